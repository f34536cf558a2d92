"""The task side of training: what runs inside each Spark barrier task.

:func:`run_task` is the function given to
``rdd.barrier().mapPartitions`` (bound to a :class:`TaskSpec` with
``functools.partial``; both are picklable module-level objects). Each task:

0. starts its TensorFlow worker process (step 3) at once, in preload mode: it
   imports TensorFlow while the task stages and meets its peers, and waits for
   its go; or takes the spare that an earlier task left in this reused Python
   worker (docs/design.md, 'Starting TensorFlow early, and a spare for the next job');
1. stages its own train shards and its val shards into the host's shard
   cache (:mod:`spark_imagenet.dataset.cache`);
2. meets the other tasks (:func:`spark_imagenet.training.rendezvous.rendezvous`):
   rank = partition id, every worker's ``host:port``. This happens after the
   downloads, so the probed ports are released only just before TensorFlow
   binds them, and all workers start TensorFlow within moments of each other;
3. gives its go to ``python -m spark_imagenet.training.worker --preload ENV_JSON WORKER_SPEC_JSON
   RESULT_JSON``, a fresh child process that no other job used (TensorFlow's collective ops can
   be configured once per process, and PySpark reuses its Python workers: tensorflow#34568),
   started with TF_USE_LEGACY_KERAS=1 and the task's GPUs (all of them, :func:`task_gpus`) in
   its environment (:func:`preload_env`; set here, inside the executor: the driver's environment
   does not reach executors on a cluster), and given TF_CONFIG (``--strategy multiworker`` only:
   the one-worker strategies skip the rendezvous and have no cluster) in ENV_JSON (:func:`job_env`).
   The child runs under a supervisor
   (:mod:`spark_imagenet.training.supervisor`) in a session of its own, with
   a per-task temporary folder that the supervisor creates and removes: the
   child's working folder and ``TMPDIR``, holding WORKER_SPEC_JSON (the
   worker's :class:`~spark_imagenet.training.config.WorkerSpec`), ENV_JSON and RESULT_JSON;
4. streams the child's output line by line to the task's stderr prefixed
   with ``[rank R]`` (the driver console under ``local[N]``, the executor
   log on a cluster), keeping the last lines for the error message;
5. yields the child's RESULT_JSON, plus ``host``, as one JSON string, after starting a spare
   for the next task of this Python worker (unless ``spare_worker`` is off or PySpark does not
   reuse its Python workers).

However the task ends, the child ends with it and the folder is removed:
PySpark SIGKILLs the Python worker of a cancelled or failed barrier task, so
no ``finally`` here could clean up; the supervisor gets ``PR_SET_PDEATHSIG``
= SIGTERM (Linux) and its stdin is a pipe that closes when the task dies;
either way it SIGKILLs the child and removes the folder. The task ignores
SIGINT while it runs, and the supervisor and child are in their own session,
so a Ctrl-C in the driver's terminal reaches neither (the driver cancels the
job instead: docs/design.md, 'One TensorFlow process per task').

No TensorFlow import here: the Python worker stays light; only the child
imports TensorFlow.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import json
import re
import os
import signal
import subprocess
import sys
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from spark_imagenet.training.assignment import Assignment
from spark_imagenet.training.checkpoints import CheckpointMeta
from spark_imagenet.training.config import EXIT_STEP_TIMEOUT, TrainConfig, WorkerSpec
from spark_imagenet.training.interrupts import sigint_handler
from spark_imagenet.training.logchannel import ChannelSpec, LogSender
from spark_imagenet.training.outputs import LOCAL_OUTPUT_DIR, MODEL_FILE, TENSORBOARD_DIR, publish
from spark_imagenet.errors import ConfigError, PeerFailed, SparkImagenetError, TrainingError, WorkerLost
from spark_imagenet.training.supervisor import EXIT_PRELOAD_ENDED, EXIT_SUPERVISOR_FAILED, set_death_signal

#: The module run in the child process: the TensorFlow worker (reads a :class:`WorkerSpec`).
WORKER_MODULE = "spark_imagenet.training.worker"
#: The module that runs the child, ends it and removes its folder when the task dies.
SUPERVISOR_MODULE = "spark_imagenet.training.supervisor"
#: A checkpoint to resume from: its folder name in ``--checkpoint-dir`` and its meta.
Resume = tuple[str, CheckpointMeta]

#: Lines of child output kept for the error message of a failed rank.
TAIL_LINES = 40
#: Seconds to wait for the supervisor after asking it to stop (it stops at once).
STOP_WAIT_S = 30


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs, built on the driver and pickled.

    Attributes:
        url: the dataset bucket URL (as given to :func:`open_storage`).
        dataset_id: the manifest's dataset id (names the cache sub-folder).
        num_classes: the model's output width.
        assignment: the cluster plan (:func:`spark_imagenet.training.assignment.assign`).
        config: the job's settings (``cache`` already absolute).
        storage_options: :meth:`Storage.reopen_options` of the driver's
            storage (e.g. the emulator endpoint), to reopen it in the task.
        child_module: module run with ``python -m`` in the child; it takes ``--preload ENV_JSON`` as
            :mod:`spark_imagenet.training.worker` does.
        output_options: :meth:`Storage.reopen_options` of the driver's ``--output``
            storage, to publish the chief's model and TensorBoard logs there.
        log_channel: where to send the task's output lines besides its own
            stderr (the driver's :class:`~spark_imagenet.training.logchannel.LogServer`),
            or None (local mode, where the stderr is the console, and Spark Connect).
        checkpoint_options: :meth:`Storage.reopen_options` of ``config.checkpoint_dir``.
        resume: the checkpoint every task restores before training (its folder
            name in ``config.checkpoint_dir`` and its meta), or None to start at epoch 1.
    """

    url: str
    dataset_id: str
    num_classes: int
    assignment: Assignment
    config: TrainConfig
    storage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    child_module: str = WORKER_MODULE
    log_channel: ChannelSpec | None = None
    output_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    checkpoint_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    resume: Resume | None = None


