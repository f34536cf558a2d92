"""TrainConfig (validated once, versioned JSON), TOML job files, and WorkerSpec, the
one message of the TensorFlow worker process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.config import (
    JOB_FORMAT_VERSION,
    TrainConfig,
    WorkerSpec,
    dump_job,
    load_job_file,
    resolve_job,
)


def worker_spec(**changes) -> WorkerSpec:
    fields = dict(config=TrainConfig(workers=2, batch_size=8), rank=1, workers=2, num_classes=10,
                  train_files=("/c/train-00001.tfrecord",), train_examples=40, val_files=("/c/val-00000.tfrecord",),
                  val_record_shard=(2, 1), val_examples=9, val_examples_total=18, steps_per_epoch=5, val_steps=2,
                  parallel=2, threads=1)
    fields.update(changes)
    return WorkerSpec(**fields)


# ------------------------------------------------------------------ TrainConfig
def test_defaults_and_normalisation():
    c = TrainConfig(workers=2, width=1, learning_rate=1, cache=Path("/tmp/c"), conf={"b": "2", "a": True})
    assert (c.model, c.epochs, c.batch_size, c.image_size, c.seed, c.transfers) == ("alexnet", 1, 32, 224, 0, 8)
    assert isinstance(c.width, float) and isinstance(c.learning_rate, float)
    assert c.cache == "/tmp/c" and c.conf == (("a", "true"), ("b", "2")) and c.spark_conf == {"a": "true", "b": "2"}
    assert c.global_batch_size == 64
    with pytest.raises(Exception):
        c.epochs = 3  # frozen


@pytest.mark.parametrize("change, fragment", [
    ({"workers": 0}, "workers (--workers) must be an integer >= 1, got 0"),
    ({"workers": True}, "workers (--workers) must be an integer, got True"),
    ({"batch_size": "32"}, "batch_size (--batch-size) must be an integer, got '32'"),
    ({"epochs": 0}, "--epochs"),
    ({"image_size": 32}, "image_size (--image-size) 32 is too small for alexnet: its layers need at least 67 px"),
    ({"width": 0.0}, "width (--width) must be a positive number"),
    ({"width": float("nan")}, "--width"),
    ({"learning_rate": -1.0}, "--learning-rate"),
    ({"parallel": 0}, "--parallel"),
    ({"seed": -1}, "--seed"),
    ({"transfers": 0}, "--transfers"),
    ({"model": ""}, "--model"),
    ({"model": "alexnt"}, "'alexnt' is not a known model (did you mean 'alexnet'?); choose one of: alexnet"),
    ({"conf": {"spark.x": [1]}}, "conf (--conf)"),
])
def test_bad_values_name_the_key_and_the_option(change, fragment):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**{"workers": 2, **change})
    assert fragment in str(e.value)


def test_workers_are_required():
    with pytest.raises(ConfigError, match=r"workers \(--workers\) is required"):
        TrainConfig.from_mapping({})


def test_unknown_keys_suggest_the_closest_and_list_the_known():
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_mapping({"workers": 2, "bach_size": 8, "zzz": 1}, "train()")
    msg = str(e.value)
    assert "'bach_size' (did you mean 'batch_size'?)" in msg and "'zzz'" in msg
    assert "known keys are: workers, model, epochs, batch_size" in msg


def test_json_round_trip_and_version():
    c = TrainConfig(workers=3, epochs=7, results="r.json", conf={"spark.a": "1"})
    data = json.loads(json.dumps(c.to_json()))
    assert data["format_version"] == JOB_FORMAT_VERSION and data["conf"] == {"spark.a": "1"}
    assert TrainConfig.from_json(data) == c
    with pytest.raises(ConfigError, match="format_version 99 is not supported"):
        TrainConfig.from_json({**data, "format_version": 99})
    with pytest.raises(ConfigError, match="expected a JSON object"):
        TrainConfig.from_json([1])


# ------------------------------------------------------------------ job files
def test_job_file_round_trip(tmp_path):
    c = TrainConfig(workers=2, epochs=3, cache="/data/cache", conf={"spark.executor.memory": "4g"})
    text = dump_job(c, "gs://b/imagenet")
    assert text.startswith('url = "gs://b/imagenet"\nworkers = 2\n')
    assert "parallel" not in text and "[conf]" in text  # no value: omitted
    path = tmp_path / "job.toml"
    path.write_text(text)
    values = load_job_file(path)
    assert values["url"] == "gs://b/imagenet"
    again = resolve_job([{k: v for k, v in values.items() if k != "url"}])
    assert again == c and dump_job(again, values["url"]) == text


def test_layers_later_wins_and_conf_merges_per_key():
    c = resolve_job([{"workers": 4, "epochs": 10}, {"epochs": 2, "conf": {"a": "1", "b": "1"}},
                     {"epochs": None, "conf": {"b": "2"}}])
    assert c.workers == 4 and c.epochs == 2 and c.spark_conf == {"a": "1", "b": "2"}


@pytest.mark.parametrize("text, fragments", [
    ("workers = 2\nbach_size = 3\n", ["unknown key(s) 'bach_size' (did you mean 'batch_size'?)", "url, workers"]),
    ("workers = 2\nepochs = = 3\n", ["not a valid TOML file", "line 2"]),
    ("url = 3\n", ["url must be a dataset URL string"]),
    ("conf = 3\n", ["conf must be a table"]),
])
def test_bad_job_files_name_the_file_and_the_key(tmp_path, text, fragments):
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_job_file(path)
    assert str(path) in str(e.value)
    for fragment in fragments:
        assert fragment in str(e.value)


def test_missing_job_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the job file"):
        load_job_file(tmp_path / "none.toml")


def test_example_job_file_documents_every_key_with_its_default():
    path = Path(__file__).resolve().parents[1] / "conf" / "job.example.toml"
    text = path.read_text()
    values = load_job_file(path)
    assert values["workers"] == 4
    defaults = TrainConfig(workers=4)
    for key in TrainConfig.keys():
        assert f"{key} =" in text or f"[{key}]" in text, key
        if key in values and key not in ("workers", "conf"):
            assert values[key] == getattr(defaults, key), key


# ------------------------------------------------------------------ WorkerSpec
def test_worker_spec_json_round_trip():
    spec = worker_spec()
    data = json.loads(json.dumps(spec.to_json()))
    assert data["format"] == "spark-imagenet-worker-spec" and data["config"]["batch_size"] == 8
    assert WorkerSpec.from_json(data) == spec
    assert spec.seed == 1  # job seed 0 + rank 1


@pytest.mark.parametrize("change, fragment", [
    ({"rank": 2}, "rank 2 is not in 0..workers-1"),
    ({"workers": 3}, "workers = 3 but the job has 2"),
    ({"train_files": ()}, "no train_files"),
    ({"val_steps": 1}, "val_steps 1 * batch_size 8 is less than this worker's val_examples 9"),
    ({"val_files": ()}, "val_examples is 9 but val_files is empty"),
    ({"val_record_shard": (2, 2)}, "val_record_shard must be null or [n, i]"),
    ({"steps_per_epoch": 0}, "steps_per_epoch must be an integer >= 1"),
    ({"train_files": "one.tfrecord"}, "train_files must be a list of file paths"),
])
def test_worker_spec_rejects_impossible_values(change, fragment):
    with pytest.raises(ConfigError) as e:
        worker_spec(**change)
    assert fragment in str(e.value)


def test_worker_spec_from_json_names_missing_and_unknown_keys():
    data = worker_spec().to_json()
    del data["val_steps"]
    with pytest.raises(ConfigError, match="missing key.*val_steps"):
        WorkerSpec.from_json(data)
    data = {**worker_spec().to_json(), "learning_rate": 0.1}
    with pytest.raises(ConfigError, match="unknown key.*'learning_rate'"):
        WorkerSpec.from_json(data)
    data = worker_spec().to_json()
    data["config"]["model"] = "vgg16"
    with pytest.raises(ConfigError, match="'vgg16' is not a known model"):
        WorkerSpec.from_json(data)


def test_conf_tables_flatten_dotted_keys_and_bad_conf_is_a_config_error():
    c = TrainConfig(workers=2, conf={"spark": {"executor": {"memory": "4g"}}, "spark.task.cpus": 1})
    assert c.spark_conf == {"spark.executor.memory": "4g", "spark.task.cpus": "1"}
    for bad in ("spark.x=1", 5, {"a": None}, {"a": [1]}):
        with pytest.raises(ConfigError, match=r"conf \(--conf\)"):
            TrainConfig(workers=2, conf=bad)


def test_seed_leaves_room_for_every_rank():
    assert TrainConfig(workers=1, seed=2**32 - 1).seed == 2**32 - 1
    with pytest.raises(ConfigError, match="at most 4294967292") as e:
        TrainConfig(workers=4, seed=2**32 - 1)
    assert e.value.key == "seed"


def test_job_file_paths_are_relative_to_the_file(tmp_path):
    folder = tmp_path / "jobs"
    folder.mkdir()
    path = folder / "job.toml"
    path.write_text('url = "data/shards"\nworkers = 2\ncache = "/abs/cache"\nresults = "r.json"\n')
    values = load_job_file(path)
    assert values["url"] == str(folder / "data" / "shards") and values["results"] == str(folder / "r.json")
    assert values["cache"] == "/abs/cache"
    path.write_text('url = "gs://b/p"\nworkers = 2\n')
    assert load_job_file(path)["url"] == "gs://b/p"


def test_strategy_and_all_reduce_choices_are_checked_with_the_option_named():
    assert TrainConfig(workers=1, strategy="mirrored", cross_device_ops="reduction-to-one").strategy == "mirrored"
    with pytest.raises(ConfigError, match=r"strategy \(--strategy\) must be one of multiworker, mirrored, default"):
        TrainConfig(workers=1, strategy="horovod")
    with pytest.raises(ConfigError, match=r"runs one worker .* but workers \(--workers\) is 4: use --workers 1"):
        TrainConfig(workers=4, strategy="mirrored")
    with pytest.raises(ConfigError, match="reduction-to-one does not apply to --strategy multiworker"):
        TrainConfig(workers=2, cross_device_ops="reduction-to-one")
    with pytest.raises(ConfigError, match=r"gpus_per_worker \(--gpus-per-worker\) must be an integer >= 0"):
        TrainConfig(workers=2, gpus_per_worker=-1)


def test_the_default_strategy_refuses_gpus_it_would_leave_idle():
    with pytest.raises(ConfigError, match=r"--gpus-per-worker\) 2 with --strategy default.*--strategy mirrored"):
        TrainConfig(workers=1, strategy="default", gpus_per_worker=2)
    with pytest.raises(ConfigError, match=r"default runs one worker \(on one device\)"):
        TrainConfig(workers=2, strategy="default")


@pytest.mark.parametrize("master", ["bogus://x", "local[", "spark:/host:7077", "yarn-client", "localhost:7077"])
def test_a_master_that_is_no_spark_url_is_refused_with_the_forms_spark_takes(master):
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=1, master=master)
    assert f"master (--master) {master!r} is not a Spark master URL" in str(e.value)
    assert "spark://HOST:PORT, yarn, k8s://https://HOST:PORT, or sc://HOST:PORT" in str(e.value)


# ------------------------------------------------------------------ recipe keys (issue 13)
@pytest.mark.parametrize("key, value, fragment", [
    ("crop_area", 0.5, "two fractions MIN MAX"),
    ("crop_area", [0.6, 0.2], "two fractions MIN MAX"),
    ("lr_boundaries", 30, "list of positive epoch numbers"),
    ("lr_boundaries", [60, 30], "increasing"),
])
def test_a_scalar_or_bad_list_for_a_list_key_is_one_config_error(key, value, fragment):
    with pytest.raises(ConfigError, match=fragment) as e:
        TrainConfig(workers=2, lr_schedule="step", **{key: value})
    assert e.value.key == key


def test_recipe_values_follow_the_model_and_the_epochs():
    alexnet = TrainConfig(workers=1, epochs=90)
    resnet = TrainConfig(workers=1, epochs=45, model="resnet50", image_size=64)
    assert (alexnet.lr_schedule, alexnet.warmup_epochs, alexnet.weight_decay) == ("cosine", 5.0, 5e-4)
    assert (resnet.learning_rate, resnet.lr_scaling, resnet.warmup_epochs, resnet.weight_decay) == \
        (0.1, "linear", 2.5, 1e-4)
    assert TrainConfig(workers=1, warmup_epochs=0.0).warmup_epochs == 0.0  # an option given wins


def test_dumped_job_leaves_recipe_values_to_the_recipe(tmp_path):
    config = TrainConfig(workers=2, epochs=3, model="resnet50", image_size=64, momentum=0.8)
    path = tmp_path / "job.toml"
    path.write_text(dump_job(config))
    values = load_job_file(path)
    assert "warmup_epochs" not in values and values["momentum"] == 0.8  # given: kept
    assert TrainConfig.from_mapping(values) == config
    longer = TrainConfig.from_mapping({**values, "epochs": 90})
    assert longer.warmup_epochs == 5.0 and longer.momentum == 0.8
