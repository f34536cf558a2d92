"""benchmarks/shard.py: its --quick --json records (benchmarks/common.py's format, through tests/bench_util.py)
and its refusals of bad input.

The quick run generates its own small Kaggle tree (no ../shared/data needed) and shards it from the folder,
the zip and the nested tar.gz zip, with 1 process and with all cores. No timing is asserted.
"""

from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

from bench_util import check_records, run_quick

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "shard.py"
SOURCES = ("folder", "zip", "nested tar")


def expected(processes: int) -> set[str]:
    names = {
        "byte copy (read + append to one file): images per CPU-second",
        "converter (Pillow decode + RGB + JPEG q95 + framing): MB per CPU-second (one core)",
        "ours per image in memory, verify=decode: images per CPU-second",
        "ours per image in memory, verify=header: images per CPU-second",
        "nested tar.gz stream, one pass (serial): MB per CPU-second (one core)",
        "fixed cost of a shard call (5-image tree, 1 process): CPU",
        "ours per image in memory (verify=decode) / converter, per CPU-second",
        "projection: I/O-bound hours, ImageNet train read + written at ASSUMED local NVMe (3,000 MB/s)",
    }
    for s in SOURCES:
        names |= {f"shard {s}, 1 process: whole call", f"shard {s}, 1 process: images per CPU-second",
                  f"shard {s}, 1 process: steady MB per CPU-second (fixed cost subtracted)",
                  f"shard {s}, {processes} processes: whole call", f"ours ({s}) / byte copy, per CPU-second",
                  f"ours ({s}) / converter, per CPU-second", f"scaling ({s}): {processes} processes / 1 process, wall"}
        names |= {f"projection: shard {s}, ImageNet train on {c} cores" for c in (16, 64)}
    names |= {f"projection: converter, ImageNet train on {c} cores" for c in (16, 64)}
    names |= {f"projection: JPEG read rate shard folder needs on {c} cores" for c in (16, 64)}
    return names


@pytest.mark.slow
def test_quick_json_records_are_well_formed():
    records, _stderr = run_quick("shard.py", "--processes", "2")
    by_name = check_records(records, "shard", expected(2))
    assert by_name["shard folder, 1 process: whole call"]["reps"] == 2
    assert by_name["ours (zip) / converter, per CPU-second"]["kind"] == "ratio"
    projection = by_name["projection: shard nested tar, ImageNet train on 64 cores"]
    assert projection["kind"] == "derived" and projection["unit"] == "h"
    assert projection["params"]["images"] == 1_281_167 and "serial_pass_s" in projection["params"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_a_missing_data_folder_is_exit_2_naming_the_options(tmp_path):
    proc = _run("--data", str(tmp_path / "absent"), "--reps", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--data {tmp_path / 'absent'} is not a folder" in proc.stderr and "--tree" in proc.stderr
    assert "--quick" not in proc.stderr and "Traceback" not in proc.stderr  # --data was given: --quick is no remedy


def test_a_folder_that_is_not_a_kaggle_tree_is_exit_2(tmp_path):
    proc = _run("--tree", str(tmp_path), "--reps", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "not usable as a Kaggle tree" in proc.stderr and "Traceback" not in proc.stderr


def test_data_and_tree_together_are_refused(tmp_path):
    proc = _run("--data", str(tmp_path), "--tree", str(tmp_path))
    assert proc.returncode == 2 and "not both" in proc.stderr
