"""Sharding a Spark DataFrame or table of image bytes and labels as a Spark job: :func:`shard_dataframe`.

What a build does:

1. check the columns (image bytes, label, optional split and name) and survey the labels in one
   aggregation that reads only the label and split columns (:func:`survey`): class ids, rows per split,
   and one clear error for an empty DataFrame, null labels, labels of mixed kinds or an unknown split value,
   before anything is written;
2. give each row its shard from hashes of its image bytes (xxhash64, seeded): its split, where the split
   column leaves it open (``val_fraction``), its shard in the split, and its place in the shard, so the same
   rows make the same shards however the DataFrame is partitioned; identical images share a shard and sort
   next to each other (:func:`keyed_table`);
3. one Spark task per shard (:func:`shard_partitions`: ``repartition`` on a key that puts shard ``s`` in
   partition ``s``, ``sortWithinPartitions`` by ``(shard, order hash, name, label)``, then ``mapInArrow`` of
   :class:`ShardTask`; DataFrame API only, so classic and Spark Connect sessions run the same job, and the
   shard's bytes depend only on its rows, never on the order Spark delivers them in): each image is checked,
   repaired (and scaled, for ``resize``/``max_side``) and encoded by the local builder's functions
   (:func:`~spark_imagenet.dataset.shard_writer.check_image`, :func:`~spark_imagenet.dataset.shard_writer.example`,
   :func:`~spark_imagenet.dataset.report.note`); identical images sort next to each other (same order hash), so
   a task finds its shard's duplicates holding one run of equal hashes. The shard is written to the executor's
   disk, uploaded verified (:func:`spark_imagenet.storage.committed.upload_verified`) under a name unique to
   the task attempt (:func:`~spark_imagenet.dataset.naming.attempt_shard_name`), and the task returns its
   :class:`ShardResult`;
4. the driver (:func:`commit_build`) takes exactly one reported shard per partition (Spark returns one result
   per partition, whichever attempt succeeded first), writes ``quality-report.json``, commits ``manifest.json``
   last with the compare-and-swap of :func:`spark_imagenet.dataset.transfer.commit_manifest`, and deletes the
   run's objects the manifest does not name (failed attempts, speculative copies that finished second). Nothing
   is renamed: on object stores a rename is a copy of every byte, and the manifest is the commit point. An
   attempt Spark could not stop before the clean-up may still upload its object after it: that object is in no
   manifest, matches the shard pattern, and the next build to the same destination removes it
   (:func:`~spark_imagenet.dataset.transfer.remove_replaced`).

The dataset id is a fingerprint of the shards' content (class names, and per shard its examples, size and
CRC32C), known only once they are written: a second run over the same rows finds the same id and leaves the
committed dataset as it is. How this differs from :func:`spark_imagenet.dataset.sharding.shard`: docs/design.md,
'Sharding a DataFrame as a Spark job'. What runs on the executors (:class:`ShardTask` and what it calls) is
module-level and picklable.

Example:

>>> import shutil
>>> photos = shutil.copytree("/data/kaggle/ILSVRC/Data/CLS-LOC/train", os.path.abspath("photos"))
>>> df = spark.read.format("binaryFile").load(f"{photos}/*/*.JPEG")
>>> manifest = shard_dataframe(df, "gs://my-bucket/photo-shards", train_shards=2, val_shards=1,
...                            val_fraction=0.25, progress=False)
>>> manifest.classes[0].wnid, sorted(manifest.splits)
('n90000000', ['train', 'val'])
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import itertools
import logging
import math
import os
import pickle
import re
import tempfile
import threading
import uuid
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from spark_imagenet import errors
from spark_imagenet.dataset.duplicates import Duplicate, Duplicates, digest
from spark_imagenet.dataset.image_form import ORIGINAL, ImageForm, image_form
from spark_imagenet.dataset.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, ShardInfo, SplitInfo
from spark_imagenet.dataset.naming import attempt_shard_name, of_run
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, check_max_pixels
from spark_imagenet.dataset.quality import CATEGORIES
from spark_imagenet.dataset.report import (QUALITY_REPORT, Quality, format_quality, note, quality_totals,
                                           write_quality_report)
from spark_imagenet.dataset.shard_writer import check_image, example
from spark_imagenet.dataset.sharding import (FEATURE_KEYS, MAX_LISTED, MIN_AUTO_TRAIN_SHARDS, MIN_AUTO_VAL_SHARDS,
                                             ON_CORRUPT_MODES, TARGET_SHARD_BYTES, VERIFY_MODES)
from spark_imagenet.dataset.split_copies import copies_across_splits
from spark_imagenet.dataset.tables import labelled_by_folder
from spark_imagenet.dataset.tfrecord import write_record
from spark_imagenet.dataset.transfer import Destination, check_destination, commit_manifest, remove_replaced
from spark_imagenet.errors import (ConfigError, DataError, ImageError, LayoutError, ManifestError, SparkImagenetError,
                                   StorageError, spark_reason)
from spark_imagenet.source.base import ImageFile
from spark_imagenet.source.labelled import MAX_LISTED as MAX_ROWS_LISTED, integer_classes, listing, name_classes
from spark_imagenet.source.synset import SynsetClass
from spark_imagenet.storage import Storage, crc32c_file, open_storage
from spark_imagenet.storage.committed import Entry, upload_verified

logger = logging.getLogger(__name__)

#: Default share of the rows without a split that go to validation.
DEFAULT_VAL_FRACTION = 0.1
#: More distinct labels than this and the label column is refused (an id per image, most likely).
MAX_CLASSES = 100_000
#: The automatic shard count leaves at least this many rows per shard (hash assignment: no empty shard).
MIN_AUTO_ROWS_PER_SHARD = 32
#: Seconds between the driver's progress lines.
PROGRESS_SECONDS = 10.0
_INT_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType")


@dataclasses.dataclass(frozen=True)
class Columns:
    """The columns a build reads.

    Attributes:
        image: image bytes (binary).
        label: class name (string) or class id (integer).
        split: ``"train"``/``"val"``/null per row (string), or None: every row split by ``val_fraction``.
        name: the row's file name or path (string), or None: rows are named by their content hash.
        integer_labels: whether ``label`` holds class ids.
    """

    image: str
    label: str
    split: str | None
    name: str | None
    integer_labels: bool


@dataclasses.dataclass(frozen=True)
class Survey:
    """What the label and split columns hold (:func:`survey`).

    Attributes:
        classes: class names by class id.
        rows: rows per split: ``"train"``, ``"val"`` and ``None`` (no split given).
        image_bytes: bytes of all images (only when an automatic shard count needs it), else None.
        synsets: the classes with their human-readable names, when the source gives them (a Kaggle class
            list); None: each class's only name is its label (:attr:`classes`).
    """

    classes: tuple[str, ...]
    rows: dict[str | None, int]
    image_bytes: int | None = None
    synsets: tuple[SynsetClass, ...] | None = None

    def manifest_classes(self) -> tuple[SynsetClass, ...]:
        """The manifest's classes: :attr:`synsets`, else one per label named by it."""
        return self.synsets if self.synsets is not None else \
            tuple(SynsetClass(i, name, (name,)) for i, name in enumerate(self.classes))

    def expected(self, split: str, val_fraction: float) -> float:
        """Rows expected in ``split``: those the split column names, and its share of the others."""
        share = val_fraction if split == "val" else 1.0 - val_fraction
        return self.rows.get(split, 0) + share * self.rows.get(None, 0)


