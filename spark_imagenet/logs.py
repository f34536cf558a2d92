"""The package's log lines: module loggers under ``spark_imagenet``, and the console that shows them.

Every module logs through ``logging.getLogger(__name__)``: progress at INFO, warnings at WARNING (their
text starts with ``warning:``, as the console has always shown them). Nothing here touches the root
logger, and no other library's logger changes level, but MLflow's inside the command line's and the TensorFlow
worker's consoles (:func:`quiet_mlflow`: its INFO lines and run links are not the job's report).

Who shows the lines:

* **The command line** (``spark-imagenet ...``, ``python -m spark_imagenet.submit``) runs inside
  :func:`console`: one :class:`ConsoleHandler` on the ``spark_imagenet`` logger, plain lines (the message
  alone), level INFO, ``propagate`` off (a root handler does not print them twice). The training job's lines
  (loggers under ``spark_imagenet.training``: the driver's summary and the tasks' ``[rank R on HOST]``
  lines) go to stdout, as the job's report; the data side's (``source``, ``dataset``, ``storage``, ``demo``,
  the command line's own) to stderr, beside the path or JSON those commands print on stdout.
* **A library user** (``spark_imagenet.train(spark, ...)`` or ``run_demo`` in a notebook): these call
  :func:`ensure_console`, which installs the same console (for good, :func:`to_console`) only when neither
  the ``spark_imagenet`` logger nor the root logger has a handler: progress shows as it always did with
  no set-up. To take the lines elsewhere, configure logging first, e.g.
  ``logging.basicConfig(level=logging.INFO)`` (the lines then go through the root handler, in its format)
  or a handler of your own on ``logging.getLogger("spark_imagenet")``; to keep progress quiet,
  ``logging.getLogger("spark_imagenet").setLevel(logging.WARNING)`` (a level set there is kept).
* **The barrier task** (a Python worker of an executor) runs inside :func:`task_console`: every line
  ``[rank R] message`` on the task's stderr, which the task also sends to the driver's log channel
  (:mod:`spark_imagenet.training.task.barrier_task`); the driver shows it as ``[rank R on HOST] message``.
* **The TensorFlow worker process** runs inside :func:`worker_console`: plain lines on its stdout, which its
  barrier task reads and passes on with the rank prefix.

Example (a notebook that wants standard logging's format instead of plain lines)::

    >>> import logging, spark_imagenet
    >>> logging.basicConfig(level=logging.INFO)   # then train(spark, ...) logs in its format too
    >>> manifest = spark_imagenet.shard("/data/kaggle", "gs://my-bucket/imagenet", classes=2, processes=1)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Iterator, TextIO

#: The package's top logger; every module's logger is below it.
PACKAGE = "spark_imagenet"
#: Loggers under this name write the training job's report: stdout on the command line's console.
TRAINING = "spark_imagenet.training"


class ConsoleHandler(logging.Handler):
    """Writes each record's message as one plain line, flushed.

    Args:
        stream: ``"stdout"`` or ``"stderr"`` for every record; None: records of loggers under
            :data:`TRAINING` to stdout, the rest to stderr. The stream is looked up when each line is
            written (so ``contextlib.redirect_stderr`` and test capture apply).
        prefix: put before every line, e.g. ``"[rank 0] "``.
    """

    def __init__(self, stream: str | None = None, prefix: str = "") -> None:
        super().__init__(logging.INFO)
        if stream not in (None, "stdout", "stderr"):
            raise ValueError(f"ConsoleHandler stream {stream!r} must be 'stdout', 'stderr' or None")
        self._stream, self._prefix = stream, prefix

    def _target(self, record: logging.LogRecord) -> TextIO:
        name = self._stream or ("stdout" if record.name == TRAINING or record.name.startswith(TRAINING + ".")
                                else "stderr")
        return sys.stdout if name == "stdout" else sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``prefix + message`` and a newline to the record's stream."""
        try:
            out = self._target(record)
            out.write(f"{self._prefix}{record.getMessage()}\n")
            out.flush()
        except Exception:  # noqa: BLE001 - logging's convention: a failed line never raises
            self.handleError(record)


