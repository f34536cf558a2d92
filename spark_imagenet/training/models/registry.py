"""Model registry and compilation for training in the TensorFlow worker process.

This module imports TensorFlow (through ``tf_keras``, i.e. Keras 2:
docs/design.md, 'Keras 2 (tf-keras) under MultiWorkerMirroredStrategy'), so
only the TensorFlow worker process and tests import it, never the driver.

Public API:

* :data:`MODELS`: ``{name: builder(num_classes, image_size, width) -> Model}``.
* :func:`build_model`: build a registered model by name.
* :func:`get_builder`: look a name up (raises the same error as ``build_model``).
* :func:`compile_model`: SGD with momentum, sparse categorical cross-entropy
  from logits, metrics ``top1`` / ``top5`` (and ``xent``).
"""

from __future__ import annotations

import os
from typing import Callable

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.models.alexnet import build_alexnet, min_image_size  # noqa: E402

#: Registered models: name -> builder(num_classes: int, image_size: int, width: float) -> tf_keras.Model.
MODELS: dict[str, Callable[[int, int, float], keras.Model]] = {
    "alexnet": build_alexnet,
}

#: Momentum of the SGD optimizer (Krizhevsky et al. 2012, section 5).
MOMENTUM = 0.9


def build_model(name: str, num_classes: int, image_size: int, width: float = 1.0) -> keras.Model:
    """Build an uncompiled model from the registry.

    Args:
        name: registered model name (see :data:`MODELS`), e.g. ``"alexnet"``.
        num_classes: number of classes (width of the logits layer).
        image_size: input height (= width) in pixels.
        width: multiplier of every conv/hidden dense width (1.0 = the paper's model).

    Returns:
        A ``tf_keras.Model`` mapping float32 ``[B, S, S, 3]`` normalised images
        to float32 logits ``[B, num_classes]``. Call it inside
        ``strategy.scope()`` when training under a distribution strategy.

    Raises:
        ConfigError: unknown ``name`` (the message lists the known names), or a
            setting the model cannot use (e.g. ``image_size`` too small).
    """
    return get_builder(name)(num_classes, image_size, width)


def get_builder(name: str) -> Callable[[int, int, float], keras.Model]:
    """The builder function registered under ``name``.

    Args:
        name: model name, e.g. ``"alexnet"``.

    Returns:
        ``builder(num_classes, image_size, width) -> tf_keras.Model``.

    Raises:
        ConfigError: unknown ``name``; the message names ``--model`` and lists
            the known names.
    """
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(MODELS))
        raise ConfigError(f"unknown model {name!r} (--model); known models: {known}") from None


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


__all__ = ["MODELS", "MOMENTUM", "build_model", "compile_model", "get_builder", "min_image_size"]
