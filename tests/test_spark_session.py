"""Java detection and the SparkSession the command line starts (spark_imagenet.training.spark_session)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from spark_imagenet.errors import EnvironmentSetupError
from spark_imagenet.training.spark_session import (
    check_java,
    is_local_master,
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


def test_is_local_master():
    assert is_local_master("local[2]") and is_local_master("local") and not is_local_master("yarn")


def test_more_workers_than_cores_without_a_master_is_named():
    assert oversubscription_warning(2, 2) is None and oversubscription_warning(1, 8) is None
    text = oversubscription_warning(8, 2)
    assert "--workers 8" in text and "local[8]" in text and "2 core(s)" in text and "--workers 2" in text
    assert "--master" in text


def test_an_unreachable_connect_server_is_named_at_once():
    import socket

    from spark_imagenet.errors import ConfigError
    from spark_imagenet.training.spark_session import check_connect_reachable

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"cannot reach the Spark Connect server at sc://127.0.0.1:{port}"):
            check_connect_reachable(f"sc://127.0.0.1:{port}", timeout_s=5)
    with pytest.raises(ConfigError, match="not a Spark Connect URL"):
        check_connect_reachable("sc:///;token=x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_connect_reachable(f"sc://127.0.0.1:{s.getsockname()[1]}/;token=abc", timeout_s=5)