class _ChannelTee(io.TextIOBase):
    """A text stream that writes to ``out`` and sends each complete line to the driver's log channel.

    Lines are sent without ``prefix`` (the driver puts its own rank prefix); the channel never blocks.
    """

    def __init__(self, out, sender: LogSender, prefix: str) -> None:
        super().__init__()
        self._out, self._sender, self._prefix, self._partial = out, sender, prefix, ""

    def write(self, text: str) -> int:
        """Write ``text`` to the stream; send its complete lines."""
        self._out.write(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()[-4096:]  # an unfinished line waits for its end (bounded)
        for line in lines:
            self._sender.send(line.removeprefix(self._prefix))
        return len(text)

    def flush(self) -> None:
        """Flush the stream."""
        self._out.flush()


@contextlib.contextmanager
def _output_to_driver(channel: ChannelSpec | None, rank: int, host: str) -> Iterator[None]:
    """While inside, this task's stderr (its ``[rank R]`` lines and its TensorFlow process's output) also goes
    to the driver through ``channel``; nothing changes when ``channel`` is None."""
    if channel is None:
        yield
        return
    with LogSender(channel, rank, host) as sender, contextlib.redirect_stderr(
            _ChannelTee(sys.stderr, sender, f"[rank {rank}] ")):
        yield


def cuda_visible_devices(addresses: Sequence[str], existing: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES value for the GPUs Spark gave a task.

    The rule (the one PySpark's TorchDistributor follows): Spark's addresses
    are what the discovery script reported, CUDA device indices as the
    executor sees them. Without an executor CUDA_VISIBLE_DEVICES they are used
    as they are; with one, address ``i`` means the executor's ``i``-th visible
    device, so ``["0", "1"]`` under ``CUDA_VISIBLE_DEVICES=3,5,7`` is ``"3,5"``
    (docs/design.md, 'GPUs and CUDA_VISIBLE_DEVICES').

    Args:
        addresses: ``TaskContext.resources()["gpu"].addresses``, GPU indices
            as strings (``["0", "2"]``).
        existing: the executor's own CUDA_VISIBLE_DEVICES (None or empty when
            unset). When set, Spark's addresses index into that list (the
            executor only sees those devices), so they are mapped through it.

    Returns:
        str: comma-separated device ids, e.g. ``"0,2"``.

    Raises:
        ConfigError: an address that is not a plain non-negative integer, or
            one outside the executor's CUDA_VISIBLE_DEVICES list.
    """
    indices = []
    for a in addresses:
        a = str(a).strip()
        if not a.isdigit() or (len(a) > 1 and a.startswith("0")):
            raise ConfigError(
                f"GPU address {a!r} from Spark is not a plain device index; the GPU discovery script must "
                "report CUDA device indices (0, 1, ...)"
            )
        indices.append(int(a))
    visible = [d.strip() for d in existing.split(",")] if existing and existing.strip() else None
    if visible is None:
        return ",".join(str(i) for i in indices)
    bad = [i for i in indices if i >= len(visible)]
    if bad:
        raise ConfigError(
            f"Spark assigned GPU(s) {bad} but the executor's CUDA_VISIBLE_DEVICES={existing!r} has only "
            f"{len(visible)} device(s); make the discovery script report indices relative to it"
        )
    return ",".join(visible[i] for i in indices)


def child_env(base: Mapping[str, str], tf_config: Mapping[str, Any] | None, gpu_addresses: Sequence[str] | None,
              local_workers: int, task_path: Sequence[str] = ()) -> dict[str, str]:
    """The environment of the TensorFlow worker process once it trains: :func:`preload_env` (what it is started
    with) updated with :func:`job_env` (what it sets after its go).

    Args:
        base: the task's environment (``os.environ``).
        tf_config: from :func:`spark_imagenet.training.rendezvous.build_tf_config`;
            None for the one-worker strategies (``mirrored``, ``default``):
            no cluster, and a ``TF_CONFIG`` inherited from ``base`` is dropped.
        gpu_addresses: the task's GPU addresses from Spark, or None when Spark
            assigned no GPU resource.
        local_workers: workers sharing this host.
        task_path: the task's ``sys.path``; its entries outside the interpreter's own installation (the folders
            and zips of ``--py-files``/``addPyFile``, the task's working directory) are appended to PYTHONPATH, so
            the child imports what the task can, e.g. a user's ``--model package.module:function``.

    Returns:
        dict: ``base`` plus TF_CONFIG (JSON; none without ``tf_config``), TF_USE_LEGACY_KERAS=1 (docs/design.md,
        'Keras 2 (tf-keras) under MultiWorkerMirroredStrategy'),
        TF_CPP_MIN_LOG_LEVEL=2 unless set, PYTHONUNBUFFERED=1,
        CUDA_VISIBLE_DEVICES from ``gpu_addresses`` (see
        :func:`cuda_visible_devices`); with no GPU resource and several
        workers on the host, TF_FORCE_GPU_ALLOW_GROWTH=true unless set, so
        co-located workers do not each reserve a whole GPU's memory; and this
        package's folder first on PYTHONPATH, so ``python -m`` finds it even
        when it is not installed.

    Raises:
        ConfigError: see :func:`cuda_visible_devices`.
    """
    return {**preload_env(base, gpu_addresses, task_path), **job_env(base, tf_config, gpu_addresses, local_workers)}


def preload_env(base: Mapping[str, str], gpu_addresses: Sequence[str] | None,
                task_path: Sequence[str] = ()) -> dict[str, str]:
    """The environment the TensorFlow worker process is started with, before the rendezvous: what TensorFlow
    reads when it is imported, all known when the task starts (docs/design.md, 'Starting TensorFlow early, and a
    spare for the next job').

    Args:
        base, gpu_addresses, task_path: as for :func:`child_env`.

    Returns:
        dict: :func:`child_env`'s environment without what :func:`job_env` adds: no TF_CONFIG (dropped from
        ``base``), no TF_FORCE_GPU_ALLOW_GROWTH unless ``base`` has it.

    Raises:
        ConfigError: see :func:`cuda_visible_devices`.
    """
    env = dict(base)
    env.pop("TF_CONFIG", None)
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    if gpu_addresses:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(gpu_addresses, base.get("CUDA_VISIBLE_DEVICES"))
    import spark_imagenet

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(spark_imagenet.__file__)))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [package_parent] + [p for p in paths if p != package_parent]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in _task_only_paths(task_path) if p not in paths])
    return env


def job_env(base: Mapping[str, str], tf_config: Mapping[str, Any] | None, gpu_addresses: Sequence[str] | None,
            local_workers: int) -> dict[str, str]:
    """The environment variables known only after the rendezvous, which the TensorFlow worker process puts into
    its ``os.environ`` after its go, before it builds its strategy (TensorFlow reads them then, not at import).

    Args:
        base, tf_config, gpu_addresses, local_workers: as for :func:`child_env`.

    Returns:
        dict: TF_CONFIG (JSON) with ``tf_config``; TF_FORCE_GPU_ALLOW_GROWTH=true with no GPU resource, several
        workers on the host and none in ``base``.
    """
    extra = {} if tf_config is None else {"TF_CONFIG": json.dumps(tf_config)}
    if not gpu_addresses and local_workers > 1 and "TF_FORCE_GPU_ALLOW_GROWTH" not in base:
        extra["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    return extra


def _task_only_paths(task_path: Sequence[str]) -> list[str]:
    """The entries of ``task_path`` that a fresh interpreter would not have: absolute, existing, not inside
    ``sys.prefix``/``sys.base_prefix`` (the standard library and site-packages), in order, without repeats."""
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    kept: list[str] = []
    for entry in task_path:
        if not isinstance(entry, str):
            continue  # bytes entries: not for PYTHONPATH
        path = os.path.abspath(entry)
        real = os.path.realpath(path)
        if (os.path.exists(path) and path not in kept
                and not any(real == o or real.startswith(o + os.sep) for o in own)):
            kept.append(path)
    return kept


def task_gpus(addresses: Sequence[str] | None, gpus_per_worker: int, rank: int, host: str) -> list[str] | None:
    """Check the GPU addresses Spark gave a task against ``--gpus-per-worker``.

    Args:
        addresses: ``TaskContext.resources()["gpu"].addresses``, None when the
            task has no GPU resource.
        gpus_per_worker: K from the job's config (0 = no GPUs asked for).
        rank, host: named in the message.

    Returns:
        The addresses (all of them: a worker trains on every GPU it is
        given), or None when there are none.

    Raises:
        ConfigError: K > 0 and fewer than K addresses; the message names
            ``spark.task.resource.gpu.amount`` and the executor settings.
    """
    got = [str(a) for a in addresses] if addresses else []
    if gpus_per_worker > 0 and len(got) < gpus_per_worker:
        raise ConfigError(
            f"rank {rank} on {host}: --gpus-per-worker {gpus_per_worker} but Spark gave this task "
            f"{len(got)} GPU(s) {got}; set spark.task.resource.gpu.amount={gpus_per_worker} (with "
            f"spark.executor.resource.gpu.amount >= {gpus_per_worker} and a GPU discovery script, "
            "conf/gpu-discovery.sh)"
        )
    return got or None


def gpu_sharing_warning(addresses: Sequence[str] | None, local_workers: int, host_has_gpus: bool) -> str | None:
    """A warning when several workers on a GPU host would all see every GPU.

    Args:
        addresses: the task's GPU addresses (None: no GPU resource configured).
        local_workers: workers sharing this host.
        host_has_gpus: :func:`spark_imagenet.training.gpus.host_has_gpus` of this host.

    Returns:
        The warning line, or None.
    """
    if addresses or local_workers <= 1 or not host_has_gpus:
        return None
    return (f"warning: this host has GPUs but Spark assigned this task none (no spark.task.resource.gpu.amount): "
            f"all {local_workers} workers on it see every GPU and share their memory; pass --gpus-per-worker K "
            "and set Spark's GPU resources to give each worker its own")


def host_cpus() -> int:
    """CPUs this process may run on (affinity mask, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _supervisor_preexec() -> None:
    """preexec_fn of the supervisor: SIGTERM when the task (its parent) dies, held back until
    the supervisor's handler is in place (the supervisor checks for a parent already gone)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    set_death_signal(signal.SIGTERM)


def _exit_description(code: int) -> str:
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


#: TensorFlow's start-up lines on a host without a CUDA driver: true, but they read like failures
#: ("failed call to cuInit: ... CUDA error") on every CPU-only rank.
_CPU_STARTUP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|Could not find cuda drivers on your machine, GPU will not be used"
    r"|failed call to cuInit"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation placer already registered"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags"
)


class CpuStartupFilter:
    """Hides TensorFlow's CUDA start-up lines of a worker that has no GPU, on a host without one.

    Called with each output line; returns the line to echo, or None. The first
    hidden line is replaced by one line saying that TensorFlow trains on the CPU
    and that its CUDA start-up lines are not shown; the hidden lines stay in
    :func:`run_child`'s tail, so a failure's message still carries them.
    Use it only where no GPU was asked for or found (a GPU worker's CUDA
    errors are real).

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
        if not _CPU_STARTUP_NOISE.search(line):
            return line
        self.hidden += 1
        return self.notice if self.hidden == 1 else None


def _echo(raw: bytes, prefix: str, tail: collections.deque, out,
          shown: Callable[[str], str | None] | None = None) -> None:
    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    line = line.rsplit("\r", 1)[-1]  # a progress bar redraws with \r: keep what the terminal would show
    tail.append(line)
    echo = line if shown is None else shown(line)
    if echo is not None:
        out.write(f"{prefix}{echo}\n")
        out.flush()


def start_child(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
                folder_prefix: str | None = None, preload: bool = False) -> subprocess.Popen:
    """Start the supervisor of a child (:mod:`spark_imagenet.training.supervisor`) in a new session.

    The supervisor gets ``PR_SET_PDEATHSIG`` = SIGTERM, bound to the calling thread (start it from the
    thread that outlives it: a task's main thread); its stdin is the lifeline (:func:`finish_child`).

    Args:
        argv, env, cwd: the child's command, environment (also the supervisor's) and working folder.
        folder_prefix: the name prefix of the child's temporary folder (:class:`ChildFolder`), or None.
        preload: start the child at once, before its inputs are written; it waits for its go (``--preload``).

    Returns:
        The supervisor's ``Popen`` (stdin and stdout pipes, stderr merged into stdout).
    """
    command = [sys.executable, "-m", SUPERVISOR_MODULE, "--parent", str(os.getpid())]
    command += ["--folder", folder_prefix] if folder_prefix is not None else []
    command += ["--preload"] if preload else []
    return subprocess.Popen(
        command + ["--", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(env), cwd=cwd, start_new_session=True, preexec_fn=_supervisor_preexec,
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
    collect its results; the arguments and the result as for :func:`run_child` (``folder.prefix`` unused).

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


def run_child(argv: Sequence[str], env: Mapping[str, str], cwd: str | None, prefix: str,
              tail_lines: int = TAIL_LINES, out=None, folder: ChildFolder | None = None,
              shown: Callable[[str], str | None] | None = None) -> tuple[int, list[str]]:
    """Run a child process under the supervisor, echoing its output line by line.

    The child and its supervisor (:mod:`spark_imagenet.training.supervisor`)
    run in a new session (a Ctrl-C in the terminal does not reach them); the
    child ends, and ``folder`` is removed, when this call returns, raises, or
    this process dies (even by SIGKILL).

    Args:
        argv: the command.
        env: its environment (also the supervisor's, which imports this package).
        cwd: its working folder (None: this process's; with ``folder``, the folder).
        prefix: put before each echoed line, e.g. ``"[rank 1] "``.
        tail_lines: how many of the last lines to keep.
        out: text stream to echo to (default ``sys.stderr``).
        folder: a temporary folder for the child (see :class:`ChildFolder`).
        shown: called with each line, returns what to echo instead (None: nothing), e.g.
            :class:`CpuStartupFilter`; every line is kept in the tail either way.

    Returns:
        ``(exit_code, last_lines)``; a negative code is the killing signal,
        125 (``EXIT_SUPERVISOR_FAILED``) a child that could not be started.

    Raises:
        whatever ``folder.prepare`` or ``folder.collect`` raises (the child is ended first).
    """
    proc = start_child(argv, env, cwd, folder.prefix if folder is not None else None)
    return finish_child(proc, prefix, tail_lines, out, folder, shown)


#: TensorFlow errors of a collective whose peer is gone (or of the coordination service), as the worker's
#: failure line names them; and the ``faulthandler`` line of a start-up that timed out waiting for a peer.
_LOST_PEER = re.compile(r"failed while [^:]+: (UnavailableError|CancelledError|DeadlineExceededError|AbortedError)"
                        r"|^Timeout \(\d+:\d\d:\d\d\)!")


#: Who is missing, as the worker's failure line names it (worker.lost_peers, the step watchdog's peer probe).
_MISSING_PEER = re.compile(r"((?:rank \d+ \([^)]*\)(?:, )?)+ (?:stopped sending heartbeats|does not answer)"
                           r"|the chief, rank 0 \([^)]*\), which runs TensorFlow's coordination service, does not "
                           r"answer heartbeats)")


def worker_lost(code: int, tail: Sequence[str]) -> bool:
    """Whether a TensorFlow process that ended with ``code`` and printed ``tail`` lost a worker (a failure that
    may not recur, so the job is launched again: :class:`~spark_imagenet.errors.WorkerLost`) rather than
    failed on its data or settings.

    Args:
        code: its exit status (negative: the killing signal).
        tail: its last output lines.

    Returns:
        True for a signal (killed, OOM-killed), the step watchdog's exit status
        (:data:`~spark_imagenet.training.config.EXIT_STEP_TIMEOUT`), a start-up that
        timed out waiting for a peer, or a collective aborted because a peer is gone.
    """
    if code < 0 or code == EXIT_STEP_TIMEOUT:
        return True
    return any(_LOST_PEER.search(line) for line in tail)


def _log(rank: int, msg: str) -> None:
    sys.stderr.write(f"[rank {rank}] {msg}\n")
    sys.stderr.flush()


def _stage(spec: TaskSpec, rank: int, host: str) -> tuple[list[str], list[str]]:
    """Fetch this rank's train and val shards into the host's cache; return their local paths.

    Raises:
        StorageError: a shard could not be staged (the message names rank, host and shard).
    """
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.staging import stage_shards

    def log(msg: str) -> None:
        _log(rank, msg)

    try:
        storage = open_storage(spec.url, **spec.storage_options)
        staged = stage_shards(storage, spec.assignment[rank], spec.config.cache, spec.dataset_id,
                              transfers=spec.config.transfers, log=log)
    except SparkImagenetError as e:
        raise type(e)(f"rank {rank} on {host}: {e}") from None
    for what, got in zip(("train", "val"), staged):
        if got.downloaded:
            log(f"{what}: downloaded {got.downloaded} shard(s), {got.bytes_downloaded / 1e6:.1f} MB at "
                f"{got.mb_per_sec:.1f} MB/s; {got.reused} already cached")
    return list(staged[0]), list(staged[1])


def worker_spec(spec: TaskSpec, rank: int, train_files: Sequence[str], val_files: Sequence[str],
                threads: int, peers: Sequence[str] = ()) -> WorkerSpec:
    """The message for rank ``rank``'s TensorFlow worker process (``restore`` is set once the checkpoint
    to resume from has been fetched, :func:`_run_worker`).

    Args:
        spec: the job's task spec.
        rank: the worker's rank.
        train_files, val_files: its staged shard files.
        threads: CPUs for this worker (the host's CPUs / workers on the host);
            also the tf.data parallelism unless ``config.parallel`` is set.
        peers: every worker's ``host:port`` in rank order (empty without a cluster).
    """
    plan = spec.assignment[rank]
    return WorkerSpec(
        config=spec.config, rank=rank, workers=spec.config.workers, num_classes=spec.num_classes,
        train_files=tuple(train_files), train_examples=plan.train_examples,
        val_files=tuple(val_files), val_record_shard=plan.val_record_shard, val_examples=plan.val_examples,
        val_examples_total=spec.assignment.val_examples_total, steps_per_epoch=spec.assignment.steps_per_epoch,
        val_steps=spec.assignment.val_steps, parallel=spec.config.parallel or threads, threads=threads,
        startup_timeout_s=spec.config.startup_timeout, peers=tuple(peers), dataset_id=spec.dataset_id,
        checkpoint_options=dict(spec.checkpoint_options) if spec.config.checkpoint_dir else None,
    )


def _fetch_checkpoint(spec: TaskSpec, folder: str, rank: int, host: str) -> str:
    """Fetch ``spec.resume``'s checkpoint into ``folder/checkpoint``; return that folder (the worker's ``restore``).

    Raises:
        StorageError: a file could not be fetched intact (names rank, host and the file).
    """
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training import checkpoints

    assert spec.resume is not None and spec.config.checkpoint_dir is not None
    name, meta = spec.resume
    local = os.path.join(folder, "checkpoint")
    try:
        storage = open_storage(spec.config.checkpoint_dir, **spec.checkpoint_options)
        checkpoints.download(storage, name, meta, local, transfers=spec.config.transfers)
    except SparkImagenetError as e:
        raise type(e)(f"rank {rank} on {host}: {e}") from None
    return local


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
        spare: started after an earlier task, for the next one in this Python worker.
    """

    proc: subprocess.Popen
    env: dict[str, str]
    key: tuple
    spare: bool = False


#: This Python worker's spare (PySpark reuses its Python workers from task to task): at most one.
_SPARE: list[Preloaded] = []


def preload_key(env: Mapping[str, str], child_module: str) -> tuple:
    """What a preloaded process depends on: the interpreter, the module and the environment it was started with."""
    return sys.executable, child_module, tuple(sorted(env.items()))


def start_preloaded(env: Mapping[str, str], child_module: str, folder_prefix: str, spare: bool = False) -> Preloaded:
    """Start ``python -m child_module --preload {folder}/environ.json {folder}/worker.json {folder}/result.json``
    under its supervisor (``--preload``), from the calling thread (its death signal is bound to it)."""
    argv = [sys.executable, "-m", child_module, "--preload", "{folder}/environ.json", "{folder}/worker.json",
            "{folder}/result.json"]
    return Preloaded(start_child(argv, env, None, folder_prefix, preload=True), dict(env),
                     preload_key(env, child_module), spare)


def spares_enabled(config: TrainConfig, base: Mapping[str, str]) -> bool:
    """Whether a task leaves a spare behind: ``config.spare_worker`` and PySpark reuses this Python worker
    (``spark.python.worker.reuse``, which PySpark passes to its workers as ``SPARK_REUSE_WORKER``)."""
    return bool(config.spare_worker and base.get("SPARK_REUSE_WORKER"))


def take_preloaded(env: Mapping[str, str], child_module: str, rank: int, use_spare: bool) -> Preloaded:
    """This task's TensorFlow process: this Python worker's spare when ``use_spare``, it still runs and its key
    matches ``env`` and ``child_module``; else a new one (folder ``spark-imagenet-rank<R>-``). A spare not
    taken is ended."""
    key = preload_key(env, child_module)
    while _SPARE:
        spare = _SPARE.pop()
        if use_spare and spare.key == key and spare.proc.poll() is None:
            return spare
        end_child(spare.proc)
    return start_preloaded(env, child_module, f"spark-imagenet-rank{rank}-")


def leave_spare(env: Mapping[str, str], child_module: str) -> None:
    """Start a spare for the next task of this Python worker (ending any other); call it from the task's own
    thread once its TensorFlow process has ended."""
    while _SPARE:
        end_child(_SPARE.pop().proc)
    _SPARE.append(start_preloaded(env, child_module, SPARE_FOLDER_PREFIX, spare=True))


def _run_worker(spec: TaskSpec, message: WorkerSpec, extra_env: Mapping[str, str], held: Preloaded, host: str,
                shown: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """Give the TensorFlow worker process ``held`` its inputs and its go; return its result.

    Its folder (``spark-imagenet-rank<R>-*``, or ``spark-imagenet-spare-*`` for a spare, in the task's temporary
    directory) holds ``environ.json`` (``extra_env``, :func:`job_env`), ``worker.json`` and ``result.json`` and
    is the child's ``TMPDIR`` (autograph's generated modules); the supervisor removes it however the task ends
    (:func:`run_child`). A process that had ended before its go (a spare killed while it waited) is replaced by
    a new one, started at once.

    Raises:
        TrainingError: the process failed (rank, host, exit status and its last
            output lines) or wrote no readable result.
    """
    rank = message.rank
    got: dict[str, Any] = {}

    def prepare(folder: str) -> None:
        restore = _fetch_checkpoint(spec, folder, rank, host) if spec.resume is not None else None
        with open(os.path.join(folder, "environ.json"), "w") as f:
            json.dump(dict(extra_env), f)
        with open(os.path.join(folder, "worker.json"), "w") as f:
            json.dump(dataclasses.replace(message, restore=restore).to_json(), f, indent=1)

    def collect(folder: str) -> None:
        path = os.path.join(folder, "result.json")
        try:
            with open(path) as f:
                got["result"] = json.load(f)
        except (OSError, ValueError) as e:
            got["error"] = f"{path}: {e}"
        local = os.path.join(folder, LOCAL_OUTPUT_DIR)
        if rank == 0 and spec.config.output and "result" in got and os.path.isdir(local):
            try:
                names = publish(local, spec.config.output, spec.output_options)
            except SparkImagenetError as e:
                raise type(e)(f"rank 0 on {host}: {e}") from None
            _log(rank, f"output: {len(names)} file(s) written to {spec.config.output} ({MODEL_FILE}, "
                       f"{sum(1 for n in names if n.startswith(TENSORBOARD_DIR + '/'))} TensorBoard file(s))")

    folder = ChildFolder(f"spark-imagenet-rank{rank}-", prepare, collect)
    _log(rank, f"TensorFlow process: {'a spare, started by an earlier task' if held.spare else 'started by this task'}"
               f" (supervisor pid {held.proc.pid})")
    code, tail = finish_child(held.proc, f"[rank {rank}] ", folder=folder, shown=shown)
    if code == EXIT_PRELOAD_ENDED:
        _log(rank, "that TensorFlow process had ended before its go; starting a new one")
        held = start_preloaded(held.env, spec.child_module, folder.prefix)
        code, tail = finish_child(held.proc, f"[rank {rank}] ", folder=folder, shown=shown)
    if code != 0:
        shown = "\n".join(f"  | {line}" for line in tail) or "  | (no output)"
        missing = next((m.group(1) for line in reversed(tail) for m in [_MISSING_PEER.search(line)] if m), None)
        raise (WorkerLost if worker_lost(code, tail) else TrainingError)(
            f"rank {rank} on {host}: " + (f"lost its peer: {missing}; " if missing else "")
            + f"the TensorFlow process ({spec.child_module}) {_exit_description(code)}; "
            f"its last {len(tail)} output line(s):\n{shown}\n"
            f"(end of rank {rank} output)"
        )
    if "result" not in got:
        raise TrainingError(f"rank {rank} on {host}: the TensorFlow process exited 0 but wrote no readable result "
                            f"({got.get('error', 'no folder')})")
    return {**got["result"], "tf_process": {"spare": held.spare, "supervisor_pid": held.proc.pid,
                                            "task_pid": os.getpid()}}


def run_task(spec: TaskSpec, _partition: Iterable[Any]) -> Iterator[str]:
    """Body of one barrier task (see the module docstring); SIGINT is ignored while it runs.

    Args:
        spec: the job's :class:`TaskSpec`.
        _partition: the partition's items (ignored; one partition per worker).

    A task whose preparation fails (its GPUs, its shards) still joins the
    rendezvous with its reason and then raises its own error; the other tasks
    learn of it there and end without training (their result says
    ``"peer_failed"``), so none is killed while blocked in ``allGather``.

    Yields:
        str: one JSON object: the worker's result plus ``"host"``,
        ``"python"`` (the task's interpreter, e.g. a shipped environment's) and ``"tf_process"``
        (``{"spare": whether it was a spare left by an earlier task, "supervisor_pid", "task_pid"}``);
        ``{"rank", "host", "python", "peer_failed"}`` when a peer failed before the rendezvous.

    Raises:
        TrainingError: the child failed (message: rank, host, exit status and
            its last output lines), or the rendezvous failed.
        ConfigError: ``gpus_per_worker`` K > 0 and Spark gave the task fewer
            than K GPUs (names ``spark.task.resource.gpu.amount``), or a GPU
            address that does not map (:func:`cuda_visible_devices`).
        StorageError: a shard could not be staged (message names rank, host
            and shard).
    """
    from pyspark import BarrierTaskContext

    from spark_imagenet.training.rendezvous import split_host_port

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    host = split_host_port(ctx.getTaskInfos()[rank].address)[0]
    spares = spares_enabled(spec.config, os.environ)
    # PySpark's forked workers have Python's default SIGINT handler: a terminal's Ctrl-C that reaches
    # them (workers started without the daemon share the JVM's process group) would crash the task;
    # the driver cancels the job instead.
    with sigint_handler(signal.SIG_IGN), _output_to_driver(spec.log_channel, rank, host):
        held: Preloaded | None = None
        failed: SparkImagenetError | None = None
        gpus: list[str] | None = None
        try:
            try:
                resources = ctx.resources()  # checked before any download
                gpus = task_gpus(resources["gpu"].addresses if "gpu" in resources else None,
                                 spec.config.gpus_per_worker, rank, host)
                env = preload_env(os.environ, gpus, task_path=sys.path)  # --py-files reach the child
                # TensorFlow's import overlaps the staging and the rendezvous
                held = take_preloaded(env, spec.child_module, rank, spares)
                train_files, val_files = _stage(spec, rank, host)
            except SparkImagenetError as e:
                failed = e
            result = _meet_and_train(ctx, spec, rank, host, failed, held, gpus,
                                     (train_files, val_files) if failed is None else ([], []))
        finally:
            if held is not None:
                end_child(held.proc)  # a no-op once it has run
        if spares and held is not None:  # not after a failure: the exception has left already
            leave_spare(held.env, spec.child_module)
    result["python"] = sys.executable
    yield json.dumps(result)


def _meet_and_train(ctx, spec: TaskSpec, rank: int, host: str, failed: SparkImagenetError | None,
                    held: Preloaded | None, gpus: list[str] | None,
                    staged: tuple[Sequence[str], Sequence[str]]) -> dict[str, Any]:
    """The rendezvous (``multiworker``), then the go of ``held`` (started with ``gpus``, the task's GPU
    addresses) on the ``staged`` train and val files; return its result, or ``{"rank", "host",
    "peer_failed"}`` when a peer failed before the rendezvous.

    Raises:
        ``failed`` (this task's own preparation error), after the rendezvous; see :func:`run_task`.
    """
    from spark_imagenet.training.gpus import host_has_gpus
    from spark_imagenet.training.rendezvous import build_tf_config, local_worker_count, rendezvous

    if spec.config.strategy == "multiworker":
        try:  # a failed task still comes to the rendezvous, so no peer is killed while it waits there
            rank, addresses, host = rendezvous(ctx, None if failed is None else " ".join(str(failed).split()))
        except PeerFailed as e:
            if failed is not None:
                raise failed from None  # the stage fails with this task's own error
            _log(rank, f"not training: {e}")
            return {"rank": rank, "host": host, "peer_failed": str(e)}
        local_workers = local_worker_count(addresses, host)
        tf_config: dict[str, Any] | None = build_tf_config(addresses, rank)
        where = f"cluster {addresses}"
    elif failed is not None:
        raise failed
    else:  # one worker, no cluster: no TF_CONFIG, no ports
        local_workers, tf_config, where = 1, None, f"strategy {spec.config.strategy}, no cluster"
    assert held is not None
    train_files, val_files = staged
    env = held.env
    threads = max(1, host_cpus() // max(1, local_workers))
    warning = gpu_sharing_warning(gpus, local_workers, host_has_gpus() if local_workers > 1 else False)
    if warning:
        _log(rank, warning)
    message = worker_spec(spec, rank, train_files, val_files, threads,
                          addresses if spec.config.strategy == "multiworker" else ())
    devices = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if gpus else "no GPU resource"
    _log(rank, f"{host}: {len(train_files)} train + {len(val_files)} val shard(s), {threads} thread(s), "
               f"{devices}, {where}")
    cpu_only = not gpus and not host_has_gpus()
    result = _run_worker(spec, message, job_env(os.environ, tf_config, gpus, local_workers), held, host,
                         CpuStartupFilter() if cpu_only else None)
    result["host"] = host
    return result
