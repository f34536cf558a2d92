"""``spark-imagenet predict MODEL_URL --source URL|--table NAME --out URL``: batch inference as a Spark job,
written as Parquet (or a Delta table: ``--out-format delta``).

Runs on the Spark driver (the command line's process). The images become a DataFrame through the readers
the ``shard`` command uses: a folder (a flat folder of images or a class-folder tree, any path or URL Spark
reads) with binaryFile (:func:`spark_imagenet.dataset.tables.images_under`); a labels file (any store) through
its source, read by the executors (:func:`spark_imagenet.dataset.source_job.image_rows`); a table
(:func:`spark_imagenet.dataset.tables.read_table`). :func:`~spark_imagenet.training.driver.batch_predict.
predict_dataframe` scores them, and the table at ``--out`` holds one row per image: the key (``path``, or
``--id-column``), ``class_ids``, ``wnids``, ``names``, ``probabilities`` and ``error``. The command prints
the counts and where they went; images without a prediction are counted and named in one warning.

Everything that can be checked without Spark (the model, ``--out``, the options) is checked before Spark
starts; a mistake is one :class:`~spark_imagenet.errors.ConfigError` naming the option.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlparse

from spark_imagenet.arguments import ArgumentParser, conf_pair, nonnegative_int, positive_int
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, OPTION as PIXELS_OPTION
from spark_imagenet.errors import ConfigError, spark_reason
from spark_imagenet.training.driver.batch_predict import DEFAULT_BATCH, check_model, model_location
from spark_imagenet.training.driver.spark_session import require_pyspark

logger = logging.getLogger(__name__)

#: The options that choose this form of ``predict`` (the other is ``predict MODEL IMAGE...``).
SPARK_FORM_OPTIONS = ("--source", "--table")
#: The formats ``--out-format`` writes.
OUT_FORMATS = ("parquet", "delta")
#: The output's columns after the key.
FIELDS = ("class_ids", "wnids", "names", "probabilities", "error")
#: Images without a prediction named in the warning.
NAMED_ERRORS = 5
#: Rows per Arrow batch sent to Python (Spark's 10,000 would be over a gigabyte of ImageNet JPEGs).
ARROW_BATCH_CONF = {"spark.sql.execution.arrow.maxRecordsPerBatch": "256"}


def is_spark_form(arguments: Sequence[str]) -> bool:
    """Whether ``predict``'s arguments ask for this form (``--source`` or ``--table`` among them)."""
    return any(a in SPARK_FORM_OPTIONS or a.startswith(tuple(f"{o}=" for o in SPARK_FORM_OPTIONS))
               for a in arguments)


