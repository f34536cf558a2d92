"""The barrier stage, behind one launch interface for both kinds of session.

A :class:`BarrierLaunch` runs the frozen :class:`~spark_imagenet.training.task.barrier_task.TaskSpec`, bound to
:func:`~spark_imagenet.training.task.barrier_task.run_task` with ``functools.partial``, as one barrier stage of N
tasks, and cancels it after Ctrl-C:

* :class:`ClassicLaunch`: ``sc.parallelize(range(N), N).barrier().mapPartitions(...)`` in a job group of its
  own (the product's design: docs/design.md, 'One TensorFlow process per task');
* :class:`~spark_imagenet.training.driver.connect.ConnectLaunch`: ``spark.range(N, numPartitions=N)
  .mapInArrow(..., barrier=True)`` under a tag of its own (Spark Connect has no RDD).

:func:`run_stage` runs either in a thread of its own (:func:`~spark_imagenet.training.job.interrupts.run_interruptibly`)
and returns every task's JSON line.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
import uuid
from typing import Callable, Protocol

from spark_imagenet.training.job.interrupts import run_interruptibly, sigint_handler
from spark_imagenet.training.task.barrier_task import TaskSpec, run_task

#: Seconds to wait, after Ctrl-C, for the cancelled barrier job and its tasks to end.
CANCEL_WAIT_S = 60


class BarrierLaunch(Protocol):
    """How one kind of session runs a barrier stage.

    Attributes:
        thread_class: the thread :func:`run_stage` runs :meth:`collect` in.
    """

    thread_class: Callable[..., threading.Thread]

    def collect(self, spec: TaskSpec) -> list[str]:
        """Run the stage of ``spec.config.scaling.workers`` tasks; return every task's JSON line (raises Spark's error)."""

    def cancel(self, done: threading.Event) -> None:
        """Cancel the stage after Ctrl-C, quietly, and wait (bounded) for ``done``: the stage's thread ended."""


def run_stage(launch: BarrierLaunch, spec: TaskSpec) -> list[str]:
    """``launch.collect(spec)`` in a thread of its own while this thread waits; Ctrl-C cancels it.

    Raises:
        whatever ``collect`` raised (Spark's error: the caller rebuilds the task's);
        KeyboardInterrupt: Ctrl-C; the stage has been cancelled.
    """
    return run_interruptibly(functools.partial(launch.collect, spec), launch.cancel,
                             thread_class=launch.thread_class, name="spark-imagenet barrier job", poll_s=0.5)


class ClassicLaunch:
    """The barrier stage of a classic session: ``RDD.barrier().mapPartitions`` in a job group of its own.

    Args:
        sc: the SparkContext.
        description: the job group's description (the Spark UI shows it).
    """

    def __init__(self, sc, description: str) -> None:
        from pyspark import InheritableThread

        self.sc, self.description = sc, description
        self.group = f"spark-imagenet-{uuid.uuid4().hex}"
        self.thread_class = InheritableThread

    def collect(self, spec: TaskSpec) -> list[str]:
        """Run the stage; return every task's JSON line."""
        workers = spec.config.scaling.workers
        self.sc.setJobGroup(self.group, self.description, interruptOnCancel=True)
        return self.sc.parallelize(range(workers), workers).barrier().mapPartitions(
            functools.partial(run_task, spec)).collect()

    def cancel(self, done: threading.Event, wait_s: float = CANCEL_WAIT_S) -> None:
        """Cancel the job group after Ctrl-C without Spark's log noise; wait for it to end.

        Spark's log is turned off while the tasks die (the executor logs every killed Python worker as
        "crashed"), and restored once no task of the group runs; a further Ctrl-C is ignored meanwhile. Every
        Spark failure here is swallowed: the caller re-raises the KeyboardInterrupt.

        Args:
            done: set when the thread running the job has ended (waited for, at most ``wait_s``).
            wait_s: the bound on the whole wait, in seconds.
        """
        sc = self.sc
        with sigint_handler(signal.SIG_IGN):
            level = None
            with contextlib.suppress(Exception):
                level = str(sc._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
            with contextlib.suppress(Exception):
                sc.setLogLevel("OFF")
            with contextlib.suppress(Exception):
                sc.cancelJobGroup(self.group)
            deadline = time.monotonic() + wait_s
            done.wait(wait_s)
            with contextlib.suppress(Exception):
                tracker = sc.statusTracker()
                while time.monotonic() < deadline and _active_tasks(tracker, self.group):
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
