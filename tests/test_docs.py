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


# ---------------------------------------------------------------------------------------------------------------
# The package's docstring examples (issue 42): every ``>>>`` example of a public docstring runs here, one test id
# per docstring (``path:line`` of its first example); every other literal block that is Python (it parses, and
# calls, assigns, loops or opens a ``with``) fails :func:`test_python_examples_are_doctests`; every
# ``spark-imagenet ...`` and ``python -m spark_imagenet...`` line of a literal block is checked by the CLI's parser
# (or names a module that exists). Literal blocks that are neither (a wire format, a data layout, JSON) are text.

PACKAGE = REPO / "spark_imagenet"
#: The places the examples name for "your data", and what they are here: ``/data/kaggle`` a small synthetic
#: Kaggle tree, ``gs://my-bucket/`` a local folder (the test's working directory is a fresh tmp folder).
REWRITES = {"gs://my-bucket/": "my-bucket/", "gs://bucket/": "bucket/"}
#: The places the examples name for a sharded dataset and a finished run's ``--output`` (below the working
#: directory, as :data:`REWRITES` makes them), and what they are here (:func:`trained_run`): a docstring naming
#: one is in the slow tier (a train of the tiny settings costs about 30 s on 2 cores).
RUN_PLACES = {"my-bucket/imagenet-shards": "shards", "my-bucket/runs/alexnet-8": "run"}
#: Modules whose examples run in a Python of their own: they import TensorFlow, whose state outlives the test.
OWN_PROCESS = "spark_imagenet.training.worker"


def _public_docstrings() -> list[tuple[str, str, int, str]]:
    """``(module name, repository path, line of the docstring's first line, docstring)`` of every public module,
    class, function and method of the package (no leading underscore in its dotted path)."""
    import ast

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        parts = path.relative_to(REPO).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if any(p.startswith("_") for p in parts):
            continue

        def visit(node, public: bool):
            if public and node.body and isinstance(node.body[0], ast.Expr) \
                    and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str):
                found.append((".".join(parts), rel, node.body[0].lineno, node.body[0].value.value))
            for child in node.body:
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(child, public and not child.name.startswith("_"))

        visit(ast.parse(path.read_text()), True)
    return found


def _literal_blocks(doc: str) -> list[tuple[int, str, list[str]]]:
    """``(line offset, introducing line, lines)`` of each literal block of a docstring: the indented lines after
    a line ending in ``::``, and the lines of a fenced block (the fence's first line introduces it)."""
    lines = doc.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
            blocks.append((i, line.strip(), lines[i + 1:end]))
            i = end + 1
        elif line.rstrip().endswith("::"):
            indent = len(line) - len(line.lstrip()) if i else 0
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
                end += 1
            blocks.append((i, line.strip(), lines[i + 1:end]))
            i = end
        else:
            i += 1
    return blocks


def _is_python_example(lines: list[str]) -> bool:
    """Whether a literal block is Python code that does something (it parses, and calls, assigns, loops or
    opens a ``with``), as opposed to a data layout, a wire format or a JSON document."""
    import ast
    import textwrap

    text = textwrap.dedent("\n".join(lines)).strip()
    if not text or text.startswith(">>>"):
        return False
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.Call, ast.Assign, ast.With, ast.For, ast.Import, ast.ImportFrom))
               for n in ast.walk(tree))


def _doctests() -> list:
    """``pytest.param((module, path, line, docstring), id="path:line")`` for every docstring with ``>>>``
    examples (the line is that of its first example)."""
    import doctest

    params = []
    for module, rel, line, doc in _public_docstrings():
        examples = doctest.DocTestParser().get_examples(doc)
        if examples:
            first = line + examples[0].lineno
            slow = [pytest.mark.slow] if any(f"gs://{place}" in doc for place in RUN_PLACES) else []
            params.append(pytest.param((module, rel, line, doc), id=f"{rel}:{first}", marks=slow))
    return params


def _run_doctest(module: str, rel: str, line: int, doc: str, extra: dict | None = None) -> tuple[int, int, int, str]:
    """Run one docstring's examples in this process, in the module's namespace plus ``extra`` (e.g. ``spark``),
    with :data:`REWRITES` applied: ``(examples, failed, skipped, report)``."""
    import doctest
    import importlib
    import io

    for place, here in REWRITES.items():
        doc = doc.replace(place, here)
    globs = {**vars(importlib.import_module(module)), **(extra or {})}
    test = doctest.DocTestParser().get_doctest(doc, globs, f"{module} ({rel}:{line})", str(REPO / rel), line - 1)
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=report.write)
    skipped = sum(1 for e in test.examples if e.options.get(doctest.SKIP))
    return len(test.examples), runner.failures, skipped, report.getvalue()


