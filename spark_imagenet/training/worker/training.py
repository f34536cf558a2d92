"""One TensorFlow worker's training: datasets, model, ``fit``, evaluation, checkpoints and ``--output``
(:func:`run_worker`; the strategy: :mod:`spark_imagenet.training.worker.strategy`, the process's entry:
:mod:`spark_imagenet.training.worker.main`).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any, Callable, Sequence

import tensorflow as tf
import tf_keras as keras

from spark_imagenet.errors import TrainingError
from spark_imagenet.training.job.checkpoints import CheckpointMeta
from spark_imagenet.training.job.outcome import LostPeer, ValMetrics, WorkerResult
from spark_imagenet.training.job.outputs import MODEL_FILE, TENSORBOARD_DIR
from spark_imagenet.training.job.plan import WorkerSpec
from spark_imagenet.training.worker.strategy import STAGE_STRATEGY, build_strategy, configure, startup_report
from spark_imagenet.training.worker import tf_internals
from spark_imagenet.training.worker.watchdog import StepWatchdog

logger = logging.getLogger(__name__)

# Stages reported in the failure line.
STAGE_SPEC = "reading its spec"
STAGE_SETUP = "setting up TensorFlow (threads, seed)"
STAGE_DATA = "reading data"
STAGE_MODEL = "building the model"
STAGE_RESTORE = "restoring the checkpoint"
STAGE_FIT = "training (fit)"
STAGE_EVALUATE = "evaluating"
STAGE_OUTPUT = "saving the model for --output"
STAGE_RESULT = "writing the result"


class _EpochProgress(keras.callbacks.Callback):
    """Records the wall seconds of each training epoch (``time.perf_counter``) and, with ``log_epochs`` (the
    chief), logs one line per epoch with our exact training metrics instead of Keras' own progress lines.

    The line, counting epochs from 1 as Keras does: ``Epoch E/N: S steps in T s, xent X, top1 A, top5 B,
    lr L, R images/s on this worker, ETA Q s`` (``xent``: the mean cross-entropy without weight decay; the
    ETA from the mean epoch time, the first epoch left out once there are two).

    Args:
        epochs: N, the epochs ``fit`` runs.
        steps: S, steps per epoch (:attr:`steps`, set to the remaining steps while an epoch a checkpoint stopped
            inside is finished).
        batch_size: examples per step on this worker.
        log_epochs: log (INFO) each epoch's line; False logs nothing (the other ranks).
        summary_dir: the chief's TensorBoard folder for each epoch's scalars (:meth:`scalars`), or None.
        tracker: the chief's MLflow sender (:class:`~spark_imagenet.training.worker.tracking.EpochMetricsSender`),
            handed the same scalars, or None.
    """

    def __init__(self, epochs: int = 0, steps: int = 0, batch_size: int = 0,
                 log_epochs: bool = False, summary_dir: str | None = None, tracker: Any = None) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self.counted: list[int] = []  # the steps of each epoch in seconds
        self._start = 0.0
        self._epochs, self.steps, self._batch, self._log_epochs = epochs, steps, batch_size, log_epochs
        self._writer = tf.summary.create_file_writer(summary_dir) if summary_dir else None
        self._tracker = tracker

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Start the clock of epoch ``epoch`` (0-based)."""
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Append the seconds since ``on_epoch_begin`` to :attr:`seconds`; log the epoch's line; add
        ``learning_rate`` and ``images_per_sec`` to ``logs`` (so to the history); hand :meth:`scalars` to
        TensorBoard and the MLflow sender."""
        self.seconds.append(time.perf_counter() - self._start)
        self.counted.append(self.steps)
        if self._log_epochs:
            logger.info(self.line(epoch, logs or {}))
        scalars = self.scalars(logs or {})
        if isinstance(logs, dict):  # into the history (Keras' History comes after us), checkpoints and results
            logs.update({k: scalars[k] for k in ("learning_rate", "images_per_sec") if k in scalars})
        if self._writer is not None:
            with self._writer.as_default(step=epoch + 1):
                for key, value in scalars.items():
                    tf.summary.scalar(key, value)
            self._writer.flush()
        if self._tracker is not None:
            self._tracker.epoch(epoch + 1, scalars)

    def scalars(self, logs: dict) -> dict[str, float]:
        """The last epoch's scalars (TensorBoard's and MLflow's; step = the epoch from 1): ``xent``, ``top1``,
        ``top5`` from its Keras ``logs``, ``learning_rate`` and ``images_per_sec`` on this worker."""
        seconds = self.seconds[-1]
        out = {key: float(logs[key]) for key in ("xent", "top1", "top5") if key in logs}
        lr = self._learning_rate()
        if lr is not None:
            out["learning_rate"] = lr
        out["images_per_sec"] = self.steps * self._batch / seconds if seconds > 0 else 0.0
        return out

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
        rate = self.steps * self._batch / seconds if seconds > 0 else 0.0
        return (f"Epoch {epoch + 1}/{self._epochs}: {self.steps} steps in {seconds:.1f} s, {metrics}"
                + (f", lr {lr:.4g}" if lr is not None else "")
                + f", {rate:.1f} images/s on this worker, ETA {eta:.0f} s")


def _check_files(files: list[str], what: str) -> None:
    """Raise TrainingError naming the first file in ``files`` that does not exist."""
    for path in files:
        if not tf.io.gfile.exists(path):
            raise TrainingError(f"{what} shard {path} does not exist on this worker; it should have been staged here")


def _datasets(strategy: tf.distribute.Strategy, spec: WorkerSpec, initial_epoch: int = 0) -> tuple[Any, Any]:
    """The distributed train dataset, from epoch ``initial_epoch`` (0-based) on (:func:`_train_stream`), and the
    val dataset (None without val steps).

    Raises:
        TrainingError: a shard file is missing.
    """
    from spark_imagenet.training.worker import pipeline

    _check_files(spec.train_files, "train")
    _check_files(spec.val_files, "val")
    config = spec.config
    global_batch = config.global_batch_size

    def eval_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # Each local replica takes one batch per step from this worker's dataset.
        local_replicas = max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        return pipeline.eval_dataset(list(spec.val_files), ctx.get_per_replica_batch_size(global_batch),
                                     config.recipe.image_size, spec.parallel, record_shard=spec.val_record_shard,
                                     examples=spec.val_examples, steps=spec.val_steps * local_replicas)

    tf_internals.no_autotune_on_device_datasets()  # why: docs/design.md, 'The tf.data autotune stall'
    train_ds = _train_stream(strategy, spec, initial_epoch)
    val_ds = strategy.distribute_datasets_from_function(eval_fn) if spec.val_steps > 0 else None
    return train_ds, val_ds


def _train_stream(strategy: tf.distribute.Strategy, spec: WorkerSpec, initial_epoch: int, skip_steps: int = 0,
                  epochs: int | None = None) -> Any:
    """The distributed train dataset: epochs ``initial_epoch`` .. ``epochs`` (default the run's), the first
    without its first ``skip_steps`` steps (a resume inside it). Each epoch's batches depend only on the
    worker's files, its seed and the epoch (:func:`~spark_imagenet.training.worker.pipeline.train_dataset`), so
    a resumed run sees the batches of an uninterrupted one."""
    from spark_imagenet.training.worker import pipeline

    config = spec.config

    def train_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # each local replica takes one batch per step: an epoch is steps x this worker's batch records
        per_replica = ctx.get_per_replica_batch_size(config.global_batch_size)
        per_step = per_replica * max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        return pipeline.train_dataset(list(spec.train_files), per_replica, config.recipe.image_size, spec.parallel,
                                      seed=spec.seed, records_per_epoch=spec.steps_per_epoch * per_step,
                                      initial_epoch=initial_epoch, epochs=epochs or config.recipe.epochs,
                                      deterministic=config.data.deterministic, flip=config.data.flip,
                                      crop_area=config.data.crop_area, lighting=config.data.lighting,
                                      skip_records=skip_steps * per_step)

    return strategy.distribute_datasets_from_function(train_fn)


def _build_model(strategy: tf.distribute.Strategy, spec: WorkerSpec) -> keras.Model:
    """The compiled model, built inside the strategy's scope.

    In order: Keras' global precision policy ``config.recipe.precision``; the model; its logits cast to float32
    (:func:`~spark_imagenet.training.worker.models.compile.float32_logits`); compiled with the config's optimizer,
    momentum, weight decay, label smoothing and ``jit_compile``, at the learning rate of its schedule (a function
    of the optimizer's step count, which checkpoints restore: a resumed run goes on exactly).
    """
    from spark_imagenet.training.worker.models.compile import float32_logits, set_precision
    from spark_imagenet.training.worker.keras_schedule import KerasSchedule
    from spark_imagenet.training.worker.models.compile import compile_model
    from spark_imagenet.training.worker.models.registry import build_model

    config = spec.config
    schedule = spec.schedule
    plain = schedule.kind == "constant" and schedule.warmup_steps == 0
    set_precision(config.recipe.precision)
    with strategy.scope():
        model = float32_logits(build_model(config.recipe.model, spec.num_classes, config.recipe.image_size, config.recipe.width))
        compile_model(model, schedule.peak if plain else KerasSchedule(schedule), optimizer=config.recipe.optimizer,
                      momentum=config.recipe.momentum, weight_decay=config.recipe.weight_decay,
                      label_smoothing=config.recipe.label_smoothing, jit_compile=config.recipe.jit_compile)
    return model


def _fit(model: keras.Model, train_ds: Any, spec: WorkerSpec,
         summary_dir: str | None = None, initial_epoch: int = 0,
         callbacks: Sequence[keras.callbacks.Callback] = (),
         earlier: dict[str, list[float]] | None = None, partial: tuple[Any, int] | None = None) -> dict[str, Any]:
    """Train epochs ``initial_epoch + 1 .. epochs``; return the result fields about training.

    ``partial`` = ``(dataset, k)``: a checkpoint stopped ``k`` steps into epoch ``initial_epoch + 1``; that epoch
    is trained first from ``dataset`` (its remaining steps, its logs over those steps only), then the others
    from ``train_ds`` (which then starts at epoch ``initial_epoch + 1``, 0-based).

    The chief writes TensorBoard scalars to ``summary_dir``. ``earlier`` is the history of the epochs a
    checkpoint already holds; the returned ``history`` covers every epoch, and ``steps``/``train_images``
    count only the steps this run made.
    """
    from spark_imagenet.training.worker import pipeline

    config = spec.config
    # one progress stream: the chief logs our epoch lines; Keras' own per-rank lines are off
    chief = spec.rank == 0
    tracker = None
    if chief and spec.tracking is not None:
        from spark_imagenet.training.worker.tracking import EpochMetricsSender

        tracker = EpochMetricsSender(spec.tracking)
    timer = _EpochProgress(config.recipe.epochs, spec.steps_per_epoch, config.recipe.batch_size, chief,
                           summary_dir if chief else None, tracker)
    t0 = time.perf_counter()
    hist = {k: list(v) for k, v in (earlier or {}).items()}
    fits = [(train_ds, initial_epoch, config.recipe.epochs, spec.steps_per_epoch)]
    if partial is not None and initial_epoch < config.recipe.epochs:  # the rest of an epoch a checkpoint stopped inside
        fits = [(partial[0], initial_epoch, initial_epoch + 1, spec.steps_per_epoch - partial[1]),
                (train_ds, initial_epoch + 1, config.recipe.epochs, spec.steps_per_epoch)]
    for dataset, first, last, steps_per_epoch in fits:
        if first >= last:
            continue
        timer.steps = steps_per_epoch  # the rest of an epoch counts its own steps (line, images/s)
        with pipeline.naming_bad_records(list(spec.train_files), parallel=spec.parallel):
            history = model.fit(dataset, epochs=last, initial_epoch=first, steps_per_epoch=steps_per_epoch,
                                callbacks=[timer, *callbacks], verbose=0)
        for k, vals in history.history.items():
            hist.setdefault(k, []).extend(float(v) for v in vals)
    train_seconds = time.perf_counter() - t0
    if tracker is not None:
        tracker.close()
    steps = (config.recipe.epochs - initial_epoch) * spec.steps_per_epoch - (partial[1] if partial else 0)
    timed = timer.seconds[1:] if len(timer.seconds) > 1 else timer.seconds
    images = sum(timer.counted[1:] if len(timer.counted) > 1 else timer.counted) * config.recipe.batch_size
    images_per_sec = images / sum(timed) if timed and sum(timed) > 0 else 0.0
    logger.info(
        f"train: {steps} steps, {steps * config.recipe.batch_size} images in {train_seconds:.1f} s; "
        f"{images_per_sec:.1f} images/s on this worker over {len(timed)} epoch(s)"
        + (" (first epoch excluded)" if len(timer.seconds) > 1 else "")
    )
    last = {k: (v[-1] if v else None) for k, v in hist.items()}
    return {"train_images": steps * config.recipe.batch_size, "steps": steps, "images_per_sec": images_per_sec,
            "timed_epochs": len(timed), "epoch_seconds": tuple(timer.seconds), "train_seconds": train_seconds,
            "train_loss": last.get("xent"), "train_top1": last.get("top1"), "history": hist,
            "initial_epoch": initial_epoch}


def _evaluate(model: keras.Model, val_ds: Any, spec: WorkerSpec, val_total: int,
              callbacks: Sequence[keras.callbacks.Callback] = ()) -> tuple[ValMetrics, float]:
    """Exact top-1/top-5/loss over all workers' validation examples; and the seconds it took. ``callbacks``
    (the step watchdog) see the evaluation's batches."""
    from spark_imagenet.training.worker import pipeline

    if val_ds is None:
        logger.info("val: no validation data (val_steps = 0)")
        return ValMetrics(val_total), 0.0
    t0 = time.perf_counter()
    with pipeline.naming_bad_records(list(spec.val_files), parallel=spec.parallel):
        # verbose=0: Keras' line would show its "loss", diluted by the zero-weight padding rows; we log the exact one
        scores = model.evaluate(val_ds, steps=spec.val_steps, return_dict=True, verbose=0, callbacks=list(callbacks))
    seconds = time.perf_counter() - t0
    val = ValMetrics(val_total, top1=float(scores["top1"]), top5=float(scores["top5"]), loss=float(scores["xent"]))
    if spec.rank == 0:  # the same global numbers on every rank: one line
        logger.info(f"val: {val_total} images, top1 {val.top1:.4f}, top5 {val.top5:.4f}, loss {val.loss:.4f} "
                    f"({seconds:.1f} s)")
    return val, seconds


def run_worker(spec: WorkerSpec, *, status: dict | None = None, output_dir: str | None = None,
               on_step_timeout: Callable[[str, tuple[LostPeer, ...]], None] | None = None) -> WorkerResult:
    """Train and evaluate one MWMS worker; return its result.

    Must run in a process that has not built a distribution strategy before.
    ``TF_CONFIG`` in the environment names the cluster; without it this is the
    only worker.

    Args:
        spec: this worker's spec.
        status: optional dict; ``status["stage"]`` is kept set to the stage
            being run (one of the ``STAGE_*`` strings).
        output_dir: with ``config.run.output`` set, the local folder where the
            chief puts ``model.keras`` and ``tensorboard/`` for its task to publish
            (a temporary folder when None).
        on_step_timeout: called by the step watchdog, from its thread, with its message and the peers that did
            not answer, when no step finished within ``--step-timeout``; it must end the process (default:
            print the message and exit with :data:`~spark_imagenet.training.job.config.EXIT_STEP_TIMEOUT`).

    Returns:
        WorkerResult: see the module docstring.

    Raises:
        TrainingError: the workers disagree on shared settings, the cluster
            size differs from ``workers``, or a shard file is missing.
        tf.errors.OpError and others: from TensorFlow while reading data,
            training or evaluating (MWMS aborts a worker whose peer died).
    """
    status = {} if status is None else status
    config = spec.config
    status["stage"] = STAGE_SETUP
    configure(spec)
    status["stage"] = STAGE_STRATEGY
    with startup_report(spec, status.get("result_path")):
        strategy, val_total, described = build_strategy(spec)
    status["stage"] = STAGE_MODEL
    model = _build_model(strategy, spec)
    params = int(model.count_params())
    if spec.rank == 0:  # the same model on every rank: one line
        from spark_imagenet.training.worker.models.compile import describe_compiled

        logger.info(f"model: {config.recipe.model} width {config.recipe.width:g}, {params:,} parameters, {spec.num_classes} classes; "
                    f"{describe_compiled(model)}")
    earlier = None
    if spec.restore is not None:
        status["stage"] = STAGE_RESTORE
        earlier = _restore(model, strategy, spec)
    initial_epoch = earlier.epoch if earlier is not None else 0
    inside = earlier.step - earlier.epoch * spec.steps_per_epoch if earlier is not None else 0  # a mid-epoch one
    status["stage"] = STAGE_DATA
    train_ds, val_ds = _datasets(strategy, spec, initial_epoch + (1 if inside else 0))
    partial = (_train_stream(strategy, spec, initial_epoch, inside, initial_epoch + 1), inside) if inside else None
    logger.info(f"data: {len(spec.train_files)} train file(s), {spec.train_examples} examples; "
                f"{len(spec.val_files)} val file(s), {spec.val_examples} of {val_total} val examples; "
                f"batch {config.recipe.batch_size}/worker, {config.recipe.image_size} px")
    local_output = output_dir if config.run.output else None
    status["stage"] = STAGE_FIT
    watchdog = StepWatchdog(config.run.step_timeout, spec.rank, list(spec.peers), on_expire=None if on_step_timeout
                            is None else lambda message: on_step_timeout(message, watchdog.lost))
    from spark_imagenet.training.worker.model_state import StopOnNaN

    callbacks: list[keras.callbacks.Callback] = [watchdog, StopOnNaN()]
    if spec.checkpoints is not None:
        callbacks.append(_saver(spec, earlier, watchdog.feed))
    trained = _fit(model, train_ds, spec,
                   os.path.join(local_output, TENSORBOARD_DIR, "train") if local_output else None,
                   initial_epoch, callbacks, earlier.history if earlier is not None else None, partial)
    status["stage"] = STAGE_EVALUATE
    val, eval_seconds = _evaluate(model, val_ds, spec, val_total, [watchdog])
    if config.run.output:
        status["stage"] = STAGE_OUTPUT
        _save_outputs(model, spec, val, local_output)
        from spark_imagenet.training.worker.strategy import leave_together

        leave_together(strategy, spec)  # the others wait while the chief writes its outputs
    return WorkerResult(rank=spec.rank, workers=spec.workers, replicas_in_sync=int(strategy.num_replicas_in_sync),
                        train_examples=spec.train_examples, batch_size=config.recipe.batch_size, epochs=config.recipe.epochs,
                        **described, **trained, val=val, eval_seconds=eval_seconds, params=params)


def _restore(model: keras.Model, strategy: tf.distribute.Strategy, spec: WorkerSpec) -> CheckpointMeta:
    """Load ``spec.restore`` into ``model``; the chief logs where training resumes. Returns its meta."""
    from spark_imagenet.training.job import checkpoints
    from spark_imagenet.training.worker.model_state import restore

    meta = restore(model, strategy, spec.restore)
    if spec.rank == 0:
        epochs = spec.config.recipe.epochs
        if meta.epoch >= epochs:
            logger.info(f"checkpoint: {checkpoints.describe(meta)} is the run's last ({epochs} epoch(s)): nothing "
                        "left to train; evaluating it")
        else:
            logger.info(f"resumed at epoch {meta.epoch + 1} of {epochs} from {checkpoints.describe(meta)}")
    return meta


def _saver(spec: WorkerSpec, earlier: CheckpointMeta | None, feed: Callable[[], None]) -> keras.callbacks.Callback:
    """The callback that writes a checkpoint after every epoch (the chief commits it to ``checkpoint_dir``)."""
    from spark_imagenet.training.job import checkpoints
    from spark_imagenet.training.worker.model_state import CheckpointSaver

    config = spec.config
    meta = checkpoints.new_meta(config, spec.dataset_id, spec.num_classes, spec.steps_per_epoch,
                                earlier.history if earlier is not None else {})
    assert spec.checkpoints is not None
    return CheckpointSaver(meta, spec.checkpoints,
                           spec.rank == 0, spec.steps_per_epoch, feed, keep=config.run.keep_checkpoints,
                           run_id=spec.run_id, every_steps=config.run.checkpoint_every)


def _save_outputs(model: keras.Model, spec: WorkerSpec, val: ValMetrics, local: str | None) -> None:
    """Save the model on every rank (MultiWorkerMirroredStrategy wants all workers to take part), each into a
    temporary folder; the chief then writes ``model.keras`` (a plain copy, without the optimizer),
    ``preprocessing.json``, ``serving/`` (:func:`spark_imagenet.training.worker.export.write_outputs`) and its
    validation scalars into ``local``, which its barrier task then publishes to ``--output``
    (:func:`spark_imagenet.training.job.outputs.publish`)."""
    import shutil

    chief = spec.rank == 0 and local is not None
    saved = tempfile.mkdtemp(prefix="spark-imagenet-save-")
    try:
        model.save(os.path.join(saved, MODEL_FILE))
        if not chief:
            return
        from spark_imagenet.training.worker.export import write_outputs

        assert local is not None
        os.makedirs(local, exist_ok=True)
        seconds = write_outputs(os.path.join(saved, MODEL_FILE), spec.labels, local)
        if seconds is not None:
            logger.info("output: model.keras, preprocessing.json" + (
                f" and serving/ (SavedModel, {seconds:.1f} s)" if spec.labels else " (no class list: no serving/)"))
        if spec.config.tracking.enabled:  # the driver logs it to the run from --output
            from spark_imagenet.training.worker.tracking import write_mlflow_model

            write_mlflow_model(os.path.join(local, MODEL_FILE), local)
    finally:
        shutil.rmtree(saved, ignore_errors=True)
    if val.top1 is None:
        return
    writer = tf.summary.create_file_writer(os.path.join(local, TENSORBOARD_DIR, "validation"))
    with writer.as_default(step=spec.config.recipe.epochs):
        for name, value in (("xent", val.loss), ("top1", val.top1), ("top5", val.top5)):
            tf.summary.scalar(name, float(value))
    writer.close()
