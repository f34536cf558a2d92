"""The TensorFlow worker process of one barrier task: one worker of the job's strategy.

The strategy is ``config.strategy`` (docs/design.md, 'Strategies'):
``multiworker`` (MultiWorkerMirroredStrategy, every local GPU of the worker),
``mirrored`` (MirroredStrategy over every local GPU, one worker, no cluster)
or ``default`` (one device); the all-reduce is ``config.cross_device_ops``.

Usage::

    python -m spark_imagenet.training.worker [--preload ENV_JSON] WORKER_SPEC_JSON RESULT_JSON

The barrier task starts this in a fresh process (collectives can be configured
once per process: docs/design.md, 'One TensorFlow process per task') with
``TF_CONFIG`` naming every worker and ``TF_USE_LEGACY_KERAS=1`` (this module
also sets it, and ``TF_CPP_MIN_LOG_LEVEL=2``, as defaults before TensorFlow is
imported). Without ``TF_CONFIG`` the strategy has one worker, which tests use.
One worker may hold several replicas (one per local GPU).

Input: WORKER_SPEC_JSON, a :class:`~spark_imagenet.training.config.WorkerSpec`
(``to_json``); nothing else is read.

With ``--preload ENV_JSON`` (how the barrier task starts it: docs/design.md,
'Starting TensorFlow early, and a spare for the next job') the process first
imports TensorFlow and this package's training modules (:func:`preload`; no
strategy, no device, no op), then waits for one line ``run`` on its stdin (its
go; the end of stdin instead: exit 1 without a word). Only then does it read
ENV_JSON, a JSON object of environment variables known only after the
rendezvous (``TF_CONFIG``; ``TF_FORCE_GPU_ALLOW_GROWTH``), which it puts into
``os.environ`` before building the strategy (TensorFlow reads both then, not
at import), and then WORKER_SPEC_JSON.

What it does (:func:`run_worker`): threads and seed; the strategy, then one
all-gather of every worker's shared settings (a mismatch is a
:class:`TrainingError` instead of a hang in a collective); datasets through
``strategy.distribute_datasets_from_function`` with
:func:`spark_imagenet.training.pipeline.train_dataset` / ``eval_dataset``
(each worker reads only its own files); the model built and compiled inside
``strategy.scope()``; ``fit(epochs, steps_per_epoch)``; then
``evaluate(steps=val_steps)`` on ``(image, label, weight)`` batches whose
zero-weight padding rows do not count, so the metrics are exact over the real
validation examples of all workers.

Output: RESULT_JSON::

    {"rank": 0, "workers": 4, "replicas_in_sync": 4,
     "strategy": "multiworker", "all_reduce": "collective AUTO",
     "devices": ["/job:worker/replica:0/task:0/device:CPU:0"],   # this worker's replicas
     "train_examples": 150,        # examples in this worker's train shards
     "train_images": 288,          # images this worker trained on = steps * batch_size
     "steps": 18,                  # epochs * steps_per_epoch
     "batch_size": 16, "epochs": 2,
     "images_per_sec": 12.3,       # images/s of this worker over the timed epochs
     "timed_epochs": 1, "epoch_seconds": [14.2, 11.7], "train_seconds": 26.0,
     "train_loss": 4.1,            # last epoch's mean cross-entropy ("xent"), no weight decay
     "train_top1": 0.05,           # last epoch's top-1 accuracy (all workers)
     "val": {"images": 300, "top1": 0.2, "top5": 0.5, "loss": 3.9},
     "eval_seconds": 3.2,
     "history": {"loss": [...], "top1": [...], "top5": [...], "xent": [...]},
     "params": 1361252}

``images_per_sec`` leaves the first epoch out when there are several (it
includes tracing, the first collective handshakes and filling the pipeline);
``train_seconds`` is the whole ``fit``. ``train_loss`` and ``val.loss`` are
the cross-entropy without weight decay; ``history["loss"]`` is Keras'
objective with it. Metrics are summed over the workers by the strategy.

Exit status 0 with RESULT_JSON written; 1 on any failure, after one stderr
line ``worker rank R failed while STAGE: ExceptionType: message`` (data errors
inside ``fit``/``evaluate`` name the shard file and record, see
:func:`spark_imagenet.training.pipeline.naming_bad_records`); 2 on wrong usage.
Waiting for the other workers is bounded by ``startup_timeout_s``: the process
then exits 1 printing ``Timeout`` and its stack (docs/design.md, 'Waiting for
peers at start-up'). Parents should end it with SIGKILL.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import SparkImagenetError, TrainingError  # noqa: E402
from spark_imagenet.training.config import WorkerSpec  # noqa: E402
from spark_imagenet.training.checkpoints import CheckpointMeta  # noqa: E402
from spark_imagenet.training.outputs import LOCAL_OUTPUT_DIR, MODEL_FILE, TENSORBOARD_DIR  # noqa: E402
from spark_imagenet.training.watchdog import StepWatchdog  # noqa: E402

#: Settings every worker must agree on, as ``WorkerSpec`` attribute paths
#: (order matters: it is the all-gather layout).
SHARED_SETTINGS = ("workers", "steps_per_epoch", "val_steps", "config.epochs", "config.batch_size",
                   "config.image_size", "num_classes")

# Stages reported in the failure line.
STAGE_SPEC = "reading its spec"
STAGE_SETUP = "setting up TensorFlow (threads, seed)"
STAGE_STRATEGY = "building the strategy"
STAGE_DATA = "reading data"
STAGE_MODEL = "building the model"
STAGE_RESTORE = "restoring the checkpoint"
STAGE_FIT = "training (fit)"
STAGE_EVALUATE = "evaluating"
STAGE_OUTPUT = "saving the model for --output"
STAGE_RESULT = "writing the result"


def _setting(spec: WorkerSpec, path: str) -> Any:
    """``spec.<path>`` for a dotted attribute path such as ``"config.epochs"``."""
    value: Any = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


class _EpochProgress(keras.callbacks.Callback):
    """Records the wall seconds of each training epoch (``time.perf_counter``) and, when ``log`` is given (the
    chief), logs one line per epoch with our exact training metrics instead of Keras' own progress lines.

    The line, counting epochs from 1 as Keras does: ``Epoch E/N: S steps in T s, xent X, top1 A, top5 B,
    lr L, R images/s on this worker, ETA Q s`` (``xent``: the mean cross-entropy without weight decay; the
    ETA from the mean epoch time, the first epoch left out once there are two).

    Args:
        epochs: N, the epochs ``fit`` runs.
        steps: S, steps per epoch.
        batch_size: examples per step on this worker.
        log: called with each epoch's line; None logs nothing (the other ranks).
    """

    def __init__(self, epochs: int = 0, steps: int = 0, batch_size: int = 0,
                 log: Callable[[str], None] | None = None, summary_dir: str | None = None) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self._start = 0.0
        self._epochs, self._steps, self._batch, self._log = epochs, steps, batch_size, log
        self._writer = tf.summary.create_file_writer(summary_dir) if summary_dir else None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Start the clock of epoch ``epoch`` (0-based)."""
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Append the seconds since ``on_epoch_begin`` to :attr:`seconds`; log the epoch's line."""
        self.seconds.append(time.perf_counter() - self._start)
        if self._log is not None:
            self._log(self.line(epoch, logs or {}))
        if self._writer is not None:
            self._summarize(epoch, logs or {})

    def _summarize(self, epoch: int, logs: dict) -> None:
        """TensorBoard scalars of epoch ``epoch`` (0-based; step = epoch + 1): xent, top1, top5, learning rate,
        images/s on this worker."""
        seconds = self.seconds[-1]
        lr = self._learning_rate()
        with self._writer.as_default(step=epoch + 1):
            for key in ("xent", "top1", "top5"):
                if key in logs:
                    tf.summary.scalar(key, float(logs[key]))
            if lr is not None:
                tf.summary.scalar("learning_rate", lr)
            tf.summary.scalar("images_per_sec", self._steps * self._batch / seconds if seconds > 0 else 0.0)
        self._writer.flush()

    def _learning_rate(self) -> float | None:
        try:
            return float(keras.backend.get_value(self.model.optimizer.learning_rate))
        except Exception:  # noqa: BLE001 - a schedule object or no optimizer: leave it out
            return None

    def line(self, epoch: int, logs: dict) -> str:
        """The progress line of epoch ``epoch`` (0-based) from its Keras ``logs``."""
        seconds = self.seconds[-1]
        timed = self.seconds[1:] if len(self.seconds) > 1 else self.seconds
        eta = (self._epochs - epoch - 1) * (sum(timed) / len(timed))
        metrics = ", ".join(f"{k} {float(logs[k]):.4f}" for k in ("xent", "top1", "top5") if k in logs)
        lr = self._learning_rate()
        rate = self._steps * self._batch / seconds if seconds > 0 else 0.0
        return (f"Epoch {epoch + 1}/{self._epochs}: {self._steps} steps in {seconds:.1f} s, {metrics}"
                + (f", lr {lr:.4g}" if lr is not None else "")
                + f", {rate:.1f} images/s on this worker, ETA {eta:.0f} s")


