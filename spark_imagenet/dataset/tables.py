"""Reading a table or a folder of images as the DataFrame :func:`spark_imagenet.dataset.dataframe.shard_dataframe`
takes (``spark-imagenet shard --table``).

* ``read_table(spark, "catalog.schema.images")``: a table of the session's catalog (any format the session
  reads: Parquet, Delta where the cluster has Delta, ...);
* ``read_table(spark, "s3://b/images.parquet", "parquet")``: files read with that data source;
* ``read_table(spark, "s3://b/images", "delta", version=3)``: a Delta table, at a version
  (:func:`spark_imagenet.dataset.delta.read_delta`);
* ``read_table(spark, "hdfs:///photos", "binaryFile")``: every file under the folder, one row each (``path``,
  ``modificationTime``, ``length``, ``content``), plus ``label``, the name of the file's folder, and ``split``,
  ``train`` or ``val`` when the path has such a folder (``photos/train/cat/1.jpg``), else null (then
  ``val_fraction`` decides). Files whose names do not end like an image are left out.

A binaryFile DataFrame a user read without a label column gets the same ``label`` (and ``split``) in
:func:`spark_imagenet.dataset.dataframe.shard_dataframe` (:func:`labelled_by_folder`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlparse

from spark_imagenet.dataset.delta_jars import DELTA_SESSION_SETTINGS
from spark_imagenet.errors import ConfigError, spark_reason
from spark_imagenet.source.labelled import IMAGE_EXTENSIONS

logger = logging.getLogger(__name__)

#: The columns of a ``spark.read.format("binaryFile")`` read.
BINARY_FILE_COLUMNS = ("path", "modificationTime", "length", "content")
#: The data sources ``--format`` takes.
FORMATS = ("parquet", "binaryFile", "delta")
#: The file endings a binaryFile read keeps (without the dot): :data:`~spark_imagenet.source.labelled.IMAGE_EXTENSIONS`.
IMAGE_ENDINGS = tuple(e[1:] for e in IMAGE_EXTENSIONS)
#: The same as a Hadoop glob, in lower, upper and capitalised case.
IMAGE_GLOB = "*.{" + ",".join(f(e) for f in (str.lower, str.upper, str.capitalize) for e in IMAGE_ENDINGS) + "}"


def check_table_path(table: str, fmt: str | None, columns: Sequence[str] = ()) -> None:
    """What can be checked of ``--table`` on this machine before Spark starts (a minute on a small machine):
    a local path given without ``--format``; a local path that does not exist; a local folder without Parquet
    files for ``parquet``, or without class folders for ``binaryFile``; local Parquet files without the named
    columns. URLs and table names are left to Spark.

    Args:
        table: the path, URL or table name of ``--table``.
        fmt: its ``--format`` (None: a table name).
        columns: the columns the job will read (image, label, and those given), checked in local Parquet.

    Raises:
        ConfigError: what is wrong, naming the path and what to give instead.
    """
    parsed = urlparse(table)
    if fmt is None:
        if not parsed.scheme and ("/" in table or table.startswith("~")):
            raise ConfigError(f"--table {table} is a path, not a table name: give its --format (binaryFile for a "
                              "folder of class folders of images, parquet or delta for a table's files)",
                              key="--table", value=table)
        return
    if fmt not in FORMATS or parsed.scheme not in ("", "file"):
        return
    path = Path(parsed.path if parsed.scheme else table)
    if not path.exists():
        raise ConfigError(f"--table {table}: no such file or folder (give a local path that exists, or a URL "
                          "the executors read)", key="--table", value=table)
    if fmt == "binaryFile" and path.is_dir():
        _check_class_folders(table, path)
    if fmt == "parquet":
        _check_parquet(table, path, columns)


def _images_in(folder: Path) -> int:
    """How many image files (by name) sit directly in ``folder``."""
    return sum(1 for p in folder.iterdir() if p.is_file() and p.suffix[1:].lower() in IMAGE_ENDINGS)


def _check_class_folders(table: str, path: Path) -> None:
    """Refuse a local folder whose images are not in sub-folders (one class) before Spark reads it."""
    if not any(p.is_dir() for p in path.iterdir()) and _images_in(path):
        raise _one_folder(f"--table {table}", table, path.name)


def _one_folder(what: str, root: str, folder: str) -> ConfigError:
    """The error for a binaryFile read whose images all sit in one folder (they would all be one class)."""
    return ConfigError(f"{what}: every image is in one folder ({folder}), so they would all be one class; "
                       "binaryFile takes each image's label from the name of its folder: give the folder whose "
                       f"sub-folders are the classes ({root}/<class>/x.jpg, or {root}/train/<class>/ and "
                       f"{root}/val/<class>/)")


def _check_parquet(table: str, path: Path, columns: Sequence[str]) -> None:
    """Refuse local Parquet input that has no Parquet files, or lacks a named column, before Spark reads it."""
    if path.is_dir() and not any(path.rglob("*.parquet")):
        images = sum(_images_in(p) for p in [path, *path.rglob("*")] if p.is_dir())
        raise ConfigError(f"--table {table}: no .parquet files in this folder"
                          + (f" (it holds {images} image file(s): --format binaryFile reads a folder of class "
                             "folders)" if images else ""), key="--table", value=table)
    if not columns:
        return
    import pyarrow.dataset as ds

    try:
        names = ds.dataset(str(path), format="parquet").schema.names
    except Exception:  # noqa: BLE001 - not readable here: Spark will say why
        return
    missing = [c for c in columns if c not in names]
    if missing:
        raise ConfigError(f"--table {table}: no column {', '.join(missing)} in its Parquet files (they have "
                          f"{', '.join(names)}); name the columns with --image-column / --label-column / "
                          "--split-column / --name-column", key="--table", value=table)


def check_table_version(version: int | None, fmt: str | None) -> None:
    """Refuse a table version (``--table-version``) for anything but a Delta table.

    Raises:
        ConfigError: ``version`` is given and ``fmt`` is not ``"delta"``.
    """
    if version is not None and fmt != "delta":
        raise ConfigError("--table-version: only with --format delta (a Delta table's version)")


def read_table(spark: Any, table: str, fmt: str | None = None, version: int | None = None) -> Any:
    """The DataFrame of a table name, or of files read with a data source.

    Args:
        spark: a SparkSession.
        table: a table name of the session's catalog (``fmt`` None), or a path or URL the executors read.
        fmt: ``"parquet"``, ``"binaryFile"`` (label from the folder name, split from a train/val folder) or
            ``"delta"`` (Delta's connector when the session has it, else ``deltalake``:
            :func:`spark_imagenet.dataset.delta.read_delta`), or None for a table name.
        version: a Delta table's version to read (``--table-version``; Delta's ``versionAsOf``), or None for the
            latest; only with ``"delta"``.

    Returns:
        pyspark.sql.DataFrame

    Raises:
        ConfigError: an unknown format, a version for another format, or Spark cannot read the table or path (its
            reason, and what to check).
    """
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format {fmt}: choose one of {', '.join(FORMATS)} (or no --format for a table name)",
                          key="--format", value=fmt)
    check_table_version(version, fmt)
    try:
        if fmt is None:
            return spark.table(table)
        if fmt == "binaryFile":
            return image_folder(spark, table)
        if fmt == "delta":
            from spark_imagenet.dataset.delta import read_delta

            return read_delta(spark, table, version)
        return spark.read.format(fmt).load(table)
    except ConfigError:
        raise
    except Exception as e:  # Py4J / AnalysisException: only its reason is worth showing
        what = f"the table {table}" if fmt is None else f"{table} as {fmt}"
        reason = spark_reason(e)
        hint = "check the name (catalog.schema.table) or give a path with --format" if fmt is None else (
            "check the path and that the executors can read it")
        if "DELTA_CONFIGURE_SPARK_SESSION" in reason:
            hint = "a session with Delta's jars also needs " + " and ".join(
                f"--conf {k}={v}" for k, v in DELTA_SESSION_SETTINGS.items())
        raise ConfigError(f"cannot read {what}: {reason}; {hint}") from None


def image_folder(spark: Any, root: str) -> Any:
    """Every image file under ``root`` as a row: binaryFile's columns plus ``label`` (the file's folder name)
    and ``split`` (``train``/``val`` from a folder of that name on the path, else null).

    Raises:
        ConfigError: no image file under ``root``, or all of them in one folder (one class).
    """
    label, split = folder_label_and_split()
    labelled = images_under(spark, root).withColumn("label", label).withColumn("split", split)
    labels = [r[0] for r in labelled.select("label").distinct().limit(2).collect()]
    if not labels:
        raise ConfigError(f"{root} holds no image files (.jpg, .jpeg, .png, .gif, .bmp): give the folder whose "
                          "sub-folders are the classes")
    if len(labels) == 1:
        raise _one_folder(root, root, labels[0])
    return labelled


def folder_label_and_split() -> tuple[Any, Any]:
    """The class and split of a binaryFile row, from its ``path`` column: the ``label`` and ``split`` columns of
    :func:`image_folder` (also what :func:`spark_imagenet.dataset.dataframe.shard_dataframe` gives a binaryFile
    read that has no label column).

    Returns:
        tuple: two ``pyspark.sql.Column``: the name of the file's folder (``photos/train/cat/1.jpg`` -> ``cat``),
        and ``train`` or ``val`` when the path has a folder of that name, else null.
    """
    from pyspark.sql import functions as F

    parts = F.split(F.col("path"), "/")
    split = F.when(F.array_contains(parts, "train"), F.lit("train")).when(F.array_contains(parts, "val"), F.lit("val"))
    return F.element_at(parts, -2), split


def labelled_by_folder(df: Any, label_col: str, split_col: str | None) -> tuple[Any, str | None]:
    """A binaryFile read without a label column, labelled by folder as the command line's ``--format binaryFile``
    (:func:`folder_label_and_split`); any other DataFrame as it is.

    Args:
        df: the DataFrame given to :func:`spark_imagenet.dataset.dataframe.shard_dataframe`.
        label_col: its label column; only the default ``"label"``, absent from ``df``, is made from the path.
        split_col: its split column, or None: then ``train``/``val`` folders on the path give the split.

    Returns:
        tuple: the DataFrame (with ``label``, and ``split`` when ``split_col`` was None, for a binaryFile read
        labelled here) and the split column to use.
    """
    names = set(df.columns)
    if label_col != "label" or label_col in names or not set(BINARY_FILE_COLUMNS) <= names:
        return df, split_col
    label, split = folder_label_and_split()
    df = df.withColumn("label", label)
    split_by_path = split_col is None and "split" not in names
    if split_by_path:
        df, split_col = df.withColumn("split", split), "split"
    logger.info("label: the name of each image's folder (a binaryFile read without a 'label' column)"
                + ("; split: a train or val folder on the path, else by val_fraction" if split_by_path else ""))
    return df, split_col


def images_under(spark: Any, root: str) -> Any:
    """Every image file under the folder ``root`` (sub-folders included, names ending like an image:
    :data:`IMAGE_GLOB`) as binaryFile's rows (``path``, ``modificationTime``, ``length``, ``content``), read by
    the executors (``root`` is a path or URL Spark reads)."""
    return (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
            .option("pathGlobFilter", IMAGE_GLOB).load(root))
