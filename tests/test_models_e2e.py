"""End to end: ResNet-50 and a user's own builder (``--model user_model:build``) each train one epoch on
local[2] (two barrier tasks, two TensorFlow workers under MultiWorkerMirroredStrategy) on a tiny generated
dataset."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from data_util import small_layout
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.errors import ConfigError
from spark_imagenet.training.driver.launch import train
from spark_imagenet.training.job.config import TrainConfig

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
#: 4 classes x 6 train images, 2 workers x batch 4: 3 steps per epoch.
SMALL = {"batch_size": 4, "epochs": 1, "image_size": 32}


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    root = tmp_path_factory.mktemp("models-e2e")
    tree = small_layout(root / "kaggle")  # 4 classes x 6 train, 3 val each
    shard(tree, root / "bucket", train_shards=2, val_shards=1, processes=1, progress=False)
    return root / "bucket"


def _check_one_epoch(out: dict, model: str) -> None:
    assert out.config["model"] == model
    assert out.workers == 2 and [w.rank for w in out.per_worker] == [0, 1]
    assert all(w.steps == 3 for w in out.per_worker)
    assert len(out.history["loss"]) == 1
    assert out.val.images == 12
    assert 0 <= out.val.top1 <= out.val.top5 <= 1


def test_resnet50_trains_one_epoch(log_lines, spark, bucket, tmp_path):
    lines = log_lines
    lines.clear()  # the lines from here on
    # ResNet-50's recipe warms up for 5 epochs, longer than this one-epoch run: no warm-up here
    out = train(spark, str(bucket), TrainConfig(workers=2, model="resnet50", lr_schedule="cosine", warmup_epochs=0,
                                                cache=tmp_path / "cache", **SMALL))
    _check_one_epoch(out, "resnet50")
    assert out.config["width"] == 1.0 and out.config["lr_scaling"] == "linear"  # the model's recipe


def test_user_builder_trains_one_epoch(log_lines, spark, bucket, tmp_path):
    # the way a user ships a module to the executors: the driver finds it on its own path (conftest puts
    # tests/ there), the barrier tasks get it from addPyFile, and the TensorFlow child from the task's sys.path
    spark.sparkContext.addPyFile(str(TESTS / "user_model.py"))
    lines = log_lines
    lines.clear()  # the lines from here on
    out = train(spark, str(bucket), TrainConfig(workers=2, model="user_model:build", width=0.5, learning_rate=0.05,
                                                cache=tmp_path / "cache", **SMALL))
    _check_one_epoch(out, "user_model:build")
    assert out.config["width"] == 0.5
    # a builder written with Keras 3 (import keras) is refused where the worker first holds its model, inside the
    # strategy's scope and before training; its one line reaches the driver as a ConfigError, with the TensorFlow
    # process's last lines after it and no traceback
    with pytest.raises(ConfigError) as info:
        train(spark, str(bucket), TrainConfig(workers=2, model="user_model:keras3_model", cache=tmp_path / "cache",
                                              **SMALL))
    first = str(info.value).splitlines()[0]
    assert re.match(r"rank [01] on .*while building the model: ConfigError: model \(--model\) "
                    r"'user_model:keras3_model' returned a Keras 3 model keras\.", first), first
    assert first.endswith("`import tf_keras as keras` (the tf-keras package), instead of `import keras`; its last "
                          f"{len(str(info.value).splitlines()) - 2} output line(s):"), first
    assert "Traceback" not in str(info.value)
