"""Every versioned JSON document of the package goes through the one Envelope
(spark_imagenet.storage.envelope): another format or an unknown version reads the same everywhere."""

from __future__ import annotations

import dataclasses

import pytest

from spark_imagenet.errors import ConfigError
from spark_imagenet.storage.envelope import Envelope
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.outcome import Failure, TaskResult, WorkerResult
from spark_imagenet.training.job.plan import WorkerSpec
from spark_imagenet.training.job.schedules import Schedule, schedule_for

READERS = [Failure, WorkerResult, TaskResult, WorkerSpec, TrainConfig, Schedule]


def _good(cls) -> dict:
    config = TrainConfig(workers=2, batch_size=8)
    if cls is TrainConfig:
        return config.to_json()
    if cls is Schedule:
        return schedule_for(config, 5).to_json()
    if cls is Failure:
        return Failure(stage="training (fit)", message="boom", rank=1).to_json()
    if cls is TaskResult:
        return TaskResult(rank=0, host="h", python="p", peer_failed="rank 1 failed").to_json()
    if cls is WorkerSpec:
        return WorkerSpec(config=config, schedule=schedule_for(config, 5), dataset_id="d", num_classes=10, rank=1,
                          train_files=("/t",), train_examples=40, val_files=(), val_examples=0,
                          val_examples_total=0, steps_per_epoch=5, val_steps=0).to_json()
    return None  # WorkerResult: its envelope is checked without a body


@pytest.mark.parametrize("cls", READERS, ids=lambda c: c.__name__)
def test_another_format_or_version_reads_the_same_everywhere(cls):
    good = _good(cls) or {"format": "spark-imagenet-worker-result", "format_version": 1}
    with pytest.raises(ConfigError, match=r"^here: not a spark-imagenet .* \(expected \"format\": \"spark-imagenet-"):
        cls.from_json({**good, "format": "something-else"}, "here")
    with pytest.raises(ConfigError, match=r"^here: format_version 99 is not supported by this version of "
                                          r"spark-imagenet \(which reads \d\); use the version"):
        cls.from_json({**good, "format_version": 99}, "here")
    if _good(cls) is not None:
        assert cls.from_json(good, "here").to_json() == good


@dataclasses.dataclass
class _Two:
    kind: str
    epochs: int
    factor: float = 1.0


def test_fields_for_names_missing_and_unknown_keys():
    envelope = Envelope("x-doc", 1, "x document", remedy="rebuild it")
    data = envelope.to_json({"kind": "a", "colour": 1})
    with pytest.raises(ConfigError, match=r"^f: unknown key\(s\) colour; missing key\(s\) epochs; rebuild it$"):
        envelope.fields_for(_Two, data, "f")
    assert envelope.fields_for(_Two, envelope.to_json({"kind": "a", "epochs": 2}), "f") == {"kind": "a", "epochs": 2}
