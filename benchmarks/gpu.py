"""Training throughput of one GPU: tensors already on the device vs JPEG shards through the input pipeline.

Usage (from the repository root; the package need not be installed, its dependencies must be)::

    python benchmarks/gpu.py [--models alexnet,resnet50] [--modes synthetic,real] [--steps 100]
        [--warmup 10] [--batch-size 256] [--image-size 224] [--precision mixed_bfloat16] [--no-xla]
        [--data DIR ...] [--jpegs 1024] [--parallel N] [--out FILE] [--dry-run | --quick] [--reps 5] [--json [FILE]]

For each model (built with :func:`spark_imagenet.training.worker.models.registry.build_model` under the Keras
mixed-precision policy ``--precision``, compiled with the project's ``compile_model``) it runs, in this order:

* **synthetic**: one batch of random float32 images and int32 labels created on the device, fed to the
  training step again and again: no input pipeline, no host-to-device copy. This is the model's ceiling.
* **real**: batches from :func:`spark_imagenet.training.worker.pipeline.train_dataset` (random crop, decode, flip,
  resize on the host's CPU cores, ``--parallel`` decode calls; uint8 batches, normalized by the training step on
  the GPU), once per stored image form (issue 35; ``form`` in every line and record):

  - without ``--data``: ``--jpegs`` synthetic JPEGs (``spark_imagenet.demo.synthetic``, 500x375 px by default,
    about ImageNet's mean size) drawn into a class-folder tree in a temporary folder (a GPU machine may have no
    dataset and no network), then sharded twice by the package's own
    :func:`spark_imagenet.dataset.sharding.shard`: as they are (``original``) and with ``resize=256`` (the paper's
    256 x 256 form, ``resize 256 q90``: what ``spark-imagenet shard --resize 256`` stores);
  - with ``--data DIR`` (repeatable): the TFRecord shards of each folder, its form read from its
    ``manifest.json`` (``unknown`` without one). For real photos in both forms, build the shards twice with
    ``spark-imagenet shard SOURCE DIR`` and ``spark-imagenet shard SOURCE DIR256 --resize 256``, then give
    ``--data DIR --data DIR256``.

The training step is the model's own ``train_step`` (forward, loss, backward, SGD update, metrics) in one
``tf.function``, compiled with XLA (``jit_compile=True``) unless ``--no-xla``. The first ``--warmup`` steps
of each (model, mode) are run untimed (XLA compilation, pipeline start-up, buffers filling); then
``--steps`` steps are timed one by one, each ended by reading its loss back to the host (so a step's time
is its whole time on the device, and the next step starts on an idle device).

Printed: one JSON line per (model, mode, form) on stdout (on stderr instead with ``--json`` to stdout; also written
to ``--out``, default ``$OUT/gpu.jsonl`` when ``$OUT`` is set), with the keys of :data:`KEYS`:

* ``images_per_s``: ``steps * batch / wall time of the timed steps``.
* ``step_ms_median`` / ``step_ms_p90``: per-step wall time, fetching the batch included.
* ``input_wait_share``: the share of the timed wall time spent in the input iterator's ``next()``, i.e.
  waiting for the pipeline while the device sat idle (0 for synthetic).
* ``input_bound_share``: ``1 - real images/s / synthetic images/s`` of the same model and form (null on
  synthetic lines, or when synthetic was not run): everything the real input costs, the wait above plus the
  host-to-device copy of the uint8 batch (``B*S*S*3`` bytes, 39 MB at B=256, S=224) and its normalization
  in the step, which the synthetic mode does not do.
* ``first_step_s``: the first (warm-up) step's wall time: tracing, XLA compilation, pipeline start.
* ``batch``, ``image_size``, ``width``, ``num_classes``, ``params``, ``precision``, ``xla``, ``device``
  (the GPU's name, else the CPU's), ``tf_version``, ``steps``, ``warmup``, ``parallel`` (decode calls;
  null on synthetic lines), ``cpu_count``, ``data`` (``"synthetic-jpeg"``, the ``--data`` folder, or null),
  ``form`` (the stored image form of the real line's shards, as the manifest names it: ``original``,
  ``resize 256 q90``; null on synthetic lines), ``dry_run``.

On one NVIDIA H200 with about 16 CPU cores (TensorFlow 2.21 with CUDA, ``pip install
"tensorflow[and-cuda]==2.21.*" "tf-keras==2.21.*"``, plus this repository's dependencies), the prepared run,
expected to take 2 to 4 minutes (TensorFlow start, 1024 JPEGs drawn and sharded twice on 16 cores, the XLA
compilations, 6 x 110 steps), held to 5 by ``timeout``; each line is written (and flushed) as soon as it is
measured, so a run cut short keeps the lines before::

    timeout 300 python benchmarks/gpu.py --steps 100 --warmup 10 --out "${OUT:-.}/gpu.jsonl"

``--budget-s`` (default 30 s) ends a line's timed steps early if they run past it (``steps`` then
reports how many were timed), so that a slow input pipeline cannot use up the machine's time.

``--dry-run`` (also ``--quick``, which runs AlexNet alone unless ``--models`` is given) runs the same code
on the CPU at a tiny size (AlexNet at 67 px and width 0.25, ResNet-50 at 32 px, batch 4, 3 timed steps
after 1 warm-up, 32 small synthetic JPEGs sharded in both forms), same keys and lines: about a minute of CPU
time on 2 cores, most of it ResNet-50's XLA compilation (``--models alexnet``: about 15 s)::

    python benchmarks/gpu.py --dry-run

Without ``--dry-run`` (or ``--allow-cpu``) the script refuses to run when TensorFlow sees no GPU.

``--json [FILE]`` also writes the records of benchmarks/common.py (one JSON object per line, to FILE or to
stdout), per (model, mode): ``MODEL MODE: images/s`` over ``--reps`` windows of consecutive timed steps
(default 5; with ``--quick`` 2; fewer when fewer steps were timed), ``MODEL MODE: step ms`` over the timed
steps, on real lines ``MODEL real (FORM): input wait %`` per window (real lines' names end with their form:
``alexnet real (resize 256 q90): images/s``); and per model and form, derived, ``MODEL: input-bound share (FORM)``
(``100 * input_bound_share``, in %) where both modes ran; every record's params hold ``form``. The human
summary lines go to stderr.

Results: docs/projection.md (its GPU side is PyTorch's on one H200, a ceiling; no TensorFlow GPU run is recorded).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import multiprocessing
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import Report, add_options, repetitions  # noqa: E402  (benchmarks/common.py, beside this script)
from spark_imagenet.errors import ConfigError, SparkImagenetError  # noqa: E402  (TensorFlow-free)
from spark_imagenet.training.job import model_specs  # noqa: E402  (TensorFlow-free)

#: The keys of every JSON line, in order.
KEYS = (
    "model", "mode", "form", "images_per_s", "step_ms_median", "step_ms_p90", "input_wait_share", "input_bound_share",
    "first_step_s", "batch", "image_size", "width", "num_classes", "params", "precision", "xla", "device",
    "tf_version", "steps", "warmup", "parallel", "cpu_count", "data", "dry_run",
)
MODELS = tuple(model_specs.MODELS)
MODES = ("synthetic", "real")
#: The stored forms the real mode shards its synthetic JPEGs in (``shard(resize=...)``; None: the originals).
RESIZE_FORMS = (None, 256)
#: Classes of the synthetic JPEGs (at most; each gets at least 2 images, one or more drawn for validation).
SYNTHETIC_CLASSES = 8
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
#: --dry-run sizes: each model at its smallest input side (AlexNet's layer arithmetic needs 67 px,
#: ``tf_keras.applications.ResNet50`` accepts 32).
DRY_RUN_IMAGE_SIZE = {name: spec.min_image_size for name, spec in model_specs.MODELS.items()}
DRY_RUN = {"batch_size": 4, "steps": 3, "warmup": 1, "jpegs": 32, "jpeg_size": (96, 72), "width": 0.25,
           "budget_s": 60.0}
#: Learning rate of the benchmark's SGD steps (any small value; the numbers do not depend on it).
LEARNING_RATE = 0.01


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring); ``--dry-run`` replaces the sizes not given."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None,
                   help=f"comma-separated (default: {','.join(MODELS)}; with --quick: alexnet, to stay under a minute)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated (default: %(default)s)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per (model, mode) (default: 100)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default: 10)")
    p.add_argument("--batch-size", type=int, default=None, help="images per step (default: 256)")
    p.add_argument("--image-size", type=int, default=None, help="S in pixels (default: 224)")
    p.add_argument("--width", type=float, default=None, help="AlexNet width multiplier (default: 1.0)")
    p.add_argument("--num-classes", type=int, default=1000, help="logits (default: %(default)s)")
    p.add_argument("--precision", default="mixed_bfloat16", choices=PRECISIONS, help="(default: %(default)s)")
    p.add_argument("--no-xla", dest="xla", action="store_false", help="no jit_compile of the training step")
    p.add_argument("--data", type=Path, action="append", default=None,
                   help="folder of TFRecord shards built by `spark-imagenet shard` (its form from its manifest); "
                        "repeat it for each form, e.g. --data DIR --data DIR256 (DIR256 built with --resize 256) "
                        "(default: synthetic JPEGs sharded here as they are and with --resize 256)")
    p.add_argument("--jpegs", type=int, default=None, help="synthetic JPEGs to draw without --data (default: 1024)")
    p.add_argument("--parallel", type=int, default=None, help="decode calls of the pipeline (default: CPU count)")
    p.add_argument("--budget-s", type=float, default=None, help="wall limit of the timed steps (default: 30)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON lines here (default: $OUT/gpu.jsonl)")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (a test of the script)")
    p.add_argument("--allow-cpu", action="store_true", help="run full sizes even when no GPU is visible")
    add_options(p)  # --quick (= --dry-run here), --reps (windows of the images/s records), --json (the records)
    args = p.parse_args(argv)
    return resolve_args(args)


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults (``--dry-run``'s or the GPU run's) and check the options.

    Raises:
        ConfigError: an unknown model or mode, a count below 1 (``--jpegs``: 2), or a ``--data`` folder that does
            not exist.
    """
    if args.models is None:  # --quick alone: AlexNet only (ResNet-50's XLA compilation on a CPU takes a minute)
        args.models = "alexnet" if getattr(args, "quick", False) and not args.dry_run else ",".join(MODELS)
    args.dry_run = args.quick = dry = bool(args.dry_run or getattr(args, "quick", False))
    full = {"steps": 100, "warmup": 10, "batch_size": 256, "jpegs": 1024, "width": 1.0, "budget_s": 30.0}
    for key, value in full.items():
        if getattr(args, key) is None:
            setattr(args, key, DRY_RUN[key] if dry else value)
    args.jpeg_size = DRY_RUN["jpeg_size"] if dry else (500, 375)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for option, given, known in (("--models", args.models, MODELS), ("--modes", args.modes, MODES)):
        bad = [v for v in given if v not in known]
        if bad or not given:
            raise ConfigError(f"{option}: {', '.join(bad) or 'nothing given'}; choose from {', '.join(known)}")
    for option in ("steps", "batch_size", "num_classes"):
        if getattr(args, option) < 1:
            raise ConfigError(f"--{option.replace('_', '-')} must be at least 1, got {getattr(args, option)}")
    if args.jpegs < 2:
        raise ConfigError(f"--jpegs must be at least 2 (the sharding draws one for validation), got {args.jpegs}")
    if args.warmup < 1:
        raise ConfigError(f"--warmup must be at least 1 (the first step compiles), got {args.warmup}")
    if args.image_size is not None and args.image_size < max(DRY_RUN_IMAGE_SIZE[m] for m in args.models):
        raise ConfigError(f"--image-size {args.image_size} is below what {', '.join(args.models)} accept "
                          f"(AlexNet >= {DRY_RUN_IMAGE_SIZE['alexnet']}, "
                          f"ResNet-50 >= {DRY_RUN_IMAGE_SIZE['resnet50']})")
    for folder in args.data or ():
        if not folder.is_dir():
            raise ConfigError(f"--data {folder}: no such folder (give a folder of TFRecord shards)")
    if args.out is None and os.environ.get("OUT"):
        args.out = Path(os.environ["OUT"]) / "gpu.jsonl"
    return args


