"""Building TFRecord shards and their manifest from a Kaggle source: :func:`shard`.

What a build does:

1. open the source (:func:`spark_imagenet.source.open_source`: the unpacked
   folder, or the downloaded zip in either form, read in place) and list the
   chosen labelled images;
2. shuffle the train images across classes with the seed and deal them
   round-robin to the shards (so shard sizes differ by at most one example and
   every shard mixes classes); val images are dealt in file-name order
   (:func:`plan_shards`);
3. write the shards in parallel worker processes, each image checked first
   (:func:`check_image`, :mod:`spark_imagenet.dataset.quality`): stored byte
   for byte, or repaired, or (unusable) failing the build or left out
   (``on_corrupt``). A random-access source: each worker reads its shard's
   images itself through the source's :class:`~spark_imagenet.source.base.ImageReader`.
   A stream source: the main process reads the stream, the pool checks the
   images in batches, each record is appended to a spill file of its shard,
   and the workers then copy every shard's records into plan order. Either
   way the shards are byte for byte the same;
4. only when every image passed (or was skipped): publish the shards under
   their final names (a remote ``out``: each uploaded, verified, as soon as it
   is written), write ``quality-report.json``, then ``manifest.json`` last
   (:mod:`spark_imagenet.dataset.transfer`).

An interrupted or failed build leaves no manifest (so nothing can train on a
partial dataset) and no half-written shard under a final name.

Feature keys of every record are those of TensorFlow's reference ImageNet
converter (tensorflow/models ``build_imagenet_data.py``), with 0-based labels:
see :data:`FEATURE_KEYS`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime as _dt
import hashlib
import io
import math
import multiprocessing as mp
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from spark_imagenet.dataset.manifest import FORMAT_VERSION, Manifest, ShardInfo, SplitInfo
from spark_imagenet.dataset.naming import PARTIAL_RE, partial_name, shard_name
from spark_imagenet.dataset.quality import DECODE_ERRORS, Finding, classify, repair
from spark_imagenet.dataset.report import (
    Quality,
    format_quality,
    note,
    quality_report,
    quality_totals,
    write_quality_report,
)
from spark_imagenet.dataset.tfrecord import encode_example, write_record
from spark_imagenet.dataset.transfer import Destination, check_destination, commit_manifest, publish, remove_replaced
from spark_imagenet.errors import ConfigError, ImageError, SparkImagenetError, StorageError
from spark_imagenet.source import open_source
from spark_imagenet.source.base import ImageFile, ImageReader, SourceDataset
from spark_imagenet.storage import DEFAULT_TRANSFERS, Storage, crc32c_file, open_storage

FEATURE_KEYS = (
    "image/encoded",
    "image/format",
    "image/class/label",
    "image/class/synset",
    "image/height",
    "image/width",
    "image/filename",
)
#: Target shard size for the automatic shard count, in bytes (128 MiB; the
#: TF reference converter's 1024 train shards of full ImageNet are ~140 MB).
TARGET_SHARD_BYTES = 128 * 1024 * 1024
#: The automatic count never goes below these, so up to 16 workers can train.
MIN_AUTO_TRAIN_SHARDS = 16
MIN_AUTO_VAL_SHARDS = 4
VERIFY_MODES = ("decode", "header")
ON_CORRUPT_MODES = ("error", "skip")
#: How many bad files the error of a failed build lists.
MAX_LISTED = 50


def check_image(data: bytes, name: str, verify: str = "decode") -> tuple[bytes | None, int, int, Finding]:
    """The per-image step of every build path: classify the file and, when
    it needs it, repair it (see :mod:`spark_imagenet.dataset.quality`).

    Args:
        data: the file's bytes.
        name: how messages name the file.
        verify: ``"decode"`` or ``"header"``, see :func:`spark_imagenet.dataset.quality.classify`.

    Returns:
        tuple: ``(stored, height, width, finding)``: the bytes to store (the
        file's own bytes unless it was repaired, then the repaired JPEG) and
        their size in pixels; ``stored`` is ``None`` when the file is unusable
        (``finding.category`` ``empty`` or ``corrupt``, also a file that
        Pillow cannot decode for its repair).

    Raises:
        Exception: anything but a decoder error (:data:`~spark_imagenet.dataset.quality.DECODE_ERRORS`)
            raised while repairing: a bug, never taken for a corrupt file.
    """
    finding = classify(data, name, verify)
    if not finding.usable:
        return None, 0, 0, finding
    try:
        stored, height, width = repair(data, finding)
    except DECODE_ERRORS as e:  # decodes at 1/8 scale but not at full size (or verify="header")
        finding = dataclasses.replace(finding, category="corrupt", reason=f"does not decode for repair: {e}")
        return None, 0, 0, finding
    return stored, height, width, finding


@dataclasses.dataclass(frozen=True)
class _ShardJob:
    """One shard to write: its images in record order, and where to write it.

    ``reader`` reads the images in a worker process (a random-access source);
    ``None`` when the main process streams them (:func:`_stream_images`).
    """

    split: str
    index: int
    name: str
    tmp_path: str
    images: tuple[ImageFile, ...]
    verify: str
    reader: ImageReader | None = None
    on_corrupt: str = "error"


def _init_worker(counter) -> None:
    global _COUNTER
    _COUNTER = counter


_COUNTER = None


def _example(img: ImageFile, data: bytes, height: int, width: int) -> bytes:
    """The serialized ``tf.train.Example`` of one checked image."""
    return encode_example(
        {
            "image/encoded": data,
            "image/format": b"JPEG",
            "image/class/label": img.label,
            "image/class/synset": img.wnid,
            "image/height": height,
            "image/width": width,
            "image/filename": img.filename,
        }
    )


def _write_shard(job: _ShardJob) -> tuple[ShardInfo | None, list[str], Quality]:
    """Write one shard (in a worker process). Returns the shard's info, the
    list of bad files (then the info is ``None``: with ``on_corrupt="error"``
    any unusable image fails the shard) and the quality tally."""
    problems: list[str] = []
    quality: Quality = ({}, [])
    pending = 0
    written = 0
    with open(job.tmp_path, "wb") as f:
        for k, img in enumerate(job.images):
            try:
                data = job.reader.read(img)
            except (OSError, SparkImagenetError) as e:
                problems.append(f"{job.reader.where(img)}: cannot read ({getattr(e, 'strerror', None) or e})")
                continue
            stored, height, width, finding = check_image(data, img.filename, job.verify)
            note(quality, k, finding, stored)
            if stored is None:
                if job.on_corrupt == "error":
                    problems.append(f"{job.reader.where(img)}: {finding.reason}")
            elif not problems:
                write_record(f, _example(img, stored, height, width))
                written += 1
            pending += 1
            if _COUNTER is not None and pending >= 16:
                with _COUNTER.get_lock():
                    _COUNTER.value += pending
                pending = 0
    if _COUNTER is not None and pending:
        with _COUNTER.get_lock():
            _COUNTER.value += pending
    if problems:
        os.unlink(job.tmp_path)
        return None, problems, quality
    size = os.path.getsize(job.tmp_path)
    return ShardInfo(job.name, written, size, crc32c_file(job.tmp_path)), [], quality


def _spill_path(job: _ShardJob) -> str:
    """Where the stream form collects a shard's records in arrival order
    (a name the leftover clean-up of an interrupted build removes)."""
    return job.tmp_path + ".spill"


def _assemble_shard(job: _ShardJob, index: list[tuple[int, int] | None]) -> tuple[ShardInfo, list[str], Quality]:
    """Copy a shard's records from its spill file into plan order (in a worker
    process), then delete the spill file. ``index[i]`` is the (offset, length)
    of the shard's i-th planned record in the spill file, ``None`` for a
    skipped image (``on_corrupt="skip"``)."""
    spill = _spill_path(job)
    with open(spill, "rb") as src, open(job.tmp_path, "wb") as f:
        fd = src.fileno()
        for place in index:
            if place is not None:
                f.write(os.pread(fd, place[1], place[0]))
    if os.path.exists(spill):  # absent when every image of the shard was skipped
        os.unlink(spill)
    size = os.path.getsize(job.tmp_path)
    written = sum(place is not None for place in index)
    return ShardInfo(job.name, written, size, crc32c_file(job.tmp_path)), [], ({}, [])


#: The stream form hands images to the pool in batches of this many images or bytes, whichever
#: comes first (one task per image spends more time in the pool's queues than in the check).
STREAM_BATCH_IMAGES = 32
STREAM_BATCH_BYTES = 4 * 1024 * 1024


def _check_and_frame(batch: list[tuple[ImageFile, bytes]], verify: str) -> list[tuple[bytes | None, Finding]]:
    """Check (and repair) a batch of images and return, per image, its whole
    TFRecord (framing included), or ``None`` for an unusable image, and what
    :func:`check_image` found (in a worker process, for the stream form)."""
    out: list[tuple[bytes | None, Finding]] = []
    for img, data in batch:
        stored, height, width, finding = check_image(data, img.filename, verify)
        if stored is None:
            out.append((None, finding))
            continue
        buf = io.BytesIO()
        write_record(buf, _example(img, stored, height, width))
        out.append((buf.getvalue(), finding))
    if _COUNTER is not None:
        with _COUNTER.get_lock():
            _COUNTER.value += len(batch)
    return out


class _SpillWriter:
    """Appends records to the spill files of the stream form in a thread of
    its own (file writes release the GIL, so the stream keeps being read).

    At most ``capacity`` spill files are open at a time (least recently used
    closed first; full ImageNet has over 1,000 shards). Offsets are assigned
    when a record is queued: one writer appends in queue order.
    """

    def __init__(self, jobs: list[_ShardJob], capacity: int, queued: int = 64):
        import queue
        import threading

        self._jobs = jobs
        self._open: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._capacity = max(1, capacity)
        self._queue: queue.Queue = queue.Queue(queued)
        self.sizes = [0] * len(jobs)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="spill-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self.error is not None:
                continue  # drain
            j, record = item
            try:
                f = self._open.pop(j, None)
                if f is None:
                    if len(self._open) >= self._capacity:
                        self._open.popitem(last=False)[1].close()
                    f = open(_spill_path(self._jobs[j]), "ab")
                self._open[j] = f
                f.write(record)
            except BaseException as e:  # reported by append() / close()
                self.error = e
        while self._open:
            try:
                self._open.popitem()[1].close()
            except OSError as e:
                self.error = self.error or e

    def append(self, j: int, record: bytes) -> int:
        """Queue a record for job ``j``'s spill file; returns its offset there.

        Raises:
            OSError: an earlier write failed (e.g. the disk is full).
        """
        if self.error is not None:
            raise self.error
        offset = self.sizes[j]
        self.sizes[j] += len(record)
        self._queue.put((j, record))
        return offset

    def close(self, check: bool = True) -> None:
        """Write what is queued and close the files.

        Args:
            check: raise the first write error, if any (False while another
                error is already on its way up).
        """
        self._queue.put(None)
        self._thread.join()
        if check and self.error is not None:
            raise self.error


def _stream_images(pool, src: SourceDataset, jobs: list[_ShardJob], verify: str, in_flight: int,
                   counter, bar) -> tuple[list[list[tuple[int, int] | None]], list[str], list[Quality]]:
    """Pass 2 of the nested-tar form: read the planned images from the stream
    (main process), have ``pool`` check and encode them (:func:`_check_and_frame`),
    append each record to its shard's spill file in arrival order.

    Args:
        pool: the worker pool.
        src: the source (a stream: ``src.source.random_access`` is False).
        jobs: the shards and their planned images.
        verify: ``"decode"`` or ``"header"``.
        in_flight: batches handed to the pool and not yet written, at most.
        counter: shared count of images checked (for the progress bar).
        bar: tqdm bar or ``None``.

    Returns:
        tuple: per job the (offset, length) of each planned record in its
        spill file (``None`` for a skipped image), the list of bad files
        (once there is one, nothing more is spilled) and per job the quality
        tally (see :func:`_write_shard`).
    """
    place = {img.path: (j, k) for j, job in enumerate(jobs) for k, img in enumerate(job.images)}
    planned = [img for job in jobs for img in job.images]
    index: list[list[tuple[int, int] | None]] = [[(0, 0)] * len(job.images) for job in jobs]
    problems: list[str] = []
    quality: list[Quality] = [({}, []) for _ in jobs]
    waiting: collections.deque = collections.deque()
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        soft = 256
    spills = _SpillWriter(jobs, min(len(jobs), (soft if soft > 0 else 256) // 2))

    def settle() -> None:
        result, places = waiting.popleft()
        for (j, k), (record, finding) in zip(places, result.get()):
            note(quality[j], k, finding, record)
            if record is None:
                if jobs[j].on_corrupt == "error":
                    problems.append(f"{src.where(jobs[j].images[k])}: {finding.reason}")
                index[j][k] = None
            elif not problems:
                index[j][k] = (spills.append(j, record), len(record))
        if bar is not None:
            bar.update(counter.value - bar.n)

    batch: list[tuple[ImageFile, bytes]] = []
    places: list[tuple[int, int]] = []

    def submit() -> None:
        waiting.append((pool.apply_async(_check_and_frame, (list(batch), verify)), list(places)))
        batch.clear()
        places.clear()
        while len(waiting) >= in_flight:
            settle()

    try:
        batch_bytes = 0
        for img, data in src.source.stream(planned):
            j, k = place[img.path]
            batch.append((jobs[j].images[k], data))
            places.append((j, k))
            batch_bytes += len(data)
            if len(batch) >= STREAM_BATCH_IMAGES or batch_bytes >= STREAM_BATCH_BYTES:
                submit()
                batch_bytes = 0
        if batch:
            submit()
        while waiting:
            settle()
    except BaseException:
        spills.close(check=False)
        raise
    spills.close()
    return index, problems, quality


def _auto_shards(images: Sequence[ImageFile], minimum: int) -> int:
    nbytes = sum(i.size for i in images)
    return max(1, min(len(images), max(minimum, math.ceil(nbytes / TARGET_SHARD_BYTES))))


def _deal(images: Sequence[ImageFile], count: int) -> list[tuple[ImageFile, ...]]:
    """Round-robin: shard ``k`` gets images ``k, k+count, ...`` (sizes differ by <= 1)."""
    return [tuple(images[k::count]) for k in range(count)]


def plan_shards(
    source: SourceDataset, train_shards: int | None, val_shards: int | None, seed: int
) -> dict[str, list[tuple[ImageFile, ...]]]:
    """Decide which image goes to which shard.

    Args:
        source: the listed source images.
        train_shards: number of train shards, or ``None`` for automatic
            (about 128 MiB per shard, at least 16, at most one per image).
        val_shards: number of val shards, or ``None`` for automatic (at least 4).
        seed: seed of the train shuffle (``random.Random(seed)``).

    Returns:
        dict[str, list[tuple[ImageFile, ...]]]: per split, the images of each
        shard in record order.

    Raises:
        ConfigError: a shard count below 1 or above the number of images.
    """
    plan = {}
    train = list(source.train)
    random.Random(seed).shuffle(train)
    for split, images, count, option, minimum in (
        ("train", train, train_shards, "--train-shards", MIN_AUTO_TRAIN_SHARDS),
        ("val", list(source.val), val_shards, "--val-shards", MIN_AUTO_VAL_SHARDS),
    ):
        if count is None:
            count = _auto_shards(images, minimum)
        if not 1 <= count <= len(images):
            raise ConfigError(
                f"{option} {count}: must be between 1 and the number of {split} images ({len(images)}), "
                "so that no shard is empty"
            )
        plan[split] = _deal(images, count)
    return plan


def dataset_fingerprint(plan: dict[str, list[tuple[ImageFile, ...]]], source: SourceDataset,
                        on_corrupt: str = "error") -> str:
    """SHA-256 (hex, first 16 bytes) of what a build would write: the format
    version, the classes, and per shard the file names (relative to the
    Kaggle root, so a directory and the zip it came from give the same id),
    sizes and labels in record order. Equal fingerprints mean equal datasets.

    ``on_corrupt="skip"`` is part of the fingerprint (the default ``"error"``
    adds nothing, so ids of earlier builds stay the same): a skip build leaves
    out the unusable files, which are known only after reading them, so its
    dataset may differ from the planned one, and is never taken for an error
    build's (which holds every planned file)."""
    h = hashlib.sha256(f"spark-imagenet/{FORMAT_VERSION}\n".encode())
    if on_corrupt != "error":
        h.update(f"on-corrupt {on_corrupt}\n".encode())
    for c in source.classes:
        h.update(f"class {c.id} {c.wnid}\n".encode())
    for split, shards in plan.items():
        for k, images in enumerate(shards):
            h.update(f"shard {split} {k} {len(shards)}\n".encode())
            for img in images:
                h.update(f"{source.relpath(img)} {img.size} {img.label}\n".encode())
    return h.hexdigest()[:32]


