"""Ctrl-C and killed tasks leave nothing behind.

The end-to-end tests run the real ``python -m spark_imagenet demo`` in a
session of its own (as a terminal would run it: one foreground process group),
wait until TensorFlow trains, and send SIGINT to the whole process group, as
a terminal's Ctrl-C does. They assert:

* exit status 130;
* after the signal, the output holds only ``[rank R] ...`` lines (what the
  TensorFlow processes had already written) and then exactly one line,
  ``spark-imagenet: interrupted (Spark's log of this run: PATH)``, as its last line; no line after the signal
  mentions a traceback, Py4J, a reentrant call, a crashed worker, an
  exception or an ERROR log line;
* a second Ctrl-C, sent once the driver ignores SIGINT (it is shutting down),
  adds nothing to that output; since the driver ignores it, the exit is the
  first Ctrl-C's doing: one Ctrl-C is enough;
* within a bounded wait, no process remains that belongs to the run: none in
  its session, and none carrying the run's unique marker in its environment
  (the fork server and the TensorFlow processes run in sessions of their own; the
  marker is checked to find them while training runs), and per rank only the
  task's PySpark Python worker and its TensorFlow process ran besides the driver
  and the host's fork server;
* no ``spark-imagenet-rank*`` folder is left under the run's ``TMPDIR``.

The fast tests check the same cleanup for one child run as the barrier task runs it
(:mod:`spark_imagenet.training.task.child`, with the stand-in worker of tests/child_util.py) whose task process
is SIGKILLed, as PySpark kills the Python worker of a cancelled task.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKER_VAR = "SPARK_IMAGENET_TEST_MARKER"
#: Words no line after the signal may hold (the noise of the bug this guards against).
NOISE = re.compile(r"Traceback|Py4J|py4j|reentrant|crashed|Exception|ERROR")
#: A line written by a TensorFlow worker process (through its barrier task).
RANK_LINE = re.compile(r"^\[rank \d+\] ")


# ------------------------------------------------------------------ helpers
def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, session id)`` of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[3])  # state ppid pgrp session


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


FORK_SERVER = "spark_imagenet.training.worker.forkserver"


def _kind(cmd: str) -> str:
    """What a process of the run is, by its command line: the driver (with its JVM and multiprocessing's
    resource tracker), a PySpark daemon or Python worker (a barrier task), the fork server or a fork of it (a
    TensorFlow process); else the command line itself."""
    words = cmd.split()
    if words[1:3] == ["-m", FORK_SERVER]:
        return "fork server"
    if words[1:3] in (["-m", "pyspark.daemon"], ["-m", "pyspark.worker"]):
        return "PySpark"
    if words[1:3] == ["-m", "spark_imagenet"]:
        return "driver"
    if words and words[0].endswith("/java"):
        return "JVM"
    return "resource tracker" if "from multiprocessing.resource_tracker import main" in cmd else cmd


def _folder(pid: int) -> str:
    """The name of ``pid``'s working folder when it is a task's folder (``spark-imagenet-...``), else ``""``."""
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return ""
    return name if name.startswith("spark-imagenet-rank") else ""


def _run_processes(sid: int, marker: str) -> dict[int, str]:
    """Live (not zombie) processes of the run: in session ``sid`` or with ``marker`` in their environment."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        stat = _stat(pid)
        if stat is None or stat[0] in "ZX":
            continue
        if stat[1] == sid or needle in _environ(pid).split(b"\0"):
            found[pid] = _cmdline(pid)
    return found


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (no /proc entry, or a zombie); one read, so no race with its reaping."""
    stat = _stat(pid)
    return stat is None or stat[0] in "ZX"


def _wait_until(condition, timeout: float, step: float = 0.2) -> bool:
    """Poll ``condition()`` until it is true (True) or ``timeout`` seconds have passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(step)


def _rank_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("spark-imagenet-rank*") if p.is_dir())


