"""The TensorFlow worker process started early, and the spare left for the next job.

docs/design.md, 'Starting TensorFlow early, and a spare for the next job'. The fast tests drive the
supervisor's ``--preload`` protocol with small Python children; the Spark tests run real barrier jobs on
``local[2]`` and check, through each rank's record (``tf_process``) and ``/proc``:

* the first job of a session starts its own processes; a task leaves one spare per reused Python worker;
  the next job's tasks take those spares (the very supervisor pids);
* a spare whose TensorFlow process was killed while it waited is replaced and the job trains;
* a job whose tasks have another environment (``addPyFile`` of a zip puts a path on PYTHONPATH) takes no spare;
* ``spare_worker=False`` takes none and leaves none;
* stopping the session leaves no spare process and no spare folder;
* PySpark tells its Python workers whether it reuses them (``SPARK_REUSE_WORKER``), which decides the spares.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from session_util import stop_shared_spark

from child_util import worker_env as child_env
from spark_imagenet.training.task.child import (SPARE_FOLDER_PREFIX, ChildFolder, finish_child, spares_enabled,
                                               start_child)
from spark_imagenet.training.job import priority
from spark_imagenet.training.task.environment import job_env, preload_env
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.task.supervisor import EXIT_PRELOAD_ENDED

REPO = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, PR_SET_PDEATHSIG")


def _wait_until(condition, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _children(pid: int) -> dict[int, str]:
    """Live children of ``pid`` with their command lines."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in "ZX":
            found[int(name)] = cmd
    return found


