"""The options of ``spark-imagenet shard`` and the call they make: :func:`add_shard_arguments`, :func:`run_shard`.

The sources (one of them)::

    spark-imagenet shard SOURCE --out DEST            the Kaggle folder or zip, or a class-folder tree
    spark-imagenet shard --labels FILE --out DEST     a CSV, JSON Lines or Parquet labels file (a path or a URL)
    spark-imagenet shard --table NAME|PATH --out DEST  a table or files Spark reads, sharded as a Spark job
                                                      (the command line's part: ``spark_imagenet.cli``)
    ... --master M                                     any of them as a Spark job (SOURCE or --labels FILE:
                                                      ``spark_imagenet.dataset.source_job``)

It imports neither Spark nor TensorFlow.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlparse

from spark_imagenet.arguments import conf_pair, nonnegative_int, positive_int
from spark_imagenet.errors import ConfigError
from spark_imagenet.dataset.image_form import DEFAULT_JPEG_QUALITY, image_form
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, OPTION as PIXELS_OPTION
from spark_imagenet.dataset.tables import FORMATS as TABLE_FORMATS, check_table_version
from spark_imagenet.storage import store_schemes, url_forms


def fraction(text: str) -> float:
    """The type of ``--val-fraction``: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be between 0 and 1 (e.g. 0.1 for 10% of each class)")
    return value


