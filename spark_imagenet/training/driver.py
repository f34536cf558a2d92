"""The driver side of training: check, plan, launch the barrier stage, report.

:func:`train` runs one MultiWorkerMirroredStrategy job as one Spark barrier
stage of N tasks (``sc.parallelize(range(N), N).barrier().mapPartitions``; on
Spark Connect ``spark.range(N, numPartitions=N).mapInArrow(..., barrier=True)``,
:mod:`spark_imagenet.training.connect`), one TensorFlow worker per task (the task side is
:mod:`spark_imagenet.training.barrier_task`). It is two steps, which the
command line runs apart so that mistakes needing no cluster are reported
before Spark starts:

1. :func:`plan_job` (no Spark): the results path, the dataset's manifest, and
   the assignment of shards to ranks (at least N train shards).
2. :func:`run_job`: the Spark checks (:mod:`spark_imagenet.training.preflight`),
   the barrier stage, then the per-worker records combined into one results
   dict (:mod:`spark_imagenet.training.results`), a table and optionally a JSON file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping
from urllib.parse import urlsplit

from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.errors import SparkImagenetError, TrainingError, WorkerLost
from spark_imagenet.storage import open_storage
from spark_imagenet.training import checkpoints
from spark_imagenet.training.assignment import Assignment, assign
from spark_imagenet.training.barrier_task import Resume, TaskSpec, run_task
from spark_imagenet.training.config import TrainConfig
from spark_imagenet.training.connect import cancel_connect_job, check_connect, conf_getter, connect_job, connect_url
from spark_imagenet.training.gpus import check_gpu_conf
from spark_imagenet.training.interrupts import sigint_handler
from spark_imagenet.training.logchannel import ChannelSpec, LogServer
from spark_imagenet.training.outputs import MODEL_FILE, TENSORBOARD_DIR, open_output, write_driver_outputs
from spark_imagenet.training.preflight import (
    check_cluster_conf,
    check_dataset_reachable,
    check_output_reachable,
    check_results_path,
    check_spark,
    spark_context,
)
from spark_imagenet.training.schedules import schedule_for
from spark_imagenet.training.results import build_results, format_table, write_json_atomic
from spark_imagenet.training.spark_session import is_local_mode


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """A training job planned on the driver, before Spark is involved.

    Attributes:
        url: the dataset's storage URL, normalised (``Storage.url``).
        config: the job's settings.
        manifest: the dataset's manifest.
        assignment: shards and validation records of every rank.
        storage_options: :meth:`Storage.reopen_options`, to open the same
            storage in each task.
        output_options: the same for ``config.output`` (empty without one).
        checkpoint_options: the same for ``config.checkpoint_dir`` (empty without one).
    """

    url: str
    config: TrainConfig
    manifest: Manifest
    assignment: Assignment
    storage_options: Mapping[str, Any]
    output_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    checkpoint_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def as_config(config: TrainConfig | int | None, settings: Mapping[str, Any]) -> TrainConfig:
    """The :class:`TrainConfig` of :func:`train`'s arguments.

    Args:
        config: a TrainConfig, or the worker count (the keyword form
            ``train(spark, url, 8, epochs=90)``), or None (``workers=`` given
            in ``settings``).
        settings: keyword settings; with a TrainConfig they override its fields.

    Raises:
        ConfigError: an unknown setting name (with the closest one), or an invalid value.
    """
    if isinstance(config, TrainConfig):
        return TrainConfig.from_mapping({**config_fields(config), **settings}, "train()") if settings else config
    if config is not None:
        settings = {"workers": config, **settings}
    return TrainConfig.from_mapping(settings, "train()")


def config_fields(config: TrainConfig) -> dict[str, Any]:
    """``{field: value}`` of a config (for merging)."""
    return {key: getattr(config, key) for key in TrainConfig.keys()}


def plan_job(url: str | os.PathLike, config: TrainConfig) -> JobPlan:
    """Everything about the job that needs no Spark: results path, manifest, assignment.

    Returns:
        JobPlan: with ``config.cache`` and a local ``config.output`` made absolute.

    Raises:
        ConfigError: an unwritable ``results`` path, ``output`` or ``checkpoint_dir``, too few train shards
            for the workers, GPUs asked of a ``local[N]`` master (which never gives tasks GPUs), a checkpoint
            in ``checkpoint_dir`` this job cannot resume from (:func:`resume_point`).
        ManifestError: no or invalid manifest at ``url``.
        StorageError: the storage cannot be read.
    """
    check_results_path(config.results)
    if config.gpus_per_worker and is_local_mode(config.master or ""):
        check_gpu_conf(lambda key: None, config.gpus_per_worker, config.workers, config.master.strip())
    if config.cache is not None:  # the executors' folder, as the driver's working directory names it
        config = config.replace(cache=str(Path(config.cache).expanduser().absolute()))
    output_options: Mapping[str, Any] = {}
    if config.output is not None:  # written by the chief: refused now if it cannot be written
        output_options = open_output(config.output).reopen_options()
        if "://" not in config.output:
            config = config.replace(output=str(Path(config.output).expanduser().absolute()))
    checkpoint_options: Mapping[str, Any] = {}
    if config.checkpoint_dir is not None:  # written by the chief after every epoch: refused now if it cannot be
        checkpoint_options = open_output(config.checkpoint_dir, "--checkpoint-dir").reopen_options()
        if "://" not in config.checkpoint_dir:
            config = config.replace(checkpoint_dir=str(Path(config.checkpoint_dir).expanduser().absolute()))
    storage = open_storage(url)
    manifest = Manifest.load(storage)
    plan = assign(manifest, config.workers, config.batch_size)
    schedule_for(config, plan.steps_per_epoch)  # a schedule that does not fit the run is refused now
    job = JobPlan(url=storage.url, config=config, manifest=manifest, assignment=plan,
                  storage_options=storage.reopen_options(), output_options=output_options,
                  checkpoint_options=checkpoint_options)
    resume_point(job)  # a checkpoint this job cannot resume from is refused before Spark starts
    return job


def _announce(job: JobPlan, log: Callable[[str], None]) -> None:
    """Log what is about to run, and warn about batches larger than a worker's data."""
    config, plan = job.config, job.assignment
    smallest = min(p.train_examples for p in plan.workers)
    if config.batch_size > smallest:
        log(f"warning: --batch-size {config.batch_size} is larger than the {smallest} train images of the smallest "
            "worker; its batches repeat images within one step (use a smaller batch or fewer workers)")
    log(f"training {config.model} on {job.url}: {config.workers} worker(s), {plan.train_examples_total} train / "
        f"{plan.val_examples_total} val images, {config.epochs} epoch(s) x {plan.steps_per_epoch} steps, "
        f"batch {config.batch_size} per worker")
    log(schedule_for(config, plan.steps_per_epoch).describe())
    log(f"recipe: optimizer {config.optimizer}, momentum {config.momentum:g}, weight decay {config.weight_decay:g}, "
        f"label smoothing {config.label_smoothing:g}, precision {config.precision}, "
        f"XLA {'on' if config.jit_compile else 'off'}")


