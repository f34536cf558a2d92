"""The ``spark-imagenet`` command line: a thin layer over the package's functions.

Each sub-command parses its options and calls one importable function, so a
notebook with an existing SparkSession (Databricks) runs the same job:

==============  ==========================================================
command         function
==============  ==========================================================
``demo``        :func:`spark_imagenet.demo.run_demo`
``shard``       :func:`spark_imagenet.dataset.sharding.shard` (options: :mod:`spark_imagenet.dataset.shard_options`)
``shard``       ``--table``: :func:`spark_imagenet.dataset.dataframe.shard_dataframe`
``inspect``     :func:`spark_imagenet.dataset.report.inspect`
``upload``      :func:`spark_imagenet.dataset.transfer.upload`
``fetch``       :func:`spark_imagenet.training.task.staging.fetch_rank`
``train``       :func:`spark_imagenet.training.driver.launch.plan_job` (checks: ``driver.preflight``), ``run_job``
``download``    :func:`spark_imagenet.source.kaggle.download`
``doctor``      :func:`spark_imagenet.doctor.run_doctor`
``mlflow-log``  :func:`spark_imagenet.training.driver.tracking.send_pending`
``evaluate``    ``python -m spark_imagenet.training.worker.evaluate`` in a child Python (TensorFlow)
``predict``     ``python -m spark_imagenet.training.worker.predict`` in a child Python (TensorFlow)
``predict``     ``--source``/``--table``: :func:`spark_imagenet.training.driver.predict_job.main` (a Spark job)
``export``      ``python -m spark_imagenet.training.worker.export`` in a child Python (TensorFlow)
==============  ==========================================================

``train`` and ``demo`` take every setting of :class:`~spark_imagenet.training.job.config.TrainConfig`
as an option (generated from its definition, one ``--help`` group per section:
:mod:`spark_imagenet.training.job.options`), a TOML job file (``--config``) and ``--print-config``.

Errors the user can fix (:class:`~spark_imagenet.errors.SparkImagenetError`)
are printed as one message without a traceback, exit status 2; an option error
is that message and one line pointing at ``--help`` (:mod:`spark_imagenet.arguments`).

pyspark is the optional extra ``spark``: ``demo``, ``train``, ``shard --table|--master`` and ``predict
--source|--table`` say it is missing in one line before reading anything
(:func:`~spark_imagenet.training.driver.spark_session.require_pyspark`); the other commands need none.

The package's log lines are shown by :func:`spark_imagenet.logs.console` while a command runs: plain lines, the
training job's on stdout, the data commands' progress on stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from typing import Sequence

from spark_imagenet import __version__
from spark_imagenet.arguments import ArgumentParser, conf_pair, nonnegative_int, positive_int
from spark_imagenet.demo import DEMO_TRAIN_DEFAULTS
from spark_imagenet.errors import ConfigError, SparkImagenetError, spark_reason
from spark_imagenet.logs import console
from spark_imagenet.training.driver.console import ignore_sigint, start_session, stopped_at_end
from spark_imagenet.training.driver.spark_session import require_pyspark

logger = logging.getLogger(__name__)


def _resolve_job(args: argparse.Namespace, defaults: dict):
    """The :class:`TrainConfig` of the defaults, the job file and the options given, and the URL.

    Returns:
        ``(config, url)``; url is None when neither the command line nor the file gives one.

    Raises:
        ConfigError: a bad job file or value (naming the key, the option or the file).
    """
    from spark_imagenet.training.job.config import TrainConfig
    from spark_imagenet.training.job.jobfile import absolute_paths, load_job_file, resolve_job

    file_values = load_job_file(args.config) if args.config else {}
    given = {key: getattr(args, key) for key in (*TrainConfig.keys(), "url") if getattr(args, key, None) is not None}
    given = absolute_paths(given, os.getcwd())
    try:
        config = resolve_job([defaults, file_values, given])
    except ConfigError as e:
        key = getattr(e, "key", None)
        from_file = args.config and key in file_values and key not in given
        raise ConfigError(f"{e} (from the job file {args.config})" if from_file else str(e)) from None
    return config, given.get("url") or file_values.get("url")


def _shard_table(args: argparse.Namespace) -> int:
    """``spark-imagenet shard --table ...`` (or ``shard URL --master M``, a class-folder tree read as
    ``--table URL --format binaryFile``): read the table with Spark and shard it as a Spark job
    (:func:`spark_imagenet.dataset.dataframe.shard_dataframe`; the options: :mod:`spark_imagenet.dataset.shard_options`)."""
    from spark_imagenet.dataset.dataframe import DEFAULT_VAL_FRACTION, shard_dataframe
    from spark_imagenet.dataset.delta_jars import delta_session_conf
    from spark_imagenet.dataset.shard_options import check_shard_arguments, form_arguments, is_url
    from spark_imagenet.dataset.tables import check_table_path, read_table
    from spark_imagenet.training.driver.spark_session import session_for

    check_shard_arguments(args)
    require_pyspark()  # a Spark job: without pyspark, say so before the sources and tables are read
    if args.table is None and not is_url(args.source or ""):
        return _shard_source(args)
    if args.source is not None:  # a URL: a class-folder tree read by Spark
        args.table, args.format, args.source = args.source, "binaryFile", None
    columns = [args.image_column, args.label_column or "label", args.split_column, args.name_column]
    check_table_path(args.table, args.format, [c for c in columns if c])
    conf = dict(args.conf or [])
    if args.format == "delta":
        conf.update(delta_session_conf(conf, args.master))
    spark = session_for(args.master, os.cpu_count() or 1, conf, app_name="spark-imagenet shard",
                        warn_oversubscription=False)
    df = read_table(spark, args.table, args.format, args.table_version)
    split = args.split_column or _default_split(df, args.format)
    shard_dataframe(df, args.out, args.image_column, args.label_column or "label", split, name_col=args.name_column,
                    val_fraction=args.val_fraction or DEFAULT_VAL_FRACTION, seed=args.seed,
                    train_shards=args.train_shards, val_shards=args.val_shards, verify=args.verify,
                    on_corrupt=args.on_corrupt, overwrite=args.overwrite, progress=not args.no_progress,
                    max_image_pixels=args.max_image_pixels, **form_arguments(args))
    return 0


def _default_split(df, fmt: str | None) -> str | None:
    """The split column when ``--split-column`` is not given: ``split`` of a binaryFile read (from the path),
    else a string column named ``split`` if the table has one (as ``--labels`` reads one), said in a line."""
    if fmt == "binaryFile":
        return "split"
    if any(f.name == "split" and type(f.dataType).__name__ == "StringType" for f in df.schema.fields):
        logger.info(
            "the table's 'split' column gives each row's split (train, val, or null: by --val-fraction); "
            "--split-column names another")
        return "split"
    return None


def _shard_source(args: argparse.Namespace) -> int:
    """``spark-imagenet shard SOURCE|--labels FILE --master M``: choose the images here, shard them as a Spark
    job (:func:`spark_imagenet.dataset.source_job.shard_source_job`)."""
    from spark_imagenet.dataset.shard_options import form_arguments, open_chosen_source
    from spark_imagenet.dataset.source_job import shard_source_job, shard_zip_job
    from spark_imagenet.source.zip_archive import is_zip_source, plan_kaggle_zip
    from spark_imagenet.training.driver.spark_session import session_for

    options = dict(train_shards=args.train_shards, val_shards=args.val_shards, seed=args.seed, verify=args.verify,
                   on_corrupt=args.on_corrupt, overwrite=args.overwrite, progress=not args.no_progress,
                   max_image_pixels=args.max_image_pixels, **form_arguments(args))
    plan, dataset = None, None
    if args.labels is None and args.per_class is None and is_zip_source(args.source):
        # The zip's members are never all held here (docs/design.md, 'Sharding a DataFrame as a Spark job').
        plan = plan_kaggle_zip(args.source, num_classes=args.classes, class_list=args.class_list, seed=args.seed)
    else:
        dataset = open_chosen_source(args).list_images(num_classes=args.classes, class_list=args.class_list,
                                                       per_class=args.per_class, seed=args.seed,
                                                       progress=not args.no_progress)
    spark = session_for(args.master, os.cpu_count() or 1, dict(args.conf or []), app_name="spark-imagenet shard",
                        warn_oversubscription=False)
    if plan is not None:
        shard_zip_job(spark, plan, args.out, **options)
        return 0
    shard_source_job(spark, dataset, args.out, **options)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``spark-imagenet`` (all sub-commands)."""
    from spark_imagenet.dataset.shard_options import add_shard_arguments
    from spark_imagenet.storage import store_schemes, url_forms
    from spark_imagenet.training.job.options import add_train_options

    parser = ArgumentParser(
        prog="spark-imagenet",
        description="ImageNet in the Kaggle layout -> verified TFRecord shards -> AlexNet trained by "
        "Spark barrier tasks under MultiWorkerMirroredStrategy.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("demo", help="generate a small dataset, shard it and train on local[4] (the built-in default)")
    p.add_argument("--workdir", help="folder for the generated dataset and shards (default: a temporary one, removed after)")
    p.add_argument("--classes", type=positive_int, default=10, help="synthetic classes (default 10)")
    add_train_options(p, DEMO_TRAIN_DEFAULTS)

    p = sub.add_parser("shard", help="write TFRecord shards and manifest.json from a Kaggle-layout folder or the "
                       "downloaded zip, a folder of class folders, or a labels file")
    add_shard_arguments(p)

    p = sub.add_parser("upload", help="publish shards built on local disk to a bucket (verified, resumable)")
    p.add_argument("source", help="local folder holding manifest.json and the shards (the --out of shard)")
    p.add_argument("dest", help=f"bucket URL: {url_forms(local=False)}")
    p.add_argument("--transfers", type=positive_int, default=8,
                   help=f"parallel uploads to DEST ({store_schemes()}; default 8)")
    p.add_argument("--overwrite", action="store_true", help="replace a different dataset already at DEST")

    p = sub.add_parser("fetch", help="download and verify the shards of one barrier task into a local cache "
                       "(what each task does before training)")
    p.add_argument("url", help="bucket URL of a sharded dataset")
    p.add_argument("--rank", type=int, required=True, help="task rank, 0 .. WORKERS-1")
    p.add_argument("--workers", type=positive_int, required=True, help="number of barrier tasks")
    p.add_argument("--cache", help="cache folder (default: under SPARK_LOCAL_DIRS, else the temp folder)")
    p.add_argument("--transfers", type=positive_int, default=8, help="parallel downloads (default 8)")

    p = sub.add_parser("inspect", help="print the summary of a sharded dataset's manifest")
    p.add_argument("url", help="bucket URL")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")

    p = sub.add_parser("train", help="train a model on a sharded dataset with Spark barrier tasks")
    p.add_argument("url", nargs="?", help="bucket URL of a sharded dataset (or the job file's url)")
    add_train_options(p, {})
    # For the submit/ scripts: check the job for spark-submit with this master, print its worker count, exit.
    p.add_argument("--check-for-master", metavar="MASTER", default=None, help=argparse.SUPPRESS)

    p = sub.add_parser("download", help="download the ImageNet archive from Kaggle with the official kaggle client "
                       "(resumable; needs Kaggle credentials and the competition's rules accepted)")
    p.add_argument("--competition", default="imagenet-object-localization-challenge",
                   help="Kaggle competition name (default imagenet-object-localization-challenge, a ~155 GiB zip)")
    p.add_argument("--dest", required=True, help="folder for the archive (created if absent)")
    p.add_argument("--file", dest="file_name", help="download this one file of the competition instead of the archive")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    _add_tensorflow_commands(sub)
    p = sub.add_parser("mlflow-log", help="send a tracked run that its MLflow server could not take (the "
                       "mlflow-pending.json the job wrote) to that server")
    p.add_argument("record", help="the mlflow-pending.json (a local path or bucket URL)")
    p = sub.add_parser("doctor", help="print the versions, GPUs, bucket credentials and Spark preflight checks "
                       "found here and on a master; exit 1 when a check fails")
    p.add_argument("url", nargs="?", help="a dataset URL whose manifest to read (optional)")
    p.add_argument("--master", help="the Spark master to check: spark://, yarn, k8s://, local[N], or a Spark Connect "
                   "sc://HOST:PORT (default: the session train would get)")
    p.add_argument("--conf", type=conf_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting, repeatable (as for train)")
    p.add_argument("--workers", type=positive_int,
                   help="check for this many barrier tasks (default: as many as the master has slots)")
    p.add_argument("--allow-unencrypted", action="store_true",
                   help="check as train --allow-unencrypted would (Spark's encryption or SSL on is then a warning)")
    p.add_argument("--gpus-per-worker", type=nonnegative_int, default=0, metavar="K",
                   help="check the GPU settings as train --gpus-per-worker K would (default 0)")
    return parser


def _check_for_master(config, url: str | None, master: str) -> int:
    """What the submit/ scripts ask before spark-submit starts: print the job's worker count.

    Raises:
        ConfigError: no URL; a job ``master`` (spark-submit's ``--master``
            decides); the first problem of the checks before Spark
            (:func:`~spark_imagenet.training.driver.preflight.check_before_spark` with that master: YARN without
            its configuration, too few slots, a dataset on this machine's disk with a cluster master and no
            ``--shared-filesystem``, ...).
        ManifestError: with a master on this machine, a local dataset folder
            that does not exist or holds no manifest.
    """
    from spark_imagenet.storage import is_remote_url, open_storage
    from spark_imagenet.training.driver.preflight import check_before_spark
    from spark_imagenet.training.job.master import Master

    if url is None:
        raise ConfigError("no dataset URL: give it as the first argument (or as url in the job file)")
    if config.scaling.master is not None:
        raise ConfigError(f"--master {config.scaling.master} (or master in the job file): the script submits to {master} "
                          "(set its MASTER, or use the script of another platform) and leaves the job's master out",
                          key="--master", value=config.scaling.master)
    # --results is written by the driver spark-submit starts (in a pod, or YARN's application master in cluster
    # mode): that driver checks it, not this machine
    check_before_spark(config.replace(master=master, results=None), url).raise_if_problems()
    if Master.parse(master, check=False).runs_on_this_host and not is_remote_url(url):  # read here: before the JVM
        from spark_imagenet.dataset.manifest import Manifest

        Manifest.load(open_storage(url))
    print(config.scaling.workers)
    return 0


def _train(args: argparse.Namespace) -> int:
    """``spark-imagenet train``: resolve the job, plan and check it without Spark
    (:func:`~spark_imagenet.training.driver.launch.plan_job`, whose checks before Spark take the job's master
    as the session's), then run it."""
    from spark_imagenet.training.job.jobfile import dump_job
    from spark_imagenet.training.driver.launch import plan_job, run_job

    config, url = _resolve_job(args, {})
    if args.print_config:
        print(dump_job(config, url), end="")
        return 0
    if args.check_for_master is not None:
        return _check_for_master(config, url, args.check_for_master)
    if url is None:
        raise ConfigError("no dataset URL: give it as the first argument of train (or as url in the job file)")
    require_pyspark()  # before the dataset is read: the job cannot run without it
    job = plan_job(url, config)  # a dataset, setting or master mistake is reported before Spark starts
    spark = start_session(config, "train")
    with stopped_at_end(spark):
        run_job(spark, job)
    return 0


def _demo(args: argparse.Namespace) -> int:
    """``spark-imagenet demo``: the demo's defaults under the job file and options."""
    from spark_imagenet.demo import run_demo
    from spark_imagenet.training.job.jobfile import dump_job

    config, url = _resolve_job(args, DEMO_TRAIN_DEFAULTS)
    if url is not None:
        raise ConfigError(f"the demo makes its own dataset: remove url from the job file {args.config} (or run "
                          "`spark-imagenet train` on that dataset)")
    if args.print_config:
        print(dump_job(config), end="")
        return 0
    from spark_imagenet.training.driver.preflight import check_before_spark

    require_pyspark()
    check_before_spark(config, None).raise_if_problems()  # before the JVM; the demo's plan checks them again
    # the demo's own local[4] on a small machine is by design: warn only about --workers the user gave
    spark = start_session(config, "demo", warn_oversubscription=args.workers is not None)
    with stopped_at_end(spark):
        run_demo(spark, config, workdir=args.workdir, num_classes=args.classes)
    return 0


class _NoInterruptTracebacks(logging.Filter):
    """Drops log records that carry a KeyboardInterrupt: Py4J logs one with its traceback
    (``KeyboardInterrupt while sending command``) when Ctrl-C breaks a call to the JVM."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[0] is not None
                    and issubclass(record.exc_info[0], KeyboardInterrupt))


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (a BrokenPipeError came from our output).

    On Linux, poll() reports POLLERR for such a pipe; where poll is missing
    (Windows) this answers True, the usual assumption.
    """
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):
        return True
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _fd, events in poller.poll(0))


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line, its log lines on the console (:func:`spark_imagenet.logs.console`); return the
    exit status.

    Raises:
        SparkImagenetError: passed through to :func:`main`, which prints it.
    """
    with console():
        return _run_command(argv)


def _run_command(argv: Sequence[str] | None) -> int:
    """:func:`run` without the console."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["predict"] and _spark_predict(argv[1:]):
        from spark_imagenet.training.driver.predict_job import main as predict_job

        return predict_job(argv[1:])  # predict MODEL --source/--table ... --out: a Spark job run from here
    if argv[:1] in (["evaluate"], ["predict"], ["export"]):  # their options, --help too, are the child's
        if argv[0] == "predict":
            _check_predict_images(argv[1:])
        return _in_tensorflow_child(f"spark_imagenet.training.worker.{argv[0]}", argv[1:])
    args = build_parser().parse_args(argv)
    from spark_imagenet.storage import report_retries

    report_retries()  # a bucket that keeps failing says so while the client retries
    if args.command == "shard" and (args.table is not None or args.master is not None):
        return _shard_table(args)
    if args.command == "shard":
        from spark_imagenet.dataset.shard_options import run_shard

        run_shard(args)
        return 0
    if args.command == "upload":
        from spark_imagenet.dataset.transfer import upload

        upload(args.source, args.dest, transfers=args.transfers, overwrite=args.overwrite)
        return 0
    if args.command == "fetch":
        from spark_imagenet.storage import open_storage
        from spark_imagenet.training.task.staging import fetch_rank

        train, val = fetch_rank(open_storage(args.url), args.rank, args.workers, args.cache, transfers=args.transfers)
        for path in [*train, *val]:
            print(path)
        moved = train.bytes_downloaded + val.bytes_downloaded
        seconds = train.seconds + val.seconds
        logger.info(f"rank {args.rank} of {args.workers}: {len(train)} train + {len(val)} val shard(s) in "
                    f"{os.path.dirname(train[0]) if train else args.cache}; downloaded "
                    f"{train.downloaded + val.downloaded} ({moved / 1e6:.1f} MB"
                    + (f", {moved / 1e6 / seconds:.1f} MB/s" if moved and seconds > 0 else "")
                    + f"), {train.reused + val.reused} already cached")
        return 0
    if args.command == "inspect":
        from spark_imagenet.dataset.report import format_summary, inspect

        manifest = inspect(args.url)
        print(manifest.dumps() if args.json else format_summary(manifest, args.url), end="\n" if not args.json else "")
        return 0
    if args.command == "train":
        return _train(args)
    if args.command == "download":
        from spark_imagenet.source.kaggle import download

        path = download(args.competition, args.dest, file_name=args.file_name, progress=not args.no_progress)
        print(path)
        return 0
    if args.command == "demo":
        return _demo(args)
    if args.command == "mlflow-log":
        from spark_imagenet.training.driver.tracking import send_pending

        print(send_pending(args.record))
        return 0
    if args.command == "doctor":
        from spark_imagenet.doctor import run_doctor

        return run_doctor(master=args.master, conf=args.conf, workers=args.workers, url=args.url,
                          allow_unencrypted=args.allow_unencrypted, gpus_per_worker=args.gpus_per_worker)
    raise ConfigError(f"unknown command {args.command!r}")  # argparse prevents this


