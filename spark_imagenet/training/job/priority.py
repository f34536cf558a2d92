"""CPU priority of a spare TensorFlow process: idle while a job runs, normal once a task takes it.

A barrier task starts the spare for the next job of its Python worker while its own job still runs
(docs/design.md, 'Starting TensorFlow early, and a spare for the next job'). The spare then runs under
Linux's ``SCHED_IDLE`` policy: it imports TensorFlow only on CPU time nothing else wants, so the running
job is not slowed. The task that takes it puts every thread of the spare's process tree back to
``SCHED_OTHER`` (:func:`wake_tree`), and the TensorFlow worker does the same for its own threads at its go
(:func:`wake_threads`), so no thread of a training process stays idle.

Going back from ``SCHED_IDLE`` needs ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` that allows nice 0 (sched(7)),
which an unprivileged executor often lacks; :func:`idle_reversible` finds out once per process, on a
throwaway thread, and a task whose spare could not be woken must not start one early. Standard library
only (the supervisor's preexec function calls :func:`set_idle`).
"""

from __future__ import annotations

import os
import sys
import threading
import time

#: Whether the platform has the policies at all (Linux).
SUPPORTED = sys.platform.startswith("linux") and hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setscheduler")

_REVERSIBLE: list[bool] = []


#: The autogroup nice value of an idle spare's session (the lowest weight: 15 against nice 0's 1024).
IDLE_AUTOGROUP_NICE = 19
#: Tries, 0.1 s apart, of a write to ``/proc/PID/autogroup`` (the kernel allows one per 0.1 s without
#: CAP_SYS_ADMIN and answers EAGAIN in between).
_AUTOGROUP_TRIES = 20


def set_autogroup_nice(pid: int, nice: int) -> bool:
    """Set the nice value of the autogroup of ``pid``'s session (Linux ``CONFIG_SCHED_AUTOGROUP``).

    With autogroups on (``/proc/sys/kernel/sched_autogroup_enabled``), the scheduler shares the CPU between
    sessions first and between threads inside a session second, so a spare in a session of its own
    (its supervisor calls ``setsid``) would get half the CPU whatever its threads' policy: its session's
    autogroup must be at nice 19 too. Any user may set a value from 0 to 19 (only below 0 needs privilege).

    Returns:
        bool: whether it was set (False: no autogroups, or the system refused).
    """
    path = f"/proc/{pid or 'self'}/autogroup"
    for _ in range(_AUTOGROUP_TRIES):
        try:
            with open(path, "w") as f:
                f.write(str(nice))
            return True
        except BlockingIOError:  # EAGAIN: another write within the last 0.1 s
            time.sleep(0.1)
        except OSError:
            return False
    return False


def set_idle(pid: int = 0) -> None:
    """Put thread ``pid`` (0: the calling thread) under ``SCHED_IDLE``, and its session's autogroup at nice
    :data:`IDLE_AUTOGROUP_NICE` (:func:`set_autogroup_nice`); threads it starts inherit the policy.

    Raises:
        OSError: refused by the system (not on a platform without the policy: a no-op there).
    """
    if SUPPORTED:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        set_autogroup_nice(pid, IDLE_AUTOGROUP_NICE)


def idle_reversible() -> bool:
    """Whether this process may put a thread under ``SCHED_IDLE`` and back to ``SCHED_OTHER`` (tried once per
    process on a thread of its own, which ends whatever the answer; cached)."""
    if not _REVERSIBLE:
        answer = [False]

        def probe() -> None:
            try:  # the policy only: the autogroup is this process's whole session's
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                answer[0] = True
            except OSError:
                pass

        if SUPPORTED:
            thread = threading.Thread(target=probe, name="spark-imagenet-priority-probe", daemon=True)
            thread.start()
            thread.join()
        _REVERSIBLE.append(answer[0])
    return _REVERSIBLE[0]


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (a scan of /proc: the ``children`` files need a kernel option)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            parents[int(entry)] = int(fields[1])
    return parents


def wake_threads(pid: int) -> int:
    """Put every thread of process ``pid`` that is under ``SCHED_IDLE`` back to ``SCHED_OTHER``.

    Returns:
        int: how many threads were changed (0 where the platform has no such policy).

    Raises:
        OSError: the system refused (no ``CAP_SYS_NICE`` and an ``RLIMIT_NICE`` below nice 0).
    """
    changed = 0
    if not SUPPORTED:
        return changed
    for tid in _threads(pid):
        try:
            if os.sched_getscheduler(tid) != os.SCHED_IDLE:
                continue
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        changed += 1
    return changed


def wake_tree(pid: int) -> int:
    """:func:`wake_threads` for process ``pid`` and every process below it.

    Returns:
        int: how many threads were changed.

    Raises:
        OSError: as :func:`wake_threads`.
    """
    if not SUPPORTED:
        return 0
    parents = _parents()
    changed, todo, seen = 0, [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        changed += wake_threads(current)
        todo += [child for child, parent in parents.items() if parent == current]
    set_autogroup_nice(pid, 0)  # its session's autogroup (the supervisor leads the session)
    return changed
