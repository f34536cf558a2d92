"""Training checkpoints in ``--checkpoint-dir``: the storage side (no TensorFlow here).

After every epoch the chief's TensorFlow process writes a checkpoint (weights and optimizer state) into a
local folder and :func:`commit` publishes it; a job launched again, or a barrier stage launched again after
a lost worker, finds the newest one with :func:`latest`, refuses a foreign one with
:func:`check_compatible`, and every worker fetches it with :func:`download`. The driver imports this
module, so it never imports TensorFlow: it moves files and reads ``checkpoint.json``.

Layout of the checkpoint dir (a local folder every host sees, or ``gs://bucket/prefix``, through
:func:`spark_imagenet.storage.open_storage`)::

    CHECKPOINT_DIR/
      epoch-000001/                  # one folder per checkpoint: the completed epoch, 6 digits
        ckpt.index                   # the TensorFlow files, whatever their names (subfolders allowed)
        ckpt.data-00000-of-00001
        checkpoint.json              # the CheckpointMeta, written last: the commit point
      epoch-000002/
        ...

A folder counts as a checkpoint only when its ``checkpoint.json`` exists, is JSON, and every file it lists
exists with the listed size; anything else (an upload cut short, a folder being pruned) is half-written
and never taken as the latest. A commit first deletes its own folder's ``checkpoint.json`` (an epoch
trained again after a crash reuses the folder), so files of two uploads whose sizes happen to match, as
every epoch's do, never count as one checkpoint. Pruning deletes a folder's ``checkpoint.json`` first too.

``checkpoint.json`` (``format_version`` 1)::

    {
      "format": "spark-imagenet-checkpoint",
      "format_version": 1,
      "epoch": 3, "epochs": 90, "step": 3753,
      "dataset_id": "<the manifest's dataset_id>", "model": "alexnet", "width": 1.0,
      "image_size": 224, "num_classes": 1000, "workers": 8, "batch_size": 128, "seed": 0,
      "learning_rate": 0.01, "optimizer": "sgd", "precision": "float32",
      "files": [{"name": "ckpt.index", "size": 1234, "crc32c": "<base64>"}, ...],
      "history": {"loss": [6.1, 5.2, 4.8], "val_top1": [0.02, 0.05, 0.09]},
      "created": "2026-12-01T18:00:00Z"
    }
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from spark_imagenet.errors import AccessError, ConfigError, IntegrityError, StorageError
from spark_imagenet.storage import DEFAULT_TRANSFERS, LocalStorage, ObjectInfo, Storage, crc32c_file

META_NAME = "checkpoint.json"
FORMAT = "spark-imagenet-checkpoint"
FORMAT_VERSION = 1
#: Complete checkpoints :func:`commit` keeps by default (the new one included).
DEFAULT_KEEP = 2
#: Tries of a transfer whose bytes do not match (the first and one more).
ATTEMPTS = 2
#: What to do about a checkpoint this job cannot resume from.
REMEDY = "use another --checkpoint-dir, or remove the old checkpoints (its epoch-* folders) to start afresh"
#: The settings a checkpoint must share with the job that resumes from it, and the option (or the source)
#: that sets each in that job, for messages. ``epochs`` is not here: see :func:`check_compatible`.
OPTIONS = {
    "dataset_id": "the dataset's manifest",
    "num_classes": "the dataset's classes",
    "model": "--model",
    "width": "--width",
    "image_size": "--image-size",
    "workers": "--workers",
    "batch_size": "--batch-size",
    "seed": "--seed",
    "learning_rate": "--learning-rate",
    "optimizer": "--optimizer",
    "precision": "--precision",
}
#: Fields a ``checkpoint.json`` written before they existed lacks, and the value such a run had.
DEFAULTS = {"optimizer": "sgd", "precision": "float32"}
#: Why a field must match, where it is not plain (added to the message).
_WHY = {"workers": "the global batch (batch_size x workers), the steps per epoch and each worker's shards "
                   "depend on it",
        "optimizer": "the optimizer's saved state differs (SGD and LARS keep different slots)",
        "precision": "mixed_float16 adds a loss-scale optimizer, whose state the checkpoint does or does not hold"}
_FOLDER = re.compile(r"epoch-(\d{6,})")
#: Integer fields and their minimum.
_INTS = {"epoch": 1, "epochs": 1, "step": 0, "image_size": 1, "num_classes": 1, "workers": 1, "batch_size": 1,
         "seed": 0}
_FLOATS = ("width", "learning_rate")
_STRINGS = ("dataset_id", "model", "created", "optimizer", "precision")


def utc_now() -> str:
    """The current UTC time as ``2026-12-01T18:00:00Z`` (the form of :attr:`CheckpointMeta.created`)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def folder_name(epoch: int) -> str:
    """The folder of the checkpoint of ``epoch``: ``epoch-000003``."""
    return f"epoch-{epoch:06d}"


