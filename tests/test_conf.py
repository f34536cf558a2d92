"""conf/: the spark-defaults files (one per platform) carry what barrier training needs, each setting with a
comment; the log4j2 configuration is quiet."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
PLATFORMS = ["spark-defaults.conf", "spark-defaults.standalone.conf", "spark-defaults.yarn.conf",
             "spark-defaults.k8s.conf"]


def parse(text: str) -> tuple[dict[str, str], list[str]]:
    """Spark's properties-file lines: KEY whitespace VALUE (or KEY=VALUE); # comments. Returns the settings and
    the keys of settings that have no comment line right above them (in a run of settings, the first's)."""
    settings, uncommented = {}, []
    commented = False
    for line in text.splitlines():
        s = line.strip()
        if not s:
            commented = False
            continue
        if s.startswith("#"):
            commented = True
            continue
        m = re.match(r"^(\S+?)\s*(?:=|\s)\s*(.*)$", s)
        assert m, f"not a KEY VALUE line: {line!r}"
        key, value = m.group(1), m.group(2).strip()
        assert key.startswith("spark."), f"not a Spark setting: {key}"
        assert key not in settings, f"{key} set twice"
        settings[key] = value
        if not commented:
            uncommented.append(key)
        commented = False
    return settings, uncommented


def test_parse():
    s, unc = parse("# c\nspark.a  1\nspark.b=2\n\n#x\n# y\nspark.c   x y\n")
    assert s == {"spark.a": "1", "spark.b": "2", "spark.c": "x y"} and unc == ["spark.b"]


@pytest.mark.parametrize("name", PLATFORMS)
def test_spark_defaults_have_the_barrier_essentials(name):
    settings, uncommented = parse((CONF / name).read_text())
    assert not uncommented, f"{name}: settings without a comment: {uncommented}"
    assert settings["spark.dynamicAllocation.enabled"] == "false"
    assert settings["spark.ui.showConsoleProgress"] == "false"
    if name != "spark-defaults.conf":  # the generic file is the one submit/local.sh and standalone.sh pass
        assert re.fullmatch(r"\d+s", settings["spark.barrier.sync.timeout"])
        assert int(settings["spark.barrier.sync.timeout"][:-1]) <= 3600
        assert settings["spark.executor.cores"] == settings["spark.task.cpus"]
    if "spark.executor.cores" in settings and "spark.task.cpus" in settings:
        assert settings["spark.executor.cores"] == settings["spark.task.cpus"]
    if "spark.executor.resource.gpu.amount" in settings:
        assert settings["spark.task.resource.gpu.amount"] == settings["spark.executor.resource.gpu.amount"]
        script = settings["spark.executor.resource.gpu.discoveryScript"]
        # the path the image from docker/Dockerfile installs conf/ at
        assert script == "/opt/spark-imagenet/conf/gpu-discovery.sh"


@pytest.mark.parametrize("name", PLATFORMS[1:])
def test_gpu_settings_are_there_commented_out_or_set(name):
    text = (CONF / name).read_text()
    for key in ("spark.executor.resource.gpu.amount", "spark.task.resource.gpu.amount",
                "spark.executor.resource.gpu.discoveryScript"):
        assert re.search(rf"^#?{re.escape(key)}\s", text, re.M), f"{name}: no {key}"


def test_gpu_discovery_script_prints_spark_resource_json(tmp_path):
    import json
    import os
    env = {**os.environ, "PATH": str(tmp_path) + os.pathsep + os.environ["PATH"]}
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    fake.chmod(0o755)
    out = subprocess.run(["bash", str(CONF / "gpu-discovery.sh")], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert json.loads(out) == {"name": "gpu", "addresses": ["0", "1"]}
    fake.write_text("#!/bin/sh\nexit 9\n")
    out = subprocess.run(["bash", str(CONF / "gpu-discovery.sh")], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert json.loads(out) == {"name": "gpu", "addresses": []}


def test_log4j2_is_quiet():
    props = {}
    for line in (CONF / "log4j2.properties").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    assert props["rootLogger.level"].lower() == "warn"
    names = {k[: -len(".name")]: v for k, v in props.items() if k.endswith(".name") and k.startswith("logger.")}
    assert "org.apache.spark.scheduler" in names.values()
    for logger in names:
        assert props[f"{logger}.level"].lower() == "error"
    assert props["rootLogger.appenderRef.stderr.ref"] == props["appender.console.name"]