#: Seconds to wait, after Ctrl-C, for the cancelled barrier job and its tasks to end.
CANCEL_WAIT_S = 60


def _task_spec(job: JobPlan, log_channel: ChannelSpec | None = None, resume: Resume | None = None) -> TaskSpec:
    """The description every barrier task of the job receives (pickled)."""
    return TaskSpec(url=job.url, dataset_id=job.manifest.dataset_id, num_classes=job.manifest.num_classes,
                    assignment=job.assignment, config=job.config, storage_options=dict(job.storage_options),
                    log_channel=log_channel, output_options=dict(job.output_options),
                    checkpoint_options=dict(job.checkpoint_options), resume=resume)


def resume_point(job: JobPlan, log: Callable[[str], None] | None = None) -> Resume | None:
    """The latest complete checkpoint in ``job.config.checkpoint_dir`` that this job may resume from.

    ``log`` is given each folder skipped as half-written.

    Returns:
        ``(folder name, CheckpointMeta)``, or None: no ``checkpoint_dir``, or no complete checkpoint in it yet.

    Raises:
        ConfigError: the checkpoint is of another dataset, model, cluster shape or
            recipe, or of more epochs than ``epochs`` (:func:`~spark_imagenet.training.checkpoints.check_compatible`).
        StorageError: the folder cannot be listed or a ``checkpoint.json`` read.
    """
    config = job.config
    if config.checkpoint_dir is None:
        return None
    found = checkpoints.latest(open_storage(config.checkpoint_dir, **job.checkpoint_options), log=log)
    if found is None:
        return None
    name, meta = found
    checkpoints.check_compatible(meta, checkpoints.expected_for(config, job.manifest),
                                 f"--checkpoint-dir {config.checkpoint_dir}, {name}")
    return found


