"""Rendezvous: TF_CONFIG, and ports in a real barrier stage, over the driver's log channel (a real LogServer) or,
without one, Spark's allGather; a task that cannot reach the channel fails at once, and the driver launches
the stage again with allGather."""

from __future__ import annotations

import contextlib
import json
import socket

import pytest

from bucket_util import make_bucket
from spark_imagenet.errors import ConfigError, StorageError, TrainingError
from spark_imagenet.training.driver.logserver import LogServer
from spark_imagenet.training.job.logchannel import STAGE_CONNECT, ChannelSpec
from spark_imagenet.training.task.logsender import LogSender
from spark_imagenet.training.task.rendezvous import build_tf_config, join_host_port, local_worker_count, split_host_port


@pytest.fixture(params=["allGather", "channel"])
def channel(request):
    """How the tasks meet: None (Spark's allGather), or the spec of a real LogServer on this machine."""
    if request.param == "allGather":
        yield None
        return
    with LogServer("127.0.0.1", lambda rank, host, text: None) as server:
        yield server


def _dead_channel() -> ChannelSpec:
    """A channel nobody listens on: its port was bound and released (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return ChannelSpec("127.0.0.1", s.getsockname()[1], "s" * 32, lines=False)


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
def test_rendezvous_in_a_local_barrier_stage(spark, channel):
    from spark_imagenet.training.task.rendezvous import rendezvous

    spec = None if channel is None else channel.spec

    def task(_):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        with contextlib.nullcontext() if spec is None else LogSender(spec, ctx.partitionId(), "h") as sender:
            rank, addresses, host = rendezvous(ctx, None, sender)
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
    assert channel is None or channel.met == 4  # both jobs met on the channel, not through allGather


def test_a_task_that_failed_before_the_rendezvous_ends_it_for_all(spark, channel):
    """Rank 1 comes with a failure: both tasks raise PeerFailed naming it, none is left waiting."""
    from spark_imagenet.errors import PeerFailed
    from spark_imagenet.training.task.rendezvous import rendezvous

    spec = None if channel is None else channel.spec

    def task(_):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        try:
            with contextlib.nullcontext() if spec is None else LogSender(spec, ctx.partitionId(), "h") as sender:
                rendezvous(ctx, "shard train-1 is corrupt" if ctx.partitionId() == 1 else None, sender)
        except PeerFailed as e:
            yield json.dumps({"rank": ctx.partitionId(), "failures": e.failures, "message": str(e)})

    out = [json.loads(s) for s in spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(task).collect()]
    assert sorted(o["rank"] for o in out) == [0, 1]
    for o in out:
        assert o["failures"] == {"1": "shard train-1 is corrupt"}
        assert o["message"] == "1 task(s) failed before the rendezvous: rank 1: shard train-1 is corrupt"


def test_a_task_that_cannot_reach_the_channel_fails_at_once_naming_it(spark, tmp_path):
    """run_task itself, in a real barrier stage: both tasks fail before staging anything, in the stage the
    driver reads as 'launch again with allGather', with the address and port in the message."""
    from spark_imagenet.training.driver.launch import plan_job, task_error
    from spark_imagenet.training.driver.stage import ClassicLaunch, run_stage
    from spark_imagenet.training.job.config import TrainConfig
    from spark_imagenet.training.task.barrier_task import TaskSpec

    job = plan_job(str(make_bucket(tmp_path / "b")), TrainConfig(workers=2, cache=str(tmp_path / "cache")))
    dead = _dead_channel()
    with pytest.raises(Exception) as e:
        run_stage(ClassicLaunch(spark.sparkContext, "unreachable channel"), TaskSpec(job, None, dead))
    err = task_error(str(e.value))
    assert type(err) is TrainingError and err.failure.stage == STAGE_CONNECT
    assert f"cannot connect to the driver's log channel at 127.0.0.1:{dead.port}" in err.failure.message
    assert not (tmp_path / "cache").exists()  # it failed before staging


@pytest.mark.slow
def test_the_driver_launches_again_with_allgather_when_a_task_cannot_reach_its_channel(spark, tmp_path,
                                                                                       monkeypatch, log_lines):
    """The first launch's tasks cannot connect (a channel on a dead port, as behind a firewall); the driver warns
    once, naming the port, and launches again without a channel: the tasks meet through allGather, where rank
    1's corrupt shard ends the job with rank 1's own error."""
    from spark_imagenet.training.driver import launch
    from spark_imagenet.training.job.config import TrainConfig

    dead = _dead_channel()
    monkeypatch.setattr(launch, "_log_server", lambda sc, facts, config: contextlib.nullcontext(dead))
    bucket = make_bucket(tmp_path / "b", train=2, corrupt="train-00001-of-00002.tfrecord")
    with pytest.raises(StorageError, match="train-00001-of-00002.tfrecord"):
        launch.train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", batch_size=2))
    warned = [line for line in log_lines if "launched again" in line]
    assert len(warned) == 1 and f"127.0.0.1:{dead.port}" in warned[0] and "allGather" in warned[0]
