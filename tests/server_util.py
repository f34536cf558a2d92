"""What the tests' stand-in servers share (moto, Azurite, fake-gcs-server, the MiniDFSCluster): waiting for one to
answer, stopping it, and the session fixture that runs one or skips saying why."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest


def wait_for_http(url: str, proc: subprocess.Popen, timeout_s: float, *, any_reply: bool = False) -> bool:
    """Poll ``url`` every 0.1 s until the server answers it.

    Args:
        url: a URL the server answers once it is up.
        proc: the server's process (its exit ends the wait).
        timeout_s: how long to wait at the most, in seconds.
        any_reply: an HTTP error reply counts as up (a server that refuses requests without credentials).

    Returns:
        bool: True when it answered; False when ``proc`` exited or ``timeout_s`` passed first.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return True
        except OSError as e:
            if any_reply and isinstance(e, urllib.error.HTTPError):
                return True
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def stop_server(proc: subprocess.Popen, log: IO, *, kill: bool = False) -> None:
    """End a server's process (terminate, or ``kill`` at once), killing it when it has not exited within 10 s,
    and close its log."""
    if kill:
        proc.kill()
    else:
        proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def serving(start: Callable[[Path], Any], unavailable: type[Exception], work: Path) -> Iterator[Any]:
    """The body of a session fixture: start a server (or cluster) in ``work``, yield it, stop it.

    Args:
        start: makes the running server from a scratch folder (its class), which has ``stop()``.
        unavailable: the exception ``start`` raises when the machine lacks the server: the tests skip with its
            message.
        work: the scratch folder.

    Example:
        ``yield from serving(MotoS3, Unavailable, tmp_path_factory.mktemp("moto"))``
    """
    try:
        server = start(work)
    except unavailable as e:
        pytest.skip(str(e))
    yield server
    server.stop()
