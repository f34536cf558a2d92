"""Training checkpoints in ``--checkpoint-dir``: what a checkpoint is (its meta, ``checkpoint.json``), whether a
job can resume from it, and the folders that hold them (no TensorFlow here).

After every epoch the chief's TensorFlow process writes a checkpoint (weights and optimizer state) into a
local folder and :func:`commit` publishes it; a job launched again, or a barrier stage launched again after
a lost worker, finds the newest one with :func:`latest`, refuses a foreign one with
:func:`check_compatible`, and every worker fetches it with :func:`download`. The driver imports this
module, so it never imports TensorFlow: it moves files and reads ``checkpoint.json``.

Each checkpoint is a committed set (:class:`spark_imagenet.storage.committed.CommittedSets`): the
TensorFlow files with their sizes and CRC32C, and ``checkpoint.json`` listing them, written last. Layout
of the checkpoint dir (a local folder every host sees, or ``gs://bucket/prefix``, through
:func:`spark_imagenet.storage.open_storage`)::

    CHECKPOINT_DIR/
      epoch-000001/                  # one folder per checkpoint: the completed epoch, 6 digits
        ckpt.index                   # the TensorFlow files, whatever their names (subfolders allowed)
        ckpt.data-00000-of-00001
        checkpoint.json              # the CheckpointMeta, written last: the commit point
      epoch-000002-000120/           # with --checkpoint-every: 2 epochs done and 120 steps into the third
        ...
      epoch-000003/
        ...

A folder counts as a checkpoint only when its ``checkpoint.json`` exists, is JSON, and every file it lists
exists with the listed size (and CRC32C, where the store's listing reports one); anything else (an upload
cut short, a folder being pruned) is half-written and never taken as the latest. A commit first deletes
its own folder's ``checkpoint.json`` (an epoch trained again after a crash reuses the folder), so files of
two uploads whose sizes happen to match never count as one checkpoint. Pruning deletes a folder's
``checkpoint.json`` first too.

How many checkpoints stay is :func:`commit`'s ``keep`` (default :data:`DEFAULT_KEEP`, the
``--keep-checkpoints`` default), and one more: the newest complete checkpoint at an epoch's end is never pruned
while only checkpoints inside the epoch after it are newer (:func:`prune_plan`). A checkpoint inside an epoch
resumes on the worker count that wrote it only (:func:`check_compatible`); from that one
(:func:`latest_at_epoch_end`) a job on another count trains the interrupted epoch again from its start.

``checkpoint.json`` (format ``spark-imagenet-checkpoint``, ``format_version`` 2, through
:class:`~spark_imagenet.storage.envelope.Envelope`)::

    {
      "format": "spark-imagenet-checkpoint",
      "format_version": 2,
      "epoch": 3, "epochs": 90, "step": 3753,
      "dataset_id": "<the manifest's dataset_id>", "model": "alexnet", "width": 1.0,
      "image_size": 224, "num_classes": 1000, "workers": 8, "batch_size": 128, "seed": 0,
      "learning_rate": 0.01, "optimizer": "sgd", "precision": "float32",
      "lr_schedule": "cosine", "lr_boundaries": [], "warmup_epochs": 5.0, "lr_scaling": "none",
      "momentum": 0.9, "weight_decay": 0.0005, "label_smoothing": 0.0,
      "flip": true, "crop_area": [0.08, 1.0], "lighting": 0.0,
      "files": [{"name": "ckpt.index", "size": 1234, "crc32c": "<base64>"}, ...],
      "history": {"loss": [6.1, 5.2, 4.8], "val_top1": [0.02, 0.05, 0.09]},
      "created": "2026-12-01T18:00:00Z"
    }

Every field is required. Another ``format_version`` is refused with what to do: an older one (an earlier
spark-imagenet's), start the run afresh in a new ``--checkpoint-dir``; a newer one, upgrade spark-imagenet.

Every value is checked by a rule (:class:`~spark_imagenet.training.job.settings.Rule`): a job setting's by the
setting's own rule (:class:`~spark_imagenet.training.job.config.TrainConfig`), the dataset's id and class count by
the rules every record shares (:data:`~spark_imagenet.training.job.settings.FACTS`), the meta's own fields by
:data:`_OWN_RULES`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

from spark_imagenet.errors import ConfigError, StorageError
from spark_imagenet.storage import DEFAULT_TRANSFERS, ObjectInfo, Storage
from spark_imagenet.storage.base import check_transfers
from spark_imagenet.storage.committed import CommittedSets, Entry, download_verified, local_entries
from spark_imagenet.storage.committed import prune_plan as _sets_prune_plan
from spark_imagenet.storage.envelope import FORMAT_KEY, VERSION_KEY, Envelope
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.sections import DEFAULT_KEEP
from spark_imagenet.training.job.settings import FACTS, Rule, check_value
from spark_imagenet.units import human_size

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_KEEP", "FORMAT", "FORMAT_VERSION", "MAY_CHANGE", "META_NAME", "OPTIONS", "REMEDY", "CheckpointFile",
    "CheckpointMeta", "RunSettings", "check_compatible", "check_keep", "checkpoint_sets", "commit", "describe",
    "differences", "download", "expected_for", "folder_epoch", "folder_name", "folder_position", "latest",
    "latest_at_epoch_end", "new_meta", "prune_plan", "read_local", "steps_inside", "tf_prefix", "utc_now",
]

META_NAME = "checkpoint.json"
FORMAT = "spark-imagenet-checkpoint"
#: The version this module writes and the only one it reads.
FORMAT_VERSION = 2
#: What to do about a checkpoint this job cannot resume from.
REMEDY = "use another --checkpoint-dir, or remove the old checkpoints (its epoch-* folders) to start afresh"
#: ``checkpoint.json``'s versioned-JSON form.
ENVELOPE = Envelope(FORMAT, FORMAT_VERSION, "spark-imagenet checkpoint", error=ConfigError, remedy=REMEDY)

#: that sets each in that job, for messages. ``epochs`` is not here: see :func:`check_compatible`.
OPTIONS = {
    "dataset_id": "the dataset's manifest",
    "num_classes": "the dataset's classes",
    "model": "--model",
    "width": "--width",
    "image_size": "--image-size",
    "seed": "--seed",
    "learning_rate": "--learning-rate",
    "optimizer": "--optimizer",
    "precision": "--precision",
    "lr_schedule": "--lr-schedule",
    "lr_boundaries": "--lr-boundaries",
    "warmup_epochs": "--warmup-epochs",
    "lr_scaling": "--lr-scaling",
    "momentum": "--momentum",
    "weight_decay": "--weight-decay",
    "label_smoothing": "--label-smoothing",
    "flip": "--no-flip",
    "crop_area": "--crop-area",
    "lighting": "--lighting",
}
#: Settings whose default scales with ``--epochs``: compared only when ``--epochs`` is the checkpoint's (a run
#: extended with more epochs is described by :func:`~spark_imagenet.training.job.schedules.extension_note`).
_SCALED_WITH_EPOCHS = ("lr_boundaries", "warmup_epochs")
#: Settings that may change on resume (docs/guide/failures.md): ``--epochs`` (larger), and everything that
#: is not in :data:`OPTIONS`: outputs, checkpoints kept, restarts, timeouts, transfers, cache, parallelism.
MAY_CHANGE = "--epochs (more, to extend a run), --workers (with --batch-size keeping the global batch; from a " \
             "checkpoint at an epoch's end), " \
             "--keep-checkpoints, --max-restarts, the timeouts, --output, " \
             "--results, --overwrite, --transfers, --parallel, --cache, --deterministic, --jit-compile and the " \
             "Spark settings"
#: Why a field must match, where it is not plain (added to the message).
_WHY = {"optimizer": "the optimizer's saved state differs (SGD and LARS keep different slots)",
        "precision": "mixed_float16 adds a loss-scale optimizer, whose state the checkpoint does or does not hold",
        "lr_schedule": "the saved optimizer holds the schedule, and the learning rate of every step to come "
                       "depends on it"}
#: The rules of the meta's own fields (a job setting is checked by the setting's own rule, the dataset's id and
#: class count by :data:`~spark_imagenet.training.job.settings.FACTS`).
_OWN_RULES = {**FACTS, "epoch": Rule("int", minimum=0), "step": Rule("int", minimum=0), "created": Rule("str")}


def utc_now() -> str:
    """The current UTC time as ``2026-12-01T18:00:00Z`` (the form of :attr:`CheckpointMeta.created`)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


