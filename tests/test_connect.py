"""Spark Connect: barrier training through ``mapInArrow(..., barrier=True)`` against a real local Connect server.

The server is the installed pyspark's own ``SparkConnectServer`` (``spark-submit --class ...``, which execs the
JVM, so the pid started here is the server's; ``sbin/start-connect-server.sh`` would daemonize), on ``local[2]``
and a free port, started once for the module and killed at its end. Its Python workers run this interpreter
(``PYSPARK_PYTHON``), as a cluster's would run a shipped environment.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the Spark Connect client (the connect extra) is not installed")
pytest.importorskip("grpc_status", reason="the Spark Connect client (the connect extra) is not installed")

from data_util import build, small_layout  # noqa: E402
from spark_imagenet.errors import ConfigError, StorageError  # noqa: E402
from spark_imagenet.training.job.config import TrainConfig  # noqa: E402

#: Every test here starts a server or a cluster (seconds to tens of seconds): the slow tier.
pytestmark = pytest.mark.slow

SMALL = dict(workers=2, epochs=1, image_size=72, width=0.25, batch_size=4)
SMALL_ARGS = ["--workers", "2", "--epochs", "1", "--image-size", "72", "--width", "0.25", "--batch-size", "4"]
#: The running server's pid (set by the ``connect_url`` fixture): its descendants are the tasks' processes.
SERVER: dict[str, int] = {}
WARNING = "warning: Spark Connect session: not checked before launch: the scheduler's barrier task slot count"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    """``sc://127.0.0.1:P`` of a Spark Connect server (local[2]) this module starts and kills."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    port = _free_port()
    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    env = {**_clean_env(), "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(spark_home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.ui.enabled=false", "--conf", f"spark.pyspark.python={sys.executable}"],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    SERVER["pid"] = proc.pid
    try:
        deadline = time.monotonic() + 240
        while not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Connect server did not start (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


#: What pyspark sets in os.environ when it creates a Connect session (and then refuses classic sessions in this
#: process and its children); the tests after this module, and the CLI runs here, must not inherit it.
CONNECT_MARK = "SPARK_CONNECT_MODE_ENABLED"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "SPARK_REMOTE", CONNECT_MARK)}


@pytest.fixture(scope="module")
def remote(connect_url):
    from spark_imagenet.training.driver.spark_session import session_for

    had_mark = CONNECT_MARK in os.environ
    session = session_for(connect_url, 2)
    try:
        yield session
    finally:
        session.stop()
        if not had_mark:
            os.environ.pop(CONNECT_MARK, None)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("connect-data") / "bucket"
    build(small_layout(out.parent / "src"), out)  # 4 train shards, 2 val shards, 12 val images
    return out


def test_a_connect_session_has_no_spark_context_and_is_checked_through_its_conf(remote, connect_url):
    from spark_imagenet.training.driver.connect import connect_url as url_of, is_connect_session
    from spark_imagenet.training.driver.preflight import check_session, read_session_facts, spark_context

    assert is_connect_session(remote) and spark_context(remote) is None
    assert url_of(remote) == connect_url
    facts = read_session_facts(remote)
    assert facts.master == "local[2]" and facts.connect_url == connect_url and facts.slots == 2
    findings = check_session(facts, TrainConfig(workers=2))
    assert not findings.problems
    (warning,) = findings.warnings
    assert warning.line.startswith(WARNING) and "estimated instead from spark.master local[2]" in warning.line
    with pytest.raises(ConfigError) as e:
        check_session(facts, TrainConfig(workers=3)).raise_if_problems()  # the server's local[2] gives 2 slots
    assert "--workers 3 needs 3 barrier task slots" in str(e.value) and "local[2]" in str(e.value)


