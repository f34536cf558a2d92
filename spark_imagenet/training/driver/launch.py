"""The driver side of training: check, plan, launch the barrier stage, report.

:func:`train` runs one MultiWorkerMirroredStrategy job as one Spark barrier
stage of N tasks (``sc.parallelize(range(N), N).barrier().mapPartitions``; on
Spark Connect ``spark.range(N, numPartitions=N).mapInArrow(..., barrier=True)``,
:mod:`spark_imagenet.training.driver.connect`), one TensorFlow worker per task (the task side is
:mod:`spark_imagenet.training.task.barrier_task`). It is two steps, which the
command line runs apart so that mistakes needing no cluster are reported
before Spark starts; every check is the preflight's (:mod:`spark_imagenet.training.driver.preflight`):

1. :func:`plan_job` (no Spark): the checks of the settings, the dataset's manifest, the assignment of shards
   to ranks (at least N train shards), and the checks of the plan, which find the checkpoint to resume from.
2. :func:`run_job`: check the session (its facts read once), take the folders' leases, begin tracking,
   launch the barrier stage (again after a lost worker, as the failure policy decides), then report: the
   per-worker records combined into one :class:`~spark_imagenet.training.driver.results.Result`, a table and
   optionally a JSON file.
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
from typing import Iterator

from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.errors import ConfigError, SparkImagenetError, TrainingError, WorkerLost
from spark_imagenet.logs import ensure_console
from spark_imagenet.storage import is_remote_url, lease, open_storage
from spark_imagenet.training.driver.connect import ConnectLaunch
from spark_imagenet.training.driver.logserver import LogServer, driver_host
from spark_imagenet.training.driver.preflight import (
    CheckedJob,
    Findings,
    SessionFacts,
    barrier_timeout_seconds,
    check_folders,
    check_job,
    check_plan,
    check_settings,
    find_resume,
    free_slots,
    spark_context,
)
from spark_imagenet.training.driver.results import Result, build_results, format_table, write_results
from spark_imagenet.training.driver.stage import BarrierLaunch, ClassicLaunch, run_stage
from spark_imagenet.training.driver.tracking import RunTracker
from spark_imagenet.training.job import checkpoints
from spark_imagenet.training.job.assignment import assign
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.logchannel import STAGE_CONNECT, ChannelSpec
from spark_imagenet.training.job.outcome import Failure, ResumePoint, TaskResult
from spark_imagenet.training.job.outputs import (
    MODEL_FILE,
    PREPROCESSING_FILE,
    SERVING_DIR,
    TENSORBOARD_DIR,
    open_output,
    write_driver_outputs,
)
from spark_imagenet.training.job.plan import JobPlan
from spark_imagenet.training.job.restarts import FailurePolicy
from spark_imagenet.training.job.schedules import extension_note, schedule_for
from spark_imagenet.training.task.barrier_task import TaskSpec

logger = logging.getLogger(__name__)


def plan_job(url: str | os.PathLike, config: TrainConfig) -> JobPlan:
    """Everything about the job that needs no Spark: the checks of its settings, its manifest and assignment,
    the checks of the plan (:mod:`spark_imagenet.training.driver.preflight`); their warnings are logged.

    Returns:
        JobPlan: with ``config.data.cache`` and a local ``config.run.output`` and ``config.run.checkpoint_dir`` made absolute,
        and the checkpoint to resume from found (``resume``).

    Raises:
        ConfigError: the first problem of :func:`~spark_imagenet.training.driver.preflight.check_settings`
            (the checks of the command line's master, an unwritable ``results`` path, GPUs asked of a
            ``local[N]`` master, which never gives tasks GPUs), of
            :func:`~spark_imagenet.training.driver.preflight.check_folders` (an ``output`` holding an earlier
            run's outputs without ``overwrite``, ``output`` or ``checkpoint_dir`` the dataset's own folder) or of
            :func:`~spark_imagenet.training.driver.preflight.check_plan` (a checkpoint this job cannot resume
            from, a path on the driver's disk the master's executors cannot reach, tracking that cannot work);
            an unwritable ``output`` or ``checkpoint_dir``; too few train shards for the workers.
        ManifestError: no or invalid manifest at ``url``, or a shard it names is missing or differs in the
            store (:func:`~spark_imagenet.dataset.transfer.check_listed`).
        StorageError: the storage cannot be read.
    """
    before = check_settings(config)
    before.raise_if_problems()
    if config.data.cache is not None:  # the executors' folder, as the driver's working directory names it
        config = config.replace(cache=str(Path(config.data.cache).expanduser().absolute()))
    output = checkpoints_at = None
    if config.run.output is not None:  # written by the chief: refused now if it cannot be written
        output = open_output(config.run.output)
        if not is_remote_url(config.run.output):  # a folder here: its absolute path, as the chief must see it
            config = config.replace(output=output.url)
    if config.run.checkpoint_dir is not None:  # written by the chief after every epoch: refused now if it cannot be
        checkpoints_at = open_output(config.run.checkpoint_dir, "--checkpoint-dir")
        if not is_remote_url(config.run.checkpoint_dir):
            config = config.replace(checkpoint_dir=checkpoints_at.url)
    storage = open_storage(url)
    folders = check_folders(config, storage, output, checkpoints_at)
    folders.raise_if_problems()
    manifest = Manifest.load(storage)
    plan = assign(manifest, config.scaling.workers, config.recipe.batch_size)  # every worker a train shard, or refused
    schedule = schedule_for(config, plan.steps_per_epoch)  # the job's one schedule; one that does not fit is refused
    job, found = check_plan(JobPlan(config=config, dataset=storage, manifest=manifest, assignment=plan,
                                    schedule=schedule, output=output, checkpoints=checkpoints_at,
                                    run_id=uuid.uuid4().hex))
    found.raise_if_problems()
    (before + folders + found).log_warnings(logger)
    return job


def _announce(job: JobPlan) -> None:
    """Log what is about to run, and warn about batches larger than a worker's data."""
    config, plan = job.config, job.assignment
    smallest = min(p.train_examples for p in plan.workers)
    if config.recipe.batch_size > smallest:
        logger.warning(f"warning: --batch-size {config.recipe.batch_size} is larger than the {smallest} train images of the "
                       "smallest worker; its batches repeat images within one step (use a smaller batch or fewer "
                       "workers)")
    logger.info(f"training {config.recipe.model} on {job.url}: {config.scaling.workers} worker(s), {plan.train_examples_total} "
                f"train / "
                f"{plan.val_examples_total} val images, {config.recipe.epochs} epoch(s) x {plan.steps_per_epoch} steps, "
                f"batch {config.recipe.batch_size} per worker")
    logger.info(job.schedule.describe())
    logger.info(f"recipe: optimizer {config.recipe.optimizer}, momentum {config.recipe.momentum:g}, "
                f"weight decay {config.recipe.weight_decay:g}, "
                f"label smoothing {config.recipe.label_smoothing:g}, precision {config.recipe.precision}, "
                f"XLA {'on' if config.recipe.jit_compile else 'off'}")