def folder_epoch(name: str) -> int | None:
    """The epoch a checkpoint folder's name stands for (``epoch-000003`` -> 3); None for any other name."""
    m = _FOLDER.fullmatch(name)
    return int(m.group(1)) if m and folder_name(int(m.group(1))) == name else None


class CheckpointFile(NamedTuple):
    """One TensorFlow file of a checkpoint.

    Attributes:
        name: path relative to the checkpoint's folder, ``/``-separated.
        size: size in bytes.
        crc32c: CRC32C in the form of :func:`spark_imagenet.storage.crc32c_bytes`.
    """

    name: str
    size: int
    crc32c: str


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

    @classmethod
    def from_config(cls, config: Any, *, dataset_id: str, num_classes: int) -> "RunSettings":
        """The settings of a job.

        Args:
            config: a :class:`~spark_imagenet.training.config.TrainConfig` (any object with its attributes
                ``model``, ``width``, ``image_size``, ``workers``, ``batch_size``, ``seed``,
                ``learning_rate``, ``epochs``, ``optimizer`` and ``precision``).
            dataset_id: the dataset manifest's ``dataset_id``.
            num_classes: the dataset's class count.

        Returns:
            RunSettings: the job's values.
        """
        return cls(dataset_id=dataset_id, num_classes=num_classes,
                   **{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)
                      if f.name not in ("dataset_id", "num_classes")})


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


def _problems(meta: "CheckpointMeta") -> list[str]:
    """What is wrong with a meta's values (pure): one line per field."""
    problems = []
    for name, minimum in _INTS.items():
        value = getattr(meta, name)
        if not _is_int(value) or value < minimum:
            problems.append(f"{name} must be an integer >= {minimum}, got {value!r}")
    for name in _FLOATS:
        value = getattr(meta, name)
        if not _is_number(value) or not math.isfinite(value) or value <= 0:
            problems.append(f"{name} must be a number > 0, got {value!r}")
    for name in _STRINGS:
        if not isinstance(getattr(meta, name), str) or not getattr(meta, name):
            problems.append(f"{name} must be a non-empty string, got {getattr(meta, name)!r}")
    if not problems and meta.epoch > meta.epochs:
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


