"""Running a benchmark script with ``--quick --json`` and checking that its records are well formed.

Only the format is checked (benchmarks/common.py's record contract): no timing is asserted, since the
numbers of a quick run on a shared machine are noise.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import RECORD_KEYS  # noqa: E402

UNITS = {"s", "ms", "images/s", "images/CPU-s", "MB/s", "MB", "x", "h", "steps/s", "%"}
KINDS = {"measured", "ratio", "derived"}


def run_quick(script: str, *args: str, timeout: float = 300, **env: str) -> tuple[list[dict], str]:
    """Run ``benchmarks/SCRIPT --quick --json ARGS`` from the repository root; returns (records, stderr).

    Raises:
        AssertionError: the script failed, or a stdout line is not a JSON object.
    """
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--quick", "--json", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env})
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert records, f"{script} --json printed no record; stderr:\n{proc.stderr[-3000:]}"
    return records, proc.stderr


def read_records(path: Path) -> list[dict]:
    """The records a script wrote to ``--json FILE``, one JSON object a line.

    Raises:
        AssertionError: the file holds no record.
    """
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert records, f"{path} holds no record"
    return records


def check_record(record: dict, benchmark: str) -> None:
    """Assert that ``record`` follows the contract of benchmarks/common.py for ``benchmark``."""
    assert tuple(record) == RECORD_KEYS, record.keys()
    assert record["benchmark"] == benchmark
    assert isinstance(record["measurement"], str) and record["measurement"]
    assert record["unit"] in UNITS, record["unit"]
    assert record["kind"] in KINDS
    values = record["values"]
    assert record["reps"] == len(values) >= 1
    assert all(isinstance(v, float) and math.isfinite(v) for v in values), values
    assert record["min"] == min(values) and record["max"] == max(values)
    assert record["min"] <= record["median"] <= record["max"]
    assert record["spread"] >= 0.0
    if record["kind"] == "derived":
        assert record["reps"] == 1
    assert isinstance(record["params"], dict)
    assert record["quick"] is True
    datetime.datetime.fromisoformat(record["date"])
    assert record["commit"] is None or isinstance(record["commit"], str)
    assert record["machine"]["cpus"] >= 1 and record["machine"]["python"]
    assert "tensorflow" in record["versions"] or "pillow" in record["versions"]
    others = record["others_cpu"]  # the quiet machine rule: measured, never refused under --quick
    assert others is None or (others["cpu_seconds"] >= 0.0 and others["wall_seconds"] > 0.0
                              and isinstance(others["quiet"], bool) and len(others["top"]) <= 3), others


def check_records(records: list[dict], benchmark: str, expected: set[str]) -> dict[str, dict]:
    """Check every record and that the measurements ``expected`` are among them; returns them by name."""
    for record in records:
        check_record(record, benchmark)
    by_name = {r["measurement"]: r for r in records}
    assert len(by_name) == len(records), "two records with the same measurement name"
    missing = expected - set(by_name)
    assert not missing, f"missing measurements: {sorted(missing)}; got {sorted(by_name)}"
    return by_name
