"""The Spark session's facts, read once, and the checks of a job against them.

:func:`read_session_facts` asks a session, classic or Spark Connect, everything the checks need, once: its
master (under Connect: the server's ``spark.master``), the settings the checks read (:data:`CONF_KEYS`), and
the barrier task slots with how they were found (a classic session's scheduler, after waiting for a
cluster's executors to register; under Connect the slots the server's master URL gives, when it tells). The
result is a frozen :class:`SessionFacts`; :func:`check_session` turns it and the job into findings: the job's
master not used, dynamic allocation, slots, reach of the driver's local paths from the executors, network
encryption and the GPU settings.
"""

from __future__ import annotations

import dataclasses
import os
import time

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.driver.connect import connect_url
from spark_imagenet.training.driver.preflight.findings import Finding, Findings
from spark_imagenet.training.driver.preflight.gpus import (
    EXECUTOR_AMOUNT,
    EXECUTOR_SCRIPT,
    TASK_AMOUNT,
    WORKER_AMOUNT,
    WORKER_FILE,
    WORKER_SCRIPT,
    check_gpu_conf,
)
from spark_imagenet.training.driver.preflight.rules import (
    NETWORK_ENCRYPTION_KEYS,
    check_dataset_reachable,
    check_encryption,
    check_output_reachable,
    too_few_slots,
)
from spark_imagenet.training.driver.spark_session import is_connect_session
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.master import Master

#: Seconds to wait for executors to register on a cluster master before the
#: slot count is taken (executors of a freshly started application register
#: a few seconds after the SparkContext).
EXECUTOR_WAIT_SECONDS = 60.0

DYNAMIC_ALLOCATION = "spark.dynamicAllocation.enabled"
TASK_CPUS = "spark.task.cpus"
#: How long a barrier stage's rendezvous waits for its last task (allGather's bound, and the log channel's).
BARRIER_TIMEOUT = "spark.barrier.sync.timeout"
#: Every setting the checks read, read once into :attr:`SessionFacts.conf`.
CONF_KEYS = (DYNAMIC_ALLOCATION, TASK_CPUS, BARRIER_TIMEOUT, *NETWORK_ENCRYPTION_KEYS, TASK_AMOUNT, EXECUTOR_AMOUNT,
             EXECUTOR_SCRIPT, WORKER_AMOUNT, WORKER_SCRIPT, WORKER_FILE)

#: The names of this machine's loopback address in an ``sc://`` URL.
LOOPBACK = ("127.0.0.1", "localhost", "::1")

#: What the Connect warning says about the slot check Connect cannot make.
_SLOTS_NOT_CHECKED = "the scheduler's barrier task slot count (SparkContext.maxNumConcurrentTasks needs the JVM)"