def _add_tensorflow_commands(sub) -> None:
    """``evaluate``, ``predict`` and ``export`` in the command list; :func:`run` hands their arguments to a child
    Python."""
    sub.add_parser("evaluate", add_help=False,
                   help="top-1/top-5 of a saved model (model.keras or an --output folder) on a dataset's "
                        "validation shards, on this machine: evaluate MODEL_URL DATA_URL [--json] [--cache DIR]")
    sub.add_parser("predict", add_help=False,
                   help="the top-5 classes of images (JPEG files or folders) with names and probabilities: "
                        "predict MODEL_URL IMAGE... [--json] [--labels URL] [--top K]; or as a Spark job over a "
                        "folder, a labels file or a table, into Parquet: predict MODEL_URL --source URL|--table NAME "
                        "--out URL [--master M] [--top K] (predict MODEL_URL --source X --out Y --help)")
    sub.add_parser("export", add_help=False,
                   help="write serving/ (a TensorFlow SavedModel taking JPEG/PNG bytes) and preprocessing.json for "
                        "a model.keras and its labels.json: export MODEL_URL [--labels URL] [--out URL]")


def _spark_predict(arguments: list[str]) -> bool:
    """Whether ``predict``'s arguments ask for the Spark job (``--source`` or ``--table`` among them)."""
    from spark_imagenet.training.driver.predict_job import is_spark_form

    return is_spark_form(arguments)


