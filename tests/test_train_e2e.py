"""End to end: a tiny generated dataset, sharded, trained twice in one SparkSession
on local[2] (two barrier tasks, two TensorFlow workers under MWMS)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from data_util import small_layout
from spark_imagenet.errors import TrainingError
from spark_imagenet.shard import shard
from spark_imagenet.train import train

pytestmark = pytest.mark.slow

# AlexNet's smallest input is 67 px (conv1 11x11/4 then three 3x3/2 pools); a little above it keeps CPU time low.
SMALL = {"batch_size": 4, "image_size": 72, "width": 0.25, "learning_rate": 0.01}


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    tree = small_layout(root / "kaggle")  # 4 classes x 6 train, 3 val each
    # 2 train shards for 2 workers; 1 val shard: the workers split its records (record sharding)
    shard(tree, root / "bucket", train_shards=2, val_shards=1, processes=1, progress=False, log=lambda m: None)
    return root


def _cache_state(cache: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.rglob("*.tfrecord")}


def test_train_twice_in_one_session(spark, bucket):
    url, cache = str(bucket / "bucket"), bucket / "cache"
    lines: list[str] = []

    first = train(spark, url, 2, epochs=1, cache=cache, results=bucket / "r1.json", log=lines.append, **SMALL)
    assert first["workers"] == 2
    assert [w["rank"] for w in first["per_worker"]] == [0, 1]
    steps_per_epoch = 24 // (SMALL["batch_size"] * 2)
    assert first["config"]["steps_per_epoch"] == steps_per_epoch
    for w in first["per_worker"]:
        assert w["host"] and w["steps"] == steps_per_epoch
        assert w["train_images"] == steps_per_epoch * SMALL["batch_size"]
        assert w["images_per_sec"] > 0 and w["train_loss"] > 0 and 0 <= w["train_top1"] <= 1
    # every val image counted exactly once although each worker read half the records of one shard
    assert first["val"]["images"] == 12
    assert 0 <= first["val"]["top1"] <= first["val"]["top5"] <= 1
    assert json.loads((bucket / "r1.json").read_text())["val"] == first["val"]
    assert any(line.lstrip().startswith("rank") and "images/s" in line for line in lines)
    assert any(line.startswith("val: 12 images") for line in lines)
    cached = _cache_state(cache)
    assert len(cached) == 3  # 2 train shards + the shared val shard, each once on this host

    # a second MWMS job in the same session: fresh child processes, shards reused from the cache
    second = train(spark, url, 2, epochs=2, cache=cache, log=lines.append, **SMALL)
    assert [w["steps"] for w in second["per_worker"]] == [2 * steps_per_epoch] * 2
    assert second["val"]["images"] == 12
    assert len(second["history"]["loss"]) == 2
    assert _cache_state(cache) == cached


def test_worker_failure_is_reported_with_its_output(spark, bucket):
    # 64 px is below AlexNet's minimum: each TensorFlow child exits 1 with a ConfigError
    with pytest.raises(TrainingError) as e:
        train(spark, str(bucket / "bucket"), 2, epochs=1, cache=bucket / "cache", log=lambda m: None,
              **{**SMALL, "image_size": 64})
    msg = str(e.value)
    assert msg.startswith("rank ") and "exited with code 1" in msg
    assert "--image-size 64" in msg and "(end of rank" in msg
    assert "\tat org.apache" not in msg
    # the session survives a failed barrier job
    assert spark.sparkContext.parallelize(range(3), 3).count() == 3
    assert os.path.isdir(bucket / "cache")
