"""The quiet machine rule of benchmarks/common.py: the CPU that processes outside a benchmark's own process
tree use during its run, read from /proc; a full run above the limit writes no record and exits 3.

The pure functions are fed literal /proc text; the Report runs in a small script (a subprocess) next to a
busy loop that is not its child (refused), or with its own child burning CPU (counted as its own). Each burns
under a CPU-second; no test asserts a timing beyond the limit's wide margin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import (NOISY_EXIT, OTHERS_LIMIT, RECORD_KEYS, CpuGroup, ProcStat, Snapshot,  # noqa: E402
                    _mount_points, _own_paths, clock_ticks, join_cpu_group, machine_busy_seconds, noisy_message,
                    others_cpu,
                    parse_pid_stat, parse_proc_stat, process_tree, read_snapshot)

pytestmark = pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="the quiet machine rule reads Linux /proc")

#: /proc/stat of a 2-CPU machine: user nice system idle iowait irq softirq steal guest guest_nice.
PROC_STAT = """cpu  3675370 12 650791 5554202 23416 5 21511 9574 0 0
cpu0 1681286 0 306547 2958888 4392 0 11562 4825 0 0
cpu1 1994084 12 344244 2595314 19024 5 9949 4749 0 0
intr 12345 0 0
ctxt 99
"""

#: A /proc/PID/stat line whose command name holds spaces and parentheses (utime 1234, stime 56, cutime 78,
#: cstime 9, starttime 4982261).
PID_STAT = ("9038 (my (odd) name) R 9034 9034 6318 0 -1 4194304 99 0 0 0 1234 56 78 9 20 0 1 0 4982261 "
            "3133440 384 18446744073709551615 94528908963840 94528908983721 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n")

#: Burns CPU in this process until it has used argv[1] CPU-seconds (argv[1] < 0: until killed).
BURN = ("import sys, time\nlimit = float(sys.argv[1])\nt = time.process_time()\n"
        "while limit < 0 or time.process_time() - t < limit:\n    pass\n")

#: A benchmark-like script: a Report, optionally a child that burns CPU or a sleep, one record, close().
SCRIPT = f"""
import argparse, subprocess, sys, time
sys.path.insert(0, {str(REPO / "benchmarks")!r})
from common import Report, add_options
p = argparse.ArgumentParser()
add_options(p)
p.add_argument("--child-burn", type=float, default=0.0)
p.add_argument("--sleep", type=float, default=0.0)
args = p.parse_args()
report = Report("quiet", args)
if args.child_burn:
    subprocess.run([sys.executable, "-c", {BURN!r}, str(args.child_burn)], check=True)
