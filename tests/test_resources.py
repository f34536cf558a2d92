"""The files the package ships (spark_imagenet.resources): where they are, what they hold, how a user finds them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from spark_imagenet.errors import EnvironmentSetupError
from spark_imagenet.resources import (
    GPU_DISCOVERY_SCRIPT,
    QUIET_LOG4J2,
    gpu_discovery_script,
    resource_path,
)

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DATA = REPO / "spark_imagenet" / "resources"


def read_properties(path: Path) -> dict[str, str]:
    """A Java .properties file of ``key = value`` lines (no continuations), comments left out."""
    props = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


def test_the_gpu_discovery_script_is_shipped_executable_and_is_the_repositorys():
    path = gpu_discovery_script()
    assert path.is_absolute() and path.name == GPU_DISCOVERY_SCRIPT and path.parent.name == "resources"
    assert path.is_file() and os.access(path, os.X_OK)
    assert path.read_bytes() == (REPO / "conf" / "gpu-discovery.sh").read_bytes()
    assert resource_path(GPU_DISCOVERY_SCRIPT) == path


def test_the_package_copy_is_a_relative_link_to_conf():
    """One file to maintain: the package holds a relative symbolic link to conf/gpu-discovery.sh."""
    link = PACKAGE_DATA / GPU_DISCOVERY_SCRIPT
    if not link.is_symlink():
        pytest.skip("not a source checkout (an installed copy holds the file itself)")
    assert os.readlink(link) == "../../conf/gpu-discovery.sh"


def test_pyproject_ships_every_data_file_of_the_resources_package():
    """``[tool.setuptools.package-data]`` names each non-Python file of spark_imagenet/resources."""
    if not (REPO / "pyproject.toml").is_file():
        pytest.skip("not a source checkout")
    with open(REPO / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["package-data"]["spark_imagenet.resources"])
    present = {p.name for p in PACKAGE_DATA.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert listed == present == {GPU_DISCOVERY_SCRIPT, QUIET_LOG4J2}


def test_submit_prints_the_installed_script_path():
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    p = subprocess.run([sys.executable, "-m", "spark_imagenet.submit", "--gpu-discovery-script"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    # the package that python -m finds with PYTHONSAFEPATH=1 (the installed one, editable or not), not
    # necessarily the one this test imported (python -m pytest puts the checkout first on sys.path)
    seen = subprocess.run([sys.executable, "-c", "from spark_imagenet.resources import gpu_discovery_script as g; "
                           "print(g())"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert seen.returncode == 0, seen.stderr
    assert p.stdout == seen.stdout
    printed = Path(p.stdout.strip())
    assert printed.is_file() and os.access(printed, os.X_OK)
    assert printed.read_bytes() == (REPO / "conf" / "gpu-discovery.sh").read_bytes()
    p = subprocess.run([sys.executable, "-m", "spark_imagenet.submit", "--help"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("python -m spark_imagenet.submit --path\n")
    assert "python -m spark_imagenet.submit --gpu-discovery-script" in p.stdout
    assert "usage: spark-imagenet train" in p.stdout  # the train options follow


def test_an_unknown_resource_is_named_with_what_is_shipped():
    with pytest.raises(EnvironmentSetupError) as e:
        resource_path("no-such-file.sh")
    msg = str(e.value)
    import spark_imagenet.resources as imported  # the checkout's or the installed copy, as sys.path has it

    assert "'no-such-file.sh'" in msg and str(Path(imported.__file__).parent) in msg
    assert GPU_DISCOVERY_SCRIPT in msg and QUIET_LOG4J2 in msg and "reinstall" in msg


@pytest.mark.parametrize("name", ["", "..", "../conf/gpu-discovery.sh", "resources/gpu-discovery.sh"])
def test_a_resource_name_with_folders_is_refused(name):
    with pytest.raises(EnvironmentSetupError, match="not the name of a file shipped with spark-imagenet"):
        resource_path(name)


def test_the_quiet_log4j2_config_keeps_warnings_and_cuts_the_start_up_chatter():
    props = read_properties(resource_path(QUIET_LOG4J2))
    assert props["rootLogger.level"].lower() == "warn"
    assert props["appender.console.target"] == "SYSTEM_ERR"
    assert props["rootLogger.appenderRef.stderr.ref"] == props["appender.console.name"]
    levels = {props[k]: props[k[: -len(".name")] + ".level"].lower()
              for k in props if k.startswith("logger.") and k.endswith(".name")}
    assert levels == {"org.apache.spark.util.Utils": "error", "org.apache.hadoop.util.NativeCodeLoader": "error",
                      "org.apache.spark.scheduler": "warn", "org.apache.spark.executor.Executor": "warn",
                      "org.apache.spark.scheduler.TaskSetManager": "warn",
                      "org.apache.spark.rpc.netty.NettyRpcEnv": "warn"}
    # Spark's whole log goes to a file; a failed task's two stack-trace records go there only
    assert props["rootLogger.appenderRef.file.ref"] == props["appender.sparklog.name"]
    assert props["appender.sparklog.fileName"].startswith("${sys:spark_imagenet.spark_log:-")
    for logger in ("task_error", "lost_task", "rpc_ignored"):
        assert props[f"logger.{logger}.additivity"] == "false"
        assert props[f"logger.{logger}.appenderRef.file.ref"] == props["appender.sparklog.name"]
        assert not any(k.startswith(f"logger.{logger}.appenderRef.") and v == props["appender.console.name"]
                       for k, v in props.items())


SPARK_LOGS = """
import sys
from pyspark.sql import SparkSession
from spark_imagenet.training.driver.spark_session import quiet_logging_conf
builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
for key, value in quiet_logging_conf({}).items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
jvm = spark.sparkContext._jvm
logs = jvm.org.apache.logging.log4j.LogManager
logs.getLogger("org.apache.spark.scheduler.DAGScheduler").warn("first line\\nTraceback\\n  File x\\nBoom")
logs.getLogger("org.apache.spark.rpc.netty.NettyRpcEnv").warn("Ignored failure: TaskKilledException")
logs.getLogger("org.apache.spark.Other").warn("y" * 1000, jvm.java.lang.RuntimeException("kaput"))
print(jvm.java.lang.System.getProperty("spark_imagenet.spark_log"))
spark.stop()
"""


@pytest.mark.slow
def test_the_console_gets_one_line_per_spark_record_and_the_log_file_the_whole_record(tmp_path):
    """Spark puts whole task tracebacks inside some messages (NettyRpcEnv's "Ignored failure"): a real driver JVM
    with the quiet config prints a message's first line only, no stack trace, and keeps everything in its log file."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR", "SPARK_HOME")}
    env["TMPDIR"] = str(tmp_path)
    p = subprocess.run([sys.executable, "-c", SPARK_LOGS], capture_output=True, text=True, env=env, timeout=180,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    console = [ln for ln in p.stderr.splitlines() if " WARN " in ln]
    assert console[0].endswith("WARN DAGScheduler: first line [...]")
    assert len(console) == 2 and "y" * 200 in console[1] and len(console[1]) <= 340
    assert "kaput" not in p.stderr and "Traceback" not in p.stderr and "Ignored failure" not in p.stderr
    whole = Path(p.stdout.strip().splitlines()[-1]).read_text()
    assert "first line\nTraceback\n  File x\nBoom" in whole and "Ignored failure: TaskKilledException" in whole
    assert "y" * 1000 in whole and "java.lang.RuntimeException: kaput" in whole


def test_the_dockerfile_copies_conf_before_it_installs_the_package():
    """The package's gpu-discovery.sh links to ../../conf/gpu-discovery.sh; setuptools leaves a dangling link out."""
    lines = (REPO / "docker" / "Dockerfile").read_text().splitlines()
    copy_conf = next(i for i, ln in enumerate(lines) if ln.startswith("COPY conf/"))
    install = next(i for i, ln in enumerate(lines) if re.match(r"RUN pip install '?\./", ln))  # with its extras
    assert copy_conf < install
    assert 'test -x "$(PYTHONSAFEPATH=1 python -m spark_imagenet.submit --gpu-discovery-script)"' in "\n".join(lines)
