"""Lost workers on local[2]: checkpoints and resume after a SIGKILL, a worker lost at start-up, a stopped worker.

The faults are real: the test finds a rank's TensorFlow worker process (a fork of the host's fork server) by the
worker spec in its folder and sends it SIGKILL or SIGSTOP from outside, as a dying machine or a stuck process would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from data_util import small_bucket
from spark_imagenet.errors import ConfigError, WorkerLost
from spark_imagenet.logs import collect
from spark_imagenet.training.driver.launch import train
from spark_imagenet.training.job.config import TrainConfig

pytestmark = pytest.mark.slow

FORK_SERVER_MODULE = b"spark_imagenet.training.worker.forkserver"
# 4 classes x 20 train images, 2 workers of batch 4: 10 steps per epoch, long enough to be killed inside
# a warm-up and cosine schedule: equal weights after a resume also show the schedule continued at the right step
SMALL = {"batch_size": 4, "image_size": 72, "width": 0.25, "learning_rate": 0.01, "epochs": 3,
         "deterministic": True, "parallel": 1, "lr_schedule": "cosine", "warmup_epochs": 1.0}


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    return small_bucket(tmp_path_factory.mktemp("faults"), train_per_class=20)


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _fork_server_owner(pid: int) -> int | None:
    """The ``--owner`` of ``pid`` when it is a TensorFlow fork server (the executor it lives as long as), else None."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if cmdline[1:3] != [b"-m", FORK_SERVER_MODULE] or b"--owner" not in cmdline:
        return None
    return int(cmdline[cmdline.index(b"--owner") + 1])


def _ours(pid: int) -> bool:
    """Whether ``pid`` descends from this test process (its Spark JVM's workers do; nobody else's do), a fork
    server counting as a child of the executor it serves (it outlives the Python worker that started it)."""
    me = os.getpid()
    for _ in range(64):
        owner = _fork_server_owner(pid)
        pid = owner if owner is not None else _parent(pid)
        if pid == me:
            return True
        if pid <= 1:
            return False
    return False


