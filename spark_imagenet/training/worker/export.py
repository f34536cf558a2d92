"""The trained model for use without spark-imagenet: ``model.keras`` without the optimizer, ``preprocessing.json``
and the serving SavedModel ``serving/``; and the ``spark-imagenet export`` command.

* :func:`write_outputs`: the chief's part of ``--output``: a plain (non-distributed) copy of the trained model is
  loaded from the file training saved, outside any strategy, and written as ``model.keras`` (no optimizer, no
  compile state: ``tf_keras.models.load_model`` loads it in any process), ``preprocessing.json``
  (:func:`write_preprocessing`) and ``serving/`` (:func:`write_serving`). Why a plain copy: docs/design.md,
  'The exported model'.
* :func:`write_serving`: a TensorFlow SavedModel whose signatures take encoded image bytes (the contract:
  :data:`spark_imagenet.training.job.exported.SIGNATURES`).
* ``python -m spark_imagenet.training.worker.export MODEL_URL [--labels URL] [--out URL]`` (``spark-imagenet
  export``; the command line starts it in a child Python): ``serving/`` and ``preprocessing.json`` for an existing
  ``model.keras`` and ``labels.json`` (an older run's, or a model trained elsewhere). Exit status 0, or 2 with one
  ``spark-imagenet: error:`` line naming the file at fault.

Example (a run's ``model.keras`` and ``labels.json``; here a small classifier of 2 classes)::

    >>> import tensorflow as tf, tf_keras
    >>> model = tf_keras.Sequential([tf_keras.Input((72, 72, 3)), tf_keras.layers.GlobalAveragePooling2D(),
    ...                              tf_keras.layers.Dense(2)])          # tf_keras.models.load_model(...)
    >>> labels = [{"id": 0, "wnid": "n01", "names": ["cat"]}, {"id": 1, "wnid": "n02", "names": ["dog"]}]
    >>> write_serving(model, labels, 72, "run")
    'run/serving'
    >>> serving = tf.saved_model.load("run/serving").signatures["serving_default"]
    >>> photo = "/data/kaggle/ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_00000001.JPEG"
    >>> out = serving(images=tf.constant([open(photo, "rb").read()]))
    >>> sorted(out), out["names"].shape                                   # K = min(5, classes)
    (['class_ids', 'names', 'probabilities', 'wnids'], TensorShape([1, 2]))
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Sequence

from spark_imagenet.arguments import ArgumentParser
from spark_imagenet.errors import ConfigError, SparkImagenetError
from spark_imagenet.storage import store_schemes
from spark_imagenet.training.job.exported import (INPUT_KEY, PROBABILITIES_SIGNATURE, SERVING_SIGNATURE, TOP_K,
                                                  Preprocessing)
from spark_imagenet.training.job.outputs import MODEL_FILE, PREPROCESSING_FILE, SERVING_DIR, open_output, publish

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # TensorFlow is imported only once the command's URLs are checked (see main)
    import tensorflow as tf
    import tf_keras as keras


def preprocessing_spec(image_size: int) -> Preprocessing:
    """The description of a model with input side ``image_size``, from the constants training uses
    (:mod:`spark_imagenet.training.worker.preprocessing`)."""
    from spark_imagenet.training.worker import preprocessing

    return Preprocessing.describe(image_size, preprocessing.MEAN_RGB, preprocessing.STD_RGB,
                                  preprocessing.CENTER_CROP_FRACTION)


def write_preprocessing(image_size: int, folder: str) -> str:
    """Write ``folder/preprocessing.json`` (:func:`preprocessing_spec`); return its path.

    Raises:
        OSError: the file cannot be written.
    """
    path = os.path.join(folder, PREPROCESSING_FILE)
    with open(path, "w") as f:
        f.write(preprocessing_spec(image_size).dumps() + "\n")
    return path


def image_size_of(model: keras.Model, where: str) -> int:
    """S of a model taking ``[B, S, S, 3]`` images.

    Raises:
        ConfigError: another input shape, or an output that is not ``[B, C]`` (names ``where``).
    """
    shape, out = getattr(model, "input_shape", None), getattr(model, "output_shape", None)
    if (not isinstance(shape, tuple) or len(shape) != 4 or not isinstance(shape[1], int) or shape[1] != shape[2]
            or shape[3] != 3 or not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[1], int)):
        raise ConfigError(f"model {where}: takes {shape} and returns {out}; the export needs a classifier of "
                          "square RGB images, [B, S, S, 3] -> logits [B, C]")
    return int(shape[1])


def _check_labels(labels: Sequence[dict[str, Any]], classes: int, where: str) -> None:
    if len(labels) != classes or not all(isinstance(c, dict) and isinstance(c.get("wnid"), str) for c in labels):
        raise ConfigError(f"{where} lists {len(labels)} classes but the model has {classes} outputs (or an entry "
                          "without a \"wnid\"): give the labels.json of this model's run")


def serving_module(model: keras.Model, labels: Sequence[dict[str, Any]], image_size: int) -> tf.Module:
    """The module :func:`write_serving` saves: its two signature functions and the model's variables.

    Args:
        model: a classifier, float32 ``[B, S, S, 3]`` normalised images -> logits ``[B, C]``; not under a
            distribution strategy.
        labels: ``labels.json``'s entries, one per output (``wnid``; ``names``, whose first is the class name).
        image_size: S.

    Returns:
        tf.Module: ``serve`` (string ``[None]`` -> ``class_ids`` int32, ``wnids``, ``names`` string,
        ``probabilities`` float32, each ``[None, K]``, K = min(5, C)) and ``probabilities`` (string ``[None]`` ->
        ``probabilities`` float32 ``[None, C]``), each a ``tf.function`` with that input signature.

    Raises:
        ConfigError: ``labels`` does not have one entry per output.
    """
    import tensorflow as tf

    from spark_imagenet.training.worker import preprocessing

    classes = int(model.output_shape[-1])
    _check_labels(labels, classes, "labels")
    wnids = [str(c["wnid"]) for c in labels]
    names = [str((list(c.get("names") or []) or [c["wnid"]])[0]) for c in labels]
    k = min(TOP_K, classes)
    normalize = preprocessing.normalizer(image_size, xla=False)  # a plain graph: any TensorFlow Serving runs it
    view = tf.TensorSpec([image_size, image_size, 3], tf.uint8)
    images_spec = tf.TensorSpec([None], tf.string, name=INPUT_KEY)

    def decode(data: tf.Tensor) -> tf.Tensor:
        def other() -> tf.Tensor:
            image = tf.io.decode_image(data, channels=3, expand_animations=False)
            image.set_shape([None, None, 3])
            return preprocessing.eval_view(image, image_size)

        return tf.cond(tf.io.is_jpeg(data), lambda: preprocessing.eval_image(data, image_size), other)

    @tf.function(input_signature=[images_spec])
    def probabilities(images: tf.Tensor) -> dict[str, tf.Tensor]:
        pixels = tf.map_fn(decode, images, fn_output_signature=view)  # each image its own shape, then one batch
        logits = tf.cast(model(normalize(pixels), training=False), tf.float32)
        return {"probabilities": tf.nn.softmax(logits, axis=-1)}

    @tf.function(input_signature=[images_spec])
    def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
        top = tf.math.top_k(probabilities(images)["probabilities"], k=k)
        ids = tf.cast(top.indices, tf.int32)
        return {"class_ids": ids, "wnids": tf.gather(tf.constant(wnids), ids),
                "names": tf.gather(tf.constant(names), ids), "probabilities": top.values}

    module = tf.Module()
    module.weights = list(model.variables)  # tracked, so the SavedModel holds them (no Keras objects in it)
    module.serve, module.probabilities = serve, probabilities
    return module


def write_serving(model: keras.Model, labels: Sequence[dict[str, Any]], image_size: int, folder: str) -> str:
    """Write the serving SavedModel ``folder/serving`` (replacing one there).

    Signatures (:data:`spark_imagenet.training.job.exported.SIGNATURES`):

    * ``serving_default``: ``images`` string ``[None]`` (JPEG, PNG, GIF, BMP bytes) -> ``class_ids`` int32,
      ``wnids`` string, ``names`` string (the first of the class' ``names``, or its wnid) and ``probabilities``
      float32, each ``[None, K]``, K = min(5, C), most probable first;
    * ``probabilities``: ``images`` as above -> ``probabilities`` float32 ``[None, C]`` (softmax).

    Each image is decoded and cropped as evaluation does (a JPEG by
    :func:`~spark_imagenet.training.worker.preprocessing.eval_image`, other formats decoded whole and given
    :func:`~spark_imagenet.training.worker.preprocessing.eval_view`), normalised with the training constants and
    classified.

    Args:
        model: a classifier, float32 ``[B, S, S, 3]`` normalised images -> logits ``[B, C]``, built outside any
            distribution strategy (a SavedModel of a strategy's model would hold its collective ops).
        labels: ``labels.json``'s entries, one per output, in output order.
        image_size: S.
        folder: a local folder.

    Returns:
        str: the SavedModel's path, ``folder/serving``.

    Raises:
        ConfigError: ``labels`` does not have one entry per output.
    """
    import tensorflow as tf

    module = serving_module(model, labels, image_size)
    path = os.path.join(folder, SERVING_DIR)
    if os.path.isdir(path):
        shutil.rmtree(path)
    tf.saved_model.save(module, path, signatures={SERVING_SIGNATURE: module.serve,
                                                  PROBABILITIES_SIGNATURE: module.probabilities})
    return path


def write_outputs(trained: str, labels: Sequence[dict[str, Any]], folder: str) -> float | None:
    """The chief's ``model.keras``, ``preprocessing.json`` and ``serving/`` in ``folder``, from the model training
    saved (with its optimizer) to ``trained``.

    The model is loaded again from ``trained`` outside the strategy's scope (a plain copy: no mirrored
    variables, no collective ops), saved as ``folder/model.keras`` without optimizer or compile state, and
    exported. Without ``labels`` (a spec made by hand) ``serving/`` is left out. A model that does not load
    again (a user's model with custom classes that are not registered with Keras) is copied as it was saved,
    with its optimizer, and nothing else is written: one warning says why.

    Args:
        trained: the ``.keras`` file training saved.
        labels: ``labels.json``'s entries, one per output, or empty.
        folder: the chief's local output folder.

    Returns:
        float | None: the seconds the SavedModel took (0.0 when left out); None when the model did not load
        again.

    Raises:
        ConfigError: ``labels`` does not have one entry per output.
    """
    import tf_keras as keras

    try:
        model = keras.models.load_model(trained, compile=False)
    except Exception as e:  # noqa: BLE001 - a user's classes; training's model is kept as saved
        shutil.copyfile(trained, os.path.join(folder, MODEL_FILE))
        logger.warning(f"output: the trained model does not load again without its custom classes "
                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); model.keras is saved "
                       "with its optimizer and without preprocessing.json and serving/ (register the classes with "
                       "tf_keras.saving.register_keras_serializable, then spark-imagenet export)")
        return None
    model.save(os.path.join(folder, MODEL_FILE))
    size = image_size_of(model, trained)
    write_preprocessing(size, folder)
    if not labels:
        return 0.0
    start = time.perf_counter()
    write_serving(model, labels, size, folder)
    return time.perf_counter() - start


def default_out(model_url: str) -> str:
    """The folder of the model at ``model_url`` (a ``.keras`` file's folder, or the folder itself)."""
    if not model_url.endswith(".keras"):
        return model_url
    return model_url.rsplit("/", 1)[0] or "/" if "/" in model_url else "."


def export(model_url: str, labels_url: str | None = None, out: str | None = None) -> list[str]:
    """``serving/`` and ``preprocessing.json`` of the model at ``model_url``, written to ``out``.

    Args:
        model_url: a ``model.keras`` file or the folder holding one, in any store (with or without its optimizer).
        labels_url: its ``labels.json`` (None: the one beside the model).
        out: the destination folder in any store (None: the model's folder).

    Returns:
        list[str]: the object names written under ``out``, sorted.

    Raises:
        ConfigError: no model there, labels that cannot be read or do not match the model's outputs, a model
            that is not an image classifier, or an ``out`` that cannot be written (each names the file).
        StorageError: an object could not be written intact.
    """
    from spark_imagenet.training.worker.evaluate import fetched_model, load_model
    from spark_imagenet.training.worker.predict import read_labels

    out = default_out(model_url) if out is None else out
    with fetched_model(model_url) as local:  # the model, labels and --out are checked before TensorFlow starts
        read_labels(model_url, labels_url, None)
        storage = open_output(out, "--out")
        model = load_model(model_url, local)
    size = image_size_of(model, model_url)
    labels = read_labels(model_url, labels_url, int(model.output_shape[-1]))
    with tempfile.TemporaryDirectory(prefix="spark-imagenet-export-") as tmp:
        write_preprocessing(size, tmp)
        write_serving(model, labels, size, tmp)
        return publish(tmp, storage, replace=(SERVING_DIR,))


def main(argv: list[str] | None = None) -> int:
    """The ``export`` command (see the module docstring); returns the exit status."""
    parser = ArgumentParser(prog="spark-imagenet export",
                            description="write serving/ (a TensorFlow SavedModel taking image bytes) and "
                                        "preprocessing.json for a model.keras and its labels.json")
    parser.add_argument("model", help="a model.keras file or the --output folder of a run (a local path or a "
                        f"bucket URL: {store_schemes()})")
    parser.add_argument("--labels", help="the run's labels.json (default: the one beside the model)")
    parser.add_argument("--out", help="where to write serving/ and preprocessing.json (default: the model's folder)")
    args = parser.parse_args(argv)
    try:
        written = export(args.model, args.labels, args.out)
    except SparkImagenetError as e:
        print(f"spark-imagenet: error: {e}", file=sys.stderr)
        return 2
    serving = sum(1 for name in written if name.startswith(SERVING_DIR + "/"))
    where = args.out or default_out(args.model)
    print(f"export: {PREPROCESSING_FILE} and {SERVING_DIR}/ ({serving} files; signatures {SERVING_SIGNATURE}, "
          f"{PROBABILITIES_SIGNATURE}) written to {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
