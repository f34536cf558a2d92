"""MLflow tracking against a real ``mlflow server`` (SQLite backend, local artifact root): the run record and its
sending (fast), a tracked training job read back with ``MlflowClient`` and its model loaded through
``mlflow.pyfunc`` (slow), a server that is down. A killed worker and a resumed job staying in the same run are
checked by tests/test_fault_tolerance.py's runs, which track to the same server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from spark_imagenet.errors import ConfigError
from spark_imagenet.logs import collect
from spark_imagenet.training.driver import tracking as driver_tracking
from spark_imagenet.training.driver.tracking import RunRecord, send_pending, send_record
from spark_imagenet.training.job.config import TrainConfig

pytest.importorskip("mlflow", reason="the mlflow extra is not installed: pip install '.[test]'")


def _record(uri: str, experiment: str, **fields) -> RunRecord:
    return RunRecord(uri=uri, experiment=experiment, run_name="r", tags={"team": "vision"},
                     params={"workers": "2", "epochs": "3"}, **fields)


@pytest.mark.slow  # a server or a Spark job (the fast tier stays under 5 minutes)
def test_a_record_is_sent_once_and_a_second_send_repeats_nothing(mlflow_server):
    rows = [["xent", 2.0, 1, 1000], ["xent", 1.5, 2, 2000], ["top1", 0.25, 1, 1000]]
    record = _record(mlflow_server.uri, "fast-record", metrics=rows, results={"val": {"top1": 0.5}},
                     status="FINISHED")
    assert RunRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    run_id = send_record(record)
    client = mlflow_server.client()
    run = client.get_run(run_id)
    assert run.data.params == {"workers": "2", "epochs": "3"} and run.data.tags["team"] == "vision"
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "xent")] == [(1, 2.0), (2, 1.5)]
    record.metrics.append(["xent", 1.0, 3, 3000])
    record.params["epochs"] = "4"  # a resumed job that grew --epochs: MLflow keeps the first value
    assert send_record(record) == run_id
    assert sorted(m.step for m in client.get_metric_history(run_id, "xent")) == [1, 2, 3]  # nothing repeated
    run = client.get_run(run_id)
    assert run.data.params["epochs"] == "3" and run.data.tags["spark_imagenet.changed_on_resume"] == "epochs=4"
    local = client.download_artifacts(run_id, "results.json")
    assert json.loads(Path(local).read_text()) == {"val": {"top1": 0.5}}


@pytest.mark.slow  # a server or a Spark job (the fast tier stays under 5 minutes)
def test_a_down_server_keeps_the_record_and_mlflow_log_sends_it_later(mlflow_server, tmp_path, monkeypatch):
    from gcs_emulator import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    down = f"http://127.0.0.1:{free_port()}"
    record = _record(down, "fast-pending", metrics=[["top1", 0.5, 1, 1000]], status="FINISHED")
    with pytest.raises(Exception):
        send_record(record)
    pending = tmp_path / "mlflow-pending.json"
    pending.write_text(json.dumps(record.to_json()))
    with pytest.raises(Exception, match=f"cannot be reached \\(cannot connect to 127.0.0.1:.*\\); {pending} is kept"):
        send_pending(str(pending))
    assert pending.exists()
    record.uri = mlflow_server.uri  # the server is back (here: the URI fixed by hand)
    pending.write_text(json.dumps(record.to_json()))
    run_id = send_pending(str(pending))
    assert not pending.exists()
    assert [m.value for m in mlflow_server.client().get_metric_history(run_id, "top1")] == [0.5]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="bad.json: not a spark-imagenet MLflow run record"):
        send_pending(str(tmp_path / "bad.json"))
    (tmp_path / "part.json").write_text(json.dumps({"format": "spark-imagenet-mlflow-run", "format_version": 1}))
    with pytest.raises(ConfigError, match=r"part.json: not an MLflow run record \(it lacks experiment, uri\)"):
        send_pending(str(tmp_path / "part.json"))


def test_register_model_without_output_is_refused_before_spark(tmp_path):
    from bucket_util import make_bucket
    from spark_imagenet.training.driver.launch import plan_job

    bucket = make_bucket(tmp_path / "bucket")
    with pytest.raises(ConfigError, match="needs --output") as e:
        plan_job(str(bucket), TrainConfig(workers=2, register_model="m"))
    assert (e.value.key, e.value.value) == ("--register-model", "m")
    assert TrainConfig(workers=2, mlflow_experiment="x").tracking.enabled
    assert not TrainConfig(workers=2).tracking.enabled


def test_a_databricks_workspace_host_comes_from_the_runtime_the_environment_or_the_profile(tmp_path):
    from spark_imagenet.training.driver.databricks_tracking import check_workspace_known

    cfg = tmp_path / "databrickscfg"
    none = {"DATABRICKS_CONFIG_FILE": str(cfg)}
    check_workspace_known(str(tmp_path / "runs"), none)  # not Databricks: nothing to check
    with pytest.raises(ConfigError, match=rf"\(databricks\).*profile DEFAULT in {cfg} nor in DATABRICKS_HOST: add a "
                       r"\[DEFAULT\] profile .* or set DATABRICKS_HOST and DATABRICKS_TOKEN"):
        check_workspace_known("databricks", none)
    check_workspace_known("databricks", {**none, "DATABRICKS_RUNTIME_VERSION": "16.4"})  # on a Databricks cluster
    check_workspace_known("databricks", {**none, "DATABRICKS_HOST": "https://x.cloud.databricks.com"})
    cfg.write_text("[DEFAULT]\nhost = https://x.cloud.databricks.com\ntoken = t\n\n[prod]\ntoken = t\n"
                   "\n[dev]\nhost = https://dev.cloud.databricks.com\n")
    check_workspace_known("databricks", none)
    check_workspace_known("databricks://dev", none)
    check_workspace_known("databricks", {**none, "DATABRICKS_CONFIG_PROFILE": "dev"})
    # a named profile is read from the file only (the environment's host is not that profile's)
    with pytest.raises(ConfigError, match=r"\(databricks://qa\).*profile qa in .*databrickscfg: add a \[qa\] profile"):
        check_workspace_known("databricks://qa", {**none, "DATABRICKS_HOST": "https://x.cloud.databricks.com"})
    cfg.write_text("[dev]\nhost = https://dev.cloud.databricks.com\n")
    with pytest.raises(ConfigError, match="no workspace host was found for the profile DEFAULT"):
        check_workspace_known("databricks", none)
    cfg.write_text("host = no section\n")
    with pytest.raises(ConfigError, match=rf"the Databricks configuration file {cfg} cannot be read"):
        check_workspace_known("databricks://dev", none)
    cfg.write_bytes(b"[DEFAULT]\nhost = \xff\xfe\n")  # not UTF-8
    with pytest.raises(ConfigError, match=rf"{cfg} cannot be read \(UnicodeDecodeError: "):
        check_workspace_known("databricks", none)
    with pytest.raises(ConfigError, match=rf"{tmp_path} cannot be read \(IsADirectoryError: "):
        check_workspace_known("databricks", {"DATABRICKS_CONFIG_FILE": str(tmp_path)})


def test_a_databricks_workspace_needs_an_experiment_path_before_spark(tmp_path, monkeypatch):
    from bucket_util import make_bucket
    from spark_imagenet.training.driver.launch import plan_job

    bucket = str(make_bucket(tmp_path / "bucket"))
    for name in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_TRACKING_URI", "DATABRICKS_CONFIG_PROFILE",
                 "DATABRICKS_RUNTIME_VERSION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABRICKS_HOST", "https://adb-1.2.azuredatabricks.net")
    with pytest.raises(ConfigError, match=r"Databricks workspace \(databricks\).*no experiment was named: pass "
                       r"--mlflow-experiment /Users/<you>/spark-imagenet"):
        plan_job(bucket, TrainConfig(workers=2, mlflow_tracking_uri="databricks"))
    with pytest.raises(ConfigError, match=r"\(databricks://prod\).*the experiment 'alexnet'"):
        plan_job(bucket, TrainConfig(workers=2, mlflow_tracking_uri="databricks://prod", mlflow_experiment="alexnet"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "databricks")  # MLflow's own default, as on a Databricks cluster
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "runs")
    with pytest.raises(ConfigError, match="the experiment 'runs'"):
        plan_job(bucket, TrainConfig(workers=2, mlflow=True))
    # a workspace path, or an experiment named by id, passes this check
    plan_job(bucket, TrainConfig(workers=2, mlflow_tracking_uri="databricks", mlflow_experiment="/Users/a@b.c/x"))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "123")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    plan_job(bucket, TrainConfig(workers=2, mlflow=True))
    # no workspace host anywhere: refused before Spark too
    monkeypatch.delenv("DATABRICKS_HOST")
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "no.databrickscfg"))
    with pytest.raises(ConfigError, match="no workspace host was found for the profile DEFAULT"):
        plan_job(bucket, TrainConfig(workers=2, mlflow=True))
    # elsewhere a plain name is fine
    plan_job(bucket, TrainConfig(workers=2, mlflow_tracking_uri=str(tmp_path / "runs"), mlflow_experiment="alexnet"))


# ------------------------------------------------------------------ training jobs (slow)
SMALL = {"batch_size": 4, "image_size": 72, "width": 0.25, "learning_rate": 0.01, "epochs": 3, "parallel": 1}


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    from data_util import small_bucket

    return small_bucket(tmp_path_factory.mktemp("mlflow-data"), train_per_class=8)


def _train_images(bucket: Path) -> list[Path]:
    """Four training JPEGs of the bucket's tree."""
    return sorted((bucket.parent / "kaggle").glob("ILSVRC/Data/CLS-LOC/train/*/*.JPEG"))[::8][:4]


