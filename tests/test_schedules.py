"""Tests for spark_imagenet.training.job.schedules (pure Python) and .keras_schedule (the same formula in TensorFlow):
warm-up, step drops, cosine, scaling, validation, JSON, TF equality, resume at a restored step, saving."""

from __future__ import annotations

import dataclasses
import json
import math
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.worker.keras_schedule import KerasSchedule  # noqa: E402
from spark_imagenet.training.job.schedules import Schedule, default_boundaries  # noqa: E402


def make(**kw) -> Schedule:
    args = dict(kind="step", base_lr=0.01, global_batch=1024, steps_per_epoch=50, epochs=90)
    args.update(kw)
    return Schedule(**args)


# ------------------------------------------------------------------ pure Python
def test_linear_scaling_and_none():
    assert make().peak == pytest.approx(0.04)
    assert make(scaling="none").peak == 0.01
    assert make(global_batch=256).peak == pytest.approx(0.01)
    assert make(global_batch=64, kind="constant").at(123) == pytest.approx(0.0025)
    assert make(global_batch=64, kind="constant", scaling="none").at(123) == 0.01


def test_warmup_values_follow_the_formula():
    s = make(warmup_epochs=5)  # 250 warm-up steps, peak 0.04
    peak, w = s.peak, 250
    assert s.warmup_steps == w
    assert s.at(0) == pytest.approx(peak / w) and s.at(0) > 0
    assert s.at(124) == pytest.approx(peak * 125 / w)
    assert s.at(124) == pytest.approx(peak / 2)
    assert s.at(w - 1) == pytest.approx(peak)
    assert s.at(w) == pytest.approx(peak)  # first step after the warm-up
    assert all(s.at(i) < s.at(i + 1) for i in range(w - 1))


def test_fractional_warmup_rounds_to_the_nearest_step():
    assert make(warmup_epochs=0.5, steps_per_epoch=5).warmup_steps == 3  # 2.5 -> 3 (halves up)
    assert make(warmup_epochs=0.01, steps_per_epoch=5).warmup_steps == 0
    s = make(kind="constant", warmup_epochs=0.01, steps_per_epoch=5)
    assert s.at(0) == s.peak


def test_step_drops_exactly_at_the_boundary_steps():
    s = make(warmup_epochs=5)
    assert s.boundary_epochs == (30, 60, 80)
    assert s.boundary_steps == (1500, 3000, 4000)
    peak = s.peak
    for i, b in enumerate(s.boundary_steps):
        assert s.at(b - 1) == pytest.approx(peak / 10 ** i)
        assert s.at(b) == pytest.approx(peak / 10 ** (i + 1))
    assert s.at(s.total_steps - 1) == pytest.approx(peak / 1000)
    assert s.at(s.total_steps + 100) == pytest.approx(peak / 1000)


def test_given_boundaries_and_factor():
    s = make(epochs=10, steps_per_epoch=7, boundaries=(2.5, 6), factor=4)
    assert s.boundary_steps == (18, 42)  # 17.5 -> 18
    assert s.at(17) == pytest.approx(s.peak) and s.at(18) == pytest.approx(s.peak / 4)
    assert s.at(41) == pytest.approx(s.peak / 4) and s.at(42) == pytest.approx(s.peak / 16)
    assert make(boundaries=[10, 20]).boundaries == (10, 20)


def test_default_boundaries_for_90_and_10_epochs():
    assert default_boundaries(90) == (30, 60, 80)
    assert default_boundaries(10) == (3, 7, 9)
    assert default_boundaries(1) == (1,)
    assert default_boundaries(2) == (1, 2)
    s = make(epochs=10, steps_per_epoch=20)
    assert s.boundaries == () and s.boundary_steps == (60, 140, 180)
    assert s.at(59) == pytest.approx(s.peak) and s.at(60) == pytest.approx(s.peak / 10)
    assert s.at(180) == pytest.approx(s.peak / 1000)


