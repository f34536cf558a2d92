"""GPUs per worker: the task side's cheap, TensorFlow-free probe for GPUs on a host (:func:`host_has_gpus`), and
the lines TensorFlow prints when it starts on a host without one (:func:`is_cpu_startup_line`).

The driver's check of Spark's GPU settings is a preflight rule:
:func:`spark_imagenet.training.driver.preflight.gpus.check_gpu_conf`.

No TensorFlow import here (the driver and the barrier tasks stay light).
"""

from __future__ import annotations

import glob
import os
import re
import shutil

#: TensorFlow's start-up lines on a host without a CUDA driver: true, but they read like failures
#: ("failed call to cuInit: ... CUDA error") in every CPU-only TensorFlow process.
_CPU_STARTUP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|Could not find cuda drivers on your machine, GPU will not be used"
    r"|failed call to cuInit"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation placer already registered"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags"
)


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


def is_cpu_startup_line(line: str) -> bool:
    """Whether ``line`` is one of TensorFlow's CUDA start-up lines of a process on the CPU (``failed call to
    cuInit ...``, ``Could not find cuda drivers ...``, absl's preamble, ...).

    Every TensorFlow process of the package hides these where it has no GPU and its host has none (a GPU
    process's CUDA errors are real): the barrier task's worker and the command line's children through
    :class:`spark_imagenet.training.task.child.CpuStartupFilter`, an executor's batch inference through
    :func:`spark_imagenet.training.worker.native_log.filtered_stderr`.

    Args:
        line: one output line, with or without its newline.

    Returns:
        bool: True for such a line.
    """
    return _CPU_STARTUP_NOISE.search(line) is not None
