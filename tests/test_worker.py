"""The TensorFlow worker process (spark_imagenet.training.worker.main): failure reporting,
and real one-worker and two-worker MultiWorkerMirroredStrategy runs in child
processes on tiny generated TFRecord shards, each given a WorkerSpec."""

from __future__ import annotations

import io
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.job.config import TrainConfig  # noqa: E402
from spark_imagenet.training.job.plan import WORKER, WorkerSpec  # noqa: E402
from spark_imagenet.training.job.schedules import schedule_for  # noqa: E402
from spark_imagenet.training.job.outcome import Failure, read_outcome  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

#: Four classes of distinct solid colours (RGB, 0..255); a random crop of any
#: part of an image still shows its class.
COLOURS = ((220, 30, 30), (30, 200, 30), (30, 30, 220), (230, 220, 40))
SYNSETS = tuple(f"n9900000{k}" for k in range(len(COLOURS)))
#: Child processes are killed after this many seconds (a hung collective must
#: not hang the test run); normal runs take 10 to 40 s.
CHILD_TIMEOUT_S = 300


def _jpeg(colour: tuple[int, int, int], rng: np.random.Generator, size: int) -> bytes:
    """A JPEG of one solid colour with a little per-pixel noise."""
    pixels = np.asarray(colour, np.float32) + rng.normal(0, 12, size=(size, size, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def write_shard(path: Path, labels: list[int], seed: int, size: int = 80) -> Path:
    """Write a TFRecord shard with one ``tf.train.Example`` per label, with the
    feature keys the shard builder writes (spark_imagenet.dataset.tfrecord)."""
    rng = np.random.default_rng(seed)

    def b(value: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def i64(value: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, label in enumerate(labels):
            feature = {
                "image/encoded": b(_jpeg(COLOURS[label], rng, size)),
                "image/format": b(b"JPEG"),
                "image/class/label": i64(label),
                "image/class/synset": b(SYNSETS[label].encode()),
                "image/height": i64(size),
                "image/width": i64(size),
                "image/filename": b(f"{SYNSETS[label]}_{seed}_{i}.JPEG".encode()),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict:
    """Two train shards of 32 images (8 per class, shuffled) and one val shard
    of 18 images (not a multiple of the batch size, so evaluation pads)."""
    d = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    train = []
    for s in range(2):
        labels = [k for k in range(4) for _ in range(8)]
        rng.shuffle(labels)
        train.append(str(write_shard(d / f"train-0000{s}-of-00002.tfrecord", labels, seed=10 + s)))
    val_labels = [i % 4 for i in range(18)]
    val = str(write_shard(d / "val-00000-of-00001.tfrecord", val_labels, seed=20))
    return {"train": train, "val": val, "val_labels": val_labels}


#: The settings of the job (TrainConfig); the other keys of base_config belong to the worker.
JOB_KEYS = ("workers", "model", "epochs", "batch_size", "image_size", "width", "learning_rate", "seed", "parallel")
#: Job keys a test may set (TrainConfig's defaults otherwise).
OPTIONAL_JOB_KEYS = ("strategy", "cross_device_ops", "gpus_per_worker", "optimizer", "precision", "jit_compile",
                     "weight_decay", "label_smoothing", "lr_schedule", "warmup_epochs", "output", "startup_timeout",
                     "lighting")


def base_config(shards: dict, **overrides) -> dict:
    """A one-worker spec as WorkerSpec JSON: both train shards (64 images), the whole val shard.

    ``overrides`` are flat: job settings and worker fields by name."""
    cfg = {
        "rank": 0,
        "workers": 1,
        "train_files": shards["train"],
        "train_examples": 64,
        "val_files": [shards["val"]],
        "val_record_shard": None,
        "val_examples": 18,
        "steps_per_epoch": 8,  # 64 // (8 * 1)
        "val_steps": 3,  # ceil(18 / 8)
        "num_classes": 4,
        "model": "alexnet",
        "epochs": 3,
        "batch_size": 8,
        "image_size": 72,
        "width": 0.25,
        # Solid colours make every conv position's gradient agree, so they
        # tolerate a smaller step than natural images (0.01 diverged for 2 of
        # 10 seeds in-process; 0.005 learned in 6 of 6).
        "learning_rate": 0.005,
        "parallel": 1,
        "seed": 0,
        "threads": 1,
        "val_examples_total": 18,
    }
    cfg.update(overrides)
    job = {k: cfg.pop(k) for k in JOB_KEYS}
    job.update({k: cfg.pop(k) for k in OPTIONAL_JOB_KEYS if k in cfg})
    config = {"format": "spark-imagenet-train-config", "format_version": 1, **job}
    try:  # the job's one schedule, as the driver builds it (a spec a test breaks on purpose gets a default one)
        schedule = schedule_for(TrainConfig.from_json(config), cfg["steps_per_epoch"]).to_json()
    except ConfigError:
        schedule = schedule_for(TrainConfig(workers=1), 1).to_json()
    return {"format": WORKER.format, "format_version": WORKER.version, "config": config,
            "schedule": schedule, "dataset_id": "test", **cfg}


def child_env(tf_config: dict | None = None) -> dict:
    """Environment of a worker process: the repo importable, TF_CONFIG as given."""
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TF_USE_LEGACY_KERAS"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def start_worker(tmp: Path, config: dict, name: str, tf_config: dict | None = None) -> tuple[subprocess.Popen, Path]:
    """Start ``python -m spark_imagenet.training.worker.main`` on ``config``; return (process, result path)."""
    cfg_path = tmp / f"{name}-config.json"
    result_path = tmp / f"{name}-result.json"
    cfg_path.write_text(json.dumps(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_imagenet.training.worker.main", str(cfg_path), str(result_path)],
        cwd=REPO,
        env=child_env(tf_config),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, result_path


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Wait for all processes (killing all of them on timeout); (rc, stdout, stderr) each."""
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=CHILD_TIMEOUT_S)
            out.append((p.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        for p in procs:
            p.communicate()
        pytest.fail(f"worker processes did not finish within {CHILD_TIMEOUT_S} s")
    return out


def free_ports(n: int) -> list[int]:
    """n distinct free localhost TCP ports (bound together on port 0, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def assert_integral(fraction: float, n: int) -> None:
    """``fraction`` is k / n for an integer k: a metric over exactly n examples."""
    assert fraction * n == pytest.approx(round(fraction * n), abs=1e-4), (fraction, n)


# --------------------------------------------------------------------------- the spec it reads


def test_base_config_is_a_valid_worker_spec(shards):
    spec = WorkerSpec.from_json(base_config(shards, val_record_shard=[4, 0]))
    assert spec.val_record_shard == (4, 0) and spec.config == TrainConfig(
        workers=1, epochs=3, batch_size=8, image_size=72, width=0.25, learning_rate=0.005, parallel=1)


# --------------------------------------------------------------------------- failures in a child process


@pytest.mark.slow
def test_child_reports_unknown_model_on_one_stderr_line(shards, tmp_path):
    proc, result = start_worker(tmp_path, base_config(shards, model="vgg16"), "bad-model")
    [(rc, _stdout, stderr)] = finish([proc])
    assert rc == 1
    failure = read_outcome(result)  # what its task reads: the typed failure, not the line
    assert isinstance(failure, Failure) and failure.stage == "reading its spec" and failure.error == "ConfigError"
    assert failure.rank == 0 and "'vgg16' is not a known model" in failure.message and not failure.lost
    lines = [ln for ln in stderr.splitlines() if ln.startswith("worker rank")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("worker rank 0 failed while reading its spec: ConfigError: ")
    assert "'vgg16' is not a known model" in lines[0] and "choose one of: alexnet" in lines[0]


@pytest.mark.slow
def test_child_reports_missing_shard_with_stage(shards, tmp_path):
    missing = str(tmp_path / "train-00009-of-00010.tfrecord")
    proc, result = start_worker(tmp_path, base_config(shards, train_files=[missing]), "missing")
    [(rc, _stdout, stderr)] = finish([proc])
    assert rc == 1
    failure = read_outcome(result)
    assert (failure.stage, failure.error, failure.rank) == ("reading data", "TrainingError", 0)
    assert f"worker rank 0 failed while reading data: TrainingError: train shard {missing} does not exist" in stderr


@pytest.mark.slow
def test_child_names_a_corrupt_shard(shards, tmp_path):
    """Data errors inside fit go through pipeline.naming_bad_records: the
    failure line names the shard file, not just TensorFlow's DataLossError."""
    corrupt = tmp_path / "train-00000-of-00001.tfrecord"
    corrupt.write_bytes(np.random.default_rng(5).bytes(4000))
    proc, result = start_worker(tmp_path, base_config(shards, train_files=[str(corrupt)]), "corrupt")
    [(rc, _stdout, stderr)] = finish([proc])
    assert rc == 1
    failure = read_outcome(result)
    assert (failure.stage, failure.error) == ("training (fit)", "ImageError") and str(corrupt) in failure.message
    line = next(ln for ln in stderr.splitlines() if ln.startswith("worker rank"))
    assert line.startswith("worker rank 0 failed while training (fit): ImageError: ")
    assert str(corrupt) in line


@pytest.mark.slow
def test_child_reports_too_small_image_size(shards, tmp_path):
    proc, _ = start_worker(tmp_path, base_config(shards, image_size=64), "small")
    [(rc, _stdout, stderr)] = finish([proc])
    assert rc == 1
    assert "failed while reading its spec: ConfigError: image_size (--image-size) 64 is too small" in stderr
    assert "at least 67" in stderr


# --------------------------------------------------------------------------- real training runs


@pytest.mark.slow
def test_one_worker_run_learns_and_reports(shards, tmp_path):
    cfg = base_config(shards)
    proc, result_path = start_worker(tmp_path, cfg, "one")
    [(rc, stdout, stderr)] = finish([proc])
    assert rc == 0, stderr
    result = json.loads(result_path.read_text())

    assert result["rank"] == 0 and result["workers"] == 1 and result["replicas_in_sync"] == 1
    assert result["steps"] == 24  # 3 epochs x 8 steps
    assert result["train_images"] == 24 * 8
    assert result["train_examples"] == 64
    assert result["timed_epochs"] == 2 and len(result["epoch_seconds"]) == 3
    assert result["images_per_sec"] > 0 and result["train_seconds"] > 0
    assert result["images_per_sec"] == pytest.approx(2 * 8 * 8 / sum(result["epoch_seconds"][1:]), rel=1e-6)
    history = result["history"]
    assert set(history) >= {"loss", "top1", "top5", "xent"}
    assert all(len(v) == 3 for v in history.values())
    assert result["train_loss"] == history["xent"][-1]
    assert result["train_top1"] == history["top1"][-1]

    val = result["val"]
    assert val["images"] == 18
    assert_integral(val["top1"], 18)  # padding rows (6 of 24) counted for nothing
    assert val["top5"] == 1.0  # 4 classes: the label is always among the top 5
    assert val["top1"] > 0.25 + 0.25, result  # chance is 0.25
    assert val["loss"] < math.log(4), result
    assert "val: 18 images" in stdout and "Epoch 3/3" in stdout


@pytest.mark.slow
def test_two_worker_mwms_run_agrees_on_global_metrics(shards, tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs, results = [], []
    for rank in range(2):
        cfg = base_config(
            shards,
            rank=rank,
            workers=2,
            train_files=[shards["train"][rank]],
            train_examples=32,
            val_record_shard=[2, rank],
            val_examples=9,
            steps_per_epoch=4,  # 64 // (8 * 2)
            val_steps=2,  # ceil(9 / 8)
            epochs=2,
        )
        proc, result = start_worker(
            tmp_path, cfg, f"w{rank}", tf_config={"cluster": cluster, "task": {"type": "worker", "index": rank}}
        )
        procs.append(proc)
        results.append(result)
    outcomes = finish(procs)
    for rank, (rc, _stdout, stderr) in enumerate(outcomes):
        assert rc == 0, f"rank {rank}: {stderr}"
    r0, r1 = (json.loads(p.read_text()) for p in results)

    for rank, r in enumerate((r0, r1)):
        assert r["rank"] == rank and r["workers"] == 2 and r["replicas_in_sync"] == 2
        assert r["steps"] == 8 and r["train_images"] == 64
        assert r["val"]["images"] == 18
        assert_integral(r["val"]["top1"], 18)
    # Metrics are all-reduced over both workers: the same on each.
    for key in ("top1", "top5", "loss"):
        assert r0["val"][key] == pytest.approx(r1["val"][key], rel=1e-6), key
    for key in ("top1", "xent"):
        assert r0["history"][key] == pytest.approx(r1["history"][key], rel=1e-6), key
    assert "strategy: multiworker (MultiWorkerMirroredStrategy), 2 worker(s), 2 replica(s) in sync" in outcomes[0][1]
    assert "all-reduce collective AUTO" in outcomes[0][1]


@pytest.mark.slow
def test_two_workers_disagreeing_on_steps_fail_instead_of_hanging(shards, tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for rank in range(2):
        cfg = base_config(
            shards, rank=rank, workers=2, train_files=[shards["train"][rank]], train_examples=32,
            val_record_shard=[2, rank], val_examples=9, val_steps=2, steps_per_epoch=4 + rank,
        )
        procs.append(start_worker(tmp_path, cfg, f"bad{rank}",
                                   tf_config={"cluster": cluster, "task": {"type": "worker", "index": rank}})[0])
    for rc, _stdout, stderr in finish(procs):
        assert rc == 1
        assert ("failed while building the strategy: TrainingError: "
                "workers disagree on steps_per_epoch: {0: 4, 1: 5}") in stderr


@pytest.mark.slow
def test_lone_worker_gives_up_after_startup_timeout(shards, tmp_path):
    """A worker whose peer never starts ends by itself after startup_timeout_s
    (the strategy blocks in C++ holding the GIL and ignores SIGTERM)."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    cfg = base_config(shards, workers=2, val_record_shard=[2, 0], val_examples=9, val_steps=2, startup_timeout=5)
    tf_config = {"cluster": cluster, "task": {"type": "worker", "index": 0}}
    proc, result = start_worker(tmp_path, cfg, "alone", tf_config=tf_config)
    [(rc, stdout, stderr)] = finish([proc])
    assert rc == 1
    failure = read_outcome(result)  # written before the wait: the faulthandler's exit runs no Python code
    assert failure.lost and failure.stage == "building the strategy" and "--startup-timeout 5 s" in failure.message
    assert "strategy: waiting for 2 worker(s) (at most 5 s)" in stdout
    assert "Timeout (0:00:05)!" in stderr
    assert "collective_all_reduce_strategy.py" in stderr  # the stack shows where it waited


# --------------------------------------------------------------------------- strategies
@pytest.mark.slow
@pytest.mark.parametrize("strategy, ops, kind, all_reduce", [
    ("mirrored", "reduction-to-one", "MirroredStrategy", "ReductionToOneDevice"),
    ("mirrored", "auto", "MirroredStrategy", "auto"),
    ("default", "auto", "the default strategy", "none (one device)"),
    ("multiworker", "ring", "MultiWorkerMirroredStrategy", "collective RING"),
])
def test_each_strategy_trains_one_worker_on_cpu(shards, tmp_path, strategy, ops, kind, all_reduce):
    """One epoch per strategy; the one-worker strategies also get a stray 2-worker TF_CONFIG, which they drop."""
    cfg = base_config(shards, epochs=1, strategy=strategy, cross_device_ops=ops)
    stray = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}
    proc, result_path = start_worker(tmp_path, cfg, strategy, tf_config=None if strategy == "multiworker" else stray)
    [(rc, stdout, stderr)] = finish([proc])
    assert rc == 0, stderr
    result = json.loads(result_path.read_text())
    assert result["strategy"] == strategy and result["all_reduce"].startswith(all_reduce)
    assert result["workers"] == 1 and result["replicas_in_sync"] == 1
    assert len(result["devices"]) == 1 and result["devices"][0].endswith("CPU:0")
    assert result["steps"] == 8 and result["val"]["images"] == 18
    assert f"strategy: {strategy} ({kind}), 1 worker(s), 1 replica(s) in sync on " in stdout
    assert f"all-reduce {all_reduce}" in stdout


@pytest.mark.slow
@pytest.mark.parametrize("jit", [False, True])
def test_lighting_shifts_travel_beside_the_uint8_batches_into_the_step(shards, tmp_path, jit):
    """--lighting: the dataset's x is (uint8 images, float32 shifts), through MultiWorkerMirroredStrategy's
    distributed dataset into the train step, which normalizes it (with XLA: inside the compiled step)."""
    cfg = base_config(shards, epochs=1, lighting=0.1, jit_compile=jit)
    proc, result_path = start_worker(tmp_path, cfg, f"lighting-{jit}")
    [(rc, _stdout, stderr)] = finish([proc])
    assert rc == 0, stderr
    result = json.loads(result_path.read_text())
    assert result["steps"] == 8 and result["val"]["images"] == 18
    assert all(math.isfinite(v) for v in result["history"]["xent"])


@pytest.mark.slow
def test_lars_under_float16_loss_scaling_logs_the_scheduled_rate_and_saves_the_model(shards, tmp_path):
    """The worker's recipe wiring: LARS inside a LossScaleOptimizer (mixed_float16) with a warm-up + cosine
    schedule trains; the epoch lines read the rate through both wrappers; the saved model.keras loads back
    (float32 logits, no weight-decay term) for evaluate/predict."""
    from spark_imagenet.training.job.schedules import Schedule

    from spark_imagenet.training.job.outputs import LOCAL_OUTPUT_DIR, MODEL_FILE

    cfg = base_config(shards, epochs=2, optimizer="lars", precision="mixed_float16", learning_rate=2.0,
                      lr_schedule="cosine", warmup_epochs=1.0, weight_decay=5e-4, label_smoothing=0.1,
                      output=str(tmp_path / "published"))
    proc, result_path = start_worker(tmp_path, cfg, "lars")
    [(rc, stdout, stderr)] = finish([proc])
    assert rc == 0, stderr
    result = json.loads(result_path.read_text())
    assert all(math.isfinite(v) for v in result["history"]["loss"]) and result["steps"] == 16
    schedule = Schedule(kind="cosine", base_lr=2.0, global_batch=8, steps_per_epoch=8, epochs=2, scaling="none",
                        warmup_epochs=1.0)
    # optimizer.learning_rate holds the rate of each epoch's last step (7 and 15)
    assert f"lr {schedule.at(7):.4g}," in stdout and f"lr {schedule.at(15):.4g}," in stdout
    import tf_keras as keras

    model = keras.models.load_model(str(tmp_path / LOCAL_OUTPUT_DIR / MODEL_FILE), compile=False)
    assert model.output.dtype == tf.float32 and model.losses == []
    assert model.get_layer("conv1").compute_dtype == "float16"


@pytest.mark.slow
def test_mirrored_nccl_without_gpus_is_a_clear_error(shards, tmp_path):
    cfg = base_config(shards, epochs=1, strategy="mirrored", cross_device_ops="nccl")
    proc, _ = start_worker(tmp_path, cfg, "nccl")
    [(rc, stdout, stderr)] = finish([proc])
    assert rc == 1
    assert "failed while building the strategy: TrainingError: cross_device_ops (--cross-device-ops) nccl needs " \
           "GPUs, but this worker sees none" in stderr


# TensorFlow 2.21's texts (docs/design.md, 'No hangs'): a worker that stopped sending heartbeats, and the chief
# (the coordination service's leader) that stopped answering them.
UNHEALTHY = ("{{function_node __wrapped__CollectiveReduceV2}} Collective ops is aborted by: Error reported from "
             "/job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):\n"
             "/job:worker/replica:0/task:1\nThe tasks have crashed. Check the task logs for an earlier error.")
RESET = ("{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/replica:0/task:0/"
         "device:CPU:0}} Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error "
         "information from remote target /job:worker/replica:0/task:1 while calling "
         "/tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received from peer  {grpc_message:\"recvmsg:Connection "
         "reset by peer\", grpc_status:14}")
LEADER_GONE = ("Collective ops is aborted by: Deadline Exceeded\n\nRPC: /tensorflow.CoordinationService/Heartbeat\n"
               "The error could be from a previous operation. Restart your program to reset.")


def test_the_failure_names_the_worker_that_stopped_sending_heartbeats():
    """The worker classifies TensorFlow's own exception where it catches it; the task reads the Failure."""
    from spark_imagenet.errors import TrainingError
    from spark_imagenet.training.job.outcome import LostPeer
    from spark_imagenet.training.worker.main import failure_of, lost_peers

    peers = ["10.0.0.1:4000", "10.0.0.2:4001"]
    assert lost_peers(UNHEALTHY, peers) == (
        LostPeer(1, "10.0.0.2:4001", "stopped sending heartbeats (stopped, killed or unreachable)"),)
    [chief] = lost_peers(LEADER_GONE, peers)
    assert chief.rank == 0 and chief.address == "10.0.0.1:4000" and "coordination service" in chief.why
    assert lost_peers("Socket closed", peers) == ()
    # a peer killed mid-collective: gRPC names it as the remote target of the reset connection
    assert lost_peers(RESET, peers) == (
        LostPeer(1, "10.0.0.2:4001", "closed its connection (killed, or its process ended)"),)
    assert lost_peers(RESET.replace("Connection reset by peer", "Deadline Exceeded"), peers) == ()
    failure = failure_of(tf.errors.UnavailableError(None, None, UNHEALTHY), "training (fit)", 0, peers)
    assert failure.lost and failure.rank == 0 and failure.lost_peers == lost_peers(UNHEALTHY, peers)
    assert failure.message.startswith("UnavailableError: ")
    assert failure.describe().startswith("rank 0 on None: lost its peer: rank 1 (10.0.0.2:4001) stopped sending")
    # without a named peer the hint stays general
    unnamed = failure_of(tf.errors.UnavailableError(None, None, "Socket closed"), "training (fit)", 0)
    assert unnamed.lost and unnamed.message.endswith("see the other workers' messages)")
    bad = failure_of(tf.errors.InvalidArgumentError(None, None, "logits"), "training (fit)", 0)
    assert not bad.lost and bad.error == "TrainingError" and bad.message == "InvalidArgumentError: logits"
    own = failure_of(TrainingError("workers disagree"), "building the strategy", 1)
    assert own.error == "TrainingError" and own.message == "TrainingError: workers disagree"
