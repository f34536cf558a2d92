import sys
from pathlib import Path

# Make tests/ helpers (data_util, ...) importable as plain modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest


@pytest.fixture(scope="module")
def spark():
    """A real ``local[2]`` SparkSession shared by the tests of one module.

    Stopped at the end of the module; later modules start a new SparkContext
    in the same JVM (PySpark keeps its gateway), which is much cheaper than a
    JVM start-up on this 2-core machine. Note: the conf of the session that
    launches the JVM becomes JVM system properties that every later
    SparkContext in the process inherits; a test needing other settings
    should start the JVM first (``SparkContext._ensure_initialized()``).
    """
    from spark_imagenet.spark_env import local_session

    session = local_session("local[2]", app_name="spark-imagenet-tests",
                            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