@pytest.mark.lanes  # also on the Spark 4.1 and 4.2 lanes (.ci/run)
@pytest.mark.slow
def test_train_through_connect(log_lines, remote, connect_url, dataset, tmp_path):
    from spark_imagenet.training.driver.launch import train

    lines = log_lines
    lines.clear()  # the lines from here on
    start = time.monotonic()
    out = train(remote, str(dataset), TrainConfig(**SMALL, cache=str(tmp_path / "cache")))
    print(f"\nConnect train() wall time: {time.monotonic() - start:.1f} s (barrier job {out.wall_seconds:.1f} s)")
    assert out.workers == 2 and [w.rank for w in out.per_worker] == [0, 1]
    assert all(w.host and w.steps > 0 and w.images_per_sec > 0 for w in out.per_worker)
    assert out.val.images == 12 and 0 <= out.val.top1 <= out.val.top5 <= 1
    assert out.config["master"] == connect_url
    assert set(out.to_json()) == {"format", "format_version", "workers", "per_worker", "val", "train", "images_per_sec",
                        "history", "config", "wall_seconds", "restarts", "checkpoint", "output"}
    assert out.restarts == 0 and out.checkpoint is None and out.output is None
    assert sum(line.startswith(WARNING) for line in lines) == 1
    assert any(line.startswith("val: 12 images") for line in lines)
    # the tasks run under the loopback server's local[2]: their lines reach this console through the channel
    assert any(line.startswith("[rank 0 on ") for line in lines) and any(line.startswith("[rank 1 on ") for line in lines)


@pytest.mark.slow
def test_a_task_error_reaches_the_driver_as_our_error(remote, dataset, tmp_path):
    """A shard the tasks cannot read (removed after planning): the task's StorageError, rebuilt on the driver."""
    from spark_imagenet.training.driver.launch import plan_job, run_job

    copy = tmp_path / "bucket"
    shutil.copytree(dataset, copy)
    job = plan_job(str(copy), TrainConfig(**SMALL, cache=str(tmp_path / "cache")))
    victim = job.assignment.workers[1].train_shards[0].name
    (copy / victim).unlink()
    with pytest.raises(StorageError) as e:
        run_job(remote, job)
    message = str(e.value)
    assert "rank 1" in message and Path(victim).name in message
    assert "\tat " not in message and "JVM stacktrace" not in message


def _cli(*args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    cli = Path(sys.executable).with_name("spark-imagenet")
    env = _clean_env()
    start = time.monotonic()
    p = subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=timeout, env=env)
    return p, time.monotonic() - start


@pytest.mark.slow
def test_cli_trains_through_connect(connect_url, dataset, tmp_path):
    """The command line's job through the Connect server (its own process, as a user runs it). The same job on
    a classic session is every other command-line training test; the two are not timed against each other
    here (no wall-clock comparisons in tests)."""
    connect, connect_s = _cli("train", str(dataset), "--master", connect_url, *SMALL_ARGS,
                              "--results", str(tmp_path / "connect.json"))
    assert connect.returncode == 0, connect.stdout[-3000:] + connect.stderr[-3000:]
    assert WARNING in connect.stdout + connect.stderr
    out = json.loads((tmp_path / "connect.json").read_text())
    assert out["workers"] == 2 and [w["rank"] for w in out["per_worker"]] == [0, 1]
    assert out["val"]["images"] == 12 and out["config"]["master"] == connect_url
    print(f"\nCLI through Connect: {connect_s:.1f} s (barrier job {out['wall_seconds']:.1f} s, server already running)")


