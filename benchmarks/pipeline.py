"""Input pipeline throughput against the JPEG decode ceiling of the same cores.

Usage (from the repository root)::

    .venv/bin/python benchmarks/pipeline.py [--data DIR] [--seconds 3] [--reps 8]
        [--image-size 224] [--batch-size 64] [--parallel N] [--shards 8] [--max-side N | --forms] [--cpus 0,1]
        [--quick] [--json [FILE]]
    .venv/bin/python benchmarks/pipeline.py --scaling 1,2 [--repeats 2] [--reps 3] [--max-side N]

What it does:

1. Writes the JPEGs of ``--data`` (default ``../shared/data/imagenet-sample``,
   1000 real ILSVRC-2012 images, one per class) into ``--shards`` TFRecord
   shards in a temporary folder, with the record format of
   :mod:`spark_imagenet.dataset.sharding` (its TF-free writer :mod:`spark_imagenet.dataset.tfrecord`;
   the JPEG bytes stored as read, or re-encoded with the longer side at most
   ``--max-side`` pixels; label = index of the file name in sorted order).
2. **Ceiling** (the hardware limit of these cores for this work): the same
   per-image work as the training pipeline (random crop box from the JPEG
   header, ``decode_and_crop_jpeg``, bilinear resize to S, flip, uint8, drawn
   from stateless seeds as the pipeline draws them) on JPEG bytes already in
   memory, through tf.data with ``--parallel`` calls and autotune off, handed
   on in uint8 batches of B (as the pipeline hands on its batches: one
   ``next()`` per image cost the ceiling about 5% of its CPU, profiled); no
   file reading, parsing, shuffling or normalization. Two formulations run
   (``parallel`` and ``parallel + 1`` map calls); the one with the higher
   median images/s over the run is the ceiling (chosen once per run: taking
   the better window of each round would pick the noise's maximum).
3. **Pipeline**: :func:`spark_imagenet.training.worker.pipeline.train_dataset` on the shards
   (batch B), images/s after a warm-up: its uint8 ``[B,S,S,3]`` batches as training consumes them (the
   normalization to float32 is in the model's train step, on the step's device since issue 23; before, the
   pipeline normalized each batch on the host, +4.4 to 4.7% of the ceiling's CPU; the step's side of it:
   ``benchmarks/step.py``).

Ceiling and pipeline windows alternate for ``--reps`` rounds (default 8; each
round is one repetition) on persistent iterators: the machine may be shared, so
load from others drifts and hits both alike. Each window runs untimed first, at
least 1 s (``--quick``: 0.25 s) and until the other iterators have refilled
their buffers (see :class:`Meter`), so that no window is charged for another
iterator's work. Each window also prints how many
cores other processes used meanwhile (from ``/proc/stat``; the records carry
them in ``params.others_cores``).

Records (``--json``; see benchmarks/common.py): ``ceiling images/s``,
``pipeline images/s``, ``ceiling images/CPU-s`` and ``pipeline images/CPU-s``
(images per CPU-second of this process, which load from others moves less),
and the per-round ratios ``pipeline / ceiling (images/s)`` and ``pipeline /
ceiling (images/CPU-s)`` (goal: at least 0.95; below 1 by what the pipeline's
own stages, file reading, parsing and shuffling, cost on top of the decode). ``params.ceiling_by_calls`` holds both
formulations' series, ``params.ceiling_calls`` the one chosen.

``--cpus`` pins the process to those CPUs before TensorFlow starts (parallel
defaults to their number). ``--scaling 1,2`` runs the benchmark on CPUs 0..n-1
with ``parallel n`` for each n, alternating, ``--repeats`` times, in child
processes (``--reps`` rounds each, default 3), and records per CPU count the
pipeline's images/s per core, its images/CPU-s and its ratio to the ceiling,
the per-core rate of n CPUs over that of the first count (1.0: linear scaling),
and, derived, how many such cores one H200 would need: from ASSUMED H200
training rates (:data:`H200_ASSUMED_IMAGES_PER_S`, docs/projection.md section 2,
not measured here; benchmarks/gpu.py measures them on a GPU).

``--forms`` (issue 35): in the same run, also the JPEGs stored in the paper's 256 x 256 form and with a longer
side of at most 320 px, each in its own shards, and the decode ceiling with the scaled decode: one more
pipeline window per form and one more ceiling window per round; the records (stored bytes per image, pipeline
images/CPU-s, both as ratios to the originals, and the scaled decode's on/off ratio) are described in
``benchmarks/forms.py``.

``--quick`` (under a minute): 128 JPEGs of ``--data`` or, when the shared data
is absent and no ``--data`` is given, 64 synthetic JPEGs
(:mod:`spark_imagenet.demo.synthetic`, 500x375 px); batch 32, 1-second windows,
2 rounds. Its numbers only show that the script works.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import forms  # noqa: E402
from common import Report, add_options, machine_busy_seconds, repetitions, shared_data  # noqa: E402

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: The shared data folder used without ``--data``.
SAMPLE = "imagenet-sample"
#: Settings of a full run and of ``--quick`` (options not given take these).
FULL = {"seconds": 3.0, "warmup": 5.0, "window_warmup": 1.0, "batch_size": 64, "limit": None}
QUICK = {"seconds": 1.0, "warmup": 0.5, "window_warmup": 0.25, "batch_size": 32, "limit": 128}
#: --quick without the shared data: synthetic JPEGs (count, width, height; about ImageNet's mean size).
QUICK_SYNTHETIC = (64, 500, 375)
#: Batches the ceiling prefetches (as the pipeline's PREFETCH_BATCHES).
CEILING_PREFETCH = 2
#: Rounds of each child of --scaling when --reps is not given (x --repeats 2 = 6 repetitions per CPU count).
SCALING_CHILD_REPS = 3
#: ASSUMED training images/s of one NVIDIA H200 at 224 px, bf16 + XLA, and their ranges: docs/projection.md
#: section 2 (not measured here; benchmarks/gpu.py measures them on a GPU).
H200_ASSUMED_IMAGES_PER_S = {"AlexNet": (20_000, (10_000, 40_000)), "ResNet-50": (5_000, (4_000, 6_000))}


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring); the settings not given take FULL's or QUICK's."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=None,
                   help=f"folder of JPEG files (default: ../shared/data/{SAMPLE}; with --quick and no shared "
                        "data: synthetic JPEGs)")
    p.add_argument("--seconds", type=float, default=None, help="measured seconds per window (default: 3, quick 1)")
    p.add_argument("--warmup", type=float, default=None,
                   help="first warm-up seconds of each dataset (default: 5, quick 0.5)")
    p.add_argument("--rounds", dest="reps", type=int, default=None, help="an older name of --reps")
    p.add_argument("--image-size", type=int, default=224, help="S, output side in pixels (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=None, help="B (default: 64, quick 32)")
    p.add_argument("--parallel", type=int, default=None,
                   help="decode parallelism (default: the CPUs this process may run on)")
    p.add_argument("--shards", type=int, default=8, help="TFRecord shards to write (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N JPEGs (quick: 128)")
    p.add_argument("--max-side", type=int, default=None,
                   help="re-encode every JPEG with its longer side at most N pixels (Pillow, quality 90) before "
                        "sharding: the 'store shards smaller' lever")
    p.add_argument("--forms", action="store_true",
                   help="also measure the JPEGs stored in the forms of issue 35 (resize 256, max-side 320) and the "
                        "scaled decode, in the same rounds (benchmarks/forms.py)")
    p.add_argument("--cpus", default=None,
                   help="run on these CPUs only, e.g. 0 or 0,1 (sched_setaffinity before TensorFlow starts)")
    p.add_argument("--scaling", default=None, metavar="LIST",
                   help="instead: run the benchmark once per CPU count of LIST (e.g. 1,2; CPUs 0..n-1, "
                        "parallel n) in child processes, alternating, and record the scaling and the cores "
                        "one H200 would need (ASSUMED H200 rates)")
    p.add_argument("--repeats", type=int, default=2,
                   help="with --scaling: child runs per CPU count, alternating (default: %(default)s)")
    p.add_argument("--summary-json", type=Path, default=None, help=argparse.SUPPRESS)  # a --scaling child's rounds
    add_options(p, reps=8, quick_reps=2)
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    for option in ("seconds", "batch_size", "shards", "image_size", "repeats"):
        if getattr(args, option) <= 0:
            p.error(f"--{option.replace('_', '-')} must be positive, got {getattr(args, option)}")
    if args.forms and (args.max_side or args.scaling):
        p.error("--forms stores its own max-side 320 and resize 256 forms beside the originals: leave out "
                + ("--max-side" if args.max_side else "--scaling"))
    return args


def list_jpegs(folder: Path, limit: int | None) -> list[Path]:
    """Sorted ``*.jpeg``/``*.jpg`` files of ``folder`` (case-insensitive), at most ``limit``."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpeg", ".jpg") and p.is_file())
    return files[:limit] if limit else files


