"""The public API of ``spark_imagenet``: its names, lazily imported, visible to dir() and type checkers."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import spark_imagenet
import spark_imagenet.errors

REPO = Path(__file__).resolve().parents[1]
INIT = REPO / "spark_imagenet" / "__init__.py"


def test_the_main_names_import_without_spark_or_tensorflow():
    code = ("import json, sys\nfrom spark_imagenet import Result, TrainConfig, ConfigError, RunConfig, train\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'pyspark', 'py4j', 'tensorflow', 'tf_keras', 'keras'})))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == []


def test_every_name_of_all_resolves_and_dir_lists_it():
    listed = dir(spark_imagenet)
    for name in spark_imagenet.__all__:
        assert name in listed, name
        assert getattr(spark_imagenet, name) is not None, name
    assert spark_imagenet.Result.from_path and spark_imagenet.TrainConfig(workers=1).recipe == spark_imagenet.RecipeConfig()


def test_all_names_the_lazy_names_and_the_errors_once():
    assert len(set(spark_imagenet.__all__)) == len(spark_imagenet.__all__)
    assert set(spark_imagenet._LAZY) <= set(spark_imagenet.__all__)


def test_every_public_error_is_exported():
    errors = {name for name, value in vars(spark_imagenet.errors).items()
              if inspect.isclass(value) and issubclass(value, spark_imagenet.errors.SparkImagenetError)
              and not name.startswith("_")}
    assert "ConfigError" in errors and errors <= set(spark_imagenet.__all__)
    assert all(getattr(spark_imagenet, name) is getattr(spark_imagenet.errors, name) for name in errors)


def test_type_checkers_see_every_lazy_name():
    """The ``if TYPE_CHECKING:`` block imports each name of ``_LAZY`` from the module ``__getattr__`` uses."""
    tree = ast.parse(INIT.read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    imported = {alias.name: (node.module, alias.name) for node in block.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == spark_imagenet._LAZY


def test_the_wheel_ships_py_typed():
    assert (REPO / "spark_imagenet" / "py.typed").is_file()
    with open(REPO / "pyproject.toml", "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["spark_imagenet"]
