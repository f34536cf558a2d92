"""submit/databricks-job.json (a GPU cluster) and submit/databricks-serverless-job.json (serverless compute, Spark
Connect): Jobs API 2.1 jobs/create bodies that the databricks-sdk classes read in full.

No Databricks workspace is reachable here, so the job is checked against the SDK's own model of the API:
``JobSettings.from_dict`` silently drops keys it does not know (a misspelt ``spark_conf`` or
``python_wheel_task`` would vanish), so a round trip back through ``as_dict()`` that gives the file's JSON
unchanged shows every field is one the API knows, at the place the API expects it. (The installed
databricks-sdk has no ``CreateJob`` class: ``JobsAPI.create`` takes the fields of ``JobSettings`` as keyword
arguments, plus ``access_control_list``, which this job does not set.)
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

jobs = pytest.importorskip("databricks.sdk.service.jobs", reason="databricks-sdk is not installed (the test extra)")

JOB_FILE = Path(__file__).resolve().parent.parent / "submit" / "databricks-job.json"
SERVERLESS_FILE = JOB_FILE.with_name("databricks-serverless-job.json")


@pytest.fixture(scope="module")
def job() -> dict:
    return json.loads(JOB_FILE.read_text())


@pytest.fixture(scope="module")
def task(job) -> dict:
    (task,) = job["tasks"]
    return task


def _differences(expected, actual, path="$"):
    """Every place where two JSON values differ (a key missing on either side, a changed value)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for key in sorted(set(expected) | set(actual)):
            if key not in actual:
                out.append(f"{path}.{key}: dropped")
            elif key not in expected:
                out.append(f"{path}.{key}: added ({actual[key]!r})")
            else:
                out += _differences(expected[key], actual[key], f"{path}.{key}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: {len(expected)} items became {len(actual)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in _differences(e, a, f"{path}[{i}]")]
    if type(expected) is not type(actual) or expected != actual:
        return [f"{path}: {expected!r} became {actual!r}"]
    return []


def test_job_round_trips_through_the_sdk_without_losing_a_field(job):
    settings = jobs.JobSettings.from_dict(job)
    back = settings.as_dict()
    assert _differences(job, back) == []
    assert back == job
    # typed all the way down, not kept as raw dicts
    (task,) = settings.tasks
    assert isinstance(task, jobs.Task)
    assert isinstance(task.python_wheel_task, jobs.PythonWheelTask)
    assert type(task.new_cluster).__name__ == "ClusterSpec"
    assert task.libraries[0].whl == job["tasks"][0]["libraries"][0]["whl"]


def test_job_is_a_jobs_create_body(job):
    accepted = set(inspect.signature(jobs.JobsAPI.create).parameters) - {"self"}
    assert set(job) <= accepted, set(job) - accepted


def test_wheel_task_runs_the_cli_entry_point(task):
    wheel_task = task["python_wheel_task"]
    assert wheel_task["package_name"] == "spark_imagenet"
    assert wheel_task["entry_point"] == "spark-imagenet"  # [project.scripts] spark-imagenet = spark_imagenet.cli:main
    (library,) = task["libraries"]
    assert library["whl"].endswith("/spark_imagenet-0.1.0-py3-none-any.whl")
    assert "spark_python_task" not in task


def test_parameters_are_a_valid_train_command(task):
    from spark_imagenet.cli import _resolve_job, build_parser
    from spark_imagenet.training.job.config import TrainConfig

    args = build_parser().parse_args(task["python_wheel_task"]["parameters"])
    assert args.command == "train"
    config, url = _resolve_job(args, {})
    assert isinstance(config, TrainConfig)
    assert url == "gs://my-bucket/imagenet"  # a bucket every node reads, not the driver's disk
    assert config.workers == task["new_cluster"]["num_workers"]  # one barrier task per worker node
    assert config.epochs == 90
    assert config.results == "/Volumes/main/default/spark_imagenet/results.json"
    assert config.master is None  # the cluster's own session decides


def test_cluster_is_set_up_for_barrier_training_on_gpus(task):
    cluster = task["new_cluster"]
    assert "-gpu-ml-" in cluster["spark_version"]
    # the wheel depends on pyspark>=4: a runtime with Spark 4 (Databricks Runtime 17.x), never an older one
    assert int(cluster["spark_version"].split(".")[0]) >= 17
    conf = cluster["spark_conf"]
    assert all(isinstance(v, str) for v in conf.values())  # the API takes strings only
    assert conf["spark.dynamicAllocation.enabled"] == "false"  # barrier stages refuse dynamic allocation
    assert conf["spark.task.resource.gpu.amount"] == conf["spark.executor.resource.gpu.amount"] == "1"
    assert conf["spark.task.cpus"] == "16"  # all of a g5.4xlarge's vCPUs: one task per executor
    assert conf["spark.barrier.sync.timeout"].endswith("s")
    # Shared access mode blocks the RDD API that barrier stages need.
    assert cluster["data_security_mode"] == "SINGLE_USER"


# ------------------------------------------------------------ serverless compute (Spark Connect)
@pytest.fixture(scope="module")
def serverless() -> dict:
    return json.loads(SERVERLESS_FILE.read_text())


def test_serverless_job_round_trips_through_the_sdk_without_losing_a_field(serverless):
    settings = jobs.JobSettings.from_dict(serverless)
    back = settings.as_dict()
    assert _differences(serverless, back) == []
    assert back == serverless
    (task,) = settings.tasks
    assert isinstance(task.python_wheel_task, jobs.PythonWheelTask)
    (environment,) = settings.environments
    assert isinstance(environment, jobs.JobEnvironment)
    assert type(environment.spec).__name__ == "Environment"


def test_serverless_job_is_a_jobs_create_body(serverless):
    accepted = set(inspect.signature(jobs.JobsAPI.create).parameters) - {"self"}
    assert set(serverless) <= accepted, set(serverless) - accepted


def test_serverless_job_has_no_cluster_and_installs_the_wheel_in_its_environment(serverless):
    (task,) = serverless["tasks"]
    # serverless: no cluster of any kind; the task names an environment of the job instead
    assert not {"new_cluster", "existing_cluster_id", "job_cluster_key", "libraries"} & set(task)
    assert "job_clusters" not in serverless
    (environment,) = serverless["environments"]
    assert task["environment_key"] == environment["environment_key"]
    (wheel,) = environment["spec"]["dependencies"]
    assert wheel.endswith("/spark_imagenet-0.1.0-py3-none-any.whl")
    assert environment["spec"]["environment_version"].isdigit()
    wheel_task = task["python_wheel_task"]
    assert (wheel_task["package_name"], wheel_task["entry_point"]) == ("spark_imagenet", "spark-imagenet")


def test_serverless_parameters_are_a_valid_train_command_without_a_master(serverless):
    from spark_imagenet.cli import _resolve_job, build_parser

    (task,) = serverless["tasks"]
    args = build_parser().parse_args(task["python_wheel_task"]["parameters"])
    assert args.command == "train"
    config, url = _resolve_job(args, {})
    assert url.startswith("gs://")  # the serverless executors read a bucket, never the driver's disk
    assert config.workers == 2
    assert config.master is None  # the job's own (Spark Connect) session decides
    assert config.results.startswith("/Volumes/")
