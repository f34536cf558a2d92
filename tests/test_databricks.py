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
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

jobs = pytest.importorskip("databricks.sdk.service.jobs", reason="databricks-sdk is not installed (the test extra)")

REPO = Path(__file__).resolve().parent.parent
JOB_FILE = REPO / "submit" / "databricks-job.json"
SERVERLESS_FILE = JOB_FILE.with_name("databricks-serverless-job.json")

#: The Spark and Python of each Databricks Runtime major a job file may name (Databricks' release notes: 18 LTS is
#: Apache Spark 4.1.0 on Python 3.12).
RUNTIMES = {"18": ("4.1", "3.12")}
#: The Python of each serverless environment version (version 4: Python 3.12, Databricks Connect 17).
SERVERLESS_PYTHON = {"4": "3.12"}


def _project() -> dict:
    """``[project]`` of pyproject.toml: what the wheel declares."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _requirement(project: dict, name: str, extra: str | None = None) -> Requirement:
    """The wheel's requirement on ``name``: in ``[project] dependencies``, or in the optional ``extra``."""
    listed = project["optional-dependencies"][extra] if extra else project["dependencies"]
    (found,) = [r for r in map(Requirement, listed) if r.name == name]
    return found


def test_the_wheel_requires_no_pyspark_and_its_extras_bring_one_range():
    """pyspark is no requirement of the wheel (a Spark platform brings its own, often where pip does not see it),
    nor is py4j (pyspark's own); the extras that bring pyspark name one range."""
    project = _project()
    assert not {"pyspark", "py4j"} & {Requirement(r).name for r in project["dependencies"]}
    ranges = {extra: str(_requirement(project, "pyspark", extra).specifier) for extra in ("spark", "connect", "test")}
    assert len(set(ranges.values())) == 1, ranges
    assert _requirement(project, "pyspark", "connect").extras == {"connect"}


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
    assert config.scaling.workers == task["new_cluster"]["num_workers"]  # one barrier task per worker node
    assert config.recipe.epochs == 90
    assert config.run.results == "/Volumes/main/default/spark_imagenet/results.json"
    assert config.scaling.master is None  # the cluster's own session decides


def test_cluster_names_an_lts_runtime_whose_spark_and_python_our_ranges_accept(job, task):
    key = task["new_cluster"]["spark_version"]
    # Databricks' key of a major's LTS ML runtime on GPUs (18 LTS: "18.x-gpu-ml-scala2.13"; a feature release is
    # "MAJOR.MINOR.x-...")
    found = re.fullmatch(r"(\d+)\.x-gpu-ml-scala2\.13", key)
    assert found, key
    spark, python = RUNTIMES[found.group(1)]
    project = _project()
    assert SpecifierSet(project["requires-python"]).contains(f"{python}.0"), (python, project["requires-python"])
    assert _requirement(project, "pyspark", "spark").specifier.contains(f"{spark}.0"), spark
    assert f"Databricks Runtime {found.group(1)} LTS ML, GPU ({key}: Spark {spark}, Python {python})" in (
        job["description"])


def test_serverless_environment_has_a_python_our_range_accepts(serverless):
    (environment,) = serverless["environments"]
    version = environment["spec"]["environment_version"]
    python = SERVERLESS_PYTHON[version]
    assert SpecifierSet(_project()["requires-python"]).contains(f"{python}.0")
    assert f"serverless environment version {version} (Python {python})" in serverless["description"]


def test_cluster_is_set_up_for_barrier_training_on_gpus(task):
    cluster = task["new_cluster"]
    assert "-gpu-ml-" in cluster["spark_version"]
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
    assert config.scaling.workers == 2
    assert config.scaling.master is None  # the job's own (Spark Connect) session decides
    assert config.run.results.startswith("/Volumes/")


