"""The channel from the barrier tasks to the Spark driver: their log lines and their rendezvous; the protocol
both sides share.

When the executors run on other hosts, what a barrier task (or its
TensorFlow worker process) prints stays in that executor's log. This channel
carries those lines to the driver, which prints them as ``[rank R]`` lines
on its console: a :class:`~spark_imagenet.training.driver.logserver.LogServer`
listens on the driver, every task opens a
:class:`~spark_imagenet.training.task.logsender.LogSender` on the
:class:`ChannelSpec` that travels inside the job's task spec. The same connection carries the task's
rendezvous (:func:`~spark_imagenet.training.task.rendezvous.rendezvous`): Spark's own,
``BarrierTaskContext.allGather``, costs about one second per job however fast the tasks meet (the
executor's JVM looks for the coordinator's answer once a second), the driver's answer comes as soon as the
last task's entry has. This module holds what both sides share: the protocol, its bounds and the spec.
Pure standard library: no TensorFlow, no PySpark.

Wire format (one TCP connection per sender)::

    task -> driver   SECRET\\n                 the job's secret (32 hex characters), once, first
    task -> driver   RANK\\tHOST\\tTEXT\\n       one line of output, UTF-8, as many as needed
    task -> driver   @meet\\t{"stage": S, "tasks": N, "rank": R, "entry": E}\\n     once, at the rendezvous
    driver -> task   {"entries": [E0, E1, ...]}\\n | {"error": "why"}\\n          the answer, once

``RANK`` is a decimal integer, ``HOST`` has no tab or newline (the sender
replaces them by spaces), ``TEXT`` is the rest of the line and may hold
tabs. The sender splits a text with line breaks into several lines. The
server decodes with ``errors="replace"`` and passes
``on_line(rank, host, text)``; a line it cannot parse arrives as rank -1,
host ``"?"``, with the whole line as text. A rendezvous line starts with :data:`MEET` (a log line starts
with a digit), so the two never mix up; ``E`` is the very string a task would give ``allGather``
(``{"address": "host:port"}`` or ``{"failed": "reason"}`` as JSON), ``S`` Spark's stage id (a barrier
result stage is never retried: Spark aborts its job, and a relaunch is a new stage). Once all ``N`` tasks
of stage ``S`` have sent theirs, the driver writes the entries in rank order to each of them; it writes
nothing else, ever.

Security properties:

* the server binds the address it is given (the driver's address, e.g.
  ``spark.driver.host``), on an ephemeral port; never all interfaces unless
  it is told ``0.0.0.0``;
* a per-job secret (``secrets.token_hex(16)``, compared with
  ``hmac.compare_digest``) must be the first line; a wrong, silent (10 s)
  or oversized (over 200 bytes) first line closes the connection unread;
* everything is bounded: line length (longer lines are cut with a
  ``... [N chars cut]`` marker, and a partial line is never buffered beyond
  that bound; a rendezvous line that long is answered with an error), lines per second per connection (a
  token bucket; the excess is dropped and announced by one notice line per dropped run; the rendezvous
  line is never dropped), one rendezvous per connection, and concurrent connections;
* the traffic is plaintext: the channel carries log lines, addresses and failure reasons only, never
  data, weights or credentials.

Failure properties: the log lines never slow or fail training.
:meth:`LogSender.send` never blocks and never raises; it puts the line on a
bounded queue that a daemon thread writes out, and drops (and counts) what
does not fit. A server that cannot be reached, goes away or stops reading
ends the sending (recorded in :attr:`LogSender.error`). On
the driver, an exception in ``on_line`` is counted, never fatal to the
server thread. The rendezvous needs the connection: a task of a
multiworker job that cannot connect fails at once, in the stage :data:`STAGE_CONNECT`, naming the
driver's address and port (it could not send its entry, so its peers would wait for it), and the driver
launches the stage again with Spark's ``allGather`` for every task
(:mod:`spark_imagenet.training.driver.launch`). A driver that goes away fails the waiting tasks.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from spark_imagenet.errors import ConfigError, TrainingError

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
#: What starts a task's rendezvous line (a log line starts with its rank: a digit).
MEET = b"@meet\t"
#: Longest answer a task reads, in bytes (one entry per task).
MAX_ANSWER_BYTES = 16 << 20
#: Longest failure reason a task sends to the rendezvous, in characters (its own error keeps all of it).
MAX_REASON_CHARS = 500
#: The stage of a task's failure when it cannot connect to the driver's channel (the driver, seeing it,
#: launches the stage again with Spark's ``allGather``).
STAGE_CONNECT = "connecting to the driver's log channel"
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
        lines: bool, whether the tasks send their output lines (False where their stderr is the driver's
            console already, ``local[N]``: the channel then carries the rendezvous alone).

    Raises:
        ConfigError: an empty host, a port outside 1..65535, or a secret that
            is empty, has a line break, or is over 200 bytes.
    """

    host: str
    port: int
    secret: str = dataclasses.field(repr=False)
    lines: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"log channel host {self.host!r} must be a non-empty string")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ConfigError(f"log channel port {self.port!r} is outside 1..65535")
        if (not isinstance(self.secret, str) or not self.secret or "\n" in self.secret or "\r" in self.secret
                or len(self.secret.encode("utf-8")) > MAX_AUTH_BYTES):
            raise ConfigError(f"log channel secret must be 1..{MAX_AUTH_BYTES} bytes on one line")
        if not isinstance(self.lines, bool):
            raise ConfigError(f"log channel lines {self.lines!r} must be True or False")


