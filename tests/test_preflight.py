"""The driver's checks before a barrier launch: dynamic allocation, task slots, the
results path, network encryption, train shards per worker, and that
spark.python.worker.reuse is not needed (spark_imagenet.training.driver.preflight), on real local Spark."""

from __future__ import annotations

import os

import pytest

from session_util import stop_shared_spark

from bucket_util import make_bucket
from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.driver.launch import plan_job, train
from spark_imagenet.training.driver.preflight import (
    NETWORK_ENCRYPTION_KEYS,
    available_slots,
    check_dataset_reachable,
    check_encryption,
    check_results_path,
    check_train_shards,
    executor_wait_seconds,
    read_session_facts,
    slots_from_master,
    spark_seconds,
)
from spark_imagenet.training.driver.preflight.session import CONF_KEYS
from spark_imagenet.training.driver.spark_session import local_session


def test_dynamic_allocation_is_refused_before_launch(tmp_path):
    # runs first in this module, before the shared `spark` fixture exists: its own session. The
    # JVM is started first without this conf: the conf of the session that launches the JVM becomes
    # JVM system properties, which every later SparkContext in this process would inherit.
    from pyspark import SparkContext

    stop_shared_spark()  # the session a module before this one handed on
    SparkContext._ensure_initialized()
    session = local_session("local[2]", app_name="dyn-alloc-test",
                            conf={"spark.ui.enabled": "false", "spark.dynamicAllocation.enabled": "true"})
    try:
        sc = session.sparkContext
        assert sc.getConf().get("spark.dynamicAllocation.enabled") == "true", "got a session started elsewhere"
        jobs = len(sc.statusTracker().getJobIdsForGroup())
        with pytest.raises(ConfigError) as e:
            train(session, str(make_bucket(tmp_path / "b")), TrainConfig(workers=2, cache=tmp_path / "cache"))
        assert type(e.value) is ConfigError
        assert (e.value.key, e.value.value) == ("spark.dynamicAllocation.enabled", "true")
        assert len(sc.statusTracker().getJobIdsForGroup()) == jobs  # nothing launched
    finally:
        session.stop()


def test_network_encryption_is_refused_unless_allowed(tmp_path):
    # before the shared `spark` fixture, like the test above: a session of its own with the conf set (the JVM
    # already runs, so the conf does not become JVM system properties that later sessions would inherit)
    from pyspark import SparkContext

    stop_shared_spark()  # the session a module before this one handed on
    SparkContext._ensure_initialized()
    session = local_session("local[2]", app_name="crypto-test",
                            conf={"spark.ui.enabled": "false", "spark.network.crypto.enabled": "true",
                                  "spark.authenticate": "true"})  # Spark refuses crypto without authentication
    try:
        sc = session.sparkContext
        assert sc.getConf().get("spark.network.crypto.enabled") == "true", "got a session started elsewhere"
        # the classic getter and the Connect-shaped one (RuntimeConfig.get) read the same setting
        for get in (sc.getConf().get, session.conf.get):
            with pytest.raises(ConfigError) as e:
                check_encryption(get, 2, False).raise_if_problem()
            text = str(e.value)
            assert "spark.network.crypto.enabled=true" in text and "2 workers" in text
            assert "gradients" in text and "weights" in text and "plaintext" in text
            assert "--allow-unencrypted" in text and "allow_unencrypted = true" in text
            warning = check_encryption(get, 2, True)
            assert warning.level == "warning" and warning.line.startswith("warning: ")
            assert "spark.network.crypto.enabled=true" in warning.line and "gradients" in warning.line
            assert "--allow-unencrypted" in warning.line
            assert check_encryption(get, 1, False).level == "ok"  # one worker: nothing between workers
    finally:
        session.stop()


def test_ssl_settings_are_refused_too():
    from pyspark import SparkConf

    for key in ("spark.ssl.enabled", "spark.ssl.rpc.enabled"):
        conf = SparkConf(loadDefaults=False).set(key, " TRUE ")
        with pytest.raises(ConfigError) as e:
            check_encryption(conf.get, 3, False).raise_if_problem()
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, "true")
    off = SparkConf(loadDefaults=False).set("spark.ssl.enabled", "false").set("spark.network.crypto.enabled", "false")
    assert check_encryption(off.get, 3, False).level == "ok"
    assert set(NETWORK_ENCRYPTION_KEYS) >= {"spark.network.crypto.enabled", "spark.ssl.enabled"}


def test_fewer_train_shards_than_workers_is_refused_with_the_numbers_and_the_fix(tmp_path):
    """Wording test (preflight refusals): the numbers found and both ways out."""
    with pytest.raises(ConfigError) as e:
        check_train_shards(3, 5).raise_if_problem()
    assert "3 train shard(s) but --workers is 5" in str(e.value)
    assert "--train-shards >= 5" in str(e.value) and "--workers <= 3" in str(e.value)
    assert (e.value.key, e.value.value) == ("--workers", 5)
    assert check_train_shards(5, 5).level == "ok"
    # the same rule on a real manifest, in plan_job (before Spark starts)
    with pytest.raises(ConfigError) as e:
        plan_job(str(make_bucket(tmp_path / "b", train=2)), TrainConfig(workers=3))
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("--workers", 3)
    assert "2 train shard(s)" in str(e.value)


