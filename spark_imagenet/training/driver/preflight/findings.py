"""What a check before the barrier stage found: :class:`Finding`, and the :class:`Findings` of a phase.

A check returns its finding instead of raising or logging: ``ok`` (what it saw), ``warning`` (the job runs,
but the user should know) or ``problem`` (the job must not start; the finding carries the error to raise, of
the class and with the message the user sees). The caller decides what to do with them: the driver raises
the first problem and logs the warnings (:meth:`Findings.raise_if_problems`, :meth:`Findings.log_warnings`),
``spark-imagenet doctor`` prints every finding under its check's name.

Example::

    >>> import logging
    >>> findings = Findings([Finding.ok("barrier slots", "4 (executor cores / spark.task.cpus=1)"),
    ...                      Finding.warning("encryption", "Spark's network encryption is on, ...")])
    >>> findings.raise_if_problems()            # no problem here: the findings back
    (Finding(check='barrier slots', level='ok', ...), Finding(check='encryption', level='warning', ...))
    >>> findings.log_warnings(logging.getLogger("spark_imagenet"))   # logs "warning: Spark's network ..."
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterable, Literal

from spark_imagenet.errors import ConfigError, SparkImagenetError

#: The levels of a finding, from harmless to fatal.
Level = Literal["ok", "warning", "problem"]
LEVELS = ("ok", "warning", "problem")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One check's result.

    Attributes:
        check: the check's name, as ``doctor`` prints it (``barrier slots``, ``encryption``, ``gpu settings``, ...).
        level: ``ok``, ``warning`` or ``problem``.
        message: what was found; for a problem, the error's message (what to change); for a warning, the text
            logged after ``warning: ``.
        error: a problem's error, raised by :meth:`raise_if_problem` (its class and attributes kept:
            :class:`~spark_imagenet.errors.ConfigError`, :class:`~spark_imagenet.errors.ManifestError`, ...);
            None for the other levels. Not compared.

    Raises:
        ValueError: a level not in :data:`LEVELS`, or a problem without its error.
    """

    check: str
    level: Level
    message: str
    error: SparkImagenetError | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"a finding's level is one of {', '.join(LEVELS)}, got {self.level!r}")
        if (self.level == "problem") != (self.error is not None):
            raise ValueError("a problem, and only a problem, carries the error to raise")

    @classmethod
    def ok(cls, check: str, message: str = "") -> Finding:
        """A check that found nothing to say against the job; ``message`` says what it saw."""
        return cls(check, "ok", message)

    @classmethod
    def warning(cls, check: str, message: str) -> Finding:
        """A check whose finding the user should read; the job runs. ``message`` without ``warning: ``."""
        return cls(check, "warning", message)

    @classmethod
    def problem(cls, check: str, error: SparkImagenetError | str, *, key: str | None = None,
                value: object = None) -> Finding:
        """A check that refuses the job.

        Args:
            check: the check's name.
            error: the error to raise, or its message (a :class:`~spark_imagenet.errors.ConfigError`).
            key, value: for a message: the setting at fault and its value, kept by the ConfigError.
        """
        if isinstance(error, str):
            error = ConfigError(error, key=key, value=value)
        return cls(check, "problem", str(error), error)

    @classmethod
    def of(cls, check: str, run: Callable[[], object], ok: str = "") -> Finding:
        """The finding of a step that raises its refusal (a manifest read, a listing compared): ``ok`` when
        ``run()`` returns, else a problem carrying the :class:`~spark_imagenet.errors.SparkImagenetError` it
        raised (other exceptions pass through)."""
        try:
            run()
        except SparkImagenetError as e:
            return cls.problem(check, e)
        return cls.ok(check, ok)

    @property
    def line(self) -> str:
        """The finding as the driver logs it: ``warning: <message>`` for a warning, else the message."""
        return f"warning: {self.message}" if self.level == "warning" else self.message

    def raise_if_problem(self) -> Finding:
        """Raise a problem's error; return the finding otherwise.

        Raises:
            SparkImagenetError: :attr:`error`, for a problem.
        """
        if self.error is not None:
            raise self.error.with_traceback(None)
        return self


class Findings(tuple):
    """The findings of one phase of checks, in the order they were made (a tuple of :class:`Finding`).

    Args:
        findings: the findings; None items (a check with nothing to look at) are left out.
    """

    def __new__(cls, findings: Iterable[Finding | None] = ()) -> Findings:
        return super().__new__(cls, tuple(f for f in findings if f is not None))

    def __add__(self, other: Iterable[Finding]) -> Findings:
        return Findings([*self, *other])

    @property
    def problems(self) -> tuple[Finding, ...]:
        """tuple[Finding, ...]: the problems, in order."""
        return tuple(f for f in self if f.level == "problem")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        """tuple[Finding, ...]: the warnings, in order."""
        return tuple(f for f in self if f.level == "warning")

    def named(self, check: str) -> tuple[Finding, ...]:
        """The findings of the check named ``check``."""
        return tuple(f for f in self if f.check == check)

    def raise_if_problems(self) -> Findings:
        """Raise the first problem's error (its own class and message); return these findings when none.

        Raises:
            SparkImagenetError: the first problem's :attr:`Finding.error`.
        """
        for finding in self.problems:
            finding.raise_if_problem()
        return self

    def log_warnings(self, logger: logging.Logger) -> None:
        """Log each warning as ``warning: <message>`` (level WARNING), in order."""
        for finding in self.warnings:
            logger.warning(finding.line)
