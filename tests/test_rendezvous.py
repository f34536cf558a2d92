"""Rendezvous: TF_CONFIG, and ports over allGather in a real barrier stage."""

from __future__ import annotations

import json

import pytest

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.task.rendezvous import build_tf_config, join_host_port, local_worker_count, split_host_port


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
    from spark_imagenet.training.task.rendezvous import rendezvous

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


def test_a_task_that_failed_before_the_rendezvous_ends_it_for_all(spark):
    """Rank 1 comes with a failure: both tasks raise PeerFailed naming it, none is left waiting in allGather."""
    from spark_imagenet.errors import PeerFailed
    from spark_imagenet.training.task.rendezvous import rendezvous

    def task(_):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        try:
            rendezvous(ctx, "shard train-1 is corrupt" if ctx.partitionId() == 1 else None)
        except PeerFailed as e:
            yield json.dumps({"rank": ctx.partitionId(), "failures": e.failures, "message": str(e)})

    out = [json.loads(s) for s in spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(task).collect()]
    assert sorted(o["rank"] for o in out) == [0, 1]
    for o in out:
        assert o["failures"] == {"1": "shard train-1 is corrupt"}
        assert o["message"] == "1 task(s) failed before the rendezvous: rank 1: shard train-1 is corrupt"
