"""Delta Lake's jars and settings for a SparkSession this process starts to read or write a Delta table.

Spark reads Delta with Delta's own connector, the jars of the ``delta-spark`` release (``io.delta:delta-spark_<spark
major.minor>_2.13`` and ``io.delta:delta-storage``, one version) plus two session settings
(:data:`DELTA_SESSION_SETTINGS`). A user gives the jars the ways Spark takes them: ``--conf spark.jars=...`` or
``spark.jars.packages``, ``--jars`` in ``PYSPARK_SUBMIT_ARGS``, or spark-submit's ``--jars``. When none of them
names Delta and the ``delta-spark`` Python package is installed, :func:`delta_session_conf` looks for its two jars in
the local Maven repository (``~/.m2/repository``) and names them in ``spark.jars``, else asks Spark to download them
(``spark.jars.packages``: works where Maven Central and the jars' own dependencies are reachable).

Everything here is a pure function of its arguments except :func:`delta_session_conf`'s defaults (the environment,
the installed versions); nothing imports Spark at import time.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from pathlib import Path
from typing import Mapping

logger = logging.getLogger(__name__)

#: The settings a session needs to read Delta with Delta's connector (without them Spark refuses a Delta read with
#: DELTA_CONFIGURE_SPARK_SESSION_WITH_EXTENSION_AND_CATALOG).
DELTA_SESSION_SETTINGS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
#: The Spark settings that name jars (comma-separated paths or Maven coordinates).
JAR_SETTINGS = ("spark.jars", "spark.jars.packages")
#: The name every Delta connector jar and coordinate holds (``delta-spark_4.1_2.13``; ``delta-core`` before 3.0).
_CONNECTOR_NAMES = ("delta-spark", "delta-core")


def delta_coordinates(spark_version: str, delta_version: str) -> tuple[str, str]:
    """The Maven coordinates of Delta's connector and storage jars for a Spark version.

    Args:
        spark_version: pyspark's version, e.g. ``"4.1.1"`` (its major.minor names the connector).
        delta_version: delta-spark's version, e.g. ``"4.3.1"``.

    Returns:
        tuple: ``("io.delta:delta-spark_4.1_2.13:4.3.1", "io.delta:delta-storage:4.3.1")``.
    """
    major_minor = ".".join(spark_version.split(".")[:2])
    return (f"io.delta:delta-spark_{major_minor}_2.13:{delta_version}", f"io.delta:delta-storage:{delta_version}")


def maven_jar(repository: Path, coordinate: str) -> Path:
    """Where a Maven coordinate ``group:artifact:version`` lies in a local Maven repository
    (``repository/io/delta/delta-storage/4.3.1/delta-storage-4.3.1.jar``)."""
    group, artifact, version = coordinate.split(":")
    return repository.joinpath(*group.split("."), artifact, version, f"{artifact}-{version}.jar")


def find_delta_jars(spark_version: str, delta_version: str, repository: Path) -> list[Path] | None:
    """Delta's two jars for ``spark_version`` in the local Maven repository ``repository``.

    Returns:
        list[Path] | None: the connector's and the storage jar's paths, or None when either is not there.
    """
    jars = [maven_jar(repository, c) for c in delta_coordinates(spark_version, delta_version)]
    return jars if all(j.is_file() for j in jars) else None


def _listed(conf: Mapping[str, str], key: str) -> list[str]:
    """The comma-separated entries of setting ``key`` in ``conf`` (none when it is not set)."""
    return [entry.strip() for entry in str(conf.get(key, "")).split(",") if entry.strip()]


def names_delta_jars(conf: Mapping[str, str], submit_args: str = "") -> bool:
    """Whether the user already gave Delta's connector: a ``spark.jars``/``spark.jars.packages`` value of
    ``conf``, or ``PYSPARK_SUBMIT_ARGS`` (``submit_args``: ``--jars``, ``--packages``, ``--conf``), names it."""
    given = " ".join(str(conf.get(k, "")) for k in JAR_SETTINGS) + " " + submit_args
    return any(name in given for name in _CONNECTOR_NAMES)


def with_delta_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """:data:`DELTA_SESSION_SETTINGS` merged into the user's: Delta's extension added to theirs (comma-separated),
    the catalog set unless they chose one.

    Returns:
        dict[str, str]: only the settings to add or change.
    """
    added: dict[str, str] = {}
    key, extension = "spark.sql.extensions", DELTA_SESSION_SETTINGS["spark.sql.extensions"]
    theirs = _listed(conf, key)
    if extension not in theirs:
        added[key] = ",".join([*theirs, extension])
    catalog = "spark.sql.catalog.spark_catalog"
    if catalog not in conf:
        added[catalog] = DELTA_SESSION_SETTINGS[catalog]
    return added


def delta_jar_settings(conf: Mapping[str, str], spark_version: str, delta_version: str | None,
                       repository: Path) -> dict[str, str]:
    """The jar settings that bring Delta's connector into a new session, when the user gave none.

    Args:
        conf: the user's Spark settings (``--conf``).
        spark_version: pyspark's version.
        delta_version: the installed delta-spark's version, or None (not installed: no jars, the table is read with
            ``deltalake``: :mod:`spark_imagenet.dataset.delta`).
        repository: the local Maven repository.

    Returns:
        dict[str, str]: ``{"spark.jars": "...,CONNECTOR,STORAGE"}`` (the user's jars kept first) when the jars are in
        ``repository``; ``{"spark.jars.packages": "CONNECTOR,STORAGE"}`` when they are not; ``{}`` without
        delta-spark. Which one is logged.
    """
    if delta_version is None:
        return {}
    jars = find_delta_jars(spark_version, delta_version, repository)
    if jars is not None:
        logger.info(f"delta: Delta's jars from the local Maven repository: {', '.join(map(str, jars))}")
        return {"spark.jars": ",".join([*_listed(conf, "spark.jars"), *map(str, jars)])}
    coordinates = delta_coordinates(spark_version, delta_version)
    logger.info(f"delta: Delta's jars are not in {repository}: Spark downloads them (spark.jars.packages "
                f"{','.join(coordinates)}; or: mvn dependency:copy -Dartifact=COORDINATE for each)")
    return {"spark.jars.packages": ",".join([*_listed(conf, "spark.jars.packages"), *coordinates])}


def delta_session_conf(conf: Mapping[str, str], master: str | None = None,
                       env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings to add to the user's ``conf`` for a session this process starts that reads or writes Delta:
    Delta's jars when the user gave none (:func:`delta_jar_settings`), and, when Delta's jars are in the session,
    :data:`DELTA_SESSION_SETTINGS` (:func:`with_delta_settings`).

    Nothing is added when this process does not start the JVM: a Spark Connect master (``sc://``, or
    ``SPARK_REMOTE``), under spark-submit or on Databricks (the session exists, with its own jars), or a SparkContext
    already running here.

    Args:
        conf: the user's Spark settings.
        master: the session's master, or None.
        env: the environment (default ``os.environ``).

    Returns:
        dict[str, str]: the settings to add (``{}`` when none).
    """
    env = os.environ if env is None else env
    if (master or env.get("SPARK_REMOTE", "")).startswith("sc://"):
        return {}
    if "PYSPARK_GATEWAY_PORT" in env or "DATABRICKS_RUNTIME_VERSION" in env:
        return {}
    import pyspark
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        return {}
    if names_delta_jars(conf, env.get("PYSPARK_SUBMIT_ARGS", "")):
        return with_delta_settings(conf)
    repository = Path.home() / ".m2" / "repository"
    added = delta_jar_settings(conf, pyspark.__version__, installed_delta_spark(), repository)
    return {**added, **with_delta_settings(conf)} if added else {}


def installed_delta_spark() -> str | None:
    """The installed ``delta-spark`` Python package's version (its ``delta`` module), or None."""
    try:
        return importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        return None