@pytest.fixture(scope="module")
def kaggle_tree(tmp_path_factory) -> Path:
    """The small synthetic Kaggle tree the examples' ``/data/kaggle`` stands for."""
    from data_util import small_layout

    return small_layout(tmp_path_factory.mktemp("docs-data") / "kaggle")


@pytest.fixture(scope="module")
def trained_run(kaggle_tree, spark, tmp_path_factory) -> dict[str, Path]:
    """``{"shards": folder, "run": folder}``: :func:`kaggle_tree` sharded (2 train, 1 val shards), and the
    ``--output`` of a ``train`` on it (2 workers, 1 epoch, alexnet of width 0.25 at 72 px): what
    :data:`RUN_PLACES` name."""
    from spark_imagenet.dataset.sharding import shard
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.job.config import TrainConfig

    base = tmp_path_factory.mktemp("docs-run")
    shard(kaggle_tree, base / "shards", train_shards=2, val_shards=1, processes=1, progress=False)
    train(spark, str(base / "shards"), TrainConfig(workers=2, epochs=1, batch_size=4, image_size=72, width=0.25,
                                                   cache=base / "cache", output=str(base / "run")))
    return {"shards": base / "shards", "run": base / "run"}


def _run_doctests_in_tmp(examples: list) -> list:
    """:func:`_run_doctest` of each ``(module, path, line, docstring)``, each in a fresh temporary working
    directory: what the Python of :func:`own_process_results` runs."""
    import os
    import tempfile

    results = []
    for example in examples:
        with tempfile.TemporaryDirectory() as here:
            os.chdir(here)
            results.append(_run_doctest(*example))
    return results


@pytest.fixture(scope="module")
def own_process_results(kaggle_tree) -> dict:
    """``{(path, line): (examples, failed, skipped, report)}`` of the docstrings of the modules under
    :data:`OWN_PROCESS`, all run in one Python of their own (one TensorFlow import for them all)."""
    import subprocess
    import sys

    examples = [[module, rel, line, doc.replace("/data/kaggle", str(kaggle_tree))]
                for module, rel, line, doc in (p.values[0] for p in _doctests()) if module.startswith(OWN_PROCESS)]
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_docs; "
            "print(json.dumps(test_docs._run_doctests_in_tmp(json.loads(sys.stdin.read()))))")
    done = subprocess.run([sys.executable, "-c", code, str(REPO / "tests")], input=json.dumps(examples),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {(rel, line): tuple(result) for (_, rel, line, _), result in
            zip(examples, json.loads(done.stdout.splitlines()[-1]))}


@pytest.mark.parametrize("example", _doctests())
def test_docstring_examples_run(example, kaggle_tree, tmp_path, monkeypatch, request):
    """Every docstring's ``>>>`` examples give the outputs they show, in a fresh working directory, with the
    places named in :data:`REWRITES` local and ``spark`` the tests' shared session; the modules under
    :data:`OWN_PROCESS` in a Python of their own."""
    module, rel, line, doc = example
    doc = doc.replace("/data/kaggle", str(kaggle_tree))
    monkeypatch.chdir(tmp_path)
    for place, what in RUN_PLACES.items():
        if f"gs://{place}" in doc:
            (tmp_path / place).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / place).symlink_to(request.getfixturevalue("trained_run")[what])
    if module.startswith(OWN_PROCESS):
        total, failed, skipped, report = request.getfixturevalue("own_process_results")[rel, line]
    else:
        extra = {"spark": request.getfixturevalue("spark")} if re.search(r"\bspark[.,)]", doc) else {}
        total, failed, skipped, report = _run_doctest(module, rel, line, doc, extra)
    assert not failed, f"{rel}:{line}: {failed} of {total} examples fail:\n{report}"
    if skipped == total:
        pytest.skip(f"{rel}:{line}: all {total} examples are marked +SKIP")


def test_python_examples_are_doctests():
    """A literal block of Python in a public docstring is written as ``>>>`` examples, so that
    :func:`test_docstring_examples_run` runs it."""
    bare = [f"{rel}:{line + offset} ({intro})" for _, rel, line, doc in _public_docstrings()
            for offset, intro, lines in _literal_blocks(doc) if _is_python_example(lines)]
    assert not bare, f"Python examples not in doctest form (>>>): {bare}"


