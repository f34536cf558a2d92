"""The barrier task's own ways to run a child and build its environment, composed as the task composes them
(spark_imagenet.training.task.child and .environment), for tests that run a child outside a Spark task."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from spark_imagenet.training.task.child import ChildFolder, finish_child, start_child
from spark_imagenet.training.task.environment import job_env, preload_env


def run_child(argv: Sequence[str], env: Mapping[str, str], cwd: str | None, prefix: str, *,
              folder: ChildFolder | None = None, **options: Any) -> tuple[int, list[str]]:
    """:func:`start_child` then :func:`finish_child` (``options``: its ``tail_lines``, ``out``, ``shown``)."""
    proc = start_child(argv, env, cwd, folder.prefix if folder is not None else None)
    return finish_child(proc, prefix, folder=folder, **options)


def worker_env(base: Mapping[str, str], tf_config: Mapping[str, Any] | None, gpu_addresses: Sequence[str] | None,
               local_workers: int, task_path: Sequence[str] = ()) -> dict[str, str]:
    """The TensorFlow worker's environment once it trains: started with :func:`preload_env`, then given
    :func:`job_env` after its go."""
    return {**preload_env(base, gpu_addresses, task_path), **job_env(base, tf_config, gpu_addresses, local_workers)}