class _ArgumentsUnclear(Exception):
    """Raised by :class:`_LenientParser` instead of printing an error (the child then says it)."""


class _LenientParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _ArgumentsUnclear(message)


def _check_predict_images(arguments: list[str]) -> None:
    """``predict``'s image files, checked here (they exist, can be read, have an image header within the pixel
    limit) before the child that imports TensorFlow starts: an error when none is usable (the child names each
    unusable one when others are). Arguments this cannot read (and ``--help``) are left to the child.

    Raises:
        ConfigError: see :func:`spark_imagenet.dataset.images.image_files`.
    """
    if "-h" in arguments or "--help" in arguments:
        return
    parser = _LenientParser(add_help=False)  # predict's own options (spark_imagenet.training.worker.predict)
    parser.add_argument("model")
    parser.add_argument("images", nargs="+")
    parser.add_argument("--labels")
    parser.add_argument("--top")
    parser.add_argument("--json", action="store_true")
    from spark_imagenet.dataset.images import image_files
    from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, OPTION

    parser.add_argument(OPTION, type=int, default=DEFAULT_MAX_PIXELS)
    try:
        parsed = parser.parse_args(arguments)
    except _ArgumentsUnclear:
        return
    if parsed.max_image_pixels >= 1:  # else the child's own parser says what is wrong with it
        image_files(parsed.images, parsed.max_image_pixels)


