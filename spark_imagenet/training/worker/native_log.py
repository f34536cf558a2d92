"""TensorFlow's native log lines while ``import tensorflow`` runs: the level asked for, each line once.

TensorFlow 2.21 logs through absl, which writes every message to stderr until
``absl::InitializeLog()`` runs, whatever ``TF_CPP_MIN_LOG_LEVEL`` says; and
``import tensorflow`` loads two shared libraries that each carry their own copy
of the oneDNN check (``_pywrap_tensorflow_internal.so`` and
``_pywrap_profiler_plugin.so``), so a process printed "oneDNN custom operations
are on ..." (and "Could not find cuda drivers ...") twice, each after absl's
"WARNING: All log messages before absl::InitializeLog() ..." (docs/design.md,
'The environment of executors').

:func:`install` makes the first ``import tensorflow`` of the process write its
file descriptor 2 into a temporary file, then passes on what
:func:`filter_native_log` keeps: lines below the ``TF_CPP_MIN_LOG_LEVEL``
severity and absl's preamble dropped, any line repeated in the same words
dropped, everything else (Python warnings, TensorFlow's errors, anything not
in absl's format) unchanged and in order.

:func:`filtered_stderr` is the same filter around any block of code; with ``cpu_only`` it also drops
TensorFlow's CUDA start-up lines (:func:`spark_imagenet.training.job.gpus.is_cpu_startup_line`, e.g.
``failed call to cuInit`` at the first op), as an executor's batch inference does on a host without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

from spark_imagenet.training.job.gpus import is_cpu_startup_line
from spark_imagenet.training.worker.import_hooks import around_import

#: absl's line prefix: severity letter, date, time, thread id, ``file:line]``.
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([^\]]+\] .*)$")
#: The line absl writes before its first message while uninitialized.
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
#: ``TF_CPP_MIN_LOG_LEVEL`` value -> the lowest severity shown (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL only).
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}


def min_log_level() -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it: an integer 0..3 (0 when unset or not a number)."""
    try:
        return max(0, min(3, int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))))
    except ValueError:
        return 0


def filter_native_log(text: str, min_level: int, cpu_only: bool = False) -> str:
    """The lines of ``text`` (what the native libraries wrote) that TensorFlow's log level lets through, once each.

    Args:
        text: stderr output, lines ending in ``\\n``.
        min_level: ``TF_CPP_MIN_LOG_LEVEL``: absl lines of a lower severity are dropped
            (0: none dropped; 2: INFO and WARNING dropped, ERROR and FATAL kept).
        cpu_only: also drop TensorFlow's CUDA start-up lines
            (:func:`~spark_imagenet.training.job.gpus.is_cpu_startup_line`), whatever their severity: for a
            process with no GPU on a host without one.

    Returns:
        str: ``text`` without absl's preamble line, the absl lines below ``min_level``, any absl line
        whose ``file:line] message`` part appeared before and (``cpu_only``) the CUDA start-up lines; all other
        lines unchanged, in order.

    Example::

        >>> filter_native_log("I0000 00:00:1.5  7 port.cc:153] oneDNN ...\\n", 2)
        ''
    """
    seen: set[str] = set()
    kept = []
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\n")
        if stripped == _ABSL_PREAMBLE or (cpu_only and is_cpu_startup_line(stripped)):
            continue
        match = _ABSL_LINE.match(stripped)
        if match:
            if _SEVERITY[match.group(1)] < min_level or match.group(2) in seen:
                continue
            seen.add(match.group(2))
        kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def filtered_stderr(cpu_only: bool = False) -> Iterator[None]:
    """Context manager: what is written to file descriptor 2 inside passes through :func:`filter_native_log`.

    The output is held in a temporary file and written to the real stderr when the block ends (normally or
    with an exception), so its lines come out together, after the block. Where no temporary file can be
    made (an unwritable ``$TMPDIR``), nothing is filtered.

    Args:
        cpu_only: passed to :func:`filter_native_log` (drop TensorFlow's CUDA start-up lines).
    """
    try:
        held_file = tempfile.TemporaryFile()
    except OSError:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with held_file as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = filter_native_log(held.read().decode("utf-8", "replace"), min_log_level(), cpu_only)
            if text:
                sys.stderr.write(text)
                sys.stderr.flush()


def install() -> bool:
    """Filter the native log lines of this process's first ``import tensorflow`` (see the module docstring).

    Returns:
        bool: True when the filter is in place for the first import; False when TensorFlow is already
        imported (nothing to do) or the filter is already installed.
    """
    return around_import("tensorflow", filtered_stderr)
