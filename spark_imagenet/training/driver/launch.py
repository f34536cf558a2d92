"""The driver side of training: check, plan, launch the barrier stage, report.

:func:`train` runs one MultiWorkerMirroredStrategy job as one Spark barrier
stage of N tasks (``sc.parallelize(range(N), N).barrier().mapPartitions``; on
Spark Connect ``spark.range(N, numPartitions=N).mapInArrow(..., barrier=True)``,
:mod:`spark_imagenet.training.driver.connect`), one TensorFlow worker per task (the task side is
:mod:`spark_imagenet.training.task.barrier_task`). It is two steps, which the
command line runs apart so that mistakes needing no cluster are reported
before Spark starts:

1. :func:`plan_job` (no Spark): the results path, the dataset's manifest, and
   the assignment of shards to ranks (at least N train shards).
2. :func:`run_job`: the Spark checks (:mod:`spark_imagenet.training.driver.preflight`),
   the barrier stage, then the per-worker records combined into one results
   dict (:mod:`spark_imagenet.training.driver.results`), a table and optionally a JSON file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.dataset.transfer import check_listed
from spark_imagenet.storage import lease
from spark_imagenet.errors import ConfigError, SparkImagenetError, TrainingError, WorkerLost
from spark_imagenet.logs import ensure_console
from spark_imagenet.storage import is_remote_url, open_storage
from spark_imagenet.training.job import checkpoints
from spark_imagenet.training.job.assignment import assign
from spark_imagenet.training.task.barrier_task import TaskSpec
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.master import Master
from spark_imagenet.training.driver.connect import ConnectLaunch, check_connect, conf_getter, connect_url
from spark_imagenet.training.driver.stage import BarrierLaunch, ClassicLaunch, run_stage
from spark_imagenet.training.job.gpus import check_gpu_conf
from spark_imagenet.training.job.logchannel import ChannelSpec
from spark_imagenet.training.driver.logserver import LogServer, driver_host
from spark_imagenet.training.driver.meeting_server import driver_meeting
from spark_imagenet.training.job.outcome import Failure, ResumePoint, TaskResult
from spark_imagenet.training.job.outputs import (
    MODEL_FILE,
    PREPROCESSING_FILE,
    SERVING_DIR,
    TENSORBOARD_DIR,
    open_output,
    write_driver_outputs,
)
from spark_imagenet.training.driver.preflight import (
    check_apart_from_dataset,
    check_cluster_conf,
    check_dataset_reachable,
    check_output_reachable,
    check_output_unused,
    check_results_path,
    check_spark,
    free_slots,
    spark_context,
)
from spark_imagenet.training.job.plan import JobPlan
from spark_imagenet.training.job.restarts import FailurePolicy
from spark_imagenet.training.job.schedules import extension_note, schedule_for
from spark_imagenet.training.driver.results import Result, build_results, format_table, write_results
from spark_imagenet.training.driver.tracking import RunTracker, check_tracking
from spark_imagenet.training.driver.spark_session import is_connect_url, runs_in_driver_jvm

logger = logging.getLogger(__name__)


def plan_job(url: str | os.PathLike, config: TrainConfig) -> JobPlan:
    """Everything about the job that needs no Spark: results path, manifest, assignment.

    Returns:
        JobPlan: with ``config.cache`` and a local ``config.output`` made absolute.

    Raises:
        ConfigError: an unwritable ``results`` path, ``output`` or ``checkpoint_dir``, either of them the
            dataset's own folder, an ``output`` holding an earlier run's outputs without ``overwrite``, too few train shards
            for the workers, GPUs asked of a ``local[N]`` master (which never gives tasks GPUs), a checkpoint
            in ``checkpoint_dir`` this job cannot resume from (:func:`resume_point`).
        ManifestError: no or invalid manifest at ``url``, or a shard it names is missing or differs in the
            store (:func:`~spark_imagenet.dataset.transfer.check_listed`).
        StorageError: the storage cannot be read.
    """
    check_results_path(config.results)
    if config.gpus_per_worker and runs_in_driver_jvm(config.master or ""):
        check_gpu_conf(lambda key: None, config.gpus_per_worker, config.workers, config.master.strip())
    if config.cache is not None:  # the executors' folder, as the driver's working directory names it
        config = config.replace(cache=str(Path(config.cache).expanduser().absolute()))
    output = checkpoints_at = None
    if config.output is not None:  # written by the chief: refused now if it cannot be written
        output = open_output(config.output)
        check_output_unused(output, config.output, config.overwrite)
        if not is_remote_url(config.output):  # a folder here: its absolute path, as the chief must see it
            config = config.replace(output=output.url)
    if config.checkpoint_dir is not None:  # written by the chief after every epoch: refused now if it cannot be
        checkpoints_at = open_output(config.checkpoint_dir, "--checkpoint-dir")
        if not is_remote_url(config.checkpoint_dir):
            config = config.replace(checkpoint_dir=checkpoints_at.url)
    storage = open_storage(url)
    check_apart_from_dataset(storage, output, "--output")
    check_apart_from_dataset(storage, checkpoints_at, "--checkpoint-dir")
    manifest = Manifest.load(storage)
    check_listed(storage, manifest)  # a shard deleted or replaced since: caught here, not hidden by a host's cache
    plan = assign(manifest, config.workers, config.batch_size)
    schedule = schedule_for(config, plan.steps_per_epoch)  # the job's one schedule; one that does not fit is refused
    job = JobPlan(config=config, dataset=storage, manifest=manifest, assignment=plan,
                  schedule=schedule, output=output, checkpoints=checkpoints_at, run_id=uuid.uuid4().hex)
    resume_point(job)  # a checkpoint this job cannot resume from is refused before Spark starts
    check_tracking(job)
    useless = FailurePolicy.of(config).useless_min_workers()
    if useless:
        logger.warning(useless)
    if config.checkpoint_every and config.checkpoint_dir is None:
        logger.warning("warning: --checkpoint-every has no effect without --checkpoint-dir: no checkpoint is kept")
    return job


def _announce(job: JobPlan) -> None:
    """Log what is about to run, and warn about batches larger than a worker's data."""
    config, plan = job.config, job.assignment
    smallest = min(p.train_examples for p in plan.workers)
    if config.batch_size > smallest:
        logger.warning(f"warning: --batch-size {config.batch_size} is larger than the {smallest} train images of the "
                       "smallest worker; its batches repeat images within one step (use a smaller batch or fewer "
                       "workers)")
    logger.info(f"training {config.model} on {job.url}: {config.workers} worker(s), {plan.train_examples_total} "
                f"train / "
                f"{plan.val_examples_total} val images, {config.epochs} epoch(s) x {plan.steps_per_epoch} steps, "
                f"batch {config.batch_size} per worker")
    logger.info(job.schedule.describe())
    logger.info(f"recipe: optimizer {config.optimizer}, momentum {config.momentum:g}, "
                f"weight decay {config.weight_decay:g}, "
                f"label smoothing {config.label_smoothing:g}, precision {config.precision}, "
                f"XLA {'on' if config.jit_compile else 'off'}")


