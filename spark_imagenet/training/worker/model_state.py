"""The model state a checkpoint holds (``tf.train.Checkpoint`` of model, optimizer, dropout generators): save it after every epoch, restore it before training.

Imported only by the TensorFlow worker process (:mod:`spark_imagenet.training.worker.main`). The storage side
(layout, commit, latest, compatibility) is :mod:`spark_imagenet.training.job.checkpoints`, which needs no
TensorFlow.

What a checkpoint holds: a ``tf.train.Checkpoint(model=..., optimizer=...)`` written with ``write`` to the
prefix :data:`TF_PREFIX`: every weight, the optimizer's iterations and momentum slots, and the state of the
dropout layers' random generators (the worker turns on Keras' ``tf.random.Generator`` RNG, whose state is a
variable, so a resumed run draws the same dropout masks as an uninterrupted one). Under
MultiWorkerMirroredStrategy every worker writes (reading synchronised variables may need all of them); the
chief's copy is committed, the others' are deleted.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from typing import Callable


import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import StorageError, TrainingError  # noqa: E402
from spark_imagenet.storage import Storage  # noqa: E402
from spark_imagenet.storage.lease import check_held  # noqa: E402
from spark_imagenet.training.job import checkpoints  # noqa: E402
from spark_imagenet.training.job.checkpoints import CheckpointMeta  # noqa: E402
from spark_imagenet.training.worker import tf_internals  # noqa: E402

logger = logging.getLogger(__name__)

#: The prefix of the TensorFlow checkpoint files inside a checkpoint folder (``ckpt.index``, ``ckpt.data-*``).
TF_PREFIX = "ckpt"


def random_generators(model: keras.Model) -> dict[str, tf.random.Generator]:
    """The ``tf.random.Generator`` of each random layer (dropout), by layer name.

    A functional model's checkpoint tracks only its layers with weights, so these are added to the
    checkpoint explicitly. They exist once Keras' generator RNG is on
    (``keras.backend.experimental.enable_tf_random_generator()``, set by the worker before the model is
    built); read with :func:`~spark_imagenet.training.worker.tf_internals.random_generator`, an empty dict
    where tf-keras keeps them elsewhere.
    """
    found = {}
    for layer in model.layers:
        generator = tf_internals.random_generator(layer)
        if generator is not None:
            found[layer.name] = generator
    return found


def _trackable(model: keras.Model) -> tf.train.Checkpoint:
    """What a checkpoint holds: the model, its optimizer and its dropout layers' random generators."""
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer, random=random_generators(model))


def restore(model: keras.Model, strategy: tf.distribute.Strategy, folder: str) -> CheckpointMeta:
    """Load a fetched checkpoint into a compiled ``model``; return its meta.

    The optimizer's slot variables are created first (inside ``strategy.scope()``), so the momentum is
    restored now rather than deferred to the first step.

    Args:
        model: the compiled model, built in ``strategy``'s scope.
        strategy: the worker's strategy.
        folder: a folder holding ``checkpoint.json`` and the :data:`TF_PREFIX` files (:func:`checkpoints.download`).

    Returns:
        CheckpointMeta: the checkpoint's meta (``epoch`` = completed epochs).

    Raises:
        ConfigError: no readable ``checkpoint.json`` in ``folder``.
        TrainingError: the files do not fit this model (another architecture or width).
    """
    meta = checkpoints.read_local(folder)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    try:
        _trackable(model).read(os.path.join(folder, TF_PREFIX)).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise TrainingError(f"the checkpoint in {folder} does not fit this model: {str(e).splitlines()[0]}") from None
    return meta


