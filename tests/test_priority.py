"""A spare TensorFlow process imports under SCHED_IDLE while a job runs, and runs at normal priority once taken.

docs/design.md, 'Starting TensorFlow early, and a spare for the next job'. Real processes, real policies; the
unprivileged case runs a real process as user ``nobody`` (``setpriv``, root only).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time

import pytest

from spark_imagenet.training.job import priority
from spark_imagenet.training.task import child
from spark_imagenet.training.task.child import ChildFolder, finish_child, start_child

linux_only = pytest.mark.skipif(not priority.SUPPORTED, reason="SCHED_IDLE is Linux's")

#: A child that starts a second thread (as TensorFlow's import does) and waits for its go.
CHILD = ("import sys, threading, time\n"
         "threading.Thread(target=time.sleep, args=(300,), daemon=True).start()\n"
         "print('ready', flush=True)\n"
         "print('go', sys.stdin.readline().strip(), flush=True)\n")


def _policies(pid: int) -> set[int]:
    """The scheduling policy of every thread of ``pid`` and of its children's threads."""
    pids = [pid] + [c for c, parent in priority._parents().items() if parent == pid]
    return {os.sched_getscheduler(t) for p in pids for t in priority._threads(p)}


def _autogroup_nice(pid: int) -> int | None:
    """The nice value of ``pid``'s session autogroup; None without autogroups."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError):
        return None


def _wait(condition, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@linux_only
def test_an_idle_child_and_its_threads_are_woken_by_its_task(tmp_path):
    if not priority.idle_reversible():
        pytest.skip("this process may not leave SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE below nice 0)")
    proc = start_child([sys.executable, "-c", CHILD], dict(os.environ, TMPDIR=str(tmp_path)), None,
                       "spark-imagenet-spare-", preload=True, idle=True)
    try:
        assert _wait(lambda: len(_policies(proc.pid)) and priority._threads(proc.pid)
                     and any(len(priority._threads(c)) >= 2 for c, p in priority._parents().items() if p == proc.pid))
        assert _policies(proc.pid) == {os.SCHED_IDLE}  # the supervisor, the child, the child's thread
        assert _autogroup_nice(proc.pid) in (None, 19)  # its own session's autogroup, lowest weight
        assert priority.wake_tree(proc.pid) >= 3
        assert _policies(proc.pid) == {os.SCHED_OTHER}
        assert _autogroup_nice(proc.pid) in (None, 0)
        assert priority.wake_tree(proc.pid) == 0
        code, tail = finish_child(proc, "", out=io.StringIO(), folder=ChildFolder("unused", lambda f: None,
                                                                                 lambda f: None))
        assert code == 0 and tail == ["ready", "go run"]
    finally:
        child.end_child(proc)


@linux_only
def test_a_spare_started_early_is_idle_and_the_task_that_takes_it_wakes_it(tmp_path, monkeypatch):
    if not priority.idle_reversible():
        pytest.skip("this process may not leave SCHED_IDLE")
    module = tmp_path / "fake_worker.py"
    module.write_text("import sys, time\nsys.stdin.readline()\n")
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    try:
        assert child.start_spare_early(env, "fake_worker")
        spare = child._SPARE[0]
        assert spare.idle and _wait(lambda: len(_policies(spare.proc.pid)) > 0)
        assert _policies(spare.proc.pid) == {os.SCHED_IDLE}
        child.leave_spare(env, "fake_worker")  # the early one still runs: kept, not replaced
        assert child._SPARE == [spare]
        taken = child.take_preloaded(env, "fake_worker", 0, use_spare=True)
        assert taken is spare and not taken.idle
        assert _policies(taken.proc.pid) == {os.SCHED_OTHER}
        child.end_child(taken.proc)
        assert child.start_spare_early(env, "fake_worker")
        other = dict(env, EXTRA="1")  # another key: the spare is ended, a fresh process started
        fresh = child.take_preloaded(other, "fake_worker", 0, use_spare=True)
        assert not fresh.spare and not fresh.idle and child._SPARE == []
        child.end_child(fresh.proc)
        assert child.start_spare_early(env, "fake_worker")
        child.drop_spare()
        assert child._SPARE == []
    finally:
        child.drop_spare()


#: A Python any user may run (the virtualenv may sit in a folder only its owner can enter).
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@linux_only
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or SYSTEM_PYTHON is None,
                    reason="needs root, setpriv and a system python3")
def test_an_unprivileged_executor_starts_no_idle_spare():
    """Without CAP_SYS_NICE and with RLIMIT_NICE 0, a thread cannot leave SCHED_IDLE: no spare may start idle."""
    probe = open(priority.__file__, encoding="utf-8").read() + "\nprint(idle_reversible())\n"
    runs = {}
    for who, prefix in (("nobody", ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                    "--inh-caps=-all", "prlimit", "--nice=0"]), ("root", [])):
        out = subprocess.run(prefix + [SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60,
                             cwd="/")
        assert out.returncode == 0, out.stderr
        runs[who] = out.stdout.strip()
    assert runs == {"nobody": "False", "root": "True"}
