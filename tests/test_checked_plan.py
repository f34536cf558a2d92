"""The checked plan (spark_imagenet.training.driver.preflight): the findings type, and each phase on plain
values (no Spark): the settings and reach before Spark, the plan's folders and checks (the resume point found
once), and the session's checks over hand-made SessionFacts."""

from __future__ import annotations

import logging

import pytest

from bucket_util import make_bucket
from spark_imagenet.errors import ConfigError, ManifestError
from spark_imagenet.training.driver.preflight import (
    Finding,
    Findings,
    SessionFacts,
    check_before_spark,
    check_reach,
    check_session,
    check_settings,
)
from spark_imagenet.training.job.config import TrainConfig


# ------------------------------------------------------------ the findings type
def test_a_problem_raises_its_own_error_class_and_message():
    manifest = Finding.problem("dataset shards", ManifestError("shard x is missing"))
    assert manifest.level == "problem" and manifest.message == "shard x is missing"
    with pytest.raises(ManifestError, match="^shard x is missing$"):
        manifest.raise_if_problem()
    with pytest.raises(ConfigError, match="^too few$"):
        Finding.problem("barrier slots", "too few").raise_if_problem()  # a message: a ConfigError
    ok = Finding.ok("encryption", "off")
    assert ok.raise_if_problem() is ok and ok.line == "off"
    assert Finding.warning("tracking", "no model").line == "warning: no model"


def test_a_finding_refuses_a_level_it_does_not_know_and_a_problem_without_its_error():
    with pytest.raises(ValueError, match="ok, warning, problem"):
        Finding("x", "fatal", "m")
    with pytest.raises(ValueError, match="carries the error"):
        Finding("x", "problem", "m")
    with pytest.raises(ValueError, match="carries the error"):
        Finding("x", "ok", "m", ConfigError("m"))


def test_finding_of_a_step_that_raises():
    def refuse():
        raise ManifestError("gone")

    found = Finding.of("dataset shards", refuse, "listed")
    assert found.level == "problem" and isinstance(found.error, ManifestError)
    assert Finding.of("dataset shards", lambda: None, "listed") == Finding.ok("dataset shards", "listed")
    with pytest.raises(ZeroDivisionError):  # not a refusal: passes through
        Finding.of("x", lambda: 1 / 0)


def test_findings_raise_the_first_problem_and_log_the_warnings_in_order(caplog):
    findings = Findings([Finding.ok("a", "fine"), None, Finding.warning("b", "look"),
                         Finding.problem("c", ConfigError("first")), Finding.warning("d", "again"),
                         Finding.problem("e", ManifestError("second"))])
    assert len(findings) == 5 and [f.check for f in findings.problems] == ["c", "e"]
    assert [f.check for f in findings.warnings] == ["b", "d"] and findings.named("a") == (Finding.ok("a", "fine"),)
    with pytest.raises(ConfigError, match="^first$"):
        findings.raise_if_problems()
    caplog.set_level(logging.WARNING)
    findings.log_warnings(logging.getLogger("test"))
    assert [r.getMessage() for r in caplog.records] == ["warning: look", "warning: again"]
    more = Findings([Finding.ok("a")]) + [Finding.ok("b")]
    assert isinstance(more, Findings) and [f.check for f in more] == ["a", "b"]
    assert Findings().raise_if_problems() == ()


# ------------------------------------------------------------ before Spark
def test_the_settings_alone_say_slots_results_and_gpus_of_a_local_master(tmp_path):
    assert not check_settings(TrainConfig(workers=2)).problems
    findings = check_settings(TrainConfig(workers=4, master="local[2]", results=tmp_path / "no" / "r.json",
                                          gpus_per_worker=1))
    assert [f.check for f in findings.problems] == ["barrier slots", "results path", "gpu settings"]
    assert "--workers 4 needs 4 barrier task slots, only 2 available" in findings.problems[0].message
    assert "Spark's local mode (local[2]) does not hand GPUs to tasks" in findings.problems[2].message


def test_a_barrier_timeout_that_is_no_spark_time_is_refused_before_spark():
    """``--conf spark.barrier.sync.timeout=soon`` is found with the settings, not after Spark started."""
    bad = check_settings(TrainConfig(workers=2, conf={"spark.barrier.sync.timeout": "soon"}))
    assert [f.check for f in bad.problems] == ["barrier timeout"]
    error = bad.problems[0].error
    assert type(error) is ConfigError and (error.key, error.value) == ("spark.barrier.sync.timeout", "soon")
    assert not check_settings(TrainConfig(workers=2, conf={"spark.barrier.sync.timeout": "3600s"})).problems


def test_reach_is_checked_for_a_known_cluster_master_only():
    cluster = TrainConfig(workers=2, master="spark://h:7077", output="/runs/1")
    found = check_reach(cluster, "/data/shards")
    assert [(f.check, f.level) for f in found] == [("dataset reachable", "problem"), ("--output reachable", "problem")]
    assert not check_reach(cluster.replace(shared_filesystem=True), "/data/shards").problems
    assert check_reach(TrainConfig(workers=2, master="sc://h:15002"), "/data") == ()  # known with the session
    assert check_reach(TrainConfig(workers=2), "/data") == ()
    assert check_before_spark(cluster, "/data/shards") == check_settings(cluster) + found


