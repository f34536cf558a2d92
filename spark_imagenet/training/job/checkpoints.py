"""Training checkpoints in ``--checkpoint-dir``: the storage side (no TensorFlow here).

After every epoch the chief's TensorFlow process writes a checkpoint (weights and optimizer state) into a
local folder and :func:`commit` publishes it; a job launched again, or a barrier stage launched again after
a lost worker, finds the newest one with :func:`latest`, refuses a foreign one with
:func:`check_compatible`, and every worker fetches it with :func:`download`. The driver imports this
module, so it never imports TensorFlow: it moves files and reads ``checkpoint.json``
(:mod:`spark_imagenet.training.job.checkpoint_meta`, whose names this module re-exports).

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

How many checkpoints stay is :func:`commit`'s ``keep`` (default :data:`DEFAULT_KEEP`), and one more: the newest
complete checkpoint at an epoch's end is never pruned while only checkpoints inside the epoch after it are newer
(:func:`prune_plan`). A checkpoint inside an epoch resumes on the worker count that wrote it only
(:func:`check_compatible`); from that one (:func:`latest_at_epoch_end`) a job on another count trains the
interrupted epoch again from its start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import shutil
from pathlib import Path

from spark_imagenet.errors import ConfigError, StorageError
from spark_imagenet.units import human_size
from spark_imagenet.storage import DEFAULT_TRANSFERS, ObjectInfo, Storage
from spark_imagenet.storage.base import check_transfers
from spark_imagenet.storage.committed import CommittedSets, download_verified, local_entries
from spark_imagenet.storage.committed import prune_plan as _sets_prune_plan
from spark_imagenet.training.job.checkpoint_meta import (
    DEFAULTS,
    FORMAT,
    FORMAT_VERSION,
    META_NAME,
    MAY_CHANGE,
    OPTIONS,
    RECIPE_FIELDS,
    REMEDY,
    CheckpointFile,
    CheckpointMeta,
    RunSettings,
    check_compatible,
    describe,
    differences,
    expected_for,
    new_meta,
    utc_now,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULTS", "DEFAULT_KEEP", "FORMAT", "FORMAT_VERSION", "MAY_CHANGE", "META_NAME", "OPTIONS", "RECIPE_FIELDS", "REMEDY", "CheckpointFile",
    "CheckpointMeta", "RunSettings", "check_compatible", "check_keep", "checkpoint_sets", "commit", "describe",
    "differences", "download", "expected_for", "folder_epoch", "folder_name", "folder_position", "latest",
    "latest_at_epoch_end", "new_meta", "prune_plan", "steps_inside",
    "read_local", "tf_prefix", "utc_now",
]

#: Complete checkpoints :func:`commit` keeps by default (the new one included).
DEFAULT_KEEP = 2
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
        raise ConfigError(f"keep {keep}: a commit keeps at least the new checkpoint (give 1 or more, None = all)")
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
                          f"its folder says; {REMEDY}")
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
        raise StorageError(f"{local_dir}: the checkpoint to commit holds no file")
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
