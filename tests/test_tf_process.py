"""The environment of a process that imports TensorFlow, made by one function (training/job/tf_process.py)."""

import ast
from pathlib import Path

from spark_imagenet.training.job.tf_process import tensorflow_environment

PACKAGE = Path(__file__).resolve().parent.parent / "spark_imagenet"


def test_keras_2_always_and_the_log_level_a_default():
    env = tensorflow_environment({"TF_USE_LEGACY_KERAS": "0", "PATH": "/bin"})
    assert env == {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/bin"}
    assert tensorflow_environment({"TF_CPP_MIN_LOG_LEVEL": "0"})["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_a_log_level_given_wins_and_base_is_not_changed():
    base = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    assert tensorflow_environment(base, log_level="3")["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert base == {"TF_CPP_MIN_LOG_LEVEL": "0"}


def test_the_variable_is_named_in_code_once():
    """Every process that imports TensorFlow gets TF_USE_LEGACY_KERAS from tensorflow_environment, nowhere else."""
    places = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
              for path in sorted(PACKAGE.rglob("*.py"))
              for node in ast.walk(ast.parse(path.read_text(), str(path)))
              if isinstance(node, ast.Constant) and node.value == "TF_USE_LEGACY_KERAS"]
    assert [place.split(":")[0] for place in places] == ["training/job/tf_process.py"], places
