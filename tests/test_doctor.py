"""`spark-imagenet doctor`: versions, GPUs, the GPU mapping, bucket credentials (never their content),
the preflight checks against a real local master, and a dataset's manifest; exit 0, 1 or 2."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from bucket_util import make_bucket
from spark_imagenet.doctor import Report, check_gpu_mapping, check_master, check_spark, credential_sources

#: Written into the fake credential files: must never appear in the doctor's output.
SECRET = "do-not-print-this-private-key-0123456789"


def doctor(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST",
                         "PYSPARK_GATEWAY_PORT", "DATABRICKS_RUNTIME_VERSION")}
    return subprocess.run([sys.executable, "-m", "spark_imagenet", "doctor", *args], capture_output=True, text=True,
                          timeout=timeout, env={**base, **env})


def lines_of(p: subprocess.CompletedProcess, what: str) -> list[str]:
    return [ln for ln in p.stdout.splitlines() if ln.split(":")[0].split(None, 1)[-1] == what]


@pytest.mark.slow
def test_doctor_on_local_2_finds_nothing_wrong(tmp_path):
    p = doctor("--master", "local[2]", "--workers", "2", env={"CLOUDSDK_CONFIG": str(tmp_path / "gcloud")})
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "Traceback" not in p.stdout + p.stderr
    import pyspark

    out = p.stdout
    assert f"ok       python: {platform.python_version()} ({sys.executable})" in out
    assert lines_of(p, "java")[0].startswith("ok       java: ")
    assert f"ok       spark: pyspark {pyspark.__version__}" in out
    assert lines_of(p, "tensorflow")[0].startswith("ok       tensorflow: 2.")
    assert lines_of(p, "tf-keras")[0].startswith("ok       tf-keras: 2.")
    assert "ok       gpus (TensorFlow, this machine): none here" in out
    assert "a task given addresses ['0', '1'] gets CUDA_VISIBLE_DEVICES=0,1" in out
    assert lines_of(p, "bucket credentials")[0].startswith("ok       bucket credentials: none found")
    assert "ok       spark session: master local[2]" in out
    assert lines_of(p, "barrier slots")[0].startswith("ok       barrier slots: 2 ")
    assert lines_of(p, "encryption")[0].startswith("ok ")
    assert lines_of(p, "gpu settings")[0].startswith("ok       gpu settings: no GPUs asked for")
    assert out.rstrip().endswith("no problems found")
    assert "PROBLEM" not in out


@pytest.mark.slow
def test_doctor_reports_each_problem_with_its_fix_and_never_a_secret(tmp_path):
    key = tmp_path / "key.json"
    key.write_text('{"type": "service_account", "private_key": "%s"}' % SECRET)
    gcloud = tmp_path / "gcloud"
    gcloud.mkdir()
    (gcloud / "application_default_credentials.json").write_text('{"refresh_token": "%s"}' % SECRET)
    bucket = make_bucket(tmp_path / "b", train=4)
    p = doctor("--master", "local[2]", "--workers", "8", "--conf", "spark.network.crypto.enabled=true",
               "--conf", "spark.authenticate=true", "--gpus-per-worker", "1", str(bucket),
               env={"CUDA_VISIBLE_DEVICES": "4,6", "GOOGLE_APPLICATION_CREDENTIALS": str(key),
                    "CLOUDSDK_CONFIG": str(gcloud)})
    assert p.returncode == 1, p.stdout + p.stderr[-3000:]
    assert "Traceback" not in p.stdout + p.stderr and "Py4J" not in p.stdout
    assert SECRET not in p.stdout + p.stderr
    out = p.stdout
    slots = lines_of(p, "barrier slots")[0]
    assert slots.startswith("PROBLEM") and "--workers 8 needs 8 barrier task slots, only 2 available" in slots
    assert "--workers <= 2" in slots
    crypto = lines_of(p, "encryption")[0]
    assert crypto.startswith("PROBLEM") and "spark.network.crypto.enabled=true" in crypto
    assert "gradients" in crypto and "--allow-unencrypted" in crypto
    gpus = lines_of(p, "gpu settings")[0]
    assert gpus.startswith("PROBLEM") and "Spark's local mode (local[2]) does not hand GPUs to tasks" in gpus
    assert "--master 'local-cluster[1,8,2048]'" in gpus and "--conf spark.worker.resource.gpu.amount=8" in gpus
    shards = lines_of(p, "train shards")[0]
    assert shards.startswith("PROBLEM") and "4 train shard(s) but --workers is 8" in shards
    assert "--train-shards >= 8" in shards
    assert f"ok       dataset: {bucket}" in out
    assert "CUDA_VISIBLE_DEVICES=4,6) a task given addresses ['0', '1'] gets CUDA_VISIBLE_DEVICES=4,6" in out
    creds = "\n".join(lines_of(p, "bucket credentials"))
    assert f"GOOGLE_APPLICATION_CREDENTIALS={key} (the file exists" in creds
    assert str(gcloud / "application_default_credentials.json") in creds
    assert out.rstrip().endswith("4 problem(s) found")


def test_bad_options_exit_2():
    for args in (["--workers", "0"], ["--conf", "no-equals-sign"]):
        p = subprocess.run([sys.executable, "-m", "spark_imagenet", "doctor", *args], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2, p.stderr
        assert "Traceback" not in p.stderr


def test_credential_sources_name_the_source_and_never_read_it(tmp_path):
    key = tmp_path / "key.json"
    key.write_text(SECRET)
    found = credential_sources({"GOOGLE_APPLICATION_CREDENTIALS": str(key), "CLOUDSDK_CONFIG": str(tmp_path),
                                "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443"})
    assert found[0].startswith("STORAGE_EMULATOR_HOST=http://127.0.0.1:4443")
    assert found[1].startswith(f"GOOGLE_APPLICATION_CREDENTIALS={key} (the file exists")
    assert len(found) == 2 and SECRET not in "".join(found)
    missing = credential_sources({"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "nope.json"),
                                  "CLOUDSDK_CONFIG": str(tmp_path)})
    assert missing == [f"GOOGLE_APPLICATION_CREDENTIALS={tmp_path / 'nope.json'} (PROBLEM: no such file; its content "
                       "is not read)"]
    assert credential_sources({"CLOUDSDK_CONFIG": str(tmp_path)}) == []


def test_the_spark_line_names_pyspark_and_its_folder_or_says_how_to_install_it(monkeypatch):
    import pyspark

    lines: list[str] = []
    report = Report(lines.append)
    assert check_spark(report) and report.problems == 0
    assert lines == [f"ok       spark: pyspark {pyspark.__version__} ({os.path.dirname(pyspark.__file__)})"]
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` fails as where it is not installed
    assert not check_spark(report) and report.problems == 1
    assert lines[1].startswith("PROBLEM  spark: pyspark is not installed: pip install '.[spark]' in the project's")
    assert "a Spark platform such as Databricks, EMR or Dataproc brings its own pyspark" in lines[1]


def test_the_gpu_mapping_through_an_existing_cuda_visible_devices():
    lines: list[str] = []
    report = Report(lines.append)
    check_gpu_mapping(report, {"CUDA_VISIBLE_DEVICES": "2,3,5"})
    assert report.problems == 0 and lines[-1].endswith("addresses ['0', '1'] gets CUDA_VISIBLE_DEVICES=2,3")
    check_gpu_mapping(report, {"CUDA_VISIBLE_DEVICES": "7"})  # only one device visible: address 1 is outside it
    assert report.problems == 0 and lines[-1].startswith("warn     gpu mapping:") and "would fail" in lines[-1]
    assert "has only 1 device(s)" in lines[-1]


def test_doctor_says_yarn_without_its_configuration_in_one_line(monkeypatch):
    for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR", "PYSPARK_GATEWAY_PORT", "DATABRICKS_RUNTIME_VERSION"):
        monkeypatch.delenv(name, raising=False)
    lines: list[str] = []
    report = Report(lines.append)
    assert check_master(report, "yarn", (), 2, False) is None
    assert report.problems == 1 and len(lines) == 1, lines
    assert lines[0].startswith("PROBLEM  spark session: master yarn: --master yarn: set HADOOP_CONF_DIR"), lines


def test_doctor_says_a_master_spark_cannot_parse_without_starting_spark():
    lines: list[str] = []
    report = Report(lines.append)
    assert check_master(report, "local[two]", (), 2, False) is None
    assert report.problems == 1 and len(lines) == 1, lines
    assert lines[0].startswith("PROBLEM  spark session: master local[two]: master (--master) 'local[two]' is not a "
                               "Spark master URL: use local, local[N], local[*]"), lines