def _launch_with_restarts(spark, sc, checked: CheckedJob) -> tuple[list[TaskResult], int, JobPlan]:
    """Run the barrier stage; after a :class:`WorkerLost` failure launch it again as the job's
    :class:`~spark_imagenet.training.job.restarts.FailurePolicy` decides (at most ``config.run.max_restarts``
    times, each time from the latest complete checkpoint, found again, or from the newest at an epoch's end when
    the latest is inside an epoch and of another worker count (a warning says so:
    :func:`~spark_imagenet.training.job.restarts.relaunch_from`); from epoch 1 without ``checkpoint_dir``;
    on fewer workers when ``min_workers`` allows and the slots are not free within ``regain_timeout``). The
    first launch resumes from the checkpoint the plan found. Returns every rank's record, the number of restarts
    and the job the last launch ran.

    Raises:
        WorkerLost: the last allowed launch lost a worker too (the message counts the launches).
        SparkImagenetError: any other failure, at once (bad data or settings fail again the same way).
    """
    job = wanted = checked.job
    policy = FailurePolicy.of(job.config)
    restarts = 0
    while True:
        _announce_resume(job, job.resume, restarts)
        try:
            return _launch(spark, sc, checked.facts, job, job.resume), restarts, job
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
            decision = policy.relaunch(job.config.scaling.workers, _free_slots_after_wait(sc, policy))
            if decision.note:
                (logger.warning if decision.warn else logger.info)(decision.note)
            job = wanted.resized(decision.workers)
            # a checkpoint written since the last launch; one inside an epoch only on the count that wrote it
            resume, resumable = find_resume(job, announce=True, relaunch=True)
            Findings([resumable]).raise_if_problems().log_warnings(logger)
            job = dataclasses.replace(job, resume=resume)  # the job the tasks get names the same checkpoint


