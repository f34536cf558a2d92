"""The host's TensorFlow fork server (docs/design.md, 'One TensorFlow import per host: the fork server').

Real processes and real sockets, with a small stand-in for the TensorFlow worker module (tests/child_util.py; no
TensorFlow here: the Spark tests and the end-to-end training tests fork the real one): one import per server,
forks that run the module as ``__main__`` in their folder, exit statuses through the server, a fork killed before
its go replaced once, a fork and its folder gone with its task's connection, a server that ends with its owner
and takes its forks, one server for tasks that start at once, and a failed import told to every requester as an
error with the server's one-line reason.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from child_util import WORKER, fake_worker, run_child
from spark_imagenet.errors import TrainingError
from spark_imagenet.training.task import child
from spark_imagenet.training.task.child import end_child, finish_child, fork_server, start_preloaded

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets, pidfds, /proc")


@pytest.fixture()
def fake(tmp_path):
    """``(environment, owner)``: the stand-in module on PYTHONPATH, and an owner process the test ends."""
    with fake_worker(tmp_path) as got:
        yield got


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


def _run(env, owner, code: int | None = None) -> tuple[int, list[str], str]:
    """One task's process: forked, given its inputs and its go; ``(exit status, its lines, its folder)``."""
    folders: list[str] = []

    def prepare(folder: str) -> None:
        folders.append(folder)
        if code is not None:
            Path(folder, "code.txt").write_text(str(code))

    code, lines = run_child(env, owner, "", prepare=prepare, out=io.StringIO())
    return code, lines, folders[0]


def _pid(folder: str) -> int:
    """The stand-in worker's pid, once it has written it to its folder."""
    assert _wait_until(lambda: Path(folder, "pid.txt").exists())
    return int(Path(folder, "pid.txt").read_text())


def test_one_import_serves_every_fork_and_each_fork_runs_the_module_in_its_folder(fake, tmp_path):
    env, owner = fake
    results = [_run(env, owner), _run(env, owner, code=3)]
    imports = (tmp_path / "imports").read_text().split()
    assert len(imports) == 1 and _servers(owner) == [int(imports[0])]  # the server imported; the forks did not
    assert [code for code, _, _ in results] == [0, 3]  # each fork's exit status, through the server
    for _, lines, folder in results:  # and nothing else: no warning of runpy's about rerunning an imported module
        [line] = lines
        words = line.split()
        assert words[0] == "pid" and int(words[1]) != int(imports[0])
        assert words[2:] == ["threads", "1", "folder", os.path.basename(folder), "tmpdir", "True", "args",
                             "--preload", "go", "run"]
        assert words[5].startswith("spark-imagenet-rank0-")
        assert not Path(folder).exists()  # removed by the server before the task's end returned


def test_a_fork_killed_before_its_go_is_replaced_once_and_one_killed_after_is_reported(fake):
    env, owner = fake
    for sleep in (False, True):
        held = start_preloaded(env, WORKER, 0, owner=owner)
        first = held.folder
        seen: list[str] = []

        def prepare(folder: str, sleep=sleep) -> None:
            seen.append(folder)
            if sleep:
                Path(folder, "sleep.txt").write_text("")
            elif len(seen) == 1:  # killed while it waited for its go: the task forks a fresh one
                pid = _pid(folder)
                os.kill(pid, signal.SIGKILL)
                assert _wait_until(lambda: not _alive(pid))

        def shown(line: str, sleep=sleep) -> str:
            if sleep and line.endswith("go run"):  # killed while it runs: the task sees the signal
                os.kill(int(line.split()[1]), signal.SIGKILL)
            return line

        try:
            code, lines = finish_child(held, "", prepare, lambda f: None, out=io.StringIO(), shown=shown)
        finally:
            end_child(held)
        assert len(lines) == 1 and lines[0].endswith("go run"), lines
        if sleep:
            assert code == -signal.SIGKILL and seen == [first]
        else:  # the fresh fork ran in a folder of its own
            assert code == 0 and seen == [first, held.folder] and held.folder != first
        assert not any(Path(folder).exists() for folder in seen)


def test_a_fork_dies_with_its_task_s_connection(fake):
    env, owner = fake
    held = start_preloaded(env, WORKER, 1, owner=owner)
    pid = _pid(held.folder)
    held.proc._sock.close()  # what the task's death does: the connection ends, nothing else is said
    assert _wait_until(lambda: not _alive(pid)), "the fork outlived its task's connection"
    assert _wait_until(lambda: not Path(held.folder).exists()), "the fork's folder was left behind"
    end_child(held)


def test_a_fork_killed_through_the_server_reports_the_signal(fake):
    env, owner = fake
    held = start_preloaded(env, WORKER, 0, owner=owner)
    try:
        pid = _pid(held.folder)
        held.proc.kill()
        assert held.proc.wait() == -signal.SIGKILL and held.proc.pid == pid and not _alive(pid)
    finally:
        end_child(held)
    assert not Path(held.folder).exists()


def test_the_server_ends_with_its_owner_and_takes_its_forks_and_their_folders(fake):
    env, owner = fake
    held = start_preloaded(env, WORKER, 0, owner=owner)
    pid = _pid(held.folder)
    [server] = _servers(owner)
    os.kill(owner, signal.SIGKILL)
    assert _wait_until(lambda: not _alive(server) and not _alive(pid)), "the server or its fork outlived the owner"
    assert not Path(held.folder).exists()
    assert held.proc.wait() == -signal.SIGKILL  # the server said so before it ended
    end_child(held)


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


def test_a_failed_import_is_a_training_error_with_the_server_s_reason_for_every_requester(fake, tmp_path):
    env, owner = fake
    (tmp_path / "fake_tf" / "worker.py").write_text("raise ImportError('no TensorFlow here')\n")
    for _ in range(2):
        held = start_preloaded(env, WORKER, 0, owner=owner)
        try:
            with pytest.raises(TrainingError) as got:
                finish_child(held, "", lambda f: None, lambda f: None, out=io.StringIO())
        finally:
            end_child(held)
        assert str(got.value) == ("could not start the TensorFlow process (fake_tf.worker): the TensorFlow fork "
                                  "server could not import fake_tf.worker: ImportError: no TensorFlow here")
        assert not Path(held.folder).exists()