def _num_workers(strategy: tf.distribute.Strategy) -> int:
    """Number of workers (chief + workers) in the strategy's cluster (1 without TF_CONFIG)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    n = len(spec.get("chief", [])) + len(spec.get("worker", []))
    return max(1, n)


def _gather_worker_settings(strategy: tf.distribute.Strategy, spec: WorkerSpec) -> dict[int, dict[str, int]]:
    """All-gather every worker's rank, shared settings and example counts.

    One collective, run at the same point on every worker right after the
    strategy is built: it checks that all workers are reachable and lets each
    check the others' settings before anything can hang on a mismatch.

    Returns:
        ``{rank: {"train_examples", "val_examples", *SHARED_SETTINGS}}`` for
        every worker (rows of a worker's several local replicas are merged).
    """
    keys = ("rank", "train_examples", "val_examples") + SHARED_SETTINGS
    local = tf.constant([[_setting(spec, k) for k in keys]], dtype=tf.int64)

    @tf.function
    def gather() -> Any:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_gather(local, axis=0))

    rows = strategy.experimental_local_results(gather())[0].numpy()
    return {int(row[0]): dict(zip(keys[1:], (int(v) for v in row[1:]))) for row in rows}


def _check_workers(spec: WorkerSpec, workers: dict[int, dict[str, int]]) -> int:
    """Check the gathered settings agree; return the total real val examples.

    Raises:
        TrainingError: ranks missing or duplicated, or a shared setting differs
            between workers (which would make the collectives hang).
    """
    if sorted(workers) != list(range(spec.workers)):
        raise TrainingError(
            f"the MWMS workers report ranks {sorted(workers)} but the spec says workers = {spec.workers}: "
            f"each worker needs a distinct rank 0..{spec.workers - 1}"
        )
    for key in SHARED_SETTINGS:
        values = {rank: w[key] for rank, w in workers.items()}
        if len(set(values.values())) > 1:
            name = key.rpartition(".")[2]
            raise TrainingError(
                f"workers disagree on {name}: {values} (rank: value); every worker must use the same "
                f"{name} or the synchronous training hangs"
            )
    total = sum(w["val_examples"] for w in workers.values())
    if spec.val_examples_total != total:
        raise TrainingError(
            f"val_examples_total in the spec is {spec.val_examples_total} but the workers' val_examples add up "
            f"to {total}"
        )
    return total


def _check_files(files: list[str], what: str) -> None:
    """Raise TrainingError naming the first file in ``files`` that does not exist."""
    for path in files:
        if not tf.io.gfile.exists(path):
            raise TrainingError(f"{what} shard {path} does not exist on this worker; it should have been staged here")


def _no_autotune_on_device_datasets() -> bool:
    """Turn tf.data autotuning off on the per-device datasets of MultiWorkerMirroredStrategy.

    Wraps TensorFlow's private ``multi_device_iterator_ops._create_device_dataset``
    (TF 2.21) to apply ``autotune.enabled = False``; where that function does
    not exist, does nothing. Why: docs/design.md, 'The tf.data autotune stall'.

    Returns:
        bool: whether the wrapper is installed.
    """
    from tensorflow.python.data.ops import multi_device_iterator_ops as mdi

    create = getattr(mdi, "_create_device_dataset", None)
    if create is None or getattr(create, "_spark_imagenet", False):
        return create is not None

    def create_without_autotune(*args, **kwargs):
        options = tf.data.Options()
        options.autotune.enabled = False
        return create(*args, **kwargs).with_options(options)

    create_without_autotune._spark_imagenet = True
    mdi._create_device_dataset = create_without_autotune
    return True


def _configure(spec: WorkerSpec) -> None:
    """Threads and seed: before TensorFlow's runtime starts (before the strategy)."""
    if spec.threads:
        tf.config.threading.set_intra_op_parallelism_threads(spec.threads)
        tf.config.threading.set_inter_op_parallelism_threads(spec.threads)
    # Per-worker seed (dropout, augmentation); the initial weights are
    # broadcast from the chief by MWMS, so they agree anyway.
    keras.utils.set_random_seed(spec.seed)
    # Dropout draws from a tf.random.Generator, whose state is a variable: checkpoints hold it, so a resumed
    # run draws the masks an uninterrupted one would (Keras' legacy stateful ops restart their streams).
    keras.backend.experimental.enable_tf_random_generator()
    if spec.config.deterministic:
        tf.config.experimental.enable_op_determinism()


#: The TensorFlow strategy each ``--strategy`` builds (named in the log line).
_STRATEGY_CLASS = {"multiworker": "MultiWorkerMirroredStrategy", "mirrored": "MirroredStrategy",
                   "default": "the default strategy"}
#: ``--cross-device-ops`` of MultiWorkerMirroredStrategy: its collective implementation.
_MWMS_IMPLEMENTATION = {"auto": "AUTO", "nccl": "NCCL", "ring": "RING"}


def _make_strategy(spec: WorkerSpec) -> tuple[tf.distribute.Strategy, str]:
    """The strategy ``spec.config.strategy`` names, with its all-reduce; and a description of that all-reduce.

    ``multiworker``: ``MultiWorkerMirroredStrategy`` (cluster from
    ``TF_CONFIG``; every local GPU of this worker, else its CPU) with
    ``CommunicationOptions(implementation=AUTO|NCCL|RING)``. ``mirrored``:
    ``MirroredStrategy`` over every local GPU (the CPU if none) with
    ``cross_device_ops`` ``NcclAllReduce()``, ``ReductionToOneDevice()`` or
    None (auto: TensorFlow's choice). ``default``: ``tf.distribute.get_strategy()``,
    one device, no all-reduce. The one-worker strategies drop an inherited
    ``TF_CONFIG`` (they have no cluster).

    Raises:
        TrainingError: ``mirrored`` with ``nccl`` on a worker that sees no GPU.
    """
    config = spec.config
    ops = config.cross_device_ops
    if config.strategy == "multiworker":
        implementation = getattr(tf.distribute.experimental.CommunicationImplementation, _MWMS_IMPLEMENTATION[ops])
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        return strategy, f"collective {implementation.name}"
    os.environ.pop("TF_CONFIG", None)
    if config.strategy == "default":
        return tf.distribute.get_strategy(), "none (one device)"
    gpus = tf.config.list_physical_devices("GPU")  # does not start the runtime
    if ops == "nccl" and not gpus:
        raise TrainingError("cross_device_ops (--cross-device-ops) nccl needs GPUs, but this worker sees none "
                            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); use auto or "
                            "reduction-to-one on CPU")
    cross = {"auto": None, "nccl": tf.distribute.NcclAllReduce,
             "reduction-to-one": tf.distribute.ReductionToOneDevice}[ops]
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=cross() if cross else None)
    if cross is not None:
        return strategy, cross.__name__
    # TensorFlow's choice for auto (a private attribute of TF 2.21's MirroredExtended; read only when present)
    chosen = getattr(strategy.extended, "_inferred_cross_device_ops", None)
    return strategy, f"auto ({type(chosen).__name__})" if chosen is not None else "auto"


