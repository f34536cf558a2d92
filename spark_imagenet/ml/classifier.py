"""``pyspark.ml`` stages: :class:`ImageClassifier` (an Estimator) and :class:`ImageClassifierModel` (its Model).

``ImageClassifier.fit(df)`` is the package's two Spark jobs in a row on ``df``'s session: shard the DataFrame
(:func:`~spark_imagenet.dataset.dataframe.shard_dataframe`, into ``datasetPath``), then train on the shards with
barrier tasks (:func:`~spark_imagenet.training.driver.launch.train`, into ``outputPath``). The model it returns
is that ``--output`` folder, by reference: ``transform(df)`` is
:func:`~spark_imagenet.training.driver.batch_predict.predict_dataframe` with it, and saving the model saves its
Params (the folder's URL among them), not the weights. Both save and load with pyspark.ml's Params writer and
reader, alone or as stages of a ``Pipeline``. A classic session only: a Spark Connect DataFrame is refused in
one line (docs/design.md, 'A Spark ML estimator').
"""

from __future__ import annotations

from typing import Any

from pyspark.ml import Estimator, Model
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable

from spark_imagenet.dataset.dataframe import is_connect, shard_dataframe
from spark_imagenet.errors import ConfigError
from spark_imagenet.ml.params import PREDICT, SHARD, TRAINING, ParamTable, plain
from spark_imagenet.training.driver.batch_predict import predict_dataframe
from spark_imagenet.training.driver.launch import train
from spark_imagenet.training.driver.results import Result
from spark_imagenet.training.job.config import TrainConfig

#: The Params of each stage, in the order of their groups (a Param shared by groups takes the first's default).
MODEL_PARAMS = ParamTable("ImageClassifierModel", {"predict": PREDICT})
ESTIMATOR_PARAMS = ParamTable("ImageClassifier", {"train": TRAINING, "shard": SHARD, "predict": PREDICT})


def refuse_connect(df: Any, what: str) -> None:
    """Refuse a DataFrame of a Spark Connect session in one line.

    Raises:
        ConfigError: ``df`` belongs to a Spark Connect session (names the functions to use there).
    """
    if is_connect(df):
        raise ConfigError(f"{what}: this DataFrame belongs to a Spark Connect session, and the spark_imagenet.ml "
                          "stages run on a classic SparkSession only; under Spark Connect call "
                          "spark_imagenet.shard_dataframe, train and predict_dataframe, which work there")


class _Stage:
    """What both stages share: construction and ``setParams`` by keyword, checked against the stage's Params."""

    _table: ParamTable

    def _start(self, params: dict[str, Any]) -> None:
        self._setDefault(**self._table.defaults())
        self.setParams(**params)

    def setParams(self, **params: Any):
        """Set Params by name (``setParams(epochs=3, batchSize=16)``); returns ``self``.

        Raises:
            ConfigError: an unknown Param name (with the closest one).
        """
        self._table.check_names(params)
        return self._set(**{name: plain(value) for name, value in params.items()})


@MODEL_PARAMS.declare
class ImageClassifierModel(_Stage, Model, DefaultParamsReadable, DefaultParamsWritable):
    """A trained image classifier: the ``--output`` folder of a training run, as a ``pyspark.ml`` Model.

    ``transform(df)`` adds the top-k classes of each image of ``df`` as one struct column, exactly as
    :func:`~spark_imagenet.training.driver.batch_predict.predict_dataframe` does (it calls it): ``class_ids``
    (int32 ``[K]``), ``wnids`` and ``names`` (``[K]``), ``probabilities`` (float32 ``[K]``, softmax) and
    ``error`` (null, or why the row has no prediction). :meth:`ImageClassifier.fit` returns one; one can also
    be made for any run's folder: ``ImageClassifierModel(outputPath="gs://b/runs/a")``. Saving it writes its
    Params (``outputPath`` among them), not the model: the folder must stay where it is.

    Params (each with ``getX``/``setX``; ``explainParams()`` lists them): ``outputPath`` (required: the
    run's ``--output`` folder or bucket URL, holding ``serving/`` and ``labels.json``), ``imageCol``
    (binary, default ``content``), ``predictionCol`` (default ``prediction``), ``topK`` (default 5),
    ``predictionBatchSize`` (images per call of the model, default 64), ``maxImagePixels``.

    Args:
        **params: Param values by name.

    Raises:
        ConfigError: an unknown Param name; from ``transform``: a Spark Connect DataFrame, ``outputPath`` not
            set, or what ``predict_dataframe`` refuses (a missing or non-binary image column, a bad ``topK``,
            a folder without ``serving/``), naming the Param.

    Example:

    ```python
    >>> from spark_imagenet.ml import ImageClassifierModel
    >>> model = ImageClassifierModel(outputPath="gs://my-bucket/runs/alexnet-90", topK=3)
    >>> model.getOrDefault("outputPath"), model.getOrDefault("topK")
    ('my-bucket/runs/alexnet-90', 3)

    Then ``model.transform(spark.read.format("binaryFile").load("/data/photos/*.jpg"))`` adds the ``prediction``
    column of :func:`~spark_imagenet.predict_dataframe` (run by ``tests/test_ml.py`` on a trained run).
    ```
    """

    _table = MODEL_PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self._start(params)

    @property
    def summary(self) -> Result:
        """The training run's :class:`~spark_imagenet.training.driver.results.Result`, read from
        ``results.json`` in ``outputPath`` (:meth:`Result.from_path`)."""
        return Result.from_path(self._table.arguments(self, "predict")["model_url"])

    def _transform(self, dataset: Any) -> Any:
        refuse_connect(dataset, f"{self._table.owner}.transform")
        arguments = self._table.arguments(self, "predict")
        with self._table.naming("predict"):
            return predict_dataframe(dataset, **arguments)


