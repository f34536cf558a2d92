"""The executor side of :func:`spark_imagenet.dataset.dataframe.shard_dataframe`: one Spark task writes one shard.

A task gets the rows of its shard sorted by ``(shard, order hash, name, label)`` (:func:`shard_partitions`:
``repartition`` on a key that sends shard ``s`` to partition ``s``, then ``sortWithinPartitions``; the task reads them as Arrow batches
through ``mapInArrow``, which classic and Spark Connect sessions both offer), so the shard's bytes depend only
on the rows, never on the order Spark delivers them in. Each image is checked and encoded by the functions the
local builder uses (:func:`~spark_imagenet.dataset.shard_writer.check_image`,
:func:`~spark_imagenet.dataset.shard_writer.example`, :func:`~spark_imagenet.dataset.report.note`): stored
byte for byte, or repaired, or (unusable) failing the build or left out. Identical image bytes sort next to
each other (same order hash), so a task finds the duplicates of its shard without holding more than one run
of equal hashes. The shard is written to a temporary file on the executor's disk, then uploaded to the destination verified
(:func:`spark_imagenet.storage.committed.upload_verified`) under a name unique to this task attempt
(:func:`~spark_imagenet.dataset.naming.attempt_shard_name`); the driver decides which attempt's object the
manifest names. Everything here runs in a Spark Python worker: module-level, picklable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import pickle
import tempfile
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from spark_imagenet.dataset.duplicates import Duplicate, digest
from spark_imagenet.dataset.image_form import ORIGINAL, ImageForm
from spark_imagenet.dataset.manifest import ShardInfo
from spark_imagenet.dataset.naming import attempt_shard_name
from spark_imagenet.dataset.report import Quality, note
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS
from spark_imagenet.dataset.shard_writer import check_image, example
from spark_imagenet.dataset.tfrecord import write_record
from spark_imagenet.source.base import ImageFile
from spark_imagenet.storage import Storage, crc32c_file
from spark_imagenet.storage.committed import Entry, upload_verified

#: How many bad files one task reports by name (the count is always whole).
MAX_PROBLEMS = 50
#: How many groups of duplicates one task reports.
MAX_DUPLICATES = 1000

#: The columns a task reads, in this order: shard (int), order hash (long), name (string), label (class name or
#: id), image (binary).
ROW_COLUMNS = ("shard", "order", "name", "label", "image")
#: The schema of what a task returns: per shard one row with its pickled :class:`ShardResult` (the other columns
#: null), and with ``index`` set one row per usable image (``result`` null): its order hash, length, whether it
#: is in val, name and label (what :mod:`spark_imagenet.dataset.split_copies` groups).
RESULT_SCHEMA = "result binary, order long, length long, val int, name string, label string"
#: Index rows per Arrow batch a task yields.
INDEX_BATCH_ROWS = 4096

#: One row as the task reads it: ``(shard, order hash, name, label, image bytes)``.
Row = tuple[int, int, str, Any, bytes]


def partition_keys(spark: Any, partitions: int) -> list[int]:
    """For each partition ``p`` of ``partitions``, a long whose Spark hash partitioning
    (``repartition(partitions, key)``: Murmur3 with seed 42, modulo ``partitions``) is ``p``: the smallest such
    among the first ``64 * partitions`` numbers, found by one small Spark query (the same hash the shuffle uses,
    so no copy of it here).

    Raises:
        RuntimeError: some partition has no key among them (about e^-64 per partition; never seen).
    """
    from pyspark.sql import functions as F

    found = (spark.range(64 * partitions).groupBy(F.pmod(F.hash("id"), F.lit(partitions)).alias("p"))
             .agg(F.min("id").alias("key")).collect())
    keys = {row["p"]: row["key"] for row in found}
    if len(keys) < partitions:
        raise RuntimeError(f"no partition key found for {partitions - len(keys)} of {partitions} partitions")
    return [keys[p] for p in range(partitions)]


def shard_partitions(table: Any, total: int) -> Any:
    """``table`` (:func:`keyed_table`) in ``total`` partitions, partition ``s`` holding exactly shard ``s``'s rows
    sorted by ``(shard, order, name, label)``. A repartition with a number is kept as it is by adaptive query
    execution (only repartitions without one are coalesced)."""
    from pyspark.sql import functions as F

    keys = partition_keys(table.sparkSession, total)
    key = F.element_at(F.array(*[F.lit(k) for k in keys]), F.col("shard") + F.lit(1)).cast("long")
    return (table.withColumn("_key", key).repartition(total, "_key")
            .sortWithinPartitions("shard", "order", "name", "label").drop("_key"))


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What one task attempt reports to the driver.

    Attributes:
        split: ``"train"`` or ``"val"``.
        index: the shard's index in its split.
        info: the shard as uploaded (name, examples, bytes, CRC32C); None when a bad image stopped it
            (``on_corrupt="error"``).
        problems: the bad files (``name: reason``), at most :data:`MAX_PROBLEMS`.
        bad: how many images were unusable (empty, truncated, undecodable).
        images: images read.
        image_bytes: bytes of the images read.
        categories: the count per quality category (:data:`spark_imagenet.dataset.quality.CATEGORIES`).
        files: every repaired or skipped image: ``(name, category, reason, action)``.
        duplicates: the groups of identical images found in this shard (at most :data:`MAX_DUPLICATES`; rows
            of one split: a shard holds one).
    """

    split: str
    index: int
    info: ShardInfo | None
    problems: tuple[str, ...]
    bad: int
    images: int
    image_bytes: int
    categories: dict[str, int]
    files: tuple[tuple[str, str, str, str], ...]
    duplicates: tuple[Duplicate, ...]


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """The function Spark runs per partition (``mapInArrow``): for each shard among its rows (one, as the job
    partitions them), write, upload and report it. Shard ``s`` is train shard ``s`` for ``s < train_shards``,
    else val shard ``s - train_shards``.

    Attributes:
        storage: the destination (a picklable handle; each executor opens its own client).
        run: this run's token (8 hex digits), part of every object name the run writes.
        train_shards: shards of the train split.
        val_shards: shards of the val split.
        classes: the class names by class id (the record's ``image/class/synset``).
        integer_labels: whether the rows' labels are class ids (else class names, looked up in ``classes``).
        verify: ``"decode"`` or ``"header"`` (:func:`spark_imagenet.dataset.quality.classify`).
        on_corrupt: ``"error"`` (a bad image stops the shard; nothing is uploaded) or ``"skip"``.
        max_pixels: the pixel limit (:mod:`spark_imagenet.dataset.pixels`): a larger image is unusable.
        form: how the images are stored (:mod:`spark_imagenet.dataset.image_form`).
        progress: Spark accumulators ``(shards, images, bytes, bad)`` the driver's progress line reads, or None
            (a Spark Connect session has none).
        index: also return one index row per usable image (see :data:`RESULT_SCHEMA`).
        after_upload: called with the object's name right after this attempt uploaded it (a test makes the
            first attempt fail there); None in real use.
    """

    storage: Storage
    run: str
    train_shards: int
    val_shards: int
    classes: tuple[str, ...]
    integer_labels: bool = False
    verify: str = "decode"
    on_corrupt: str = "error"
    progress: tuple[Any, Any, Any, Any] | None = None
    index: bool = False
    after_upload: Callable[[str], None] | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    form: ImageForm = ORIGINAL

    def place(self, shard: int) -> tuple[str, int, int]:
        """``(split, index, count)`` of shard ``shard``."""
        if shard < self.train_shards:
            return "train", shard, self.train_shards
        return "val", shard - self.train_shards, self.val_shards

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Arrow batches of sorted rows (:data:`ROW_COLUMNS`) in, one batch per shard out (:data:`RESULT_SCHEMA`).

        Raises:
            StorageError: a shard cannot be written locally or uploaded intact (Spark retries the task).
        """
        for shard, rows in itertools.groupby(self._rows(batches), key=lambda row: row[0]):
            images: list[tuple[int, int, str, str]] = []
            result = self.write(shard, rows, images if self.index else None)
            yield _batch([pickle.dumps(result)], [(None, None, None, None)])
            val = int(shard >= self.train_shards)
            for at in range(0, len(images), INDEX_BATCH_ROWS):
                chunk = images[at:at + INDEX_BATCH_ROWS]
                yield _batch([None] * len(chunk), [(o, n, name, cls) for o, n, name, cls in chunk], val)

    def _rows(self, batches: Iterable[Any]) -> Iterator[Row]:
        """The rows of the batches in order, each label made a class id."""
        ids = None if self.integer_labels else {name: i for i, name in enumerate(self.classes)}
        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in ROW_COLUMNS]
            for shard, order, name, label, image in zip(*columns):
                yield shard, order, name, (label if ids is None else ids[label]), image

    def write(self, shard: int, rows: Iterable[Row], images: list | None = None) -> ShardResult:
        """Write, upload and report one shard from its sorted rows; append ``(order, length, name, class)`` of
        each usable image to ``images`` when it is given.

        Raises:
            StorageError: the shard cannot be written locally or uploaded intact.
        """
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.taskAttemptId() if context is not None else 0
        split, index, count = self.place(shard)
        name = attempt_shard_name(split, index, count, self.run, attempt)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=_scratch())
        try:
            with os.fdopen(fd, "wb") as f:
                writer = _ShardWriter(f, split, self, images)
                for _shard, order, image_name, label, data in rows:
                    writer.add(order, image_name, label, data)
                writer.finish()
            info = None
            if not writer.problems:
                size = os.path.getsize(tmp)
                info = ShardInfo(name, writer.written, size, crc32c_file(tmp))
                upload_verified(self.storage, [(tmp, Entry(name, size, info.crc32c))], transfers=1, noun="shard",
                                reference="the shard this task wrote", uncommitted="the shard was not kept")
                if self.after_upload is not None:
                    self.after_upload(name)
            self._count(writer)
            return writer.result(index, info)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _count(self, writer: _ShardWriter) -> None:
        """Add this shard to the driver's progress accumulators."""
        if self.progress is not None:
            shards, images, nbytes, bad = self.progress
            shards.add(1)
            images.add(writer.images)
            nbytes.add(writer.image_bytes)
            bad.add(writer.bad)