def _command_lines(lines: list[str]) -> list[list[str]]:
    """The words of each ``spark-imagenet ...`` and ``python -m spark_imagenet...`` command of a block: continued
    lines (a trailing backslash) joined, a ``$ `` prompt and ``#`` comments dropped, and in a usage table the
    description after a run of two or more spaces."""
    import shlex

    commands = []
    for raw in "\n".join(lines).replace("\\\n", " ").splitlines():
        line = raw.strip().removeprefix("$ ")
        if line.startswith(("spark-imagenet ", "python -m spark_imagenet")) and not line.split()[1].endswith(":"):
            commands.append(shlex.split(re.split(r"\s{2,}(?!-)", line)[0], comments=True))
    return commands


def _cli_error(words: list[str]) -> str | None:
    """Why the command line ``words`` is not one the package accepts, or None: ``spark-imagenet ...`` by the
    CLI's parser, ``python -m MODULE ...`` by the module's existence."""
    import contextlib
    import importlib.util
    import io

    if words[0] == "python":
        module = words[2]
        return None if importlib.util.find_spec(module) else f"no module {module}"
    from spark_imagenet.cli import build_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            build_parser().parse_args(words[1:])
    except SystemExit as exit:
        return None if exit.code == 0 else stderr.getvalue().strip().splitlines()[-1:]
    return None


def _docstring_commands() -> list:
    """``pytest.param(words, id="path:line")`` of each command line in a literal block of a public docstring."""
    params = []
    for _, rel, line, doc in _public_docstrings():
        for offset, _, lines in _literal_blocks(doc):
            for words in _command_lines(lines):
                params.append(pytest.param(words, id=f"{rel}:{line + offset}:{words[1]}"))
    return params


@pytest.mark.parametrize("words", _docstring_commands())
def test_docstring_command_lines_parse(words):
    """Each command line a docstring shows is accepted by the command line's parser (placeholders in capitals
    are values to it)."""
    assert _cli_error(words) is None, f"{' '.join(words)}: {_cli_error(words)}"


# ---------------------------------------------------------------------------------------------------------------
# The README's ```python blocks (issue 42): each runs, in a fresh working directory, with :data:`REWRITES` and
# :data:`README_PLACES` applied; a block using ``spark`` runs here with the tests' session (``spark_imagenet``
# imported), any other in a Python of its own (TensorFlow's state outlives a test). A block that reads a run's
# ``--output`` is in the slow tier (:func:`trained_run`).

#: What the README's blocks name for a run's ``--output``, a photo and a table of photos, and what they are here
#: (``{run}``, ``{tree}``: :func:`trained_run`'s run and :func:`kaggle_tree`).
README_PLACES = {"/tmp/mini-run": "{run}", "cat.jpg": "{tree}/ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_00000001.JPEG",
                 'spark.read.table("ml.photos")':
                     'spark.read.format("binaryFile").load("{tree}/ILSVRC/Data/CLS-LOC/test")'}
#: README blocks that cannot run here, by a phrase of theirs, and why.
README_NOT_RUN = {
    "mlflow.pyfunc.load_model": "needs an MLflow server holding a model registered by a train "
                                "(tests/test_mlflow.py loads one)",
    "TrainConfig(workers=8, epochs=90)": "ImageNet on 8 workers (the same call, small: launch.py's train example)",
}


def _readme_blocks() -> list:
    """``pytest.param(code, id="README.md:line")`` of each ```python block of the README (marked slow when it
    reads a run's ``--output``)."""
    lines = README.read_text().splitlines()
    params = []
    for i, line in enumerate(lines):
        if line.strip() == "```python":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            code = "\n".join(lines[i + 1:end])
            slow = [pytest.mark.slow] if "/tmp/mini-run" in code else []
            params.append(pytest.param(code, id=f"README.md:{i + 1}", marks=slow))
    return params


@pytest.mark.parametrize("code", _readme_blocks())
def test_readme_python_blocks_run(code, kaggle_tree, tmp_path, monkeypatch, request):
    """Every ```python block of the README runs without an error, but those of :data:`README_NOT_RUN`."""
    import subprocess
    import sys

    reason = next((why for phrase, why in README_NOT_RUN.items() if phrase in code), None)
    if reason:
        pytest.skip(f"not run here: {reason}")
    run = request.getfixturevalue("trained_run")["run"] if "/tmp/mini-run" in code else None
    for place, here in {**REWRITES, **README_PLACES}.items():
        code = code.replace(place, here.format(run=run, tree=kaggle_tree))
    monkeypatch.chdir(tmp_path)
    if re.search(r"\bspark[.,)]", code):
        import spark_imagenet

        exec(compile(code, "README.md", "exec"), {"spark": request.getfixturevalue("spark"),
                                                  "spark_imagenet": spark_imagenet})
    else:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"README block fails:\n{code}\n{done.stderr[-3000:]}"
