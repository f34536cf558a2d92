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
    saver = CheckpointSaver(meta, storage, True, 2, keep=config.run.keep_checkpoints)
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
    with pytest.raises(ConfigError) as e:
        CheckpointSaver(None, None, True, 2, keep=0)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("keep", 0)


def test_a_full_store_fails_an_epoch_but_not_the_runs_last(tmp_path, log_lines):
    """A checkpoint the store has no room for: before the last epoch the run stops (a rerun resumes from the one
    before); at the last epoch the trained model goes on to evaluation and --output, with one error line."""
    from disk_util import small_tmpfs
    from spark_imagenet.errors import StorageError

    with small_tmpfs(tmp_path / "disk", 4096) as disk:
        saver = _saver(LocalStorage(disk / "ckpt"), 2)
        with pytest.raises(StorageError, match="no room for checkpoint epoch-000002"):
            saver.on_epoch_end(1, {"loss": 1.0})
        saver.on_epoch_end(3, {"loss": 0.5})  # epoch 4 of 4: no exception
        assert any(line.startswith("checkpoint: the last epoch's checkpoint was not committed (no room for "
                                   "checkpoint epoch-000004") and "written to --output as usual" in line
                   for line in log_lines)


def test_a_loss_that_is_not_finite_stops_training_before_its_checkpoint(tmp_path):
    """StopOnNaN raises at the end of a diverged epoch, and it comes before the saver, so no NaN checkpoint."""
    from spark_imagenet.errors import TrainingError
    from spark_imagenet.training.worker.model_state import StopOnNaN

    StopOnNaN().on_epoch_end(0, {"xent": 1.5})
    with pytest.raises(TrainingError, match=r"training diverged: the loss is nan after epoch 3; .*Lower "
                                            r"--learning-rate, add --warmup-epochs"):
        StopOnNaN().on_epoch_end(2, {"xent": float("nan"), "top1": 0.2})