@dataclasses.dataclass(frozen=True)
class CheckpointMeta:
    """A parsed ``checkpoint.json``: what a checkpoint holds and which run wrote it. Validated when built.

    Attributes:
        epoch: completed epochs (>= 1, counted from 1 as Keras prints them).
        epochs: the run's total epochs (``--epochs``), ``>= epoch``.
        step: global optimizer steps done (>= 0).
        dataset_id: the dataset manifest's ``dataset_id``.
        model: ``--model``.
        width: ``--width`` (> 0).
        image_size: ``--image-size``.
        num_classes: the dataset's class count.
        workers: ``--workers``.
        batch_size: ``--batch-size`` (per worker).
        seed: ``--seed``.
        learning_rate: ``--learning-rate`` (> 0).
        optimizer: ``--optimizer`` (``"sgd"`` in a ``checkpoint.json`` without it).
        precision: ``--precision`` (``"float32"`` in a ``checkpoint.json`` without it).
        files: the TensorFlow files, names relative to the checkpoint's folder (:func:`commit` fills it).
        history: the Keras history of the epochs so far, ``{"loss": [per epoch], ...}`` (at most ``epoch``
            values per key; a metric computed every other epoch has fewer).
        created: ISO-8601 UTC time, ``2026-12-01T18:00:00Z`` (default: now).

    Raises:
        ConfigError: a value of the wrong type or out of range (every one is named).
    """

    epoch: int
    epochs: int
    step: int
    dataset_id: str
    model: str
    width: float
    image_size: int
    num_classes: int
    workers: int
    batch_size: int
    seed: int
    learning_rate: float
    optimizer: str = DEFAULTS["optimizer"]
    precision: str = DEFAULTS["precision"]
    files: tuple[CheckpointFile, ...] = ()
    history: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    created: str = dataclasses.field(default_factory=utc_now)

    def __post_init__(self) -> None:
        if isinstance(self.files, (list, tuple)):  # (name, size, crc32c) triples as CheckpointFile
            object.__setattr__(self, "files", tuple(
                CheckpointFile(*f) if isinstance(f, (list, tuple)) and len(f) == 3 else f for f in self.files))
        if isinstance(self.history, dict):
            object.__setattr__(self, "history", {k: [float(x) if _is_number(x) else x for x in v]
                                                 if isinstance(v, (list, tuple)) else v
                                                 for k, v in self.history.items()})
        for name in _FLOATS:
            if _is_int(getattr(self, name)):
                object.__setattr__(self, name, float(getattr(self, name)))
        problems = _problems(self)
        if problems:
            raise ConfigError("invalid checkpoint meta: " + "; ".join(problems))

    @classmethod
    def create(cls, settings: RunSettings, *, epoch: int, step: int,
               history: dict[str, list[float]] | None = None) -> "CheckpointMeta":
        """The meta of a job's checkpoint after ``epoch`` (``files`` empty: :func:`commit` fills them).

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

    def to_json(self) -> dict[str, Any]:
        """The meta as a JSON-serialisable dict (format of the module doc)."""
        data = {"format": FORMAT, "format_version": FORMAT_VERSION}
        data.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        data["files"] = [f._asdict() for f in self.files]
        data["history"] = {k: list(v) for k, v in self.history.items()}
        return data

    def dumps(self) -> str:
        """The meta as indented JSON text."""
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, data: Any, where: str = META_NAME) -> "CheckpointMeta":
        """Parse and validate a ``checkpoint.json`` dict.

        Args:
            data: the decoded JSON.
            where: the file, named in error messages.

        Returns:
            CheckpointMeta: the meta.

        Raises:
            ConfigError: another format or format version (says what to do), or a missing or invalid field.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{where}: not a spark-imagenet checkpoint (expected \"format\": \"{FORMAT}\"); "
                              f"{REMEDY}")
        if data.get("format_version") != FORMAT_VERSION:
            raise ConfigError(f"{where}: format_version {data.get('format_version')!r} is not supported by this "
                              f"version of spark-imagenet (which reads {FORMAT_VERSION}); resume with the version "
                              f"that wrote it, or {REMEDY}")
        data = {**DEFAULTS, **data}  # written before these fields existed: the values such a run had
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}; {REMEDY}")
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
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{where}: not valid JSON ({e}); {REMEDY}") from None
        return cls.from_json(data, where)


def describe(meta: CheckpointMeta) -> str:
    """A checkpoint for log lines: ``the checkpoint of epoch 1 (step 12, 2026-12-01T18:00:00Z)``."""
    return f"the checkpoint of epoch {meta.epoch} (step {meta.step}, {meta.created})"


def differences(meta: CheckpointMeta, expected: RunSettings) -> list[str]:
    """Why a job cannot resume from a checkpoint, one line per reason (pure; empty: it can).

    Args:
        meta: the checkpoint.
        expected: the job's values.

    Returns:
        list[str]: e.g. ``"--image-size 224 in the checkpoint, 128 in this job"``, in :data:`OPTIONS` order,
        then the epochs rule.
    """
    lines = []
    for field, option in OPTIONS.items():
        ours, theirs = getattr(meta, field), getattr(expected, field)
        if ours != theirs:
            label = option if option.startswith("--") else f"{field} ({option})"
            why = f" ({_WHY[field]})" if field in _WHY else ""
            lines.append(f"{label} {ours!r} in the checkpoint, {theirs!r} in this job{why}")
    if meta.epoch > expected.epochs:
        lines.append(f"--epochs {expected.epochs} in this job, but the checkpoint has completed {meta.epoch} "
                     f"epoch(s) (give --epochs {meta.epoch} or more to resume from it)")
    return lines


