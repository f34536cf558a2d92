"""A real YARN cluster for the tests, and a virtualenv that submit/yarn.sh can ship to it.

The cluster is Hadoop's MiniYARNCluster (a ResourceManager and NodeManagers in one JVM) with a MiniDFSCluster
as its default file system, from Maven Central's ``hadoop-client-minicluster`` 3.5.0, the version
of the Hadoop client inside pyspark 4.3. ``tests/yarn/pom.xml`` names the jars; Maven fetches them once
into ``~/.m2`` and later runs reuse them. Nothing is committed but the pom and the launcher
``tests/yarn/MiniYarnCluster.java`` (run as a single source file by ``java``, Java 11+).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator, NamedTuple

REPO = Path(__file__).resolve().parents[1]
POM = REPO / "tests" / "yarn" / "pom.xml"
LAUNCHER = REPO / "tests" / "yarn" / "MiniYarnCluster.java"
#: Bounded waits (seconds): resolving the jars (a first download is about 110 MB), the cluster's start.
RESOLVE_TIMEOUT_S = 900
START_TIMEOUT_S = 180
#: How long a launcher may take to stop its cluster before it is killed: a graceful stop took 21 s, most of it
#: threads waiting out their sleeps; by teardown the jobs are over, and a job's containers end with its driver.
STOP_TIMEOUT_S = 1
#: Where the tests keep what outlives one run: the virtualenv to ship and its packed archive.
CACHE = Path(os.environ.get("SPARK_IMAGENET_TEST_CACHE", Path.home() / ".cache" / "spark-imagenet-tests"))


class Unavailable(Exception):
    """The machine lacks what a YARN cluster needs (Java, Maven, the jars); the message says what."""


def yarn_classpath(work: Path) -> str:
    """The class path of the test cluster: the pom's jars, resolved (and on first use fetched) by Maven.

    Raises:
        Unavailable: no ``java`` or ``mvn`` on PATH, or Maven could not resolve the jars.
    """
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise Unavailable(f"no {tool} on PATH (a YARN test cluster needs Java 11+ and Maven)")
    out = work / "yarn-classpath.txt"
    p = subprocess.run(["mvn", "-q", "-B", "-f", str(POM), "dependency:build-classpath",
                        f"-Dmdep.outputFile={out}"], capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
    if p.returncode != 0 or not out.is_file():
        tail = (p.stdout + p.stderr).strip().splitlines()[-5:]
        raise Unavailable("Maven could not resolve hadoop-client-minicluster 3.5.0 from tests/yarn/pom.xml: "
                          + " | ".join(tail))
    return out.read_text().strip()


class YarnCluster(NamedTuple):
    """A running test cluster: ``conf`` (the folder for ``HADOOP_CONF_DIR``), ``default_fs`` (its HDFS,
    ``hdfs://127.0.0.1:PORT``) and ``webhdfs_port`` (that HDFS's WebHDFS port on 127.0.0.1)."""

    conf: Path
    default_fs: str
    webhdfs_port: int


@contextlib.contextmanager
def mini_yarn_cluster(work: Path, node_managers: int = 1) -> Iterator[YarnCluster]:
    """Run a MiniYARNCluster on a MiniDFSCluster for the block; yields its :class:`YarnCluster`.

    Args:
        work: a scratch folder: the cluster's data (``work/cluster``), its log (``work/yarn.log``) and the
            configuration it writes (``work/conf``).
        node_managers: NodeManagers to start (each takes one executor of conf/spark-defaults.yarn.conf).

    Raises:
        Unavailable: see :func:`yarn_classpath`.
        RuntimeError: the cluster did not start (the message holds the end of its log).
    """
    classpath = yarn_classpath(work)
    conf, data, log = work / "conf", work / "cluster", work / "yarn.log"
    data.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as log_file:
        # The cluster keeps its folders under its working directory (target/test/data) and stops when its
        # standard input closes.
        proc = subprocess.Popen(["java", "-cp", classpath, str(LAUNCHER), str(conf), str(node_managers)],
                                cwd=data, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, text=True)
        try:
            ready = ready_line(proc)
            if ready is None:
                raise RuntimeError(f"the MiniYARNCluster did not start within {START_TIMEOUT_S} s; its log ends:\n"
                                   + log_tail(log))
            _, _rm, default_fs, webhdfs_port = ready.split()
            yield YarnCluster(conf, default_fs, int(webhdfs_port))
        finally:
            stop_launcher(proc)


def ready_line(proc: subprocess.Popen) -> str | None:
    """The launcher's ``READY ...`` line on its standard output, None when none came within
    :data:`START_TIMEOUT_S` seconds."""
    ready: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("READY"):
                ready.append(line)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    return ready[0] if ready else None


def log_tail(log: Path) -> str:
    """The last 30 lines of a launcher's log."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:])


def stop_launcher(proc: subprocess.Popen) -> None:
    """Stop a launcher (it exits when its standard input closes), killing it after :data:`STOP_TIMEOUT_S` s."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the virtualenv to ship
def _installed_regularly(python: str) -> bool:
    """Whether ``python`` runs in a virtualenv that holds spark-imagenet itself (not an editable install)."""
    code = ("import sys, spark_imagenet.submit as s; "
            "print(sys.prefix != sys.base_prefix and s.__file__.startswith(sys.prefix + '/'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([python, "-c", code], capture_output=True, text=True, env={**env, "PYTHONSAFEPATH": "1"},
                       cwd="/")
    return p.stdout.strip() == "True"


def _source_digest() -> str:
    """A digest of the package's sources and pyproject.toml (what an install of the repository holds)."""
    h = hashlib.sha256()
    for path in sorted([REPO / "pyproject.toml", *(REPO / "spark_imagenet").rglob("*.py")]):
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def shippable_python() -> str:
    """A Python whose virtualenv holds spark-imagenet as a regular install, as yarn.sh needs.

    This interpreter when it qualifies (as in ``.ci/run``, which runs ``pip install '.[test]'``); else (a
    developer's ``pip install -e``) a virtualenv under :data:`CACHE` with the repository installed, made
    once and refreshed when the sources change.

    Returns:
        str: the path of that virtualenv's ``python``.
    """
    if _installed_regularly(sys.executable):
        return sys.executable
    venv = CACHE / "yarn-venv"
    python = venv / "bin" / "python"
    stamp, digest = venv / "spark-imagenet-source.sha256", _source_digest()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if not stamp.exists() or stamp.read_text() != digest:
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"{REPO}[spark,yarn]"], check=True, cwd="/")  # its pyspark: Spark's jars, spark-submit
        # The same version number again: pip keeps the old copy unless told.
        subprocess.run([*pip, "--no-deps", "--force-reinstall", str(REPO)], check=True, cwd="/")
        stamp.write_text(digest)
    return str(python)
