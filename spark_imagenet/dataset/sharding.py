"""Building TFRecord shards and their manifest from a Kaggle-layout source.

What a build does (:func:`shard`):

1. list the chosen labelled images (:func:`spark_imagenet.source.layout.read_layout`
   for a folder, :func:`spark_imagenet.source.archive.read_zip_layout` for the
   downloaded zip, read in place);
2. shuffle the train images across classes with the seed and deal them
   round-robin to the shards (so shard sizes differ by at most one example and
   every shard mixes classes); val images are dealt in file-name order;
3. write the shards in parallel worker processes (one shard per job), each
   image's bytes stored as read (no decode/re-encode), after checking that the
   file is a JPEG that decodes and needs no repair (Pillow, see
   :func:`check_image` and :mod:`spark_imagenet.dataset.quality`: CMYK/YCCK JPEGs,
   other formats and EXIF-rotated images are stored as repaired RGB JPEGs,
   unusable files fail the build or are skipped, ``on_corrupt``). A folder or a
   zip in the current form: each worker reads its shard's images itself. The
   older zip form (a nested tar.gz, one stream): the main process reads the
   stream, a process pool checks the images, each record is appended to a
   spill file of its shard, and the workers then copy every shard's records
   into plan order (see :func:`_stream_images`). Either way the shards are
   byte for byte the same as from the unpacked folder;
4. only when every image passed (or was skipped): publish the shards under
   their final names, write ``quality-report.json`` (what was repaired or
   skipped, counts per category), then ``manifest.json`` last and atomically.

An interrupted or failed build leaves no manifest (so nothing can train on a
partial dataset) and no half-written shard under a final name.

Feature keys of every record are those of TensorFlow's reference ImageNet
converter (tensorflow/models ``build_imagenet_data.py``), with 0-based labels:
see :data:`FEATURE_KEYS`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as _dt
import hashlib
import io
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence


from spark_imagenet.errors import ConfigError, ImageError, SparkImagenetError, StorageError
from spark_imagenet.source.layout import ImageFile, SourceDataset, read_layout
from spark_imagenet.dataset.quality import CATEGORIES, Finding, classify, repair
from spark_imagenet.dataset.manifest import FORMAT_VERSION, Manifest, ShardInfo, SplitInfo
from spark_imagenet.storage import DEFAULT_TRANSFERS, Storage, crc32c_file, open_storage
from spark_imagenet.dataset.transfer import (
    PARTIAL_RE,
    Destination,
    check_destination,
    commit_manifest,
    publish,
    remove_replaced,
    shard_name,
)
from spark_imagenet.dataset.tfrecord import encode_example, write_record

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
#: The quality report's object name, beside ``manifest.json``.
QUALITY_REPORT_NAME = "quality-report.json"


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
        (``finding.category`` ``empty`` or ``corrupt``).
    """
    finding = classify(data, name, verify)
    if not finding.usable:
        return None, 0, 0, finding
    try:
        stored, height, width = repair(data, finding)
    except Exception as e:  # decodes at 1/8 scale but not at full size (or verify="header")
        finding = dataclasses.replace(finding, category="corrupt", reason=f"does not decode for repair: {e}")
        return None, 0, 0, finding
    return stored, height, width, finding


@dataclasses.dataclass(frozen=True)
class _ShardJob:
    split: str
    index: int
    name: str
    tmp_path: str
    images: tuple[ImageFile, ...]
    verify: str
    reader: Any = None  # None: files on disk; else reads the images from a zip (archive.ZipMemberReader)
    on_corrupt: str = "error"

    def where(self, img: ImageFile) -> str:
        """How messages name an image's file."""
        return img.path if self.reader is None else self.reader.where(img.path)


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


#: What a worker reports about its images' quality: the count per category, and per repaired or
#: skipped image ``(index in the job, category, reason, action)`` with action ``"repaired"`` or ``"skipped"``.
Quality = tuple[dict[str, int], list[tuple[int, str, str, str]]]


