"""A user's own model builder, as a user would write one: ``--model user_model:build``.

Used by tests/test_models.py and tests/test_models_e2e.py. The other functions are deliberately wrong builders
for the worker-side checks of :func:`spark_imagenet.training.worker.models.registry.build_model`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tf_keras as keras  # noqa: E402  (Keras 2: Keras 3 does not train under MultiWorkerMirroredStrategy)


def build(num_classes: int, image_size: int, width: float) -> keras.Model:
    """A small convolutional net: float32 ``[B, S, S, 3]`` images -> float32 logits ``[B, num_classes]``.

    Args:
        num_classes: logits width.
        image_size: input side S in pixels (any size >= 4).
        width: multiplier of the conv widths (1.0 = 16 and 32 filters).
    """
    filters = max(1, round(16 * width))
    inputs = keras.Input(shape=(image_size, image_size, 3), name="image")
    x = keras.layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu", name="conv1")(inputs)
    x = keras.layers.Conv2D(2 * filters, 3, strides=2, padding="same", activation="relu", name="conv2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="user_model")


def not_a_model(num_classes: int, image_size: int, width: float) -> dict:
    """Returns a dict, not a model."""
    return {"classes": num_classes}


def wrong_output(num_classes: int, image_size: int, width: float) -> keras.Model:
    """A model with one logit too many."""
    return build(num_classes + 1, image_size, width)


def wrong_input(num_classes: int, image_size: int, width: float) -> keras.Model:
    """A model for twice the job's image size."""
    return build(num_classes, 2 * image_size, width)


def raises(num_classes: int, image_size: int, width: float) -> keras.Model:
    """Fails inside the builder."""
    raise ValueError(f"this builder does not support {num_classes} classes")


NOT_CALLABLE = 3


def keras3_model(num_classes: int, image_size: int, width: float):
    """The same net built with Keras 3 (``import keras``), which this project cannot train."""
    import keras as keras3

    inputs = keras3.Input(shape=(image_size, image_size, 3))
    return keras3.Model(inputs, keras3.layers.Dense(num_classes)(keras3.layers.GlobalAveragePooling2D()(inputs)))
