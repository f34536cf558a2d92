"""A barrier task's child process (the TensorFlow worker) under its supervisor, and the spare a task leaves.

:func:`start_child` starts the supervisor (:mod:`spark_imagenet.training.task.supervisor`) in a session of its
own, bound to the task by ``PR_SET_PDEATHSIG``; a TensorFlow worker is forked by the host's fork server
(:func:`fork_server`, :func:`start_preloaded`); :func:`finish_child` gives the child its inputs (a
:class:`ChildFolder`) and its go, echoes its output line by line with a prefix, and collects its results;
:func:`end_child` ends it. A task starts its TensorFlow process early (:func:`take_preloaded`) and may leave a
spare for the next task of its Python worker (:func:`leave_spare`; docs/design.md, 'Starting TensorFlow early,
and a spare for the next job'). No TensorFlow here.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os
import signal
import socket
import subprocess
import sys
from typing import Callable, Mapping, Sequence

from spark_imagenet.training.job import forking, priority
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.forking import set_death_signal
from spark_imagenet.training.job.gpus import is_cpu_startup_line
from spark_imagenet.training.task.supervisor import EXIT_SUPERVISOR_FAILED

#: The module that runs the child, ends it and removes its folder when the task dies.
SUPERVISOR_MODULE = "spark_imagenet.training.task.supervisor"
#: The module of the host's TensorFlow fork server (:func:`fork_server`).
FORK_SERVER_MODULE = "spark_imagenet.training.worker.forkserver"
#: Lines of child output kept for the error message of a failed rank.
TAIL_LINES = 40
#: Seconds to wait for the supervisor after asking it to stop (it stops at once).
STOP_WAIT_S = 30


def _supervisor_preexec() -> None:
    """preexec_fn of the supervisor: SIGTERM when the task (its parent) dies, held back until
    the supervisor's handler is in place (the supervisor checks for a parent already gone)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    set_death_signal(signal.SIGTERM)


def _idle_supervisor_preexec() -> None:
    """preexec_fn of a spare's supervisor: :func:`_supervisor_preexec`, then ``SCHED_IDLE`` (inherited by the
    TensorFlow process it starts; :mod:`spark_imagenet.training.job.priority`)."""
    _supervisor_preexec()
    priority.set_idle()


def exit_description(code: int) -> str:
    """How a process ended: ``"exited with code 1"``, ``"was killed by SIGKILL"``, ``"could not be started (...)"``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == EXIT_SUPERVISOR_FAILED:
        return f"could not be started (supervisor exit status {code})"
    return f"exited with code {code}"


@dataclasses.dataclass(frozen=True)
class ChildFolder:
    """A temporary folder of the child, created and removed by the supervisor.

    The folder is the child's working folder and ``TMPDIR``; ``{folder}`` in
    the child's command is replaced by its path.

    Attributes:
        prefix: the folder's name prefix (``tempfile.mkdtemp``), e.g. ``"spark-imagenet-rank0-"``.
        prepare: called with the folder's path before the child starts (to write its inputs).
        collect: called with the folder's path after the child's output has
            ended, before the folder is removed (to read its results).
    """

    prefix: str
    prepare: Callable[[str], None]
    collect: Callable[[str], None]


class CpuStartupFilter:
    """Hides TensorFlow's CUDA start-up lines of a worker that has no GPU, on a host without one.

    Called with each output line; returns the line to echo, or None. The first
    hidden line is replaced by one line saying that TensorFlow trains on the CPU
    and that its CUDA start-up lines are not shown (the lines are those of
    :func:`~spark_imagenet.training.job.gpus.is_cpu_startup_line`). :func:`finish_child`'s
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


def _echo(raw: bytes, prefix: str, tail: collections.deque, out,
          shown: Callable[[str], str | None] | None = None) -> None:
    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    line = line.rsplit("\r", 1)[-1]  # a progress bar redraws with \r: keep what the terminal would show
    echo = line if shown is None else shown(line)
    if echo is not None:
        tail.append(echo)
        out.write(f"{prefix}{echo}\n")
        out.flush()


