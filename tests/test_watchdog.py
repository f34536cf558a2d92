"""The step watchdog (spark_imagenet.training.worker.watchdog): deadline, feeding, pausing, peer diagnosis, the default
exit; and, marked slow, two real MultiWorkerMirroredStrategy workers, one SIGSTOPped or stuck."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cluster_util import free_ports
from spark_imagenet.training.worker import watchdog as wd
from spark_imagenet.training.worker.watchdog import ALL_ANSWER, EXIT_STEP_TIMEOUT, NO_ANSWER, StepWatchdog

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(timeout_s: float = 10.0, **kwargs):
    """A watchdog on a fake clock that polls every 10 ms; returns (watchdog, clock, messages, fired_event)."""
    clock, messages, fired = FakeClock(), [], threading.Event()

    def on_expire(message: str) -> None:
        messages.append(message)
        fired.set()

    kwargs.setdefault("peers", [])
    dog = StepWatchdog(timeout_s, on_expire=on_expire, clock=clock, poll_s=0.01, **kwargs)
    return dog, clock, messages, fired


def test_fires_once_when_not_fed():
    dog, clock, messages, fired = make(10.0, rank=2)
    dog.on_train_begin()
    dog.on_epoch_begin(0)
    dog.on_train_batch_end(4)
    clock.now += 11
    assert fired.wait(10)
    time.sleep(0.2)  # the thread has stopped: no second call
    clock.now += 100
    time.sleep(0.1)
    assert messages == ["worker rank 2: no training step finished in 11 s (--step-timeout 10); no peer to probe "
                        "(one worker): the step itself is stuck on this worker; last progress: train batch 5 of "
                        "epoch 1 finished"]
    assert dog.fired
    dog.on_train_end()


def test_never_fires_when_fed_regularly():
    dog, clock, messages, _ = make(10.0)
    dog.on_train_begin()
    for i in range(40):
        clock.now += 4
        hook = (dog.on_train_batch_end, dog.on_test_batch_end, dog.on_epoch_end, lambda i: dog.feed())[i % 4]
        hook(i)
        time.sleep(0.01)
    dog.on_train_end()
    assert messages == [] and not dog.fired


def test_never_fires_after_train_end():
    dog, clock, messages, _ = make(10.0)
    dog.on_train_begin()
    dog.on_train_end()
    assert dog._thread is None
    clock.now += 1000
    time.sleep(0.1)
    assert messages == [] and dog.expired() is None


@pytest.mark.parametrize("timeout_s", [0, -1])
def test_timeout_zero_never_arms(timeout_s):
    threads = threading.active_count()
    dog, clock, messages, _ = make(timeout_s)
    dog.on_train_begin()
    dog.on_test_begin()
    assert not dog.enabled and dog._thread is None and threading.active_count() == threads
    clock.now += 10 ** 6
    time.sleep(0.05)
    assert messages == [] and dog.expired() is None
    dog.on_train_end()


def test_pause_keeps_it_quiet_and_restarts_the_deadline():
    dog, clock, messages, fired = make(10.0)
    dog.on_train_begin()
    with dog.pause():
        with dog.pause():
            clock.now += 500
            time.sleep(0.05)
        clock.now += 500
        time.sleep(0.05)
    assert messages == []
    clock.now += 9  # the deadline restarted when the pause ended
    time.sleep(0.05)
    assert messages == []
    clock.now += 2
    assert fired.wait(10)
    assert len(messages) == 1
    dog.on_train_end()


def test_evaluate_outside_fit_arms_and_disarms():
    dog, clock, messages, fired = make(10.0)
    dog.on_test_begin()
    assert dog._thread is not None
    dog.on_test_batch_end(0)
    dog.on_test_end()
    assert dog._thread is None
    dog.on_train_begin()  # inside fit, the validation hooks neither arm nor disarm
    dog.on_test_begin()
    dog.on_test_end()
    assert dog._thread is not None
    clock.now += 20
    assert fired.wait(10)
    assert messages[0].endswith("last progress: evaluation ended")


def test_message_names_the_peer_that_does_not_answer():
    probed = []

    def probe(task, timeout_s):
        probed.append((task, timeout_s))
        if task.endswith("task:0"):
            raise RuntimeError("Deadline Exceeded")

    dog, clock, messages, fired = make(30.0, rank=1, peers=["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"],
                                       probe=probe, probe_timeout_s=0.5)
    dog.on_train_begin()
    clock.now += 31
    assert fired.wait(10)
    assert messages == ["worker rank 1: no training step finished in 31 s (--step-timeout 30); rank 0 (10.0.0.1:2222) "
                        f"{NO_ANSWER}; last progress: training began"]
    assert sorted(probed) == [("/job:worker/replica:0/task:0", 0.5), ("/job:worker/replica:0/task:2", 0.5)]
    dog.on_train_end()


def test_probe_peers():
    peers = ["a:1", "b:2", "c:3", "d:4"]

    class FailedPreconditionError(Exception):
        pass

    def probe(task, timeout_s):
        index = int(task.rsplit(":", 1)[1])
        if index == 1:
            raise ConnectionError("Unavailable")
        if index == 2:
            raise FailedPreconditionError("restarted")
        if index == 3:
            time.sleep(30)  # never answers within the bound: counts as not answering

    text = wd.probe_peers(peers, 0, 0.1, probe)
    assert text == (f"rank 1 (b:2) {NO_ANSWER}, rank 2 (c:3) has restarted (it is another process now), "
                    f"rank 3 (d:4) {NO_ANSWER}")
    assert wd.probe_peers(peers, 3, 1.0, lambda task, t: None) == ALL_ANSWER
    assert wd.probe_peers(["a:1"], 0, 1.0, probe).startswith("no peer to probe")
    lost = wd.probe_lost_peers(peers, 0, 0.1, probe)
    assert [(p.rank, p.address) for p in lost] == [(1, "b:2"), (2, "c:3"), (3, "d:4")]
    assert lost[0].why == NO_ANSWER and lost[1].why.startswith("has restarted")


def test_a_failing_diagnosis_still_gives_the_message(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(wd, "probe_lost_peers", broken)
    dog, clock, messages, fired = make(5.0, peers=["a:1", "b:2"])
    dog.arm()
    clock.now += 6
    assert fired.wait(10)
    assert "the peers could not be probed (ValueError: boom)" in messages[0]
    dog.disarm()


def test_peers_and_task_names_from_tf_config():
    workers_only = json.dumps({"cluster": {"worker": ["h0:1", "h1:2"]}, "task": {"type": "worker", "index": 1}})
    assert wd.peers_from_tf_config(workers_only) == ["h0:1", "h1:2"]
    assert wd._task_name(["h0:1", "h1:2"], 1, workers_only) == "/job:worker/replica:0/task:1"
    with_chief = json.dumps({"cluster": {"chief": ["c:9"], "worker": ["h0:1"]}, "task": {"type": "chief", "index": 0}})
    assert wd.peers_from_tf_config(with_chief) == ["c:9", "h0:1"]
    assert wd._task_name(["c:9", "h0:1"], 0, with_chief) == "/job:chief/replica:0/task:0"
    assert wd._task_name(["c:9", "h0:1"], 1, with_chief) == "/job:worker/replica:0/task:0"
    assert wd.peers_from_tf_config("") == [] and wd.peers_from_tf_config("not json") == []


def test_keras_fit_feeds_it_and_a_stuck_batch_fires_it():
    import numpy as np
    import tf_keras as keras

    model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((32, 3), "float32"), np.zeros((32, 2), "float32")
    messages = []
    dog = StepWatchdog(30.0, on_expire=messages.append)
    model.fit(x, y, batch_size=4, epochs=2, validation_data=(x, y), verbose=0, callbacks=[dog])
    model.evaluate(x, y, verbose=0, callbacks=[dog])
    assert messages == [] and dog._thread is None

    class Stuck(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 3:
                time.sleep(3.0)  # a step that takes far longer than the watchdog's timeout

    # On a starved CPU (a CI lane of low priority) an ordinary step can outlast the timeout too; such a run
    # fires before batch 3 and is tried again (at most three runs), so what is checked is the stuck batch's line.
    for _ in range(3):
        messages.clear()
        fired = threading.Event()
        dog = StepWatchdog(0.5, on_expire=lambda m: (messages.append(m), fired.set()), poll_s=0.05)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[Stuck(), dog])
        assert fired.is_set() and len(messages) == 1
        assert messages[0].startswith("worker rank 0: no training step finished in ")
        if messages[0].endswith("last progress: train batch 3 of epoch 1 finished"):
            break
    assert messages[0].endswith("last progress: train batch 3 of epoch 1 finished"), messages


@pytest.mark.slow
def test_default_expiry_prints_one_line_and_exits_3():
    code = ("import time\nfrom spark_imagenet.training.worker.watchdog import StepWatchdog\n"
            "StepWatchdog(0.2, rank=3).arm()\ntime.sleep(60)\nprint('not reached')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert p.returncode == EXIT_STEP_TIMEOUT == 3
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("worker rank 3:")]
    assert len(lines) == 1, p.stderr
    assert "(--step-timeout 0.2); no peer to probe" in lines[0]
    assert "not reached" not in p.stdout


# Two real MWMS workers -----------------------------------------------------------------------------------------------

#: One worker of two: a tiny model trained for ever on zeros, one "STEP n" line per batch on stdout.
#: argv: rank, the two ports, the watchdog's timeout, the batch at which rank 1 sleeps for ever (-1: never).
#: TensorFlow's coordination service ends the job by itself about 10 s after a peer stops sending heartbeats
#: (SIGSTOP, SIGKILL): its heartbeat timeout is raised to 10 minutes so that only the watchdog can end it.
CHILD = textwrap.dedent("""
    import json, os, sys, time
    rank, ports, timeout, stuck_at = int(sys.argv[1]), sys.argv[2].split(","), float(sys.argv[3]), int(sys.argv[4])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    import tensorflow as tf
    import tf_keras as keras
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context
    from spark_imagenet.training.worker.watchdog import StepWatchdog, peers_from_tf_config

    context.context().configure_coordination_service(
        service_type="standalone", service_leader="/job:worker/replica:0/task:0", heartbeat_timeout_in_ms=600_000,
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=2)])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(4, input_shape=(3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensors((tf.zeros([3]), tf.zeros([1]))).repeat().batch(4).with_options(options)

    class Steps(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == stuck_at:
                time.sleep(3600)  # alive (its heartbeats go on) but stuck

        def on_train_batch_end(self, batch, logs=None):
            print("STEP", batch, flush=True)
            time.sleep(0.05)

    watchdog = StepWatchdog(timeout, rank=rank, peers=peers_from_tf_config())
    model.fit(data, epochs=1, steps_per_epoch=10 ** 7, verbose=0, callbacks=[Steps(), watchdog])
""")


def _steps(path: Path) -> int:
    return path.read_text().count("STEP ") if path.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("case", ["stopped", "stuck"])
def test_two_workers_one_stopped_or_stuck(tmp_path, case):
    """Rank 1 is SIGSTOPped after a few steps, or sleeps inside a step; rank 0, blocked in the all-reduce,
    is ended by its watchdog (exit 3) with one line that names rank 1, or says every peer answers."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ports = free_ports(2)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1", PYTHONPATH=str(REPO))
    # rank 1 has no watchdog when stuck: its own would end it, and rank 0 would see a dead peer instead
    args = {0: ("10", "-1"), 1: ("0", "5") if case == "stuck" else ("10", "-1")}
    procs = []
    try:
        for rank in (0, 1):
            with open(tmp_path / f"out{rank}", "w") as out, open(tmp_path / f"err{rank}", "w") as err:
                procs.append(subprocess.Popen([sys.executable, str(script), str(rank), ",".join(map(str, ports)),
                                               *args[rank]], cwd=REPO, env=env, stdout=out, stderr=err))
        deadline = time.monotonic() + 240
        while min(_steps(tmp_path / f"out{r}") for r in (0, 1)) < 3:
            failed = [r for r, p in enumerate(procs) if p.poll() is not None]
            assert not failed and time.monotonic() < deadline, (tmp_path / f"err{(failed or [0])[0]}").read_text()
            time.sleep(0.2)
        if case == "stopped":
            os.kill(procs[1].pid, signal.SIGSTOP)
        rc = procs[0].wait(timeout=240)
        stderr = (tmp_path / "err0").read_text()
        assert rc == EXIT_STEP_TIMEOUT, stderr
        lines = [ln for ln in stderr.splitlines() if ln.startswith("worker rank 0:")]
        assert len(lines) == 1, stderr
        assert "no training step finished in " in lines[0] and "(--step-timeout 10); " in lines[0]
        if case == "stopped":
            assert f"rank 1 (127.0.0.1:{ports[1]}) {NO_ANSWER}" in lines[0]
        else:
            assert ALL_ANSWER in lines[0]
        assert "last progress: train batch " in lines[0]
    finally:
        for p in procs:
            p.kill()  # SIGKILL, also ends a stopped process
            p.wait()
