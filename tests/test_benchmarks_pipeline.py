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
#: --forms' records (benchmarks/forms.py) beside the rounds'.
FORMS = {"original: stored MB per image", "resize 256: stored MB per image", "max-side 320: stored MB per image",
         "resize 256: pipeline images/CPU-s", "max-side 320: pipeline images/CPU-s",
         "resize 256 / original: stored MB per image", "max-side 320 / original: stored MB per image",
         "resize 256 / original: pipeline images/CPU-s", "max-side 320 / original: pipeline images/CPU-s",
         "scaled decode: ceiling images/CPU-s", "scaled decode on / off: ceiling images/CPU-s"}


@pytest.mark.slow
def test_quick_json_records_each_measurement_of_the_rounds_and_the_forms():
    # --forms adds five windows a round: one round of 64 JPEGs in batches of 16 keeps the run as short as
    # --quick's own 2 rounds of 128 in batches of 32
    records, _ = run_quick("pipeline.py", *SHORT, "--forms", "--reps", "1", "--limit", "64", "--batch-size", "16")
    by_name = check_records(records, "pipeline", ROUNDS | FORMS)
    assert set(by_name) == ROUNDS | FORMS
    for name in ROUNDS:
        record = by_name[name]
        assert record["reps"] == 1
        assert record["params"]["batch_size"] == 16 and record["params"]["image_size"] == 224
        assert len(record["params"]["others_cores"]) == 1
        assert record["params"]["pipeline_output"].startswith("uint8 [B,S,S,3] batches, as training consumes")
    assert {by_name[n]["kind"] for n in ROUNDS if "/ ceiling" in n} == {"ratio"}
    ratio = by_name["pipeline / ceiling (images/s)"]["values"]
    pipeline, ceiling = by_name["pipeline images/s"]["values"], by_name["ceiling images/s"]["values"]
    assert ratio == pytest.approx([p / c for p, c in zip(pipeline, ceiling)])
    # the forms: smaller stored images, their ratios to the originals, the scaled decode against the ceiling
    mb = {form: by_name[f"{form}: stored MB per image"]["values"][0]
          for form in ("original", "resize 256", "max-side 320")}
    assert mb["resize 256"] < mb["original"] and mb["max-side 320"] < mb["original"]
    assert by_name["resize 256 / original: stored MB per image"]["values"] == pytest.approx(
        [mb["resize 256"] / mb["original"]])
    assert by_name["resize 256 / original: stored MB per image"]["params"]["goal"] == 0.4
    per_cpu = by_name["resize 256 / original: pipeline images/CPU-s"]
    assert per_cpu["kind"] == "ratio" and per_cpu["params"]["goal"] == 2.0
    assert per_cpu["values"] == pytest.approx([by_name["resize 256: pipeline images/CPU-s"]["values"][0]
                                               / by_name["pipeline images/CPU-s"]["values"][0]])
    scaled = by_name["scaled decode on / off: ceiling images/CPU-s"]
    assert sum(scaled["params"]["windows_by_ratio"].values()) == 64 and scaled["params"]["decode_calls"] >= 1


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


def test_forms_with_max_side_is_refused_before_any_work():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "pipeline.py"), "--forms", "--max-side", "256"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--forms stores its own max-side 320 and resize 256 forms" in proc.stderr and "--max-side" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