def jpeg_data(path: Path, max_side: int | None) -> bytes:
    """The JPEG bytes of ``path``, as stored, or in the ``max-side`` form (:func:`forms.stored_form`: the
    longer side at most ``max_side`` pixels, quality 90) when the image is larger."""
    data = path.read_bytes()
    return forms.stored_form(data, "max-side", max_side) if max_side else data


def synthetic_jpegs(count: int, width: int, height: int) -> list[tuple[str, bytes]]:
    """``count`` synthetic JPEGs (class textures of :mod:`spark_imagenet.demo.synthetic`, quality 90),
    as ``(file name, bytes)``; the same ones on every call."""
    from spark_imagenet.demo.synthetic import draw_image, synthetic_wnid

    classes = 10
    images = []
    for i in range(count):
        out = io.BytesIO()
        draw_image(i % classes, classes, random.Random(i), width, height).save(out, "JPEG", quality=90)
        images.append((f"{synthetic_wnid(i % classes)}_{i:04d}.JPEG", out.getvalue()))
    return images


def load_images(args) -> tuple[list[tuple[str, bytes]], str] | None:
    """The ``(file name, JPEG bytes)`` to use and where they come from, or None after printing why there
    are none (no data folder, or fewer JPEGs than one batch)."""
    folder = args.data if args.data is not None else shared_data(SAMPLE)
    if folder is None and args.quick:
        return synthetic_jpegs(*QUICK_SYNTHETIC), "synthetic (demo.synthetic, {1}x{2} px)".format(*QUICK_SYNTHETIC)
    if folder is None or not folder.is_dir():
        where = args.data if args.data is not None else f"../shared/data/{SAMPLE}"
        print(f"benchmarks/pipeline.py: data folder {where} not found. It should hold ImageNet JPEGs "
              f"(../shared/data/{SAMPLE} beside the repository); pass --data DIR"
              + ("." if args.data is not None else
                 " (or --quick, which draws synthetic JPEGs when the shared data is absent)."), file=sys.stderr)
        return None
    jpegs = list_jpegs(folder, args.limit)
    if len(jpegs) < args.batch_size:
        print(f"benchmarks/pipeline.py: {folder} holds {len(jpegs)} JPEGs, fewer than one batch of "
              f"--batch-size {args.batch_size}; pass --data with more JPEGs or a smaller --batch-size",
              file=sys.stderr)
        return None
    return [(p.name, jpeg_data(p, args.max_side)) for p in jpegs], str(folder)