def _runs(client, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


@pytest.mark.slow
def test_a_tracked_job_is_one_run_with_every_epoch_the_validation_and_a_registered_model(
        spark, bucket, tmp_path, mlflow_server, monkeypatch):
    """Params, one series per epoch metric (steps 1..3, from the chief only), the final validation, the dataset,
    results.json, the model (loaded back with mlflow.pyfunc: predictions equal predict's) and version 1 of the
    registered model."""
    from spark_imagenet.training.driver.launch import train

    out = tmp_path / "out"
    result = train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", output=str(out), **SMALL,
                                                   mlflow_tracking_uri=mlflow_server.uri, mlflow_experiment="e2e",
                                                   mlflow_run_name="tiny", mlflow_tags={"team": "vision"},
                                                   register_model="tiny-alexnet"))
    client = mlflow_server.client()
    (run,) = _runs(client, "e2e")
    rid = run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny" and run.data.tags["team"] == "vision"
    assert run.data.params["workers"] == "2" and run.data.params["batch_size"] == "4"
    manifest = json.loads((bucket / "manifest.json").read_text())
    assert run.data.params["dataset_id"] == manifest["dataset_id"] and run.data.params["train_images"] == "32"
    for key in ("xent", "top1", "top5", "learning_rate", "images_per_sec"):
        assert [m.step for m in client.get_metric_history(rid, key)] == [1, 2, 3], key
    assert [m.value for m in client.get_metric_history(rid, "xent")] == pytest.approx(result.history["xent"])
    assert run.data.metrics["val_top1"] == pytest.approx(result.val.top1)
    assert run.inputs.dataset_inputs[0].dataset.source == json.dumps({"url": str(bucket)})
    (version,) = client.search_model_versions("name='tiny-alexnet'")
    assert version.version == "1" and version.run_id == rid
    _check_model_equals_predict("models:/tiny-alexnet/1", mlflow_server.uri, out, _train_images(bucket))


