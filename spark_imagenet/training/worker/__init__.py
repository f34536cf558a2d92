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
* :mod:`.native_log`: TensorFlow's import-time log lines at the level asked for, once each.
* :mod:`.import_hooks`: code run around a module's import (the native log's filter around TensorFlow's), and
  pandas left out of tf_keras's modules.
* :mod:`.tf_internals`: every private TensorFlow and tf-keras API the package uses, behind small shims, with
  the TensorFlow version each was checked against.
* :mod:`.evaluate`, :mod:`.predict`: the ``evaluate`` and ``predict`` commands (run in a child Python).
* :mod:`.batch_predict`: the executor side of batch inference (``predict_dataframe``): runs in an executor's
  PySpark Python worker, inside a pandas UDF, the one module here not run in a TensorFlow process of ours.

TensorFlow's set-up is made here, once, before any module of this folder imports it, as defaults from
:func:`spark_imagenet.training.job.tf_process.tensorflow_environment`: the Keras 2 API of
``tf_keras`` (``TF_USE_LEGACY_KERAS=1``), which MultiWorkerMirroredStrategy needs (Keras 3 fails under it;
docs/design.md), and TensorFlow's C++ log level (``TF_CPP_MIN_LOG_LEVEL=2``: no INFO or WARNING lines),
which :mod:`.native_log` also applies to the lines TensorFlow's libraries print while it is imported.
"""

import os

from spark_imagenet.training.job.tf_process import tensorflow_environment

for _name, _value in tensorflow_environment({}).items():
    os.environ.setdefault(_name, _value)  # defaults: what the process was started with wins
del _name, _value

from spark_imagenet.training.worker import import_hooks, native_log  # noqa: E402  (after the environment above)

native_log.install()
import_hooks.leave_out_pandas()
