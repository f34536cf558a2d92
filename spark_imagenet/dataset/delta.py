"""Reading a Delta Lake table as a DataFrame, with Delta's Spark connector or, where Spark has none, with
``deltalake`` (delta-rs): :func:`read_delta` (``shard --table PATH --format delta [--table-version N]``, ``predict
--table PATH --format delta``); and writing one: :func:`write_delta` (``predict --out-format delta``).

* Spark with Delta's connector (its jars in the session: :mod:`spark_imagenet.dataset.delta_jars`): Spark reads the
  table, ``spark.read.format("delta").option("versionAsOf", N).load(path)``; what :func:`read_delta` does is exactly
  that, so a ``shard_dataframe`` user who reads the table themselves gets the same rows.
* Spark without it (pyspark 4.3: no delta-spark release supports it): ``deltalake`` resolves the table's snapshot at
  the version to its list of active Parquet files, and Spark reads those files (executors, not the driver, read the
  data); partition values, which Delta keeps in its log and not in the files, are joined on by file name. A table
  whose files cannot be read as plain Parquet (:func:`refused_feature`: column mapping, deletion vectors present,
  or a reader feature not known here) is refused in one line naming the feature.

Why this split: docs/design.md, 'Delta Lake tables'.
"""

from __future__ import annotations

import logging
from typing import Any

from spark_imagenet.errors import ConfigError, install_hint, spark_reason

logger = logging.getLogger(__name__)

#: Reader features whose files read as plain Parquet (checkpoint and vacuum bookkeeping, timestamp without time
#: zone); ``deletionVectors`` is allowed while no file of the snapshot has one (:func:`refused_feature`).
PLAIN_READER_FEATURES = frozenset({"deletionVectors", "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"})
#: The column that joins each row of the delta-rs read to its file's partition values.
_FILE_COLUMN = "__spark_imagenet_delta_file"
#: What to install for the connector, said in every refusal.
CONNECTOR_HINT = ("delta-spark with its jars (io.delta:delta-spark_<spark major.minor>_2.13 and "
                  "io.delta:delta-storage; spark-imagenet finds them in ~/.m2) on a Spark it supports (pyspark <= 4.2)")


def read_delta(spark: Any, path: str, version: int | None = None) -> Any:
    """The rows of the Delta table at ``path``, at its latest version or at ``version``.

    Args:
        spark: a SparkSession (classic or Connect).
        path: the table's folder (a path or URL the executors read).
        version: the table version to read (Delta's ``versionAsOf``), or None for the latest.

    Returns:
        pyspark.sql.DataFrame: with Delta's connector, ``spark.read.format("delta").option("versionAsOf", version)
        .load(path)``; without it, the snapshot's Parquet files read by Spark (:func:`read_with_deltalake`).

    Raises:
        ConfigError: neither reader is here (what to install), the table or version does not exist, or the table
            needs a feature the ``deltalake`` path cannot honour (named).
        Exception: what Spark's connector raises for a table it cannot read (``read_table`` says it in one line).
    """
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", int(version))
    try:
        return reader.load(path)
    except Exception as e:
        if not no_delta_connector(e):
            raise
    logger.info(f"delta: this Spark has no Delta connector; {path} is read with deltalake (delta-rs)")
    return read_with_deltalake(spark, path, version)


def no_delta_connector(error: BaseException) -> bool:
    """Whether a Spark error says the session has no ``delta`` data source (DATA_SOURCE_NOT_FOUND)."""
    reason = spark_reason(error)
    return "DATA_SOURCE_NOT_FOUND" in reason or "Failed to find the data source: delta" in reason


def open_snapshot(path: str, version: int | None) -> Any:
    """``deltalake.DeltaTable(path, version=version)``.

    Raises:
        ConfigError: ``deltalake`` is not installed (both readers named), no Delta table at ``path``, no such
            version, or deltalake cannot read the log (its reason).
    """
    try:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError
    except ImportError:
        raise ConfigError(f"cannot read {path} as delta: this Spark has no Delta connector and the deltalake package "
                          f"is not installed; install deltalake ({install_hint('delta')}), or use "
                          f"{CONNECTOR_HINT}") from None
    try:
        return DeltaTable(path, version=version)
    except TableNotFoundError:
        raise ConfigError(f"{path} is not a Delta table (no _delta_log found there): check the path, or give the "
                          "table's --format") from None
    except Exception as e:  # deltalake's DeltaError: a missing version, a log it cannot read
        reason = " ".join(str(e).split())[:300]
        if version is not None and "version" in reason.lower():
            latest = _latest_version(DeltaTable, path)
            raise ConfigError(f"{path}: the Delta table has no version {version} (its versions run 0 to {latest}); "
                              "give --table-version within them, or leave it out for the latest") from None
        raise ConfigError(f"cannot read {path} as delta with deltalake: {reason}; or use {CONNECTOR_HINT}") from None