def _check_model_equals_predict(model_uri: str, tracking_uri: str, out: Path, files: list[Path]) -> None:
    """The logged model's probabilities on the evaluation view of real JPEGs equal ``predict``'s (1e-5)."""
    import subprocess
    import sys

    script = f"""
import os, json, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import mlflow, numpy as np, tensorflow as tf
from spark_imagenet.training.worker import predict as p, preprocessing
mlflow.set_tracking_uri({tracking_uri!r})
model = mlflow.pyfunc.load_model({model_uri!r})
files = {[str(f) for f in files]!r}
size = {72}
pixels = np.stack([preprocessing.eval_image(tf.constant(p.jpeg_bytes(__import__('pathlib').Path(f))), size).numpy()
                   for f in files]).astype(np.float32)
got = np.asarray(model.predict(pixels))
keras_model = p.load_model({str(out)!r})
labels = p.read_labels({str(out)!r}, None, None)
want = p.predict(keras_model, [__import__('pathlib').Path(f) for f in files], labels, top=len(labels))
for row, w in zip(got, want):
    for c in w["top"]:
        assert abs(row[c["id"]] - c["probability"]) < 1e-5, (row, w)
print("EQUAL", len(files))
"""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert "EQUAL" in done.stdout, done.stdout[-3000:] + done.stderr[-5000:]


