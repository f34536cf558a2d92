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
* ``others_cpu`` (dict or None): the CPU that processes other than this run's own process tree used during the
  run (:func:`others_cpu`): ``cpu_seconds``, ``wall_seconds``, ``core_share`` (others' CPU-seconds per wall
  second: the share of one core), ``limit`` (:data:`OTHERS_LIMIT`), ``quiet`` (``core_share <= limit``),
  ``own_cpu_seconds``, ``own_from`` (``"cgroup"`` or ``"process tree"``: how the run's own CPU was counted,
  see :func:`others_cpu`) and ``top`` (the 3 other processes that used most); None where ``/proc`` cannot be
  read (Linux only). Records committed before this rule lack the key (see BENCHMARKS.md, "Quiet machine rule").

The quiet machine rule: a full run (not ``--quick``) whose others used more than :data:`OTHERS_LIMIT` of a core
writes no record: :meth:`Report.close` prints one message on stderr (how much, and the top 3 other processes)
and exits with status 3 (:data:`NOISY_EXIT`). ``--noisy-ok`` writes the records anyway, marked
``"quiet": false``; ``--quick`` runs record the number and never refuse.

Repetitions are interleaved by the scripts where two things are compared (A, B, A, B, ...), so that drifting
load from other processes on a shared machine hits both alike; the ratio of one run is what a claim rests on,
not an absolute time (see BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

#: The keys of every JSON record, in order.
RECORD_KEYS = ("benchmark", "measurement", "unit", "kind", "median", "min", "max", "spread", "reps", "values",
               "params", "quick", "date", "commit", "machine", "versions", "others_cpu")

#: The keys of the records committed before the quiet machine rule (no ``others_cpu``).
PRE_QUIET_RECORD_KEYS = RECORD_KEYS[:-1]

#: Others' CPU during a full run, as a share of one core (CPU-seconds per wall second), above which the run
#: writes no record.
OTHERS_LIMIT = 0.10

#: The exit status of a full run refused by the quiet machine rule.
NOISY_EXIT = 3

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
    parser.add_argument("--noisy-ok", action="store_true",
                        help=f"write the records even if other processes used more than {OTHERS_LIMIT:g} of a "
                             "core during the run (they are then marked \"quiet\": false; without it such a "
                             f"full run writes nothing and exits {NOISY_EXIT})")
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


# --- the quiet machine rule: the CPU of other processes during a run (Linux /proc) ---------------------------

#: Indexes, after the ``cpu`` label of /proc/stat, of the busy jiffies: user, nice, system, irq, softirq, steal
#: (idle and iowait are 3 and 4; guest and guest_nice are already inside user and nice).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def parse_proc_stat(text: str) -> int:
    """The busy jiffies of all CPUs (user+nice+system+irq+softirq+steal) from the text of ``/proc/stat``.

    Raises:
        ValueError: no aggregate ``cpu`` line.
    """
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            numbers = [int(f) for f in fields[1:]]
            return sum(numbers[i] for i in _BUSY_FIELDS if i < len(numbers))
    raise ValueError("no aggregate 'cpu' line in /proc/stat")



def machine_busy_seconds(proc: Path = Path("/proc")) -> float | None:
    """CPU-seconds all processes of the machine have spent so far (the busy jiffies of
    :func:`parse_proc_stat` over :func:`clock_ticks`), or None where ``/proc/stat`` cannot be read: what a
    script's per-window "cores other processes used" reads."""
    try:
        return parse_proc_stat((proc / "stat").read_text()) / clock_ticks()
    except (OSError, ValueError):
        return None

@dataclass(frozen=True)
class ProcStat:
    """What the quiet machine rule reads from one ``/proc/PID/stat`` (times in clock ticks)."""

    pid: int
    comm: str
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int
    starttime: int

    @property
    def cpu(self) -> int:
        """The process's CPU and that of its children it has waited for: utime+stime+cutime+cstime."""
        return self.utime + self.stime + self.cutime + self.cstime


def parse_pid_stat(text: str) -> ProcStat:
    """Parse one ``/proc/PID/stat`` line. The command name sits in parentheses and may hold spaces and
    parentheses itself, so it runs to the *last* ``)``.

    Raises:
        ValueError: not a stat line.
    """
    head, close, tail = text.rpartition(")")
    pid_text, open_, comm = head.partition(" (")
    if not close or not open_:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    rest = tail.split()  # rest[0] is field 3 (state) of proc(5), so field N is rest[N - 3]
    if len(rest) < 20:
        raise ValueError(f"/proc/PID/stat line too short: {text[:80]!r}")
    return ProcStat(pid=int(pid_text), comm=comm, ppid=int(rest[1]), utime=int(rest[11]), stime=int(rest[12]),
                    cutime=int(rest[13]), cstime=int(rest[14]), starttime=int(rest[19]))


def process_tree(parents: Mapping[int, int], root: int) -> set[int]:
    """``root`` and every process below it, from a map pid -> parent pid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


@dataclass(frozen=True)
class Snapshot:
    """One reading: the wall clock (monotonic seconds), the machine's busy jiffies and every process's stat."""

    wall: float
    busy: int
    procs: Mapping[int, ProcStat]
    group_cpu: float | None = None  #: CPU-seconds of the run's own cgroup (:class:`CpuGroup`), None without one


def own_cpu(snapshot: Snapshot, root: int) -> int:
    """Clock ticks used by the process tree of ``root`` at ``snapshot``: root's utime+stime+cutime+cstime and
    the same of every live descendant (a descendant that ended is in its parent's cutime once waited for)."""
    tree = process_tree({pid: p.ppid for pid, p in snapshot.procs.items()}, root)
    return sum(snapshot.procs[pid].cpu for pid in tree if pid in snapshot.procs)


def top_others(start: Snapshot, end: Snapshot, root: int, count: int = 3) -> list[tuple[int, str, int]]:
    """The ``count`` processes outside ``root``'s tree (at either reading) that used the most clock ticks
    between the readings, as (pid, command name, ticks), most first. A process started in between counts
    all its ticks; one that ended in between is not seen (its parent's cutime holds it)."""
    tree = (process_tree({pid: p.ppid for pid, p in start.procs.items()}, root)
            | process_tree({pid: p.ppid for pid, p in end.procs.items()}, root))
    used = []
    for pid, proc in end.procs.items():
        if pid in tree:
            continue
        before = start.procs.get(pid)
        ticks = proc.cpu - (before.cpu if before is not None and before.starttime == proc.starttime else 0)
        if ticks > 0:
            used.append((pid, proc.comm, ticks))
    return sorted(used, key=lambda u: (-u[2], u[0]))[:count]


def others_cpu(start: Snapshot, end: Snapshot, root: int, ticks_per_second: float,
               limit: float = OTHERS_LIMIT) -> dict[str, Any]:
    """The record's ``others_cpu``: the CPU used between two readings by processes other than the run's own,
    i.e. the machine's busy time less the run's own, in CPU-seconds and as a share of one core.

    The run's own CPU is its cgroup's (``own_from`` ``"cgroup"``) where both readings have one: exact, and it
    keeps the CPU of every process that ran in it, also of those reaped without a wait (a parent that ignores
    ``SIGCHLD``, as PySpark's daemon does for the Python workers it forks, adds nothing to its ``cutime``).
    Otherwise it is ``root``'s process tree (``own_from`` ``"process tree"``), which misses such processes."""
    if start.group_cpu is not None and end.group_cpu is not None:
        own, own_from = (end.group_cpu - start.group_cpu) * ticks_per_second, "cgroup"
    else:
        own, own_from = own_cpu(end, root) - own_cpu(start, root), "process tree"
    others = max(0.0, end.busy - start.busy - own) / ticks_per_second
    wall = max(end.wall - start.wall, 1e-9)
    share = others / wall
    return {"cpu_seconds": round(others, 2), "wall_seconds": round(wall, 2), "core_share": round(share, 4),
            "limit": limit, "quiet": share <= limit, "own_cpu_seconds": round(own / ticks_per_second, 2),
            "own_from": own_from,
            "top": [{"pid": pid, "command": comm, "cpu_seconds": round(t / ticks_per_second, 2)}
                    for pid, comm, t in top_others(start, end, root)]}


def noisy_message(result: Mapping[str, Any]) -> str:
    """The one line a refused run prints: how much CPU others used, and the top 3 of them."""
    top = ", ".join(f"pid {t['pid']} ({t['command']}) {t['cpu_seconds']:g} CPU-s" for t in result["top"])
    return (f"quiet machine rule: other processes used {result['cpu_seconds']:g} CPU-s in the run's "
            f"{result['wall_seconds']:g} s, {result['core_share']:.2f} of a core (limit {result['limit']:g}); "
            f"top others: {top or 'none still running'}; no record written (re-run on a quiet machine, or pass "
            "--noisy-ok to write the records marked \"quiet\": false)")


def read_snapshot(proc: Path = Path("/proc"), group: CpuGroup | None = None) -> Snapshot | None:
    """Read ``/proc/stat``, every ``/proc/PID/stat`` and ``group``'s CPU now; None where ``/proc/stat``
    cannot be read."""
    group_cpu = group.cpu_seconds() if group is not None else None
    wall = time.monotonic()
    try:
        busy = parse_proc_stat((proc / "stat").read_text())
    except (OSError, ValueError):
        return None
    procs = {}
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return None
    for name in entries:
        try:
            stat = parse_pid_stat((proc / name / "stat").read_text())
        except (OSError, ValueError):  # ended meanwhile, or unreadable
            continue
        procs[stat.pid] = stat
    return Snapshot(wall, busy, procs, group_cpu)


#: The name of the cgroup a run creates for itself (its pid appended), beside the cgroup it started in.
GROUP_PREFIX = "spark-imagenet-bench-"


def _mount_points(mountinfo: str) -> dict[str, str]:
    """``{"cgroup2": PATH, "cpuacct": PATH}`` from the text of ``/proc/self/mountinfo`` (where mounted)."""
    found: dict[str, str] = {}
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            found.setdefault("cgroup2", fields[4])
        elif tail[0] == "cgroup" and "cpuacct" in tail[2].split(","):
            found.setdefault("cpuacct", fields[4])
    return found


def _own_paths(cgroup_text: str) -> dict[str, str]:
    """This process's cgroup per hierarchy, ``{"cgroup2": "/a/b", "cpuacct": "/"}``, from ``/proc/self/cgroup``."""
    paths: dict[str, str] = {}
    for line in cgroup_text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths["cgroup2"] = path
        elif "cpuacct" in controllers.split(","):
            paths["cpuacct"] = path
    return paths


@dataclass(frozen=True)
class CpuGroup:
    """A cgroup this run created and moved itself into: every process it starts from then on is in it, and
    the group's CPU time counts each of them, alive or ended however (see :func:`others_cpu`).

    ``kind`` is ``"cgroup2"`` (``cpu.stat``'s ``usage_usec``) or ``"cpuacct"`` (cgroup v1, ``cpuacct.usage``
    in nanoseconds); ``home`` is the cgroup the process was in before."""

    kind: str
    path: Path
    home: Path

    def cpu_seconds(self) -> float | None:
        """The group's CPU-seconds so far; None where it cannot be read."""
        try:
            if self.kind == "cgroup2":
                stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
                return int(stat["usage_usec"]) / 1e6
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError, KeyError):
            return None

    def leave(self) -> None:
        """Move this process back home and remove the group once nothing runs in it (best effort: a process
        still running or unreaped there keeps it; the next run removes it)."""
        with contextlib.suppress(OSError):
            (self.home / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            self.path.rmdir()


def join_cpu_group(proc: Path = Path("/proc")) -> CpuGroup | None:
    """Create a cgroup beside this process's own (cgroup v2, else v1's cpuacct) and move this process into
    it; first removes the empty groups that earlier runs left. None where neither can be made or joined
    (not Linux, no permission to create or to move: usually not root): the rule then counts the process tree.
    """
    try:
        mounts = _mount_points((proc / "self" / "mountinfo").read_text())
        paths = _own_paths((proc / "self" / "cgroup").read_text())
    except (OSError, ValueError):
        return None
    for kind, usage in (("cgroup2", "cpu.stat"), ("cpuacct", "cpuacct.usage")):
        if kind not in mounts or kind not in paths:
            continue
        home = Path(mounts[kind]) / paths[kind].lstrip("/")
        for stale in home.glob(GROUP_PREFIX + "*"):
            with contextlib.suppress(OSError):
                stale.rmdir()
        group = CpuGroup(kind, home / f"{GROUP_PREFIX}{os.getpid()}", home)
        try:
            group.path.mkdir()
        except OSError:
            continue
        try:
            (group.path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            group.leave()
            continue
        if (group.path / usage).is_file() and group.cpu_seconds() is not None:
            return group
        group.leave()
    return None


#: Linux prctl(2) option: orphans of this process's descendants are re-parented to it rather than to init.
PR_SET_CHILD_SUBREAPER = 36


def keep_orphans() -> None:
    """Make this process the *subreaper* of its tree (Linux; a no-op elsewhere): a descendant whose parent
    ends (a Spark JVM after its driver, the Python workers and TensorFlow processes below it) is re-parented
    to this process instead of init, stays in the tree the quiet machine rule counts as its own, and, once it
    ends, stays a zombie here (with its CPU times) until this process exits. Without it the CPU of every
    orphan counts as another's, and a run that starts Spark could never be quiet."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def clock_ticks() -> float:
    """Clock ticks per second of /proc's times (``SC_CLK_TCK``, 100 where unknown)."""
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


class Report:
    """Collects a script's measurements, prints them, and writes the JSON lines of ``--json``.

    Args:
        benchmark: the script's short name (the records' ``benchmark``).
        args: the parsed options (uses ``quick`` and ``json``).
        extra_versions: more distributions to name in ``versions``.
        others_limit: the quiet machine rule's limit (share of one core; default :data:`OTHERS_LIMIT`).

    The run measured for the quiet machine rule is from this constructor to :meth:`close`.
    """

    def __init__(self, benchmark: str, args: argparse.Namespace, extra_versions: Iterable[str] = (),
                 others_limit: float = OTHERS_LIMIT) -> None:
        self.benchmark = benchmark
        self.quick = bool(getattr(args, "quick", False))
        self.target = getattr(args, "json", None)
        self.noisy_ok = bool(getattr(args, "noisy_ok", False))
        self.others_limit = others_limit
        self.others: dict[str, Any] | None = None
        self.records: list[dict[str, Any]] = []
        self._context = {"quick": self.quick,
                         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         "commit": commit(), "machine": machine(), "versions": versions(extra_versions)}
        self.human = sys.stderr if self.target == "-" else sys.stdout
        keep_orphans()
        self._group = join_cpu_group()
        self._start = read_snapshot(group=self._group)

    def say(self, text: str) -> None:
        """Print a human-readable line (to stderr when the JSON goes to stdout)."""
        print(text, file=self.human, flush=True)

    def add(self, measurement: str, unit: str, values: Sequence[float], kind: str = "measured",
            **params: Any) -> dict[str, Any]:
        """Record one measurement from its repetitions ``values``; prints its line and returns the record."""
        values = [float(v) for v in values]
        record = {"benchmark": self.benchmark, "measurement": measurement, "unit": unit, "kind": kind,
                  **summary(values), "reps": len(values), "values": values, "params": params, **self._context,
                  "others_cpu": None}
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

    def measure_others(self) -> dict[str, Any] | None:
        """Read /proc again and put the CPU that others used since the constructor into every record."""
        end = read_snapshot(group=self._group) if self._start is not None else None
        if self._group is not None:
            self._group.leave()
            self._group = None
        if end is None:
            self.say(f"{self.benchmark}: the CPU of other processes is not measured: /proc/stat cannot be read "
                     "(Linux only); the records' others_cpu is null")
            return None
        self.others = others_cpu(self._start, end, os.getpid(), clock_ticks(), self.others_limit)
        for record in self.records:
            record["others_cpu"] = self.others
        self.say(f"{self.benchmark}: other processes used {self.others['cpu_seconds']:g} CPU-s in "
                 f"{self.others['wall_seconds']:g} s, {self.others['core_share']:.2f} of a core (limit "
                 f"{self.others_limit:g}{'' if self.others['quiet'] else ': not quiet'})")
        return self.others

    def close(self) -> None:
        """Apply the quiet machine rule, then write the JSON lines (if ``--json`` was given).

        Raises:
            SystemExit: status :data:`NOISY_EXIT`, after one message on stderr, when a full run without
                ``--noisy-ok`` was not quiet (nothing is written).
        """
        others = self.measure_others()
        if others is not None and not others["quiet"] and not self.quick and not self.noisy_ok:
            print(f"{self.benchmark}: {noisy_message(others)}", file=sys.stderr, flush=True)
            raise SystemExit(NOISY_EXIT)
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
