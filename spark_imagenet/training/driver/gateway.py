"""The driver JVM this process starts itself, with its stderr passed through one filter.

Spark 4's launcher gives every JVM it starts ``--add-modules=jdk.incubator.vector``
(``org.apache.spark.launcher.JavaModuleOptions``, not configurable), and the JDK then prints
``WARNING: Using incubator modules: jdk.incubator.vector`` on stderr at start-up, whatever the options
(``-XX:-PrintWarnings`` and ``-Xlog:disable`` leave it). It says nothing to a user. PySpark's
``launch_gateway`` takes ``popen_kwargs`` for this purpose ("capturing stdout/stderr"): :func:`start_gateway`
starts the JVM with its stderr on a pipe that a thread copies to this process's stderr (file
descriptor 2, where it went before), line by line, leaving out that one warning. Everything else the JVM
and its local tasks write reaches the console unchanged, in order.

Used only where this process starts the JVM (:func:`spark_imagenet.training.driver.spark_session.local_session`
and ``session_for``); under ``spark-submit`` the JVM is spark-submit's own (``submit/local.sh`` filters its
stderr the same way).
"""

from __future__ import annotations

import os
import threading
from typing import Mapping

#: The start of the JVM's line that :func:`start_gateway` leaves out.
INCUBATOR_WARNING = b"WARNING: Using incubator modules: "
#: Seconds to wait, after a JVM that failed to start, for its last lines to reach the console.
FAILED_START_DRAIN_S = 5.0


def start_gateway(options: Mapping[str, str]) -> None:
    """Start the driver JVM for a session of these settings, its stderr filtered; nothing when one runs.

    The JVM is started as ``SparkSession.builder...getOrCreate()`` would start it (the same settings
    passed to ``spark-submit``), and its SparkContext created, so that the builder's ``getOrCreate``
    then finds both.

    Args:
        options: the builder's settings, ``spark.master`` and ``spark.app.name`` included.

    Raises:
        Exception: what PySpark raises when the JVM or the SparkContext does not start
            (``[JAVA_GATEWAY_EXITED]``, a Py4J error), after the JVM's own lines reached the console.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return  # a JVM runs already: this process's, or spark-submit's
    conf = SparkConf()
    for key, value in options.items():
        conf.set(key, value)
    read_fd, write_fd = os.pipe()
    forwarder = threading.Thread(target=forward_stderr, args=(read_fd,), name="spark-imagenet JVM stderr",
                                 daemon=True)
    forwarder.start()
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_fd})
    except BaseException:
        os.close(write_fd)
        forwarder.join(FAILED_START_DRAIN_S)  # the JVM exited: its reason is on the console before our error
        raise
    os.close(write_fd)  # the JVM holds the pipe's writing end now
    SparkContext(conf=conf, gateway=gateway)


def forward_stderr(fd: int, out: int = 2) -> None:
    """Copy the lines read from ``fd`` to file descriptor ``out``, leaving out :data:`INCUBATOR_WARNING`'s,
    until end of file. Once ``out`` cannot be written (a closed console), the lines are still read (so the
    JVM never blocks on a full pipe) and dropped."""
    writable = True
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:
            if not writable or line.startswith(INCUBATOR_WARNING):
                continue
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(out, view):]
            except OSError:
                writable = False
