"""The results of a training job: :class:`Result` (what ``train()`` returns), its per-worker rows, the table and
the JSON file."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from spark_imagenet.errors import ConfigError, TrainingError
from spark_imagenet.storage.envelope import Envelope
from spark_imagenet.training.job.outcome import TaskResult, TfProcess, ValMetrics
from spark_imagenet.training.job.sections import SECTION_OF

#: The JSON form of a :class:`Result` (``--results``, ``results.json`` under ``--output``).
RESULTS = Envelope("spark-imagenet-results", 1, "spark-imagenet training results")
logger = logging.getLogger(__name__)
#: Tolerance for "all workers report the same all-reduced val metrics".
VAL_REL_TOL = 1e-3
VAL_ABS_TOL = 1e-4


@dataclasses.dataclass(frozen=True)
class WorkerRecord:
    """One worker's row of the results: where it ran and how fast (its own numbers; the loss and accuracy are the
    job's, in :attr:`Result.train`).

    Attributes:
        rank, host, python: the rank, its host and its task's interpreter.
        strategy, all_reduce, devices: what it trained with.
        train_images, steps: images and steps it trained in the last launch.
        images_per_sec: its images per second over the timed epochs.
        train_seconds: its whole ``fit``, in seconds.
        tf_process: which TensorFlow process ran (its pid and its task's).
    """

    rank: int
    host: str
    python: str
    strategy: str
    all_reduce: str
    devices: tuple[str, ...]
    train_images: int
    steps: int
    images_per_sec: float
    train_seconds: float
    tf_process: TfProcess | None = None

    @classmethod
    def of(cls, task: TaskResult) -> "WorkerRecord":
        """The row of a task that trained (``task.worker`` set)."""
        w = task.worker
        assert w is not None
        return cls(rank=task.rank, host=task.host, python=task.python, strategy=w.strategy,
                   all_reduce=w.all_reduce, devices=tuple(w.devices), train_images=w.train_images, steps=w.steps,
                   images_per_sec=w.images_per_sec, train_seconds=w.train_seconds, tf_process=task.tf_process)

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the fields."""
        data = dataclasses.asdict(self)
        data["devices"] = list(self.devices)
        return data


def combine(records: Sequence[TaskResult], workers: int) -> tuple[list[WorkerRecord], ValMetrics]:
    """Per-worker rows (sorted by rank) and the val metrics of rank 0; ranks that disagree on them are logged
    (WARNING).

    Args:
        records: every rank's task result.
        workers: N.

    Returns:
        ``(per_worker, val)``.

    Raises:
        TrainingError: missing or duplicate ranks, or a rank that did not train (its reason).
    """
    records = sorted(records, key=lambda r: r.rank)
    ranks = [r.rank for r in records]
    if ranks != list(range(workers)):
        raise TrainingError(f"expected results from ranks 0..{workers - 1}, got ranks {ranks}")
    idle = [r for r in records if r.worker is None]
    if idle:
        raise TrainingError("; ".join(f"rank {r.rank} on {r.host} did not train: {r.peer_failed}" for r in idle))
    val = records[0].worker.val
    for r in records[1:]:
        other = r.worker.val
        for k, v in val.to_json().items():
            w = getattr(other, k)
            if not (isinstance(v, (int, float)) and isinstance(w, (int, float))
                    and (math.isclose(v, w, rel_tol=VAL_REL_TOL, abs_tol=VAL_ABS_TOL)
                         or (math.isnan(v) and math.isnan(w)))):
                logger.warning(f"warning: rank {r.rank} reports val {k}={w!r} but rank 0 reports {v!r}; "
                               "the all-reduced metrics should agree (using rank 0's)")
    return [WorkerRecord.of(r) for r in records], val


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def format_table(results: "Result") -> str:
    """A readable summary: one row per worker (the train images it went through over all epochs, its steps
    and speed), then the job's train and validation metrics."""
    rows = [f"{'rank':>4}  {'host':<22} {'imgs seen':>10} {'steps':>6} {'images/s':>9} {'seconds':>8}"]
    for w in results.per_worker:
        rows.append(f"{w.rank:>4}  {str(w.host)[:22]:<22} {_fmt(w.train_images, 'd'):>10} "
                    f"{_fmt(w.steps, 'd'):>6} {_fmt(w.images_per_sec, '.1f'):>9} {_fmt(w.train_seconds, '.1f'):>8}")
    train, val = results.train, results.val
    rows.append(f"train (all workers, last epoch): loss {_fmt(train.loss, '.4f')}, top1 {_fmt(train.top1, '.4f')}")
    rows.append(f"val: {_fmt(val.images, 'd')} images, top1 {_fmt(val.top1, '.4f')}, "
                f"top5 {_fmt(val.top5, '.4f')}, loss {_fmt(val.loss, '.4f')}; "
                f"total {_fmt(results.images_per_sec, '.1f')} train images/s; "
                f"wall {results.wall_seconds:.1f} s")
    return "\n".join(rows)


def write_results(path: str | os.PathLike, result: "Result") -> None:
    """Write ``result`` (:meth:`Result.to_json`) to the local file ``path`` (``--results``), atomically.

    Raises:
        ConfigError: the file cannot be written (names ``--results``).
    """
    from spark_imagenet.errors import StorageError
    from spark_imagenet.storage import write_json_atomic

    try:
        write_json_atomic(path, result.to_json())
    except StorageError as e:
        raise ConfigError(f"cannot write --results {Path(path).expanduser().absolute()}: {e}") from e


@dataclasses.dataclass(frozen=True)
class TrainMetrics:
    """The job's training metrics of the last epoch (all-reduced over every worker).

    Attributes:
        loss: mean cross-entropy without weight decay; None when no epoch trained (all restored).
        top1: top-1 accuracy; None likewise.
    """

    loss: float | None = None
    top1: float | None = None


@dataclasses.dataclass(frozen=True)
class Result:
    """What :func:`~spark_imagenet.training.driver.launch.train` returns.

    Its fields are read as attributes (``result.val.top1``). :meth:`to_json` gives the form of ``--results`` and
    of ``results.json`` under ``--output`` (a versioned document, :data:`RESULTS`:
    ``{"format": "spark-imagenet-results", "format_version": 1, "workers": ..., "val": {...}, ...}``).

    Attributes:
        workers: N.
        per_worker: one :class:`WorkerRecord` per rank, by rank.
        val: the validation metrics (all workers' images).
        train: the job's training metrics of the last epoch.
        images_per_sec: the sum of the workers' images per second.
        history: rank 0's Keras history, every epoch including those restored from a checkpoint.
        config: the settings that ran, with the dataset's numbers and the master, as JSON values (a list for a
            tuple setting such as ``crop_area``).
        wall_seconds: the barrier stage's wall time (every launch: staging, TensorFlow start-up, training,
            evaluation), in seconds.
        restarts: launches after a lost worker.
        checkpoint: the last checkpoint written (``CHECKPOINT_DIR/epoch-NNNNNN``), or None without
            ``checkpoint_dir``.
        output: the ``--output`` folder, or None.
    """

    workers: int
    per_worker: tuple[WorkerRecord, ...]
    val: ValMetrics
    train: TrainMetrics
    images_per_sec: float
    history: Mapping[str, Sequence[float]]
    config: Mapping[str, Any]
    wall_seconds: float
    restarts: int = 0
    checkpoint: str | None = None
    output: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON object (:data:`RESULTS`' format and version, then every attribute, the records and metrics as
        objects)."""
        return RESULTS.to_json({"workers": self.workers, "per_worker": [w.to_json() for w in self.per_worker],
                "val": self.val.to_json(), "train": dataclasses.asdict(self.train),
                "images_per_sec": self.images_per_sec, "history": {k: list(v) for k, v in self.history.items()},
                "config": {k: list(v) if isinstance(v, tuple) else v for k, v in self.config.items()},
                "wall_seconds": self.wall_seconds, "restarts": self.restarts,
                "checkpoint": self.checkpoint, "output": self.output})

    @classmethod
    def from_json(cls, data: Any, where: str = "results") -> "Result":
        """The :class:`Result` of its :meth:`to_json` document.

        Args:
            data: the decoded JSON (``results.json``, ``--results``).
            where: the file, named in messages.

        Raises:
            ConfigError: not a results document of a version this package reads, or one missing or holding an
                unknown key (each named with ``where``).
        """
        body = RESULTS.fields_for(cls, data, where)
        try:
            return cls(**{**body, "per_worker": tuple(_worker_record(w) for w in body["per_worker"]),
                          "val": ValMetrics(**body["val"]), "train": TrainMetrics(**body["train"]),
                          "history": {k: tuple(v) for k, v in body["history"].items()}})
        except (TypeError, AttributeError, KeyError) as e:
            raise ConfigError(f"{where}: not a {RESULTS.title} this version of spark-imagenet reads ({e})") from None

    @classmethod
    def from_path(cls, output_url: str | os.PathLike) -> "Result":
        """The :class:`Result` of a finished training run, read from ``results.json`` in its ``--output``.

        Args:
            output_url: the run's ``--output``: a local folder or a bucket URL of any store
                (:func:`~spark_imagenet.storage.open_storage`).

        Returns:
            Result: equal to what :func:`~spark_imagenet.training.driver.launch.train` returned.

        Raises:
            ConfigError: no ``results.json`` there (not the ``--output`` of a finished run), or one this
                package cannot read; each names the URL.
            StorageError: the folder or bucket cannot be read.

        Example (the ``--output`` of a run of 2 workers on a dataset of 12 validation images):

        >>> from spark_imagenet import Result
        >>> result = Result.from_path("gs://my-bucket/runs/alexnet-8")
        >>> result.workers, result.val.images, 0.0 <= result.val.top1 <= 1.0
        (2, 12, True)
        """
        from spark_imagenet.storage import open_storage
        from spark_imagenet.training.job.outputs import RESULTS_FILE

        url = os.fspath(output_url)
        storage = open_storage(url)
        where = f"{url.rstrip('/')}/{RESULTS_FILE}"
        if not storage.exists(RESULTS_FILE):
            raise ConfigError(f"{url} holds no {RESULTS_FILE}: it is not the --output of a finished training run "
                              "(train writes results.json there when the job ends); give that folder or bucket")
        return cls.from_json(RESULTS.decode(storage.read_bytes(RESULTS_FILE), where), where)


def _worker_record(data: Mapping[str, Any]) -> WorkerRecord:
    """A :class:`WorkerRecord` of its :meth:`WorkerRecord.to_json` object."""
    process = data.get("tf_process")
    return WorkerRecord(**{**data, "devices": tuple(data["devices"]),
                           "tf_process": None if process is None else TfProcess(**process)})


def build_results(records: Sequence[TaskResult], job, *, master: str, wall_seconds: float,
                  restarts: int = 0) -> Result:
    """The :class:`Result` of a finished job.

    Args:
        records: every rank's task result.
        job: the job that ran (its config, assignment and manifest).
        master: the Spark master URL it ran on.
        wall_seconds: the barrier stage's wall time (every launch of it).
        restarts: how many times the stage was launched again after a lost worker.

    Raises:
        TrainingError: missing or duplicate ranks, or a rank that did not train.
    """
    config, plan, manifest = job.config, job.assignment, job.manifest
    per_worker, val = combine(records, config.scaling.workers)
    rank0 = min(records, key=lambda r: r.rank).worker
    settings = {key: getattr(getattr(config, SECTION_OF[key]), key) for key in
                ("model", "epochs", "batch_size", "image_size", "width", "learning_rate", "lr_schedule",
                 "lr_boundaries", "warmup_epochs", "lr_scaling", "optimizer", "momentum", "weight_decay",
                 "label_smoothing", "flip", "crop_area", "lighting", "precision", "jit_compile", "parallel", "seed",
                 "checkpoint_dir", "deterministic")}
    checkpoint = _last_checkpoint(job) if config.run.checkpoint_dir else None
    return Result(
        workers=config.scaling.workers, per_worker=tuple(per_worker), val=val,
        train=TrainMetrics(rank0.train_loss, rank0.train_top1),
        images_per_sec=sum(w.images_per_sec or 0.0 for w in per_worker),
        history={k: tuple(v) for k, v in rank0.history.items()},
        config=_json_values({
            "url": job.url, "dataset_id": manifest.dataset_id, "master": master,
            **settings, "cache": config.data.cache, "num_classes": manifest.num_classes,
            "train_examples": plan.train_examples_total, "val_examples": plan.val_examples_total,
            "steps_per_epoch": plan.steps_per_epoch, "val_steps": plan.val_steps,
            "global_batch_size": config.global_batch_size,
            "assignment": [p.to_json() for p in plan.workers],
        }),
        wall_seconds=wall_seconds, restarts=restarts, checkpoint=checkpoint, output=config.run.output,
    )


def _json_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each tuple a list, as JSON reads it back (so :meth:`Result.from_path` gives an equal one)."""
    return {k: [list(i) if isinstance(i, tuple) else i for i in v] if isinstance(v, tuple) else v
            for k, v in values.items()}


def _last_checkpoint(job: Any) -> str | None:
    """The URL of the newest complete checkpoint in ``--checkpoint-dir`` (that of the last epoch, unless its
    commit failed), or None when there is none or the folder cannot be read (a warning)."""
    from spark_imagenet.errors import SparkImagenetError
    from spark_imagenet.training.job.checkpoints import latest

    try:
        found = latest(job.checkpoints) if job.checkpoints is not None else None
    except SparkImagenetError as e:
        logger.warning(f"warning: could not read --checkpoint-dir {job.config.run.checkpoint_dir} for the results: {e}")
        return None
    return None if found is None else job.config.run.checkpoint_dir.rstrip("/") + "/" + found[0]