def test_cosine_start_middle_end():
    s = make(kind="cosine", epochs=10, steps_per_epoch=10, warmup_epochs=2)  # W = 20, T = 100
    peak = s.peak
    assert s.at(19) == pytest.approx(peak)
    assert s.at(20) == pytest.approx(peak)
    assert s.at(60) == pytest.approx(peak / 2)  # half of the 80 post-warm-up steps
    assert s.at(40) == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi / 4)))
    assert s.at(99) == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi * 79 / 80)))
    assert 0 < s.at(99) < s.at(98)
    assert s.at(100) == 0.0 and s.at(1000) == 0.0
    no_warmup = make(kind="cosine", epochs=1, steps_per_epoch=4)
    assert [no_warmup.at(i) for i in range(5)] == pytest.approx(
        [peak, peak * 0.5 * (1 + math.cos(math.pi / 4)), peak / 2, peak * 0.5 * (1 + math.cos(3 * math.pi / 4)), 0])


def test_constant_schedule_and_bad_steps():
    s = make(kind="constant")
    assert s.boundary_steps == () and s.at(0) == s.at(10 ** 9) == s.peak
    assert s.at(np.int64(5)) == s.peak
    with pytest.raises(ValueError):
        s.at(-1)
    with pytest.raises(TypeError):
        s.at(1.5)


def test_describe():
    assert make(warmup_epochs=5).describe() == (
        "lr: step schedule, peak 0.04 (0.01 per 256 images x 1024 / 256, linear scaling), warm-up 5 epochs "
        "(250 steps), /10 at epochs 30, 60, 80 (default)")
    assert make(kind="cosine", scaling="none", epochs=1, warmup_epochs=0.5).describe() == (
        "lr: cosine schedule, peak 0.01 (no scaling), warm-up 0.5 epochs (25 steps), cosine decay to 0 at step 50 "
        "(end of 1 epoch)")
    assert make(kind="constant").describe().endswith("no warm-up")
    assert make(boundaries=(10, 20.5), factor=2).describe().endswith("/2 at epochs 10, 20.5")


def test_json_round_trip():
    for s in (make(), make(kind="cosine", warmup_epochs=1.5), make(boundaries=(10, 20.5), factor=2.5),
              make(kind="constant", scaling="none", base_lr=1)):
        data = json.loads(json.dumps(s.to_json()))
        assert data["format"] == "spark-imagenet-lr-schedule" and data["format_version"] == 1
        back = Schedule.from_json(data)
        assert back == s and back.at(777) == s.at(777)


@pytest.mark.parametrize("data, message", [
    ({"format": "other"}, "not a spark-imagenet learning-rate schedule"),
    ({**make().to_json(), "format_version": 2}, "format_version 2 is not supported"),
    ({k: v for k, v in make().to_json().items() if k != "epochs"}, "missing key(s) epochs"),
    ({**make().to_json(), "colour": 1}, "unknown key(s) colour"),
    ({**make().to_json(), "kind": "linear"}, "--lr-schedule"),
])
def test_from_json_refuses(data, message):
    with pytest.raises(ConfigError, match="spec: ") as e:
        Schedule.from_json(data, "spec")
    assert message in str(e.value)


@pytest.mark.parametrize("kw, option, text", [
    (dict(kind="exponential"), "--lr-schedule", "one of constant, step, cosine"),
    (dict(scaling="sqrt"), "--lr-scaling", "one of linear, none"),
    (dict(base_lr=0), "--learning-rate", "positive"),
    (dict(base_lr=-0.1), "--learning-rate", "-0.1"),
    (dict(base_lr=float("nan")), "--learning-rate", "positive"),
    (dict(base_lr="0.1"), "--learning-rate", "positive"),
    (dict(warmup_epochs=-1), "--warmup-epochs", ">= 0"),
    (dict(warmup_epochs=91), "--warmup-epochs", "longer than training"),
    (dict(kind="cosine", epochs=2, warmup_epochs=2.5), "--warmup-epochs", "longer than training"),
    (dict(epochs=0), "--epochs", "positive integer"),
    (dict(epochs=True), "--epochs", "positive integer"),
    (dict(global_batch=0), "--batch-size", "positive integer"),
    (dict(steps_per_epoch=2.0), "steps per epoch", "positive integer"),
    (dict(boundaries=(0, 30)), "--lr-boundaries", "outside (0, 90]"),
    (dict(boundaries=(30, 91)), "--lr-boundaries", "outside (0, 90]"),
    (dict(boundaries=(-5,)), "--lr-boundaries", "outside"),
    (dict(boundaries=(60, 30)), "--lr-boundaries", "strictly increasing"),
    (dict(boundaries=(30, 30)), "--lr-boundaries", "strictly increasing"),
    (dict(boundaries=(30, 30.001)), "--lr-boundaries", "same step"),
    (dict(boundaries="30"), "--lr-boundaries", "numbers"),
    (dict(boundaries=(3,), warmup_epochs=5), "--warmup-epochs", "within the 5-epoch warm-up"),
    (dict(epochs=10, warmup_epochs=5), "--lr-schedule cosine", "default drops at epochs 3, 7, 9"),
    (dict(boundaries=(0.001,)), "--lr-boundaries", "before the first step"),
    (dict(kind="cosine", boundaries=(30,)), "--lr-boundaries", "only to --lr-schedule step"),
    (dict(factor=1), "step schedule's factor", "> 1"),
    (dict(factor=0.1), "step schedule's factor", "> 1"),
])
def test_bad_values_raise_config_error_naming_the_option(kw, option, text):
    with pytest.raises(ConfigError) as e:
        make(**kw)
    assert option in str(e.value) and text in str(e.value), str(e.value)