def check_compatible(meta: CheckpointMeta, expected: RunSettings, where: str) -> None:
    """Refuse to resume a job from a checkpoint another run wrote.

    Must match: the dataset (its ``dataset_id`` and class count), ``--model``, ``--width``,
    ``--image-size``, ``--batch-size``, ``--seed``, ``--learning-rate``, ``--optimizer``, ``--precision``
    and ``--workers`` (the optimizer and precision decide which optimizer state the checkpoint holds). A different
    worker count is refused: the global batch (``batch_size x workers``), the steps per epoch (so what
    ``step`` means) and which shards each worker reads (so the data order) all depend on it; TensorFlow
    would restore the weights, but the run would not be the one the checkpoint belongs to, and a run launched
    again after a lost worker keeps its count anyway. A different ``--epochs`` (the run's total) is allowed,
    to extend a run, as long as the checkpoint's completed epochs are at most the new total (equal: nothing
    is left to train).

    Args:
        meta: the checkpoint.
        expected: the job's values (:meth:`RunSettings.from_config`).
        where: the checkpoint, for the message (e.g. the URL of its ``checkpoint.json``).

    Raises:
        ConfigError: the job differs; the message names ``where``, every differing field with the checkpoint's
            value, the job's and the option that sets it, and what to do.
    """
    lines = differences(meta, expected)
    if lines:
        raise ConfigError(f"{where}: this job cannot resume from {describe(meta)}: " + "; ".join(lines)
                          + f". Run with the checkpoint's values to resume from it, or {REMEDY}")


# ------------------------------------------------------------------ reading the checkpoint dir
def _listing(storage: Storage) -> list[ObjectInfo]:
    """Every object of the checkpoint folder.

    Raises:
        StorageError: the folder cannot be listed (an unreadable entry or a symbolic-link loop in it).
    """
    try:
        return storage.list()
    except OSError as e:
        raise StorageError(f"cannot list the checkpoint folder {storage.url} ({e.strerror or e}: "
                           f"{e.filename or ''}); give --checkpoint-dir a folder of its own, which holds only "
                           "checkpoints") from None


def _group(objects: Sequence[ObjectInfo]) -> dict[str, dict[str, ObjectInfo]]:
    """``{checkpoint folder: {name inside it: object}}`` of a listing; other objects are left out (pure)."""
    groups: dict[str, dict[str, ObjectInfo]] = {}
    for o in objects:
        folder, sep, rest = o.name.partition("/")
        if sep and rest and folder_epoch(folder) is not None:
            groups.setdefault(folder, {})[rest] = o
    return groups


def _incomplete(meta: CheckpointMeta, objects: dict[str, ObjectInfo]) -> str | None:
    """Why a checkpoint's listed files are not all there with their sizes, or None when they are (pure)."""
    for f in meta.files:
        info = objects.get(f.name)
        if info is None:
            return f"{f.name} is missing"
        if info.size != f.size:
            return f"{f.name} holds {info.size} bytes, {META_NAME} says {f.size}"
    return None


def _read_meta(storage: Storage, folder: str) -> CheckpointMeta | None:
    """A folder's meta; None when it is gone or not JSON (a half-written or damaged file).

    Raises:
        ConfigError: JSON of another format or version, or invalid (see :meth:`CheckpointMeta.from_json`).
        StorageError: the object exists and cannot be read.
    """
    name = f"{folder}/{META_NAME}"
    try:
        text = storage.read_bytes(name)
    except StorageError:
        if storage.exists(name):
            raise
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return CheckpointMeta.from_json(data, storage.where(name))


