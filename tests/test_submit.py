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


def test_the_scripts_refuse_the_jobs_master_before_spark_submit(dataset):
    p = run_script("local.sh", str(dataset), *TRAIN, "--master", "local[2]", MASTER="local[2]")
    assert p.returncode == 2 and p.stdout == ""  # spark-submit never started
    assert "--master local[2] (or master in the job file): the script submits to local[2]" in p.stderr
    assert "Traceback" not in p.stderr


def test_the_scripts_refuse_a_dataset_on_this_disk_for_a_cluster_before_spark_submit(dataset):
    p = run_script("standalone.sh", str(dataset), *TRAIN, MASTER="spark://127.0.0.1:1")
    assert p.returncode == 2 and p.stdout == ""
    assert "is a path on the driver's disk" in p.stderr and "--shared-filesystem" in p.stderr


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


# ---------------------------------------------------------------- a standalone cluster
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def alive_workers(ui_port: int, host: str = "127.0.0.1") -> int:
    """Workers the master's web UI reports alive (0 while it is not up)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{ui_port}/json/", timeout=5) as r:
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


# ---------------------------------------------------- a standalone cluster of two "hosts"
#: The test hosts' network: a bridge of this machine's own (nothing leaves it) and one namespace per worker.
NET = "10.77.0"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=60)


def make_hosts(tag: str, count: int) -> tuple[str, list[tuple[str, str]]]:
    """A bridge with the driver's address and ``count`` namespaces, each with its own address on it.

    Returns:
        ``(bridge, [(namespace, address), ...])``.
    """
    bridge = f"sib{tag}"
    sh("ip", "link", "add", bridge, "type", "bridge")
    sh("ip", "addr", "add", f"{NET}.1/24", "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    hosts = []
    for i in range(1, count + 1):
        ns, veth, address = f"si{tag}w{i}", f"si{tag}v{i}", f"{NET}.{10 + i}"
        hosts.append((ns, address))
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", bridge)
        sh("ip", "link", "set", veth, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    return bridge, hosts


def remove_hosts(tag: str, count: int) -> None:
    """Remove what :func:`make_hosts` made, whatever exists of it."""
    for i in range(1, count + 1):
        subprocess.run(["ip", "netns", "delete", f"si{tag}w{i}"], capture_output=True, timeout=60)
        subprocess.run(["ip", "link", "delete", f"si{tag}v{i}"], capture_output=True, timeout=60)
    subprocess.run(["ip", "link", "delete", f"sib{tag}"], capture_output=True, timeout=60)


def can_make_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"sip{os.getpid() % 10000}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"`ip netns add` failed: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


@pytest.fixture
def two_host_cluster(tmp_path):
    """A standalone master on the bridge and one 1-core worker in each of two namespaces; yields
    ``(master URL, [worker addresses])``. Everything is removed afterwards, also when the test fails."""
    why = can_make_namespaces()
    if why:
        pytest.skip(why)
    tag = str(os.getpid() % 10000)
    log = open(tmp_path / "cluster.log", "w")
    procs: list[subprocess.Popen] = []
    try:
        _bridge, hosts = make_hosts(tag, 2)
        port, ui = free_port(), free_port()
        env = {**os.environ, "SPARK_LOCAL_IP": f"{NET}.1", "SPARK_LOG_DIR": str(tmp_path / "logs")}
        procs.append(subprocess.Popen([spark_class(), "org.apache.spark.deploy.master.Master", "--host", f"{NET}.1",
                                       "--port", str(port), "--webui-port", str(ui)], env=env, stdout=log, stderr=log))
        for i, (ns, address) in enumerate(hosts):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "env", f"SPARK_LOCAL_IP={address}", spark_class(),
                 "org.apache.spark.deploy.worker.Worker", "--host", address, "--cores", "1", "--memory", "2g",
                 "--work-dir", str(tmp_path / f"work{i}"), f"spark://{NET}.1:{port}"],
                env=env, stdout=log, stderr=log))
        deadline = time.monotonic() + CLUSTER_START_S
        while alive_workers(ui, f"{NET}.1") < 2:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                log.flush()
                pytest.fail("the cluster did not start:\n" + (tmp_path / "cluster.log").read_text()[-3000:])
            time.sleep(1)
        yield f"spark://{NET}.1:{port}", [address for _ns, address in hosts]
    finally:
        for p in procs:  # `ip netns exec` execs, so these are the JVMs themselves
            p.kill()
        for p in procs:
            p.wait(timeout=60)
        log.close()
        remove_hosts(tag, 2)


@pytest.mark.slow
def test_standalone_sh_trains_across_two_hosts(dataset, two_host_cluster, tmp_path):
    """One barrier task per worker "host"; TensorFlow's gRPC between the two namespaces; results on the driver."""
    master, addresses = two_host_cluster
    results = tmp_path / "r.json"
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
