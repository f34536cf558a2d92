"""The task side of training: what runs inside each Spark barrier task.

:func:`run_task` is the function given to
``rdd.barrier().mapPartitions`` (bound to a :class:`TaskSpec` with
``functools.partial``; both are picklable module-level objects). Each task:

0. starts its TensorFlow worker process (step 3) at once, in preload mode: it
   is ready while the task stages and meets its peers, and waits for its go;
1. stages its own train shards and its val shards into the host's shard
   cache (:mod:`spark_imagenet.dataset.cache`);
2. meets the other tasks (:func:`spark_imagenet.training.task.rendezvous.rendezvous`):
   rank = partition id, every worker's ``host:port``. This happens after the
   downloads, so the probed ports are released only just before TensorFlow
   binds them, and all workers start TensorFlow within moments of each other;
3. gives its go to ``python -m spark_imagenet.training.worker.main --preload ENV_JSON WORKER_SPEC_JSON
   RESULT_JSON``, a fresh child process that no other job used, forked by the host's TensorFlow fork server
   from a process that imported TensorFlow and started nothing of it (TensorFlow's collective ops can
   be configured once per process, and PySpark reuses its Python workers: tensorflow#34568),
   started with TF_USE_LEGACY_KERAS=1 and the task's GPUs (all of them, :func:`task_gpus`) in
   its environment (:func:`preload_env`; set here, inside the executor: the driver's environment
   does not reach executors on a cluster), and given TF_CONFIG (``--strategy multiworker`` only:
   the one-worker strategies skip the rendezvous and have no cluster) in ENV_JSON (:func:`job_env`).
   The task holds the child's connection to the fork server and a per-task temporary folder that it
   creates and the server removes: the child's working folder and ``TMPDIR``, holding WORKER_SPEC_JSON (the
   worker's :class:`~spark_imagenet.training.job.plan.WorkerSpec`), ENV_JSON and RESULT_JSON
   (:mod:`spark_imagenet.training.task.child`);
4. streams the child's output line by line to the task's stderr prefixed
   with ``[rank R]`` (the driver console under ``local[N]``, the executor
   log on a cluster), keeping the last lines for the error message; the task's
   own log lines get the same prefix (:func:`spark_imagenet.logs.task_console`);
5. yields a :class:`~spark_imagenet.training.job.outcome.TaskResult` (the child's
   :class:`~spark_imagenet.training.job.outcome.WorkerResult`, the host, which process ran) as one JSON
   line. A failure is raised as the error of a
   :class:`~spark_imagenet.training.job.outcome.Failure` (the one the child wrote to RESULT_JSON, with the
   exit status and last output lines added; or the task's own, e.g. a shard it could not stage), which the
   driver reads back typed (:meth:`~spark_imagenet.training.job.outcome.Failure.find`).

However the task ends, the child ends with it and the folder is removed:
PySpark SIGKILLs the Python worker of a cancelled or failed barrier task, so
no ``finally`` here could clean up; the task's connection to the fork server
closes when the task dies, and the server then SIGKILLs the child and removes
the folder. The task ignores SIGINT while it runs, and the child is in a
session of its own, so a Ctrl-C in the driver's terminal reaches neither (the
driver cancels the job instead: docs/design.md, 'One TensorFlow process per task').

No TensorFlow import here: the Python worker stays light; only the child
imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import signal
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from spark_imagenet.training.job.config import EXIT_STEP_TIMEOUT, TrainConfig
from spark_imagenet.training.job.plan import JobPlan, WorkerSpec, worker_spec
from spark_imagenet.training.job.interrupts import sigint_handler
from spark_imagenet.training.job.logchannel import STAGE_CONNECT, ChannelSpec
from spark_imagenet.training.task.logsender import LogSender
from spark_imagenet.storage.lease import check_held
from spark_imagenet.training.job.outputs import LOCAL_OUTPUT_DIR, MODEL_FILE, SERVING_DIR, TENSORBOARD_DIR, publish
from spark_imagenet.training.job.tracking import MODEL_DIR as MLFLOW_MODEL_DIR
from spark_imagenet.training.job.outcome import Failure, ResumePoint, TaskResult, TfProcess, WorkerResult, read_outcome
from spark_imagenet.errors import ConfigError, PeerFailed, SparkImagenetError
from spark_imagenet.logs import task_console
from spark_imagenet.training.task.child import (CpuStartupFilter, Preloaded, end_child, exit_description, finish_child,
                                               start_preloaded)
from spark_imagenet.training.task.environment import gpu_sharing_warning, host_cpus, job_env, preload_env, task_gpus

logger = logging.getLogger(__name__)

#: The module run in the child process: the TensorFlow worker (reads a :class:`WorkerSpec`).
WORKER_MODULE = "spark_imagenet.training.worker.main"
#: Seconds a task whose TensorFlow process failed because a peer went away waits before it fails the stage:
#: the peer's own task (its process killed by a signal, its own error) then fails first, and Spark reports
#: the cause, not this consequence (the first failed task of a barrier stage is the one the driver sees).
PEER_CAUSE_GRACE_S = 3.0
#: The stages of a task, named in its failure (the TensorFlow worker names its own).
STAGE_GPUS = "checking its GPUs"
STAGE_STAGING = "staging its shards"
STAGE_RENDEZVOUS = "meeting its peers"
STAGE_CHECKPOINT = "fetching the checkpoint to resume from"
STAGE_OUTPUT = "publishing --output"
STAGE_START = "starting its TensorFlow process"



@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What every barrier task of one launch receives (pickled, bound to :func:`run_task` with
    ``functools.partial``): the job and what this launch adds to it.

    Attributes:
        job: the job, resolved once on the driver (:class:`~spark_imagenet.training.job.plan.JobPlan`).
        resume: the checkpoint every task restores before training, or None to start at epoch 1.
        log_channel: the driver's :class:`~spark_imagenet.training.driver.logserver.LogServer`: where the task
            sends its output lines besides its own stderr (unless ``lines`` is off: ``local[N]``, where the
            stderr is the console) and where it meets its peers; or None (a remote Spark Connect server, or
            a relaunch after a task could not connect): no lines sent, the tasks meet through ``allGather``.
        child_module: module run with ``python -m`` in the child; it takes ``--preload ENV_JSON`` as
            :mod:`spark_imagenet.training.worker.main` does.
    """

    job: JobPlan
    resume: ResumePoint | None = None
    log_channel: ChannelSpec | None = None
    child_module: str = WORKER_MODULE

    @property
    def config(self) -> TrainConfig:
        """TrainConfig: the job's settings."""
        return self.job.config


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
def _output_to_driver(channel: ChannelSpec | None, rank: int, host: str) -> Iterator[LogSender | None]:
    """While inside, this task's stderr (its ``[rank R]`` lines and its TensorFlow process's output) also goes
    to the driver through ``channel`` (when ``channel.lines``); yields the connection (for the rendezvous),
    or None and changes nothing when ``channel`` is None."""
    if channel is None:
        yield None
        return
    with LogSender(channel, rank, host) as sender:
        if not channel.lines:
            yield sender
            return
        with contextlib.redirect_stderr(_ChannelTee(sys.stderr, sender, f"[rank {rank}] ")):
            yield sender


