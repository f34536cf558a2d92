"""TrainConfig (validated once, versioned JSON) and TOML job files (WorkerSpec: tests/test_plan.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job.config import (
    ENVELOPE,
    SECTION_OF,
    DataConfig,
    RecipeConfig,
    RunConfig,
    ScalingConfig,
    TrainConfig,
)
from spark_imagenet.training.job.jobfile import dump_job, load_job_file, resolve_job


# ------------------------------------------------------------------ TrainConfig
def test_defaults_and_normalisation():
    c = TrainConfig(workers=2, width=1, learning_rate=1, cache=Path("/tmp/c"), conf={"b": "2", "a": True})
    assert (c.recipe.model, c.recipe.epochs, c.recipe.batch_size, c.recipe.image_size, c.data.seed, c.data.transfers) == ("alexnet", 1, 32, 224, 0, 8)
    assert isinstance(c.recipe.width, float) and isinstance(c.recipe.learning_rate, float)
    assert c.data.cache == "/tmp/c" and c.scaling.conf == (("a", "true"), ("b", "2")) and c.spark_conf == {"a": "true", "b": "2"}
    assert c.global_batch_size == 64
    with pytest.raises(Exception):
        c.epochs = 3  # frozen


@pytest.mark.parametrize("change", [
    {"workers": 0}, {"workers": True}, {"batch_size": "32"}, {"epochs": 0}, {"image_size": 32}, {"width": 0.0},
    {"learning_rate": -1.0}, {"parallel": 0}, {"seed": -1}, {"transfers": 0}, {"model": ""}, {"model": "alexnt"},
])
def test_bad_values_name_the_key_and_the_value(change):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**{"workers": 2, **change})
    [(key, value)] = change.items()
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)


def test_a_bad_value_is_worded_with_its_option_and_the_choices():
    """Wording test (settings): the message names the setting, its option and what would do."""
    with pytest.raises(ConfigError, match=r"^image_size \(--image-size\) 32 is too small for alexnet: its layers "
                                          r"need at least 67 px"):
        TrainConfig(workers=2, image_size=32)
    with pytest.raises(ConfigError, match=r"'alexnt' is not a known model \(did you mean 'alexnet'\?\); choose one "
                                          r"of: alexnet"):
        TrainConfig(workers=2, model="alexnt")


def test_a_nan_width_and_a_bad_conf_value_name_their_setting():
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=2, width=float("nan"))
    assert e.value.key == "width"
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=2, conf={"spark.x": [1]})
    assert (e.value.key, e.value.value) == ("conf", [1])


def test_workers_are_required():
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_mapping({})
    assert (e.value.key, e.value.value) == ("workers", None)


def test_unknown_keys_suggest_the_closest_and_list_the_known():
    """Wording test (unknown keys): the closest known name and the list of known keys."""
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_mapping({"workers": 2, "bach_size": 8, "zzz": 1}, "train()")
    msg = str(e.value)
    assert "'bach_size' (did you mean 'batch_size'?)" in msg and "'zzz'" in msg
    assert "known keys are: scaling, data, recipe, run, tracking, workers, gpus_per_worker" in msg


def test_json_round_trip_and_version():
    c = TrainConfig(workers=3, epochs=7, results="r.json", conf={"spark.a": "1"})
    data = json.loads(json.dumps(c.to_json()))
    assert data["format_version"] == ENVELOPE.version and data["conf"] == {"spark.a": "1"}
    assert TrainConfig.from_json(data) == c
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_json({**data, "format_version": 99})
    assert (e.value.key, e.value.value) == ("format_version", 99)
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_json([1])
    assert (e.value.key, e.value.value) == ("format", [1])


# ------------------------------------------------------------------ job files
def test_job_file_round_trip(tmp_path):
    c = TrainConfig(workers=2, epochs=3, cache="/data/cache", conf={"spark.executor.memory": "4g"})
    text = dump_job(c, "gs://b/imagenet")
    assert text.startswith('url = "gs://b/imagenet"\n\n[scaling]\nworkers = 2\n')
    assert "parallel" not in text and "[scaling.conf]" in text  # no value: omitted
    assert text.index("[data]") < text.index("cache =") < text.index("[recipe]") < text.index("epochs = 3")
    path = tmp_path / "job.toml"
    path.write_text(text)
    values = load_job_file(path)
    assert values["url"] == "gs://b/imagenet"
    again = resolve_job([{k: v for k, v in values.items() if k != "url"}])
    assert again == c and dump_job(again, values["url"]) == text


def test_layers_later_wins_and_conf_merges_per_key():
    c = resolve_job([{"workers": 4, "epochs": 10}, {"epochs": 2, "conf": {"a": "1", "b": "1"}},
                     {"epochs": None, "conf": {"b": "2"}}])
    assert c.scaling.workers == 4 and c.recipe.epochs == 2 and c.spark_conf == {"a": "1", "b": "2"}


@pytest.mark.parametrize("text, key, value", [
    ("workers = 2\nbach_size = 3\n", "bach_size", 3),
    ("[scaling]\nworkers = 2\nepochs = 3\n", "epochs", None),
    ("[recipe]\nepoch = 3\n", "epoch", 3),
    ("workers = 2\n[scaling]\nworkers = 3\n", "workers", None),
    ("recipe = 3\n", "recipe", 3),
    ("[scaling]\nconf = 3\n", "conf", 3),
    ("url = 3\n", "url", 3),
    ("conf = 3\n", "conf", 3),
])
def test_bad_job_files_name_the_file_and_the_key(tmp_path, text, key, value):
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_job_file(path)
    assert str(path) in str(e.value)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)


def test_a_job_file_in_the_wrong_section_is_worded_with_the_right_one(tmp_path):
    """Wording test (job files): the file, the setting and the section it belongs in."""
    path = tmp_path / "job.toml"
    path.write_text("[scaling]\nworkers = 2\nepochs = 3\n")
    with pytest.raises(ConfigError, match=rf"^job file {re.escape(str(path))}: \[scaling\] has no setting 'epochs': "
                                          r"it belongs in \[recipe\]$"):
        load_job_file(path)


def test_an_unreadable_or_invalid_job_file_names_the_option(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_job_file(tmp_path / "none.toml")
    assert (e.value.key, e.value.value) == ("--config", str(tmp_path / "none.toml"))
    path = tmp_path / "job.toml"
    path.write_text("workers = 2\nepochs = = 3\n")
    with pytest.raises(ConfigError) as e:
        load_job_file(path)
    assert (e.value.key, e.value.value) == ("--config", str(path)) and "line 2" in str(e.value)


def test_example_job_file_documents_every_key_with_its_default():
    path = Path(__file__).resolve().parents[1] / "conf" / "job.example.toml"
    text = path.read_text()
    values = load_job_file(path)
    assert values["workers"] == 4
    defaults = TrainConfig(workers=4)
    for key in TrainConfig.keys():
        assert f"{key} =" in text or f"[{key}]" in text, key
        if key in values and key not in ("workers", "conf"):
            assert values[key] == getattr(getattr(defaults, SECTION_OF[key]), key), key


def test_sections_hold_the_settings_and_only_they_read_them():
    c = TrainConfig(scaling=ScalingConfig(workers=4, strategy="multiworker"), recipe={"epochs": 9, "model": "alexnet"},
                    run=RunConfig(output="gs://b/run"), batch_size=16)
    assert isinstance(c.recipe, RecipeConfig) and isinstance(c.data, DataConfig)
    assert (c.scaling.workers, c.recipe.epochs, c.recipe.batch_size, c.run.output) == (4, 9, 16, "gs://b/run")
    assert c == TrainConfig(workers=4, epochs=9, batch_size=16, output="gs://b/run")
    assert c.replace(epochs=3).recipe.epochs == 3 and c.replace(epochs=3).scaling == c.scaling
    assert c.recipe.learning_rate == 0.01  # the model's recipe fills what is left at None
    assert [name for name, _ in TrainConfig.settings()][:1] == ["scaling"] and len(TrainConfig.keys()) == 49
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=1, run=ScalingConfig(workers=1))
    assert e.value.key == "run" and isinstance(e.value.value, ScalingConfig)
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=1, scaling={"epochs": 3})
    assert (e.value.key, e.value.value) == ("epochs", 3)
    with pytest.raises(ConfigError) as e:
        ScalingConfig(workers=2, strategy="mirrored")  # a section checks its own settings
    assert (e.value.key, e.value.value) == ("strategy", "mirrored")
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=2, seed=2**32 - 1)  # and the job the checks across sections
    assert (e.value.key, e.value.value) == ("seed", 2**32 - 1)
    with pytest.raises(AttributeError, match="no attribute 'epochs'"):
        c.epochs  # noqa: B018 - one spelling: config.recipe.epochs


def test_a_job_file_without_sections_still_loads(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text('workers = 2\nepochs = 3\noutput = "run"\n[conf]\n"spark.a" = "1"\n')
    c = resolve_job([load_job_file(path)])
    assert (c.scaling.workers, c.recipe.epochs, c.run.output, c.spark_conf) == (2, 3, str(tmp_path / "run"), {"spark.a": "1"})
    path.write_text('url = "d"\n[scaling]\nworkers = 2\n[scaling.conf]\n"spark.a" = "1"\n[recipe]\nepochs = 3\n')
    values = load_job_file(path)
    assert values == {"url": str(tmp_path / "d"), "workers": 2, "conf": {"spark.a": "1"}, "epochs": 3}


def test_conf_tables_flatten_dotted_keys_and_bad_conf_is_a_config_error():
    c = TrainConfig(workers=2, conf={"spark": {"executor": {"memory": "4g"}}, "spark.task.cpus": 1})
    assert c.spark_conf == {"spark.executor.memory": "4g", "spark.task.cpus": "1"}
    for bad in ("spark.x=1", 5, {"a": None}, {"a": [1]}):
        with pytest.raises(ConfigError) as e:
            TrainConfig(workers=2, conf=bad)
        assert e.value.key == "conf"


def test_seed_leaves_room_for_every_rank():
    assert TrainConfig(workers=1, seed=2**32 - 1).data.seed == 2**32 - 1
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=4, seed=2**32 - 1)
    assert (e.value.key, e.value.value) == ("seed", 2**32 - 1) and "at most 4294967292" in str(e.value)


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


@pytest.mark.parametrize("key, value, meant", [("url", "gs:/b/p", "gs://b/p"), ("output", "s3:bucket/run", "s3://bucket/run"),
                                               ("checkpoint_dir", "hdfs:/nn/ckpt", "hdfs://nn/ckpt")])
def test_a_store_url_without_its_two_slashes_is_refused_not_taken_for_a_local_path(tmp_path, key, value, meant):
    """Wording test (store URLs in a job file): the setting, the URL and how to write it."""
    from spark_imagenet.training.job.jobfile import absolute_paths

    with pytest.raises(ConfigError, match=rf"{key} '{value}' is not a URL: a .*:// URL has two slashes after .*; "
                                          rf"write {meant}$"):
        absolute_paths({key: value}, tmp_path)
    path = tmp_path / "job.toml"
    path.write_text(f'{key} = "{value}"\nworkers = 2\n')
    with pytest.raises(ConfigError) as e:
        load_job_file(path)
    assert (e.value.key, e.value.value) == (key, value)
    assert absolute_paths({"url": "data:set"}, tmp_path)["url"] == str(tmp_path / "data:set")  # not a store


def test_strategy_and_all_reduce_choices_are_checked_with_the_option_named():
    assert TrainConfig(workers=1, strategy="mirrored", cross_device_ops="reduction-to-one").scaling.strategy == "mirrored"
    for settings, key, value in ((dict(workers=1, strategy="horovod"), "strategy", "horovod"),
                                 (dict(workers=4, strategy="mirrored"), "strategy", "mirrored"),
                                 (dict(workers=2, cross_device_ops="reduction-to-one"), "cross_device_ops",
                                  "reduction-to-one"),
                                 (dict(workers=2, gpus_per_worker=-1), "gpus_per_worker", -1)):
        with pytest.raises(ConfigError) as e:
            TrainConfig(**settings)
        assert (e.value.key, e.value.value) == (key, value)
    with pytest.raises(ConfigError, match=r"runs one worker .* but workers \(--workers\) is 4: use --workers 1"):
        TrainConfig(workers=4, strategy="mirrored")  # wording test (settings that disagree): what to do


def test_the_default_strategy_refuses_gpus_it_would_leave_idle():
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=1, strategy="default", gpus_per_worker=2)
    assert (e.value.key, e.value.value) == ("gpus_per_worker", 2)
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=2, strategy="default")
    assert (e.value.key, e.value.value) == ("strategy", "default")


@pytest.mark.parametrize("master", ["bogus://x", "local[", "spark:/host:7077", "yarn-client", "localhost:7077"])
def test_a_master_that_is_no_spark_url_is_refused_with_the_forms_spark_takes(master):
    """Wording test (--master): the URL given and the forms Spark takes."""
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=1, master=master)
    assert f"master (--master) {master!r} is not a Spark master URL" in str(e.value)
    assert "spark://HOST:PORT, yarn, k8s://https://HOST:PORT, or sc://HOST:PORT" in str(e.value)
    assert (e.value.key, e.value.value) == ("master", master)


# ------------------------------------------------------------------ recipe keys (issue 13)
@pytest.mark.parametrize("key, value", [
    ("crop_area", 0.5), ("crop_area", [0.6, 0.2]), ("lr_boundaries", 30), ("lr_boundaries", [60, 30]),
])
def test_a_scalar_or_bad_list_for_a_list_key_is_one_config_error(key, value):
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=2, lr_schedule="step", **{key: value})
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)


def test_recipe_values_follow_the_model_and_the_epochs():
    alexnet = TrainConfig(workers=1, epochs=90)
    resnet = TrainConfig(workers=1, epochs=45, model="resnet50", image_size=64)
    assert (alexnet.recipe.lr_schedule, alexnet.recipe.warmup_epochs, alexnet.recipe.weight_decay) == ("cosine", 5.0, 5e-4)
    assert (resnet.recipe.learning_rate, resnet.recipe.lr_scaling, resnet.recipe.warmup_epochs, resnet.recipe.weight_decay) == \
        (0.1, "linear", 2.5, 1e-4)
    assert TrainConfig(workers=1, warmup_epochs=0.0).recipe.warmup_epochs == 0.0  # an option given wins


def test_dumped_job_leaves_recipe_values_to_the_recipe(tmp_path):
    config = TrainConfig(workers=2, epochs=3, model="resnet50", image_size=64, momentum=0.8)
    path = tmp_path / "job.toml"
    path.write_text(dump_job(config))
    values = load_job_file(path)
    assert "warmup_epochs" not in values and values["momentum"] == 0.8  # given: kept
    assert TrainConfig.from_mapping(values) == config
    longer = TrainConfig.from_mapping({**values, "epochs": 90})
    assert longer.recipe.warmup_epochs == 5.0 and longer.recipe.momentum == 0.8


def test_overwrite_is_a_setting_of_the_job_file_and_the_command_line(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('workers = 2\noutput = "run"\noverwrite = true\n')
    config = resolve_job([load_job_file(job)])
    assert config.run.overwrite and config.run.output == str(tmp_path / "run")
    assert "overwrite = true" in dump_job(config)
    assert not TrainConfig(workers=1).run.overwrite
    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=1, overwrite="yes")
    assert (e.value.key, e.value.value) == ("overwrite", "yes")


def test_keep_checkpoints_is_a_run_setting_of_the_job_file_and_the_command_line(tmp_path):
    assert TrainConfig(workers=1).run.keep_checkpoints == 2
    job = tmp_path / "job.toml"
    job.write_text("workers = 2\n[run]\nkeep_checkpoints = 5\n")
    config = resolve_job([load_job_file(job)])
    assert config.run.keep_checkpoints == 5 and "keep_checkpoints = 5" in dump_job(config)
    for bad in (0, "3", 1.5):
        with pytest.raises(ConfigError) as e:
            TrainConfig(workers=1, keep_checkpoints=bad)
        assert (e.value.key, e.value.value) == ("keep_checkpoints", bad)


def test_keep_checkpoints_may_change_when_a_run_resumes():
    from spark_imagenet.training.job.checkpoints import CheckpointMeta, RunSettings, check_compatible, new_meta

    before = TrainConfig(workers=1, epochs=3, keep_checkpoints=2)
    meta = new_meta(before, "d", 10, 4, {}).replace(epoch=2, step=8)
    assert isinstance(meta, CheckpointMeta)
    check_compatible(meta, RunSettings.from_config(before.replace(keep_checkpoints=7), dataset_id="d",
                                                   num_classes=10), "here")


def test_print_config_writes_floats_with_six_significant_digits(tmp_path):
    """--print-config (dump_job) writes 0.3, not 0.30000000000000004, also in the recipe's comment lines and in
    lists, and reads back to the rounded values."""
    config = TrainConfig(workers=2, epochs=7, learning_rate=0.1 * 3, crop_area=(1 / 3, 1.0))
    text = dump_job(config)
    assert "learning_rate = 0.3\n" in text and "0.30000000000000004" not in text
    assert "# warmup_epochs = 0.388889  (the alexnet recipe's)" in text  # 7 epochs of 90's 5: 0.3888...
    assert "0.333333," in text and "0.3333333333" not in text
    job = tmp_path / "job.toml"
    job.write_text(text)
    again = resolve_job([load_job_file(job)])
    assert again.recipe.learning_rate == 0.3 and again.data.crop_area == (0.333333, 1.0)
    assert again.recipe.warmup_epochs == config.recipe.warmup_epochs  # a comment: derived from the recipe again


def test_a_rule_words_the_place_of_a_value_it_checks_outside_the_settings():
    """Wording test (a value's rule): check_value's place: another record (worker.json, checkpoint.json) names its key instead of an option; the
    ConfigError keeps the field's name as .key either way."""
    from spark_imagenet.training.job.settings import Rule, check_value

    rule = Rule("int", minimum=1, option="--workers")
    with pytest.raises(ConfigError, match=r"^workers \(--workers\) must be an integer >= 1, got 0$"):
        check_value("workers", rule, 0)
    with pytest.raises(ConfigError, match=r"^worker.json: key 'workers' must be an integer >= 1, got 0$") as e:
        check_value("workers", rule, 0, "worker.json: key 'workers'")
    assert (e.value.key, e.value.value) == ("workers", 0)
    assert check_value("peers", Rule("strings"), ["h:1"]) == ("h:1",)



def test_an_errors_key_and_value_survive_pickling():
    """Errors cross processes (a barrier task's to the driver): what they are about goes with them."""
    import pickle

    with pytest.raises(ConfigError) as e:
        TrainConfig(workers=2, batch_size="32")
    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is ConfigError and (again.key, again.value, str(again)) == ("batch_size", "32", str(e.value))