def resume_point(job: JobPlan, *, announce: bool = False) -> ResumePoint | None:
    """The latest complete checkpoint in ``job.config.checkpoint_dir`` that this job may resume from.

    With ``announce``, each folder skipped as half-written is logged (INFO).

    Returns:
        The checkpoint's :class:`ResumePoint`, or None: no ``checkpoint_dir``, or no complete checkpoint in it yet.

    Raises:
        ConfigError: the checkpoint is of another dataset, model, cluster shape or
            recipe, or of more epochs than ``epochs`` (:func:`~spark_imagenet.training.job.checkpoints.check_compatible`).
        StorageError: the folder cannot be listed or a ``checkpoint.json`` read.
    """
    config = job.config
    if job.checkpoints is None:
        return None
    found = checkpoints.latest(job.checkpoints, announce=announce)
    if found is None:
        return None
    name, meta = found
    checkpoints.check_compatible(meta, checkpoints.expected_for(config, job.manifest),
                                 f"--checkpoint-dir {config.checkpoint_dir}, {name}")
    return ResumePoint(name, meta)


def _launch_with_restarts(spark, sc, job: JobPlan) -> tuple[list[TaskResult], int, JobPlan]:
    """Run the barrier stage; after a :class:`WorkerLost` failure launch it again as the job's
    :class:`~spark_imagenet.training.job.restarts.FailurePolicy` decides (at most ``config.max_restarts``
    times, each time from the latest complete checkpoint, from epoch 1 without ``checkpoint_dir``; on fewer
    workers when ``min_workers`` allows and the slots are not free within ``regain_timeout``). Returns every
    rank's record, the number of restarts and the job the last launch ran.

    Raises:
        WorkerLost: the last allowed launch lost a worker too (the message counts the launches).
        SparkImagenetError: any other failure, at once (bad data or settings fail again the same way).
    """
    wanted, policy = job, FailurePolicy.of(job.config)
    restarts = 0
    while True:
        resume = resume_point(job, announce=True)
        _announce_resume(job, resume, restarts)
        try:
            return _launch(spark, sc, job, resume), restarts, job
        except WorkerLost as e:
            give_up = policy.exhausted(restarts)
            if give_up is not None:
                if give_up.note:
                    raise WorkerLost(f"{e}\n{give_up.note}") from None
                raise
            restarts += 1
            failure = getattr(e, "failure", None)
            logger.warning(f"warning: a worker was lost: "
                           f"{failure.summary() if failure else str(e).splitlines()[0]}")
            logger.info(f"launching the barrier stage again (restart {restarts} of {policy.max_restarts})")
            decision = policy.relaunch(job.config.workers, _free_slots_after_wait(sc, policy))
            if decision.note:
                (logger.warning if decision.warn else logger.info)(decision.note)
            job = wanted.resized(decision.workers)


