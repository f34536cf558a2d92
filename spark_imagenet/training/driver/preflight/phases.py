"""The three phases of checks before the barrier stage, each one function returning :class:`~.findings.Findings`.

1. :func:`check_before_spark` (no JVM; the command line runs it before Spark starts): what the settings
   alone tell (:func:`check_settings`): ``--master yarn`` without its configuration, more workers than a
   master on this machine has slots, the results path, GPUs asked of ``local[N]``; and a path on the driver's
   disk that a known cluster master's executors cannot reach (:func:`check_reach`). A plan checks the
   settings first and the reach last, once its dataset's manifest is read (a missing dataset is said as
   such).
2. the plan's checks, in two steps: :func:`check_folders` before the dataset's manifest is read (``--output``
   free of an earlier run, the run's folders apart from the dataset's), then :func:`check_plan` of the planned
   job: the shards listed as the manifest says, the checkpoint to resume from (found once, here, and
   compatible), the tracking, and settings that have no effect (``--min-workers``, ``--checkpoint-every``
   without ``--checkpoint-dir``).
3. :func:`check_job` (a session): its facts read once (:func:`~.session.read_session_facts`) and checked
   (:func:`~.session.check_session`): slots, dynamic allocation, reach from the executors, encryption, GPUs.
   The result is the one value the launch takes, a :class:`CheckedJob`.

``spark-imagenet doctor`` prints the findings of the same functions.
"""

from __future__ import annotations

import dataclasses
import logging

from spark_imagenet.dataset.transfer import check_listed
from spark_imagenet.storage import Storage
from spark_imagenet.training.driver.preflight.findings import Finding, Findings
from spark_imagenet.training.driver.preflight.gpus import check_gpu_conf
from spark_imagenet.training.driver.preflight.rules import (
    check_apart_from_dataset,
    check_dataset_reachable,
    check_output_reachable,
    check_output_unused,
    check_results_path,
    check_slots_of_master_url,
    check_yarn_conf,
)
from spark_imagenet.training.driver.preflight.session import (
    BARRIER_TIMEOUT,
    SessionFacts,
    barrier_timeout_seconds,
    check_session,
    read_session_facts,
)
from spark_imagenet.training.driver.tracking import check_tracking_settings
from spark_imagenet.training.job import checkpoints
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.master import Master
from spark_imagenet.training.job.outcome import ResumePoint
from spark_imagenet.training.job.plan import JobPlan
from spark_imagenet.training.job.restarts import FailurePolicy, relaunch_from

logger = logging.getLogger(__name__)


def check_before_spark(config: TrainConfig, url: str | None) -> Findings:
    """The checks the settings alone allow, before any JVM starts: :func:`check_settings`, then
    :func:`check_reach`; ``config.scaling.master`` is taken as the master the session will run on (the command
    line's).

    Args:
        config: the job's settings.
        url: the dataset's URL, or None when not known yet (the demo makes its own).

    Returns:
        Findings: those of :func:`check_settings` and :func:`check_reach`, in that order.
    """
    return check_settings(config) + check_reach(config, url)


def check_settings(config: TrainConfig) -> Findings:
    """The checks of the settings that need neither Spark nor the dataset.

    Returns:
        Findings: ``yarn`` (``--master yarn`` without its configuration), ``barrier slots`` (a master on this
        machine with fewer slots than workers), ``results path``, and ``gpu settings`` (GPUs asked of
        ``local[N]``, which never gives tasks GPUs; judged with the job's own ``--conf`` settings), and
        ``barrier timeout`` (a ``--conf spark.barrier.sync.timeout`` that is not a Spark time); each problem a
        :class:`~spark_imagenet.errors.ConfigError`. A check with nothing to look at gives none.
    """
    master = config.scaling.master
    conf = dict(config.spark_conf)
    return Findings([
        Finding.of("barrier timeout", lambda: barrier_timeout_seconds(conf)) if BARRIER_TIMEOUT in conf else None,
        check_yarn_conf(master),
        check_slots_of_master_url(master, config.scaling.workers, config.spark_conf),
        check_results_path(config.run.results),
        check_gpu_conf(conf.get, config.scaling.gpus_per_worker, config.scaling.workers, master.strip())
        if config.scaling.gpus_per_worker and Master.parse(master, check=False).runs_in_driver_jvm else None,
    ])


