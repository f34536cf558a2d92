"""The spark-submit entry point and the submit/ scripts, run for real: spark-submit in local mode and
against a Spark standalone cluster (a master and a worker started from the installed pyspark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_util import NET
from data_util import build, small_layout

REPO = Path(__file__).resolve().parents[1]
SUBMIT = REPO / "submit"
#: Bounded waits (seconds): a job here takes well under a minute; these only stop a hang.
JOB_TIMEOUT_S = 600


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
    """With spark.python.worker.reuse=false (reuse on, Spark's default, is what test_train_e2e runs): TensorFlow
    lives in a child process of each task, so neither is required."""
    results = tmp_path / "r.json"
    p = run_script("local.sh", str(dataset), *TRAIN, "--results", str(results), MASTER="local[2]",
                   SPARK_SUBMIT_OPTS_EXTRA="--conf spark.python.worker.reuse=false")
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(results.read_text())
    assert r["workers"] == 2 and r["config"]["master"] == "local[2]" and r["val"]["images"] == 12
    assert "[rank 1]" in p.stderr + p.stdout
    noise = [line for line in (p.stdout + p.stderr).splitlines()
             if " INFO " in line or "log4j" in line.lower() or "incubator" in line]
    assert not noise, noise  # the quiet log4j2 configuration, as spark-imagenet train


def test_the_scripts_refuse_the_jobs_master_before_spark_submit(dataset):
    p = run_script("local.sh", str(dataset), *TRAIN, "--master", "local[2]", MASTER="local[2]")
    assert p.returncode == 2 and p.stdout == ""  # spark-submit never started
    assert "--master local[2] (or master in the job file): the script submits to local[2]" in p.stderr
    assert "Traceback" not in p.stderr


def test_the_scripts_refuse_a_dataset_on_this_disk_for_a_cluster_before_spark_submit(dataset):
    p = run_script("standalone.sh", str(dataset), *TRAIN, MASTER="spark://127.0.0.1:1")
    assert p.returncode == 2 and p.stdout == ""
    assert "is a path on the driver's disk" in p.stderr and "--shared-filesystem" in p.stderr


def test_local_sh_checks_the_dataset_and_the_slots_before_spark_submit(tmp_path, dataset):
    p = run_script("local.sh", str(tmp_path / "nothing"), *TRAIN, MASTER="local[2]")
    assert p.returncode == 2 and p.stdout == ""  # spark-submit never started
    assert f"the dataset folder {tmp_path / 'nothing'} does not exist" in p.stderr and "Traceback" not in p.stderr
    p = run_script("local.sh", str(dataset), *TRAIN, MASTER="local[1]")
    assert p.returncode == 2 and p.stdout == ""
    assert "--workers 2 needs 2 barrier task slots, only 1 available (master local[1]" in p.stderr


@pytest.mark.slow
def test_local_sh_is_as_quiet_as_the_command_line(dataset):
    """spark-submit's driver JVM gets the quiet log4j2 configuration: a job the driver program refuses (more
    workers than train shards, found once Python runs inside spark-submit) prints its error, not Spark's
    start-up INFO lines."""
    p = run_script("local.sh", str(dataset), *TRAIN[2:], "--workers", "5", MASTER="local[5]")
    out = (p.stdout + p.stderr).splitlines()
    assert p.returncode == 2, "\n".join(out)
    assert any("every worker needs at least one train shard" in line for line in out), out
    noise = [line for line in out if " INFO " in line or "log4j" in line.lower() or " WARN " in line
             or "incubator" in line]
    assert not noise, noise
    quiet = subprocess.run([sys.executable, "-m", "spark_imagenet.submit", "--quiet-java-options"],
                           capture_output=True, text=True, cwd=REPO, env=script_env())
    assert quiet.returncode == 0 and quiet.stdout.startswith("-Dlog4j2.configurationFile=file:")
    assert quiet.stdout.split()[0].endswith("/log4j2-quiet.properties")


@pytest.mark.slow
def test_the_jobs_master_is_refused_under_spark_submit(dataset):
    # spark-submit run by hand (not through a script): the driver program refuses it
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    driver = REPO / "spark_imagenet" / "submit.py"
    p = subprocess.run([str(submit), "--master", "local[2]", str(driver), str(dataset), *TRAIN, "--master", "local[2]"],
                       capture_output=True, text=True, timeout=JOB_TIMEOUT_S, env=script_env(), cwd=REPO)
    out = p.stdout + p.stderr  # spark-submit merges the Python driver's stderr into its stdout
    assert p.returncode == 2
    assert "under spark-submit the master is spark-submit's own option" in out
    assert "Traceback" not in out


def test_every_script_is_executable_in_the_repository():
    p = subprocess.run(["git", "ls-files", "-s", "submit"], capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0 or not p.stdout:
        pytest.skip("not a git checkout: no file modes to check")
    modes = {line.split("\t")[1]: line.split()[0] for line in p.stdout.splitlines()}
    scripts = {path: mode for path, mode in modes.items() if path.endswith(".sh") and not path.endswith("/_common.sh")}
    assert scripts and all(mode == "100755" for mode in scripts.values()), scripts


# ---------------------------------------------------- a standalone cluster of two "hosts"
def test_hosts_left_by_a_killed_run_are_removed_before_a_cluster_starts():
    """A run killed before its clean-up leaves a bridge (holding the driver's address) and namespaces; the next
    cluster's start removes them, and leaves the hosts of a run still alive. The bridges made here hold no
    address, so a cluster of this session that is up meanwhile is not disturbed."""
    import cluster_util

    why = cluster_util.can_make_namespaces()
    if why:
        pytest.skip(why)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    alive = {int(p) % 10000 for p in os.listdir("/proc") if p.isdigit()}
    dead = str(next(t for t in range(9999, 0, -1) if t not in alive and f"sib{t}:" not in links))
    runner = subprocess.Popen(["sleep", "60"])  # a run still alive, with a tag no cluster of ours uses
    live = str(runner.pid % 10000)
    try:
        assert f"sib{live}:" not in links and live != str(os.getpid() % 10000)
        for tag in (dead, live):
            subprocess.run(["ip", "link", "add", f"sib{tag}", "type", "bridge"], check=True)
        subprocess.run(["ip", "netns", "add", f"si{dead}w1"], check=True)
        assert cluster_util.remove_stale_hosts() == [dead]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f"sib{dead}:" not in links and f"sib{live}:" in links
        assert f"si{dead}w1" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        runner.kill()
        runner.wait()
        cluster_util.remove_hosts(dead, 2)
        subprocess.run(["ip", "link", "delete", f"sib{live}"], capture_output=True)


@pytest.mark.slow
def test_standalone_sh_trains_across_two_hosts(dataset, two_hosts, tmp_path):
    """A dataset on the driver's disk is refused without --shared-filesystem; with it, one barrier task per worker
    "host", TensorFlow's gRPC between the two namespaces, results on the driver."""
    master, addresses, _folder = two_hosts
    results = tmp_path / "r.json"
    # the dataset is on this machine's disk, which the cluster's "hosts" share
    p = run_script("standalone.sh", str(dataset), *TRAIN, "--results", str(results), MASTER=master,
                   SPARK_LOCAL_IP=f"{NET}.1")
    out = p.stdout + p.stderr
    assert p.returncode == 2 and "is a path on the driver's disk" in out and "--shared-filesystem" in out
    p = run_script("standalone.sh", str(dataset), *TRAIN, "--shared-filesystem", "--results", str(results),
                   MASTER=master, SPARK_LOCAL_IP=f"{NET}.1")
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    r = json.loads(results.read_text())
    assert sorted(w["host"] for w in r["per_worker"]) == sorted(addresses)
    assert r["config"]["master"] == master and r["val"]["images"] == 12
    # the tasks' lines reach the driver's stdout through the log channel, from both hosts
    hosts = {w["rank"]: w["host"] for w in r["per_worker"]}
    assert f"[rank 0 on {hosts[0]}] Epoch 1/1: " in p.stdout, p.stdout[-3000:]
    assert f"[rank 1 on {hosts[1]}] {hosts[1]}: " in p.stdout, p.stdout[-3000:]
