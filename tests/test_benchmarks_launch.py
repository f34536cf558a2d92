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
              "ours warm: breakdown: fit start to first step", "plain: breakdown: fit start to first step"}
    if peer:
        names |= {f"peer {k}: {m}" for k in ("cold", "warm") for m in ("call to first step", "whole job")}
        names |= {f"ours/peer {k}: {m}" for k in ("cold", "warm") for m in ("call to first step", "whole job")}
        names |= {"peer: SparkSession start (outside the timings)", "peer cold: breakdown: fit start to first step"}
    return names


@pytest.mark.slow
def test_quick_json_records_are_well_formed_and_the_run_folder_is_removed(tmp_path):
    # all three variants (--quick alone runs ours and plain, to stay under a minute); without the peer
    # installed the script says so and leaves it out
    records, stderr = run_quick("launch.py", "--root", str(tmp_path), "--variants", "ours,peer,plain", timeout=900)
    by_name = check_records(records, "launch", _expected(PEER_INSTALLED))
    assert by_name["ours/plain cold: call to first step"]["kind"] == "ratio"
    assert by_name["ours cold: whole job"]["params"]["ours_evaluates_val"] is True
    if PEER_INSTALLED:
        assert by_name["ours/peer warm: whole job"]["params"]["goal_at_most"] == 1.5
    else:
        assert "not installed" in stderr and launch.PEER_INSTALL in stderr
    # the breakdown of ours adds up to its call-to-first-step time: the gaps chain from the call to the first step
    for kind in ("cold", "warm"):
        gaps = {name.split(": breakdown: ")[1]: r["values"] for name, r in by_name.items()
                if name.startswith(f"ours {kind}: breakdown: ")}
        chain = {name.split(" to ")[0]: (name.split(" to ")[1], values) for name, values in gaps.items()}
        event, total = "call", [0.0] * len(by_name[f"ours {kind}: call to first step"]["values"])
        while event != "first step":
            event, values = chain[event]
            total = [t + v for t, v in zip(total, values)]
        assert total == pytest.approx(by_name[f"ours {kind}: call to first step"]["values"], rel=1e-6, abs=1e-3)
    assert list(tmp_path.iterdir()) == []  # the dataset, caches and probe files are gone


def test_probe_records_the_interpreter_start_and_wraps_hooked_functions(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(launch.PROBE)
    marks = tmp_path / "marks.jsonl"
    code = ("import spark_imagenet.training.task.rendezvous as r; import sys; "
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
    proc = subprocess.run([sys.executable, "-c", "import spark_imagenet.training.task.rendezvous"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and not marks.exists()


def test_read_marks_keeps_the_latest_event_of_the_window_from_the_processes_that_trained(tmp_path):
    path = tmp_path / "marks.jsonl"
    lines = [{"t": 99.0, "pid": 3, "event": "tensorflow imported"},  # before the call: not in the job
             {"t": 101.0, "pid": 1, "event": "planned"},  # the driver
             {"t": 101.5, "pid": 2, "event": "task started"},  # a task
             {"t": 102.0, "pid": 3, "event": "python start", "cmd": "python -m spark_imagenet.training.worker.main"},
             {"t": 102.5, "pid": 4, "event": "python start", "cmd": "python launch.py --_worker job.json"},
             {"t": 103.0, "pid": 4, "event": "tensorflow imported"},
             {"t": 104.0, "pid": 3, "event": "first step"}, {"t": 105.0, "pid": 4, "event": "first step"},
             {"t": 106.0, "pid": 5, "event": "python start", "cmd": "python -m spark_imagenet.training.worker.main"},
             {"t": 107.0, "pid": 5, "event": "tensorflow imported"},  # a process that did not train: not counted
             {"t": 111.0, "pid": 4, "event": "training done"}]  # after the window
    path.write_text("".join(json.dumps(m) + "\n" for m in lines) + "not json\n")
    assert launch.read_marks(path, 100.0, 110.0) == {"planned": 1.0, "task started": 1.5, "worker python start": 2.5,
                                                      "tensorflow imported": 3.0, "first step": 5.0}


def test_breakdown_gaps_follow_the_median_order_and_add_up():
    class Sink:
        def __init__(self):
            self.added = {}

        def add(self, name, unit, values, **params):
            self.added[name] = values

    runs = [{"jobs": [{"events": {"a": 1.0, "b": 3.0, "first step": 4.0}, "whole": 5.0}]},
            {"jobs": [{"events": {"a": 2.5, "b": 2.0, "first step": 6.0}, "whole": 7.0}]},  # b before a here
            {"jobs": [{"events": {"a": 1.0, "b": 2.0, "first step": 4.0}, "whole": 4.5}]}]
    sink = Sink()
    launch.record_breakdown(sink, {"plain": runs}, {})
    assert sink.added == {"plain: breakdown: call to a": [1.0, 2.5, 1.0], "plain: breakdown: a to b": [2.0, 0.0, 1.0],
                          "plain: breakdown: b to first step": [1.0, 3.5, 2.0],
                          "plain: breakdown: first step to returned": [1.0, 1.0, 0.5]}


def test_quick_runs_ours_and_plain_unless_told_and_ours_is_always_in():
    assert launch.parse_args(["--quick"]).variants == ["ours", "plain"]
    assert launch.parse_args([]).variants == ["ours", "peer", "plain"]
    assert launch.parse_args(["--quick", "--variants", "plain,ours,peer"]).variants == ["ours", "peer", "plain"]
    with pytest.raises(SystemExit):
        launch.parse_args(["--variants", "peer,plain"])


def test_a_root_that_is_a_file_is_refused(tmp_path):
    root = tmp_path / "file"
    root.write_text("x")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--root", str(root)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--root {root} is not a folder" in proc.stderr
