"""The driver's side of MLflow tracking (``--mlflow``): one MLflow run per job, its settings, dataset, final
validation, results and model; the chief logs each epoch's metrics (:mod:`spark_imagenet.training.job.tracking`).

A tracking server that is down or slow never fails or slows training:

* at the start the driver waits at most :data:`START_WAIT_S` seconds for the run to be created; without it the
  job trains untracked for now, with one warning, and the chief logs no live metrics;
* at the end everything the run should hold is sent again (what the server already has is not repeated:
  parameters by key, metrics by key and step), waiting at most :data:`FINISH_WAIT_S` seconds;
* what could not be sent is written as a :class:`RunRecord` to ``--output`` (or the working folder) as
  :data:`PENDING_FILE`, with one warning naming it; ``spark-imagenet mlflow-log FILE`` sends it later
  (:func:`send_record`, the same code that sends at the end of a job).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from spark_imagenet.errors import ConfigError, SparkImagenetError, StorageError, install_hint
from spark_imagenet.storage import open_storage
from spark_imagenet.storage.committed import download_folder
from spark_imagenet.storage.envelope import Envelope
from spark_imagenet.training.driver import databricks_tracking
from spark_imagenet.training.driver.spark_session import tcp_unreachable
from spark_imagenet.training.job.plan import JobPlan
from spark_imagenet.training.job.tracking import (
    EPOCH_METRICS,
    MODEL_DIR,
    MODEL_NAME,
    PENDING_FILE,
    RUN_FILE,
    VAL_METRICS,
    TrackingSpec,
    failure_text,
)

logger = logging.getLogger(__name__)

#: Seconds the job's start waits for the tracking server to create (or reopen) the run.
START_WAIT_S = 20.0
#: Seconds the job's end waits for everything to be sent.
FINISH_WAIT_S = 120.0
#: The experiment of a job that names none (and sets no ``MLFLOW_EXPERIMENT_NAME``).
DEFAULT_EXPERIMENT = "spark-imagenet"
#: MLflow's limit on a parameter's value, in characters.
PARAM_CHARS = 6000
PENDING = Envelope("spark-imagenet-mlflow-run", 1, "spark-imagenet MLflow run record")


def mlflow_module() -> Any:
    """The ``mlflow`` package.

    Raises:
        ConfigError: it is not installed (says how to install it).
    """
    try:
        import mlflow
    except ImportError:
        raise ConfigError("--mlflow needs the mlflow package on the driver and the executors: "
                          f"{install_hint('mlflow')}") from None
    return mlflow


@dataclasses.dataclass
class RunRecord:
    """Everything one job's MLflow run holds, in a form that can wait in a file and be sent later.

    Attributes:
        uri: the tracking URI.
        experiment: the experiment's name, or ``id:EXPERIMENT_ID``.
        run_name: the run's name, or None for MLflow's.
        run_id: the run, once created (or the checkpoints' run, continued), else None.
        tags: the run's tags.
        params: the settings and the dataset's numbers, as strings.
        metrics: ``[key, value, step, timestamp in ms]`` rows.
        dataset: ``{"name", "digest", "url"}`` of the training data, or None.
        model_url: the ``--output`` URL of the MLflow model folder the chief wrote, or None.
        register_model: the name to register the model under, or None.
        results: the job's results (the ``results.json`` form), logged as an artifact, or None.
        status: the run's end status (``FINISHED``, ``FAILED``, ``KILLED``), or None while running.
    """

    uri: str
    experiment: str
    run_name: str | None = None
    run_id: str | None = None
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    metrics: list[list[Any]] = dataclasses.field(default_factory=list)
    dataset: dict[str, str] | None = None
    model_url: str | None = None
    register_model: str | None = None
    results: dict[str, Any] | None = None
    status: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as a versioned JSON object (:data:`PENDING`)."""
        return PENDING.to_json(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: Any, where: str = PENDING_FILE) -> "RunRecord":
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: not a record of this format and version (names ``where``).
        """
        fields = PENDING.from_json(data, where)
        known = {f.name for f in dataclasses.fields(cls)}
        missing = sorted({"uri", "experiment"} - set(fields))
        unknown = sorted(set(fields) - known)
        if missing or unknown:
            raise ConfigError(f"{where}: not an MLflow run record ("
                              + "; ".join(part for part in (f"it lacks {', '.join(missing)}" if missing else "",
                                                            f"unknown key(s) {', '.join(unknown)}" if unknown else "")
                                          if part) + ")")
        return cls(**fields)


def _params(job: JobPlan) -> dict[str, str]:
    """The job's settings (every setting by name, ``conf`` as JSON) and the dataset's numbers, as strings."""
    config = job.config.to_json()
    values = {k: v for k, v in config.items() if k not in ("format", "format_version")}
    values.update(dataset_url=job.url, dataset_id=job.dataset_id, num_classes=job.num_classes,
                  train_images=_examples(job, "train"), val_images=_examples(job, "val"),
                  global_batch_size=job.config.global_batch_size)
    out = {}
    for key, value in values.items():
        text = json.dumps(value) if isinstance(value, (dict, list, tuple)) else str(value)
        out[key] = text[:PARAM_CHARS]
    return out


def _examples(job: JobPlan, split: str) -> int:
    """The examples of the dataset's ``split`` (0 when it has none)."""
    info = job.manifest.splits.get(split)
    return int(info.examples) if info is not None else 0


def new_record(job: JobPlan) -> RunRecord:
    """The record of ``job`` before it runs: where it is tracked, its settings, tags and dataset."""
    from spark_imagenet import __version__

    tracking = job.config.tracking
    uri, experiment = _where(job)
    tags = {"spark_imagenet.version": __version__, "spark_imagenet.run_id": job.run_id or "",
            "spark_imagenet.model": job.config.recipe.model, **dict(tracking.mlflow_tags)}
    dataset = {"name": f"{job.url.rstrip('/').rsplit('/', 1)[-1] or 'dataset'}", "digest": job.dataset_id[:36],
               "url": job.url}
    model_url = f"{job.output.url.rstrip('/')}/{MODEL_DIR}" if job.output is not None else None
    return RunRecord(uri=str(uri), experiment=experiment, run_name=tracking.mlflow_run_name, tags=tags,
                     params=_params(job), dataset=dataset, model_url=model_url,
                     register_model=tracking.register_model)


def _where(job: JobPlan) -> tuple[str, str]:
    """``(tracking URI, experiment)`` of ``job``: its settings, else MLflow's environment, else MLflow's default
    URI and :data:`DEFAULT_EXPERIMENT` (``id:ID`` for an experiment named by ``MLFLOW_EXPERIMENT_ID``)."""
    tracking = job.config.tracking
    uri = str(tracking.mlflow_tracking_uri or mlflow_module().get_tracking_uri())
    experiment = tracking.mlflow_experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or (
        f"id:{os.environ['MLFLOW_EXPERIMENT_ID']}" if os.environ.get("MLFLOW_EXPERIMENT_ID") else DEFAULT_EXPERIMENT)
    return uri, experiment


def check_tracking_settings(job: JobPlan) -> None:
    """Refuse a tracked job's settings before Spark starts: mlflow installed, ``register_model`` with ``--output``
    (the model reaches MLflow through it), and on Databricks an experiment that is a workspace path and a workspace
    known from somewhere (:mod:`~spark_imagenet.training.driver.databricks_tracking`). The preflight makes it a
    finding (:func:`~spark_imagenet.training.driver.preflight.phases.check_tracking`).

    Raises:
        ConfigError: the first setting that cannot work, named.
    """
    mlflow_module()  # installed, whatever the URI
    uri, experiment = _where(job)
    databricks_tracking.check_experiment(uri, experiment, DEFAULT_EXPERIMENT)
    databricks_tracking.check_workspace_known(uri)
    if job.config.tracking.register_model and job.output is None:
        raise ConfigError("--register-model needs --output: the chief writes the model there and the driver "
                          "logs it to MLflow from it", key="--register-model", value=job.config.tracking.register_model)


def _experiment_id(client: Any, experiment: str) -> str:
    """The id of the experiment named ``experiment`` (``id:ID`` names it by id), created when absent."""
    if experiment.startswith("id:"):
        return experiment[3:]
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(experiment)
    except Exception:  # noqa: BLE001 - another job created it meanwhile: read it again, or raise the first error
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise
        return found.experiment_id


def open_run(record: RunRecord, client: Any) -> TrackingSpec:
    """Create the record's run (or reopen ``record.run_id``, marked running again), and log its parameters,
    tags and dataset; ``record.run_id`` is set.

    Returns:
        TrackingSpec: the run, for the chief.

    Raises:
        Exception: whatever MLflow's client raises (the server down, refused, ...).
    """
    from mlflow.entities import Dataset, DatasetInput, InputTag, Param, RunTag

    experiment_id = _experiment_id(client, record.experiment)
    if record.run_id:
        client.update_run(record.run_id, status="RUNNING")
    else:
        run = client.create_run(experiment_id, run_name=record.run_name, tags=record.tags)
        record.run_id = run.info.run_id
    have = client.get_run(record.run_id).data.params
    changed = sorted(k for k, v in record.params.items() if k in have and have[k] != v)
    new = [Param(k, v) for k, v in record.params.items() if k not in have]
    tags = [RunTag(k, str(v)) for k, v in record.tags.items()]
    if changed:  # MLflow keeps a parameter's first value: a resumed job says which differ
        tags.append(RunTag("spark_imagenet.changed_on_resume", ", ".join(
            f"{k}={record.params[k]}" for k in changed)[:PARAM_CHARS]))
    for i in range(0, max(len(new), 1), 100):
        client.log_batch(record.run_id, params=new[i:i + 100], tags=tags if i == 0 else [])
    if record.dataset is not None:
        d = record.dataset
        source = json.dumps({"url": d["url"]})
        client.log_inputs(record.run_id, [DatasetInput(Dataset(d["name"], d["digest"], "spark-imagenet", source),
                                                       [InputTag("mlflow.data.context", "train")])])
    return TrackingSpec(uri=record.uri, experiment_id=experiment_id, run_id=record.run_id)


def _missing_metrics(record: RunRecord, client: Any) -> list[Any]:
    """The record's metrics the run does not hold yet (by key and step), as MLflow ``Metric`` objects."""
    from mlflow.entities import Metric

    have: dict[str, set[int]] = {}
    out = []
    for key, value, step, stamp in record.metrics:
        if key not in have:
            have[key] = {m.step for m in client.get_metric_history(record.run_id, key)}
        if int(step) not in have[key]:
            out.append(Metric(key, float(value), int(stamp), int(step)))
            have[key].add(int(step))
    return out


def _log_model(record: RunRecord, client: Any, experiment_id: str) -> str | None:
    """Log the MLflow model folder at ``record.model_url`` as the run's model and register it when asked;
    returns the model's id, or None when the folder holds no model (no ``--output`` model was written)."""
    from mlflow.entities import LoggedModelOutput

    assert record.model_url is not None and record.run_id is not None
    folder, prefix = record.model_url.rsplit("/", 1)
    storage = open_storage(folder)
    if not storage.exists(f"{prefix}/MLmodel"):
        return None
    with tempfile.TemporaryDirectory(prefix="spark-imagenet-mlflow-") as tmp:
        try:
            download_folder(storage, tmp, prefix=prefix)
        except StorageError as e:
            raise StorageError(f"cannot read the MLflow model {record.model_url}: {e}") from None
        model = client.create_logged_model(experiment_id, name=MODEL_NAME, source_run_id=record.run_id,
                                           model_type="tensorflow")
        client.log_model_artifacts(model.model_id, tmp)
    client.finalize_logged_model(model.model_id, "READY")
    steps = [int(step) for _, _, step, _ in record.metrics] or [0]
    client.log_outputs(record.run_id, [LoggedModelOutput(model.model_id, max(steps))])
    if record.register_model:
        _register(client, record.register_model, model.model_id, record.run_id)
    return model.model_id


def _register(client: Any, name: str, model_id: str, run_id: str) -> None:
    """Register model ``model_id`` as a new version of ``name`` (the registered model created when absent)."""
    try:
        client.create_registered_model(name)
    except Exception as e:  # noqa: BLE001 - it exists already: add a version to it
        if "already exists" not in str(e).lower() and "RESOURCE_ALREADY_EXISTS" not in str(e):
            raise
    version = client.create_model_version(name, f"models:/{model_id}", run_id=run_id, model_id=model_id)
    client.set_tag(run_id, "spark_imagenet.registered_model", f"{name} version {version.version}")
    logger.info(f"mlflow: registered the model as {name} version {version.version}")


def send_record(record: RunRecord, client: Any | None = None) -> str:
    """Send everything ``record`` holds that its run does not have yet, and end the run with its status.

    Creates the run when ``record.run_id`` is None. Parameters are sent by key, metrics by key and step, so a
    record can be sent again after a partial failure without repeating anything but the model.

    Args:
        record: the run's record; ``run_id`` is set when this returns.
        client: an ``MlflowClient`` for ``record.uri`` (None: made here).

    Returns:
        str: the run's id.

    Raises:
        ConfigError: mlflow is not installed.
        Exception: whatever MLflow's client raises.
    """
    mlflow = mlflow_module()
    client = client or mlflow.MlflowClient(record.uri)
    spec = open_run(record, client)
    metrics = _missing_metrics(record, client)
    for i in range(0, len(metrics), 1000):
        client.log_batch(spec.run_id, metrics=metrics[i:i + 1000])
    if record.results is not None:
        client.log_text(spec.run_id, json.dumps(record.results, indent=1, sort_keys=True), "results.json")
    if record.model_url is not None and record.status == "FINISHED":
        model_id = _log_model(record, client, spec.experiment_id)
        record.model_url = None  # sent: a second send does not log it again
        if model_id is None:
            logger.warning("warning: mlflow: no model was logged: --output holds no MLflow model folder")
    if record.status is not None:
        client.set_terminated(spec.run_id, record.status)
    return spec.run_id


def _bounded(work: Callable[[], Any], seconds: float, name: str) -> tuple[bool, Any]:
    """Run ``work`` in a daemon thread and wait at most ``seconds``: ``(True, value)``, ``(False, exception)``,
    or ``(False, None)`` when it did not finish in time (it goes on in the background)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not done.wait(seconds):
        return False, None
    return ("error" not in box), box.get("value", box.get("error"))


#: Seconds to wait for a TCP connection to an http(s) tracking server before calling it unreachable.
PROBE_S = 5.0


def unreachable(uri: str, timeout_s: float = PROBE_S) -> str | None:
    """Why an ``http://`` or ``https://`` tracking server cannot be reached (a refused or timed-out TCP
    connection to its host and port), in a few words; None when it can be, or for any other kind of URI
    (``databricks``, ``sqlite:///...``, a path), which MLflow's own calls are left to judge."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    why = tcp_unreachable(parts.hostname, port, timeout_s)
    return None if why is None else f"cannot connect to {parts.hostname}:{port}: {why}"


def _why(error: Any, seconds: float) -> str:
    """The reason of a failed or late MLflow call, on one line
    (:func:`~spark_imagenet.training.job.tracking.failure_text`)."""
    if error is None:
        return f"no answer within {seconds:g} s"
    return failure_text(error)


class RunTracker:
    """The MLflow run of one job, on the driver: opened before the launch (:meth:`begin`), finished after it
    (:meth:`finish`).

    Attributes:
        record: what the run holds (:class:`RunRecord`).
        spec: the run for the chief, or None when the tracking server did not take it in time.
    """

    def __init__(self, job: JobPlan, record: RunRecord) -> None:
        self._job, self.record = job, record
        self.spec: TrackingSpec | None = None
        self.warned = False  # the start's warning said the server did not take the run
        self._opening = dataclasses.replace(record)  # the start's copy, which its thread may fill in late

    @classmethod
    def begin(cls, job: JobPlan, resuming: bool) -> "RunTracker | None":
        """Create the job's run, or continue the run of the checkpoints it resumes from; None when the job is
        not tracked. Waits at most :data:`START_WAIT_S` seconds; a server that does not answer in time, or
        fails, gets one warning and the job trains on."""
        if not job.config.tracking.enabled:
            return None
        tracker = cls(job, new_record(job))
        earlier = _checkpoints_run(job, tracker.record.uri) if resuming else None
        tracker._opening.run_id = earlier
        client = mlflow_module().MlflowClient(tracker.record.uri)
        down = unreachable(tracker.record.uri)
        ok, value = (False, down) if down else _bounded(lambda: open_run(tracker._opening, client), START_WAIT_S,
                                                         "mlflow-start")
        if not ok:
            tracker.warned = True
            logger.warning(f"warning: mlflow: the tracking server {tracker.record.uri} did not take the run "
                           f"({value if down else _why(value, START_WAIT_S)}); training goes on, and the run is "
                           "sent when the job ends (or written to a file to send later)")
            return tracker
        tracker.spec = value
        tracker.record.run_id = value.run_id
        _remember_run(job, value)
        logger.info(f"mlflow: run {value.run_id} in experiment {tracker.record.experiment} at {tracker.record.uri}"
                    + (" (the checkpoints' run, continued)" if earlier == value.run_id else ""))
        return tracker

    def finish(self, result: Any | None, error: BaseException | None) -> None:
        """Send the run's metrics, results and model and end it (``FINISHED``, ``FAILED`` or ``KILLED``); what
        cannot be sent within :data:`FINISH_WAIT_S` seconds is written to :data:`PENDING_FILE` with one warning.

        Args:
            result: the job's :class:`~spark_imagenet.training.driver.results.Result`, or None when it failed.
            error: why the job failed, or None.
        """
        record = self.record
        record.run_id = record.run_id or self._opening.run_id  # a start that answered late
        record.status = "FINISHED" if error is None else (
            "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        if result is not None:
            record.metrics.extend(result_metrics(result, self._job.config.recipe.epochs))
            record.results = result.to_json()
        client = mlflow_module().MlflowClient(record.uri)
        down = unreachable(record.uri)
        ok, value = (False, down) if down else _bounded(lambda: send_record(record, client), FINISH_WAIT_S,
                                                         "mlflow-finish")
        if ok:
            logger.info(f"mlflow: run {value} {record.status.lower()} at {record.uri}")
            return
        where = self._write_pending()
        say = logger.info if self.warned else logger.warning  # one warning per job: the start's, if it warned
        say(f"{'' if self.warned else 'warning: '}mlflow: the tracking server {record.uri} did not take the run's "
            f"end ({value if down else _why(value, FINISH_WAIT_S)}); nothing is lost: {where} holds the run; send "
            f"it with: spark-imagenet mlflow-log {where}")

    def _write_pending(self) -> str:
        """Write the record to ``--output`` (else the working folder); returns where it went."""
        data = json.dumps(self.record.to_json(), indent=1).encode()
        if self._job.output is not None:
            try:
                self._job.output.write_bytes(PENDING_FILE, data)
                return f"{self._job.output.url.rstrip('/')}/{PENDING_FILE}"
            except SparkImagenetError as e:
                logger.warning(f"warning: mlflow: cannot write {PENDING_FILE} to --output ({e}); writing it here")
        path = os.path.abspath(PENDING_FILE)
        with open(path, "wb") as f:
            f.write(data)
        return path


def result_metrics(result: Any, epochs: int) -> list[list[Any]]:
    """The metric rows of a job's result: each epoch's :data:`EPOCH_METRICS` from its history (step = the
    epoch; a series shorter than ``xent``'s, from checkpoints written before it was kept, covers the last
    epochs), and the validation as :data:`VAL_METRICS` at step ``epochs``."""
    stamp = int(time.time() * 1000)
    rows = []
    done = len(result.history.get("xent", ()))
    for key in EPOCH_METRICS:
        series = list(result.history.get(key, ()))
        first = max(done - len(series), 0) + 1
        rows.extend([key, float(value), first + i, stamp] for i, value in enumerate(series))
    val = result.val
    for key, value in zip(VAL_METRICS, (val.loss, val.top1, val.top5)):
        if value is not None:
            rows.append([key, float(value), epochs, stamp])
    return rows


def _checkpoints_run(job: JobPlan, uri: str) -> str | None:
    """The MLflow run recorded in ``--checkpoint-dir`` (:data:`RUN_FILE`) when it was tracked at ``uri``."""
    if job.checkpoints is None or not job.checkpoints.exists(RUN_FILE):
        return None
    try:
        earlier = TrackingSpec.from_json(json.loads(job.checkpoints.read_bytes(RUN_FILE)), RUN_FILE)
    except (SparkImagenetError, ValueError) as e:
        logger.warning(f"warning: mlflow: {job.checkpoints.url}/{RUN_FILE} cannot be read ({e}); a new run starts")
        return None
    if earlier.uri != uri:
        logger.info(f"mlflow: the checkpoints' run was tracked at {earlier.uri}; this job starts a new run at {uri}")
        return None
    return earlier.run_id


def _remember_run(job: JobPlan, spec: TrackingSpec) -> None:
    """Record the run in ``--checkpoint-dir`` (:data:`RUN_FILE`), so that a job resuming there continues it."""
    if job.checkpoints is None:
        return
    try:
        job.checkpoints.write_bytes(RUN_FILE, json.dumps(spec.to_json()).encode())
    except SparkImagenetError as e:
        logger.warning(f"warning: mlflow: cannot record the run in {job.checkpoints.url}/{RUN_FILE} ({e}); a resumed "
                       "job will start a new MLflow run")


def send_pending(url: str) -> str:
    """``spark-imagenet mlflow-log URL``: send the run record a job wrote (:data:`PENDING_FILE`) to its tracking
    server, then delete the record.

    Args:
        url: the record: a local path or a bucket URL.

    Returns:
        str: the run's id.

    Raises:
        ConfigError: no readable record there, or mlflow not installed.
        TrainingError: the tracking server still does not take it (the record is kept).
    """
    from spark_imagenet.errors import TrainingError

    folder, _, name = url.rstrip("/").rpartition("/")
    storage = open_storage(folder or ".")
    try:
        record = RunRecord.from_json(json.loads(storage.read_bytes(name)), url)
    except (SparkImagenetError, ValueError) as e:
        reason = str(e)
        where = reason if url in reason else f"{url}: not a readable MLflow run record ({reason})"
        raise ConfigError(f"{where}; give the {PENDING_FILE} a job wrote") from None
    down = unreachable(record.uri)
    if down:
        raise TrainingError(f"the MLflow tracking server {record.uri} cannot be reached ({down}); {url} is kept: "
                            "try again later")
    try:
        run_id = send_record(record)
    except SparkImagenetError:
        raise
    except Exception as e:  # noqa: BLE001 - the server's error, on one line, and the record kept
        raise TrainingError(f"the MLflow tracking server {record.uri} did not take the run ({_why(e, 0)}); "
                            f"{url} is kept: try again later") from None
    storage.delete(name, best_effort=True)
    logger.info(f"mlflow: run {run_id} sent to {record.uri}; {url} deleted")
    return run_id
