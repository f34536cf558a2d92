"""The ``spark-imagenet`` command line: a thin layer over the package's functions.

Each sub-command parses its options and calls one importable function, so a
notebook with an existing SparkSession (Databricks) runs the same job:

============  ==========================================================
command       function
============  ==========================================================
``demo``      :func:`spark_imagenet.demo.run_demo`
``shard``     :func:`spark_imagenet.dataset.sharding.shard`
``inspect``   :func:`spark_imagenet.dataset.report.inspect`
``upload``    :func:`spark_imagenet.dataset.transfer.upload`
``fetch``     :func:`spark_imagenet.training.staging.fetch_rank`
``train``     :func:`spark_imagenet.training.driver.plan_job`, then ``run_job``
``download``  :func:`spark_imagenet.source.kaggle.download`
``extract``   :func:`spark_imagenet.source.extract.extract`
``doctor``    :func:`spark_imagenet.doctor.run_doctor`
``evaluate``  ``python -m spark_imagenet.training.evaluate`` in a child Python (TensorFlow)
``predict``   ``python -m spark_imagenet.training.predict`` in a child Python (TensorFlow)
============  ==========================================================

``train`` and ``demo`` take every :class:`~spark_imagenet.training.config.TrainConfig`
field as an option (generated from its fields), a TOML job file (``--config``) and
``--print-config``.

Errors the user can fix (:class:`~spark_imagenet.errors.SparkImagenetError`)
are printed as one message without a traceback, exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import select
import signal
import sys
import threading
from typing import Iterator, Sequence

from spark_imagenet import __version__
from spark_imagenet.demo import DEMO_TRAIN_DEFAULTS
from spark_imagenet.errors import ConfigError, SparkImagenetError, spark_reason


def _int_at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        return value

    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number greater than 0")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number, 0 or more")
    return value


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. spark.executor.memory=4g")
    return key.strip(), value.strip()


def _option_type(rule):
    """The argparse type of a :class:`TrainConfig` field's rule."""
    if rule.kind == "int":
        return _nonnegative_int if rule.minimum == 0 else _positive_int
    if rule.kind == "float":
        return _nonnegative_float if rule.minimum == 0 else _positive_float
    if rule.kind == "conf":
        return _conf_pair
    if rule.kind == "range":
        return _positive_float
    return str


def _recipe_help(key: str) -> str:
    """" (default: the model's recipe; alexnet ..., resnet50 ...)" for a setting of :data:`RECIPE_KEYS`."""
    from spark_imagenet.training.models.specs import MIN_IMAGE_SIZE, recipe_for

    parts = []
    for model in sorted(MIN_IMAGE_SIZE):
        value = getattr(recipe_for(model), key)
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{model} {text}")
    scaled = " epochs of 90, scaled to --epochs" if key == "warmup_epochs" else ""
    return " (default: the model's recipe; " + ", ".join(parts) + scaled + ")"


def _option_shape(rule) -> dict:
    """argparse's ``nargs``/``metavar`` for a field kind taking several values."""
    if rule.kind == "range":
        return {"nargs": 2, "metavar": ("MIN", "MAX")}
    if rule.kind == "epochs":
        return {"metavar": "E1,E2,..."}
    return {}


def _add_train_options(p: argparse.ArgumentParser, defaults: dict) -> None:
    """One option per :class:`TrainConfig` field, plus ``--config`` and ``--print-config``.

    Every option defaults to None (= not given), so a job file's value is only
    overridden by an option the user typed; ``defaults`` are shown in the help.
    """
    import dataclasses

    from spark_imagenet.training.config import RECIPE_KEYS, TrainConfig
    from spark_imagenet.training.models.specs import MIN_IMAGE_SIZE

    g = p.add_argument_group("training (each option is also a key of the job file)")
    g.add_argument("--config", metavar="JOB.toml", help="read the job's settings from this TOML file; options given "
                   "on the command line override it (conf/job.example.toml lists every key)")
    g.add_argument("--print-config", action="store_true",
                   help="print the fully resolved job as TOML and exit (without starting Spark)"
                   + ("; the demo's own --workdir and --classes are not part of it" if "workers" in defaults else ""))
    for f in dataclasses.fields(TrainConfig):
        rule = f.metadata["rule"]
        default = defaults.get(f.name, f.default)
        text = rule.help
        if f.name == "model":
            text += ": " + ", ".join(f"{m} (>= {px} px)" for m, px in sorted(MIN_IMAGE_SIZE.items())) \
                + ", or package.module:function, your own builder (num_classes, image_size, width) -> tf_keras.Model"
        if f.name == "conf":
            g.add_argument(rule.option, type=_conf_pair, action="append", default=None, metavar="KEY=VALUE",
                           help=text + ", repeatable")
            continue
        if rule.kind == "bool":  # an option that turns a default-on setting off is named --no-...
            g.add_argument(rule.option, action="store_const", const=not f.default, default=None, dest=f.name,
                           help=text + (" (default: off)" if not default and not f.default else ""))
            continue
        if f.name in RECIPE_KEYS and default is None:
            text += _recipe_help(f.name)
        elif default is not None and default != ():
            text += f" (default: {' '.join(map(str, default)) if isinstance(default, tuple) else default})"
        elif not rule.optional and default != ():
            text += " (required, here or in the job file)"
        g.add_argument(rule.option, type=_option_type(rule), default=None, dest=f.name, help=text,
                       choices=rule.choices or None, **_option_shape(rule))


