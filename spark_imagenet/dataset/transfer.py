"""Publishing a dataset to a bucket: verified uploads and a manifest commit
that two concurrent writers cannot interleave.

A dataset at a bucket URL is its ``manifest.json`` plus the shard objects the
manifest names (:mod:`spark_imagenet.dataset.naming`); the manifest is the
single commit point:

1. :func:`check_destination`: what is there now (the same dataset: nothing
   to do; another one: refused unless ``overwrite``), and the manifest's
   generation, the token of step 3;
2. :func:`publish`: skip the shards already present with the same size and
   CRC32C, upload the others verified against the manifest
   (:func:`spark_imagenet.storage.committed.upload_verified`: ``transfers`` at
   a time; size and CRC32C as the bucket reports them, from each upload's own
   reply on GCS, so no request per object follows the uploads; a mismatch is
   uploaded once more, then fails naming the shard);
3. :func:`commit_manifest`: write ``manifest.json`` with the precondition
   ``if_generation_match`` = the generation seen in step 1 (0: create-only),
   the same compare-and-swap GCS documents for its own concurrency control.
   The loser of a race deletes the shards it uploaded and reports the
   winner; then the shards of a replaced dataset are deleted.

:func:`upload` (``spark-imagenet upload``) runs the three steps for shards
built on local disk; :func:`spark_imagenet.dataset.sharding.shard` runs them for a
build.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Sequence

from spark_imagenet.errors import ConfigError, ManifestError, PreconditionFailed, StorageError
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest, ShardInfo
from spark_imagenet.dataset.naming import PARTIAL_RE, QUALITY_REPORT_NAME, SHARD_NAME_RE
from spark_imagenet.storage import DEFAULT_TRANSFERS, LocalStorage, ObjectInfo, Storage, open_storage
from spark_imagenet.storage.base import check_transfers
from spark_imagenet.storage.committed import Entry, intact, upload_verified

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Destination:
    """What :func:`check_destination` found at a bucket URL.

    Attributes:
        existing: the manifest there when it is the same dataset and every
            shard is present and intact (nothing to do), else None.
        generation: the manifest's generation (0: no manifest), the
            precondition for :func:`commit_manifest`.
        objects: every object under the URL by name (one listing).
        replaced: the id of a different dataset there that ``overwrite``
            will replace (None when there is none).
        committed: the manifest there when it is this same dataset, intact
            or not (then only the missing or damaged shards need publishing
            and the manifest need not be rewritten).
    """

    existing: Manifest | None
    generation: int
    objects: dict[str, ObjectInfo]
    replaced: str | None = None
    committed: Manifest | None = None


def _entry(shard: ShardInfo) -> Entry:
    """A shard as an entry of the dataset's committed set (name, size, CRC32C)."""
    return Entry(shard.name, shard.bytes, shard.crc32c)


def _intact(storage: Storage, info: ObjectInfo | None, shard: ShardInfo) -> bool:
    """Whether an object listed as ``info`` holds ``shard`` (:func:`~spark_imagenet.storage.committed.intact`)."""
    return intact(storage, info, _entry(shard))


def _shard_problem(storage: Storage, info: ObjectInfo | None, shard: ShardInfo, *, read: bool) -> str | None:
    """What is wrong with a stored shard against its manifest entry (``"<where>: missing"``, its size, or its
    CRC32C: the one ``info`` gives, else with ``read`` the stored bytes' own), or None when it matches."""
    where = storage.where(shard.name)
    if info is None:
        return f"{where}: missing"
    if info.size != shard.bytes:
        return f"{where}: {info.size} bytes, the manifest says {shard.bytes}"
    crc = info.crc32c if info.crc32c is not None or not read else storage.crc32c(shard.name)
    if crc is not None and crc != shard.crc32c:
        return f"{where}: crc32c {crc}, the manifest says {shard.crc32c}"
    return None