@dataclasses.dataclass(frozen=True)
class SessionFacts:
    """What a Spark session says about itself, read once (:func:`read_session_facts`).

    Attributes:
        master: the master the tasks run under: a classic session's ``sc.master``; under Spark Connect the
            server's ``spark.master`` (None when the server does not show it).
        connect_url: the ``sc://HOST:PORT`` of a Spark Connect session; None for a classic session.
        conf: ``(key, value)`` of each setting of :data:`CONF_KEYS` that is set.
        slots: the barrier task slots found; None when the session cannot tell (Connect with a cluster
            master behind it).
        slots_how: how :attr:`slots` were found, for messages.
        waited_s: seconds waited for a cluster's executors to register before counting (0 for a master in the
            driver's JVM and under Connect).
        unreadable: ``key (not readable: why)`` of each setting a Connect server would not show.
    """

    master: str | None
    connect_url: str | None = None
    conf: tuple[tuple[str, str], ...] = ()
    slots: int | None = None
    slots_how: str = ""
    waited_s: float = 0.0
    unreadable: tuple[str, ...] = ()

    def get(self, key: str, default: str | None = None) -> str | None:
        """A setting's text, or ``default`` when unset (a conf getter, :data:`~.rules.ConfGetter`)."""
        return dict(self.conf).get(key, default)

    @property
    def is_connect(self) -> bool:
        """bool: a Spark Connect session."""
        return self.connect_url is not None

    @property
    def tasks_on_this_machine(self) -> bool:
        """bool: the tasks run on this machine with the driver's files: a classic session whose master runs on
        this host, or a Connect server on this machine's loopback address whose master runs on its host."""
        here = Master.parse(self.master, check=False).runs_on_this_host
        if not self.is_connect:
            return here
        return here and Master.parse(self.connect_url, check=False).host in LOOPBACK

    @property
    def tasks_in_this_jvm(self) -> bool:
        """bool: the tasks' stderr is the console of the process that runs their JVM: ``local[N]`` (under
        Connect, the server's ``local[N]`` on this machine's loopback address)."""
        local = Master.parse(self.master, check=False).runs_in_driver_jvm
        return local and (not self.is_connect or Master.parse(self.connect_url, check=False).host in LOOPBACK)

    @property
    def where_tasks_run(self) -> str | None:
        """The master the reach checks judge by: the session's master, or under Connect the server's master
        when the server is on this machine, else its ``sc://`` URL (whose executors may be anywhere)."""
        if self.is_connect and not self.tasks_on_this_machine:
            return self.connect_url
        return self.master

    @property
    def reported_master(self) -> str | None:
        """The master the results name: ``sc.master``, or the Connect server's ``sc://HOST:PORT``."""
        return self.connect_url if self.is_connect else self.master


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


def read_session_facts(spark, workers: int = 0, *, master: str | None = None,
                       wait_seconds: float | None = None) -> SessionFacts:
    """Read a session's facts once: its master, the settings of :data:`CONF_KEYS`, its barrier slots.

    Args:
        spark: a SparkSession, classic or Spark Connect.
        workers: the barrier tasks wanted: on a cluster master, the count waits (at most ``wait_seconds``) for
            executors to register until there are that many slots; 0 counts at once.
        master: the job's ``master``, whose ``sc://`` URL names a Connect session's server.
        wait_seconds: how long to wait for executors (None: :func:`executor_wait_seconds`; 0 under ``local``).

    Returns:
        SessionFacts: the facts.

    Raises:
        ConfigError: the object is no session (:func:`spark_context`), a Spark Connect server that cannot be
            reached, or a ``spark.scheduler.maxRegisteredResourcesWaitingTime`` that is no Spark time.
    """
    sc = spark_context(spark)
    if sc is None:
        return _connect_facts(spark, master)
    conf = sc.getConf()
    values = tuple((key, str(value)) for key in CONF_KEYS if (value := conf.get(key, None)) is not None)
    slots, how = available_slots(sc)
    local = Master.parse(sc.master, check=False).runs_in_driver_jvm
    if wait_seconds is None:
        wait_seconds = 0.0 if local or not workers else executor_wait_seconds(conf)
    deadline = time.monotonic() + wait_seconds
    while slots < workers and time.monotonic() < deadline:
        time.sleep(1.0)
        slots, how = available_slots(sc)
    waited = 0.0 if slots >= workers else wait_seconds
    return SessionFacts(master=sc.master.strip(), conf=values, slots=slots, slots_how=how, waited_s=waited)


def _connect_facts(spark, master: str | None) -> SessionFacts:
    """:func:`read_session_facts` of a Spark Connect session, through ``spark.conf.get`` (one round trip
    first: is the server there at all?)."""
    url = connect_url(spark, master)
    try:
        spark.version
    except Exception as e:  # noqa: BLE001 - gRPC errors of every kind
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"cannot reach the Spark Connect server {url}: {first[:300]}. Check the sc://HOST:PORT "
                          "of --master (or SPARK_REMOTE) and that the server is running") from None
    values, unreadable = [], []
    for key in (DYNAMIC_ALLOCATION, "spark.master", *CONF_KEYS[1:]):
        try:
            value = spark.conf.get(key, None)
        except Exception as e:  # noqa: BLE001 - e.g. a serverless workspace hiding the setting
            if key in (DYNAMIC_ALLOCATION, "spark.master", TASK_CPUS):  # the ones the warning names
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                unreadable.append(f"{key} (not readable: {first[:120]})")
            continue
        if value is not None:
            values.append((key, str(value)))
    conf = dict(values)
    server_master = conf.pop("spark.master", None)
    task_cpus = int(conf.get(TASK_CPUS) or "1")
    slots = Master.parse(server_master, check=False).slots(task_cpus)  # local[*]: the server's cores, unknown
    how = (f"estimated from spark.master {server_master} and spark.task.cpus={task_cpus}" if slots is not None
           else f"not known through Spark Connect (spark.master {server_master or 'not readable'})")
    return SessionFacts(master=server_master, connect_url=url, conf=tuple(conf.items()), slots=slots,
                        slots_how=how, unreadable=tuple(unreadable))


