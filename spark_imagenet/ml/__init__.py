"""Spark ML (``pyspark.ml``) stages of the package: train and score images as stages of a ``Pipeline``.

* :class:`ImageClassifier`: an Estimator whose ``fit(df)`` shards a labelled DataFrame of images and trains
  on it with Spark barrier tasks (:func:`~spark_imagenet.dataset.dataframe.shard_dataframe`, then
  :func:`~spark_imagenet.training.driver.launch.train`).
* :class:`ImageClassifierModel`: the trained model, the run's ``--output`` folder by reference, whose
  ``transform(df)`` adds the prediction column of
  :func:`~spark_imagenet.training.driver.batch_predict.predict_dataframe`.

Driver-side code: it imports PySpark (``pyspark.ml``), never TensorFlow. A layer above ``training`` and
``dataset``, beside ``demo`` (docs/design.md, 'A Spark ML estimator').

Raises:
    EnvironmentSetupError: on import, when pyspark is not installed (the optional extra ``spark``:
        :func:`~spark_imagenet.training.driver.spark_session.require_pyspark`).
"""

from spark_imagenet.training.driver.spark_session import require_pyspark

require_pyspark()  # before pyspark.ml is imported: one line instead of a ModuleNotFoundError

from spark_imagenet.ml.classifier import ImageClassifier, ImageClassifierModel  # noqa: E402

__all__ = ["ImageClassifier", "ImageClassifierModel"]
