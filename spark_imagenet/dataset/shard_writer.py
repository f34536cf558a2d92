"""Writing one shard, in the worker processes of :func:`spark_imagenet.dataset.sharding.shard`.

Every image is checked first (:func:`check_image`,
:mod:`spark_imagenet.dataset.quality`): stored byte for byte, or repaired or
scaled to the dataset's form (:mod:`spark_imagenet.dataset.image_form`), or
(unusable) failing the shard or left out. A random-access source: each worker
reads its shard's images itself and writes the shard (:func:`write_shard`). A
stream source: the main process reads the stream (:func:`stream_images`), the
pool checks and frames the images in batches (:func:`check_and_frame`), each
record is appended to a spill file of its shard (:class:`SpillWriter`), and
the workers then copy every shard's records into plan order
(:func:`assemble_shard`). Either way the shards are byte for byte the same.
Where the bytes are in hand, each usable image also gets its digest
(:func:`spark_imagenet.dataset.duplicates.digest`), for the driver's search for
identical images. The check and the digest read the source's own bytes, never
the re-encoded ones.

The functions run in a ``spawn`` pool (module-level, picklable);
:func:`init_worker` gives each worker the shared count of images checked,
which the progress bar reads.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
from typing import Any

from spark_imagenet.dataset.duplicates import DIGEST_SIZE, NO_DIGEST, DigestTable, digest
from spark_imagenet.dataset.image_form import ORIGINAL, ImageForm
from spark_imagenet.dataset.manifest import ShardInfo
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS
from spark_imagenet.dataset.quality import DECODE_ERRORS, Finding, classify, repair
from spark_imagenet.dataset.report import Quality, note
from spark_imagenet.dataset.tfrecord import encode_example, write_record
from spark_imagenet.errors import SparkImagenetError
from spark_imagenet.source.base import ImageFile, ImageReader, SourceDataset
from spark_imagenet.storage import crc32c_file


def check_image(data: bytes, name: str, verify: str = "decode", max_pixels: int = DEFAULT_MAX_PIXELS,
                form: ImageForm = ORIGINAL) -> tuple[bytes | None, int, int, Finding]:
    """The per-image step of every build path: classify the file (its own
    bytes) and, when it needs it or ``form`` gives it another size, re-encode
    it (see :mod:`spark_imagenet.dataset.quality`).

    Args:
        data: the file's bytes.
        name: how messages name the file.
        verify: ``"decode"`` or ``"header"``, see :func:`spark_imagenet.dataset.quality.classify`.
        max_pixels: the pixel limit (:mod:`spark_imagenet.dataset.pixels`): a larger image is unusable,
            found from its header before it is decoded.
        form: how the dataset stores images (:mod:`spark_imagenet.dataset.image_form`).

    Returns:
        tuple: ``(stored, height, width, finding)``: the bytes to store (the
        file's own bytes unless it was repaired or scaled, then the JPEG) and
        their size in pixels; ``stored`` is ``None`` when the file is unusable
        (``finding.category`` ``empty`` or ``corrupt``, also a file that
        Pillow cannot decode for its repair).

    Raises:
        Exception: anything but a decoder error (:data:`~spark_imagenet.dataset.quality.DECODE_ERRORS`)
            raised while repairing: a bug, never taken for a corrupt file.
    """
    finding = classify(data, name, verify, max_pixels)
    if not finding.usable:
        return None, 0, 0, finding
    try:
        stored, height, width = repair(data, finding, max_pixels, form)
    except DECODE_ERRORS as e:  # decodes at 1/8 scale but not at full size (or verify="header")
        finding = dataclasses.replace(finding, category="corrupt", reason=f"does not decode for repair: {e}")
        return None, 0, 0, finding
    return stored, height, width, finding


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """One shard to write: its images in record order, and where to write it.

    ``reader`` reads the images in a worker process (a random-access source);
    ``None`` when the main process streams them (:func:`stream_images`).
    """

    split: str
    index: int
    name: str
    tmp_path: str
    images: tuple[ImageFile, ...]
    verify: str
    reader: ImageReader | None = None
    on_corrupt: str = "error"
    max_pixels: int = DEFAULT_MAX_PIXELS
    form: ImageForm = ORIGINAL


#: The shared count of images checked (a ``multiprocessing.Value``) in a worker process; None elsewhere.
_COUNTER = None


def init_worker(counter) -> None:
    """The pool's initializer: keep the shared count of images checked (``counter``, a ``multiprocessing.Value``)."""
    global _COUNTER
    _COUNTER = counter


def example(img: ImageFile, data: bytes, height: int, width: int) -> bytes:
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


#: What a problem says after its file's place when the file could not be read: not an unusable image, so never
#: left out, whatever ``on_corrupt``.
READ_FAILED = ": cannot read ("


@dataclasses.dataclass(frozen=True)
class ShardOutcome:
    """What a worker reports about one shard.

    Attributes:
        info: the shard as written; ``None`` when bad files failed it (``on_corrupt="error"``).
        problems: the bad files (``where: reason``).
        quality: the shard's quality tally.
        digests: the digest of each of its images in record order
            (:data:`~spark_imagenet.dataset.duplicates.NO_DIGEST` for an unusable or unread one); empty where the
            main process collects them (the stream form).
    """

    info: ShardInfo | None
    problems: list[str]
    quality: Quality
    digests: bytes = b""


def write_shard(job: ShardJob) -> ShardOutcome:
    """Write one shard (in a worker process): its info, bad files (then the info is ``None``: with
    ``on_corrupt="error"`` any unusable image fails the shard), quality tally and image digests."""
    problems: list[str] = []
    quality: Quality = ({}, [])
    digests = bytearray(NO_DIGEST * len(job.images))
    pending = 0
    written = 0
    with open(job.tmp_path, "wb") as f:
        for k, img in enumerate(job.images):
            try:
                data = job.reader.read(img)
            except (OSError, SparkImagenetError) as e:
                problems.append(f"{job.reader.where(img)}{READ_FAILED}{getattr(e, 'strerror', None) or e})")
                continue
            stored, height, width, finding = check_image(data, img.filename, job.verify, job.max_pixels, job.form)
            note(quality, k, finding, stored)
            if stored is None:
                if job.on_corrupt == "error":
                    problems.append(f"{job.reader.where(img)}: {finding.reason}")
            else:
                digests[DIGEST_SIZE * k:DIGEST_SIZE * (k + 1)] = digest(data)
                if not problems:
                    write_record(f, example(img, stored, height, width))
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
        return ShardOutcome(None, problems, quality, bytes(digests))
    size = os.path.getsize(job.tmp_path)
    return ShardOutcome(ShardInfo(job.name, written, size, crc32c_file(job.tmp_path)), [], quality, bytes(digests))


def spill_path(job: ShardJob) -> str:
    """Where the stream form collects a shard's records in arrival order
    (a name the leftover clean-up of an interrupted build removes)."""
    return job.tmp_path + ".spill"


def assemble_shard(job: ShardJob, index: list[tuple[int, int] | None]) -> ShardOutcome:
    """Copy a shard's records from its spill file into plan order (in a worker
    process), then delete the spill file. ``index[i]`` is the (offset, length)
    of the shard's i-th planned record in the spill file, ``None`` for a
    skipped image (``on_corrupt="skip"``)."""
    spill = spill_path(job)
    with open(spill, "rb") as src, open(job.tmp_path, "wb") as f:
        fd = src.fileno()
        for place in index:
            if place is not None:
                f.write(os.pread(fd, place[1], place[0]))
    if os.path.exists(spill):  # absent when every image of the shard was skipped
        os.unlink(spill)
    size = os.path.getsize(job.tmp_path)
    written = sum(place is not None for place in index)
    return ShardOutcome(ShardInfo(job.name, written, size, crc32c_file(job.tmp_path)), [], ({}, []))


#: The stream form hands images to the pool in batches of this many images or bytes, whichever
#: comes first (one task per image spends more time in the pool's queues than in the check).
STREAM_BATCH_IMAGES = 32
STREAM_BATCH_BYTES = 4 * 1024 * 1024


def check_and_frame(batch: list[tuple[ImageFile, bytes]], verify: str, max_pixels: int = DEFAULT_MAX_PIXELS,
                    form: ImageForm = ORIGINAL) -> list[tuple[bytes | None, Finding, bytes]]:
    """Check (and repair) a batch of images and return, per image, its whole
    TFRecord (framing included), or ``None`` for an unusable image, what
    :func:`check_image` found, and the digest of its bytes (:data:`NO_DIGEST`
    for an unusable one) (in a worker process, for the stream form)."""
    out: list[tuple[bytes | None, Finding, bytes]] = []
    for img, data in batch:
        stored, height, width, finding = check_image(data, img.filename, verify, max_pixels, form)
        if stored is None:
            out.append((None, finding, NO_DIGEST))
            continue
        buf = io.BytesIO()
        write_record(buf, example(img, stored, height, width))
        out.append((buf.getvalue(), finding, digest(data)))
    if _COUNTER is not None:
        with _COUNTER.get_lock():
            _COUNTER.value += len(batch)
    return out


class SpillWriter:
    """Appends records to the spill files of the stream form in a thread of
    its own (file writes release the GIL, so the stream keeps being read).

    At most ``capacity`` spill files are open at a time (least recently used
    closed first; full ImageNet has over 1,000 shards). Offsets are assigned
    when a record is queued: one writer appends in queue order.
    """

    def __init__(self, jobs: list[ShardJob], capacity: int, queued: int = 64):
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
                    f = open(spill_path(self._jobs[j]), "ab")
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


def stream_images(pool, src: SourceDataset, jobs: list[ShardJob], verify: str, in_flight: int,
                  counter, bar, digests: DigestTable, max_pixels: int = DEFAULT_MAX_PIXELS,
                  form: ImageForm = ORIGINAL) -> tuple[list[list[tuple[int, int] | None]], list[str], list[Quality]]:
    """Pass 2 of the nested-tar form: read the planned images from the stream
    (main process), have ``pool`` check and encode them (:func:`check_and_frame`),
    append each record to its shard's spill file in arrival order.

    Args:
        pool: the worker pool.
        src: the source (a stream: ``src.source.random_access`` is False).
        jobs: the shards and their planned images.
        verify: ``"decode"`` or ``"header"``.
        in_flight: batches handed to the pool and not yet written, at most.
        counter: shared count of images checked (for the progress bar).
        bar: tqdm bar or ``None``.
        digests: where each image's digest goes (by shard name).
        max_pixels: the pixel limit (:func:`check_image`).
        form: how the dataset stores images (:func:`check_image`).

    Returns:
        tuple: per job the (offset, length) of each planned record in its
        spill file (``None`` for a skipped image), the list of bad files
        (once there is one, nothing more is spilled) and per job the quality
        tally (see :func:`write_shard`).
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
    spills = SpillWriter(jobs, min(len(jobs), (soft if soft > 0 else 256) // 2))

    def settle() -> None:
        result, places = waiting.popleft()
        for (j, k), (record, finding, image_digest) in zip(places, result.get()):
            note(quality[j], k, finding, record)
            digests.put(jobs[j].name, image_digest, k)
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
        waiting.append((pool.apply_async(check_and_frame, (list(batch), verify, max_pixels, form)), list(places)))
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
