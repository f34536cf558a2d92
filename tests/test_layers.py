"""The package's architecture: its layers, a driver side without TensorFlow, public
names no module shadows, functions of at most 100 lines, docstrings that cite only
what ships with the repository."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "spark_imagenet"

#: The folder of the TensorFlow worker process; every other module runs in the driver or a barrier task.
TENSORFLOW_SIDE = "spark_imagenet.training.worker"


def package_modules() -> list[str]:
    """Every module of the package, by dotted name."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def fresh_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_import_linter_contracts_hold():
    """The layers and the no-TensorFlow contract of pyproject.toml ([tool.importlinter])."""
    lint = Path(sys.executable).with_name("lint-imports")
    p = subprocess.run([str(lint) if lint.exists() else "lint-imports", "--no-cache"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    contracts = (REPO / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert f"{contracts} kept, 0 broken" in p.stdout


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module at any depth (functions, classes, ``try``), but those under
    ``if TYPE_CHECKING:`` (its ``else`` branch counts)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        children = node.orelse if isinstance(node, ast.If) and _is_type_checking(node) else ast.iter_child_nodes(node)
        todo.extend(children)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module of the package: line}}``: every import of a module of the package by another,
    deferred ones included; relative imports resolved, ``from pkg import submodule`` taken as the submodule."""
    paths = {name: path for name, path in zip(package_modules(), sorted(PACKAGE.rglob("*.py")))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in paths.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges = graph.setdefault(name, {})
        for node in _import_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else node.module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            for target in targets:
                while target and target not in paths:  # ``import a.b.c`` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it (the first repeated at the end), or None."""
    state: dict[str, str] = {}
    for start in sorted(graph):
        if start in state:
            continue
        path, todo = [start], [iter(sorted(graph[start]))]
        state[start] = "open"
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                todo.pop()
            elif state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                todo.append(iter(sorted(graph.get(nxt, {}))))
    return None


def test_the_cycle_finder_sees_deferred_and_relative_imports(tmp_path, monkeypatch):
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) is None
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"b": 4}}) == ["b", "c", "b"]
    tree = ast.parse("import x\nif TYPE_CHECKING:\n    import hidden\nelse:\n    import shown\n"
                     "def f():\n    from . import y\n")
    assert sorted(ast.unparse(n) for n in _import_nodes(tree)) == ["from . import y", "import shown", "import x"]


def test_no_import_cycle_in_the_package_deferred_imports_included():
    """No module of the package imports itself through others, counting imports inside functions too
    (``python -m pytest tests/test_layers.py -k cycle``)."""
    graph = import_graph()
    assert "spark_imagenet.training.job.config" in graph["spark_imagenet.training.job.checkpoints"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_driver_side_modules_do_not_import_tensorflow():
    driver_side = [m for m in package_modules()
                   if m.split(".")[:3] != TENSORFLOW_SIDE.split(".") and m != "spark_imagenet.__main__"]
    assert "spark_imagenet.training.driver.launch" in driver_side and "spark_imagenet.cli" in driver_side
    code = ("import importlib, json, sys\n"
            f"for name in {driver_side!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras', 'keras'))))")
    p = fresh_python(code)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == []


def test_importing_every_module_changes_no_process_wide_state():
    """No variable of os.environ and no sys.meta_path hook after importing every module of the package."""
    code = ("import importlib, os, pkgutil, sys, spark_imagenet\n"
            "env, hooks = dict(os.environ), list(sys.meta_path)\n"
            "for m in pkgutil.walk_packages(spark_imagenet.__path__, 'spark_imagenet.'):\n"
            "    if m.name != 'spark_imagenet.__main__':\n"
            "        importlib.import_module(m.name)\n"
            "ours = ('TF_USE_LEGACY_KERAS', 'TF_CPP_MIN_LOG_LEVEL')\n"  # TensorFlow's own import changes others
            "print(all(os.environ.get(k) == env.get(k) for k in ours),\n"
            "      [h for h in sys.meta_path if type(h).__module__.startswith('spark_imagenet')] == [])")
    p = fresh_python(code)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-2:] == ["True", "True"], p.stdout


def test_train_help_does_not_import_tensorflow():
    code = ("import sys\nfrom spark_imagenet.cli import main\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('TF', 'tensorflow' in sys.modules, 'tf_keras' in sys.modules)")
    p = fresh_python(code)
    assert p.returncode == 0, p.stderr
    assert "--print-config" in p.stdout and p.stdout.strip().endswith("TF False False")


@pytest.mark.slow
def test_public_functions_are_never_shadowed_by_modules():
    """``spark_imagenet.train`` / ``.shard`` / ``.inspect`` stay functions after every module is imported."""
    code = ("import importlib, json, spark_imagenet\n"
            "before = {n: type(getattr(spark_imagenet, n)).__name__ for n in spark_imagenet.__all__}\n"
            f"for name in {package_modules()!r}:\n"
            "    if name != 'spark_imagenet.__main__':\n"
            "        importlib.import_module(name)\n"
            "after = {n: type(getattr(spark_imagenet, n)).__name__ for n in spark_imagenet.__all__}\n"
            "print(json.dumps([before, after]))")
    p = fresh_python(code)
    assert p.returncode == 0, p.stderr
    before, after = json.loads(p.stdout)
    assert before == after
    for name in ("shard", "inspect", "train", "run_demo", "open_storage"):
        assert after[name] == "function", name
    assert after["Manifest"] == "type"
    import spark_imagenet.errors

    assert spark_imagenet.errors.SparkImagenetError


def test_no_function_is_longer_than_100_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 100:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


@pytest.mark.parametrize("name", ["FIELD-NOTES", "contracts.md"])
def test_the_package_cites_only_what_ships_with_it(name):
    hits = [str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py") if name in p.read_text()]
    assert not hits, hits


def test_cited_design_sections_exist():
    """Every ``docs/design.md, 'Section'`` cited in the package is a heading of docs/design.md."""
    import re

    headings = {ln[3:].strip() for ln in (REPO / "docs" / "design.md").read_text().splitlines() if ln.startswith("## ")}
    cited = set()
    for path in PACKAGE.rglob("*.py"):
        text = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text())
        cited.update(re.findall(r"docs/design\.md, '([^']+)'", text))
    assert cited, "the package cites no design section"
    assert cited <= headings, sorted(cited - headings)
