"""Committed object sets: files with size and CRC32C, moved verified, and a marker object written last.

A *committed set* is a group of objects in one :class:`~spark_imagenet.storage.Storage` (a folder of it,
or its root) and one *marker* object that lists them, each as an :class:`Entry` (name, size, CRC32C). It
is written in this order: the folder's old marker is deleted (a set written again reuses its folder), the
files are uploaded and verified, the marker is written. A reader takes a set only when its marker parses
and every file it lists is there with its size (and its CRC32C, where the listing reports one), so a set
an interrupted writer left is never taken as complete.

The pieces, each usable alone:

* :func:`upload_verified`: upload files and check each object's size and CRC32C as the store reports it
  (from the upload's own reply on GCS: no request per object after the uploads); a mismatch is uploaded
  once more, then an error names every object and what differed (the bad objects are deleted).
* :func:`download_verified`: download objects to temporary files beside their targets, check size and
  CRC32C, rename into place; a mismatch is fetched once more, then an error names every object.
* :func:`upload_folder`: :func:`upload_verified` of every file under a local folder.
* :class:`CommittedSets`: the sets of one storage, one per folder with a marker: commit, the complete
  ones newest first, pruning (the newest ``keep`` complete sets stay; incomplete ones and their leftovers go).

Errors that another transfer cannot fix (a missing bucket, 401, 403, a failure the client already retried)
end a batch at once (:func:`spark_imagenet.storage.unretryable`); only a checksum mismatch
(:class:`~spark_imagenet.errors.IntegrityError`) is tried again. Users: the dataset's shards and manifest
(:mod:`spark_imagenet.dataset.transfer`, :mod:`spark_imagenet.dataset.cache`), training checkpoints
(:mod:`spark_imagenet.training.job.checkpoints`) and ``--output``
(:mod:`spark_imagenet.training.job.outputs`).

Example (a marker that is the JSON list of its entries; checkpoints use
:func:`~spark_imagenet.training.job.checkpoints.folder_epoch` as ``key``)::

    >>> import json
    >>> from spark_imagenet.storage import open_storage
    >>> os.makedirs("ckpt"); _ = Path("ckpt/weights.h5").write_bytes(b"w" * 100)
    >>> items = local_entries("ckpt")                     # [(path, Entry(name, size, crc32c)), ...]
    >>> items[0][1][:2]
    ('weights.h5', 100)
    >>> class Marker(NamedTuple):
    ...     files: list
    >>> def parse(folder, data, where):                   # None for a marker that is not complete JSON
    ...     return Marker([Entry(*f) for f in json.loads(data)])
    >>> sets = CommittedSets(open_storage("gs://my-bucket/run/checkpoints"), "checkpoint.json",
    ...                      key=lambda folder: int(folder[6:]) if folder.startswith("epoch-") else None)
    >>> sets.commit("epoch-000003", items, json.dumps([e for _, e in items]).encode())  # files, then the marker
    >>> sets.latest(parse)                                # (folder, parsed marker) or None
    ('epoch-000003', Marker(files=[Entry(name='weights.h5', size=100, crc32c='...')]))
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Protocol, Sequence

from spark_imagenet.errors import IntegrityError, StorageError
from spark_imagenet.storage.base import (
    DEFAULT_TRANSFERS,
    ObjectInfo,
    Storage,
    check_transfers,
    crc32c_file,
    unretryable,
)

logger = logging.getLogger(__name__)

#: Transfers of one object before giving up: the first and one more (for a checksum mismatch only).
ATTEMPTS = 2


class Entry(NamedTuple):
    """One file of a committed set.

    Attributes:
        name: path relative to the set's folder, ``/``-separated.
        size: size in bytes.
        crc32c: CRC32C in the form of :func:`spark_imagenet.storage.crc32c_bytes`.
    """

    name: str
    size: int
    crc32c: str


class Listing(Protocol):
    """What a parsed marker offers the set functions: the entries it lists."""

    files: Sequence[Entry]


def object_name(prefix: str, name: str) -> str:
    """``prefix/name``, or ``name`` when ``prefix`` is empty (a set at the storage's root)."""
    return f"{prefix}/{name}" if prefix else name


def _source(storage: Storage, prefix: str) -> str:
    return storage.where(prefix) if prefix else storage.url


def _tmp_path(path: Path) -> Path:
    """A temporary name beside ``path``, unique to this process and call: ``.<name>.tmp-<pid>-<8 hex>``
    (the form :class:`~spark_imagenet.storage.LocalStorage` leaves out of listings)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _delete_quietly(storage: Storage, names: Sequence[str]) -> None:
    """Delete objects after a failure; a failure to delete is not the message that matters."""
    for name in names:
        with contextlib.suppress(StorageError):
            storage.delete(name, best_effort=True)


def _details(problems: dict[str, list[str]], names: Sequence[str]) -> str:
    """``name (attempt 1: why, attempt 2: why); ...``."""
    return "; ".join(f"{n} ({', '.join(problems[n])})" for n in names)


def local_entries(local_dir: str | os.PathLike) -> list[tuple[str, Entry]]:
    """Every file under a local folder, with its size and CRC32C, sorted by name.

    Args:
        local_dir: the folder (subfolders included).

    Returns:
        list: ``(local path, Entry)`` pairs, names relative to ``local_dir`` (``/``-separated); empty for
        an empty folder.

    Raises:
        StorageError: ``local_dir`` is not a folder, or a file in it cannot be read (names it; ``key``
            ``"local_path"``, ``value`` that folder or file).
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise StorageError(f"{root}: not a folder", key="local_path", value=str(root))
    out = []
    for folder, _dirs, files in os.walk(root):
        for f in files:
            path = os.path.join(folder, f)
            try:
                entry = Entry(Path(path).relative_to(root).as_posix(), os.path.getsize(path), crc32c_file(path))
            except OSError as e:
                raise StorageError(f"{path}: cannot read it ({e.strerror or e})", key="local_path",
                                   value=path) from None
            out.append((path, entry))
    return sorted(out, key=lambda pair: pair[1].name)


def intact(storage: Storage, info: ObjectInfo | None, entry: Entry) -> bool:
    """Whether an object, as a listing or stat reported it, holds ``entry``: its size, and its CRC32C from
    ``info`` or (stores that keep none) computed by reading the object.

    Raises:
        StorageError: the object cannot be read (local stores only).
    """
    if info is None or info.size != entry.size:
        return False
    crc = info.crc32c if info.crc32c is not None else storage.crc32c(info.name)
    return crc == entry.crc32c


def _stored_mismatch(info: ObjectInfo, entry: Entry, reference: str) -> str | None:
    """Why an uploaded object (as the store reports it) is not ``entry``, or None."""
    if info.size != entry.size:
        return f"the bucket holds {info.size} bytes, {reference} says {entry.size}"
    if info.crc32c != entry.crc32c:
        return f"the bucket reports crc32c {info.crc32c}, {reference} says {entry.crc32c}"
    return None


def _local_mismatch(path: Path, entry: Entry, reference: str) -> str | None:
    """Why a downloaded file is not ``entry``, or None.

    Raises:
        OSError: the file cannot be read.
    """
    size = path.stat().st_size
    if size != entry.size:
        return f"{size} bytes, {reference} says {entry.size}"
    crc = crc32c_file(path)
    if crc != entry.crc32c:
        return f"crc32c {crc}, {reference} says {entry.crc32c}"
    return None


def upload_verified(storage: Storage, items: Sequence[tuple[str | os.PathLike, Entry]], *, prefix: str = "",
                    transfers: int = DEFAULT_TRANSFERS, noun: str = "file", reference: str = "the local file",
                    uncommitted: str = "nothing was committed", announce: bool = False) -> list[ObjectInfo]:
    """Upload local files as objects and verify each against its entry; a mismatch is uploaded once more.

    The store's own view is checked (size and CRC32C), as :meth:`Storage.put_files_info` returns it: on
    GCS from each upload's reply (no request after the uploads), locally by reading the object back.

    Args:
        storage: the destination.
        items: ``(local path, Entry)``: the file and the name (under ``prefix``), size and CRC32C the
            object must have.
        prefix: the set's folder (``""``: the storage's root).
        transfers: uploads in parallel (>= 1).
        noun: what one object is, for messages (``"shard"``, ``"file"``).
        reference: where the expected size and CRC32C come from, for messages (``"the manifest"``).
        uncommitted: what the failure leaves, for messages (``"nothing was committed"``).
        announce: log (INFO) one line per round of uploads; False: silent.

    Returns:
        list[ObjectInfo]: what the store holds for each item, in order.

    Raises:
        AccessError: a missing bucket, 401 or 403 (at once, no retry).
        StorageError: an upload failed after the client's own retries, or an object still differs from
            its entry after the second upload (every such object named with each attempt's difference;
            the bad objects are deleted; ``key`` ``"url"``, ``value`` the first such object's URL).
        ConfigError: ``transfers`` < 1.
    """
    check_transfers(transfers)
    dest = _source(storage, prefix)
    infos: list[Any] = [None] * len(items)
    problems: dict[str, list[str]] = {}
    todo = list(range(len(items)))
    for attempt in range(1, ATTEMPTS + 1):
        if not todo:
            break
        if announce:
            logger.info(f"uploading {len(todo)} {noun}(s), {sum(items[i][1].size for i in todo) / 1e6:.1f} MB, to "
                        f"{dest} with {transfers} parallel transfer(s)" + (" (retry)" if attempt > 1 else ""))
        names = [object_name(prefix, items[i][1].name) for i in todo]
        results = storage.put_files_info([(items[i][0], n) for i, n in zip(todo, names)], transfers)
        errors = [r if isinstance(r, BaseException) else None for r in results]
        stop = unretryable(errors, f"could not be uploaded to {dest}; {uncommitted}", noun)
        if stop is not None:
            _delete_quietly(storage, [n for n, e in zip(names, errors) if e is not None])
            raise stop
        failed = []
        for i, result in zip(todo, results):
            entry = items[i][1]
            why = str(result) if isinstance(result, BaseException) else _stored_mismatch(result, entry, reference)
            if why is None:
                infos[i] = result
            else:
                problems.setdefault(entry.name, []).append(f"attempt {attempt}: {why}")
                failed.append(i)
        todo = failed
    if todo:
        _delete_quietly(storage, [object_name(prefix, items[i][1].name) for i in todo])
        raise StorageError(f"{len(todo)} {noun}(s) could not be uploaded intact to {dest}: "
                           + _details(problems, [items[i][1].name for i in todo])
                           + f". {uncommitted[:1].upper()}{uncommitted[1:]}; check the local files and the network, "
                           "then run again.",
                           key="url", value=storage.where(object_name(prefix, items[todo[0]][1].name)))
    return infos


def _placer(todo: Sequence[tuple[Entry, Path]], tmps: Sequence[Path], reference: str,
            on_verified: Callable[[Entry, Path], None] | None) -> Callable[[str, str | os.PathLike], None]:
    """The ``check`` of :meth:`Storage.get_files` for one round: in the thread that downloaded a temporary
    file, re-read it from disk (size, then CRC32C against its entry), rename it into place and call
    ``on_verified``, so the verification of one file overlaps the other transfers and nothing can change
    the file between its check and its rename. A mismatch or a local file error raises
    :class:`IntegrityError` with the reason (a failure worth one more transfer)."""
    targets = {Path(tmp): item for tmp, item in zip(tmps, todo)}

    def place(_name: str, local_path: str | os.PathLike) -> None:
        tmp = Path(local_path)
        entry, path = targets[tmp]
        try:
            why = _local_mismatch(tmp, entry, reference)
            if why is None:
                os.replace(tmp, path)
                if on_verified is not None:
                    on_verified(entry, path)
        except OSError as e:
            why = f"cannot write {tmp}: {e}"
        if why is not None:
            raise IntegrityError(why)

    return place


def _failures(todo: Sequence[tuple[Entry, Path]], tmps: Sequence[Path],
              errors: Sequence[BaseException | None]) -> list[tuple[Entry, str]]:
    """Remove what a round left of its temporary files (the verified ones were renamed); the failed
    entries with why (a transfer's error, or the mismatch its check raised)."""
    failed = []
    for (entry, _path), tmp, err in zip(todo, tmps, errors):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if err is not None:
            failed.append((entry, str(err)))
    return failed


def download_verified(storage: Storage, items: Sequence[tuple[Entry, str | os.PathLike]], *, prefix: str = "",
                      transfers: int = DEFAULT_TRANSFERS, noun: str = "file", reference: str = "the listed checksum",
                      remedy: str = "", on_verified: Callable[[Entry, Path], None] | None = None) -> None:
    """Download objects into local files, verified against their entries; a mismatch is fetched once more.

    Each object goes to a temporary file beside its target (``.<name>.tmp-<pid>-<random>``), is checked
    (size, then CRC32C of the file read back from disk) and renamed into place, so a target is either
    absent, as it was, or intact. The check and the rename follow each download at once, in the thread
    that made it, while the other transfers go on (:meth:`Storage.get_files`'s ``check``).

    Args:
        storage: the source.
        items: ``(Entry, local path)``: what to fetch (name under ``prefix``) and where; parent folders
            are created; a file already at a target is replaced once the new one is verified.
        prefix: the set's folder (``""``: the storage's root).
        transfers: downloads in parallel (>= 1).
        noun: what one object is, for messages.
        reference: where the entries come from, for messages (``"the manifest"``, ``"checkpoint.json"``).
        remedy: what to do when an object stays bad, appended to that message.
        on_verified: called with each entry and its target, right after its rename, in the thread that
            downloaded it (under the caller's locks, if any; several such threads may call it at once);
            an ``OSError`` it raises counts as that object's failure.

    Raises:
        AccessError: a missing bucket, 401 or 403 (at once, no retry).
        StorageError: an object is missing or failed after the client's own retries, or still differs
            from its entry after the second fetch, or a target's folder cannot be written (every such
            object named with each attempt's difference; ``key`` ``"url"``, ``value`` the first such
            object's URL; ``"local_path"`` and the folder for a folder).
        ConfigError: ``transfers`` < 1.
    """
    check_transfers(transfers)
    todo = [(entry, Path(path)) for entry, path in items]
    for _entry, path in todo:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create the folder {path.parent} ({e.strerror or e})", key="local_path",
                               value=str(path.parent)) from None
    source = _source(storage, prefix)
    problems: dict[str, list[str]] = {}
    for attempt in range(1, ATTEMPTS + 1):
        if not todo:
            return
        tmps = [_tmp_path(path) for _entry, path in todo]
        errors = storage.get_files([(object_name(prefix, e.name), tmp) for (e, _p), tmp in zip(todo, tmps)],
                                   transfers, check=_placer(todo, tmps, reference, on_verified))
        failed = _failures(todo, tmps, errors)
        stop = unretryable(errors, f"could not be fetched from {source}", noun)
        if stop is not None:
            raise stop
        for entry, why in failed:
            problems.setdefault(entry.name, []).append(f"attempt {attempt}: {why}")
        bad = {entry.name for entry, _why in failed}
        todo = [(e, p) for e, p in todo if e.name in bad]
    if todo:
        into = os.path.commonpath([str(p.parent) for _e, p in todo])
        raise StorageError(f"{len(todo)} {noun}(s) from {source} could not be fetched intact into {into}: "
                           + _details(problems, [e.name for e, _p in todo]) + (f". {remedy}" if remedy else ""),
                           key="url", value=storage.where(object_name(prefix, todo[0][0].name)))