def check_listed(storage: Storage, manifest: Manifest) -> None:
    """Check, from one listing of the dataset, that every shard its manifest names is there with its size (and
    its CRC32C, where the listing gives one: GCS): a shard deleted or replaced after an earlier run cached it
    would otherwise go unnoticed on the hosts that hold the cached copy.

    Raises:
        ManifestError: a shard is missing or differs (up to 10 named, and what to do).
        StorageError: the dataset cannot be listed.
    """
    listed = {o.name: o for o in storage.list()}
    bad = [problem for split in manifest.splits.values() for shard in split.shards
           if (problem := _shard_problem(storage, listed.get(shard.name), shard, read=False))]
    if bad:
        raise ManifestError(
            f"{len(bad)} shard(s) of the dataset at {storage.url} (id {manifest.dataset_id}) do not match its "
            f"{MANIFEST_NAME}: the dataset changed after it was committed (a copy cached on a host from an earlier "
            "run is not used in its place). Shard the source again, or upload the dataset again (spark-imagenet "
            "upload):" + "".join(f"\n  {b}" for b in bad[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else ""))


def check_destination(storage: Storage, dataset_id: str, overwrite: bool, option: str = "--out") -> Destination:
    """Look at a bucket URL before writing a dataset there.

    Args:
        storage: the destination.
        dataset_id: id of the dataset about to be written.
        overwrite: whether a different dataset (or other files) there may be
            replaced.
        option: the option or argument that named the URL, for messages.

    Returns:
        Destination: see its attributes.

    Raises:
        ConfigError: a different dataset, an unreadable manifest, or files
            that are not shards are there and ``overwrite`` is False.
        StorageError: the destination cannot be listed or read (a missing
            bucket included).
    """
    objects = {o.name: o for o in storage.list()}
    man = objects.get(MANIFEST_NAME)
    generation = man.generation or 0 if man else 0
    if man is not None:
        try:
            existing = Manifest.load(storage)
        except ManifestError:
            if not overwrite:
                raise ConfigError(
                    f"{option} {storage.url} holds an unreadable {MANIFEST_NAME}; choose another {option} "
                    "or pass --overwrite", key=option, value=storage.url
                ) from None
            return Destination(None, generation, objects, replaced="(unreadable manifest)")
        if existing.dataset_id == dataset_id:
            shards = [s for split in existing.splits.values() for s in split.shards]
            if all(_intact(storage, objects.get(s.name), s) for s in shards):
                return Destination(existing, generation, objects, committed=existing)
            # same dataset, shards lost or damaged: publish those again
            return Destination(None, generation, objects, committed=existing)
        if not overwrite:
            raise ConfigError(
                f"{option} {storage.url} already holds a different dataset (id {existing.dataset_id}, "
                f"{existing.num_classes} classes, {existing.splits['train'].examples} train images stored as "
                f"'{existing.image_form.label}', built "
                f"{existing.created}); choose another {option}, or pass --overwrite to replace it",
                key=option, value=storage.url
            )
        return Destination(None, generation, objects, replaced=existing.dataset_id)
    # quality-report.json: a build that failed between writing it and the manifest commit leaves it.
    foreign = [n for n in objects
               if not SHARD_NAME_RE.match(n) and not PARTIAL_RE.match(n) and n != QUALITY_REPORT_NAME]
    if foreign and not overwrite:
        raise ConfigError(
            f"{option} {storage.url} is not empty and holds no {MANIFEST_NAME} (e.g. {foreign[0]}); "
            "choose an empty or new folder, or pass --overwrite", key=option, value=storage.url
        )
    return Destination(None, 0, objects)


@dataclasses.dataclass
class PublishStats:
    """What :func:`publish` or :func:`upload` moved.

    Attributes:
        uploaded: objects uploaded (verified).
        skipped: objects already present with the same size and CRC32C.
        bytes_uploaded: bytes of the uploaded objects.
        seconds: wall time, in seconds.
        manifest_written: whether ``manifest.json`` was (re)written.
    """

    uploaded: int = 0
    skipped: int = 0
    bytes_uploaded: int = 0
    seconds: float = 0.0
    manifest_written: bool = False

    @property
    def mb_per_sec(self) -> float:
        """Upload rate in MB/s (10**6 bytes per second); 0 when nothing moved."""
        return self.bytes_uploaded / 1e6 / self.seconds if self.bytes_uploaded and self.seconds > 0 else 0.0


def publish(storage: Storage, files: Sequence[tuple[str | os.PathLike, ShardInfo]], *,
            present: dict[str, ObjectInfo] | None = None, transfers: int = DEFAULT_TRANSFERS,
            stats: PublishStats | None = None, announce: bool = False) -> PublishStats:
    """Upload local shard files as objects, verified against their manifest entries.

    Args:
        storage: the destination bucket.
        files: ``(local path, ShardInfo)``: the file to upload and the name,
            size and CRC32C it must have. The local files are not changed.
        present: objects already at the destination (from
            :func:`check_destination`); those with the same size and CRC32C
            are skipped. None: list the destination first.
        transfers: uploads in parallel (at least 1).
        stats: counters to add to (a new one when None).
        announce: log (INFO) one line per round of uploads.

    Returns:
        PublishStats: uploaded and skipped counts, bytes, seconds.

    Raises:
        StorageError: an object that fails to upload, or whose CRC32C as the
            bucket reports it differs from the manifest, twice (every such
            shard is named; the bad objects are deleted).
        AccessError: a missing bucket, 401 or 403 (at once, no retry).
        ConfigError: ``transfers`` < 1.
    """
    check_transfers(transfers)
    stats = stats or PublishStats()
    start = time.monotonic()
    if present is None:
        present = {o.name: o for o in storage.list()}
    todo = []
    for path, shard in files:
        if _intact(storage, present.get(shard.name), shard):
            stats.skipped += 1
        else:
            todo.append((path, _entry(shard)))
    try:
        upload_verified(storage, todo, transfers=transfers, noun="shard", reference="the manifest",
                        uncommitted="nothing was committed (no manifest written)", announce=announce)
    finally:
        stats.seconds += time.monotonic() - start
    stats.uploaded += len(todo)
    stats.bytes_uploaded += sum(entry.size for _p, entry in todo)
    return stats


def commit_manifest(storage: Storage, manifest: Manifest, generation: int) -> Manifest:
    """Write ``manifest.json`` if nobody else did since :func:`check_destination`.

    Args:
        storage: the destination.
        manifest: the dataset to commit (its shards already published).
        generation: the generation of the manifest seen before publishing
            (0: there was none: create-only).

    Returns:
        Manifest: ``manifest``, or the one another writer committed first
        when it is the same dataset (same id).

    Raises:
        ConfigError: another writer committed a different dataset first; the
            shards this call's caller uploaded and the other dataset does not
            use are deleted first, so exactly one consistent dataset remains.
        StorageError: the manifest cannot be written.
    """
    try:
        storage.write_bytes(MANIFEST_NAME, manifest.dumps().encode("utf-8"), if_generation_match=generation)
        return manifest
    except PreconditionFailed:
        pass
    try:
        winner = Manifest.load(storage)
    except (ManifestError, StorageError) as e:
        raise StorageError(
            f"{storage.where(MANIFEST_NAME)} was changed by another writer while this one was building, and it "
            f"cannot be read now ({e}); run again"
        ) from None
    if winner == manifest:
        return manifest  # our own write, whose reply was lost and whose retry met the precondition
    if winner.dataset_id == manifest.dataset_id:
        logger.info(f"another run committed this same dataset (id {winner.dataset_id}) to {storage.url} first; "
                    "using it")
        return winner
    theirs = {s.name for split in winner.splits.values() for s in split.shards}
    for split in manifest.splits.values():
        for s in split.shards:
            if s.name not in theirs:
                storage.delete(s.name)
    raise ConfigError(
        f"another run committed a different dataset (id {winner.dataset_id}, built {winner.created}) to "
        f"{storage.url} while this one (id {manifest.dataset_id}) was being written; its shards were removed "
        "again and the other dataset is intact. Choose another destination, or pass --overwrite to replace it"
    )


def remove_replaced(storage: Storage, manifest: Manifest, before: dict[str, ObjectInfo]) -> int:
    """After this run committed ``manifest``: delete the shard objects that
    were already there when it started (``before``, from
    :func:`check_destination`) and that ``manifest`` does not use: those of
    the dataset it replaced, or left by an interrupted build.

    Objects that appeared while this run was working are left alone: they
    belong to a concurrent writer, whose own commit will now fail its
    precondition and remove them. Call this only after a commit of this run
    (never when the dataset was already committed), so a repair never
    deletes another run's work.

    Returns:
        int: objects deleted.
    """
    current = {s.name for split in manifest.splits.values() for s in split.shards}
    gone = 0
    for name in before:
        if (SHARD_NAME_RE.match(name) and name not in current) or PARTIAL_RE.match(name):
            storage.delete(name)
            gone += 1
    return gone


def upload(source: str | os.PathLike, dest: str | os.PathLike, *, transfers: int = DEFAULT_TRANSFERS,
           overwrite: bool = False) -> PublishStats:
    """Publish a dataset built on local disk to a bucket (``spark-imagenet upload``).

    Every local shard is checked against its manifest entry (size, CRC32C)
    before anything is uploaded; shards already at ``dest`` with the same size
    and CRC32C are skipped (so a rerun transfers nothing); the rest go up in
    parallel and are verified; the manifest goes last (see the module doc).

    Args:
        source: local folder (path or ``file://`` URL) holding
            ``manifest.json`` and the shards.
        dest: destination bucket URL (``gs://bucket/prefix``, or a local one).
        transfers: uploads in parallel (``--transfers``).
        overwrite: replace a different dataset at ``dest``.

    Returns:
        PublishStats: uploaded/skipped counts, bytes, seconds, and whether the
        manifest was written.

    Raises:
        ConfigError: ``source`` is not local, ``source`` and ``dest`` are the
            same, ``dest`` holds a different dataset (without ``overwrite``),
            or ``transfers`` < 1.
        ManifestError: ``source`` holds no valid manifest, or a local shard
            does not match it (named, with what to do).
        StorageError: ``dest`` cannot be listed or written, or an upload
            fails verification twice.
    """
    check_transfers(transfers)
    src = open_storage(source)
    if not isinstance(src, LocalStorage):
        raise ConfigError(f"upload SOURCE {src.url}: must be a local folder (the --out of `spark-imagenet shard`)",
                          key="SOURCE", value=source)
    dst = open_storage(dest)
    if isinstance(dst, LocalStorage) and dst.root == src.root:
        raise ConfigError(f"upload: SOURCE and DEST are the same folder ({src.url})", key="DEST", value=dest)
    manifest = Manifest.load(src)
    shards = [s for split in manifest.splits.values() for s in split.shards]
    bad = [problem for s in shards if (problem := _shard_problem(src, src.stat(s.name), s, read=True))]
    if bad:
        raise ManifestError(
            f"{len(bad)} local shard(s) in {src.url} do not match its {MANIFEST_NAME}; nothing was uploaded. "
            "Rebuild them with `spark-imagenet shard SOURCE --out " + src.url + "`:"
            + "".join(f"\n  {b}" for b in bad[:50]) + (f"\n  ... and {len(bad) - 50} more" if len(bad) > 50 else "")
        )
    dest_state = check_destination(dst, manifest.dataset_id, overwrite, option="upload DEST")
    stats = PublishStats()
    if dest_state.existing is not None:
        stats.skipped = len(shards)
        logger.info(f"{dst.url} already holds this dataset (id {manifest.dataset_id}), every shard intact; "
                    "nothing to do")
        return stats
    publish(dst, [(Path(src.root, s.name), s) for s in shards], present=dest_state.objects,
            transfers=transfers, stats=stats, announce=True)
    start = time.monotonic()
    removed = 0
    report = Path(src.root, QUALITY_REPORT_NAME)  # the shard builder's report travels with its shards
    if report.is_file():
        data = report.read_bytes()
        if report.name not in dest_state.objects or dst.read_bytes(report.name) != data:
            dst.write_bytes(report.name, data)
    if dest_state.committed is None:
        committed = commit_manifest(dst, manifest, dest_state.generation)
        stats.manifest_written = committed is manifest
        if stats.manifest_written:
            removed = remove_replaced(dst, committed, dest_state.objects)
    # else: the same dataset was committed, some shards lost: they are back now; delete nothing
    stats.seconds += time.monotonic() - start
    logger.info(f"uploaded {stats.uploaded} shard(s) ({stats.bytes_uploaded / 1e6:.1f} MB, "
                f"{stats.mb_per_sec:.1f} MB/s), "
                f"skipped {stats.skipped} already there" + (f", removed {removed} replaced" if removed else "")
                + f"; {dst.where(MANIFEST_NAME)} " + ("written" if stats.manifest_written else "already committed"))
    return stats
