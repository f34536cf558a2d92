"""The supervisor between a barrier task and its TensorFlow worker process.

Usage (started by :func:`spark_imagenet.training.task.child.start_child`)::

    python -m spark_imagenet.training.task.supervisor --parent PID [--folder PREFIX [--preload [--fork-server NAME]]]
        -- ARGV...

It runs ARGV as its child and ends it, and removes the task's temporary
folder, however the task ends: PySpark SIGKILLs the Python worker of a
cancelled or failed task, so no ``finally`` in the task can clean up
(docs/design.md, 'One TensorFlow process per task'). The supervisor imports
nothing but the standard library (no TensorFlow), so its Python signal
handlers run at once.

Protocol (stdin is the task's *lifeline*: a pipe the task never writes to
after the start, and which closes when the task ends or dies):

1. SIGTERM arrives blocked (the task blocks it before ``exec``); the
   supervisor installs its handler, ignores SIGINT, then unblocks it, so a
   death of the task during start-up is not missed. The task sets
   ``PR_SET_PDEATHSIG`` = SIGTERM: the supervisor gets SIGTERM when the task dies.
2. With ``--folder PREFIX``: it creates the folder (``tempfile.mkdtemp``),
   writes ``folder <path>`` as the first line of stdout, and waits for a ``run`` line
   on stdin (the task writes the child's inputs into the folder meanwhile).
   ``{folder}`` in ARGV is replaced by the path; the child runs in it, with
   ``TMPDIR`` set to it.
3. It starts the child (stdin ``/dev/null``, stdout and stderr its own; the
   child gets ``PR_SET_PDEATHSIG`` = SIGKILL) and waits for it.

   With ``--preload`` (needs ``--folder``) steps 2 and 3 swap: the child starts
   right after the ``folder <path>`` line, in the folder, with a pipe as its
   stdin, and gets ready (the TensorFlow worker imports TensorFlow) while the
   task writes its inputs; on the task's ``run`` line the supervisor forwards
   ``run`` to the child's stdin and closes it: that line is the child's go. A
   child that has already ended by then (killed while it waited) is not
   reported as the job's failure: the supervisor writes one line saying so and
   exits with :data:`EXIT_PRELOAD_ENDED` (after step 4's wait for the end of
   stdin), so the task can start a fresh one (docs/design.md, 'Starting
   TensorFlow early, and a spare for the next job').
4. It closes its stdout and stderr (so the task sees the end of the output),
   waits for the end of stdin (the task has read the child's results from the
   folder, or died), removes the folder, and exits as the child did: with its
   exit code, or killed by the same signal.

With ``--fork-server NAME`` (how a barrier task starts its TensorFlow process) the child of step 3 is not
started by ``exec``: the host's fork server NAME forks it from a process that has imported TensorFlow
(:mod:`spark_imagenet.training.worker.forkserver`; docs/design.md, 'One TensorFlow import per host: the fork
server'). The supervisor hands the server the child's stdin pipe and its own stdout over the server's socket and
holds a :class:`~spark_imagenet.training.job.forking.ForkedChild`: the server reports the child's pid and exit
status, kills it on the supervisor's word, and kills it when the supervisor's connection ends (the supervisor
died), so the steps above hold unchanged. The child's command line and environment in ``/proc`` are the
server's; its working folder is the task's folder.

On SIGTERM, or a parent that is already gone, at any step: it SIGKILLs the
child, waits for it, removes the folder and exits with 128 + 15. Exit status
125 with one stderr line when it is used wrongly, the folder cannot be
created or the child cannot start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Sequence

from spark_imagenet.training.job.forking import ForkedChild, set_death_signal

#: Exit status when the supervisor itself fails (usage, no folder, or the child cannot start).
EXIT_SUPERVISOR_FAILED = 125
#: Exit status with ``--preload`` when the child had already ended before its go (the task starts another).
EXIT_PRELOAD_ENDED = 126


class _Terminated(BaseException):
    """Raised by the SIGTERM handler: the task is gone, clean up now."""


def _on_sigterm(_signum, _frame) -> None:
    raise _Terminated()


def _parse(argv: Sequence[str]) -> tuple[int, str | None, bool, list[str], str | None]:
    """``(parent_pid, folder_prefix or None, preload, child_argv, fork_server or None)`` of the command line.

    Raises:
        ValueError: not ``--parent PID [--folder PREFIX [--preload [--fork-server NAME]]] -- ARGV...`` with a
            non-empty ARGV.
    """
    args = list(argv)
    if "--" not in args:
        raise ValueError("missing '--' before the child's command")
    split = args.index("--")
    options, child = args[:split], args[split + 1:]
    preload = "--preload" in options
    options = [o for o in options if o != "--preload"]
    values = dict(zip(options[::2], options[1::2]))
    if (len(options) % 2 or set(values) - {"--parent", "--folder", "--fork-server"} or "--parent" not in values
            or not child or (preload and "--folder" not in values) or ("--fork-server" in values and not preload)):
        raise ValueError("usage: --parent PID [--folder PREFIX [--preload [--fork-server NAME]]] -- ARGV...")
    return int(values["--parent"]), values.get("--folder"), preload, child, values.get("--fork-server")


def _await_start(folder: str) -> bool:
    """Write ``folder <path>`` as stdout's first line, then wait for the task's ``run`` line.

    Returns:
        bool: True on ``run``; False on the end of stdin (the task is gone).
    """
    sys.stdout.write(f"folder {folder}\n")
    sys.stdout.flush()
    return sys.stdin.buffer.readline().strip() == b"run"


def _close_output() -> None:
    """Point stdout and stderr at /dev/null, so the task's pipe ends once the child has ended too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _exit_like(code: int) -> None:
    """End this process as the child ended: exit ``code`` (>= 0), or die of signal ``-code``."""
    if code < 0:
        with contextlib.suppress(Exception):  # SIGKILL and SIGSTOP cannot be caught: nothing to reset
            signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code)


