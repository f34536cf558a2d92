"""Rendezvous (TF_CONFIG, ports over allGather in a real barrier stage) and the
task side's child process handling (environment, GPUs, output, death)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spark_imagenet.training.barrier_task import child_env, cuda_visible_devices, run_child
from spark_imagenet.errors import ConfigError
from spark_imagenet.training.rendezvous import build_tf_config, join_host_port, local_worker_count, split_host_port


# ------------------------------------------------------------- TF_CONFIG
def test_build_tf_config_shape():
    cfg = build_tf_config(["10.0.0.1:4000", "10.0.0.2:4001"], 1)
    assert cfg == {"cluster": {"worker": ["10.0.0.1:4000", "10.0.0.2:4001"]}, "task": {"type": "worker", "index": 1}}
    assert json.loads(json.dumps(cfg)) == cfg
    assert build_tf_config(["[::1]:5000"], 0)["cluster"]["worker"] == ["[::1]:5000"]


@pytest.mark.parametrize("addresses,rank,match", [
    ([], 0, "at least one"),
    (["h:1"], 1, "outside"),
    (["h:1"], -1, "outside"),
    (["h:1"], True, "outside"),
    (["h:1", "h:1"], 0, "duplicate"),
    (["h"], 0, "port"),
    (["h:0"], 0, "port"),
    (["h:70000"], 0, "port"),
    (["h:x"], 0, "host:port"),
    ([":80"], 0, "host:port"),
    ([None], 0, "not a string"),
])
def test_build_tf_config_validation(addresses, rank, match):
    with pytest.raises(ConfigError, match=match):
        build_tf_config(addresses, rank)


def test_split_and_join_host_port():
    assert split_host_port("host-1:7077") == ("host-1", 7077)
    assert split_host_port("10.1.2.3") == ("10.1.2.3", None)
    assert split_host_port("[fe80::1]:99") == ("fe80::1", 99)
    assert split_host_port("[::1]") == ("::1", None)
    assert split_host_port("::1") == ("::1", None)
    assert join_host_port("::1", 5) == "[::1]:5"
    assert join_host_port("h", 5) == "h:5"
    with pytest.raises(ValueError):
        split_host_port("[::1")


def test_local_worker_count():
    addresses = ["a:1", "b:2", "a:3", "[::1]:4"]
    assert local_worker_count(addresses, "a") == 2
    assert local_worker_count(addresses, "b") == 1
    assert local_worker_count(addresses, "::1") == 1


# ------------------------------------------------- real barrier rendezvous
def test_rendezvous_in_a_local_barrier_stage(spark):
    from spark_imagenet.training.rendezvous import rendezvous

    def task(_):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        rank, addresses, host = rendezvous(ctx)
        yield json.dumps({"partition": ctx.partitionId(), "rank": rank, "addresses": addresses, "host": host,
                          "task_host": split_host_port(ctx.getTaskInfos()[rank].address)[0],
                          "tf_config": build_tf_config(addresses, rank)})

    sc = spark.sparkContext
    out = [json.loads(s) for s in sc.parallelize(range(2), 2).barrier().mapPartitions(task).collect()]
    assert sorted(o["rank"] for o in out) == [0, 1]
    for o in out:
        assert o["rank"] == o["partition"]
        assert o["host"] == o["task_host"]
        assert o["tf_config"]["task"]["index"] == o["rank"]
        assert o["addresses"][o["rank"]].startswith(join_host_port(o["host"], 0)[:-1])
    assert out[0]["addresses"] == out[1]["addresses"]  # same list, rank order, on both ranks
    ports = [split_host_port(a)[1] for a in out[0]["addresses"]]
    assert len(set(ports)) == 2 and all(0 < p < 65536 for p in ports)
    assert local_worker_count(out[0]["addresses"], out[0]["host"]) == 2  # local[2]: one host

    # a second job picks its ports afresh and still agrees
    again = [json.loads(s) for s in sc.parallelize(range(2), 2).barrier().mapPartitions(task).collect()]
    assert again[0]["addresses"] == again[1]["addresses"]


# ---------------------------------------------------- child environment
def test_cuda_visible_devices_mapping():
    assert cuda_visible_devices(["0", "2"], None) == "0,2"
    assert cuda_visible_devices(["1"], "") == "1"
    assert cuda_visible_devices(["0", "1"], "3,5,7") == "3,5"  # indices relative to the executor's list
    assert cuda_visible_devices(["2"], "GPU-aaa,GPU-bbb,GPU-ccc") == "GPU-ccc"
    with pytest.raises(ConfigError, match="has only 2"):
        cuda_visible_devices(["2"], "4,5")
    with pytest.raises(ConfigError, match="not a plain device index"):
        cuda_visible_devices(["01"], None)
    with pytest.raises(ConfigError, match="not a plain device index"):
        cuda_visible_devices(["gpu0"], None)


def test_child_env():
    tf_config = build_tf_config(["h:1", "h:2"], 1)
    base = {"PATH": "/bin", "PYTHONPATH": "/x", "CUDA_VISIBLE_DEVICES": "4,6"}
    env = child_env(base, tf_config, ["1"], local_workers=2)
    assert json.loads(env["TF_CONFIG"]) == tf_config
    assert env["TF_USE_LEGACY_KERAS"] == "1" and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert env["PYTHONUNBUFFERED"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "6"
    assert env["PATH"] == "/bin"
    import spark_imagenet.training.barrier_task as bt

    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(bt.__file__)))
    assert env["PYTHONPATH"].split(os.pathsep) == [pkg_parent, "/x"]
    assert base == {"PATH": "/bin", "PYTHONPATH": "/x", "CUDA_VISIBLE_DEVICES": "4,6"}  # not modified
    # no GPU resource: CUDA_VISIBLE_DEVICES untouched, co-located workers share GPU memory politely
    env = child_env({"TF_CPP_MIN_LOG_LEVEL": "0"}, tf_config, None, local_workers=2)
    assert "CUDA_VISIBLE_DEVICES" not in env and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "0"  # a user's setting wins
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in child_env({}, tf_config, None, local_workers=1)


def test_child_env_lets_python_m_find_the_package(tmp_path):
    env = child_env({"PATH": os.environ.get("PATH", "")}, build_tf_config(["h:1"], 0), None, 1)
    out = subprocess.run([sys.executable, "-c", "import spark_imagenet.training.rendezvous as r; print(r.__name__)"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "spark_imagenet.training.rendezvous"


# ------------------------------------------------------------ child output
def test_run_child_streams_prefixed_lines_and_keeps_the_tail(tmp_path):
    code = ("import sys\n"
            "for i in range(50): print('line', i)\n"
            "print('to stderr', file=sys.stderr)\n"
            "sys.exit(3)\n")
    out = io.StringIO()
    rc, tail = run_child([sys.executable, "-c", code], dict(os.environ), str(tmp_path), "[rank 1] ", out=out)
    assert rc == 3
    echoed = out.getvalue().splitlines()
    assert echoed[0] == "[rank 1] line 0" and echoed[-1] == "[rank 1] to stderr" and len(echoed) == 51
    assert len(tail) == 40 and tail[-1] == "to stderr" and tail[0] == "line 11"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _dies_within(pid: int, seconds: float) -> bool:
    """Poll every 0.1 s until process ``pid`` is gone; False if it still runs after ``seconds``."""
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_child_dies_when_the_task_process_is_killed(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # the "task": runs a child that writes its pid and sleeps; then we SIGKILL the task
    child_code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    task_code = (
        "import os, sys\n"
        "from spark_imagenet.training.barrier_task import run_child\n"
        f"run_child([sys.executable, '-c', {child_code!r}], dict(os.environ), '.', '[t] ')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    task = subprocess.Popen([sys.executable, "-c", task_code], env=env, cwd=tmp_path)
    try:
        for _ in range(300):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        grandchild = int(pid_file.read_text())
        assert _alive(grandchild)
        task.send_signal(signal.SIGKILL)
        task.wait(30)
        assert _dies_within(grandchild, 10), "the child outlived its task process"
    finally:
        if task.poll() is None:
            task.kill()
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_child_of_a_killed_barrier_task_dies(spark, tmp_path):
    # rank 0 runs a child that would sleep for 5 minutes; rank 1 fails once that child is up.
    # Spark then kills rank 0's task (and its Python worker): the child must not outlive it.
    pid_file = tmp_path / "child.pid"
    child_code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"

    def task(_):
        import os
        import sys
        import time

        from pyspark import BarrierTaskContext

        if BarrierTaskContext.get().partitionId() == 0:
            run_child([sys.executable, "-c", child_code], dict(os.environ), str(tmp_path), "[rank 0] ")
        else:
            for _ in range(600):
                if pid_file.exists() and pid_file.read_text():
                    break
                time.sleep(0.1)
            raise RuntimeError("rank 1 fails on purpose")
        yield "unreachable"

    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(task).collect()
    child = int(pid_file.read_text())
    try:
        assert _dies_within(child, 60), "the TensorFlow-side child outlived its killed barrier task"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
