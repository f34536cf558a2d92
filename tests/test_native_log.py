"""spark_imagenet.training.worker.native_log: TensorFlow's import-time log lines at the level asked for, once each."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from data_util import REPO
from spark_imagenet.training.worker.native_log import filter_native_log

PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = "port.cc:153] oneDNN custom operations are on. To turn them off, set TF_ENABLE_ONEDNN_OPTS=0."
TWICE = (PREAMBLE + f"I0000 00:00:1796194456.826442    8969 {ONEDNN}\n"
         "W0000 00:00:1796194456.826789    8969 some.cc:7] a warning\n"
         "/x/y.py:3: UserWarning: a python warning\n"
         + PREAMBLE + f"I0000 00:00:1796194459.211694    8969 {ONEDNN}\n"
         "E0000 00:00:1796194459.799292    8969 cuda_platform.cc:52] failed call to cuInit\n")


def test_level_zero_keeps_each_line_once_and_drops_the_preamble():
    assert filter_native_log(TWICE, 0) == (
        f"I0000 00:00:1796194456.826442    8969 {ONEDNN}\n"
        "W0000 00:00:1796194456.826789    8969 some.cc:7] a warning\n"
        "/x/y.py:3: UserWarning: a python warning\n"
        "E0000 00:00:1796194459.799292    8969 cuda_platform.cc:52] failed call to cuInit\n")


def test_the_level_drops_lower_severities_only():
    assert filter_native_log(TWICE, 1) == (
        "W0000 00:00:1796194456.826789    8969 some.cc:7] a warning\n"
        "/x/y.py:3: UserWarning: a python warning\n"
        "E0000 00:00:1796194459.799292    8969 cuda_platform.cc:52] failed call to cuInit\n")
    assert filter_native_log(TWICE, 2) == (
        "/x/y.py:3: UserWarning: a python warning\n"
        "E0000 00:00:1796194459.799292    8969 cuda_platform.cc:52] failed call to cuInit\n")
    assert filter_native_log("plain text\nno newline at the end", 3) == "plain text\nno newline at the end"
    # a process on the CPU of a host without a GPU: TensorFlow's CUDA start-up lines go too, whatever their level
    assert filter_native_log(TWICE, 0, cpu_only=True) == (
        f"I0000 00:00:1796194456.826442    8969 {ONEDNN}\n"
        "W0000 00:00:1796194456.826789    8969 some.cc:7] a warning\n"
        "/x/y.py:3: UserWarning: a python warning\n")


#: What an entry point of a TensorFlow process of ours runs first.
PREPARED = "spark_imagenet.training.worker.environment as e; e.prepare_tensorflow_process()"


def _import_tensorflow(first: str, level: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    code = f"import {first}\nimport tensorflow\nimport warnings\nwarnings.warn('still shown')\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.slow
def test_the_onednn_notice_appears_once_at_most_in_our_tensorflow_processes():
    raw = _import_tensorflow("os", "2")
    if "oneDNN custom operations" not in raw:
        pytest.skip("this TensorFlow build prints no oneDNN notice")
    ours_default = _import_tensorflow(PREPARED, None)  # the set-up sets level 2
    assert "oneDNN" not in ours_default and "absl::InitializeLog" not in ours_default
    assert "UserWarning: still shown" in ours_default
    ours_verbose = _import_tensorflow(PREPARED, "0")
    assert ours_verbose.count("oneDNN custom operations") == 1


def test_an_unwritable_tmpdir_filters_nothing_and_breaks_nothing(tmp_path, monkeypatch, capfd):
    import tempfile

    from spark_imagenet.training.worker.native_log import filtered_stderr

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with filtered_stderr():
        os.write(2, b"I0000 00:00:1.5  7 port.cc:153] oneDNN custom operations are on.\n")
    assert "oneDNN" in capfd.readouterr().err
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    with filtered_stderr():
        os.write(2, b"I0000 00:00:1.5  7 port.cc:153] oneDNN custom operations are on.\n"
                    b"E0000 00:00:1.6  7 x.cc:1] an error\n")
    err = capfd.readouterr().err
    assert "oneDNN" not in err and "an error" in err
    with filtered_stderr(cpu_only=True):  # an executor's batch inference loading its model on a CPU-only host
        os.write(2, b"E0000 00:00:1.7  7 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
                    b"E0000 00:00:1.6  7 x.cc:1] an error\n")
    err = capfd.readouterr().err
    assert "cuInit" not in err and "an error" in err
