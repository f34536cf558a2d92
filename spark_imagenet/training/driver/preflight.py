"""Checks on the driver, before any barrier task starts.

Each check raises a :class:`~spark_imagenet.errors.ConfigError` with the
numbers and the setting to change, instead of a late failure or a hang:

* the session's ``SparkContext`` (:func:`spark_context`; None for a Spark
  Connect session, whose checks live in :mod:`spark_imagenet.training.driver.connect`);
* ``spark.dynamicAllocation.enabled`` is not true, and there are at least N
  barrier task slots (:func:`check_spark`);
* the results file can be written (:func:`check_results_path`), and the ``--output`` folder holds no
  earlier run's outputs unless ``--overwrite`` (:func:`check_output_unused`);
* Spark's network encryption or SSL is not on while TensorFlow's gRPC is
  plaintext, unless allowed, and every worker has a train shard
  (:func:`check_cluster_conf`, through a conf getter: classic or Spark Connect).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Mapping

from spark_imagenet.errors import ConfigError
from spark_imagenet.storage import Storage, is_remote_url
from spark_imagenet.training.job.master import Master
from spark_imagenet.training.job.outputs import earlier_outputs

#: Seconds to wait for executors to register on a cluster master before the
#: slot check gives up (executors of a freshly started application register
#: a few seconds after the SparkContext).
EXECUTOR_WAIT_SECONDS = 60.0


def check_results_path(results: str | os.PathLike | None) -> None:
    """Check that ``--results`` names a file in an existing, writable folder.

    Raises:
        ConfigError: the folder is missing or not writable, or the path is a folder.
    """
    if results is None:
        return
    target = Path(results).expanduser().absolute()
    parent = target.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(f"--results {results}: folder {parent} does not exist or is not writable")
    if target.is_dir():
        raise ConfigError(f"--results {results} is a folder; give a file name such as {target / 'results.json'}")


def spark_context(spark):
    """The SparkContext of a classic session; None for a Spark Connect session.

    A Spark Connect session (``pyspark.sql.connect``: ``builder.remote(...)``,
    Databricks shared or serverless compute) has no SparkContext and no RDD
    API; the driver then launches through ``DataFrame.mapInArrow(...,
    barrier=True)`` (:mod:`spark_imagenet.training.driver.connect`).

    Returns:
        pyspark.SparkContext | None: None exactly for a Spark Connect session.

    Raises:
        ConfigError: neither: an object with no usable ``sparkContext`` that
            is not a Connect session either.
    """
    from spark_imagenet.training.driver.spark_session import is_connect_session

    if is_connect_session(spark):
        return None
    try:
        sc = spark.sparkContext
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{type(spark).__name__} is neither a classic SparkSession (its sparkContext failed: "
                          f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}) nor a Spark Connect "
                          "session; pass a pyspark.sql.SparkSession") from e
    if sc is None:
        raise ConfigError(f"{type(spark).__name__} has no SparkContext and is not a Spark Connect session; "
                          "pass a pyspark.sql.SparkSession")
    return sc


def slots_from_master(master: str, task_cpus: int, default_parallelism: int) -> int:
    """Barrier task slots estimated from the master URL alone, the driver running on this machine.

    Args:
        master: ``local``, ``local[N]``, ``local[*]`` (this machine's cores), ``local[N,F]``,
            ``local-cluster[E,C,M]`` or a cluster URL (:class:`~spark_imagenet.training.job.master.Master`).
        task_cpus: ``spark.task.cpus``.
        default_parallelism: ``sc.defaultParallelism`` (for cluster URLs: the
            registered executors' total cores, unless
            ``spark.default.parallelism`` overrides it).

    Returns:
        int: cores // task_cpus.
    """
    slots = Master.parse(master, check=False).slots(task_cpus, cpu_count=os.cpu_count() or 1)
    return default_parallelism // max(1, task_cpus) if slots is None else slots


def available_slots(sc) -> tuple[int, str]:
    """How many barrier tasks the application can run at once.

    Asks the scheduler backend the same question Spark's own barrier check
    asks (``SparkContext.maxNumConcurrentTasks`` for the default resource
    profile: executor cores / ``spark.task.cpus``, also limited by GPU and
    other task resources). When that JVM call is unavailable, falls back to
    :func:`slots_from_master`. Slots busy with other jobs are not subtracted.

    Returns:
        ``(slots, how)``: the count and a short description of its source.
    """
    task_cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile)), f"executor cores / spark.task.cpus={task_cpus}"
    except Exception:
        slots = slots_from_master(sc.master, task_cpus, sc.defaultParallelism)
        return slots, f"estimated from master {sc.master} and spark.task.cpus={task_cpus}"


def free_slots(sc) -> int:
    """Barrier slots free for a new stage: :func:`available_slots` less the unfinished tasks of other jobs'
    active stages, running or waiting (a waiting task of an earlier job takes the next free slot first; one
    slot per task)."""
    total, _how = available_slots(sc)
    tracker = sc.statusTracker()
    busy = 0
    for stage in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage)
        busy += max(0, info.numTasks - info.numCompletedTasks) if info is not None else 0
    return max(0, total - busy)


#: Spark's time suffixes (JavaUtils.timeStringAs), in seconds; a bare number is Spark's default unit.
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def spark_seconds(value: str, default_unit: str = "ms") -> float:
    """A Spark time setting (``"900s"``, ``"5min"``, ``"30000"``) in seconds.

    Args:
        value: the setting's text.
        default_unit: the unit of a bare number (``ms`` for
            ``spark.scheduler.maxRegisteredResourcesWaitingTime``).

    Raises:
        ConfigError: not a number with one of Spark's time units.
    """
    text = value.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number):] or default_unit
    try:
        return float(number) * _TIME_UNITS[unit]
    except (ValueError, KeyError):
        raise ConfigError(f"{value!r} is not a Spark time (a number and one of {', '.join(_TIME_UNITS)})") from None


def executor_wait_seconds(conf) -> float:
    """How long the driver waits for executors to register before counting slots.

    Spark's own wait, ``spark.scheduler.maxRegisteredResourcesWaitingTime``
    (30 s by default; submit/'s YARN and Kubernetes settings raise it: their
    containers first unpack an environment or pull an image), and at least
    :data:`EXECUTOR_WAIT_SECONDS`.
    """
    key = "spark.scheduler.maxRegisteredResourcesWaitingTime"
    text = conf.get(key, "30s")
    try:
        spark_wait = spark_seconds(text)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}") from None
    return max(EXECUTOR_WAIT_SECONDS, spark_wait)


def check_spark(sc, workers: int, wait_seconds: float | None = None) -> int:
    """Check that a barrier stage of ``workers`` tasks can start now.

    Args:
        sc: the SparkContext.
        workers: barrier tasks wanted.
        wait_seconds: on a cluster master, how long to wait for executors
            to register before giving up (0 under ``local``; None: see
            :func:`executor_wait_seconds`).

    Returns:
        int: the barrier task slots found (executor cores / ``spark.task.cpus``, limited by
        task resources); slots busy with other jobs are not subtracted.

    Raises:
        ConfigError: dynamic allocation is on, or fewer slots than workers.
    """
    conf = sc.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        raise ConfigError(
            "spark.dynamicAllocation.enabled is true, and Spark barrier stages refuse dynamic allocation "
            "(SPARK-24942). Set spark.dynamicAllocation.enabled=false (and give the application at least "
            f"{workers} task slots, e.g. spark.executor.instances x spark.executor.cores)."
        )
    slots, how = available_slots(sc)
    master = sc.master.strip()
    # local[N] runs its tasks in the driver's JVM: its slots are there at once. local-cluster[...] starts
    # executor JVMs that register a few seconds after the context, like a cluster's.
    local = Master.parse(master, check=False).runs_in_driver_jvm
    if wait_seconds is None:
        wait_seconds = 0.0 if local else executor_wait_seconds(conf)
    deadline = time.monotonic() + wait_seconds
    while slots < workers and time.monotonic() < deadline:
        time.sleep(1.0)
        slots, how = available_slots(sc)
    if slots < workers:
        waited = "" if local else (f" after waiting {wait_seconds:.0f} s for executors to register "
                                   "(spark.scheduler.maxRegisteredResourcesWaitingTime)")
        raise _too_few_slots(workers, slots, f"{slots} available{waited}", master, how)
    return slots


def check_slots_of_master_url(master: str | None, workers: int, conf: Mapping[str, str]) -> None:
    """Refuse more workers than a master on this machine has task slots, from its URL alone (before Spark starts).

    ``local[N]`` has N slots and ``local-cluster[E,C,MB]`` E x C, divided by ``spark.task.cpus``; a
    cluster's master (whose executors register later) and no master pass, for :func:`check_spark` to
    count once the session runs.

    Args:
        master: the job's master URL, or None.
        workers: barrier tasks wanted.
        conf: the job's extra Spark settings (``spark.task.cpus``).

    Raises:
        ConfigError: fewer slots than workers (as :func:`check_spark` says it), or a
            ``spark.task.cpus`` that is not a positive integer.
    """
    parsed = Master.parse(master)
    if not parsed.runs_on_this_host:
        return
    text = str(conf.get("spark.task.cpus", "1")).strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--conf spark.task.cpus={text}: must be a positive integer (CPUs per task)")
    slots = parsed.slots(int(text), cpu_count=os.cpu_count() or 1)
    if slots < workers:
        raise _too_few_slots(workers, slots, f"{slots} available", master.strip(),
                             f"from the master URL and spark.task.cpus={text}")


def _too_few_slots(workers: int, slots: int, available: str, master: str, how: str) -> ConfigError:
    """The error of :func:`check_spark` and :func:`check_slots_of_master_url`."""
    return ConfigError(
        f"--workers {workers} needs {workers} barrier task slots, only {available} (master {master}; {how}). "
        f"Use --workers <= {max(1, slots)}, or give Spark more slots: {_more_slots(master, workers)}."
    )


def _more_slots(master: str, workers: int) -> str:
    """How to get ``workers`` slots on this kind of master (for the message of :func:`check_spark`)."""
    kind = Master.parse(master, check=False).kind
    if kind == "local":
        return f"--master local[{workers}]"
    if kind == "local-cluster":
        return (f"--master 'local-cluster[{workers},1,2048]' (executors x cores each), and with GPU task resources "
                "enough GPUs per executor (spark.executor.resource.gpu.amount / spark.task.resource.gpu.amount "
                "tasks each)")
    return ("more executors (spark.executor.instances) or cores each (spark.executor.cores); with GPU task "
            "resources, enough GPUs per executor (spark.executor.resource.gpu.amount / "
            "spark.task.resource.gpu.amount tasks each)")


def check_dataset_reachable(url: str, master: str, shared_filesystem: bool) -> None:
    """Refuse a dataset on the driver's own disk when executors run on other hosts.

    Args:
        url: the dataset's storage URL (a local path, ``file://``, or a bucket URL of any store).
        master: the session's master URL.
        shared_filesystem: the user says every host mounts that path.

    Raises:
        ConfigError: a local path with a cluster master, and ``shared_filesystem`` false.
    """
    from spark_imagenet.storage import url_forms

    here = Master.parse(master, check=False).runs_on_this_host
    if shared_filesystem or here or is_remote_url(url):
        return
    raise ConfigError(
        f"the dataset {url} is a path on the driver's disk, but master {master} runs the barrier tasks on "
        "executors that may be on other hosts, which cannot read it. Put the dataset in a bucket "
        f"(spark-imagenet upload LOCAL URL, URL one of {url_forms(local=False)}) or on a path every host "
        "mounts, and then add --shared-filesystem (shared_filesystem = true in a job file)"
    )


def check_output_reachable(output: str | None, master: str, shared_filesystem: bool,
                           option: str = "--output") -> None:
    """Refuse an ``--output`` (or ``--checkpoint-dir``) on the driver's own disk when the chief may run on
    another host.

    The chief's barrier task writes ``model.keras``, the TensorBoard logs and the checkpoints from its
    executor's host (and every task reads a checkpoint to resume from).

    Raises:
        ConfigError: a local path with a cluster master, and ``shared_filesystem`` false.
    """
    from spark_imagenet.storage import url_forms

    here = Master.parse(master, check=False).runs_on_this_host
    if output is None or shared_filesystem or here or is_remote_url(output):
        return
    what = "the checkpoints" if option == "--checkpoint-dir" else "the model and TensorBoard logs"
    raise ConfigError(
        f"{option} {output} is a path on the driver's disk, but master {master} runs the chief (rank 0), which "
        f"writes {what}, on an executor that may be on another host. Give a bucket "
        f"({option} URL, URL one of {url_forms(local=False)}), or a path every host mounts and --shared-filesystem"
    )


def check_apart_from_dataset(dataset: Storage, written: Storage | None, option: str) -> None:
    """Refuse an ``--output`` (or ``--checkpoint-dir``) that is the dataset's own folder: the run's files would
    sit among the shards and the manifest.

    Args:
        dataset: the opened dataset folder.
        written: the opened folder the job writes, or None.
        option: the option that named it, for the message.

    Raises:
        ConfigError: both are the same folder (the same URL, or local paths that resolve to the same folder
            through ``..`` or symbolic links).
    """
    def where(storage: Storage) -> str:
        url = storage.url.rstrip("/")
        return url if is_remote_url(url) else os.path.realpath(url)

    if written is not None and where(written) == where(dataset):
        raise ConfigError(f"{option} {written.url} is the dataset's own folder: give a folder of its own for the "
                          f"run's files, e.g. {written.url.rstrip('/')}-runs/1")


def check_output_unused(storage: Storage, output: str, overwrite: bool) -> None:
    """Refuse an ``--output`` folder that holds the outputs of an earlier run, unless ``overwrite``.

    ``shard --out`` and ``--checkpoint-dir`` refuse another job's data the same way; without this, a second
    run would replace ``model.keras``, ``labels.json`` and ``results.json`` and mix both runs' TensorBoard
    logs. With ``overwrite`` nothing is deleted here: this run's outputs replace the earlier ones when they
    are written, and the earlier TensorBoard files are deleted then
    (:func:`~spark_imagenet.training.job.outputs.publish`), so a job that fails leaves them as they were.

    Args:
        storage: the opened output folder (:func:`~spark_imagenet.training.job.outputs.open_output`).
        output: the ``--output`` value, for the message.
        overwrite: the job's ``overwrite`` (``--overwrite``).

    Raises:
        ConfigError: the folder holds such objects and ``overwrite`` is false; the message names the folder,
            what it holds and the flag.
        StorageError: the folder cannot be listed.
    """
    if overwrite:
        return
    found = earlier_outputs(storage)
    if found:
        shown = sorted({name.split("/", 1)[0] + ("/" if "/" in name else "") for name in found})
        raise ConfigError(
            f"--output {output} already holds the outputs of an earlier run ({', '.join(shown)}). Give another "
            "folder, or add --overwrite (overwrite = true in a job file) to replace them")


# ------------------------------------------------- checks of the Spark conf (classic and Connect)
#: A conf getter: ``get(key, default)`` returns the setting's text or ``default``. Both
#: ``sc.getConf().get`` (classic) and ``spark.conf.get`` (Spark Connect) have this shape.
ConfGetter = Callable[[str, "str | None"], "str | None"]

#: Spark settings that encrypt traffic between Spark's processes, and what each one is.
NETWORK_ENCRYPTION_KEYS = {
    "spark.network.crypto.enabled": "AES-based encryption of Spark's RPC",
    "spark.ssl.enabled": "SSL for Spark's protocols",
    "spark.ssl.rpc.enabled": "SSL for Spark's RPC",
}

#: What crosses the network in the clear between TensorFlow workers (said in every message).
UNENCRYPTED_TRAFFIC = ("TensorFlow's gRPC between the workers (MultiWorkerMirroredStrategy's collective all-reduce "
                       "of the gradients, the model's variables and weights broadcast at start-up, the "
                       "rendezvous addresses) is plaintext, not encrypted")


def conf_true(get: ConfGetter, key: str) -> bool:
    """Whether a boolean Spark setting is on (``true`` in any case, blanks ignored; unset = off)."""
    value = get(key, None)
    return value is not None and str(value).strip().lower() == "true"


def encryption_settings_on(get: ConfGetter) -> list[str]:
    """The settings of :data:`NETWORK_ENCRYPTION_KEYS` that are on, as ``key=true`` (in that order)."""
    return [f"{key}=true" for key in NETWORK_ENCRYPTION_KEYS if conf_true(get, key)]


def check_encryption(get: ConfGetter, workers: int, allow_unencrypted: bool) -> list[str]:
    """Refuse to train in the clear on a cluster whose Spark traffic is encrypted.

    A cluster set up with Spark's network encryption or SSL expects its
    traffic encrypted; TensorFlow's gRPC between the workers is not (PySpark's
    TorchDistributor refuses the same way). One worker exchanges nothing with
    other workers, so ``workers == 1`` passes.

    Args:
        get: a conf getter (:data:`ConfGetter`).
        workers: TensorFlow workers of the job.
        allow_unencrypted: the user's ``allow_unencrypted`` (``--allow-unencrypted``).

    Returns:
        list[str]: one warning line when encryption is on and ``allow_unencrypted`` is true, else none.

    Raises:
        ConfigError: encryption or SSL is on, ``workers > 1`` and ``allow_unencrypted`` is false;
            the message names the settings found, what travels unencrypted and how to allow it.
    """
    found = encryption_settings_on(get)
    if not found or workers <= 1:
        return []
    what = f"Spark's network encryption or SSL is on ({', '.join(found)}), but {UNENCRYPTED_TRAFFIC}"
    if allow_unencrypted:
        return [f"warning: {what}; training anyway because allow_unencrypted is set (--allow-unencrypted)"]
    raise ConfigError(
        f"{what}: {workers} workers would send it across the network unencrypted. Run on a private network "
        "and add --allow-unencrypted (allow_unencrypted = true in a job file) to train anyway, "
        "or use --workers 1 (nothing travels between workers)."
    )


def check_train_shards(train_shards: int, workers: int) -> None:
    """Check that every worker gets a train shard of its own.

    The same rule as :func:`spark_imagenet.training.job.assignment.assign` (which
    :func:`~spark_imagenet.training.driver.launch.plan_job` applies to a manifest),
    for a shard count known without the manifest (``doctor``).

    Raises:
        ConfigError: ``train_shards < workers``, naming both numbers and the fix.
    """
    if train_shards < workers:
        raise ConfigError(
            f"the dataset has {train_shards} train shard(s) but --workers is {workers}: every worker needs at "
            f"least one train shard of its own. Reshard with --train-shards >= {workers} (a multiple of "
            f"{workers} balances best) or use --workers <= {train_shards}."
        )


def check_cluster_conf(get: ConfGetter, config, train_shards: int | None = None) -> list[str]:
    """The checks of a job against its session's conf that need no SparkContext.

    Serves a classic session (``sc.getConf().get``) and a Spark Connect
    session (``spark.conf.get``) alike. It never reads
    ``spark.python.worker.reuse``: each task runs TensorFlow in a child
    process of its own, so reused and fresh Python workers both work.
    Dynamic allocation and task slots need the SparkContext: :func:`check_spark`.

    Args:
        get: a conf getter (:data:`ConfGetter`).
        config: the job's :class:`~spark_imagenet.training.job.config.TrainConfig`
            (``workers``, ``allow_unencrypted``).
        train_shards: the dataset's train shard count, when known.

    Returns:
        list[str]: warning lines for the log (``allow_unencrypted`` used).

    Raises:
        ConfigError: see :func:`check_encryption` and :func:`check_train_shards`.
    """
    warnings = check_encryption(get, config.workers, config.allow_unencrypted)
    if train_shards is not None:
        check_train_shards(train_shards, config.workers)
    return warnings