def _latest_version(table_class: Any, path: str) -> str:
    """The latest version of the table at ``path``, or ``?`` when it cannot be read."""
    try:
        return str(table_class(path).version())
    except Exception:  # noqa: BLE001 - only for the message
        return "?"


def refused_feature(reader_features: list[str] | None, configuration: dict[str, str],
                    files_with_deletion_vectors: int) -> str | None:
    """The feature of a Delta snapshot that keeps its Parquet files from reading as the table's rows, or None.

    Args:
        reader_features: the protocol's reader features (None for reader versions 1 and 2).
        configuration: the table's properties (``delta.columnMapping.mode``).
        files_with_deletion_vectors: how many active files of the snapshot carry a deletion vector.

    Returns:
        str | None: e.g. ``"column mapping (delta.columnMapping.mode=name)"``, ``"deletion vectors (2 files)"``,
        ``"the reader feature typeWidening"``.
    """
    mode = configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        return f"column mapping (delta.columnMapping.mode={mode})"
    if files_with_deletion_vectors:
        return f"deletion vectors ({files_with_deletion_vectors} file(s) with deleted rows marked, not rewritten)"
    unknown = sorted(set(reader_features or ()) - PLAIN_READER_FEATURES - {"columnMapping"})
    return f"the reader feature {', '.join(unknown)}" if unknown else None


def read_with_deltalake(spark: Any, path: str, version: int | None = None) -> Any:
    """The rows of a Delta snapshot: ``deltalake`` lists its active Parquet files, Spark reads them.

    Args:
        spark: a SparkSession.
        path: the table's folder (a path or URL both this process and the executors read).
        version: the version, or None for the latest.

    Returns:
        pyspark.sql.DataFrame: the table's columns in its schema's order, partition columns included.

    Raises:
        ConfigError: what :func:`open_snapshot` raises; a feature the files cannot be read without
            (:func:`refused_feature`); a snapshot without files (no rows).
    """
    import pyarrow as pa

    table = open_snapshot(path, version)
    metadata = table.metadata()
    refused = refused_feature(table.protocol().reader_features, dict(metadata.configuration),
                              pa.table(table.deletion_vectors()).num_rows)
    at = f"version {table.version()}"
    if refused:
        raise ConfigError(f"cannot read the Delta table {path} ({at}) with deltalake: it uses {refused}, which its "
                          f"Parquet files cannot be read without; use {CONNECTOR_HINT}")
    files = table.file_uris()
    if not files:
        raise ConfigError(f"the Delta table {path} has no rows at {at}")
    logger.info(f"delta: {path} at {at}: {len(files)} Parquet file(s) listed by deltalake, read by Spark")
    df = spark.read.parquet(*files)
    partitions = list(metadata.partition_columns)
    if partitions:
        df = _with_partition_values(spark, df, table, partitions)
    return df.select(*[f.name for f in table.schema().fields])


def _with_partition_values(spark: Any, df: Any, table: Any, partitions: list[str]) -> Any:
    """``df`` (the snapshot's files read by Spark) with the partition columns' values of each row's file, which
    Delta keeps in its log (joined on the file's name, unique in a Delta table)."""
    import posixpath

    import pyarrow as pa
    from pyspark.sql import functions as F

    actions = pa.table(table.get_add_actions(flatten=True))
    names = [posixpath.basename(p) for p in actions.column("path").to_pylist()]
    values = pa.table({_FILE_COLUMN: names, **{c: actions.column(f"partition.{c}") for c in partitions}})
    files = spark.createDataFrame(values)
    return (df.withColumn(_FILE_COLUMN, F.col("_metadata.file_name"))
            .join(F.broadcast(files), _FILE_COLUMN).drop(_FILE_COLUMN))


def write_delta(df: Any, out: str) -> None:
    """Write ``df`` as a Delta table at ``out`` (replacing what is there): with Delta's connector when the session
    has it; else as Parquet written by Spark, then made a Delta table by ``deltalake``
    (``convert_to_deltalake``: its log over those files).

    Raises:
        ConfigError: neither Delta's connector nor ``deltalake`` is here (what to install).
        Exception: what Spark's writer raises.
    """
    try:
        df.write.format("delta").mode("overwrite").save(out)
        return
    except Exception as e:
        if not no_delta_connector(e):
            raise
    try:
        from deltalake import convert_to_deltalake
    except ImportError:
        raise ConfigError(f"--out-format delta: this Spark has no Delta connector and the deltalake package is not "
                          f"installed; install deltalake ({install_hint('delta')}), or use {CONNECTOR_HINT}, or "
                          "write Parquet (--out-format parquet)") from None
    df.write.mode("overwrite").parquet(out)
    convert_to_deltalake(out)
    logger.info(f"delta: {out} written as Parquet by Spark and made a Delta table by deltalake")