def shard_dataframe(df: Any, out: str, image_col: str = "content", label_col: str = "label",
                    split_col: str | None = None, *, name_col: str | None = None,
                    val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0, train_shards: int | None = None,
                    val_shards: int | None = None, verify: str = "decode", on_corrupt: str = "error",
                    overwrite: bool = False, progress: bool = True, max_image_pixels: int = DEFAULT_MAX_PIXELS,
                    resize: int | None = None, max_side: int | None = None,
                    jpeg_quality: int | None = None) -> Manifest:
    """Build TFRecord shards and ``manifest.json`` from a Spark DataFrame, as a Spark job (see the module doc).

    Args:
        df: a DataFrame of a classic or Spark Connect session (under Connect there is no progress line: it
            needs accumulators).
        out: the destination URL (any store :func:`spark_imagenet.storage.open_storage` opens); every executor
            must reach it.
        image_col: the column of image bytes (binary), e.g. ``content`` of ``spark.read.format("binaryFile")``.
        label_col: the class of each row: a name (string; class ids are the sorted distinct names, as Keras'
            ``image_dataset_from_directory``) or a class id (integer; the ids must be 0..K-1, each used). A
            ``spark.read.format("binaryFile")`` read (its columns ``path``, ``modificationTime``, ``length``,
            ``content``) without a ``label`` column is labelled as ``spark-imagenet shard --format binaryFile``
            does: each image's class is the name of its folder (``photos/cat/1.jpg`` -> ``cat``).
        split_col: a column of ``"train"``/``"val"`` (null: decided by ``val_fraction``), or None (for a
            binaryFile read labelled by folder: ``train`` or ``val`` from a folder of that name on the path, as
            the command line does, else decided by ``val_fraction``).
        name_col: a string column naming each row's file (its base name is the record's
            ``image/filename``); None: ``path`` when the DataFrame has one (binaryFile), else each row is
            named by the first 16 hex digits of its SHA-256 and ``.jpg``.
        val_fraction: share of the rows without a split that go to validation (by a seeded hash of the
            image bytes, so copies of one image share a split).
        seed: seed of the hashes that choose split, shard and order.
        train_shards: train shards (None: about 128 MiB each, at least 16, at most one per 32 rows; the
            size needs one more pass over the image column).
        val_shards: val shards (None: as train, at least 4).
        verify: ``"decode"`` or ``"header"`` (:func:`spark_imagenet.dataset.quality.classify`).
        on_corrupt: ``"error"`` (a bad image fails the build, listing them) or ``"skip"`` (left out, listed
            in ``quality-report.json``).
        overwrite: replace a different dataset already at ``out``.
        progress: log a progress line every 10 s while the job runs.
        max_image_pixels: the most pixels (width x height) an image may have; a larger one is unusable, found
            from its header before it is decoded (:mod:`spark_imagenet.dataset.pixels`).
        resize, max_side, jpeg_quality: how the images are stored (``--resize N``: N x N, the shorter side scaled to
            N, the centre kept; ``--max-side N``; their JPEG quality; None, None, None: as the rows hold them), as
            :func:`spark_imagenet.dataset.sharding.shard`'s (:mod:`spark_imagenet.dataset.image_form`).

    Returns:
        Manifest: the committed manifest (the one already at ``out`` when it holds this same dataset).

    Raises:
        ConfigError: a missing column (the columns found are named), a column of the wrong type, a bad
            option, or ``out`` holds a different dataset or other files.
        DataError: no rows, null labels or (with an automatic shard count, which reads the image column) null
            images, each row named by the name column or its number, labels of mixed kinds, a split value other
            than train/val, no rows for a split, or a shard that got no rows.
        ImageError: unusable images with ``on_corrupt="error"`` (every one listed; nothing is committed).
        StorageError: ``out`` cannot be written, or a shard could not be uploaded intact.

    Example (a label column of the DataFrame's own; a binaryFile read labelled by folder: the module's example):

    >>> from pyspark.sql import functions as F
    >>> df = (spark.read.format("binaryFile").load("/data/kaggle/ILSVRC/Data/CLS-LOC/train/*/*.JPEG")
    ...       .withColumn("label", F.element_at(F.split("path", "/"), -2)))        # the folder's name
    >>> manifest = shard_dataframe(df, "gs://my-bucket/photo-shards", train_shards=2, val_shards=1,
    ...                            val_fraction=0.25, progress=False)
    >>> len(manifest.classes), {name: len(split.shards) for name, split in manifest.splits.items()}
    (4, {'train': 2, 'val': 1})
    """
    _check_options(val_fraction, verify, on_corrupt, train_shards, val_shards)
    check_max_pixels(max_image_pixels)
    form = image_form(resize, max_side, jpeg_quality)
    df, split_col = labelled_by_folder(df, label_col, split_col)
    columns = check_columns(df, image_col, label_col, split_col, name_col)
    auto = train_shards is None or val_shards is None
    found = survey(df, columns, with_bytes=auto)
    counts = shard_counts(found, val_fraction, train_shards, val_shards)
    source = {"kind": "dataframe", "columns": dataclasses.asdict(columns), "seed": seed, "val_fraction": val_fraction}
    job = JobSettings(seed, val_fraction, verify, on_corrupt, overwrite, progress, max_image_pixels, form)
    return build_shards(df, columns, found, counts, out, job, source)


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """The settings of one sharding job (see :func:`shard_dataframe` for each)."""

    seed: int
    val_fraction: float
    verify: str
    on_corrupt: str
    overwrite: bool
    progress: bool
    max_pixels: int = DEFAULT_MAX_PIXELS
    form: ImageForm = ORIGINAL


