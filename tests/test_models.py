"""Tests for spark_imagenet.training.models.registry: AlexNet shapes, parameter counts, errors, compile and learning."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.models.registry import MODELS, build_model, compile_model  # noqa: E402
from spark_imagenet.training.models.alexnet_layers import feature_map_size, min_image_size  # noqa: E402


def _alexnet_params(num_classes: int, flatten: int, width: float = 1.0) -> int:
    """Parameter count of the single-tower AlexNet, written out layer by layer
    (kernel h * w * in * out + out biases) from the paper's table, independent
    of the model code."""
    w = lambda n: max(1, round(n * width))  # noqa: E731
    convs = [(11, 3, w(96)), (5, w(96), w(256)), (3, w(256), w(384)), (3, w(384), w(384)), (3, w(384), w(256))]
    total = sum(k * k * cin * cout + cout for k, cin, cout in convs)
    dense = [(flatten, w(4096)), (w(4096), w(4096)), (w(4096), num_classes)]
    return total + sum(i * o + o for i, o in dense)


def test_alexnet_224_full_width_has_6400_flatten_and_50_8m_params():
    model = build_model("alexnet", 1000, 224, 1.0)
    shapes = {layer.name: tuple(layer.output_shape[1:]) for layer in model.layers}
    assert shapes["conv1"] == (54, 54, 96)
    assert shapes["pool1"] == (26, 26, 96)
    assert shapes["conv2"] == (26, 26, 256)
    assert shapes["pool2"] == (12, 12, 256)
    assert shapes["conv5"] == (12, 12, 256)
    assert shapes["pool5"] == (5, 5, 256)
    assert shapes["flatten"] == (6400,)
    assert shapes["logits"] == (1000,)
    params = model.count_params()
    assert params == _alexnet_params(1000, 6400) == 50_844_008
    assert round(params / 1e6, 1) == 50.8
    assert model.input.dtype == tf.float32 and tuple(model.input.shape) == (None, 224, 224, 3)
    del model
    keras.backend.clear_session()


def test_alexnet_test_size_variant_shapes():
    model = build_model("alexnet", 100, 96, 0.25)
    shapes = {layer.name: tuple(layer.output_shape[1:]) for layer in model.layers}
    assert shapes["conv1"] == (22, 22, 24)
    assert shapes["pool5"] == (1, 1, 64)
    assert shapes["fc6"] == (1024,)
    assert shapes["logits"] == (100,)
    assert model.count_params() == _alexnet_params(100, 64, 0.25)
    out = model(np.zeros((2, 96, 96, 3), np.float32), training=False)
    assert out.shape == (2, 100) and out.dtype == tf.float32
    keras.backend.clear_session()


def test_weight_decay_on_every_kernel():
    model = build_model("alexnet", 10, 67, 0.25)
    kernels = [layer for layer in model.layers if hasattr(layer, "kernel")]
    assert len(kernels) == 8  # 5 conv + 3 dense
    # One L2 term per kernel: 2.5e-4 * sum(w^2), gradient 5e-4 * w.
    assert len(model.losses) == 8
    layer = model.get_layer("fc7")
    expected = 2.5e-4 * float(tf.reduce_sum(tf.square(layer.kernel)))
    assert float(layer.losses[0]) == pytest.approx(expected, rel=1e-5)
    keras.backend.clear_session()


def test_min_image_size_from_layer_arithmetic():
    assert min_image_size() == 67
    assert feature_map_size(66) == 0
    assert feature_map_size(67) == 1
    assert feature_map_size(224) == 5
    assert feature_map_size(227) == 6  # the paper's 6x6x256 = 9216 flatten
    model = build_model("alexnet", 10, 67, 0.25)
    assert model.get_layer("pool5").output_shape[1:3] == (1, 1)
    with pytest.raises(ConfigError, match=r"--image-size 66 .*at least 67"):
        build_model("alexnet", 10, 66, 0.25)
    keras.backend.clear_session()


def test_unknown_model_and_bad_settings():
    with pytest.raises(ConfigError, match=r"unknown model 'vgg16'.*alexnet"):
        build_model("vgg16", 10, 224, 1.0)
    assert "alexnet" in MODELS
    with pytest.raises(ConfigError, match="--width"):
        build_model("alexnet", 10, 224, 0.0)
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("alexnet", 0, 224, 1.0)
    model = build_model("alexnet", 10, 67, 0.25)
    with pytest.raises(ConfigError, match="--learning-rate"):
        compile_model(model, 0.0)
    keras.backend.clear_session()


def test_compile_model_sgd_momentum_and_metric_names():
    keras.utils.set_random_seed(1)
    model = compile_model(build_model("alexnet", 10, 67, 0.25), 0.01)
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert float(model.optimizer.momentum) == pytest.approx(0.9)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)
    x = np.random.default_rng(0).normal(size=(16, 67, 67, 3)).astype(np.float32)
    y = np.arange(16) % 10
    scores = model.evaluate(x, y, return_dict=True, verbose=0)
    assert set(scores) == {"loss", "top1", "top5", "xent"}
    # Glorot logits layer: the initial cross-entropy is near ln(10) = 2.30.
    assert abs(scores["xent"] - math.log(10)) < 1.0
    # Keras' loss adds the weight-decay term on top of the cross-entropy.
    assert scores["loss"] > scores["xent"]
    keras.backend.clear_session()


def test_weighted_metrics_ignore_zero_weight_padding():
    keras.utils.set_random_seed(2)
    model = compile_model(build_model("alexnet", 10, 67, 0.25), 0.01)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(12, 67, 67, 3)).astype(np.float32)
    y = rng.integers(0, 10, size=12)
    w = np.array([1.0] * 7 + [0.0] * 5, np.float32)
    x[7:] = 0.0  # padding rows as the eval pipeline makes them
    padded = model.evaluate(x, y, sample_weight=w, batch_size=4, return_dict=True, verbose=0)
    real = model.evaluate(x[:7], y[:7], batch_size=4, return_dict=True, verbose=0)
    for key in ("top1", "top5", "xent"):
        assert padded[key] == pytest.approx(real[key], rel=1e-5, abs=1e-6)
    # top1 over 7 real examples is a multiple of 1/7.
    assert padded["top1"] * 7 == pytest.approx(round(padded["top1"] * 7), abs=1e-5)
    keras.backend.clear_session()


def test_width_quarter_96px_learns_from_scratch_with_sgd_momentum():
    """With He-normal convs and Glorot dense layers the small model fits a
    4-colour task within 24 SGD steps from scratch."""
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(3)
    colours = np.array([[220, 30, 30], [30, 200, 30], [30, 30, 220], [230, 220, 40]], np.float32)
    y = np.tile(np.arange(4), 16)
    x = colours[y][:, None, None, :] + rng.normal(0, 20, size=(64, 96, 96, 3))
    x = ((x - np.array([123.675, 116.28, 103.53])) / np.array([58.395, 57.12, 57.375])).astype(np.float32)
    # Solid colours make the gradients of all conv positions agree, so they
    # need a smaller step than natural images: lr 0.01 diverged for 2 of 10
    # seeds, 0.005 learned in 6 of 6 (measured while choosing the init).
    model = compile_model(build_model("alexnet", 4, 96, 0.25), 0.005)
    model.fit(x, y, batch_size=16, epochs=6, shuffle=True, verbose=0)
    scores = model.evaluate(x, y, return_dict=True, verbose=0)
    assert scores["top1"] == 1.0
    assert scores["xent"] < 0.5 * math.log(4)
    keras.backend.clear_session()


def test_driver_side_table_matches_the_models():
    from spark_imagenet.errors import ConfigError
    from spark_imagenet.training.models.specs import MIN_IMAGE_SIZE, check_model_settings
    from spark_imagenet.training.models.registry import MODELS
    from spark_imagenet.training.models.alexnet_layers import min_image_size

    assert set(MIN_IMAGE_SIZE) == set(MODELS)
    assert MIN_IMAGE_SIZE["alexnet"] == min_image_size()
    check_model_settings("alexnet", min_image_size())
    with pytest.raises(ConfigError, match=r"--image-size 66 is too small for alexnet: .* at least 67 px"):
        check_model_settings("alexnet", 66)
    with pytest.raises(ConfigError, match=r"--model 'resnet' is not a known model; choose one of: alexnet"):
        check_model_settings("resnet", 224)
