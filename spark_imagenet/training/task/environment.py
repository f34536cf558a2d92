"""The environment of a barrier task's TensorFlow worker process: its GPUs, threads and variables.

The process is started with :func:`preload_env` (what TensorFlow reads when it is imported, all known when the
task starts) and, after the rendezvous, puts :func:`job_env` into its ``os.environ`` (TF_CONFIG and what else
depends on the cluster). No TensorFlow here.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping, Sequence

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job.tf_process import tensorflow_environment


def cuda_visible_devices(addresses: Sequence[str], existing: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES value for the GPUs Spark gave a task.

    The rule (the one PySpark's TorchDistributor follows): Spark's addresses
    are what the discovery script reported, CUDA device indices as the
    executor sees them. Without an executor CUDA_VISIBLE_DEVICES they are used
    as they are; with one, address ``i`` means the executor's ``i``-th visible
    device, so ``["0", "1"]`` under ``CUDA_VISIBLE_DEVICES=3,5,7`` is ``"3,5"``
    (docs/design.md, 'GPUs and CUDA_VISIBLE_DEVICES').

    Args:
        addresses: ``TaskContext.resources()["gpu"].addresses``, GPU indices
            as strings (``["0", "2"]``).
        existing: the executor's own CUDA_VISIBLE_DEVICES (None or empty when
            unset). When set, Spark's addresses index into that list (the
            executor only sees those devices), so they are mapped through it.

    Returns:
        str: comma-separated device ids, e.g. ``"0,2"``.

    Raises:
        ConfigError: an address that is not a plain non-negative integer, or
            one outside the executor's CUDA_VISIBLE_DEVICES list.
    """
    indices = []
    for a in addresses:
        a = str(a).strip()
        if not a.isdigit() or (len(a) > 1 and a.startswith("0")):
            raise ConfigError(
                f"GPU address {a!r} from Spark is not a plain device index; the GPU discovery script must "
                "report CUDA device indices (0, 1, ...)"
            )
        indices.append(int(a))
    visible = [d.strip() for d in existing.split(",")] if existing and existing.strip() else None
    if visible is None:
        return ",".join(str(i) for i in indices)
    bad = [i for i in indices if i >= len(visible)]
    if bad:
        raise ConfigError(
            f"Spark assigned GPU(s) {bad} but the executor's CUDA_VISIBLE_DEVICES={existing!r} has only "
            f"{len(visible)} device(s); make the discovery script report indices relative to it"
        )
    return ",".join(visible[i] for i in indices)


def preload_env(base: Mapping[str, str], gpu_addresses: Sequence[str] | None,
                task_path: Sequence[str] = ()) -> dict[str, str]:
    """The environment the TensorFlow worker process is started with, before the rendezvous: what TensorFlow
    reads when it is imported, all known when the task starts.

    Args:
        base: the task's environment (``os.environ``).
        gpu_addresses: the task's GPU addresses from Spark, or None when Spark assigned no GPU resource.
        task_path: the task's ``sys.path``; its entries outside the interpreter's own installation (the folders
            and zips of ``--py-files``/``addPyFile``, the task's working directory) are appended to PYTHONPATH, so
            the child imports what the task can, e.g. a user's ``--model package.module:function``.

    Returns:
        dict: ``base`` without TF_CONFIG, plus TensorFlow's variables
        (:func:`~spark_imagenet.training.job.tf_process.tensorflow_environment`: TF_USE_LEGACY_KERAS=1,
        TF_CPP_MIN_LOG_LEVEL=2 unless set), PYTHONUNBUFFERED=1,
        CUDA_VISIBLE_DEVICES from ``gpu_addresses`` (:func:`cuda_visible_devices`), and this package's folder
        first on PYTHONPATH, so ``python -m`` finds it even when it is not installed; PYTHONPATH's ``.jar``
        entries are left out.

    Raises:
        ConfigError: see :func:`cuda_visible_devices`.
    """
    env = tensorflow_environment(base)
    env.pop("TF_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    if gpu_addresses:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(gpu_addresses, base.get("CUDA_VISIBLE_DEVICES"))
    import spark_imagenet

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(spark_imagenet.__file__)))
    # not the Java archives PySpark puts on PYTHONPATH (spark-core's, without a Python file): Python's zip
    # importer would read their directories into every TensorFlow process (7 MB for spark-core's 6,000 entries)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not p.endswith(".jar")]
    paths = [package_parent] + [p for p in paths if p != package_parent]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in _task_only_paths(task_path) if p not in paths])
    return env


