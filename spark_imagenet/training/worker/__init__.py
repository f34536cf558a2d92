"""The TensorFlow worker process: the only part of the package that imports TensorFlow.

* :mod:`.main`: one ``MultiWorkerMirroredStrategy`` worker (``python -m spark_imagenet.training.worker.main``):
  its spec in, its result or failure out; :mod:`.strategy` (the strategy and the workers' agreement) and
  :mod:`.training` (datasets, model, ``fit``, evaluation, checkpoints, ``--output``) do the work.
* :mod:`.pipeline`: the ``tf.data`` input pipeline (per-image work in :mod:`.preprocessing`, naming a bad
  record in :mod:`.bad_records`).
* :mod:`.models`: AlexNet, ResNet-50, a user's builder, and compiling them.
* :mod:`.model_state` (the ``tf.train.Checkpoint`` of model, optimizer and dropout generators; the folder
  store is :mod:`spark_imagenet.training.job.checkpoints`), :mod:`.keras_schedule`, :mod:`.optimizers`,
  :mod:`.watchdog`: the training loop's parts.
* :mod:`.forkserver`: the host's TensorFlow fork server: imports TensorFlow once and forks each task's worker
  process from that state (``python -m spark_imagenet.training.worker.forkserver``); kills a worker whose task
  is gone and removes its folder.
* :mod:`.environment`: the set-up each entry point makes before TensorFlow's import (its variables, the native
  log's filter, pandas left out of tf_keras's modules); :mod:`.native_log` (TensorFlow's import-time log lines at
  the level asked for, once each) and :mod:`.import_hooks` (code run around a module's import) are its parts.
* :mod:`.tf_internals`: every private TensorFlow and tf-keras API the package uses, behind small shims, with
  the TensorFlow version each was checked against.
* :mod:`.evaluate`, :mod:`.predict`: the ``evaluate`` and ``predict`` commands (run in a child Python).
* :mod:`.batch_predict`: the executor side of batch inference (``predict_dataframe``): runs in an executor's
  PySpark Python worker, inside a pandas UDF, the one module here not run in a TensorFlow process of ours.

Importing a module of this folder changes no process-wide state (no variable of ``os.environ``, no import hook):
the entry points that start a TensorFlow process set it up (:mod:`.environment`).
"""