# ------------------------------------------------------------ the plan
def test_the_plan_finds_the_resume_point_once_and_says_settings_without_effect(tmp_path, monkeypatch, caplog):
    from spark_imagenet.training.driver.launch import plan_job
    from spark_imagenet.training.job import checkpoints

    listed = []
    monkeypatch.setattr(checkpoints, "latest", lambda storage, announce=False: listed.append(announce))
    caplog.set_level(logging.WARNING)
    job = plan_job(str(make_bucket(tmp_path / "b")), TrainConfig(workers=2, checkpoint_dir=str(tmp_path / "ck")))
    assert listed == [True] and job.resume is None  # listed once, its skipped folders said
    assert "checkpoint-every" not in caplog.text
    plan_job(str(make_bucket(tmp_path / "c")), TrainConfig(workers=2, checkpoint_every=2))
    assert ("warning: --checkpoint-every has no effect without --checkpoint-dir: no checkpoint is kept"
            in caplog.text)


def test_the_plan_warns_of_images_stored_smaller_than_the_training_size(tmp_path, caplog):
    from spark_imagenet.dataset.image_form import image_form
    from spark_imagenet.training.driver.launch import plan_job

    caplog.set_level(logging.WARNING)
    small = str(make_bucket(tmp_path / "b", image_form=image_form(max_side=96)))
    plan_job(small, TrainConfig(workers=2, image_size=96))
    plan_job(str(make_bucket(tmp_path / "c", image_form=image_form(resize=256))), TrainConfig(workers=2))
    assert "image" not in caplog.text  # 96 px on 96, the paper's 256 on the default 224: nothing to say
    plan_job(small, TrainConfig(workers=2, image_size=128))
    assert ("warning: the dataset stores its images as 'max-side 96 q90' (at most 96 px a side), smaller than "
            "--image-size 128: every crop is scaled up; shard the sources again with --max-side 128 or more, or "
            "train at --image-size 96 or less") in caplog.text


def test_a_plan_of_a_cluster_master_checks_reach_after_its_manifest(tmp_path):
    from spark_imagenet.training.driver.launch import plan_job

    with pytest.raises(ManifestError, match="does not exist"):  # a missing dataset is said as such
        plan_job(str(tmp_path / "none"), TrainConfig(workers=2, master="spark://h:7077"))
    with pytest.raises(ConfigError, match="is a path on the driver's disk"):
        plan_job(str(make_bucket(tmp_path / "b")), TrainConfig(workers=2, master="spark://h:7077"))


# ------------------------------------------------------------ the session
def _facts(**kw) -> SessionFacts:
    return SessionFacts(**{"master": "spark://h:7077", "slots": 4, "slots_how": "executor cores", **kw})


def test_the_session_checks_over_its_facts():
    config = TrainConfig(workers=2)
    findings = check_session(_facts(), config, "gs://b/d")
    assert not findings.problems and not findings.warnings
    assert [f.check for f in findings] == ["dynamic allocation", "barrier slots", "dataset reachable", "encryption",
                                           "gpu settings"]
    few = check_session(_facts(slots=1, waited_s=60.0), config).problems
    assert [f.check for f in few] == ["barrier slots"]
    assert "only 1 available after waiting 60 s for executors to register" in few[0].message
    cpus = check_session(_facts(master="local[2]", slots=1, conf=(("spark.task.cpus", "2"),)), config).problems
    assert "give Spark more slots: --master local[4], or a lower spark.task.cpus" in cpus[0].message  # not local[2]
    on = check_session(_facts(conf=(("spark.dynamicAllocation.enabled", "true"),)), config).problems
    assert "SPARK-24942" in on[0].message
    local = check_session(_facts(), config, "/data/shards").problems
    assert local[0].check == "dataset reachable" and "master spark://h:7077" in local[0].message
    moved = check_session(_facts(), TrainConfig(workers=2, master="yarn")).warnings
    assert moved[0].check == "master" and "the job's master 'yarn' is not used" in moved[0].message


def test_a_connect_session_is_checked_as_far_as_connect_allows():
    facts = SessionFacts(master="local[2]", connect_url="sc://127.0.0.1:15002", slots=2,
                         unreadable=("spark.task.cpus (not readable: hidden)",))
    assert facts.tasks_on_this_machine and facts.where_tasks_run == "local[2]"
    assert facts.reported_master == "sc://127.0.0.1:15002"
    findings = check_session(facts, TrainConfig(workers=2), "/data/shards")
    assert not findings.problems  # a loopback server with a local master reads the driver's files
    (warning,) = findings.warnings
    assert warning.line.startswith("warning: Spark Connect session: not checked before launch: the scheduler's")
    assert warning.message.endswith("; spark.task.cpus (not readable: hidden)")
    remote = SessionFacts(master="local[2]", connect_url="sc://far.example:15002", slots=2)
    assert remote.where_tasks_run == "sc://far.example:15002" and not remote.tasks_in_this_jvm
    assert check_session(remote, TrainConfig(workers=2), "/data/shards").problems[0].check == "dataset reachable"
    with pytest.raises(ConfigError, match="the Spark Connect server sc://127.0.0.1:15002 runs master local\\[2\\]"):
        check_session(facts, TrainConfig(workers=3)).raise_if_problems()