def shard(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    train_shards: int | None = None,
    val_shards: int | None = None,
    classes: int | None = None,
    class_list: str | os.PathLike | None = None,
    per_class: int | None = None,
    seed: int = 0,
    processes: int | None = None,
    verify: str = "decode",
    on_corrupt: str = "error",
    overwrite: bool = False,
    transfers: int = DEFAULT_TRANSFERS,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> Manifest:
    """Build TFRecord shards and ``manifest.json`` from ImageNet in the Kaggle layout.

    Args:
        source: the unpacked Kaggle ``imagenet-object-localization-challenge``
            folder (see :mod:`spark_imagenet.source.layout`), or the downloaded zip
            in either of its forms, read without unpacking (see
            :mod:`spark_imagenet.source.zip_archive`; the older form with a nested
            tar.gz is read as a stream, twice: :mod:`spark_imagenet.source.tar_stream`).
            The manifest records its resolved absolute path.
        out: bucket URL for the shards: a local path, ``file://`` URL or
            ``gs://bucket/prefix`` (shards are then staged in a temporary
            folder and uploaded, see :mod:`spark_imagenet.dataset.transfer`).
        train_shards: number of train shards (``None``: about 128 MiB each,
            at least 16). Training needs at least as many as workers.
        val_shards: number of val shards (``None``: automatic, at least 4).
        classes: keep the first K classes (``--classes``).
        class_list: file of wnids to keep (``--class-list``).
        per_class: at most M train images per class (``--per-class``).
        seed: seed of the per-class sample and of the train shuffle.
        processes: worker processes (``None``: all cores).
        verify: ``"decode"`` (default) or ``"header"``, see
            :func:`spark_imagenet.dataset.quality.classify`.
        on_corrupt: what to do with unusable (empty, truncated, undecodable)
            files: ``"error"`` (default) fails the build listing every one;
            ``"skip"`` leaves them out and records each in
            ``quality-report.json``. Repairable files (CMYK, YCCK, other
            formats, EXIF orientation) are repaired either way, see
            :mod:`spark_imagenet.dataset.quality`.
        overwrite: replace a different dataset already at ``out``.
        transfers: parallel uploads to a remote ``out`` (``--transfers``).
        progress: show a tqdm progress bar on stderr (images/s).
        log: where to print one-line status messages (``None``: stderr).

    Returns:
        Manifest: the manifest that was written (or found, when ``out``
        already holds exactly this dataset: then nothing is rewritten).

    Raises:
        LayoutError: ``source`` is not in the Kaggle layout or inconsistent;
            for a zip also :class:`~spark_imagenet.errors.ArchiveError`
            (truncated, damaged, or not a Kaggle archive).
        ConfigError: bad option values, ``out`` holds a different dataset,
            or another run committed a different dataset to ``out`` while
            this one was building (this run's shards are removed again).
        ImageError: some images are unusable (``on_corrupt="error"``); lists every one.
        StorageError: ``out`` cannot be written, or an upload fails
            verification twice.
    """
    if log is None:
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    if verify not in VERIFY_MODES:
        raise ConfigError(f"--verify {verify!r}: choose one of {', '.join(VERIFY_MODES)}")
    if on_corrupt not in ON_CORRUPT_MODES:
        raise ConfigError(f"--on-corrupt {on_corrupt!r}: choose one of {', '.join(ON_CORRUPT_MODES)}")
    if processes is not None and processes < 1:
        raise ConfigError(f"processes={processes}: must be at least 1")
    src = open_source(source).list_images(num_classes=classes, class_list=class_list, per_class=per_class,
                                          seed=seed, progress=progress, log=log)
    plan = plan_shards(src, train_shards, val_shards, seed)
    dataset_id = dataset_fingerprint(plan, src, on_corrupt)
    if transfers < 1:
        raise ConfigError(f"--transfers {transfers}: must be at least 1")
    storage = open_storage(out)
    dest = check_destination(storage, dataset_id, overwrite)
    if dest.existing is not None:
        log(f"{storage.url} already holds this dataset (id {dataset_id}); nothing to do")
        return dest.existing

    created_root = not storage.root_exists()
    try:
        options = _Options(verify, on_corrupt, processes, transfers, progress, log)
        return _build(storage, dest, src, plan, dataset_id, options)
    except BaseException:
        if created_root:
            storage.remove_empty_root()  # "nothing was written" includes the folder itself
        raise




@dataclasses.dataclass(frozen=True)
class _Options:
    """The settings of one build (see :func:`shard`)."""

    verify: str
    on_corrupt: str
    processes: int | None
    transfers: int
    progress: bool
    log: Callable[[str], None]


def _build(storage: Storage, dest: Destination, src: SourceDataset, plan: dict, dataset_id: str,
           options: _Options) -> Manifest:
    """Write the shards of ``plan``, publish them, then commit the manifest
    (see :func:`shard` and :mod:`spark_imagenet.dataset.transfer`)."""
    log = options.log
    staging, tmp_root = _staging(storage, dest)
    remote = tmp_root is not None
    jobs = _jobs(src, plan, staging, dataset_id, options)
    total = sum(len(j.images) for j in jobs)
    n_proc = min(options.processes or os.cpu_count() or 1, len(jobs))
    log(
        f"sharding {len(src.train)} train + {len(src.val)} val images of {len(src.classes)} classes "
        f"into {len(plan['train'])} + {len(plan['val'])} shards with {n_proc} processes"
    )
    start = time.perf_counter()
    # A remote --out gets each shard uploaded (verified) as soon as it is written, so the local staging
    # folder holds only shards in flight; nothing is visible to readers before the manifest commit.
    uploader = _Uploader(storage, dest, options.transfers) if remote else None
    try:
        results, problems, quality = _run_pool(jobs, src, n_proc, staging, remote, uploader, options, total)
        if uploader is not None:
            uploader.finish(problems)
        if problems:
            raise _image_error(problems, storage.url)
        if uploader is None:  # staged beside the objects: publish by renaming
            for j in jobs:
                storage.put_file(j.tmp_path, j.name, move=True)
        else:
            log(f"uploaded {len(uploader.uploads)} shard(s) to {storage.url}, each verified against its CRC32C "
                f"({options.transfers} parallel transfer(s))")
    except BaseException:
        if uploader is not None:
            uploader.abort()
        raise
    finally:
        for j in jobs:
            for path in (j.tmp_path, _spill_path(j)):
                if os.path.exists(path):
                    os.unlink(path)
        if tmp_root is not None:
            tmp_root.cleanup()
    seconds = time.perf_counter() - start
    manifest, splits = _commit(storage, dest, src, plan, results, quality, dataset_id, options)
    log(
        f"wrote {sum(s.examples for s in splits.values())} examples "
        f"({sum(s.bytes for s in splits.values()) / 1e6:.1f} MB) from {total} files in {seconds:.1f} s "
        f"({total / max(seconds, 1e-9):.0f} files/s) to {storage.url}"
    )
    return manifest


def _staging(storage: Storage, dest: Destination) -> tuple[Path, Any]:
    """Where shards are written before they are published, and the temporary folder to clean up
    (``None`` for a local ``out``, whose staging folder is ``out`` itself); removes the leftovers
    of an interrupted build there."""
    staging = storage.staging_dir()
    tmp_root = None
    if staging is None:
        import tempfile

        tmp_root = tempfile.TemporaryDirectory(prefix="spark-imagenet-shard-")
        staging = Path(tmp_root.name)
    for name in dest.objects:  # leftovers of an interrupted build
        if PARTIAL_RE.match(name):
            storage.delete(name)
    return staging, tmp_root


def _jobs(src: SourceDataset, plan: dict, staging: Path, dataset_id: str, options: _Options) -> list[_ShardJob]:
    """One job per shard, with a reader of its images when the source has random access."""
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    source = src.source
    return [
        _ShardJob(split, k, name, str(staging / partial_name(name, token)), images, options.verify,
                  source.reader(images) if source.random_access else None, options.on_corrupt)
        for split, shards in plan.items()
        for k, images in enumerate(shards)
        for name in [shard_name(split, k, len(shards), dataset_id)]
    ]


class _Uploader:
    """Uploads each shard (verified) as soon as it is written, for a remote ``out``; deletes the local
    file after its upload.

    Attributes:
        uploads: per shard name, its upload.
    """

    def __init__(self, storage: Storage, dest: Destination, transfers: int):
        self._storage = storage
        self._dest = dest
        self._pool = concurrent.futures.ThreadPoolExecutor(transfers, thread_name_prefix="upload")
        self.uploads: dict[str, concurrent.futures.Future] = {}

    def _upload_one(self, path: str, info: ShardInfo) -> None:
        try:
            publish(self._storage, [(path, info)], present=self._dest.objects, transfers=1)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def submit(self, path: str, info: ShardInfo) -> None:
        """Start uploading the shard file ``path`` as ``info.name``."""
        self.uploads[info.name] = self._pool.submit(self._upload_one, path, info)

    def check(self) -> None:
        """Raise the error of the first upload that failed (the client already retried it)."""
        broken = next((f.exception() for f in self.uploads.values() if f.done() and f.exception()), None)
        if broken is not None:
            raise broken

    def finish(self, problems: list[str]) -> None:
        """Wait for every upload.

        Raises:
            StorageError: some failed (unless ``problems``, bad images, will be the error).
        """
        self._pool.shutdown(wait=True)
        failed = [str(f.exception()) for f in self.uploads.values() if f.exception() is not None]
        if failed and not problems:
            raise StorageError(f"{len(failed)} shard(s) could not be uploaded to {self._storage.url}; nothing was "
                               "committed:" + "".join(f"\n  {m}" for m in failed[:20]))

    def abort(self) -> None:
        """Cancel what has not started, and delete the shards uploaded but never committed."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        committed = self._dest.committed
        keep = {s.name for split in committed.splits.values() for s in split.shards} if committed else set()
        for name in self.uploads:
            if name not in keep:
                with contextlib.suppress(StorageError):
                    self._storage.delete(name, best_effort=True)


def _run_pool(jobs: list[_ShardJob], src: SourceDataset, n_proc: int, staging: Path, remote: bool,
              uploader: _Uploader | None, options: _Options,
              total: int) -> tuple[dict[str, ShardInfo], list[str], dict[str, Quality]]:
    """Write every shard in a pool of ``n_proc`` processes: each job reads its own images, or
    (a stream source) the main process streams them to the pool (:func:`_stream_images`) and the
    pool then assembles each shard from its spill file.

    Returns:
        tuple: the written shards by name, the bad files, and per shard name its quality tally.
    """
    results: dict[str, ShardInfo] = {}
    problems: list[str] = []
    quality: dict[str, Quality] = {}
    ctx = mp.get_context("spawn")
    counter = ctx.Value("q", 0)
    with ctx.Pool(n_proc, initializer=_init_worker, initargs=(counter,)) as pool:
        streamed = not src.source.random_access
        pending = [] if streamed else [pool.apply_async(_write_shard, (j,)) for j in jobs]
        job_of = dict(zip(pending, jobs))
        if streamed:
            options.log(f"reading the images from {src.source.where_source()} (pass 2 of 2 over the compressed "
                        "stream)")
        bar = None
        if options.progress:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="img", desc="shard", file=sys.stderr, dynamic_ncols=True)
        try:
            if streamed:
                index, problems, stream_quality = _stream_images(pool, src, jobs, options.verify, 2 * n_proc,
                                                                 counter, bar)
                quality.update((j.name, q) for j, q in zip(jobs, stream_quality))
                pending = [] if problems else [pool.apply_async(_assemble_shard, (j, index[i]))
                                               for i, j in enumerate(jobs)]
                job_of.update(zip(pending, jobs))
            while pending:
                pending[0].wait(0.2)
                pending = _collect(pending, job_of, results, problems, quality, uploader, staging, remote)
                if uploader is not None:
                    uploader.check()  # stop at the first failed upload
                if bar is not None:
                    bar.update(counter.value - bar.n)
        finally:
            if bar is not None:
                bar.close()
    return results, problems, quality


def _collect(pending: list, job_of: dict, results: dict[str, ShardInfo], problems: list[str],
             quality: dict[str, Quality], uploader: _Uploader | None, staging: Path, remote: bool) -> list:
    """Take in the finished jobs of ``pending`` (their shards, bad files and tallies; a finished
    shard goes to ``uploader`` while no image has failed); return the unfinished ones.

    Raises:
        StorageError: a worker could not write to the staging folder.
    """
    still = []
    for r in pending:
        if not r.ready():
            still.append(r)
            continue
        try:
            info, bad, tally = r.get()
        except OSError as e:  # raised in a worker: the staging disk, mostly
            raise StorageError(
                f"cannot write shards to {staging} ({e.strerror or e}"
                f"{': ' + e.filename if getattr(e, 'filename', None) else ''}). Free space "
                "there" + (", or point TMPDIR at a larger disk" if remote else ", or choose another --out")
                + ", and run again"
            ) from None
        problems += bad
        if tally[0]:
            quality[job_of[r].name] = tally
        if info is not None:
            results[info.name] = info
            if uploader is not None and not problems:
                uploader.submit(job_of[r].tmp_path, info)
    return still


def _image_error(problems: list[str], url: str) -> ImageError:
    """The error of a build with unusable images (``on_corrupt="error"``), listing them."""
    return ImageError(
        f"{len(problems)} image file(s) are empty, truncated or do not decode; nothing was written "
        f"to {url}. Fix or remove them (or leave their classes out), or pass --on-corrupt skip "
        "(on_corrupt=\"skip\") to leave them out, and run again:"
        + "".join(f"\n  {p}" for p in sorted(problems)[:MAX_LISTED])
        + (f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else "")
    )


def _commit(storage: Storage, dest: Destination, src: SourceDataset, plan: dict, results: dict[str, ShardInfo],
            quality: dict[str, Quality], dataset_id: str, options: _Options) -> tuple[Manifest, dict[str, SplitInfo]]:
    """Write the quality report, then commit the manifest (unless this dataset was committed
    before), then remove the shards of a dataset it replaced.

    Returns:
        tuple: the committed manifest, and the splits this build wrote.
    """
    report = quality_report(src, plan, quality, dataset_id, options.verify, options.on_corrupt)
    for line in format_quality(report):
        options.log(line)
    splits = {
        split: SplitInfo(tuple(results[shard_name(split, k, len(shards), dataset_id)] for k in range(len(shards))))
        for split, shards in plan.items()
    }
    manifest = Manifest(
        dataset_id=dataset_id,
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        classes=src.classes,
        splits=splits,
        source=src.source.describe(),
        selection={**src.selection, "train_shards": len(plan["train"]), "val_shards": len(plan["val"]),
                   "verify": options.verify, "on_corrupt": options.on_corrupt, "quality": quality_totals(report)},
        feature_keys=FEATURE_KEYS,
    )
    # The report goes first: a manifest is never visible without the report of its build.
    write_quality_report(storage, report)
    if dest.committed is not None and dest.committed.splits == manifest.splits:
        return dest.committed, splits  # this dataset was committed before; its lost shards are back now
    committed = commit_manifest(storage, manifest, dest.generation, log=options.log)
    if committed is manifest:  # this run committed: the shards of what it replaced (--overwrite) go
        remove_replaced(storage, manifest, dest.objects)
    return committed, splits
