"""spark-imagenet: ImageNet (Kaggle layout) to verified TFRecord shards, and
AlexNet training in Spark barrier tasks under TensorFlow's
MultiWorkerMirroredStrategy.

The main entry points, importable without starting TensorFlow or Spark (each is
a function of this package; no module of the package has these names):

* :func:`shard`: Kaggle folder or zip -> shards + manifest (:mod:`spark_imagenet.dataset.sharding`).
* :func:`inspect`: read a dataset's manifest.
* :func:`train`: ``train(spark, url, config)`` with a
  :class:`~spark_imagenet.training.config.TrainConfig`, or
  ``train(spark, url, workers, epochs=...)`` (:mod:`spark_imagenet.training.driver`).
* :func:`run_demo`: the built-in default (generate, shard, train).
* :class:`Manifest`, :func:`open_storage`, and :class:`TrainConfig`.

Subpackages, lowest layer first (a layer imports only from the layers below it):
:mod:`.storage` (URL-addressed storage), :mod:`.source` (the Kaggle download),
:mod:`.dataset` (shards and manifest), :mod:`.training` (driver, barrier tasks,
TensorFlow worker process), :mod:`.demo`, and the command line (:mod:`.cli`).
Errors are in :mod:`.errors`. TensorFlow is only imported inside the TensorFlow
worker process (:mod:`spark_imagenet.training.worker`), never by the driver.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "shard": ("spark_imagenet.dataset.sharding", "shard"),
    "inspect": ("spark_imagenet.dataset.report", "inspect"),
    "train": ("spark_imagenet.training.driver", "train"),
    "run_demo": ("spark_imagenet.demo", "run_demo"),
    "Manifest": ("spark_imagenet.dataset.manifest", "Manifest"),
    "open_storage": ("spark_imagenet.storage", "open_storage"),
    "TrainConfig": ("spark_imagenet.training.config", "TrainConfig"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'spark_imagenet' has no attribute {name!r}")
