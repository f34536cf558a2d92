"""The task side (spark_imagenet.training.task.barrier_task): the TensorFlow worker process's
environment (TF_CONFIG, GPUs), its output, its death with the task, and the WorkerSpec
each rank is given."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spark_imagenet.training.job.outcome import Failure
from child_util import WORKER, fake_worker, run_child, worker_env as child_env
from spark_imagenet.training.task.child import CpuStartupFilter
from spark_imagenet.training.task.environment import cuda_visible_devices
from spark_imagenet.errors import ConfigError
from spark_imagenet.training.task.rendezvous import build_tf_config


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
    base = {"PATH": "/bin", "PYTHONPATH": "/x:/spark/jars/spark-core_2.13-4.3.0.jar", "CUDA_VISIBLE_DEVICES": "4,6"}
    env = child_env(base, tf_config, ["1"], local_workers=2)
    assert json.loads(env["TF_CONFIG"]) == tf_config
    assert env["TF_USE_LEGACY_KERAS"] == "1" and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert env["PYTHONUNBUFFERED"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "6"
    assert env["PATH"] == "/bin"
    import spark_imagenet

    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(spark_imagenet.__file__)))
    assert os.path.isfile(os.path.join(pkg_parent, "spark_imagenet", "__init__.py"))  # the folder above the package
    assert env["PYTHONPATH"].split(os.pathsep) == [pkg_parent, "/x"]  # PySpark's jar left out
    assert base["PYTHONPATH"] == "/x:/spark/jars/spark-core_2.13-4.3.0.jar"  # not modified
    # no GPU resource: CUDA_VISIBLE_DEVICES untouched, co-located workers share GPU memory politely
    env = child_env({"TF_CPP_MIN_LOG_LEVEL": "0"}, tf_config, None, local_workers=2)
    assert "CUDA_VISIBLE_DEVICES" not in env and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "0"  # a user's setting wins
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in child_env({}, tf_config, None, local_workers=1)


def test_child_env_of_a_one_worker_strategy_has_no_tf_config():
    """mirrored / default: no cluster, and a TF_CONFIG the executor inherited is dropped."""
    env = child_env({"TF_CONFIG": '{"cluster": {}}', "CUDA_VISIBLE_DEVICES": "2,3"}, None, ["0", "1"], 1)
    assert "TF_CONFIG" not in env and env["CUDA_VISIBLE_DEVICES"] == "2,3"  # both of its GPUs
    assert env["TF_USE_LEGACY_KERAS"] == "1"


def test_child_env_lets_python_m_find_the_package(tmp_path):
    env = child_env({"PATH": os.environ.get("PATH", "")}, build_tf_config(["h:1"], 0), None, 1)
    # -S: no site-packages (no installed copy of the package): only the PYTHONPATH child_env built
    out = subprocess.run([sys.executable, "-S", "-c", "import spark_imagenet.training.task.rendezvous as r; print(r.__name__)"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "spark_imagenet.training.task.rendezvous"


# ------------------------------------------------------------ child output
@pytest.fixture()
def fake(tmp_path):
    """``(environment, owner)`` of the stand-in TensorFlow worker (tests/child_util.py)."""
    with fake_worker(tmp_path) as got:
        yield got


def test_run_child_streams_prefixed_lines_and_keeps_the_tail(fake):
    code = ("import sys\n"
            "for i in range(50): print('line', i)\n"
            "print('to stderr', file=sys.stderr)\n"
            "sys.exit(3)\n")
    out = io.StringIO()
    rc, tail = run_child(*fake, "[rank 1] ", code, out=out)
    assert rc == 3
    echoed = out.getvalue().splitlines()
    assert echoed[0] == "[rank 1] line 0" and echoed[-1] == "[rank 1] to stderr" and len(echoed) == 51
    assert len(tail) == 40 and tail[-1] == "to stderr" and tail[0] == "line 11"


#: What TensorFlow 2.21 printed at start-up per rank on this CPU-only machine (copied from a run).
TF_CPU_STARTUP = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796136656.600754   13016 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
    "GPU will not be used.",
    "E0000 00:00:1796136662.682967   13016 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)",
]


def test_cpu_startup_lines_become_one_notice_in_the_echo_and_the_tail(fake):
    lines = ["strategy: waiting", *TF_CPU_STARTUP, *TF_CPU_STARTUP, "Epoch 1/1: 3 steps", "Traceback (most recent"]
    code = f"import sys\nfor line in {lines!r}: print(line)\nsys.exit(1)\n"
    out, shown = io.StringIO(), CpuStartupFilter()
    rc, tail = run_child(*fake, "[rank 0] ", code, out=out, shown=shown)
    shown_lines = ["strategy: waiting", CpuStartupFilter.NOTICE, "Epoch 1/1: 3 steps", "Traceback (most recent"]
    assert rc == 1 and tail == shown_lines  # a failure's message quotes what was shown: no cuInit line
    assert out.getvalue().splitlines() == ["[rank 0] strategy: waiting", f"[rank 0] {CpuStartupFilter.NOTICE}",
                                           "[rank 0] Epoch 1/1: 3 steps", "[rank 0] Traceback (most recent"]
    assert shown.hidden == 6


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


def _wait_until_gone(path: str, seconds: float) -> bool:
    """Poll every 0.1 s until ``path`` is gone; False if it is still there after ``seconds``."""
    deadline = time.monotonic() + seconds
    while os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


#: A task's body (``python -c`` with the stand-in worker's environment): its TensorFlow process sleeps.
TASK_CODE = r"""
import os, sys
from pathlib import Path
from spark_imagenet.training.task.child import finish_child, start_preloaded