def check_positive(name: str, value: float, integer: bool) -> None:
    """Raise ConfigError unless ``value`` is a positive number (an int when ``integer``)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ConfigError(f"log server {name}={value!r} must be a positive {'integer' if integer else 'number'}",
                          key=name, value=value)


def meet_line(stage: int, tasks: int, rank: int, entry: str) -> bytes:
    """A task's rendezvous line: :data:`MEET`, its stage, the stage's task count, its rank and its entry."""
    body = json.dumps({"stage": stage, "tasks": tasks, "rank": rank, "entry": entry}, separators=(",", ":"))
    return MEET + body.encode("utf-8") + b"\n"


def parse_meet(raw: bytes) -> tuple[int, int, int, str]:
    """``(stage, tasks, rank, entry)`` of a rendezvous line (without its newline).

    Raises:
        ValueError: not a JSON object with integer ``stage``, ``tasks`` > 0 and ``rank`` and a string
            ``entry`` (the message says what came).
    """
    try:
        message = json.loads(raw[len(MEET):].decode("utf-8"))
        stage, tasks, rank, entry = (message[k] for k in ("stage", "tasks", "rank", "entry"))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"the rendezvous line is not a JSON object of stage, tasks, rank and entry ({e})") from None
    if not all(type(v) is int for v in (stage, tasks, rank)) or tasks < 1 or not isinstance(entry, str):
        raise ValueError(f"the rendezvous line needs integer stage, tasks > 0 and rank and a string entry, got "
                         f"{message}")
    return stage, tasks, rank, entry


def answer_line(entries: list[str] | None = None, error: str | None = None) -> bytes:
    """The driver's answer to a rendezvous: every entry in rank order, or why it refused this one."""
    message: dict[str, Any] = {"entries": entries} if error is None else {"error": error}
    return json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n"


def parse_answer(raw: bytes, where: str) -> list[str]:
    """The entries of the driver's answer ``raw`` (without its newline); ``where`` is the driver's address.

    Raises:
        TrainingError: the driver refused the rendezvous (its reason), or answered something else.
    """
    try:
        message = json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise TrainingError(f"the driver's log channel at {where} answered the rendezvous with no JSON ({e})") from None
    if isinstance(message, dict) and "error" in message:
        raise TrainingError(f"the driver's log channel at {where} refused this task's rendezvous: {message['error']}")
    entries = message.get("entries") if isinstance(message, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise TrainingError(f"the driver's log channel at {where} answered the rendezvous with no list of entries")
    return entries
