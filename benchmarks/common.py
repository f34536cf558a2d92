"""What every benchmark script shares: ``--quick``, ``--reps``, ``--json``, the statistics and the JSON record.

A script adds the shared options with :func:`add_options`, measures each thing ``reps`` times and hands the
values to a :class:`Report`, which prints one human line per measurement and, with ``--json``, one JSON object
per line (to stdout, or to the file given) with exactly the keys of :data:`RECORD_KEYS`:

* ``benchmark`` (str): the script's short name (``launch``, ``shard``, ...).
* ``measurement`` (str): what was measured, e.g. ``"ours cold: call to first step"``.
* ``unit`` (str): ``"s"``, ``"ms"``, ``"images/s"``, ``"MB/s"`` and ``"MB"`` (10**6 bytes), ``"x"`` (a ratio), ``"h"``...
* ``median``, ``min``, ``max`` (float): over the repetitions; ``spread`` (float): ``(max - min) / median``,
  the relative spread (0.0 for one repetition or a derived number).
* ``reps`` (int) and ``values`` (list[float]): the repetitions themselves.
* ``kind`` (str): ``"measured"`` (repetitions of a timing), ``"ratio"`` (per-repetition ratios of two measured
  series of one run; the median of those ratios) or ``"derived"`` (computed from measured medians, e.g. a
  projection; ``values`` then holds the one number).
* ``params`` (dict): the settings of this measurement (sizes, counts, the alternative compared against).
* ``quick`` (bool), ``date`` (ISO 8601, UTC), ``commit`` (the checkout's git commit or None),
  ``machine`` (:func:`machine`) and ``versions`` (:func:`versions`).

Repetitions are interleaved by the scripts where two things are compared (A, B, A, B, ...), so that drifting
load from other processes on a shared machine hits both alike; the ratio of one run is what a claim rests on,
not an absolute time (see BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

#: The keys of every JSON record, in order.
RECORD_KEYS = ("benchmark", "measurement", "unit", "kind", "median", "min", "max", "spread", "reps", "values",
               "params", "quick", "date", "commit", "machine", "versions")

#: The distributions whose versions every record names (absent ones are left out).
DISTRIBUTIONS = ("spark-imagenet", "tensorflow", "tf-keras", "pyspark", "pillow", "google-cloud-storage",
                 "spark-tensorflow-distributor", "numpy")

#: Repetitions of a full run (the issue's floor: at least 5).
FULL_REPS = 5


def add_options(parser: argparse.ArgumentParser, reps: int = FULL_REPS, quick_reps: int = 2) -> None:
    """Add ``--quick``, ``--reps`` and ``--json`` to ``parser``.

    Args:
        parser: the script's parser.
        reps: default repetitions of a full run (at least :data:`FULL_REPS`).
        quick_reps: repetitions with ``--quick`` when ``--reps`` is not given.
    """
    parser.add_argument("--quick", action="store_true",
                        help="a small run that finishes in under a minute (checks the script; its numbers are noise)")
    parser.add_argument("--reps", type=_positive, default=None,
                        help=f"repetitions of each measurement (default: {reps}, with --quick {quick_reps})")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE", type=_json_target,
                        help="write one JSON object per measurement, one per line, to FILE (replaced if it "
                             "exists; default: stdout, the human-readable lines then go to stderr)")
    parser.set_defaults(_full_reps=reps, _quick_reps=quick_reps)


def _positive(text: str) -> int:
    """argparse type of ``--reps``: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1 repetition is needed")
    return value


def _json_target(text: str) -> str:
    """argparse type of ``--json``: ``-`` (stdout) or a file path that can be written, checked before the run
    (so a long run does not lose its records at the end). Its folder is created if missing."""
    if text == "-":
        return text
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file name, e.g. {path / 'records.jsonl'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text} cannot be written: {e.strerror or e}") from None
    return text


def repetitions(args: argparse.Namespace) -> int:
    """The repetitions to run: ``--reps``, else the full or quick default. Raises SystemExit below 1."""
    reps = args.reps if args.reps is not None else (args._quick_reps if args.quick else args._full_reps)
    if reps < 1:
        raise SystemExit(f"--reps {reps}: at least 1 repetition is needed")
    return reps


