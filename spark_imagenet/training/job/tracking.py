"""MLflow tracking, the part every process shares: which run the job logs to and what is logged (no MLflow import,
no TensorFlow, no Spark).

One MLflow run per job. The driver (:mod:`spark_imagenet.training.driver.tracking`) creates it, or continues
the run of the checkpoint the job resumes from, and logs the settings, the dataset, the final validation, the
results and the model; the chief (rank 0's TensorFlow worker, :mod:`spark_imagenet.training.worker.tracking`)
logs each epoch's metrics as the epoch ends and writes the model as an MLflow model folder into ``--output``.
No other rank logs anything, so every metric is one series.

What is logged, by name:

* each epoch (step = the epoch, counted from 1): :data:`EPOCH_METRICS`, the training loss without weight decay
  (``xent``), top-1 and top-5 accuracy, the learning rate and the images per second of the chief;
* at the end (step = the last epoch): :data:`VAL_METRICS`, the validation of every worker's images.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job.logchannel import one_line

#: The object in ``--checkpoint-dir`` naming the MLflow run of the checkpoints' run, so that a job resuming from
#: them continues that run.
RUN_FILE = "mlflow-run.json"
#: The MLflow model folder the chief writes into ``--output`` (``MLmodel`` and the Keras model inside).
MODEL_DIR = "mlflow-model"
#: What the driver writes into ``--output`` when the tracking server could not take the run's end (a
#: :class:`~spark_imagenet.training.driver.tracking.RunRecord`; ``spark-imagenet mlflow-log`` sends it).
PENDING_FILE = "mlflow-pending.json"
#: The name of the logged model in the run.
MODEL_NAME = "model"
#: The metrics logged after each epoch, from the chief.
EPOCH_METRICS = ("xent", "top1", "top5", "learning_rate", "images_per_sec")
#: The metrics logged after the final evaluation: ``val_`` + the evaluation's ``xent``, ``top1``, ``top5``.
VAL_METRICS = ("val_xent", "val_top1", "val_top5")
#: The longest reason of a failed MLflow call a warning quotes, in characters (cut at a word, marked "...").
WHY_CHARS = 1000


def failure_text(error: BaseException) -> str:
    """The reason of a failed MLflow call as a warning quotes it: its type and first line (one line), whole up
    to :data:`WHY_CHARS` characters, beyond that cut at a word and marked `` ...``."""
    text = one_line(error)
    return text if len(text) <= WHY_CHARS else text[:WHY_CHARS].rsplit(" ", 1)[0] + " ..."


@dataclasses.dataclass(frozen=True)
class TrackingSpec:
    """The MLflow run a job logs to, as the driver resolved it; handed to the chief in its worker spec.

    Attributes:
        uri: the tracking URI the driver used (the resolved one, so that the chief reaches the same server).
        experiment_id: the run's experiment.
        run_id: the run.
    """

    uri: str
    experiment_id: str
    run_id: str

    def __post_init__(self) -> None:
        for name in ("uri", "experiment_id", "run_id"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"tracking spec: {name} must be a non-empty string, got "
                                  f"{getattr(self, name)!r:.100}")

    def to_json(self) -> dict[str, str]:
        """``{"uri", "experiment_id", "run_id"}``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "tracking spec") -> "TrackingSpec":
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: not an object with exactly these three strings (names ``where``).
        """
        if not isinstance(data, dict) or set(data) != {"uri", "experiment_id", "run_id"}:
            raise ConfigError(f"{where}: expected an object with uri, experiment_id and run_id, got {data!r:.200}")
        return cls(**{k: str(v) for k, v in data.items()})