def _announce_resume(job: JobPlan, resume: ResumePoint | None, restarts: int) -> None:
    """Log where a launch starts: the checkpoint it resumes (and how the schedule stretches), or epoch 1."""
    config = job.config
    epochs_done = resume.epoch if resume else 0
    if resume is not None and epochs_done >= config.epochs:
        logger.info(f"checkpoint: {checkpoints.describe(resume.meta)} in {config.checkpoint_dir} is the last of "
                    f"{config.epochs} epoch(s): nothing left to train, only the evaluation runs (give a larger "
                    "--epochs to train on)")
    elif resume is not None:
        logger.info(f"checkpoint: resuming at epoch {epochs_done + 1} of {config.epochs} from "
                    f"{checkpoints.describe(resume.meta)} in {config.checkpoint_dir}")
        stretched = extension_note(job.schedule, resume.meta.epochs, epochs_done)
        if stretched:
            logger.info(stretched)
    elif restarts:
        logger.info("checkpoint: none to resume from; training starts again at epoch 1"
                    + ("" if config.checkpoint_dir else " (no --checkpoint-dir)"))


def _free_slots_after_wait(sc, policy: FailurePolicy) -> int | None:
    """The barrier slots free once ``policy.workers`` of them are, or ``policy.regain_timeout`` seconds have
    passed; None when the policy is not elastic or the session cannot say (Spark Connect: ``sc`` None)."""
    if not policy.elastic or sc is None:
        return None
    deadline = time.monotonic() + policy.regain_timeout
    free = free_slots(sc)
    while free < policy.workers and time.monotonic() < deadline:
        time.sleep(1.0)
        free = free_slots(sc)
    return free


#: The names of this machine's loopback address in an ``sc://`` URL.
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _channel_host(spark, sc, master: str | None) -> str | None:
    """Where the driver's log channel listens, or None for no channel.

    A classic session's executors whose stderr is not this console (every master but ``local[N]``) reach it
    on ``spark.driver.host`` (else this host's name). Under Spark Connect, only a server on this machine's
    loopback address running ``local[N]`` is known to run the tasks here, with their stderr on the server's
    console, not this one: the channel then listens on 127.0.0.1. Any other Connect server's executors may
    not reach this client at all (a laptop behind NAT, Databricks), so their lines stay in their logs.
    """
    if sc is not None:
        if runs_in_driver_jvm(sc.master):
            return None
        return driver_host(sc)
    url = connect_url(spark, master)
    host = Master.parse(url, check=False).host  # url: sc://HOST:PORT, or "connect" when not known
    server_master = conf_getter(spark)("spark.master", None) if host in _LOOPBACK else None
    return "127.0.0.1" if server_master is not None and runs_in_driver_jvm(server_master) else None


@contextlib.contextmanager
def _log_server(spark, sc, master: str | None) -> Iterator[ChannelSpec | None]:
    """A :class:`~spark_imagenet.training.job.logchannel.LogServer` for the tasks' output where their stderr is
    not this console (:func:`_channel_host`); its lines are logged as ``[rank R on HOST] ...``. Yields its
    spec, or None (no channel, or no address to bind: the tasks' lines then stay in the executors' logs
    only, and a warning says so)."""
    host = _channel_host(spark, sc, master)
    if host is None:
        yield None
        return

    def on_line(rank: int, host: str, text: str) -> None:
        logger.info(f"[rank {rank} on {host}] {text}")

    try:
        server = LogServer(host, on_line).start()
    except SparkImagenetError as e:
        logger.warning(f"warning: no log channel to the driver ({e}); the tasks' lines stay in the executors' "
                       "logs")
        yield None
        return
    quiet = threading.Timer(CHANNEL_WARN_S, _warn_if_unreached, args=(server, CHANNEL_WARN_S))
    quiet.daemon = True
    quiet.start()
    try:
        yield server.spec
        if not quiet.is_alive():
            return
        quiet.cancel()
        _warn_if_unreached(server, None)  # a job shorter than the bound: it ran, and no task came
    finally:
        quiet.cancel()
        server.close()