def start_child(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
                folder_prefix: str | None = None, preload: bool = False, idle: bool = False,
                fork_server: str | None = None) -> subprocess.Popen:
    """Start the supervisor of a child (:mod:`spark_imagenet.training.task.supervisor`) in a new session.

    The supervisor gets ``PR_SET_PDEATHSIG`` = SIGTERM, bound to the calling thread (start it from the
    thread that outlives it: a task's main thread); its stdin is the lifeline (:func:`finish_child`).

    Args:
        argv, env, cwd: the child's command, environment (also the supervisor's) and working folder.
        folder_prefix: the name prefix of the child's temporary folder (:class:`ChildFolder`), or None.
        preload: start the child at once, before its inputs are written; it waits for its go (``--preload``).
        idle: start the supervisor, and so its child, under ``SCHED_IDLE`` (a spare started while a job runs).
        fork_server: with ``preload``, the name of the fork server (:func:`fork_server`) that forks the child
            (``argv`` is then ``[python, "-m", its module, ARG...]``), instead of the supervisor starting it.

    Returns:
        The supervisor's ``Popen`` (stdin and stdout pipes, stderr merged into stdout).
    """
    command = [sys.executable, "-m", SUPERVISOR_MODULE, "--parent", str(os.getpid())]
    command += ["--folder", folder_prefix] if folder_prefix is not None else []
    command += ["--preload"] if preload else []
    command += ["--fork-server", fork_server] if fork_server is not None else []
    return subprocess.Popen(
        command + ["--", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(env), cwd=cwd, start_new_session=True,
        preexec_fn=_idle_supervisor_preexec if idle else _supervisor_preexec,
    )


def end_child(proc: subprocess.Popen) -> None:
    """End a supervisor started by :func:`start_child` (it kills its child and removes the folder), wait for
    it and close its pipes; a no-op for one already ended."""
    if proc.poll() is None:
        proc.terminate()  # the supervisor kills the child and removes the folder
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            if stream is not None:
                stream.close()


def finish_child(proc: subprocess.Popen, prefix: str, tail_lines: int = TAIL_LINES, out=None,
                 folder: ChildFolder | None = None,
                 shown: Callable[[str], str | None] | None = None) -> tuple[int, list[str]]:
    """Give a child started by :func:`start_child` its inputs and its go, echo its output line by line, and
    collect its results. The child ends, and its folder is removed, when this call returns or raises, or this
    process dies (even by SIGKILL).

    Args:
        proc: the supervisor :func:`start_child` returned.
        prefix: put before each echoed line, e.g. ``"[rank 1] "``.
        tail_lines: how many of the last lines to keep.
        out: text stream to echo to (default ``sys.stderr``).
        folder: the child's temporary folder (:class:`ChildFolder`; its ``prefix`` was given to
            :func:`start_child`), or None when the child was started without one.
        shown: called with each line, returns what to echo instead (None: nothing), e.g.
            :class:`CpuStartupFilter`; the tail keeps what was echoed (without the prefix).

    Returns:
        ``(exit_code, last_lines)``: ``last_lines`` are the last ``tail_lines`` lines echoed; a negative code is
        the killing signal, 125 (``EXIT_SUPERVISOR_FAILED``) a child that could not be started.

    Raises:
        whatever ``folder.prepare`` or ``folder.collect`` raises (the child is ended first).
    """
    out = out or sys.stderr
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        path = None
        if folder is not None:
            first = proc.stdout.readline()
            if first.startswith(b"folder "):
                path = first[len(b"folder "):].decode("utf-8", errors="surrogateescape").rstrip("\n")
                folder.prepare(path)
                with contextlib.suppress(BrokenPipeError):  # a supervisor gone says so by its status
                    proc.stdin.write(b"run\n")
                    proc.stdin.flush()
            elif first:
                _echo(first, prefix, tail, out, shown)  # the supervisor failed: its message
        for raw in proc.stdout:
            _echo(raw, prefix, tail, out, shown)
        if path is not None:
            folder.collect(path)
        with contextlib.suppress(OSError):
            proc.stdin.close()  # releases the folder
        code = proc.wait()
    finally:
        end_child(proc)
    return code, list(tail)


#: The name prefix of a spare's temporary folder (which rank takes it is not known when it starts).
SPARE_FOLDER_PREFIX = "spark-imagenet-spare-"


@dataclasses.dataclass
class Preloaded:
    """A TensorFlow worker process started before its inputs exist, waiting for its go (docs/design.md,
    'Starting TensorFlow early, and a spare for the next job').

    Attributes:
        proc: its supervisor (:func:`start_child` with ``preload``).
        env: the environment it was started with (:func:`preload_env`).
        key: what it was started with (:func:`preload_key`); a task takes only a process of its own key.
        spare: started by an earlier task, for the next one in this Python worker.
        idle: started under ``SCHED_IDLE`` (until a task takes it and wakes it).
        owner: the pid its fork server lives as long as (:func:`fork_server`).
    """

    proc: subprocess.Popen
    env: dict[str, str]
    key: tuple
    spare: bool = False
    idle: bool = False
    owner: int = 0


#: This Python worker's spare (PySpark reuses its Python workers from task to task): at most one.
_SPARE: list[Preloaded] = []


def preload_key(env: Mapping[str, str], child_module: str) -> tuple:
    """What a preloaded process depends on: the interpreter, the module and the environment it was started with."""
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
        env: the environment the forked processes need (:func:`preload_env`); the server is started with it.
        child_module: the module each fork runs (the TensorFlow worker's).
        owner: the pid the server lives as long as: a barrier task passes its executor's PySpark daemon (its
            parent), so the server outlives the Python worker that started it.

    Returns:
        str: the server's name (:func:`~spark_imagenet.training.job.forking.server_name`).

    Raises:
        OSError: the socket could not be made (not ``EADDRINUSE``: a server already listens), or the server
            could not be started.
    """
    name = forking.server_name(owner, preload_key(env, child_module))
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


def start_preloaded(env: Mapping[str, str], child_module: str, folder_prefix: str, spare: bool = False,
                    idle: bool = False, owner: int | None = None) -> Preloaded:
    """Start ``python -m child_module --preload {folder}/environ.json {folder}/worker.json {folder}/result.json``
    under its supervisor (``--preload``; ``idle``: the supervisor under ``SCHED_IDLE``), from the calling thread
    (its death signal is bound to it); the process is forked by the host's fork server for ``env`` and
    ``child_module`` (:func:`fork_server`, of ``owner``: default this process)."""
    owner = os.getpid() if owner is None else owner
    argv = [sys.executable, "-m", child_module, "--preload", "{folder}/environ.json", "{folder}/worker.json",
            "{folder}/result.json"]
    server = fork_server(env, child_module, owner)
    return Preloaded(start_child(argv, env, None, folder_prefix, preload=True, idle=idle, fork_server=server),
                     dict(env), preload_key(env, child_module), spare, idle, owner)


def spares_enabled(config: TrainConfig, base: Mapping[str, str]) -> bool:
    """Whether a task leaves a spare behind: ``config.spare_worker`` and PySpark reuses this Python worker
    (``spark.python.worker.reuse``, which PySpark passes to its workers as ``SPARK_REUSE_WORKER``)."""
    return bool(config.scaling.spare_worker and base.get("SPARK_REUSE_WORKER"))


def _woken(spare: Preloaded) -> bool:
    """Wake an idle spare's whole process tree (:func:`~spark_imagenet.training.job.priority.wake_tree`);
    False when the system refuses (the spare is then not to be used)."""
    if not spare.idle:
        return True
    try:
        priority.wake_tree(spare.proc.pid)
    except OSError:
        return False
    spare.idle = False
    return True


def take_preloaded(env: Mapping[str, str], child_module: str, rank: int, use_spare: bool,
                   owner: int | None = None) -> Preloaded:
    """This task's TensorFlow process: this Python worker's spare when ``use_spare``, it still runs, its key
    matches ``env`` and ``child_module`` and it could be woken from ``SCHED_IDLE``; else a new one (folder
    ``spark-imagenet-rank<R>-``, forked by the fork server of ``owner``: :func:`start_preloaded`). A spare not
    taken is ended."""
    key = preload_key(env, child_module)
    while _SPARE:
        spare = _SPARE.pop()
        if use_spare and spare.key == key and spare.proc.poll() is None and _woken(spare):
            return spare
        end_child(spare.proc)
    return start_preloaded(env, child_module, f"spark-imagenet-rank{rank}-", owner=owner)


def start_spare_early(env: Mapping[str, str], child_module: str, owner: int | None = None) -> bool:
    """Start the spare for the next task of this Python worker now, while this task's job runs, under
    ``SCHED_IDLE`` (its import then takes only CPU time the job leaves): only where this process may wake it
    again (:func:`~spark_imagenet.training.job.priority.idle_reversible`). Call it from the task's own thread.

    Returns:
        bool: whether a spare was started (False: :func:`leave_spare` starts one when the task ends).
    """
    if not priority.idle_reversible():
        return False
    drop_spare()
    _SPARE.append(start_preloaded(env, child_module, SPARE_FOLDER_PREFIX, spare=True, idle=True, owner=owner))
    return True


def leave_spare(env: Mapping[str, str], child_module: str, owner: int | None = None) -> None:
    """Leave a spare for the next task of this Python worker: keep the one :func:`start_spare_early` started
    if it still runs and has this key, else end any other and start one (under ``SCHED_IDLE`` where it can be
    woken again). Call it from the task's own thread once its TensorFlow process has ended."""
    key = preload_key(env, child_module)
    if len(_SPARE) == 1 and _SPARE[0].key == key and _SPARE[0].proc.poll() is None:
        return
    drop_spare()
    idle = priority.idle_reversible()
    _SPARE.append(start_preloaded(env, child_module, SPARE_FOLDER_PREFIX, spare=True, idle=idle, owner=owner))


def drop_spare() -> None:
    """End this Python worker's spare, if any (after a failed task)."""
    while _SPARE:
        end_child(_SPARE.pop().proc)
