"""submit/yarn.sh on a real YARN cluster: Hadoop's MiniYARNCluster on a MiniDFSCluster (a ResourceManager, a
NodeManager, HDFS as the default file system; see tests/yarn_cluster.py), the virtualenv packed with venv-pack
(``PACK_ONLY=1``) and shipped with --archives, two executors, barrier training to the end, in client and in
cluster deploy mode.

Both jobs ship the archive from HDFS, where it is a YARN PUBLIC resource: the NodeManager unpacks it once for
both. Unpacking its ~39k files is most of a job's time here (Hadoop without its native library sets each file's
permissions with a ``chmod`` process: about 2 minutes), which is also why the cluster has one NodeManager.
Spark's jars are ``local:`` (there on the one host), as with a Spark installed on every node. What yarn.sh
hands spark-submit for an archive on this machine (which Spark then uploads per job) is checked with a
stand-in spark-submit."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import subprocess
from pathlib import Path

import pytest

from data_util import build, small_layout
from yarn_cluster import CACHE, Unavailable, mini_yarn_cluster, shippable_python

REPO = Path(__file__).resolve().parents[1]
YARN_SH = REPO / "submit" / "yarn.sh"
#: Bounded wait (seconds) for one job: packing the environment (about a minute, once), the containers'
#: start and unpacking, training; this only stops a hang.
JOB_TIMEOUT_S = 900
TRAIN = ("--workers", "2", "--epochs", "1", "--image-size", "72", "--width", "0.25", "--batch-size", "4",
         "--shared-filesystem")


def yarn_env(conf_dir: Path | None, python: str, work: Path, **extra: str) -> dict:
    """The environment yarn.sh gets: the cluster's configuration, the Python to ship, nothing from this
    checkout (spark-submit would pass PYTHONPATH on to the containers)."""
    drop = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_GATEWAY_PORT", "HADOOP_CONF_DIR",
            "YARN_CONF_DIR", "SPARK_HOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({"PYTHON": python, "ENV_ARCHIVE": str(CACHE / "yarn-env.tar.gz"), **extra})
    if conf_dir is not None:
        env["HADOOP_CONF_DIR"] = str(conf_dir)
    return env


def run_yarn_sh(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(YARN_SH), *args], capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                          env=env, cwd=REPO)


@pytest.fixture(scope="module")
def packing(shipped, tmp_path_factory):
    """yarn.sh packing the environment (``PACK_ONLY=1``) in the background while the cluster starts (both take
    a core for most of a minute); yields the running ``subprocess.Popen`` (stdout and stderr as text)."""
    python, _dataset = shipped
    env = yarn_env(None, python, tmp_path_factory.mktemp("pack"), PACK_ONLY="1")
    proc = subprocess.Popen(["bash", str(YARN_SH)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


@pytest.fixture(scope="module")
def yarn(tmp_path_factory, packing):
    """A running MiniYARNCluster (one NodeManager) on a MiniDFSCluster; yields (YarnCluster, work folder)."""
    work = tmp_path_factory.mktemp("yarn")
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(mini_yarn_cluster(work))
        except Unavailable as e:
            pytest.skip(f"no YARN test cluster on this machine: {e}")
        yield cluster, work


@pytest.fixture(scope="module")
def env_in_hdfs(yarn, packing) -> str:
    """The environment packed by yarn.sh (``PACK_ONLY=1``: :func:`packing`), uploaded once into the cluster's
    HDFS, world-readable as HDFS makes files by default; its hdfs:// URL."""
    from spark_imagenet.storage import open_storage

    cluster, work = yarn
    out, err = packing.communicate(timeout=JOB_TIMEOUT_S)
    assert packing.returncode == 0 and out.strip() == str(CACHE / "yarn-env.tar.gz"), out + err
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HADOOP_USER_NAME", getpass.getuser())  # the NameNode's user: HDFS's superuser here
        open_storage(f"webhdfs://127.0.0.1:{cluster.webhdfs_port}/apps/spark-imagenet").put_file(
            CACHE / "yarn-env.tar.gz", "env.tar.gz")
    return f"{cluster.default_fs}/apps/spark-imagenet/env.tar.gz"