def _stage(spec: TaskSpec, rank: int) -> tuple[list[str], list[str]]:
    """Fetch this rank's train and val shards into the host's cache; return their local paths.

    Raises:
        StorageError: a shard could not be staged (the message names the shard).
    """
    from spark_imagenet.training.task.staging import stage_shards

    staged = stage_shards(spec.job.dataset, spec.job.assignment[rank], spec.config.data.cache, spec.job.dataset_id,
                          transfers=spec.config.data.transfers)
    for what, got in zip(("train", "val"), staged):
        if got.downloaded:
            logger.info(f"{what}: downloaded {got.downloaded} shard(s), {got.bytes_downloaded / 1e6:.1f} MB at "
                        f"{got.mb_per_sec:.1f} MB/s; {got.reused} already cached")
    return list(staged[0]), list(staged[1])


def _fetch_checkpoint(spec: TaskSpec, folder: str) -> str:
    """Fetch ``spec.resume``'s checkpoint into ``folder/checkpoint``; return that folder (the worker's ``restore``).

    Raises:
        StorageError: a file could not be fetched intact (names the file).
    """
    from spark_imagenet.training.job import checkpoints

    assert spec.resume is not None and spec.job.checkpoints is not None
    local = os.path.join(folder, "checkpoint")
    checkpoints.download(spec.job.checkpoints, spec.resume.name, spec.resume.meta, local,
                         transfers=spec.config.data.transfers)
    return local