def _start_child(argv: list[str], env: dict, cwd: str | None, state: dict, stdin, fork_server: str | None = None
                 ) -> bool:
    """Start the child (``PR_SET_PDEATHSIG`` = SIGKILL) into ``state["child"]``, or have ``fork_server`` fork it
    (a :class:`~spark_imagenet.training.job.forking.ForkedChild`: its stdin a pipe, in ``cwd``); False (with one
    stderr line) when it cannot start."""
    me = os.getpid()
    try:
        if fork_server is not None:
            assert cwd is not None and stdin == subprocess.PIPE
            state["child"] = ForkedChild.start(fork_server, argv, cwd)
        else:
            state["child"] = subprocess.Popen(argv, stdin=stdin, env=env, cwd=cwd,
                                              preexec_fn=lambda: set_death_signal(signal.SIGKILL, me))
    except OSError as e:
        where = f"through the TensorFlow fork server {fork_server!r}" if fork_server else ""
        print(f"supervisor: cannot start {argv[0]!r}{where}: {e}", file=sys.stderr, flush=True)
        return False
    return True


def _go(child: subprocess.Popen | ForkedChild) -> bool:
    """Forward the task's ``run`` to a preloaded child's stdin and close it; False (with one stderr line) when
    the child has already ended (it waited for its go, so that is not the job's failure)."""
    code = child.poll()
    if code is not None:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(f"supervisor: the preloaded process {how} before its go", file=sys.stderr, flush=True)
        return False
    with contextlib.suppress(OSError):  # one that ends now fails like any child: by its exit status
        child.stdin.write(b"run\n")
        child.stdin.close()
    return True


def _run(prefix: str | None, argv: list[str], state: dict, preload: bool = False, fork_server: str | None = None
         ) -> int:
    """Steps 2-4 of the protocol; return the child's exit code (negative: its killing signal)."""
    env = dict(os.environ)
    cwd = None
    if prefix is not None:
        try:
            state["folder"] = cwd = tempfile.mkdtemp(prefix=prefix)
        except OSError as e:
            print(f"supervisor: cannot create the task's temporary folder: {e}", file=sys.stderr, flush=True)
            return EXIT_SUPERVISOR_FAILED
        argv = [a.replace("{folder}", cwd) for a in argv]
        env["TMPDIR"] = cwd  # TensorFlow's temporary files (autograph's modules) go with the folder
        if preload:
            sys.stdout.write(f"folder {cwd}\n")
            sys.stdout.flush()
            if not _start_child(argv, env, cwd, state, subprocess.PIPE, fork_server):
                return EXIT_SUPERVISOR_FAILED
            if sys.stdin.buffer.readline().strip() != b"run":
                return 1
            if not _go(state["child"]):
                _close_output()
                while sys.stdin.buffer.read(65536):
                    pass
                return EXIT_PRELOAD_ENDED
        elif not _await_start(cwd):
            return 1
    if not preload and not _start_child(argv, env, cwd, state, subprocess.DEVNULL):
        return EXIT_SUPERVISOR_FAILED
    code = state["child"].wait()
    _close_output()
    if prefix is not None:
        while sys.stdin.buffer.read(65536):
            pass  # the task closes the lifeline once it has read the results
    return code


def _clean_up(state: dict) -> None:
    """Kill the child if it still runs, wait for it, and remove the folder (idempotent)."""
    child = state.get("child")
    if child is not None and child.poll() is None:
        with contextlib.suppress(Exception):
            child.kill()
        with contextlib.suppress(Exception):
            child.wait()
    folder = state.pop("folder", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the protocol of the module docstring; never returns (exits as the child did).

    Args:
        argv: the command line after the program name (default ``sys.argv[1:]``).
    """
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    state: dict = {}
    code = 128 + signal.SIGTERM
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        try:
            parent, prefix, preload, child, fork_server = _parse(sys.argv[1:] if argv is None else argv)
        except ValueError as e:
            print(f"supervisor: {e}", file=sys.stderr, flush=True)
            os._exit(EXIT_SUPERVISOR_FAILED)
        if os.getppid() == parent:
            code = _run(prefix, child, state, preload, fork_server)
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # cleaning up is not interrupted twice
        _clean_up(state)
    _exit_like(code)


if __name__ == "__main__":
    main()