def _spares_of(task_pid: int) -> list[int]:
    """Pids of the spare supervisors that Python worker ``task_pid`` holds."""
    return [p for p, cmd in _children(task_pid).items()
            if "spark_imagenet.training.task.supervisor" in cmd and f"--folder {SPARE_FOLDER_PREFIX}" in cmd]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def _fork_servers(owners: set[int]) -> list[int]:
    """Pids of the live TensorFlow fork servers (not their forks, whose command line is theirs) that live as long as
    one of ``owners``."""
    found = []
    for name in os.listdir("/proc"):
        words = _cmd(int(name)).split() if name.isdigit() else []
        if (words[1:3] == ["-m", "spark_imagenet.training.worker.forkserver"] and "--owner" in words
                and int(words[words.index("--owner") + 1]) in owners and _alive(int(name))
                and "spark_imagenet.training.worker.forkserver" not in _cmd(_parent(int(name)))):
            found.append(int(name))
    return sorted(found)


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _links(pid: int) -> set[str]:
    """What the file descriptors of ``pid`` point at (``pipe:[N]`` for a pipe)."""
    try:
        return {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return set()


def _forked_for(supervisor: int) -> list[int]:
    """The TensorFlow process of ``supervisor``: the fork server's child (not the supervisor's: a fork's command line
    is its server's) whose stdin is the pipe that the supervisor holds the other end of."""
    held = {link for link in _links(supervisor) if link.startswith("pipe:")}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stdin = os.readlink(f"/proc/{name}/fd/0")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                forked = b"spark_imagenet.training.worker.forkserver" in f.read()
        except OSError:
            continue
        if forked and stdin in held and _alive(int(name)):
            found.append(int(name))
    return found


# ------------------------------------------------------------------ environments
def test_child_env_is_the_preload_env_plus_the_job_env():
    base = {"PATH": "/bin", "TF_CONFIG": "stale", "CUDA_VISIBLE_DEVICES": "3,5,7"}
    tf_config = {"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 1}}
    for gpus, local in ((["1"], 2), (None, 2), (None, 1)):
        before = preload_env(base, gpus)
        after = job_env(base, tf_config, gpus, local)
        assert "TF_CONFIG" not in before and after["TF_CONFIG"] == child_env(base, tf_config, gpus, local)["TF_CONFIG"]
        assert {**before, **after} == child_env(base, tf_config, gpus, local)
        assert ("TF_FORCE_GPU_ALLOW_GROWTH" in after) == (gpus is None and local > 1)
    assert job_env(base, None, None, 1) == {}
    assert before["CUDA_VISIBLE_DEVICES"] == "3,5,7" and preload_env(base, ["1"])["CUDA_VISIBLE_DEVICES"] == "5"


def test_spares_need_the_setting_and_a_reused_python_worker():
    assert spares_enabled(TrainConfig(workers=2), {"SPARK_REUSE_WORKER": "1"})
    assert not spares_enabled(TrainConfig(workers=2), {})
    assert not spares_enabled(TrainConfig(workers=2, spare_worker=False), {"SPARK_REUSE_WORKER": "1"})


# ------------------------------------------------------------- the --preload protocol
#: A child that records when it started (before its go) and what it read after it.
PRELOAD_CHILD = ("import os, sys, time\n"
                 "open('started', 'w').write(str(os.getpid()))\n"
                 "go = sys.stdin.readline().strip()\n"
                 "print('go', go, open(sys.argv[1]).read(), flush=True)\n")


@linux_only
def test_a_preloaded_child_runs_before_its_inputs_and_waits_for_its_go(tmp_path):
    seen: dict[str, str] = {}

    def prepare(folder: str) -> None:
        assert _wait_until(lambda: os.path.exists(os.path.join(folder, "started")), 60)
        seen["pid"] = open(os.path.join(folder, "started")).read()
        with open(os.path.join(folder, "in.txt"), "w") as f:
            f.write("inputs")

    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = start_child([sys.executable, "-c", PRELOAD_CHILD, "{folder}/in.txt"], env, None,
                       "spark-imagenet-rank0-", preload=True)
    out = io.StringIO()
    code, tail = finish_child(proc, "[r] ", out=out, folder=ChildFolder("unused", prepare, lambda f: None))
    assert code == 0 and tail == ["go run inputs"], out.getvalue()
    assert seen["pid"].isdigit() and not _alive(int(seen["pid"]))
    assert list(tmp_path.iterdir()) == []


@linux_only
def test_a_preloaded_child_that_ended_before_its_go_is_reported_apart(tmp_path):
    def prepare(folder: str) -> None:
        pid = int(open(os.path.join(folder, "started")).read()) if _wait_until(
            lambda: os.path.exists(os.path.join(folder, "started")), 60) else None
        os.kill(pid, signal.SIGKILL)
        assert _wait_until(lambda: not _alive(pid), 30)  # a zombie until the supervisor looks

    code = "import os, time\nopen('started', 'w').write(str(os.getpid()))\ntime.sleep(300)\n"
    proc = start_child([sys.executable, "-c", code], dict(os.environ, TMPDIR=str(tmp_path)), None,
                       "spark-imagenet-rank0-", preload=True)
    rc, tail = finish_child(proc, "[r] ", out=io.StringIO(), folder=ChildFolder("unused", prepare, lambda f: None))
    assert rc == EXIT_PRELOAD_ENDED
    assert tail == ["supervisor: the preloaded process was killed by signal 9 before its go"]
    assert list(tmp_path.iterdir()) == []


TASK_HOLDING_A_PRELOADED_CHILD = r"""
import os, sys, time
from spark_imagenet.training.task.child import start_child
proc = start_child([sys.executable, "-c", "import os, time\nopen(os.path.join(os.environ['TMPDIR'], 'pid'), 'w')"
                    ".write(str(os.getpid()))\ntime.sleep(300)\n"], dict(os.environ), None,
                   "spark-imagenet-spare-", preload=True)
time.sleep(300)
"""


@linux_only
def test_a_dead_task_ends_its_waiting_preloaded_child_and_removes_its_folder(tmp_path):
    """A spare waits in a Python worker that PySpark may SIGKILL at any time: nothing stays."""
    import subprocess

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, sys.path)]))
    task = subprocess.Popen([sys.executable, "-c", TASK_HOLDING_A_PRELOADED_CHILD], env=env, cwd=tmp_path)
    child = None
    try:
        assert _wait_until(lambda: [p for p in tmpdir.glob(f"{SPARE_FOLDER_PREFIX}*/pid") if p.read_text()], 60)
        pid_file = next(tmpdir.glob(f"{SPARE_FOLDER_PREFIX}*/pid"))
        child = int(pid_file.read_text())
        task.send_signal(signal.SIGKILL)
        task.wait(30)
        assert _wait_until(lambda: not _alive(child), 90), "the waiting child outlived its task"
        # 300 s: a bound, not a speed (a CI lane at nice 19 beside a busy main lane once needed more than 90)
        assert _wait_until(lambda: list(tmpdir.iterdir()) == [], 300), f"left behind: {list(tmpdir.iterdir())}"
    finally:
        if task.poll() is None:
            task.kill()
        if child is not None and _alive(child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


@linux_only
@pytest.mark.slow
def test_the_worker_waits_for_its_go_and_ends_quietly_without_one(tmp_path):
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, sys.path)]))
    done = subprocess.run([sys.executable, "-m", "spark_imagenet.training.worker.main", "--preload", "env.json",
                           "spec.json", "result.json"], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "failed" not in done.stderr and not (tmp_path / "result.json").exists()


# ------------------------------------------------------------------- real Spark jobs
@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    from data_util import build, small_layout

    root = tmp_path_factory.mktemp("spare")
    build(small_layout(root / "tree"), root / "bucket", train_shards=2, val_shards=2)
    return root


def _session(**conf):
    from pyspark import SparkContext

    from spark_imagenet.training.driver.spark_session import local_session

    SparkContext._ensure_initialized()  # this module's settings do not become the JVM's for later modules
    stop_shared_spark()  # a session of its own, not the one the module before handed on
    return local_session("local[2]", app_name="spark-imagenet-spare-tests",
                         conf={"spark.ui.enabled": "false", **conf})


def _job(spark, root: Path, **settings) -> list[dict]:
    """The job's task results as JSON objects, by rank."""
    from spark_imagenet.training.driver.launch import _launch, plan_job
    from spark_imagenet.training.driver.preflight import read_session_facts

    config = TrainConfig(workers=2, epochs=1, batch_size=2, image_size=67, width=0.25, cache=str(root / "cache"),
                         **settings)
    records = _launch(spark, spark.sparkContext, read_session_facts(spark), plan_job(str(root / "bucket"), config))
    assert sorted(r.rank for r in records) == [0, 1] and all(r.worker.steps > 0 for r in records)
    return [r.to_json() for r in sorted(records, key=lambda r: r.rank)]


def _spare_folders(root: Path) -> set[str]:
    return {p.name for p in root.glob(f"{SPARE_FOLDER_PREFIX}*")}


@pytest.mark.slow
@linux_only
def test_jobs_of_one_session_take_the_spares_of_the_last(bucket, tmp_path):
    tmpdir = tmp_path / "tmp"  # the executors' TMPDIR: the spares' folders of this session's jobs, and no others'
    tmpdir.mkdir()
    spark = _session(**{"spark.executorEnv.TMPDIR": str(tmpdir)})
    seen: list[int] = []
    try:
        first = _job(spark, bucket)
        assert [r["tf_process"]["spare"] for r in first] == [False, False]
        tasks = [r["tf_process"]["task_pid"] for r in first]
        assert _wait_until(lambda: all(len(_spares_of(t)) == 1 for t in tasks), 60), [_children(t) for t in tasks]
        spares = {t: _spares_of(t)[0] for t in tasks}
        assert _wait_until(lambda: len(_spare_folders(tmpdir)) == 2, 30)  # the spares' folders, in its TMPDIR
        seen += spares.values()
        servers = _fork_servers({_parent(t) for t in tasks})
        assert len(servers) == 1, servers  # one TensorFlow import for the executor: both tasks' processes forked
        seen += servers
        if priority.idle_reversible():  # started during the job, under SCHED_IDLE until a task takes it
            assert {os.sched_getscheduler(s) for s in spares.values()} == {os.SCHED_IDLE}

        second = _job(spark, bucket)  # each task takes the spare of its Python worker
        taken = {r["tf_process"]["task_pid"]: r["tf_process"] for r in second}
        for task, used in taken.items():
            assert used["spare"] and used["supervisor_pid"] == spares[task], (taken, spares)
            assert not _alive(spares[task])

        # a spare whose TensorFlow process is killed while it waits: replaced, and the job trains
        assert _wait_until(lambda: all(len(_spares_of(t)) == 1 for t in taken), 60)
        victim_task = sorted(taken)[0]
        victim = _spares_of(victim_task)[0]
        seen += [_spares_of(t)[0] for t in taken]
        def worker_of(supervisor: int) -> list[int]:
            return _forked_for(supervisor)

        assert _wait_until(lambda: len(worker_of(victim)) == 1, 60), _children(victim)
        workers = worker_of(victim)
        os.kill(workers[0], signal.SIGKILL)
        assert _wait_until(lambda: not _alive(workers[0]), 30)
        third = {r["tf_process"]["task_pid"]: r["tf_process"] for r in _job(spark, bucket)}
        if victim_task in third:  # Spark may place the ranks on either Python worker
            assert third[victim_task]["supervisor_pid"] != victim and not third[victim_task]["spare"]

        # another environment in the tasks (a --py-files path): no spare is taken
        import zipfile

        extra = tmp_path / "spare_probe.zip"  # a zip goes onto the tasks' sys.path (a .py joins a folder already on it)
        with zipfile.ZipFile(extra, "w") as z:
            z.writestr("spare_probe_module.py", "X = 1\n")
        spark.sparkContext.addPyFile(str(extra))
        assert _wait_until(lambda: all(len(_spares_of(t)) == 1 for t in third), 60)
        seen += [_spares_of(t)[0] for t in third]
        fourth = _job(spark, bucket)
        assert [r["tf_process"]["spare"] for r in fourth] == [False, False]
        more = _fork_servers({_parent(r["tf_process"]["task_pid"]) for r in fourth})
        assert len(more) == 2 and servers[0] in more, more  # another environment: a server of its own
        seen += more

        # spares off: none taken (the ones left are ended), none left
        fifth = _job(spark, bucket, spare_worker=False)
        assert [r["tf_process"]["spare"] for r in fifth] == [False, False]
        time.sleep(2)
        assert all(_spares_of(r["tf_process"]["task_pid"]) == [] for r in fifth)
    finally:
        spark.stop()
    assert _wait_until(lambda: not any(_alive(p) for p in seen), 60), [p for p in seen if _alive(p)]
    assert _wait_until(lambda: not _spare_folders(tmpdir), 60), _spare_folders(tmpdir)


@pytest.mark.slow
def test_pyspark_tells_its_python_workers_whether_it_reuses_them():
    for reuse, expected in (("true", True), ("false", False)):
        spark = _session(**{"spark.python.worker.reuse": reuse})
        try:
            got = spark.sparkContext.parallelize([0], 1).map(
                lambda _: bool(os.environ.get("SPARK_REUSE_WORKER"))).collect()
        finally:
            spark.stop()
        assert got == [expected], reuse
