"""A log channel from the barrier tasks to the Spark driver's console: the protocol both sides share.

When the executors run on other hosts, what a barrier task (or its
TensorFlow worker process) prints stays in that executor's log. This channel
carries those lines to the driver, which prints them as ``[rank R]`` lines
on its console: a :class:`~spark_imagenet.training.driver.logserver.LogServer`
listens on the driver, every task opens a
:class:`~spark_imagenet.training.task.logsender.LogSender` on the
:class:`ChannelSpec` that travels inside the job's task spec. This module holds
what both sides share: the protocol, its bounds and the spec. Pure standard
library: no TensorFlow, no PySpark.

Wire format (one TCP connection per sender, client to server only; the
server never writes)::

    SECRET\\n                 the job's secret (32 hex characters), once
    RANK\\tHOST\\tTEXT\\n       one line of output, UTF-8, as many as needed

``RANK`` is a decimal integer, ``HOST`` has no tab or newline (the sender
replaces them by spaces), ``TEXT`` is the rest of the line and may hold
tabs. The sender splits a text with line breaks into several lines. The
server decodes with ``errors="replace"`` and passes
``on_line(rank, host, text)``; a line it cannot parse arrives as rank -1,
host ``"?"``, with the whole line as text.

Security properties:

* the server binds the address it is given (the driver's address, e.g.
  ``spark.driver.host``), on an ephemeral port; never all interfaces unless
  it is told ``0.0.0.0``;
* a per-job secret (``secrets.token_hex(16)``, compared with
  ``hmac.compare_digest``) must be the first line; a wrong, silent (10 s)
  or oversized (over 200 bytes) first line closes the connection unread;
* everything is bounded: line length (longer lines are cut with a
  ``... [N chars cut]`` marker, and a partial line is never buffered beyond
  that bound), lines per second per connection (a token bucket; the excess
  is dropped and announced by one notice line per dropped run) and
  concurrent connections;
* the traffic is plaintext: the channel carries log lines only, never
  data, weights or credentials.

Failure properties: the channel never slows or fails training.
:meth:`LogSender.send` never blocks and never raises; it puts the line on a
bounded queue that a daemon thread writes out, and drops (and counts) what
does not fit. A server that cannot be reached, goes away or stops reading
ends the sending (recorded in :attr:`LogSender.error`), never the task. On
the driver, an exception in ``on_line`` is counted, never fatal to the
server thread.
"""

from __future__ import annotations

import dataclasses

from spark_imagenet.errors import ConfigError

#: Seconds a new connection has to send its secret line.
AUTH_TIMEOUT_S = 10.0
#: Longest first (secret) line, in bytes, newline excluded.
MAX_AUTH_BYTES = 200
#: Longest HOST field kept, in characters (the server cuts longer ones).
MAX_HOST_CHARS = 255
#: Seconds a sender waits for the socket to take the next chunk before it gives up.
SEND_TIMEOUT_S = 5.0
#: Bytes read or written per socket call.
CHUNK_BYTES = 65536
#: UTF-8 continuation bytes: deleting them from a byte string leaves one byte per character.
_CONTINUATION = bytes(range(0x80, 0xC0))


def utf8_chars(data: bytes) -> int:
    """How many characters ``data`` holds as UTF-8 (continuation bytes are not counted)."""
    return len(data.translate(None, _CONTINUATION))


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclasses.dataclass(frozen=True)
class ChannelSpec:
    """Where and how a :class:`LogSender` reaches the job's :class:`LogServer` (picklable).

    Args:
        host: str, the numeric address the server is bound to.
        port: int, its TCP port (1..65535).
        secret: str, the job's secret, the first line every connection sends
            (kept out of ``repr`` so that a logged task spec does not show it).

    Raises:
        ConfigError: an empty host, a port outside 1..65535, or a secret that
            is empty, has a line break, or is over 200 bytes.
    """

    host: str
    port: int
    secret: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"log channel host {self.host!r} must be a non-empty string")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ConfigError(f"log channel port {self.port!r} is outside 1..65535")
        if (not isinstance(self.secret, str) or not self.secret or "\n" in self.secret or "\r" in self.secret
                or len(self.secret.encode("utf-8")) > MAX_AUTH_BYTES):
            raise ConfigError(f"log channel secret must be 1..{MAX_AUTH_BYTES} bytes on one line")


def check_positive(name: str, value: float, integer: bool) -> None:
    """Raise ConfigError unless ``value`` is a positive number (an int when ``integer``)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ConfigError(f"log server {name}={value!r} must be a positive {'integer' if integer else 'number'}")
