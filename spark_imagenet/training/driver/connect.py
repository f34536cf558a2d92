"""Barrier training through Spark Connect (no SparkContext, no RDD).

A Spark Connect session (``SparkSession.builder.remote("sc://HOST:PORT")``,
Databricks shared and serverless compute) has no ``sparkContext`` and no RDD
API, but a DataFrame can still run barrier tasks:
``spark.range(N, numPartitions=N).mapInArrow(fn, "line string", barrier=True)``
runs N tasks of one barrier stage, each with a working
``BarrierTaskContext`` (``allGather``, ``getTaskInfos``). :func:`arrow_task`
turns the classic task body, :func:`~spark_imagenet.training.task.barrier_task.run_task`,
into such an ``fn``: Arrow record batches in, the task's JSON result lines out
as one batch of one string column.

:class:`ConnectLaunch` is the Connect side of the driver's one launch interface
(:class:`~spark_imagenet.training.driver.stage.BarrierLaunch`): the job's operations carry a tag of their own
(``spark.addTag``), and Ctrl-C interrupts that tag (``spark.interruptTag``), the Connect counterpart of a
classic job group.

:func:`check_connect` makes the preflight checks Connect allows (the
session's conf through ``spark.conf.get``) and names, in one warning line,
those it cannot make (the scheduler's barrier slot count, which needs the JVM's
SparkContext).

No pyarrow or pyspark import happens at module import time: the driver imports
this module for classic sessions too.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job.master import Master
from spark_imagenet.training.task.barrier_task import TaskSpec, run_task
from spark_imagenet.training.driver.spark_session import is_connect_session  # noqa: F401 - part of this module's API

#: The schema of the batches a task returns: one JSON result line per row.
RESULT_SCHEMA = "line string"

#: What the warning says about the slot check Connect cannot make.
_SLOTS_NOT_CHECKED = "the scheduler's barrier task slot count (SparkContext.maxNumConcurrentTasks needs the JVM)"


def connect_url(spark, master: str | None = None) -> str:
    """The ``sc://HOST:PORT`` a Connect session talks to, for logs and results (no token or parameters).

    Args:
        spark: a Spark Connect session.
        master: the job's ``master`` (``TrainConfig.master``); used when it is an ``sc://`` URL.

    Returns:
        str: ``sc://HOST:PORT``, or ``"connect"`` when the session does not say.
    """
    if Master.parse(master, check=False).kind == "connect":
        parts = urlsplit(master.strip().split(";", 1)[0])
        return f"sc://{parts.netloc}"
    builder = getattr(getattr(spark, "client", None), "_builder", None)  # pyspark's ChannelBuilder
    endpoint = getattr(builder, "endpoint", None)
    return f"sc://{endpoint}" if isinstance(endpoint, str) and endpoint else "connect"


def _run_arrow_task(spec: TaskSpec, batches: Iterable[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: drain the input batches, run :func:`run_task`, yield its lines as one batch."""
    import pyarrow as pa

    items = [value for batch in batches for value in batch.column(0).to_pylist()]
    lines = list(run_task(spec, items))
    yield pa.RecordBatch.from_pydict({"line": lines}, schema=pa.schema([("line", pa.string())]))