def _in_tensorflow_child(module: str, arguments: list[str]) -> int:
    """Run ``python -m module arguments...`` (a command that needs TensorFlow, which this process never imports)
    with this terminal's input and output; return its exit status. On a machine without a GPU, TensorFlow's
    CUDA start-up lines on stderr (``failed call to cuInit ...``, which read like a failure) become one line."""
    import subprocess

    from spark_imagenet.training.task.barrier_task import CpuStartupFilter
    from spark_imagenet.training.job.gpus import host_has_gpus
    from spark_imagenet.training.job.tf_process import tensorflow_environment

    env = tensorflow_environment(os.environ)
    command = [sys.executable, "-m", module, *arguments]
    try:
        if host_has_gpus():
            return subprocess.call(command, env=env)
        shown = CpuStartupFilter("TensorFlow found no CUDA driver or GPU here: running on the CPU")
        with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, errors="replace") as child:
            assert child.stderr is not None
            for line in child.stderr:
                echo = shown(line.rstrip("\n"))
                if echo is not None:
                    print(echo, file=sys.stderr, flush=True)
            return child.wait()
    except KeyboardInterrupt:
        return 130


def _spark_log() -> str | None:
    """The file of Spark's log where this process's Spark session wrote one (its warnings and the stack traces of
    failed tasks), else None."""
    from spark_imagenet.training.driver.spark_session import spark_log_written

    path = spark_log_written()
    return None if path is None else str(path)


