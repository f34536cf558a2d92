"""The barrier task's side of training: runs in a PySpark Python worker on an executor, one per rank.

* :mod:`.barrier_task`: the function Spark runs per barrier task: stage shards, meet the peers, start and
  watch the TensorFlow worker process, hand its result back.
* :mod:`.child`: the TensorFlow worker process, forked by the host's TensorFlow fork server
  (:mod:`spark_imagenet.training.worker.forkserver`): start, inputs and go, output, end.
* :mod:`.environment`: the TensorFlow process's environment (GPUs, threads, ``PYTHONPATH``, ``TF_CONFIG``).
* :mod:`.logsender`: the task's side of the log channel to the driver's console.
* :mod:`.staging`: fetch one rank's shards into the host's verified cache.
* :mod:`.rendezvous`: ranks and ``host:port`` of every worker, ``TF_CONFIG``.

May import :mod:`spark_imagenet.training.job`; never TensorFlow, never the driver's modules.
"""
