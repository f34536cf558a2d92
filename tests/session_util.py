"""The real local SparkSessions of the tests (one shared by consecutive modules, or one per module), and the
environment of their executors."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


#: The running session :func:`shared_spark` hands out (empty: none).
_SHARED: list[Any] = []


def _session(master: str, app_name: str) -> Any:
    """A new real ``master`` SparkSession: no UI, few shuffle partitions."""
    from spark_imagenet.training.driver.spark_session import local_session

    return local_session(master, app_name=app_name,
                         conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})


def shared_spark(master: str, app_name: str) -> Any:
    """The shared ``master`` session: the one running when it is still up (a test may have stopped it),
    else a new one."""
    if _SHARED and _SHARED[0].sparkContext._jsc is not None and _SHARED[0].sparkContext.master == master:
        return _SHARED[0]
    stop_shared_spark()
    _SHARED.append(_session(master, app_name))
    return _SHARED[0]


def stop_shared_spark() -> None:
    """Stop the shared session, if one runs."""
    while _SHARED:
        session = _SHARED.pop()
        if session.sparkContext._jsc is not None:
            session.stop()


def module_spark(master: str, app_name: str) -> Iterator[Any]:
    """A real ``master`` SparkSession for one test module (a generator for a module fixture), after the
    shared one (:func:`shared_spark`) stopped; stopped at the module's end."""
    stop_shared_spark()
    session = _session(master, app_name)
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