def latest(storage: Storage, *, log: Callable[[str], None] | None = None) -> tuple[str, CheckpointMeta] | None:
    """The newest complete checkpoint of a checkpoint dir.

    Folders are tried from the highest epoch down; a half-written one (no ``checkpoint.json``, one that is
    not JSON, or a listed file missing or of another size) is skipped.

    Args:
        storage: the checkpoint dir.
        log: called with a line for every folder skipped; None = silent.

    Returns:
        tuple[str, CheckpointMeta] | None: the folder's name (``epoch-000003``) and its meta; None when
        there is no complete checkpoint.

    Raises:
        ConfigError: a ``checkpoint.json`` that is JSON but of another format or version, invalid, or in
            a folder of another epoch: the message names the file and what to do.
        StorageError: the dir cannot be listed or read.
    """
    groups = _group(_listing(storage))
    for folder in sorted(groups, key=folder_epoch, reverse=True):
        reason = None
        meta = _read_meta(storage, folder) if META_NAME in groups[folder] else None
        if meta is None:
            reason = f"no readable {META_NAME}"
        elif meta.epoch != folder_epoch(folder):
            raise ConfigError(f"{storage.where(f'{folder}/{META_NAME}')}: holds the checkpoint of epoch "
                              f"{meta.epoch}, not {folder_epoch(folder)} as its folder says; {REMEDY}")
        else:
            reason = _incomplete(meta, groups[folder])
        if reason is None:
            return folder, meta
        if log:
            log(f"skipping the half-written checkpoint {storage.where(folder)}: {reason}")
    return None


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


# ------------------------------------------------------------------ transfers
def _fatal(errors: Sequence[BaseException | None], names: Sequence[str], what: str) -> StorageError | None:
    """The error that ends a batch of transfers now: an AccessError as it is, else any failure that is not a
    checksum mismatch (the client retried those already), naming the files; None when all may be retried."""
    denied = next((e for e in errors if isinstance(e, AccessError)), None)
    if denied is not None:
        return denied
    fatal = [(n, e) for n, e in zip(names, errors) if e is not None and not isinstance(e, IntegrityError)]
    if not fatal:
        return None
    return StorageError(f"{len(fatal)} file(s) {what}: " + "; ".join(f"{n}: {e}" for n, e in fatal[:5])
                        + (f"; ... and {len(fatal) - 5} more" if len(fatal) > 5 else ""))