#: One TensorFlow file of a checkpoint: ``name`` (relative to the checkpoint's folder, ``/``-separated),
#: ``size`` in bytes, ``crc32c`` (form of :func:`spark_imagenet.storage.crc32c_bytes`); a committed set's entry.
CheckpointFile = Entry


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The values of a job that decide whether it can resume from a checkpoint (see :func:`check_compatible`).

    Attributes:
        dataset_id: the dataset manifest's ``dataset_id``.
        model: ``--model``.
        width: ``--width``.
        image_size: ``--image-size``.
        num_classes: the dataset's class count.
        workers: ``--workers``.
        batch_size: ``--batch-size`` (per worker).
        seed: ``--seed``.
        learning_rate: ``--learning-rate``.
        epochs: ``--epochs``, the run's total.
        optimizer: ``--optimizer`` (``"sgd"`` or ``"lars"``).
        precision: ``--precision`` (``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``).
        lr_schedule, lr_boundaries, warmup_epochs, lr_scaling, momentum, weight_decay, label_smoothing: the
            recipe as resolved (a model's defaults filled in).
        flip, crop_area, lighting: the augmentation (``--no-flip``, ``--crop-area``, ``--lighting``).
    """

    dataset_id: str
    model: str
    width: float
    image_size: int
    num_classes: int
    workers: int
    batch_size: int
    seed: int
    learning_rate: float
    epochs: int
    optimizer: str
    precision: str
    lr_schedule: str
    lr_boundaries: tuple[float, ...]
    warmup_epochs: float
    lr_scaling: str
    momentum: float
    weight_decay: float
    label_smoothing: float
    flip: bool
    crop_area: tuple[float, ...]
    lighting: float

    def __post_init__(self) -> None:
        for name in ("lr_boundaries", "crop_area"):  # JSON gives lists
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @classmethod
    def from_config(cls, config: Any, *, dataset_id: str, num_classes: int) -> "RunSettings":
        """The settings of a job.

        Args:
            config: a :class:`~spark_imagenet.training.job.config.TrainConfig` (a dataclass of section dataclasses
                whose settings have these names).
            dataset_id: the dataset manifest's ``dataset_id``.
            num_classes: the dataset's class count.

        Returns:
            RunSettings: the job's values.
        """
        sections = (getattr(config, s.name) for s in dataclasses.fields(config))
        flat = {f.name: getattr(section, f.name) for section in sections for f in dataclasses.fields(section)}
        values = {f.name: flat[f.name] for f in dataclasses.fields(RunSettings)
                  if f.name not in ("dataset_id", "num_classes")}
        return RunSettings(dataset_id=dataset_id, num_classes=num_classes, **values)


def expected_for(config: Any, manifest: Any) -> RunSettings:
    """A job's :class:`RunSettings`: :meth:`RunSettings.from_config` with its dataset manifest's
    ``dataset_id`` and ``num_classes``."""
    return RunSettings.from_config(config, dataset_id=manifest.dataset_id, num_classes=manifest.num_classes)


def new_meta(config: Any, dataset_id: str, num_classes: int, steps_per_epoch: int,
             history: dict[str, list[float]] | None = None) -> "CheckpointMeta":
    """The meta a run's commits start from, each completing it with ``replace(epoch=..., step=..., history=...)``.

    Args:
        config: the job (as :meth:`RunSettings.from_config`).
        dataset_id: the dataset manifest's ``dataset_id``.
        num_classes: the dataset's class count.
        steps_per_epoch: training steps of one epoch.
        history: the Keras history of the epochs before this run's first (the resumed checkpoint's), or None.

    Returns:
        CheckpointMeta: ``epoch`` = the epochs ``history`` covers (its longest list, at least 1: a template,
        not a checkpoint), ``step`` = ``epoch x steps_per_epoch``, no ``files``.

    Raises:
        ConfigError: as :class:`CheckpointMeta`.
    """
    history = {k: list(v) for k, v in (history or {}).items()}
    epoch = max([1, *(len(v) for v in history.values())])
    settings = RunSettings.from_config(config, dataset_id=dataset_id, num_classes=num_classes)
    return CheckpointMeta.create(settings, epoch=epoch, step=epoch * steps_per_epoch, history=history)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad_name(name: Any) -> bool:
    """Whether ``name`` cannot be a file of a checkpoint folder (absolute, empty part, ``..``, ``\\``)."""
    return (not isinstance(name, str) or not name or name.startswith("/") or "\\" in name
            or any(part in ("", ".", "..") for part in name.split("/")))


def _file_problems(files: Sequence[Any]) -> list[str]:
    """What is wrong with a meta's ``files`` (pure)."""
    problems = []
    for f in files:
        if not isinstance(f, CheckpointFile):
            problems.append(f"files: {f!r} is not a (name, size, crc32c) entry")
        elif _bad_name(f.name) or f.name == META_NAME:
            problems.append(f"files: {f.name!r} is not a file name inside the checkpoint's folder"
                            + (f" ({META_NAME} is the meta's own name)" if f.name == META_NAME else ""))
        elif not _is_int(f.size) or f.size < 0 or not isinstance(f.crc32c, str) or not f.crc32c:
            problems.append(f"files: {f.name}: size {f.size!r} and crc32c {f.crc32c!r} must be bytes >= 0 and a "
                            "base64 CRC32C")
    names = [f.name for f in files if isinstance(f, CheckpointFile)]
    if len(set(names)) != len(names):
        problems.append("files: a name is listed twice")
    return problems