@pytest.mark.slow
def test_a_tracking_server_that_is_down_neither_fails_nor_stops_training(spark, bucket, tmp_path, monkeypatch):
    """A URI where nothing listens: training finishes; one warning at the start, one at the end naming
    --output/mlflow-pending.json, which holds every epoch's metrics."""
    from gcs_emulator import free_port

    from spark_imagenet.training.driver.launch import train

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr(driver_tracking, "START_WAIT_S", 5.0)
    monkeypatch.setattr(driver_tracking, "FINISH_WAIT_S", 5.0)
    out = tmp_path / "out"
    with collect() as lines:
        result = train(spark, str(bucket), TrainConfig(workers=2, cache=tmp_path / "cache", output=str(out),
                                                       mlflow_tracking_uri=f"http://127.0.0.1:{free_port()}",
                                                       **{**SMALL, "epochs": 1}))
    text = "\n".join(lines)
    assert result.val.top1 is not None
    warnings = [line for line in lines if line.startswith("warning: mlflow")]
    assert len(warnings) == 1 and "cannot connect to 127.0.0.1" in warnings[0], text  # one warning, at once
    assert f"spark-imagenet mlflow-log {out}/mlflow-pending.json" in text, text
    record = RunRecord.from_json(json.loads((out / "mlflow-pending.json").read_text()))
    assert record.status == "FINISHED" and {r[0] for r in record.metrics} == {
        "xent", "top1", "top5", "learning_rate", "images_per_sec", "val_xent", "val_top1", "val_top5"}
    assert (out / "mlflow-model" / "MLmodel").exists() and record.model_url == f"{out}/mlflow-model"
    assert np.isfinite([r[1] for r in record.metrics]).all()


def test_the_reason_of_a_failed_call_is_quoted_whole_or_cut_at_a_word():
    from spark_imagenet.training.driver.tracking import _why
    from spark_imagenet.training.job.tracking import WHY_CHARS

    assert _why(RuntimeError("the tracking URI can be either 'databricks' or 'databricks://profile'"), 20) == \
        "RuntimeError: the tracking URI can be either 'databricks' or 'databricks://profile'"
    long = _why(RuntimeError("profile " * 400), 20)
    assert long.endswith("profile ...") and len(long) <= WHY_CHARS + 4
    assert _why(None, 20) == "no answer within 20 s"


def test_the_chiefs_warning_quotes_the_servers_error_whole():
    from spark_imagenet.logs import collect
    from spark_imagenet.training.job.tracking import TrackingSpec
    from spark_imagenet.training.worker.tracking import EpochMetricsSender

    error = RuntimeError("API request to http://127.0.0.1:1/api/2.0/mlflow/runs/log-batch failed with exception "
                         "HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded with url: "
                         "/api/2.0/mlflow/runs/log-batch (Caused by NewConnectionError('<urllib3.connection."
                         "HTTPConnection object at 0x7f2a>: Failed to establish a new connection: [Errno 111] "
                         "Connection refused'))")
    sender = object.__new__(EpochMetricsSender)  # no thread: only its warning
    sender._spec = TrackingSpec("http://127.0.0.1:1", "1", "r")
    with collect() as lines:
        sender._give_up(error)
    assert lines == [f"warning: mlflow: the epochs' metrics are not sent to http://127.0.0.1:1 as they come "
                     f"(RuntimeError: {error}); training goes on, and the driver sends them when the job ends"]