def upload_folder(storage: Storage, local_dir: str | os.PathLike, *, prefix: str = "",
                  transfers: int = DEFAULT_TRANSFERS, uncommitted: str = "the upload is incomplete") -> list[str]:
    """Upload every file under a local folder, each verified (:func:`upload_verified`).

    Args:
        storage: the destination.
        local_dir: the folder; object names are paths relative to it (``/``-separated), under ``prefix``.
        prefix: the destination folder (``""``: the storage's root).
        transfers: uploads in parallel (>= 1).
        uncommitted: what a failure leaves, for its message.

    Returns:
        list[str]: the object names written, sorted.

    Raises:
        StorageError: ``local_dir`` is not a folder, or a file could not be uploaded intact (named).
        ConfigError: ``transfers`` < 1.
    """
    items = local_entries(local_dir)
    upload_verified(storage, items, prefix=prefix, transfers=transfers, uncommitted=uncommitted)
    return [object_name(prefix, entry.name) for _path, entry in items]


def download_folder(storage: Storage, local_dir: str | os.PathLike, *, prefix: str = "",
                    transfers: int = DEFAULT_TRANSFERS) -> list[str]:
    """Download every object under ``prefix`` into a local folder, its sub-folders made as needed (the
    inverse of :func:`upload_folder`, without a manifest to verify against: each object as the store gives it).

    Args:
        storage: the source.
        local_dir: the folder; each object lands at its name relative to ``prefix`` (``/``-separated).
        prefix: the source folder (``""``: the storage's root).
        transfers: downloads in parallel (>= 1).

    Returns:
        list[str]: the object names downloaded, sorted (empty when nothing is under ``prefix``).

    Raises:
        StorageError: the folder cannot be listed, or an object cannot be downloaded (the first failure).
    """
    start = f"{prefix.rstrip('/')}/" if prefix else ""
    names = sorted(info.name for info in storage.list() if info.name.startswith(start))
    pairs = [(name, os.path.join(local_dir, *name[len(start):].split("/"))) for name in names]
    for _, path in pairs:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    failed = [e for e in storage.get_files(pairs, transfers) if e is not None]
    if failed:
        raise failed[0]
    return names


