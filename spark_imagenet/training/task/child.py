"""A barrier task's TensorFlow worker process: started early, given its inputs and its go, watched, ended.

:func:`start_preloaded` creates the process's folder and starts it (:func:`start_worker`: forked by the host's
fork server, :func:`fork_server`), so that it is ready while the task stages and meets its peers;
:func:`finish_child` writes its inputs, gives its go, echoes its output line by line with a prefix
(:func:`echo_output`) and reads its results; :func:`end_child` ends it. The task holds the child's
:class:`~spark_imagenet.training.job.forking.ForkedChild`: its connection to the fork server is the child's
lifeline, so however the task ends (PySpark SIGKILLs a cancelled task's Python worker) the server kills the
child and removes its folder. No TensorFlow here.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from typing import IO, Callable, Mapping, Sequence

from spark_imagenet.errors import TrainingError
from spark_imagenet.training.job import forking
from spark_imagenet.training.job.forking import ForkedChild, ForkError
from spark_imagenet.training.job.gpus import is_cpu_startup_line

logger = logging.getLogger(__name__)

#: The module of the host's TensorFlow fork server (:func:`fork_server`).
FORK_SERVER_MODULE = "spark_imagenet.training.worker.forkserver"
#: Lines of child output kept for the error message of a failed rank.
TAIL_LINES = 40


def exit_description(code: int) -> str:
    """How a process ended: ``"exited with code 1"``, ``"was killed by SIGKILL"``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class CpuStartupFilter:
    """Hides TensorFlow's CUDA start-up lines of a worker that has no GPU, on a host without one.

    Called with each output line; returns the line to echo, or None. The first
    hidden line is replaced by one line saying that TensorFlow trains on the CPU
    and that its CUDA start-up lines are not shown (the lines are those of
    :func:`~spark_imagenet.training.job.gpus.is_cpu_startup_line`). :func:`echo_output`'s
    tail, which a failure's message quotes, keeps what was echoed, so it
    leaves them out too. Use it only where no GPU was asked for or found (a
    GPU worker's CUDA errors are real).

    Args:
        notice: the line shown in place of the first hidden one.

    Attributes:
        hidden: how many lines were hidden.
    """

    NOTICE = "TensorFlow found no CUDA driver or GPU here: training on the CPU (its CUDA start-up lines not shown)"

    def __init__(self, notice: str = NOTICE) -> None:
        self.hidden = 0
        self.notice = notice

    def __call__(self, line: str) -> str | None:
        if not is_cpu_startup_line(line):
            return line
        self.hidden += 1
        return self.notice if self.hidden == 1 else None


def echo_output(stream: IO[bytes], prefix: str, tail_lines: int = TAIL_LINES, out=None,
                shown: Callable[[str], str | None] | None = None) -> list[str]:
    """Echo a child's output ``stream`` line by line until it ends; return its last lines.

    Args:
        stream: the child's merged stdout and stderr (binary).
        prefix: put before each echoed line, e.g. ``"[rank 1] "``.
        tail_lines: how many of the last lines to keep.
        out: text stream to echo to (default ``sys.stderr``).
        shown: called with each line, returns what to echo instead (None: nothing), e.g.
            :class:`CpuStartupFilter`; the tail keeps what was echoed (without the prefix).

    Returns:
        list[str]: the last ``tail_lines`` lines echoed. A line a progress bar redrew with ``\\r`` is what a
        terminal would show: its last part.
    """
    out = out or sys.stderr
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    for raw in stream:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1]
        echo = line if shown is None else shown(line)
        if echo is not None:
            tail.append(echo)
            out.write(f"{prefix}{echo}\n")
            out.flush()
    return list(tail)


def _key(env: Mapping[str, str], child_module: str) -> tuple:
    """What a forked process depends on: the interpreter, the module and the environment of its server."""
    return sys.executable, child_module, tuple(sorted(env.items()))


#: This process's fork servers it started: name -> the server's Popen (kept, and reaped once ended).
_SERVERS: dict[str, subprocess.Popen] = {}


def fork_server(env: Mapping[str, str], child_module: str, owner: int) -> str:
    """The name of this host's TensorFlow fork server for ``env`` and ``child_module`` that lives as long as
    ``owner``; started here, detached, when none listens (docs/design.md, 'One TensorFlow import per host: the
    fork server').

    The name's socket is bound here and handed to the new server (``--listen-fd``): binding it is the lock, so
    tasks starting at once on one host start one server, and a task's request waits in its listen queue until
    the server has imported TensorFlow.

    Args:
        env: the environment the forked processes need (:func:`~spark_imagenet.training.task.environment.
            preload_env`); the server is started with it.
        child_module: the module each fork runs (the TensorFlow worker's).
        owner: the pid the server lives as long as: a barrier task passes its executor's PySpark daemon (its
            parent), so the server outlives the Python worker that started it.

    Returns:
        str: the server's name (:func:`~spark_imagenet.training.job.forking.server_name`).

    Raises:
        OSError: the socket could not be made (not ``EADDRINUSE``: a server already listens), or the server
            could not be started.
    """
    name = forking.server_name(owner, _key(env, child_module))
    for known, server in list(_SERVERS.items()):
        if server.poll() is not None:
            del _SERVERS[known]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            listener.bind(forking.address(name))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return name
            raise
        listener.listen(64)
        _SERVERS[name] = subprocess.Popen(
            [sys.executable, "-m", FORK_SERVER_MODULE, "--listen-fd", str(listener.fileno()), "--owner", str(owner),
             "--module", child_module], env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(listener.fileno(),))
    finally:
        listener.close()
    return name