def _launch_with_restarts(spark, sc, job: JobPlan, log: Callable[[str], None]) -> tuple[list[dict[str, Any]], int]:
    """Run the barrier stage; after a :class:`WorkerLost` failure launch it again, at most
    ``config.max_restarts`` times, each time from the latest complete checkpoint (from epoch 1 without
    ``checkpoint_dir``). Returns every rank's record and the number of restarts.

    Raises:
        WorkerLost: the last allowed launch lost a worker too (the message counts the launches).
        SparkImagenetError: any other failure, at once (bad data or settings fail again the same way).
    """
    config = job.config
    restarts = 0
    while True:
        resume = resume_point(job, log)
        epochs_done = resume[1].epoch if resume else 0
        if resume is not None and epochs_done >= config.epochs:
            log(f"checkpoint: {checkpoints.describe(resume[1])} in {config.checkpoint_dir} is the last of "
                f"{config.epochs} epoch(s): nothing left to train, only the evaluation runs (give a larger --epochs "
                "to train on)")
        elif resume is not None:
            log(f"checkpoint: resuming at epoch {epochs_done + 1} of {config.epochs} from "
                f"{checkpoints.describe(resume[1])} in {config.checkpoint_dir}")
        elif restarts:
            log("checkpoint: none to resume from; training starts again at epoch 1"
                + ("" if config.checkpoint_dir else " (no --checkpoint-dir)"))
        try:
            return _launch(spark, sc, job, log, resume), restarts
        except WorkerLost as e:
            if restarts >= config.max_restarts:
                if restarts:
                    raise WorkerLost(f"{e}\n(the barrier stage was launched {restarts + 1} times, the last "
                                     f"allowed by --max-restarts {config.max_restarts})") from None
                raise
            restarts += 1
            first = re.sub(r"; its last \d+ output line\(s\):$", "", str(e).splitlines()[0])
            log(f"warning: a worker was lost: {first}")
            log(f"launching the barrier stage again (restart {restarts} of {config.max_restarts})")


@contextlib.contextmanager
def _log_server(sc, log: Callable[[str], None]) -> Iterator[ChannelSpec | None]:
    """A :class:`~spark_imagenet.training.logchannel.LogServer` on the driver's address for the tasks' output,
    for a classic session whose executors' stderr is not this console (every master but ``local[N]``); its lines
    are logged as ``[rank R on HOST] ...``. Yields its spec, or None (``local[N]``, Spark Connect, or no
    address to bind: the tasks' lines then stay in the executors' logs only, and a warning says so)."""
    if sc is None or is_local_mode(sc.master):
        yield None
        return

    def on_line(rank: int, host: str, text: str) -> None:
        log(f"[rank {rank} on {host}] {text}")

    host = sc.getConf().get("spark.driver.host", None) or socket.gethostname()
    try:
        server = LogServer(host, on_line).start()
    except SparkImagenetError as e:
        log(f"warning: no log channel to the driver ({e}); the tasks' lines stay in the executors' logs")
        yield None
        return
    try:
        yield server.spec
    finally:
        server.close()