@dataclasses.dataclass(frozen=True)
class CommittedSets:
    """The committed sets of one storage: each a top-level folder holding its files and a marker object.

    Picklable when ``storage`` and ``key`` are (every :class:`Storage` before its first request; a
    module-level function).

    Attributes:
        storage: where the sets live.
        marker: the marker's name inside each folder (``"checkpoint.json"``).
        key: a folder name's rank (the newest set has the highest), None for a folder that is not a set
            (left alone).
        noun: what one file of a set is, for messages.
        kind: what one set is, for messages (``"checkpoint"``).
        logger_name: the logger of the sets' own lines (a set skipped or not pruned): the owner's module,
            so they show where the owner's lines do (:mod:`spark_imagenet.logs`).
    """

    storage: Storage
    marker: str
    key: Callable[[str], int | None]
    noun: str = "file"
    kind: str = "set"
    logger_name: str = __name__

    def folders(self) -> dict[str, dict[str, ObjectInfo]]:
        """``{folder: {name inside it: object}}`` of every set folder, from one listing.

        Raises:
            StorageError: the storage cannot be listed.
        """
        try:
            objects = self.storage.list()
        except OSError as e:  # an unreadable entry or a symbolic-link loop in a local folder
            raise StorageError(f"cannot list {self.storage.url} ({e.strerror or e}: {e.filename or ''})", key="url",
                               value=self.storage.url) from None
        groups: dict[str, dict[str, ObjectInfo]] = {}
        for o in objects:
            folder, sep, rest = o.name.partition("/")
            if sep and rest and self.key(folder) is not None:
                groups.setdefault(folder, {})[rest] = o
        return groups

    def missing(self, listing: Listing, objects: dict[str, ObjectInfo]) -> str | None:
        """Why a set's listed files are not all there, or None when they are (pure): a file absent, of
        another size, or of another CRC32C where the listing reports one."""
        for f in listing.files:
            info = objects.get(f.name)
            if info is None:
                return f"{f.name} is missing"
            if info.size != f.size:
                return f"{f.name} holds {info.size} bytes, {self.marker} says {f.size}"
            if info.crc32c is not None and info.crc32c != f.crc32c:
                return f"{f.name} has crc32c {info.crc32c}, {self.marker} says {f.crc32c}"
        return None

    def read_marker(self, folder: str, parse: Callable[[str, bytes, str], Any]) -> Any:
        """A folder's parsed marker: ``parse(folder, data, where)``; None when the marker is gone.

        Raises:
            StorageError: the marker exists and cannot be read.
            SparkImagenetError: what ``parse`` raises.
        """
        name = object_name(folder, self.marker)
        try:
            data = self.storage.read_bytes(name)
        except StorageError:
            if self.storage.exists(name):
                raise
            return None
        return parse(folder, data, self.storage.where(name))

    def complete(self, parse: Callable[[str, bytes, str], Any], *,
                 announce: bool = False) -> Iterator[tuple[str, Any]]:
        """Every complete set, newest first: folders are tried from the highest :attr:`key` down, and one
        whose marker is absent, unreadable (``parse`` returned None) or lists a file that is not there
        (:meth:`missing`) is skipped. A generator: each marker is read when the iteration reaches it.

        Args:
            parse: ``(folder, marker bytes, marker URL) -> parsed marker`` (with ``files``), or None for
                a marker that is not complete JSON; raise to refuse a foreign one.
            announce: log (INFO) a line for every set skipped; False: silent.

        Yields:
            tuple: ``(folder, parsed marker)``.

        Raises:
            StorageError: the storage cannot be listed or read.
            SparkImagenetError: what ``parse`` raises.
        """
        groups = self.folders()
        for folder in sorted(groups, key=self.key, reverse=True):
            listing = self.read_marker(folder, parse) if self.marker in groups[folder] else None
            reason = f"no readable {self.marker}" if listing is None else self.missing(listing, groups[folder])
            if reason is None:
                yield folder, listing
            elif announce:
                logging.getLogger(self.logger_name).info(
                    f"skipping the half-written {self.kind} {self.storage.where(folder)}: {reason}")

    def latest(self, parse: Callable[[str, bytes, str], Any], *,
               announce: bool = False) -> tuple[str, Any] | None:
        """The newest complete set (:meth:`complete`'s first, ``announce`` as there), or None when no set is
        complete."""
        return next(self.complete(parse, announce=announce), None)

    def commit(self, folder: str, items: Sequence[tuple[str | os.PathLike, Entry]], marker: bytes, *,
               transfers: int = DEFAULT_TRANSFERS, before: dict[str, dict[str, ObjectInfo]] | None = None) -> None:
        """Write one set: the folder's old marker and every object the new set does not have are deleted
        (marker first), the files are uploaded verified (:func:`upload_verified`), the marker is written.

        Args:
            folder: the set's folder name.
            items: ``(local path, Entry)`` of the set's files (none named like the marker).
            marker: the marker's bytes, listing ``items``' entries.
            transfers: uploads in parallel (>= 1).
            before: :meth:`folders` as listed before this call (None: listed now).

        Raises:
            StorageError: a file could not be uploaded intact (the set is then not committed).
            ConfigError: ``transfers`` < 1.
        """
        check_transfers(transfers)
        groups = self.folders() if before is None else before
        keep = {entry.name for _path, entry in items}
        stale = [n for n in groups.get(folder, {}) if n not in keep or n == self.marker]
        for n in sorted(stale, key=lambda n: n != self.marker):  # the marker first: the old set stops counting
            self.storage.delete(object_name(folder, n))
        upload_verified(self.storage, items, prefix=folder, transfers=transfers, noun=self.noun,
                        reference="the local file",
                        uncommitted=f"the {self.kind} {self.storage.where(folder)} was not committed")
        self.storage.write_bytes(object_name(folder, self.marker), marker)

    def delete(self, folder: str, objects: dict[str, ObjectInfo]) -> None:
        """Delete a set's objects (its marker first, so it stops counting before it is gone) and what a
        local folder leaves (:meth:`Storage.tidy`).

        Raises:
            StorageError: an object cannot be deleted.
        """
        for n in sorted(objects, key=lambda n: n != self.marker):
            self.storage.delete(object_name(folder, n))
        self.storage.tidy(folder)

    def prune(self, states: dict[str, bool], keep: int | None,
              groups: dict[str, dict[str, ObjectInfo]]) -> list[str]:
        """Delete the sets :func:`prune_plan` names; a failure is logged (WARNING), not raised.

        Args:
            states: ``{folder: complete?}`` of the sets that may go (callers leave out the newer ones and
                those they do not recognise).
            keep: complete sets of ``states`` to keep (the newest); None = all.
            groups: :meth:`folders`.

        Returns:
            list[str]: the folders deleted.
        """
        gone = []
        for folder in prune_plan(states, keep, self.key):
            try:
                self.delete(folder, groups.get(folder, {}))
                gone.append(folder)
            except StorageError as e:
                logging.getLogger(self.logger_name).warning(
                    f"could not remove the old {self.kind} {self.storage.where(folder)}: {e}")
        return gone


def prune_plan(states: dict[str, bool], keep: int | None, key: Callable[[str], Any]) -> list[str]:
    """Which sets to delete (pure): every incomplete one, and the complete ones beyond the newest ``keep``.

    Args:
        states: ``{folder: complete?}``.
        keep: complete sets to keep; None = all.
        key: a folder's rank (newest highest).

    Returns:
        list[str]: the folders, newest first.
    """
    ordered = sorted(states, key=key, reverse=True)
    complete = [f for f in ordered if states[f]]
    extra = set(complete[keep:]) if keep is not None else set()
    return [f for f in ordered if not states[f] or f in extra]
