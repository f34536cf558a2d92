"""The ``--output`` folder (spark_imagenet.training.job.outputs) and its checks before Spark starts
(spark_imagenet.training.driver.preflight.check_output_unused, plan_job): a file is named as a file, an
earlier run's outputs are refused without --overwrite, and with it this run's replace them."""

from __future__ import annotations

import pytest

from bucket_util import make_bucket
from spark_imagenet.errors import ConfigError
from spark_imagenet.storage import open_storage
from spark_imagenet.training.driver.launch import plan_job
from spark_imagenet.training.driver.preflight import check_output_unused
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.outputs import earlier_outputs, open_output, publish


def earlier_run(folder) -> None:
    """What a finished run leaves in its --output folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model.keras", "labels.json", "results.json"):
        (folder / name).write_text("old")
    (folder / "tensorboard" / "train").mkdir(parents=True)
    (folder / "tensorboard" / "train" / "events.out.tfevents.1.old").write_text("old")


def test_an_output_that_is_a_file_is_named_as_one(tmp_path):
    file = tmp_path / "results.txt"
    file.write_text("x")
    with pytest.raises(ConfigError) as e:
        open_output(str(file))
    assert str(e.value).startswith(f"--output {file} is a file, not a folder") and "write-test" not in str(e.value)
    assert (e.value.key, e.value.value) == ("--output", str(file))  # the wording test of outputs: above
    with pytest.raises(ConfigError) as e:
        open_output(str(file / "sub"), "--checkpoint-dir")
    assert (e.value.key, e.value.value) == ("--checkpoint-dir", str(file / "sub")) and f": {file} is" in str(e.value)
    with pytest.raises(ConfigError, match="is a file, not a folder") as e:
        open_output(f"file://{file}")
    assert (e.value.key, e.value.value) == ("--output", f"file://{file}")
    # a folder that is not there is tested and removed again, with the parents it needed: the job's first write
    # makes it, so a job refused before that leaves nothing
    storage = open_output(str(tmp_path / "new" / "folder"))
    assert not storage.root_exists() and not (tmp_path / "new").exists()
    storage.write_bytes("model.keras", b"x")
    assert (tmp_path / "new" / "folder" / "model.keras").read_bytes() == b"x"
    (tmp_path / "kept").mkdir()
    open_output(str(tmp_path / "kept"))
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())  # one that was there stays


def test_an_earlier_runs_outputs_are_refused_without_overwrite(tmp_path):
    out = tmp_path / "run"
    earlier_run(out)
    (out / "notes.txt").write_text("the user's own file: not ours")
    storage = open_output(str(out))
    assert earlier_outputs(storage) == ["labels.json", "model.keras", "results.json",
                                        "tensorboard/train/events.out.tfevents.1.old"]
    with pytest.raises(ConfigError) as e:
        check_output_unused(storage, str(out), overwrite=False).raise_if_problem()
    message = str(e.value)
    assert f"--output {out} already holds the outputs of an earlier run" in message
    assert "model.keras" in message and "tensorboard/" in message and "--overwrite" in message
    assert check_output_unused(storage, str(out), overwrite=True).level == "ok"  # nothing deleted before the job
    assert (out / "model.keras").read_text() == "old"
    assert check_output_unused(open_output(str(tmp_path / "fresh")), str(tmp_path / "fresh"),
                               overwrite=False).level == "ok"


def test_plan_job_refuses_an_earlier_run_before_spark_and_overwrite_is_a_setting(tmp_path):
    bucket = make_bucket(tmp_path / "bucket")
    out = tmp_path / "run"
    earlier_run(out)
    with pytest.raises(ConfigError, match="already holds the outputs of an earlier run"):
        plan_job(str(bucket), TrainConfig(workers=2, output=str(out)))
    job = plan_job(str(bucket), TrainConfig(workers=2, output=str(out), overwrite=True))
    assert job.config.run.overwrite and (out / "model.keras").exists()


def test_publishing_with_overwrite_replaces_the_earlier_runs_tensorboard_logs(tmp_path):
    out = tmp_path / "run"
    earlier_run(out)
    local = tmp_path / "local"
    (local / "tensorboard" / "train").mkdir(parents=True)
    (local / "tensorboard" / "train" / "events.out.tfevents.2.new").write_text("new")
    (local / "model.keras").write_text("new")
    names = publish(str(local), open_storage(str(out)))
    assert names == ["model.keras", "tensorboard/train/events.out.tfevents.2.new"]
    assert (out / "model.keras").read_text() == "new"
    assert sorted(p.name for p in (out / "tensorboard" / "train").iterdir()) == ["events.out.tfevents.2.new"]
    assert (out / "results.json").read_text() == "old"  # the driver's files are replaced by the driver