def image_sizes(images: list[tuple[str, bytes]]) -> list[tuple[int, int]]:
    """``(width, height)`` of each JPEG (Pillow reads the header only)."""
    from PIL import Image

    sizes = []
    for _, data in images:
        with Image.open(io.BytesIO(data)) as im:
            sizes.append(im.size)
    return sizes


def write_shards(images: list[tuple[str, bytes]], sizes: list[tuple[int, int]], out: Path,
                 shards: int) -> list[str]:
    """Write ``(file name, JPEG bytes)`` pairs (their ``(width, height)`` in ``sizes``) round-robin into
    ``shards`` TFRecord files in ``out``.

    Returns:
        list[str]: the shard paths, named like the shard builder names them.
    """
    from spark_imagenet.dataset.tfrecord import encode_example, write_record

    paths = [out / f"train-{k:05d}-of-{shards:05d}.tfrecord" for k in range(shards)]
    handles = [open(p, "wb") for p in paths]
    try:
        for label, ((name, data), (width, height)) in enumerate(zip(images, sizes)):
            write_record(handles[label % shards], encode_example({
                "image/encoded": data, "image/format": b"JPEG", "image/class/label": label,
                "image/class/synset": name.split("_")[0], "image/height": height, "image/width": width,
                "image/filename": name}))
    finally:
        for h in handles:
            h.close()
    return [str(p) for p in paths]


