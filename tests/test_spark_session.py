"""Java detection and the SparkSession the command line starts (spark_imagenet.training.driver.spark_session)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from spark_imagenet.errors import ConfigError, EnvironmentSetupError
from spark_imagenet.training.driver.preflight import check_yarn_conf
from spark_imagenet.training.driver.spark_session import (
    check_java,
    session_for,
    local_session,
    oversubscription_warning,
    parse_java_version,
)


# ------------------------------------------------------------------ Java
@pytest.mark.parametrize("text,major", [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
    ('java version "1.8.0_292"\nJava(TM) SE Runtime Environment', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ('openjdk version "11.0.2" 2019-01-15', 11),
    ('Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "25-ea" 2025-09-16', 25),
])
def test_parse_java_version(text, major):
    assert parse_java_version(text)[0] == major


def fake_java(folder: Path, version_line: str, code: int = 0) -> Path:
    """A folder with bin/java: a shell script that prints ``version_line`` to stderr like `java -version`."""
    java = folder / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\nexit {code}\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def test_check_java_rejects_an_old_java_home(tmp_path, monkeypatch):
    home = fake_java(tmp_path / "jdk8", 'java version "1.8.0_292"')
    monkeypatch.setenv("JAVA_HOME", str(home))
    with pytest.raises(EnvironmentSetupError) as e:
        check_java()
    msg = str(e.value)
    assert "1.8.0_292" in msg and str(home / "bin" / "java") in msg
    assert "openjdk-17-jre-headless" in msg and "JAVA_HOME" in msg and "17" in msg
    # local_session checks before it starts anything
    with pytest.raises(EnvironmentSetupError, match="1.8.0_292"):
        local_session("local[1]")


def test_check_java_accepts_a_new_java_home(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path / "jdk21", 'openjdk version "21.0.3" 2024-04-16')))
    assert check_java() == 21


def test_java_home_without_java(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(EnvironmentSetupError, match="has no executable bin/java"):
        check_java()


def test_java_from_path(tmp_path, monkeypatch):
    home = fake_java(tmp_path / "jdk11", 'openjdk version "11.0.2" 2019-01-15')
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(home / "bin"))
    with pytest.raises(EnvironmentSetupError, match=r"11\.0\.2.*PATH|PATH.*11\.0\.2"):
        check_java()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(EnvironmentSetupError, match="No Java found"):
        check_java()


def test_java_that_prints_no_version(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path / "broken", "Error: bad install", code=1)))
    with pytest.raises(EnvironmentSetupError, match="printed no Java version"):
        check_java()


def test_this_machine_has_a_usable_java():
    assert check_java() >= 17


def test_yarn_without_its_configuration_is_refused_before_a_jvm_starts(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"^--master yarn: set HADOOP_CONF_DIR to the folder with the cluster's "):
        check_yarn_conf("yarn", {}).raise_if_problem()  # wording test (YARN's configuration)
    with pytest.raises(ConfigError) as e:
        check_yarn_conf(" yarn ", {"YARN_CONF_DIR": str(tmp_path)}).raise_if_problem()
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("YARN_CONF_DIR", str(tmp_path))
    (tmp_path / "yarn-site.xml").write_text("<configuration/>")
    assert check_yarn_conf("yarn", {"HADOOP_CONF_DIR": str(tmp_path)}).level == "ok"
    assert check_yarn_conf("local[2]", {}) is None
    assert check_yarn_conf(None, {}) is None
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    with pytest.raises(ConfigError) as e:  # what train and doctor call, before check_java
        session_for("yarn", 1)
    assert e.value.key == "HADOOP_CONF_DIR"


def test_more_workers_than_cores_without_a_master_is_named():
    assert oversubscription_warning(2, 2) is None and oversubscription_warning(1, 8) is None
    text = oversubscription_warning(8, 2)
    assert "--workers 8" in text and "local[8]" in text and "2 core(s)" in text and "--workers 2" in text
    assert "--master" in text


def test_an_unreachable_connect_server_is_named_at_once():
    import socket

    from spark_imagenet.errors import ConfigError
    from spark_imagenet.training.driver.spark_session import check_connect_reachable

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match="cannot reach the Spark Connect server") as e:
            check_connect_reachable(f"sc://127.0.0.1:{port}", timeout_s=5)
        assert (e.value.key, e.value.value) == ("--master", f"sc://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="not a Spark Connect URL"):
        check_connect_reachable("sc:///;token=x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_connect_reachable(f"sc://127.0.0.1:{s.getsockname()[1]}/;token=abc", timeout_s=5)


# ------------------------------------------------------------------ the quiet log4j2 configuration
#: What the driver JVM prints on stderr while it starts with Spark's default logging.
START_UP_CHATTER = ("Using Spark's default log4j profile", "NativeCodeLoader", "Setting default log level",
                    "To adjust logging level", "WARN Utils:")


@pytest.fixture
def clean_logging_env(tmp_path, monkeypatch):
    """No user logging in the environment: an empty SPARK_CONF_DIR, no JVM options, no running SparkContext."""
    from pyspark import SparkContext

    for name in ("PYSPARK_GATEWAY_PORT", "DATABRICKS_RUNTIME_VERSION", "PYSPARK_SUBMIT_ARGS", "SPARK_SUBMIT_OPTS",
                 "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"):
        monkeypatch.delenv(name, raising=False)
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    return conf_dir


def test_quiet_logging_names_the_shipped_config(clean_logging_env):
    from spark_imagenet.resources import QUIET_LOG4J2, resource_path
    from spark_imagenet.training.driver.spark_session import quiet_logging_conf, spark_log_path

    (clean_logging_env / "log4j2.properties.template").write_text("rootLogger.level = info\n")  # ignored
    assert quiet_logging_conf({"spark.ui.enabled": "false"}) == {
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={resource_path(QUIET_LOG4J2).resolve().as_uri()} "
                                         f"-Dspark_imagenet.spark_log={spark_log_path()}"}
    assert spark_log_path().parent.is_dir() and spark_log_path().name.endswith(f"-{os.getpid()}.log")


@pytest.mark.parametrize("where", ["conf", "log4j2 file", "spark-defaults", "submit args", "java options",
                                   "spark-submit", "databricks"])
def test_quiet_logging_gives_way_to_the_users_logging(clean_logging_env, monkeypatch, where):
    from spark_imagenet.training.driver.spark_session import quiet_logging_conf

    conf = {"spark.driver.extraJavaOptions": "-Dx=1 -Dlog4j2.configurationFile=/mine"} if where == "conf" else {}
    if where == "log4j2 file":
        (clean_logging_env / "log4j2.properties").write_text("rootLogger.level = info\n")
    elif where == "spark-defaults":
        (clean_logging_env / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions  -Dx=1\n")
    elif where == "submit args":
        monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-java-options -Dx=1 pyspark-shell")
    elif where == "java options":
        monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dlog4j2.configurationFile=/etc/mine.properties")
    elif where == "spark-submit":
        monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
    elif where == "databricks":
        monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "16.4")
    assert quiet_logging_conf(conf) == {}


def session_child(code: str, conf_dir: Path) -> subprocess.CompletedProcess:
    """Run ``code`` after ``spark = local_session("local[1]", conf=CONF)`` in a fresh Python (its own JVM)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_GATEWAY_PORT", "PYSPARK_SUBMIT_ARGS", "SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS")}
    env["SPARK_CONF_DIR"] = str(conf_dir)
    program = ("from spark_imagenet.training.driver.spark_session import local_session\n" + code + "\nspark.stop()\n")
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                          cwd=conf_dir, env=env)


