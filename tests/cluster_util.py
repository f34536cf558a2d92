"""A Spark standalone cluster of two "hosts" on this machine, for tests and benchmarks.

Each worker "host" is a Linux network namespace with its own address on a bridge of this machine (nothing
leaves it); the master listens on the bridge's address, which the driver uses too. Needs root and
``ip netns`` (:func:`can_make_namespaces` says why not). Used by ``tests/test_submit.py`` (the
``two_host_cluster`` fixture) and ``benchmarks/scaling.py``::

    with two_host_cluster(folder) as (master_url, addresses):
        ...   # a driver with SPARK_LOCAL_IP = DRIVER_ADDRESS submits to master_url

Also the plain helpers of a standalone cluster: :func:`free_port` (and :func:`free_ports`), :func:`spark_class`
(the installed pyspark's ``bin/spark-class``) and :func:`alive_workers` (from the master's web UI).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

#: The test hosts' network: a bridge of this machine's own (nothing leaves it) and one namespace per worker.
NET = "10.77.0"
#: The driver's and the master's address (the bridge's).
DRIVER_ADDRESS = f"{NET}.1"
#: Seconds to wait for a cluster to come up (it takes well under a minute; this only stops a hang).
CLUSTER_START_S = 120


class ClusterError(RuntimeError):
    """The cluster cannot be made here, or did not start (the message says why, with the log's tail)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free localhost TCP ports (bound together on port 0, then released)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def alive_workers(ui_port: int, host: str = "127.0.0.1") -> int:
    """Workers the master's web UI reports alive (0 while it is not up)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{ui_port}/json/", timeout=5) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=60)


def make_hosts(tag: str, count: int) -> tuple[str, list[tuple[str, str]]]:
    """A bridge with the driver's address and ``count`` namespaces, each with its own address on it.

    Returns:
        ``(bridge, [(namespace, address), ...])``.
    """
    bridge = f"sib{tag}"
    sh("ip", "link", "add", bridge, "type", "bridge")
    sh("ip", "addr", "add", f"{NET}.1/24", "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    hosts = []
    for i in range(1, count + 1):
        ns, veth, address = f"si{tag}w{i}", f"si{tag}v{i}", f"{NET}.{10 + i}"
        hosts.append((ns, address))
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", bridge)
        sh("ip", "link", "set", veth, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    return bridge, hosts


def remove_hosts(tag: str, count: int) -> None:
    """Remove what :func:`make_hosts` made, whatever exists of it."""
    for i in range(1, count + 1):
        subprocess.run(["ip", "netns", "delete", f"si{tag}w{i}"], capture_output=True, timeout=60)
        subprocess.run(["ip", "link", "delete", f"si{tag}v{i}"], capture_output=True, timeout=60)
    subprocess.run(["ip", "link", "delete", f"sib{tag}"], capture_output=True, timeout=60)


def remove_stale_hosts() -> list[str]:
    """Remove the hosts of runs that were killed before their clean-up (a bridge of theirs would still hold
    :data:`DRIVER_ADDRESS`): every ``sib<TAG>`` bridge whose process (pid ``TAG`` modulo 10,000) is gone.

    Returns:
        The tags removed.
    """
    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True,
                           timeout=60).stdout
    tags = [m.group(1) for m in re.finditer(r"^\d+: sib(\d+)[:@]", links, re.M)]
    alive = {str(int(p) % 10000) for p in os.listdir("/proc") if p.isdigit()}
    stale = [t for t in tags if t not in alive]
    for tag in stale:
        remove_hosts(tag, 2)
    return stale


def can_make_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"sip{os.getpid() % 10000}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"`ip netns add` failed: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def _pinned(cpus: set[int] | None):
    """A ``preexec_fn`` that runs the child on ``cpus`` only (None: no change)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


@contextlib.contextmanager
def two_host_cluster(folder: Path, worker_cpus: Sequence[set[int]] | None = None,
                     start_timeout_s: float = CLUSTER_START_S) -> Iterator[tuple[str, list[str]]]:
    """A standalone master on the bridge and one 1-core worker in each of two namespaces.

    Args:
        folder: where the cluster's log (``cluster.log``), Spark's logs and the workers' work folders go.
        worker_cpus: the CPUs each worker's JVM (and so its executors and their children) may run on, one set
            per worker; None leaves them on every CPU.
        start_timeout_s: seconds to wait for both workers to register (JVMs pinned to one busy CPU start
            slowly).

    Yields:
        ``(master URL, [worker addresses])``; a driver must use :data:`DRIVER_ADDRESS` (``SPARK_LOCAL_IP``).
        Everything is removed afterwards, also when the body fails.

    Raises:
        ClusterError: namespaces cannot be made here (:func:`can_make_namespaces`), or the cluster did not start
            within ``start_timeout_s`` or one of its processes exited (the message ends with the log's tail).
    """
    why = can_make_namespaces()
    if why:
        raise ClusterError(why)
    folder = Path(folder)
    tag = str(os.getpid() % 10000)
    remove_stale_hosts()
    log = open(folder / "cluster.log", "w")
    procs: list[subprocess.Popen] = []
    try:
        _bridge, hosts = make_hosts(tag, 2)
        port, ui = free_port(), free_port()
        env = {**os.environ, "SPARK_LOCAL_IP": DRIVER_ADDRESS, "SPARK_LOG_DIR": str(folder / "logs")}
        procs.append(subprocess.Popen([spark_class(), "org.apache.spark.deploy.master.Master", "--host",
                                       DRIVER_ADDRESS, "--port", str(port), "--webui-port", str(ui)],
                                      env=env, stdout=log, stderr=log))
        for i, (ns, address) in enumerate(hosts):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "env", f"SPARK_LOCAL_IP={address}", spark_class(),
                 "org.apache.spark.deploy.worker.Worker", "--host", address, "--cores", "1", "--memory", "2g",
                 "--work-dir", str(folder / f"work{i}"), f"spark://{DRIVER_ADDRESS}:{port}"],
                env=env, stdout=log, stderr=log, preexec_fn=_pinned(worker_cpus[i] if worker_cpus else None)))
        names = ["the master", *(f"the worker at {address}" for _ns, address in hosts)]
        deadline = time.monotonic() + start_timeout_s
        while alive_workers(ui, DRIVER_ADDRESS) < 2:
            exited = [name for name, p in zip(names, procs) if p.poll() is not None]
            if time.monotonic() > deadline or exited:
                log.flush()
                what = (f"{' and '.join(exited)} exited" if exited
                        else f"{alive_workers(ui, DRIVER_ADDRESS)} of 2 workers alive after {start_timeout_s:g} s")
                raise ClusterError(f"the cluster did not start ({what}):\n"
                                   + (folder / "cluster.log").read_text()[-3000:])
            time.sleep(1)
        yield f"spark://{DRIVER_ADDRESS}:{port}", [address for _ns, address in hosts]
    finally:
        for p in procs:  # `ip netns exec` execs, so these are the JVMs themselves
            p.kill()
        for p in procs:
            p.wait(timeout=60)
        log.close()
        remove_hosts(tag, 2)