def _announce_resume(job: JobPlan, resume: ResumePoint | None, restarts: int) -> None:
    """Log where a launch starts: the checkpoint it resumes (and how the schedule stretches), or epoch 1."""
    config = job.config
    epochs_done = resume.epoch if resume else 0
    if resume is not None and epochs_done >= config.recipe.epochs:
        logger.info(f"checkpoint: {checkpoints.describe(resume.meta)} in {config.run.checkpoint_dir} is the last of "
                    f"{config.recipe.epochs} epoch(s): nothing left to train, only the evaluation runs (give a larger "
                    "--epochs to train on)")
    elif resume is not None:
        logger.info(f"checkpoint: resuming at epoch {epochs_done + 1} of {config.recipe.epochs} from "
                    f"{checkpoints.describe(resume.meta)} in {config.run.checkpoint_dir}")
        stretched = extension_note(job.schedule, resume.meta.epochs, epochs_done)
        if stretched:
            logger.info(stretched)
    elif restarts:
        logger.info("checkpoint: none to resume from; training starts again at epoch 1"
                    + ("" if config.run.checkpoint_dir else " (no --checkpoint-dir)"))


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


def _channel_host(sc, facts: SessionFacts, strategy: str = "multiworker") -> tuple[str, bool] | None:
    """Where the driver's log channel listens and whether the tasks send their lines on it; None for no channel
    (the tasks then meet through Spark's ``allGather``, about one second more per job).

    The channel carries the tasks' output lines where their stderr is not this console, and the rendezvous of
    a ``multiworker`` job. A classic session's executors reach it on ``spark.driver.host`` (else this host's
    name); under ``local[N]`` the tasks run in this JVM, their stderr is this console, and the channel
    listens on 127.0.0.1 for the rendezvous alone (none for a one-worker strategy). Under Spark Connect,
    only a server on this machine's loopback address running ``local[N]`` is known to run the tasks here,
    with their stderr on the server's console, not this one: the channel then listens on 127.0.0.1. Any
    other Connect server's executors may not reach this client at all (a laptop behind NAT, Databricks),
    so their lines stay in their logs.
    """
    if not facts.is_connect:
        if not facts.tasks_in_this_jvm:
            return driver_host(sc), True
        return ("127.0.0.1", False) if strategy == "multiworker" else None
    return ("127.0.0.1", True) if facts.tasks_in_this_jvm else None


@contextlib.contextmanager
def _log_server(sc, facts: SessionFacts, config: TrainConfig | None = None) -> Iterator[ChannelSpec | None]:
    """A :class:`~spark_imagenet.training.driver.logserver.LogServer` for the tasks' output and rendezvous
    (:func:`_channel_host`); its lines are logged as ``[rank R on HOST] ...``. Yields its spec, or None (no
    channel, or no address to bind: the tasks' lines then stay in the executors' logs only, and a warning
    says so; the tasks meet through ``allGather``)."""
    workers = config.scaling.workers if config is not None else 1
    where = _channel_host(sc, facts, config.scaling.strategy if config is not None else "multiworker")
    if where is None:
        yield None
        return
    host, lines = where

    def on_line(rank: int, host: str, text: str) -> None:
        logger.info(f"[rank {rank} on {host}] {text}")

    meet_timeout = barrier_timeout_seconds(facts)  # a bad setting is an error, not a reason to go without the channel
    try:
        server = LogServer(host, on_line, max_connections=max(256, workers + 64), meet_timeout_s=meet_timeout).start()
    except SparkImagenetError as e:
        logger.warning(f"warning: no log channel to the driver ({e}); the tasks' lines stay in the executors' "
                       "logs, and they meet through Spark's allGather")
        yield None
        return
    quiet = threading.Timer(CHANNEL_WARN_S, _warn_if_unreached, args=(server, CHANNEL_WARN_S))
    quiet.daemon = True
    quiet.start()
    try:
        yield dataclasses.replace(server.spec, lines=lines)
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


def _launch(spark, sc, facts: SessionFacts, job: JobPlan, resume: ResumePoint | None = None) -> list[TaskResult]:
    """Run the barrier stage; return every rank's result.

    The frozen :class:`~spark_imagenet.training.task.barrier_task.TaskSpec` (the job, the resume point, the log
    channel, which also carries the rendezvous) goes to Spark bound to
    :func:`~spark_imagenet.training.task.barrier_task.run_task` through the one launch interface
    (:mod:`spark_imagenet.training.driver.stage`): ``RDD.barrier().mapPartitions`` for a classic session (``sc``
    given), ``mapInArrow(..., barrier=True)`` for Spark Connect (``sc`` None). When a task could not connect to
    the channel (it failed at once, in the stage :data:`~spark_imagenet.training.job.logchannel.STAGE_CONNECT`),
    one warning names the address and port, and the stage is launched once more without a channel: every task
    meets through ``allGather``.

    Raises:
        SparkImagenetError: a task's error, rebuilt on the driver (:func:`task_error`).
        KeyboardInterrupt: Ctrl-C; the job has been cancelled.
    """
    launch: BarrierLaunch = (ConnectLaunch(spark) if sc is None else
                             ClassicLaunch(sc, f"spark-imagenet train {job.config.recipe.model} x{job.config.scaling.workers}"))
    try:
        with _log_server(sc, facts, job.config) as channel:
            return _run(launch, TaskSpec(job, resume, channel))
    except TrainingError as e:
        failure = getattr(e, "failure", None)
        if failure is None or failure.stage != STAGE_CONNECT:
            raise
        logger.warning(f"warning: rank {failure.rank} on {failure.host}: {failure.message.splitlines()[0]}: the "
                       "executors must be able to connect to the driver's host on the TCP port its log channel "
                       "listens on (one the system chooses per launch); the barrier stage is launched again, its "
                       "tasks meeting through Spark's allGather (about 1 s more) and their lines staying in the "
                       "executors' logs")
    return _run(launch, TaskSpec(job, resume, None))


