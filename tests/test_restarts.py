"""What follows a lost worker (spark_imagenet.training.job.restarts): give up or relaunch, on how many workers,
decided without Spark; and the relaunch's plan re-assigned from the manifest the job holds (JobPlan.resized)."""

from __future__ import annotations

import pytest

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.restarts import FailurePolicy, GiveUp, Relaunch


def policy(**settings) -> FailurePolicy:
    return FailurePolicy.of(TrainConfig(**{"workers": 8, "batch_size": 8, "max_restarts": 2, **settings}))


def test_the_policy_is_read_from_the_config():
    p = policy(min_workers=4, regain_timeout=5.0)
    assert (p.workers, p.min_workers, p.global_batch, p.max_restarts, p.regain_timeout) == (8, 4, 64, 2, 5.0)
    assert p.elastic and p.smaller_counts() == [4]  # 7, 6 and 5 do not divide 64
    assert not policy().elastic and policy().smaller_counts() == []
    assert not policy(min_workers=8).elastic


def test_a_loss_is_given_up_only_once_the_restarts_are_spent():
    p = policy()
    assert p.exhausted(0) is None and p.exhausted(1) is None
    last = p.exhausted(2)
    assert isinstance(last, GiveUp) and "launched 3 times, the last allowed by --max-restarts 2" in last.note
    assert policy(max_restarts=0).exhausted(0) == GiveUp("")  # no restart allowed: the error stands as it is


def test_without_min_workers_or_a_slot_count_the_planned_count_is_relaunched():
    assert policy().relaunch(8, free_slots=3) == Relaunch(8)
    assert policy(min_workers=4).relaunch(8, free_slots=None) == Relaunch(8)  # Spark Connect: slots unknown


def test_elastic_relaunch_goes_on_with_the_largest_count_that_fits_and_divides_the_batch():
    p = policy(min_workers=2, regain_timeout=30.0)
    d = p.relaunch(8, free_slots=6)
    assert d.workers == 4 and d.warn
    assert d.note == ("warning: elastic: 6 of 8 barrier slots free after 30 s: going on with 4 worker(s), batch 16 "
                      "each (the global batch 64 kept), from the latest checkpoint; a later relaunch goes back to 8 "
                      "when the slots are free")
    assert p.relaunch(8, free_slots=3).workers == 2


def test_elastic_relaunch_goes_back_to_the_planned_count_when_its_slots_are_free():
    p = policy(min_workers=2)
    assert p.relaunch(8, free_slots=8) == Relaunch(8)  # the lost launch had them all: nothing to say
    back = p.relaunch(4, free_slots=9)
    assert back.workers == 8 and not back.warn and "back to 8 workers" in back.note


def test_elastic_relaunch_with_no_count_that_fits_waits_for_the_planned_one():
    d = policy(min_workers=4, regain_timeout=1.0).relaunch(8, free_slots=3)
    assert d.workers == 8 and d.warn and "no worker count from --min-workers 4 to 3 divides" in d.note


def test_a_min_workers_no_relaunch_can_use_is_named():
    assert policy(workers=4, batch_size=16, min_workers=3).useless_min_workers() == (
        "--min-workers 3 has no effect: no worker count from 3 to 3 divides the global batch 64, so a "
        "relaunch after a lost worker waits for 4")
    assert policy(workers=4, batch_size=16, min_workers=2).useless_min_workers() is None
    assert policy().useless_min_workers() is None


def test_a_resized_job_keeps_the_global_batch_and_reassigns_the_manifest_it_holds(local_ds, monkeypatch):
    from spark_imagenet.training.driver.launch import plan_job

    folder, _ = local_ds
    job = plan_job(str(folder), TrainConfig(workers=4, batch_size=3, min_workers=2))
    monkeypatch.setattr("spark_imagenet.dataset.manifest.Manifest.load", lambda *a: pytest.fail("manifest reloaded"))
    smaller = job.resized(2)
    assert (smaller.config.workers, smaller.config.batch_size, smaller.config.global_batch_size) == (2, 6, 12)
    assert len(smaller.assignment.workers) == 2 and smaller.manifest is job.manifest
    assert smaller.run_id == job.run_id and smaller.dataset is job.dataset
    assert smaller.schedule.steps_per_epoch == smaller.assignment.steps_per_epoch
    assert {s for w in smaller.assignment.workers for s in w.train_shards} == \
        {s for w in job.assignment.workers for s in w.train_shards}
    assert job.resized(4) is job
    with pytest.raises(ConfigError, match="5 worker"):
        job.resized(5)
