"""The argument parser of every ``spark-imagenet`` command: an option error is two lines, not the usage.

argparse prints a command's whole usage (for ``train``, about 30 lines) before the one line that says what
was wrong. :class:`ArgumentParser` prints that line and where the options are described instead::

    spark-imagenet train: error: argument --epochs: 'x' is not an integer
    spark-imagenet train: see 'spark-imagenet train --help' for the options

The ``evaluate`` and ``predict`` commands (run in a child Python, :mod:`spark_imagenet.training.worker`) use it
too, and the option types the commands share (:func:`int_at_least`, :func:`positive_float`, ...). It imports
neither Spark nor TensorFlow.
"""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

#: The exit status of an option error (argparse's own).
USAGE_ERROR = 2


class ArgumentParser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` whose option errors are the error and a pointer to ``--help``.

    Sub-command parsers made with ``add_subparsers`` are of this class too (argparse makes them of
    the parent's class).
    """

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 - argparse's signature
        """:meth:`argparse.ArgumentParser.parse_args`, with an unknown option reported by the sub-command it
        was given to (``spark-imagenet train: error: unrecognized arguments: ...``), not by the top parser."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self._chosen(namespace).error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def _chosen(self, namespace: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost sub-command parser that ``namespace`` was parsed with (this one when none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):  # what add_subparsers returns
                chosen = action.choices.get(getattr(namespace, action.dest, None))
                if chosen is not None:
                    return chosen._chosen(namespace) if isinstance(chosen, ArgumentParser) else chosen
        return self

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE`` and ``PROG: see 'PROG --help' for the options``, exit with status 2."""
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n{self.prog}: see '{self.prog} --help' for the "
                               "options\n")


def int_at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        return value

    return parse


#: An argparse type: an integer >= 1.
positive_int = int_at_least(1)
#: An argparse type: an integer >= 0.
nonnegative_int = int_at_least(0)


def _finite_float(minimum_allowed: bool, bound: str):
    """An argparse type: a finite number above 0 (``minimum_allowed``: or equal), ``bound`` saying which."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or not (value >= 0 if minimum_allowed else value > 0):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number{bound}")
        return value

    return parse


#: An argparse type: a finite number greater than 0.
positive_float = _finite_float(False, " greater than 0")
#: An argparse type: a finite number, 0 or more.
nonnegative_float = _finite_float(True, ", 0 or more")


def _key_value(example: str):
    """An argparse type: ``KEY=VALUE`` as ``(key, value)``, its error showing ``example``."""
    def parse(text: str) -> tuple[str, str]:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. {example}")
        return key.strip(), value.strip()

    return parse


#: An argparse type: ``KEY=VALUE`` (an MLflow tag) as ``(key, value)``.
tag_pair = _key_value("team=vision")
#: An argparse type: ``KEY=VALUE`` (a Spark setting) as ``(key, value)``.
conf_pair = _key_value("spark.executor.memory=4g")
