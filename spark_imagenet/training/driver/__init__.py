"""The Spark driver's side of training: runs in the process that holds the SparkSession.

* :mod:`.launch`: ``train(spark, url, config)``: check, plan, launch the barrier stage, report.
* :mod:`.preflight`: checks made before Spark starts or before the stage is launched.
* :mod:`.spark_session`: the SparkSession of the command line (Java check, master, conf).
* :mod:`.console`: that session started and stopped for the command line (Ctrl-C, one error line).
* :mod:`.stage`: the barrier stage behind one launch interface (``RDD.barrier().mapPartitions``, Ctrl-C).
* :mod:`.connect`: the same barrier stage under Spark Connect (``mapInArrow(barrier=True)``).
* :mod:`.logserver`: the driver's side of the log channel (the tasks' lines on this console).
* :mod:`.results`: the per-worker records the tasks hand back, and the job's typed ``Result``.
* :mod:`.batch_predict`: ``predict_dataframe``, batch inference as a Spark job (its pandas UDF imports
  :mod:`spark_imagenet.training.worker.batch_predict` by name, in the executors' Python workers);
  :mod:`.predict_job`: the ``predict --source/--table ... --out`` command around it.

May import :mod:`spark_imagenet.training.task` and :mod:`spark_imagenet.training.job`; never TensorFlow.
"""