def machine() -> dict[str, Any]:
    """The machine a record was measured on: CPU model, logical CPUs (all, and those this process may use),
    memory in GiB, the OS and Python, and ``/proc/loadavg``'s 1-minute load when the run started."""
    model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        memory = None
    try:
        load = float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        load = None
    return {"cpu": model, "cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "memory_gib": memory, "os": platform.platform(), "python": platform.python_version(),
            "load_1min": load}


def versions(extra: Iterable[str] = ()) -> dict[str, str]:
    """Installed versions of :data:`DISTRIBUTIONS` and of ``extra`` (distribution name -> version)."""
    found = {}
    for name in (*DISTRIBUTIONS, *extra):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def commit() -> str | None:
    """The git commit of the checkout the scripts run from (with ``+dirty`` if it has changes), or None."""
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def summary(values: Sequence[float]) -> dict[str, float]:
    """``median``, ``min``, ``max`` and the relative ``spread`` ((max - min) / median) of ``values``."""
    if not values:
        raise ValueError("no values to summarize")
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return {"median": med, "min": lo, "max": hi, "spread": (hi - lo) / med if med else 0.0}


class Report:
    """Collects a script's measurements, prints them, and writes the JSON lines of ``--json``.

    Args:
        benchmark: the script's short name (the records' ``benchmark``).
        args: the parsed options (uses ``quick`` and ``json``).
        extra_versions: more distributions to name in ``versions``.
    """

    def __init__(self, benchmark: str, args: argparse.Namespace, extra_versions: Iterable[str] = ()) -> None:
        self.benchmark = benchmark
        self.quick = bool(getattr(args, "quick", False))
        self.target = getattr(args, "json", None)
        self.records: list[dict[str, Any]] = []
        self._context = {"quick": self.quick,
                         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         "commit": commit(), "machine": machine(), "versions": versions(extra_versions)}
        self.human = sys.stderr if self.target == "-" else sys.stdout

    def say(self, text: str) -> None:
        """Print a human-readable line (to stderr when the JSON goes to stdout)."""
        print(text, file=self.human, flush=True)

    def add(self, measurement: str, unit: str, values: Sequence[float], kind: str = "measured",
            **params: Any) -> dict[str, Any]:
        """Record one measurement from its repetitions ``values``; prints its line and returns the record."""
        values = [float(v) for v in values]
        record = {"benchmark": self.benchmark, "measurement": measurement, "unit": unit, "kind": kind,
                  **summary(values), "reps": len(values), "values": values, "params": params, **self._context}
        self.records.append(record)
        spread = f" (min {record['min']:.4g}, max {record['max']:.4g}, {len(values)} reps)" if len(values) > 1 else ""
        self.say(f"{self.benchmark}: {measurement}: {record['median']:.4g} {unit}{spread}")
        return record

    def ratio(self, measurement: str, numerator: Sequence[float], denominator: Sequence[float],
              **params: Any) -> dict[str, Any]:
        """Record the per-repetition ratios ``numerator[i] / denominator[i]`` of two series of this run."""
        if len(numerator) != len(denominator):
            raise ValueError(f"{measurement}: {len(numerator)} and {len(denominator)} repetitions do not pair up")
        return self.add(measurement, "x", [a / b for a, b in zip(numerator, denominator)], kind="ratio", **params)

    def derived(self, measurement: str, unit: str, value: float, **params: Any) -> dict[str, Any]:
        """Record a number computed from measured medians (a projection, a bound)."""
        return self.add(measurement, unit, [value], kind="derived", **params)

    def close(self) -> None:
        """Write the JSON lines (if ``--json`` was given)."""
        if self.target is None:
            return
        lines = "".join(json.dumps(r, sort_keys=False) + "\n" for r in self.records)
        if self.target == "-":
            sys.stdout.write(lines)
            sys.stdout.flush()
        else:
            path = Path(self.target)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(lines)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn()``; returns (wall seconds, its result)."""
    import time

    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def shared_data(name: str) -> Path | None:
    """``../shared/data/NAME`` beside the repository (or under ``$SPARK_IMAGENET_SHARED_DATA``), or None."""
    base = Path(os.environ.get("SPARK_IMAGENET_SHARED_DATA", SHARED / "data"))
    path = base / name
    return path if path.exists() else None