def build_shards(df: Any, columns: Columns, found: Survey, counts: tuple[int, int], out: str, job: JobSettings,
                 source: dict[str, Any]) -> Manifest:
    """Run the job over rows already checked and surveyed, then commit (steps 2 to 4 of the module doc).

    Args:
        df: the rows (:func:`check_columns` gave ``columns``).
        columns: the columns the job reads.
        found: the classes and rows per split (:func:`survey`, or known without one).
        counts: train and val shards (:func:`shard_counts`).
        out: the destination URL.
        job: the job's settings.
        source: the manifest's ``source`` record.

    Returns:
        Manifest: the committed manifest.

    Raises:
        ConfigError, DataError, ImageError, StorageError: as :func:`shard_dataframe`.
    """
    storage = open_storage(out)
    dest = _destination(storage, job.overwrite, job.form)
    created_root = not storage.root_exists()
    run = uuid.uuid4().hex[:8]
    try:
        results, across = _run_job(df, columns, found, counts, storage, run, job)
    except BaseException:
        delete_run(storage, run)
        if created_root:
            storage.remove_empty_root()
        raise
    build = Build(storage, dest, run, found.manifest_classes(), counts, tuple(results), job.verify, job.on_corrupt,
                  job.overwrite, source, across, job.form)
    try:
        return commit_build(build)  # on a failure before its commit, it deletes the run's objects itself
    except BaseException:
        if created_root:
            storage.remove_empty_root()
        raise