class Meter:
    """A persistent iterator over a dataset, measured in windows.

    Iterators stay alive between windows (no refill of shuffle buffers). A
    paused tf.data iterator goes on working until its buffers are full
    (``buffered_images``: its prefetched batches, the batch being built and
    the decode calls in flight), then waits. That refill would be charged
    to the next window of another iterator (in images/s and in this
    process's CPU seconds), so each window first runs untimed for at least
    ``warmup`` seconds and as long as the other iterators need to refill at
    half their last rate (:func:`refill_seconds`).
    """

    def __init__(self, name: str, ds, images_per_element: int, buffered_images: int):
        self.name = name
        self.it = iter(ds)
        self.images_per_element = images_per_element
        self.buffered_images = buffered_images
        self.last_rate: float | None = None  # images/s of the last call, warm-up included

    def window(self, seconds: float, warmup: float) -> tuple[float, float, float | None]:
        """Returns (images per wall second, images per CPU second of this
        process, cores' worth of CPU used by other processes meanwhile or None)."""
        t0 = time.perf_counter()
        end, warm = t0 + warmup, 0
        while time.perf_counter() < end:
            next(self.it)
            warm += self.images_per_element
        n = 0
        busy0, cpu0, start = machine_busy_seconds(), time.process_time(), time.perf_counter()
        while True:
            next(self.it)
            n += self.images_per_element
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                cpu = max(time.process_time() - cpu0, 1e-9)
                busy1 = machine_busy_seconds()
                others = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0 - cpu) / elapsed)
                self.last_rate = (warm + n) / (time.perf_counter() - t0)
                return n / elapsed, n / cpu, others


def refill_seconds(meters: list[Meter], current: Meter) -> float:
    """The seconds the meters other than ``current`` need to fill their buffers again, sharing the CPUs
    with ``current``'s warm-up: twice their buffered images over their last rate (0 when unknown)."""
    return max([2.0 * m.buffered_images / m.last_rate for m in meters if m is not current and m.last_rate] or [0.0])


def others_text(others: float | None) -> str:
    """The "(others used N cores)" note of a window, or "" when unknown."""
    return "" if others is None else f"  (others used {others:.1f} cores)"


def ceiling_dataset(jpeg_bytes: list[bytes], image_size: int, calls: int, batch_size: int,
                    scaled_decode: bool = False):
    """In-memory JPEGs -> the training pipeline's per-image work, in uint8 batches of ``batch_size`` (so that
    both sides are read batch by batch: one ``next()`` per image cost the ceiling about 5% of its CPU);
    ``scaled_decode``: ``train_image``'s, crop windows of at least 2S a side decoded at a reduced DCT scale."""
    import tensorflow as tf

    from spark_imagenet.training.worker import pipeline

    def work(position, jpeg):  # the crop and flip drawn from (0, position), as the training decoder draws them
        crop_seed = tf.stack([tf.constant(0, tf.int64), 2 * position])
        return pipeline.train_image(jpeg, image_size, crop_seed, crop_seed + [0, 1], scaled_decode=scaled_decode)

    ds = tf.data.Dataset.from_tensor_slices(jpeg_bytes).repeat().enumerate()
    ds = ds.map(work, num_parallel_calls=calls, deterministic=False)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(CEILING_PREFETCH)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.deterministic = False
    return ds.with_options(options)