def _local_files(local_dir: str | os.PathLike) -> list[tuple[str, str]]:
    """``(path, name relative to local_dir)`` of every file under ``local_dir``, sorted by name.

    Raises:
        StorageError: not a folder, or an empty one.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise StorageError(f"{root}: the checkpoint to commit is not a folder")
    pairs = sorted(((os.path.join(folder, f), Path(folder, f).relative_to(root).as_posix())
                    for folder, _dirs, files in os.walk(root) for f in files), key=lambda p: p[1])
    if not pairs:
        raise StorageError(f"{root}: the checkpoint to commit holds no file")
    return pairs


def _upload_problem(storage: Storage, name: str, f: CheckpointFile) -> str | None:
    """Why an uploaded object is not ``f`` (size, and CRC32C where the store reports one), or None."""
    info = storage.stat(name)
    if info is None:
        return "the object is not there after the upload"
    if info.size != f.size:
        return f"{info.size} bytes stored, {f.size} written"
    if info.crc32c is not None and info.crc32c != f.crc32c:
        return f"the store reports crc32c {info.crc32c}, the file's is {f.crc32c}"
    return None


def _upload(storage: Storage, folder: str, todo: list[tuple[str, CheckpointFile]], transfers: int) -> None:
    """Upload ``(local path, file)`` pairs into ``folder``, verify each, and upload a mismatch once more.

    Raises:
        StorageError: a file that cannot be uploaded, or still does not match (each one named).
    """
    problems: dict[str, list[str]] = {}
    for attempt in range(1, ATTEMPTS + 1):
        if not todo:
            return
        names = [f"{folder}/{f.name}" for _path, f in todo]
        errors = storage.put_files([(path, name) for (path, _f), name in zip(todo, names)], transfers)
        stop = _fatal(errors, names, f"of the checkpoint could not be uploaded to {storage.url}; it was not "
                                     "committed")
        if stop is not None:
            raise stop
        failed = []
        for (path, f), name, err in zip(todo, names, errors):
            why = str(err) if err is not None else _upload_problem(storage, name, f)
            if why is not None:
                problems.setdefault(f.name, []).append(f"attempt {attempt}: {why}")
                failed.append((path, f))
        todo = failed
    if todo:
        raise StorageError(f"{len(todo)} file(s) of the checkpoint could not be uploaded intact to "
                           f"{storage.where(folder)}; it was not committed: "
                           + "; ".join(f"{f.name} ({', '.join(problems[f.name])})" for _p, f in todo))


def _download_problem(path: Path, f: CheckpointFile) -> str | None:
    """Why a downloaded file is not ``f`` (size, CRC32C), or None."""
    size = path.stat().st_size
    if size != f.size:
        return f"{size} bytes, {META_NAME} says {f.size}"
    crc = crc32c_file(path)
    if crc != f.crc32c:
        return f"crc32c {crc}, {META_NAME} says {f.crc32c}"
    return None


def download(storage: Storage, name: str, meta: CheckpointMeta, local_dir: str | os.PathLike, *,
             transfers: int = DEFAULT_TRANSFERS) -> str:
    """Fetch a checkpoint into a local folder and verify every file against its meta.

    A file whose size or CRC32C differs is fetched once more; ``checkpoint.json`` is written into
    ``local_dir`` last (:func:`read_local` reads it).

    Args:
        storage: the checkpoint dir.
        name: the checkpoint's folder, as :func:`latest` returns it (``epoch-000003``).
        meta: its meta (:func:`latest`'s).
        local_dir: the local folder (created; files already there are overwritten).
        transfers: parallel downloads (>= 1).

    Returns:
        str: the path TensorFlow restores from (:func:`tf_prefix`), e.g. ``local_dir/ckpt``.

    Raises:
        StorageError: a file cannot be fetched, or still differs from the meta after a second fetch (each
            one named, with its size or CRC32C and the meta's), or ``local_dir`` cannot be written.
        ConfigError: ``transfers`` < 1.
    """
    if transfers < 1:
        raise ConfigError(f"--transfers {transfers}: must be at least 1")
    local = Path(local_dir)
    problems: dict[str, list[str]] = {}
    todo = list(meta.files)
    try:
        for attempt in range(1, ATTEMPTS + 1):
            if not todo:
                break
            for f in todo:
                (local / f.name).parent.mkdir(parents=True, exist_ok=True)
            names = [f"{name}/{f.name}" for f in todo]
            errors = storage.get_files([(n, str(local / f.name)) for n, f in zip(names, todo)], transfers)
            stop = _fatal(errors, [storage.where(n) for n in names], "of the checkpoint could not be fetched")
            if stop is not None:
                raise stop
            failed = []
            for f, err in zip(todo, errors):
                why = str(err) if err is not None else _download_problem(local / f.name, f)
                if why is not None:
                    problems.setdefault(f.name, []).append(f"attempt {attempt}: {why}")
                    failed.append(f)
            todo = failed
        if todo:
            for f in todo:
                with contextlib.suppress(OSError):
                    (local / f.name).unlink()
            raise StorageError(f"{storage.where(name)}: {len(todo)} file(s) of {describe(meta)} do not match its "
                               f"{META_NAME}: " + "; ".join(f"{f.name} ({', '.join(problems[f.name])})" for f in todo)
                               + f". The checkpoint is damaged: remove {storage.where(name)} to resume from the one "
                               "before it")
        (local / META_NAME).write_text(meta.dumps())
    except OSError as e:
        raise StorageError(f"{local}: cannot write the checkpoint there ({e.strerror or e})") from None
    return tf_prefix(local, meta)


# ------------------------------------------------------------------ committing and pruning
def _delete_folder(storage: Storage, folder: str, objects: dict[str, ObjectInfo],
                   log: Callable[[str], None] | None) -> None:
    """Delete a checkpoint folder, its ``checkpoint.json`` first; a failure is logged, not raised (the
    commit it follows is done)."""
    names = sorted(objects, key=lambda n: n != META_NAME)
    try:
        for n in names:
            storage.delete(f"{folder}/{n}")
    except StorageError as e:
        if log:
            log(f"could not remove the old checkpoint {storage.where(folder)}: {e}")
        return
    _remove_empty_local_dirs(storage, folder)


def _remove_empty_local_dirs(storage: Storage, folder: str) -> None:
    """Remove a local checkpoint folder's empty directories (buckets have none)."""
    if not isinstance(storage, LocalStorage):
        return
    top = storage.root / folder
    for path, _dirs, _files in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(path)


def prune_plan(epoch: int, keep: int | None, states: dict[str, bool]) -> list[str]:
    """Which folders a commit of ``epoch`` deletes (pure).

    Args:
        epoch: the epoch just committed.
        keep: complete checkpoints to keep, the new one included; None = all.
        states: ``{folder: complete?}`` of the other checkpoint folders.

    Returns:
        list[str]: the folders older than ``epoch`` that are half-written, or complete beyond the newest
        ``keep``; newer folders are never deleted.
    """
    older = sorted((f for f in states if folder_epoch(f) < epoch), key=folder_epoch, reverse=True)
    complete = [f for f in older if states[f]]
    extra = complete[max(keep - 1, 0):] if keep is not None else []
    return [f for f in older if not states[f] or f in extra]


def _prune(storage: Storage, epoch: int, keep: int | None, log: Callable[[str], None] | None) -> None:
    """Delete the folders :func:`prune_plan` names; a folder whose meta is of another format is left alone."""
    groups = _group(_listing(storage))
    states = {}
    for folder, objects in groups.items():
        if folder_epoch(folder) >= epoch:
            continue
        try:
            meta = _read_meta(storage, folder) if META_NAME in objects else None
        except (ConfigError, StorageError) as e:
            if log:
                log(f"leaving {storage.where(folder)} alone: {e}")
            continue
        states[folder] = meta is not None and _incomplete(meta, objects) is None
    for folder in prune_plan(epoch, keep, states):
        _delete_folder(storage, folder, groups[folder], log)


def commit(storage: Storage, local_dir: str | os.PathLike, meta: CheckpointMeta, *, keep: int | None = DEFAULT_KEEP,
           transfers: int = DEFAULT_TRANSFERS, log: Callable[[str], None] | None = None) -> str:
    """Publish the checkpoint the chief wrote into ``local_dir`` as ``epoch-{meta.epoch:06d}/``.

    In order: the folder's old ``checkpoint.json`` and any file the new checkpoint does not have are deleted
    (an epoch trained again reuses its folder), every file of ``local_dir`` is uploaded and verified (size,
    and CRC32C where the store reports one; a mismatch is uploaded once more), ``checkpoint.json`` is
    written (the commit point), then older folders are pruned: complete checkpoints beyond the newest
    ``keep`` and half-written ones (a prune that fails is logged; the commit stands).

    Args:
        storage: the checkpoint dir.
        local_dir: the folder holding the TensorFlow files (subfolders allowed; no ``checkpoint.json``).
        meta: the checkpoint's meta; its ``files`` are replaced by those of ``local_dir`` (size, CRC32C).
        keep: complete checkpoints to keep, the new one included (>= 1); None = all.
        transfers: parallel uploads (>= 1).
        log: called with a line about a folder that could not be pruned; None = silent.

    Returns:
        str: the checkpoint's folder name, ``epoch-000003``.

    Raises:
        ConfigError: ``keep`` or ``transfers`` < 1, or ``local_dir`` holds a ``checkpoint.json``.
        StorageError: ``local_dir`` is not a folder or is empty, or a file cannot be uploaded intact (the
            checkpoint is then not committed).
    """
    if keep is not None and keep < 1:
        raise ConfigError(f"keep {keep}: a commit keeps at least the new checkpoint (give 1 or more, None = all)")
    if transfers < 1:
        raise ConfigError(f"--transfers {transfers}: must be at least 1")
    pairs = _local_files(local_dir)
    try:
        files = tuple(CheckpointFile(n, os.path.getsize(p), crc32c_file(p)) for p, n in pairs)
    except OSError as e:
        raise StorageError(f"{local_dir}: cannot read the checkpoint to commit ({e})") from None
    try:
        meta = dataclasses.replace(meta, files=files)
    except ConfigError as e:
        raise ConfigError(f"{local_dir}: {e}") from None
    folder = folder_name(meta.epoch)
    new_names = {f.name for f in files}  # never checkpoint.json: the old one is always stale
    stale = [n for n in _group(_listing(storage)).get(folder, {}) if n not in new_names]
    for n in sorted(stale, key=lambda n: n != META_NAME):  # the meta first: the old checkpoint stops counting
        storage.delete(f"{folder}/{n}")
    _upload(storage, folder, [(p, f) for (p, _n), f in zip(pairs, files)], transfers)
    storage.write_bytes(f"{folder}/{META_NAME}", meta.dumps().encode("utf-8"))
    _prune(storage, meta.epoch, keep, log)
    return folder