@contextlib.contextmanager
def failing_as(stage: str, rank: int, host: str) -> Iterator[None]:
    """While inside, an error of this package becomes the error of a :class:`Failure` at ``stage`` of rank
    ``rank`` on ``host`` (:meth:`Failure.to_error`: same class, the failure's JSON on its last line for the
    driver); an error that carries its failure already passes unchanged."""
    try:
        yield
    except SparkImagenetError as e:
        if getattr(e, "failure", None) is not None:
            raise
        raise Failure(stage=stage, message=str(e), error=type(e).__name__, rank=rank, host=host).to_error() from None


def process_failure(outcome: WorkerResult | Failure | None, code: int, tail: Sequence[str], rank: int, host: str,
                    module: str) -> Failure:
    """The failure of a TensorFlow process that ended with ``code`` after printing ``tail``.

    Args:
        outcome: what it wrote to ``result.json`` (its failure, a result, or None: nothing).
        code: its exit status (negative: the killing signal).
        tail: its last output lines.
        rank, host: the task's.
        module: the module it ran.

    Returns:
        ``outcome`` (or, when it wrote no failure, one saying so) with rank, host, exit status, output and
        process added; a lost worker (``"WorkerLost"``) when a signal ended it or the step watchdog did
        (:data:`~spark_imagenet.training.job.config.EXIT_STEP_TIMEOUT`), or when the worker said so.
    """
    if isinstance(outcome, Failure):
        failure = outcome
    elif code == 0:
        failure = Failure(stage="writing the result", message="it wrote no readable result")
    else:
        failure = Failure(stage="running", message="it ended before it could report a failure")
    lost = code < 0 or code == EXIT_STEP_TIMEOUT
    return dataclasses.replace(failure, rank=rank, host=host, exit_status=code, output=tuple(tail),
                               process=f"the TensorFlow process ({module}) {exit_description(code)}",
                               error="WorkerLost" if lost else failure.error)


