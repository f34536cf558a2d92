"""The driver side of training (spark_imagenet.training.driver.launch): settings, planning
without Spark, and task failures rebuilt on the driver with their own class, on real
local Spark."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bucket_util import make_bucket
from spark_imagenet.errors import ConfigError, ManifestError, SparkImagenetError, StorageError, TrainingError
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.driver.launch import plan_job, task_error, train
from spark_imagenet.training.job.outcome import FAILURE_MARKER, Failure, LostPeer


def _error_classes(base: type[SparkImagenetError] = SparkImagenetError) -> dict[str, type[SparkImagenetError]]:
    """This package's error classes by name: ``base`` and all its subclasses, at any depth."""
    found = {base.__name__: base}
    for sub in base.__subclasses__():
        found.update(_error_classes(sub))
    return found


FAILURE = Failure(stage="training (fit)", message="InvalidArgumentError: logits and labels", rank=1,
                  host="10.0.0.2", exit_status=1, output=("hello", "worker rank 1 failed"),
                  process="the TensorFlow process (m) exited with code 1")


def test_task_error_rebuilds_the_failure_the_task_raised():
    """The driver takes the task's Failure from its JSON line inside Spark's message: no pattern over words."""
    text = ("An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            f"spark_imagenet.errors.TrainingError: {FAILURE.to_error()}\n"
            " SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:1)\n")
    err = task_error(text)
    assert type(err) is TrainingError and err.failure == FAILURE
    assert str(err) == FAILURE.describe()
    assert str(err).startswith("rank 1 on 10.0.0.2: the TensorFlow process (m) exited with code 1 while training")
    assert str(err).endswith("(end of rank 1 output)")
    assert "\tat " not in str(err) and "SQLSTATE" not in str(err) and FAILURE_MARKER not in str(err)


def test_task_error_of_a_failure_outside_our_code():
    other = task_error("org.apache.spark.SparkException: Job aborted due to stage failure: boom\n"
                       "ValueError: bad value\n\tat org.apache.X.y(X.scala:1)\n")
    assert type(other) is TrainingError and "Job aborted" in str(other) and "ValueError: bad value" in str(other)
    assert "\tat " not in str(other) and getattr(other, "failure", None) is None


def test_a_failure_survives_its_json_line():
    lost = replace(FAILURE, error="WorkerLost", lost_peers=(LostPeer(0, "h:1", "does not answer"),))
    assert Failure.find("noise\n" + str(lost.to_error()) + "\nmore") == lost
    assert Failure.from_json(lost.to_json()) == lost and lost.lost and not FAILURE.lost
    assert lost.summary().startswith("rank 1 on 10.0.0.2: lost its peer: rank 0 (h:1) does not answer; the "
                                     "TensorFlow process (m) exited with code 1 while training (fit): ")
    assert "\n" not in lost.summary()
    assert Failure.find("no failure here") is None and Failure.find(FAILURE_MARKER + "{not json") is None


#: The classes checked in the fast tier (a Spark job each); the slow tier checks every class.
FAST_ERRORS = ("AccessError", "ConfigError", "WorkerLost")


@pytest.mark.parametrize("name", [n if n in FAST_ERRORS else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(_error_classes())])
def test_every_error_class_survives_the_trip_from_a_task(spark, name):
    """A task raises the error of a Failure of each of the package's error classes (subclasses of subclasses
    too, e.g. a 403's AccessError); the driver rebuilds the same class and message from what Spark reports."""
    failure = Failure(stage="staging its shards", message=f"the {name} message", error=name, rank=0, host="h")

    def fail(_items):
        raise failure.to_error()

    with pytest.raises(Exception) as e:
        spark.sparkContext.parallelize([0], 1).mapPartitions(fail).collect()
    err = task_error(str(e.value))
    assert type(err) is _error_classes()[name]
    assert str(err) == f"rank 0 on h: the {name} message" and err.failure == failure


def test_train_takes_a_config_and_says_how_to_make_one():
    """Wording test (train()'s arguments): what was given and the call to write."""
    with pytest.raises(ConfigError, match=r"train\(\) takes the job's settings as a TrainConfig, got int 2: "
                                          r"train\(spark, url, TrainConfig\(workers=2, \.\.\.\)\)"):
        train(None, "unused", 2)
    with pytest.raises(ConfigError, match=r"TrainConfig\(workers=N, \.\.\.\)") as e:
        train(None, "unused", {"workers": 2})
    assert (e.value.key, e.value.value) == ("config", {"workers": 2})


def test_plan_job_refuses_gpus_of_a_local_master_before_spark(tmp_path):
    with pytest.raises(ConfigError, match="local") as e:
        plan_job(str(make_bucket(tmp_path / "b")), TrainConfig(workers=1, gpus_per_worker=1, master="local[2]"))
    assert (e.value.key, e.value.value) == ("--gpus-per-worker", 1)


