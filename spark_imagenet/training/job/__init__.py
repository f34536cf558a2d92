"""The job contract, read by every process of a training job (driver, barrier task, TensorFlow worker).

Settings (:mod:`.config`, in the sections of :mod:`.sections`, checked by the rules of :mod:`.settings`;
job files :mod:`.jobfile`, command-line options :mod:`.options`), what goes into a job, one value per process
hop (:mod:`.plan`: the driver's :class:`~.plan.JobPlan`, the worker's :class:`~.plan.WorkerSpec`), what comes
back (:mod:`.outcome`: results and failures, typed), the learning-rate schedule (:mod:`.schedules`), which
shards each rank reads (:mod:`.assignment`), the checkpoint folder and its meta (:mod:`.checkpoints`) and the ``--output`` folder (:mod:`.outputs`), model names and recipes
(:mod:`.model_specs`, :mod:`.alexnet_layers`), the Spark master URL (:mod:`.master`), GPU addresses
(:mod:`.gpus`), the log channel's protocol (:mod:`.logchannel`), the TensorFlow fork server's protocol
(:mod:`.forking`) and Ctrl-C handling (:mod:`.interrupts`).

Nothing here imports TensorFlow or PySpark, nor the process folders ``driver``, ``task`` and ``worker``.
"""
