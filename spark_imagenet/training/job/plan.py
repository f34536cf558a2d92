"""What goes into a training job: one value per process hop, each adding only its own part (no TensorFlow, no Spark).

* :class:`JobPlan`: the job resolved once on the driver (:func:`spark_imagenet.training.driver.launch.plan_job`):
  the settings, the dataset, its manifest and the assignment of shards to ranks, the learning-rate schedule
  (built here, once) and the storage handles of the dataset, the output and the checkpoints
  (:class:`~spark_imagenet.storage.Storage` objects opened once on the driver; a handle pickles without its
  client, and the copy makes its own on first use). Frozen and picklable: the driver hands it to every barrier
  task inside the task's spec.
* the barrier task adds its rank and the resume point (:class:`~spark_imagenet.training.task.barrier_task.TaskSpec`
  carries the plan and the resume point; the rank is the task's partition);
* :class:`WorkerSpec`: what one TensorFlow worker process reads (its ``worker.json``): the job's part the worker
  needs (settings, schedule, dataset id and classes, checkpoint storage), the task's part (rank, peers, threads,
  the local checkpoint to restore) and the worker's own files and step counts.

Example::

    >>> from spark_imagenet import shard
    >>> from spark_imagenet.training.job.config import TrainConfig
>>> from spark_imagenet.training.driver.launch import plan_job
    >>> manifest = shard("/data/kaggle", "gs://my-bucket/imagenet", train_shards=2, processes=1, progress=False)
    >>> job = plan_job("gs://my-bucket/imagenet", TrainConfig(workers=2))   # on the driver
    >>> job.schedule.describe()                                          # the one schedule of the job
    'lr: cosine schedule, peak 0.01 (no scaling), no warm-up, cosine decay to 0 at step 1 (end of 1 epoch)'
    >>> train, val = ([s.name for s in manifest.splits[name].shards] for name in ("train", "val"))
    >>> spec = worker_spec(job, rank=1, train_files=train[1:], val_files=val, threads=4)   # in the task
    >>> spec.rank
    1
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.errors import ConfigError
from spark_imagenet.storage import Storage, open_storage
from spark_imagenet.training.job.assignment import Assignment, assign
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.storage.envelope import Envelope
from spark_imagenet.training.job.outcome import SAME_VERSION, ResumePoint
from spark_imagenet.training.job.outputs import labels as output_labels
from spark_imagenet.training.job.schedules import Schedule, schedule_for
from spark_imagenet.training.job.settings import FACTS, Rule, check_value
from spark_imagenet.training.job.tracking import TrackingSpec

#: The worker spec's JSON form (``worker.json``).
WORKER = Envelope("spark-imagenet-worker-spec", 2, "spark-imagenet worker spec", remedy=SAME_VERSION)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """A training job resolved on the driver, before Spark is involved; every task receives it (pickled).

    Attributes:
        config: the job's settings (``cache``, a local ``output`` and ``checkpoint_dir`` made absolute).
        dataset: the dataset's storage (opened on the driver, pickled to every task).
        manifest: the dataset's manifest.
        assignment: shards and validation records of every rank.
        schedule: the learning-rate schedule of every optimizer step (built once, here).
        output: the ``--output`` storage, or None.
        checkpoints: the ``--checkpoint-dir`` storage, or None.
        run_id: this run's id (32 hex digits), the holder of the folders' leases
            (:mod:`spark_imagenet.storage.lease`); "" = no lease is checked.
        tracking: the job's MLflow run (set on the driver once the run exists), or None when untracked.
        resume: the checkpoint the first launch resumes from, found once when the job was planned
            (:func:`spark_imagenet.training.driver.preflight.check_plan`), or None; a relaunch looks again.
    """

    config: TrainConfig
    dataset: Storage
    manifest: Manifest
    assignment: Assignment
    schedule: Schedule
    output: Storage | None = None
    checkpoints: Storage | None = None
    run_id: str = ""
    tracking: TrackingSpec | None = None
    resume: ResumePoint | None = None

    @property
    def url(self) -> str:
        """str: the dataset's URL."""
        return self.dataset.url

    @property
    def dataset_id(self) -> str:
        """str: the manifest's dataset id (names the cache sub-folder, recorded in checkpoints)."""
        return self.manifest.dataset_id

    @property
    def num_classes(self) -> int:
        """int: the model's output width."""
        return self.manifest.num_classes

    def resized(self, workers: int) -> JobPlan:
        """This job on ``workers`` workers with the same global batch (``batch_size = global batch / workers``):
        the shards re-assigned from the manifest it holds and the schedule rebuilt; the storage handles, the run
        id and the tracking kept. What a relaunch after a lost worker runs
        (:class:`~spark_imagenet.training.job.restarts.Relaunch`).

        Args:
            workers: the new worker count; divides the global batch.

        Raises:
            ConfigError: ``workers`` does not divide the global batch, or the dataset cannot be split over it
                (:func:`~spark_imagenet.training.job.assignment.assign`).
        """
        if workers == self.config.scaling.workers:
            return self
        batch = self.config.global_batch_size
        if batch % workers:
            raise ConfigError(f"{workers} worker(s) cannot share the global batch {batch} evenly")
        config = self.config.replace(workers=workers, batch_size=batch // workers)
        assignment = assign(self.manifest, workers, config.recipe.batch_size)
        return dataclasses.replace(self, config=config, assignment=assignment,
                                   schedule=schedule_for(config, assignment.steps_per_epoch))


#: The rule of each plain value of a worker spec (:class:`WorkerSpec`), by field: the dataset's facts by the rules
#: every record shares (:data:`~spark_imagenet.training.job.settings.FACTS`), the spec's own values by these.
_RULES = {
    **FACTS,
    "rank": Rule("int", minimum=0),
    "train_examples": Rule("int", minimum=0),
    "val_examples": Rule("int", minimum=0),
    "val_examples_total": Rule("int", minimum=0),
    "steps_per_epoch": Rule("int", minimum=1),
    "val_steps": Rule("int", minimum=0),
    "threads": Rule("int", minimum=0, optional=True),
    "train_files": Rule("strings"),
    "val_files": Rule("strings"),
    "peers": Rule("strings"),
}


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What one TensorFlow worker process trains on: the job's part, its task's part and its own.

    Attributes:
        config: the job's settings.
        schedule: the job's learning-rate schedule (:attr:`JobPlan.schedule`).
        dataset_id: the manifest's dataset id (recorded in checkpoints).
        num_classes: the dataset's class count (the logits' width).
        checkpoints: the ``--checkpoint-dir`` storage, or None. In the JSON form (``worker.json``, a file
            read by another process) it is ``{"url", "options"}``: its URL and
            :meth:`~spark_imagenet.storage.Storage.reopen_options`, reopened with
            :func:`~spark_imagenet.storage.open_storage`.
        rank: this worker's rank, ``0 <= rank < config.scaling.workers`` (0 is the chief).
        peers: every worker's ``host:port`` in rank order (TF_CONFIG's), named by the step watchdog; empty for
            one worker.
        threads: TensorFlow intra/inter-op threads; None = TensorFlow's default.
        restore: a local folder holding the checkpoint to resume from (its ``checkpoint.json`` and TensorFlow
            files), or None to start at epoch 1.
        run_id: the run's id; the chief commits a checkpoint only while the run holds ``checkpoints``' lease
            (:func:`spark_imagenet.storage.lease.check_held`); "" = no check.
        labels: the class list, ``labels.json``'s entries (``{"id", "wnid", "names"}``) in output order: the
            chief's with ``--output`` (its serving SavedModel names the classes), else empty.
        tracking: the job's MLflow run: the chief's, when the job is tracked; else None.
        train_files: local paths of this worker's train shards (non-empty).
        train_examples: examples in those shards.
        val_files: local paths of the val shards this worker reads.
        val_record_shard: ``(n, i)``: keep every n-th val record from offset i (a val shard shared by several
            workers), or None for all records.
        val_examples: val examples this worker evaluates.
        val_examples_total: val examples of all workers together.
        steps_per_epoch: train steps per epoch (the same on every worker).
        val_steps: evaluation steps (the same on every worker; enough for the largest worker's
            ``val_examples``).

    Raises:
        ConfigError: a wrong type or impossible value, naming the key.
    """

    config: TrainConfig
    schedule: Schedule
    dataset_id: str
    num_classes: int
    rank: int
    train_files: tuple[str, ...]
    train_examples: int
    val_files: tuple[str, ...]
    val_examples: int
    val_examples_total: int
    steps_per_epoch: int
    val_steps: int
    val_record_shard: tuple[int, int] | None = None
    checkpoints: Storage | None = None
    peers: tuple[str, ...] = ()
    threads: int | None = None
    restore: str | None = None
    run_id: str = ""
    labels: tuple[dict[str, Any], ...] = ()
    tracking: TrackingSpec | None = None

    def __post_init__(self) -> None:
        where = f"worker spec of rank {self.rank}"
        if not isinstance(self.config, TrainConfig) or not isinstance(self.schedule, Schedule):
            raise ConfigError(f"{where}: 'config' must be a TrainConfig and 'schedule' a Schedule")
        for name, rule in _RULES.items():
            object.__setattr__(self, name, check_value(name, rule, getattr(self, name), f"{where}: key {name!r}"))
        if self.checkpoints is not None and not isinstance(self.checkpoints, Storage):
            raise ConfigError(f"{where}: 'checkpoints' must be a Storage or None, got {self.checkpoints!r:.100}",
                              key="checkpoints", value=self.checkpoints)
        if self.val_record_shard is not None:
            pair = tuple(self.val_record_shard) if isinstance(self.val_record_shard, (list, tuple)) else ()
            if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in pair) \
                    or not 0 <= pair[1] < pair[0]:
                raise ConfigError(f"{where}: key 'val_record_shard' must be [n, i] with 0 <= i < n, got {pair!r}",
                                  key="val_record_shard", value=self.val_record_shard)
            object.__setattr__(self, "val_record_shard", pair)
        if self.rank >= self.workers:
            raise ConfigError(f"{where}: rank {self.rank} is not in 0..workers-1 (workers = {self.workers})",
                              key="rank", value=self.rank)
        if not self.train_files:
            raise ConfigError(f"{where}: no train_files; every worker needs its own shards", key="train_files",
                              value=self.train_files)
        if self.val_steps * self.config.recipe.batch_size < self.val_examples:
            raise ConfigError(
                f"{where}: val_steps {self.val_steps} * batch_size {self.config.recipe.batch_size} is less than this "
                f"worker's val_examples {self.val_examples}; val_steps must be ceil(max val_examples / batch_size)",
                key="val_steps", value=self.val_steps)
        if self.val_examples > 0 and not self.val_files:
            raise ConfigError(f"{where}: val_examples is {self.val_examples} but val_files is empty",
                              key="val_files", value=self.val_files)
        if isinstance(self.labels, list):
            object.__setattr__(self, "labels", tuple(self.labels))
        if not isinstance(self.labels, tuple) or (self.labels and len(self.labels) != self.num_classes) or not all(
                isinstance(c, dict) and isinstance(c.get("wnid"), str) and isinstance(c.get("names"), list)
                for c in self.labels):
            raise ConfigError(f"{where}: key 'labels' must be empty or {self.num_classes} objects with \"wnid\" and "
                              f"\"names\", got {self.labels!r:.200}", key="labels", value=self.labels)

    @property
    def workers(self) -> int:
        """int: the cluster's worker count (``config.scaling.workers``)."""
        return self.config.scaling.workers

    @property
    def parallel(self) -> int:
        """int: tf.data parallel calls: ``config.data.parallel``, else :attr:`threads`, else 1."""
        return self.config.data.parallel or self.threads or 1

    @property
    def startup_timeout_s(self) -> float:
        """float: seconds to wait for the other workers while the strategy is built (0 = no limit)."""
        return self.config.run.startup_timeout

    @property
    def seed(self) -> int:
        """int: this worker's seed: the job's seed plus the rank (distinct augmentation per worker)."""
        return self.config.data.seed + self.rank

    def to_json(self) -> dict[str, Any]:
        """A JSON object: format name and version, then the fields (the config, schedule and checkpoint storage
        as objects)."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            data[f.name] = (value.to_json() if hasattr(value, "to_json") else list(value)
                            if isinstance(value, tuple) else value)
        if self.checkpoints is not None:
            data["checkpoints"] = {"url": self.checkpoints.url, "options": self.checkpoints.reopen_options()}
        return WORKER.to_json(data)

    @classmethod
    def from_json(cls, data: Any, where: str = "worker spec") -> "WorkerSpec":
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: not an object of this format and version, a missing or unknown key, or an invalid
                value (naming the key).
        """
        fields = WORKER.fields_for(cls, data, where)
        fields["config"] = TrainConfig.from_json(fields["config"], f"{where}, key 'config'")
        fields["schedule"] = Schedule.from_json(fields["schedule"], f"{where}, key 'schedule'")
        if fields.get("tracking") is not None:
            fields["tracking"] = TrackingSpec.from_json(fields["tracking"], f"{where}, key 'tracking'")
        if fields.get("checkpoints") is not None:
            fields["checkpoints"] = _reopen(fields["checkpoints"], f"{where}, key 'checkpoints'")
        return cls(**fields)