def check_reach(config: TrainConfig, url: str | None) -> Findings:
    """Whether the tasks of the master ``config.scaling.master`` names can reach the dataset, ``--output`` and
    ``--checkpoint-dir`` where they are paths on the driver's disk (the session's own master is checked again
    with its facts, :func:`~.session.check_session`).

    Returns:
        Findings: ``dataset reachable``, ``--output reachable`` and ``--checkpoint-dir reachable`` for a
        cluster master that is not a Spark Connect server; none without a master or with a Connect URL (where
        the tasks run is known once the session is).
    """
    master = config.scaling.master
    if Master.parse(master, check=False).kind in ("unset", "connect"):
        return Findings()
    shared = config.data.shared_filesystem
    return Findings([
        check_dataset_reachable(url, master, shared) if url is not None else None,
        check_output_reachable(config.run.output, master, shared),
        check_output_reachable(config.run.checkpoint_dir, master, shared, "--checkpoint-dir"),
    ])


def check_folders(config: TrainConfig, dataset: Storage, output: Storage | None,
                  checkpoints_at: Storage | None) -> Findings:
    """The plan's checks of the run's folders, made before the dataset's manifest is read.

    Args:
        config: the job's settings (``output``, ``overwrite``).
        dataset: the opened dataset folder.
        output: the opened ``--output`` folder, or None.
        checkpoints_at: the opened ``--checkpoint-dir`` folder, or None.

    Returns:
        Findings: ``--output unused`` (a problem for an earlier run's outputs without ``--overwrite``),
        ``--output apart from the dataset`` and ``--checkpoint-dir apart from the dataset``.

    Raises:
        StorageError: the output folder cannot be listed.
    """
    return Findings([
        check_output_unused(output, config.run.output, config.run.overwrite) if output is not None else None,
        check_apart_from_dataset(dataset, output, "--output"),
        check_apart_from_dataset(dataset, checkpoints_at, "--checkpoint-dir"),
    ])


def check_tracking(job: JobPlan) -> Findings:
    """The plan's check of its MLflow tracking, before Spark starts
    (:func:`~spark_imagenet.training.driver.tracking.check_tracking_settings`).

    Returns:
        Findings: none for an untracked job; else one ``tracking`` finding: a problem (a
        :class:`~spark_imagenet.errors.ConfigError` naming the setting), a warning when the run will hold no
        model (no ``--output``), or ok.
    """
    if not job.config.tracking.enabled:
        return Findings()
    found = Finding.of("tracking", lambda: check_tracking_settings(job),
                       ok="mlflow installed; the run gets the settings, metrics and model")
    if found.level == "ok" and job.output is None:
        found = Finding.warning("tracking", "--mlflow without --output: the run gets the settings and metrics, but "
                                            "no model")
    return Findings([found])


def check_plan(job: JobPlan) -> tuple[JobPlan, Findings]:
    """The checks of a planned job (no Spark); the checkpoint to resume from is found here, once.

    Args:
        job: the job, its dataset, output and checkpoint folders opened, its manifest read.

    Returns:
        ``(job, findings)``: the job with :attr:`~spark_imagenet.training.job.plan.JobPlan.resume` set (the
        latest complete checkpoint, which the tracker and the first launch use), and ``dataset shards``
        (a :class:`~spark_imagenet.errors.ManifestError` for a shard missing or changed in the store),
        ``resume`` (a checkpoint this job cannot resume from), ``tracking``, the reach of the job's dataset and
        folders from the master it names (:func:`check_reach`), ``image form`` (a warning: images stored smaller
        than ``--image-size``), ``min workers`` and ``checkpoint every`` (warnings for settings without effect).

    Raises:
        StorageError: a folder cannot be listed or a checkpoint's record read.
    """
    config = job.config
    resume, resumable = find_resume(job, announce=True)
    found = Findings([
        # a shard deleted or replaced since: caught here, not hidden by a host's cache
        Finding.of("dataset shards", lambda: check_listed(job.dataset, job.manifest),
                   f"the {len(job.manifest.splits)} split(s) the manifest lists are in the store"),
        resumable,
        *check_tracking(job),
        *check_reach(config, job.url),
        _useless_min_workers(config),
        _stored_smaller(config, job.manifest),
        Finding.warning("checkpoint every", "--checkpoint-every has no effect without --checkpoint-dir: no "
                                            "checkpoint is kept")
        if config.run.checkpoint_every and config.run.checkpoint_dir is None else None,
    ])
    return dataclasses.replace(job, resume=resume), found


def _stored_smaller(config: TrainConfig, manifest) -> Finding | None:
    """A warning when the dataset stores its images smaller than ``--image-size`` (``shard --resize N`` or
    ``--max-side N`` with N below it): every crop would be scaled up."""
    form = manifest.image_form
    if form.kind == "original" or form.size >= config.recipe.image_size:
        return None
    return Finding.warning("image form", f"the dataset stores its images as '{form.label}' (at most {form.size} px "
                                         f"a side), smaller than --image-size {config.recipe.image_size}: every crop is "
                                         f"scaled up; shard the sources again with --{form.kind} "
                                         f"{config.recipe.image_size} or more, or train at --image-size {form.size} or less")


