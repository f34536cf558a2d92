"""Batch inference on an executor: the ``serving/`` SavedModel of a training run's ``--output``, run on batches
of encoded images, one bad image reported in its row.

Runs in the PySpark Python worker of an executor, inside the pandas UDF that
:func:`spark_imagenet.training.driver.batch_predict.predict_dataframe` builds with PySpark's
``predict_batch_udf`` (the driver side names this module by its import path only, so the driver never
imports TensorFlow). No Spark here: :class:`BatchModel` is plain numpy in, numpy out, and works in any
Python with TensorFlow (the benchmark and the tests call it directly).

The model is fetched and loaded once per Python worker and ``--output`` URL (:func:`loaded_model`): the
``serving/`` folder and ``labels.json`` are copied into a local temporary folder (removed when the worker
exits) and the SavedModel's ``probabilities`` signature (``images``: tf.string ``[None]`` of encoded
JPEG/PNG/GIF/BMP bytes -> ``probabilities``: float32 ``[None, C]``, decoding and cropping exactly as
evaluation does) is kept. Top-k is computed here from those probabilities, so any ``top_k`` works. On a host
without a GPU, TensorFlow's CUDA start-up lines (``failed call to cuInit ...``) printed while the model loads
are left out of the worker's stderr; the PySpark worker, which Spark reuses for later tasks, keeps no variable
and no import hook of that load (:func:`~spark_imagenet.training.worker.environment.borrowed_process`).

An image above the pixel limit (:mod:`spark_imagenet.dataset.pixels`, read from its header) gets the reason
in its row's ``error`` before anything decodes it. A batch is scored in one call; when that call fails because of an image (TensorFlow cannot decode it:
not an image, truncated, a CMYK JPEG, ...), the batch is scored again one image at a time, and each image
that still fails gets the reason in its row's ``error`` and no prediction.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import tempfile
import threading
from typing import Any, Sequence

import numpy as np

from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, ImageTooLarge, open_image
from spark_imagenet.errors import ConfigError, SparkImagenetError
from spark_imagenet.storage import open_storage
from spark_imagenet.storage.committed import download_folder
from spark_imagenet.training.job.exported import INPUT_KEY, PROBABILITIES_SIGNATURE
from spark_imagenet.training.job.gpus import host_has_gpus
from spark_imagenet.training.job.outputs import LABELS_FILE, SERVING_DIR
from spark_imagenet.training.worker.environment import borrowed_process

#: The columns :meth:`BatchModel.predict` returns, in order.
FIELDS = ("class_ids", "wnids", "names", "probabilities", "error")

_models: dict[str, BatchModel] = {}
_lock = threading.Lock()


def fetch_serving(model_url: str, dest: str) -> None:
    """Copy ``serving/`` (written by :func:`spark_imagenet.training.worker.export.write_serving`) and
    ``labels.json`` of the ``--output`` folder ``model_url`` into the local folder
    ``dest`` (``dest/serving/...``, ``dest/labels.json``).

    Raises:
        ConfigError: no ``serving/`` SavedModel or no ``labels.json`` there (names the URL and the fix).
        StorageError: the store fails while copying.
    """
    root = model_url.rstrip("/")
    serving = open_storage(f"{root}/{SERVING_DIR}")
    if not serving.exists("saved_model.pb"):
        raise ConfigError(f"model {model_url}: no {SERVING_DIR}/saved_model.pb (an --output written before the "
                          f"serving export); run `spark-imagenet export {model_url}` first")
    download_folder(serving, os.path.join(dest, SERVING_DIR))
    open_storage(root).get_file(LABELS_FILE, os.path.join(dest, LABELS_FILE))


class BatchModel:
    """The ``serving/`` SavedModel of one ``--output`` folder, with its class list.

    Args:
        folder: a local folder holding ``serving/`` and ``labels.json`` (see :func:`fetch_serving`).
        url: the model's URL, named in messages.

    Raises:
        ConfigError: the SavedModel has no ``probabilities`` signature, or ``labels.json`` does not list one
            class per output.
    """

    def __init__(self, folder: str, url: str):
        import tensorflow as tf

        self.url = url
        self._loaded = tf.saved_model.load(os.path.join(folder, SERVING_DIR))
        if PROBABILITIES_SIGNATURE not in self._loaded.signatures:
            raise ConfigError(f"model {url}: its {SERVING_DIR}/ SavedModel has no '{PROBABILITIES_SIGNATURE}' "
                              f"signature (signatures: {', '.join(self._loaded.signatures)}); run "
                              f"`spark-imagenet export {url}` again")
        self._signature = self._loaded.signatures[PROBABILITIES_SIGNATURE]
        with open(os.path.join(folder, LABELS_FILE), encoding="utf-8") as f:
            labels = json.load(f)
        classes = int(self._signature.structured_outputs["probabilities"].shape[-1])
        if not isinstance(labels, list) or len(labels) != classes:
            raise ConfigError(f"model {url}: {LABELS_FILE} lists {len(labels) if isinstance(labels, list) else 'no'}"
                              f" classes but the model has {classes} outputs")
        self.wnids = np.array([str(c["wnid"]) for c in labels], dtype=object)
        self.names = np.array([str((c.get("names") or [c["wnid"]])[0]) for c in labels], dtype=object)

    @property
    def classes(self) -> int:
        """How many classes the model tells apart (C)."""
        return len(self.wnids)

    def probabilities(self, images: Sequence[bytes]) -> np.ndarray:
        """Every class's probability for each image, in one call of the SavedModel.

        Args:
            images: encoded JPEG/PNG/GIF/BMP images.

        Returns:
            np.ndarray: float32 ``[len(images), C]``.

        Raises:
            tf.errors.InvalidArgumentError: an image TensorFlow cannot decode (the whole call fails).
        """
        import tensorflow as tf

        out = self._signature(**{INPUT_KEY: tf.constant(list(images), dtype=tf.string)})
        return out["probabilities"].numpy()

    def predict(self, images: Sequence[Any], top_k: int = 5,
                max_pixels: int = DEFAULT_MAX_PIXELS) -> dict[str, np.ndarray]:
        """The ``top_k`` most probable classes of each image, most probable first; a bad image gets its reason.

        Args:
            images: encoded image bytes (``bytes``, ``bytearray`` or None for a missing image), one per row.
            top_k: classes per image (at most C are given).
            max_pixels: the most pixels (width x height) an image may have; a larger one is not decoded.

        Returns:
            dict: the columns of :data:`FIELDS`: ``class_ids`` int32 ``[N, K]``, ``wnids`` and ``names``
            object (str) ``[N, K]``, ``probabilities`` float32 ``[N, K]`` (K = min(top_k, C)), and ``error``
            object ``[N]``: None, or why that row has no prediction (then its other columns are filler:
            -1, "" and NaN).
        """
        n, k = len(images), min(top_k, self.classes)
        probabilities = np.full((n, self.classes), np.nan, dtype=np.float32)
        errors = np.full(n, None, dtype=object)
        data = []
        for i, image in enumerate(images):
            if image is None:
                errors[i] = "no image (the column is null)"
            elif not isinstance(image, (bytes, bytearray, memoryview)):
                errors[i] = f"not image bytes but {type(image).__name__}"
            elif len(image) == 0:
                errors[i] = "an empty file"
            else:
                errors[i] = _too_large(bytes(image), max_pixels)
                if errors[i] is None:
                    data.append((i, bytes(image)))
        if data:
            self._score(data, probabilities, errors)
        best = np.argsort(-np.nan_to_num(probabilities, nan=-1.0), axis=1, kind="stable")[:, :k].astype(np.int32)
        scored = errors == None  # noqa: E711  (elementwise over an object array)
        best[~scored] = -1
        top = np.take_along_axis(probabilities, np.maximum(best, 0), axis=1)
        top[~scored] = np.nan
        return {"class_ids": best, "wnids": np.where(scored[:, None], self.wnids[np.maximum(best, 0)], ""),
                "names": np.where(scored[:, None], self.names[np.maximum(best, 0)], ""),
                "probabilities": top.astype(np.float32), "error": errors}

    def _score(self, data: list[tuple[int, bytes]], probabilities: np.ndarray, errors: np.ndarray) -> None:
        """Fill ``probabilities`` rows of ``data`` (one call, else one call per image on a decode error)."""
        import tensorflow as tf

        try:
            probabilities[[i for i, _ in data]] = self.probabilities([b for _, b in data])
            return
        except tf.errors.InvalidArgumentError:
            pass  # some image of the batch: find which, one at a time
        for i, image in data:
            try:
                probabilities[i] = self.probabilities([image])[0]
            except tf.errors.InvalidArgumentError as e:
                errors[i] = f"TensorFlow cannot decode this image: {_reason(e)}"


def _too_large(image: bytes, max_pixels: int) -> str | None:
    """Why ``image`` is above ``max_pixels`` (from its header), or None: within it, or not an image Pillow
    reads (TensorFlow's decode then says what is wrong with it)."""
    try:
        with open_image(io.BytesIO(image), "image", max_pixels):
            return None
    except ImageTooLarge as e:
        return e.reason
    except (OSError, SyntaxError, ValueError, EOFError):
        return None


def _reason(e: Exception) -> str:
    """TensorFlow's reason (``Invalid JPEG data, size 500``), without the graph's node names and stack lines."""
    lines = [line.strip() for line in str(getattr(e, "message", e)).splitlines()]
    kept = [line for line in lines if line and not line.startswith(("Graph execution error", "Detected at node",
                                                                    "<stack traces", "[[", "File "))]
    text = kept[0] if kept else (lines[0] if lines and lines[0] else type(e).__name__)
    return text.split(" [Op:")[0].strip()


def loaded_model(model_url: str) -> BatchModel:
    """The :class:`BatchModel` of ``model_url``, fetched and loaded once per process (then reused).

    Raises:
        ConfigError, StorageError: see :func:`fetch_serving` and :class:`BatchModel`.
    """
    with _lock:
        model = _models.get(model_url)
        if model is None:
            folder = tempfile.mkdtemp(prefix="spark-imagenet-serving-")
            atexit.register(shutil.rmtree, folder, True)
            try:
                fetch_serving(model_url, folder)
                with borrowed_process(cpu_only=not host_has_gpus()):  # TensorFlow's import and first op
                    model = BatchModel(folder, model_url)
            except SparkImagenetError:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            _models[model_url] = model
        return model


def make_predict_fn(model_url: str, top_k: int, max_pixels: int = DEFAULT_MAX_PIXELS):
    """The ``predict`` function PySpark's ``predict_batch_udf`` calls with a numpy array of image bytes.

    Args:
        model_url: the ``--output`` folder of the run.
        top_k: classes per image.
        max_pixels: the pixel limit (:meth:`BatchModel.predict`).

    Returns:
        callable: ``predict(images: np.ndarray) -> dict`` of the :data:`FIELDS` columns
        (:meth:`BatchModel.predict`).
    """
    model = loaded_model(model_url)

    def predict(images: np.ndarray) -> dict[str, np.ndarray]:
        return model.predict(list(images), top_k, max_pixels)

    return predict