def check_session(facts: SessionFacts, config: TrainConfig, url: str | None = None) -> Findings:
    """The checks of a job against its session's facts.

    Args:
        facts: from :func:`read_session_facts`.
        config: the job's settings (``workers``, ``master``, ``allow_unencrypted``, ``gpus_per_worker``,
            ``shared_filesystem``, ``output``, ``checkpoint_dir``).
        url: the dataset's URL, checked for reach from the executors; None: not checked.

    Returns:
        Findings: ``master`` (a warning when the job's master is not the session's), ``dynamic allocation``,
        ``barrier slots`` (under Connect also a ``not checked`` warning naming what Connect cannot check),
        ``dataset reachable``, ``--output reachable``, ``--checkpoint-dir reachable``, ``encryption`` and
        ``gpu settings``; each problem carries a :class:`~spark_imagenet.errors.ConfigError` naming the setting
        to change, with the numbers.
    """
    where = facts.where_tasks_run
    return Findings([
        _master_used(facts, config.scaling.master),
        _dynamic_allocation(facts, config.scaling.workers),
        *_slots(facts, config.scaling.workers),
        check_dataset_reachable(url, where, config.data.shared_filesystem) if url is not None else None,
        check_output_reachable(config.run.output, where, config.data.shared_filesystem),
        check_output_reachable(config.run.checkpoint_dir, where, config.data.shared_filesystem, "--checkpoint-dir"),
        check_encryption(facts.get, config.scaling.workers, config.scaling.allow_unencrypted),
        check_gpu_conf(facts.get, config.scaling.gpus_per_worker, config.scaling.workers, facts.master, server=facts.connect_url),
    ])


def _master_used(facts: SessionFacts, master: str | None) -> Finding | None:
    """A warning when the job names a master the session does not run on."""
    if master is None:
        return None
    if facts.is_connect and Master.parse(master, check=False).kind != "connect":
        return Finding.warning("master", f"the job's master {master!r} is not used: this Spark Connect session "
                                         f"talks to {facts.connect_url}")
    if not facts.is_connect and master != facts.master:
        return Finding.warning("master", f"the job's master {master!r} is not used: this session runs on "
                                         f"{facts.master!r} (master and conf choose the command line's session; "
                                         "a session of your own keeps its own)")
    return None


def _dynamic_allocation(facts: SessionFacts, workers: int) -> Finding:
    """Barrier stages refuse dynamic allocation (SPARK-24942)."""
    if (facts.get(DYNAMIC_ALLOCATION) or "false").strip().lower() != "true":
        return Finding.ok("dynamic allocation", "off")
    if facts.is_connect:
        return Finding.problem("dynamic allocation", (
            f"spark.dynamicAllocation.enabled is true on the Spark Connect server {facts.connect_url}, and Spark "
            "barrier stages refuse dynamic allocation (SPARK-24942). Set spark.dynamicAllocation.enabled=false in "
            f"the server's (cluster's) Spark config, with at least {workers} task slots."),
            key="spark.dynamicAllocation.enabled", value="true")
    return Finding.problem("dynamic allocation", (
        "spark.dynamicAllocation.enabled is true, and Spark barrier stages refuse dynamic allocation "
        "(SPARK-24942). Set spark.dynamicAllocation.enabled=false (and give the application at least "
        f"{workers} task slots, e.g. spark.executor.instances x spark.executor.cores)."),
        key="spark.dynamicAllocation.enabled", value="true")


