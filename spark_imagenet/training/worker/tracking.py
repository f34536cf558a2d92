"""The chief's side of MLflow tracking: each epoch's metrics, sent as the epoch ends, and the MLflow model folder
written into ``--output`` (the run itself: :mod:`spark_imagenet.training.driver.tracking`).

Imported by rank 0's TensorFlow worker only, and only when the job is tracked. Nothing here may slow or fail
training: the metrics go through a queue to a daemon thread, which gives up after its first error with one
warning (the driver sends the epochs' metrics again from the job's history at the end), and a model folder that
cannot be written costs one warning.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Mapping

from spark_imagenet.training.job.tracking import EPOCH_METRICS, MODEL_DIR, TrackingSpec, failure_text

logger = logging.getLogger(__name__)

#: Seconds one request to the tracking server may take, and the retries after a failed one (the chief's own
#: process: MLflow's defaults retry for minutes).
REQUEST_TIMEOUT_S = "10"
REQUEST_RETRIES = "1"
#: Seconds the end of training waits for the last epoch's metrics to be sent.
CLOSE_WAIT_S = 10.0


class EpochMetricsSender:
    """Sends each epoch's metrics to the job's MLflow run from a daemon thread.

    Args:
        spec: the job's run.

    Attributes:
        sent: epochs sent.
        error: why sending stopped (one line), or None.
    """

    def __init__(self, spec: TrackingSpec) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", REQUEST_TIMEOUT_S)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", REQUEST_RETRIES)
        self._spec = spec
        self._queue: queue.Queue[tuple[int, dict[str, float]] | None] = queue.Queue()
        self.sent = 0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="mlflow-epochs", daemon=True)
        self._thread.start()

    def epoch(self, step: int, scalars: Mapping[str, float]) -> None:
        """Queue epoch ``step``'s (counted from 1) scalars (those of :data:`EPOCH_METRICS`); never waits."""
        if self.error is None:
            self._queue.put((step, {k: float(v) for k, v in scalars.items() if k in EPOCH_METRICS}))

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Wait at most ``timeout_s`` seconds for the queued epochs to be sent, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            from mlflow import MlflowClient
            from mlflow.entities import Metric

            client = MlflowClient(self._spec.uri)
        except Exception as e:  # noqa: BLE001 - no mlflow here: one warning, training goes on
            self._give_up(e)
            return
        while (item := self._queue.get()) is not None:
            step, scalars = item
            stamp = int(time.time() * 1000)
            try:
                client.log_batch(self._spec.run_id, metrics=[Metric(k, v, stamp, step) for k, v in scalars.items()])
            except Exception as e:  # noqa: BLE001 - the server down or refusing: one warning, no more tries
                self._give_up(e)
                return
            self.sent += 1

    def _give_up(self, error: BaseException) -> None:
        self.error = failure_text(error)
        logger.warning(f"warning: mlflow: the epochs' metrics are not sent to {self._spec.uri} as they come "
                       f"({self.error}); training goes on, and the driver sends them when the job ends")


def inference_model(trained: Any) -> Any:
    """The model MLflow gets: float32 ``[B, S, S, 3]`` RGB pixels in 0..255 (the evaluation view, before
    normalisation) -> float32 ``[B, C]`` class probabilities, the training normalisation inside.

    Args:
        trained: a plain (not distributed) classifier of normalised images to logits, input ``[B, S, S, 3]``.

    Returns:
        tf_keras.Model: input ``images``, output ``probabilities``.
    """
    import tf_keras as keras

    from spark_imagenet.training.worker.preprocessing import MEAN_RGB, STD_RGB

    size = int(trained.input_shape[1])
    images = keras.Input((size, size, 3), name="images", dtype="float32")
    normalised = keras.layers.Normalization(mean=list(MEAN_RGB), variance=[s * s for s in STD_RGB],
                                            name="normalization")(images)
    logits = trained(normalised, training=False)
    probabilities = keras.layers.Softmax(name="probabilities", dtype="float32")(logits)
    return keras.Model(images, probabilities, name=f"{trained.name}_inference")


def write_mlflow_model(model_file: str, folder: str) -> str | None:
    """Write ``folder/mlflow-model``, an MLflow model (``mlflow.tensorflow`` flavour, with a signature and an
    input example) of :func:`inference_model` of the plain ``model.keras`` at ``model_file``.

    Returns:
        str | None: the folder written, or None when it could not be (one warning says why; training is done
        and its other outputs are kept).
    """
    try:
        import numpy as np
        import tf_keras as keras

        import mlflow.tensorflow
        from mlflow.models.signature import ModelSignature
        from mlflow.types.schema import Schema, TensorSpec

        from spark_imagenet.training.worker.preprocessing import MEAN_RGB

        model = inference_model(keras.models.load_model(model_file, compile=False))
        size, classes = int(model.input_shape[1]), int(model.output_shape[-1])
        signature = ModelSignature(
            inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, size, size, 3), "images")]),
            outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, classes), "probabilities")]))
        example = np.broadcast_to(np.round(np.asarray(MEAN_RGB, np.float32)), (1, size, size, 3)).copy()
        path = os.path.join(folder, MODEL_DIR)
        mlflow.tensorflow.save_model(model, path, signature=signature, input_example=example)
        return path
    except Exception as e:  # noqa: BLE001 - tracking never fails a trained run
        logger.warning(f"warning: mlflow: the MLflow model was not written ({failure_text(e)}); model.keras and "
                       "serving/ are in --output")
        return None