def local_jars(python: str) -> str:
    """spark-submit options that take Spark's jars from this host (``local:``) instead of uploading them."""
    code = "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))"
    jars = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout.strip()
    return f"--conf spark.yarn.jars=local:{jars}/*"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """(python, dataset): a Python yarn.sh can ship, and a small sharded dataset on the shared disk."""
    base = tmp_path_factory.mktemp("yarn-data")
    out = base / "shards"
    build(small_layout(base / "src"), out)
    CACHE.mkdir(parents=True, exist_ok=True)
    return shippable_python(), out


def test_yarn_sh_checks_its_settings_before_submitting(tmp_path):
    p = run_yarn_sh(yarn_env(None, "python3", tmp_path), "gs://b/imagenet", "--workers", "2")
    assert p.returncode == 2 and "set HADOOP_CONF_DIR to the folder with the cluster's yarn-site.xml" in p.stderr
    p = run_yarn_sh(yarn_env(tmp_path / "nowhere", "python3", tmp_path), "gs://b/imagenet", "--workers", "2")
    assert p.returncode == 2 and f"no yarn-site.xml in {tmp_path / 'nowhere'} (HADOOP_CONF_DIR)" in p.stderr
    (tmp_path / "yarn-site.xml").write_text("<configuration/>\n")
    p = run_yarn_sh(yarn_env(tmp_path, "python3", tmp_path, DEPLOY_MODE="both"), "gs://b/imagenet")
    assert p.returncode == 2 and "DEPLOY_MODE must be client or cluster (got 'both')" in p.stderr
    p = run_yarn_sh(yarn_env(tmp_path, "python3", tmp_path, PACK="0", ENV_ARCHIVE=str(tmp_path / "no.tar.gz")),
                    "gs://b/imagenet", "--workers", "2")
    assert p.returncode == 2 and f"ENV_ARCHIVE {tmp_path / 'no.tar.gz'} does not exist" in p.stderr


def test_yarn_sh_refuses_a_local_dataset_without_shared_filesystem_before_submitting(tmp_path):
    (tmp_path / "yarn-site.xml").write_text("<configuration/>\n")
    p = run_yarn_sh(yarn_env(tmp_path, "python3", tmp_path), str(tmp_path), "--workers", "2")
    assert p.returncode == 2 and "is a path on the driver's disk" in p.stderr and p.stdout == ""


def test_yarn_sh_refuses_a_local_job_file_in_cluster_mode(tmp_path):
    (tmp_path / "yarn-site.xml").write_text("<configuration/>\n")
    job = tmp_path / "job.toml"
    job.write_text("workers = 2\n")
    p = run_yarn_sh(yarn_env(tmp_path, "python3", tmp_path, DEPLOY_MODE="cluster"), "gs://b/i", "--config", str(job))
    assert p.returncode == 2 and "cannot read this machine's job file" in p.stderr and "DEPLOY_MODE=client" in p.stderr


def test_yarn_sh_reports_a_bad_job_option_before_submitting(tmp_path):
    (tmp_path / "yarn-site.xml").write_text("<configuration/>\n")
    p = run_yarn_sh(yarn_env(tmp_path, "python3", tmp_path), "gs://b/imagenet", "--workers", "0")
    assert p.returncode == 2 and "argument --workers: 0 must be at least 1" in p.stderr


