"""Naming the record behind a TensorFlow data error.

TensorFlow's JPEG ops fail with a bare ``InvalidArgumentError`` ("Invalid
JPEG data or crop window") that cannot name the record, and a graph op cannot
catch an error; the hot path of the pipeline carries no per-record checks
(docs/design.md, 'Input pipeline speed'). Instead :func:`naming_bad_records`
(a context manager around ``fit``/``evaluate``/iteration) catches TensorFlow's
data errors and then locates the bad record by re-reading the worker's own
shards (:func:`find_bad_records`), raising
:class:`~spark_imagenet.errors.ImageError` with the shard path, the record
index and the image's file name.

Example::

    >>> with naming_bad_records([]):   # train_files + val_files
    ...     pass                      # model.fit(...): see the module's example
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Iterator, Sequence

import tensorflow as tf

from spark_imagenet.errors import ImageError, ManifestError
from spark_imagenet.training.worker.preprocessing import FILENAME_KEY, default_parallel, parse_example


@dataclasses.dataclass(frozen=True)
class BadRecord:
    """A record of a shard that the pipeline cannot use.

    Attributes:
        path: the shard file.
        index: 0-based position of the record in the file.
        filename: the record's ``image/filename`` feature (``None`` when it
            cannot be read).
        reason: TensorFlow's error message, first line.
    """

    path: str
    index: int
    filename: str | None
    reason: str

    def describe(self) -> str:
        """One line: ``shard PATH, record N (image NAME): REASON``."""
        image = f" (image {self.filename})" if self.filename else ""
        return f"shard {self.path}, record {self.index}{image}: {self.reason}"


def _first_line(exc: BaseException) -> str:
    """An OpError message without TensorFlow's ``{{function_node ...}}`` and
    ``[Op:...]`` decorations."""
    text = getattr(exc, "message", None) or str(exc)
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[\[.*", "", text, flags=re.S)
    text = re.sub(r"\s*\[Op:[^\]]*\].*", "", text, flags=re.S)
    # Graph-mode errors start with "Graph execution error:" and "Detected at node ..." and a
    # traceback of the Python frames that built the op; the reason is the last such line.
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    reasons = [ln for ln in lines if not _NOISE_RE.match(ln)]
    return reasons[-1] if reasons else (lines[0] if lines else type(exc).__name__)


_NOISE_RE = re.compile(r"^(Graph execution error:?|Detected at node|File \"|Traceback|\w+Error: Graph execution)")


def _check_record(record: tf.Tensor) -> tf.Tensor:
    """Everything the pipelines do to a record that can fail, on the whole
    image: parse, read the JPEG header, decode every scan line."""
    jpeg, _ = parse_example(record)
    shape = tf.io.extract_jpeg_shape(jpeg)
    image = tf.io.decode_jpeg(jpeg, channels=3)
    return tf.shape(image)[0] + shape[0]


def _record_filename(record: bytes) -> str | None:
    """The ``image/filename`` feature of a serialized Example, or None."""
    try:
        parsed = tf.io.parse_single_example(
            record, {FILENAME_KEY: tf.io.FixedLenFeature([], tf.string, default_value="")}
        )
        return parsed[FILENAME_KEY].numpy().decode("utf-8", "replace") or None
    except Exception:  # noqa: BLE001  (a record too broken to parse has no name)
        return None


def find_bad_records(files: Sequence[str], limit: int | None = 1, parallel: int | None = None) -> list[BadRecord]:
    """Scan shards for records the pipelines cannot decode.

    Each file is read in order; TFRecord framing errors (corrupted or
    truncated records, detected by TFRecord's CRC32C) end the scan of that
    file. Every record is parsed and its JPEG decoded in full (any crop the
    pipelines take then decodes too), ``parallel`` records at a time: about
    as long as one pass of the training pipeline over the files, so meant
    for after a failure, not before every run.

    Args:
        files: TFRecord shard paths.
        limit: stop after this many bad records (``None``: scan everything).
        parallel: parallel decode calls (``None``: ``os.cpu_count()``).

    Returns:
        list[BadRecord]: the bad records found, in file order (empty when
        every record decodes).
    """
    parallel = default_parallel(parallel)
    bad: list[BadRecord] = []
    for path in (os.fspath(f) for f in files):
        # 1. Framing: how many records can be read, and why reading stops early.
        count, framing = 0, None
        try:
            count = int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
        except tf.errors.NotFoundError as exc:
            framing = BadRecord(path, 0, None, f"cannot open the shard ({_first_line(exc)})")
        except tf.errors.OpError:
            try:  # again one record at a time, to count the readable ones
                for _ in tf.data.TFRecordDataset(path):
                    count += 1
            except tf.errors.OpError as exc:
                framing = BadRecord(path, count, None, f"unreadable TFRecord ({_first_line(exc)})")
        # 2. Content: parse and decode each readable record; the indices that
        #    do not come out of ignore_errors() failed.
        good = (
            tf.data.TFRecordDataset(path)
            .take(count)
            .enumerate()
            .map(lambda i, r: (i, _check_record(r)), num_parallel_calls=parallel, deterministic=True)
            .ignore_errors()
            .map(lambda i, _: i)
        )
        ok = set(int(i) for i in good.as_numpy_iterator()) if count else set()
        for index in (i for i in range(count) if i not in ok):
            record = next(iter(tf.data.TFRecordDataset(path).skip(index).take(1))).numpy()
            try:
                _check_record(tf.constant(record))
                reason = "does not decode inside tf.data"
            except tf.errors.OpError as exc:
                reason = _first_line(exc)
            bad.append(BadRecord(path, index, _record_filename(record), reason))
            if limit is not None and len(bad) >= limit:
                return bad
        if framing is not None:
            bad.append(framing)
            if limit is not None and len(bad) >= limit:
                return bad
    return bad


#: TensorFlow error messages that come from reading records (TFRecord framing,
#: Example parsing, JPEG header and decoding).
_DATA_ERROR_RE = re.compile(
    r"jpeg|corrupted record|truncated record|ParseExample|ParseSingleExample|Feature: image/", re.IGNORECASE
)
_CARDINALITY_RE = re.compile(r"expected to contain (\d+) elements but contained ((?:only|at least) \d+)")


def data_error(exc: BaseException, files: Sequence[str], parallel: int | None = None) -> Exception | None:
    """Translate a TensorFlow error raised while reading ``files`` into a
    :class:`~spark_imagenet.errors.SparkImagenetError` that names the record.

    Args:
        exc: the exception (typically from ``fit``, ``evaluate`` or iterating
            a dataset of this module).
        files: the shard files the failing dataset read.
        parallel: decode parallelism of the scan (``None``: all cores).

    Returns:
        ImageError naming the shard file, record index and image file name
        (found with :func:`find_bad_records`) when ``exc`` is a data error and
        the scan finds the bad record; ManifestError when an evaluation
        dataset held fewer or more records than its ``examples``; ``None`` when
        ``exc`` is not a data error of this module or the scan finds nothing
        (the caller then re-raises ``exc`` unchanged).
    """
    if not isinstance(exc, tf.errors.OpError):
        return None
    message = str(exc)
    counted = _CARDINALITY_RE.search(message)
    if isinstance(exc, tf.errors.FailedPreconditionError) and counted:
        return ManifestError(
            f"the evaluation shards hold {counted.group(2)} records for this worker, but exactly "
            f"{counted.group(1)} were expected (from the manifest); files: {', '.join(map(os.fspath, files))}. "
            "The manifest does not match the shards: rebuild or re-download them."
        )
    if not (isinstance(exc, tf.errors.DataLossError) or
            (isinstance(exc, tf.errors.InvalidArgumentError) and _DATA_ERROR_RE.search(message))):
        return None
    bad = find_bad_records(files, limit=1, parallel=parallel)
    if not bad:
        return None
    from spark_imagenet.dataset.cache import CACHE_FOLDER, MARKER_SUFFIX

    marker = os.path.basename(bad[0].path) + MARKER_SUFFIX
    return ImageError(
        f"bad record in the input data: {bad[0].describe()}. "
        "Rebuild the shards (the shard builder checks that every JPEG decodes) or remove that image from the source. "
        f"If that file is a copy in the shard cache (a {CACHE_FOLDER} folder unless --cache or cache= named "
        "another), the copy may instead have been damaged after it was verified, with the bucket's shard intact, and "
        f"every rerun would fail the same way: delete it and its marker {marker} beside it, and the next run fetches "
        "it again."
    )


@contextlib.contextmanager
def naming_bad_records(files: Sequence[str], parallel: int | None = None) -> Iterator[None]:
    """Context manager: data errors inside it become errors naming the record.

    Use around ``model.fit``/``model.evaluate`` or a loop over a dataset of
    this module (``with naming_bad_records(train_files + val_files):
    model.fit(...)``); here a file that is no TFRecord:

    >>> with open("shard-0.tfrecord", "wb") as f:
    ...     _ = f.write(b"not a TFRecord file")
    >>> with naming_bad_records(["shard-0.tfrecord"]):
    ...     for record in tf.data.TFRecordDataset(["shard-0.tfrecord"]):
    ...         pass
    Traceback (most recent call last):
    ...
    spark_imagenet.errors.ImageError: bad record in the input data: shard shard-0.tfrecord, record 0: unreadable
    TFRecord (corrupted record at 0...). Rebuild the shards ...

    On a TensorFlow data error (bad JPEG, corrupted TFRecord, unparsable
    Example, another number of evaluation records than expected) it raises the error of
    :func:`data_error` (chained to TensorFlow's); anything else passes
    through unchanged. Costs nothing until an error happens; then the scan
    takes about as long as one pass of the pipeline over ``files``.

    Args:
        files: every shard file the datasets inside read.
        parallel: decode parallelism of the scan (``None``: all cores).

    Raises:
        ImageError: a record of ``files`` does not decode (message: shard
            path, record index, image file name, TensorFlow's reason).
        ManifestError: an evaluation dataset held fewer or more records than
            its ``examples`` argument.
    """
    try:
        yield
    except tf.errors.OpError as exc:
        translated = data_error(exc, files, parallel)
        if translated is None:
            raise
        raise translated from exc
