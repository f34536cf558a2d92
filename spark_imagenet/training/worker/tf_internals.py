"""TensorFlow's and tf-keras' private APIs, in one place: small shims and the list of each internal we touch.

No other module of the package reaches into ``tensorflow.python``, ``tf_keras.src`` or a ``_``-prefixed
attribute of a TensorFlow or Keras object; they call the shims here. :data:`INTERNALS` names every internal
with the TensorFlow version it was checked against; :func:`missing_internals` says which of them the installed
TensorFlow lacks (``tests/test_tf_internals.py`` runs it, so an upgrade that drops one fails one clear test
rather than a training job).

Example::

    >>> from spark_imagenet.training.worker import tf_internals
    >>> tf_internals.missing_internals()          # [] on the TensorFlow the list was checked against
    []
    >>> tf_internals.check_peer_health("/job:worker/replica:0/task:1", 5.0)  # raises when the peer is gone  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Iterator

import tensorflow as tf

#: The TensorFlow (and tf-keras) version every entry of :data:`INTERNALS` was checked against.
CHECKED_WITH = "2.21"


@dataclasses.dataclass(frozen=True)
class Internal:
    """One private TensorFlow or tf-keras API the package uses.

    Attributes:
        module: the module that holds it (``"tensorflow.python.eager.context"``).
        attribute: its dotted path in ``module`` (``"Context.check_collective_ops_peer_health"``); for an
            attribute a layer sets on itself, the class, then the attribute after ``().``
            (``"BaseRandomLayer()._random_generator"``).
        checked_with: the TensorFlow version it was checked against.
        used_for: what the package does with it (the shim that wraps it).
    """

    module: str
    attribute: str
    checked_with: str
    used_for: str

    @property
    def name(self) -> str:
        """str: ``module.attribute``."""
        return f"{self.module}.{self.attribute}"


#: Every TensorFlow and tf-keras internal the package touches.
INTERNALS: tuple[Internal, ...] = (
    Internal("tensorflow.python.eager.context", "context", CHECKED_WITH,
             "check_peer_health: the eager context of this process"),
    Internal("tensorflow.python.eager.context", "Context.check_collective_ops_peer_health", CHECKED_WITH,
             "check_peer_health: the step watchdog asks a silent peer whether it is alive"),
    Internal("tensorflow.python.data.ops.multi_device_iterator_ops", "_create_device_dataset", CHECKED_WITH,
             "no_autotune_on_device_datasets: tf.data autotuning off on MultiWorkerMirroredStrategy's per-device "
             "datasets (docs/design.md, 'The tf.data autotune stall')"),
    Internal("tf_keras.src.engine.base_layer", "Layer._flatten_layers", CHECKED_WITH,
             "flatten_layers: a model's nested layers in order (weight decay, the precision report)"),
    Internal("tf_keras.src.engine.base_layer", "BaseRandomLayer()._random_generator", CHECKED_WITH,
             "random_generator: each dropout layer's generator, kept in checkpoints"),
    Internal("tf_keras.src.backend", "RandomGenerator()._generator", CHECKED_WITH,
             "random_generator: the tf.random.Generator inside a layer's RandomGenerator"),
)


# ------------------------------------------------------------------ the shims
def check_peer_health(task: str, timeout_s: float) -> None:
    """Ask the collective peer ``task`` whether it is alive (TensorFlow's eager context).

    Args:
        task: the peer's device prefix, e.g. ``"/job:worker/replica:0/task:1"``.
        timeout_s: seconds to wait for its answer (at least 1 ms is asked for).

    Raises:
        tf.errors.UnavailableError: the peer is down or unreachable.
        tf.errors.DeadlineExceededError: no answer within ``timeout_s``.
        tf.errors.FailedPreconditionError: the peer is another process than before (it restarted).
    """
    from tensorflow.python.eager import context

    context.context().check_collective_ops_peer_health(task, timeout_in_ms=max(1, int(timeout_s * 1000)))


def no_autotune_on_device_datasets() -> bool:
    """Turn tf.data autotuning off on the per-device datasets of MultiWorkerMirroredStrategy.

    Wraps ``multi_device_iterator_ops._create_device_dataset`` to apply ``autotune.enabled = False``
    (once: calling again changes nothing); where that function does not exist, does nothing.

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


def flatten_layers(model: Any, include_self: bool = True) -> Iterator[Any]:
    """``model``'s layers and their nested layers, recursively, in layer order, each once (tf-keras' own walk).

    Args:
        model: a tf-keras model or layer.
        include_self: whether ``model`` itself comes first.

    Returns:
        Iterator of layers.
    """
    return model._flatten_layers(include_self=include_self, recursive=True)


def random_generator(layer: Any) -> tf.random.Generator | None:
    """The ``tf.random.Generator`` of a random layer (dropout), or None.

    It exists once Keras' generator RNG is on (``keras.backend.experimental.enable_tf_random_generator()``)
    and the layer has been called; None for any other layer, or where tf-keras keeps it elsewhere.
    """
    generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
    return generator if isinstance(generator, tf.random.Generator) else None


# ------------------------------------------------------------------ the check
def _resolve(internal: Internal) -> Any:
    """The object ``internal`` names (an instance attribute: read from a fresh instance, built and called)."""
    value: Any = importlib.import_module(internal.module)
    for part in internal.attribute.split("."):
        if part.endswith("()"):
            value = _instance(value, part[:-2])
        else:
            value = getattr(value, part)
    return value


def _instance(module: Any, cls_name: str) -> Any:
    """A ready instance of ``module.cls_name`` whose private attributes are set (a called dropout layer's)."""
    import tf_keras as keras

    if cls_name == "BaseRandomLayer":
        layer = keras.layers.Dropout(0.5, seed=1)
        layer(tf.ones((1, 2)), training=True)
        return layer
    if cls_name == "RandomGenerator":
        generator = getattr(module, cls_name)(seed=1, rng_type="stateful")
        generator.random_uniform((1,))
        return generator
    return getattr(module, cls_name)()


def missing_internals() -> list[str]:
    """Which entries of :data:`INTERNALS` the installed TensorFlow lacks.

    Returns:
        list[str]: ``"NAME (checked with TF 2.21; used for ...): why"`` for each one missing; empty when all exist.
    """
    missing = []
    for internal in INTERNALS:
        try:
            _resolve(internal)
        except (ImportError, AttributeError, TypeError) as e:
            missing.append(f"{internal.name} (checked with TensorFlow {internal.checked_with}; used for "
                           f"{internal.used_for}): {type(e).__name__}: {e}")
    return missing


__all__ = ["CHECKED_WITH", "INTERNALS", "Internal", "check_peer_health", "flatten_layers", "missing_internals",
           "no_autotune_on_device_datasets", "random_generator"]
