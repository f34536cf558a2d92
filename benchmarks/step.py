"""Training step overhead: our training path against a bare tf_keras ``model.fit`` of the same model.

Usage (from the repository root)::

    .venv/bin/python benchmarks/step.py [--quick] [--reps 5] [--json [FILE]] [--sizes 224,test]
        [--steps N] [--batch-224 8] [--batch-test 8] [--ablate]

What is measured, in one process, with no Spark and no input pipeline: every variant trains on one in-memory
batch of random images and int32 labels repeated (``tf.data.Dataset.from_tensors(batch).repeat()``), so only
the training step differs (the pipeline has its own benchmark, ``pipeline.py``). Ours' batch is uint8 pixels,
as the input pipeline hands them on since issue 23: ours' train step normalizes them (cast, scale, offset:
``preprocessing.normalize_batch``), work the pipeline did on the host before, so ``ours / bare`` includes it;
bare's batch is float32 (random normal, as normalized images), with no normalization anywhere.

* **ours**: the worker's own code (``spark_imagenet.training.worker.main``): ``_configure`` (seed, the
  ``tf.random.Generator`` dropout), ``_build_strategy`` (``MultiWorkerMirroredStrategy`` with one worker, what a
  one-worker job runs), ``_build_model`` (``build_model`` + ``float32_logits`` + ``compile_model`` inside the
  strategy's scope: SGD with momentum and the L2 weight decay in its step, the learning-rate schedule, the ``top1``,
  ``top5`` and ``xent`` weighted metrics) and ``_fit`` (``model.fit`` with the epoch progress callback and the
  step watchdog the worker adds; no checkpoints, no TensorBoard: those are off unless a job asks for them). The
  batch reaches it through ``strategy.distribute_datasets_from_function``, as in the worker. Settings: the
  AlexNet recipe (cosine schedule with warm-up, weight decay 5e-4, momentum 0.9).
* **ours (bare settings)**: the same path with the recipe's extras off (``--lr-schedule constant
  --warmup-epochs 0 --weight-decay 0``): what is left is the strategy, the metrics and the callbacks.
* **bare**: ``build_model`` from our registry (the same layers and weight shapes) without a strategy, compiled
  with ``tf_keras.optimizers.SGD(0.01, momentum=0.9)`` and ``SparseCategoricalCrossentropy(from_logits=True)``,
  no metrics, no callbacks, Keras' default (stateless-op) dropout.

Each repetition is one ``fit`` call of ``--steps`` steps per variant, interleaved (ours, ours bare settings,
bare, ours, ...), after one untimed warm-up call each (tracing). A callback notes the wall clock and this
process' CPU time (``time.process_time``: user + system of all its threads) at the end of every batch (it takes
the logs as tensors, so it adds no device sync); a repetition's value is the median over its steps, so the
start of each ``fit`` call and a step preempted by another process weigh nothing. Two measures:

* ``ms per step`` (wall) and ``images/s``: what training sees, but on a machine shared with other processes
  wall time follows their load (the ratio of one run still pairs neighbouring calls);
* ``CPU ms per step``: the work a step costs this process, much less sensitive to others' load; the
  ``CPU time per step`` ratio is the overhead claim on a busy machine.

``--ablate`` adds "bare + X" variants, each adding one thing of ours to bare, to find where a difference comes
from ("bare + decoupled weight decay" is not ours: tf_keras' ``SGD(weight_decay=...)``, for comparison; "bare + L2
loss term" is how our weight decay was applied before it moved into the optimizer's step, ``DecayedSGD``;
"bare + normalization" trains on uint8 pixels normalized in its train step, as ours: that variant over bare is
what the step pays for the normalization the input pipeline no longer does).

Sizes: ``224`` is AlexNet as in the paper (224 px, width 1.0, 1000 classes) at a small batch (CPU);
``test`` is the size tests train (the smallest input AlexNet takes,
``model_specs.MODELS["alexnet"].min_image_size`` = 67 px, width 0.25, 100 classes). ``--quick``: only ``test``,
few steps.

How to read it: ``ours / bare`` is the ratio of the times per step (1.0 = our path adds nothing, the limit;
1.05 = 5 % slower); ``ours (bare settings) / bare`` separates the cost of the recipe (weight decay, schedule)
from that of the machinery (strategy, metrics, callbacks).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.pop("TF_CONFIG", None)  # one worker, no cluster

from common import Report, add_options, repetitions  # noqa: E402
from spark_imagenet.training.job.model_specs import MODELS  # noqa: E402  (TensorFlow-free)

#: The sizes: image side, width multiplier, classes (test: as tests/test_worker.py, at AlexNet's smallest input).
SIZES = {"224": {"image_size": 224, "width": 1.0, "num_classes": 1000},
         "test": {"image_size": MODELS["alexnet"].min_image_size, "width": 0.25, "num_classes": 100}}
#: Timed steps per fit call (full run, --quick).
STEPS = {"224": 8, "test": 40}
QUICK_STEPS = 10
#: Untimed steps of the warm-up call of each variant.
WARMUP_STEPS = 3
#: The bare side's learning rate (the AlexNet recipe's base rate; the timings do not depend on it).
LEARNING_RATE = 0.01
#: The recipe's extras turned off: "ours (bare settings)".
BARE_SETTINGS = {"lr_schedule": "constant", "warmup_epochs": 0.0, "weight_decay": 0.0}
#: --ablate: bare plus one thing of ours each.
ABLATIONS = ("strategy", "metrics", "weight decay", "schedule", "callbacks", "generator dropout",
             "decoupled weight decay", "L2 loss term", "normalization")
#: The recipe's weight decay (AlexNet: Krizhevsky et al. 2012).
WEIGHT_DECAY = 5e-4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=None, help="comma-separated, of 224 and test (default: both; --quick: test)")
    ap.add_argument("--steps", type=int, default=None,
                    help=f"timed steps per fit call (default: {STEPS['224']} at 224, {STEPS['test']} at test; "
                         f"--quick {QUICK_STEPS})")
    ap.add_argument("--batch-224", type=int, default=8, help="batch at 224 px (default: %(default)s; CPU-sized)")
    ap.add_argument("--batch-test", type=int, default=8, help="batch at the test size (default: %(default)s, "
                                                              "as tests/test_worker.py)")
    ap.add_argument("--ablate", nargs="?", const=",".join(ABLATIONS), default="", metavar="WHAT",
                    help="also time bare + each of WHAT, comma-separated (default, without WHAT: all of "
                         + ", ".join(ABLATIONS) + ")")
    add_options(ap)
    args = ap.parse_args(argv)
    sizes = args.sizes or ("test" if args.quick else "224,test")
    args.sizes = [s.strip() for s in sizes.split(",") if s.strip()]
    bad = [s for s in args.sizes if s not in SIZES]
    if bad or not args.sizes:
        ap.error(f"--sizes {sizes!r}: choose from 224, test")
    if args.steps is not None and args.steps < 2:
        ap.error("--steps must be at least 2 (the time per step is measured between batch ends)")
    args.ablate = [a.strip() for a in args.ablate.split(",") if a.strip()]
    unknown = [a for a in args.ablate if a not in ABLATIONS]
    if unknown:
        ap.error(f"--ablate {', '.join(unknown)}: choose from {', '.join(ABLATIONS)}")
    if min(args.batch_224, args.batch_test) < 1:
        ap.error("--batch-224 and --batch-test must be at least 1")
    return args


def size_settings(name: str, args: argparse.Namespace) -> dict:
    """Image side, width, classes, batch and timed steps of size ``name``."""
    batch = args.batch_224 if name == "224" else args.batch_test
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS[name])
    return {**SIZES[name], "batch_size": batch, "steps": steps}


def worker_spec(size: dict, steps: int, **settings):
    """A one-worker WorkerSpec for our path (its train file is never opened: the batch is in memory)."""
    from spark_imagenet.training.job.config import TrainConfig
    from spark_imagenet.training.job.plan import WorkerSpec
    from spark_imagenet.training.job.schedules import schedule_for

    config = TrainConfig(workers=1, model="alexnet", epochs=1, batch_size=size["batch_size"],
                         image_size=size["image_size"], width=size["width"], seed=0, parallel=1, **settings)
    return WorkerSpec(config=config, schedule=schedule_for(config, steps), dataset_id="(in memory)",
                      num_classes=size["num_classes"], rank=0, train_files=("(in memory)",),
                      train_examples=steps * size["batch_size"], val_files=(), val_examples=0, val_examples_total=0,
                      steps_per_epoch=steps, val_steps=0)


def step_clock():
    """A Keras callback noting the wall clock and this process' CPU time at the end of every training batch;
    its ``step_seconds()`` gives the medians of the steps' wall and CPU seconds (the call's first step, which
    ends the fit call's start-up, is the origin of the first difference)."""
    import tf_keras as keras

    class StepClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True  # the logs stay tensors: no per-batch sync added
            self.ends: list[tuple[float, float]] = []

        def on_train_begin(self, logs=None) -> None:
            self.ends = []

        def on_train_batch_end(self, batch, logs=None) -> None:
            self.ends.append((time.perf_counter(), time.process_time()))

        def step_seconds(self) -> tuple[float, float]:
            pairs = list(zip(self.ends, self.ends[1:]))
            return (statistics.median(b[0] - a[0] for a, b in pairs),
                    statistics.median(b[1] - a[1] for a, b in pairs))

    return StepClock()