def arrow_task(spec: TaskSpec) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The barrier task body for ``DataFrame.mapInArrow(fn, RESULT_SCHEMA, barrier=True)``.

    Args:
        spec: the job's :class:`~spark_imagenet.training.task.barrier_task.TaskSpec`.

    Returns:
        A picklable function of an iterator of ``pyarrow.RecordBatch`` (one
        partition's rows, ignored) yielding one batch with a string column
        ``line``: the JSON lines of :func:`run_task`, the same records the
        classic path collects. Its errors are :func:`run_task`'s.
    """
    return functools.partial(_run_arrow_task, spec)


class ConnectLaunch:
    """The barrier stage of a Spark Connect session (a :class:`~spark_imagenet.training.driver.stage.BarrierLaunch`):
    ``spark.range(N, numPartitions=N).mapInArrow(arrow_task(spec), "line string", barrier=True)`` under a tag of
    its own (``spark.addTag``; tags belong to the calling thread), interrupted after Ctrl-C with
    ``spark.interruptTag``.

    Args:
        spark: a Spark Connect session.
    """

    thread_class = threading.Thread

    def __init__(self, spark) -> None:
        self.spark = spark
        self.tag = f"spark-imagenet-{uuid.uuid4().hex}"

    def collect(self, spec: TaskSpec) -> list[str]:
        """Run the stage; return every task's JSON line (raises the Connect exception of a failed job, whose
        text carries the task's error)."""
        workers = spec.config.workers
        self.spark.addTag(self.tag)
        try:
            frame = self.spark.range(workers, numPartitions=workers).mapInArrow(arrow_task(spec), RESULT_SCHEMA,
                                                                                 barrier=True)
            return [row.line for row in frame.collect()]
        finally:
            with contextlib.suppress(Exception):
                self.spark.removeTag(self.tag)

    def cancel(self, done: threading.Event, wait_s: float = 60.0) -> None:
        """Interrupt the tagged operations and wait (at most ``wait_s``) for the stage's thread; errors swallowed."""
        with contextlib.suppress(Exception):
            self.spark.interruptTag(self.tag)
        done.wait(wait_s)


def _conf(spark, key: str, unreadable: list[str] | None = None) -> str | None:
    """``spark.conf.get(key, None)`` as a string; a setting the server will not show is None, and named in
    ``unreadable`` (when given)."""
    try:
        value = spark.conf.get(key, None)
    except Exception as e:  # noqa: BLE001 - e.g. a serverless workspace hiding the setting
        if unreadable is not None:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            unreadable.append(f"{key} (not readable: {first[:120]})")
        return None
    return None if value is None else str(value)


def conf_getter(spark) -> Callable[[str, str | None], str | None]:
    """``get(key, default)`` over a Spark Connect session's settings, the shape preflight's checks take.

    A setting the server will not show reads as ``default`` (:func:`check_connect`'s
    warning names the settings it could not read).
    """

    def get(key: str, default: str | None = None) -> str | None:
        value = _conf(spark, key)
        return default if value is None else value

    return get


def server_slots(master: str | None, task_cpus: int) -> int | None:
    """The barrier task slots a Spark Connect server's ``spark.master`` gives, when its URL alone tells:
    ``local[N]`` and ``local-cluster[E,C,MB]`` (:meth:`~spark_imagenet.training.job.master.Master.slots`).

    Returns:
        int | None: the slots; None for a cluster's master, one not readable, and ``local[*]``, whose cores
        are those of the server's machine, which a client cannot count.
    """
    return Master.parse(master, check=False).slots(task_cpus)


def check_connect(spark, workers: int, url: str) -> tuple[str | None, list[str]]:
    """Check a Connect session before launching; say which checks could not be made.

    Made through ``spark.conf.get``: ``spark.dynamicAllocation.enabled`` (barrier
    stages refuse it), and, when the server's ``spark.master`` is
    ``local[N]``/``local-cluster[...]``, the slots that master gives
    (:func:`server_slots`). The scheduler's own slot count needs the
    JVM's SparkContext and is never checked: that and any setting the server
    does not show are named in the warning line.

    Args:
        spark: a Spark Connect session.
        workers: barrier tasks wanted.
        url: the session's ``sc://`` URL (for messages).

    Returns:
        ``(master, warnings)``: the server's ``spark.master`` (None when not
        readable) and exactly one ``warning: ...`` line.

    Raises:
        ConfigError: the server cannot be reached, dynamic allocation is on,
            or a local master has fewer slots than ``workers``.
    """
    try:
        spark.version  # one round trip: is the server there at all?
    except Exception as e:  # noqa: BLE001 - gRPC errors of every kind
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"cannot reach the Spark Connect server {url}: {first[:300]}. Check the sc://HOST:PORT "
                          "of --master (or SPARK_REMOTE) and that the server is running") from None
    unreadable: list[str] = []
    if (_conf(spark, "spark.dynamicAllocation.enabled", unreadable) or "false").strip().lower() == "true":
        raise ConfigError(
            f"spark.dynamicAllocation.enabled is true on the Spark Connect server {url}, and Spark barrier stages "
            "refuse dynamic allocation (SPARK-24942). Set spark.dynamicAllocation.enabled=false in the server's "
            f"(cluster's) Spark config, with at least {workers} task slots.")
    master = _conf(spark, "spark.master", unreadable)
    task_cpus = int(_conf(spark, "spark.task.cpus", unreadable) or "1")
    not_checked = [_SLOTS_NOT_CHECKED]
    slots = server_slots(master, task_cpus)
    if slots is not None:
        if slots < workers:
            raise ConfigError(
                f"--workers {workers} needs {workers} barrier task slots, but the Spark Connect server {url} runs "
                f"master {master} with spark.task.cpus={task_cpus}: {slots} slot(s). Use --workers <= {slots}, "
                f"or start the server with more cores (--master local[{workers}] or a cluster).")
        not_checked[0] += f"; estimated instead from spark.master {master} and spark.task.cpus={task_cpus}: {slots}"
    else:
        not_checked[0] += (f"; the master behind it (spark.master {master or 'not readable'}) must give {workers} "
                           "free task slots at once, else the stage fails with 'requires N slots, only M available'")
    warning = ("warning: Spark Connect session: not checked before launch: "
               + "; ".join(not_checked + unreadable))
    return master, [warning]
