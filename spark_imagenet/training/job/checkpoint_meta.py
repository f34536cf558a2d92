"""What a training checkpoint is: its meta (``checkpoint.json``) and whether a job can resume from it.

No TensorFlow and no storage access here: :mod:`spark_imagenet.training.job.checkpoints` moves the files.

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

Version 2 records every field. Version 1, which this module still reads, may lack ``optimizer`` and
``precision`` (:data:`DEFAULTS`) and the recipe and augmentation (:data:`RECIPE_FIELDS`, read as None: not
recorded). A version newer than :data:`FORMAT_VERSION` is refused: upgrade spark-imagenet to read it.

Every value is checked by a rule (:class:`~spark_imagenet.training.job.settings.Rule`): a job setting's by the
setting's own rule (:class:`~spark_imagenet.training.job.config.TrainConfig`), the dataset's id and class count by
the rules every record shares (:data:`~spark_imagenet.training.job.settings.FACTS`), the meta's own fields by
:data:`_OWN_RULES`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from typing import Any, Sequence

from spark_imagenet.errors import ConfigError
from spark_imagenet.storage.committed import Entry
from spark_imagenet.storage.envelope import FORMAT_KEY, VERSION_KEY, Envelope
from spark_imagenet.training.job.settings import FACTS, Rule, check_value

META_NAME = "checkpoint.json"
FORMAT = "spark-imagenet-checkpoint"
#: The version this module writes; it reads every version from 1 to this one.
FORMAT_VERSION = 2
#: What to do about a checkpoint this job cannot resume from.
REMEDY = "use another --checkpoint-dir, or remove the old checkpoints (its epoch-* folders) to start afresh"
#: ``checkpoint.json``'s versioned-JSON form.
ENVELOPE = Envelope(FORMAT, FORMAT_VERSION, "spark-imagenet checkpoint", error=ConfigError, remedy=REMEDY,
                    reads=tuple(range(1, FORMAT_VERSION + 1)))

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
#: Fields a ``checkpoint.json`` of ``format_version`` 1 may lack, and the value such a run had.
DEFAULTS = {"optimizer": "sgd", "precision": "float32"}
#: The recipe and augmentation settings: a ``checkpoint.json`` of ``format_version`` 1 may lack them, read as None
#: (not recorded, so not compared); version 2 records every one. Every one changes the math of the steps to come.
RECIPE_FIELDS = ("lr_schedule", "lr_boundaries", "warmup_epochs", "lr_scaling", "momentum", "weight_decay",
                 "label_smoothing", "flip", "crop_area", "lighting")
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
            recipe as resolved (a model's defaults filled in); None: not recorded (:data:`RECIPE_FIELDS`, only
            in a checkpoint of ``format_version`` 1).
        flip, crop_area, lighting: the augmentation (``--no-flip``, ``--crop-area``, ``--lighting``); None:
            not recorded, as the recipe.
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
    optimizer: str = DEFAULTS["optimizer"]
    precision: str = DEFAULTS["precision"]
    lr_schedule: str | None = None
    lr_boundaries: tuple[float, ...] | None = None
    warmup_epochs: float | None = None
    lr_scaling: str | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    label_smoothing: float | None = None
    flip: bool | None = None
    crop_area: tuple[float, ...] | None = None
    lighting: float | None = None

    def __post_init__(self) -> None:
        for name in ("lr_boundaries", "crop_area"):  # JSON gives lists
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @classmethod
    def from_config(cls, config: Any, *, dataset_id: str, num_classes: int) -> "RunSettings":
        """The settings of a job.

        Args:
            config: a :class:`~spark_imagenet.training.job.config.TrainConfig` (a dataclass of section dataclasses
                whose settings have these names; one without a :data:`RECIPE_FIELDS` setting records None for it).
            dataset_id: the dataset manifest's ``dataset_id``.
            num_classes: the dataset's class count.

        Returns:
            RunSettings: the job's values.
        """
        sections = (getattr(config, s.name) for s in dataclasses.fields(config))
        flat = {f.name: getattr(section, f.name) for section in sections for f in dataclasses.fields(section)}
        values = {f.name: flat.get(f.name) if f.name in RECIPE_FIELDS else flat[f.name]
                  for f in dataclasses.fields(RunSettings) if f.name not in ("dataset_id", "num_classes")}
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


@functools.cache
def _rules() -> dict[str, Rule]:
    """The rule of every value field of a checkpoint's meta (not ``files``, ``history``): a job setting's own rule,
    or :data:`_OWN_RULES`; every one required (a version 1 meta's missing recipe: :func:`_checked_values`)."""
    # imported here: the settings' sections import this module (through checkpoints)
    from spark_imagenet.training.job.config import TrainConfig

    settings = {f.name: f.metadata["rule"] for _, f in TrainConfig.settings()}
    names = [f.name for f in dataclasses.fields(RunSettings)] + ["epoch", "step", "created"]
    return {n: dataclasses.replace(_OWN_RULES.get(n) or settings[n], optional=False) for n in names}


def _checked_values(meta: "CheckpointMeta") -> tuple[dict[str, Any], list[str]]:
    """Each value field of ``meta`` checked by its rule (:func:`_rules`): the converted values, and one problem
    per field that fails (pure). A :data:`RECIPE_FIELDS` field may be None in a meta of ``format_version`` 1."""
    values, problems = {}, []
    for name, rule in _rules().items():
        value = getattr(meta, name)
        if value is None and name in RECIPE_FIELDS and meta.format_version == 1:
            continue
        try:
            values[name] = check_value(name, rule, value, name)  # named by its checkpoint.json key, not its option
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


def _refuse_newer(data: Any, where: str) -> None:
    """Refuse a ``checkpoint.json`` of a ``format_version`` newer than :data:`FORMAT_VERSION`.

    Raises:
        ConfigError: names ``where`` and both versions, and says to upgrade spark-imagenet.
    """
    if not isinstance(data, dict) or data.get(FORMAT_KEY) != FORMAT:
        return
    version = data.get(VERSION_KEY)
    if _is_int(version) and version > FORMAT_VERSION:
        raise ConfigError(f"{where}: format_version {version} is not supported by this version of spark-imagenet "
                          f"(which reads 1 to {FORMAT_VERSION}): a newer spark-imagenet wrote this checkpoint; "
                          f"upgrade spark-imagenet to resume from it, or {REMEDY}")


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
        format_version: the ``checkpoint.json`` version it was read from (default: :data:`FORMAT_VERSION`, what
            this module writes); it is written back in that version.

    The run's settings are checked by their settings' rules (``epochs`` >= ``epoch`` too): every one is required,
    but in a meta of ``format_version`` 1 the :data:`RECIPE_FIELDS` may be None (not recorded; such a
    ``checkpoint.json`` without ``optimizer`` or ``precision`` reads them as ``"sgd"`` and ``"float32"``).

    Raises:
        ConfigError: a value of the wrong type or out of range (every one is named).
    """

    epoch: int
    step: int
    files: tuple[CheckpointFile, ...] = ()
    history: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    created: str = dataclasses.field(default_factory=utc_now)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.files, (list, tuple)):  # (name, size, crc32c) triples as CheckpointFile
            object.__setattr__(self, "files", tuple(
                CheckpointFile(*f) if isinstance(f, (list, tuple)) and len(f) == 3 else f for f in self.files))
        if isinstance(self.history, dict):
            object.__setattr__(self, "history", {k: [float(x) if _is_number(x) else x for x in v]
                                                 if isinstance(v, (list, tuple)) else v
                                                 for k, v in self.history.items()})
        if self.format_version not in ENVELOPE.reads:
            raise ConfigError(f"invalid checkpoint meta: format_version {self.format_version!r} is not one of "
                              f"{', '.join(map(str, ENVELOPE.reads))}")
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
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "format_version"}
        body["files"] = [f._asdict() for f in self.files]
        body["history"] = {k: list(v) for k, v in self.history.items()}
        for name in ("lr_boundaries", "crop_area"):
            if body[name] is not None:
                body[name] = list(body[name])
        return body

    def _envelope(self) -> Envelope:
        """:data:`ENVELOPE` at this meta's ``format_version``."""
        return dataclasses.replace(ENVELOPE, version=self.format_version)

    def to_json(self) -> dict[str, Any]:
        """The meta as a JSON-serialisable dict (format of the module doc), in its ``format_version``."""
        return self._envelope().to_json(self._body())

    def dumps(self) -> str:
        """The meta as indented JSON text, in its ``format_version``."""
        return self._envelope().dumps(self._body())

    @classmethod
    def from_json(cls, data: Any, where: str = META_NAME) -> "CheckpointMeta":
        """Parse and validate a ``checkpoint.json`` dict.

        Args:
            data: the decoded JSON.
            where: the file, named in error messages.

        Returns:
            CheckpointMeta: the meta.

        Raises:
            ConfigError: another format, a format version newer than this module reads (says to upgrade
                spark-imagenet) or older than 1, or a missing or invalid field (version 1 may lack
                :data:`DEFAULTS` and :data:`RECIPE_FIELDS`).
        """
        _refuse_newer(data, where)
        version = ENVELOPE.version_of(data, where)
        data = ENVELOPE.from_json(data, where)
        if version == 1:  # may lack these fields: the values such a run had, or None (not recorded)
            data = {**DEFAULTS, **dict.fromkeys(RECIPE_FIELDS), **data}
        names = [f.name for f in dataclasses.fields(cls) if f.name != "format_version"]
        missing = [n for n in names if n not in data]
        if missing:
            raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}; {REMEDY}")
        try:
            files = tuple(CheckpointFile(f["name"], f["size"], f["crc32c"]) for f in data["files"])
            return cls(**{**{n: data[n] for n in names}, "files": files, "format_version": version})
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
        if field in RECIPE_FIELDS and ours is None:
            continue  # a checkpoint of format_version 1 that did not record it
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
    every setting that changes the math of the steps to come (:data:`RECIPE_FIELDS`: the schedule, warm-up,
    learning-rate scaling, momentum, weight decay, label smoothing and augmentation) that the checkpoint
    records; ``--warmup-epochs`` and ``--lr-boundaries`` only when ``--epochs`` is the checkpoint's, since
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
