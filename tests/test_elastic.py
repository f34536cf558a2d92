"""Resuming a checkpoint on another worker count (the global batch kept): 2 workers, then 3, then 1, on a real
``local[3]`` session, with the learning-rate schedule continued (read back from TensorBoard)."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_util import small_layout
from session_util import module_spark
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.training.driver.launch import train
from spark_imagenet.training.job.config import TrainConfig
from test_train_e2e import _scalars

pytestmark = pytest.mark.slow

#: Global batch 12: 2 x 6, 3 x 4, 1 x 12. Cosine without warm-up: every step's rate differs.
RECIPE = {"image_size": 72, "width": 0.25, "learning_rate": 0.02, "lr_schedule": "cosine", "warmup_epochs": 0.0,
          "epochs": 3}


@pytest.fixture(scope="module")
def spark():
    yield from module_spark("local[3]", "spark-imagenet-elastic")


@pytest.fixture(scope="module")
def bucket(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("elastic")
    tree = small_layout(root / "kaggle", train_per_class=12)  # 48 train images: 4 steps of 12 per epoch
    shard(tree, root / "bucket", train_shards=6, val_shards=1, processes=1, progress=False)
    return root


def test_a_two_worker_checkpoint_resumes_on_three_then_on_one(spark, bucket, tmp_path, log_lines):
    from spark_imagenet.training.job.schedules import schedule_for

    ckpt, data, cache = str(tmp_path / "ck"), str(bucket / "bucket"), bucket / "cache"
    runs = [(2, 6, 1), (3, 4, 2), (1, 12, 3)]  # workers, batch per worker, epochs done at the end
    results = []
    for workers, batch, epochs in runs:
        log_lines.clear()
        out = train(spark, data, TrainConfig(workers=workers, batch_size=batch, cache=cache, checkpoint_dir=ckpt,
                                             output=str(tmp_path / f"out-{workers}"), **{**RECIPE, "epochs": epochs}))
        results.append(out)
        assert out.workers == workers and len(out.per_worker) == workers
        assert out.config["steps_per_epoch"] == 4 and len(out.history["xent"]) == epochs
        if epochs > 1:
            assert any(f"resuming at epoch {epochs} of {epochs} from the checkpoint of epoch {epochs - 1}" in line
                       for line in log_lines), log_lines
    for (workers, batch, epochs), out in zip(runs, results):
        # each run trained one epoch; its last step is global step 4 x epochs - 1 of its own schedule (the
        # optimizer's step counter came from the checkpoint of the other worker count; from 0 the rate would be
        # the schedule's at step 3)
        schedule = schedule_for(TrainConfig(workers=workers, batch_size=batch, **{**RECIPE, "epochs": epochs}), 4)
        logged = dict(_scalars(tmp_path / f"out-{workers}" / "tensorboard" / "train")["learning_rate"])
        assert sorted(logged) == [epochs]
        assert logged[epochs] == pytest.approx(schedule.at(epochs * 4 - 1), rel=1e-5)
        assert epochs == 1 or logged[epochs] != pytest.approx(schedule.at(3), rel=1e-3)
    assert results[0].history["xent"][0] == results[2].history["xent"][0]  # epoch 1's, carried along
