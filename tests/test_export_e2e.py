"""End to end: a run trained with --output on local[2] leaves model.keras (no optimizer), preprocessing.json and
serving/; a Python without spark_imagenet loads both and classifies the run's training images as `predict` does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from data_util import IMAGENET_SAMPLE, small_layout
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.training.driver.launch import train
from spark_imagenet.training.job.config import TrainConfig
from test_export import check_against_predict, clean_python, run_clean

pytestmark = pytest.mark.slow

SETTINGS = {"batch_size": 4, "image_size": 72, "width": 0.25, "learning_rate": 0.01, "lr_schedule": "cosine",
            "warmup_epochs": 0.0, "epochs": 12}


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory) -> dict:
    """One trained run: its dataset tree, --output folder and result (4 classes x 6 train images)."""
    root = tmp_path_factory.mktemp("export-e2e")
    tree = small_layout(root / "kaggle")
    shard(tree, root / "bucket", train_shards=2, val_shards=1, processes=1, progress=False)
    out = root / "out"
    result = train(spark, str(root / "bucket"), TrainConfig(workers=2, cache=root / "cache", output=str(out),
                                                            **SETTINGS))
    return {"tree": tree, "out": out, "result": result}


def test_the_output_loads_without_spark_imagenet_and_answers_as_predict(run, tmp_path):
    out = run["out"]
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert {"model.keras", "labels.json", "results.json", "preprocessing.json", "serving/saved_model.pb"} <= set(names)
    assert any(n.startswith("serving/variables/") for n in names)
    labels = json.loads((out / "labels.json").read_text())
    # every training image, by its class folder's wnid
    files = sorted((run["tree"] / "ILSVRC" / "Data" / "CLS-LOC" / "train").rglob("*.JPEG"))
    assert len(files) == 24
    # and real ImageNet photos (../shared/data/imagenet-sample, when present): the same answers as predict's
    photos = sorted(IMAGENET_SAMPLE.glob("*.JPEG"))[:8] if IMAGENET_SAMPLE.is_dir() else []
    got = run_clean(clean_python(tmp_path / "venv"), out, files + photos, tmp_path, out / "model.keras")
    assert got["optimizer"] is False and got["older_error"] == ""  # the new model.keras loads with compile=True
    truth = [f.parent.name for f in files]
    right = sum(row[0] == wnid for row, wnid in zip(got["wnids"][:24], truth))
    assert right >= 12, (right, run["result"]["val"])  # chance: 6 of 24 (measured: 18 after 12 epochs)
    files += photos
    p = subprocess.run([sys.executable, "-m", "spark_imagenet", "predict", str(out), *map(str, files), "--json",
                        "--top", "4"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    predicted = json.loads(p.stdout)
    assert [r["file"] for r in predicted] == list(map(str, files))
    check_against_predict(dict(got, class_ids=[r[:4] for r in got["class_ids"]],
                               probabilities=[r[:4] for r in got["probabilities"]],
                               wnids=[r[:4] for r in got["wnids"]], names=[r[:4] for r in got["names"]]),
                          predicted, labels)


def test_export_replaces_the_saved_model_of_a_run(run, tmp_path):
    """`spark-imagenet export` on the run's folder (into a copy): serving/ written again, the files beside kept."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run["out"], copy)
    (copy / "serving" / "variables" / "stale.index").write_bytes(b"old")
    done = subprocess.run([sys.executable, "-m", "spark_imagenet", "export", str(copy)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (copy / "serving" / "variables" / "stale.index").exists()
    assert (copy / "results.json").read_bytes() == (run["out"] / "results.json").read_bytes()
    assert (copy / "serving" / "saved_model.pb").is_file()