def _reopen(data: Any, where: str) -> Storage:
    """The storage of a worker spec's ``{"url", "options"}`` (:meth:`WorkerSpec.to_json`), reopened.

    Raises:
        ConfigError: not that shape (names ``where``), or :func:`~spark_imagenet.storage.open_storage`'s
            errors (an unknown scheme).
    """
    if (not isinstance(data, dict) or set(data) != {"url", "options"} or not isinstance(data["url"], str)
            or not isinstance(data["options"], dict)):
        raise ConfigError(f"{where}: expected {{\"url\": str, \"options\": object}}, got {data!r:.200}")
    return open_storage(data["url"], **data["options"])


def worker_spec(job: JobPlan, rank: int, train_files: Sequence[str], val_files: Sequence[str],
                threads: int | None = None, peers: Sequence[str] = ()) -> WorkerSpec:
    """The spec of rank ``rank``'s TensorFlow worker: the job's part, the task's part, this worker's files and
    step counts (``restore`` is set once the checkpoint to resume from has been fetched).

    Args:
        job: the job.
        rank: the worker's rank.
        train_files, val_files: its staged shard files.
        threads: CPUs for this worker (the host's CPUs / workers on the host); also the tf.data parallelism
            unless ``config.data.parallel`` is set.
        peers: every worker's ``host:port`` in rank order (empty without a cluster).
    """
    plan, assignment = job.assignment[rank], job.assignment
    return WorkerSpec(
        config=job.config, schedule=job.schedule, dataset_id=job.dataset_id, num_classes=job.num_classes,
        checkpoints=job.checkpoints, rank=rank, peers=tuple(peers), threads=threads, run_id=job.run_id,
        train_files=tuple(train_files), train_examples=plan.train_examples, val_files=tuple(val_files),
        val_record_shard=plan.val_record_shard, val_examples=plan.val_examples,
        val_examples_total=assignment.val_examples_total, steps_per_epoch=assignment.steps_per_epoch,
        val_steps=assignment.val_steps,
        labels=tuple(output_labels(job.manifest.classes)) if rank == 0 and job.output is not None else (),
        tracking=job.tracking if rank == 0 else None)


__all__ = ["JobPlan", "WORKER", "WorkerSpec", "worker_spec"]