def _resolve_job(args: argparse.Namespace, defaults: dict):
    """The :class:`TrainConfig` of the defaults, the job file and the options given, and the URL.

    Returns:
        ``(config, url)``; url is None when neither the command line nor the file gives one.

    Raises:
        ConfigError: a bad job file or value (naming the key, the option or the file).
    """
    from spark_imagenet.training.config import TrainConfig, absolute_paths, load_job_file, resolve_job

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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``spark-imagenet`` (all sub-commands)."""
    parser = argparse.ArgumentParser(
        prog="spark-imagenet",
        description="ImageNet in the Kaggle layout -> verified TFRecord shards -> AlexNet trained by "
        "Spark barrier tasks under MultiWorkerMirroredStrategy.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("demo", help="generate a small dataset, shard it and train on local[4] (the built-in default)")
    p.add_argument("--workdir", help="folder for the generated dataset and shards (default: a temporary one, removed after)")
    p.add_argument("--classes", type=_positive_int, default=10, help="synthetic classes (default 10)")
    _add_train_options(p, DEMO_TRAIN_DEFAULTS)

    p = sub.add_parser("shard", help="write TFRecord shards and manifest.json from a Kaggle-layout folder or the "
                       "downloaded zip")
    p.add_argument("source", help="the unpacked Kaggle imagenet-object-localization-challenge folder, or its .zip "
                   "(either form, read without unpacking)")
    p.add_argument("--out", required=True, help="bucket URL: local path, file:// URL or gs://bucket/prefix")
    p.add_argument("--train-shards", type=_positive_int, help="number of train shards (default: ~128 MiB each, >= 16)")
    p.add_argument("--val-shards", type=_positive_int, help="number of val shards (default: ~128 MiB each, >= 4)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--classes", type=_positive_int, help="keep the first K classes of LOC_synset_mapping.txt")
    sel.add_argument("--class-list", help="file of wnids to keep")
    p.add_argument("--per-class", type=_positive_int, help="at most M train images per class")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-class sample and the train shuffle (default 0)")
    p.add_argument("--processes", type=_positive_int, help="worker processes (default: all cores)")
    p.add_argument("--verify", choices=("decode", "header"), default="decode",
                   help="decode: check every JPEG decodes (default); header: header and end marker only (faster, "
                   "but a JPEG damaged inside that still ends with its marker gets through, and TensorFlow "
                   "decodes it with grey areas without an error)")
    p.add_argument("--on-corrupt", choices=("error", "skip"), default="error",
                   help="empty, truncated or undecodable images: error lists them all and writes nothing (default); "
                        "skip leaves them out and records each in quality-report.json. CMYK/YCCK JPEGs, other "
                        "formats and EXIF-rotated images are repaired either way")
    p.add_argument("--overwrite", action="store_true", help="replace a different dataset already at --out")
    p.add_argument("--transfers", type=_positive_int, default=8, help="parallel uploads to a gs:// --out (default 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("upload", help="publish shards built on local disk to a bucket (verified, resumable)")
    p.add_argument("source", help="local folder holding manifest.json and the shards (the --out of shard)")
    p.add_argument("dest", help="bucket URL, e.g. gs://bucket/imagenet")
    p.add_argument("--transfers", type=_positive_int, default=8, help="parallel uploads (default 8)")
    p.add_argument("--overwrite", action="store_true", help="replace a different dataset already at DEST")

    p = sub.add_parser("fetch", help="download and verify the shards of one barrier task into a local cache "
                       "(what each task does before training)")
    p.add_argument("url", help="bucket URL of a sharded dataset")
    p.add_argument("--rank", type=int, required=True, help="task rank, 0 .. WORKERS-1")
    p.add_argument("--workers", type=_positive_int, required=True, help="number of barrier tasks")
    p.add_argument("--cache", help="cache folder (default: under SPARK_LOCAL_DIRS, else the temp folder)")
    p.add_argument("--transfers", type=_positive_int, default=8, help="parallel downloads (default 8)")

    p = sub.add_parser("inspect", help="print the summary of a sharded dataset's manifest")
    p.add_argument("url", help="bucket URL")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")

    p = sub.add_parser("train", help="train a model on a sharded dataset with Spark barrier tasks")
    p.add_argument("url", nargs="?", help="bucket URL of a sharded dataset (or the job file's url)")
    _add_train_options(p, {})
    # For the submit/ scripts: check the job for spark-submit with this master, print its worker count, exit.
    p.add_argument("--check-for-master", metavar="MASTER", default=None, help=argparse.SUPPRESS)

    p = sub.add_parser("download", help="download the ImageNet archive from Kaggle with the official kaggle client "
                       "(resumable; needs Kaggle credentials and the competition's rules accepted)")
    p.add_argument("--competition", default="imagenet-object-localization-challenge",
                   help="Kaggle competition name (default imagenet-object-localization-challenge, a ~155 GiB zip)")
    p.add_argument("--dest", required=True, help="folder for the archive (created if absent)")
    p.add_argument("--file", dest="file_name", help="download this one file of the competition instead of the archive")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("extract", help="unpack the downloaded Kaggle zip (either form, the nested tar.gz too) into a "
                       "folder, refusing unsafe member names and checking free space first")
    p.add_argument("zip", help="the downloaded imagenet-object-localization-challenge.zip")
    p.add_argument("dest", help="folder to unpack into (created if absent)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files in DIR that differ from the archive although extract did not write them")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    _add_tensorflow_commands(sub)
    p = sub.add_parser("doctor", help="print the versions, GPUs, bucket credentials and Spark preflight checks "
                       "found here and on a master; exit 1 when a check fails")
    p.add_argument("url", nargs="?", help="a dataset URL whose manifest to read (optional)")
    p.add_argument("--master", help="the Spark master to check: spark://, yarn, k8s://, local[N], or a Spark Connect "
                   "sc://HOST:PORT (default: the session train would get)")
    p.add_argument("--conf", type=_conf_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting, repeatable (as for train)")
    p.add_argument("--workers", type=_positive_int,
                   help="check for this many barrier tasks (default: as many as the master has slots)")
    p.add_argument("--allow-unencrypted", action="store_true",
                   help="check as train --allow-unencrypted would (Spark's encryption or SSL on is then a warning)")
    p.add_argument("--gpus-per-worker", type=_nonnegative_int, default=0, metavar="K",
                   help="check the GPU settings as train --gpus-per-worker K would (default 0)")
    return parser


def _session(config, command: str, *, warn_oversubscription: bool = True):
    """The SparkSession for a job's ``master`` and ``conf``, or one clear error."""
    from spark_imagenet.training.spark_session import session_for

    try:
        return session_for(config.master, config.workers, conf=config.spark_conf, app_name=f"spark-imagenet {command}",
                           warn_oversubscription=warn_oversubscription)
    except SparkImagenetError:
        raise
    except Exception as e:  # Py4J / JVM start-up failures
        reason = spark_reason(e)
        keys = ", ".join(k for k, _ in config.conf)
        if config.master:
            master = f"--master {config.master}"
        elif "PYSPARK_GATEWAY_PORT" in os.environ:
            master = "spark-submit's master"
        else:
            master = f"the default master local[{config.workers}]"
        raise ConfigError(
            f"Spark could not start with {master}"
            f"{' and --conf ' + keys if keys else ''}: {reason[:300]}. "
            "Check the master URL (spark://HOST:PORT, yarn, k8s://..., local[N]) and that the cluster is reachable."
        ) from None