def _strategy_devices(strategy: tf.distribute.Strategy) -> list[str]:
    """The devices of this worker's replicas (``extended.worker_devices``; the default strategy's one device)."""
    try:
        return [str(d) for d in strategy.extended.worker_devices]
    except RuntimeError:  # the default strategy has no worker_devices: its one device is TF's first choice
        gpus = tf.config.list_logical_devices("GPU")
        return [gpus[0].name if gpus else tf.config.list_logical_devices("CPU")[0].name]


def _build_strategy(spec: WorkerSpec, log: Callable[[str], None]) -> tuple[tf.distribute.Strategy, int, dict]:
    """The strategy, once every worker is up and agrees; returns it, the total val examples and its description.

    The description is ``{"strategy", "all_reduce", "devices"}`` (put into
    the result). The one-worker strategies (``mirrored``, ``default``) need no
    all-gather: this worker's settings are the only ones.

    Raises:
        TrainingError: TF_CONFIG's cluster size differs from the spec, or the
            workers disagree (see :func:`_check_workers`).
    """
    t0 = time.perf_counter()
    timeout = spec.startup_timeout_s
    multiworker = spec.config.strategy == "multiworker"
    if spec.workers > 1:
        limit = f"at most {timeout:g} s" if timeout > 0 else "no time limit"
        log(f"strategy: waiting for {spec.workers} worker(s) ({limit})")
    if timeout > 0:
        # A C-level watchdog: the strategy blocks holding the GIL (docs/design.md, 'Waiting for peers at start-up').
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.stderr)
    try:
        strategy, all_reduce = _make_strategy(spec)
        cluster_workers = _num_workers(strategy)
        if cluster_workers != spec.workers:
            raise TrainingError(
                f"TF_CONFIG describes {cluster_workers} worker(s) but the worker spec says workers = {spec.workers}"
            )
        if multiworker:
            gathered = _gather_worker_settings(strategy, spec)
        else:
            keys = ("train_examples", "val_examples") + SHARED_SETTINGS
            gathered = {spec.rank: {k: int(_setting(spec, k)) for k in keys}}
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()
    val_total = _check_workers(spec, gathered)
    devices = _strategy_devices(strategy)
    log(
        f"strategy: {spec.config.strategy} ({_STRATEGY_CLASS[spec.config.strategy]}), {cluster_workers} worker(s), "
        f"{strategy.num_replicas_in_sync} replica(s) in sync on {', '.join(devices)}; all-reduce {all_reduce}; "
        f"{time.perf_counter() - t0:.1f} s; threads {spec.threads or 'default'}"
    )
    return strategy, val_total, {"strategy": spec.config.strategy, "all_reduce": all_reduce, "devices": devices}


