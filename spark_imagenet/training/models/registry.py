"""Model registry and compilation for training in the TensorFlow worker process.

This module imports TensorFlow (through ``tf_keras``, i.e. Keras 2:
docs/design.md, 'Keras 2 (tf-keras) under MultiWorkerMirroredStrategy'), so
only the TensorFlow worker process and tests import it, never the driver.

Public API:

* :data:`MODELS`: ``{name: builder(num_classes, image_size, width) -> Model}``.
* :func:`build_model`: build a registered model by name.
* :func:`get_builder`: look a name up (raises the same error as ``build_model``).
* :func:`compile_model` (from :mod:`spark_imagenet.training.models.compile`): the optimizer, the loss and
  the metrics ``top1`` / ``top5`` (and ``xent``).
"""

from __future__ import annotations

import os
from typing import Callable

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.models.alexnet import build_alexnet, min_image_size  # noqa: E402
from spark_imagenet.training.models.compile import MOMENTUM, compile_model  # noqa: E402  (re-exported)

#: Registered models: name -> builder(num_classes: int, image_size: int, width: float) -> tf_keras.Model.
MODELS: dict[str, Callable[[int, int, float], keras.Model]] = {
    "alexnet": build_alexnet,
}


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


__all__ = ["MODELS", "MOMENTUM", "build_model", "compile_model", "get_builder", "min_image_size"]
