"""compile_model's optimizers (SGD, LARS), weight decay, label smoothing, mixed precision and XLA, on real
TensorFlow (CPU)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.worker import model_state  # noqa: E402
from spark_imagenet.training.worker.keras_schedule import KerasSchedule  # noqa: E402
from spark_imagenet.training.worker.models.alexnet import build_alexnet  # noqa: E402
from spark_imagenet.training.worker.models.compile import (  # noqa: E402
    SmoothedSparseCrossentropy,
    compile_model,
    decayed_kernels,
    describe_compiled,
    float32_logits,
    set_precision,
)
from spark_imagenet.training.worker.optimizers import LARS, DecayedSGD  # noqa: E402
from spark_imagenet.training.job.schedules import Schedule  # noqa: E402


@pytest.fixture(autouse=True)
def float32_afterwards():
    """The mixed-precision policy is global to the process: every test leaves it at float32."""
    yield
    set_precision("float32")
    keras.backend.clear_session()


def _colours(n: int = 32, size: int = 67, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable 4-class task: noisy solid colours, normalised like the pipeline's images."""
    rng = np.random.default_rng(seed)
    colours = np.array([[220, 30, 30], [30, 200, 30], [30, 30, 220], [230, 220, 40]], np.float32)
    y = np.arange(n) % 4
    x = colours[y][:, None, None, :] + rng.normal(0, 20, size=(n, size, size, 3))
    x = (x - np.array([123.675, 116.28, 103.53])) / np.array([58.395, 57.12, 57.375])
    return x.astype(np.float32), y