def measure(args, parallel: int, images: list[tuple[str, bytes]], files: list[str], say,
            extra: Sequence[Meter] = ()) -> list[dict]:
    """The alternating rounds (``say`` prints a line), with one window of each ``extra`` meter after the
    pipeline's. Returns one dict per round: ``ceilings`` (``[calls, images/s, images/CPU-s]`` of each ceiling
    formulation), ``pipeline`` (``[images/s, images/CPU-s]``), ``others`` (cores other processes used during
    the pipeline window, or None) and ``extra`` (``[images/s, images/CPU-s]`` by meter name)."""
    from spark_imagenet.training.worker import pipeline

    jpeg_bytes = [data for _, data in images]
    batch = args.batch_size
    ceilings = [(calls, Meter(f"ceiling ({calls} calls)", ceiling_dataset(jpeg_bytes, args.image_size, calls, batch),
                              batch, (CEILING_PREFETCH + 1) * batch + calls)) for calls in (parallel, parallel + 1)]
    ds = pipeline.train_dataset(files, batch, args.image_size, parallel, seed=0)
    train = Meter("pipeline", ds, batch, (pipeline.PREFETCH_BATCHES + 2) * batch + parallel)  # + the one batching
    meters = [m for _, m in ceilings] + [train, *extra]
    # One untimed pass fills every shuffle buffer and traces every function.
    for m in meters:
        m.window(0.0, args.warmup + refill_seconds(meters, m))
    rows = []
    for r in range(repetitions(args)):
        row: dict = {"ceilings": []}
        for calls, m in ceilings:
            rate, cpu_rate, others = m.window(args.seconds, max(args.window_warmup, refill_seconds(meters, m)))
            say(f"round {r + 1}: {m.name:20s} {rate:7.1f} images/s  {cpu_rate:7.1f} images/CPU-s"
                + others_text(others))
            row["ceilings"].append([calls, rate, cpu_rate])
        rate, cpu_rate, others = train.window(args.seconds, max(args.window_warmup, refill_seconds(meters, train)))
        best, best_cpu = max(c[1] for c in row["ceilings"]), max(c[2] for c in row["ceilings"])
        say(f"round {r + 1}: {train.name:20s} {rate:7.1f} images/s  {cpu_rate:7.1f} images/CPU-s"
            + others_text(others) + f"  ratio to the round's better ceiling {rate / best:.3f} "
            f"(per CPU-s {cpu_rate / best_cpu:.3f})")
        row["extra"] = {}
        for m in extra:
            m_rate, m_cpu, m_others = m.window(args.seconds, max(args.window_warmup, refill_seconds(meters, m)))
            say(f"round {r + 1}: {m.name:20s} {m_rate:7.1f} images/s  {m_cpu:7.1f} images/CPU-s"
                + others_text(m_others))
            row["extra"][m.name] = [m_rate, m_cpu]
        rows.append(dict(row, pipeline=[rate, cpu_rate], others=others))
    return rows


def series(rows: list[dict]) -> dict:
    """The per-round series of a run's rounds: ``ceiling`` and ``ceiling_cpu`` of the ceiling formulation
    with the higher median images/s (``ceiling_calls``; chosen once for the run, not per round, so that
    the noise of two windows does not pick the ceiling's maximum), ``pipeline``, ``pipeline_cpu``,
    ``others`` and ``ceiling_by_calls`` (every formulation's images/s and images/CPU-s)."""
    by_calls = {}
    for k, (calls, _, _) in enumerate(rows[0]["ceilings"]):
        by_calls[calls] = {"images/s": [r["ceilings"][k][1] for r in rows],
                           "images/CPU-s": [r["ceilings"][k][2] for r in rows]}
    chosen = max(by_calls, key=lambda calls: statistics.median(by_calls[calls]["images/s"]))
    return {"ceiling": by_calls[chosen]["images/s"], "ceiling_cpu": by_calls[chosen]["images/CPU-s"],
            "ceiling_calls": chosen, "pipeline": [r["pipeline"][0] for r in rows],
            "pipeline_cpu": [r["pipeline"][1] for r in rows],
            "others": [None if r["others"] is None else round(r["others"], 2) for r in rows],
            "ceiling_by_calls": {str(c): v for c, v in by_calls.items()}}


def record_rounds(report: Report, rows: list[dict], params: dict) -> dict:
    """The records of one benchmark run's rounds (see the module docstring); returns :func:`series`."""
    s = series(rows)
    params = dict(params, ceiling_calls=s["ceiling_calls"], others_cores=s["others"],
                  ceiling_by_calls=s["ceiling_by_calls"])
    report.add("ceiling images/s", "images/s", s["ceiling"], **params)
    report.add("pipeline images/s", "images/s", s["pipeline"], **params)
    report.add("ceiling images/CPU-s", "images/CPU-s", s["ceiling_cpu"], **params)
    report.add("pipeline images/CPU-s", "images/CPU-s", s["pipeline_cpu"], **params)
    report.ratio("pipeline / ceiling (images/s)", s["pipeline"], s["ceiling"], goal=0.95, **params)
    report.ratio("pipeline / ceiling (images/CPU-s)", s["pipeline_cpu"], s["ceiling_cpu"], goal=0.95, **params)
    return s


