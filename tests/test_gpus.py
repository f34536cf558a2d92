"""GPUs per worker and the choice of strategy: the driver's check of Spark's GPU settings
(spark_imagenet.training.driver.preflight.gpus), the task side's GPU mapping through a real local-cluster with a
fake discovery script, and the one-worker strategies (mirrored, default) trained end to end on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from data_util import build, small_layout
from spark_imagenet.errors import ConfigError
from spark_imagenet.training.task.environment import gpu_sharing_warning, task_gpus
from spark_imagenet.training.driver.preflight import check_gpu_conf
from spark_imagenet.training.job.gpus import host_has_gpus

REPO = Path(__file__).resolve().parents[1]
SMALL = {"batch_size": 4, "image_size": 72, "width": 0.25, "learning_rate": 0.01, "epochs": 1}

COMPLETE = {"spark.task.resource.gpu.amount": "2", "spark.executor.resource.gpu.amount": "4",
            "spark.executor.resource.gpu.discoveryScript": "/opt/spark-imagenet/conf/gpu-discovery.sh"}


def conf(**settings):
    """A ``get`` over a dict (keys with dots given as a dict literal through ``**{...}``)."""
    return lambda key: settings.get(key)


# ------------------------------------------------------ the driver's check
def test_complete_gpu_settings_pass():
    assert check_gpu_conf(conf(**COMPLETE), 2, 3, "yarn").level == "ok"
    assert check_gpu_conf(conf(**COMPLETE), 2, 3, None).level == "ok"
    assert check_gpu_conf(conf(), 0, 3, "yarn").level == "ok"  # no GPUs asked for, none configured


@pytest.mark.parametrize("key, expected", [
    ("spark.task.resource.gpu.amount", "spark.task.resource.gpu.amount=2 (now unset)"),
    ("spark.executor.resource.gpu.amount", "spark.executor.resource.gpu.amount=2 or more (now unset"),
    ("spark.executor.resource.gpu.discoveryScript",
     "spark.executor.resource.gpu.discoveryScript=/path/to/conf/gpu-discovery.sh (now unset)"),
])
def test_each_missing_setting_is_named_with_its_number(key, expected):
    settings = {k: v for k, v in COMPLETE.items() if k != key}
    with pytest.raises(ConfigError) as e:
        check_gpu_conf(conf(**settings), 2, 3, "k8s://https://api:6443").raise_if_problem()
    message = str(e.value)
    assert expected in message
    assert "--gpus-per-worker 2 with 3 worker(s) needs 6 GPU(s) in all, 2 per task" in message
    others = [k for k in COMPLETE if k != key]
    assert not any(f"--conf {k}=" in message for k in others), message  # only what is missing


def test_too_small_amounts_are_reported_with_their_values():
    with pytest.raises(ConfigError) as e:
        check_gpu_conf(conf(**{**COMPLETE, "spark.task.resource.gpu.amount": "1",
                               "spark.executor.resource.gpu.amount": "1"}), 2, 1, "yarn").raise_if_problem()
    assert "spark.task.resource.gpu.amount=2 (now is 1)" in str(e.value)
    assert "spark.executor.resource.gpu.amount=2 or more (now is 1;" in str(e.value)
    with pytest.raises(ConfigError) as e:
        check_gpu_conf(conf(**{**COMPLETE, "spark.task.resource.gpu.amount": "two"}), 2, 1,
                       "yarn").raise_if_problem()
    assert (e.value.key, e.value.value) == ("spark.task.resource.gpu.amount", "two")


def test_standalone_and_local_cluster_name_the_worker_resources():
    amounts = {"spark.task.resource.gpu.amount": "1", "spark.executor.resource.gpu.amount": "2"}
    # standalone: the workers discover the GPUs (no executor script needed), the driver cannot check them
    assert check_gpu_conf(conf(**amounts), 1, 2, "spark://m:7077").level == "ok"
    with pytest.raises(ConfigError) as e:
        check_gpu_conf(conf(), 1, 2, "spark://m:7077").raise_if_problem()
    assert "SPARK_WORKER_OPTS=\"-Dspark.worker.resource.gpu.amount=" in str(e.value)
    assert "discoveryScript (now unset)" not in str(e.value)
    # local-cluster: the worker resources are in the application's conf, so they are checked
    with pytest.raises(ConfigError) as e:
        check_gpu_conf(conf(**amounts), 1, 2, "local-cluster[1,2,1024]").raise_if_problem()
    assert "\n  --conf spark.worker.resource.gpu.amount=2 (now unset)" in str(e.value)
    assert "\n  --conf spark.worker.resource.gpu.discoveryScript=" in str(e.value)
    worker = {"spark.worker.resource.gpu.amount": "2", "spark.worker.resource.gpu.discoveryScript": "/x.sh"}
    assert check_gpu_conf(conf(**amounts, **worker), 1, 2, "local-cluster[1,2,1024]").level == "ok"


def test_local_cluster_amounts_count_the_workers_per_executor():
    """Spark runs executor amount // K tasks on an executor: 2 workers on 1 executor need 2 GPUs there."""
    one_each = {"spark.task.resource.gpu.amount": "1", "spark.executor.resource.gpu.amount": "1",
                "spark.worker.resource.gpu.amount": "1", "spark.worker.resource.gpu.discoveryScript": "/x.sh"}
    with pytest.raises(ConfigError) as e:
        check_gpu_conf(conf(**one_each), 1, 2, "local-cluster[1,2,1024]").raise_if_problem()
    message = str(e.value)
    assert "--conf spark.executor.resource.gpu.amount=2 (now is 1): 2 worker(s) on 1 executor(s)" in message
    assert "--conf spark.worker.resource.gpu.amount=2 (now is 1)" in message
    assert check_gpu_conf(conf(**one_each), 1, 2, "local-cluster[2,1,1024]").level == "ok"  # one worker per executor


