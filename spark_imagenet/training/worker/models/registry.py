"""The model registry of the TensorFlow worker process: a model built by its name, or a user's builder.

This module imports TensorFlow (through ``tf_keras``, i.e. Keras 2:
docs/design.md, 'Keras 2 (tf-keras) under MultiWorkerMirroredStrategy'), so
only the TensorFlow worker process and tests import it, never the driver.

Public API:

* :func:`build_model`: build a registered model by name, or a user's builder ``package.module:function``
  (whose result is checked).
* :func:`get_builder`: a registered model's builder (imported from its row of
  :data:`spark_imagenet.training.job.model_specs.MODELS`), or a user's builder (raises the same errors as
  ``build_model``).
* :func:`import_builder`: import a builder named ``package.module:function``, a registered one or a user's.

Compiling a built model (optimizer, loss, metrics) is :mod:`spark_imagenet.training.worker.models.compile`.
"""

from __future__ import annotations

import os
from typing import Callable


import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.job.model_specs import MODELS, is_user_builder  # noqa: E402


def build_model(name: str, num_classes: int, image_size: int, width: float = 1.0) -> keras.Model:
    """Build an uncompiled model: a registered one, or a user's builder.

    Args:
        name: ``--model``: a registered model name (a key of
            :data:`spark_imagenet.training.job.model_specs.MODELS`), e.g. ``"alexnet"``, or
            ``package.module:function``, a user's builder called as ``function(num_classes, image_size, width)``.
        num_classes: number of classes (width of the logits layer).
        image_size: input height (= width) in pixels.
        width: multiplier of every conv/hidden dense width (1.0 = the paper's model; ResNet-50 takes only 1.0).

    Returns:
        A ``tf_keras.Model`` mapping float32 ``[B, S, S, 3]`` normalised images
        to float32 logits ``[B, num_classes]``. Call it inside
        ``strategy.scope()`` when training under a distribution strategy.

    Raises:
        ConfigError: unknown ``name`` (the message lists the known names), a
            setting the model cannot use (e.g. ``image_size`` too small), or a user's builder that cannot be
            imported, raises, or returns something other than a ``tf_keras.Model`` with input shape
            ``(None, S, S, 3)`` and output shape ``(None, num_classes)`` (each message names ``--model``).
    """
    builder = get_builder(name)
    if not is_user_builder(name):
        return builder(num_classes, image_size, width)
    try:
        model = builder(num_classes, image_size, width)
    except Exception as e:  # noqa: BLE001 - any failure of the user's code is reported as a --model error
        raise ConfigError(f"model (--model) {name!r}: the builder raised {_first_line(e)} when called as "
                          f"{name.split(':')[1]}(num_classes={num_classes}, image_size={image_size}, "
                          f"width={width:g}); fix the builder (SPARK_IMAGENET_DEBUG=1 shows the traceback)",
                          key="model", value=name) from e
    check_built_model(name, model, num_classes, image_size)
    return model


def get_builder(name: str) -> Callable[[int, int, float], keras.Model]:
    """The builder of the model registered under ``name``, or a user's builder imported from ``package.module``.

    Args:
        name: model name, e.g. ``"alexnet"`` (its builder is imported from its row's ``builder``), or
            ``package.module:function`` (the module is imported here, in the TensorFlow worker process, from its
            ``sys.path``: see docs/design.md, 'Your own model').

    Returns:
        ``builder(num_classes, image_size, width) -> tf_keras.Model``.

    Raises:
        ConfigError: unknown ``name`` (the message names ``--model`` and lists the known names), or a user's
            module that cannot be imported, or that has no callable ``function`` (the message names ``--model``
            and the original error's first line).
    """
    if is_user_builder(name):
        return import_builder(name)
    try:
        spec = MODELS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(MODELS))
        raise ConfigError(f"unknown model {name!r} (--model); known models: {known}, or your own builder as "
                          "package.module:function", key="model", value=name) from None
    return import_builder(spec.builder, model=name)


