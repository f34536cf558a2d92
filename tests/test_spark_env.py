"""Java detection, local sessions, and the driver's checks before a barrier launch
(settings, dynamic allocation, task slots) and its translation of task failures."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest

from spark_imagenet.errors import (ConfigError, EnvironmentSetupError, ManifestError, StorageError, TrainingError)
from spark_imagenet.dataset.manifest import Manifest, ShardInfo, SplitInfo
from spark_imagenet.source.synset import SynsetClass
from spark_imagenet.training.spark_session import check_java, is_local_master, local_session, parse_java_version
from spark_imagenet.storage import LocalStorage, crc32c_file
from spark_imagenet.training.driver import available_slots, slots_from_master, task_error, train


# ------------------------------------------------------------------ Java
@pytest.mark.parametrize("text,major", [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
    ('java version "1.8.0_292"\nJava(TM) SE Runtime Environment', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ('openjdk version "11.0.2" 2019-01-15', 11),
    ('Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "25-ea" 2025-09-16', 25),
])
def test_parse_java_version(text, major):
    assert parse_java_version(text)[0] == major


def fake_java(folder: Path, version_line: str, code: int = 0) -> Path:
    """A folder with bin/java: a shell script that prints ``version_line`` to stderr like `java -version`."""
    java = folder / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\nexit {code}\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def test_check_java_rejects_an_old_java_home(tmp_path, monkeypatch):
    home = fake_java(tmp_path / "jdk8", 'java version "1.8.0_292"')
    monkeypatch.setenv("JAVA_HOME", str(home))
    with pytest.raises(EnvironmentSetupError) as e:
        check_java()
    msg = str(e.value)
    assert "1.8.0_292" in msg and str(home / "bin" / "java") in msg
    assert "openjdk-17-jre-headless" in msg and "JAVA_HOME" in msg and "17" in msg
    # local_session checks before it starts anything
    with pytest.raises(EnvironmentSetupError, match="1.8.0_292"):
        local_session("local[1]")


def test_check_java_accepts_a_new_java_home(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path / "jdk21", 'openjdk version "21.0.3" 2024-04-16')))
    assert check_java() == 21


def test_java_home_without_java(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(EnvironmentSetupError, match="has no executable bin/java"):
        check_java()


def test_java_from_path(tmp_path, monkeypatch):
    home = fake_java(tmp_path / "jdk11", 'openjdk version "11.0.2" 2019-01-15')
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(home / "bin"))
    with pytest.raises(EnvironmentSetupError, match=r"11\.0\.2.*PATH|PATH.*11\.0\.2"):
        check_java()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(EnvironmentSetupError, match="No Java found"):
        check_java()


def test_java_that_prints_no_version(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path / "broken", "Error: bad install", code=1)))
    with pytest.raises(EnvironmentSetupError, match="printed no Java version"):
        check_java()


def test_this_machine_has_a_usable_java():
    assert check_java() >= 17


# ------------------------------------------------------------ slot math
def test_slots_from_master():
    assert slots_from_master("local", 1, 99) == 1
    assert slots_from_master("local[3]", 1, 99) == 3
    assert slots_from_master("local[4, 2]", 1, 99) == 4
    assert slots_from_master("local[*]", 1, 99) == (os.cpu_count() or 1)
    assert slots_from_master("local-cluster[2,3,1024]", 1, 99) == 6
    assert slots_from_master("local-cluster[2,3,1024]", 2, 99) == 3
    assert slots_from_master("spark://h:7077", 2, 8) == 4
    assert is_local_master("local[2]") and is_local_master("local") and not is_local_master("yarn")


def test_task_error_extracts_the_package_error():
    text = ("An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "spark_imagenet.errors.TrainingError: rank 1 on 10.0.0.2: the TensorFlow process exited with code 1; "
            "its last 2 output line(s):\n  | hello\n  | replica rank 1 failed\n(end of rank 1 output)\n"
            " SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:1)\n")
    err = task_error(text)
    assert type(err) is TrainingError
    assert str(err).startswith("rank 1 on 10.0.0.2") and str(err).endswith("(end of rank 1 output)")
    assert "\tat " not in str(err) and "SQLSTATE" not in str(err)
    other = task_error("org.apache.spark.SparkException: Job aborted due to stage failure: boom\n"
                       "ValueError: bad value\n\tat org.apache.X.y(X.scala:1)\n")
    assert type(other) is TrainingError and "Job aborted" in str(other) and "ValueError: bad value" in str(other)
    assert "\tat " not in str(other)


# ------------------------------------------------------- driver-side checks
def make_bucket(root: Path, train: int = 4, val: int = 1, corrupt: str | None = None) -> Path:
    """Shard files of random bytes and a valid manifest (enough for everything before TensorFlow)."""
    rng = random.Random(0)
    storage = LocalStorage(root)
    splits = {}
    for split, count in (("train", train), ("val", val)):
        shards = []
        for i in range(count):
            name = f"{split}-{i:05d}-of-{count:05d}.tfrecord"
            data = rng.randbytes(500 + i)
            storage.write_bytes(name, data)
            shards.append(ShardInfo(name, 5, len(data), crc32c_file(root / name)))
        splits[split] = SplitInfo(tuple(shards))
    Manifest(dataset_id="fake-" + root.name, created="", classes=(SynsetClass(0, "n0", ("a",)),
             SynsetClass(1, "n1", ("b",))), splits=splits).save(storage)
    if corrupt:
        data = bytearray((root / corrupt).read_bytes())
        data[0] ^= 0xFF
        (root / corrupt).write_bytes(bytes(data))
    return root


def test_dynamic_allocation_is_refused_before_launch(tmp_path):
    # runs first in this module, before the shared `spark` fixture exists: its own session. The
    # JVM is started first without this conf: the conf of the session that launches the JVM becomes
    # JVM system properties, which every later SparkContext in this process would inherit.
    from pyspark import SparkContext

    SparkContext._ensure_initialized()
    session = local_session("local[2]", app_name="dyn-alloc-test",
                            conf={"spark.ui.enabled": "false", "spark.dynamicAllocation.enabled": "true"})
    try:
        sc = session.sparkContext
        assert sc.getConf().get("spark.dynamicAllocation.enabled") == "true", "got a session started elsewhere"
        jobs = len(sc.statusTracker().getJobIdsForGroup())
        with pytest.raises(ConfigError) as e:
            train(session, str(make_bucket(tmp_path / "b")), 2, cache=tmp_path / "cache")
        assert "spark.dynamicAllocation.enabled" in str(e.value) and "SPARK-24942" in str(e.value)
        assert "false" in str(e.value)
        assert len(sc.statusTracker().getJobIdsForGroup()) == jobs  # nothing launched
    finally:
        session.stop()


def test_available_slots_of_local_2(spark):
    slots, how = available_slots(spark.sparkContext)
    assert slots == 2 and how.startswith("executor cores") and "spark.task.cpus=1" in how


def test_more_workers_than_slots_is_refused_before_launch(spark, tmp_path):
    sc = spark.sparkContext
    jobs = len(sc.statusTracker().getJobIdsForGroup())
    with pytest.raises(ConfigError) as e:
        train(spark, str(make_bucket(tmp_path / "b")), 3, cache=tmp_path / "cache")
    assert "--workers 3 needs 3 barrier task slots, only 2 available" in str(e.value)
    assert len(sc.statusTracker().getJobIdsForGroup()) == jobs
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("kwargs,option", [
    ({"workers": 0}, "--workers"), ({"batch_size": 0}, "--batch-size"), ({"epochs": 0}, "--epochs"),
    ({"image_size": -3}, "--image-size"), ({"width": 0.0}, "--width"), ({"width": float("nan")}, "--width"),
    ({"learning_rate": -1.0}, "--learning-rate"), ({"parallel": 0}, "--parallel"), ({"model": ""}, "--model"),
])
def test_bad_settings_name_the_option(spark, tmp_path, kwargs, option):
    args = {"workers": 2, **kwargs}
    workers = args.pop("workers")
    with pytest.raises(ConfigError, match=option):
        train(spark, str(tmp_path / "nowhere"), workers, **args)


def test_missing_manifest_and_bad_results_path(spark, tmp_path):
    with pytest.raises(ManifestError, match="does not exist"):
        train(spark, str(tmp_path / "empty"), 2)
    with pytest.raises(ConfigError, match="--results"):
        train(spark, str(make_bucket(tmp_path / "b")), 2, results=tmp_path / "no" / "such" / "r.json")
    with pytest.raises(ConfigError, match="--train-shards >= 2"):
        train(spark, str(make_bucket(tmp_path / "one", train=1)), 2)


def test_task_failure_reaches_the_driver_as_a_clear_error(spark, tmp_path):
    # rank 1's train shard is corrupted in the bucket: its barrier task fails while staging it,
    # rank 0 is waiting in the rendezvous and gets killed; the driver re-raises the task's error.
    bucket = make_bucket(tmp_path / "b", train=2, corrupt="train-00001-of-00002.tfrecord")
    with pytest.raises(StorageError) as e:
        train(spark, str(bucket), 2, cache=tmp_path / "cache", batch_size=2)
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