def _batch(results: list[bytes | None], rows: list[tuple], val: int | None = None) -> Any:
    """One Arrow batch of :data:`RESULT_SCHEMA`."""
    import pyarrow as pa

    orders, lengths, names, labels = zip(*rows)
    return pa.RecordBatch.from_arrays(
        [pa.array(results, pa.binary()), pa.array(orders, pa.int64()), pa.array(lengths, pa.int64()),
         pa.array([val] * len(rows), pa.int32()), pa.array(names, pa.string()), pa.array(labels, pa.string())],
        names=["result", "order", "length", "val", "name", "label"])


def _scratch() -> str | None:
    """Where a task writes its shard before the upload: the first of the executor's ``SPARK_LOCAL_DIRS`` (Spark
    sets it for its Python workers: the disks it gives to shuffle files), else the temporary folder."""
    first = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return first if first and os.path.isdir(first) else None


class _ShardWriter:
    """Checks, encodes and writes the rows of one shard in order, and tallies what it found."""

    def __init__(self, f: BinaryIO, split: str, task: ShardTask, index: list | None = None):
        self._f = f
        self._index = index
        self._split = split
        self._task = task
        self.quality: Quality = ({}, [])
        self.files: list[tuple[str, str, str, str]] = []
        self.problems: list[str] = []
        self.duplicates: list[Duplicate] = []
        self.bad = self.images = self.image_bytes = self.written = 0
        self._run_hash: int | None = None
        self._run: list[tuple[bytes, str, str]] = []

    def add(self, order: int, name: str, label: int, data: bytes) -> None:
        """Check one image and append its record (unless it is unusable, or a bad image stopped the shard). A
        null image (one the driver's survey did not read) is never left out: it fails the shard, named."""
        if data is None:
            self.images += 1
            self.bad += 1
            if len(self.problems) < MAX_PROBLEMS:
                self.problems.append(f"{name or 'a row without a name column'}: no image (the image column is null)")
            return
        data = bytes(data)
        cls = self._task.classes[label]
        self.images += 1
        self.image_bytes += len(data)
        stored, height, width, finding = check_image(data, name, self._task.verify, self._task.max_pixels,
                                                     self._task.form)
        if stored is not None:  # an unusable image is left out, reported as such, and not compared
            self._note_duplicate(order, digest(data), name, cls)
            if self._index is not None:
                self._index.append((order, len(data), name, cls))
        listed = len(self.quality[1])
        note(self.quality, self.images - 1, finding, stored)
        if len(self.quality[1]) > listed:
            _k, category, reason, action = self.quality[1][-1]
            self.files.append((name, category, reason, action))
        if stored is None:
            self.bad += 1
            if self._task.on_corrupt == "error" and len(self.problems) < MAX_PROBLEMS:
                self.problems.append(f"{name}: {finding.reason}")
        elif not self.bad or self._task.on_corrupt != "error":
            write_record(self._f, example(ImageFile(name, label, cls, len(data)), stored, height, width))
            self.written += 1

    def _note_duplicate(self, order: int, image_digest: bytes, name: str, cls: str) -> None:
        """Keep the run of rows with the same order hash; report its identical images when the run ends."""
        if order != self._run_hash:
            self._flush_run()
            self._run_hash = order
        self._run.append((image_digest, name, cls))

    def _flush_run(self) -> None:
        groups: dict[bytes, list[tuple[str, str]]] = {}
        for same, name, cls in self._run:
            groups.setdefault(same, []).append((name, cls))
        for rows in groups.values():
            if len(rows) > 1 and len(self.duplicates) < MAX_DUPLICATES:
                self.duplicates.append(Duplicate.of((self._split, n, c) for n, c in rows))
        self._run = []

    def finish(self) -> None:
        """Report the last run of equal hashes."""
        self._flush_run()

    def result(self, index: int, info: ShardInfo | None) -> ShardResult:
        """What the task reports (see :class:`ShardResult`)."""
        return ShardResult(self._split, index, info, tuple(self.problems), self.bad, self.images, self.image_bytes,
                           dict(self.quality[0]), tuple(self.files), tuple(self.duplicates))