# ------------------------------------------------------------ installing the wheel on the runtime
#: What Databricks Runtime 18 LTS ML brings that the wheel also requires, as pip sees it (name -> version). pyspark is
#: the runtime's Spark, 4.1.0; py4j the version pyspark 4.1 pins. numpy, pandas and pyarrow: Runtime 18's own list
#: was not reachable here, so these are 17.3 LTS's (its release notes' Python libraries, GPU ML and standard alike),
#: the closest LTS, assumed unchanged; replace them with 18's when they are at hand.
RUNTIME_18_PINS = {"pyspark": "4.1.0", "py4j": "0.10.9.9", "numpy": "2.1.3", "pandas": "2.2.3", "pyarrow": "19.0.1"}
#: What a runtime brings that pip cannot see: pyspark and py4j as files on the interpreter's path, not distributions
#: (reported for Runtime 12.2 LTS: lance-format/lance#730, databricks-industry-solutions/auto-data-linkage#95).
INVISIBLE_TO_PIP = ("pyspark", "py4j")


def _python_312() -> str | None:
    """A Python 3.12 interpreter (Runtime 18's Python): ``python3.12`` on PATH, or pyenv's 3.12; None when there
    is none."""
    import shutil
    import subprocess

    found = shutil.which("python3.12")
    pyenv = shutil.which("pyenv")
    if pyenv:  # a pyenv shim runs only the versions selected: ask pyenv for an installed 3.12 itself
        versions = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True).stdout.split()
        version = next((v for v in versions if v.startswith("3.12")), None)
        prefix = version and subprocess.run([pyenv, "prefix", version], capture_output=True, text=True).stdout.strip()
        found = f"{prefix}/bin/python3.12" if prefix else None
    return found if found and Path(found).exists() else None


def _runtime_env(folder: Path, python: str, pins: dict[str, str]) -> Path:
    """A bare Python 3.12 virtualenv (no pip) in ``folder`` holding one stub distribution per pin (a
    ``NAME-VERSION.dist-info`` with METADATA only: what pip reads of an installed package); returns its python."""
    import subprocess

    subprocess.run([python, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    (site,) = folder.glob("lib/python3.*/site-packages")
    for name, version in pins.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
    return folder / "bin" / "python"


@pytest.mark.slow
def test_installing_the_wheel_on_runtime_18_keeps_its_spark_and_data_libraries(tmp_path):
    """pip's resolver plan (``pip install --dry-run --report``) for the wheel's requirements, in an environment that
    holds what Runtime 18 LTS ML pins as pip would see it where the runtime's pyspark and py4j are no distributions
    (:data:`INVISIBLE_TO_PIP`, the case that matters): the plan installs no pyspark and no py4j at all, and keeps
    numpy, pandas and pyarrow as they are (the wheel's ranges accept them), so installing the wheel neither puts a
    second Spark beside the runtime's nor replaces its data libraries.

    One plan covers a runtime whose pyspark pip does see as well: a plan that installs no pyspark where none is
    visible has no requirement on pyspark anywhere in it, so it leaves a visible pyspark 4.1.0 as it is too (one
    pip run, about 25 s, instead of two).

    The requirements are read from pyproject.toml's ``[project] dependencies``, which is what the wheel's METADATA
    declares (no build needed). Needs Python 3.12 and PyPI (the plan reads the candidates' metadata)."""
    import subprocess
    import sys

    python = _python_312()
    if python is None:
        pytest.skip("no Python 3.12 here (Databricks Runtime 18's Python): install it, e.g. `pyenv install 3.12`")
    visible = {name: version for name, version in RUNTIME_18_PINS.items() if name not in INVISIBLE_TO_PIP}
    runtime = _runtime_env(tmp_path / "runtime", python, visible)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(_project()["dependencies"]) + "\n")
    report = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(runtime), "install", "--dry-run", "--quiet",
                        "--disable-pip-version-check", "--report", str(report), "-r", str(requirements)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"pip could not plan the install:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    planned = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    added = {name: planned[name] for name in INVISIBLE_TO_PIP if name in planned}
    assert added == {}, f"installing the wheel would install a second Spark beside the runtime's: {added}"
    replaced = {name: f"{visible[name]} -> {planned[name]}" for name in visible if name in planned}
    assert replaced == {}, f"installing the wheel would replace the runtime's own packages: {replaced}"
    assert planned["tensorflow"].startswith("2.21.") and planned["tf-keras"].startswith("2.21.")  # it brings its own
