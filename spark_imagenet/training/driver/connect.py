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

The checks of a Connect session before launch are the preflight's
(:func:`spark_imagenet.training.driver.preflight.read_session_facts` reads the server's settings through
``spark.conf.get``; :func:`~spark_imagenet.training.driver.preflight.check_session` names, in one warning,
what Connect cannot check: the scheduler's barrier slot count, which needs the JVM's SparkContext).

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

from spark_imagenet.training.job.master import Master
from spark_imagenet.training.task.barrier_task import TaskSpec, run_task
from spark_imagenet.training.driver.spark_session import is_connect_session  # noqa: F401 - part of this module's API

#: The schema of the batches a task returns: one JSON result line per row.
RESULT_SCHEMA = "line string"

def connect_url(spark, master: str | None = None) -> str:
    """The ``sc://HOST:PORT`` a Connect session talks to, for logs and results (no token or parameters).

    Args:
        spark: a Spark Connect session.
        master: the job's ``master`` (``TrainConfig.scaling.master``); used when it is an ``sc://`` URL.

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
        workers = spec.config.scaling.workers
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