@ESTIMATOR_PARAMS.declare
class ImageClassifier(_Stage, Estimator, DefaultParamsReadable, DefaultParamsWritable):
    """Train an image classifier on a labelled DataFrame of images, as a ``pyspark.ml`` Estimator.

    ``fit(df)`` shards ``df`` into ``datasetPath`` (:func:`~spark_imagenet.dataset.dataframe.shard_dataframe`)
    and trains on the shards with ``workers`` Spark barrier tasks into ``outputPath``
    (:func:`~spark_imagenet.training.driver.launch.train` on ``df``'s session), then returns an
    :class:`ImageClassifierModel` of that folder. Both are Spark jobs of the DataFrame's classic session; the
    session's master and conf are its own (no Param).

    Params (camelCase; each with ``getX``/``setX``; ``explainParams()`` lists them with their docs):

    * the data: ``imageCol`` (binary, default ``content``), ``labelCol`` (a class name or id 0..K-1, default
      ``label``), ``splitCol``, ``nameCol``, ``valFraction``, ``trainShards``, ``valShards``, ``verify``,
      ``onCorrupt``, ``maxImagePixels`` and ``datasetPath`` (required), ``overwriteDataset``: the keywords of
      ``shard_dataframe``, with its defaults;
    * training: one Param per setting of :class:`~spark_imagenet.training.job.config.TrainConfig` but
      ``master`` and ``conf``, named in camelCase with the setting's default (``workers``, required;
      ``epochs``, ``batchSize``, ``imageSize``, ``width``, ``model``, ``learningRate``, ``checkpointDir``,
      ``cache``, ``seed`` (also the shards' seed), ...), ``outputPath`` for ``output`` (required: the model)
      and ``resultsPath`` for ``results``;
    * the model's: ``predictionCol``, ``topK``, ``predictionBatchSize`` (see :class:`ImageClassifierModel`).

    The values are checked where they are used, by the same checks as the functions' and the command line's,
    and a bad one is named by its Param: :meth:`trainConfig` checks the training Params without Spark.

    Args:
        **params: Param values by name.

    Raises:
        ConfigError: an unknown Param name; from ``fit``: a Spark Connect DataFrame, a required Param not set,
            a bad value (``ImageClassifier param 'batchSize': batch_size (--batch-size) must be ...``), or the
            checks of the data and the plan (an ``outputPath`` holding an earlier run without ``overwrite``).
        DataError, ImageError, ManifestError, StorageError, TrainingError, WorkerLost: from ``fit``, what
            ``shard_dataframe`` and ``train`` raise.

    Example:

    ```python
    >>> from pyspark.ml import Pipeline
    >>> from spark_imagenet.ml import ImageClassifier
    >>> classifier = ImageClassifier(datasetPath="gs://my-bucket/photo-shards", outputPath="gs://my-bucket/runs/a",
    ...                              workers=4, epochs=30, batchSize=64, imageSize=224)
    >>> classifier.getOrDefault("workers"), classifier.getOrDefault("epochs")
    (4, 30)

    Then, on photos in one folder per class (its label), fitting trains (``tests/test_ml.py`` runs it):

    df = spark.read.format("binaryFile").load("/data/photos/*/*.jpg")   # one folder per class: its label
    classifier = ImageClassifier(datasetPath="gs://my-bucket/photo-shards", outputPath="gs://my-bucket/runs/a",
                                 workers=4, epochs=30, batchSize=64, imageSize=224)
    model = Pipeline(stages=[classifier]).fit(df)
    model.transform(df).select("path", "prediction.names").show()
    model.write().overwrite().save("gs://my-bucket/pipelines/a")
    ```
    """

    _table = ESTIMATOR_PARAMS

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self._start(params)

    def trainConfig(self) -> TrainConfig:
        """The training job's :class:`~spark_imagenet.training.job.config.TrainConfig` from the training
        Params (no Spark).

        Raises:
            ConfigError: a required Param not set, or a bad value, naming the Param.
        """
        return self._table.train_config(self)

    def _fit(self, dataset: Any) -> ImageClassifierModel:
        refuse_connect(dataset, f"{self._table.owner}.fit")
        config = self.trainConfig()
        shard = self._table.arguments(self, "shard")
        self._table.arguments(self, "predict")  # the model's required Params, before any job
        url = shard.pop("out")
        with self._table.naming("shard"):
            shard_dataframe(dataset, url, **shard)
        with self._table.naming("train"):
            result = train(dataset.sparkSession, url, config)
        model = self._copyValues(ImageClassifierModel())
        return model.setOutputPath(result.output or config.run.output)