def _name_spark_log() -> None:
    """After an error: name the file of Spark's log where this process's Spark session wrote one."""
    path = _spark_log()
    if path is not None:
        print(f"spark-imagenet: Spark's log of this run (its warnings and the stack traces of failed tasks): {path}",
              file=sys.stderr)


def _debug_traceback() -> None:
    """With ``SPARK_IMAGENET_DEBUG`` set (non-empty, not 0), print the traceback of the error being handled."""
    if os.environ.get("SPARK_IMAGENET_DEBUG", "") not in ("", "0"):
        import traceback

        traceback.print_exc()


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: run and turn errors into messages.

    Returns:
        int: 0 on success, 2 for a :class:`SparkImagenetError` (printed as
        ``spark-imagenet: error: ...``, after its traceback when the
        environment sets ``SPARK_IMAGENET_DEBUG=1``), 1 for a failure inside Spark itself
        (Py4J/PySpark error, printed as one message), 130 on Ctrl-C (one
        line ``spark-imagenet: interrupted``, which names Spark's log where this process's Spark wrote one, as
        an error's message does; Spark and Py4J print nothing), 141
        (128 + SIGPIPE, like a program the signal ended) without a message
        when the reader of stdout went away (``spark-imagenet inspect URL | head -1``).
    """
    root = logging.getLogger()  # Py4J logs on the root logger
    if not any(isinstance(f, _NoInterruptTracebacks) for f in root.filters):
        root.addFilter(_NoInterruptTracebacks())
    try:
        code = run(argv)
        sys.stdout.flush()  # a reader that went away (`| head -1`) shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # e.g. a network connection, not our output
        # The conventional handling (Python docs, "Note on SIGPIPE"): stop quietly, and point stdout at
        # devnull so the interpreter's final flush of what is still buffered does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except SparkImagenetError as e:
        _debug_traceback()
        print(f"spark-imagenet: error: {e}", file=sys.stderr)
        _name_spark_log()
        return 2
    except KeyboardInterrupt:
        ignore_sigint()  # a second Ctrl-C while exiting prints nothing more
        log = _spark_log()  # named as after an error: the cancelled tasks' traces went there
        print("spark-imagenet: interrupted" + (f" (Spark's log of this run: {log})" if log else ""), file=sys.stderr)
        return 130
    except Exception as e:
        if not type(e).__module__.startswith(("py4j", "pyspark")):
            raise
        _debug_traceback()
        # Spark itself failed (e.g. its context was stopped because the master is
        # unreachable): one message instead of a Py4J stack.
        print(
            f"spark-imagenet: error: Spark failed: {spark_reason(e)[:400]}\n"
            "Check --master and that the cluster has free executors (the Spark log above says more).",
            file=sys.stderr,
        )
        _name_spark_log()
        return 1


if __name__ == "__main__":
    sys.exit(main())