def _meta_rules() -> dict[str, Rule]:
    """The rule of every value field of a checkpoint's meta (not ``files``, ``history``): a job setting's own rule,
    or :data:`_OWN_RULES`; every one required."""
    settings = {f.name: f.metadata["rule"] for _, f in TrainConfig.settings()}
    names = [f.name for f in dataclasses.fields(RunSettings)] + ["epoch", "step", "created"]
    return {n: dataclasses.replace(_OWN_RULES.get(n) or settings[n], optional=False) for n in names}


_RULES = _meta_rules()


def _checked_values(meta: "CheckpointMeta") -> tuple[dict[str, Any], list[str]]:
    """Each value field of ``meta`` checked by its rule (:data:`_RULES`): the converted values, and one problem
    per field that fails (pure)."""
    values, problems = {}, []
    for name, rule in _RULES.items():
        try:
            values[name] = check_value(name, rule, getattr(meta, name), name)  # named by its checkpoint.json key, not its option
        except ConfigError as e:
            problems.append(str(e))
    return values, problems


def _problems(meta: "CheckpointMeta") -> list[str]:
    """What is wrong with a meta's epoch, files and history (pure), one line each; its values are checked by
    :func:`_checked_values`."""
    problems = []
    if _is_int(meta.epoch) and _is_int(meta.epochs) and meta.epoch > meta.epochs:
        problems.append(f"epoch {meta.epoch} is past the run's epochs {meta.epochs}")
    if not isinstance(meta.files, tuple):
        problems.append(f"files must be a tuple, got {type(meta.files).__name__}")
    else:
        problems.extend(_file_problems(meta.files))
    if not isinstance(meta.history, dict):
        problems.append(f"history must be a dict of lists, got {type(meta.history).__name__}")
        return problems
    for key, values in meta.history.items():
        if not isinstance(key, str) or not isinstance(values, list) or not all(map(_is_number, values)):
            problems.append(f"history: {key!r} must name a list of numbers")
        elif _is_int(meta.epoch) and len(values) > meta.epoch:
            problems.append(f"history: {key!r} holds {len(values)} values for {meta.epoch} epoch(s)")
    return problems