def _first_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` (at most 300 characters)."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= 300 else line[:300] + " ..."


def import_builder(builder: str, model: str | None = None) -> Callable[[int, int, float], keras.Model]:
    """Import ``package.module`` and return its ``function``: a registered model's builder or a user's.

    Args:
        builder: ``package.module:function``.
        model: the ``--model`` value named in the messages (default: ``builder``, a user's builder).

    Returns:
        ``function``, callable as ``function(num_classes, image_size, width) -> tf_keras.Model``.

    Raises:
        ConfigError: the module cannot be imported (its own code failing included), has no ``function``, or its
            ``function`` is not callable; the message names ``--model`` and the original error's first line.
    """
    import importlib
    import sys

    name = builder if model is None else model
    module_name, function = builder.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - ImportError, or the module's own code failing
        raise ConfigError(
            f"model (--model) {name!r}: cannot import {module_name} in the TensorFlow worker ({_first_line(e)}; "
            f"sys.path: {os.pathsep.join(p for p in sys.path if p)}); on a cluster ship the module with "
            "spark-submit --py-files (or spark.submit.pyFiles), or install it in the executors' environment",
            key="model", value=name
        ) from e
    try:
        found = getattr(module, function)
    except AttributeError as e:
        raise ConfigError(f"model (--model) {name!r}: module {module_name} ({getattr(module, '__file__', None)}) "
                          f"has no attribute {function!r} ({_first_line(e)}); define "
                          f"{function}(num_classes, image_size, width) in it", key="model", value=name) from None
    if not callable(found):
        raise ConfigError(f"model (--model) {name!r}: {module_name}.{function} is not callable (a value of type "
                          f"{type(found).__name__}); define {function}(num_classes, image_size, width) -> "
                          "tf_keras.Model", key="model", value=name)
    return found


def _is_keras3_model(obj: object) -> bool:
    """Whether ``obj`` is a Keras 3 ``keras.Model`` (checked by class, without importing Keras 3)."""
    return any(c.__name__ == "Model" and c.__module__.split(".")[0] == "keras" for c in type(obj).__mro__)


def check_built_model(name: str, model: object, num_classes: int, image_size: int) -> None:
    """Check what a user's builder returned.

    Args:
        name: ``--model`` value (named in the messages).
        model: the builder's result.
        num_classes: the logits width the job needs.
        image_size: the input side S the job feeds (float32 ``[B, S, S, 3]``).

    Raises:
        ConfigError: ``model`` is not a ``tf_keras.Model`` (one line saying why, naming a Keras 3 model as such,
            and how to build it with ``tf_keras``), or its input shape is not ``(None, S, S, 3)``, or its output
            shape is not ``(None, num_classes)``; the message names ``--model``.
    """
    expected_in, expected_out = (None, image_size, image_size, 3), (None, num_classes)
    if not isinstance(model, keras.Model):
        kind = "a Keras 3 model" if _is_keras3_model(model) else "a"
        raise ConfigError(
            f"model (--model) {name!r} returned {kind} {type(model).__module__}.{type(model).__name__}, not a "
            "tf_keras.Model: MultiWorkerMirroredStrategy trains only Keras 2 models (Keras 3's fit fails under it: "
            "keras-team/keras#20585, tensorflow/tensorflow#72388; "
            "docs/design.md, 'Keras 3: our position and what a move would take'); "
            "build it with Keras 2, `import tf_keras as keras` (the tf-keras package), instead of `import keras`",
            key="model", value=name)
    got_in = _shape(model, "input_shape")
    if got_in != expected_in:
        raise ConfigError(f"model (--model) {name!r}: the model's input shape is {got_in}, but the job feeds "
                          f"images of shape {expected_in} (float32, --image-size {image_size}); give it one "
                          f"input `tf_keras.Input(shape=({image_size}, {image_size}, 3))`", key="model", value=name)
    got_out = _shape(model, "output_shape")
    if got_out != expected_out:
        raise ConfigError(f"model (--model) {name!r}: the model's output shape is {got_out}, but the job needs "
                          f"logits of shape {expected_out} ({num_classes} classes); end it with "
                          f"`Dense({num_classes})` and no softmax", key="model", value=name)



def _shape(model: keras.Model, attr: str) -> tuple | None:
    """``model.input_shape`` or ``model.output_shape`` as a tuple, or None when the model has none (not built,
    several inputs or outputs)."""
    try:
        return tuple(getattr(model, attr))
    except (AttributeError, RuntimeError, TypeError):
        return None


__all__ = ["build_model", "check_built_model", "get_builder", "import_builder"]