def run_benchmark(args) -> int:
    """One benchmark run (the whole script without --scaling); returns the exit status."""
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})  # before TensorFlow starts its threads
    report = Report("pipeline", args)
    t0 = time.perf_counter()
    loaded = load_images(args)
    if loaded is None:
        return 2
    images, source = loaded
    prepared_s = time.perf_counter() - t0
    import tensorflow as tf

    from spark_imagenet.training.worker import pipeline

    cpus = len(os.sched_getaffinity(0))
    parallel = pipeline.default_parallel(args.parallel if args.parallel else cpus)
    sizes = image_sizes(images)
    params = {"data": source, "images": len(images), "mean_kpixels": round(statistics.mean(w * h for w, h in sizes)
                                                                          / 1e3, 1),
              "mean_kb": round(statistics.mean(len(d) for _, d in images) / 1e3, 1), "max_side": args.max_side,
              "shards": args.shards, "image_size": args.image_size, "batch_size": args.batch_size,
              "parallel": parallel, "cpus": cpus, "seconds": args.seconds, "warmup": args.warmup,
              "alternative": "ceiling: the per-image work alone on in-memory JPEGs (better of parallel and "
                             "parallel + 1 calls per round)",
              "pipeline_output": "uint8 [B,S,S,3] batches, as training consumes them (normalized in the model's "
                                 "train step)"}
    report.say(f"settings: {len(images)} JPEGs from {source} (mean {params['mean_kpixels']:.0f} K pixels, "
               f"{params['mean_kb']:.0f} KB, prepared in {prepared_s:.1f} s), {args.shards} shards, "
               f"image {args.image_size}, batch {args.batch_size}, parallel {parallel}, {cpus} CPUs "
               f"(os.cpu_count() {os.cpu_count()}), {repetitions(args)} rounds x {args.seconds:g} s "
               f"(+{args.warmup:g} s warm-up), TensorFlow {tf.__version__}")
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        files = write_shards(images, sizes, Path(tmp), args.shards)
        extra, stored_mb = form_meters(args, parallel, images, files, Path(tmp)) if args.forms else ([], {})
        rows = measure(args, parallel, images, files, report.say, extra)
    result = record_rounds(report, rows, params)
    if args.forms:
        forms.record_forms(report, rows, stored_mb, params, parallel,
                           forms.windows_by_ratio([d for _, d in images], args.image_size))
    if args.summary_json is not None:  # a --scaling child: the parent reads the rounds
        args.summary_json.write_text(json.dumps(dict(result, cpus=cpus, parallel=parallel, params=params)))
    report.close()
    return 0


def form_meters(args, parallel: int, images: list[tuple[str, bytes]], files: list[str], tmp: Path
                ) -> tuple[list[Meter], dict[str, float]]:
    """--forms: the meters of the training pipeline on each form's shards (written under ``tmp``) and of the
    ceiling with the scaled decode (``parallel`` calls); and each form's shard MB per image, originals too."""
    from spark_imagenet.training.worker import pipeline

    def mb_per_image(paths: list[str]) -> float:
        return sum(os.path.getsize(p) for p in paths) / len(images) / 1e6

    batch = args.batch_size
    stored_mb = {"original": mb_per_image(files)}
    meters = []
    for kind, size in forms.FORMS:
        name = forms.label(kind, size)
        stored = forms.form_images(images, kind, size)
        (tmp / name).mkdir()
        paths = write_shards(stored, image_sizes(stored), tmp / name, args.shards)
        stored_mb[name] = mb_per_image(paths)
        meters.append(Meter(f"pipeline ({name})", pipeline.train_dataset(paths, batch, args.image_size, parallel,
                                                                         seed=0),
                            batch, (pipeline.PREFETCH_BATCHES + 2) * batch + parallel))
    scaled = ceiling_dataset([d for _, d in images], args.image_size, parallel, batch, scaled_decode=True)
    meters.append(Meter("ceiling (scaled decode)", scaled, batch, (CEILING_PREFETCH + 1) * batch + parallel))
    return meters, stored_mb