def worker_pids(rank: int) -> list[int]:
    """The pids of this test session's TensorFlow worker processes of ``rank``: forks of a fork server of ours whose
    folder (their working folder) holds a worker spec of ``rank`` (a fork's command line and environment are its
    server's; other jobs on the machine are never touched)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or _fork_server_owner(_parent(int(entry.name))) is None:
            continue
        if _ours(int(entry.name)) and _spec_rank(int(entry.name)) == rank:
            found.append(int(entry.name))
    return found


def _spec_rank(pid: int) -> int | None:
    """The rank in the ``worker.json`` of ``pid``'s working folder (its task's folder), or None (not written yet)."""
    try:
        return json.loads(Path(f"/proc/{pid}/cwd/worker.json").read_text()).get("rank")
    except (OSError, ValueError, AttributeError):
        return None


class Saboteur(threading.Thread):
    """Sends ``sig`` once to rank ``rank``'s TensorFlow process when ``ready()`` first holds; records the pid,
    then calls ``then()`` when given."""

    def __init__(self, rank: int, sig: int, ready, then=None) -> None:
        super().__init__(daemon=True)
        self.rank, self.sig, self.ready, self.then = rank, sig, ready, then
        self.victims: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = worker_pids(self.rank)
            if pids and self.ready():
                for pid in pids:
                    os.kill(pid, self.sig)
                self.victims = pids
                if self.then is not None:
                    self.then()
                return
            time.sleep(0.02)


def _weights(output: Path) -> list[np.ndarray]:
    import tf_keras as keras

    return keras.models.load_model(output / "model.keras", compile=False).get_weights()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def none_left(wait_s: float = 60.0) -> bool:
    """Whether every TensorFlow worker process is gone, waiting up to ``wait_s`` for Spark to end the tasks."""
    deadline = time.monotonic() + wait_s
    while worker_pids(0) or worker_pids(1):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture(scope="module")
def uninterrupted(spark, bucket, tmp_path_factory):
    """The uninterrupted run (no checkpoints) the resumed runs are compared with: its results and --output."""
    root = tmp_path_factory.mktemp("plain")
    result = train(spark, str(bucket), TrainConfig(workers=2, cache=root / "cache", output=str(root / "out"), **SMALL))
    return result, root / "out"


@dataclasses.dataclass(frozen=True)
class KilledRun:
    """The module's run killed in epoch 2 with gs:// checkpoints and MLflow tracking, as it was when it ended.

    Attributes:
        out: its result.
        lines: its log lines.
        output: its --output folder.
        names: the top-level names in its --checkpoint-dir (a gs:// folder on fake-gcs-server).
        copy: a local copy of that folder (the later tests resume from it or size a disk with it).
        mlflow_uri: the tracking server's URI.
        run_file: mlflow-run.json of the checkpoint folder, read.
        runs: the experiment's MLflow runs then.
        xent_steps: the steps of the run's xent series then.
    """

    out: dict
    lines: list[str]
    output: Path
    names: set[str]
    copy: Path
    mlflow_uri: str
    run_file: dict
    runs: list
    xent_steps: list[int]


def _runs(client, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


@pytest.fixture(scope="module")
def killed_in_epoch_2(spark, bucket, tmp_path_factory, gcs_emulator, mlflow_server) -> KilledRun:
    """Train with --checkpoint-dir gs://... (fake-gcs-server: commits and the restore go through the storage layer
    over HTTP) and MLflow tracking while a Saboteur SIGKILLs rank 1 once epoch 1's checkpoint is committed."""
    from spark_imagenet.storage import open_storage

    root = tmp_path_factory.mktemp("killed")
    name = f"killed-in-epoch-2-{uuid.uuid4().hex[:6]}"
    gcs_emulator.create_bucket(name)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
        url = f"gs://{name}/runs/ckpt"
        storage = open_storage(url)
        killer = Saboteur(1, signal.SIGKILL, lambda: storage.exists("epoch-000001/checkpoint.json"))
        killer.start()
        try:
            with collect() as lines:
                out = train(spark, str(bucket), TrainConfig(workers=2, cache=root / "cache", output=str(root / "out"),
                                                            checkpoint_dir=url, mlflow_tracking_uri=mlflow_server.uri,
                                                            mlflow_experiment="killed", **SMALL))
        finally:
            killer.stop.set()
        assert killer.victims, "\n".join(lines)
        objects = storage.list()
        for o in objects:
            (root / "copy" / o.name).parent.mkdir(parents=True, exist_ok=True)
            storage.get_file(o.name, root / "copy" / o.name)
        run_file = json.loads(storage.read_bytes("mlflow-run.json"))
    client = mlflow_server.client()
    runs = _runs(client, "killed")
    steps = sorted({m.step for r in runs[:1] for m in client.get_metric_history(r.info.run_id, "xent")})
    return KilledRun(out, lines, root / "out", {o.name.split("/")[0] for o in objects}, root / "copy",
                     mlflow_server.uri, run_file, runs, steps)


def test_a_worker_killed_in_epoch_2_resumes_from_the_checkpoint_of_epoch_1(killed_in_epoch_2, uninterrupted):
    """SIGKILL of rank 1's TensorFlow process during epoch 2 of 3 (checkpoints in a gs:// bucket): the driver
    launches the stage again, every worker restores the checkpoint of epoch 1, epochs 2 and 3 are trained once
    more, and the final weights equal those of an uninterrupted run (deterministic mode: the same batches, dropout
    masks and ops); the newest two checkpoints are kept; the relaunch logs to the same MLflow run
    (mlflow-run.json in --checkpoint-dir), which ends FINISHED with every epoch once."""
    run = killed_in_epoch_2
    plain, plain_output = uninterrupted
    text = "\n".join(run.lines)
    assert run.out.restarts == 1, text
    assert "warning: a worker was lost: rank 1 on" in text and "SIGKILL" in text, text
    assert "launching the barrier stage again (restart 1 of 2)" in text, text
    assert "resuming at epoch 2 of 3 from the checkpoint of epoch 1 " in text, text
    assert len(run.out.history["xent"]) == 3  # epoch 1 from the checkpoint, epochs 2 and 3 trained again
    assert run.out.history["xent"] == pytest.approx(plain.history["xent"], rel=1e-6)
    for a, b in zip(_weights(plain_output), _weights(run.output), strict=True):
        np.testing.assert_array_equal(a, b)
    assert run.out.val == plain.val
    assert run.names == {"epoch-000002", "epoch-000003", "mlflow-run.json"}  # the newest two checkpoints kept
    assert run.run_file["uri"] == run.mlflow_uri
    (tracked,) = run.runs
    assert tracked.info.status == "FINISHED" and run.xent_steps == [1, 2, 3]


