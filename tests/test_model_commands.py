"""The `evaluate` and `predict` commands leave no copy of the model behind in $TMPDIR, whether they succeed or fail."""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile

import pytest

import spark_imagenet.training.worker  # noqa: F401  (TensorFlow's set-up, before it is imported)
import tf_keras as keras  # noqa: E402
from PIL import Image  # noqa: E402

from own_images import huge_png  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.worker import evaluate, predict  # noqa: E402

PREFIX = "spark-imagenet-model-"


@pytest.fixture
def tmpdir_for_copies(tmp_path, monkeypatch):
    """A fresh $TMPDIR for the commands' temporary folders."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def run_folder(tmp_path):
    """An --output folder: a 2-class model.keras on 8-pixel images and its labels.json."""
    folder = tmp_path / "run"
    folder.mkdir()
    inputs = keras.Input((8, 8, 3))
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(inputs))
    keras.Model(inputs, outputs).save(str(folder / "model.keras"))
    labels = [{"id": i, "wnid": f"n0000000{i}", "names": [f"class {i}"]} for i in range(2)]
    (folder / "labels.json").write_text(json.dumps(labels))
    return folder


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "red.jpg"
    Image.new("RGB", (16, 12), (200, 10, 10)).save(path, format="JPEG")
    return path


def copies(folder) -> list[str]:
    return [name for name in os.listdir(folder) if name.startswith(PREFIX)]


def test_the_copy_exists_inside_the_block_only(run_folder, tmpdir_for_copies):
    with evaluate.fetched_model(str(run_folder)) as local:
        assert os.path.isfile(local) and os.path.dirname(os.path.dirname(local)) == str(tmpdir_for_copies)
        assert copies(tmpdir_for_copies)
    assert copies(tmpdir_for_copies) == [] and not os.path.exists(local)


def test_predict_success_leaves_no_copy(run_folder, image, tmpdir_for_copies, capsys, monkeypatch):
    assert predict.main([str(run_folder), str(image), "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["file"] == str(image) and len(result["top"]) == 2
    assert copies(tmpdir_for_copies) == []
    # a folder with a file that is no image and a truncated JPEG: the rest predicted, each bad one named, exit 1
    folder = image.parent / "photos"
    folder.mkdir()
    good = folder / "good.jpg"
    good.write_bytes(image.read_bytes())
    (folder / "notes.jpg").write_text("not an image")
    noisy = io.BytesIO()
    Image.effect_noise((64, 64), 60).convert("RGB").save(noisy, format="JPEG")
    (folder / "truncated.jpg").write_bytes(noisy.getvalue()[:len(noisy.getvalue()) // 2])
    assert predict.main([str(run_folder), str(folder), "--json"]) == 1
    out, err = capsys.readouterr()
    assert [r["file"] for r in json.loads(out)] == [str(good)]
    notes, truncated = err.splitlines()
    assert notes == (f"spark-imagenet: warning: {folder / 'notes.jpg'}: not an image (JPEG, PNG or another format "
                     "Pillow reads); not predicted")
    assert truncated.startswith(f"spark-imagenet: warning: {folder / 'truncated.jpg'}: not an image that can be read "
                                "(image file is truncated") and truncated.endswith("; not predicted"), truncated
    assert copies(tmpdir_for_copies) == []
    # a reader that leaves early (`| head -1`): exit 1, no BrokenPipeError traceback
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as closed, monkeypatch.context() as m:
        m.setattr(sys, "stdout", closed)
        assert predict.main([str(run_folder), str(image)]) == 1


def test_load_model_success_leaves_no_copy(run_folder, tmpdir_for_copies):
    model = evaluate.load_model(str(run_folder / "model.keras"))
    assert model.output_shape == (None, 2)
    assert copies(tmpdir_for_copies) == []


def test_a_file_that_is_not_a_model_leaves_no_copy(tmp_path, image, tmpdir_for_copies, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.keras").write_bytes(b"not a zip of a Keras model")
    (broken / "labels.json").write_text(json.dumps([{"id": 0, "wnid": "n00000000", "names": ["a"]}]))
    with pytest.raises(ConfigError, match="is not a Keras model"):
        evaluate.load_model(str(broken))
    assert copies(tmpdir_for_copies) == []
    assert predict.main([str(broken), str(image)]) == 2
    assert "is not a Keras model" in capsys.readouterr().err
    assert copies(tmpdir_for_copies) == []


def test_failures_after_the_copy_leave_no_copy(run_folder, image, tmp_path, tmpdir_for_copies, capsys):
    # evaluate: the model was fetched, then the dataset is missing
    assert evaluate.main([str(run_folder), str(tmp_path / "no-dataset")]) == 2
    assert "no-dataset" in capsys.readouterr().err
    assert copies(tmpdir_for_copies) == []
    # predict: the model was fetched and loaded, then the labels do not match its outputs
    (run_folder / "labels.json").write_text(json.dumps([{"id": 0, "wnid": "n00000000", "names": ["a"]}]))
    assert predict.main([str(run_folder), str(image)]) == 2
    assert "1 classes but the model has 2 outputs" in capsys.readouterr().err
    assert copies(tmpdir_for_copies) == []


def test_predict_refuses_a_non_image_before_fetching_the_model(tmp_path, tmpdir_for_copies, capsys):
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    assert predict.main([str(tmp_path / "no-model"), str(text)]) == 2
    assert f"{text}: not an image (JPEG, PNG" in capsys.readouterr().err
    bomb = tmp_path / "bomb.png"  # 900 megapixels in a few dozen bytes: refused from its header, never decoded
    bomb.write_bytes(huge_png(30000, 30000))
    assert predict.main([str(tmp_path / "no-model"), str(bomb)]) == 2
    err = capsys.readouterr().err
    assert err == (f"spark-imagenet: error: {bomb}: 30000 x 30000 pixels (900.0 megapixels) is above the limit of "
                   "100 megapixels; resize the image, or raise the limit with --max-image-pixels (max_image_pixels= "
                   "in Python) where there is memory to decode it (about 4 bytes a pixel, several copies)\n")
    assert predict.main([str(tmp_path / "no-model"), str(bomb), "--max-image-pixels", "1000"]) == 2
    assert "above the limit of 1,000 pixels;" in capsys.readouterr().err


def test_predict_refuses_top_0(run_folder, image, capsys):
    with pytest.raises(SystemExit) as e:
        predict.main([str(run_folder), str(image), "--top", "0"])
    assert e.value.code == 2 and "--top: 0 must be at least 1" in capsys.readouterr().err


def test_evaluate_with_the_dataset_first_says_the_order(run_folder, tmp_path, tmpdir_for_copies, capsys):
    dataset = tmp_path / "shards"
    dataset.mkdir()
    (dataset / "manifest.json").write_text("{}")
    assert evaluate.main([str(dataset), str(run_folder)]) == 2
    err = capsys.readouterr().err
    assert f"model {dataset}: cannot read model.keras" in err
    assert f"{dataset} is a dataset" in err and f"evaluate {run_folder} {dataset}" in err
    # a dataset given twice: no example that repeats the mistake
    assert evaluate.main([str(dataset), str(dataset)]) == 2
    err = capsys.readouterr().err
    assert "give the model as the first argument" in err and f"evaluate {dataset} {dataset}" not in err
    # a missing model that is not a dataset gets no such hint
    assert evaluate.main([str(tmp_path / "nothing"), str(dataset)]) == 2
    assert "hint" not in capsys.readouterr().err
    assert copies(tmpdir_for_copies) == []
