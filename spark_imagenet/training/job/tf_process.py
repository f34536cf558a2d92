"""The environment a Python process that imports TensorFlow starts with: made here, once, for every such process.

Every process of the package that imports TensorFlow (the barrier task's TensorFlow worker, the ``evaluate``,
``predict`` and ``export`` children of the command line, ``doctor``'s probe, an executor's batch-inference UDF)
gets its variables from :func:`tensorflow_environment`: the Keras 2 API of ``tf_keras``, which
MultiWorkerMirroredStrategy needs (Keras 3 fails under it; docs/design.md, 'Keras 2 (tf-keras) under
MultiWorkerMirroredStrategy'), and TensorFlow's C++ log level. No TensorFlow here.
"""

from __future__ import annotations

from typing import Mapping

#: ``TF_CPP_MIN_LOG_LEVEL`` unless the environment or the caller says otherwise: no INFO or WARNING lines.
DEFAULT_LOG_LEVEL = "2"


def tensorflow_environment(base: Mapping[str, str], *, log_level: str | None = None) -> dict[str, str]:
    """The environment of a process that imports TensorFlow: ``base`` plus TensorFlow's settings.

    Args:
        base: the environment to start from (``os.environ``, or ``{}`` for only TensorFlow's variables).
        log_level: ``TF_CPP_MIN_LOG_LEVEL`` (``"0"`` all lines .. ``"3"`` fatal only), set whatever ``base``
            says; None keeps ``base``'s value, else :data:`DEFAULT_LOG_LEVEL`.

    Returns:
        dict[str, str]: a copy of ``base`` with ``TF_USE_LEGACY_KERAS=1`` (always: the package's models and
        strategies are Keras 2's) and ``TF_CPP_MIN_LOG_LEVEL``.

    Example:

    ```python
    >>> import os, subprocess, sys
    >>> from spark_imagenet.training.job.tf_process import tensorflow_environment
    >>> env = tensorflow_environment(os.environ)
    >>> subprocess.run([sys.executable, "-c", "import os; print(os.environ['TF_USE_LEGACY_KERAS'])"], env=env,
    ...                capture_output=True, text=True).stdout.strip()   # then: "import tensorflow"
    '1'

    ```
    """
    env = dict(base)
    env["TF_USE_LEGACY_KERAS"] = "1"
    if log_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = log_level
    else:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_LOG_LEVEL)
    return env
