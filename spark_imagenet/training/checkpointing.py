"""The TensorFlow side of checkpoints: save after every epoch, restore before training.

Imported only by the TensorFlow worker process (:mod:`spark_imagenet.training.worker`). The storage side
(layout, commit, latest, compatibility) is :mod:`spark_imagenet.training.checkpoints`, which needs no
TensorFlow.

What a checkpoint holds: a ``tf.train.Checkpoint(model=..., optimizer=...)`` written with ``write`` to the
prefix :data:`TF_PREFIX`: every weight, the optimizer's iterations and momentum slots, and the state of the
dropout layers' random generators (the worker turns on Keras' ``tf.random.Generator`` RNG, whose state is a
variable, so a resumed run draws the same dropout masks as an uninterrupted one). Under
MultiWorkerMirroredStrategy every worker writes (reading synchronised variables may need all of them); the
chief's copy is committed, the others' are deleted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import TrainingError  # noqa: E402
from spark_imagenet.training import checkpoints  # noqa: E402
from spark_imagenet.training.checkpoints import CheckpointMeta  # noqa: E402

#: The prefix of the TensorFlow checkpoint files inside a checkpoint folder (``ckpt.index``, ``ckpt.data-*``).
TF_PREFIX = "ckpt"


def random_generators(model: keras.Model) -> dict[str, tf.random.Generator]:
    """The ``tf.random.Generator`` of each random layer (dropout), by layer name.

    A functional model's checkpoint tracks only its layers with weights, so these are added to the
    checkpoint explicitly. They exist once Keras' generator RNG is on
    (``keras.backend.experimental.enable_tf_random_generator()``, set by the worker before the model is
    built); read from tf-keras' ``BaseRandomLayer._random_generator._generator`` (TF 2.21), an empty dict
    where those attributes are absent.
    """
    found = {}
    for layer in model.layers:
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if isinstance(generator, tf.random.Generator):
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
    """At the end of every epoch, write the model and optimizer state; the chief commits it to ``--checkpoint-dir``.

    Args:
        meta: the job's fields of every checkpoint (``epoch``, ``step``, ``history`` and ``files`` are
            filled in per epoch); ``history`` holds the epochs before this run's first.
        open_storage: returns the checkpoint folder's storage (called once, on the chief).
        chief: whether this worker commits (rank 0); the others write to a temporary folder and delete it.
        steps_per_epoch: steps of one epoch (``step`` = completed epochs x steps).
        log: called with one line per commit (the chief's).
        feed: called before and after each save (the step watchdog's ``feed``), so a slow upload does not
            count as a stuck step.
    """

    def __init__(self, meta: CheckpointMeta, open_storage: Callable[[], Any], chief: bool, steps_per_epoch: int,
                 log: Callable[[str], None], feed: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self._meta, self._open, self._chief, self._steps = meta, open_storage, chief, steps_per_epoch
        self._log, self._feed = log, feed
        self._storage = None
        self.history: dict[str, list[float]] = {k: list(v) for k, v in meta.history.items()}

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Record epoch ``epoch``'s (0-based) logs in the history, then write and (chief) commit the checkpoint."""
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(float(value))
        self._feed()
        t0 = time.perf_counter()
        folder = tempfile.mkdtemp(prefix="spark-imagenet-ckpt-")
        try:
            _trackable(self.model).write(os.path.join(folder, TF_PREFIX))
            if self._chief:
                self._commit(folder, epoch + 1, time.perf_counter() - t0)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            self._feed()

    def _commit(self, folder: str, epoch: int, write_seconds: float) -> None:
        """Commit the chief's written checkpoint of ``epoch`` (completed epochs)."""
        if self._storage is None:
            self._storage = self._open()
        meta = self._meta.replace(epoch=epoch, step=epoch * self._steps, history=self.history,
                                  created=checkpoints.utc_now())
        t0 = time.perf_counter()
        name = checkpoints.commit(self._storage, folder, meta)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        self._log(f"checkpoint: epoch {epoch} committed to {self._storage.url}/{name} ({size / 1e6:.1f} MB; "
                  f"written in {write_seconds:.1f} s, committed in {time.perf_counter() - t0:.1f} s)")