def _note(quality: Quality, k: int, finding: Finding, stored: bytes | None) -> None:
    counts, files = quality
    counts[finding.category] = counts.get(finding.category, 0) + 1
    if stored is None:
        files.append((k, finding.category, finding.reason or "", "skipped"))
    elif finding.needs_repair:
        files.append((k, finding.category, finding.reason or "", "repaired"))


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
                if job.reader is None:
                    with open(img.path, "rb") as src:
                        data = src.read()
                else:
                    data = job.reader.read(img.path)
            except (OSError, SparkImagenetError) as e:
                problems.append(f"{job.where(img)}: cannot read ({getattr(e, 'strerror', None) or e})")
                continue
            stored, height, width, finding = check_image(data, img.filename, job.verify)
            _note(quality, k, finding, stored)
            if stored is None:
                if job.on_corrupt == "error":
                    problems.append(f"{job.where(img)}: {finding.reason}")
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
        src: the source (``src.archive.streamed``).
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
            _note(quality[j], k, finding, record)
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
        for name, data in src.archive.stream(set(place)):
            j, k = place[name]
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
            :mod:`spark_imagenet.source.archive`; the older form with a nested
            tar.gz is read as a stream, twice).
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
    from spark_imagenet.source.archive import is_zip_source, read_zip_layout

    if is_zip_source(source):
        src = read_zip_layout(source, num_classes=classes, class_list=class_list, per_class=per_class, seed=seed,
                              progress=progress, log=log)
    else:
        src = read_layout(source, num_classes=classes, class_list=class_list, per_class=per_class, seed=seed)
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
        return _build(storage, dest, src, plan, dataset_id, verify, on_corrupt, processes, transfers, progress, log)
    except BaseException:
        if created_root:
            storage.remove_empty_root()  # "nothing was written" includes the folder itself
        raise