def test_a_checkpoint_of_another_shape_is_refused_and_a_longer_run_extends_it(spark, bucket, tmp_path,
                                                                            killed_in_epoch_2, mlflow_server):
    """A checkpoint written by a job of another image size is refused before any task starts; a job of more
    --epochs resumes from it, saying its cosine schedule is stretched, keeps --keep-checkpoints of them, and
    continues the checkpoints' MLflow run (a local copy of the killed run's gs:// folder)."""
    import shutil

    from spark_imagenet.errors import ConfigError

    ckpt = tmp_path / "ckpt"
    shutil.copytree(killed_in_epoch_2.copy, ckpt)
    with pytest.raises(ConfigError) as e:
        train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", checkpoint_dir=str(ckpt),
                                              **{**SMALL, "image_size": 80}))
    assert "--image-size" in str(e.value) and "72" in str(e.value) and "80" in str(e.value)
    # a longer run extends it: the driver says the cosine schedule is stretched; only --keep-checkpoints 1 stays
    with collect() as lines:
        out = train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", checkpoint_dir=str(ckpt),
                                                    mlflow_tracking_uri=mlflow_server.uri, mlflow_experiment="killed",
                                                    **{**SMALL, "epochs": 4, "keep_checkpoints": 1}))
    text = "\n".join(lines)
    assert "resuming at epoch 4 of 4 from the checkpoint of epoch 3 " in text, text
    assert "lr: --epochs 4 instead of the checkpoint's 3 stretches the cosine schedule to 4 epochs" in text, text
    assert len(out.history["xent"]) == 4
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-000004", "mlflow-run.json"]
    client = mlflow_server.client()
    (before,) = killed_in_epoch_2.runs
    (again,) = _runs(client, "killed")  # still one run
    assert again.info.run_id == before.info.run_id and again.info.status == "FINISHED"
    assert sorted({m.step for m in client.get_metric_history(again.info.run_id, "xent")}) == [1, 2, 3, 4]
    # every setting that differs from the first job's, epochs among them (MLflow keeps a param's first value)
    assert again.data.tags["spark_imagenet.changed_on_resume"] == (
        f"cache={tmp_path / 'cache'}, checkpoint_dir={ckpt}, epochs=4, keep_checkpoints=1, output=None")


def test_a_worker_lost_at_start_up_fails_the_job_naming_its_rank(spark, bucket, tmp_path):
    """Rank 1's TensorFlow process dies as soon as it starts; without restarts the job fails at once with
    WorkerLost naming rank 1 and its host, and no TensorFlow process is left."""
    killer = Saboteur(1, signal.SIGKILL, lambda: True)
    killer.start()
    try:
        with pytest.raises(WorkerLost) as e:
            train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", max_restarts=0, **SMALL))
    finally:
        killer.stop.set()
    assert killer.victims
    assert "rank 1 on " in str(e.value) and "SIGKILL" in str(e.value)
    assert none_left()


