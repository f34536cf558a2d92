"""benchmarks/scale.py: its --quick --json records (benchmarks/common.py's format, through tests/bench_util.py) and
its refusal of too few entries. The quick run writes an 80-entry zip of 2 classes and shards it by both paths into 2
train and 1 val shards (the Spark job on local[2]). No timing or memory figure is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench_util import check_records, run_quick

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_json_records_both_paths_their_ratio_and_the_projection(tmp_path):
    records, _ = run_quick("scale.py", "--keep", str(tmp_path), timeout=600)
    label = {"local": "local path (all cores)", "spark": "Spark job (local[2])"}
    expected = {f"{label[k]}: {m}" for k in label for m in ("whole call", "images/s", "driver's peak RSS")}
    expected |= {"Spark job / local path, images/s",
                 "projection: ImageNet-21k read + written at an ASSUMED 10 Gbit/s (I/O bound)",
                 *(f"projection: ImageNet-21k as a Spark job on {n} executor cores" for n in (16, 64))}
    by_name = check_records(records, "scale", expected)
    params = by_name["local path (all cores): images/s"]["params"]
    assert (params["entries"], params["classes"], params["train_shards"], params["val_shards"]) == (80, 2, 2, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["imagenet-80x2.zip"]  # kept; the shards are gone


def test_too_few_entries_per_class_are_refused():
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scale.py"), "--entries", "100", "--classes", "10"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "give at least 2 classes and 40 entries per class" in p.stderr