def test_local_mode_cannot_hand_out_gpus():
    with pytest.raises(ConfigError, match=r"local mode \(local\[2\]\) does not hand GPUs to tasks.*"
                                          r"local-cluster\[1,2,2048\].*spark.worker.resource.gpu.amount=4"):
        check_gpu_conf(conf(**COMPLETE), 2, 2, "local[2]").raise_if_problem()


def test_under_connect_the_settings_are_named_as_the_servers():
    with pytest.raises(ConfigError) as e:
        check_gpu_conf(conf(), 1, 2, "yarn", server="sc://spark.example:15002").raise_if_problem()
    message = str(e.value)
    assert "the Spark Connect server's (sc://spark.example:15002), not this client's" in message
    assert "\n  spark.task.resource.gpu.amount 1 (now unset)" in message and "--conf" not in message
    with pytest.raises(ConfigError) as e:
        check_gpu_conf(conf(), 1, 2, "local[4]", server="sc://127.0.0.1:15002").raise_if_problem()
    assert "the Spark Connect server sc://127.0.0.1:15002 runs Spark's local mode (local[4])" in str(e.value)
    assert "start the server with --master 'local-cluster[1,2,2048]'" in str(e.value)


def test_gpus_configured_but_not_asked_for_is_a_warning():
    warning = check_gpu_conf(conf(**COMPLETE), 0, 2, "yarn")
    assert warning.level == "warning" and warning.line.startswith("warning: spark.task.resource.gpu.amount=2")
    assert "--gpus-per-worker 2" in warning.message


# --------------------------------------------------------- the task side
def test_task_gpus_needs_as_many_as_asked():
    assert task_gpus(["0", "1"], 2) == ["0", "1"]
    assert task_gpus(["3"], 0) == ["3"]  # given but not asked for: used
    assert task_gpus(None, 0) is None and task_gpus([], 0) is None
    with pytest.raises(ConfigError, match=r"^--gpus-per-worker 2 but Spark gave this task 1 GPU\(s\) "
                                          r"\['0'\]; set spark.task.resource.gpu.amount=2"):
        task_gpus(["0"], 2)
    with pytest.raises(ConfigError, match="gave this task 0 GPU") as e:
        task_gpus(None, 1)
    assert (e.value.key, e.value.value) == ("--gpus-per-worker", 1)


def test_gpu_sharing_warning_and_probe(tmp_path):
    assert not host_has_gpus(str(tmp_path)) or os.path.exists("/dev/nvidia0") or bool(
        __import__("shutil").which("nvidia-smi"))
    (tmp_path / "nvidia0").write_text("")
    assert host_has_gpus(str(tmp_path))
    assert "all 2 workers on it see every GPU" in gpu_sharing_warning(None, 2, True)
    assert gpu_sharing_warning(["0"], 2, True) is None  # each has its own
    assert gpu_sharing_warning(None, 1, True) is None  # alone on the host
    assert gpu_sharing_warning(None, 2, False) is None  # no GPUs