def _refuse_other_version(data: Any, where: str) -> None:
    """Refuse a ``checkpoint.json`` of an older or a newer ``format_version`` than :data:`FORMAT_VERSION`.

    Raises:
        ConfigError: names ``where`` and both versions, and what to do: for an older version (an earlier
            spark-imagenet's), start the run afresh in a new ``--checkpoint-dir``; for a newer one, upgrade
            spark-imagenet. Any other version (not an integer >= 1) is left to :data:`ENVELOPE`'s check.
    """
    if not isinstance(data, dict) or data.get(FORMAT_KEY) != FORMAT:
        return
    version = data.get(VERSION_KEY)
    if not _is_int(version) or version < 1 or version == FORMAT_VERSION:
        return
    if version > FORMAT_VERSION:
        raise ConfigError(f"{where}: format_version {version} is not supported by this version of spark-imagenet "
                          f"(which reads {FORMAT_VERSION}): a newer spark-imagenet wrote this checkpoint; upgrade "
                          f"spark-imagenet to resume from it, or {REMEDY}", key=VERSION_KEY, value=version)
    raise ConfigError(f"{where}: format_version {version} is an older checkpoint format, which this version of "
                      f"spark-imagenet no longer reads (it reads {FORMAT_VERSION}): start the run afresh with a new "
                      "--checkpoint-dir, or resume it with the spark-imagenet version that wrote it",
                      key=VERSION_KEY, value=version)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointMeta(RunSettings):
    """A parsed ``checkpoint.json``: the :class:`RunSettings` of the run that wrote it (every attribute of
    those), and what the checkpoint holds. Validated when built; keyword arguments only.

    Attributes:
        epoch: completed epochs (>= 0: 0 for a checkpoint inside the first epoch; counted from 1 as Keras prints
            them).
        step: global optimizer steps done (>= 0); beyond ``epoch`` x steps per epoch for a checkpoint inside
            an epoch (``--checkpoint-every``).
        files: the TensorFlow files, names relative to the checkpoint's folder
            (:func:`~spark_imagenet.training.job.checkpoints.commit` fills it).
        history: the Keras history of the epochs so far, ``{"loss": [per epoch], ...}`` (at most ``epoch``
            values per key; a metric computed every other epoch has fewer).
        created: ISO-8601 UTC time, ``2026-12-01T18:00:00Z`` (default: now).

    The run's settings are checked by their settings' rules (``epochs`` >= ``epoch`` too); every one is required.

    Raises:
        ConfigError: a value of the wrong type or out of range (every one is named).
    """

    epoch: int
    step: int
    files: tuple[CheckpointFile, ...] = ()
    history: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    created: str = dataclasses.field(default_factory=utc_now)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.files, (list, tuple)):  # (name, size, crc32c) triples as CheckpointFile
            object.__setattr__(self, "files", tuple(
                CheckpointFile(*f) if isinstance(f, (list, tuple)) and len(f) == 3 else f for f in self.files))
        if isinstance(self.history, dict):
            object.__setattr__(self, "history", {k: [float(x) if _is_number(x) else x for x in v]
                                                 if isinstance(v, (list, tuple)) else v
                                                 for k, v in self.history.items()})
        values, problems = _checked_values(self)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        problems += _problems(self)
        if problems:
            raise ConfigError("invalid checkpoint meta: " + "; ".join(problems))

    @classmethod
    def create(cls, settings: RunSettings, *, epoch: int, step: int,
               history: dict[str, list[float]] | None = None) -> "CheckpointMeta":
        """The meta of a job's checkpoint after ``epoch`` (``files`` empty:
        :func:`~spark_imagenet.training.job.checkpoints.commit` fills them).

        Args:
            settings: the job's values.
            epoch: completed epochs.
            step: global optimizer steps done.
            history: the Keras history so far.

        Raises:
            ConfigError: as the class.
        """
        return cls(epoch=epoch, step=step, history=dict(history or {}), **dataclasses.asdict(settings))

    def replace(self, **changes: Any) -> "CheckpointMeta":
        """A copy with ``changes`` applied (validated again; raises ConfigError as the class)."""
        return dataclasses.replace(self, **changes)

    def settings(self) -> RunSettings:
        """The :class:`RunSettings` of the run that wrote this checkpoint."""
        return RunSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunSettings)})

    def _body(self) -> dict[str, Any]:
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        body["files"] = [f._asdict() for f in self.files]
        body["history"] = {k: list(v) for k, v in self.history.items()}
        for name in ("lr_boundaries", "crop_area"):
            body[name] = list(body[name])
        return body

    def to_json(self) -> dict[str, Any]:
        """The meta as a JSON-serialisable dict (format of the module doc)."""
        return ENVELOPE.to_json(self._body())

    def dumps(self) -> str:
        """The meta as indented JSON text."""
        return ENVELOPE.dumps(self._body())

    @classmethod
    def from_json(cls, data: Any, where: str = META_NAME) -> "CheckpointMeta":
        """Parse and validate a ``checkpoint.json`` dict.

        Args:
            data: the decoded JSON.
            where: the file, named in error messages.

        Returns:
            CheckpointMeta: the meta.

        Raises:
            ConfigError: another format, another format version (:func:`_refuse_other_version`: an older one
                says to start a new ``--checkpoint-dir``, a newer one to upgrade spark-imagenet), or a missing or
                invalid field.
        """
        _refuse_other_version(data, where)
        data = ENVELOPE.from_json(data, where)
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}; {REMEDY}", key=missing[0])
        try:
            files = tuple(CheckpointFile(f["name"], f["size"], f["crc32c"]) for f in data["files"])
            return cls(**{**{n: data[n] for n in names}, "files": files})
        except (KeyError, TypeError) as e:
            raise ConfigError(f"{where}: malformed files entry ({type(e).__name__}: {e}); {REMEDY}") from None
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}; {REMEDY}") from None

    @classmethod
    def loads(cls, text: str | bytes, where: str = META_NAME) -> "CheckpointMeta":
        """Parse ``checkpoint.json`` text.

        Raises:
            ConfigError: not JSON, or invalid (see :meth:`from_json`).
        """
        return cls.from_json(ENVELOPE.decode(text, where), where)


