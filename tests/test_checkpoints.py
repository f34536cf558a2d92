"""Training checkpoints in --checkpoint-dir (spark_imagenet.training.job.checkpoints) on real storage: local folders
and gs:// through the fake-gcs emulator. Commit, latest, pruning, half-written folders, foreign formats, the
compatibility check and verified downloads."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from spark_imagenet.errors import ConfigError, StorageError
from spark_imagenet.storage import crc32c_file, open_storage
from spark_imagenet.training.job import checkpoints as ck
from spark_imagenet.training.job.checkpoints import (
    META_NAME,
    CheckpointFile,
    CheckpointMeta,
    RunSettings,
    check_compatible,
    commit,
    describe,
    download,
    latest,
)
from spark_imagenet.training.job.config import TrainConfig

#: A job's recipe and augmentation, resolved (a checkpoint of format_version 2 records every one).
RECIPE = {"lr_schedule": "cosine", "lr_boundaries": (), "warmup_epochs": 0.5, "lr_scaling": "none", "momentum": 0.9,
          "weight_decay": 0.0005, "label_smoothing": 0.0, "flip": True, "crop_area": (0.08, 1.0), "lighting": 0.0}
SETTINGS = RunSettings(dataset_id="d" * 16, model="alexnet", width=0.25, image_size=96, num_classes=10, workers=2,
                       batch_size=8, seed=3, learning_rate=0.01, epochs=5, optimizer="sgd", precision="float32",
                       **RECIPE)
DATA = "ckpt.data-00000-of-00001"


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path):
    """An empty checkpoint dir: a local folder, or a prefix of a fresh emulator bucket."""
    if request.param == "local":
        return open_storage(tmp_path / "checkpoints")
    return open_storage(f"gs://{request.getfixturevalue('gcs_bucket')}/run/checkpoints")


def tf_files(folder: Path, epoch: int, salt: int = 0) -> Path:
    """A stand-in for what tf.train.Checkpoint.write leaves: an index, a data file (content differs by epoch
    and salt, sizes do not, as with real checkpoints) and a subfolder file."""
    folder.mkdir(parents=True)
    (folder / "ckpt.index").write_bytes(b"index-%03d" % epoch)
    (folder / DATA).write_bytes(bytes((epoch * 7 + salt + i) % 256 for i in range(70_000)))
    (folder / "assets").mkdir()
    (folder / "assets" / "note.txt").write_text(f"epoch {epoch}\n")
    return folder


def meta(epoch: int, **changes) -> CheckpointMeta:
    history = {"loss": [5.0 - i for i in range(epoch)], "val_top1": [0.1 * (i + 1) for i in range(epoch)]}
    m = CheckpointMeta.create(SETTINGS, epoch=epoch, step=12 * epoch, history=history)
    return dataclasses.replace(m, **changes) if changes else m


def commit_epoch(store, tmp_path, epoch: int, salt: int = 0, **kwargs) -> str:
    local = tf_files(tmp_path / f"local-{epoch}-{os.urandom(3).hex()}", epoch, salt)
    return commit(store, local, meta(epoch), **kwargs)


def folders(store) -> list[str]:
    return sorted({o.name.split("/")[0] for o in store.list()})


# ------------------------------------------------------------------ commit / latest / download
def test_commit_latest_download_round_trip(store, tmp_path):
    local = tf_files(tmp_path / "tf", 1)
    assert latest(store) is None
    assert commit(store, local, meta(1)) == "epoch-000001"
    found = latest(store)
    assert found is not None
    name, got = found
    assert name == "epoch-000001"
    assert got == dataclasses.replace(meta(1, created=got.created), files=got.files)
    assert got.created.endswith("Z") and len(got.created) == len("2026-12-01T18:00:00Z")
    expected = sorted((f, (local / f).stat().st_size, crc32c_file(local / f))
                      for f in ("ckpt.index", DATA, "assets/note.txt"))
    assert sorted(got.files) == expected
    assert sorted(o.name for o in store.list()) == sorted(
        [f"epoch-000001/{n}" for n, _s, _c in expected] + [f"epoch-000001/{META_NAME}"])

    prefix = download(store, name, got, tmp_path / "restore", transfers=2)
    assert prefix == str(tmp_path / "restore" / "ckpt")
    for n, _s, _c in expected:
        assert (tmp_path / "restore" / n).read_bytes() == (local / n).read_bytes()
    assert ck.read_local(tmp_path / "restore") == got


def test_latest_is_the_highest_epoch_and_keep_prunes_the_oldest(store, tmp_path):
    for epoch in (1, 2):
        commit_epoch(store, tmp_path, epoch)
    assert latest(store)[0] == "epoch-000002"
    assert folders(store) == ["epoch-000001", "epoch-000002"]
    commit_epoch(store, tmp_path, 3)
    name, got = latest(store, announce=True)
    assert (name, got.epoch, got.step) == ("epoch-000003", 3, 36)
    assert folders(store) == ["epoch-000002", "epoch-000003"]
    if hasattr(store, "root"):  # a local folder leaves no empty directory behind
        assert sorted(p.name for p in store.root.iterdir()) == ["epoch-000002", "epoch-000003"]
    commit_epoch(store, tmp_path, 4, keep=1)
    assert folders(store) == ["epoch-000004"]
    commit_epoch(store, tmp_path, 5, keep=None)
    assert folders(store) == ["epoch-000004", "epoch-000005"]


def test_other_objects_in_the_dir_are_left_alone(tmp_path):
    store = open_storage(tmp_path / "c")
    store.write_bytes("notes.txt", b"mine")
    store.write_bytes("epoch-1/x", b"not a checkpoint folder name")
    for epoch in (1, 2, 3):
        commit_epoch(store, tmp_path, epoch, keep=1)
    assert folders(store) == ["epoch-000003", "epoch-1", "notes.txt"]


@pytest.mark.parametrize("damage", ["no-meta", "missing-file", "short-file", "not-json"])
def test_a_half_written_checkpoint_is_skipped(log_lines, store, tmp_path, damage):
    commit_epoch(store, tmp_path, 1)
    commit_epoch(store, tmp_path, 2)
    if damage == "no-meta":
        store.delete(f"epoch-000002/{META_NAME}")
    elif damage == "missing-file":
        store.delete(f"epoch-000002/{DATA}")
    elif damage == "short-file":
        store.write_bytes(f"epoch-000002/{DATA}", b"cut short")
    else:
        store.write_bytes(f"epoch-000002/{META_NAME}", b'{"format": "spark-imagenet-checkpoint", "epo')
    lines = log_lines
    lines.clear()  # the lines from here on
    name, got = latest(store, announce=True)
    assert (name, got.epoch) == ("epoch-000001", 1)
    assert len(lines) == 1 and store.where("epoch-000002") in lines[0]
    if damage in ("missing-file", "short-file"):
        assert DATA in lines[0]
    # training epoch 2 again commits it whole, over the half-written folder
    commit_epoch(store, tmp_path, 2)
    assert latest(store)[0] == "epoch-000002"


def test_uploaded_files_without_meta_never_count(tmp_path):
    """Files of epoch 2 uploaded (as a killed chief leaves them), no checkpoint.json: epoch 1 is the latest;
    the next commit (epoch 2 again, keep=1) removes epoch 1 but keeps itself."""
    store = open_storage(tmp_path / "c")
    commit_epoch(store, tmp_path, 1)
    local = tf_files(tmp_path / "partial", 2)
    store.put_files([(local / "ckpt.index", "epoch-000002/ckpt.index"), (local / DATA, f"epoch-000002/{DATA}")])
    assert latest(store)[0] == "epoch-000001"
    commit_epoch(store, tmp_path, 3, keep=2)  # the half-written epoch 2 is older than 3: pruned
    assert folders(store) == ["epoch-000001", "epoch-000003"]


def test_an_interrupted_recommit_never_mixes_old_and_new_files(store, tmp_path, monkeypatch):
    """Committing an epoch again over its complete folder deletes its checkpoint.json first: an upload cut
    short (the new data file and the old index, of the same sizes as the old ones) is then half-written, not
    taken for the old checkpoint."""
    commit_epoch(store, tmp_path, 1)
    commit_epoch(store, tmp_path, 2)
    real = store.put_files_info

    def cut_short(pairs, transfers=8):
        assert [n.rsplit("/", 1)[1] for _p, n in pairs] == ["note.txt", DATA, "ckpt.index"]
        return [*real(pairs[:2], transfers), StorageError("connection reset")]

    monkeypatch.setattr(store, "put_files_info", cut_short)
    with pytest.raises(StorageError, match="connection reset"):
        commit_epoch(store, tmp_path, 2, salt=1)
    assert latest(store)[0] == "epoch-000001"
    monkeypatch.undo()
    commit_epoch(store, tmp_path, 2, salt=1)
    name, got = latest(store, announce=True)
    assert name == "epoch-000002"
    download(store, name, got, tmp_path / "restore")
    assert (tmp_path / "restore" / DATA).read_bytes() == bytes((2 * 7 + 1 + i) % 256 for i in range(70_000))


def test_a_commit_removes_files_the_new_checkpoint_does_not_have(tmp_path):
    store = open_storage(tmp_path / "c")
    local = tf_files(tmp_path / "a", 1)
    (local / "extra.bin").write_bytes(b"x")
    commit(store, local, meta(1))
    commit(store, tf_files(tmp_path / "b", 1), meta(1))
    assert "epoch-000001/extra.bin" not in {o.name for o in store.list()}
    assert len(latest(store)[1].files) == 3


@pytest.mark.parametrize("change", [{"format_version": 3}, {"format": "something-else"}])
def test_a_checkpoint_json_of_another_format_is_an_error_naming_the_file(store, tmp_path, change):
    commit_epoch(store, tmp_path, 1)
    data = json.loads(store.read_bytes(f"epoch-000001/{META_NAME}"))
    store.write_bytes(f"epoch-000001/{META_NAME}", json.dumps({**data, **change}).encode())
    with pytest.raises(ConfigError) as e:
        latest(store)
    message = str(e.value)
    assert store.where(f"epoch-000001/{META_NAME}") in message and "--checkpoint-dir" in message
    assert ("format_version 3 is not supported" if "format_version" in change else "not a spark-imagenet") in message
    if "format_version" in change:
        assert "a newer spark-imagenet wrote this checkpoint; upgrade spark-imagenet" in message


def test_a_meta_in_the_folder_of_another_epoch_is_an_error(tmp_path):
    store = open_storage(tmp_path / "c")
    commit_epoch(store, tmp_path, 2)
    store.write_bytes(f"epoch-000003/{META_NAME}", store.read_bytes(f"epoch-000002/{META_NAME}"))
    with pytest.raises(ConfigError, match="not 3") as e:
        latest(store)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("epoch", 2)


@pytest.mark.parametrize("how", ["same-size", "other-size"])
def test_download_verifies_and_names_a_corrupted_file(store, tmp_path, how):
    """An object replaced after the commit (the store's own checksum agrees with it) fails the meta's check."""
    commit_epoch(store, tmp_path, 1)
    name, got = latest(store, announce=True)
    size = next(f.size for f in got.files if f.name == DATA)
    store.write_bytes(f"{name}/{DATA}", b"\0" * (size if how == "same-size" else size - 1))
    with pytest.raises(StorageError) as e:
        download(store, name, got, tmp_path / "restore")
    message = str(e.value)
    assert DATA in message and store.where(name) in message and "attempt 2" in message
    assert ("crc32c" if how == "same-size" else f"{size - 1} bytes, checkpoint.json says {size}") in message
    assert not (tmp_path / "restore" / DATA).exists() and not (tmp_path / "restore" / META_NAME).exists()


# ------------------------------------------------------------------ compatibility
def test_check_compatible_names_every_differing_field_and_option():
    m = meta(2)
    check_compatible(m, SETTINGS, "x")  # the same job
    check_compatible(m, dataclasses.replace(SETTINGS, epochs=90), "x")  # extending the run
    check_compatible(m, dataclasses.replace(SETTINGS, epochs=2), "x")  # nothing left to train
    job = dataclasses.replace(SETTINGS, image_size=128, model="other", workers=4, dataset_id="e" * 16)
    with pytest.raises(ConfigError) as e:
        check_compatible(m, job, "gs://b/ck/epoch-000002/checkpoint.json")
    message = str(e.value)
    assert message.startswith("gs://b/ck/epoch-000002/checkpoint.json: ")
    for part in ("--image-size 96 in the checkpoint, 128 in this job", "--model 'alexnet' in the checkpoint, "
                 "'other' in this job", "the global batch (--batch-size x --workers) 16 (8 x 2) in the checkpoint, "
                 "32 (8 x 4) in this job: on 4 worker(s) give --batch-size 4 to keep it",
                 f"dataset_id (the dataset's manifest) '{'d' * 16}' in the checkpoint, '{'e' * 16}' in this job",
                 "use another --checkpoint-dir, or remove the old checkpoints", "epoch 2 (step 24"):
        assert part in message
    for option in ("--width", "--seed", "--learning-rate", "--epochs"):
        assert option not in message.partition(". Run with")[0]
    assert "what may differ: --epochs (more, to extend a run), --workers (with --batch-size keeping" in message


@pytest.mark.parametrize("field, value, option", [
    ("width", 0.5, "--width"), ("seed", 4, "--seed"),
    ("learning_rate", 0.1, "--learning-rate"), ("num_classes", 11, "num_classes (the dataset's classes)"),
    ("optimizer", "lars", "--optimizer"), ("precision", "mixed_float16", "--precision"),
])
def test_check_compatible_refuses_each_setting(field, value, option):
    with pytest.raises(ConfigError, match=f"{re.escape(option)} .* in the checkpoint, {value!r} in this job"):
        check_compatible(meta(1), dataclasses.replace(SETTINGS, **{field: value}), "here")


def test_another_worker_count_resumes_when_the_global_batch_stays():
    m = meta(2)  # 2 workers x 8
    for workers, batch in ((1, 16), (4, 4), (16, 1)):
        check_compatible(m, dataclasses.replace(SETTINGS, workers=workers, batch_size=batch), "here")
    with pytest.raises(ConfigError) as e:
        check_compatible(m, dataclasses.replace(SETTINGS, workers=3, batch_size=5), "here")
    assert ("the global batch (--batch-size x --workers) 16 (8 x 2) in the checkpoint, 15 (5 x 3) in this job: 3 "
            "worker(s) cannot share 16 images per step evenly; resume on 1, 2, 4, 8, 16 worker(s) with --batch-size "
            "16 / workers") in str(e.value)
    with pytest.raises(ConfigError, match=r"on 4 worker\(s\) give --batch-size 4 to keep it"):
        check_compatible(m, dataclasses.replace(SETTINGS, workers=4), "here")


def test_check_compatible_refuses_a_checkpoint_past_the_jobs_epochs():
    with pytest.raises(ConfigError, match=r"--epochs 3 in this job, but the checkpoint has completed 4 epoch\(s\) "
                                          r"\(give --epochs 4 or more"):
        check_compatible(meta(4), dataclasses.replace(SETTINGS, epochs=3), "here")


def test_run_settings_from_a_train_config_and_the_options_exist():
    config = TrainConfig(workers=2, model="alexnet", epochs=5, batch_size=8, image_size=96, width=0.25,
                         learning_rate=0.01, seed=3)
    recipe = {"lr_schedule": "cosine", "lr_boundaries": (), "warmup_epochs": 5.0 * 5 / 90, "lr_scaling": "none",
              "momentum": 0.9, "weight_decay": 0.0005, "label_smoothing": 0.0, "flip": True,
              "crop_area": (0.08, 1.0), "lighting": 0.0}  # alexnet's recipe, resolved for 5 epochs
    settings = dataclasses.replace(SETTINGS, **recipe)
    assert RunSettings.from_config(config, dataset_id="d" * 16, num_classes=10) == settings
    manifest = type("M", (), {"dataset_id": "d" * 16, "num_classes": 10})()
    assert ck.expected_for(config, manifest) == settings
    template = ck.new_meta(config, "d" * 16, 10, 12, {"loss": [3.0, 2.0]})
    assert (template.epoch, template.step, template.files, template.settings()) == (2, 24, (), settings)
    assert CheckpointMeta.loads(template.dumps()) == template  # tuples through JSON lists
    assert template.replace(epoch=3, step=36, history=meta(3).history).history == meta(3).history
    assert ck.new_meta(config, "d" * 16, 10, 12).epoch == 1
    options = {f.metadata["rule"].option for _, f in TrainConfig.settings()}
    assert {o for o in ck.OPTIONS.values() if o.startswith("--")} <= options


# ------------------------------------------------------------------ the meta itself
def test_meta_json_round_trip_and_validation():
    m = dataclasses.replace(meta(3), files=(("ckpt.index", 10, "AAAAAA=="),))
    assert m.files == (CheckpointFile("ckpt.index", 10, "AAAAAA=="),)
    assert CheckpointMeta.loads(m.dumps()) == m
    assert m.settings() == SETTINGS
    assert describe(dataclasses.replace(m, created="2026-12-01T18:00:00Z")) == \
        "the checkpoint of epoch 3 (step 36, 2026-12-01T18:00:00Z)"
    for change, pattern in [({"epoch": -1}, "epoch must be an integer >= 0"),
                            ({"epoch": 6}, "epoch 6 is past the run's epochs 5"),
                            ({"width": "1"}, "width must be a number > 0"),
                            ({"files": [{"name": "../x", "size": 1, "crc32c": "A"}]}, "'../x' is not a file name"),
                            ({"files": [{"name": META_NAME, "size": 1, "crc32c": "A"}]}, "the meta's own name"),
                            ({"files": [{"name": "a"}]}, "malformed files entry"),
                            ({"history": {"loss": [1, 2, 3, 4]}}, "holds 4 values for 3 epoch"),
                            ({"history": {"loss": ["x"]}}, "'loss' must name a list of numbers")]:
        with pytest.raises(ConfigError, match=pattern) as e:
            CheckpointMeta.from_json({**m.to_json(), **change}, "dir/epoch-000003/checkpoint.json")
        assert str(e.value).startswith("dir/epoch-000003/checkpoint.json: ")
    data = m.to_json()
    del data["step"]
    with pytest.raises(ConfigError) as e:
        CheckpointMeta.from_json(data, "f")
    assert type(e.value) is ConfigError and e.value.key == "step"


def test_the_meta_is_written_in_version_2_which_records_every_field():
    data = meta(2).to_json()
    assert data["format_version"] == ck.FORMAT_VERSION == 2
    assert set(dataclasses.asdict(SETTINGS)) <= set(data)
    for name in ("lr_schedule", "optimizer"):
        with pytest.raises(ConfigError) as e:
            CheckpointMeta.from_json({k: v for k, v in data.items() if k != name}, "dir/checkpoint.json")
        assert type(e.value) is ConfigError and e.value.key == name
    with pytest.raises(ConfigError, match=r"lr_schedule is required.*crop_area is required"):
        CheckpointMeta.create(RunSettings(**{**dataclasses.asdict(SETTINGS), **dict.fromkeys(RECIPE)}),
                              epoch=1, step=12)


def test_an_older_format_version_is_refused_with_a_new_checkpoint_dir_to_start():
    """Version 1 (an earlier spark-imagenet's) is not read: the error names the file and says what to do."""
    data = {**meta(2).to_json(), "format_version": 1}
    with pytest.raises(ConfigError) as e:
        CheckpointMeta.from_json(data, "old/epoch-000002/checkpoint.json")
    assert str(e.value).startswith("old/epoch-000002/checkpoint.json: format_version 1 is an older checkpoint format")
    assert "start the run afresh with a new --checkpoint-dir" in str(e.value)
    assert (e.value.key, e.value.value) == ("format_version", 1)
    with pytest.raises(ConfigError) as e:
        CheckpointMeta.from_json({**data, "format_version": 0}, "old/checkpoint.json")
    assert (e.value.key, e.value.value) == ("format_version", 0)


def test_the_meta_values_are_checked_by_the_settings_rules():
    """The same rule as the job's setting: choices, bounds, kinds; every bad field named."""
    data = meta(2).to_json()
    for change, pattern in [({"lr_schedule": "linear"}, "lr_schedule must be one of constant, step, cosine"),
                            ({"precision": "float16"}, "precision must be one of"),
                            ({"momentum": -0.1}, "momentum must be a number >= 0, got -0.1"),
                            ({"crop_area": [0.5, 2]}, "crop_area must be two fractions"),
                            ({"lr_boundaries": [3, 2]}, "lr_boundaries must be increasing"),
                            ({"flip": 1}, "flip must be true or false"),
                            ({"num_classes": 0, "seed": -1}, "num_classes must be an integer >= 1, got 0; seed "
                                                             "must be an integer >= 0, got -1")]:
        with pytest.raises(ConfigError, match=pattern):
            CheckpointMeta.from_json({**data, **change}, "f")
    again = CheckpointMeta.from_json({**data, "momentum": 1, "width": 1}, "f")
    assert (again.momentum, again.width) == (1.0, 1.0) and isinstance(again.momentum, float)


def test_commit_refuses_a_local_dir_holding_checkpoint_json_and_bad_arguments(tmp_path):
    store = open_storage(tmp_path / "c")
    local = tf_files(tmp_path / "tf", 1)
    (local / META_NAME).write_text("{}")
    with pytest.raises(ConfigError, match="the meta's own name"):
        commit(store, local, meta(1))
    with pytest.raises(ConfigError) as e:
        commit(store, local, meta(1), keep=0)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("keep", 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StorageError) as e:
        commit(store, tmp_path / "empty", meta(1))
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("local_path", str(tmp_path / "empty"))
    assert store.list() == []


def test_prune_plan():
    states = {"epoch-000001": True, "epoch-000002": False, "epoch-000003": True, "epoch-000004": True,
              "epoch-000009": False}
    assert ck.prune_plan(5, 2, states) == ["epoch-000003", "epoch-000002", "epoch-000001"]
    assert ck.prune_plan(5, 3, states) == ["epoch-000002", "epoch-000001"]
    assert ck.prune_plan(5, None, states) == ["epoch-000002"]
    assert ck.folder_epoch("epoch-000012") == 12 and ck.folder_epoch("epoch-12") is None
    assert ck.folder_epoch("epoch-1234567") == 1234567 and ck.folder_name(1234567) == "epoch-1234567"


# ------------------------------------------------------------------ the recipe and augmentation
@pytest.mark.parametrize("field, value, option", [
    ("lr_schedule", "constant", "--lr-schedule"), ("lr_scaling", "linear", "--lr-scaling"),
    ("momentum", 0.95, "--momentum"), ("weight_decay", 0.0001, "--weight-decay"),
    ("label_smoothing", 0.1, "--label-smoothing"), ("flip", False, "random flips (off with --no-flip)"),
    ("crop_area", (0.25, 1.0), "--crop-area"), ("lighting", 0.1, "--lighting"),
    ("warmup_epochs", 1.0, "--warmup-epochs"), ("lr_boundaries", (2.0, 4.0), "--lr-boundaries"),
])
def test_every_setting_that_changes_the_math_is_compared(field, value, option):
    recorded = dataclasses.replace(SETTINGS, lr_schedule="cosine", lr_boundaries=(), warmup_epochs=0.5,
                                   lr_scaling="none", momentum=0.9, weight_decay=0.0005, label_smoothing=0.0,
                                   flip=True, crop_area=(0.08, 1.0), lighting=0.0)
    m = CheckpointMeta.create(recorded, epoch=2, step=24)
    check_compatible(m, recorded, "here")
    job = dataclasses.replace(recorded, **{field: value})
    with pytest.raises(ConfigError) as e:
        check_compatible(m, job, "here")
    assert f"{option} {getattr(recorded, field)!r} in the checkpoint, {value!r} in this job" in str(e.value)
    if field in ("warmup_epochs", "lr_boundaries"):  # their defaults follow --epochs: an extension is allowed
        check_compatible(m, dataclasses.replace(job, epochs=10), "here")


def test_a_checkpoint_of_another_schedule_is_refused_before_spark(tmp_path):
    """plan_job (no Spark) reads the latest checkpoint and names the option with both values."""
    from data_util import build, small_layout
    from spark_imagenet.training.driver.launch import plan_job

    data = tmp_path / "bucket"
    manifest = build(small_layout(tmp_path / "src"), data)
    before = TrainConfig(workers=1, epochs=3, image_size=72, width=0.25, batch_size=4, lr_schedule="cosine",
                         checkpoint_dir=str(tmp_path / "ck"))
    meta = ck.new_meta(before, manifest.dataset_id, manifest.num_classes, 6).replace(epoch=1, step=6)
    commit(open_storage(tmp_path / "ck"), tf_files(tmp_path / "tf", 1), meta)
    plan_job(str(data), before)  # the same settings resume
    with pytest.raises(ConfigError) as e:
        plan_job(str(data), before.replace(lr_schedule="constant", momentum=0.8))
    message = str(e.value)
    assert "--lr-schedule 'cosine' in the checkpoint, 'constant' in this job" in message
    assert "--momentum 0.9 in the checkpoint, 0.8 in this job" in message
    assert "epoch-000001" in message and "Run with the checkpoint's values" in message


# ------------------------------------------------------------------ a store that runs out of room
@pytest.fixture
def small_disk(tmp_path):
    """A 180 KiB tmpfs (room for two of tf_files' checkpoints, about 71 KB each, not three); needs root."""
    from disk_util import small_tmpfs

    with small_tmpfs(tmp_path / "disk", 180 * 1024) as where:
        yield where


def test_a_folder_with_room_for_two_checkpoints_keeps_training(small_disk, tmp_path, log_lines):
    """Epoch 3's commit runs out of room; the older checkpoint goes, the commit is tried again and stands; the
    next epochs do the same, and no temp file is left."""
    store = open_storage(small_disk / "ck")
    for epoch in range(1, 6):
        assert commit(store, tf_files(tmp_path / f"tf{epoch}", epoch), meta(epoch)) == \
            f"epoch-{epoch:06d}"
    assert sorted(p.name for p in (small_disk / "ck").iterdir()) == ["epoch-000004", "epoch-000005"]
    assert latest(store)[1].epoch == 5
    assert any("no room in" in line and "removed the older checkpoint(s) epoch-000001" in line for line in log_lines)
    assert not [p for p in (small_disk / "ck").rglob(".*tmp-*")]


def test_a_folder_with_room_for_one_checkpoint_fails_once_with_the_size_and_keeps_the_last(small_disk, tmp_path):
    store = open_storage(small_disk / "ck")
    commit(store, tf_files(tmp_path / "tf1", 1), meta(1), keep=1)
    (small_disk / "filler").write_bytes(b"\0" * 60_000)  # leaves room for one checkpoint, not two
    with pytest.raises(StorageError) as e:
        commit(store, tf_files(tmp_path / "tf2", 2), meta(2), keep=1)
    message = str(e.value)
    assert re.search(r"no room for checkpoint epoch-000002 in .*: it needs 70\.\d KB \(\d+\.?\d* KB free there now\)",
                     message), message
    assert "give a --checkpoint-dir with room for two checkpoints" in message
    assert latest(store)[1].epoch == 1  # the last good checkpoint is whole
    assert sorted(p.name for p in (small_disk / "ck").iterdir()) == ["epoch-000001"]


# ------------------------------------------------------------------ checkpoints inside an epoch
def test_a_checkpoint_inside_an_epoch_ranks_between_the_epochs_and_is_pruned_like_them(tmp_path):
    assert ck.folder_name(2, 120) == "epoch-000002-000120" and ck.folder_position("epoch-000002-000120") == (2, 120)
    assert ck.folder_position("epoch-000002") == (2, 0) and ck.folder_position("epoch-000002-000000") is None
    assert ck.folder_position("epoch-2-5") is None and ck.folder_epoch("epoch-000003-000001") == 3
    store = open_storage(tmp_path / "ck")
    commit(store, tf_files(tmp_path / "tf1", 1), meta(1), keep=3)
    inside = dataclasses.replace(meta(1), step=12 + 5)
    assert commit(store, tf_files(tmp_path / "tf2", 2), inside, keep=3, inside=5) == "epoch-000001-000005"
    name, got = latest(store)
    assert name == "epoch-000001-000005" and (got.epoch, got.step) == (1, 17)
    commit(store, tf_files(tmp_path / "tf3", 3), meta(2), keep=2)  # the newest two: epoch 2 and the one inside it
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["epoch-000001-000005", "epoch-000002"]
    assert ck.prune_plan((2, 3), 1, {"epoch-000002": True, "epoch-000001-000009": True}) == \
        ["epoch-000001-000009"]  # epoch 2's end stays while only checkpoints inside epoch 3 are newer
    first = dataclasses.replace(meta(1), epoch=0, step=4, history={})  # inside the first epoch: 0 epochs done
    assert CheckpointMeta.loads(first.dumps()).epoch == 0
    assert ck.steps_inside("epoch-000002-000120") == 120 and ck.steps_inside("epoch-000002") == 0


def test_pruning_keeps_the_newest_checkpoint_at_an_epochs_end_while_only_checkpoints_inside_the_next_are_newer():
    states = {"epoch-000001": True, "epoch-000001-000004": True, "epoch-000002": True, "epoch-000002-000004": True,
              "epoch-000002-000008": False}
    # inside epoch 3: epoch 2's end stays beyond keep; the half-written one and the older ones go
    assert ck.prune_plan((2, 12), 1, states) == ["epoch-000002-000008", "epoch-000002-000004",
                                                  "epoch-000001-000004", "epoch-000001"]
    assert "epoch-000002" not in ck.prune_plan((2, 12), 1, states)
    assert ck.prune_plan((2, 12), 2, states) == ["epoch-000002-000008", "epoch-000001-000004", "epoch-000001"]
    assert ck.prune_plan(3, 1, states) == ["epoch-000002-000008", "epoch-000002-000004", "epoch-000002",
                                           "epoch-000001-000004", "epoch-000001"]  # at epoch 3's end: none kept
    # the newest at an epoch's end is the one kept, even when half-written ones of later epochs' ends are around
    assert ck.prune_plan((2, 4), 1, {"epoch-000001": True, "epoch-000002": False}) == ["epoch-000002"]
    assert ck.prune_plan((2, 4), 1, {"epoch-000001": True, "epoch-000001-000005": True}) == ["epoch-000001-000005"]


def test_commits_inside_an_epoch_keep_its_start_until_the_next_epochs_end(tmp_path):
    store = open_storage(tmp_path / "ck")
    assert ck.latest_at_epoch_end(store) is None
    commit(store, tf_files(tmp_path / "tf1", 1), meta(1), keep=1)
    for i, step in enumerate((3, 6, 9)):
        commit(store, tf_files(tmp_path / f"in{step}", 2, i), dataclasses.replace(meta(1), step=12 + step), keep=1,
               inside=step)
        assert folders(store) == ["epoch-000001", f"epoch-000001-{step:06d}"]
    name, got = ck.latest_at_epoch_end(store)
    assert name == "epoch-000001" and got.step == 12
    commit(store, tf_files(tmp_path / "tf2", 2), meta(2), keep=1)
    assert folders(store) == ["epoch-000002"] and ck.latest_at_epoch_end(store)[0] == "epoch-000002"


def test_no_room_inside_an_epoch_counts_the_checkpoint_kept_at_the_epochs_end(tmp_path):
    store = open_storage(tmp_path / "ck")
    items = [("x", CheckpointFile("ckpt.index", 2048, "AAAAAA=="))]
    message = str(ck.no_room(store, "epoch-000001-000005", items))
    assert "but the newest complete one and the newest at an epoch's end, which are kept" in message
    assert "room for three checkpoints (two without --checkpoint-every)" in message
    assert "room for two checkpoints, then" in str(ck.no_room(store, "epoch-000002", items))


# ------------------------------------------------------------------ another worker count inside an epoch
INSIDE = dataclasses.replace(meta(1), step=12 + 6)  # 2 workers x 8, 6 steps into epoch 2 (epoch-000001-000006)
ONE = dataclasses.replace(SETTINGS, workers=1, batch_size=16)  # the same global batch on one worker


def test_a_checkpoint_inside_an_epoch_resumes_on_its_own_worker_count_only():
    assert ck.differences(INSIDE, SETTINGS, inside=6, epoch_start="epoch-000001") == []  # the same count: exact
    assert ck.differences(meta(1), ONE, inside=0) == []  # at an epoch's end: any count that keeps the global batch
    [line] = ck.differences(INSIDE, ONE, inside=6, epoch_start="epoch-000001")
    assert line == ("--workers 1 in this job, but the checkpoint was written 6 step(s) into epoch 2 by 2 worker(s), "
                    "and only that count trains exactly the records the epoch has left (each worker's share and "
                    "order of an epoch's records follow from the worker count): resume on 2 worker(s) with "
                    "--workers 2 --batch-size 8 to finish epoch 2 exactly, or resume on any worker count from "
                    "epoch-000001, the newest checkpoint at an epoch's end (the steps after it are trained again): "
                    "remove the checkpoint folders newer than epoch-000001, then run this command again")


def test_the_second_way_on_is_named_only_where_it_exists():
    [line] = ck.differences(INSIDE, ONE, inside=6)
    assert line.endswith("to finish epoch 2 exactly (no complete checkpoint at an epoch's end is left to train "
                         "epoch 2 again from its start)")
    first = dataclasses.replace(meta(1), epoch=0, step=4, history={})
    [line] = ck.differences(first, ONE, inside=4)
    assert "4 step(s) into epoch 1 by 2 worker(s)" in line
    assert line.endswith("or train epoch 1 from its start on any worker count: remove the checkpoint folders (all "
                         "inside epoch 1), then run this command again")


def test_check_compatible_refuses_another_count_inside_an_epoch_with_the_folder_and_the_global_batch():
    where = "--checkpoint-dir /ck, epoch-000001-000006"
    with pytest.raises(ConfigError) as e:
        check_compatible(INSIDE, ONE, where, inside=6, epoch_start="epoch-000001")
    message = str(e.value)
    assert message.startswith(f"{where}: this job cannot resume from the checkpoint of epoch 1 (step 18, ")
    assert "--workers 2 --batch-size 8 to finish epoch 2 exactly" in message and "from epoch-000001" in message
    with pytest.raises(ConfigError) as e:  # another global batch too: both said at once
        check_compatible(INSIDE, dataclasses.replace(ONE, batch_size=8), where, inside=6)
    assert "the global batch (--batch-size x --workers) 16 (8 x 2)" in str(e.value)
    assert "resume on 2 worker(s) with --workers 2 --batch-size 8" in str(e.value)
