"""BENCHMARKS.md and benchmarks/: every script is documented, tested with --quick, and the committed records
of the full runs follow the record contract of benchmarks/common.py (format only: no number is checked)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import RECORD_KEYS  # noqa: E402

#: The scripts that are tools of the others, not benchmarks.
HELPERS = {"common.py", "throttle_proxy.py"}


def scripts() -> list[Path]:
    return sorted(p for p in (REPO / "benchmarks").glob("*.py") if p.name not in HELPERS)


def test_every_script_uses_the_harness_is_in_benchmarks_md_and_has_a_quick_test():
    text = (REPO / "BENCHMARKS.md").read_text()
    assert scripts(), "no benchmark script found"
    for script in scripts():
        assert "add_options(" in script.read_text(), f"{script.name} does not take --quick/--reps/--json"
        assert f"`{script.name}`" in text, f"BENCHMARKS.md does not describe {script.name}"
        test = REPO / "tests" / f"test_benchmarks_{script.stem}.py"
        body = test.read_text() if test.is_file() else ""
        assert "--quick" in body or "run_quick" in body, f"no quick test for {script.name} in {test.name}"


def test_the_committed_records_follow_the_contract():
    results = sorted((REPO / "benchmarks" / "results").glob("*.jsonl"))
    assert results, "benchmarks/results/ holds no records"
    for path in results:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        assert lines, f"{path.name} is empty"
        for line in lines:
            record = json.loads(line)
            assert tuple(record) == RECORD_KEYS, (path.name, list(record))
            assert record["quick"] is False, f"{path.name}: a --quick run is not a result"
            assert record["reps"] == len(record["values"]) >= 1
            assert record["commit"], f"{path.name}: no commit recorded"
        assert f"benchmarks/results/{path.name}" in (REPO / "BENCHMARKS.md").read_text(), \
            f"BENCHMARKS.md does not say which run {path.name} is"