def test_plan_job_needs_no_spark(tmp_path):
    bucket = make_bucket(tmp_path / "b", train=4)
    job = plan_job(str(bucket), TrainConfig(workers=2, cache="rel-cache"))
    assert job.url == str(bucket) and job.manifest.dataset_id == "fake-b"
    assert [p.train_shards for p in job.assignment.workers][0][0].name == "train-00000-of-00004.tfrecord"
    assert job.config.data.cache == str(Path.cwd() / "rel-cache")


@pytest.mark.parametrize("kwargs", [
    {"workers": 0}, {"batch_size": 0}, {"epochs": 0}, {"image_size": -3}, {"width": 0.0}, {"learning_rate": -1.0},
    {"parallel": 0}, {"model": ""},
])
def test_bad_settings_name_the_option(spark, tmp_path, kwargs):
    args = {"workers": 2, **kwargs}
    workers = args.pop("workers")
    with pytest.raises(ConfigError) as e:
        train(spark, str(tmp_path / "nowhere"), TrainConfig(workers=workers, **args))
    [(key, value)] = kwargs.items()
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)


def test_missing_manifest_and_bad_results_path(spark, tmp_path):
    with pytest.raises(ManifestError, match="does not exist"):
        train(spark, str(tmp_path / "empty"), TrainConfig(workers=2))
    with pytest.raises(ConfigError) as e:
        train(spark, str(make_bucket(tmp_path / "b")), TrainConfig(workers=2,
                                                                   results=tmp_path / "no" / "such" / "r.json"))
    assert e.value.key == "--results"
    with pytest.raises(ConfigError) as e:
        train(spark, str(make_bucket(tmp_path / "one", train=1)), TrainConfig(workers=2))
    assert (e.value.key, e.value.value) == ("--workers", 2)


def test_gpus_the_session_cannot_give_are_refused_before_launch(spark, tmp_path):
    # local[2] has no GPU resources: refused by the driver's checks, not by a task or a stuck stage
    with pytest.raises(ConfigError) as e:
        train(spark, str(make_bucket(tmp_path / "b")), TrainConfig(workers=1, gpus_per_worker=1))
    assert (e.value.key, e.value.value) == ("--gpus-per-worker", 1)


@pytest.mark.slow
def test_task_failure_reaches_the_driver_as_a_clear_error(spark, tmp_path):
    # rank 1's train shard is corrupted in the bucket: its barrier task fails while staging it,
    # rank 0 is waiting in the rendezvous and gets killed; the driver re-raises the task's error.
    bucket = make_bucket(tmp_path / "b", train=2, corrupt="train-00001-of-00002.tfrecord")
    with pytest.raises(StorageError) as e:
        train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", batch_size=2))
    msg = str(e.value)
    assert msg.startswith("rank 1 on ")
    assert "train-00001-of-00002.tfrecord" in msg and "crc32c" in msg
    assert "\tat org.apache" not in msg and "Py4J" not in msg
    # How far rank 0 got before the stage was killed depends on timing (under CPU load its Python worker
    # may not even have started), so check what holds either way: the corrupt shard never reached its
    # cache name, and every shard that did is an intact copy of the bucket's.
    cached = tmp_path / "cache" / "fake-b"
    assert not (cached / "train-00001-of-00002.tfrecord").exists()
    assert not (cached / "train-00001-of-00002.tfrecord.verified").exists()
    for path in sorted(cached.glob("*.tfrecord")):
        assert path.read_bytes() == (bucket / path.name).read_bytes(), path.name
    # the session is still usable afterwards
    assert spark.sparkContext.parallelize(range(4), 2).sum() == 6


def test_a_spark_failure_of_a_lost_executor_is_worker_lost_and_others_are_not():
    from spark_imagenet.errors import WorkerLost

    lost = task_error("org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 3.0 "
                      "failed 1 times, most recent failure: Lost task 1.0 (ExecutorLostFailure (executor 2 exited "
                      "caused by one of the running tasks) Reason: Remote RPC client disassociated)\n\tat x.y(Z)")
    assert type(lost) is WorkerLost and "ExecutorLostFailure" in str(lost)
    other = task_error("org.apache.spark.SparkException: Job aborted due to stage failure: bad conf\n\tat x.y(Z)")
    assert type(other) is TrainingError
    killed = replace(FAILURE, error="WorkerLost", exit_status=-9,
                     process="the TensorFlow process (m) was killed by SIGKILL")
    rebuilt = task_error(f"...spark_imagenet.errors.WorkerLost: {killed.to_error()}\n\tat x")
    assert type(rebuilt) is WorkerLost and str(rebuilt).endswith("(end of rank 1 output)")