def describe(meta: CheckpointMeta) -> str:
    """A checkpoint for log lines: ``the checkpoint of epoch 1 (step 12, 2026-12-01T18:00:00Z)``."""
    return f"the checkpoint of epoch {meta.epoch} (step {meta.step}, {meta.created})"


def differences(meta: CheckpointMeta, expected: RunSettings, *, inside: int = 0,
                epoch_start: str | None = None) -> list[str]:
    """Why a job cannot resume from a checkpoint, one line per reason (pure; empty: it can).

    Args:
        meta: the checkpoint.
        expected: the job's values.
        inside: the steps the checkpoint is into the epoch after ``meta.epoch`` (its folder's ``K``,
            ``epoch-E-K``); 0 for a checkpoint at an epoch's end.
        epoch_start: the folder of the newest complete checkpoint at an epoch's end (``epoch-E``), from which a
            job on another worker count may train the interrupted epoch again from its start; None when there is
            none. Read only for a checkpoint inside an epoch.

    Returns:
        list[str]: e.g. ``"--image-size 224 in the checkpoint, 128 in this job"``, in :data:`OPTIONS` order,
        then the global batch, the worker count of a checkpoint inside an epoch (:func:`_inside_an_epoch`) and
        the epochs rule.
    """
    lines = []
    for field, option in OPTIONS.items():
        ours, theirs = getattr(meta, field), getattr(expected, field)
        if field in _SCALED_WITH_EPOCHS and meta.epochs != expected.epochs:
            continue  # its default follows --epochs: an extension is described by schedules.extension_note
        if ours != theirs:
            label = option if option.startswith("--") else f"{field} ({option})"
            if field == "flip":
                label = "random flips (off with --no-flip)"
            why = f" ({_WHY[field]})" if field in _WHY else ""
            lines.append(f"{label} {ours!r} in the checkpoint, {theirs!r} in this job{why}")
    lines += _global_batch(meta, expected)
    lines += _inside_an_epoch(meta, expected, inside, epoch_start)
    if meta.epoch > expected.epochs:
        lines.append(f"--epochs {expected.epochs} in this job, but the checkpoint has completed {meta.epoch} "
                     f"epoch(s) (give --epochs {meta.epoch} or more to resume from it)")
    return lines


def _inside_an_epoch(meta: CheckpointMeta, expected: RunSettings, inside: int,
                     epoch_start: str | None) -> list[str]:
    """Why a job on another worker count cannot finish the epoch a checkpoint inside it interrupted (pure; empty:
    it can): each worker's stream of records in an epoch follows from the worker count, so another count would
    train a different rest of the epoch. The line names the two ways on: the checkpoint's count, or the epoch
    again from its start (from ``epoch_start``, or from the first epoch when the checkpoint is inside it)."""
    if not inside or meta.workers == expected.workers:
        return []
    epoch = meta.epoch + 1
    line = (f"--workers {expected.workers} in this job, but the checkpoint was written {inside} step(s) into epoch "
            f"{epoch} by {meta.workers} worker(s), and only that count trains exactly the records the epoch has left "
            "(each worker's share and order of an epoch's records follow from the worker count): resume on "
            f"{meta.workers} worker(s) with --workers {meta.workers} --batch-size {meta.batch_size} to finish epoch "
            f"{epoch} exactly")
    if epoch_start is not None:
        return [f"{line}, or resume on any worker count from {epoch_start}, the newest checkpoint at an epoch's end "
                f"(the steps after it are trained again): remove the checkpoint folders newer than {epoch_start}, "
                "then run this command again"]
    if epoch == 1:
        return [f"{line}, or train epoch 1 from its start on any worker count: remove the checkpoint folders (all "
                "inside epoch 1), then run this command again"]
    return [f"{line} (no complete checkpoint at an epoch's end is left to train epoch {epoch} again from its start)"]


def _global_batch(meta: RunSettings, expected: RunSettings) -> list[str]:
    """Why the job's global batch cannot resume the checkpoint's (pure; empty: it can): the batch per worker
    that keeps it on the job's worker count, or the worker counts that can."""
    ours, theirs = meta.batch_size * meta.workers, expected.batch_size * expected.workers
    if ours == theirs:
        return []
    was = f"the global batch (--batch-size x --workers) {ours} ({meta.batch_size} x {meta.workers}) in the checkpoint, " \
          f"{theirs} ({expected.batch_size} x {expected.workers}) in this job"
    if ours % expected.workers == 0:
        return [f"{was}: on {expected.workers} worker(s) give --batch-size {ours // expected.workers} to keep it"]
    counts = [n for n in range(1, min(ours, 64) + 1) if ours % n == 0]
    return [f"{was}: {expected.workers} worker(s) cannot share {ours} images per step evenly; resume on "
            f"{', '.join(map(str, counts))} worker(s) with --batch-size {ours} / workers"]


