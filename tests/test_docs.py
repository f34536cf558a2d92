"""README.md and docs/: the README stays short, its links resolve, every measured claim matches its record,
and docs/options.md is what the options reference generates from the code.

A measured claim is written in one fixed form, ``VALUE [to VALUE] [UNIT] (record: PATH, KEY)``, e.g.
``validation top-1 0.908 (record: docs/records/demo.json, results.val.top1)``: PATH is a JSON record in the
repository (with its ``date`` and ``commit``), KEY a dotted path into it (list items by index). The claim
holds when the record's value, rounded to the decimals the claim shows, equals it (a range ``A to B`` needs
a record value ``[A, B]``).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"

#: The README's length limit (issue 19: a newcomer reads it in ten minutes).
MAX_README_LINES = 300

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
CLAIM = re.compile(rf"({_NUMBER})(?: to ({_NUMBER}))?(?: [A-Za-z/%]+)? \(record: ([^,()\s]+), ([\w.\-]+)\)")
#: Accuracy figures (``top-1 0.908``) that must carry a record.
ACCURACY = re.compile(r"top-[15] (\d\.\d+)(?!\d)(?!(?: to \d\.\d+)? \(record:)")


def _documents() -> list[Path]:
    """The README and every Markdown file of the user guide (the files whose numbers must cite records)."""
    return [README, *sorted((DOCS / "guide").glob("*.md"))]


def _claims(path: Path) -> list[tuple[str, str | None, str, str]]:
    """``(value, range end or None, record path, key)`` of every claim in ``path``, line breaks joined."""
    text = " ".join(path.read_text().split())
    return CLAIM.findall(text)


def _lookup(record: object, key: str) -> object:
    """The value at the dotted ``key`` in a JSON record."""
    value = record
    for part in key.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _matches(claimed: str, actual: object) -> bool:
    """Whether ``actual`` rounded to the decimals of ``claimed`` (``"0.908"``, ``"2,705"``) equals it."""
    text = claimed.replace(",", "")
    decimals = len(text.partition(".")[2])
    return isinstance(actual, (int, float)) and round(float(actual), decimals) == float(text)


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"


def test_readme_states_the_demo_figure_from_its_record():
    cited = {(path, key) for _, _, path, key in _claims(README)}
    assert ("docs/records/demo.json", "results.val.top1") in cited, \
        "README.md states no demo top-1 from docs/records/demo.json"


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_measured_claims_match_their_records(doc):
    wrong = []
    for value, upper, path, key in _claims(doc):
        record_file = REPO / path
        assert record_file.is_file(), f"{doc.name}: record {path} does not exist"
        record = json.loads(record_file.read_text())
        assert record.get("date") and record.get("commit"), f"{path}: a record needs its date and commit"
        try:
            actual = _lookup(record, key)
        except (KeyError, IndexError, ValueError, TypeError):
            wrong.append(f"{value} ({path}, {key}): no such key")
            continue
        ok = (isinstance(actual, list) and len(actual) == 2 and _matches(value, actual[0])
              and _matches(upper, actual[1])) if upper else _matches(value, actual)
        if not ok:
            wrong.append(f"{value}{' to ' + upper if upper else ''} ({path}, {key}): the record says {actual!r}")
    assert not wrong, f"{doc.name}: claims that do not match their records: {wrong}"


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_record_citation_is_a_parseable_claim(doc):
    text = " ".join(doc.read_text().split())
    cited = text.count("(record:")
    parsed = len(_claims(doc))
    assert cited == parsed, (f"{doc.name}: {cited - parsed} '(record: ...)' citation(s) not in the form "
                             "'VALUE [to VALUE] [UNIT] (record: PATH, KEY)'")


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_accuracy_figure_cites_a_record(doc):
    text = " ".join(doc.read_text().split())
    bare = ACCURACY.findall(text)
    assert not bare, f"{doc.name}: top-1/top-5 figures without '(record: PATH, KEY)': {bare}"


def _heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of the Markdown headings of ``path``."""
    anchors = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


@pytest.mark.parametrize("doc", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(doc):
    """Every relative link (``[text](path#anchor)``) and every ``docs/...`` path in backticks names an existing
    file (and heading)."""
    text = doc.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _heading_anchors(path):
            broken.append(target)
    for named in re.findall(r"`(docs/[\w./-]+\.(?:md|json))`", text):
        if not (REPO / named).is_file():
            broken.append(named)
    assert not broken, f"{doc.relative_to(REPO)}: links to nothing: {broken}"


def test_options_reference_is_generated_from_the_config():
    from spark_imagenet.training.job.options_reference import render

    committed = (DOCS / "options.md").read_text()
    assert committed == render(), ("docs/options.md differs from the code; regenerate it with "
                                   "`python -m spark_imagenet.training.job.options_reference > docs/options.md`")


def test_options_reference_names_every_option_of_train():
    """Each ``train`` option of the command line, and each job-file key, has a row in docs/options.md."""
    from spark_imagenet.cli import build_parser
    from spark_imagenet.training.job.config import TrainConfig

    text = (DOCS / "options.md").read_text()
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    train = commands.choices["train"]
    options = [s for action in train._actions for s in action.option_strings
               if s.startswith("--") and action.help != "==SUPPRESS==" and s != "--help"]
    assert options, "no train options found"
    missing = [o for o in options if f"`{o}" not in text]
    missing += [k for k in TrainConfig.keys() if f"| `{k}` |" not in text]
    assert not missing, f"docs/options.md lacks: {missing}"


@pytest.mark.parametrize("doc", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda p: str(p.relative_to(REPO)))
def test_cited_sections_exist(doc):
    """Every ``design.md, 'Section'`` (also ``[..](../design.md), 'Section'``) and ``xxx.md), 'Section'`` cited in
    the README and docs names a heading of that file (the section's title, before any parenthesis)."""
    text = " ".join(doc.read_text().split())
    missing = []
    for name, section in re.findall(r"([\w-]+\.md)\)?, '([^']+)'", text):
        target = next((p for p in [README, *DOCS.rglob("*.md")] if p.name == name), None)
        if target is None:
            continue
        titles = {line.lstrip("#").strip() for line in target.read_text().splitlines() if line.startswith("#")}
        titles |= {title.split(" (")[0] for title in titles}
        if section not in titles:
            missing.append(f"{name}, '{section}'")
    assert not missing, f"{doc.relative_to(REPO)}: cites sections that do not exist: {missing}"