def _tiny_alexnet(num_classes: int = 4, seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return float32_logits(build_alexnet(num_classes, 67, 0.25))


def _sum_squares(variables) -> float:
    return float(sum(np.sum(np.square(v.numpy().astype(np.float64))) for v in variables))


def test_weight_decay_is_in_the_optimizer_not_the_loss():
    model = _tiny_alexnet()
    kernels = decayed_kernels(model)
    # 5 conv + 3 dense kernels; no bias (rank 1) among them
    assert [k.shape.rank for k in kernels] == [4] * 5 + [2] * 3
    assert not any(layer.losses for layer in model.layers)  # no regularisers baked into AlexNet
    x, y = _colours(16)
    for kwargs in ({"weight_decay": 5e-4}, {"weight_decay": 0.0}, {"optimizer": "lars", "weight_decay": 5e-4}):
        compile_model(model, 0.01, **kwargs)
        assert not model.losses
        scores = model.evaluate(x, y, batch_size=16, return_dict=True, verbose=0)
        assert scores["loss"] == pytest.approx(scores["xent"], rel=1e-5)  # the reported loss is the data loss
    compile_model(model, 0.01, weight_decay=5e-4)
    assert isinstance(model.optimizer, DecayedSGD) and model.optimizer.l2_weight_decay == 5e-4
    again = DecayedSGD.from_config(model.optimizer.get_config())  # as a .keras file reloads it
    assert again.l2_weight_decay == 5e-4 and again.momentum == pytest.approx(0.9)


def test_sgd_with_momentum_and_decay_in_the_step_equals_sgd_on_the_loss_plus_the_l2_term():
    """Three steps of DecayedSGD (momentum 0.9, wd 0.05) give the weights and velocities of plain momentum SGD on
    the data loss plus 0.05 / 2 * sum(kernel ** 2): the same update, without the term in the loss."""
    x, y = _colours(16)
    models = []
    for in_step in (True, False):
        model = _tiny_alexnet(seed=3)
        if in_step:
            compile_model(model, 0.05, momentum=0.9, weight_decay=0.05)
        else:
            kernels = decayed_kernels(model)
            model.add_loss(lambda: 0.05 / 2 * tf.add_n([tf.reduce_sum(tf.square(k)) for k in kernels]))
            model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for _ in range(3):
            model.train_on_batch(x, y)
        models.append(model)
    for a, b in zip(models[0].get_weights(), models[1].get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    velocities = [[v.numpy() for v in m.optimizer.momentums] for m in models]
    assert len(velocities[0]) == len(models[0].trainable_variables)
    for a, b in zip(*velocities, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_sgd_weight_decay_gradient_is_wd_times_w():
    """With momentum 0, one step on a batch whose data gradient we know moves w by -lr * (g + wd * w)."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="d")(inputs))
    compile_model(model, 0.1, momentum=0.0, weight_decay=0.5)
    x, y = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32), np.arange(8) % 2
    kernel, bias = (w.numpy() for w in model.get_layer("d").weights)
    with tf.GradientTape() as tape:
        data_loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
    g_kernel, g_bias = (g.numpy() for g in tape.gradient(data_loss, model.get_layer("d").weights))
    model.train_on_batch(x, y)
    new_kernel, new_bias = (w.numpy() for w in model.get_layer("d").weights)
    np.testing.assert_allclose(new_kernel, kernel - 0.1 * (g_kernel + 0.5 * kernel), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_bias, bias - 0.1 * g_bias, rtol=1e-5, atol=1e-6)  # biases not decayed


def test_label_smoothing_loss_and_unsmoothed_xent():
    logits = tf.constant([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]])
    labels = tf.constant([0, 2])
    smoothed = SmoothedSparseCrossentropy(0.1)(labels, logits)
    reference = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)(
        tf.one_hot(labels, 3), logits)
    assert float(smoothed) == pytest.approx(float(reference), rel=1e-6)
    # by hand: targets (1 - 0.1) * one_hot + 0.1 / 3
    targets = 0.9 * np.eye(3)[[0, 2]] + 0.1 / 3
    log_p = logits.numpy() - np.log(np.exp(logits.numpy()).sum(axis=1, keepdims=True))
    assert float(smoothed) == pytest.approx(float(-(targets * log_p).sum(axis=1).mean()), rel=1e-5)
    model = _tiny_alexnet()
    compile_model(model, 0.01, label_smoothing=0.1)
    x, y = _colours(16)
    scores = model.evaluate(x, y, batch_size=16, return_dict=True, verbose=0)
    plain = float(tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)))
    assert scores["xent"] == pytest.approx(plain, rel=1e-4)  # the metric stays unsmoothed
    assert scores["loss"] != pytest.approx(scores["xent"], rel=1e-3)


def _numpy_lars(w, v, g, lr, m, wd, eta):
    if w.ndim >= 2:
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        local = eta * w_norm / (g_norm + wd * w_norm) if w_norm > 0 and g_norm > 0 else 1.0
        v = m * v + lr * local * (g + wd * w)
    else:
        v = m * v + lr * g
    return w - v, v


def test_lars_matches_numpy_for_several_steps():
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(3, 3, 2, 4)), rng.normal(size=(5, 4)), rng.normal(size=(4,)), np.zeros((2, 2))]
    variables = [tf.Variable(w.astype(np.float32)) for w in start]
    schedule = Schedule(kind="cosine", base_lr=0.5, global_batch=256, steps_per_epoch=1, epochs=5, scaling="none",
                        warmup_epochs=2)
    opt = LARS(KerasSchedule(schedule), momentum=0.9, weight_decay=1e-2, trust_coefficient=0.02)
    ws, vs = [w.copy() for w in start], [np.zeros_like(w) for w in start]
    for step in range(5):
        grads = [rng.normal(size=w.shape) for w in start]
        grads[1] *= 0.0 if step == 1 else 1.0  # a zero gradient: local rate 1
        opt.apply_gradients(zip([tf.constant(g, tf.float32) for g in grads], variables))
        lr = schedule.at(step)
        for i, g in enumerate(grads):
            ws[i], vs[i] = _numpy_lars(ws[i], vs[i], g, lr, 0.9, 1e-2, 0.02)
    assert int(opt.iterations) == 5
    for var, w in zip(variables, ws):
        np.testing.assert_allclose(var.numpy(), w, rtol=2e-5, atol=2e-6)
    for vel, v in zip(opt.velocities, vs):
        np.testing.assert_allclose(vel.numpy(), v, rtol=2e-5, atol=2e-6)
    again = LARS.from_config(opt.get_config())
    assert (again.momentum, again.lars_weight_decay, again.trust_coefficient) == (0.9, 1e-2, 0.02)


@pytest.mark.slow
def test_lars_velocities_survive_a_checkpoint(tmp_path):
    x, y = _colours(16)
    model = _tiny_alexnet()
    compile_model(model, 0.1, optimizer="lars", momentum=0.9, weight_decay=5e-4)
    assert isinstance(model.optimizer, LARS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    prefix = str(tmp_path / "ckpt")
    model_state._trackable(model).write(prefix)
    other = _tiny_alexnet(seed=9)
    compile_model(other, 0.1, optimizer="lars", momentum=0.9, weight_decay=5e-4)
    other.optimizer.build(other.trainable_variables)
    model_state._trackable(other).read(prefix).assert_existing_objects_matched()
    assert int(other.optimizer.iterations) == 2
    assert any(np.abs(v.numpy()).sum() > 0 for v in model.optimizer.velocities)
    for a, b in zip(model.optimizer.velocities, other.optimizer.velocities):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(model.weights, other.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _fit_losses(model: keras.Model, epochs: int = 4) -> list[float]:
    x, y = _colours(32)
    return model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0).history["xent"]


@pytest.mark.slow
def test_mixed_bfloat16_trains_with_float32_logits():
    set_precision("mixed_bfloat16")
    model = _tiny_alexnet()
    assert model.get_layer("conv1").compute_dtype == "bfloat16"
    assert model.get_layer("conv1").kernel.dtype == tf.float32  # variables stay float32
    assert model.get_layer("logits").compute_dtype == "bfloat16" and model.output.dtype == tf.float32
    compile_model(model, 0.005, weight_decay=5e-4, label_smoothing=0.1)
    assert model(_colours(2)[0]).dtype == tf.float32
    before = [w.numpy().copy() for w in model.trainable_weights]
    losses = _fit_losses(model)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert all(not np.array_equal(a, w.numpy()) for a, w in zip(before, model.trainable_weights))


def test_float32_model_keeps_its_outputs():
    model = build_alexnet(4, 67, 0.25)
    assert float32_logits(model) is model


@pytest.mark.slow
def test_mixed_float16_wraps_the_optimizer_in_loss_scaling():
    set_precision("mixed_float16")
    model = _tiny_alexnet()
    schedule = KerasSchedule(Schedule(kind="step", base_lr=0.005, global_batch=8, steps_per_epoch=4, epochs=2,
                                      scaling="none", boundaries=(1,)))
    compile_model(model, schedule, optimizer="lars", weight_decay=5e-4)
    assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, LARS)
    assert describe_compiled(model) == "LARS in LossScaleOptimizer, compute float16, XLA: off"
    losses = _fit_losses(model, epochs=2)
    assert all(math.isfinite(v) for v in losses)
    assert float(model.optimizer.loss_scale) > 1  # dynamic loss scale, 2**15 at the start
    # what the worker's epoch line and TensorBoard read: the rate of the last step (step 7: after the drop)
    assert float(keras.backend.get_value(model.optimizer.learning_rate)) == pytest.approx(0.0005, rel=1e-5)


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)])  # XLA compiles: slow tier
def test_uint8_batches_train_and_evaluate_as_the_host_normalized_ones(jit):
    """The pipeline hands on uint8 pixels (and the lighting shifts beside them); the compiled model's train and
    test steps normalize them first: the same weights and scores as float32 batches normalized on the host."""
    from spark_imagenet.training.worker import preprocessing

    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (8, 6, 6, 3), dtype=np.uint8)
    shifts = rng.normal(0, 4, (8, 3)).astype(np.float32)
    labels, weights = np.arange(8) % 3, np.array([1, 1, 1, 1, 1, 0, 0, 0], np.float32)
    host = preprocessing.normalizer(6)(tf.constant(pixels)).numpy()
    host_lit = preprocessing.lighting_normalizer(6)(tf.constant(pixels), tf.constant(shifts)).numpy()

    def trained(x, x_eval):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6, 6, 3))
        model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(inputs)))
        compile_model(model, 0.05, weight_decay=1e-3, jit_compile=jit)
        model.fit(tf.data.Dataset.from_tensor_slices((x, labels)).batch(4), epochs=2, verbose=0)
        scores = model.evaluate(tf.data.Dataset.from_tensor_slices((x_eval, labels, weights)).batch(4),
                                return_dict=True, verbose=0)
        return [w.numpy() for w in model.weights], scores

    for uint8_input, float_input in [((pixels, pixels), (host, host)),
                                     (((pixels, shifts), pixels), (host_lit, host))]:
        got, got_scores = trained(*uint8_input)
        want, want_scores = trained(*float_input)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        assert got_scores == pytest.approx(want_scores, abs=1e-5)


@pytest.mark.slow
def test_jit_compile_trains_on_cpu():
    model = _tiny_alexnet()
    compile_model(model, 0.2, optimizer="lars", weight_decay=5e-4, label_smoothing=0.1, jit_compile=True)
    assert model.jit_compile and describe_compiled(model) == "LARS, compute float32, XLA: the whole step"
    losses = _fit_losses(model)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


@pytest.mark.slow
def test_a_trained_model_saves_and_loads_without_training_losses(tmp_path):
    from spark_imagenet.training.worker.evaluate import load_model

    set_precision("mixed_bfloat16")
    model = _tiny_alexnet()
    compile_model(model, 0.01, weight_decay=5e-4, label_smoothing=0.1)
    _fit_losses(model, epochs=1)
    path = str(tmp_path / "model.keras")
    model.save(path)
    set_precision("float32")
    loaded = load_model(path)
    assert loaded.losses == [] and loaded.output.dtype == tf.float32
    x, _ = _colours(4)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    compile_model(loaded, 0.01)  # as evaluate does
    scores = loaded.evaluate(x, np.arange(4), return_dict=True, verbose=0)
    assert scores["loss"] == pytest.approx(scores["xent"], rel=1e-5)


@pytest.mark.parametrize("kwargs, option", [
    ({"learning_rate": 0.0}, "--learning-rate"),
    ({"optimizer": "adam"}, "--optimizer"),
    ({"momentum": 1.0}, "--momentum"),
    ({"weight_decay": -1.0}, "--weight-decay"),
    ({"label_smoothing": 1.0}, "--label-smoothing"),
])
def test_bad_arguments_name_the_option(kwargs, option):
    model = build_alexnet(4, 67, 0.25)
    kwargs = {"learning_rate": 0.01, **kwargs}
    with pytest.raises(ConfigError, match=option):
        compile_model(model, kwargs.pop("learning_rate"), **kwargs)
    with pytest.raises(ConfigError, match="--precision.*mixed_bfloat16"):
        set_precision("bfloat16")


_TWO_REPLICAS = r"""
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_keras as keras
from spark_imagenet.training.worker.models.compile import compile_model

def weights_after_steps(strategy, optimizer, jit):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(5, activation="relu")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
        compile_model(model, 0.1, optimizer=optimizer, momentum=0.9, weight_decay=0.05, label_smoothing=0.1,
                      jit_compile=jit)
    assert model.__dict__["_spark_imagenet_split_xla"] == (jit and strategy.num_replicas_in_sync > 1)  # XLA gradients
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(16, 6)).astype(np.float32), np.arange(16) % 3
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # the global batch, split over the replicas
    model.fit(ds, epochs=3, verbose=0)
    return [w.numpy().tolist() for w in model.weights]

mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert mirrored.num_replicas_in_sync == 2
one = tf.distribute.get_strategy()
runs = {"sgd": ("sgd", False), "lars": ("lars", False), "lars+xla": ("lars", True)}
print(json.dumps({name: [weights_after_steps(mirrored, *run), weights_after_steps(one, *run)]
                  for name, run in runs.items()}))
"""


@pytest.mark.slow
def test_two_replicas_train_as_one_with_weight_decay_lars_and_xla():
    """The L2 term is counted once per step, not once per replica, and LARS' per-tensor norms agree: 2
    synchronous replicas (MirroredStrategy over 2 logical CPUs, the loss scaling tf-keras also applies under
    MultiWorkerMirroredStrategy) end with the weights of one device on the same global batches; also with
    XLA, whose gradients step keeps the all-reduce outside (XLA cannot compile it for CPU)."""
    out = subprocess.run([sys.executable, "-c", _TWO_REPLICAS], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    for opt, (two, one) in json.loads(out.stdout.strip().splitlines()[-1]).items():
        for a, b in zip(two, one):
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-6, err_msg=opt)


@pytest.mark.slow
def test_bf16_xla_lars_label_smoothing_train_end_to_end(log_lines, spark, tmp_path):
    """The issue's 'mixed_bfloat16 and --jit-compile train a tiny model on CPU', through the driver on local
    Spark: two MultiWorkerMirroredStrategy workers (XLA-compiled steps with their gradient all-reduce), LARS,
    label smoothing 0.1, one epoch of a tiny AlexNet at 67 px."""
    from data_util import small_layout
    from spark_imagenet.dataset.sharding import shard
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.job.config import TrainConfig

    tree = small_layout(tmp_path / "kaggle")  # 4 classes x 6 train, 3 val each
    shard(tree, tmp_path / "bucket", train_shards=2, val_shards=1, processes=1, progress=False)
    lines = log_lines
    lines.clear()  # the lines from here on
    out = train(spark, str(tmp_path / "bucket"), TrainConfig(workers=2, epochs=1, batch_size=4, image_size=67,
                                                             width=0.25, learning_rate=1.0, optimizer="lars",
                                                             precision="mixed_bfloat16", jit_compile=True,
                                                             label_smoothing=0.1, cache=tmp_path / "cache",
                                                             output=str(tmp_path / "out")))
    assert "recipe: optimizer lars, momentum 0.9, weight decay 0.0005, label smoothing 0.1, precision " \
           "mixed_bfloat16, XLA on" in lines
    # what each worker compiled: LARS, bfloat16 layers, XLA for the forward pass and gradients
    # the chief's published model: bfloat16 layers, float32 logits, no training-only losses
    model = keras.models.load_model(str(tmp_path / "out" / "model.keras"), compile=False)
    assert model.get_layer("conv1").compute_dtype == "bfloat16" and model.output.dtype == tf.float32
    assert model.losses == []
    assert [w.steps for w in out.per_worker] == [3, 3]  # 24 images / (4 x 2) per step
    assert math.isfinite(out.train.loss) and out.train.loss > 0
    assert out.val.images == 12 and math.isfinite(out.val.loss)
    assert 0 <= out.val.top1 <= out.val.top5 <= 1
