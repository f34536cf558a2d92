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
    assert (smaller.config.scaling.workers, smaller.config.recipe.batch_size, smaller.config.global_batch_size) == (2, 6, 12)
    assert len(smaller.assignment.workers) == 2 and smaller.manifest is job.manifest
    assert smaller.run_id == job.run_id and smaller.dataset is job.dataset
    assert smaller.schedule.steps_per_epoch == smaller.assignment.steps_per_epoch
    assert {s for w in smaller.assignment.workers for s in w.train_shards} == \
        {s for w in job.assignment.workers for s in w.train_shards}
    assert job.resized(4) is job
    with pytest.raises(ConfigError, match="5 worker"):
        job.resized(5)


# ------------------------------------------------------------------ the checkpoint a relaunch resumes from
def _point(name: str, workers: int, epoch: int, step: int):
    import dataclasses

    from spark_imagenet.training.job.checkpoints import new_meta
    from spark_imagenet.training.job.outcome import ResumePoint

    meta = new_meta(TrainConfig(workers=workers, batch_size=8 // workers, epochs=3), "d" * 16, 4, 10)
    return ResumePoint(name, dataclasses.replace(meta, epoch=epoch, step=step))


def test_a_relaunch_resumes_from_the_latest_checkpoint_at_an_epochs_end_or_on_its_own_count():
    from spark_imagenet.training.job.restarts import RelaunchFrom, relaunch_from

    end, inside = _point("epoch-000001", 2, 1, 10), _point("epoch-000001-000006", 2, 1, 16)
    assert relaunch_from(end, None, 1) == RelaunchFrom(end)  # at an epoch's end: any count
    assert relaunch_from(inside, end, 2) == RelaunchFrom(inside)  # the count that wrote it: exact


def test_a_relaunch_on_another_count_trains_the_interrupted_epoch_again_from_its_start():
    from spark_imagenet.training.job.restarts import relaunch_from

    end, inside = _point("epoch-000001", 2, 1, 10), _point("epoch-000001-000006", 2, 1, 16)
    chosen = relaunch_from(inside, end, 1)
    assert chosen.resume == end
    assert chosen.note == ("elastic: the latest checkpoint epoch-000001-000006 was written 6 step(s) into epoch 2 by "
                           "2 worker(s), and only that count trains exactly the records the epoch has left (each "
                           "worker's share and order of an epoch's records follow from the worker count): the "
                           "relaunch on 1 worker(s) resumes from epoch-000001, the newest checkpoint at an epoch's "
                           "end: the 6 step(s) of epoch 2 done are trained again from its start")
    older = relaunch_from(inside, _point("epoch-000000", 2, 0, 0), 1)  # only an older epoch's end is left
    assert older.note.endswith("epochs 1 to 2 are trained again from the start of epoch 1")
    back = relaunch_from(_point("epoch-000001-000006", 1, 1, 16), end, 2)  # back on --workers after a smaller one
    assert back.resume == end and "written 6 step(s) into epoch 2 by 1 worker(s)" in back.note
    none = relaunch_from(_point("epoch-000000-000004", 2, 0, 4), None, 1)
    assert none.resume is None and none.note.endswith("starts again at epoch 1, as no complete checkpoint at an "
                                                      "epoch's end is left")


def test_find_resume_refuses_or_relaunches_a_checkpoint_inside_an_epoch_by_the_count(local_ds, tmp_path):
    """The plan on another worker count is refused before Spark with both ways on; a relaunch on it resumes from
    the epoch's start with a warning; the count that wrote it resumes where it was."""
    import dataclasses

    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.driver.launch import plan_job
    from spark_imagenet.training.driver.preflight import find_resume
    from spark_imagenet.training.job import checkpoints

    folder, _ = local_ds
    ckpt = tmp_path / "ck"
    job = plan_job(str(folder), TrainConfig(workers=2, batch_size=3, epochs=3, checkpoint_dir=str(ckpt),
                                            checkpoint_every=2))
    steps = job.assignment.steps_per_epoch
    store = open_storage(ckpt)
    template = checkpoints.new_meta(job.config, job.manifest.dataset_id, job.manifest.num_classes, steps)
    for name, step, inside in (("end", steps, 0), ("in", steps + 2, 2)):
        local = tmp_path / name
        local.mkdir()
        (local / "ckpt.index").write_bytes(name.encode())
        checkpoints.commit(store, local, dataclasses.replace(template, step=step), inside=inside)
    one = job.resized(1)
    resume, finding = find_resume(job, relaunch=True)  # the count that wrote it
    assert resume.name == "epoch-000001-000002" and finding.level == "ok"
    resume, finding = find_resume(one)
    assert resume is None and finding.level == "problem"
    for part in ("epoch-000001-000002", "by 2 worker(s)", "--workers 2 --batch-size 3", "from epoch-000001, the "
                 "newest checkpoint at an epoch's end", "remove the checkpoint folders newer than epoch-000001"):
        assert part in finding.message, finding.message
    with pytest.raises(ConfigError, match=r"epoch-000001-000002: this job cannot resume"):
        plan_job(str(folder), one.config)  # before Spark starts
    resume, finding = find_resume(one, relaunch=True)
    assert resume.name == "epoch-000001" and finding.level == "warning"
    assert "the relaunch on 1 worker(s) resumes from epoch-000001" in finding.message
