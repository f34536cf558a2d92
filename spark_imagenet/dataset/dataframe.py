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
3. one Spark task per shard (:func:`~spark_imagenet.dataset.dataframe_task.shard_partitions`: ``repartition``
   on a key that puts shard ``s`` in partition ``s``, ``sortWithinPartitions``, then ``mapInArrow`` of
   :class:`~spark_imagenet.dataset.dataframe_task.ShardTask`; DataFrame API only, so classic and Spark Connect
   sessions run the same job): checks, repairs (and scales, for ``resize``/``max_side``) and encodes each image
   with the local builder's functions, writes the shard, uploads it verified under a name unique to the task
   attempt, and returns its :class:`~spark_imagenet.dataset.manifest.ShardInfo`, quality tally and duplicates;
4. the driver keeps one attempt per shard, writes ``quality-report.json``, commits ``manifest.json`` last
   (:mod:`spark_imagenet.dataset.dataframe_commit`) and deletes every other object the run wrote.

The dataset id is a fingerprint of the shards' content (class names, and per shard its examples, size and
CRC32C), known only once they are written: a second run over the same rows finds the same id and leaves the
committed dataset as it is. How this differs from :func:`spark_imagenet.dataset.sharding.shard`: docs/design.md,
'Sharding a DataFrame as a Spark job'.

Example::

    df = spark.read.parquet("s3://bucket/images")          # columns content (binary), label (string)
    manifest = shard_dataframe(df, "s3://bucket/shards", train_shards=64, val_shards=8)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import uuid
from typing import Any, Iterator

from spark_imagenet.dataset.dataframe_commit import Build, commit_build, delete_run
from spark_imagenet.dataset.dataframe_task import RESULT_SCHEMA, ShardResult, ShardTask, shard_partitions
from spark_imagenet.dataset.image_form import ORIGINAL, ImageForm, image_form
from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, check_max_pixels
from spark_imagenet.dataset.duplicates import Duplicate
from spark_imagenet.dataset.split_copies import copies_across_splits
from spark_imagenet.dataset.tables import labelled_by_folder
from spark_imagenet.dataset.sharding import (MIN_AUTO_TRAIN_SHARDS, MIN_AUTO_VAL_SHARDS, ON_CORRUPT_MODES,
                                             TARGET_SHARD_BYTES, VERIFY_MODES)
from spark_imagenet.dataset.transfer import Destination, check_destination
from spark_imagenet.errors import ConfigError, DataError, LayoutError, SparkImagenetError, spark_reason
from spark_imagenet.source.labelled import MAX_LISTED, integer_classes, listing, name_classes
from spark_imagenet.source.synset import SynsetClass
from spark_imagenet.storage import open_storage

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

    Example:

    ```python
    from spark_imagenet import shard_dataframe

    df = spark.read.format("binaryFile").load("/data/photos/*/*.jpg")   # one folder per class: its label
    manifest = shard_dataframe(df, "gs://my-bucket/photo-shards", val_fraction=0.1)
    ```
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


def row_names(df: Any, columns: Columns, bad: Any, limit: int = MAX_LISTED) -> list[str]:
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
    from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest

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
    """The rows as a DataFrame of :data:`~spark_imagenet.dataset.dataframe_task.ROW_COLUMNS`: ``shard`` (train
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
                output = output.persist(_disk_only())
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
    import pickle

    return [pickle.loads(row["result"]) for row in output.where("result IS NOT NULL").select("result").collect()]


def _disk_only() -> Any:
    from pyspark.storagelevel import StorageLevel

    return StorageLevel.DISK_ONLY


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
    import re

    from spark_imagenet import errors

    found = re.findall(r"spark_imagenet\.errors\.(\w+): (.+)", str(exc))
    if found:
        name, message = found[-1]
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, SparkImagenetError):
            return cls(message)
    return errors.StorageError(f"the sharding job failed: {spark_reason(exc)}")