def _datasets(strategy: tf.distribute.Strategy, spec: WorkerSpec, initial_epoch: int = 0) -> tuple[Any, Any]:
    """The distributed train dataset, from epoch ``initial_epoch`` (0-based) on, and the val dataset (None
    without val steps). Each epoch's batches depend only on the worker's files, its seed and the epoch
    (:func:`~spark_imagenet.training.pipeline.train_dataset`), so a resumed run sees the batches of an
    uninterrupted one.

    Raises:
        TrainingError: a shard file is missing.
    """
    from spark_imagenet.training import pipeline

    _check_files(spec.train_files, "train")
    _check_files(spec.val_files, "val")
    config = spec.config
    global_batch = config.global_batch_size

    def train_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # each local replica takes one batch per step: an epoch is steps x this worker's batch records
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        local_replicas = max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        return pipeline.train_dataset(list(spec.train_files), per_replica, config.image_size, spec.parallel,
                                      seed=spec.seed,
                                      records_per_epoch=spec.steps_per_epoch * per_replica * local_replicas,
                                      initial_epoch=initial_epoch, epochs=config.epochs,
                                      deterministic=config.deterministic, flip=config.flip,
                                      crop_area=config.crop_area, lighting=config.lighting)

    def eval_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # Each local replica takes one batch per step from this worker's dataset.
        local_replicas = max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        return pipeline.eval_dataset(list(spec.val_files), ctx.get_per_replica_batch_size(global_batch),
                                     config.image_size, spec.parallel, record_shard=spec.val_record_shard,
                                     examples=spec.val_examples, steps=spec.val_steps * local_replicas)

    _no_autotune_on_device_datasets()
    train_ds = strategy.distribute_datasets_from_function(train_fn)
    val_ds = strategy.distribute_datasets_from_function(eval_fn) if spec.val_steps > 0 else None
    return train_ds, val_ds


