"""Training, in one folder per process a module runs in.

* :mod:`.job`: the job contract every process reads (settings, schedule, shard assignment, checkpoint and
  output folders, model names and recipes). No TensorFlow, no Spark.
* :mod:`.driver`: the Spark driver (the ``spark-imagenet train`` process or a user's ``train(spark, ...)``):
  check, plan, launch the barrier stage, report. No TensorFlow.
* :mod:`.task`: each Spark barrier task (a PySpark Python worker on an executor): stage shards, meet the
  peers, run and watch the TensorFlow worker. No TensorFlow.
* :mod:`.worker`: the TensorFlow worker process (for each barrier task a fresh fork of the host's TensorFlow
  fork server, which is here too), the TensorFlow commands ``evaluate`` and ``predict``, and batch
  inference's executor side (``batch_predict``, in an executor's Python worker; the driver names it by its
  import path only). The only folder that imports TensorFlow.

Imports go downwards only: ``driver`` may import ``task`` (it hands the task function to Spark) and ``job``;
``task`` imports ``job``; ``worker`` imports ``job``; ``job`` imports none of them (checked by import-linter,
``pyproject.toml``).

Layer: above :mod:`spark_imagenet.dataset`; below :mod:`spark_imagenet.demo` and the CLI.
"""