def _slots(facts: SessionFacts, workers: int) -> list[Finding]:
    """``barrier slots``: enough for ``workers``, or not; under Connect, also what could not be checked."""
    if facts.is_connect:
        return _connect_slots(facts, workers)
    if facts.slots is not None and facts.slots < workers:
        waited = "" if not facts.waited_s else (f" after waiting {facts.waited_s:.0f} s for executors to register "
                                                "(spark.scheduler.maxRegisteredResourcesWaitingTime)")
        return [Finding.problem("barrier slots", too_few_slots(workers, facts.slots, f"{facts.slots} available{waited}",
                                                               facts.master, facts.slots_how, _task_cpus(facts)),
                                key="--workers", value=workers)]
    return [Finding.ok("barrier slots", f"{facts.slots} ({facts.slots_how}); enough for --workers {workers}")]


def _task_cpus(facts: SessionFacts) -> int:
    """The session's ``spark.task.cpus`` as a number of cores (1 when unset or not a whole number)."""
    text = (facts.get(TASK_CPUS) or "1").strip()
    return int(text) if text.isdigit() and int(text) > 0 else 1


def _connect_slots(facts: SessionFacts, workers: int) -> list[Finding]:
    """The slots a Connect server's local master gives, and one warning naming what Connect cannot check."""
    task_cpus = facts.get(TASK_CPUS) or "1"
    if facts.slots is not None and facts.slots < workers:
        return [Finding.problem("barrier slots", (
            f"--workers {workers} needs {workers} barrier task slots, but the Spark Connect server "
            f"{facts.connect_url} runs master {facts.master} with spark.task.cpus={task_cpus}: {facts.slots} "
            f"slot(s). Use --workers <= {facts.slots}, or start the server with more cores (--master "
            f"local[{workers * _task_cpus(facts)}] or a cluster)."), key="--workers", value=workers)]
    if facts.slots is not None:
        found = f"{facts.slots} (from the server's master)"
        not_checked = f"{_SLOTS_NOT_CHECKED}; estimated instead from spark.master {facts.master} and " \
                      f"spark.task.cpus={task_cpus}: {facts.slots}"
    else:
        found = "not known through Connect"
        not_checked = (f"{_SLOTS_NOT_CHECKED}; the master behind it (spark.master {facts.master or 'not readable'}) "
                       f"must give {workers} free task slots at once, else the stage fails with 'requires N slots, "
                       "only M available'")
    return [Finding.ok("barrier slots", f"{found}; --workers {workers} checked as far as Connect allows"),
            Finding.warning("not checked", "Spark Connect session: not checked before launch: "
                            + "; ".join([not_checked, *facts.unreadable]))]


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
    task_cpus = int(sc.getConf().get(TASK_CPUS, "1"))
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile)), f"executor cores / spark.task.cpus={task_cpus}"
    except Exception:
        slots = slots_from_master(sc.master, task_cpus, sc.defaultParallelism)
        return slots, f"estimated from master {sc.master} and spark.task.cpus={task_cpus}"


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


def barrier_timeout_seconds(conf) -> float:
    """``spark.barrier.sync.timeout`` of a conf getter (``.get(key, default)``: the session's facts, a job's
    ``--conf``) in seconds; Spark's default, 365 days, when unset.

    Raises:
        ConfigError: the setting is not a Spark time (``.key`` the setting).
    """
    text = conf.get(BARRIER_TIMEOUT, "365d")
    try:
        return spark_seconds(text, "s")
    except ConfigError as e:
        raise ConfigError(f"{BARRIER_TIMEOUT}: {e}; give a time such as 3600s", key=BARRIER_TIMEOUT,
                          value=text) from None


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
        raise ConfigError(f"{key}: {e}", key=key, value=text) from None
    return max(EXECUTOR_WAIT_SECONDS, spark_wait)