def check_compatible(meta: CheckpointMeta, expected: RunSettings, where: str, *, inside: int = 0,
                     epoch_start: str | None = None) -> None:
    """Refuse to resume a job from a checkpoint another run wrote.

    Must match: the dataset (its ``dataset_id`` and class count), ``--model``, ``--width``,
    ``--image-size``, ``--seed``, ``--learning-rate``, ``--optimizer``, ``--precision``
    and the global batch (the optimizer and precision decide which optimizer state the checkpoint holds), and
    every setting that changes the math of the steps to come (the schedule, warm-up, learning-rate scaling,
    momentum, weight decay, label smoothing and augmentation); ``--warmup-epochs`` and ``--lr-boundaries`` only when ``--epochs`` is the checkpoint's, since
    their defaults scale with it. What may change: :data:`MAY_CHANGE`.

    ``--workers`` may change when the global batch (``batch_size x workers``) stays: the steps per epoch
    (``train images // global batch``), so the meaning of ``step`` and the learning-rate schedule, then stay
    too; the shards are assigned to the new worker count, so the data order of the epochs to come differs
    (each epoch still reads every train shard). A checkpoint of 2 workers at ``--batch-size 64`` resumes on 4
    with ``--batch-size 32``, on 1 with 128; a worker count that does not divide the global batch is refused
    with the counts that do (:func:`_global_batch`). A checkpoint inside an epoch (``inside`` > 0) resumes on
    its own worker count only: another count is refused with the two ways on, that count or the epoch again
    from its start (:func:`_inside_an_epoch`). A different ``--epochs`` (the run's total) is allowed,
    to extend a run, as long as the checkpoint's completed epochs are at most the new total (equal: nothing
    is left to train).

    Args:
        meta: the checkpoint.
        expected: the job's values (:meth:`RunSettings.from_config`).
        where: the checkpoint, for the message (e.g. the URL of its ``checkpoint.json``).
        inside: as :func:`differences`.
        epoch_start: as :func:`differences`.

    Raises:
        ConfigError: the job differs; the message names ``where``, every differing field with the checkpoint's
            value, the job's and the option that sets it, and what to do.
    """
    lines = differences(meta, expected, inside=inside, epoch_start=epoch_start)
    if lines:
        raise ConfigError(f"{where}: this job cannot resume from {describe(meta)}: " + "; ".join(lines)
                          + f". Run with the checkpoint's values to resume from it (what may differ: {MAY_CHANGE}), "
                          f"or {REMEDY}")

_FOLDER = re.compile(r"epoch-(\d{6,})(?:-(\d{6,}))?")


def folder_name(epoch: int, inside: int = 0) -> str:
    """The folder of the checkpoint after ``epoch`` epochs and ``inside`` steps into the next: ``epoch-000003``,
    or ``epoch-000003-000120`` (``--checkpoint-every``)."""
    return f"epoch-{epoch:06d}" + (f"-{inside:06d}" if inside else "")


def folder_position(name: str) -> tuple[int, int] | None:
    """``(epochs done, steps into the next)`` a checkpoint folder's name stands for (``epoch-000003`` ->
    ``(3, 0)``, ``epoch-000003-000120`` -> ``(3, 120)``); None for any other name. Newer is greater."""
    m = _FOLDER.fullmatch(name)
    if not m:
        return None
    position = (int(m.group(1)), int(m.group(2) or 0))
    return position if folder_name(*position) == name else None


def folder_epoch(name: str) -> int | None:
    """The epochs done of a checkpoint folder's name (``epoch-000003`` -> 3); None for any other name."""
    position = folder_position(name)
    return None if position is None else position[0]


def checkpoint_sets(storage: Storage) -> CommittedSets:
    """The checkpoints of a checkpoint dir as committed sets: ``epoch-*`` folders, ``checkpoint.json``
    markers, newest = highest position (:func:`folder_position`)."""
    return CommittedSets(storage, META_NAME, folder_position, noun="file", kind="checkpoint",
                         logger_name=__name__)


def check_keep(keep: int | None) -> int | None:
    """Refuse a number of checkpoints to keep below 1.

    Args:
        keep: complete checkpoints to keep, the newest included; None = all.

    Returns:
        int | None: ``keep``.

    Raises:
        ConfigError: ``keep`` is not None nor an integer >= 1.
    """
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ConfigError(f"keep {keep}: a commit keeps at least the new checkpoint (give 1 or more, None = all)",
                          key="keep", value=keep)
    return keep


def _parse(folder: str, data: bytes, where: str) -> CheckpointMeta | None:
    """A folder's ``checkpoint.json`` parsed; None when it is not JSON (half-written or damaged).

    Raises:
        ConfigError: JSON of another format or version, invalid, or the meta of another epoch than its
            folder's.
    """
    try:
        decoded = json.loads(data)
    except ValueError:
        return None
    meta = CheckpointMeta.from_json(decoded, where)
    if meta.epoch != folder_epoch(folder):
        raise ConfigError(f"{where}: holds the checkpoint of epoch {meta.epoch}, not {folder_epoch(folder)} as "
                          f"its folder says; {REMEDY}", key="epoch", value=meta.epoch)
    return meta


def latest(storage: Storage, *, announce: bool = False) -> tuple[str, CheckpointMeta] | None:
    """The newest complete checkpoint of a checkpoint dir.

    Folders are tried from the highest epoch down; a half-written one (no ``checkpoint.json``, one that is
    not JSON, or a listed file missing or of another size or CRC32C) is skipped.

    Args:
        storage: the checkpoint dir.
        announce: log (INFO) a line for every folder skipped; False: silent.

    Returns:
        tuple[str, CheckpointMeta] | None: the folder's name (``epoch-000003``) and its meta; None when
        there is no complete checkpoint.

    Raises:
        ConfigError: a ``checkpoint.json`` that is JSON but of another format or version, invalid, or in
            a folder of another epoch: the message names the file and what to do.
        StorageError: the dir cannot be listed or read.
    """
    return checkpoint_sets(storage).latest(_parse, announce=announce)