def _launch(spark, sc, job: JobPlan, log: Callable[[str], None] = print,
            resume: Resume | None = None) -> list[dict[str, Any]]:
    """Run the barrier stage; return every rank's record.

    A classic session (``sc`` given) runs ``sc.parallelize(range(N), N).barrier().mapPartitions``
    in a job group of its own; a Spark Connect session (``sc`` None) runs
    ``spark.range(N, numPartitions=N).mapInArrow(..., barrier=True)`` under a tag of its own
    (:func:`~spark_imagenet.training.connect.connect_job`). Both tasks run the same
    :func:`~spark_imagenet.training.barrier_task.run_task`; see :func:`_run_interruptibly`
    for Ctrl-C.

    Raises:
        SparkImagenetError: a task's error, rebuilt on the driver (:func:`task_error`).
        KeyboardInterrupt: Ctrl-C; the job has been cancelled.
    """
    workers = job.config.workers
    if sc is None:
        run, interrupt = connect_job(spark, _task_spec(job, resume=resume), workers)
        lines = _run_interruptibly(run, lambda done: cancel_connect_job(interrupt, done, CANCEL_WAIT_S),
                                   threading.Thread)
        return [json.loads(s) for s in lines]
    from pyspark import InheritableThread

    group = f"spark-imagenet-{uuid.uuid4().hex}"
    with _log_server(sc, log) as channel:
        spec = _task_spec(job, channel, resume)

        def run() -> list[str]:
            sc.setJobGroup(group, f"spark-imagenet train {job.config.model} x{workers}", interruptOnCancel=True)
            return sc.parallelize(range(workers), workers).barrier().mapPartitions(
                functools.partial(run_task, spec)).collect()

        lines = _run_interruptibly(run, functools.partial(_cancel_quietly, sc, group), InheritableThread)
    return [json.loads(s) for s in lines]


def _run_interruptibly(run: Callable[[], list[str]], cancel: Callable[[threading.Event], None],
                       thread_class: Callable[..., threading.Thread]) -> list[str]:
    """``run()`` in a thread of its own while this thread waits; Ctrl-C cancels it.

    A Ctrl-C (KeyboardInterrupt) thus arrives here and never in the middle of
    a Py4J or gRPC call; ``cancel(done)`` then stops the job (``done`` is set
    when the job's thread has ended) and the KeyboardInterrupt is re-raised.

    Args:
        run: the blocking job; returns the tasks' JSON lines.
        cancel: cancels the job quietly and waits, bounded, for ``done``.
        thread_class: ``threading.Thread`` or PySpark's ``InheritableThread``.

    Raises:
        SparkImagenetError: the job's error, rebuilt by :func:`task_error`.
        KeyboardInterrupt: Ctrl-C; the job has been cancelled.
    """
    outcome: dict[str, Any] = {}
    done = threading.Event()  # not Thread.join: an interrupted join marks a live thread ended (Python 3.11)

    def collect() -> None:
        try:
            outcome["lines"] = run()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = e
        finally:
            done.set()

    thread = thread_class(target=collect, name="spark-imagenet barrier job", daemon=True)
    try:
        # Python's default handler, not PySpark's: that one cancels every job from inside the signal
        # handler, which breaks a Py4J call in progress ("reentrant call") and prints its tracebacks.
        with sigint_handler(signal.default_int_handler):
            thread.start()
            while not done.wait(0.5):
                pass
    except KeyboardInterrupt:
        if thread.ident is None:  # interrupted before the job's thread began
            done.set()
        cancel(done)
        raise
    error = outcome.get("error")
    if isinstance(error, Exception):
        raise task_error(str(error)) from None
    if error is not None:
        raise error
    return outcome["lines"]