def build_parser() -> ArgumentParser:
    """The options of ``spark-imagenet predict MODEL_URL --source URL|--table NAME --out URL``."""
    p = ArgumentParser(prog="spark-imagenet predict",
                       description="the top classes of every image of a folder, a labels file or a table, as a "
                       "Spark job, written as Parquet or Delta (the other form, predict MODEL_URL IMAGE..., scores "
                       "files on this machine)")
    p.add_argument("model", help="the --output folder of a training run (holding serving/ and labels.json)")
    p.add_argument("--source", help="a folder of images or of class folders (a path or URL Spark reads), or a "
                   "labels file (.csv, .jsonl, .parquet: path,label; its images in any store)")
    p.add_argument("--table", help="a table of images: a catalog table name, or Parquet files or a Delta table "
                   "(--format; a path or URL)")
    p.add_argument("--format", choices=("parquet", "delta"), help="--table's files' format (default: parquet "
                   "for a path, none for a table name)")
    p.add_argument("--image-column", default="content", help="--table's column of encoded image bytes "
                   "(default content)")
    p.add_argument("--table-version", type=nonnegative_int, metavar="N",
                   help="with --format delta: score the table as of its version N (default: the latest)")
    p.add_argument("--id-column", help="--table's column that names each image in the output (default path)")
    p.add_argument("--out", required=True, help="where the output goes (a folder, created; a path or URL Spark "
                   "writes)")
    p.add_argument("--out-format", choices=OUT_FORMATS, default="parquet",
                   help="the output's format: parquet (default) or delta (a Delta table: with Delta's connector, "
                   "else Parquet made a Delta table by deltalake)")
    p.add_argument("--overwrite", action="store_true", help="replace what is at --out")
    p.add_argument("--top", type=positive_int, default=5, help="classes per image (default 5)")
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH,
                   help=f"images per call of the model on an executor (default {DEFAULT_BATCH})")
    p.add_argument(PIXELS_OPTION, type=positive_int, default=DEFAULT_MAX_PIXELS, metavar="PIXELS",
                   help=f"the largest image scored, in pixels (width x height; default {DEFAULT_MAX_PIXELS:,}): a "
                   "larger one gets the reason in its row's error, from its header, without being decoded")
    p.add_argument("--master", help="the Spark master (default: local[N], N this machine's cores; or sc://HOST:PORT)")
    p.add_argument("--conf", type=conf_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting, repeatable")
    return p


def check_arguments(args: argparse.Namespace) -> None:
    """What can be checked before Spark starts: one of ``--source``/``--table``, the options that go with
    each, the model (:func:`~spark_imagenet.training.driver.batch_predict.check_model`) and a local ``--out``.

    Raises:
        ConfigError: the first mistake, naming its option.
    """
    if (args.source is None) == (args.table is None):
        raise ConfigError("give one of --source URL (a folder or a labels file) and --table NAME (a table), "
                          + ("not both" if args.source is not None else "to say which images to score"))
    if args.source is not None:
        given = [o for o, v in (("--format", args.format), ("--id-column", args.id_column),
                                ("--table-version", args.table_version)) if v is not None]
        if given or args.image_column != "content":
            raise ConfigError(f"{', '.join(given) or '--image-column'} goes with --table, not --source (a "
                              "--source's rows are named by their path)")
        local = "://" not in args.source or args.source.startswith("file://")
        path = Path(urlparse(args.source).path if args.source.startswith("file://") else args.source).expanduser()
        if local and not path.exists():
            raise ConfigError(f"--source {args.source}: no such folder or file (give a folder of images, a "
                              "class-folder tree, or a labels file)", key="--source", value=args.source)
    from spark_imagenet.dataset.tables import check_table_version

    check_table_version(args.table_version, args.format)
    check_model(model_location(args.model))
    check_out(args.out, args.overwrite)


def check_out(out: str, overwrite: bool) -> None:
    """Refuse a local ``--out`` that is a file, is a folder with something in it (without ``--overwrite``), or
    cannot be created. A URL is left to Spark's writer.

    Raises:
        ConfigError: names ``--out`` and the fix.
    """
    if "://" in out and not out.startswith("file://"):
        return
    path = Path(urlparse(out).path if out.startswith("file://") else out).expanduser().absolute()
    if path.is_file():
        raise ConfigError(f"--out {out} is a file: give a folder for the output (it is created)",
                          key="--out", value=out)
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out} is a folder with files in it: give a new folder, or --overwrite to "
                          "replace them", key="--out", value=out)
    parent = next((p for p in (path, *path.parents) if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: cannot write there ({parent} is not a folder you can write to); give "
                          "a folder you can write to", key="--out", value=out)


def is_labels_file(source: str) -> bool:
    """Whether ``--source`` names a labels file (a local file, or a URL ending in a labels file's suffix)."""
    from spark_imagenet.source.labels_file import FORMATS

    if "://" in source and not source.startswith("file://"):
        return os.path.splitext(urlparse(source).path)[1].lower() in FORMATS
    return Path(urlparse(source).path if source.startswith("file://") else source).expanduser().is_file()


def source_rows(spark: Any, source: str) -> Any:
    """The images of ``--source`` as a DataFrame of ``path`` and ``content``.

    Raises:
        ConfigError: a labels file that cannot be read or lists no image, a folder Spark cannot read or with
            no image file in it.
    """
    from spark_imagenet.dataset.source_job import image_rows
    from spark_imagenet.dataset.tables import images_under

    if is_labels_file(source):
        from spark_imagenet.source import open_labels

        dataset = open_labels(source).list_images()
        return image_rows(spark, dataset).withColumnRenamed("name", "path").select("path", "content")
    where = os.path.abspath(os.path.expanduser(source)) if "://" not in source else source
    try:
        df = images_under(spark, where).select("path", "content")
        found = df.limit(1).count()
    except Exception as e:
        raise ConfigError(f"--source {source}: Spark cannot read it ({spark_reason(e)[:300]}); check the path "
                          "and that the executors can read it", key="--source", value=source) from None
    if not found:
        raise ConfigError(f"--source {source} holds no image files (.jpg, .jpeg, .png, .gif, .bmp, sub-folders "
                          "included)", key="--source", value=source)
    return df


def table_rows(spark: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """The rows of ``--table`` and the key column that names them in the output.

    Raises:
        ConfigError: the table cannot be read (:func:`~spark_imagenet.dataset.tables.read_table`); the key
            column is not there.
    """
    from spark_imagenet.dataset.tables import read_table

    fmt = args.format
    if fmt is None and ("/" in args.table or "://" in args.table or args.table.endswith(".parquet")):
        fmt = "parquet"
    if fmt == "parquet" and "://" not in args.table and not os.path.exists(os.path.expanduser(args.table)):
        raise ConfigError(f"--table {args.table}: no such file or folder (give Parquet files, or a table name)",
                          key="--table", value=args.table)
    where = os.path.abspath(os.path.expanduser(args.table)) if fmt and "://" not in args.table else args.table
    df = read_table(spark, where, fmt, args.table_version)
    key = args.id_column or "path"
    if key not in df.columns:
        raise ConfigError(f"--id-column {key}: the table {args.table} has no such column (columns: "
                          f"{', '.join(df.columns)}); give the column that names each image",
                          key="--id-column", value=key)
    return df, key


def run_predict_job(spark: Any, df: Any, key: str, args: argparse.Namespace) -> dict[str, Any]:
    """Score ``df`` with :func:`predict_dataframe`, write ``key`` and the prediction's fields to ``--out`` as
    Parquet or a Delta table (``--out-format``; :func:`spark_imagenet.dataset.delta.write_delta`), and count what
    was written.

    Returns:
        dict: ``{"images", "errors", "out", "failed": [(key, error), ...]}`` (at most :data:`NAMED_ERRORS`).

    Raises:
        ConfigError: the image column is wrong (:func:`predict_dataframe`), Spark cannot write ``--out``, or no
            writer of Delta is here (:func:`~spark_imagenet.dataset.delta.write_delta`).
    """
    from pyspark.sql import functions as F

    from spark_imagenet.dataset.delta import read_delta, write_delta
    from spark_imagenet.training.driver.batch_predict import predict_dataframe

    out = os.path.abspath(os.path.expanduser(args.out)) if "://" not in args.out else args.out
    scored = predict_dataframe(df, args.model, image_col=args.image_column, top_k=args.top,
                               batch_size=args.batch_size, max_image_pixels=args.max_image_pixels)
    table = scored.select(F.col(key).alias(key), *[F.col(f"prediction.{f}").alias(f) for f in FIELDS])
    before = _set_conf(spark, ARROW_BATCH_CONF)
    try:
        if args.out_format == "delta":
            write_delta(table, out)
        else:
            table.write.mode("overwrite").parquet(out)
    except ConfigError:
        raise
    except Exception as e:
        reason = spark_reason(e) if type(e).__module__.startswith(("py4j", "pyspark")) else ""
        if not any(s in reason for s in ("Permission denied", "No FileSystem for scheme", "Mkdirs failed")):
            raise  # a failure of the job itself (cli.main prints Spark's reason)
        raise ConfigError(f"--out {args.out}: Spark could not write the output there ({reason[:300]})",
                          key="--out", value=args.out) from None
    finally:
        _set_conf(spark, before)
    written = read_delta(spark, out) if args.out_format == "delta" else spark.read.parquet(out)
    counts = written.agg(F.count(F.lit(1)).alias("images"),
                         F.count(F.col("error")).alias("errors")).collect()[0]
    failed = [(r[0], r[1]) for r in written.where(F.col("error").isNotNull()).select(key, "error")
              .orderBy(key).limit(NAMED_ERRORS).collect()]
    return {"images": int(counts["images"]), "errors": int(counts["errors"]), "out": out, "failed": failed,
            "format": "Delta" if args.out_format == "delta" else "Parquet"}


def _set_conf(spark: Any, values: dict[str, str | None]) -> dict[str, str | None]:
    """Set (or with None unset) session settings; return what was there (a server that refuses keeps its own)."""
    before: dict[str, str | None] = {}
    for key, value in values.items():
        try:
            before[key] = spark.conf.get(key, None)
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)
        except Exception as e:  # a Connect server may refuse (CANNOT_MODIFY_CONFIG)
            before.pop(key, None)
            logger.info(f"predict: {key} stays as the session has it ({spark_reason(e)})")
    return before


def report(result: dict[str, Any], key: str) -> None:
    """Print the counts and where the output went (stdout); warn once about the images without a prediction
    (stderr)."""
    print(f"predict: {result['images']} images, {result['errors']} errors -> {result['out']} "
          f"({result['format']}: {key}, {', '.join(FIELDS)})")
    if result["errors"]:
        named = "; ".join(f"{k} ({e})" for k, e in result["failed"])
        more = result["errors"] - len(result["failed"])
        print(f"spark-imagenet: warning: {result['errors']} of {result['images']} images have no prediction (the "
              f"error column says why): {named}" + (f"; and {more} more" if more > 0 else ""), file=sys.stderr)


def main(argv: Sequence[str]) -> int:
    """``spark-imagenet predict MODEL_URL --source URL|--table NAME --out URL [options]``; returns 0.

    Raises:
        SparkImagenetError: a mistake in the options, the model, the images or ``--out`` (one message).
    """
    from spark_imagenet.dataset.delta_jars import delta_session_conf
    from spark_imagenet.training.driver.console import stopped_at_end
    from spark_imagenet.training.driver.spark_session import session_for

    args = build_parser().parse_args(list(argv))
    require_pyspark()  # a Spark job: said before the model and the options are checked
    check_arguments(args)
    conf = dict(args.conf)
    if "delta" in (args.format, args.out_format):
        conf.update(delta_session_conf(conf, args.master))
    spark = session_for(args.master, os.cpu_count() or 1, conf, app_name="spark-imagenet predict",
                        warn_oversubscription=False)
    with stopped_at_end(spark):
        df, key = (source_rows(spark, args.source), "path") if args.source is not None else table_rows(spark, args)
        result = run_predict_job(spark, df, key, args)
    report(result, key)
    return 0