def test_a_stopped_worker_ends_the_job_within_the_step_timeout_naming_it(spark, bucket, tmp_path):
    """Rank 1's TensorFlow process is SIGSTOPped in the middle of training: rank 0's step watchdog gives up
    before --step-timeout ends (TensorFlow's heartbeats or the step watchdog), names rank 1 and its address, and
    nothing is left running."""
    ckpt = tmp_path / "ckpt"
    stopper = Saboteur(1, signal.SIGSTOP, (ckpt / "epoch-000001" / "checkpoint.json").exists)
    stopper.start()
    try:
        with pytest.raises(WorkerLost) as e:
            train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", checkpoint_dir=str(ckpt),
                                                  max_restarts=0, step_timeout=20, **SMALL))
    finally:
        stopper.stop.set()
        for pid in stopper.victims:  # a stopped process is still killable; the job must have done it already
            if not none_left() and not _gone(pid):
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the stopped worker {pid} was left running")
    message = str(e.value)
    assert stopper.victims
    # TensorFlow's coordination service notices the missing heartbeats first (about 10 s); a peer that still
    # sends them but is stuck in a step is found by the step watchdog (tests/test_watchdog.py)
    first = message.splitlines()[0]
    assert re.search(r"^rank 0 on \S+: lost its peer: rank 1 \([^ ]+:\d+\) (stopped sending heartbeats|does not "
                     r"answer) \([^)]*\); the TensorFlow process", first), message
    [peer] = e.value.failure.lost_peers  # the same, typed: what the worker wrote, not parsed from its output
    assert peer.rank == 1 and peer.address and e.value.failure.rank == 0 and e.value.failure.lost
    assert none_left()


def test_a_worker_killed_inside_an_epoch_resumes_at_the_step_of_the_last_checkpoint(spark, bucket, tmp_path,
                                                                                   uninterrupted):
    """--checkpoint-every 4 (10 steps per epoch): rank 1 is SIGKILLed once the checkpoint 6 steps into epoch 2
    (global step 16) is committed; the relaunch resumes inside epoch 2 (the rest of its batches, not the whole
    epoch again) and the final weights equal the uninterrupted run's (deterministic mode). The checkpoint folder
    as the kill left it (epoch 1's end kept beside the checkpoints inside epoch 2), given to a job on one worker
    with the same global batch, is refused before Spark starts, naming both ways on."""
    ckpt, at_kill = tmp_path / "ckpt", tmp_path / "at-the-kill"

    def keep_a_copy() -> None:  # nothing is committed or pruned until the relaunch trains
        for name in ("epoch-000001", "epoch-000001-000006"):
            shutil.copytree(ckpt / name, at_kill / name)

    killer = Saboteur(1, signal.SIGKILL, (ckpt / "epoch-000001-000006" / "checkpoint.json").exists, keep_a_copy)
    killer.start()
    try:
        with collect() as lines:
            out = train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache",
                                                        output=str(tmp_path / "resumed"), checkpoint_dir=str(ckpt),
                                                        checkpoint_every=4, **SMALL))
    finally:
        killer.stop.set()
    text = "\n".join(lines)
    assert killer.victims and out.restarts == 1, text
    resumed = re.search(r"resuming at epoch (\d) of 3 from the checkpoint of epoch (\d) \(step (\d+),", text)
    assert resumed, text
    step = int(resumed.group(3))
    assert step >= 16 and (step % 10 != 0 or step == 20), text  # inside epoch 2, or the end of it if the kill was late
    assert [w.steps for w in out.per_worker] == [30 - step] * 2  # the rest of epoch 2, then epoch 3
    plain, plain_output = uninterrupted
    for a, b in zip(_weights(plain_output), _weights(tmp_path / "resumed"), strict=True):
        np.testing.assert_array_equal(a, b)
    assert out.val == plain.val and len(out.history["xent"]) == 3
    assert out.history["xent"][2] == pytest.approx(plain.history["xent"][2], rel=1e-6)  # epoch 3: whole
    _another_count_is_refused_inside_the_epoch(spark, bucket, tmp_path, at_kill)


def _another_count_is_refused_inside_the_epoch(spark, bucket, tmp_path, at_kill: Path) -> None:
    """One worker of batch 8 (the global batch kept) from the checkpoint 6 steps into epoch 2 of two workers: refused
    by the plan, before run_job (no session check, lease or Spark job), with the folder, the count and both ways."""
    from spark_imagenet.training.driver import launch

    with pytest.MonkeyPatch.context() as patch, pytest.raises(ConfigError) as e:
        patch.setattr(launch, "run_job", lambda *a: pytest.fail("the job reached Spark"))
        train(spark, str(bucket), TrainConfig(workers=1, cache=tmp_path / "cache", checkpoint_dir=str(at_kill),
                                              checkpoint_every=4, **{**SMALL, "batch_size": 8}))
    message = str(e.value)
    for part in (f"--checkpoint-dir {at_kill}, epoch-000001-000006: this job cannot resume", "written 6 step(s) into "
                 "epoch 2 by 2 worker(s)", "resume on 2 worker(s) with --workers 2 --batch-size 4 to finish epoch 2 "
                 "exactly", "or resume on any worker count from epoch-000001, the newest checkpoint at an epoch's end",
                 "remove the checkpoint folders newer than epoch-000001"):
        assert part in message, message
    assert sorted(p.name for p in at_kill.iterdir()) == ["epoch-000001", "epoch-000001-000006"]


