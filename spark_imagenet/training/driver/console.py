"""The command line's SparkSession: started so that Ctrl-C works, stopped quietly, one clear error.

* :func:`start_session`: the session of a job's ``master`` and ``conf``
  (:func:`~spark_imagenet.training.driver.spark_session.session_for`), started in a helper thread so that a
  Ctrl-C during Spark's start-up is a KeyboardInterrupt here, not a Py4J traceback; a JVM start-up failure
  becomes one :class:`~spark_imagenet.errors.ConfigError` naming the master and the JVM's reason.
* :func:`stopped_at_end`: runs the job with Python's own Ctrl-C handling and stops the session after it.

``spark-imagenet train`` and ``demo`` use both; :func:`~spark_imagenet.training.driver.launch.train` with a
session of your own needs neither.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

from spark_imagenet.errors import ConfigError, SparkImagenetError, spark_reason


def _session(config, command: str, *, warn_oversubscription: bool = True):
    """The SparkSession for a job's ``master`` and ``conf``, or one clear error."""
    from spark_imagenet.training.driver.spark_session import session_for

    try:
        return session_for(config.scaling.master, config.scaling.workers, conf=config.spark_conf, app_name=f"spark-imagenet {command}",
                           warn_oversubscription=warn_oversubscription)
    except SparkImagenetError:
        raise
    except Exception as e:  # Py4J / JVM start-up failures
        reason = spark_reason(e)
        keys = ", ".join(k for k, _ in config.scaling.conf)
        if config.scaling.master:
            master = f"--master {config.scaling.master}"
        elif "PYSPARK_GATEWAY_PORT" in os.environ:
            master = "spark-submit's master"
        else:
            master = f"the default master local[{config.scaling.workers}]"
        raise ConfigError(
            f"Spark could not start with {master}"
            f"{' and --conf ' + keys if keys else ''}: {reason[:300]}. "
            "Check the master URL (spark://HOST:PORT, yarn, k8s://..., local[N]) and that the cluster is reachable."
        ) from None


#: Seconds a Ctrl-C during Spark's start-up waits for the start-up to end (then Spark is stopped).
SESSION_START_WAIT_S = 120


def start_session(config, command: str, **options):
    """The SparkSession of ``config`` (its ``master`` and ``conf``), started in a helper thread while this one waits.

    A Ctrl-C during Spark's start-up then raises KeyboardInterrupt here, not
    inside a Py4J call (which logs a traceback), and PySpark, started outside
    the main thread, does not install its SIGINT handler (see
    :func:`stopped_at_end`). The JVM of an interrupted start-up exits with
    this process.

    Args:
        config: the job's :class:`~spark_imagenet.training.job.config.TrainConfig`.
        command: the command's name, for the application name (``spark-imagenet train``).
        **options: for :func:`~spark_imagenet.training.driver.spark_session.session_for`
            (``warn_oversubscription``).

    Raises:
        ConfigError: Spark could not start (the master, the ``--conf`` keys and the JVM's reason named),
            or what :func:`~spark_imagenet.training.driver.spark_session.session_for` raises.
        KeyboardInterrupt: Ctrl-C during the start-up; the start-up is let
            finish (at most ``SESSION_START_WAIT_S``) and the session stopped.
    """
    box: dict = {}
    done = threading.Event()  # not Thread.join: an interrupted join marks a live thread ended (Python 3.11)

    def start() -> None:
        try:
            box["spark"] = _session(config, command, **options)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=start, name="spark-imagenet session start", daemon=True).start()
    try:
        while not done.wait(0.2):
            pass
    except KeyboardInterrupt:
        ignore_sigint()
        done.wait(SESSION_START_WAIT_S)  # a JVM left starting would print its banner after we exit
        if "spark" in box:
            stop_quietly(box["spark"])
        raise
    if "error" in box:
        raise box["error"]
    return box["spark"]


@contextlib.contextmanager
def stopped_at_end(spark) -> Iterator[None]:
    """Run the block with Ctrl-C raising KeyboardInterrupt, then stop ``spark``.

    PySpark's own SIGINT handler cancels every job from inside the signal
    handler, which breaks a Py4J call in progress and prints its tracebacks;
    Python's default handler is used instead (the driver cancels its job:
    :func:`spark_imagenet.training.driver.launch.run_job`). After a Ctrl-C, Spark is
    stopped quietly (its log off, its errors swallowed) while a further
    Ctrl-C is ignored, and the KeyboardInterrupt is re-raised.
    """
    previous = signal.getsignal(signal.SIGINT)
    with contextlib.suppress(ValueError):  # not the main thread: signals stay as they are
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    except KeyboardInterrupt:
        ignore_sigint()
        stop_quietly(spark)
        raise
    except BaseException:
        spark.stop()
        raise
    spark.stop()
    with contextlib.suppress(ValueError, TypeError):  # TypeError: a handler not set from Python
        signal.signal(signal.SIGINT, previous)


def stop_quietly(spark) -> None:
    """Stop ``spark`` with its log off, swallowing its errors (after a Ctrl-C)."""
    with contextlib.suppress(Exception):
        spark.sparkContext.setLogLevel("OFF")
    with contextlib.suppress(Exception):
        spark.stop()


def ignore_sigint() -> None:
    """Ignore SIGINT from now on (shutting down after a Ctrl-C); a no-op outside the main thread."""
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
