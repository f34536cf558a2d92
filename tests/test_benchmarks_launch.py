"""benchmarks/launch.py: its --quick --json records (benchmarks/common.py's format, through tests/bench_util.py),
its probe, and its refusal of a bad --root. No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench_util import check_records, run_quick

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "launch.py"
sys.path.insert(0, str(REPO / "benchmarks"))

import launch  # noqa: E402

PEER_INSTALLED = importlib.util.find_spec("spark_tensorflow_distributor") is not None


def _expected(peer: bool) -> set[str]:
    names = {f"ours {k}: {m}" for k in ("cold", "warm") for m in ("call to first step", "whole job")}
    names |= {"plain: call to first step", "plain: whole job", "ours: SparkSession start (outside the timings)"}
    names |= {f"ours/plain {k}: {m}" for k in ("cold", "warm") for m in ("call to first step", "whole job")}
    names |= {"ours cold: breakdown: call to planned", "ours cold: breakdown: fit start to first step",
              "ours warm: breakdown: shards staged to rendezvous done", "plain: breakdown: fit start to first step"}
    if peer:
        names |= {f"peer {k}: {m}" for k in ("cold", "warm") for m in ("call to first step", "whole job")}
        names |= {f"ours/peer {k}: {m}" for k in ("cold", "warm") for m in ("call to first step", "whole job")}
        names |= {"peer: SparkSession start (outside the timings)", "peer cold: breakdown: fit start to first step"}
    return names


@pytest.mark.slow
def test_quick_json_records_are_well_formed_and_the_run_folder_is_removed(tmp_path):
    records, stderr = run_quick("launch.py", "--root", str(tmp_path), timeout=900)
    by_name = check_records(records, "launch", _expected(PEER_INSTALLED))
    assert by_name["ours/plain cold: call to first step"]["kind"] == "ratio"
    assert by_name["ours cold: whole job"]["params"]["ours_evaluates_val"] is True
    if PEER_INSTALLED:
        assert by_name["ours/peer warm: whole job"]["params"]["goal_at_most"] == 1.5
    else:
        assert "not installed" in stderr and launch.PEER_INSTALL in stderr
    # the breakdown of ours adds up to its call-to-first-step time (consecutive gaps of one event list)
    gaps = [r for name, r in by_name.items() if name.startswith("ours cold: breakdown: ")]
    first_step = by_name["ours cold: call to first step"]["values"]
    ordered = list(launch.EVENTS["ours"])
    upto = ordered.index("first step")
    total = [sum(r["values"][i] for r in gaps
                 if ordered.index(r["measurement"].rsplit(" to ", 1)[1]) <= upto) for i in range(len(first_step))]
    assert total == pytest.approx(first_step, rel=1e-6, abs=1e-3)
    assert list(tmp_path.iterdir()) == []  # the dataset, caches and probe files are gone


def test_probe_records_the_interpreter_start_and_wraps_hooked_functions(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(launch.PROBE)
    marks = tmp_path / "marks.jsonl"
    code = ("import spark_imagenet.training.rendezvous as r; import sys; "
            "sys.exit(0 if hasattr(r.rendezvous, '__wrapped__') else 3)")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), launch.PROBE_ENV: str(marks)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in marks.read_text().splitlines()]
    assert events[0]["event"] == "python start" and events[0]["pid"] > 0 and "-c" in events[0]["cmd"]
    # without the variable the probe does nothing
    env.pop(launch.PROBE_ENV)
    marks.unlink()
    proc = subprocess.run([sys.executable, "-c", "import spark_imagenet.training.rendezvous"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and not marks.exists()


def test_read_marks_keeps_the_latest_event_of_the_window_and_names_worker_starts(tmp_path):
    path = tmp_path / "marks.jsonl"
    lines = [{"t": 99.0, "pid": 1, "event": "first step"},  # before the window
             {"t": 101.0, "pid": 2, "event": "python start", "cmd": "python -m pyspark.daemon"},
             {"t": 102.0, "pid": 3, "event": "python start", "cmd": "python -m spark_imagenet.training.worker a b"},
             {"t": 102.5, "pid": 4, "event": "python start", "cmd": "python launch.py --_worker job.json"},
             {"t": 103.0, "pid": 7, "event": "tensorflow imported"},  # the driver's own import: left out
             {"t": 104.0, "pid": 3, "event": "first step"}, {"t": 105.0, "pid": 4, "event": "first step"}]
    path.write_text("".join(json.dumps(m) + "\n" for m in lines) + "not json\n")
    assert launch.read_marks(path, 100.0, 110.0, exclude_pid=7) == {"worker python start": 2.5, "first step": 5.0}


def test_a_root_that_is_a_file_is_refused(tmp_path):
    root = tmp_path / "file"
    root.write_text("x")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--root", str(root)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--root {root} is not a folder" in proc.stderr
