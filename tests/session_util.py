"""A real local SparkSession per test module, and the environment of its executors."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


def module_spark(master: str, app_name: str) -> Iterator[Any]:
    """A real ``master`` SparkSession for one test module (a generator for a module fixture): no UI, few
    shuffle partitions; stopped at the module's end."""
    from spark_imagenet.training.driver.spark_session import local_session

    session = local_session(master, app_name=app_name,
                            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@contextlib.contextmanager
def executor_env(spark, env: dict[str, str]) -> Iterator[None]:
    """Give the executors' Python workers ``env`` for the block (what ``spark.executorEnv.NAME`` does; a local
    session's workers otherwise keep the environment of the JVM's start, before a test set its variables)."""
    sc = spark.sparkContext
    saved = dict(sc.environment)
    sc.environment.update(env)
    try:
        yield
    finally:
        sc.environment.clear()
        sc.environment.update(saved)