def test_min_workers_goes_on_with_fewer_when_a_slot_stays_taken(spark, bucket, tmp_path):
    """--min-workers 1: rank 1 is SIGKILLed after epoch 1 while another job takes one of the two slots; the
    relaunch waits --regain-timeout for two free slots, then goes on with one worker (batch 8, the global batch
    kept) from the checkpoint, and finishes."""
    sc = spark.sparkContext
    ckpt = tmp_path / "ckpt"

    def hold_a_slot() -> None:
        sc.setJobGroup("slot-hog", "holds one task slot", interruptOnCancel=True)
        with contextlib.suppress(Exception):  # cancelled at the end
            sc.parallelize([0], 1).foreach(lambda _: time.sleep(60))

    hog = threading.Thread(target=hold_a_slot, daemon=True)

    def ready() -> bool:
        if not (ckpt / "epoch-000001" / "checkpoint.json").exists():
            return False
        if not hog.is_alive():
            hog.start()  # queued behind the barrier tasks: it gets the first slot they free
        tracker = sc.statusTracker()
        stages = {s for j in tracker.getJobIdsForGroup("slot-hog") for s in (tracker.getJobInfo(j) or
                                                                              type("", (), {"stageIds": ()})).stageIds}
        return bool(stages & set(tracker.getActiveStageIds()))  # its stage waits for a slot: now the kill

    killer = Saboteur(1, signal.SIGKILL, ready)
    killer.start()
    try:
        with collect() as lines:
            out = train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", checkpoint_dir=str(ckpt),
                                                        min_workers=1, regain_timeout=5.0, **SMALL))
    finally:
        killer.stop.set()
        sc.cancelJobGroup("slot-hog")
    text = "\n".join(lines)
    assert killer.victims and out.restarts == 1, text
    assert ("warning: elastic: 1 of 2 barrier slots free after 5 s: going on with 1 worker(s), batch 8 each (the "
            "global batch 8 kept), from the latest checkpoint") in text, text
    resumed = re.search(r"resuming at epoch (\d) of 3 from the checkpoint of epoch (\d) ", text)
    assert resumed and resumed.group(2) in ("1", "2"), text  # epoch 2 when the kill came late
    assert out.workers == 1 and len(out.per_worker) == 1 and len(out.history["xent"]) == 3
    assert out.per_worker[0].steps == (3 - int(resumed.group(2))) * 10  # 10 steps an epoch, as on two


def test_a_checkpoint_folder_with_room_for_two_checkpoints_finishes_the_run(spark, bucket, tmp_path,
                                                                            killed_in_epoch_2):
    """--checkpoint-dir on a tmpfs with room for two of this job's checkpoints, not three: epoch 3's commit
    runs out of room, the oldest checkpoint goes, the commit is tried again; the run finishes with the last
    two checkpoints."""
    from disk_util import small_tmpfs
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.job.checkpoints import latest

    probe = killed_in_epoch_2.copy / "epoch-000003"  # one checkpoint of this job, to size the disk
    size = sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())
    with small_tmpfs(tmp_path / "disk", int(size * 2.5)) as disk, collect() as lines:
        out = train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache",
                                                    checkpoint_dir=str(disk / "ck"), **SMALL))
        assert len(out.history["xent"]) == 3 and out.restarts == 0
        assert sorted(p.name for p in (disk / "ck").iterdir()) == ["epoch-000002", "epoch-000003"]
        assert latest(open_storage(disk / "ck"))[1].epoch == 3
        assert out.checkpoint == f"{disk / 'ck'}/epoch-000003", "\n".join(lines)