def _check_for_master(config, url: str | None, master: str) -> int:
    """What the submit/ scripts ask before spark-submit starts: print the job's worker count.

    Raises:
        ConfigError: no URL; a job ``master`` (spark-submit's ``--master``
            decides); a dataset on this machine's disk with a cluster master
            and no ``--shared-filesystem``.
    """
    from spark_imagenet.training.preflight import check_dataset_reachable

    if url is None:
        raise ConfigError("no dataset URL: give it as the first argument (or as url in the job file)")
    if config.master is not None:
        raise ConfigError(f"--master {config.master} (or master in the job file): the script submits to {master} "
                          "(set its MASTER, or use the script of another platform) and leaves the job's master out")
    check_dataset_reachable(url, master, config.shared_filesystem)
    print(config.workers)
    return 0


def _train(args: argparse.Namespace) -> int:
    """``spark-imagenet train``: resolve the job, plan it without Spark, then run it."""
    from spark_imagenet.training.config import dump_job
    from spark_imagenet.training.driver import plan_job, run_job

    config, url = _resolve_job(args, {})
    if args.print_config:
        print(dump_job(config, url), end="")
        return 0
    if args.check_for_master is not None:
        return _check_for_master(config, url, args.check_for_master)
    if url is None:
        raise ConfigError("no dataset URL: give it as the first argument of train (or as url in the job file)")
    job = plan_job(url, config)  # a dataset or setting mistake is reported before Spark starts
    if config.master is not None and not config.master.strip().startswith("sc://"):
        from spark_imagenet.training.preflight import check_dataset_reachable, check_output_reachable

        check_dataset_reachable(job.url, config.master, config.shared_filesystem)  # also before Spark starts
        check_output_reachable(job.config.output, config.master, config.shared_filesystem)
        check_output_reachable(job.config.checkpoint_dir, config.master, config.shared_filesystem,
                               "--checkpoint-dir")
    spark = _session_interruptibly(config, "train")
    with _stopped_at_end(spark):
        run_job(spark, job)
    return 0