def _build_model(strategy: tf.distribute.Strategy, spec: WorkerSpec) -> keras.Model:
    """The compiled model, built inside the strategy's scope.

    In order: Keras' global precision policy ``config.precision``; the model; its logits cast to float32
    (:func:`~spark_imagenet.training.models.compile.float32_logits`); compiled with the config's optimizer,
    momentum, weight decay, label smoothing and ``jit_compile``, at the learning rate of its schedule (a function
    of the optimizer's step count, which checkpoints restore: a resumed run goes on exactly).
    """
    from spark_imagenet.training.models.compile import float32_logits, set_precision
    from spark_imagenet.training.models.registry import build_model, compile_model

    from spark_imagenet.training.keras_schedule import KerasSchedule
    from spark_imagenet.training.schedules import schedule_for

    config = spec.config
    schedule = schedule_for(config, spec.steps_per_epoch)
    plain = schedule.kind == "constant" and schedule.warmup_steps == 0
    set_precision(config.precision)
    with strategy.scope():
        model = float32_logits(build_model(config.model, spec.num_classes, config.image_size, config.width))
        compile_model(model, schedule.peak if plain else KerasSchedule(schedule), optimizer=config.optimizer,
                      momentum=config.momentum, weight_decay=config.weight_decay,
                      label_smoothing=config.label_smoothing, jit_compile=config.jit_compile)
    return model


