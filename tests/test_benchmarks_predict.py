"""benchmarks/predict.py: its --quick --json records (benchmarks/common.py's format, through tests/bench_util.py)
and its refusal of bad options. The quick run scores 16 images with a narrow AlexNet on 72-pixel images, as a
Spark job on local[2] and by the one-process predict path, once each after the untimed warm-up. No timing is
asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench_util import check_records, run_quick

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_json_records_both_paths_and_their_ratio():
    records, _ = run_quick("predict.py", "--reps", "1", timeout=600)  # one timed repetition: no number is read
    spark, local = "predict_dataframe on local[2]", "one-process predict path"
    expected = {f"{spark}: images/s", f"{local}: images/s", f"{spark}: images/s per core",
                f"{local}: images/s per core", f"{spark} / one-process predict, images/s per core"}
    by_name = check_records(records, "predict", expected)
    assert by_name[f"{spark}: images/s"]["params"]["images"] == 16
    assert by_name[f"{spark}: images/s per core"]["unit"] == "images/CPU-s"
    assert by_name[f"{spark}: images/s per core"]["params"]["cores"] == 2


@pytest.mark.parametrize("option, message", [(["--images", "0"], "--images 0: give 1 or more"),
                                             (["--width", "-1"], "--width -1.0: give a positive multiplier")])
def test_bad_options_are_exit_2(option, message):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "predict.py"), *option], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2 and message in p.stderr, p.stderr[-2000:]