def _demo(args: argparse.Namespace) -> int:
    """``spark-imagenet demo``: the demo's defaults under the job file and options."""
    from spark_imagenet.demo import run_demo
    from spark_imagenet.training.config import dump_job

    config, url = _resolve_job(args, DEMO_TRAIN_DEFAULTS)
    if url is not None:
        raise ConfigError(f"the demo makes its own dataset: remove url from the job file {args.config} (or run "
                          "`spark-imagenet train` on that dataset)")
    if args.print_config:
        print(dump_job(config), end="")
        return 0
    # the demo's own local[4] on a small machine is by design: warn only about --workers the user gave
    spark = _session_interruptibly(config, "demo", warn_oversubscription=args.workers is not None)
    with _stopped_at_end(spark):
        run_demo(spark, config, workdir=args.workdir, num_classes=args.classes)
    return 0


#: Seconds a Ctrl-C during Spark's start-up waits for the start-up to end (then Spark is stopped).
SESSION_START_WAIT_S = 120


def _session_interruptibly(config, command: str, **options):
    """:func:`_session`, started in a helper thread while this one waits.

    A Ctrl-C during Spark's start-up then raises KeyboardInterrupt here, not
    inside a Py4J call (which logs a traceback), and PySpark, started outside
    the main thread, does not install its SIGINT handler (see
    :func:`_stopped_at_end`). The JVM of an interrupted start-up exits with
    this process.

    Raises:
        ConfigError: see :func:`_session`.
        KeyboardInterrupt: Ctrl-C during the start-up; the start-up is let
            finish (at most ``SESSION_START_WAIT_S``) and the session stopped.
    """
    box: dict = {}
    done = threading.Event()  # not Thread.join: an interrupted join marks a live thread ended (Python 3.11)

    def start() -> None:
        try:
            box["spark"] = _session(config, command, **options)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=start, name="spark-imagenet session start", daemon=True).start()
    try:
        while not done.wait(0.2):
            pass
    except KeyboardInterrupt:
        _ignore_sigint()
        done.wait(SESSION_START_WAIT_S)  # a JVM left starting would print its banner after we exit
        if "spark" in box:
            _stop_quietly(box["spark"])
        raise
    if "error" in box:
        raise box["error"]
    return box["spark"]


@contextlib.contextmanager
def _stopped_at_end(spark) -> Iterator[None]:
    """Run the block with Ctrl-C raising KeyboardInterrupt, then stop ``spark``.

    PySpark's own SIGINT handler cancels every job from inside the signal
    handler, which breaks a Py4J call in progress and prints its tracebacks;
    Python's default handler is used instead (the driver cancels its job:
    :func:`spark_imagenet.training.driver.run_job`). After a Ctrl-C, Spark is
    stopped quietly (its log off, its errors swallowed) while a further
    Ctrl-C is ignored, and the KeyboardInterrupt is re-raised.
    """
    previous = signal.getsignal(signal.SIGINT)
    with contextlib.suppress(ValueError):  # not the main thread: signals stay as they are
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    except KeyboardInterrupt:
        _ignore_sigint()
        _stop_quietly(spark)
        raise
    except BaseException:
        spark.stop()
        raise
    spark.stop()
    with contextlib.suppress(ValueError, TypeError):  # TypeError: a handler not set from Python
        signal.signal(signal.SIGINT, previous)