#: Seconds after the launch within which some task is expected to reach the driver's log channel.
CHANNEL_WARN_S = 90.0


def _warn_if_unreached(server: LogServer, after: float | None) -> None:
    """One warning when no task has reached the log channel (``after`` seconds into the job, or by its end)."""
    if server.connections:
        return
    spec = server.spec
    when = f"within {after:g} s of the launch" if after is not None else "during the job"
    logger.warning(f"warning: no task reached the driver's log channel at {spec.host}:{spec.port} {when}: the "
                   "executors cannot connect to the driver at that address (a firewall, NAT, or a spark.driver.host "
                   "they do not reach); the tasks' lines stay in the executors' logs, and training does not wait "
                   "for the channel" + (" (or the tasks have not started yet)" if after is not None else ""))


def _launch(spark, sc, job: JobPlan, resume: ResumePoint | None = None) -> list[TaskResult]:
    """Run the barrier stage; return every rank's result.

    The frozen :class:`~spark_imagenet.training.task.barrier_task.TaskSpec` (the job, the resume point, the log
    channel) goes to Spark bound to :func:`~spark_imagenet.training.task.barrier_task.run_task` through the one
    launch interface (:mod:`spark_imagenet.training.driver.stage`): ``RDD.barrier().mapPartitions`` for a
    classic session (``sc`` given), ``mapInArrow(..., barrier=True)`` for Spark Connect (``sc`` None).

    Raises:
        SparkImagenetError: a task's error, rebuilt on the driver (:func:`task_error`).
        KeyboardInterrupt: Ctrl-C; the job has been cancelled.
    """
    launch: BarrierLaunch = (ConnectLaunch(spark) if sc is None else
                             ClassicLaunch(sc, f"spark-imagenet train {job.config.model} x{job.config.workers}"))
    with _log_server(spark, sc, job.config.master) as channel, driver_meeting(sc) as meeting:
        try:
            lines = run_stage(launch, TaskSpec(job, resume, channel, meeting=meeting))
        except Exception as e:  # noqa: BLE001 - Spark's (Py4J's, gRPC's) error of the failed stage
            raise task_error(str(e)) from None
    return [TaskResult.from_line(s) for s in lines]


def _check_session(spark, sc, job: JobPlan) -> str:
    """The preflight checks of the session; returns the master to report (``sc.master`` or ``sc://HOST:PORT``).

    A classic session gets :func:`check_spark`; a Spark Connect session (``sc``
    None) gets :func:`~spark_imagenet.training.driver.connect.check_connect`, whose
    warning line (the checks Connect cannot make) is logged. A local dataset
    path is refused for executors that may be elsewhere (:func:`check_dataset_reachable`;
    under Connect a local path passes only for a server on this machine's loopback
    address with a local master).

    Raises:
        ConfigError: see :func:`run_job`.
    """
    config = job.config
    if sc is None:
        url = connect_url(spark, config.master)
        if config.master is not None and not is_connect_url(config.master):
            logger.warning(f"warning: the job's master {config.master!r} is not used: this Spark Connect session "
                           f"talks to {url}")
        server_master, warnings = check_connect(spark, config.workers, url)
        for line in warnings:
            logger.warning(line)
        on_this_machine = Master.parse(url, check=False).host in _LOOPBACK and server_master is not None
        check_dataset_reachable(job.url, server_master if on_this_machine else url, config.shared_filesystem)
        for path, option in ((config.output, "--output"), (config.checkpoint_dir, "--checkpoint-dir")):
            check_output_reachable(path, server_master if on_this_machine else url, config.shared_filesystem, option)
        _check_conf(conf_getter(spark), server_master, job, server=url)
        return url
    if config.master is not None and config.master != sc.master:
        logger.warning(f"warning: the job's master {config.master!r} is not used: this session runs on "
                       f"{sc.master!r} "
                       "(master and conf choose the command line's session; a session of your own keeps its own)")
    check_dataset_reachable(job.url, sc.master, config.shared_filesystem)
    check_output_reachable(config.output, sc.master, config.shared_filesystem)
    check_output_reachable(config.checkpoint_dir, sc.master, config.shared_filesystem, "--checkpoint-dir")
    check_spark(sc, config.workers)
    _check_conf(sc.getConf().get, sc.master, job)
    return sc.master