class _RecordingConf:
    """A conf getter over a real SparkConf that remembers every key read."""

    def __init__(self, conf):
        self.conf, self.keys = conf, []

    def get(self, key, default=None):
        self.keys.append(key)
        return self.conf.get(key, default)


def test_the_checks_do_not_depend_on_python_worker_reuse(spark):
    # each task runs TensorFlow in a child process, so spark.python.worker.reuse may be true or false
    from pyspark import SparkConf

    base = _RecordingConf(spark.sparkContext.getConf())
    assert check_encryption(base.get, 2, False).level == "ok"
    assert base.keys and "spark.python.worker.reuse" not in base.keys
    facts = read_session_facts(spark)  # every setting the session's checks read
    assert "spark.python.worker.reuse" not in dict(facts.conf) and "spark.python.worker.reuse" not in CONF_KEYS
    for reuse in ("true", "false"):
        conf = SparkConf(loadDefaults=False).set("spark.python.worker.reuse", reuse)
        assert check_encryption(conf.get, 2, False).level == "ok"
        with pytest.raises(ConfigError) as e:
            check_encryption(conf.set("spark.ssl.enabled", "true").get, 2, False).raise_if_problem()
        assert e.value.key == "spark.ssl.enabled"


def test_available_slots_of_local_2(spark):
    slots, how = available_slots(spark.sparkContext)
    assert slots == 2 and how.startswith("executor cores") and "spark.task.cpus=1" in how


def test_more_workers_than_slots_is_refused_before_launch(spark, tmp_path):
    sc = spark.sparkContext
    jobs = len(sc.statusTracker().getJobIdsForGroup())
    with pytest.raises(ConfigError) as e:
        train(spark, str(make_bucket(tmp_path / "b")), TrainConfig(workers=3, cache=tmp_path / "cache"))
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("--workers", 3)
    assert "only 2 available" in str(e.value)
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
    assert check_results_path(None) is None
    assert check_results_path(tmp_path / "r.json").level == "ok"
    with pytest.raises(ConfigError, match="does not exist or is not writable") as e:
        check_results_path(tmp_path / "no" / "such" / "r.json").raise_if_problem()
    assert (e.value.key, e.value.value) == ("--results", tmp_path / "no" / "such" / "r.json")
    with pytest.raises(ConfigError, match="is a folder") as e:
        check_results_path(tmp_path).raise_if_problem()
    assert (e.value.key, e.value.value) == ("--results", tmp_path)


def test_a_dataset_on_the_drivers_disk_needs_a_local_master_or_a_shared_filesystem():
    assert check_dataset_reachable("/data/shards", "local[4]", False).level == "ok"
    assert check_dataset_reachable("gs://b/shards", "spark://h:7077", False).level == "ok"
    assert check_dataset_reachable("/nfs/shards", "yarn", True).level == "ok"
    for master in ("spark://h:7077", "yarn", "k8s://https://h:6443"):
        with pytest.raises(ConfigError) as e:
            check_dataset_reachable("/data/shards", master, False).raise_if_problem()
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("url", "/data/shards")
        assert master in str(e.value)


def test_spark_time_settings_are_read_in_seconds():
    assert spark_seconds("900s") == 900 and spark_seconds("5min") == 300 and spark_seconds("2h") == 7200
    assert spark_seconds("30000") == 30 and spark_seconds("1500ms") == 1.5 and spark_seconds("1", "s") == 1
    with pytest.raises(ConfigError, match="'soon' is not a Spark time"):
        spark_seconds("soon")


def test_the_wait_for_executors_follows_sparks_own_wait_and_is_at_least_a_minute():
    assert executor_wait_seconds({}) == 60
    assert executor_wait_seconds({"spark.scheduler.maxRegisteredResourcesWaitingTime": "900s"}) == 900
    assert executor_wait_seconds({"spark.scheduler.maxRegisteredResourcesWaitingTime": "10s"}) == 60
    with pytest.raises(ConfigError) as e:
        executor_wait_seconds({"spark.scheduler.maxRegisteredResourcesWaitingTime": "10 parsecs"})
    assert (e.value.key, e.value.value) == ("spark.scheduler.maxRegisteredResourcesWaitingTime", "10 parsecs")


