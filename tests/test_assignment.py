"""Shard assignment: mod-N train shards, val shards or val record sharding, step counts."""

from __future__ import annotations

import math

import pytest

from spark_imagenet.training.job.assignment import assign, elastic_counts, record_shard_count
from spark_imagenet.errors import ConfigError
from spark_imagenet.dataset.manifest import Manifest, ShardInfo, SplitInfo
from spark_imagenet.source.synset import SynsetClass


def make_manifest(train: list[int], val: list[int]) -> Manifest:
    """A manifest whose shards hold the given example counts (no files needed)."""
    def shards(split, counts):
        return tuple(ShardInfo(f"{split}-{i:05d}-of-{len(counts):05d}.tfrecord", n, 1000 * n, "AAAAAA==")
                     for i, n in enumerate(counts))

    return Manifest(
        dataset_id="test",
        created="",
        classes=(SynsetClass(0, "n0", ("a",)), SynsetClass(1, "n1", ("b",))),
        splits={"train": SplitInfo(shards("train", train)), "val": SplitInfo(shards("val", val))},
    )


def test_train_shards_go_to_rank_i_mod_n():
    m = make_manifest(train=[10, 11, 12, 13, 14, 15, 16, 17], val=[5, 5, 5])
    plan = assign(m, 3, batch_size=4)
    assert len(plan) == 3
    for rank, w in enumerate(plan):
        assert w.rank == rank
        expected = [f"train-{i:05d}-of-00008.tfrecord" for i in range(8) if i % 3 == rank]
        assert [s.name for s in w.train_shards] == expected
        assert w.train_examples == sum(s.examples for s in w.train_shards)
    # every shard exactly once
    names = sorted(s.name for w in plan for s in w.train_shards)
    assert names == sorted(s.name for s in m.splits["train"].shards)


def test_equal_shards_divisible_by_workers_are_balanced():
    m = make_manifest(train=[25] * 8, val=[10] * 4)
    plan = assign(m, 4, batch_size=8)
    assert {w.train_examples for w in plan} == {50}
    assert {len(w.train_shards) for w in plan} == {2}
    assert {w.val_examples for w in plan} == {10}


def test_steps_per_epoch_is_one_pass_of_the_cluster_and_at_least_one():
    m = make_manifest(train=[25] * 8, val=[10] * 4)  # 200 train examples
    assert assign(m, 4, batch_size=8).steps_per_epoch == 200 // 32
    assert assign(m, 2, batch_size=7).steps_per_epoch == 200 // 14
    assert assign(m, 4, batch_size=1000).steps_per_epoch == 1
    a = assign(m, 4, batch_size=8)
    assert a.train_examples_total == 200 and a.val_examples_total == 40


def test_val_shards_at_least_workers_are_split_mod_n():
    m = make_manifest(train=[10] * 4, val=[3, 4, 5, 6, 7])
    plan = assign(m, 2, batch_size=4)
    assert [s.name for s in plan[0].val_shards] == ["val-00000-of-00005.tfrecord", "val-00002-of-00005.tfrecord",
                                                    "val-00004-of-00005.tfrecord"]
    assert [s.name for s in plan[1].val_shards] == ["val-00001-of-00005.tfrecord", "val-00003-of-00005.tfrecord"]
    assert plan[0].val_record_shard is None and plan[1].val_record_shard is None
    assert (plan[0].val_examples, plan[1].val_examples) == (3 + 5 + 7, 4 + 6)
    assert plan.val_steps == math.ceil(15 / 4)


@pytest.mark.parametrize("val_counts,workers", [([7], 2), ([5, 6], 3), ([1], 4), ([0, 2], 3), ([13, 0, 4], 4),
                                                 ([3, 3, 3], 8)])
def test_val_record_sharding_counts_match_a_simulation(val_counts, workers):
    m = make_manifest(train=[10] * workers, val=val_counts)
    plan = assign(m, workers, batch_size=2)
    total = sum(val_counts)
    # brute force: concatenate the files' records in order and keep index % N == rank (tf.data shard(N, rank))
    records = [(f, j) for f, n in enumerate(val_counts) for j in range(n)]
    for w in plan:
        assert w.val_record_shard == (workers, w.rank)
        assert [s.name for s in w.val_shards] == [s.name for s in m.splits["val"].shards]
        simulated = [r for i, r in enumerate(records) if i % workers == w.rank]
        assert w.val_examples == len(simulated) == record_shard_count(total, workers, w.rank)
    assert sum(w.val_examples for w in plan) == total
    assert plan.val_steps == max(1, math.ceil(max(w.val_examples for w in plan) / 2))
    assert plan.val_steps * 2 >= max(w.val_examples for w in plan)


def test_record_shard_count_formula():
    for total in range(0, 30):
        for n in range(1, 7):
            counts = [record_shard_count(total, n, r) for r in range(n)]
            assert sum(counts) == total
            assert counts == [len(range(r, total, n)) for r in range(n)]


def test_fewer_train_shards_than_workers_is_a_config_error():
    m = make_manifest(train=[10, 10, 10], val=[5])
    with pytest.raises(ConfigError) as e:
        assign(m, 4, batch_size=2)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("--workers", 4)


def test_zero_val_examples_is_a_config_error():
    with pytest.raises(ConfigError, match="val split holds no examples"):
        assign(make_manifest(train=[10, 10], val=[0, 0]), 2, batch_size=2)
    with pytest.raises(ConfigError, match="val split holds no examples"):
        assign(make_manifest(train=[10, 10], val=[]), 2, batch_size=2)


def test_worker_with_empty_train_shards_is_a_config_error():
    with pytest.raises(ConfigError, match="worker 1's train shards") as e:
        assign(make_manifest(train=[10, 0, 10, 0], val=[4]), 2, batch_size=2)
    assert (e.value.key, e.value.value) == ("--train-shards", 4)


@pytest.mark.parametrize("workers,batch", [(0, 4), (-1, 4), (True, 4), (2.0, 4), (2, 0), (2, None)])
def test_bad_workers_or_batch_size(workers, batch):
    with pytest.raises(ConfigError) as e:
        assign(make_manifest(train=[10] * 4, val=[4]), workers, batch)
    assert (e.value.key, e.value.value) == (("--workers", workers) if batch == 4 else ("--batch-size", batch))


def test_plan_json_is_serialisable():
    import json

    plan = assign(make_manifest(train=[10] * 4, val=[4]), 2, batch_size=2)
    data = json.loads(json.dumps([w.to_json() for w in plan]))
    assert data[1]["val_record_shard"] == [2, 1]
    assert data[0]["train_shards"] == ["train-00000-of-00004.tfrecord", "train-00002-of-00004.tfrecord"]


def test_a_relaunch_goes_on_only_with_worker_counts_that_divide_the_global_batch():
    assert elastic_counts(8, 4, 64) == [4]  # 7, 6 and 5 do not divide 64
    assert elastic_counts(6, 2, 96) == [4, 3, 2]
    assert elastic_counts(4, 3, 64) == []
    assert elastic_counts(4, 4, 64) == [] and elastic_counts(4, None, 64) == []
