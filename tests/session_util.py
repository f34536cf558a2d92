"""A real local SparkSession per test module."""

from __future__ import annotations

from typing import Any, Iterator


def module_spark(master: str, app_name: str) -> Iterator[Any]:
    """A real ``master`` SparkSession for one test module (a generator for a module fixture): no UI, few
    shuffle partitions; stopped at the module's end."""
    from spark_imagenet.training.driver.spark_session import local_session

    session = local_session(master, app_name=app_name,
                            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