def start_worker(env: Mapping[str, str], module: str, args: Sequence[str], folder: str, owner: int) -> ForkedChild:
    """Start the TensorFlow process ``python -m module ARGS...`` in ``folder`` (also its ``TMPDIR``): the one place
    that starts it. It is forked by the host's fork server for ``env`` and ``module`` of ``owner``
    (:func:`fork_server`), which then owns ``folder``.

    Returns:
        ForkedChild: used as a ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``kill``, a ``stdin`` pipe, a
        ``stdout`` pipe with stderr merged) plus ``close``, which ends the connection and waits until the folder
        is removed.

    Raises:
        OSError: the server could not be started or reached.
    """
    return ForkedChild.start(fork_server(env, module, owner), [sys.executable, "-m", module, *args], folder)


@dataclasses.dataclass
class Preloaded:
    """A TensorFlow worker process started before its inputs exist, waiting for its go.

    Attributes:
        proc: the process (:func:`start_worker`); :func:`finish_child` replaces one that ended before its go.
        folder: its folder (``spark-imagenet-rank<R>-*`` in the task's temporary directory).
        env: the environment it was started with (:func:`~spark_imagenet.training.task.environment.preload_env`).
        module: the module it runs.
        rank: the task's rank.
        owner: the pid its fork server lives as long as (:func:`fork_server`).
    """

    proc: ForkedChild
    folder: str
    env: dict[str, str]
    module: str
    rank: int
    owner: int


def start_preloaded(env: Mapping[str, str], module: str, rank: int, owner: int | None = None) -> Preloaded:
    """Create a folder ``spark-imagenet-rank<rank>-*`` and start ``python -m module --preload {folder}/environ.json
    {folder}/worker.json {folder}/result.json`` in it (:func:`start_worker`; ``owner``: default this process);
    the process waits for its go (:func:`finish_child`).

    Raises:
        TrainingError: the process could not be started (the folder is removed).
    """
    owner = os.getpid() if owner is None else owner
    folder = tempfile.mkdtemp(prefix=f"spark-imagenet-rank{rank}-")
    args = ["--preload", *(os.path.join(folder, name) for name in ("environ.json", "worker.json", "result.json"))]
    try:
        proc = start_worker(env, module, args, folder, owner)
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise TrainingError(f"could not start the TensorFlow process ({module}) through the host's fork "
                            f"server: {e}") from None
    return Preloaded(proc, folder, dict(env), module, rank, owner)


def _go(proc: ForkedChild) -> bool:
    """Write the ``run`` line to a preloaded process's stdin and close it; False when the process had already
    ended (nothing reads its stdin any more)."""
    try:
        proc.stdin.write(b"run\n")
    except BrokenPipeError:
        return False
    with contextlib.suppress(OSError):
        proc.stdin.close()
    return True


def finish_child(held: Preloaded, prefix: str, prepare: Callable[[str], None], collect: Callable[[str], None],
                 **echo) -> tuple[int, list[str]]:
    """Give a process from :func:`start_preloaded` its inputs and its go, echo its output, read its results.

    A process that had ended before its go (killed while it waited) is not the job's failure: it is replaced
    (``held.proc`` and ``held.folder``) by a fresh one, once. The process is ended and its folder removed
    when :func:`end_child` runs or this process dies.

    Args:
        held: the process (its ``proc`` and ``folder`` may be replaced).
        prefix: put before each echoed line, e.g. ``"[rank 1] "``.
        prepare: called with the folder before the go (to write the inputs).
        collect: called with the folder once the process has ended (to read its results).
        **echo: :func:`echo_output`'s ``tail_lines``, ``out`` and ``shown``.

    Returns:
        ``(exit_code, last_lines)``: a negative code is the killing signal; ``last_lines``: :func:`echo_output`'s.

    Raises:
        TrainingError: the fork server could not fork the process (its one-line reason).
        whatever ``prepare`` or ``collect`` raises.
    """
    try:
        for attempt in (1, 2):
            prepare(held.folder)
            if _go(held.proc) or attempt == 2:
                break
            code = held.proc.wait()
            logger.info(f"the TensorFlow process {exit_description(code)} before its go; starting a new one")
            end_child(held)
            fresh = start_preloaded(held.env, held.module, held.rank, held.owner)
            held.proc, held.folder = fresh.proc, fresh.folder
        tail = echo_output(held.proc.stdout, prefix, **echo)
        code = held.proc.wait()
    except ForkError as e:
        raise TrainingError(f"could not start the TensorFlow process ({held.module}): {e}") from None
    collect(held.folder)
    return code, tail


def end_child(held: Preloaded) -> None:
    """End the process's connection to the fork server (its lifeline: the server kills a process that still
    runs) and wait until the server has removed its folder; a no-op once done."""
    held.proc.close()