def add_shard_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of ``shard`` to its sub-command parser ``p``."""
    p.add_argument("source", nargs="?",
                   help="the unpacked Kaggle imagenet-object-localization-challenge folder, or its .zip (either form, "
                   "read without unpacking); or a folder of class folders (root/<class>/*.jpg, or root/train/<class>/ "
                   "and root/val/<class>/). Leave it out with --labels")
    p.add_argument("--labels", metavar="FILE",
                   help="a labels file instead of SOURCE: CSV, JSON Lines or Parquet with columns path (or url), label "
                   "and optionally split; a local path or a gs://, s3://, abfs://, hdfs:// URL")
    p.add_argument("--table", metavar="NAME|PATH",
                   help="a table instead of SOURCE, read and sharded by Spark (one task per shard): a table of the "
                   "session's catalog, or with --format a path or URL the executors read")
    p.add_argument("--format", choices=TABLE_FORMATS,
                   help="read --table as files of this format; binaryFile: a folder of class folders, the label from "
                   "each file's folder, train/val from a train/ or val/ folder on the path")
    p.add_argument("--table-version", type=nonnegative_int, metavar="N",
                   help="with --format delta: read the table as of its version N (Delta's versionAsOf; default: the "
                   "latest)")
    p.add_argument("--path-column", metavar="NAME", help="the labels file's image column (default: path, else url)")
    p.add_argument("--label-column", metavar="NAME", help="the label column of --labels or --table: class names or ids "
                   "0..K-1 (default: label)")
    p.add_argument("--split-column", metavar="NAME", help="the split column of --labels or --table, train or val "
                   "(default: split, if there is one; with --format binaryFile the train/val folder in the path)")
    p.add_argument("--image-column", metavar="NAME", default="content",
                   help="--table's column of image bytes (default: content)")
    p.add_argument("--name-column", metavar="NAME", help="--table's column of file names (default: path, if there is one)")
    p.add_argument("--master", help="shard as a Spark job on this master (--table: default spark-submit's, else "
                   "local[all cores]). SOURCE or --labels FILE with --master: the images are chosen here as without "
                   "it, and read, checked and written by the executors (the source where every executor reads it); "
                   "a SOURCE URL is a folder of class folders read by Spark, as --table URL --format binaryFile")
    p.add_argument("--conf", type=conf_pair, action="append", default=None, metavar="KEY=VALUE",
                   help="extra Spark setting of the Spark job (--table, --master), repeatable: e.g. "
                   "spark.jars=A.jar,B.jar (as for train)")
    p.add_argument("--out", required=True, help=f"where the dataset goes: {url_forms()}")
    p.add_argument("--train-shards", type=positive_int, help="number of train shards (default: ~128 MiB each, >= 16)")
    p.add_argument("--val-shards", type=positive_int, help="number of val shards (default: ~128 MiB each, >= 4)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--classes", type=positive_int, help="keep the first K classes of LOC_synset_mapping.txt "
                     "(your own images: the first K class names in sorted order)")
    sel.add_argument("--class-list", help="file of wnids to keep (Kaggle layout)")
    p.add_argument("--per-class", type=positive_int, help="at most M train images per class")
    p.add_argument("--val-fraction", type=fraction, metavar="F",
                   help="your own images without a val/ folder or split column: the share of each class drawn for "
                   "validation, by file name and --seed (default 0.1)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the per-class sample, the train shuffle and the --val-fraction split (default 0)")
    p.add_argument("--processes", type=positive_int, help="worker processes (default: all cores)")
    p.add_argument("--verify", choices=("decode", "header"), default="decode",
                   help="decode: check every JPEG decodes (default); header: header and end marker only (faster, "
                   "but a JPEG damaged inside that still ends with its marker gets through, and TensorFlow "
                   "decodes it with grey areas without an error)")
    p.add_argument("--on-corrupt", choices=("error", "skip"), default="error",
                   help="empty, truncated or undecodable images: error lists them all and writes nothing (default); "
                        "skip leaves them out and records each in quality-report.json. CMYK/YCCK JPEGs, other "
                        "formats and EXIF-rotated images are repaired either way")
    p.add_argument(PIXELS_OPTION, type=positive_int, default=DEFAULT_MAX_PIXELS, metavar="PIXELS",
                   help="the largest image accepted, in pixels (width x height; default "
                   f"{DEFAULT_MAX_PIXELS:,}): a larger one is refused from its header, before it is decoded, as an "
                   "unusable image (--on-corrupt)")
    p.add_argument("--resize", type=int, metavar="N",
                   help="store every image as N x N pixels: the shorter side scaled to N (smaller images up), the "
                   "centre square kept; 256: the AlexNet paper's form (smaller shards, faster input pipeline). "
                   "Default: as the source holds it")
    p.add_argument("--max-side", type=int, metavar="N",
                   help="store every image with its longer side at most N pixels, the aspect ratio kept (smaller "
                   "images as they are). Not with --resize")
    p.add_argument("--jpeg-quality", type=int, metavar="Q",
                   help=f"JPEG quality 1-100 of the images --resize or --max-side re-encodes (default "
                   f"{DEFAULT_JPEG_QUALITY})")
    p.add_argument("--overwrite", action="store_true", help="replace a different dataset already at --out")
    p.add_argument("--transfers", type=positive_int, default=8, help=f"parallel uploads to a bucket --out ({store_schemes()}; default 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


#: The options that go with some sources only: ``(option, the sources, how the message names them)``.
_ONLY_WITH = (
    ("--path-column", ("labels",), "--labels FILE"),
    ("--label-column", ("labels", "table"), "--labels FILE or --table"),
    ("--split-column", ("labels", "table"), "--labels FILE or --table"),
    ("--format", ("table",), "--table"),
    ("--table-version", ("table",), "--table"),
    ("--image-column", ("table",), "--table"),
    ("--name-column", ("table",), "--table"),
    ("--master", ("table", "source", "labels"), "--table, SOURCE or --labels FILE"),
    ("--classes", ("source", "labels"), "SOURCE or --labels FILE (filter a --table first)"),
    ("--class-list", ("source", "labels"), "SOURCE or --labels FILE (filter a --table first)"),
    ("--per-class", ("source", "labels"), "SOURCE or --labels FILE (filter a --table first)"),
    ("--processes", ("source", "labels"), "SOURCE or --labels FILE (a --table's job uses the Spark cluster)"),
)


def check_shard_arguments(args: argparse.Namespace) -> None:
    """Check that the options name exactly one source, the column options only with ``--labels``, the stored
    form (``--resize``, ``--max-side``, ``--jpeg-quality``: :func:`~spark_imagenet.dataset.image_form.image_form`),
    and ``--out`` outside SOURCE (:func:`~spark_imagenet.dataset.sharding.check_out_apart`).

    Raises:
        ConfigError: they do not (what to give).
    """
    chosen = [s for s in (args.source, args.labels, args.table) if s is not None]
    if len(chosen) > 1:
        raise ConfigError("give the images either as SOURCE (a Kaggle folder or zip, or a folder of class folders), "
                          "as --labels FILE or as --table NAME|PATH, not several")
    if not chosen:
        raise ConfigError("give SOURCE (a Kaggle folder or zip, or a folder of class folders) or --labels FILE or "
                          "--table NAME|PATH")
    kind = "source" if args.source is not None else "labels" if args.labels is not None else "table"
    for option, kinds, words in _ONLY_WITH:
        value = getattr(args, option[2:].replace("-", "_"))
        if kind not in kinds and value is not None and not (option == "--image-column" and value == "content"):
            raise ConfigError(f"{option}: only with {words}")
    if kind in ("source", "labels") and args.master is None and args.conf:
        raise ConfigError("--conf: only with --table or --master (the settings of a Spark job)")
    check_table_version(args.table_version, args.format)
    image_form(**form_arguments(args))
    if kind in ("source", "labels") and args.master is not None:
        _check_source_job(args)
    from spark_imagenet.dataset.sharding import check_out_apart

    check_out_apart(args.source, args.out)


def form_arguments(args: argparse.Namespace) -> dict[str, int | None]:
    """The keywords of the stored form the options give (``resize``, ``max_side``, ``jpeg_quality``), for every
    sharding function (:func:`~spark_imagenet.dataset.sharding.shard`, ``shard_dataframe``, the source jobs)."""
    return {"resize": args.resize, "max_side": args.max_side, "jpeg_quality": args.jpeg_quality}


def is_url(text: str) -> bool:
    """Whether SOURCE is a URL (a scheme of two letters or more other than ``file``), not a local path."""
    scheme = urlparse(text).scheme.lower()
    return len(scheme) > 1 and scheme != "file"


def _check_source_job(args: argparse.Namespace) -> None:
    """SOURCE or ``--labels`` with ``--master`` (sharded as a Spark job): refuse what such a job cannot take.

    Raises:
        ConfigError: ``--processes`` (the executors do the work), or a filter with a SOURCE URL (read whole by
            Spark as a binaryFile table).
    """
    if args.processes is not None:
        raise ConfigError("--processes: not with --master (the Spark job's executors do the work; leave out "
                          "--master to shard with this machine's processes)")
    if args.source is not None and is_url(args.source):
        for option in ("--classes", "--class-list", "--per-class"):
            if getattr(args, option[2:].replace("-", "_")) is not None:
                raise ConfigError(f"{option}: not with a SOURCE URL (Spark reads the whole tree there, as --table "
                                  "URL --format binaryFile): give a tree of the classes and images to keep")


def open_chosen_source(args: argparse.Namespace) -> Any:
    """The source SOURCE or ``--labels FILE`` names, opened (not yet listed).

    Raises:
        SparkImagenetError: what :func:`~spark_imagenet.source.open_source` and
            :func:`~spark_imagenet.source.open_labels` raise.
    """
    from spark_imagenet.source import open_labels, open_source

    if args.labels is not None:
        return open_labels(args.labels, path_column=args.path_column, label_column=args.label_column or "label",
                           split_column=args.split_column, val_fraction=args.val_fraction)
    return open_source(args.source, val_fraction=args.val_fraction)


def run_shard(args: argparse.Namespace) -> None:
    """Run ``shard`` with the parsed options (see :func:`spark_imagenet.dataset.sharding.shard`).

    Raises:
        SparkImagenetError: bad options (:func:`check_shard_arguments`), and what
            :func:`~spark_imagenet.dataset.sharding.shard` and the sources raise.
    """
    check_shard_arguments(args)
    from spark_imagenet.dataset.sharding import shard

    shard(
        open_chosen_source(args),
        args.out,
        train_shards=args.train_shards,
        val_shards=args.val_shards,
        classes=args.classes,
        class_list=args.class_list,
        per_class=args.per_class,
        seed=args.seed,
        processes=args.processes,
        verify=args.verify,
        on_corrupt=args.on_corrupt,
        overwrite=args.overwrite,
        transfers=args.transfers,
        progress=not args.no_progress,
        max_image_pixels=args.max_image_pixels,
        **form_arguments(args),
    )
