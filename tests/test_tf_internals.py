"""The TensorFlow internals the package touches (spark_imagenet.training.worker.tf_internals) exist in the
installed TensorFlow, and no other module reaches into one: an upgrade that drops one fails here, clearly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spark_imagenet.training.worker import tf_internals

PACKAGE = Path(tf_internals.__file__).resolve().parents[2]
#: What reaching into TensorFlow's or tf-keras' private parts looks like in source.
PRIVATE = re.compile(r"tensorflow\.python|tf_keras\.src|keras\.src|check_collective_ops_peer_health"
                     r"|context\.context\(\)|\._flatten_layers|\._random_generator|_create_device_dataset")


@pytest.mark.parametrize("internal", tf_internals.INTERNALS, ids=lambda i: i.name)
def test_each_listed_internal_exists_in_the_installed_tensorflow(internal):
    assert internal.checked_with == tf_internals.CHECKED_WITH
    assert tf_internals._resolve(internal) is not None, internal.name


def test_missing_internals_is_empty_and_names_one_that_is_gone(monkeypatch):
    assert tf_internals.missing_internals() == []
    gone = tf_internals.Internal("tensorflow.python.eager.context", "no_such_thing", "2.21", "a test")
    monkeypatch.setattr(tf_internals, "INTERNALS", (gone,))
    [line] = tf_internals.missing_internals()
    assert line.startswith("tensorflow.python.eager.context.no_such_thing (checked with TensorFlow 2.21; used "
                           "for a test): AttributeError")


def test_no_other_module_touches_a_tensorflow_internal():
    found = [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "tf_internals.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE.search(line)]
    assert found == []


def test_the_shims_work():
    import tensorflow as tf
    import tf_keras as keras

    was = keras.backend.experimental.is_tf_random_generator_enabled()
    keras.backend.experimental.enable_tf_random_generator()  # as the worker does
    try:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dropout(0.5, seed=1)])
        model(tf.ones((1, 2)), training=True)
    finally:
        if not was:
            keras.backend.experimental.disable_tf_random_generator()
    dense, dropout = model.layers
    assert [layer.name for layer in tf_internals.flatten_layers(model, include_self=False)][-2:] == [
        dense.name, dropout.name]
    assert next(iter(tf_internals.flatten_layers(model))) is model
    assert tf_internals.random_generator(dense) is None
    assert isinstance(tf_internals.random_generator(dropout), tf.random.Generator)
    assert tf_internals.no_autotune_on_device_datasets() is True
    assert tf_internals.no_autotune_on_device_datasets() is True  # installed once
    with pytest.raises((tf.errors.OpError, ValueError, RuntimeError)):
        tf_internals.check_peer_health("/job:worker/replica:0/task:1", 0.1)  # no cluster here