def prepare(folder):
    Path(folder, "sleep.txt").write_text("")
    Path(sys.argv[1], "folder.txt").write_text(folder)

held = start_preloaded(dict(os.environ), "fake_tf.worker", 0)
finish_child(held, "[t] ", prepare, lambda folder: None)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets, /proc")
def test_child_dies_and_its_folder_goes_when_the_task_process_is_killed(fake, tmp_path):
    env, _owner = fake
    task = subprocess.Popen([sys.executable, "-c", TASK_CODE, str(tmp_path)], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not ((tmp_path / "folder.txt").exists() and os.path.exists(os.path.join(
                (tmp_path / "folder.txt").read_text(), "pid.txt"))) and time.monotonic() < deadline:
            time.sleep(0.1)
        folder = (tmp_path / "folder.txt").read_text()
        grandchild = int(open(os.path.join(folder, "pid.txt")).read())
        assert _alive(grandchild)
        task.send_signal(signal.SIGKILL)  # as PySpark ends a cancelled task's Python worker
        task.wait(30)
        assert _dies_within(grandchild, 10), "the child outlived its task process"
        assert _wait_until_gone(folder, 10), "the child's folder outlived its task process"
    finally:
        if task.poll() is None:
            task.kill()


@pytest.mark.slow
def test_child_of_a_killed_barrier_task_dies(spark, fake, tmp_path):
    # rank 0 runs a child that would sleep for 2 minutes; rank 1 fails once that child is up.
    # Spark then kills rank 0's task (and its Python worker): the child must not outlive it.
    env, _owner = fake
    folder_file, pid_file = tmp_path / "folder.txt", tmp_path / "child.pid"

    def task(_):
        import os
        import time
        from pathlib import Path

        from pyspark import BarrierTaskContext

        from spark_imagenet.training.task.child import finish_child, start_preloaded

        def prepare(folder):
            Path(folder, "sleep.txt").write_text("")
            folder_file.write_text(folder)

        if BarrierTaskContext.get().partitionId() == 0:
            finish_child(start_preloaded(env, WORKER, 0), "[rank 0] ", prepare, lambda folder: None)
        else:
            for _ in range(600):
                if folder_file.exists() and os.path.exists(os.path.join(folder_file.read_text(), "pid.txt")):
                    pid_file.write_text(Path(folder_file.read_text(), "pid.txt").read_text())
                    break
                time.sleep(0.1)
            raise RuntimeError("rank 1 fails on purpose")
        yield "unreachable"

    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(task).collect()
    child = int(pid_file.read_text())
    try:
        assert _dies_within(child, 60), "the TensorFlow-side child outlived its killed barrier task"
        assert _wait_until_gone(folder_file.read_text(), 60), "the child's folder outlived its killed barrier task"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


# ------------------------------------------------------- the worker's message
@pytest.mark.parametrize("code, outcome, lost", [
    (-9, None, True),  # SIGKILL (the OOM killer, a dying machine): whatever it wrote
    (-9, Failure(stage="reading data", message="ImageError: x"), True),
    (3, Failure(stage="training (fit)", message="no step", error="WorkerLost"), True),  # the step watchdog
    (3, None, True),
    (1, Failure(stage="training (fit)", message="UnavailableError: x", error="WorkerLost"), True),  # the worker said
    (1, Failure(stage="building the strategy", message="not all up", error="WorkerLost"), True),  # start-up timeout
    (1, Failure(stage="reading data", message="ImageError: train-00000.tfrecord record 3", error="ImageError"), False),
    (1, Failure(stage="training (fit)", message="InvalidArgumentError: logits and labels"), False),
    (1, None, False),
])
def test_a_lost_worker_is_told_from_a_failure_that_would_recur(code, outcome, lost):
    """The task decides from the exit status and the failure the worker wrote, never from its output's words."""
    from spark_imagenet.training.task.barrier_task import process_failure

    failure = process_failure(outcome, code, ["a", "b"], 1, "h", "m")
    assert failure.lost is lost and failure.rank == 1 and failure.host == "h" and failure.exit_status == code
    assert failure.output == ("a", "b") and failure.process.startswith("the TensorFlow process (m) ")
    if outcome is not None and not lost:
        assert failure.error == outcome.error and failure.message == outcome.message
    assert failure.describe().startswith("rank 1 on h: the TensorFlow process (m) ")