def _check_conf(get: Callable[[str, str | None], str | None], master: str | None, job: JobPlan,
                server: str | None = None) -> None:
    """The checks over the session's settings: encryption, train shards (:func:`check_cluster_conf`) and the
    GPU settings --gpus-per-worker needs (:func:`~spark_imagenet.training.job.gpus.check_gpu_conf`); logs their
    warnings.

    Raises:
        ConfigError: a setting to change (named, with the numbers).
    """
    config = job.config
    for line in check_cluster_conf(get, config, len(job.manifest.splits["train"].shards)):
        logger.warning(line)
    warning = check_gpu_conf(lambda key: get(key, None), config.gpus_per_worker, config.workers, master,
                             server=server)
    if warning:
        logger.warning(warning)


def run_job(spark, job: JobPlan) -> Result:
    """Check Spark, run the planned job's barrier stage, report and return the results.

    Args:
        spark: a SparkSession: classic, or Spark Connect (``builder.remote("sc://...")``,
            Databricks shared or serverless compute), which launches through
            ``mapInArrow(..., barrier=True)``; see :mod:`spark_imagenet.training.driver.connect`.
        job: from :func:`plan_job`.

    Returns:
        Result: see :func:`train`.

    Raises:
        ConfigError: dynamic allocation, too few task slots (under Connect:
            a local master's slots only; the checks not made are named in a
            ``warning:`` line), an unreachable Connect server, Spark's network
            encryption or SSL without ``allow_unencrypted``, GPU settings that
            cannot give each task ``gpus_per_worker`` GPUs.
        StorageError: a shard cannot be staged intact (from a task).
        TrainingError: a TensorFlow worker failed.
        KeyboardInterrupt: Ctrl-C during the barrier job, which has been
            cancelled without Spark's log noise (its tasks' TensorFlow
            processes and temporary folders are gone).
    """
    ensure_console()  # a notebook without logging set up sees the progress (spark_imagenet.logs)
    sc = spark_context(spark)  # None: a Spark Connect session
    master = _check_session(spark, sc, job)
    with _leases(spark, job):
        tracker = RunTracker.begin(job, resume_point(job) is not None)
        if tracker is not None and tracker.spec is not None:
            job = dataclasses.replace(job, tracking=tracker.spec)  # the chief logs each epoch to it
        _announce(job)
        start = time.monotonic()
        try:
            records, restarts, ran = _launch_with_restarts(spark, sc, job)
            out = build_results(records, ran, master=master, wall_seconds=time.monotonic() - start,
                                restarts=restarts)
            _report(job, out)
        except BaseException as e:
            if tracker is not None:
                tracker.finish(None, e)
            raise
        if tracker is not None:
            tracker.finish(out, None)
    return out


@contextlib.contextmanager
def _leases(spark, job: JobPlan) -> Iterator[None]:
    """Hold the run's lease on ``--checkpoint-dir`` and ``--output`` while inside (:mod:`spark_imagenet.storage.lease`):
    another run using either folder is refused, a stale lease taken over; released at the end."""
    folders = [(s, o) for s, o in ((job.checkpoints, "--checkpoint-dir"), (job.output, "--output")) if s is not None]
    if not folders or not job.run_id:
        yield
        return
    renewal = lease.take(folders, job.run_id, _app_id(spark))
    try:
        yield
    finally:
        renewal.stop()


def _app_id(spark) -> str:
    """The Spark application's id (the same for every attempt of a YARN application), or ""."""
    try:
        return str(spark.conf.get("spark.app.id", "") or "")
    except Exception:  # noqa: BLE001 - a Connect server that does not say: no same-application wait
        return ""


def _report(job: JobPlan, out: Result) -> None:
    """Log the results table and write ``--results`` and the driver's part of ``--output``."""
    for line in format_table(out).splitlines():
        logger.info(line)
    if job.config.results is not None:
        write_results(job.config.results, out)
        logger.info(f"results written to {job.config.results}")
    if job.output is not None:
        written = write_driver_outputs(job.output, job.manifest.classes,
                                       out.to_json())
        logger.info(f"output: {', '.join(written)} written to {job.config.output} (beside the chief's "
                    f"{MODEL_FILE}, {PREPROCESSING_FILE}, {SERVING_DIR}/ and {TENSORBOARD_DIR}/)")


