"""Batch inference as a Spark job: :func:`predict_dataframe` adds the top-k classes of each image of a DataFrame.

Runs on the Spark driver (a user's session, or ``spark-imagenet predict --source/--table``): it checks the model
and the column, and builds the pandas UDF with PySpark's ``predict_batch_udf``. No TensorFlow here: the UDF's
``make_predict_fn`` imports :mod:`spark_imagenet.training.worker.batch_predict` by name in the executor's
Python worker, which fetches the ``serving/`` SavedModel of the run's ``--output`` once per worker and URL,
decodes the images and runs the model there (the driver never loads the model).

Example (``gs://my-bucket/runs/alexnet-8`` a run's ``--output``):

    >>> import spark_imagenet
    >>> df = spark.read.format("binaryFile").load("/data/kaggle/ILSVRC/Data/CLS-LOC/val/*.JPEG")
    >>> scored = spark_imagenet.predict_dataframe(df, "gs://my-bucket/runs/alexnet-8", top_k=3)
    >>> row = scored.select("path", "prediction.wnids", "prediction.probabilities", "prediction.error").first()
    >>> len(row.wnids), len(row.probabilities), row.error
    (3, 3, None)
"""

from __future__ import annotations

import os
from typing import Any

from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, check_max_pixels
from spark_imagenet.errors import ConfigError, SparkImagenetError
from spark_imagenet.storage import is_remote_url, open_storage
from spark_imagenet.training.job.outputs import LABELS_FILE, MODEL_FILE, SERVING_DIR

#: The executor-side module, imported by name in the UDF (:func:`_make_predict_fn`).
WORKER_MODULE = "spark_imagenet.training.worker.batch_predict"
#: Images per call of the model (per executor Python worker).
DEFAULT_BATCH = 64
#: The added column's type.
PREDICTION_DDL = ("struct<class_ids: array<int>, wnids: array<string>, names: array<string>, "
                  "probabilities: array<float>, error: string>")


def result_type() -> Any:
    """The Spark type of the added column (:data:`PREDICTION_DDL`), as a ``StructType``."""
    from pyspark.sql.types import ArrayType, FloatType, IntegerType, StringType, StructField, StructType

    return StructType([StructField("class_ids", ArrayType(IntegerType())),
                       StructField("wnids", ArrayType(StringType())),
                       StructField("names", ArrayType(StringType())),
                       StructField("probabilities", ArrayType(FloatType())),
                       StructField("error", StringType())])


def model_location(model_url: str) -> str:
    """``model_url`` as the executors should read it: a local path made absolute, a URL as given."""
    if is_remote_url(model_url) or "://" in model_url:
        return model_url.rstrip("/")
    return os.path.abspath(os.path.expanduser(model_url))


def check_model(model_url: str) -> None:
    """Check on the driver, before any task starts, that ``model_url`` is an ``--output`` folder with a serving
    SavedModel and its class list.

    Raises:
        ConfigError: nothing readable there, no ``serving/saved_model.pb`` (an older run's output: names the
            ``spark-imagenet export`` command that adds it), or no ``labels.json``.
    """
    try:
        root = open_storage(model_url)
        has_model = root.exists(f"{SERVING_DIR}/saved_model.pb")
        has_labels = root.exists(LABELS_FILE)
        has_keras = root.exists(MODEL_FILE)
    except SparkImagenetError as e:
        raise ConfigError(f"model {model_url}: cannot read it ({e}); give the --output folder of a training "
                          "run") from None
    if not has_model:
        if has_keras:
            raise ConfigError(f"model {model_url}: no {SERVING_DIR}/ SavedModel (an --output written before the "
                              f"serving export): run `spark-imagenet export {model_url}` first")
        raise ConfigError(f"model {model_url}: no {SERVING_DIR}/saved_model.pb there; give the --output folder "
                          "of a training run")
    if not has_labels:
        raise ConfigError(f"model {model_url}: no {LABELS_FILE} beside {SERVING_DIR}/ (the class names); give "
                          "the whole --output folder of the run")


def _make_predict_fn(model_url: str, top_k: int, max_pixels: int):
    """``predict_batch_udf``'s ``make_predict_fn``: called once per executor Python worker (PySpark caches
    what it returns), it imports the TensorFlow side by name and loads the model there."""

    def make_predict_fn():
        import importlib

        return importlib.import_module(WORKER_MODULE).make_predict_fn(model_url, top_k, max_pixels)

    return make_predict_fn