def latest_at_epoch_end(storage: Storage) -> tuple[str, CheckpointMeta] | None:
    """The newest complete checkpoint at an epoch's end (``epoch-000003``, not ``epoch-000003-000120``): where a
    job on another worker count than a checkpoint inside an epoch was written with trains that epoch again.

    Returns:
        tuple[str, CheckpointMeta] | None: its folder's name and its meta, as :func:`latest`; None when there is
        none (half-written folders are skipped silently).

    Raises:
        ConfigError, StorageError: as :func:`latest`.
    """
    return next(((name, meta) for name, meta in checkpoint_sets(storage).complete(_parse)
                 if folder_position(name)[1] == 0), None)


def steps_inside(name: str) -> int:
    """The steps a checkpoint folder is into the epoch after its epochs done (``epoch-000003-000120`` -> 120,
    ``epoch-000003`` -> 0; 0 for any other name)."""
    return (folder_position(name) or (0, 0))[1]


def read_local(local_dir: str | os.PathLike) -> CheckpointMeta:
    """The meta of a checkpoint :func:`download` fetched into ``local_dir``.

    Raises:
        ConfigError: no ``checkpoint.json`` there, or an invalid one.
    """
    path = Path(local_dir) / META_NAME
    try:
        text = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the checkpoint's meta ({e.strerror or e})") from None
    return CheckpointMeta.loads(text, str(path))


def tf_prefix(local_dir: str | os.PathLike, meta: CheckpointMeta) -> str:
    """The path TensorFlow restores from: ``local_dir/ckpt`` when the files hold one ``ckpt.index`` (a
    ``tf.train.Checkpoint`` prefix), else ``local_dir`` itself (a SavedModel or other folder layout)."""
    index = [f.name for f in meta.files if f.name.endswith(".index")]
    return os.path.join(os.fspath(local_dir), index[0][:-len(".index")]) if len(index) == 1 else os.fspath(local_dir)


def download(storage: Storage, name: str, meta: CheckpointMeta, local_dir: str | os.PathLike, *,
             transfers: int = DEFAULT_TRANSFERS) -> str:
    """Fetch a checkpoint into a local folder, every file verified against its meta
    (:func:`~spark_imagenet.storage.committed.download_verified`: a mismatch is fetched once more).

    ``checkpoint.json`` is written into ``local_dir`` last (:func:`read_local` reads it).

    Args:
        storage: the checkpoint dir.
        name: the checkpoint's folder, as :func:`latest` returns it (``epoch-000003``).
        meta: its meta (:func:`latest`'s).
        local_dir: the local folder (created; files already there are replaced).
        transfers: parallel downloads (>= 1).

    Returns:
        str: the path TensorFlow restores from (:func:`tf_prefix`), e.g. ``local_dir/ckpt``.

    Raises:
        StorageError: a file cannot be fetched, or still differs from the meta after a second fetch (each
            one named, with its size or CRC32C and the meta's), or ``local_dir`` cannot be written.
        ConfigError: ``transfers`` < 1.
    """
    local = Path(local_dir)
    download_verified(storage, [(f, local / f.name) for f in meta.files], prefix=name, transfers=transfers,
                      noun="file", reference=META_NAME,
                      remedy=f"{describe(meta)} is damaged: remove {storage.where(name)} to resume from the one "
                             "before it")
    try:
        (local / META_NAME).write_text(meta.dumps())
    except OSError as e:
        raise StorageError(f"{local}: cannot write the checkpoint there ({e.strerror or e})") from None
    return tf_prefix(local, meta)


def prune_plan(epoch: int | tuple[int, int], keep: int | None, states: dict[str, bool]) -> list[str]:
    """Which folders a commit of ``epoch`` deletes (pure).

    Args:
        epoch: the epoch just committed, or its position ``(epochs done, steps into the next)``.
        keep: complete checkpoints to keep, the new one included; None = all.
        states: ``{folder: complete?}`` of the other checkpoint folders.

    Returns:
        list[str]: the folders older than ``epoch`` that are half-written, or complete beyond the newest
        ``keep``, newest first; newer folders are never deleted, nor, when ``epoch`` is inside an epoch, the
        newest complete checkpoint at an epoch's end (only checkpoints inside an epoch are newer than it: it
        stays the start a job on another worker count resumes from, :func:`latest_at_epoch_end`).
    """
    position = (epoch, 0) if isinstance(epoch, int) else epoch
    older = {f: complete for f, complete in states.items() if (folder_position(f) or (-1, 0)) < position}
    plan = _sets_prune_plan(older, None if keep is None else max(keep - 1, 0), folder_position)
    if not position[1]:
        return plan
    ends = [f for f, complete in older.items() if complete and steps_inside(f) == 0 and folder_position(f) is not None]
    start = max(ends, key=folder_position, default=None)
    return [f for f in plan if f != start]