def child_argv(args, n: int, reps: int, summary: Path) -> list[str]:
    """The command line of a --scaling child on CPUs 0..n-1 with ``parallel n`` and ``reps`` rounds: the
    parent's settings (resolved), without --scaling, --repeats and --json."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--cpus", ",".join(map(str, range(n))),
            "--parallel", str(n), "--reps", str(reps), "--summary-json", str(summary),
            "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--image-size", str(args.image_size),
            "--batch-size", str(args.batch_size), "--shards", str(args.shards)]
    for option, value in (("--data", args.data), ("--limit", args.limit), ("--max-side", args.max_side)):
        if value is not None:
            argv += [option, str(value)]
    return argv + (["--quick"] if args.quick else [])


def run_children(args, counts: list[int], reps: int, report: Report) -> dict[int, list[dict]] | None:
    """The --scaling children, alternating CPU counts, ``--repeats`` times; their summaries per count
    (None when one failed). Their output goes to the parent's human stream."""
    results: dict[int, list[dict]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory(prefix="pipeline-scaling-") as tmp:
        for rep in range(args.repeats):
            for n in counts:
                out = Path(tmp) / f"{n}-{rep}.json"
                report.say(f"=== {n} CPU(s), run {rep + 1} of {args.repeats}")
                proc = subprocess.run(child_argv(args, n, reps, out), stdout=report.human)
                if proc.returncode != 0:
                    print(f"benchmarks/pipeline.py: the --scaling run on {n} CPU(s) exited {proc.returncode}",
                          file=sys.stderr)
                    return None
                results[n].append(json.loads(out.read_text()))
    return results


def scaling(args) -> int:
    """--scaling: the benchmark on 1, 2, ... CPUs in alternating child processes; records per CPU count
    and the cores one H200 would need (from the ASSUMED rates of :data:`H200_ASSUMED_IMAGES_PER_S`)."""
    try:
        counts = [int(c) for c in args.scaling.split(",")]
    except ValueError:
        counts = []
    available = len(os.sched_getaffinity(0))
    if not counts or min(counts) < 1 or max(counts) > available:
        print(f"benchmarks/pipeline.py: --scaling {args.scaling}: give CPU counts between 1 and the {available} "
              "CPUs this process may use, comma-separated (e.g. 1,2)", file=sys.stderr)
        return 2
    report = Report("pipeline", args)
    reps = args.reps if args.reps is not None else (args._quick_reps if args.quick else SCALING_CHILD_REPS)
    results = run_children(args, counts, reps, report)
    if results is None:
        return 1
    per_core: dict[int, list[float]] = {}
    per_cpu_s: dict[int, list[float]] = {}
    for n in counts:
        pooled = {key: [v for result in results[n] for v in result[key]]  # (repeat, round) order
                  for key in ("ceiling", "pipeline", "pipeline_cpu", "others")}
        params = dict(results[n][0]["params"], repeats=args.repeats, rounds_per_repeat=reps,
                      others_cores=pooled["others"], ceiling_calls=[r["ceiling_calls"] for r in results[n]])
        per_core[n], per_cpu_s[n] = [v / n for v in pooled["pipeline"]], pooled["pipeline_cpu"]
        report.add(f"{n} CPU(s): pipeline images/s per core", "images/s", per_core[n], **params)
        report.add(f"{n} CPU(s): pipeline images/CPU-s", "images/CPU-s", per_cpu_s[n], **params)
        report.add(f"{n} CPU(s): ceiling images/s per core", "images/s", [v / n for v in pooled["ceiling"]],
                   **params)
        report.ratio(f"{n} CPU(s): pipeline / ceiling (images/s)", pooled["pipeline"], pooled["ceiling"], **params)
    first = counts[0]
    for n in counts[1:]:
        report.ratio(f"{n} / {first} CPU(s): pipeline images/s per core", per_core[n], per_core[first],
                     note="1.0: linear scaling; rounds paired by (repeat, round), the children alternating")
    record_h200(report, counts[-1], statistics.median(per_cpu_s[counts[-1]]), args.image_size)
    report.close()
    return 0


def record_h200(report: Report, n: int, per_core: float, image_size: int) -> None:
    """Derived: cores of ``per_core`` images/s one H200 would need, at its ASSUMED training rates."""
    for model, (rate, (lo, hi)) in H200_ASSUMED_IMAGES_PER_S.items():
        report.derived(f"cores per H200, {model} (ASSUMED {rate:,} images/s)", "x", rate / per_core,
                       assumed_h200_images_per_s=rate, assumed_range=[lo, hi], cores_for_range=[
                           round(lo / per_core, 1), round(hi / per_core, 1)], per_core_images_per_s=per_core,
                       image_size=image_size,
                       basis=f"ASSUMED H200 rate (docs/projection.md section 2, not measured) / the median "
                             f"pipeline images/CPU-s with {n} CPU(s) (a core the pipeline has to itself)")


def main(argv=None) -> int:
    """Run the benchmark; returns the process exit status."""
    args = parse_args(argv)
    if args.scaling:
        return scaling(args)
    return run_benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