def test_yarn_sh_refuses_a_package_the_archive_would_not_hold(tmp_path):
    # With the checkout on PYTHONPATH (as with `pip install -e`), the package lies outside the virtualenv.
    import sys

    (tmp_path / "yarn-site.xml").write_text("<configuration/>\n")
    env = yarn_env(tmp_path, sys.executable, tmp_path)
    env["PYTHONPATH"] = str(REPO)
    p = run_yarn_sh(env, "gs://b/imagenet", "--workers", "2")
    assert p.returncode == 2 and "the archive would lack it: pip install . (not -e)" in p.stderr


def test_yarn_sh_hands_spark_submit_the_archive_and_the_shipped_python(tmp_path):
    """A local archive and an hdfs:// one go to --archives as ENV#environment; a URL is never packed here
    (this checkout's editable install would be refused if it were)."""
    (tmp_path / "yarn-site.xml").write_text("<configuration/>\n")
    fake = tmp_path / "spark-submit"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")
    for where, pack in ((str(archive), "0"), ("hdfs:///apps/spark-imagenet/env.tar.gz", "1")):
        env = yarn_env(tmp_path, "python3", tmp_path, PACK=pack, ENV_ARCHIVE=where, SPARK_SUBMIT=str(fake))
        p = run_yarn_sh(env, "gs://b/imagenet", "--workers", "3", "--epochs", "2")
        assert p.returncode == 0, p.stderr
        args = p.stdout.splitlines()
        assert args[args.index("--archives") + 1] == f"{where}#environment"
        assert args[args.index("--master") + 1] == "yarn" and args[args.index("--deploy-mode") + 1] == "client"
        for conf in ("spark.executor.instances=3", "spark.pyspark.python=./environment/bin/python",
                     "spark.executorEnv.PYSPARK_PYTHON=./environment/bin/python"):
            assert conf in args, args
        assert args[-5:] == ["gs://b/imagenet", "--workers", "3", "--epochs", "2"]


def check_results(results: Path, out: str) -> dict:
    """The results JSON of a 2-worker job whose tasks ran the shipped environment's Python."""
    r = json.loads(results.read_text())
    assert r["workers"] == 2 and r["config"]["master"] == "yarn" and r["val"]["images"] == 12, out[-3000:]
    assert [w["rank"] for w in r["per_worker"]] == [0, 1]
    for w in r["per_worker"]:
        # Each executor unpacked the archive in its container as ./environment and ran its Python.
        assert w["python"].endswith("/environment/bin/python") and "/appcache/application_" in w["python"], w
    return r


@pytest.mark.slow
def test_yarn_sh_client_mode_ships_the_environment_and_trains(yarn, shipped, env_in_hdfs, tmp_path):
    cluster, work = yarn
    python, dataset = shipped
    results = tmp_path / "client.json"
    env = yarn_env(cluster.conf, python, work, ENV_ARCHIVE=env_in_hdfs, SPARK_SUBMIT_OPTS_EXTRA=local_jars(python))
    p = run_yarn_sh(env, str(dataset), *TRAIN, "--results", str(results))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    check_results(results, out)
    assert "spark.yarn.Client" in out or "YarnClientSchedulerBackend" in out, out[-3000:]


@pytest.mark.slow
def test_yarn_sh_cluster_mode_runs_the_driver_in_the_application_master(yarn, shipped, env_in_hdfs, tmp_path):
    cluster, work = yarn
    python, dataset = shipped
    results = tmp_path / "cluster.json"
    env = yarn_env(cluster.conf, python, work, DEPLOY_MODE="cluster", ENV_ARCHIVE=env_in_hdfs,
                   SPARK_SUBMIT_OPTS_EXTRA=local_jars(python))
    p = run_yarn_sh(env, str(dataset), *TRAIN, "--results", str(results))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert "final status: SUCCEEDED" in out, out[-3000:]
    check_results(results, out)
    # The NodeManager unpacked the archive into its PUBLIC cache (shared by every job), not for one application.
    public = [p for p in work.glob("cluster/target/test/data/**/filecache/*/env.tar.gz") if "usercache" not in p.parts]
    assert public, out[-3000:]
