"""spark-imagenet: ImageNet (Kaggle layout) to verified TFRecord shards, and
AlexNet training in Spark barrier tasks under TensorFlow's
MultiWorkerMirroredStrategy.

The main entry points, importable without starting TensorFlow or Spark (each is
a function of this package; no module of the package has these names):

* :func:`shard`: Kaggle folder or zip, or a class-folder tree -> shards + manifest
  (:mod:`spark_imagenet.dataset.sharding`); ``shard(open_labels("labels.csv"), out)`` for a labels file.
* :func:`shard_dataframe`: a Spark DataFrame of image bytes and labels -> shards + manifest, as a Spark job
  (:mod:`spark_imagenet.dataset.dataframe`).
* :func:`predict_dataframe`: the top-k classes of each image of a Spark DataFrame, as a Spark job, with the
  ``serving/`` model of a training run's ``--output`` (:mod:`spark_imagenet.training.driver.batch_predict`).
* :func:`inspect`: read a dataset's manifest.
* :func:`train`: ``train(spark, url, config)`` with a
  :class:`~spark_imagenet.training.job.config.TrainConfig`, or
  ``train(spark, url, workers, epochs=...)`` (:mod:`spark_imagenet.training.driver.launch`).
* :func:`run_demo`: the built-in default (generate, shard, train).
* :class:`Manifest`, :func:`open_storage`, and :class:`TrainConfig`.

Subpackages, lowest layer first (a layer imports only from the layers below it):
:mod:`.storage` (URL-addressed storage), :mod:`.source` (the Kaggle download),
:mod:`.dataset` (shards and manifest), :mod:`.training` (driver, barrier tasks,
TensorFlow worker process), :mod:`.demo`, and the command line (:mod:`.cli`).
Errors are in :mod:`.errors`. TensorFlow is only imported inside the TensorFlow
worker process (:mod:`spark_imagenet.training.worker.main`), never by the driver.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "shard": ("spark_imagenet.dataset.sharding", "shard"),
    "open_labels": ("spark_imagenet.source", "open_labels"),
    "shard_dataframe": ("spark_imagenet.dataset.dataframe", "shard_dataframe"),
    "predict_dataframe": ("spark_imagenet.training.driver.batch_predict", "predict_dataframe"),
    "inspect": ("spark_imagenet.dataset.report", "inspect"),
    "train": ("spark_imagenet.training.driver.launch", "train"),
    "run_demo": ("spark_imagenet.demo", "run_demo"),
    "Manifest": ("spark_imagenet.dataset.manifest", "Manifest"),
    "open_storage": ("spark_imagenet.storage", "open_storage"),
    "TrainConfig": ("spark_imagenet.training.job.config", "TrainConfig"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'spark_imagenet' has no attribute {name!r}")
