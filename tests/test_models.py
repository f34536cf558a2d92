"""Tests for spark_imagenet.training.worker.models: AlexNet and ResNet-50 shapes, parameter counts, errors, compile and
learning; a user's builder (``--model package.module:function``) checked on the driver and in the worker."""

from __future__ import annotations

import math
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.job.model_specs import MODELS  # noqa: E402
from spark_imagenet.training.worker.models.compile import compile_model  # noqa: E402
from spark_imagenet.training.worker.models.registry import build_model  # noqa: E402
from spark_imagenet.training.job.alexnet_layers import feature_map_size, min_image_size  # noqa: E402


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
    kernels = [layer.kernel for layer in model.layers if hasattr(layer, "kernel")]
    assert len(kernels) == 8  # 5 conv + 3 dense
    assert model.losses == []  # no regularisers in the layers: compile_model adds the decay
    compile_model(model, 0.01, weight_decay=5e-4)
    # the decay (gradient 5e-4 * w) is in the optimizer's step, on exactly these kernels; no loss term
    assert model.losses == [] and model.optimizer.l2_weight_decay == 5e-4
    decayed = model.optimizer._decayed
    assert decayed == {model.optimizer._var_key(k) for k in kernels}
    assert not any(model.optimizer._var_key(v) in decayed for v in model.trainable_variables if v.shape.rank == 1)
    keras.backend.clear_session()


def test_min_image_size_from_layer_arithmetic():
    assert min_image_size() == 67
    assert feature_map_size(66) == 0
    assert feature_map_size(67) == 1
    assert feature_map_size(224) == 5
    assert feature_map_size(227) == 6  # the paper's 6x6x256 = 9216 flatten
    model = build_model("alexnet", 10, 67, 0.25)
    assert model.get_layer("pool5").output_shape[1:3] == (1, 1)
    with pytest.raises(ConfigError) as e:
        build_model("alexnet", 10, 66, 0.25)
    assert (e.value.key, e.value.value) == ("image_size", 66)
    keras.backend.clear_session()


def test_unknown_model_and_bad_settings():
    for args, key, value in ((("vgg16", 10, 224, 1.0), "model", "vgg16"), (("alexnet", 10, 224, 0.0), "width", 0.0),
                             (("alexnet", 0, 224, 1.0), "num_classes", 0)):
        with pytest.raises(ConfigError) as e:
            build_model(*args)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)
    assert "alexnet" in MODELS
    model = build_model("alexnet", 10, 67, 0.25)
    with pytest.raises(ConfigError) as e:
        compile_model(model, 0.0)
    assert (e.value.key, e.value.value) == ("learning_rate", 0.0)
    keras.backend.clear_session()


def test_compile_model_sgd_momentum_and_metric_names():
    keras.utils.set_random_seed(1)
    model = compile_model(build_model("alexnet", 10, 67, 0.25), 0.01, weight_decay=5e-4)
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert float(model.optimizer.momentum) == pytest.approx(0.9)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)
    x = np.random.default_rng(0).normal(size=(16, 67, 67, 3)).astype(np.float32)
    y = np.arange(16) % 10
    scores = model.evaluate(x, y, return_dict=True, verbose=0)
    assert set(scores) == {"loss", "top1", "top5", "xent"}
    # Glorot logits layer: the initial cross-entropy is near ln(10) = 2.30.
    assert abs(scores["xent"] - math.log(10)) < 1.0
    # the weight decay is in the optimizer's step, not the loss: Keras' loss is the cross-entropy
    assert scores["loss"] == pytest.approx(scores["xent"], rel=1e-6)
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
    from spark_imagenet.training.job.model_specs import check_model_settings
    from spark_imagenet.training.job.alexnet_layers import min_image_size
    from spark_imagenet.training.worker.models.resnet import MIN_IMAGE_SIZE as RESNET_MIN

    assert set(MODELS) == {"alexnet", "resnet50"}
    assert all(name == spec.name for name, spec in MODELS.items())
    assert {name for name, spec in MODELS.items() if spec.fixed_width} == {"resnet50"}
    assert MODELS["alexnet"].min_image_size == min_image_size()
    assert MODELS["resnet50"].min_image_size == RESNET_MIN == 32
    check_model_settings("alexnet", min_image_size())
    check_model_settings("resnet50", 32)
    for args, key, value in ((("alexnet", 66), "image_size", 66), (("resnet50", 31), "image_size", 31),
                             (("resnet50", 224, 0.5), "width", 0.5)):
        with pytest.raises(ConfigError) as e:
            check_model_settings(*args)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)
    # wording test (models): the model given, the closest known one and every choice
    with pytest.raises(ConfigError, match=r"\(--model\) 'resnet' is not a known model \(did you mean 'resnet50'\?\); "
                                          r"choose one of: alexnet, resnet50, or give your own builder"):
        check_model_settings("resnet", 224)