def _cancel_quietly(sc, group: str, done: threading.Event, wait_s: float = CANCEL_WAIT_S) -> None:
    """Cancel the job group after Ctrl-C without Spark's log noise; wait for it to end.

    Spark's log is turned off while the tasks die (the executor logs every
    killed Python worker as "crashed"), and restored once no task of the
    group runs; a further Ctrl-C is ignored meanwhile. Every Spark failure
    here is swallowed: the caller re-raises the KeyboardInterrupt.

    Args:
        sc: the SparkContext.
        group: the job group of the barrier job.
        done: set when the thread running the job has ended (waited for, at most ``wait_s``).
        wait_s: the bound on the whole wait, in seconds.
    """
    with sigint_handler(signal.SIG_IGN):
        level = None
        with contextlib.suppress(Exception):
            level = str(sc._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
        with contextlib.suppress(Exception):
            sc.setLogLevel("OFF")
        with contextlib.suppress(Exception):
            sc.cancelJobGroup(group)
        deadline = time.monotonic() + wait_s
        done.wait(wait_s)
        with contextlib.suppress(Exception):
            tracker = sc.statusTracker()
            while time.monotonic() < deadline and _active_tasks(tracker, group):
                time.sleep(0.2)
        if level:
            with contextlib.suppress(Exception):
                sc.setLogLevel(level)


def _active_tasks(tracker, group: str) -> int:
    """Tasks of the job group's stages still running (``StatusTracker``)."""
    active = 0
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info is not None else ():
            stage = tracker.getStageInfo(stage_id)
            active += stage.numActiveTasks if stage is not None else 0
    return active


def _check_session(spark, sc, job: JobPlan, log: Callable[[str], None]) -> str:
    """The preflight checks of the session; returns the master to report (``sc.master`` or ``sc://HOST:PORT``).

    A classic session gets :func:`check_spark`; a Spark Connect session (``sc``
    None) gets :func:`~spark_imagenet.training.connect.check_connect`, whose
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
        if config.master is not None and not config.master.startswith("sc://"):
            log(f"warning: the job's master {config.master!r} is not used: this Spark Connect session talks to {url}")
        server_master, warnings = check_connect(spark, config.workers, url)
        for line in warnings:
            log(line)
        host = urlsplit(url).hostname if url.startswith("sc://") else None
        on_this_machine = host in ("127.0.0.1", "localhost", "::1") and server_master is not None
        check_dataset_reachable(job.url, server_master if on_this_machine else url, config.shared_filesystem)
        for path, option in ((config.output, "--output"), (config.checkpoint_dir, "--checkpoint-dir")):
            check_output_reachable(path, server_master if on_this_machine else url, config.shared_filesystem, option)
        _check_conf(conf_getter(spark), server_master, job, log, server=url)
        return url
    if config.master is not None and config.master != sc.master:
        log(f"warning: the job's master {config.master!r} is not used: this session runs on {sc.master!r} "
            "(master and conf choose the command line's session; a session of your own keeps its own)")
    check_dataset_reachable(job.url, sc.master, config.shared_filesystem)
    check_output_reachable(config.output, sc.master, config.shared_filesystem)
    check_output_reachable(config.checkpoint_dir, sc.master, config.shared_filesystem, "--checkpoint-dir")
    check_spark(sc, config.workers)
    _check_conf(sc.getConf().get, sc.master, job, log)
    return sc.master


def _check_conf(get: Callable[[str, str | None], str | None], master: str | None, job: JobPlan,
                log: Callable[[str], None], server: str | None = None) -> None:
    """The checks over the session's settings: encryption, train shards (:func:`check_cluster_conf`) and the
    GPU settings --gpus-per-worker needs (:func:`~spark_imagenet.training.gpus.check_gpu_conf`); logs their
    warnings.

    Raises:
        ConfigError: a setting to change (named, with the numbers).
    """
    config = job.config
    for line in check_cluster_conf(get, config, len(job.manifest.splits["train"].shards)):
        log(line)
    warning = check_gpu_conf(lambda key: get(key, None), config.gpus_per_worker, config.workers, master,
                             server=server)
    if warning:
        log(warning)


def run_job(spark, job: JobPlan, *, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Check Spark, run the planned job's barrier stage, report and return the results.

    Args:
        spark: a SparkSession: classic, or Spark Connect (``builder.remote("sc://...")``,
            Databricks shared or serverless compute), which launches through
            ``mapInArrow(..., barrier=True)``; see :mod:`spark_imagenet.training.connect`.
        job: from :func:`plan_job`.
        log: called with each line of the summary.

    Returns:
        dict: see :func:`train`.

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
    sc = spark_context(spark)  # None: a Spark Connect session
    master = _check_session(spark, sc, job, log)
    _announce(job, log)
    start = time.monotonic()
    records, restarts = _launch_with_restarts(spark, sc, job, log)
    out = build_results(records, job, master=master, wall_seconds=time.monotonic() - start, log=log,
                        restarts=restarts)
    for line in format_table(out).splitlines():
        log(line)
    if job.config.results is not None:
        write_json_atomic(Path(job.config.results).expanduser(), out)
        log(f"results written to {job.config.results}")
    if job.config.output is not None:
        written = write_driver_outputs(open_storage(job.config.output, **job.output_options), job.manifest.classes,
                                       out)
        log(f"output: {', '.join(written)} written to {job.config.output} (beside the chief's {MODEL_FILE} and "
            f"{TENSORBOARD_DIR}/)")
    return out


def train(spark, url: str | os.PathLike, config: TrainConfig | int | None = None, *,
          log: Callable[[str], None] = print, **settings: Any) -> dict[str, Any]:
    """Train a model on a sharded dataset with N Spark barrier tasks.

    ``train(spark, url, TrainConfig(workers=8, epochs=90))``, or the keyword
    form ``train(spark, url, 8, epochs=90)`` / ``train(spark, url, workers=8)``.

    Args:
        spark: a SparkSession, classic or Spark Connect (see :func:`run_job`).
        url: the dataset bucket URL (holding ``manifest.json`` and shards).
        config: a :class:`~spark_imagenet.training.config.TrainConfig`, or
            the worker count N.
        log: called with each line of the summary (default ``print``).
        **settings: :class:`TrainConfig` fields (``epochs``, ``batch_size``,
            ...); with a config object they override its fields.

    Returns:
        dict: ``{"workers", "per_worker": [{"rank", "host", "python", "train_images",
        "steps", "images_per_sec", "train_loss", "train_top1",
        "train_seconds"}], "val": {"images", "top1", "top5", "loss"},
        "images_per_sec" (sum over workers), "history" (rank 0's Keras
        history, every epoch including those restored from a checkpoint), "config": {..., "master"},
        "wall_seconds", "restarts"}`` where ``wall_seconds`` is the barrier job's wall time (shard staging,
        TensorFlow start-up, training and evaluation; every launch) and ``restarts`` the relaunches after a
        lost worker.

    Raises:
        ConfigError: a bad setting, dynamic allocation, too few
            task slots, too few train shards, an unwritable ``results`` path.
        ManifestError: no or invalid manifest at ``url``.
        StorageError: a shard cannot be staged intact (from a task).
        TrainingError: a TensorFlow worker failed (message: rank, host, exit
            status and its last output lines).
    """
    return run_job(spark, plan_job(url, as_config(config, settings)), log=log)


def _error_classes(base: type[SparkImagenetError] = SparkImagenetError) -> dict[str, type[SparkImagenetError]]:
    """This package's error classes by name: ``base`` and all its subclasses, at any depth."""
    found = {base.__name__: base}
    for sub in base.__subclasses__():
        found.update(_error_classes(sub))
    return found