def _fit(model: keras.Model, train_ds: Any, spec: WorkerSpec, log: Callable[[str], None],
         summary_dir: str | None = None, initial_epoch: int = 0,
         callbacks: Sequence[keras.callbacks.Callback] = (),
         earlier: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Train epochs ``initial_epoch + 1 .. epochs``; return the result fields about training.

    The chief writes TensorBoard scalars to ``summary_dir``. ``earlier`` is the history of the epochs a
    checkpoint already holds; the returned ``history`` covers every epoch, and ``steps``/``train_images``
    count only the steps this run made.
    """
    from spark_imagenet.training import pipeline

    config = spec.config
    # one progress stream: the chief logs our epoch lines; Keras' own per-rank lines are off
    chief = spec.rank == 0
    timer = _EpochProgress(config.epochs, spec.steps_per_epoch, config.batch_size, log if chief else None,
                           summary_dir if chief else None)
    t0 = time.perf_counter()
    hist = {k: list(v) for k, v in (earlier or {}).items()}
    if initial_epoch < config.epochs:
        with pipeline.naming_bad_records(list(spec.train_files), parallel=spec.parallel):
            history = model.fit(train_ds, epochs=config.epochs, initial_epoch=initial_epoch,
                                steps_per_epoch=spec.steps_per_epoch, callbacks=[timer, *callbacks], verbose=0)
        for k, vals in history.history.items():
            hist.setdefault(k, []).extend(float(v) for v in vals)
    train_seconds = time.perf_counter() - t0
    steps = (config.epochs - initial_epoch) * spec.steps_per_epoch
    timed = timer.seconds[1:] if len(timer.seconds) > 1 else timer.seconds
    images = spec.steps_per_epoch * config.batch_size * len(timed)
    images_per_sec = images / sum(timed) if timed and sum(timed) > 0 else 0.0
    log(
        f"train: {steps} steps, {steps * config.batch_size} images in {train_seconds:.1f} s; "
        f"{images_per_sec:.1f} images/s on this worker over {len(timed)} epoch(s)"
        + (" (first epoch excluded)" if len(timer.seconds) > 1 else "")
    )
    last = {k: (v[-1] if v else None) for k, v in hist.items()}
    return {"train_images": steps * config.batch_size, "steps": steps, "images_per_sec": images_per_sec,
            "timed_epochs": len(timed), "epoch_seconds": timer.seconds, "train_seconds": train_seconds,
            "train_loss": last.get("xent"), "train_top1": last.get("top1"), "history": hist,
            "initial_epoch": initial_epoch}


def _evaluate(model: keras.Model, val_ds: Any, spec: WorkerSpec, val_total: int,
              log: Callable[[str], None],
              callbacks: Sequence[keras.callbacks.Callback] = ()) -> tuple[dict[str, Any], float]:
    """Exact top-1/top-5/loss over all workers' validation examples; and the seconds it took. ``callbacks``
    (the step watchdog) see the evaluation's batches."""
    from spark_imagenet.training import pipeline

    val: dict[str, Any] = {"images": val_total, "top1": None, "top5": None, "loss": None}
    if val_ds is None:
        log("val: no validation data (val_steps = 0)")
        return val, 0.0
    t0 = time.perf_counter()
    with pipeline.naming_bad_records(list(spec.val_files), parallel=spec.parallel):
        # verbose=0: Keras' line would show its "loss", diluted by the zero-weight padding rows; we log the exact one
        scores = model.evaluate(val_ds, steps=spec.val_steps, return_dict=True, verbose=0, callbacks=list(callbacks))
    seconds = time.perf_counter() - t0
    val.update(top1=float(scores["top1"]), top5=float(scores["top5"]), loss=float(scores["xent"]))
    if spec.rank == 0:  # the same global numbers on every rank: one line
        log(f"val: {val_total} images, top1 {val['top1']:.4f}, top5 {val['top5']:.4f}, "
            f"loss {val['loss']:.4f} ({seconds:.1f} s)")
    return val, seconds


def run_worker(spec: WorkerSpec, *, log: Callable[[str], None] | None = None,
               status: dict | None = None, output_dir: str | None = None) -> dict[str, Any]:
    """Train and evaluate one MWMS worker; return its result dict.

    Must run in a process that has not built a distribution strategy before.
    ``TF_CONFIG`` in the environment names the cluster; without it this is the
    only worker.

    Args:
        spec: this worker's spec.
        log: called with one progress line at a time; default: print to stdout and flush.
        status: optional dict; ``status["stage"]`` is kept set to the stage
            being run (one of the ``STAGE_*`` strings).
        output_dir: with ``config.output`` set, the local folder where the
            chief puts ``model.keras`` and ``tensorboard/`` for its task to publish
            (a temporary folder when None).

    Returns:
        The RESULT_JSON object (see the module docstring).

    Raises:
        TrainingError: the workers disagree on shared settings, the cluster
            size differs from ``workers``, or a shard file is missing.
        tf.errors.OpError and others: from TensorFlow while reading data,
            training or evaluating (MWMS aborts a worker whose peer died).
    """
    if log is None:
        def log(line: str) -> None:
            print(line, flush=True)
    status = {} if status is None else status
    config = spec.config
    status["stage"] = STAGE_SETUP
    _configure(spec)
    status["stage"] = STAGE_STRATEGY
    strategy, val_total, described = _build_strategy(spec, log)
    status["stage"] = STAGE_MODEL
    model = _build_model(strategy, spec)
    params = int(model.count_params())
    if spec.rank == 0:  # the same model on every rank: one line
        from spark_imagenet.training.models.compile import describe_compiled

        log(f"model: {config.model} width {config.width:g}, {params:,} parameters, {spec.num_classes} classes; "
            f"{describe_compiled(model)}")
    earlier = None
    if spec.restore is not None:
        status["stage"] = STAGE_RESTORE
        earlier = _restore(model, strategy, spec, log)
    initial_epoch = earlier.epoch if earlier is not None else 0
    status["stage"] = STAGE_DATA
    train_ds, val_ds = _datasets(strategy, spec, initial_epoch)
    log(f"data: {len(spec.train_files)} train file(s), {spec.train_examples} examples; "
        f"{len(spec.val_files)} val file(s), {spec.val_examples} of {val_total} val examples; "
        f"batch {config.batch_size}/worker, {config.image_size} px")
    local_output = output_dir if config.output else None
    status["stage"] = STAGE_FIT
    watchdog = StepWatchdog(config.step_timeout, spec.rank, list(spec.peers))
    callbacks: list[keras.callbacks.Callback] = [watchdog]
    if config.checkpoint_dir is not None:
        callbacks.append(_saver(spec, earlier, log, watchdog.feed))
    trained = _fit(model, train_ds, spec, log,
                   os.path.join(local_output, TENSORBOARD_DIR, "train") if local_output else None,
                   initial_epoch, callbacks, earlier.history if earlier is not None else None)
    status["stage"] = STAGE_EVALUATE
    val, eval_seconds = _evaluate(model, val_ds, spec, val_total, log, [watchdog])
    if config.output:
        status["stage"] = STAGE_OUTPUT
        _save_outputs(model, spec, val, local_output)
    return {"rank": spec.rank, "workers": spec.workers, "replicas_in_sync": int(strategy.num_replicas_in_sync),
            "train_examples": spec.train_examples, "batch_size": config.batch_size, "epochs": config.epochs,
            **described, **trained, "val": val, "eval_seconds": eval_seconds, "params": params}


def _restore(model: keras.Model, strategy: tf.distribute.Strategy, spec: WorkerSpec,
             log: Callable[[str], None]) -> CheckpointMeta:
    """Load ``spec.restore`` into ``model``; the chief logs where training resumes. Returns its meta."""
    from spark_imagenet.training import checkpoints
    from spark_imagenet.training.checkpointing import restore

    meta = restore(model, strategy, spec.restore)
    if spec.rank == 0:
        epochs = spec.config.epochs
        if meta.epoch >= epochs:
            log(f"checkpoint: {checkpoints.describe(meta)} is the run's last ({epochs} epoch(s)): nothing left to "
                "train; evaluating it")
        else:
            log(f"resumed at epoch {meta.epoch + 1} of {epochs} from {checkpoints.describe(meta)}")
    return meta


def _saver(spec: WorkerSpec, earlier: CheckpointMeta | None, log: Callable[[str], None],
           feed: Callable[[], None]) -> keras.callbacks.Callback:
    """The callback that writes a checkpoint after every epoch (the chief commits it to ``checkpoint_dir``)."""
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training import checkpoints
    from spark_imagenet.training.checkpointing import CheckpointSaver

    config = spec.config
    meta = checkpoints.new_meta(config, spec.dataset_id, spec.num_classes, spec.steps_per_epoch,
                                earlier.history if earlier is not None else {})
    return CheckpointSaver(meta, lambda: open_storage(config.checkpoint_dir, **(spec.checkpoint_options or {})),
                           spec.rank == 0, spec.steps_per_epoch, log, feed)


def _save_outputs(model: keras.Model, spec: WorkerSpec, val: dict[str, Any], local: str | None) -> None:
    """Save the model on every rank (MultiWorkerMirroredStrategy wants all workers to take part): the chief's
    ``model.keras`` and its validation scalars into ``local``, which its barrier task then publishes to
    ``--output`` (:func:`spark_imagenet.training.barrier_task.publish_output`); the other ranks' copies go to a
    temporary folder."""
    chief = spec.rank == 0
    folder = local if chief and local else tempfile.mkdtemp(prefix="spark-imagenet-save-")
    os.makedirs(folder, exist_ok=True)
    model.save(os.path.join(folder, MODEL_FILE))
    if not chief or val.get("top1") is None:
        return
    writer = tf.summary.create_file_writer(os.path.join(folder, TENSORBOARD_DIR, "validation"))
    with writer.as_default(step=spec.config.epochs):
        for key, name in (("loss", "xent"), ("top1", "top1"), ("top5", "top5")):
            tf.summary.scalar(name, float(val[key]))
    writer.close()


def _one_line(exc: BaseException, peers: Sequence[str] = ()) -> str:
    """A one-line description of ``exc`` for stderr.

    A :class:`SparkImagenetError` message is kept whole. Other messages keep
    their informative lines joined with " | " (at most 2000 characters):
    TensorFlow's "Graph execution error" header, the "Detected at node"
    Python stack and the ``[[{{node ...}}]]`` context are dropped. A
    collective aborted because a peer is gone gets a hint to look at the
    other workers' logs.
    """
    message = str(exc)
    if isinstance(exc, SparkImagenetError):
        return f"{type(exc).__name__}: {message}"
    skip = ("[[", "Executing op", "Graph execution error", "Detected at node", 'File "', "<stack traces unavailable>")
    lines = [ln.strip() for ln in message.splitlines()]
    message = " | ".join(ln for ln in lines if ln and not ln.startswith(skip))
    if len(message) > 2000:
        message = message[:2000] + " ..."
    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.DeadlineExceededError)):
        lost = lost_peers(str(exc), peers)
        message = (f"{lost}; TensorFlow: {message}" if lost else
                   message + " (another worker probably failed or became unreachable: see the other workers' "
                             "messages)")
    return f"{type(exc).__name__}: {message}"


