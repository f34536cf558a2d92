"""GPUs per worker: the task side's cheap, TensorFlow-free probe for GPUs on a host (:func:`host_has_gpus`).

The driver's check of Spark's GPU settings is a preflight rule:
:func:`spark_imagenet.training.driver.preflight.gpus.check_gpu_conf`.

No TensorFlow import here (the driver and the barrier tasks stay light).
"""

from __future__ import annotations

import glob
import os
import shutil


def host_has_gpus(dev: str = "/dev") -> bool:
    """Whether this host looks like it has NVIDIA GPUs, without starting CUDA or TensorFlow.

    Args:
        dev: the device folder to look in (tests point it at a folder of their own).

    Returns:
        bool: ``dev/nvidia0``, ``dev/nvidia1``, ... exist, or ``nvidia-smi`` is on PATH.
    """
    if glob.glob(os.path.join(dev, "nvidia[0-9]*")):
        return True
    return shutil.which("nvidia-smi") is not None