def test_every_registered_builder_imports_to_a_callable():
    """Each row's ``builder`` string imports (the worker's one import, also a user's builder's) to the function
    that builds the model of that name."""
    from spark_imagenet.training.worker.models.alexnet import build_alexnet
    from spark_imagenet.training.worker.models.registry import get_builder, import_builder
    from spark_imagenet.training.worker.models.resnet import build_resnet50

    for name, spec in MODELS.items():
        builder = import_builder(spec.builder, model=name)
        assert callable(builder), name
        assert get_builder(name) is builder
    assert get_builder("alexnet") is build_alexnet and get_builder("resnet50") is build_resnet50


def test_a_row_names_its_builder_as_module_and_function():
    from spark_imagenet.training.job.model_specs import ModelSpec

    with pytest.raises(ValueError, match=r"model 'x': builder 'build_x' is not package.module:function"):
        ModelSpec(name="x", min_image_size=1, fixed_width=False, recipe=MODELS["alexnet"].recipe, builder="build_x")


# ---------------------------------------------------------------- ResNet-50

def test_resnet50_builds_at_32_px_with_float32_logits_and_25_6m_params():
    model = build_model("resnet50", 1000, 32)
    assert model.name == "resnet50"
    assert model.input.dtype == tf.float32 and tuple(model.input_shape) == (None, 32, 32, 3)
    assert tuple(model.output_shape) == (None, 1000)
    # He et al. 2016's 50-layer net: 25,583,592 trainable + 53,120 batch-norm moving statistics
    assert model.count_params() == 25_636_712
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == 25_583_592
    assert round(model.count_params() / 1e6, 1) == 25.6
    assert model.get_layer("predictions").activation is keras.activations.linear  # logits, no softmax
    assert not model.losses  # no kernel regularisers: compile_model adds weight decay for every model
    keras.backend.clear_session()


def test_resnet50_logits_at_a_small_size():
    model = build_model("resnet50", 7, 48)
    x = np.random.default_rng(0).normal(size=(2, 48, 48, 3)).astype(np.float32)
    out = model(x, training=False)
    assert out.shape == (2, 7) and out.dtype == tf.float32
    assert np.all(np.isfinite(out.numpy()))
    # logits, not probabilities: rows do not sum to 1 and values may be negative
    assert not np.allclose(out.numpy().sum(axis=1), 1.0)
    # the parameter count depends on the classes only (global average pooling), not on the size
    assert model.count_params() == 25_636_712 - 2048 * 993 - 993
    keras.backend.clear_session()


def test_resnet50_refuses_other_widths_and_small_sizes():
    for args, key, value in (((10, 224, 0.25), "width", 0.25), ((10, 31), "image_size", 31), ((0, 32), "num_classes", 0)):
        with pytest.raises(ConfigError) as e:
            build_model("resnet50", *args)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)


# ---------------------------------------------------------------- a user's builder, driver side (no TensorFlow)

def _driver_error(model: str) -> str:
    from spark_imagenet.training.job.model_specs import check_model_settings

    with pytest.raises(ConfigError) as info:
        check_model_settings(model, 64)
    message = str(info.value)
    assert "--model" in message and "\n" not in message
    return message


def test_user_builder_found_on_the_driver_by_its_source():
    from spark_imagenet.training.job.model_specs import check_model_settings, recipe_for, USER_RECIPE

    note = check_model_settings("user_model:build", 64)
    assert note.startswith("user_model:build: build found in ") and note.endswith("user_model.py")
    assert check_model_settings("user_model:NOT_CALLABLE", 64)  # bound at top level: callability is the worker's
    assert recipe_for("user_model:build") is USER_RECIPE


