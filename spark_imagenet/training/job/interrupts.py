"""SIGINT (Ctrl-C) handling shared by the command line, the driver and the barrier tasks: a handler for a
block (:func:`sigint_handler`), and blocking work run in a thread so that a Ctrl-C arrives between calls
(:func:`run_interruptibly`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def sigint_handler(handler: Any) -> Iterator[None]:
    """Handle SIGINT with ``handler`` for the block, then put the previous handler back.

    Args:
        handler: ``signal.SIG_IGN``, ``signal.default_int_handler`` (Ctrl-C
            raises KeyboardInterrupt) or any handler :func:`signal.signal` takes.

    Signal handlers can only be set in the main thread: elsewhere this is a
    no-op. A previous handler set from C (``None``) cannot be restored and is left.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def run_interruptibly(work: Callable[[], T], on_interrupt: Callable[[threading.Event], None], *,
                      thread_class: Callable[..., threading.Thread] = threading.Thread,
                      name: str = "spark-imagenet work", poll_s: float = 0.2) -> T:
    """Run ``work()`` in a thread of its own while this thread waits, so that a Ctrl-C arrives here.

    A Ctrl-C (KeyboardInterrupt) thus never breaks a call in progress inside ``work`` (a Py4J or gRPC call,
    Spark's start-up); ``on_interrupt(done)`` is called instead (``done`` is set once ``work``'s thread has
    ended; it may wait for it, bounded) and the KeyboardInterrupt is re-raised. SIGINT raises
    KeyboardInterrupt while this waits (Python's default handler, not PySpark's, which cancels every job from
    inside the signal handler).

    Args:
        work: the blocking work; its value is returned.
        on_interrupt: what to do after a Ctrl-C (cancel the job, stop the session).
        thread_class: ``threading.Thread``, or PySpark's ``InheritableThread`` (which carries the job group
            and local properties into the thread).
        name: the thread's name.
        poll_s: seconds between this thread's checks.

    Returns:
        What ``work()`` returned.

    Raises:
        whatever ``work()`` raised; KeyboardInterrupt: Ctrl-C, after ``on_interrupt``.

    Example::

        >>> rdd = spark.sparkContext.parallelize([1, 2, 3])
    >>> run_interruptibly(rdd.collect, lambda done: (spark.sparkContext.cancelAllJobs(), done.wait()))
    [1, 2, 3]
    """
    outcome: dict[str, Any] = {}
    done = threading.Event()  # not Thread.join: an interrupted join marks a live thread ended (Python 3.11)

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = e
        finally:
            done.set()

    thread = thread_class(target=target, name=name, daemon=True)
    try:
        with sigint_handler(signal.default_int_handler):
            thread.start()
            while not done.wait(poll_s):
                pass
    except KeyboardInterrupt:
        if thread.ident is None:  # interrupted before the thread began
            done.set()
        on_interrupt(done)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