def _check_options(val_fraction: float, verify: str, on_corrupt: str, train_shards: int | None,
                   val_shards: int | None) -> None:
    """Refuse option values that cannot work (each error names the argument)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction={val_fraction}: must be at least 0 and below 1 (e.g. 0.1 for 10% of the rows "
                          "without a split)")
    if verify not in VERIFY_MODES:
        raise ConfigError(f"verify={verify!r}: choose one of {', '.join(VERIFY_MODES)}")
    if on_corrupt not in ON_CORRUPT_MODES:
        raise ConfigError(f"on_corrupt={on_corrupt!r}: choose one of {', '.join(ON_CORRUPT_MODES)}")
    for option, value in (("train_shards", train_shards), ("val_shards", val_shards)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{option}={value!r}: must be a whole number of at least 1")


def check_columns(df: Any, image_col: str, label_col: str, split_col: str | None, name_col: str | None) -> Columns:
    """Check that the columns exist and have usable types.

    Returns:
        Columns: the columns, with ``name`` resolved (``path`` of a binaryFile read when not given).

    Raises:
        ConfigError: a column is missing (the columns found are listed) or of the wrong type (what to do).
    """
    types = {f.name: type(f.dataType).__name__ for f in df.schema.fields}
    found = ", ".join(f"{n} ({t.removesuffix('Type').lower()})" for n, t in types.items()) or "none"
    for role, col in (("image", image_col), ("label", label_col), ("split", split_col), ("name", name_col)):
        if col is not None and col not in types:
            raise ConfigError(f"{role} column {col!r} is not in the DataFrame; its columns: {found}. Name the "
                              f"{role} column with {role}_col= (--{role}-column)")
    if types[image_col] != "BinaryType":
        hint = (" (file paths? read the files with spark.read.format('binaryFile'), or spark-imagenet shard "
                "--table PATH --format binaryFile)" if types[image_col] == "StringType" else "")
        raise ConfigError(f"image column {image_col!r} is {types[image_col].removesuffix('Type').lower()}, not "
                          f"binary: it must hold each image file's bytes{hint}")
    if types[label_col] not in ("StringType", *_INT_TYPES):
        raise ConfigError(f"label column {label_col!r} is {types[label_col].removesuffix('Type').lower()}: give "
                          "class names (string) or class ids 0..K-1 (integer); cast it first, e.g. "
                          f"df.withColumn({label_col!r}, df[{label_col!r}].cast('string'))")
    for role, col in (("split", split_col), ("name", name_col)):
        if col is not None and types[col] != "StringType":
            raise ConfigError(f"{role} column {col!r} is {types[col].removesuffix('Type').lower()}, not string")
    if name_col is None and types.get("path") == "StringType" and "path" not in (image_col, label_col, split_col):
        name_col = "path"
    return Columns(image_col, label_col, split_col, name_col, types[label_col] in _INT_TYPES)


def survey(df: Any, columns: Columns, *, with_bytes: bool = False) -> Survey:
    """Class ids and rows per split, from one aggregation over the label and split columns.

    Args:
        df: the DataFrame.
        columns: its checked columns (:func:`check_columns`).
        with_bytes: also sum the image sizes (reads the image column).

    Returns:
        Survey: the classes (sorted distinct names, or ids 0..K-1), rows per split, and the bytes.

    Raises:
        DataError: no rows, null labels, names that mix integers and words, integer labels that are not
            0..K-1 each used, or split values other than train/val/null.
        ConfigError: more than :data:`MAX_CLASSES` distinct labels.
    """
    from pyspark.sql import functions as F

    keys = [F.col(columns.label).alias("label")]
    keys.append((F.col(columns.split) if columns.split else F.lit(None).cast("string")).alias("split"))
    aggs = [F.count(F.lit(1)).alias("rows")]
    if with_bytes:  # the image column is read anyway: its nulls are counted too
        aggs.append(F.sum(F.length(F.col(columns.image))).alias("bytes"))
        aggs.append(F.count(F.col(columns.image)).alias("images"))
    try:
        groups = df.groupBy(*keys).agg(*aggs).limit(3 * MAX_CLASSES + 1).collect()
    except Exception as e:
        raise ConfigError(f"cannot read the DataFrame's label column {columns.label!r}: {spark_reason(e)}") from None
    if not groups:
        raise DataError("the DataFrame has no rows: nothing to shard (check its source and any filter)")
    _check_groups(df, groups, columns)
    labels = {g["label"] for g in groups}
    if len(labels) > MAX_CLASSES:
        raise ConfigError(f"label column {columns.label!r} has more than {MAX_CLASSES:,} distinct values: is it the "
                          "class of each image (not an id per image)?")
    rows: dict[str | None, int] = {}
    for g in groups:
        rows[g["split"]] = rows.get(g["split"], 0) + g["rows"]
    nbytes = sum(g["bytes"] or 0 for g in groups) if with_bytes else None
    return Survey(_classes(labels, columns), rows, nbytes)


def _check_groups(df: Any, groups: list, columns: Columns) -> None:
    """Refuse null labels, null images (when the survey read the image column) and unknown split values
    (:func:`survey`); the rows at fault are named (:func:`row_names`)."""
    from pyspark.sql import functions as F

    nulls = sum(g["rows"] for g in groups if g["label"] is None)
    if nulls:
        raise DataError(f"label column {columns.label!r} is null in {nulls} row(s): give every row a class, or leave "
                        f"those rows out first (df.where(df[{columns.label!r}].isNotNull())):"
                        + listing(row_names(df, columns, F.col(columns.label).isNull())))
    empty = sum(g["rows"] - g["images"] for g in groups) if "images" in groups[0] else 0
    if empty:
        raise DataError(f"image column {columns.image!r} is null in {empty} row(s): give every row its image's bytes, "
                        f"or leave those rows out first (df.where(df[{columns.image!r}].isNotNull())):"
                        + listing(row_names(df, columns, F.col(columns.image).isNull())))
    odd = sorted({g["split"] for g in groups if g["split"] not in (None, "train", "val")})
    if odd:
        raise DataError(f"split column {columns.split!r} holds {', '.join(repr(v) for v in odd[:10])}: each row must "
                        "say 'train', 'val' or nothing (null: decided by val_fraction); map the other values first")


def row_names(df: Any, columns: Columns, bad: Any, limit: int = MAX_ROWS_LISTED) -> list[str]:
    """How a refusal names the first ``limit`` rows where the boolean column ``bad`` holds: by the name column
    (``path`` of a binaryFile read, or ``name_col``) when there is one, else by their number in the DataFrame's
    order (1-based: the partitions in order, the rows of each in order). Reads only the columns ``bad`` and the
    name need (never the image bytes to find a null).

    Returns:
        list[str]: e.g. ``["path s3://b/cat/1.jpg", ...]`` or ``["row 7", ...]``.
    """
    from pyspark.sql import functions as F

    if columns.name:
        picked = df.where(bad).select(F.col(columns.name).alias("n")).limit(limit).collect()
        return [f"{columns.name} {r['n']}" for r in picked]
    # monotonically_increasing_id: the partition's number in the upper 31 bits, the row's place in it below
    marked = df.select(F.monotonically_increasing_id().alias("id"), bad.alias("bad"))
    ids = [r["id"] for r in marked.where("bad").select("id").orderBy("id").limit(limit).collect()]
    sizes = {r["p"]: r["n"] for r in marked.groupBy(F.shiftright(F.col("id"), 33).alias("p")).agg(
        F.count(F.lit(1)).alias("n")).collect()}
    before = {p: sum(n for q, n in sizes.items() if q < p) for p in sizes}
    return [f"row {before.get(i >> 33, 0) + (i & (2 ** 33 - 1)) + 1}" for i in ids]


def _classes(labels: set, columns: Columns) -> tuple[str, ...]:
    """Class names by id: the ids' own numbers (0..K-1, each used) for an integer column, else the sorted names
    (text that looks like numbers too: sorted as text, as the class folders a binaryFile read names are)."""
    where = f"label column {columns.label!r}"
    if columns.integer_labels:
        try:
            return tuple(c.wnid for c in integer_classes(labels, where))
        except LayoutError as e:
            raise DataError(str(e)) from None  # the same words as a labels file's, as this module's error
    numeric = sorted(v for v in labels if v.strip().lstrip("-").isdigit())
    if numeric and len(numeric) < len(labels):
        words = sorted(labels - set(numeric))
        raise DataError(f"{where} mixes integers ({', '.join(numeric[:3])}) and names "
                        f"({', '.join(words[:3])}): give every row a class name, or cast integer class ids to int")
    return tuple(c.wnid for c in name_classes(labels))


def shard_counts(found: Survey, val_fraction: float, train_shards: int | None,
                 val_shards: int | None) -> tuple[int, int]:
    """The shards of each split: as given, else about 128 MiB each (at least 16 / 4, at most one per 32 rows).

    Raises:
        DataError: no rows for a split (no val rows and ``val_fraction`` 0, or every row's split says train).
        ConfigError: more shards than rows expected in a split.
    """
    counts = []
    for split, given, minimum, option in (("train", train_shards, MIN_AUTO_TRAIN_SHARDS, "train_shards"),
                                          ("val", val_shards, MIN_AUTO_VAL_SHARDS, "val_shards")):
        rows = found.expected(split, val_fraction)
        if rows < 1:
            raise DataError(f"no {split} rows: give some rows the split {split!r}"
                            + (f" or a larger --val-fraction (val_fraction=; {val_fraction} of the rows without a split gives none)"
                               if split == "val" else "") + " (rows per split: "
                            + ", ".join(f"{k or 'none given'} {v}" for k, v in found.rows.items()) + ")")
        if given is None:
            share = rows / max(1, sum(found.rows.values()))
            auto = math.ceil((found.image_bytes or 0) * share / TARGET_SHARD_BYTES)
            given = max(1, min(max(minimum, auto), int(rows) // MIN_AUTO_ROWS_PER_SHARD))
        elif given > rows:
            raise ConfigError(f"--{option.replace('_', '-')} {given} ({option}=): more than the about {int(rows)} "
                              f"{split} rows, so some shards would be empty; choose fewer")
        counts.append(given)
    return counts[0], counts[1]


def _destination(storage: Any, overwrite: bool, form: ImageForm) -> Destination:
    """What ``out`` holds before the job: other files refused unless ``overwrite``; an unreadable manifest too,
    and a dataset of another image form (this build's id cannot be its id). Any other dataset there is compared
    with this one once its id is known (:func:`commit_build`)."""
    if storage.exists(MANIFEST_NAME):
        dest = check_destination(storage, "", True)
        if dest.replaced == "(unreadable manifest)" and not overwrite:
            raise ConfigError(f"{storage.url} holds an unreadable {MANIFEST_NAME}; choose another destination or pass "
                              "overwrite=True (--overwrite)")
        prior = None if overwrite or dest.replaced == "(unreadable manifest)" else Manifest.load(storage)
        if prior is not None and prior.image_form != form:
            raise ConfigError(f"{storage.url} already holds a dataset of images stored as '{prior.image_form.label}' "
                              f"(id {prior.dataset_id}, built {prior.created}); this build stores them as "
                              f"'{form.label}': choose another destination, or pass overwrite=True (--overwrite) to "
                              "replace it")
        return dest
    return check_destination(storage, "", overwrite)


def keyed_table(df: Any, columns: Columns, counts: tuple[int, int], seed: int, val_fraction: float) -> Any:
    """The rows as a DataFrame of :data:`ROW_COLUMNS`: ``shard`` (train
    shard ``s`` is ``s``, val shard ``s`` is ``train_shards + s``), ``order`` (the place in it), ``name``,
    ``label`` (as the label column holds it) and ``image``, each chosen by seeded hashes of the image bytes."""
    from pyspark.sql import functions as F

    image = F.col(columns.image)
    picked = F.pmod(F.xxhash64(F.lit(f"val/{seed}"), image), F.lit(1_000_000)) < F.lit(int(val_fraction * 1_000_000))
    split = F.when(picked, F.lit("val")).otherwise(F.lit("train"))
    if columns.split:
        split = F.coalesce(F.col(columns.split), split)
    where = F.xxhash64(F.lit(f"shard/{seed}"), image)
    shard = F.when(split == "train", F.pmod(where, F.lit(counts[0]))).otherwise(
        F.lit(counts[0]) + F.pmod(where, F.lit(counts[1])))
    name = F.concat(F.substring(F.sha2(image, 256), 1, 16), F.lit(".jpg"))
    if columns.name:
        name = F.coalesce(F.col(columns.name), name)
    label = F.col(columns.label).cast("long") if columns.integer_labels else F.col(columns.label)
    return df.select(shard.cast("int").alias("shard"), F.xxhash64(F.lit(f"order/{seed}"), image).alias("order"),
                     name.alias("name"), label.alias("label"), image.alias("image"))


#: Spark settings for the job's Arrow batches: rows handed to a task's Python worker per batch, and their
#: bytes (the default is 10,000 rows, which for images of ~110 KB is over a gigabyte per batch).
ARROW_BATCH_CONF = {"spark.sql.execution.arrow.maxRecordsPerBatch": "256",
                    "spark.sql.execution.arrow.maxBytesPerBatch": str(64 << 20)}


@contextlib.contextmanager
def _arrow_batches(spark: Any) -> Iterator[None]:
    """Set :data:`ARROW_BATCH_CONF` on the session while the job runs, then put back what was there (a server
    that does not let the session change a setting keeps its own, with an info line)."""
    before: dict[str, str | None] = {}
    for key, value in ARROW_BATCH_CONF.items():
        try:
            before[key] = spark.conf.get(key, None)
            spark.conf.set(key, value)
        except Exception as e:  # a Connect server may refuse (CANNOT_MODIFY_CONFIG)
            before.pop(key, None)
            logger.info(f"sharding: {key} stays as the session has it ({spark_reason(e)})")
    try:
        yield
    finally:
        for key, value in before.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)


def is_connect(df: Any) -> bool:
    """Whether ``df`` belongs to a Spark Connect session (no SparkContext, so no accumulators)."""
    return "pyspark.sql.connect" in type(df).__module__


def _run_job(df: Any, columns: Columns, found: Survey, counts: tuple[int, int], storage: Any, run: str,
             job: JobSettings) -> tuple[list[ShardResult], tuple[Duplicate, ...]]:
    """Run one task per shard and collect what each reports (see the module doc), and with a split column the
    groups of copies it put in both splits (:mod:`spark_imagenet.dataset.split_copies`).

    Raises:
        SparkImagenetError: what a task raised (its own class and message), after Spark's retries.
    """
    total = counts[0] + counts[1]
    spark = df.sparkSession
    accumulators = None if is_connect(df) else tuple(spark.sparkContext.accumulator(0) for _ in range(4))
    task = ShardTask(storage, run, counts[0], counts[1], found.classes, columns.integer_labels, job.verify,
                     job.on_corrupt, accumulators, bool(columns.split), max_pixels=job.max_pixels, form=job.form)
    logger.info(f"sharding {sum(found.rows.values())} rows of {len(found.classes)} classes into {counts[0]} train + "
                f"{counts[1]} val shards as a Spark job ({total} tasks) to {storage.url}")
    if accumulators is None and job.progress:
        logger.info("sharding: no progress lines under Spark Connect (no accumulators); the Spark UI shows the job")
    stop = threading.Event()
    reporter = threading.Thread(target=_report, args=(accumulators, total, stop, PROGRESS_SECONDS if job.progress else 0),
                                name="shard-progress", daemon=True)
    reporter.start()
    output = None
    try:
        table = shard_partitions(keyed_table(df, columns, counts, job.seed, job.val_fraction), total)
        with _arrow_batches(spark):
            output = table.mapInArrow(task, RESULT_SCHEMA)
            if task.index:  # kept on the executors' disks for the index's aggregation: the images are read once
                from pyspark.storagelevel import StorageLevel

                output = output.persist(StorageLevel.DISK_ONLY)
            return _results(output), (copies_across_splits(output.where("result IS NULL")) if task.index else ())
    except Exception as e:
        raise task_error(e) from None
    finally:
        stop.set()
        reporter.join()
        _log_progress(accumulators, total)
        if output is not None and task.index:
            output.unpersist()


def _results(output: Any) -> list[ShardResult]:
    """The tasks' :class:`ShardResult` rows of the job's output."""
    return [pickle.loads(row["result"]) for row in output.where("result IS NOT NULL").select("result").collect()]


def _report(accumulators: tuple | None, total: int, stop: threading.Event, every: float) -> None:
    """Log the progress line every ``every`` seconds until ``stop`` (never when ``every`` is 0 or there are no
    accumulators)."""
    while every and accumulators is not None and not stop.wait(every):
        _log_progress(accumulators, total)


def _log_progress(accumulators: tuple | None, total: int) -> None:
    if accumulators is None:
        return
    shards, images, nbytes, bad = (a.value for a in accumulators)
    logger.info(f"sharding: {shards} of {total} shards written, {images} images, {nbytes / 1e6:.1f} MB, "
                f"{bad} bad so far")


def task_error(exc: BaseException) -> SparkImagenetError:
    """The error a failed job stands for: the package error a task raised (same class and message), else a
    :class:`~spark_imagenet.errors.StorageError` with Spark's reason."""
    found = re.findall(r"spark_imagenet\.errors\.(\w+): (.+)", str(exc))
    if found:
        name, message = found[-1]
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, SparkImagenetError):
            return cls(message)
    return errors.StorageError(f"the sharding job failed: {spark_reason(exc)}")


# -- the executor task ---------------------------------------------------------------------------------------------

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


# -- the commit ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Build:
    """A finished Spark job, ready to commit.

    Attributes:
        storage: the destination.
        dest: what it held before the job (:func:`spark_imagenet.dataset.transfer.check_destination`).
        run: the run's token (in every object name it wrote).
        classes: the manifest's classes, by id.
        counts: ``(train shards, val shards)``.
        results: one :class:`ShardResult` per partition.
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
        manifest, report = _manifest(build)
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
        _log_report(build, report)
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


def _manifest(build: Build) -> tuple[Manifest, dict[str, Any]]:
    """The manifest of a checked build (:func:`_check_results`), and its quality report."""
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
    ), report
