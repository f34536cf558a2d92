"""Training: the driver side, the barrier task side and the TensorFlow worker process.

Driver side (never imports TensorFlow):

* :mod:`.driver`: ``train``: check, plan, launch the barrier stage, report.
* :mod:`.spark_session`: the SparkSession for the command line (Java check, master, conf).
* :mod:`.assignment`: which shards and validation records each rank reads.

Task side (inside each Spark barrier task; no TensorFlow either):

* :mod:`.barrier_task`: stage shards, rendezvous, run the TensorFlow worker process.
* :mod:`.staging`: fetch one rank's shards into the host's cache.
* :mod:`.rendezvous`: ranks and ``host:port`` of every worker, ``TF_CONFIG``.

TensorFlow worker process (a fresh child of each barrier task):

* :mod:`.worker`: one ``MultiWorkerMirroredStrategy`` worker (it may hold several replicas).
* :mod:`.pipeline`: the ``tf.data`` input pipeline.
* :mod:`.models`: the models (``.models.specs`` is TensorFlow-free for the driver).

Layer: above :mod:`spark_imagenet.dataset`; below :mod:`spark_imagenet.demo` and the CLI.
"""
