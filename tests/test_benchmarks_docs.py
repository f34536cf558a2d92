"""BENCHMARKS.md and benchmarks/: every script is documented, tested with --quick, and the committed records
of the full runs follow the record contract of benchmarks/common.py (format only: no number is checked).

The quiet machine rule: a committed record says how much CPU other processes used during its run and was
quiet (a run marked ``"quiet": false``, by ``--noisy-ok``, or unmeasured, is refused in benchmarks/results/);
a run committed before the rule (its records lack ``others_cpu``) is accepted only while BENCHMARKS.md's
"Quiet machine rule" section lists it as not under the quiet rule, and only then."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import PRE_QUIET_RECORD_KEYS, RECORD_KEYS  # noqa: E402

#: The scripts that are tools of the others, not benchmarks.
HELPERS = {"common.py", "forms.py", "throttle_proxy.py"}


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


def not_under_the_quiet_rule(text: str) -> str:
    """The paragraph of BENCHMARKS.md's "Quiet machine rule" section that lists the runs taken before it."""
    section = re.search(r"^## Quiet machine rule\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "BENCHMARKS.md has no '## Quiet machine rule' section"
    paragraphs = [p for p in section.group(1).split("\n\n") if "not under the quiet rule" in p.lower()]
    assert len(paragraphs) <= 1, "more than one paragraph lists the runs not under the quiet rule"
    return paragraphs[0] if paragraphs else ""


def test_the_committed_records_follow_the_contract():
    results = sorted((REPO / "benchmarks" / "results").glob("*.jsonl"))
    assert results, "benchmarks/results/ holds no records"
    before_rule = not_under_the_quiet_rule((REPO / "BENCHMARKS.md").read_text())
    for path in results:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        assert lines, f"{path.name} is empty"
        listed = f"`benchmarks/results/{path.name}`" in before_rule
        for line in lines:
            record = json.loads(line)
            if tuple(record) == PRE_QUIET_RECORD_KEYS:
                assert listed, (f"{path.name} was taken before the quiet machine rule (no others_cpu): "
                                "BENCHMARKS.md must list it as not under the quiet rule, or re-take it")
            else:
                assert tuple(record) == RECORD_KEYS, (path.name, list(record))
                assert not listed, f"{path.name} is under the quiet rule: take it off the list of runs before it"
                others = record["others_cpu"]
                assert others is not None, f"{path.name}: the CPU of other processes was not measured"
                assert others["quiet"] is True and others["core_share"] <= others["limit"], \
                    f"{path.name}: a noisy run (others used {others['core_share']} of a core) is not a result"
            assert record["quick"] is False, f"{path.name}: a --quick run is not a result"
            assert record["reps"] == len(record["values"]) >= 1
            assert record["commit"], f"{path.name}: no commit recorded"
        assert f"benchmarks/results/{path.name}" in (REPO / "BENCHMARKS.md").read_text(), \
            f"BENCHMARKS.md does not say which run {path.name} is"
