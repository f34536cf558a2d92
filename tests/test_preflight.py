"""The driver's checks before a barrier launch: dynamic allocation, task slots, the
results path (spark_imagenet.training.preflight), on real local Spark."""

from __future__ import annotations

import os

import pytest

from bucket_util import make_bucket
from spark_imagenet.errors import ConfigError
from spark_imagenet.training.driver import train
from spark_imagenet.training.preflight import (
    available_slots,
    check_dataset_reachable,
    check_results_path,
    executor_wait_seconds,
    slots_from_master,
    spark_seconds,
)
from spark_imagenet.training.spark_session import local_session


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


def test_slots_from_master():
    assert slots_from_master("local", 1, 99) == 1
    assert slots_from_master("local[3]", 1, 99) == 3
    assert slots_from_master("local[4, 2]", 1, 99) == 4
    assert slots_from_master("local[*]", 1, 99) == (os.cpu_count() or 1)
    assert slots_from_master("local-cluster[2,3,1024]", 1, 99) == 6
    assert slots_from_master("local-cluster[2,3,1024]", 2, 99) == 3
    assert slots_from_master("spark://h:7077", 2, 8) == 4


def test_results_path_checks(tmp_path):
    check_results_path(None)
    check_results_path(tmp_path / "r.json")
    with pytest.raises(ConfigError, match="does not exist or is not writable"):
        check_results_path(tmp_path / "no" / "such" / "r.json")
    with pytest.raises(ConfigError, match="is a folder"):
        check_results_path(tmp_path)


def test_a_dataset_on_the_drivers_disk_needs_a_local_master_or_a_shared_filesystem():
    check_dataset_reachable("/data/shards", "local[4]", False)
    check_dataset_reachable("gs://b/shards", "spark://h:7077", False)
    check_dataset_reachable("/nfs/shards", "yarn", True)
    for master in ("spark://h:7077", "yarn", "k8s://https://h:6443"):
        with pytest.raises(ConfigError) as e:
            check_dataset_reachable("/data/shards", master, False)
        assert "/data/shards is a path on the driver's disk" in str(e.value) and master in str(e.value)
        assert "--shared-filesystem" in str(e.value) and "gs://" in str(e.value)


def test_spark_time_settings_are_read_in_seconds():
    assert spark_seconds("900s") == 900 and spark_seconds("5min") == 300 and spark_seconds("2h") == 7200
    assert spark_seconds("30000") == 30 and spark_seconds("1500ms") == 1.5 and spark_seconds("1", "s") == 1
    with pytest.raises(ConfigError, match="'soon' is not a Spark time"):
        spark_seconds("soon")


def test_the_wait_for_executors_follows_sparks_own_wait_and_is_at_least_a_minute():
    assert executor_wait_seconds({}) == 60
    assert executor_wait_seconds({"spark.scheduler.maxRegisteredResourcesWaitingTime": "900s"}) == 900
    assert executor_wait_seconds({"spark.scheduler.maxRegisteredResourcesWaitingTime": "10s"}) == 60
    with pytest.raises(ConfigError, match="spark.scheduler.maxRegisteredResourcesWaitingTime: '10 parsecs'"):
        executor_wait_seconds({"spark.scheduler.maxRegisteredResourcesWaitingTime": "10 parsecs"})
