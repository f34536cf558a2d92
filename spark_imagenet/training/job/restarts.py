"""What the driver does after a lost worker: give up, or launch the barrier stage again on how many workers.

A pure policy (no Spark, no clock): :class:`FailurePolicy` holds the settings that decide it
(``max_restarts``, ``workers``, ``min_workers``, the global batch) and it turns
the facts of one loss into a decision: :meth:`FailurePolicy.exhausted` (the restarts so far) gives a
:class:`GiveUp` or lets a relaunch follow, and :meth:`FailurePolicy.relaunch` (the workers of the launch that
failed, the barrier slots free once the driver stopped waiting for them) its :class:`Relaunch`. The driver
(:mod:`spark_imagenet.training.driver.launch`) waits for the slots, logs the decision's ``note`` and resizes
its plan (:meth:`~spark_imagenet.training.job.plan.JobPlan.resized`); the rules are testable without a cluster.
:func:`relaunch_from` chooses the checkpoint the relaunch resumes from, given the checkpoints the driver found
(:func:`~spark_imagenet.training.driver.preflight.find_resume`).

Example::

    >>> from spark_imagenet.training.job.config import TrainConfig
    >>> policy = FailurePolicy.of(TrainConfig(workers=8, min_workers=4, max_restarts=1))
    >>> policy.exhausted(restarts=0) is None                # max_restarts >= 1: a relaunch follows
    True
    >>> policy.relaunch(launched=8, free_slots=6).workers   # the largest count <= 6 dividing the global batch
    4
"""

from __future__ import annotations

import dataclasses

from spark_imagenet.training.job.assignment import elastic_counts
from spark_imagenet.training.job.checkpoints import steps_inside
from spark_imagenet.training.job.outcome import ResumePoint


@dataclasses.dataclass(frozen=True)
class Relaunch:
    """Launch the barrier stage again.

    Attributes:
        workers: the worker count of the next launch (``1 <= workers <=`` the planned count).
        note: a line for the log (a ``warning:`` when the job goes on smaller, or the planned count cannot be
            met), or "" when there is nothing to say.
        warn: whether ``note`` is a warning (else information).
    """

    workers: int
    note: str = ""
    warn: bool = False


@dataclasses.dataclass(frozen=True)
class GiveUp:
    """Launch no more: the error of the last launch stands.

    Attributes:
        note: what to add to that error's message ("" for a job allowed no restart).
    """

    note: str = ""


@dataclasses.dataclass(frozen=True)
class FailurePolicy:
    """The settings that decide what follows a lost worker.

    Attributes:
        max_restarts: launches allowed after the first (``--max-restarts``, >= 0).
        workers: the planned worker count (``--workers``).
        min_workers: the fewest a relaunch may go on with (``--min-workers``), or None: always ``workers``.
        global_batch: images per step over all workers, kept by every relaunch so the checkpoint resumes.
        regain_timeout: seconds (>= 0) the driver waits for ``workers`` free barrier slots before it asks
            :meth:`relaunch` (``--regain-timeout``).
    """

    max_restarts: int
    workers: int
    min_workers: int | None
    global_batch: int
    regain_timeout: float = 0.0

    @classmethod
    def of(cls, config) -> FailurePolicy:
        """The policy of a :class:`~spark_imagenet.training.job.config.TrainConfig`."""
        return cls(max_restarts=config.run.max_restarts, workers=config.scaling.workers, min_workers=config.scaling.min_workers,
                   global_batch=config.global_batch_size, regain_timeout=config.run.regain_timeout)

    @property
    def elastic(self) -> bool:
        """bool: a relaunch may go on with fewer workers than planned (``min_workers`` below ``workers``)."""
        return self.min_workers is not None and self.min_workers < self.workers

    def smaller_counts(self) -> list[int]:
        """list[int]: the counts below ``workers`` a relaunch may use (each divides the global batch), largest
        first; empty when the policy is not elastic or none divides it
        (:func:`~spark_imagenet.training.job.assignment.elastic_counts`)."""
        return elastic_counts(self.workers, self.min_workers, self.global_batch) if self.elastic else []

    def useless_min_workers(self) -> str | None:
        """The text of a warning (logged after ``warning: ``) when ``min_workers`` is set below ``workers`` but
        no relaunch can use it, else None."""
        if not self.elastic or self.smaller_counts():
            return None
        return (f"--min-workers {self.min_workers} has no effect: no worker count from {self.min_workers} "
                f"to {self.workers - 1} divides the global batch {self.global_batch}, so a relaunch after a lost "
                f"worker waits for {self.workers}")

    def exhausted(self, restarts: int) -> GiveUp | None:
        """Whether a loss after ``restarts`` relaunches ends the job.

        Args:
            restarts: relaunches made before this loss (0 after the first launch).

        Returns:
            GiveUp: ``restarts`` already reached ``max_restarts``; None: a relaunch is allowed (:meth:`relaunch`).
        """
        if restarts < self.max_restarts:
            return None
        if not restarts:
            return GiveUp()
        return GiveUp(f"(the barrier stage was launched {restarts + 1} times, the last allowed by "
                      f"--max-restarts {self.max_restarts})")

    def relaunch(self, launched: int, free_slots: int | None) -> Relaunch:
        """The next launch after a lost worker (once :meth:`exhausted` allowed one).

        Args:
            launched: the worker count of the launch that lost a worker.
            free_slots: the barrier slots free once the driver stopped waiting (up to ``regain_timeout``
                seconds) for ``workers`` of them; None when they cannot be counted (Spark Connect) or were not
                (the policy is not elastic).

        Returns:
            Relaunch: on ``workers`` when they are free, when the policy is not elastic, when the free slots
            are unknown, or when no allowed smaller count fits in them (a warning says the launch waits);
            else on the largest allowed count that fits, with a warning.
        """
        if not self.elastic or free_slots is None:
            return Relaunch(self.workers)
        if free_slots >= self.workers:
            back = launched != self.workers
            return Relaunch(self.workers, f"elastic: {self.workers} barrier slots are free again: back to "
                                          f"{self.workers} workers" if back else "")
        fits = [m for m in self.smaller_counts() if m <= free_slots]
        waited = f"{free_slots} of {self.workers} barrier slots free after {self.regain_timeout:g} s"
        if not fits:
            return Relaunch(self.workers, f"warning: elastic: {waited}, and no worker count from --min-workers "
                                          f"{self.min_workers} to {free_slots} divides the global batch "
                                          f"{self.global_batch}: relaunching on {self.workers} (it waits for the "
                                          "slots)", warn=True)
        m = fits[0]
        return Relaunch(m, f"warning: elastic: {waited}: going on with {m} worker(s), batch "
                           f"{self.global_batch // m} each (the global batch {self.global_batch} kept), from the "
                           f"latest checkpoint; a later relaunch goes back to {self.workers} when the slots are "
                           "free", warn=True)