def train(spark, url: str | os.PathLike, config: TrainConfig) -> Result:
    """Train a model on a sharded dataset with N Spark barrier tasks.

    Its progress, the tasks' lines and the summary are logged (:mod:`spark_imagenet.logs`); where logging
    is not set up they are printed, as on the command line.

    Args:
        spark: a SparkSession, classic or Spark Connect (see :func:`run_job`).
        url: the dataset bucket URL (holding ``manifest.json`` and shards).
        config: every setting of the job (:class:`~spark_imagenet.training.job.config.TrainConfig`; change one
            with ``config.replace(epochs=...)``).

    Returns:
        Result: :class:`~spark_imagenet.training.driver.results.Result`: the per-worker records, the
        validation and training metrics, rank 0's history, the settings, the wall time, the restarts, the last
        checkpoint and the output folder; ``result.to_json()`` (also ``result["val"]["top1"]``) is the
        ``--results`` file's form, and ``Result.from_path(output)`` reads it back from ``--output``.

    Raises:
        ConfigError: ``config`` is not a TrainConfig, a bad setting, dynamic allocation, too few
            task slots, too few train shards, an unwritable ``results`` path.
        ManifestError: no or invalid manifest at ``url``, or a shard it names is missing or differs in the
            store (:func:`~spark_imagenet.dataset.transfer.check_listed`).
        StorageError: a shard cannot be staged intact (from a task).
        TrainingError: a TensorFlow worker failed (message: rank, host, exit
            status and its last output lines; the error's ``failure`` attribute holds them as a
            :class:`~spark_imagenet.training.job.outcome.Failure`).
        WorkerLost: a worker was lost in the last launch ``max_restarts`` allows.

    Example:

    ```python
    from pyspark.sql import SparkSession
    from spark_imagenet import TrainConfig, train

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    result = train(spark, "gs://my-bucket/imagenet-shards", TrainConfig(workers=2, epochs=1, output="/tmp/run"))
    print(result.val.top1)
    ```
    """
    if not isinstance(config, TrainConfig):
        hint = f"TrainConfig(workers={config!r}, ...)" if isinstance(config, int) else "TrainConfig(workers=N, ...)"
        raise ConfigError(f"train() takes the job's settings as a TrainConfig, got {type(config).__name__} "
                          f"{config!r}: train(spark, url, {hint}) (from spark_imagenet import TrainConfig)")
    return run_job(spark, plan_job(url, config))


# ------------------------------------------------------------ task failures
#: Spark's words for an executor or Python worker that went away (no Python error of ours reached the driver).
_LOST_EXECUTOR = re.compile(r"ExecutorLostFailure|exited unexpectedly|crashed|Lost executor|heartbeat timed out")


def task_error(text: str) -> SparkImagenetError:
    """The user-facing error of a failed Spark job, from its message ``text``.

    A barrier task's error carries its :class:`~spark_imagenet.training.job.outcome.Failure` as a JSON line
    (:meth:`Failure.to_error`), which Spark's message quotes: the error is rebuilt from it with its own class
    (:meth:`Failure.as_error`; the last such line, the outermost of a chained traceback). Without one (Spark
    lost the executor, or a task failed outside our code) the error is a :class:`TrainingError` holding Spark's
    failure reason and the last Python exception line, without JVM frames; a :class:`WorkerLost` when Spark
    says an executor or its Python worker went away (the driver may launch the stage again).

    Args:
        text: ``str()`` of the exception raised by ``collect()``.

    Returns:
        SparkImagenetError: to be raised by the caller.
    """
    failure = Failure.find(text)
    if failure is not None:
        return failure.as_error()
    lines = [ln for ln in text.splitlines() if ln.strip() and not re.match(r"\s+at |\s*\.\.\. \d+ more", ln)]
    reason = next((ln.strip() for ln in lines if "Job aborted" in ln or "SparkException" in ln),
                  lines[0] if lines else "")
    exc_lines = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", ln)
                 and not ln.startswith(("org.apache.", "java.", "scala.", "py4j."))]
    detail = f"\nlast Python exception: {exc_lines[-1]}" if exc_lines else ""
    lost = _LOST_EXECUTOR.search(text)
    return (WorkerLost if lost else TrainingError)(f"the Spark training job failed: {reason[:1500]}{detail}\n"
                         "(see the [rank R] lines above or the executor logs for each worker's output)")