def _run(launch: BarrierLaunch, spec: TaskSpec) -> list[TaskResult]:
    """Run the stage of ``spec``; every rank's result (raises the task's error rebuilt, :func:`task_error`)."""
    try:
        lines = run_stage(launch, spec)
    except Exception as e:  # noqa: BLE001 - Spark's (Py4J's, gRPC's) error of the failed stage
        raise task_error(str(e)) from None
    return [TaskResult.from_line(s) for s in lines]


def run_job(spark, job: JobPlan) -> Result:
    """Check the session, run the planned job's barrier stage, report and return the results: check
    (:func:`~spark_imagenet.training.driver.preflight.check_job`), take the leases, begin tracking, launch,
    report.

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
            cannot give each task ``gpus_per_worker`` GPUs, a path on the driver's disk the executors cannot
            reach.
        StorageError: a shard cannot be staged intact (from a task).
        TrainingError: a TensorFlow worker failed.
        KeyboardInterrupt: Ctrl-C during the barrier job, which has been
            cancelled without Spark's log noise (its tasks' TensorFlow
            processes and temporary folders are gone).
    """
    ensure_console()  # a notebook without logging set up sees the progress (spark_imagenet.logs)
    checked = check_job(spark, job)
    with _leases(spark, job):
        tracker = RunTracker.begin(job, checked.resume is not None)
        if tracker is not None and tracker.spec is not None:  # the chief logs each epoch to it
            checked = dataclasses.replace(checked, job=dataclasses.replace(job, tracking=tracker.spec))
        try:
            out = _launch_and_report(spark, checked)
        except BaseException as e:
            if tracker is not None:
                tracker.finish(None, e)
            raise
        if tracker is not None:
            tracker.finish(out, None)
    return out


def _launch_and_report(spark, checked: CheckedJob) -> Result:
    """Announce the job, launch it (with its restarts), combine the records and report them."""
    _announce(checked.job)
    start = time.monotonic()
    records, restarts, ran = _launch_with_restarts(spark, spark_context(spark), checked)
    out = build_results(records, ran, master=checked.master_to_report, wall_seconds=time.monotonic() - start,
                        restarts=restarts)
    _report(checked.job, out)
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
    if job.config.run.results is not None:
        write_results(job.config.run.results, out)
        logger.info(f"results written to {job.config.run.results}")
    if job.output is not None:
        written = write_driver_outputs(job.output, job.manifest.classes,
                                       out.to_json())
        logger.info(f"output: {', '.join(written)} written to {job.config.run.output} (beside the chief's "
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
        checkpoint and the output folder; ``result.to_json()`` is the ``--results`` file's form, and
        ``Result.from_path(output)`` reads it back from ``--output``.

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

    Example (``spark`` a session, e.g. ``SparkSession.builder.master("local[2]").getOrCreate()``; a small
    dataset and model):

    >>> from spark_imagenet import TrainConfig, train
    >>> config = TrainConfig(workers=2, epochs=1, batch_size=4, image_size=72, width=0.25, output="run")
    >>> result = train(spark, "gs://my-bucket/imagenet-shards", config)
    >>> result.workers, 0.0 <= result.val.top1 <= 1.0, os.path.isfile("run/results.json")
    (2, True, True)
    """
    if not isinstance(config, TrainConfig):
        hint = f"TrainConfig(workers={config!r}, ...)" if isinstance(config, int) else "TrainConfig(workers=N, ...)"
        raise ConfigError(f"train() takes the job's settings as a TrainConfig, got {type(config).__name__} "
                          f"{config!r}: train(spark, url, {hint}) (from spark_imagenet import TrainConfig)",
                          key="config", value=config)
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
