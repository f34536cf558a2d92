"""The model for use without spark-imagenet (spark_imagenet.training.worker.export): model.keras without the
optimizer, preprocessing.json, the serving SavedModel, and the `export` command; loaded in a clean Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import spark_imagenet.training.worker  # noqa: F401  (TensorFlow's set-up, before it is imported)
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from PIL import Image  # noqa: E402

from spark_imagenet.storage import LocalStorage  # noqa: E402
from spark_imagenet.training.job.exported import PREPROCESSING, Preprocessing  # noqa: E402
from spark_imagenet.training.job.outputs import earlier_outputs, publish  # noqa: E402
from spark_imagenet.training.worker import export, preprocessing  # noqa: E402
from spark_imagenet.training.worker.predict import predict  # noqa: E402

SIZE = 16
CLASSES = 7

#: Run in a clean Python (see clean_python): model.keras with plain tf_keras and preprocessing.json, the SavedModel
#: with plain TensorFlow, on the image files given; prints what each gave as JSON.
CHILD = r'''
import json, sys
try:
    import spark_imagenet  # noqa: F401
except ImportError:
    pass
else:
    sys.exit("spark_imagenet is importable in the clean Python")
import numpy as np
import tensorflow as tf
import tf_keras

folder, older, files = sys.argv[1], sys.argv[2], sys.argv[3:]
try:  # a model.keras saved with its optimizer (our KerasSchedule), as before: plain tf_keras cannot load it
    tf_keras.models.load_model(older)
    older_error = ""
except Exception as e:
    older_error = f"{type(e).__name__}: {e}"
model = tf_keras.models.load_model(folder + "/model.keras")  # compile=True, the default: no optimizer in it
spec = json.load(open(folder + "/preprocessing.json"))
assert spec["format"] == "spark-imagenet-preprocessing" and spec["format_version"] == 1, spec
size, fraction = spec["image_size"], spec["center_crop_fraction"]
mean, std = np.array(spec["mean_rgb"], np.float32), np.array(spec["std_rgb"], np.float32)

def view(path):
    image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
    h, w = int(image.shape[0]), int(image.shape[1])
    side = max(1, int(fraction * min(h, w)))
    y, x = (h - side + 1) // 2, (w - side + 1) // 2
    resized = tf.image.resize(image[y:y + side, x:x + side], [size, size], method="bilinear")
    return (tf.cast(tf.cast(resized + 0.5, tf.uint8), tf.float32) - mean) / std

keras_p = tf.nn.softmax(model(tf.stack([view(f) for f in files]), training=False), axis=-1).numpy()
serving = tf.saved_model.load(folder + "/serving")
images = tf.constant([open(f, "rb").read() for f in files])
top = serving.signatures["serving_default"](images=images)
every = serving.signatures["probabilities"](images=images)["probabilities"].numpy()
print(json.dumps({"optimizer": model.optimizer is not None, "older_error": older_error, "keras": keras_p.tolist(), "every": every.tolist(),
                  "class_ids": top["class_ids"].numpy().tolist(), "probabilities": top["probabilities"].numpy().tolist(),
                  "wnids": [[w.decode() for w in row] for row in top["wnids"].numpy()],
                  "names": [[n.decode() for n in row] for row in top["names"].numpy()]}))
'''


def clean_python(root: Path) -> Path:
    """A virtualenv (no pip) that sees this one's installed packages (TensorFlow, tf_keras, ...) but not
    spark_imagenet, however it was installed: a folder of links to every entry of this site-packages except
    spark_imagenet's own (its package, its dist-info, an editable install's .pth and finder) is named in a .pth
    line (the linked folder's own .pth files are not processed). Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    inner = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           check=True, capture_output=True, text=True).stdout.strip()
    outer = Path(sysconfig.get_paths()["purelib"])
    linked = root / "outer-site-packages"
    linked.mkdir()
    for entry in outer.iterdir():
        if not entry.name.lower().replace("-", "_").startswith(("spark_imagenet", "__editable__.spark_imagenet")):
            (linked / entry.name).symlink_to(entry)
    Path(inner, "outer.pth").write_text(f"{linked}\n")
    return python


def run_clean(python: Path, folder: Path, files: list[Path], cwd: Path, older: Path) -> dict:
    """CHILD in the clean Python, in ``cwd`` (so the project folder is not on its path); ``older``: a
    model.keras saved with its optimizer."""
    (cwd / "child.py").write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([str(python), "child.py", str(folder), str(older), *map(str, files)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_against_predict(got: dict, predicted: list[dict], labels: list[dict], tolerance: float = 1e-5) -> None:
    """The SavedModel's answers (``got``, from CHILD) equal ``predict``'s: same classes, probabilities within
    ``tolerance``; the wnids and names are labels.json's."""
    assert len(got["class_ids"]) == len(predicted)
    for ids, probs, wnids, names, every, row in zip(got["class_ids"], got["probabilities"], got["wnids"],
                                                    got["names"], got["every"], predicted):
        assert ids == [c["id"] for c in row["top"]], (ids, row)
        assert probs == pytest.approx([c["probability"] for c in row["top"]], abs=tolerance)
        assert wnids == [labels[i]["wnid"] for i in ids]
        assert names == [(labels[i]["names"] or [labels[i]["wnid"]])[0] for i in ids]
        assert sorted(every, reverse=True)[:len(ids)] == pytest.approx(probs, abs=1e-6)


def tiny_model(classes: int = CLASSES, size: int = SIZE) -> keras.Model:
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.Dense(classes)(keras.layers.Flatten()(x))
    return keras.Model(inputs, x)


def labels_for(classes: int) -> list[dict]:
    return [{"id": i, "wnid": f"n{i:08d}", "names": [f"class {i}", "other"] if i % 2 else []}
            for i in range(classes)]


@pytest.fixture(scope="module")
def older_run(tmp_path_factory) -> Path:
    """An older run's --output: model.keras saved with its optimizer (a KerasSchedule: plain tf_keras cannot load
    it), labels.json, nothing else."""
    from spark_imagenet.training.job.config import TrainConfig
    from spark_imagenet.training.job.schedules import schedule_for
    from spark_imagenet.training.worker.keras_schedule import KerasSchedule
    from spark_imagenet.training.worker.models.compile import compile_model

    folder = tmp_path_factory.mktemp("older") / "run"
    folder.mkdir()
    model = tiny_model()
    config = TrainConfig(workers=1, lr_schedule="cosine", epochs=2)
    compile_model(model, KerasSchedule(schedule_for(config, 3)))
    x = np.random.RandomState(0).normal(size=(4, SIZE, SIZE, 3)).astype("float32")
    model.fit(x, np.arange(4) % CLASSES, epochs=1, verbose=0)  # optimizer variables too
    model.save(str(folder / "model.keras"))
    (folder / "labels.json").write_text(json.dumps(labels_for(CLASSES)))
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    """One picture as JPEG, PNG, GIF and BMP (non-square, so the crop matters), and a second JPEG."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.RandomState(3)
    pixels = np.clip(rng.normal(128, 60, (30, 44, 3)), 0, 255).astype("uint8")
    files = {}
    for fmt, ext in (("JPEG", "jpg"), ("PNG", "png"), ("GIF", "gif"), ("BMP", "bmp")):
        files[ext] = folder / f"one.{ext}"
        Image.fromarray(pixels).save(files[ext], format=fmt)
    files["jpg2"] = folder / "two.jpg"
    Image.fromarray(np.clip(rng.normal(90, 40, (50, 37, 3)), 0, 255).astype("uint8")).save(files["jpg2"], "JPEG")
    return files


def test_preprocessing_json_states_the_training_constants(tmp_path):
    path = export.write_preprocessing(96, str(tmp_path))
    data = json.loads(Path(path).read_text())
    assert data["format"] == "spark-imagenet-preprocessing" and data["format_version"] == 1
    spec = Preprocessing.from_json(data, path)
    assert spec.image_size == 96 and spec.input["shape"] == [None, 96, 96, 3] and spec.input["layout"] == "NHWC"
    assert spec.mean_rgb == preprocessing.MEAN_RGB and spec.std_rgb == preprocessing.STD_RGB
    assert spec.center_crop_fraction == preprocessing.CENTER_CROP_FRACTION and spec.resize.startswith("bilinear")
    assert spec.labels == "labels.json" and set(spec.serving["signatures"]) == {"serving_default", "probabilities"}
    assert Preprocessing.loads(spec.dumps(), "x") == spec
    with pytest.raises(Exception, match="format_version 2 is not supported"):
        Preprocessing.from_json({**data, "format_version": 2}, path)
    assert PREPROCESSING.format == data["format"]


def test_earlier_outputs_count_the_serving_files_and_publish_replaces_them(tmp_path):
    storage = LocalStorage(tmp_path / "out")
    for name in ("serving/saved_model.pb", "serving/variables/old.index", "preprocessing.json", "mine.txt"):
        storage.write_bytes(name, b"x")
    assert earlier_outputs(storage) == ["preprocessing.json", "serving/saved_model.pb", "serving/variables/old.index"]
    local = tmp_path / "local"
    (local / "serving").mkdir(parents=True)
    (local / "serving" / "saved_model.pb").write_bytes(b"new")
    assert publish(str(local), storage) == ["serving/saved_model.pb"]
    assert earlier_outputs(storage) == ["preprocessing.json", "serving/saved_model.pb"]  # the old index went
    assert storage.read_bytes("mine.txt") == b"x"
    # so a second train into this folder is refused without --overwrite
    from spark_imagenet.errors import ConfigError
    from spark_imagenet.training.driver.preflight import check_output_unused

    with pytest.raises(ConfigError, match=r"holds the outputs of an earlier run \(preprocessing.json, serving/\)"):
        check_output_unused(storage, "OUT", overwrite=False).raise_if_problem()
    assert check_output_unused(storage, "OUT", overwrite=True).level == "ok"


def test_the_saved_model_answers_as_predict_does_and_takes_png_gif_bmp(tmp_path, images):
    model = tiny_model()
    labels = labels_for(CLASSES)
    path = export.write_serving(model, labels, SIZE, str(tmp_path))
    assert path == str(tmp_path / "serving")
    loaded = tf.saved_model.load(path)
    serve, every = loaded.signatures["serving_default"], loaded.signatures["probabilities"]
    assert serve.structured_input_signature[1] == {"images": tf.TensorSpec([None], tf.string, name="images")}
    assert {k: (v.dtype, v.shape.as_list()) for k, v in serve.structured_outputs.items()} == {
        "class_ids": (tf.int32, [None, 5]), "wnids": (tf.string, [None, 5]), "names": (tf.string, [None, 5]),
        "probabilities": (tf.float32, [None, 5])}
    assert every.structured_outputs["probabilities"].shape.as_list() == [None, CLASSES]
    jpegs = [images["jpg"], images["jpg2"]]
    out = serve(images=tf.constant([p.read_bytes() for p in jpegs]))
    got = {k: v.numpy().tolist() for k, v in out.items()}
    got["wnids"] = [[w.decode() for w in row] for row in got["wnids"]]
    got["names"] = [[n.decode() for n in row] for row in got["names"]]
    got["every"] = every(images=tf.constant([p.read_bytes() for p in jpegs]))["probabilities"].numpy().tolist()
    check_against_predict(got, predict(model, jpegs, labels, top=5), labels)
    # PNG, GIF, BMP: decoded whole, then the same crop and resize (the GIF's palette changes the pixels a little)
    decoded = np.asarray(Image.open(images["png"]).convert("RGB"))
    expected = tf.nn.softmax(model(preprocessing.normalizer(SIZE)(
        preprocessing.eval_view(tf.constant(decoded), SIZE)[tf.newaxis]))).numpy()[0]
    for ext in ("png", "bmp"):
        row = every(images=tf.constant([images[ext].read_bytes()]))["probabilities"].numpy()[0]
        np.testing.assert_allclose(row, expected, atol=1e-5)
    gif = every(images=tf.constant([images["gif"].read_bytes()]))["probabilities"].numpy()[0]
    assert gif.shape == (CLASSES,) and abs(gif.sum() - 1) < 1e-5
    # a JPEG's eval_view of its decoded pixels is eval_image of its bytes (the same crop and resize)
    jpeg = tf.constant(images["jpg"].read_bytes())
    np.testing.assert_array_equal(preprocessing.eval_view(tf.io.decode_jpeg(jpeg, channels=3), SIZE),
                                  preprocessing.eval_image(jpeg, SIZE))
    assert every(images=tf.constant([], tf.string))["probabilities"].shape == (0, CLASSES)
    small = export.write_serving(tiny_model(classes=3), labels_for(3), SIZE, str(tmp_path / "three"))
    assert tf.saved_model.load(small).signatures["serving_default"](
        images=jpeg[tf.newaxis])["class_ids"].shape == (1, 3)  # K = min(5, classes)


@pytest.mark.slow  # a whole job or process (the fast tier stays under 5 minutes)
def test_a_clean_python_loads_the_model_and_the_saved_model(tmp_path, older_run, images):
    """write_outputs (the chief's part) on an older model.keras with its optimizer: model.keras without it,
    preprocessing.json and serving/; a Python without spark_imagenet loads both and classifies."""
    folder = tmp_path / "out"
    folder.mkdir()
    labels = json.loads((older_run / "labels.json").read_text())
    seconds = export.write_outputs(str(older_run / "model.keras"), labels, str(folder))
    assert seconds > 0 and sorted(p.name for p in folder.iterdir()) == ["model.keras", "preprocessing.json",
                                                                         "serving"]
    (folder / "labels.json").write_text(json.dumps(labels))
    files = [images["jpg"], images["jpg2"]]
    got = run_clean(clean_python(tmp_path / "venv"), folder, files, tmp_path, older_run / "model.keras")
    assert got["optimizer"] is False
    assert "KerasSchedule" in got["older_error"], got["older_error"]  # why model.keras is saved without it now
    model = keras.models.load_model(older_run / "model.keras", compile=False)
    check_against_predict(got, predict(model, files, labels, top=5), labels)
    # model.keras with preprocessing.json's recipe (whole decode, crop, resize): the same classes
    np.testing.assert_allclose(got["keras"], got["every"], atol=2e-3)


@pytest.mark.slow  # a whole job or process (the fast tier stays under 5 minutes)
def test_export_command_on_an_older_run(tmp_path, older_run, images):
    out = tmp_path / "exported"
    done = subprocess.run([sys.executable, "-m", "spark_imagenet", "export", str(older_run / "model.keras"),
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"written to {out}" in done.stdout and "Traceback" not in done.stderr
    assert (out / "serving" / "saved_model.pb").is_file() and (out / "preprocessing.json").is_file()
    assert Preprocessing.loads((out / "preprocessing.json").read_text(), "p").image_size == SIZE
    serve = tf.saved_model.load(str(out / "serving")).signatures["serving_default"]
    assert serve(images=tf.constant([images["png"].read_bytes()]))["class_ids"].shape == (1, 5)
    assert not (older_run / "serving").exists()  # --out, not beside the model


@pytest.mark.parametrize("case", ["no model", "labels length", "labels missing", "out is a file", "not images"])
def test_export_refuses_bad_input_naming_the_file(tmp_path, older_run, case, capsys):
    model, args = str(older_run), []
    if case == "no model":
        model = str(tmp_path / "nothing")
        fragment = f"model {model}: cannot read model.keras"
    elif case == "labels length":
        (tmp_path / "labels.json").write_text(json.dumps(labels_for(2)))
        args = ["--labels", str(tmp_path / "labels.json")]
        fragment = f"{tmp_path}/labels.json lists 2 classes but the model has {CLASSES} outputs"
    elif case == "labels missing":
        args = ["--labels", str(tmp_path / "none.json")]
        fragment = f"cannot read the class names {tmp_path}/none.json"
    elif case == "out is a file":
        (tmp_path / "file").write_text("x")
        args = ["--out", str(tmp_path / "file" / "sub")]
        fragment = f"--out {tmp_path / 'file' / 'sub'}: {tmp_path / 'file'} is a file, not a folder"
    else:
        flat = tmp_path / "flat"
        flat.mkdir()
        inputs = keras.Input((10,))
        keras.Model(inputs, keras.layers.Dense(CLASSES)(inputs)).save(str(flat / "model.keras"))
        model, args = str(flat / "model.keras"), ["--labels", str(older_run / "labels.json")]
        fragment = f"model {model}: takes (None, 10)"
    assert export.main([model, "--out", str(tmp_path / "o"), *args] if "--out" not in args else [model, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spark-imagenet: error: ") and fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "o" / "serving").exists()


class _Unregistered(keras.layers.Layer):
    """A user's layer that is not registered with Keras: a saved model holding it does not load again."""

    def call(self, x):
        return x * 2.0


def test_a_model_that_does_not_load_again_is_kept_as_saved(tmp_path, caplog):
    inputs = keras.Input((SIZE, SIZE, 3))
    model = keras.Model(inputs, keras.layers.Dense(CLASSES)(keras.layers.Flatten()(_Unregistered()(inputs))))
    model.save(str(tmp_path / "trained.keras"))
    folder = tmp_path / "out"
    folder.mkdir()
    with caplog.at_level("WARNING"):
        assert export.write_outputs(str(tmp_path / "trained.keras"), labels_for(CLASSES), str(folder)) is None
    assert [p.name for p in folder.iterdir()] == ["model.keras"]
    assert (folder / "model.keras").read_bytes() == (tmp_path / "trained.keras").read_bytes()
    assert "does not load again without its custom classes" in caplog.text and "spark-imagenet export" in caplog.text