def job_env(base: Mapping[str, str], tf_config: Mapping[str, Any] | None, gpu_addresses: Sequence[str] | None,
            local_workers: int) -> dict[str, str]:
    """The environment variables known only after the rendezvous, which the TensorFlow worker process puts into
    its ``os.environ`` after its go, before it builds its strategy (TensorFlow reads them then, not at import).

    Args:
        base: the task's environment (``os.environ``).
        tf_config: from :func:`spark_imagenet.training.task.rendezvous.build_tf_config`; None for the
            one-worker strategies (``mirrored``, ``default``): no cluster.
        gpu_addresses: the task's GPU addresses from Spark, or None when Spark assigned no GPU resource.
        local_workers: workers sharing this host.

    Returns:
        dict: TF_CONFIG (JSON) with ``tf_config``; TF_FORCE_GPU_ALLOW_GROWTH=true with no GPU resource, several
        workers on the host and none in ``base``.
    """
    extra = {} if tf_config is None else {"TF_CONFIG": json.dumps(tf_config)}
    if not gpu_addresses and local_workers > 1 and "TF_FORCE_GPU_ALLOW_GROWTH" not in base:
        extra["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    return extra


def _task_only_paths(task_path: Sequence[str]) -> list[str]:
    """The entries of ``task_path`` that a fresh interpreter would not have: absolute, existing, not inside
    ``sys.prefix``/``sys.base_prefix`` (the standard library and site-packages), in order, without repeats."""
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    kept: list[str] = []
    for entry in task_path:
        if not isinstance(entry, str):
            continue  # bytes entries: not for PYTHONPATH
        path = os.path.abspath(entry)
        real = os.path.realpath(path)
        if (os.path.exists(path) and path not in kept
                and not any(real == o or real.startswith(o + os.sep) for o in own)):
            kept.append(path)
    return kept


def task_gpus(addresses: Sequence[str] | None, gpus_per_worker: int) -> list[str] | None:
    """Check the GPU addresses Spark gave a task against ``--gpus-per-worker``.

    Args:
        addresses: ``TaskContext.resources()["gpu"].addresses``, None when the
            task has no GPU resource.
        gpus_per_worker: K from the job's config (0 = no GPUs asked for).

    Returns:
        The addresses (all of them: a worker trains on every GPU it is
        given), or None when there are none.

    Raises:
        ConfigError: K > 0 and fewer than K addresses; the message names
            ``spark.task.resource.gpu.amount`` and the executor settings.
    """
    got = [str(a) for a in addresses] if addresses else []
    if gpus_per_worker > 0 and len(got) < gpus_per_worker:
        raise ConfigError(
            f"--gpus-per-worker {gpus_per_worker} but Spark gave this task "
            f"{len(got)} GPU(s) {got}; set spark.task.resource.gpu.amount={gpus_per_worker} (with "
            f"spark.executor.resource.gpu.amount >= {gpus_per_worker} and a GPU discovery script, "
            "conf/gpu-discovery.sh)", key="--gpus-per-worker", value=gpus_per_worker
        )
    return got or None


def gpu_sharing_warning(addresses: Sequence[str] | None, local_workers: int, host_has_gpus: bool) -> str | None:
    """A warning when several workers on a GPU host would all see every GPU.

    Args:
        addresses: the task's GPU addresses (None: no GPU resource configured).
        local_workers: workers sharing this host.
        host_has_gpus: :func:`spark_imagenet.training.job.gpus.host_has_gpus` of this host.

    Returns:
        The warning line, or None.
    """
    if addresses or local_workers <= 1 or not host_has_gpus:
        return None
    return (f"warning: this host has GPUs but Spark assigned this task none (no spark.task.resource.gpu.amount): "
            f"all {local_workers} workers on it see every GPU and share their memory; pass --gpus-per-worker K "
            "and set Spark's GPU resources to give each worker its own")


def host_cpus() -> int:
    """CPUs this process may run on (affinity mask, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
