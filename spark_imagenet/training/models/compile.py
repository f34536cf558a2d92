"""Compiling a model for training: optimizer, loss and metrics (imports TensorFlow; worker side only)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402

#: Momentum of the SGD optimizer (Krizhevsky et al. 2012, section 5).
MOMENTUM = 0.9


def compile_model(model: keras.Model, learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
                  momentum: float = MOMENTUM) -> keras.Model:
    """Compile a model for training and exact weighted evaluation.

    Optimizer: ``SGD(learning_rate, momentum)`` (Krizhevsky et al. 2012 used
    lr 0.01, momentum 0.9). Loss: ``SparseCategoricalCrossentropy(from_logits=True)``
    (the models output logits), plus the models' weight-decay terms.

    Metrics (all in ``weighted_metrics``, so they honour the sample weights of
    the evaluation dataset, whose zero-weight padding rows then count for
    nothing; ``tf_keras`` passes sample weights only to ``weighted_metrics``,
    plain ``metrics`` see padding rows as real):

    * ``top1``: ``SparseCategoricalAccuracy`` (argmax of the logits == label).
    * ``top5``: ``SparseTopKCategoricalAccuracy(k=5)`` (label among the 5
      largest logits; with fewer than 5 classes it is 1.0).
    * ``xent``: ``SparseCategoricalCrossentropy(from_logits=True)``, the
      weighted mean cross-entropy per example *without* the weight-decay term.
      Keras' own ``loss`` divides by the batch size including padding rows
      and adds weight decay, so ``xent`` is the exact validation loss.

    Under MultiWorkerMirroredStrategy the metric states are summed over all
    workers, so the reported values are global.

    Args:
        model: an uncompiled model (built inside the strategy scope if any);
            call this inside the same scope.
        learning_rate: SGD learning rate (> 0), or a schedule of the step
            (:class:`~spark_imagenet.training.keras_schedule.KerasSchedule`).
        momentum: SGD momentum in [0, 1).

    Returns:
        The same model, compiled.

    Raises:
        ConfigError: ``learning_rate`` not positive (names ``--learning-rate``)
            or ``momentum`` outside [0, 1).
    """
    schedule = isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule)
    if not schedule and (not isinstance(learning_rate, (int, float)) or not learning_rate > 0):
        raise ConfigError(f"--learning-rate must be a positive number, got {learning_rate!r}")
    if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
        raise ConfigError(f"momentum must be in [0, 1), got {momentum!r}")
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=learning_rate if schedule else float(learning_rate),
                                       momentum=float(momentum)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="top1"),
            keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5"),
            keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent"),
        ],
    )
    return model


__all__ = ["MOMENTUM", "compile_model"]