@pytest.mark.slow
def test_a_local_session_starts_without_the_start_up_chatter(clean_logging_env):
    p = session_child(
        "spark = local_session('local[1]', conf={'spark.ui.enabled': 'false'})\n"
        "assert spark.range(5).count() == 5\n"
        "log4j = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager\n"
        "print('scheduler-warn', log4j.getLogger('org.apache.spark.scheduler.TaskSchedulerImpl').isWarnEnabled())\n"
        "print('utils-warn', log4j.getLogger('org.apache.spark.util.Utils').isWarnEnabled())",
        clean_logging_env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not [s for s in START_UP_CHATTER if s in p.stderr], p.stderr
    assert "scheduler-warn True" in p.stdout and "utils-warn False" in p.stdout  # the quiet config is the one in use


@pytest.mark.slow
def test_the_users_driver_java_options_are_kept(clean_logging_env):
    p = session_child(
        "spark = local_session('local[1]', conf={'spark.driver.extraJavaOptions': '-Dspark_imagenet.test=kept'})\n"
        "print('options', spark.sparkContext.getConf().get('spark.driver.extraJavaOptions'))\n"
        "print('property', spark.sparkContext._jvm.java.lang.System.getProperty('spark_imagenet.test'))",
        clean_logging_env)
    assert p.returncode == 0, p.stderr[-3000:]
    options = next(ln for ln in p.stdout.splitlines() if ln.startswith("options "))
    # the user's options (not about logging) are kept, the quiet logging's follow them
    assert " -Dspark_imagenet.test=kept -Dlog4j2.configurationFile=file:" in options
    assert "property kept" in p.stdout
    assert not [s for s in START_UP_CHATTER if s in p.stderr], p.stderr


def test_an_unreachable_standalone_master_is_named_before_spark_starts():
    import socket

    from spark_imagenet.training.driver.spark_session import check_standalone_reachable, session_for

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(ConfigError) as e:
            session_for(f"spark://127.0.0.1:{port}", 2)
        assert f"cannot reach the Spark standalone master spark://127.0.0.1:{port} (127.0.0.1:{port}: " in str(e.value)
        assert "Connection refused" in str(e.value) and "start-master.sh" in str(e.value)
        with socket.socket() as listening:
            listening.bind(("127.0.0.1", 0))
            listening.listen()
            good = listening.getsockname()[1]
            check_standalone_reachable(f"spark://127.0.0.1:{port},127.0.0.1:{good}")  # HA: one that answers


# ------------------------------------------------------------------ the JVM's stderr
def test_the_jvms_stderr_reaches_the_console_without_the_incubator_warning(tmp_path):
    from spark_imagenet.training.driver.gateway import forward_stderr

    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"WARNING: Using incubator modules: jdk.incubator.vector\nline 1\n"
                       b"26/01/01 WARN Spark: a warning\nno newline at the end")
    os.close(write_fd)
    with open(tmp_path / "console", "wb") as console:
        forward_stderr(read_fd, console.fileno())
    assert (tmp_path / "console").read_bytes() == b"line 1\n26/01/01 WARN Spark: a warning\nno newline at the end"


@pytest.mark.slow
def test_a_local_session_started_here_prints_no_incubator_warning():
    code = ("import sys\n"
            "from spark_imagenet.training.driver.spark_session import local_session\n"
            "spark = local_session('local[1]', conf={'spark.ui.enabled': 'false'})\n"
            "assert spark.range(3).count() == 3\n"
            "spark.sparkContext._jvm.java.lang.System.err.println('said by the JVM')\n"
            "spark.stop()\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "said by the JVM" in p.stderr and "incubator" not in p.stderr, p.stderr
