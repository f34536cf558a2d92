"""spark-imagenet: ImageNet (Kaggle layout) to verified TFRecord shards, and
AlexNet training in Spark barrier tasks under TensorFlow's
MultiWorkerMirroredStrategy.

The public API, every name importable from this package without starting TensorFlow or Spark
(``from spark_imagenet import train, TrainConfig, Result``; each module that imports something heavy is
imported on first use):

Datasets:

* :func:`shard`: Kaggle folder or zip, or a class-folder tree -> shards + manifest
  (:mod:`spark_imagenet.dataset.sharding`); ``shard(open_labels("labels.csv"), out)`` for a labels file.
* :func:`open_labels`: a labels file (CSV) of image paths and their classes, for :func:`shard`.
* :func:`shard_dataframe`: a Spark DataFrame of image bytes and labels -> shards + manifest, as a Spark job
  (:mod:`spark_imagenet.dataset.dataframe`).
* :func:`inspect`: read a dataset's manifest; :class:`Manifest`: the manifest itself.
* :func:`open_storage`: a local folder or a bucket URL (gs://, s3://, abfss://, hdfs://) as one storage API.

Training:

* :func:`train`: ``train(spark, url, config)`` with a :class:`TrainConfig`
  (:mod:`spark_imagenet.training.driver.launch`); it returns a :class:`Result`, which
  :meth:`Result.from_path` also reads back from a finished run's ``--output``.
* :class:`TrainConfig`: every setting of a training job, in five sections: :class:`ScalingConfig`,
  :class:`DataConfig`, :class:`RecipeConfig`, :class:`RunConfig` and :class:`TrackingConfig`.
* :func:`predict_dataframe`: the top-k classes of each image of a Spark DataFrame, as a Spark job, with the
  ``serving/`` model of a training run's ``--output`` (:mod:`spark_imagenet.training.driver.batch_predict`).
* :func:`run_demo`: the built-in default (generate, shard, train), returning its :class:`Result`.

Spark ML (:mod:`spark_imagenet.ml`):

* :class:`ImageClassifier`: a ``pyspark.ml`` Estimator whose ``fit(df)`` shards a labelled DataFrame of
  images and trains on it (:func:`shard_dataframe`, then :func:`train`), a stage of a ``Pipeline``.
* :class:`ImageClassifierModel`: what it returns, a training run's ``--output`` folder whose ``transform(df)``
  adds :func:`predict_dataframe`'s column.

Errors (:mod:`spark_imagenet.errors`): :class:`SparkImagenetError`, the base of every error raised on
purpose, and its subclasses :class:`ConfigError`, :class:`LayoutError`, :class:`ArchiveError`,
:class:`ImageError`, :class:`ImageTooLarge`, :class:`DataError`, :class:`ManifestError`, :class:`StorageError`,
:class:`AccessError`, :class:`IntegrityError`, :class:`PreconditionFailed`, :class:`EnvironmentSetupError`,
:class:`TrainingError`, :class:`WorkerLost`, :class:`PeerFailed` and :class:`DownloadError`.

Subpackages, lowest layer first (a layer imports only from the layers below it):
:mod:`.storage` (URL-addressed storage), :mod:`.source` (the Kaggle download),
:mod:`.dataset` (shards and manifest), :mod:`.training` (driver, barrier tasks,
TensorFlow worker process), :mod:`.demo` and :mod:`.ml` (the Spark ML stages), and the command line (:mod:`.cli`).
TensorFlow is only imported inside the TensorFlow worker process
(:mod:`spark_imagenet.training.worker.main`), never by the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_imagenet.errors import (
    AccessError,
    ArchiveError,
    ConfigError,
    DataError,
    DownloadError,
    EnvironmentSetupError,
    ImageError,
    ImageTooLarge,
    IntegrityError,
    LayoutError,
    ManifestError,
    PeerFailed,
    PreconditionFailed,
    SparkImagenetError,
    StorageError,
    TrainingError,
    WorkerLost,
)

if TYPE_CHECKING:  # what __getattr__ gives, for editors and type checkers
    from spark_imagenet.dataset.dataframe import shard_dataframe
    from spark_imagenet.dataset.manifest import Manifest
    from spark_imagenet.dataset.report import inspect
    from spark_imagenet.dataset.sharding import shard
    from spark_imagenet.demo import run_demo
    from spark_imagenet.ml import ImageClassifier, ImageClassifierModel
    from spark_imagenet.source import open_labels
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.driver.batch_predict import predict_dataframe
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.driver.results import Result
    from spark_imagenet.training.job.config import TrainConfig
    from spark_imagenet.training.job.sections import (
        DataConfig,
        RecipeConfig,
        RunConfig,
        ScalingConfig,
        TrackingConfig,
    )

__version__ = "0.1.0"

#: The public names imported on first use, by module.
_LAZY_MODULES = {
    "spark_imagenet.dataset.sharding": ("shard",),
    "spark_imagenet.source": ("open_labels",),
    "spark_imagenet.dataset.dataframe": ("shard_dataframe",),
    "spark_imagenet.training.driver.batch_predict": ("predict_dataframe",),
    "spark_imagenet.dataset.report": ("inspect",),
    "spark_imagenet.training.driver.launch": ("train",),
    "spark_imagenet.demo": ("run_demo",),
    "spark_imagenet.training.driver.results": ("Result",),
    "spark_imagenet.dataset.manifest": ("Manifest",),
    "spark_imagenet.storage": ("open_storage",),
    "spark_imagenet.training.job.config": ("TrainConfig",),
    "spark_imagenet.training.job.sections": ("ScalingConfig", "DataConfig", "RecipeConfig", "RunConfig",
                                             "TrackingConfig"),
    "spark_imagenet.ml": ("ImageClassifier", "ImageClassifierModel"),
}
#: The same as ``{name: (module, attribute)}``, what ``__getattr__`` reads.
_LAZY = {name: (module, name) for module, names in _LAZY_MODULES.items() for name in names}

#: Every public name, written out so that type checkers read it (``_LAZY``'s names, then the errors).
__all__ = [
    "__version__",
    "shard", "open_labels", "shard_dataframe", "predict_dataframe", "inspect", "train", "run_demo", "Result",
    "Manifest", "open_storage", "TrainConfig", "ScalingConfig", "DataConfig", "RecipeConfig", "RunConfig",
    "TrackingConfig", "ImageClassifier", "ImageClassifierModel",
    "SparkImagenetError", "ConfigError", "LayoutError", "ArchiveError", "ImageError", "ImageTooLarge",
    "DataError",
    "ManifestError", "StorageError", "AccessError", "IntegrityError", "PreconditionFailed",
    "EnvironmentSetupError", "TrainingError", "WorkerLost", "PeerFailed", "DownloadError",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'spark_imagenet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