def image_size_of(args: argparse.Namespace, model: str) -> int:
    """S for ``model``: ``--image-size``, else 224, else (``--dry-run``) the model's tiny size."""
    if args.image_size is not None:
        return args.image_size
    return DRY_RUN_IMAGE_SIZE[model] if args.dry_run else 224


# --------------------------------------------------------------------------- shards


@dataclasses.dataclass(frozen=True)
class ShardSet:
    """The TFRecord shards of one stored image form, as the real lines read them.

    Attributes:
        form: the form's label, as the manifest records it (``original``, ``resize 256 q90``; ``unknown`` for a
            ``--data`` folder without ``manifest.json``).
        files: the training shards' paths.
        data: where they come from: ``"synthetic-jpeg"`` or the ``--data`` folder.
    """

    form: str
    files: tuple[str, ...]
    data: str


def _draw_jpeg(job: tuple[int, int, int, int, int]) -> bytes:
    """One synthetic JPEG (quality 90): ``(index, label, classes, width, height) -> bytes``."""
    from spark_imagenet.demo.synthetic import draw_image

    index, label, classes, width, height = job
    out = io.BytesIO()
    draw_image(label, classes, random.Random(index), width, height).save(out, "JPEG", quality=90)
    return out.getvalue()


def draw_images(folder: Path, count: int, size: tuple[int, int], num_classes: int) -> Path:
    """Draw ``count`` synthetic JPEGs into a class-folder tree ``folder/images/classKK/*.JPEG`` (what
    :func:`spark_imagenet.source.open_source` reads as one's own images).

    Each image is a class texture of :mod:`spark_imagenet.demo.synthetic` of ``size = (width, height)`` pixels,
    JPEG quality 90, in class ``index % K`` with K = min(:data:`SYNTHETIC_CLASSES`, ``num_classes``,
    ``count // 2``) (so every class has two images or more, the sharding draws validation images from each,
    and the labels fit a model of ``num_classes`` logits). Drawn in a process pool of all CPU cores (at most 16).

    Returns:
        Path: the tree's root.
    """
    classes = max(1, min(SYNTHETIC_CLASSES, num_classes, count // 2))
    jobs = [(i, i % classes, classes, size[0], size[1]) for i in range(count)]
    root = folder / "images"
    for label in range(classes):
        (root / f"class{label:02d}").mkdir(parents=True)
    with multiprocessing.get_context("spawn").Pool(min(os.cpu_count() or 1, 16)) as pool:
        for (i, label, *_), data in zip(jobs, pool.imap(_draw_jpeg, jobs, chunksize=8)):
            (root / f"class{label:02d}" / f"synthetic_{i:06d}.JPEG").write_bytes(data)
    return root


def shard_forms(images: Path, folder: Path) -> list[ShardSet]:
    """Shard the class-folder tree ``images`` once per form of :data:`RESIZE_FORMS` with the package's own
    :func:`spark_imagenet.dataset.sharding.shard` (all cores, at most 16; automatic shard counts) into
    ``folder/original`` and ``folder/resize-256``.

    Returns:
        list[ShardSet]: per form, in :data:`RESIZE_FORMS` order, its label (from the manifest) and train shards.
    """
    from spark_imagenet.dataset.sharding import shard

    sets = []
    for resize in RESIZE_FORMS:
        out = folder / (f"resize-{resize}" if resize else "original")
        manifest = shard(images, out, resize=resize, processes=min(os.cpu_count() or 1, 16), progress=False)
        sets.append(ShardSet(manifest.image_form.label, tuple(shard_files(out)), "synthetic-jpeg"))
    return sets


def data_shard_sets(folders: list[Path]) -> list[ShardSet]:
    """The shards of each ``--data`` folder, with its form from its ``manifest.json``.

    Raises:
        ConfigError: a folder without shards (:func:`shard_files`), an unreadable manifest, or two folders of
            the same form (their lines and records would have the same names).
    """
    from spark_imagenet.dataset.manifest import Manifest

    sets: list[ShardSet] = []
    for folder in folders:
        path = folder / "manifest.json"
        try:
            form = Manifest.loads(path.read_text(), where=str(path)).image_form.label if path.is_file() else "unknown"
        except (OSError, SparkImagenetError) as exc:
            raise ConfigError(f"--data {folder}: {exc}") from None
        same = [s.data for s in sets if s.form == form]
        if same:
            raise ConfigError(f"--data {folder} and --data {same[0]} both hold the form {form!r}: give one folder "
                              "per form")
        sets.append(ShardSet(form, tuple(shard_files(folder)), str(folder)))
    return sets


def shard_files(folder: Path) -> list[str]:
    """The training shards of ``--data``: ``train-*.tfrecord`` files (any depth), else every ``*.tfrecord``.

    Raises:
        ConfigError: the folder holds no ``.tfrecord`` file (names ``--data``).
    """
    files = sorted(str(p) for p in folder.rglob("train-*.tfrecord")) or \
        sorted(str(p) for p in folder.rglob("*.tfrecord"))
    if not files:
        raise ConfigError(f"--data {folder}: no .tfrecord shards in it (build them with `spark-imagenet shard`, "
                          "or leave --data out to use synthetic JPEGs)")
    return files


# --------------------------------------------------------------------------- TensorFlow side


def make_step(model, xla: bool):
    """One training step ``(images [B,S,S,3], labels int32 [B]) -> logs`` (dict of scalar tensors, ``"loss"``
    among them; images uint8 pixels, normalized in the step, or float32 already normalized): the model's own
    ``train_step`` in one ``tf.function``, XLA-compiled when ``xla`` (what Keras' ``fit`` runs per step with
    ``jit_compile=True``)."""
    import tensorflow as tf

    def step(images, labels):
        return model.train_step((images, labels))

    return tf.function(step, jit_compile=xla, reduce_retracing=True)


def timed_steps(step, batches, steps: int, warmup: int, budget_s: float) -> tuple[float, list[float], list[float]]:
    """Run ``warmup`` untimed steps, then up to ``steps`` timed ones.

    Args:
        step: ``(images, labels) -> logs`` (:func:`make_step`).
        batches: ``() -> (images, labels)``, the next batch.
        steps: timed steps.
        warmup: untimed steps first (at least 1).
        budget_s: the timed steps stop after the first one that ends past this many seconds.

    Returns:
        ``(first_step_s, step_s, wait_s)``: the first warm-up step's wall time in seconds, and per timed step
        its wall time (the batch's fetch, the step and reading its loss back) and the part spent in
        ``batches()``.
    """
    start = time.perf_counter()
    for i in range(warmup):
        float(step(*batches())["loss"])
        if i == 0:
            first = time.perf_counter() - start
    step_s, wait_s = [], []
    end = time.perf_counter() + budget_s
    for _ in range(steps):
        t0 = time.perf_counter()
        images, labels = batches()
        t1 = time.perf_counter()
        float(step(images, labels)["loss"])  # waits for the device
        t2 = time.perf_counter()
        step_s.append(t2 - t0)
        wait_s.append(t1 - t0)
        if t2 > end:
            break
    return first, step_s, wait_s


def summarize(step_s: list[float], wait_s: list[float], batch: int) -> dict:
    """``images_per_s``, ``step_ms_median``, ``step_ms_p90`` and ``input_wait_share`` of timed steps
    (seconds each; see the module docstring), rounded for printing."""
    total = sum(step_s)
    p90 = statistics.quantiles(step_s, n=10)[-1] if len(step_s) > 1 else step_s[0]
    return {"images_per_s": round(len(step_s) * batch / total, 1),
            "step_ms_median": round(1000 * statistics.median(step_s), 3), "step_ms_p90": round(1000 * p90, 3),
            "input_wait_share": round(sum(wait_s) / total, 4), "steps": len(step_s)}


def device_name(tf) -> str:
    """The first visible GPU's name (e.g. ``"NVIDIA H200"``), else the CPU's model name."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return str(details.get("device_name") or gpus[0].name)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU: " + (platform.processor() or platform.machine())


def synthetic_batches(tf, batch: int, image_size: int, num_classes: int):
    """``() -> (images, labels)`` returning one fixed batch created on the default device (the GPU when
    there is one): float32 ``[B,S,S,3]`` normal noise (the pipeline's normalized images have mean 0 and
    standard deviation 1 too) and int32 ``[B]`` labels in ``[0, num_classes)``."""
    gen = tf.random.Generator.from_seed(0)
    images = gen.normal([batch, image_size, image_size, 3], dtype=tf.float32)
    labels = gen.uniform([batch], 0, num_classes, dtype=tf.int32)
    return lambda: (images, labels)


def pipeline_batches(files: list[str], batch: int, image_size: int, parallel: int | None):
    """``() -> (images, labels)``: the next batch of :func:`spark_imagenet.training.worker.pipeline.train_dataset`
    over ``files`` (one endless epoch, seed 0; uint8 ``[B,S,S,3]`` and int32 ``[B]`` on the host; the model's
    ``train_step`` normalizes the images)."""
    from spark_imagenet.training.worker.pipeline import train_dataset

    iterator = iter(train_dataset(files, batch, image_size, parallel, seed=0))
    return lambda: next(iterator)


def bench_model(args: argparse.Namespace, name: str, shard_sets: list[ShardSet],
                common: dict) -> list[tuple[dict, list[float], list[float]]]:
    """Build, compile and time model ``name`` in each of ``args.modes`` (``real``: once per shard set).

    Args:
        args: the resolved options (:func:`parse_args`).
        name: ``"alexnet"`` or ``"resnet50"``.
        shard_sets: the shards of each stored form for the ``real`` mode (empty when it is not run).
        common: the keys shared by every line (device, versions, ...).

    Returns:
        list: per line, ``(row, step_s, wait_s)``: the row with the keys of :data:`KEYS`, and per timed step
        its wall time and the part spent waiting for the batch, in seconds (:func:`timed_steps`).
    """
    import tensorflow as tf
    import tf_keras as keras

    from spark_imagenet.training.worker.models.compile import compile_model, float32_logits, set_precision
    from spark_imagenet.training.worker.models.registry import build_model
    from spark_imagenet.training.worker.pipeline import default_parallel

    keras.backend.clear_session()
    image_size = image_size_of(args, name)
    spec = model_specs.MODELS.get(name)
    width = 1.0 if spec is None or spec.fixed_width else args.width
    set_precision(args.precision)
    model = float32_logits(build_model(name, args.num_classes, image_size, width))
    # SGD with momentum 0.9 and the recipe's weight decay (one term per kernel in the step), XLA when asked
    model = compile_model(model, LEARNING_RATE, weight_decay=spec.recipe.weight_decay if spec else 0.0,
                          jit_compile=args.xla)
    step = make_step(model, args.xla)
    rows, synthetic_rate = [], None
    runs = [(mode, shards) for mode in args.modes for shards in (shard_sets if mode == "real" else [None])]
    for mode, shards in runs:
        if shards is None:
            batches = synthetic_batches(tf, args.batch_size, image_size, args.num_classes)
        else:
            batches = pipeline_batches(list(shards.files), args.batch_size, image_size, args.parallel)
        first, step_s, wait_s = timed_steps(step, batches, args.steps, args.warmup, args.budget_s)
        row = dict(common, model=name, mode=mode, first_step_s=round(first, 3), batch=args.batch_size,
                   image_size=image_size, width=width, num_classes=args.num_classes, params=model.count_params(),
                   **summarize(step_s, wait_s, args.batch_size))
        if shards is None:
            synthetic_rate = row["images_per_s"]
            row.update(input_wait_share=0.0, input_bound_share=None, parallel=None, data=None, form=None)
        else:
            bound = None if synthetic_rate is None else round(1.0 - row["images_per_s"] / synthetic_rate, 4)
            row.update(input_bound_share=bound, parallel=default_parallel(args.parallel), data=shards.data,
                       form=shards.form)
        rows.append(({key: row[key] for key in KEYS}, step_s, wait_s))
    keras.mixed_precision.set_global_policy("float32")
    return rows


def rows_stream_of(json_target: str | None):
    """Where the rows of :data:`KEYS` are printed: stdout, or stderr when ``--json``'s records go to stdout
    (``json_target`` ``"-"``)."""
    return sys.stderr if json_target == "-" else sys.stdout


def emit(row: dict, out, stream=None) -> None:
    """Print ``row`` as one JSON line on ``stream`` (default stdout; flushed) and append it to ``out`` (a file
    or None)."""
    line = json.dumps(row, allow_nan=False)
    print(line, file=stream or sys.stdout, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def windows(values: list[float], count: int) -> list[list[float]]:
    """``values`` cut into ``count`` runs of consecutive values, as equal in length as can be (fewer when
    there are fewer values)."""
    count = max(1, min(count, len(values)))
    size, extra = divmod(len(values), count)
    bounds = [k * size + min(k, extra) for k in range(count + 1)]
    return [values[bounds[k]:bounds[k + 1]] for k in range(count)]


def record_mode(report: Report, row: dict, step_s: list[float], wait_s: list[float], reps: int) -> None:
    """The harness records of one (model, mode) (module docstring): images/s per window of consecutive timed
    steps, step ms per step, and on real lines the input wait per window in %."""
    params = {key: row[key] for key in KEYS if key not in ("images_per_s", "step_ms_median", "step_ms_p90",
                                                          "input_wait_share", "input_bound_share", "params")}
    params["model_params"] = row["params"]
    label = f"{row['model']} {row['mode']}" + (f" ({row['form']})" if row["form"] is not None else "")
    step_windows = windows(step_s, reps)
    wait_windows = windows(wait_s, reps)
    report.add(f"{label}: images/s", "images/s", [len(w) * row["batch"] / sum(w) for w in step_windows],
               windows=len(step_windows), **params)
    report.add(f"{label}: step ms", "ms", [1000 * t for t in step_s], **params)
    if row["mode"] == "real":
        report.add(f"{label}: input wait %", "%", [100 * sum(w) / sum(s) for w, s in zip(wait_windows,
                                                                                       step_windows)],
                   windows=len(step_windows), **params)


def record_model(report: Report, results: list[tuple[dict, list[float], list[float]]], reps: int) -> None:
    """The records of one model's lines, then (derived) its input-bound share per form where both modes ran."""
    for row, step_s, wait_s in results:
        record_mode(report, row, step_s, wait_s, reps)
    for row, _, _ in results:
        if row["mode"] == "real" and row["input_bound_share"] is not None:
            report.derived(f"{row['model']}: input-bound share ({row['form']})", "%", 100 * row["input_bound_share"],
                           formula="100 * (1 - real images/s / synthetic images/s), images/s over all timed steps",
                           alternative="synthetic: the batch already on the device (the model's ceiling)",
                           **{k: row[k] for k in ("batch", "image_size", "precision", "xla", "device", "parallel",
                                                  "data", "form")})


def run(args: argparse.Namespace) -> int:
    """Start TensorFlow, write the shards of both forms if needed, and time every (model, mode, form) (module
    docstring).

    Returns:
        int: 0.

    Raises:
        ConfigError: no GPU visible without ``--dry-run``/``--allow-cpu``, or a bad ``--data`` folder
            (:func:`data_shard_sets`).
    """
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # the dry run is a CPU run, also on a GPU machine
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU") and not (args.dry_run or args.allow_cpu):
        raise ConfigError("TensorFlow sees no GPU: install TensorFlow with CUDA "
                          "(pip install 'tensorflow[and-cuda]'), or run with --dry-run (tiny, on the CPU) "
                          "or --allow-cpu (full sizes on the CPU)")
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        shard_sets = []
        if "real" in args.modes:
            if args.data:
                shard_sets = data_shard_sets(args.data)
            else:
                images = draw_images(Path(tmp), args.jpegs, args.jpeg_size, args.num_classes)
                shard_sets = shard_forms(images, Path(tmp) / "shards")
        common = {"precision": args.precision, "xla": bool(args.xla), "device": device_name(tf),
                  "tf_version": tf.__version__, "warmup": args.warmup, "cpu_count": os.cpu_count(),
                  "dry_run": bool(args.dry_run)}
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        report = Report("gpu", args)
        report.human = sys.stderr  # stdout keeps the rows of KEYS (unless the records go there)
        rows_stream = rows_stream_of(args.json)
        with open(args.out, "w") if args.out is not None else _no_file() as out:
            for name in args.models:
                results = bench_model(args, name, shard_sets, common)
                for row, _, _ in results:
                    emit(row, out, rows_stream)
                record_model(report, results, repetitions(args))
        report.close()
    return 0


class _no_file:
    """A context manager standing for 'no output file' (yields None)."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main(argv=None) -> int:
    """Entry point: parse the options and :func:`run`; a ConfigError is one line on stderr, exit status 2."""
    try:
        return run(parse_args(argv))
    except ConfigError as exc:
        print(f"gpu.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