# ------------------------------------------------------------ task failures
def task_error(text: str) -> SparkImagenetError:
    """The user-facing error inside a failed Spark job's message.

    A barrier task's Python exception reaches the driver as text inside the
    JVM's exception (``...spark_imagenet.errors.TrainingError: <message>``
    followed by `` SQLSTATE``/``\\tat`` stack lines). This finds the last
    such error of this package (the outermost of a chained traceback; Spark
    repeats the failing task's traceback in the job's message) and rebuilds
    it with its own class and message; anything else becomes a
    :class:`TrainingError` holding the Spark failure reason and the last
    Python exception line, without JVM frames.

    Args:
        text: ``str()`` of the exception raised by ``collect()``.

    Returns:
        SparkImagenetError: to be raised by the caller.
    """
    matches = list(re.finditer(r"spark_imagenet\.errors\.(\w+): ", text))
    if matches:
        m = matches[-1]  # the outermost error of a chained traceback
        cls = _error_classes().get(m.group(1), TrainingError)
        rest = text[m.end():]
        end = re.search(r"\(end of rank \d+ output\)", rest)
        if end:
            message = rest[:end.end()]
        else:
            stop = re.search(r"\n\s*SQLSTATE|\n\tat |\n\s+at [\w$.]+\(|\nDriver stacktrace", rest)
            message = rest[:stop.start()] if stop else rest[:4000]
        return cls(message.strip())
    lines = [ln for ln in text.splitlines() if ln.strip() and not re.match(r"\s+at |\s*\.\.\. \d+ more", ln)]
    reason = next((ln.strip() for ln in lines if "Job aborted" in ln or "SparkException" in ln),
                  lines[0] if lines else "")
    exc_lines = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", ln)
                 and not ln.startswith(("org.apache.", "java.", "scala.", "py4j."))]
    detail = f"\nlast Python exception: {exc_lines[-1]}" if exc_lines else ""
    # a lost executor or a crashed Python worker may not recur: the driver launches the stage again
    lost = re.search(r"ExecutorLostFailure|exited unexpectedly|crashed|Lost executor|heartbeat timed out", text)
    return (WorkerLost if lost else TrainingError)(f"the Spark training job failed: {reason[:1500]}{detail}\n"
                         "(see the [rank R] lines above or the executor logs for each worker's output)")