time.sleep(args.sleep)
report.add("nothing", "s", [1.0])
report.close()
"""


def test_proc_stat_busy_jiffies_are_user_nice_system_irq_softirq_steal():
    assert parse_proc_stat(PROC_STAT) == 3675370 + 12 + 650791 + 5 + 21511 + 9574
    with pytest.raises(ValueError):
        parse_proc_stat("cpu0 1 2 3 4\nintr 5\n")


def test_pid_stat_reads_past_a_command_name_with_spaces_and_parentheses():
    stat = parse_pid_stat(PID_STAT)
    assert stat == ProcStat(pid=9038, comm="my (odd) name", ppid=9034, utime=1234, stime=56, cutime=78, cstime=9,
                            starttime=4982261)
    assert stat.cpu == 1234 + 56 + 78 + 9
    with pytest.raises(ValueError):
        parse_pid_stat("9038 no parentheses here")


def test_process_tree_follows_parent_links_only_downwards():
    parents = {1: 0, 2: 1, 3: 2, 4: 1, 5: 3, 6: 99, 7: 6}
    assert process_tree(parents, 2) == {2, 3, 5}
    assert process_tree(parents, 42) == {42}


def _proc(pid, ppid, cpu, comm="p", starttime=1):
    return ProcStat(pid=pid, comm=comm, ppid=ppid, utime=cpu, stime=0, cutime=0, cstime=0, starttime=starttime)


def test_others_are_the_busy_time_less_the_own_trees():
    # root 10: +50 ticks itself, its live child 11 +100, its child 12 ended and was waited for (its 30 ticks
    # move into root's cutime); others: 20 +150, 21 started in between with 40, 22 reused pid of another process
    start = Snapshot(100.0, 1000, {10: _proc(10, 1, 500), 11: _proc(11, 10, 0), 12: _proc(12, 10, 30),
                                   20: _proc(20, 1, 7, "busy loop"), 22: _proc(22, 1, 900, starttime=5)})
    end = Snapshot(102.0, 1000 + 50 + 100 + 150 + 40 + 60,
                   {10: ProcStat(10, "p", 1, 550, 0, 30, 0, 1), 11: _proc(11, 10, 100),
                    20: _proc(20, 1, 157, "busy loop"), 21: _proc(21, 20, 40, "kid"),
                    22: _proc(22, 1, 60, "new", starttime=9)})
    result = others_cpu(start, end, 10, ticks_per_second=100, limit=0.10)
    assert result["own_cpu_seconds"] == 1.5
    assert result["cpu_seconds"] == 2.5 and result["wall_seconds"] == 2.0
    assert result["core_share"] == 1.25 and result["limit"] == 0.10 and result["quiet"] is False
    assert [(t["pid"], t["command"], t["cpu_seconds"]) for t in result["top"]] == [
        (20, "busy loop", 1.5), (22, "new", 0.6), (21, "kid", 0.4)]
    message = noisy_message(result)
    assert "2.5 CPU-s" in message and "1.25 of a core" in message and "pid 20 (busy loop) 1.5 CPU-s" in message
    quiet = others_cpu(start, Snapshot(102.0, 1000 + 150 + 10, end.procs), 10, 100, limit=0.10)
    assert quiet["cpu_seconds"] == 0.1 and quiet["core_share"] == 0.05 and quiet["quiet"] is True


def test_a_missing_proc_reads_as_none(tmp_path):
    assert read_snapshot(tmp_path / "no-proc") is None


def _run(*args, timeout=60):
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=timeout)


def _cpu_seconds(pid: int) -> float:
    return parse_pid_stat(Path(f"/proc/{pid}/stat").read_text()).cpu / clock_ticks()


def test_a_full_run_beside_a_busy_process_that_is_not_its_child_is_refused(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", BURN, "-1"])  # the test's child, a sibling of the script's
    try:
        time.sleep(0.3)
        out = tmp_path / "records.jsonl"
        refused = _run("--json", str(out), "--sleep", "0.7")
        assert refused.returncode == NOISY_EXIT, refused.stderr
        assert out.read_text() == "", "a refused run wrote records"
        message = [line for line in refused.stderr.splitlines() if "quiet machine rule" in line]
        assert len(message) == 1, refused.stderr
        assert "CPU-s" in message[0] and f"limit {OTHERS_LIMIT:g}" in message[0], message[0]
        assert message[0].count("top others: pid ") == 1, message[0]

        burned = _cpu_seconds(busy.pid)
        kept = _run("--json", str(out), "--sleep", "0.7", "--noisy-ok")
        burned = _cpu_seconds(busy.pid) - burned
        assert kept.returncode == 0, kept.stderr
        quick = _run("--json", "-", "--quick", "--sleep", "0.7")
        assert quick.returncode == 0, quick.stderr
    finally:
        busy.kill()
        busy.wait()
    for text in (out.read_text(), quick.stdout):
        (record,) = [json.loads(line) for line in text.splitlines()]
        assert tuple(record) == RECORD_KEYS
        assert record["others_cpu"]["quiet"] is False
        assert record["others_cpu"]["core_share"] > OTHERS_LIMIT
    # the busy loop burned in the --noisy-ok run, and not as the script's own (which only slept)
    assert burned > 0.2 and json.loads(out.read_text())["others_cpu"]["own_cpu_seconds"] < 0.15, burned


def test_the_cpu_of_the_runs_own_child_is_its_own():
    ticks = clock_ticks()
    before = read_snapshot()
    run = _run("--json", "-", "--noisy-ok", "--child-burn", "0.6")
    after = read_snapshot()
    assert run.returncode == 0, run.stderr
    (record,) = [json.loads(line) for line in run.stdout.splitlines()]
    measured = record["others_cpu"]
    assert measured["own_cpu_seconds"] >= 0.6  # the child's CPU (waited for: in the script's cutime)
    # whatever else ran meanwhile, the script's others are at most this test's others over a longer interval
    # (this test process only waits): the child's 0.6 CPU-s are not among them
    outer = others_cpu(before, after, os.getpid(), ticks)
    assert measured["cpu_seconds"] <= outer["cpu_seconds"] + 0.3, (measured, outer)
    assert measured["quiet"] is (measured["core_share"] <= OTHERS_LIMIT)
    # a quiet machine: even had all of the outer interval's others fallen in the script's shorter run (with
    # two clock ticks of sampling), the script is within the limit, so the child alone did not make it noisy
    if outer["cpu_seconds"] + 2 / ticks <= OTHERS_LIMIT * measured["wall_seconds"]:
        assert measured["quiet"] is True, (measured, outer)


#: A child that ignores SIGCHLD (as PySpark's daemon does) forks a grandchild that burns argv[1] CPU-seconds:
#: the kernel reaps the grandchild without a wait, so its CPU reaches no parent's cutime.
IGNORING_PARENT = ("import os, signal, sys, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
                   "if os.fork() == 0:\n    t = time.process_time()\n"
                   "    while time.process_time() - t < float(sys.argv[1]):\n        pass\n    os._exit(0)\n"
                   "while True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        break\n")


def test_the_cgroup_counts_a_grandchild_reaped_without_a_wait():
    group = join_cpu_group()
    if group is None:
        pytest.skip("no cgroup can be created and joined here (not root, or no cgroup mount)")
    try:
        start = read_snapshot(group=group)
        subprocess.run([sys.executable, "-c", IGNORING_PARENT, "0.5"], check=True)
        end = read_snapshot(group=group)
    finally:
        group.leave()
    assert not group.path.exists()  # left and removed: nothing runs there any more
    by_group = others_cpu(start, end, os.getpid(), clock_ticks())
    assert by_group["own_from"] == "cgroup"
    assert by_group["own_cpu_seconds"] >= 0.5, by_group
    by_tree = others_cpu(Snapshot(start.wall, start.busy, start.procs), Snapshot(end.wall, end.busy, end.procs),
                         os.getpid(), clock_ticks())
    assert by_tree["own_from"] == "process tree"
    assert by_tree["own_cpu_seconds"] < 0.45, by_tree  # the grandchild's CPU escapes the tree's accounting


MOUNTINFO = """22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
31 22 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
33 31 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_cgroup_mounts_and_own_paths_are_read_per_hierarchy():
    assert _mount_points(MOUNTINFO) == {"cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "cgroup2": "/sys/fs/cgroup/unified"}
    assert _own_paths("4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/user.slice/x.scope\n") == {
        "cpuacct": "/c", "cgroup2": "/user.slice/x.scope"}


def test_a_missing_cgroup_reads_as_none(tmp_path):
    assert join_cpu_group(tmp_path) is None  # no /proc/self/mountinfo there
    assert CpuGroup("cgroup2", tmp_path / "gone", tmp_path).cpu_seconds() is None


def test_the_machines_busy_seconds_are_the_busy_jiffies_over_the_clock_ticks(tmp_path):
    (tmp_path / "stat").write_text(PROC_STAT)
    assert machine_busy_seconds(tmp_path) == pytest.approx(parse_proc_stat(PROC_STAT) / clock_ticks())
    assert machine_busy_seconds(tmp_path / "absent") is None