class _Output:
    """Collects a process's merged output lines in a thread."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for raw in stream:
            with self._lock:
                self.lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


# ---------------------------------------------------------- end to end
def _ignores_sigint(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT (its ``SigIgn`` mask in /proc), False when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line.split()[1] for line in f if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


def _second_ctrl_c(proc: subprocess.Popen, sid: int) -> None:
    """Ctrl-C the process group again once the driver ``proc`` ignores SIGINT (shutting down after the first)."""
    assert _wait_until(lambda: _ignores_sigint(proc.pid) or proc.poll() is not None, 60, 0.02), \
        "the driver does not ignore SIGINT after the first Ctrl-C"
    assert proc.poll() is None, "the driver exited before a second Ctrl-C could be sent"
    os.killpg(sid, signal.SIGINT)


def _interrupted_demo(tmp_path: Path) -> None:
    """Run the demo, Ctrl-C it once it trains and again while it shuts down; check the module docstring's claims."""
    marker = uuid.uuid4().hex
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env[MARKER_VAR] = marker
    env.pop("SPARK_IMAGENET_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_imagenet", "demo", "--workers", "2", "--epochs", "30",
         "--workdir", str(tmp_path / "work")],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    sid = proc.pid  # the session leader's pid is the session id (and the process group id)
    out = _Output(proc.stdout)
    try:
        training = _wait_until(lambda: any(RANK_LINE.match(x) and "Epoch" in x for x in out.snapshot())
                               or proc.poll() is not None, 900, 0.5)
        assert training and proc.poll() is None, "the demo did not start training:\n" + "\n".join(out.snapshot()[-40:])
        running = _run_processes(sid, marker)
        # the host's fork server and its forks (a fork's command line is the server's): each task's TensorFlow
        # process; nothing else of ours but the driver, its JVM and PySpark's Python workers
        forked = {p: _folder(p) for p, c in running.items() if c.split()[1:3] == ["-m", FORK_SERVER]}
        servers = [p for p, folder in forked.items() if not folder]
        workers = [p for p, folder in forked.items() if folder.startswith("spark-imagenet-rank")]
        assert len(servers) == 1 and len(workers) == 2, f"the marker does not find the run's processes: {running}"
        assert len(forked) == 1 + len(workers), running  # the server, then one fork each
        kinds = {_kind(c) for c in running.values()}
        assert kinds <= {"driver", "JVM", "resource tracker", "PySpark", "fork server"}, running
        assert len(_rank_folders(tmpdir)) == 2

        assert not _ignores_sigint(proc.pid), "the driver ignores Ctrl-C while it trains"
        before = len(out.snapshot())
        os.killpg(sid, signal.SIGINT)
        _second_ctrl_c(proc, sid)
        code = proc.wait(300)
        out.join(60)
        after = out.snapshot()[before:]
        assert code == 130, "\n".join(out.snapshot()[-60:])
        # the one line names Spark's log, as after an error (the cancelled tasks' traces went there)
        spark_logs = [p for p in (tmpdir / "spark-imagenet-logs").glob("*.log") if p.stat().st_size]
        assert len(spark_logs) == 1, spark_logs
        assert after and after[-1] == f"spark-imagenet: interrupted (Spark's log of this run: {spark_logs[0]})", \
            "\n".join(after)
        assert sum(x.startswith("spark-imagenet: interrupted") for x in after) == 1, "\n".join(after)
        assert all(RANK_LINE.match(x) for x in after[:-1]), "\n".join(after)
        assert not [x for x in after if NOISE.search(x)], "\n".join(after)

        assert _wait_until(lambda: not _run_processes(sid, marker), 120), \
            f"processes left behind: {_run_processes(sid, marker)}"
        assert _rank_folders(tmpdir) == []
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
        for pid in _run_processes(sid, marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_during_training_prints_one_line_and_leaves_nothing_and_a_second_prints_nothing_more(tmp_path):
    _interrupted_demo(tmp_path)


# ------------------------------------------------------- one killed task
TASK_CODE = r"""
import os, sys
from spark_imagenet.training.task.child import finish_child, start_preloaded

script = ("import os, sys, time\n"
          "open(os.path.join(os.environ['TMPDIR'], 'scratch.txt'), 'w').write('x')\n"
          f"open({sys.argv[2]!r}, 'w').write(str(os.getpid()))\n"
          "time.sleep(300)\n")

def prepare(folder):
    with open(os.path.join(folder, "input.txt"), "w") as f:
        f.write("hello")
    with open(os.path.join(folder, "script.py"), "w") as f:
        f.write(script)
    with open(sys.argv[1], "w") as f:
        f.write(folder)

finish_child(start_preloaded(dict(os.environ), "fake_tf.worker", 0), "[t] ", prepare, lambda folder: None)
"""


@pytest.fixture()
def fake(tmp_path):
    """``(environment, owner)`` of the stand-in TensorFlow worker (tests/child_util.py), in ``tmp_path/fake``."""
    from child_util import fake_worker

    (tmp_path / "fake").mkdir()
    with fake_worker(tmp_path / "fake") as got:
        yield got


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets, /proc")
def test_a_killed_task_leaves_no_child_and_no_folder(fake, tmp_path):
    """PySpark SIGKILLs the Python worker of a cancelled task: the child dies, its folder goes."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    folder_file, pid_file = tmp_path / "folder", tmp_path / "child.pid"
    env = dict(fake[0], TMPDIR=str(tmpdir))
    task = subprocess.Popen([sys.executable, "-c", TASK_CODE, str(folder_file), str(pid_file)], env=env,
                            cwd=tmp_path, stdout=subprocess.DEVNULL)
    child = None
    try:
        assert _wait_until(lambda: pid_file.exists() and pid_file.read_text(), 120), "the child did not start"
        child = int(pid_file.read_text())
        folder = Path(folder_file.read_text())
        assert folder.parent == tmpdir and folder.name.startswith("spark-imagenet-rank0-")
        # TMPDIR is the folder (the stand-in's pid.txt besides)
        assert sorted(p.name for p in folder.iterdir()) == ["input.txt", "pid.txt", "scratch.txt", "script.py"]
        task.send_signal(signal.SIGKILL)
        task.wait(30)
        assert _wait_until(lambda: _gone(child), 30), "the child outlived its task"
        assert _wait_until(lambda: not folder.exists(), 30), "the task's folder was left behind"
        assert _rank_folders(tmpdir) == []
    finally:
        if task.poll() is None:
            task.kill()
        if child is not None and not _gone(child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def test_run_child_folder_carries_inputs_and_results_and_is_removed(fake):
    from child_util import run_child

    seen: dict[str, str] = {}

    def prepare(folder: str) -> None:
        seen["folder"] = folder
        Path(folder, "in.txt").write_text("41")

    def collect(folder: str) -> None:
        seen["result"] = Path(folder, "out.txt").read_text()

    code = ("import os, sys\n"
            "n = int(open('in.txt').read())\n"
            "open('out.txt', 'w').write(str(n + 1))\n"  # the working folder is the task's folder
            "print('tmp', os.environ['TMPDIR'] == os.getcwd())\n")
    out = io.StringIO()
    rc, tail = run_child(*fake, "[r] ", code, prepare=prepare, collect=collect, rank=3, out=out)
    assert rc == 0, tail
    assert out.getvalue() == "[r] tmp True\n"
    assert seen["result"] == "42" and Path(seen["folder"]).name.startswith("spark-imagenet-rank3-")
    assert not Path(seen["folder"]).exists()


def test_run_child_reports_the_childs_signal(fake):
    from child_util import run_child

    rc, _tail = run_child(*fake, "", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", out=io.StringIO())
    assert rc == -signal.SIGKILL
