"""benchmarks/gpu.py: its --dry-run (the GPU benchmark's code on the CPU at a tiny size, what --quick runs), its
--json records (benchmarks/common.py's format, through tests/bench_util.py) and its refusals.

The script is run as a subprocess from the repository root, as a user runs it (it puts the checkout on
``sys.path`` itself, so this does not rely on an editable install). Only AlexNet runs here: ResNet-50's
XLA compilation alone costs about a minute of CPU on 2 cores. One dry run serves the tests of its rows and of
its records (:func:`dry_run`). No timing is asserted.
"""

from __future__ import annotations

import pytest

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench_util import check_records, read_records

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu.py"

#: The real lines' stored forms, in order: the synthetic JPEGs sharded by the package as they are and with
#: ``resize=256`` (the paper's 256 x 256 form at the default JPEG quality).
FORMS = ["original", "resize 256 q90"]
#: Every JSON line carries exactly these keys (the script's KEYS, spelled out so a renamed key fails here).
EXPECTED_KEYS = {
    "model", "mode", "form", "images_per_s", "step_ms_median", "step_ms_p90", "input_wait_share", "input_bound_share",
    "first_step_s", "batch", "image_size", "width", "num_classes", "params", "precision", "xla", "device",
    "tf_version", "steps", "warmup", "parallel", "cpu_count", "data", "dry_run",
}


def _run(*args: str, timeout: float = 600, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OUT"} | extra_env
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@dataclass(frozen=True)
class DryRun:
    """A finished run: ``proc`` (its rows on stdout), ``out`` (the --out file) and ``records`` (the --json file)."""

    proc: subprocess.CompletedProcess
    out: Path
    records: Path


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> DryRun:
    """One ``--dry-run --models alexnet`` with ``--out`` in a folder still to be made and ``--json FILE``."""
    tmp = tmp_path_factory.mktemp("gpu")
    out, records = tmp / "sub" / "gpu.jsonl", tmp / "records.jsonl"
    proc = _run("--dry-run", "--models", "alexnet", "--out", str(out), "--json", str(records))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return DryRun(proc, out, records)


@pytest.mark.slow
def test_dry_run_prints_one_json_line_per_mode_with_every_key(dry_run):
    lines = [line for line in dry_run.proc.stdout.splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines]  # every line is JSON
    assert [(r["model"], r["mode"], r["form"]) for r in rows] == [("alexnet", "synthetic", None),
                                                              *[("alexnet", "real", f) for f in FORMS]]
    for row in rows:
        assert set(row) == EXPECTED_KEYS
        assert row["images_per_s"] > 0 and row["step_ms_median"] > 0 and row["step_ms_p90"] > 0
        assert 0.0 <= row["input_wait_share"] <= 1.0
        assert (row["batch"], row["image_size"], row["width"], row["steps"], row["warmup"]) == (4, 67, 0.25, 3, 1)
        assert (row["precision"], row["xla"], row["dry_run"], row["num_classes"]) == ("mixed_bfloat16", True,
                                                                                     True, 1000)
        assert row["tf_version"] == metadata.version("tensorflow")
        assert row["device"].startswith("CPU")
        assert row["params"] > 1_000_000
    synthetic, *reals = rows
    assert synthetic["input_wait_share"] == 0.0 and synthetic["input_bound_share"] is None
    assert synthetic["parallel"] is None and synthetic["data"] is None
    for real in reals:
        assert isinstance(real["input_bound_share"], float) and real["parallel"] >= 1
        assert real["data"] == "synthetic-jpeg"
    assert dry_run.out.read_text().splitlines() == lines  # --out holds the same lines


@pytest.mark.slow
def test_json_writes_the_harness_records_and_out_keeps_the_rows(dry_run):
    expected = {"alexnet synthetic: images/s", "alexnet synthetic: step ms"}
    for form in FORMS:
        expected |= {f"alexnet real ({form}): images/s", f"alexnet real ({form}): step ms",
                     f"alexnet real ({form}): input wait %", f"alexnet: input-bound share ({form})"}
    by_name = check_records(read_records(dry_run.records), "gpu", expected)
    assert set(by_name) == expected
    assert by_name["alexnet synthetic: images/s"]["params"]["form"] is None
    for form in FORMS:
        assert by_name[f"alexnet: input-bound share ({form})"]["kind"] == "derived"
        assert by_name[f"alexnet: input-bound share ({form})"]["params"]["form"] == form
        assert by_name[f"alexnet real ({form}): images/s"]["reps"] == 2  # --quick's: 2 windows of the 3 timed steps
        assert by_name[f"alexnet real ({form}): step ms"]["reps"] == 3  # one value per timed step
        params = by_name[f"alexnet real ({form}): images/s"]["params"]
        assert (params["model"], params["mode"], params["form"], params["batch"], params["dry_run"]) == \
            ("alexnet", "real", form, 4, True)
    rows = [json.loads(line) for line in dry_run.out.read_text().splitlines()]  # --out: the rows of KEYS, as before
    assert [(r["model"], r["mode"], r["form"]) for r in rows] == [("alexnet", "synthetic", None),
                                                              *[("alexnet", "real", f) for f in FORMS]]
    assert all(set(r) == EXPECTED_KEYS and r["dry_run"] is True for r in rows)


def test_the_rows_go_to_stderr_when_the_records_go_to_stdout(monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # importing gpu.py sets TensorFlow's variables
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    gpu = importlib.import_module("gpu")
    assert gpu.rows_stream_of("-") is sys.stderr  # --json alone: the records take stdout
    assert gpu.rows_stream_of(None) is sys.stdout and gpu.rows_stream_of("records.jsonl") is sys.stdout


@pytest.mark.slow
def test_without_a_gpu_a_full_run_is_refused_with_what_to_do():
    proc = _run("--models", "alexnet", "--modes", "synthetic", timeout=300, CUDA_VISIBLE_DEVICES="-1")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "TensorFlow sees no GPU" in proc.stderr and "--dry-run" in proc.stderr


def test_bad_options_are_one_line_naming_the_option(tmp_path, monkeypatch):
    proc = _run("--models", "vgg", timeout=120)
    assert proc.returncode == 2 and "--models: vgg" in proc.stderr and "alexnet, resnet50" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _run("--data", str(tmp_path / "missing"), timeout=120)
    assert proc.returncode == 2 and "--data" in proc.stderr and "no such folder" in proc.stderr
    proc = _run("--jpegs", "1", timeout=120)
    assert proc.returncode == 2 and "--jpegs must be at least 2" in proc.stderr
    monkeypatch.setattr(os, "environ", dict(os.environ))  # importing gpu.py sets TensorFlow's variables
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    gpu = importlib.import_module("gpu")
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:  # shards without a manifest: both of the form "unknown"
        folder.mkdir()
        (folder / "train-00000-of-00001.tfrecord").write_bytes(b"")
    with pytest.raises(gpu.ConfigError, match=r"^--data .*b and --data .*a both hold the form 'unknown': give one"):
        gpu.data_shard_sets(folders)