def _descendants(root: int) -> dict[int, str]:
    """Live (not zombie) processes below ``root``, by pid, with their command lines (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            try:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            todo.append(pid)
    return found


def _tensorflow_workers() -> list[int]:
    """The training TensorFlow processes of the server's executors: forks of a TensorFlow fork server whose owner
    (``--owner``, the executor's PySpark daemon) is below the server, working in a rank's folder.
    A fork's command line is its fork server's, and the fork server may have outlived the Python worker that
    started it (docs/design.md, 'One TensorFlow import per host: the fork server')."""
    below = set(_descendants(SERVER["pid"])) | {SERVER["pid"]}
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            server = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
            folder = os.path.basename(os.readlink(entry / "cwd"))
        except (OSError, ValueError):
            continue
        if (words[1:3] == server[1:3] == [b"-m", b"spark_imagenet.training.worker.forkserver"]
                and int(server[server.index(b"--owner") + 1]) in below and folder.startswith("spark-imagenet-rank")):
            found.append(int(entry.name))
    return found


def _wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return bool(condition())


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_interrupts_the_connect_job_and_its_tensorflow_workers(connect_url, dataset, tmp_path):
    """Ctrl-C of the CLI: exit 130 with one line, and the server's TensorFlow workers end (spark.interruptTag)."""
    import signal

    cli = Path(sys.executable).with_name("spark-imagenet")
    args = [*SMALL_ARGS[:2], "--epochs", "500", *SMALL_ARGS[4:]]
    env = _clean_env()
    before = set(_tensorflow_workers())
    proc = subprocess.Popen([str(cli), "train", str(dataset), "--master", connect_url, *args], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        started = lambda: len(set(_tensorflow_workers()) - before) == 2  # noqa: E731
        assert _wait_until(lambda: started() or proc.poll() is not None, 600), "no training"
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        job = set(_tensorflow_workers()) - before
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=180)
        assert proc.returncode == 130, output[-3000:]
        assert output.rstrip().splitlines()[-1] == "spark-imagenet: interrupted", output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        left = lambda: job & set(_tensorflow_workers())  # noqa: E731
        assert _wait_until(lambda: not left(), 120), f"left running: {left()}"
        assert not set(_tensorflow_workers()) - before, "the job left a TensorFlow process"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_doctor_checks_a_connect_server_and_names_what_it_cannot(connect_url):
    p, _ = _cli("doctor", "--master", connect_url, "--workers", "2", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert f"ok       spark session: Spark Connect server {connect_url}, Spark " in out
    assert "the server's master local[2]" in out
    assert "ok       barrier slots: 2 (from the server's master)" in out
    assert "warn     not checked: " in out and "estimated instead from spark.master local[2]" in out
    assert "ok       encryption: " in out and "ok       gpu settings: no GPUs asked for" in out
    assert out.rstrip().endswith("no problems found") and "Traceback" not in p.stderr


def test_doctor_reports_a_connect_servers_problems_as_the_servers_settings(connect_url):
    p, _ = _cli("doctor", "--master", connect_url, "--workers", "3", "--gpus-per-worker", "1", timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    slots = next(ln for ln in p.stdout.splitlines() if ln.startswith("PROBLEM  barrier slots"))
    assert "--workers 3 needs 3 barrier task slots" in slots and "--workers <= 2" in slots
    gpus = next(ln for ln in p.stdout.splitlines() if ln.startswith("PROBLEM  gpu settings"))
    assert f"the Spark Connect server {connect_url} runs Spark's local mode (local[2])" in gpus
    assert "start the server with --master 'local-cluster[1,3,2048]'" in gpus
    assert "--conf spark.task.resource.gpu.amount=1" in gpus
    assert "2 problem(s) found" in p.stdout and "Traceback" not in p.stderr


def test_a_setting_the_server_keeps_is_named_in_one_warning(connect_url):
    code = ("import sys\nfrom spark_imagenet.training.driver.spark_session import session_for\n"
            "s = session_for(sys.argv[1], 2, conf={'spark.task.cpus': '2'})\n"
            "print('task.cpus', s.conf.get('spark.task.cpus', 'unset'))\ns.stop()\n")
    p = subprocess.run([sys.executable, "-c", code, connect_url], capture_output=True, text=True, timeout=300,
                       env=_clean_env())
    assert p.returncode == 0, p.stderr[-3000:]
    assert "task.cpus 2" not in p.stdout  # the server's value holds
    assert p.stderr.count("spark-imagenet: warning: ") == 1, p.stderr
    assert (f"spark-imagenet: warning: --conf spark.task.cpus=2 was not applied: the Spark Connect server "
            f"{connect_url} does not let a client change it (CANNOT_MODIFY_CONFIG)") in p.stderr, p.stderr
    assert "UserWarning" not in p.stderr


def test_an_unreachable_server_is_reported_at_once(dataset):
    port = _free_port()
    p, _ = _cli("train", str(dataset), "--workers", "1", "--master", f"sc://127.0.0.1:{port}", timeout=120)
    assert p.returncode == 2 and f"cannot reach the Spark Connect server at sc://127.0.0.1:{port}" in p.stderr


def _image_table(path: Path, bad: bool = False) -> Path:
    """A Parquet table (content binary, label string, name string) of 3 classes x 8 small JPEGs, written with
    pyarrow (no Spark in this process); ``bad`` adds a truncated image."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rows = []
    for k, cls in enumerate(("cat", "dog", "fox")):
        for i in range(8):
            buf = io.BytesIO()
            Image.new("RGB", (20, 16), (80 * k, 30 * i, 7 * i + k)).save(buf, "JPEG", quality=90)
            rows.append((buf.getvalue(), cls, f"{cls}/{cls}_{i}.jpg"))
    if bad:
        rows.append((rows[0][0][:-40], "cat", "cat/truncated.jpg"))
    content, label, name = zip(*rows)
    pq.write_table(pa.table({"content": pa.array(content, pa.binary()), "label": list(label), "name": list(name)}),
                   path)
    return path


@pytest.mark.lanes  # also on the Spark 4.1 and 4.2 lanes (.ci/run)
def test_shard_dataframe_through_connect_equals_the_classic_sessions(connect_url, tmp_path):
    """The same table sharded by the command line through the Connect server and on a classic local[2] session:
    the same dataset id and byte-identical shards (one DataFrame-API job for both)."""
    table = _image_table(tmp_path / "images.parquet")
    runs = {}
    for kind, master in (("connect", connect_url), ("classic", "local[2]")):
        out = tmp_path / kind
        p, _ = _cli("shard", "--table", str(table), "--format", "parquet", "--name-column", "name", "--master",
                    master, "--train-shards", "2", "--val-shards", "1", "--val-fraction", "0.25", "--out", str(out),
                    timeout=300)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        runs[kind] = json.loads((out / "manifest.json").read_text())
    assert runs["connect"]["dataset_id"] == runs["classic"]["dataset_id"]
    shards = {kind: [s for split in run["splits"].values() for s in split["shards"]] for kind, run in runs.items()}
    assert len(shards["connect"]) == 3 and sum(s["examples"] for s in shards["connect"]) == 24
    for ours, theirs in zip(shards["connect"], shards["classic"]):  # names differ: each holds its run's token
        assert (tmp_path / "connect" / ours["name"]).read_bytes() == (tmp_path / "classic" / theirs["name"]).read_bytes()


def test_shard_dataframe_in_a_connect_session_reports_bad_images_as_our_error(remote, tmp_path, log_lines):
    from spark_imagenet.dataset.dataframe import shard_dataframe
    from spark_imagenet.errors import ImageError

    df = remote.read.parquet(str(_image_table(tmp_path / "images.parquet", bad=True)))
    out = tmp_path / "shards"
    with pytest.raises(ImageError) as e:
        shard_dataframe(df, str(out), name_col="name", train_shards=1, val_shards=1, val_fraction=0.25)
    assert "1 image(s) are empty, truncated or do not decode" in str(e.value)
    assert "cat/truncated.jpg" in str(e.value) and "JVM stacktrace" not in str(e.value)
    assert not out.exists() or not list(out.iterdir())
    assert any("no progress lines under Spark Connect" in line for line in log_lines)
    manifest = shard_dataframe(df, str(out), name_col="name", train_shards=1, val_shards=1, val_fraction=0.25,
                               on_corrupt="skip")
    assert sum(s.examples for s in manifest.splits.values()) == 24


@pytest.mark.lanes  # also on the Spark 4.1 and 4.2 lanes (.ci/run)
def test_predict_dataframe_through_connect_equals_the_classic_answers(remote, tmp_path):
    """predict_dataframe in a Spark Connect session (its pandas UDF run by the server's Python workers): the
    SavedModel's answers for generated JPEGs and a PNG, and a bad image's reason in its row."""
    import io

    import numpy as np
    from PIL import Image

    import spark_imagenet.training.worker  # noqa: F401  (TensorFlow's set-up)
    import tensorflow as tf
    import tf_keras as keras

    from spark_imagenet import predict_dataframe
    from spark_imagenet.training.worker.export import write_serving

    keras.utils.set_random_seed(5)
    inputs = keras.Input((32, 32, 3))
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(inputs)))
    labels = [{"id": i, "wnid": f"n0000000{i}", "names": [f"class {i}"]} for i in range(3)]
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    write_serving(model, labels, 32, str(tmp_path))
    rng = np.random.default_rng(0)
    data = {}
    for i, fmt in enumerate(("JPEG", "JPEG", "PNG")):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (40 + i, 50, 3), dtype=np.uint8)).save(buf, fmt)
        data[f"{i}.{fmt.lower()}"] = buf.getvalue()
    data["bad.jpg"] = b"not an image"
    df = remote.createDataFrame(sorted(data.items()), "name string, content binary")
    got = {r["name"]: r["prediction"] for r in predict_dataframe(df, str(tmp_path), top_k=2).collect()}
    signature = tf.saved_model.load(str(tmp_path / "serving")).signatures["probabilities"]
    for name, image in data.items():
        if name == "bad.jpg":
            assert "Unknown image file format" in got[name]["error"] and got[name]["class_ids"] is None
            continue
        probabilities = signature(images=tf.constant([image]))["probabilities"].numpy()[0]
        best = np.argsort(-probabilities, kind="stable")[:2]
        assert got[name]["error"] is None and list(got[name]["class_ids"]) == best.tolist()
        np.testing.assert_allclose(got[name]["probabilities"], probabilities[best], atol=1e-6)