def lost_peers(message: str, peers: Sequence[str] = ()) -> str | None:
    """Who is missing, from the text of a collective that TensorFlow's coordination service aborted.

    The service (on the chief) fails every worker's collectives about 10 s after a worker stops sending
    heartbeats (killed, SIGSTOPped, its machine gone) with "The following tasks are unhealthy (stopped
    sending heartbeats): /job:worker/replica:0/task:R ..."; when the chief itself stops, the others' heartbeat
    RPC times out ("Deadline Exceeded ... CoordinationService/Heartbeat"). docs/design.md, 'No hangs'.

    Args:
        message: the error's text.
        peers: every worker's ``host:port`` in rank order (named beside each rank when given).

    Returns:
        ``"rank 1 (HOST:PORT) stopped sending heartbeats (stopped, killed or unreachable)"``, the chief's
        case, or None.
    """
    def name(r: int) -> str:
        return f"rank {r} ({peers[r]})" if 0 <= r < len(peers) else f"rank {r}"

    if "stopped sending heartbeats" in message:
        tail = message.split("stopped sending heartbeats", 1)[1]
        ranks = sorted({int(r) for r in re.findall(r"/job:worker/replica:\d+/task:(\d+)", tail)})
        if ranks:
            who = ", ".join(name(r) for r in ranks)
            return f"{who} stopped sending heartbeats (stopped, killed or unreachable)"
    if "CoordinationService/Heartbeat" in message:
        return (f"the chief, {name(0)}, which runs TensorFlow's coordination service, does not answer heartbeats "
                "(stopped, killed or unreachable)")
    return None