def _run_worker(spec: TaskSpec, message: WorkerSpec, extra_env: Mapping[str, str], held: Preloaded, host: str,
                shown: Callable[[str], str | None] | None = None) -> tuple[WorkerResult, TfProcess]:
    """Give the TensorFlow worker process ``held`` its inputs and its go; return its result and which process ran.

    Its folder (``spark-imagenet-rank<R>-*`` in the task's temporary directory) holds ``environ.json``
    (``extra_env``, :func:`job_env`), ``worker.json`` and ``result.json`` and is the child's ``TMPDIR``
    (autograph's generated modules); the fork server removes it however the task ends. A process that had
    ended before its go (killed while it waited) is replaced by a new one, once (:func:`finish_child`).

    Raises:
        TrainingError, WorkerLost, or the class the worker named: the process failed (the error carries its
            :class:`Failure`: stage, rank, host, exit status, lost peers, last output lines).
        StorageError: the checkpoint could not be fetched, or ``--output`` not published (with its failure).
    """
    rank = message.rank
    got: dict[str, Any] = {}

    def prepare(folder: str) -> None:
        with failing_as(STAGE_CHECKPOINT, rank, host):
            restore = _fetch_checkpoint(spec, folder) if spec.resume is not None else None
        with open(os.path.join(folder, "environ.json"), "w") as f:
            json.dump(dict(extra_env), f)
        with open(os.path.join(folder, "worker.json"), "w") as f:
            json.dump(dataclasses.replace(message, restore=restore).to_json(), f, indent=1)

    def collect(folder: str) -> None:
        try:
            got["outcome"] = read_outcome(os.path.join(folder, "result.json"))
        except ConfigError as e:
            got["outcome"] = Failure(stage="writing the result", message=str(e))
        local = os.path.join(folder, LOCAL_OUTPUT_DIR)
        output = spec.job.output
        if rank == 0 and output and isinstance(got["outcome"], WorkerResult) and os.path.isdir(local):
            with failing_as(STAGE_OUTPUT, rank, host):
                if spec.job.run_id:
                    check_held(output, spec.job.run_id)  # the driver is gone or another run took the folder
                names = publish(local, output)
            logger.info(f"output: {len(names)} file(s) written to {spec.config.run.output} ({MODEL_FILE}, "
                        f"{sum(1 for n in names if n.startswith(SERVING_DIR + '/'))} SavedModel file(s), "
                        f"{sum(1 for n in names if n.startswith(TENSORBOARD_DIR + '/'))} TensorBoard file(s)"
                        + (f", {mlflow_files} MLflow model file(s))" if (mlflow_files := sum(
                            1 for n in names if n.startswith(MLFLOW_MODEL_DIR + "/"))) else ")"))

    with failing_as(STAGE_START, rank, host):
        code, tail = finish_child(held, f"[rank {rank}] ", prepare, collect, shown=shown)
    outcome = got.get("outcome")
    if code != 0 or not isinstance(outcome, WorkerResult):
        failure = process_failure(outcome, code, tail, rank, host, spec.child_module)
        if isinstance(outcome, Failure) and failure.lost:
            # This worker failed because a peer went away: give that peer's own task (its process killed, its
            # error) a head start, so that the stage fails with the cause rather than this consequence.
            time.sleep(PEER_CAUSE_GRACE_S)
        raise failure.to_error()
    return outcome, TfProcess(pid=held.proc.pid, task_pid=os.getpid())


def run_task(spec: TaskSpec, _partition: Iterable[Any]) -> Iterator[str]:
    """Body of one barrier task (see the module docstring); SIGINT is ignored while it runs.

    Args:
        spec: the job's :class:`TaskSpec`.
        _partition: the partition's items (ignored; one partition per worker).

    A task whose preparation fails (its GPUs, its shards) still joins the
    rendezvous with its reason and then raises its own error; the other tasks
    learn of it there and end without training (their result says
    ``peer_failed``), so none is killed while blocked in the rendezvous. A task of a ``multiworker`` job
    that cannot connect to the driver's channel fails at once (it could not tell its peers), in the stage
    :data:`~spark_imagenet.training.job.logchannel.STAGE_CONNECT`: the driver then launches the stage again
    with ``allGather`` for every task (the task's error is a ``TrainingError``).

    Yields:
        str: one :class:`~spark_imagenet.training.job.outcome.TaskResult` as a JSON line (:meth:`TaskResult.to_line`).

    Raises:
        SparkImagenetError: of the class of what failed, carrying its :class:`Failure` (stage, rank, host, and
            for a TensorFlow process its exit status, lost peers and last output lines; the driver reads it
            back with :meth:`Failure.find`): the TensorFlow process failed (``TrainingError``, ``WorkerLost``),
            the rendezvous failed, ``gpus_per_worker`` K > 0 and Spark gave the task fewer than K GPUs or an
            address that does not map (``ConfigError``), a shard could not be staged (``StorageError``).
    """
    from pyspark import BarrierTaskContext

    from spark_imagenet.training.task.rendezvous import split_host_port

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    host = split_host_port(ctx.getTaskInfos()[rank].address)[0]
    owner = os.getppid()  # the executor's PySpark daemon (or its JVM): the host's fork server lives as long
    # PySpark's forked workers have Python's default SIGINT handler: a terminal's Ctrl-C that reaches
    # them (workers started without the daemon share the JVM's process group) would crash the task;
    # the driver cancels the job instead.
    with sigint_handler(signal.SIG_IGN), _output_to_driver(spec.log_channel, rank, host) as channel, \
            task_console(rank):
        held: Preloaded | None = None
        failed: SparkImagenetError | None = None
        gpus: list[str] | None = None
        if channel is not None and spec.config.scaling.strategy == "multiworker":
            with failing_as(STAGE_CONNECT, rank, host):
                channel.reach()  # else its peers would wait for it at the rendezvous
        try:
            try:
                with failing_as(STAGE_GPUS, rank, host):
                    resources = ctx.resources()  # checked before any download
                    gpus = task_gpus(resources["gpu"].addresses if "gpu" in resources else None,
                                     spec.config.scaling.gpus_per_worker)
                    env = preload_env(os.environ, gpus, task_path=sys.path)  # --py-files reach the child
                # TensorFlow's import overlaps the staging and the rendezvous
                with failing_as(STAGE_START, rank, host):
                    held = start_preloaded(env, spec.child_module, rank, owner)
                with failing_as(STAGE_STAGING, rank, host):
                    train_files, val_files = _stage(spec, rank)
            except SparkImagenetError as e:
                failed = e
            result = _meet_and_train(ctx, spec, rank, host, failed, held, gpus,
                                     (train_files, val_files) if failed is None else ([], []), channel)
        finally:
            if held is not None:
                end_child(held)  # a no-op once it has run
    yield dataclasses.replace(result, python=sys.executable).to_line()