def test_user_builder_module_missing_on_the_driver():
    message = _driver_error("nosuch_pkg.models:build")
    assert "cannot find module nosuch_pkg.models (no package 'nosuch_pkg') on the driver's Python path" in message
    assert "sys.path: " in message and "--py-files" in message
    message = _driver_error("user_model_typo:build")
    assert "cannot find module user_model_typo on the driver's Python path" in message


def test_user_builder_module_missing_in_the_worker_spec_check(monkeypatch):
    """The worker (``python -m spark_imagenet.training.worker.main``) checks its spec's config again: the message
    names its own path."""
    import types

    main = types.SimpleNamespace(__spec__=types.SimpleNamespace(name="spark_imagenet.training.worker.main"))
    monkeypatch.setitem(sys.modules, "__main__", main)
    message = _driver_error("user_model_typo:build")
    assert "cannot find module user_model_typo on the TensorFlow worker's Python path" in message


def test_user_builder_function_missing_on_the_driver():
    message = _driver_error("user_model:bulid")
    assert "user_model" in message and "defines no top-level 'bulid' (did you mean 'build'?)" in message
    assert "define bulid(num_classes, image_size, width) -> tf_keras.Model" in message


def test_user_builder_bad_forms_on_the_driver():
    for bad in ("user_model:", ":build", "user_model:build:x", "user-model:build", "user_model.:build"):
        assert "is not of the form package.module:function" in _driver_error(bad), bad


def test_user_builder_source_checks(tmp_path, monkeypatch):
    """Definitions in if/try blocks and imports count; a syntax error and a folder without code are named;
    a compiled module without source is accepted (checked in the first task)."""
    from spark_imagenet.training.job.model_specs import check_model_settings

    (tmp_path / "ubpkg").mkdir()
    (tmp_path / "ubpkg" / "__init__.py").write_text("")
    (tmp_path / "ubpkg" / "nets.py").write_text(
        "try:\n    from os.path import join as build_a\nexcept ImportError:\n    pass\n"
        "if True:\n    def build_b(n, s, w):\n        return None\n"
        "build_c = build_b\nclass BuildD:\n    pass\n")
    (tmp_path / "ubpkg" / "broken.py").write_text("def build(:\n")
    (tmp_path / "ubns").mkdir()
    (tmp_path / "ubns" / "deeper").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("build_a", "build_b", "build_c", "BuildD"):
        assert check_model_settings(f"ubpkg.nets:{name}", 64).endswith("nets.py")
    assert "ubpkg.nets" not in sys.modules  # found and read, never run
    assert "line 1 does not parse" in _driver_error("ubpkg.broken:build")
    assert "is a folder without code" in _driver_error("ubns.deeper:build")
    note = check_model_settings("_json:build", 64)  # a compiled extension
    assert "no Python source to check here: build is checked in the first task" in note