def test_every_problem_is_listed():
    with pytest.raises(ConfigError) as e:
        make(kind="exp", scaling="x", base_lr=-1, warmup_epochs=-2)
    for option in ("--lr-schedule", "--lr-scaling", "--learning-rate", "--warmup-epochs"):
        assert option in str(e.value)


def test_warmup_as_long_as_training_is_allowed():
    s = make(kind="cosine", epochs=2, steps_per_epoch=3, warmup_epochs=2)
    assert [s.at(i) for i in range(6)] == pytest.approx([s.peak * (i + 1) / 6 for i in range(6)])
    assert s.at(6) == 0.0


# ------------------------------------------------------------------ TensorFlow
SCHEDULES = {
    "step-warmup": make(epochs=9, steps_per_epoch=11, warmup_epochs=1.5, boundaries=(3, 6, 8)),
    "step-default": make(epochs=10, steps_per_epoch=7, factor=3),
    "cosine-warmup": make(kind="cosine", epochs=5, steps_per_epoch=13, warmup_epochs=1, scaling="none"),
    "cosine": make(kind="cosine", epochs=3, steps_per_epoch=10, base_lr=0.1, global_batch=4096),
    "constant-warmup": make(kind="constant", epochs=4, steps_per_epoch=9, warmup_epochs=2, global_batch=32),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_keras_schedule_equals_python_eagerly_and_in_tf_function(name):
    s = SCHEDULES[name]
    ks = KerasSchedule(s)
    steps = list(range(s.total_steps + 5))
    want = np.array([s.at(i) for i in steps])
    eager = np.array([ks(tf.constant(i, tf.int64)).numpy() for i in steps])
    assert ks(tf.constant(0, tf.int64)).dtype == tf.float32
    np.testing.assert_allclose(eager, want, rtol=1e-6, atol=0)
    graph = tf.function(lambda i: ks(i))
    in_graph = np.array([graph(tf.constant(i, tf.int64)).numpy() for i in steps])
    np.testing.assert_allclose(in_graph, want, rtol=1e-6, atol=0)
    mapped = tf.function(lambda x: tf.map_fn(ks, x, fn_output_signature=tf.float32))
    np.testing.assert_allclose(mapped(tf.constant(steps, tf.int64)).numpy(), want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(ks(7).numpy(), s.at(7), rtol=1e-6)


def test_resumed_optimizer_uses_the_rate_of_its_restored_step(tmp_path):
    """Set ``iterations`` to k (as a checkpoint restore does): the next update uses lr(k)."""
    s = SCHEDULES["step-warmup"]
    for k in (0, 5, s.warmup_steps, s.boundary_steps[0] - 1, s.boundary_steps[0], s.boundary_steps[2] + 3):
        w = tf.Variable(0.0)
        opt = keras.optimizers.SGD(learning_rate=KerasSchedule(s))
        opt.build([w])
        opt.iterations.assign(k)
        np.testing.assert_allclose(opt._learning_rate(opt.iterations).numpy(), s.at(k), rtol=1e-6)
        opt.apply_gradients([(tf.constant(1.0), w)])  # plain SGD: w -= lr(k) * 1
        np.testing.assert_allclose(-w.numpy(), s.at(k), rtol=1e-6)
        np.testing.assert_allclose(opt.learning_rate.numpy(), s.at(k), rtol=1e-6)  # the rate of the last step
        assert int(opt.iterations.numpy()) == k + 1
    # Through a real tf.train.Checkpoint: a fresh optimizer restored at step k steps with lr(k).
    k = s.boundary_steps[1]
    w = tf.Variable(0.0)
    opt = keras.optimizers.SGD(learning_rate=KerasSchedule(s), momentum=0.9)
    opt.build([w])
    opt.iterations.assign(k)
    path = tf.train.Checkpoint(optimizer=opt, w=w).write(str(tmp_path / "ckpt"))
    w2 = tf.Variable(0.0)
    opt2 = keras.optimizers.SGD(learning_rate=KerasSchedule(s), momentum=0.9)
    opt2.build([w2])
    tf.train.Checkpoint(optimizer=opt2, w=w2).read(path).assert_consumed()
    assert int(opt2.iterations.numpy()) == k
    opt2.apply_gradients([(tf.constant(1.0), w2)])
    np.testing.assert_allclose(-w2.numpy(), s.at(k), rtol=1e-6)


def test_get_config_from_config_and_serialization():
    s = SCHEDULES["cosine-warmup"]
    ks = KerasSchedule(s)
    config = json.loads(json.dumps(ks.get_config()))
    back = KerasSchedule.from_config(config)
    assert back.schedule == s and back.name == ks.name
    serialized = json.loads(json.dumps(keras.optimizers.schedules.serialize(ks)))
    again = keras.optimizers.schedules.deserialize(serialized)
    assert isinstance(again, KerasSchedule) and again.schedule == s
    with pytest.raises(TypeError):
        KerasSchedule(s.to_json())
    with pytest.raises(ConfigError, match="KerasSchedule config"):
        KerasSchedule.from_config({"schedule": {**s.to_json(), "epochs": 0}})


def test_saved_model_with_its_optimizer_reloads(tmp_path):
    s = SCHEDULES["step-warmup"]
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=KerasSchedule(s), momentum=0.9), loss="mse")
    x, y = np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32)
    model.fit(x, y, batch_size=4, epochs=3, verbose=0)  # 6 steps
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    opt = loaded.optimizer
    assert isinstance(opt._learning_rate, KerasSchedule) and opt._learning_rate.schedule == s
    assert int(opt.iterations.numpy()) == 6
    np.testing.assert_allclose(opt._learning_rate(opt.iterations).numpy(), s.at(6), rtol=1e-6)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)


