"""benchmarks/scaling.py: its --quick --json records (local[1] and local[2] through Spark, one repetition each;
benchmarks/common.py's format, through tests/bench_util.py) and its refusal of bad options. No timing is
asserted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench_util import REPO, check_records, run_quick


@pytest.mark.slow
def test_quick_run_records_one_and_two_workers_and_their_ratio():
    records, _stderr = run_quick("scaling.py", timeout=600)
    by_name = check_records(records, "scaling", {"local[1] on 2 cores: train images/s",
                                                 "local[2] on 2 cores: train images/s",
                                                 "local[2] / local[1] on 2 cores: images/s"})
    assert all(r["reps"] == 1 for r in records)
    ratio = by_name["local[2] / local[1] on 2 cores: images/s"]
    assert ratio["kind"] == "ratio" and ratio["params"]["scaling"].startswith("weak")
    assert not any("cluster" in name for name in by_name)  # --quick leaves the 2-host cluster out


def test_one_epoch_is_refused_since_the_first_is_not_timed():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scaling.py"), "--epochs", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--epochs" in proc.stderr


def test_a_folder_that_is_not_a_kaggle_tree_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scaling.py"), "--tree", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--tree" in proc.stderr and "ILSVRC" in proc.stderr