def _build(storage: Storage, dest: Destination, src: SourceDataset, plan: dict, dataset_id: str, verify: str,
           on_corrupt: str, processes: int | None, transfers: int, progress: bool, log: Callable[[str], None]) -> Manifest:
    """Write the shards of ``plan``, publish them, then commit the manifest
    (see :func:`shard` and :mod:`spark_imagenet.dataset.transfer`)."""
    staging = storage.staging_dir()
    tmp_root = None
    if staging is None:
        import tempfile

        tmp_root = tempfile.TemporaryDirectory(prefix="spark-imagenet-shard-")
        staging = Path(tmp_root.name)
    for name in dest.objects:  # leftovers of an interrupted build
        if PARTIAL_RE.match(name):
            storage.delete(name)
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    streamed = src.archive is not None and src.archive.streamed
    jobs = [
        _ShardJob(split, k, name, str(staging / f".{name}.partial-{token}"), images, verify,
                  src.archive.reader(images) if src.archive is not None and not streamed else None, on_corrupt)
        for split, shards in plan.items()
        for k, images in enumerate(shards)
        for name in [shard_name(split, k, len(shards), dataset_id)]
    ]
    total = sum(len(j.images) for j in jobs)
    n_proc = min(processes or os.cpu_count() or 1, len(jobs))
    log(
        f"sharding {len(src.train)} train + {len(src.val)} val images of {len(src.classes)} classes "
        f"into {len(plan['train'])} + {len(plan['val'])} shards with {n_proc} processes"
    )
    start = time.perf_counter()
    results: dict[str, ShardInfo] = {}
    problems: list[str] = []
    quality: dict[str, Quality] = {}  # per shard name
    job_of: dict[Any, str] = {}  # pending result -> shard name
    ctx = mp.get_context("spawn")
    counter = ctx.Value("q", 0)
    # A remote --out gets each shard uploaded (verified) as soon as it is written, so the local staging
    # folder holds only shards in flight; nothing is visible to readers before the manifest commit.
    uploader = None
    uploads: dict[str, Any] = {}
    if tmp_root is not None:
        import concurrent.futures

        uploader = concurrent.futures.ThreadPoolExecutor(transfers, thread_name_prefix="upload")

    def upload_one(path: str, info: ShardInfo) -> None:
        try:
            publish(storage, [(path, info)], present=dest.objects, transfers=1)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    try:
        with ctx.Pool(n_proc, initializer=_init_worker, initargs=(counter,)) as pool:
            if not streamed:
                pending = [pool.apply_async(_write_shard, (j,)) for j in jobs]
                job_of.update((r, j.name) for r, j in zip(pending, jobs))
            else:
                log(f"reading the images from {src.archive.path} member {src.archive.tar_member} "
                    "(pass 2 of 2 over the compressed stream)")
            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=total, unit="img", desc="shard", file=sys.stderr, dynamic_ncols=True)
            try:
                if streamed:
                    index, problems, stream_quality = _stream_images(pool, src, jobs, verify, 2 * n_proc, counter, bar)
                    quality.update((j.name, q) for j, q in zip(jobs, stream_quality))
                    pending = [] if problems else [pool.apply_async(_assemble_shard, (j, index[i]))
                                                   for i, j in enumerate(jobs)]
                while pending:
                    pending[0].wait(0.2)
                    still = []
                    for r in pending:
                        if r.ready():
                            try:
                                info, bad, tally = r.get()
                            except OSError as e:  # raised in a worker: the staging disk, mostly
                                raise StorageError(
                                    f"cannot write shards to {staging} ({e.strerror or e}"
                                    f"{': ' + e.filename if getattr(e, 'filename', None) else ''}). Free space "
                                    "there" + (", or point TMPDIR at a larger disk" if tmp_root is not None else
                                               ", or choose another --out") + ", and run again"
                                ) from None
                            problems += bad
                            if tally[0]:
                                quality[job_of[r]] = tally
                            if info is not None:
                                results[info.name] = info
                                if uploader is not None and not problems:
                                    job = next(j for j in jobs if j.name == info.name)
                                    uploads[info.name] = uploader.submit(upload_one, job.tmp_path, info)
                        else:
                            still.append(r)
                    pending = still
                    broken = next((f.exception() for f in uploads.values() if f.done() and f.exception()), None)
                    if broken is not None:  # stop at the first failed upload (the client already retried)
                        raise broken
                    if bar is not None:
                        bar.update(counter.value - bar.n)
            finally:
                if bar is not None:
                    bar.close()
        if uploader is not None:
            uploader.shutdown(wait=True)
            failed = [str(f.exception()) for f in uploads.values() if f.exception() is not None]
            if failed and not problems:
                raise StorageError(f"{len(failed)} shard(s) could not be uploaded to {storage.url}; nothing was "
                                   "committed:" + "".join(f"\n  {m}" for m in failed[:20]))
        if problems:
            raise ImageError(
                f"{len(problems)} image file(s) are empty, truncated or do not decode; nothing was written "
                f"to {storage.url}. Fix or remove them (or leave their classes out), or pass --on-corrupt skip "
                "(on_corrupt=\"skip\") to leave them out, and run again:"
                + "".join(f"\n  {p}" for p in sorted(problems)[:50])
                + (f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else "")
            )
        if uploader is None:  # staged beside the objects: publish by renaming
            for j in jobs:
                storage.put_file(j.tmp_path, j.name, move=True)
        else:
            log(f"uploaded {len(uploads)} shard(s) to {storage.url}, each verified against its CRC32C "
                f"({transfers} parallel transfer(s))")
    except BaseException:
        if uploader is not None:
            uploader.shutdown(wait=True, cancel_futures=True)
            keep = {s.name for split in dest.committed.splits.values() for s in split.shards} if dest.committed else set()
            for name in uploads:  # uploaded but never committed: remove again
                if name not in keep:
                    with contextlib.suppress(StorageError):
                        storage.delete(name, best_effort=True)
        raise
    finally:
        for j in jobs:
            for path in (j.tmp_path, _spill_path(j)):
                if os.path.exists(path):
                    os.unlink(path)
        if tmp_root is not None:
            tmp_root.cleanup()
    seconds = time.perf_counter() - start
    report = quality_report(src, plan, jobs, quality, dataset_id, verify, on_corrupt)
    for line in format_quality(report):
        log(line)
    splits = {
        split: SplitInfo(tuple(results[shard_name(split, k, len(shards), dataset_id)] for k in range(len(shards))))
        for split, shards in plan.items()
    }
    manifest = Manifest(
        dataset_id=dataset_id,
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        classes=src.classes,
        splits=splits,
        source={"kind": "kaggle-cls-loc-dir", "path": src.root} if src.archive is None else src.archive.describe(),
        selection={**src.selection, "train_shards": len(plan["train"]), "val_shards": len(plan["val"]), "verify": verify,
                   "on_corrupt": on_corrupt, "quality": _quality_totals(report)},
        feature_keys=FEATURE_KEYS,
    )
    # The report goes first: a manifest is never visible without the report of its build.
    storage.write_bytes(QUALITY_REPORT_NAME, (json.dumps(report, indent=1) + "\n").encode("utf-8"))
    if dest.committed is not None and dest.committed.splits == manifest.splits:
        manifest = dest.committed  # this dataset was committed before; its lost shards are back now
    else:
        ours = manifest
        manifest = commit_manifest(storage, manifest, dest.generation, log=log)
        if manifest is ours:  # this run committed: the shards of what it replaced (--overwrite) go
            remove_replaced(storage, manifest, dest.objects)
    log(
        f"wrote {sum(s.examples for s in splits.values())} examples "
        f"({sum(s.bytes for s in splits.values()) / 1e6:.1f} MB) from {total} files in {seconds:.1f} s "
        f"({total / max(seconds, 1e-9):.0f} files/s) to {storage.url}"
    )
    return manifest