def test_extending_a_finished_run_says_the_schedule_is_stretched():
    from spark_imagenet.training.job.schedules import extension_note

    cosine = Schedule(kind="cosine", base_lr=0.002, global_batch=256, steps_per_epoch=10, epochs=10, scaling="none")
    note = extension_note(cosine, planned_epochs=4, epochs_done=4)
    planned = dataclasses.replace(cosine, epochs=4)
    assert note == (f"lr: --epochs 10 instead of the checkpoint's 4 stretches the cosine schedule to 10 epochs: the "
                    f"learning rate goes from {planned.at(39):.3g} (the last step trained) to {cosine.at(40):.3g} "
                    "at epoch 5 (the 4-epoch schedule had 0)")
    assert cosine.at(40) > 100 * planned.at(39)  # the jump the line warns about
    assert "at epoch 3" in extension_note(cosine, planned_epochs=4, epochs_done=2)  # a relaunch mid-run too
    assert extension_note(cosine, planned_epochs=10, epochs_done=4) is None  # the same run resumed
    assert extension_note(cosine, planned_epochs=4, epochs_done=10) is None  # nothing left to train
    constant = dataclasses.replace(cosine, kind="constant")
    assert extension_note(constant, planned_epochs=4, epochs_done=4) is None
    fixed = dataclasses.replace(cosine, kind="step", boundaries=(2, 3))
    assert extension_note(fixed, planned_epochs=4, epochs_done=4) is None  # --lr-boundaries do not move
    assert "step schedule" in extension_note(dataclasses.replace(cosine, kind="step"), 4, 4)  # default drops do
