"""--keep-checkpoints reaches the commit: the chief's CheckpointSaver keeps that many complete checkpoints."""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.storage import LocalStorage  # noqa: E402
from spark_imagenet.training.job import checkpoints  # noqa: E402
from spark_imagenet.training.job.config import TrainConfig  # noqa: E402
from spark_imagenet.training.worker.model_state import CheckpointSaver  # noqa: E402


def _saver(storage, keep) -> CheckpointSaver:
    config = TrainConfig(workers=1, epochs=4, keep_checkpoints=keep)
    meta = checkpoints.new_meta(config, "d", 3, 2, {})
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    saver = CheckpointSaver(meta, storage, True, 2, keep=config.keep_checkpoints)
    saver.set_model(model)
    return saver


@pytest.mark.parametrize("keep", [1, 3])
def test_the_saver_keeps_keep_checkpoints(tmp_path, keep):
    storage = LocalStorage(tmp_path / "ckpt")
    saver = _saver(storage, keep)
    for epoch in range(4):
        saver.on_epoch_end(epoch, {"loss": 1.0 / (epoch + 1)})
    kept = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert kept == [checkpoints.folder_name(e) for e in range(5 - keep, 5)]
    assert checkpoints.latest(storage)[1].epoch == 4


def test_the_saver_refuses_keeping_none(tmp_path):
    with pytest.raises(ConfigError, match="keep 0"):
        CheckpointSaver(None, None, True, 2, keep=0)
