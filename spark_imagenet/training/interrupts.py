"""SIGINT (Ctrl-C) handling shared by the driver and the barrier tasks."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


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