def _meet_and_train(ctx, spec: TaskSpec, rank: int, host: str, failed: SparkImagenetError | None,
                    held: Preloaded | None, gpus: list[str] | None,
                    staged: tuple[Sequence[str], Sequence[str]], channel: LogSender | None = None) -> TaskResult:
    """The rendezvous (``multiworker``; over the driver's ``channel``, else ``allGather``), then the go of
    ``held`` (started with ``gpus``, the task's GPU addresses) on the ``staged`` train and val files; return the
    task's result (``peer_failed`` when a peer failed before the rendezvous).

    Raises:
        ``failed`` (this task's own preparation error), after the rendezvous; see :func:`run_task`.
    """
    from spark_imagenet.training.job.gpus import host_has_gpus
    from spark_imagenet.training.task.rendezvous import build_tf_config, local_worker_count, rendezvous

    if spec.config.scaling.strategy == "multiworker":
        failure = getattr(failed, "failure", None)
        reason = None if failed is None else " ".join((failure.summary() if failure else str(failed)).split())
        with failing_as(STAGE_RENDEZVOUS, rank, host):
            try:  # a failed task still comes to the rendezvous, so no peer is killed while it waits there
                rank, addresses, host = rendezvous(ctx, reason, channel)
            except PeerFailed as e:
                if failed is not None:
                    raise failed from None  # the stage fails with this task's own error
                logger.info(f"not training: {e}")
                return TaskResult(rank=rank, host=host, python=sys.executable, peer_failed=str(e))
        local_workers = local_worker_count(addresses, host)
        tf_config: dict[str, Any] | None = build_tf_config(addresses, rank)
        where = f"cluster {addresses}"
    elif failed is not None:
        raise failed
    else:  # one worker, no cluster: no TF_CONFIG, no ports
        local_workers, tf_config, where = 1, None, f"strategy {spec.config.scaling.strategy}, no cluster"
    assert held is not None
    train_files, val_files = staged
    env = held.env
    threads = max(1, host_cpus() // max(1, local_workers))
    warning = gpu_sharing_warning(gpus, local_workers, host_has_gpus() if local_workers > 1 else False)
    if warning:
        logger.warning(warning)
    message = worker_spec(spec.job, rank, train_files, val_files, threads,
                          addresses if spec.config.scaling.strategy == "multiworker" else ())
    devices = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if gpus else "no GPU resource"
    logger.info(f"{host}: {len(train_files)} train + {len(val_files)} val shard(s), {threads} thread(s), "
                f"{devices}, {where}")
    cpu_only = not gpus and not host_has_gpus()
    worker, process = _run_worker(spec, message, job_env(os.environ, tf_config, gpus, local_workers), held, host,
                                  CpuStartupFilter() if cpu_only else None)
    return TaskResult(rank=rank, host=host, python=sys.executable, worker=worker, tf_process=process)