@contextlib.contextmanager
def _only_handler(handler: logging.Handler) -> Iterator[logging.Logger]:
    """While inside, ``handler`` is the only handler of the ``spark_imagenet`` logger, at INFO (unless a level
    was set there), without propagation; the logger's handlers, level and propagation are restored after."""
    logger = logging.getLogger(PACKAGE)
    saved = (logger.handlers[:], logger.level, logger.propagate)
    logger.handlers[:] = [handler]
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])


#: MLflow's settings :func:`quiet_mlflow` makes where the environment has none: its logger's level at import,
#: and no "View run ... at: URL" lines printed on stdout when a run ends.
MLFLOW_QUIET_ENV = (("MLFLOW_LOGGING_LEVEL", "WARNING"), ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true"))


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """While inside, MLflow's own lines stay off the console: the ``mlflow`` logger shows warnings and errors
    only (its INFO lines are not the job's report), and a run's end prints no run and experiment links on stdout
    (the package's own ``mlflow: run ...`` line names the run). Settings of :data:`MLFLOW_QUIET_ENV` the
    environment has are kept (``MLFLOW_LOGGING_LEVEL=INFO`` shows MLflow's lines again); the environment and the
    logger's level are restored after.
    """
    saved_env = {name: os.environ.get(name) for name, _ in MLFLOW_QUIET_ENV}
    for name, value in MLFLOW_QUIET_ENV:
        os.environ.setdefault(name, value)  # MLflow reads them at import and when a run ends
    logger = logging.getLogger("mlflow")
    saved_level = logger.level
    wanted = logging.getLevelName(os.environ["MLFLOW_LOGGING_LEVEL"].strip().upper())
    if isinstance(wanted, int):  # an mlflow imported before: its level set from the environment of then
        logger.setLevel(wanted)
    try:
        yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        logger.setLevel(saved_level)


@contextlib.contextmanager
def _process_console(handler: logging.Handler) -> Iterator[logging.Logger]:
    """:func:`_only_handler` of ``handler`` and :func:`quiet_mlflow` while inside: a process's own console."""
    with quiet_mlflow(), _only_handler(handler) as logger:
        yield logger


def console() -> contextlib.AbstractContextManager[logging.Logger]:
    """The command line's console while inside (see the module docstring), MLflow's own lines kept off it
    (:func:`quiet_mlflow`); restored after.

    Example::

        >>> from spark_imagenet import logs, shard
        >>> with logs.console():   # shard's progress lines on stderr
        ...     manifest = shard("/data/kaggle", "gs://my-bucket/imagenet", classes=2, processes=1)
    """
    return _process_console(ConsoleHandler())


def task_console(rank: int) -> contextlib.AbstractContextManager[logging.Logger]:
    """A barrier task's console while inside: every line ``[rank R] message`` on ``sys.stderr``.

    Args:
        rank: the task's rank (an int >= 0).
    """
    return _only_handler(ConsoleHandler("stderr", prefix=f"[rank {rank}] "))


def worker_console() -> contextlib.AbstractContextManager[logging.Logger]:
    """The TensorFlow worker process's console while inside: every line plain on ``sys.stdout``, MLflow's own
    lines kept off it (:func:`quiet_mlflow`)."""
    return _process_console(ConsoleHandler("stdout"))


def to_console() -> None:
    """Install the command line's console on the ``spark_imagenet`` logger for good (once; calling again
    changes nothing): for a notebook or script that wants the plain lines without configuring logging."""
    logger = logging.getLogger(PACKAGE)
    if any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        return
    logger.addHandler(ConsoleHandler())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False


def ensure_console() -> None:
    """:func:`to_console` when neither the ``spark_imagenet`` logger nor the root logger has a handler (a user
    who configured logging gets the lines through it instead)."""
    if not logging.getLogger(PACKAGE).handlers and not logging.getLogger().handlers:
        to_console()


class _ListHandler(logging.Handler):
    """Appends each record's message to a list."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def collect() -> Iterator[list[str]]:
    """The messages the package logs (INFO and up) while inside, in order, in a list that fills as they
    come: for tests, benchmarks, or a caller that wants the lines as data. Handlers already there still get
    them; nothing more is printed.

    Example::

        >>> from spark_imagenet import logs, shard
        >>> with logs.collect() as lines:
        ...     manifest = shard("/data/kaggle", "gs://my-bucket/imagenet", classes=2, processes=1)
        >>> lines[-1]
        '...'
    """
    logger = logging.getLogger(PACKAGE)
    lines: list[str] = []
    handler = _ListHandler(lines)
    saved = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
