"""The driver's side of a DataFrame build after its Spark job (:mod:`spark_imagenet.dataset.dataframe`): keep one
attempt per shard, write the quality report, commit ``manifest.json`` last, delete every other object the run wrote.

Every task attempt uploads its shard under a name of its own (:func:`~spark_imagenet.dataset.naming.attempt_shard_name`:
the run's token and the attempt's id), so a retried, speculative or late attempt never writes over the object
another attempt wrote. The driver takes exactly one reported shard per partition (Spark returns one result per
partition, whichever attempt succeeded first), names those objects in the manifest, commits it with the
compare-and-swap of :func:`spark_imagenet.dataset.transfer.commit_manifest`, and then deletes the objects of the
run the manifest does not name (failed attempts, speculative copies that finished second). Nothing is renamed: on
object stores a rename is a copy of every byte, and the manifest is the commit point anyway. An attempt Spark
could not stop before the driver's clean-up may still upload its object after it: that object is in no manifest,
matches the shard pattern, and the next build to the same destination removes it
(:func:`~spark_imagenet.dataset.transfer.remove_replaced`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import logging
from typing import Any, Iterable

from spark_imagenet.dataset.dataframe_task import ShardResult
from spark_imagenet.dataset.duplicates import Duplicate, Duplicates
from spark_imagenet.dataset.image_form import ORIGINAL, ImageForm
from spark_imagenet.dataset.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, SplitInfo
from spark_imagenet.dataset.naming import of_run
from spark_imagenet.dataset.quality import CATEGORIES
from spark_imagenet.dataset.report import QUALITY_REPORT, format_quality, quality_totals, write_quality_report
from spark_imagenet.dataset.sharding import FEATURE_KEYS, MAX_LISTED
from spark_imagenet.dataset.transfer import Destination, commit_manifest, remove_replaced
from spark_imagenet.errors import ConfigError, DataError, ImageError, ManifestError, StorageError
from spark_imagenet.source.synset import SynsetClass
from spark_imagenet.storage import Storage

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Build:
    """A finished Spark job, ready to commit.

    Attributes:
        storage: the destination.
        dest: what it held before the job (:func:`spark_imagenet.dataset.transfer.check_destination`).
        run: the run's token (in every object name it wrote).
        classes: the manifest's classes, by id.
        counts: ``(train shards, val shards)``.
        results: one :class:`~spark_imagenet.dataset.dataframe_task.ShardResult` per partition.
        verify: ``"decode"`` or ``"header"``.
        on_corrupt: ``"error"`` or ``"skip"``.
        overwrite: whether a different dataset at the destination may be replaced.
        source: the manifest's ``source`` (what was read).
        across: groups of copies in both splits that a split column made (none without one; the tasks cannot
            see them: :mod:`spark_imagenet.dataset.split_copies`).
        form: how the images are stored (:mod:`spark_imagenet.dataset.image_form`).
    """

    storage: Storage
    dest: Destination
    run: str
    classes: tuple[SynsetClass, ...]
    counts: tuple[int, int]
    results: tuple[ShardResult, ...]
    verify: str
    on_corrupt: str
    overwrite: bool
    source: dict[str, Any]
    across: tuple[Duplicate, ...] = ()
    form: ImageForm = ORIGINAL


def delete_run(storage: Storage, run: str, keep: Iterable[str] = ()) -> int:
    """Delete the objects run ``run`` wrote that are not in ``keep``; a failure to delete is logged, not raised
    (this runs after another failure, or after the commit).

    Returns:
        int: objects deleted.
    """
    keep = set(keep)
    try:
        names = [o.name for o in storage.list() if of_run(o.name, run) and o.name not in keep]
    except StorageError as e:
        logger.warning(f"warning: could not list {storage.url} to remove this run's extra shards: {e}")
        return 0
    gone = 0
    for name in names:
        try:
            storage.delete(name, best_effort=True)
            gone += 1
        except StorageError as e:
            logger.warning(f"warning: could not remove {storage.where(name)}: {e}")
    return gone


def fingerprint(classes: tuple[str, ...], splits: dict[str, SplitInfo], on_corrupt: str,
                form: ImageForm = ORIGINAL) -> str:
    """The dataset id of a DataFrame build: SHA-256 (first 16 bytes, hex) of the format version, the class names,
    the stored form (unless ``original``: ids of earlier builds stay) and per shard its examples, size and CRC32C,
    in shard order. Equal ids mean byte-identical shards of the same form (the object names, which carry the run
    and attempt, are left out; a ``--max-side`` above every image's size stores the same bytes, another form)."""
    h = hashlib.sha256(f"spark-imagenet/{FORMAT_VERSION}\ndataframe\n".encode())
    if on_corrupt != "error":
        h.update(f"on-corrupt {on_corrupt}\n".encode())
    if form != ORIGINAL:
        h.update(f"form {form.label}\n".encode())
    for i, name in enumerate(classes):
        h.update(f"class {i} {name}\n".encode())
    for split, info in splits.items():
        for k, s in enumerate(info.shards):
            h.update(f"shard {split} {k} {len(info.shards)} {s.examples} {s.bytes} {s.crc32c}\n".encode())
    return h.hexdigest()[:32]


def _ordered(build: Build) -> dict[str, list[ShardResult]]:
    """The results per split in shard order; a shard that got no rows (its task had none, so it reported
    nothing) stands as an empty result, which :func:`_check_results` refuses."""
    found = {(r.split, r.index): r for r in build.results}
    return {split: [found.get((split, i)) or ShardResult(split, i, None, (), 0, 0, 0, {}, (), ())
                    for i in range(count)]
            for split, count in zip(("train", "val"), build.counts)}


def _check_results(build: Build, ordered: dict[str, list[ShardResult]]) -> None:
    """Refuse a build with unusable images (``on_corrupt="error"``) or a shard that got no rows.

    Raises:
        ImageError: unusable images (listed, at most :data:`~spark_imagenet.dataset.sharding.MAX_LISTED`).
        DataError: a shard without examples.
    """
    bad = sum(r.bad for r in build.results)
    if bad and build.on_corrupt == "error":
        listed = sorted(p for r in build.results for p in r.problems)[:MAX_LISTED]
        raise ImageError(f"{bad} image(s) are empty, truncated or do not decode; nothing was committed to "
                         f"{build.storage.url}. Fix or remove those rows, or pass on_corrupt='skip' (--on-corrupt skip) "
                         "to leave them out, and run again:" + "".join(f"\n  {p}" for p in listed)
                         + (f"\n  ... and {bad - len(listed)} more" if bad > len(listed) else ""))
    for split, results in ordered.items():
        empty = [r.index for r in results if r.info is None or r.info.examples == 0]
        if empty and len(empty) == len(results):
            fraction = "larger" if split == "val" else "smaller"
            raise DataError(f"the {split} split got no images: rows without a split go to validation by a hash of "
                            f"their bytes, and the hash sent {split} none; give a {fraction} --val-fraction "
                            f"(val_fraction=), or a split column that names some rows '{split}'")
        if empty:
            raise DataError(f"{len(empty)} of the {len(results)} {split} shards got no images (shard "
                            f"{', '.join(map(str, empty[:10]))}): choose fewer {split} shards (rows go to shards by "
                            "a hash of their bytes, so shards need some dozens of rows each to be filled)")


def quality_report(build: Build, ordered: dict[str, list[ShardResult]], dataset_id: str) -> dict[str, Any]:
    """The content of ``quality-report.json``, in the local builder's format
    (:func:`spark_imagenet.dataset.report.quality_report`), ``duplicates`` included: the groups of rows with
    identical image bytes that the tasks found, each within one shard
    (:class:`spark_imagenet.dataset.duplicates.Duplicates`)."""
    splits: dict[str, dict[str, Any]] = {}
    files: list[dict[str, str]] = []
    for split, results in ordered.items():
        counts = dict.fromkeys(CATEGORIES, 0)
        repaired = skipped = 0
        for r in results:
            for category, n in r.categories.items():
                counts[category] += n
            for name, category, reason, action in r.files:
                files.append({"split": split, "file": name, "category": category, "action": action, "reason": reason})
                repaired += action == "repaired"
                skipped += action == "skipped"
        found = sum(r.images for r in results)
        splits[split] = {"files": found, "examples": found - skipped, "repaired": repaired, "skipped": skipped,
                         "categories": counts}
    files.sort(key=lambda f: (f["split"] != "train", f["file"]))
    duplicates = _duplicates(build)
    return QUALITY_REPORT.to_json({"dataset_id": dataset_id, "verify": build.verify, "on_corrupt": build.on_corrupt,
                                   "splits": splits, "files": files, **duplicates.fields()})


def _duplicates(build: Build) -> Duplicates:
    """The groups of identical images the tasks reported, and those across splits."""
    return Duplicates.of([*build.across, *(d for r in build.results for d in r.duplicates)])


def _log_report(build: Build, report: dict[str, Any]) -> None:
    """The quality summary, and the identical images (:meth:`Duplicates.log`)."""
    for line in format_quality(report):
        logger.info(line)
    _duplicates(build).log(logger)


def _prior(build: Build) -> Manifest | None:
    """The manifest at the destination before the job, or None (none, or unreadable and ``overwrite``)."""
    if MANIFEST_NAME not in build.dest.objects:
        return None
    try:
        return Manifest.load(build.storage)
    except ManifestError:
        return None


def _intact(build: Build, manifest: Manifest) -> bool:
    """Whether every shard ``manifest`` names is at the destination with its size (and listed CRC32C)."""
    objects = build.dest.objects
    for split in manifest.splits.values():
        for s in split.shards:
            info = objects.get(s.name)
            if info is None or info.size != s.bytes or (info.crc32c is not None and info.crc32c != s.crc32c):
                return False
    return True


def commit_build(build: Build) -> Manifest:
    """Commit a finished job (see the module doc): check it, write the quality report, commit the manifest, delete
    the run's other objects. On any failure before the commit, every object of the run is deleted.

    Returns:
        Manifest: the committed manifest, or the one already at the destination when it is the same dataset.

    Raises:
        ImageError: unusable images with ``on_corrupt="error"``.
        DataError: a shard got no rows.
        ConfigError: the destination holds a different dataset (without ``overwrite``), or another writer
            committed a different one meanwhile.
        StorageError: the report or the manifest cannot be written.
    """
    try:
        manifest = _manifest(build)
        prior = _prior(build)
        if prior is not None and prior.dataset_id == manifest.dataset_id and _intact(build, prior):
            logger.info(f"{build.storage.url} already holds this dataset (id {prior.dataset_id}); nothing to do")
            delete_run(build.storage, build.run)
            return prior
        if prior is not None and prior.dataset_id != manifest.dataset_id and not build.overwrite:
            raise ConfigError(f"{build.storage.url} already holds a different dataset (id {prior.dataset_id}, images "
                              f"stored as '{prior.image_form.label}', built {prior.created}); choose another "
                              "destination, or pass overwrite=True (--overwrite) to replace it. This run's shards were "
                              "removed again")
        _log_report(build, report := quality_report(build, _ordered(build), manifest.dataset_id))
        write_quality_report(build.storage, report)
        committed = commit_manifest(build.storage, manifest, build.dest.generation)
    except BaseException:
        delete_run(build.storage, build.run)
        raise
    keep = {s.name for split in committed.splits.values() for s in split.shards}
    with contextlib.suppress(StorageError):
        if committed is manifest:
            remove_replaced(build.storage, manifest, build.dest.objects)
    removed = delete_run(build.storage, build.run, keep)
    logger.info(f"committed {sum(s.examples for s in committed.splits.values())} examples in {len(keep)} shards "
                f"(id {committed.dataset_id}) to {build.storage.url}"
                + (f"; removed {removed} object(s) of failed or duplicate task attempts" if removed else ""))
    return committed


def _manifest(build: Build) -> Manifest:
    """The manifest of a checked build (:func:`_check_results`)."""
    ordered = _ordered(build)
    _check_results(build, ordered)
    splits = {split: SplitInfo(tuple(r.info for r in results if r.info is not None))
              for split, results in ordered.items()}
    dataset_id = fingerprint(tuple(c.wnid for c in build.classes), splits, build.on_corrupt, build.form)
    report = quality_report(build, ordered, dataset_id)
    return Manifest(
        dataset_id=dataset_id,
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        classes=build.classes,
        splits=splits,
        source=build.source,
        selection={"train_shards": build.counts[0], "val_shards": build.counts[1], "verify": build.verify,
                   "on_corrupt": build.on_corrupt, "quality": quality_totals(report),
                   "duplicates": report["duplicate_totals"]["groups"]},
        feature_keys=FEATURE_KEYS,
        image_form=build.form,
    )
