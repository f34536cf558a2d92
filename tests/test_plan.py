"""The job's values going in (spark_imagenet.training.job.plan): the plan the driver resolves once, the worker
spec each TensorFlow worker reads, and the hop in between (each adds only its own part)."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from bucket_util import make_bucket
from spark_imagenet.errors import ConfigError
from spark_imagenet.training.driver.launch import plan_job
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.storage import LocalStorage, open_storage
from spark_imagenet.training.job import outputs
from spark_imagenet.training.job.plan import WorkerSpec, worker_spec
from spark_imagenet.training.job.schedules import schedule_for
from spark_imagenet.training.task.barrier_task import TaskSpec


def spec(**changes) -> WorkerSpec:
    config = TrainConfig(workers=2, batch_size=8)
    fields = dict(config=config, schedule=schedule_for(config, 5), dataset_id="d", num_classes=10, rank=1,
                  train_files=("/c/train-00001.tfrecord",), train_examples=40, val_files=("/c/val-00000.tfrecord",),
                  val_record_shard=(2, 1), val_examples=9, val_examples_total=18, steps_per_epoch=5, val_steps=2,
                  threads=1, checkpoints=LocalStorage("/c/ckpt"))
    fields.update(changes)
    return WorkerSpec(**fields)


def test_worker_spec_json_round_trip():
    one = spec()
    data = json.loads(json.dumps(one.to_json()))
    assert data["format"] == "spark-imagenet-worker-spec" and data["config"]["batch_size"] == 8
    assert data["schedule"]["format"] == "spark-imagenet-lr-schedule" and data["checkpoints"]["url"] == "/c/ckpt"
    assert WorkerSpec.from_json(data) == one
    assert one.seed == 1 and one.workers == 2 and one.parallel == 1  # job seed 0 + rank 1; threads 1


@pytest.mark.parametrize("change", [
    {"rank": 2}, {"train_files": ()}, {"val_steps": 1}, {"val_files": ()}, {"val_record_shard": (2, 2)}, {"steps_per_epoch": 0}, {"train_files": 3},
    {"peers": ["h:1", ""]}, {"threads": -1}, {"num_classes": 0}, {"dataset_id": ""},
])
def test_worker_spec_rejects_impossible_values(change):
    with pytest.raises(ConfigError) as e:
        spec(**change)
    [(key, value)] = change.items()
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)


def test_a_worker_spec_names_its_rank_and_key():
    """Wording test (worker specs): the record, the key and what it must be."""
    with pytest.raises(ConfigError, match=r"^worker spec of rank 1: key 'threads' must be an integer >= 0, got -1$"):
        spec(threads=-1)
    with pytest.raises(ConfigError, match="'schedule' a Schedule"):
        spec(schedule=None)


def test_the_worker_spec_and_the_checkpoint_meta_check_the_dataset_facts_by_one_rule():
    """The dataset's id and class count have one rule each (settings.FACTS), which both records use; lists of
    names become tuples, as worker.json gives them."""
    from spark_imagenet.training.job import checkpoints, plan
    from spark_imagenet.training.job.settings import FACTS

    for name in FACTS:
        assert plan._RULES[name] is FACTS[name] and checkpoints._OWN_RULES[name] is FACTS[name]
    one = spec(train_files=["/c/a"], peers=["h:1", "h:2"])
    assert one.train_files == ("/c/a",) and one.peers == ("h:1", "h:2")


def test_worker_spec_from_json_names_missing_and_unknown_keys_and_other_versions():
    data = spec().to_json()
    del data["val_steps"]
    with pytest.raises(ConfigError, match="missing key") as e:
        WorkerSpec.from_json(data)
    assert e.value.key == "val_steps"
    with pytest.raises(ConfigError, match="unknown key") as e:
        WorkerSpec.from_json({**spec().to_json(), "learning_rate": 0.1})
    assert e.value.key == "learning_rate"
    with pytest.raises(ConfigError) as e:
        WorkerSpec.from_json({**spec().to_json(), "format_version": 1})
    assert (e.value.key, e.value.value) == ("format_version", 1)
    data = spec().to_json()
    data["config"]["model"] = "vgg16"
    with pytest.raises(ConfigError) as e:
        WorkerSpec.from_json(data)
    assert (e.value.key, e.value.value) == ("model", "vgg16")


def test_the_plan_gives_the_chief_a_local_output_as_its_absolute_path(tmp_path, monkeypatch):
    """A relative path and a file:// URL both reach the chief as the folder's absolute path (storage.is_remote_url
    tells them from a bucket, which is kept as given)."""
    bucket = make_bucket(tmp_path / "b", train=4, val=1)
    monkeypatch.chdir(tmp_path)
    job = plan_job(str(bucket), TrainConfig(workers=2, batch_size=2, output="out",
                                            checkpoint_dir=f"file://{tmp_path / 'ckpt'}"))
    assert job.config.run.output == str(tmp_path / "out") and job.config.run.checkpoint_dir == str(tmp_path / "ckpt")


def test_the_plan_is_resolved_once_and_each_hop_adds_its_own_part(tmp_path):
    """The driver's plan carries the settings, the dataset, the one schedule and the storage handles; the
    task's spec adds the resume point; the worker's spec adds the rank, files and step counts."""
    bucket = make_bucket(tmp_path / "b", train=4, val=1)
    job = plan_job(str(bucket), TrainConfig(workers=2, batch_size=2, checkpoint_dir=str(tmp_path / "ckpt"),
                                            output=str(tmp_path / "out")))
    assert job.schedule == schedule_for(job.config, job.assignment.steps_per_epoch)
    assert job.dataset == open_storage(str(bucket)) and job.dataset.url == str(bucket)
    assert job.checkpoints.url == str(tmp_path / "ckpt") and job.output.url == str(tmp_path / "out")
    task = TaskSpec(job)
    assert pickle.loads(pickle.dumps(task)) == task  # what functools.partial hands to Spark
    assert {f.name for f in dataclasses.fields(task)} == {"job", "resume", "log_channel", "child_module"}
    one = worker_spec(job, 1, ["/c/t1", "/c/t3"], ["/c/v0"], threads=3)
    assert one.rank == 1 and one.workers == 2 and one.num_classes == 2 and one.config is job.config
    assert one.schedule is job.schedule and one.checkpoints is job.checkpoints and one.dataset_id == "fake-b"
    assert one.train_files == ("/c/t1", "/c/t3") and one.train_examples == 10  # 2 shards x 5 examples
    assert one.val_record_shard == (2, 1) and one.val_examples == 2 and one.val_examples_total == 5
    assert one.steps_per_epoch == job.assignment.steps_per_epoch and one.parallel == 3 and one.threads == 3
    fixed = worker_spec(dataclasses.replace(job, config=job.config.replace(parallel=1)), 0, ["/c/t0"], ["/c/v0"],
                        threads=3)
    assert fixed.parallel == 1 and fixed.threads == 3
    assert WorkerSpec.from_json(json.loads(json.dumps(one.to_json()))) == one
    # the chief alone carries the class list (its serving SavedModel names the classes), as labels.json has it
    assert one.labels == () and [c["wnid"] for c in fixed.labels] == [c.wnid for c in job.manifest.classes]
    assert list(fixed.labels) == outputs.labels(job.manifest.classes)
    assert WorkerSpec.from_json(json.loads(json.dumps(fixed.to_json()))) == fixed
    no_output = worker_spec(dataclasses.replace(job, output=None), 0, ["/c/t0"], ["/c/v0"])
    assert no_output.labels == ()
    with pytest.raises(ConfigError, match="key 'labels' must be empty or 2 objects"):
        dataclasses.replace(fixed, labels=fixed.labels[:1])


def test_the_plan_carries_storage_handles_that_pickle_without_their_clients(tmp_path, gcs_bucket):
    """The driver opens each storage once; the plan pickles it to the tasks (a GCS handle without its client,
    with the emulator endpoint the driver's environment named), and the worker spec's JSON reopens it."""
    bucket = make_bucket(tmp_path / "b", train=4, val=1)
    gcs = open_storage(f"gs://{gcs_bucket}/runs/ckpt")
    gcs.exists("x")  # used: its client is made
    job = dataclasses.replace(plan_job(str(bucket), TrainConfig(workers=2, batch_size=2)), checkpoints=gcs)
    again = pickle.loads(pickle.dumps(TaskSpec(job))).job
    assert again == job and again.checkpoints is not gcs and again.checkpoints.endpoint == gcs.endpoint
    assert again.checkpoints.exists("x") is False and again.dataset.read_bytes("manifest.json")
    one = worker_spec(job, 0, ["/c/t0"], ["/c/v0"])
    data = json.loads(json.dumps(one.to_json()))
    assert data["checkpoints"] == {"url": gcs.url, "options": gcs.reopen_options()}
    assert WorkerSpec.from_json(data).checkpoints == gcs
    with pytest.raises(ConfigError, match=r"key 'checkpoints': expected \{\"url\": str"):
        WorkerSpec.from_json({**data, "checkpoints": "gs://x"})


def test_a_shard_deleted_or_replaced_after_the_commit_is_caught_before_spark(tmp_path):
    """One listing of the dataset at plan time: a shard gone or of another size is named (a host's cached copy
    from an earlier run would otherwise hide it)."""
    from data_util import build, small_layout
    from spark_imagenet.errors import ManifestError

    data = tmp_path / "bucket"
    manifest = build(small_layout(tmp_path / "src"), data)
    config = TrainConfig(workers=1, batch_size=2, image_size=72, width=0.25)
    plan_job(str(data), config)
    gone, changed = manifest.splits["train"].shards[0], manifest.splits["val"].shards[0]
    (data / gone.name).unlink()
    (data / changed.name).write_bytes(b"other bytes")
    with pytest.raises(ManifestError) as e:
        plan_job(str(data), config)
    message = str(e.value)
    assert message.startswith(f"2 shard(s) of the dataset at {data} (id {manifest.dataset_id}) do not match")
    assert f"{gone.name}: missing" in message
    assert f"{changed.name}: 11 bytes, the manifest says {changed.bytes}" in message
    assert "Shard the source again, or upload the dataset again" in message
