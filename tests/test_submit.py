"""The spark-submit entry point and the submit/ scripts, run for real: spark-submit in local mode and
against a Spark standalone cluster (a master and a worker started from the installed pyspark)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from data_util import build, small_layout

REPO = Path(__file__).resolve().parents[1]
SUBMIT = REPO / "submit"
#: Bounded waits (seconds): a job here takes well under a minute; these only stop a hang.
JOB_TIMEOUT_S = 600
CLUSTER_START_S = 120


def script_env(**extra: str) -> dict:
    """The scripts' environment: this interpreter as PYTHON, the repository importable."""
    env = {**os.environ, "PYTHON": sys.executable, **extra}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


def run_script(name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SUBMIT / name), *args], capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S, env=script_env(**env), cwd=REPO)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A small sharded dataset (4 classes, 4 train and 2 val shards) on local disk."""
    base = tmp_path_factory.mktemp("submit")
    out = base / "shards"
    build(small_layout(base / "src"), out)
    return out


TRAIN = ("--workers", "2", "--epochs", "1", "--image-size", "72", "--width", "0.25", "--batch-size", "4")


def test_every_script_parses():
    scripts = sorted(SUBMIT.glob("*.sh"))
    assert {p.name for p in scripts} >= {"local.sh", "standalone.sh", "_common.sh"}
    for path in scripts:
        p = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert p.returncode == 0, (path, p.stderr)


def test_the_driver_program_path_is_a_file_of_the_installed_package():
    p = subprocess.run([sys.executable, "-m", "spark_imagenet.submit", "--path"], capture_output=True, text=True,
                       cwd=REPO, env=script_env())
    path = Path(p.stdout.strip())
    assert p.returncode == 0 and path.is_file() and path.name == "submit.py" and path.parent.name == "spark_imagenet"


def test_scripts_check_their_arguments_before_starting_spark(dataset):
    p = run_script("local.sh")
    assert p.returncode == 2 and "usage: local.sh URL [spark-imagenet train options ...]" in p.stderr
    p = run_script("local.sh", "--workers", "2")
    assert p.returncode == 2 and "usage:" in p.stderr
    p = run_script("standalone.sh", str(dataset), *TRAIN, MASTER="yarn")
    assert p.returncode == 2 and "set MASTER to the cluster's spark://HOST:PORT (got 'yarn')" in p.stderr


@pytest.mark.slow
def test_local_sh_trains_through_spark_submit(dataset, tmp_path):
    results = tmp_path / "r.json"
    p = run_script("local.sh", str(dataset), *TRAIN, "--results", str(results), MASTER="local[2]")
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(results.read_text())
    assert r["workers"] == 2 and r["config"]["master"] == "local[2]" and r["val"]["images"] == 12
    assert "[rank 1]" in p.stderr + p.stdout


@pytest.mark.slow
def test_the_jobs_master_is_refused_under_spark_submit(dataset):
    p = run_script("local.sh", str(dataset), *TRAIN, "--master", "local[2]", MASTER="local[2]")
    out = p.stdout + p.stderr  # spark-submit merges the Python driver's stderr into its stdout
    assert p.returncode == 2
    assert "under spark-submit the master is spark-submit's own option" in out
    assert "Traceback" not in out


# ---------------------------------------------------------------- a standalone cluster
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


@pytest.fixture
def standalone(tmp_path):
    """A standalone master and one worker of 2 cores on 127.0.0.1; yields the master URL."""
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path / "logs")}
    log = open(tmp_path / "cluster.log", "w")
    procs = [subprocess.Popen([spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env=env, stdout=log, stderr=log)]
    try:
        procs.append(subprocess.Popen(
            [spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2",
             "--memory", "2g", "--webui-port", str(worker_ui), "--work-dir", str(tmp_path / "work"),
             f"spark://127.0.0.1:{port}"], env=env, stdout=log, stderr=log))
        deadline = time.monotonic() + CLUSTER_START_S
        while alive_workers(ui) < 1:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                log.flush()
                pytest.fail("the standalone cluster did not start:\n" + (tmp_path / "cluster.log").read_text()[-3000:])
            time.sleep(1)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=60)
        log.close()


@pytest.mark.slow
def test_standalone_sh_trains_on_a_standalone_cluster(dataset, standalone, tmp_path):
    results = tmp_path / "r.json"
    # the dataset is on this machine's disk, which the cluster's one worker shares
    p = run_script("standalone.sh", str(dataset), *TRAIN, "--results", str(results), MASTER=standalone)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and "is a path on the driver's disk" in out and "--shared-filesystem" in out
    p = run_script("standalone.sh", str(dataset), *TRAIN, "--shared-filesystem", "--results", str(results),
                   MASTER=standalone)
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(results.read_text())
    assert r["config"]["master"] == standalone and r["workers"] == 2
    assert [w["rank"] for w in r["per_worker"]] == [0, 1] and r["val"]["images"] == 12