def _useless_min_workers(config: TrainConfig) -> Finding | None:
    """A warning for a ``--min-workers`` no relaunch can use (:meth:`FailurePolicy.useless_min_workers`)."""
    useless = FailurePolicy.of(config).useless_min_workers()
    return Finding.warning("min workers", useless) if useless else None


def find_resume(job: JobPlan, *, announce: bool = False,
                relaunch: bool = False) -> tuple[ResumePoint | None, Finding | None]:
    """The latest complete checkpoint in ``job.config.run.checkpoint_dir``, and whether this job may resume from it.

    The plan finds it once (:func:`check_plan`); a relaunch after a lost worker finds it again, since a newer
    checkpoint may exist by then. A checkpoint inside an epoch resumes on the worker count that wrote it only: a
    job on another count is refused, its message naming the newest checkpoint at an epoch's end to train the epoch
    again from; a relaunch on another count resumes from that one instead
    (:func:`~spark_imagenet.training.job.restarts.relaunch_from`).

    Args:
        job: the job.
        announce: log (INFO) each folder skipped as half-written.
        relaunch: the job is a relaunch after a lost worker (its worker count chosen by the failure policy, not
            by the user).

    Returns:
        ``(resume, finding)``: the checkpoint's :class:`ResumePoint` (None: no ``checkpoint_dir``, no complete
        checkpoint in it yet, one this job cannot resume from, or a relaunch that starts again at epoch 1) and the
        ``resume`` finding (None without ``checkpoint_dir``): a problem when the checkpoint is of another dataset,
        model, cluster shape or recipe, or of more epochs than ``epochs``
        (:func:`~spark_imagenet.training.job.checkpoints.check_compatible`); a warning when a relaunch does not
        resume from the latest checkpoint.

    Raises:
        StorageError: the folder cannot be listed or a ``checkpoint.json`` read.
    """
    config = job.config
    if job.checkpoints is None:
        return None, None
    latest = checkpoints.latest(job.checkpoints, announce=announce)
    if latest is None:
        return None, Finding.ok("resume", f"no complete checkpoint in {config.run.checkpoint_dir} yet: epoch 1")
    point = ResumePoint(*latest)
    elsewhere = checkpoints.steps_inside(point.name) and point.meta.workers != config.scaling.workers
    at_end = checkpoints.latest_at_epoch_end(job.checkpoints) if elsewhere else None
    start = ResumePoint(*at_end) if at_end is not None else None  # the start of the epoch the latest is inside
    note = ""
    if relaunch:
        chosen = relaunch_from(point, start, config.scaling.workers)
        point, note = chosen.resume, chosen.note
        if point is None:
            return None, Finding.warning("resume", note)
    compatible = Finding.of("resume", lambda: checkpoints.check_compatible(
        point.meta, checkpoints.expected_for(config, job.manifest), f"--checkpoint-dir {config.run.checkpoint_dir}, "
        f"{point.name}", inside=checkpoints.steps_inside(point.name), epoch_start=start.name if start else None),
        f"{point.name} in {config.run.checkpoint_dir}")
    if compatible.level == "problem":
        return None, compatible
    return point, Finding.warning("resume", note) if note else compatible


@dataclasses.dataclass(frozen=True)
class CheckedJob:
    """A planned job whose session passed its checks: what the launch takes (:func:`check_job`).

    Attributes:
        job: the planned job (its :attr:`~spark_imagenet.training.job.plan.JobPlan.resume` found once).
        facts: the session's facts, read once.
        findings: the session's findings (no problem among them).
    """

    job: JobPlan
    facts: SessionFacts
    findings: Findings = Findings()

    @property
    def resume(self) -> ResumePoint | None:
        """ResumePoint | None: the checkpoint the first launch resumes from."""
        return self.job.resume

    @property
    def master_to_report(self) -> str | None:
        """str | None: the master the results name (``sc.master``, or a Connect server's ``sc://HOST:PORT``)."""
        return self.facts.reported_master


def check_job(spark, job: JobPlan) -> CheckedJob:
    """Read the session's facts once, check the job against them, log the warnings.

    Args:
        spark: a SparkSession, classic or Spark Connect.
        job: from :func:`~spark_imagenet.training.driver.launch.plan_job`.

    Returns:
        CheckedJob: the job, the facts and the findings.

    Raises:
        ConfigError: the first problem (:func:`~.session.check_session`), or a session whose facts cannot be
            read (:func:`~.session.read_session_facts`).
    """
    config = job.config
    facts = read_session_facts(spark, config.scaling.workers, master=config.scaling.master)
    findings = check_session(facts, config, job.url)
    findings.log_warnings(logger)
    findings.raise_if_problems()
    return CheckedJob(job, facts, findings)