def one_batch(size: dict, pixels: bool = False):
    """The in-memory batch: random normal float32 images ``[B, S, S, 3]`` (``pixels``: uniform uint8 pixels
    0..255, what the input pipeline hands on), int32 labels ``[B]``."""
    import tensorflow as tf

    g = tf.random.Generator.from_seed(1)
    s, b = size["image_size"], size["batch_size"]
    images = g.normal([b, s, s, 3], dtype=tf.float32)
    if pixels:
        images = tf.cast(g.uniform([b, s, s, 3], 0, 256, dtype=tf.int32), tf.uint8)
    labels = g.uniform([b], 0, size["num_classes"], dtype=tf.int32)
    return images, labels


class Ours:
    """Our path: the worker's strategy, model, callbacks and ``_fit``; ``settings`` override the recipe."""

    def __init__(self, strategy, size: dict, batch, **settings) -> None:
        import tensorflow as tf

        from spark_imagenet.training.worker import tf_internals
        from spark_imagenet.training.worker import training as worker
        from spark_imagenet.training.worker.watchdog import StepWatchdog

        self.worker, self.size = worker, size
        self.spec = worker_spec(size, size["steps"], **settings)
        self.warm = dataclasses.replace(self.spec, steps_per_epoch=WARMUP_STEPS)
        import tf_keras as keras

        keras.backend.experimental.enable_tf_random_generator()  # what strategy.configure sets
        self.model = worker._build_model(strategy, self.spec)
        tf_internals.no_autotune_on_device_datasets()
        self.data = strategy.distribute_datasets_from_function(
            lambda ctx: tf.data.Dataset.from_tensors(batch).repeat())
        self.watchdog = StepWatchdog(self.spec.config.run.step_timeout, 0, [])
        self.clock = step_clock()

    def fit(self, warm: bool = False) -> tuple[float, float]:
        """One fit call; returns (wall, CPU) seconds per step."""
        spec = self.warm if warm else self.spec
        self.worker._fit(self.model, self.data, spec, None, 0, [self.watchdog, self.clock])
        return self.clock.step_seconds()


