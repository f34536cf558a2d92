"""The host's TensorFlow fork server (docs/design.md, 'One TensorFlow import per host: the fork server').

Real processes and real sockets, with a small stand-in for the TensorFlow worker module (no TensorFlow here: the
Spark tests, tests/test_spare_worker.py and the end-to-end training tests, fork the real one): one import per
server, forks that run the module as ``__main__`` in their folder, exit statuses through the supervisor as before,
a fork that dies with its supervisor, a server that ends with its owner, one server for tasks that start at once,
and a failed import told to every requester in one line.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_imagenet.training.task import child
from spark_imagenet.training.task.child import ChildFolder, end_child, finish_child, fork_server, start_preloaded
from spark_imagenet.training.task.supervisor import EXIT_PRELOAD_ENDED

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets, pidfds, /proc")

#: The stand-in for TensorFlow: counts its imports.
FAKE_TENSORFLOW = '''import os
with open(os.path.join(os.environ["FAKE_LOG"], "imports"), "a") as f:
    f.write(f"{os.getpid()}\\n")
'''
#: The stand-in worker: imports the stand-in TensorFlow, says what a fork sees, waits for its go, exits as told.
FAKE_WORKER = '''import os, sys, threading
import fake_tensorflow  # what the real worker imports at its top: TensorFlow

def main():
    print("pid", os.getpid(), "threads", threading.active_count(), "folder", os.path.basename(os.getcwd()),
          "tmpdir", os.environ["TMPDIR"] == os.getcwd(), "args", " ".join(sys.argv[1:2]), flush=True)
    go = sys.stdin.readline().strip()
    print("go", go, flush=True)
    if os.path.exists("sleep.txt"):
        import time
        time.sleep(120)
    sys.exit(int(open("code.txt").read()) if os.path.exists("code.txt") else 0)

if __name__ == "__main__":
    main()
'''


#: The stand-in worker's module.
WORKER = "fake_tf.worker"


@pytest.fixture()
def fake(tmp_path):
    """``(environment, owner)``: the stand-in module on PYTHONPATH, and an owner process the test ends."""
    (tmp_path / "fake_tf").mkdir()  # a module in a package, as the real worker is (runpy warns of such a rerun)
    (tmp_path / "fake_tf" / "__init__.py").write_text("")
    (tmp_path / "fake_tf" / "worker.py").write_text(FAKE_WORKER)
    (tmp_path / "fake_tensorflow.py").write_text(FAKE_TENSORFLOW)
    env = dict(os.environ, TMPDIR=str(tmp_path), FAKE_LOG=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield env, owner.pid
    owner.kill()
    owner.wait()


def _wait_until(condition, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _servers(owner: int) -> list[int]:
    """Live fork servers of ``owner`` (not their forks: a server's parent is no server)."""
    def cmd(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""

    def parent(pid: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return 0

    mine = f"-m {child.FORK_SERVER_MODULE} --listen-fd"
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and mine in cmd(int(p)) and f"--owner {owner} " in
            cmd(int(p)) and _alive(int(p)) and child.FORK_SERVER_MODULE not in cmd(parent(int(p)))]


def _run(env, owner, code: int | None = None) -> tuple[int, list[str]]:
    """One task's process: forked, given its inputs and its go; ``(exit status, its lines)``."""
    def prepare(folder: str) -> None:
        if code is not None:
            Path(folder, "code.txt").write_text(str(code))

    held = start_preloaded(env, WORKER, "spark-imagenet-rank0-", owner=owner)
    return finish_child(held.proc, "", out=io.StringIO(), folder=ChildFolder("unused", prepare, lambda f: None))


def test_one_import_serves_every_fork_and_each_fork_runs_the_module_in_its_folder(fake, tmp_path):
    env, owner = fake
    results = [_run(env, owner), _run(env, owner, code=3)]
    imports = (tmp_path / "imports").read_text().split()
    assert len(imports) == 1 and _servers(owner) == [int(imports[0])]  # the server imported; the forks did not
    assert [code for code, _ in results] == [0, 3]  # each fork's exit status, through its supervisor
    for _, (first, go) in results:  # and nothing else: no warning of runpy's about rerunning an imported module
        words = first.split()
        assert words[0] == "pid" and int(words[1]) != int(imports[0])
        assert words[2:] == ["threads", "1", "folder", words[5], "tmpdir", "True", "args", "--preload"]
        assert words[5].startswith("spark-imagenet-rank0-") and go == "go run"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("spark-imagenet-")] == []  # folders removed


def test_a_fork_killed_before_or_after_its_go_is_reported_as_before_and_dies_with_its_supervisor(fake, tmp_path):
    env, owner = fake
    for sleep in (False, True):
        held = start_preloaded(env, WORKER, "spark-imagenet-rank0-", owner=owner)
        forked: list[int] = []

        def prepare(folder: str, sleep=sleep, held=held) -> None:
            if sleep:
                Path(folder, "sleep.txt").write_text("")
            else:  # killed while it waited for its go, as a spare can be: the supervisor says so (126)
                forked.append(int(held.proc.stdout.readline().split()[1]))
                os.kill(forked[0], signal.SIGKILL)
                assert _wait_until(lambda: not _alive(forked[0]))
                time.sleep(0.5)  # the server has reaped it and said so

        def shown(line: str) -> str:
            if line.startswith("pid "):
                forked.append(int(line.split()[1]))
            if line == "go run":  # killed while it runs: the task sees the signal, as before
                os.kill(forked[0], signal.SIGKILL)
            return line

        code, _ = finish_child(held.proc, "", out=io.StringIO(), folder=ChildFolder("x", prepare, lambda f: None),
                               shown=shown)
        assert code == (-signal.SIGKILL if sleep else EXIT_PRELOAD_ENDED)

    held = start_preloaded(env, WORKER, "spark-imagenet-rank1-", owner=owner)
    assert held.proc.stdout.readline().startswith(b"folder ")
    pid = int(held.proc.stdout.readline().split()[1])
    held.proc.kill()  # the supervisor dies by SIGKILL (no clean-up of its own): the server ends its fork
    held.proc.wait()
    assert _wait_until(lambda: not _alive(pid)), "the fork outlived its supervisor"
    end_child(held.proc)


def test_the_server_ends_with_its_owner_and_takes_its_forks(fake):
    env, owner = fake
    held = start_preloaded(env, WORKER, "spark-imagenet-spare-", owner=owner)

    def prepare(folder: str) -> None:
        pid = int(held.proc.stdout.readline().split()[1])
        [server] = _servers(owner)
        os.kill(owner, signal.SIGKILL)
        assert _wait_until(lambda: not _alive(server) and not _alive(pid)), "the server or its fork outlived the owner"
        time.sleep(0.5)  # the server said so before it ended

    code, _ = finish_child(held.proc, "", out=io.StringIO(), folder=ChildFolder("x", prepare, lambda f: None))
    assert code == EXIT_PRELOAD_ENDED  # as for a spare whose process ended while it waited: the task starts another


def test_tasks_starting_at_once_start_one_server(fake):
    env, owner = fake
    names: list[str] = []
    threads = [threading.Thread(target=lambda: names.append(fork_server(env, WORKER, owner)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(names)) == 1 and _wait_until(lambda: len(_servers(owner)) == 1)
    time.sleep(0.5)
    assert len(_servers(owner)) == 1


def test_a_failed_import_is_one_line_for_every_requester(fake, tmp_path):
    env, owner = fake
    (tmp_path / "fake_tf" / "worker.py").write_text("raise ImportError('no TensorFlow here')\n")
    for _ in range(2):
        code, lines = _run(env, owner)
        # as for a fresh process whose import failed: exit status 1, or, when that came before the go, the
        # supervisor's 126 and its line (the task then tries a new one, once)
        assert lines[0] == "the TensorFlow fork server could not import fake_tf.worker: ImportError: no TensorFlow here"
        assert (code, lines[1:]) in ((1, []), (EXIT_PRELOAD_ENDED,
                                               ["supervisor: the preloaded process exited with code 1 before its go"]))
