"""A real HDFS for the tests: Hadoop's MiniDFSCluster (a NameNode and a DataNode in one JVM) with WebHDFS on.

The jars are those of the YARN tests (``tests/yarn/pom.xml``: ``hadoop-client-minicluster`` 3.5.0, resolved by
Maven into ``~/.m2`` once, see :func:`yarn_cluster.yarn_classpath`); the launcher is
``tests/hdfs/MiniDfsCluster.java``, run as a single source file by ``java``. The cluster writes its blocks
under a scratch folder; :meth:`MiniDFS.conf_dir` holds an ``hdfs-site.xml`` naming its WebHDFS address, for
``HADOOP_CONF_DIR``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from yarn_cluster import (  # noqa: F401 - Unavailable is re-exported
    REPO,
    START_TIMEOUT_S,
    Unavailable,
    log_tail,
    ready_line,
    stop_launcher,
    yarn_classpath,
)

LAUNCHER = REPO / "tests" / "hdfs" / "MiniDfsCluster.java"


class MiniDFS:
    """A running MiniDFSCluster.

    Attributes:
        rpc_port: the NameNode's RPC port (``hdfs://127.0.0.1:RPC``).
        http_port: the NameNode's HTTP port, where WebHDFS answers.
        conf_dir: a folder with ``hdfs-site.xml`` (``dfs.namenode.http-address``) and ``core-site.xml``.

    Raises:
        Unavailable: no Java or Maven, or the jars cannot be resolved.
        RuntimeError: the cluster did not start (the message holds the end of its log).
    """

    def __init__(self, work: Path):
        work = Path(work)
        classpath = yarn_classpath(work)
        self.log_path = work / "hdfs.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(["java", "-cp", classpath, str(LAUNCHER), str(work / "cluster")], cwd=work,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready = ready_line(self.proc)
        if ready is None:
            self.stop()
            raise RuntimeError(f"the MiniDFSCluster did not start within {START_TIMEOUT_S} s; its log ends:\n"
                               + log_tail(self.log_path))
        _word, rpc, http = ready.split()
        self.rpc_port, self.http_port = int(rpc), int(http)
        self.conf_dir = work / "conf"
        self.conf_dir.mkdir(exist_ok=True)
        (self.conf_dir / "hdfs-site.xml").write_text(
            "<configuration><property><name>dfs.namenode.http-address</name>"
            f"<value>127.0.0.1:{self.http_port}</value></property></configuration>\n")
        (self.conf_dir / "core-site.xml").write_text(
            "<configuration><property><name>fs.defaultFS</name>"
            f"<value>hdfs://127.0.0.1:{self.rpc_port}</value></property></configuration>\n")
        self.blocks = work / "cluster"

    def stop(self) -> None:
        stop_launcher(self.proc)
        self.log.close()
