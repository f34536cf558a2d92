"""The set-up of a process before its first ``import tensorflow``, made by the entry point that starts it.

Importing a module of this package changes nothing in the process; the entry points that make a process
import TensorFlow call one of these first:

* :func:`prepare_tensorflow_process`: a TensorFlow process of ours, for its whole life (the TensorFlow worker,
  :mod:`.main`; the fork server, :mod:`.forkserver`; the ``evaluate`` and ``predict`` commands).
* :func:`borrowed_process`: the block that loads TensorFlow in a process that is not ours, an executor's
  PySpark Python worker, which Spark reuses for later tasks (batch inference, :mod:`.batch_predict`).

TensorFlow's variables come from :func:`spark_imagenet.training.job.tf_process.tensorflow_environment`: the
Keras 2 API of ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``), which MultiWorkerMirroredStrategy needs (Keras 3 fails
under it; docs/design.md), and TensorFlow's C++ log level (``TF_CPP_MIN_LOG_LEVEL=2``: no INFO or WARNING
lines), which :mod:`.native_log` also applies to the lines TensorFlow's libraries print while it is imported.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from spark_imagenet.training.job.tf_process import tensorflow_environment
from spark_imagenet.training.worker import import_hooks, native_log


def prepare_tensorflow_process() -> None:
    """Set this process up as a TensorFlow process of ours; call it before anything imports TensorFlow.

    * TensorFlow's variables (:func:`~spark_imagenet.training.job.tf_process.tensorflow_environment`) as
      defaults in ``os.environ``: what the process was started with wins;
    * the native log lines of the first ``import tensorflow`` filtered (:func:`.native_log.install`; the hook
      removes itself at that import);
    * pandas left out of every tf_keras module the process imports (:func:`.import_hooks.leave_out_pandas`; the
      hook stays, tf_keras imports its modules lazily).

    Calling it again changes nothing; once TensorFlow is imported, only the variables are set.
    """
    for name, value in tensorflow_environment({}).items():
        os.environ.setdefault(name, value)
    native_log.install()
    import_hooks.leave_out_pandas()


@contextlib.contextmanager
def borrowed_process(cpu_only: bool = False) -> Iterator[None]:
    """Context manager around the first use of TensorFlow in a process that is not ours (an executor's PySpark
    Python worker): inside, TensorFlow's variables as defaults (as :func:`prepare_tensorflow_process`) and the
    native log lines filtered (:func:`.native_log.filtered_stderr`); afterwards ``os.environ`` is as before and
    no import hook is left (pandas is imported there already: a pandas UDF runs it).

    Args:
        cpu_only: also drop TensorFlow's CUDA start-up lines (a host without a GPU).
    """
    added = {name: value for name, value in tensorflow_environment({}).items() if name not in os.environ}
    os.environ.update(added)
    try:
        with native_log.filtered_stderr(cpu_only=cpu_only):
            yield
    finally:
        for name in added:
            os.environ.pop(name, None)