def predict_dataframe(df: Any, model_url: str, image_col: str = "content", top_k: int = 5,
                      batch_size: int = DEFAULT_BATCH, output_col: str = "prediction",
                      max_image_pixels: int = DEFAULT_MAX_PIXELS) -> Any:
    """The top-k classes of each image of ``df``, as a Spark job (lazy: nothing runs until the result is used).

    Built on PySpark's ``predict_batch_udf``: each executor Python worker fetches the ``serving/`` SavedModel
    of the training run's ``--output`` folder once and scores the images ``batch_size`` at a time; JPEG
    decoding (and PNG, GIF, BMP) happens there, exactly as evaluation decodes and crops. An image TensorFlow
    cannot decode (not an image, truncated, a CMYK JPEG), one above ``max_image_pixels`` (refused from its header,
    not decoded) or a null one does not fail the job: its row's
    ``error`` says why and its predictions are null. Works in a classic session and under Spark Connect (the
    UDF is a pandas UDF; the executors need spark-imagenet and TensorFlow installed in either case).

    Images per Arrow batch: Spark's default is 10,000 rows per batch sent to Python, over a gigabyte of
    ImageNet-sized JPEGs; set ``spark.sql.execution.arrow.maxRecordsPerBatch`` (``spark-imagenet predict``
    uses 256) for large images.

    Args:
        df: a DataFrame with a binary column of encoded images (``binaryFile``'s ``content``, a Parquet
            table's bytes).
        model_url: the ``--output`` folder of a training run (a local path every executor reads, or a
            bucket URL of any store), holding ``serving/`` and ``labels.json``.
        image_col: the image column (binary).
        top_k: classes per image, most probable first (at most the model's class count).
        batch_size: images per call of the model.
        output_col: the name of the added column.
        max_image_pixels: the most pixels (width x height) an image may have
            (:mod:`spark_imagenet.dataset.pixels`).

    Returns:
        pyspark.sql.DataFrame: ``df`` with one more column ``output_col`` of type :data:`PREDICTION_DDL`:
        ``class_ids`` (int32 ``[K]``), ``wnids`` and ``names`` (the ``labels.json`` entries' WordNet id and
        first name, ``[K]``), ``probabilities`` (float32 ``[K]``, softmax), and ``error`` (null, or why the row
        has no prediction; then the arrays are null).

    Raises:
        ConfigError: ``top_k``, ``batch_size`` or ``max_image_pixels`` below 1, ``image_col`` missing or not binary, ``output_col``
            already a column, or the model not there (:func:`check_model`).

    Example (a file that is no image gets its ``error``, the others their classes):

    >>> import shutil
    >>> from spark_imagenet import predict_dataframe
    >>> photos = shutil.copytree("/data/kaggle/ILSVRC/Data/CLS-LOC/test", os.path.abspath("photos"))
    >>> _ = open(f"{photos}/notes.JPEG", "w").write("not an image")
    >>> df = spark.read.format("binaryFile").load(f"{photos}/*.JPEG")
    >>> scored = predict_dataframe(df, "gs://my-bucket/runs/alexnet-8", top_k=1).orderBy("path")
    >>> [(len(r.prediction.names or []), r.prediction.error is None) for r in scored.collect()]
    [(1, True), (1, True), (0, False)]
    """
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"top_k={top_k!r}: give a whole number of classes, 1 or more", key="top_k", value=top_k)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r}: give a whole number of images, 1 or more",
                          key="batch_size", value=batch_size)
    check_max_pixels(max_image_pixels)
    fields = {f.name: f.dataType for f in df.schema.fields}
    if image_col not in fields:
        raise ConfigError(f"image column {image_col!r} is not in the DataFrame (columns: {', '.join(fields)})",
                          key="image_col", value=image_col)
    if not isinstance(fields[image_col], BinaryType):
        raise ConfigError(f"image column {image_col!r} is {fields[image_col].simpleString()}, not binary: give "
                          "the column of encoded image bytes (binaryFile's content)", key="image_col", value=image_col)
    if output_col in fields:
        raise ConfigError(f"the DataFrame already has a column {output_col!r}: give another output_col",
                          key="output_col", value=output_col)
    url = model_location(model_url)
    check_model(url)
    udf = predict_batch_udf(_make_predict_fn(url, top_k, max_image_pixels), return_type=result_type(), batch_size=batch_size)
    raw = "__spark_imagenet_raw_prediction"
    scored = F.col(raw).getField("error").isNull()
    arrays = [F.when(scored, F.col(raw).getField(name)).alias(name)
              for name in ("class_ids", "wnids", "names", "probabilities")]
    return (df.withColumn(raw, udf(F.col(image_col)))
            .withColumn(output_col, F.struct(*arrays, F.col(raw).getField("error").alias("error")))
            .drop(raw))