# ------------------------------------------ the mapping on a real cluster
CLUSTER_JOB = textwrap.dedent("""
    import json, os, sys
    import pyspark
    from pyspark import BarrierTaskContext
    from pyspark.sql import SparkSession

    os.environ["SPARK_HOME"] = os.path.dirname(pyspark.__file__)  # local-cluster starts workers from it
    os.environ["PYSPARK_PYTHON"] = sys.executable
    script = sys.argv[1]
    spark = (SparkSession.builder.master("local-cluster[1,2,1024]").appName("gpu-mapping")
             .config("spark.ui.enabled", "false")
             .config("spark.worker.resource.gpu.amount", "2")
             .config("spark.worker.resource.gpu.discoveryScript", script)
             .config("spark.executor.resource.gpu.amount", "2")
             .config("spark.task.resource.gpu.amount", "1")
             .config("spark.executorEnv.CUDA_VISIBLE_DEVICES", "5,7")
             .getOrCreate())
    sc = spark.sparkContext

    def task(_):
        from spark_imagenet.errors import ConfigError
        from spark_imagenet.training.task.environment import cuda_visible_devices, task_gpus

        ctx = BarrierTaskContext.get()
        addresses = list(ctx.resources()["gpu"].addresses)
        try:
            task_gpus(addresses, 2)
            too_few = None
        except ConfigError as e:
            too_few = str(e)
        gpus = task_gpus(addresses, 1)
        yield json.dumps({"rank": ctx.partitionId(), "addresses": addresses, "too_few": too_few,
                          "visible": cuda_visible_devices(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))})

    from spark_imagenet.training.driver.preflight import check_gpu_conf

    out = {"check": check_gpu_conf(lambda k: sc.getConf().get(k), 1, 2, sc.master).level,
           "tasks": [json.loads(r) for r in sc.parallelize(range(2), 2).barrier().mapPartitions(task).collect()]}
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
""")


@pytest.mark.slow
def test_two_barrier_tasks_on_one_host_get_different_gpus(tmp_path):
    """local-cluster (one worker, 2 cores) with a fake discovery script reporting GPUs 0 and 1; the executor's
    CUDA_VISIBLE_DEVICES=5,7, so Spark's addresses index into it."""
    script = tmp_path / "fake-gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    job = tmp_path / "job.py"
    job.write_text(CLUSTER_JOB)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(job), str(script)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=240)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["check"] == "ok"  # the driver's check accepts these settings
    tasks = sorted(out["tasks"], key=lambda t: t["rank"])
    assert sorted(a for t in tasks for a in t["addresses"]) == ["0", "1"]  # one GPU each, different
    assert sorted(t["visible"] for t in tasks) == ["5", "7"]  # mapped through the executor's list
    for t in tasks:
        assert "set spark.task.resource.gpu.amount=2" in t["too_few"]


# ------------------------------------------- the strategies end to end
@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    root = tmp_path_factory.mktemp("strategies")
    build(small_layout(root / "kaggle"), root / "bucket", train_shards=2, val_shards=1)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("strategy, cross_device_ops, all_reduce", [
    ("mirrored", "reduction-to-one", "ReductionToOneDevice"),
    ("default", "auto", "none (one device)"),
])
def test_one_worker_strategies_train_on_cpu(log_lines, spark, bucket, strategy, cross_device_ops, all_reduce):
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.job.config import TrainConfig

    lines = log_lines
    lines.clear()  # the lines from here on
    out = train(spark, str(bucket / "bucket"), TrainConfig(workers=1, strategy=strategy,
                                                           cross_device_ops=cross_device_ops, cache=bucket / "cache",
                                                           **SMALL))
    assert out.workers == 1 and len(out.per_worker) == 1
    assert out.val.images == 12 and 0 <= out.val.top1 <= out.val.top5 <= 1
    w = out.per_worker[0]
    assert w.steps == 24 // SMALL["batch_size"] and out.train.loss > 0
    # which strategy ran is in the worker's record (strategy, all_reduce, devices: tests/test_worker.py) and on
    # its "[rank 0] strategy: ..." line; results.combine does not carry those keys yet


@pytest.mark.slow
def test_multiworker_ring_all_reduce_trains_two_workers(spark, bucket):
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.job.config import TrainConfig

    out = train(spark, str(bucket / "bucket"), TrainConfig(workers=2, strategy="multiworker", cross_device_ops="ring",
                                                           cache=bucket / "cache", **SMALL))
    assert [w.rank for w in out.per_worker] == [0, 1]
    assert out.val.images == 12