def test_a_local_output_for_a_cluster_master_is_refused_unless_every_host_mounts_it():
    """Wording test (a path the executors cannot reach): the option, the path and both ways out."""
    from spark_imagenet.training.driver.preflight import check_output_reachable

    with pytest.raises(ConfigError) as e:
        check_output_reachable("/data/runs/one", "spark://m:7077", False).raise_if_problem()
    assert "--output /data/runs/one is a path on the driver's disk" in str(e.value)
    assert "--output URL, URL one of gs://BUCKET/PREFIX, s3://BUCKET/PREFIX" in str(e.value)
    assert "--shared-filesystem" in str(e.value) and (e.value.key, e.value.value) == ("--output", "/data/runs/one")
    assert check_output_reachable("/data/runs/one", "spark://m:7077", True).level == "ok"
    assert check_output_reachable("/data/runs/one", "local-cluster[2,1,1024]", False).level == "ok"  # this machine
    assert check_output_reachable("gs://b/runs/one", "yarn", False).level == "ok"
    assert check_output_reachable(None, "yarn", False) is None


def test_the_dataset_folder_as_output_or_checkpoint_dir_is_refused_before_spark(tmp_path):
    bucket = make_bucket(tmp_path / "bucket")
    for option, settings in (("--output", {"output": f"{bucket}/"}), ("--checkpoint-dir", {"checkpoint_dir": str(bucket)})):
        with pytest.raises(ConfigError) as e:
            plan_job(str(bucket), TrainConfig(workers=2, **settings))
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (option, str(bucket))
    assert not (bucket / "results.json").exists() and not (bucket / "checkpoints").exists()
    plan_job(str(bucket), TrainConfig(workers=2, output=str(bucket / "runs" / "1")))  # a folder inside it is its own
    (tmp_path / "link").symlink_to(bucket)
    for other in (f"{bucket}/../{bucket.name}", str(tmp_path / "link")):  # the same folder by another path
        with pytest.raises(ConfigError) as e:
            plan_job(str(bucket), TrainConfig(workers=2, output=other))
        assert e.value.key == "--output"


def test_min_workers_that_no_relaunch_can_use_is_said_before_spark(tmp_path, caplog):
    bucket = make_bucket(tmp_path / "bucket")
    caplog.set_level("WARNING")
    plan_job(str(bucket), TrainConfig(workers=4, min_workers=3, batch_size=16))
    assert ("--min-workers 3 has no effect: no worker count from 3 to 3 divides the global batch 64, so a relaunch "
            "after a lost worker waits for 4") in caplog.text
    caplog.clear()
    plan_job(str(bucket), TrainConfig(workers=4, min_workers=2, batch_size=16))
    assert "--min-workers" not in caplog.text


@pytest.mark.parametrize("master, workers, slots", [
    ("local[2]", 4, 2), ("local[2,3]", 4, 2), ("local[2, 3]", 3, 2), ("local", 2, 1),
    ("local[*]", (os.cpu_count() or 1) + 1, os.cpu_count() or 1), ("local[*,2]", (os.cpu_count() or 1) + 1,
                                                                   os.cpu_count() or 1),
    ("local-cluster[2,1,1024]", 3, 2)])
def test_the_master_url_alone_refuses_more_workers_than_its_slots(master, workers, slots):
    """local[N], local[N,F], local[*] (this machine's cores) and local-cluster[E,C,MB] are parsed from the
    URL, so `train --workers 4 --master 'local[2]'` is refused before a JVM starts."""
    from spark_imagenet.training.driver.preflight import check_slots_of_master_url

    with pytest.raises(ConfigError, match=rf"only {slots} available") as e:
        check_slots_of_master_url(master, workers, {}).raise_if_problem()
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("--workers", workers)
    assert check_slots_of_master_url(master, slots, {}).level == "ok"  # as many as it has: passes
    assert check_slots_of_master_url("spark://h:7077", 99, {}) is None  # a cluster's slots: counted once it runs


@pytest.mark.parametrize("master", ["local[x]", "local[2", "local[]", "local[2,]", "local-cluster[2,1]"])
def test_a_master_spark_cannot_parse_is_refused_before_spark(master):
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=1, master=master)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("master", master)


def test_train_refuses_more_workers_than_local_slots_at_once(capsys):
    import time

    from spark_imagenet.cli import main

    started = time.monotonic()
    assert main(["train", "/no/such/dataset", "--workers", "4", "--master", "local[2,3]"]) == 2
    assert time.monotonic() - started < 5  # no JVM: it starts in 5-10 s
    assert "--workers 4 needs 4 barrier task slots, only 2 available" in capsys.readouterr().err
    # the remedy counts spark.task.cpus: never the master the job already has
    assert main(["train", "/no/such/dataset", "--workers", "2", "--master", "local[2]",
                 "--conf", "spark.task.cpus=2"]) == 2
    err = capsys.readouterr().err
    assert ("only 1 available (master local[2]; from the master URL and spark.task.cpus=2: each task takes 2 of its "
            "2 core(s))") in err, err
    assert "give Spark more slots: --master local[4], or a lower spark.task.cpus" in err, err