def _l2_term(model):
    """The L2 term ``WEIGHT_DECAY / 2 * sum(w ** 2)`` over the model's kernels, as a callable loss (the former
    way of weight decay, kept here to measure against)."""
    import tensorflow as tf

    from spark_imagenet.training.worker.models.compile import decayed_kernels

    kernels = decayed_kernels(model)
    return lambda: tf.constant(WEIGHT_DECAY / 2, tf.float32) * tf.add_n([tf.reduce_sum(tf.square(k)) for k in kernels])


class Bare:
    """tf_keras alone: the registry's model, SGD + sparse cross-entropy, ``fit`` with no callbacks of ours.

    ``extra`` (for ``--ablate``) adds one thing of ours: one of :data:`ABLATIONS`.
    """

    def __init__(self, strategy, size: dict, batch, extra: str | None = None) -> None:
        import tensorflow as tf
        import tf_keras as keras

        from spark_imagenet.training.worker.models.registry import build_model

        self.size, self.extra = size, extra
        self.steps = size["steps"]
        scope = strategy.scope() if extra == "strategy" else contextlib.nullcontext()
        if extra == "generator dropout":
            keras.backend.experimental.enable_tf_random_generator()
        else:
            keras.backend.experimental.disable_tf_random_generator()
        with scope:
            self.model = build_model("alexnet", size["num_classes"], size["image_size"], size["width"])
            if extra == "L2 loss term":  # how weight decay was applied before DecayedSGD: a callable loss
                self.model.add_loss(_l2_term(self.model))
            # not ours: tf_keras' own decoupled decay (w -= lr * wd * w in the update), a cheaper alternative
            decoupled = WEIGHT_DECAY if extra == "decoupled weight decay" else None
            optimizer = keras.optimizers.SGD(self._rate(), momentum=0.9, weight_decay=decoupled)
            if extra == "weight decay":  # ours: the L2 gradient added inside the optimizer's step
                from spark_imagenet.training.worker.models.compile import decayed_kernels
                from spark_imagenet.training.worker.optimizers import DecayedSGD

                optimizer = DecayedSGD(self._rate(), momentum=0.9, weight_decay=WEIGHT_DECAY,
                                       decayed=decayed_kernels(self.model))
            self.model.compile(optimizer=optimizer,
                               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                               weighted_metrics=self._metrics())
            if extra == "normalization":  # ours: the batch of uint8 pixels normalized in the train step
                from spark_imagenet.training.worker.models.compile import normalize_in_steps

                normalize_in_steps(self.model)
                batch = one_batch(size, pixels=True)
        data = tf.data.Dataset.from_tensors(batch).repeat()
        self.data = (strategy.distribute_datasets_from_function(lambda ctx: data) if extra == "strategy" else data)
        self.callbacks = self._callbacks()
        self.clock = step_clock()

    def _rate(self):
        if self.extra != "schedule":
            return LEARNING_RATE
        from spark_imagenet.training.worker.keras_schedule import KerasSchedule
        from spark_imagenet.training.job.schedules import schedule_for

        return KerasSchedule(schedule_for(worker_spec(self.size, self.steps).config, self.steps))

    def _metrics(self):
        if self.extra != "metrics":
            return None
        import tf_keras as keras

        return [keras.metrics.SparseCategoricalAccuracy(name="top1"),
                keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5"),
                keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent")]

    def _callbacks(self) -> list:
        if self.extra != "callbacks":
            return []
        from spark_imagenet.training.job.config import DEFAULT_STEP_TIMEOUT_S
        from spark_imagenet.training.worker.watchdog import StepWatchdog
        from spark_imagenet.training.worker.training import _EpochProgress

        return [_EpochProgress(1, self.steps, self.size["batch_size"]),
                StepWatchdog(DEFAULT_STEP_TIMEOUT_S, 0, [])]

    def fit(self, warm: bool = False) -> tuple[float, float]:
        """One fit call; returns (wall, CPU) seconds per step."""
        self.model.fit(self.data, epochs=1, steps_per_epoch=WARMUP_STEPS if warm else self.steps, verbose=0,
                       callbacks=[*self.callbacks, self.clock])
        return self.clock.step_seconds()


def build_variants(strategy, size: dict, ablate: list[str]) -> dict:
    """Every variant of one size, by name, warmed up (one untimed fit call each)."""
    batch, pixels = one_batch(size), one_batch(size, pixels=True)
    variants = {"ours": Ours(strategy, size, pixels),
                "ours (bare settings)": Ours(strategy, size, pixels, **BARE_SETTINGS),
                "bare": Bare(strategy, size, batch)}
    for extra in ablate:
        variants[f"bare + {extra}"] = Bare(strategy, size, batch, extra)
    for variant in variants.values():
        variant.fit(warm=True)
    return variants


def measure_size(report: Report, strategy, name: str, args: argparse.Namespace, reps: int) -> None:
    """Interleaved repetitions of every variant at size ``name``; records per variant and the ratios."""
    size = size_settings(name, args)
    t0 = time.perf_counter()
    variants = build_variants(strategy, size, args.ablate)
    report.say(f"step: {name}: {size['image_size']} px, width {size['width']:g}, {size['num_classes']} classes, "
               f"batch {size['batch_size']}, {size['steps']} timed steps per fit call; built and warmed up "
               f"{len(variants)} variants in {time.perf_counter() - t0:.0f} s")
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(reps):
        for key, variant in variants.items():
            wall, used = variant.fit()
            seconds[key].append(wall)
            cpu[key].append(used)
    params = {"size": name, **size, "model": "alexnet", "reps_interleaved": list(variants),
              "alternative": "bare tf_keras fit: SGD(momentum 0.9) + SparseCategoricalCrossentropy, "
                             "no strategy, no metrics, no callbacks",
              "input": "ours: uint8 pixels, normalized in its train step; bare: float32, no normalization"}
    for key, values in seconds.items():
        report.add(f"{name}: {key}: ms per step", "ms", [v * 1000 for v in values], **params)
        report.add(f"{name}: {key}: images/s", "images/s", [size["batch_size"] / v for v in values], **params)
        report.add(f"{name}: {key}: CPU ms per step", "ms", [v * 1000 for v in cpu[key]], **params)
    for key in seconds:
        if key != "bare":
            report.ratio(f"{name}: {key} / bare: time per step", seconds[key], seconds["bare"],
                         limit=1.0, **params)
            report.ratio(f"{name}: {key} / bare: CPU time per step", cpu[key], cpu["bare"], limit=1.0, **params)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reps = repetitions(args)
    report = Report("step", args, extra_versions=("tf-keras",))
    from spark_imagenet.training.worker import strategy as worker

    # the strategy first, once: collectives are configured once per process (the worker builds it first too)
    first = worker_spec(size_settings(args.sizes[0], args), 2)
    worker.configure(first)
    strategy, _total, described = worker.build_strategy(first)
    report.say(f"step: our strategy: {first.config.scaling.strategy} ({type(strategy).__name__}), all-reduce "
               f"{described['all_reduce']}, {strategy.num_replicas_in_sync} replica; recipe: lr "
               f"{first.config.recipe.learning_rate:g} {first.config.recipe.lr_schedule} (warm-up {first.config.recipe.warmup_epochs:.3g} "
               f"epochs), momentum {first.config.recipe.momentum:g}, weight decay {first.config.recipe.weight_decay:g}, label "
               f"smoothing {first.config.recipe.label_smoothing:g}; limit of every ratio: 1.0 (no overhead)")
    for name in args.sizes:
        measure_size(report, strategy, name, args, reps)
    report.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