def test_user_builder_check_starts_no_tensorflow_on_the_driver():
    import subprocess

    code = ("import sys\nfrom spark_imagenet.training.job.config import TrainConfig\n"
            "TrainConfig(model='user_model:build', image_size=64, workers=1)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras', 'keras')))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_train_config_names_model_for_a_missing_builder():
    from spark_imagenet.training.job.config import TrainConfig

    with pytest.raises(ConfigError, match="cannot find module") as e:
        TrainConfig(model="nosuch.mod:fn", workers=1)
    assert (e.value.key, e.value.value) == ("model", "nosuch.mod:fn")


# ---------------------------------------------------------------- a user's builder, worker side

def test_user_builder_builds_and_is_checked_in_the_worker():
    model = build_model("user_model:build", 5, 40, 0.5)
    assert isinstance(model, keras.Model) and model.name == "user_model"
    assert tuple(model.input_shape) == (None, 40, 40, 3) and tuple(model.output_shape) == (None, 5)
    assert model.get_layer("conv1").filters == 8  # width was passed through
    keras.backend.clear_session()


@pytest.mark.parametrize("function, expected", [
    ("not_a_model", r"returned a builtins\.dict, not a tf_keras\.Model"),
    ("wrong_output", r"output shape is \(None, 6\), but the job needs logits of shape \(None, 5\).*Dense\(5\)"),
    ("wrong_input", r"input shape is \(None, 80, 80, 3\), but the job feeds images of shape \(None, 40, 40, 3\)"),
    ("raises", r"the builder raised ValueError: this builder does not support 5 classes when called as "
               r"raises\(num_classes=5, image_size=40, width=1\)"),
    ("NOT_CALLABLE", r"user_model\.NOT_CALLABLE is not callable \(a value of type int\)"),
    ("missing", r"module user_model \(.*user_model\.py\) has no attribute 'missing'"),
])
def test_user_builder_errors_in_the_worker(function, expected):
    """Wording test (a user's builder): each way a builder fails is said in one line naming --model."""
    name = f"user_model:{function}"
    with pytest.raises(ConfigError, match=rf"^model \(--model\) '{name}'.*{expected}") as info:
        build_model(name, 5, 40, 1.0)
    assert "\n" not in str(info.value) and (info.value.key, info.value.value) == ("model", name)
    keras.backend.clear_session()


def test_user_builder_module_missing_in_the_worker():
    with pytest.raises(ConfigError, match="ModuleNotFoundError") as e:
        build_model("nosuch_pkg.models:build", 5, 40)
    assert (e.value.key, e.value.value) == ("model", "nosuch_pkg.models:build")


def test_user_builder_of_keras3_is_refused_in_one_line_that_reaches_the_driver():
    """A builder written with ``import keras`` (Keras 3) is refused where its result is first in hand, in one line
    saying why and how to build it; the line travels to the driver as the worker's other errors do (its Failure,
    completed by the barrier task, read back from Spark's error text) and is raised there as a ConfigError."""
    from spark_imagenet.training.job.outcome import Failure
    from spark_imagenet.training.task.barrier_task import process_failure
    from spark_imagenet.training.worker.main import failure_of

    pytest.importorskip("keras", minversion="3")
    with pytest.raises(ConfigError) as info:
        build_model("user_model:keras3_model", 5, 40)
    message = str(info.value)
    assert message.startswith("model (--model) 'user_model:keras3_model' returned a Keras 3 model keras.")
    assert "MultiWorkerMirroredStrategy trains only Keras 2 models" in message
    assert "keras-team/keras#20585, tensorflow/tensorflow#72388" in message
    assert "docs/design.md, 'Keras 3: our position and what a move would take'" in message
    assert message.endswith("`import tf_keras as keras` (the tf-keras package), instead of `import keras`")
    assert "\n" not in message
    line = f"worker rank 1 failed while building the model: ConfigError: {message}"
    failure = process_failure(failure_of(info.value, "building the model", 1), 1, [line], 1, "h1", "worker.main")
    raised = Failure.find(f"org.apache.spark.SparkException: Job aborted ...\n{failure.to_error()}").as_error()
    assert type(raised) is ConfigError
    assert str(raised).splitlines()[0] == (f"rank 1 on h1: the TensorFlow process (worker.main) exited with code 1 "
                                           f"while building the model: ConfigError: {message}; its last 1 output "
                                           "line(s):")


def test_the_tensorflow_child_gets_the_tasks_extra_path(tmp_path, monkeypatch):
    """The worker's environment (preload_env) appends the task's sys.path entries that a fresh interpreter lacks (what --py-files and
    addPyFile add), so the worker process imports the user's module the task could import."""
    import subprocess
    import sysconfig

    from child_util import worker_env as child_env

    shipped = tmp_path / "userFiles"
    shipped.mkdir()
    (shipped / "shipped_builder.py").write_text("def build(n, s, w):\n    return 'built'\n")
    (tmp_path / "task").mkdir()
    monkeypatch.chdir(tmp_path / "task")
    site = sysconfig.get_paths()["purelib"]
    task_path = ["", str(shipped), site, sysconfig.get_paths()["stdlib"], str(tmp_path / "gone"), str(shipped)]
    env = child_env({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": "/x"}, None, None, 1, task_path=task_path)
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert entries[1] == "/x" and entries[2:] == [str(tmp_path / "task"), str(shipped)]  # '' is the task's folder
    p = subprocess.run([sys.executable, "-c", "import shipped_builder; print(shipped_builder.build(1, 2, 3))"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "built"
    assert child_env({}, None, None, 1)["PYTHONPATH"].split(os.pathsep) == entries[:1]  # no task path, as before