def quality_report(src: SourceDataset, plan: dict, jobs: list[_ShardJob], quality: dict[str, Quality],
                   dataset_id: str, verify: str, on_corrupt: str) -> dict[str, Any]:
    """The content of ``quality-report.json``.

    Returns:
        dict: ``dataset_id``, ``verify``, ``on_corrupt``; per split
        (``splits``) the files found, examples written, files repaired and
        skipped, and the count per category (:data:`spark_imagenet.dataset.quality.CATEGORIES`);
        ``files``: every repaired or skipped file (``split``, ``file``
        relative to the Kaggle root, ``category``, ``action``, ``reason``),
        sorted by split and file.
    """
    splits: dict[str, dict[str, Any]] = {}
    files: list[dict[str, str]] = []
    for split, shards in plan.items():
        found = sum(len(images) for images in shards)
        counts = dict.fromkeys(CATEGORIES, 0)
        repaired = skipped = 0
        for job in jobs:
            if job.split != split or job.name not in quality:
                continue
            tally, listed = quality[job.name]
            for category, n in tally.items():
                counts[category] += n
            for k, category, reason, action in listed:
                files.append({"split": split, "file": src.relpath(job.images[k]), "category": category,
                              "action": action, "reason": reason})
                repaired += action == "repaired"
                skipped += action == "skipped"
        splits[split] = {"files": found, "examples": found - skipped, "repaired": repaired, "skipped": skipped,
                         "categories": counts}
    files.sort(key=lambda f: (f["split"] != "train", f["file"]))
    return {
        "format": "spark-imagenet-quality-report",
        "format_version": 1,
        "dataset_id": dataset_id,
        "verify": verify,
        "on_corrupt": on_corrupt,
        "splits": splits,
        "files": files,
    }


def _quality_totals(report: dict[str, Any]) -> dict[str, Any]:
    """What the manifest's ``selection["quality"]`` holds: per split the files
    found, examples written, repaired and skipped (``files = examples + skipped``)."""
    return {
        "report": QUALITY_REPORT_NAME,
        **{split: {key: s[key] for key in ("files", "examples", "repaired", "skipped")}
           for split, s in report["splits"].items()},
    }


def format_quality(report: dict[str, Any]) -> list[str]:
    """The short summary of a quality report the CLI prints: one line per
    category that occurred (train and val counts), and the totals."""
    lines = ["image quality (train / val):"]
    splits = report["splits"]
    for category in CATEGORIES:
        counts = [splits[s]["categories"].get(category, 0) for s in ("train", "val") if s in splits]
        if any(counts):
            lines.append(f"  {category:<13} " + " / ".join(str(c) for c in counts))
    total = {key: sum(s[key] for s in splits.values()) for key in ("files", "examples", "repaired", "skipped")}
    lines.append(f"  {total['files']} files found = {total['examples']} examples written + {total['skipped']} "
                 f"skipped; {total['repaired']} repaired (see {QUALITY_REPORT_NAME})")
    return lines


def format_summary(manifest: Manifest, url: str = "") -> str:
    """A human-readable summary of a manifest (what ``spark-imagenet inspect`` prints).

    Args:
        manifest: the manifest.
        url: the bucket URL to show in the first line.

    Returns:
        str: several lines: dataset id, classes (first few wnids), and per
        split the shard count, examples, bytes and min/max examples per shard.
    """
    lines = [
        f"dataset {url}".rstrip(),
        f"  id        {manifest.dataset_id}",
        f"  created   {manifest.created}",
        f"  classes   {manifest.num_classes} (label base 0): "
        + ", ".join(f"{c.id}={c.wnid}" for c in manifest.classes[:5])
        + (" ..." if manifest.num_classes > 5 else ""),
    ]
    for name, split in manifest.splits.items():
        counts = [s.examples for s in split.shards]
        lines.append(
            f"  {name:<9} {len(split.shards)} shards, {split.examples} examples, {split.bytes / 1e6:.1f} MB "
            f"({min(counts)}-{max(counts)} examples per shard)"
        )
    total_ex = sum(s.examples for s in manifest.splits.values())
    total_b = sum(s.bytes for s in manifest.splits.values())
    lines.append(f"  total     {total_ex} examples, {total_b / 1e6:.1f} MB")
    return "\n".join(lines)


def inspect(url: str | os.PathLike) -> Manifest:
    """Load the manifest of a sharded dataset.

    Args:
        url: bucket URL.

    Returns:
        Manifest: the parsed manifest.

    Raises:
        ManifestError: no manifest at ``url``, or an invalid one.
        StorageError: the URL cannot be opened.
    """
    return Manifest.load(open_storage(url))
