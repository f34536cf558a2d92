"""benchmarks/step.py: its --quick --json records (benchmarks/common.py's format, through tests/bench_util.py)
and its refusal of bad options. No timing is asserted."""

from __future__ import annotations

import pytest

import subprocess
import sys

from bench_util import REPO, check_records, run_quick

VARIANTS = ("ours", "ours (bare settings)", "bare")


@pytest.mark.slow
def test_quick_run_records_each_variant_and_the_ratios_against_bare():
    records, _stderr = run_quick("step.py", "--reps", "1")  # one timed fit call per variant: no number is read
    expected = {f"test: {v}: {what}" for v in VARIANTS for what in ("ms per step", "images/s", "CPU ms per step")}
    expected |= {f"test: {v} / bare: {what}" for v in VARIANTS[:2] for what in ("time per step", "CPU time per step")}
    by_name = check_records(records, "step", expected)
    ratio = by_name["test: ours / bare: time per step"]
    assert ratio["kind"] == "ratio" and ratio["unit"] == "x" and ratio["params"]["limit"] == 1.0
    assert ratio["params"]["image_size"] == 67 and ratio["params"]["width"] == 0.25
    assert ratio["params"]["input"].startswith("ours: uint8 pixels, normalized in its train step")
    assert all(r["benchmark"] == "step" and r["params"]["size"] == "test" for r in records)


def test_bad_sizes_are_refused_naming_the_option():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "step.py"), "--sizes", "300"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--sizes" in proc.stderr