def _stop_quietly(spark) -> None:
    """Stop ``spark`` with its log off, swallowing its errors (after a Ctrl-C)."""
    with contextlib.suppress(Exception):
        spark.sparkContext.setLogLevel("OFF")
    with contextlib.suppress(Exception):
        spark.stop()


def _ignore_sigint() -> None:
    """Ignore SIGINT from now on (shutting down after a Ctrl-C); a no-op outside the main thread."""
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


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
    """Run the command line; return the exit status.

    Raises:
        SparkImagenetError: passed through to :func:`main`, which prints it.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["evaluate"], ["predict"]):  # their options, --help too, are the child's (not argparse's here)
        return _in_tensorflow_child(f"spark_imagenet.training.{argv[0]}", argv[1:])
    args = build_parser().parse_args(argv)
    from spark_imagenet.storage import report_retries

    report_retries()  # a bucket that keeps failing says so while the client retries
    if args.command == "shard":
        from spark_imagenet.dataset.sharding import shard

        shard(
            args.source,
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
        )
        return 0
    if args.command == "upload":
        from spark_imagenet.dataset.transfer import upload

        upload(args.source, args.dest, transfers=args.transfers, overwrite=args.overwrite)
        return 0
    if args.command == "fetch":
        from spark_imagenet.training.staging import fetch_rank

        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)

        train, val = fetch_rank(args.url, args.rank, args.workers, args.cache, transfers=args.transfers, log=log)
        for path in [*train, *val]:
            print(path)
        moved = train.bytes_downloaded + val.bytes_downloaded
        seconds = train.seconds + val.seconds
        log(f"rank {args.rank} of {args.workers}: {len(train)} train + {len(val)} val shard(s) in "
            f"{os.path.dirname(train[0]) if train else args.cache}; downloaded {train.downloaded + val.downloaded} "
            f"({moved / 1e6:.1f} MB" + (f", {moved / 1e6 / seconds:.1f} MB/s" if moved and seconds > 0 else "")
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
    if args.command == "extract":
        from spark_imagenet.source.extract import extract

        print(extract(args.zip, args.dest, overwrite=args.overwrite, progress=not args.no_progress))
        return 0
    if args.command == "demo":
        return _demo(args)
    if args.command == "doctor":
        from spark_imagenet.doctor import run_doctor

        return run_doctor(master=args.master, conf=args.conf, workers=args.workers, url=args.url,
                          allow_unencrypted=args.allow_unencrypted, gpus_per_worker=args.gpus_per_worker)
    raise ConfigError(f"unknown command {args.command!r}")  # argparse prevents this


def _add_tensorflow_commands(sub) -> None:
    """``evaluate`` and ``predict`` in the command list; :func:`run` hands their arguments to a child Python."""
    sub.add_parser("evaluate", add_help=False,
                   help="top-1/top-5 of a saved model (model.keras or an --output folder) on a dataset's "
                        "validation shards, on this machine: evaluate MODEL_URL DATA_URL [--json] [--cache DIR]")
    sub.add_parser("predict", add_help=False,
                   help="the top-5 classes of images (JPEG files or folders) with names and probabilities: "
                        "predict MODEL_URL IMAGE... [--json] [--labels URL] [--top K]")


def _in_tensorflow_child(module: str, arguments: list[str]) -> int:
    """Run ``python -m module arguments...`` (a command that needs TensorFlow, which this process never imports)
    with this terminal's input and output; return its exit status. On a machine without a GPU, TensorFlow's
    CUDA start-up lines on stderr (``failed call to cuInit ...``, which read like a failure) become one line."""
    import subprocess

    from spark_imagenet.training.barrier_task import CpuStartupFilter
    from spark_imagenet.training.gpus import host_has_gpus

    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
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


def _name_spark_log() -> None:
    """After an error: name the file of Spark's log where this process's Spark session wrote one."""
    from spark_imagenet.training.spark_session import spark_log_written

    path = spark_log_written()
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
        line ``spark-imagenet: interrupted``; Spark and Py4J print nothing), 141
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
        _ignore_sigint()  # a second Ctrl-C while exiting prints nothing more
        print("spark-imagenet: interrupted", file=sys.stderr)
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
