"""spark-imagenet: ImageNet (Kaggle layout) to verified TFRecord shards, and
AlexNet training in Spark barrier tasks under TensorFlow's
MultiWorkerMirroredStrategy.

The main entry points, importable without starting TensorFlow or Spark:

* :func:`shard` (``spark_imagenet.dataset.sharding.shard``): Kaggle folder -> shards + manifest.
* :func:`inspect`: read a dataset's manifest.
* :func:`train` (``spark_imagenet.training.driver.train``): ``train(spark, url, workers, ...)``.
* :func:`run_demo`: the built-in default (generate, shard, train).

TensorFlow is only imported inside the per-task child process
(:mod:`spark_imagenet.training.worker`), never by the driver.
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
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'spark_imagenet' has no attribute {name!r}")