@dataclasses.dataclass(frozen=True)
class RelaunchFrom:
    """The checkpoint a relaunch resumes from (:func:`relaunch_from`).

    Attributes:
        resume: the checkpoint, or None: training starts again at epoch 1.
        note: a warning (logged after ``warning: ``) when it is not the latest checkpoint, else "".
    """

    resume: ResumePoint | None
    note: str = ""


def relaunch_from(latest: ResumePoint, epoch_start: ResumePoint | None, workers: int) -> RelaunchFrom:
    """The checkpoint a relaunch on ``workers`` resumes from (pure).

    The latest, unless it is inside an epoch and was written by another worker count (a relaunch on fewer workers
    with ``--min-workers``, or back on ``--workers`` after one): only the count that began an epoch trains exactly
    the records it has left (:func:`~spark_imagenet.training.job.checkpoints.check_compatible` refuses the others),
    so the relaunch trains that epoch again from its start: from ``epoch_start``, or from epoch 1 without one.

    Args:
        latest: the latest complete checkpoint.
        epoch_start: the newest complete checkpoint at an epoch's end
            (:func:`~spark_imagenet.training.job.checkpoints.latest_at_epoch_end`), or None when there is none; read
            only when ``latest`` is inside an epoch.
        workers: the worker count of the relaunch.

    Returns:
        RelaunchFrom: ``latest`` without a note; else ``epoch_start`` (or None: epoch 1) with a warning saying
        which steps are trained again, and why.
    """
    inside = steps_inside(latest.name)
    if not inside or latest.meta.workers == workers:
        return RelaunchFrom(latest)
    epoch = latest.epoch + 1
    why = (f"elastic: the latest checkpoint {latest.name} was written {inside} step(s) into epoch {epoch} by "
           f"{latest.meta.workers} worker(s), and only that count trains exactly the records the epoch has left "
           f"(each worker's share and order of an epoch's records follow from the worker count): the relaunch on "
           f"{workers} worker(s)")
    if epoch_start is None:
        return RelaunchFrom(None, f"{why} starts again at epoch 1, as no complete checkpoint at an epoch's end is "
                                  "left")
    first = epoch_start.epoch + 1
    again = (f"the {inside} step(s) of epoch {epoch} done are trained again from its start" if first == epoch else
             f"epochs {first} to {epoch} are trained again from the start of epoch {first}")
    return RelaunchFrom(epoch_start, f"{why} resumes from {epoch_start.name}, the newest checkpoint at an epoch's "
                                     f"end: {again}")