def _prune(sets: CommittedSets, epoch: tuple[int, int], keep: int | None,
           groups: dict[str, dict[str, ObjectInfo]]) -> list[str]:
    """Delete the folders :func:`prune_plan` names and return those deleted; a folder whose meta is foreign is
    left alone (logged)."""
    states = {}
    for folder, objects in groups.items():
        if (folder_position(folder) or (-1, 0)) >= epoch:
            continue
        try:
            meta = sets.read_marker(folder, _parse) if META_NAME in objects else None
        except (ConfigError, StorageError) as e:
            logger.warning(f"leaving {sets.storage.where(folder)} alone: {e}")
            continue
        states[folder] = meta is not None and sets.missing(meta, objects) is None
    older = prune_plan(epoch, keep, states)
    return sets.prune({f: states[f] for f in older}, 0, groups)  # every one of them goes


def commit(storage: Storage, local_dir: str | os.PathLike, meta: CheckpointMeta, *, keep: int | None = DEFAULT_KEEP,
           transfers: int = DEFAULT_TRANSFERS, inside: int = 0) -> str:
    """Publish the checkpoint the chief wrote into ``local_dir`` as ``epoch-{meta.epoch:06d}/``.

    :meth:`CommittedSets.commit <spark_imagenet.storage.committed.CommittedSets.commit>`: the folder's old
    ``checkpoint.json`` and any file the new checkpoint does not have are deleted (an epoch trained again
    reuses its folder), every file of ``local_dir`` is uploaded and verified (size and CRC32C as the store
    reports them; a mismatch is uploaded once more), ``checkpoint.json`` is written (the commit point);
    then older folders are pruned: complete checkpoints beyond the newest ``keep`` and half-written ones (a
    prune that fails is logged as a warning; the commit stands). One listing serves the whole commit.

    A store that runs out of room (:func:`out_of_space`) gets one more try after what the new checkpoint
    wrote and every older checkpoint but the newest complete one (and, for a checkpoint inside an epoch, the
    newest at an epoch's end: :func:`prune_plan`) are deleted (a warning names them): a folder with room for two
    checkpoints (three with checkpoints inside epochs) then keeps training; with room for fewer the error says
    how much one needs.

    Args:
        storage: the checkpoint dir.
        local_dir: the folder holding the TensorFlow files (subfolders allowed; no ``checkpoint.json``).
        meta: the checkpoint's meta; its ``files`` are replaced by those of ``local_dir`` (size, CRC32C).
        keep: complete checkpoints to keep, the new one included (>= 1); None = all.
        transfers: parallel uploads (>= 1).
        inside: steps into the epoch after ``meta.epoch`` (a checkpoint inside an epoch), else 0.

    Returns:
        str: the checkpoint's folder name, ``epoch-000003`` (``epoch-000003-000120`` inside an epoch).

    Raises:
        ConfigError: ``keep`` or ``transfers`` < 1, or ``local_dir`` holds a ``checkpoint.json``.
        StorageError: ``local_dir`` is not a folder or is empty, or a file cannot be uploaded intact (the
            checkpoint is then not committed), or there is no room for it even after the pruning above
            (:func:`no_room`).
    """
    check_keep(keep)
    check_transfers(transfers)
    items = local_entries(local_dir)
    if not items:
        raise StorageError(f"{local_dir}: the checkpoint to commit holds no file", key="local_path",
                           value=str(local_dir))
    try:
        meta = dataclasses.replace(meta, files=tuple(entry for _path, entry in items))
    except ConfigError as e:
        raise ConfigError(f"{local_dir}: {e}") from None
    folder, position = folder_name(meta.epoch, inside), (meta.epoch, inside)
    sets = checkpoint_sets(storage)
    before = sets.folders()
    marker = meta.dumps().encode("utf-8")
    try:
        sets.commit(folder, items, marker, transfers=transfers, before=before)
    except StorageError as e:
        if not out_of_space(e):
            raise
        sets.delete(folder, sets.folders().get(folder, {}))  # what of the new one did fit
        freed = _prune(sets, position, 2, before)  # the newest complete checkpoint stays
        if not freed:
            raise no_room(storage, folder, items) from None
        logger.warning(f"checkpoint: no room in {storage.url} for {folder}; removed the older checkpoint(s) "
                       f"{', '.join(freed)} before the new one is committed (the newest complete one is kept) and "
                       "trying again")
        try:
            sets.commit(folder, items, marker, transfers=transfers)
        except StorageError as again:
            raise (no_room(storage, folder, items) if out_of_space(again) else again) from None
    _prune(sets, position, keep, before)
    return folder


def out_of_space(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says the store is full: ENOSPC or EDQUOT, or their
    text in a message that carries another process's or a client's error."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def no_room(storage: Storage, folder: str, items: list) -> StorageError:
    """The error for a checkpoint the store has no room for: its size, the free space where it is known (a
    local folder), and what to do."""
    size = sum(entry.size for _path, entry in items)
    free = ""
    root = getattr(storage, "root", None)
    if root is not None:
        with contextlib.suppress(OSError):
            free = f" ({human_size(shutil.disk_usage(root).free)} free there now)"
    kept, room = "the newest complete one, which is kept", "two checkpoints"
    if steps_inside(folder):  # the newest at an epoch's end stays too (prune_plan)
        kept = "the newest complete one and the newest at an epoch's end, which are kept"
        room = "three checkpoints (two without --checkpoint-every)"
    return StorageError(f"no room for checkpoint {folder} in {storage.url}: it needs {human_size(size)}{free}, "
                        f"and no older checkpoint is left to remove but {kept}. Free space there, or give a "
                        f"--checkpoint-dir with room for {room}, then run the same command again: it resumes from "
                        "the newest complete checkpoint")
