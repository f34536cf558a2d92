"""Batch inference: images/s per core of ``predict_dataframe`` (a Spark job on ``local[N]``) against the
one-process ``predict`` path, on the same images and the same model.

Usage (from the repository root)::

    .venv/bin/python benchmarks/predict.py [--quick] [--reps 5] [--json [FILE]] [--images 300] [--master 'local[2]']
        [--model alexnet] [--image-size 224] [--width 1.0] [--classes 100] [--batch-size 64]

What it does:

1. Writes an ``--output``-like folder once (untimed): ``model.keras`` of an untrained ``--model`` (weights do
   not change the cost of a forward pass), ``labels.json`` and the ``serving/`` SavedModel
   (:func:`spark_imagenet.training.worker.export.write_serving`).
2. Takes ``--images`` real ILSVRC JPEGs from ``../shared/data/ilsvrc-mini`` (its val images first, then its
   train images; generated 500x375 noise JPEGs where it is absent, said in the params).
3. **Spark job**: a ``--master`` session (started untimed), the images as a DataFrame of bytes in N
   partitions, cached in the JVM (untimed); each repetition runs ``predict_dataframe(df, run, top_k=5)`` and
   writes its rows to Spark's ``noop`` sink (the whole job: bytes to the Python workers, decode, crop, the
   model, top-5, back to the JVM). A first run, untimed, loads the model in each Python worker (each
   repetition after it finds the model loaded, as the batches of a long job do).
4. **One process** (this one): the ``predict`` command's path,
   :func:`spark_imagenet.training.worker.predict.predict` on the same bytes (one decode and crop per image
   in Python, the model on all of them at once), TensorFlow using every core. A first call is untimed too.

The two alternate (A, B, B, A, ...). Recorded: images/s of each, images/s per core (the cores each may use:
N for ``local[N]``, this machine's usable CPUs for the one process), and the per-repetition ratio
Spark / one process of images/s per core. A run on 2 cores shares them with everything else on the machine;
the ratio is what a claim rests on (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from common import REPO, Report, add_options, repetitions, shared_data, timed

sys.path.insert(0, str(REPO))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p)
    p.add_argument("--images", type=int, default=None, help="images scored per repetition (default 300; --quick 16)")
    p.add_argument("--master", default="local[2]", help="the Spark job's master (default local[2])")
    p.add_argument("--model", default="alexnet", help="the model (default alexnet)")
    p.add_argument("--image-size", type=int, default=None, help="input side in pixels (default 224; --quick 72)")
    p.add_argument("--width", type=float, default=None, help="model width multiplier (default 1.0; --quick 0.25)")
    p.add_argument("--classes", type=int, default=100, help="classes (default 100)")
    p.add_argument("--batch-size", type=int, default=64, help="predict_dataframe's batch size (default 64)")
    args = p.parse_args(argv)
    defaults = {"images": (16, 300), "image_size": (72, 224), "width": (0.25, 1.0)}
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    for name in ("images", "image_size", "classes", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: give 1 or more")
    if args.width <= 0:
        p.error(f"--width {args.width}: give a positive multiplier")
    return args


def write_run(folder: Path, args: argparse.Namespace) -> None:
    """model.keras, labels.json and serving/ of an untrained ``--model`` in ``folder``."""
    import spark_imagenet.training.worker  # noqa: F401  (TensorFlow's set-up)
    from spark_imagenet.training.worker.export import write_serving
    from spark_imagenet.training.worker.models.registry import build_model

    model = build_model(args.model, args.classes, args.image_size, args.width)
    model.save(str(folder / "model.keras"))
    labels = [{"id": i, "wnid": f"n{i:08d}", "names": [f"class {i}"]} for i in range(args.classes)]
    (folder / "labels.json").write_text(json.dumps(labels))
    write_serving(model, labels, args.image_size, str(folder))


def images(count: int) -> tuple[list[tuple[str, bytes]], str]:
    """``count`` (name, JPEG bytes): real ILSVRC images when ../shared/data has them, else generated."""
    mini = shared_data("ilsvrc-mini")
    if mini is not None:
        data = mini / "ILSVRC" / "Data" / "CLS-LOC"
        files = sorted((data / "val").glob("*.JPEG")) + sorted((data / "train").rglob("*.JPEG"))
        if len(files) >= count:
            return [(f.name, f.read_bytes()) for f in files[:count]], "ilsvrc-mini"
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        out.append((f"noise-{i}.jpg", buf.getvalue()))
    return out, "generated 500x375 noise JPEGs"


def master_cores(master: str) -> int:
    """The cores of a ``local[N]`` master (``local[*]``: this machine's), else this machine's."""
    inner = master[6:-1] if master.startswith("local[") else ""
    return int(inner) if inner.isdigit() else len(os.sched_getaffinity(0))


def main(argv=None) -> int:
    args = parse_args(argv)
    report = Report("predict", args)
    reps = repetitions(args)
    folder = Path(tempfile.mkdtemp(prefix="spark-imagenet-bench-predict-"))
    try:
        write_run(folder, args)
        rows, kind = images(args.images)
        spark_rate, local_rate = measure(report, args, folder, rows, reps)
        record(report, args, spark_rate, local_rate, kind, sum(len(b) for _, b in rows))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.close()
    return 0


def measure(report: Report, args: argparse.Namespace, folder: Path, rows: list[tuple[str, bytes]],
            reps: int) -> tuple[list[float], list[float]]:
    """Interleaved repetitions of the Spark job and the one-process path; returns their images/s."""
    from spark_imagenet.training.driver.batch_predict import predict_dataframe
    from spark_imagenet.training.driver.spark_session import local_session
    from spark_imagenet.training.worker import evaluate, predict

    spark = local_session(args.master, app_name="benchmark predict", conf={"spark.ui.enabled": "false"})
    try:
        cores = master_cores(args.master)
        df = spark.createDataFrame(rows, "name string, content binary").repartition(cores).cache()
        df.count()
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "256")
        scored = predict_dataframe(df, str(folder), top_k=5, batch_size=args.batch_size)

        def spark_run() -> None:
            scored.write.format("noop").mode("overwrite").save()

        model = evaluate.load_model(str(folder))
        labels = json.loads((folder / "labels.json").read_text())
        files = [Path(name) for name, _ in rows]
        jpegs = [data for _, data in rows]

        def local_run() -> None:
            predict.predict(model, files, labels, 5, jpegs)

        report.say(f"predict: warming up (model loads) on {len(rows)} images ...")
        spark_run()
        local_run()
        times: dict[str, list[float]] = {"spark": [], "local": []}
        for rep in range(reps):
            for name in (("spark", "local") if rep % 2 == 0 else ("local", "spark")):
                seconds, _ = timed(spark_run if name == "spark" else local_run)
                times[name].append(seconds)
        return [len(rows) / s for s in times["spark"]], [len(rows) / s for s in times["local"]]
    finally:
        spark.stop()


def record(report: Report, args: argparse.Namespace, spark_rate: list[float], local_rate: list[float],
           kind: str, total_bytes: int) -> None:
    """Record images/s, images/s per core and the per-core ratio."""
    spark_cores, local_cores = master_cores(args.master), len(os.sched_getaffinity(0))
    params = {"images": args.images, "image_source": kind, "bytes": total_bytes, "model": args.model,
              "image_size": args.image_size, "width": args.width, "classes": args.classes}
    report.add(f"predict_dataframe on {args.master}: images/s", "images/s", spark_rate,
               batch_size=args.batch_size, cores=spark_cores, **params)
    report.add("one-process predict path: images/s", "images/s", local_rate, cores=local_cores, **params)
    spark_per_core = [r / spark_cores for r in spark_rate]
    local_per_core = [r / local_cores for r in local_rate]
    report.add(f"predict_dataframe on {args.master}: images/s per core", "images/CPU-s", spark_per_core,
               cores=spark_cores, **params)
    report.add("one-process predict path: images/s per core", "images/CPU-s", local_per_core,
               cores=local_cores, **params)
    report.ratio(f"predict_dataframe on {args.master} / one-process predict, images/s per core", spark_per_core,
                 local_per_core, **params)


if __name__ == "__main__":
    sys.exit(main())