class CheckpointSaver(keras.callbacks.Callback):
    """At the end of every epoch, write the model and optimizer state; the chief commits it to ``--checkpoint-dir``
    and logs one line per commit.

    Args:
        meta: the job's fields of every checkpoint (``epoch``, ``step``, ``history`` and ``files`` are
            filled in per epoch); ``history`` holds the epochs before this run's first.
        storage: the checkpoint folder (``--checkpoint-dir``; the chief commits to it).
        chief: whether this worker commits (rank 0); the others write to a temporary folder and delete it.
        steps_per_epoch: steps of one epoch (``step`` = completed epochs x steps).
        feed: called before and after each save (the step watchdog's ``feed``), so a slow upload does not
            count as a stuck step.
        keep: complete checkpoints kept in the checkpoint folder, the new one included (``--keep-checkpoints``);
            None = all.
        run_id: the run's id: each commit first checks that the run still holds the folder's lease
            (:func:`~spark_imagenet.storage.lease.check_held`; a TrainingError otherwise); "" = no check.
        every_steps: also write a checkpoint inside an epoch whenever the global step (the optimizer's
            iterations) is a multiple of it (``--checkpoint-every``), in ``epoch-E-K`` (E epochs done, K steps
            into the next); None = at epoch ends only.

    Raises:
        ConfigError: ``keep`` below 1.
    """

    def __init__(self, meta: CheckpointMeta, storage: Storage, chief: bool, steps_per_epoch: int,
                 feed: Callable[[], None] = lambda: None, *,
                 keep: int | None = checkpoints.DEFAULT_KEEP, run_id: str = "",
                 every_steps: int | None = None) -> None:
        super().__init__()
        self._keep = checkpoints.check_keep(keep)
        self._run_id = run_id
        self._every = every_steps
        self._meta, self._storage, self._chief, self._steps = meta, storage, chief, steps_per_epoch
        self._feed = feed
        self.history: dict[str, list[float]] = {k: list(v) for k, v in meta.history.items()}

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Record epoch ``epoch``'s (0-based) logs in the history, then write and (chief) commit the checkpoint."""
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(float(value))
        self._save(epoch + 1, 0)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """With ``every_steps``: a checkpoint inside the epoch at each multiple of it (not at an epoch's end)."""
        if not self._every:
            return
        step = int(self.model.optimizer.iterations.numpy())
        if step % self._every == 0 and step % self._steps != 0:
            self._save(step // self._steps, step % self._steps)

    def _save(self, epoch: int, inside: int) -> None:
        """Write the checkpoint after ``epoch`` epochs and ``inside`` steps (every worker: the strategy's
        collective), and commit it (the chief)."""
        self._feed()
        t0 = time.perf_counter()
        folder = tempfile.mkdtemp(prefix="spark-imagenet-ckpt-")
        try:
            _trackable(self.model).write(os.path.join(folder, TF_PREFIX))
            if self._chief:
                self._commit_or_go_on(folder, epoch, inside, time.perf_counter() - t0)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            self._feed()

    def _commit_or_go_on(self, folder: str, epoch: int, inside: int, write_seconds: float) -> None:
        """:meth:`_commit`; the last epoch's checkpoint may fail to commit (a full store) without failing the
        run: the model is trained, so evaluation and ``--output`` still come, and one error line says so."""
        try:
            self._commit(folder, epoch, inside, write_seconds)
        except StorageError as e:
            if inside or epoch < self._meta.epochs:
                raise  # a rerun resumes from the checkpoint before: fail now, clearly
            logger.error(f"checkpoint: the last epoch's checkpoint was not committed ({e}); the trained model "
                         "is not lost: it is evaluated and written to --output as usual (without --output it is "
                         "not kept)")

    def _commit(self, folder: str, epoch: int, inside: int, write_seconds: float) -> None:
        """Commit the chief's written checkpoint of ``epoch`` completed epochs and ``inside`` steps more."""
        meta = self._meta.replace(epoch=epoch, step=epoch * self._steps + inside, history=self.history,
                                  created=checkpoints.utc_now())
        t0 = time.perf_counter()
        if self._run_id:  # a chief whose driver is gone, or whose folder another run took, stops committing
            check_held(self._storage, self._run_id)
        name = checkpoints.commit(self._storage, folder, meta, keep=self._keep, inside=inside)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        where = f"epoch {epoch}" if not inside else f"step {meta.step} ({inside} into epoch {epoch + 1})"
        logger.info(f"checkpoint: {where} committed to {self._storage.url}/{name} ({size / 1e6:.1f} MB; "
                    f"written in {write_seconds:.1f} s, committed in {time.perf_counter() - t0:.1f} s)")


class StopOnNaN(keras.callbacks.Callback):
    """Stops training with a :class:`~spark_imagenet.errors.TrainingError` at the end of an epoch whose loss is
    not finite (the weights have diverged: everything after it, checkpoints and outputs included, would hold
    NaN). Placed before the checkpoint saver, so no such checkpoint is committed."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        loss = (logs or {}).get("xent", (logs or {}).get("loss"))
        if loss is not None and not math.isfinite(float(loss)):
            raise TrainingError(f"training diverged: the loss is {float(loss)} after epoch {epoch + 1}; nothing of "
                                "this epoch was kept. Lower --learning-rate, add --warmup-epochs, or check the "
                                "data, then run again (a --checkpoint-dir resumes from the last good epoch)")
