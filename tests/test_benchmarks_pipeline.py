"""benchmarks/pipeline.py: its --quick --json records (format only, no timing asserted) and its refusals.

The quick run uses 128 JPEGs of ../shared/data/imagenet-sample, or 64 synthetic JPEGs where the shared data
is absent (so it does not skip on a fresh clone). The tests shorten its windows and warm-up to a quarter of a
second (SHORT: no test reads a number), and the --scaling run's children to one round each.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench_util import REPO, check_records, run_quick

ROUNDS = {"ceiling images/s", "pipeline images/s", "ceiling images/CPU-s", "pipeline images/CPU-s",
          "pipeline / ceiling (images/s)", "pipeline / ceiling (images/CPU-s)"}
#: Quarter-second windows and warm-up: the records are --quick's but for the params seconds and warmup.
SHORT = ("--seconds", "0.25", "--warmup", "0.25")


@pytest.mark.slow
def test_quick_json_records_each_measurement_of_the_rounds():
    records, _ = run_quick("pipeline.py", *SHORT)
    by_name = check_records(records, "pipeline", ROUNDS)
    assert set(by_name) == ROUNDS
    for name in ROUNDS:
        record = by_name[name]
        assert record["reps"] == 2  # --quick: 2 rounds
        assert record["params"]["batch_size"] == 32 and record["params"]["image_size"] == 224
        assert len(record["params"]["others_cores"]) == 2
        assert record["params"]["pipeline_output"].startswith("uint8 [B,S,S,3] batches, as training consumes")
    assert {by_name[n]["kind"] for n in ROUNDS if "/ ceiling" in n} == {"ratio"}
    ratio = by_name["pipeline / ceiling (images/s)"]["values"]
    pipeline, ceiling = by_name["pipeline images/s"]["values"], by_name["ceiling images/s"]["values"]
    assert ratio == pytest.approx([p / c for p, c in zip(pipeline, ceiling)])


@pytest.mark.slow
def test_quick_scaling_records_per_cpu_count_and_the_assumed_h200_cores():
    counts = [1, 2] if len(os.sched_getaffinity(0)) >= 2 else [1]
    records, _ = run_quick("pipeline.py", "--scaling", ",".join(map(str, counts)), "--repeats", "1", "--reps", "1",
                           *SHORT)
    expected = {f"{n} CPU(s): {what}" for n in counts for what in (
        "pipeline images/s per core", "pipeline images/CPU-s", "ceiling images/s per core",
        "pipeline / ceiling (images/s)")}
    expected |= {"cores per H200, AlexNet (ASSUMED 20,000 images/s)",
                 "cores per H200, ResNet-50 (ASSUMED 5,000 images/s)"}
    if len(counts) > 1:
        expected.add("2 / 1 CPU(s): pipeline images/s per core")
    by_name = check_records(records, "pipeline", expected)
    assert set(by_name) == expected
    h200 = by_name["cores per H200, AlexNet (ASSUMED 20,000 images/s)"]
    assert h200["kind"] == "derived" and "ASSUMED" in h200["params"]["basis"]


def test_a_missing_data_folder_is_one_sentence_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "pipeline.py"), "--data",
                           str(tmp_path / "missing")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "missing not found" in proc.stderr and "pass --data DIR" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