def _write_json_atomic(path: str, obj: dict) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (``LocalStorage.write_bytes``)."""
    from spark_imagenet.storage import LocalStorage

    target = os.path.abspath(path)
    LocalStorage(os.path.dirname(target)).write_bytes(
        os.path.basename(target), (json.dumps(obj, indent=1) + "\n").encode("utf-8")
    )


#: The modules the training imports lazily, imported by :func:`preload` before the go.
PRELOADED_MODULES = ("spark_imagenet.training.pipeline", "spark_imagenet.training.models.compile",
                     "spark_imagenet.training.models.registry", "spark_imagenet.training.keras_schedule",
                     "spark_imagenet.training.schedules", "spark_imagenet.training.checkpoints",
                     "spark_imagenet.training.checkpointing", "spark_imagenet.storage")


def preload() -> None:
    """Import :data:`PRELOADED_MODULES` (TensorFlow and tf-keras are imported with this module): what the
    training would import anyway, without building a strategy or touching a device."""
    import importlib

    for name in PRELOADED_MODULES:
        importlib.import_module(name)


def _await_go(env_path: str) -> bool:
    """:func:`preload`, wait for the ``run`` line on stdin, then set the environment variables of the JSON
    object at ``env_path``. Returns False on the end of stdin (no go).

    Raises:
        OSError, ValueError: ``env_path`` unreadable, or not an object of strings.
    """
    preload()
    if sys.stdin.readline().strip() != "run":
        return False
    with open(env_path, encoding="utf-8") as f:
        environ = json.load(f)
    if not isinstance(environ, dict) or not all(isinstance(v, str) for v in environ.values()):
        raise ValueError(f"{env_path}: not a JSON object of strings")
    os.environ.update(environ)
    return True


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``python -m spark_imagenet.training.worker [--preload ENV_JSON] WORKER_SPEC_JSON
    RESULT_JSON``.

    Returns:
        0 on success (RESULT_JSON written), 1 on any failure (one line on
        stderr, see the module docstring; the full traceback too with
        ``SPARK_IMAGENET_DEBUG=1``) and on a ``--preload`` process's stdin
        ending without a go (silently), 2 on wrong usage.
    """
    argv = sys.argv[1:] if argv is None else argv
    env_path = None
    if len(argv) == 4 and argv[0] == "--preload":
        env_path, argv = argv[1], argv[2:]
    if len(argv) != 2:
        print("usage: python -m spark_imagenet.training.worker [--preload ENV_JSON] WORKER_SPEC_JSON RESULT_JSON",
              file=sys.stderr, flush=True)
        return 2
    spec_path, result_path = argv
    status = {"stage": STAGE_SPEC}
    rank: Any = "?"
    try:
        if env_path is not None and not _await_go(env_path):
            return 1
        with open(spec_path, encoding="utf-8") as f:
            data = json.load(f)
        if isinstance(data, dict):
            rank = data.get("rank", "?")
        spec = WorkerSpec.from_json(data, f"worker spec {spec_path}")
        status["peers"] = spec.peers
        output_dir = os.path.join(os.path.dirname(os.path.abspath(result_path)), LOCAL_OUTPUT_DIR)
        result = run_worker(spec, status=status, output_dir=output_dir)
        status["stage"] = STAGE_RESULT
        _write_json_atomic(result_path, result)
    except BaseException as exc:  # noqa: BLE001 - report everything, including KeyboardInterrupt
        peers = status.get("peers", ())
        print(f"worker rank {rank} failed while {status['stage']}: {_one_line(exc, peers)}", file=sys.stderr,
              flush=True)
        if os.environ.get("SPARK_IMAGENET_DEBUG"):
            import traceback

            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.stdout.reconfigure(line_buffering=True)  # progress lines reach the parent as they happen
    except (AttributeError, ValueError):
        pass
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit without interpreter teardown: TensorFlow's gRPC server and the MWMS
    # health-check thread can block or crash a normal shutdown after training.
    os._exit(code)
