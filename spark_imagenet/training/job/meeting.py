"""The rendezvous on the driver: the protocol its server and the barrier tasks share.

Spark's own rendezvous, ``BarrierTaskContext.allGather``, costs about one second per job however fast the
tasks meet: the executor's JVM checks the coordinator's answer in a loop that sleeps one second between
looks (``BarrierTaskContext.runBarrier`` in Spark 4). A job of a classic session therefore meets on the
driver instead: a :class:`~spark_imagenet.training.driver.meeting_server.MeetingServer` listens there, and
each task exchanges the same JSON entry it would give ``allGather`` (its address, or why it cannot train)
over one TCP connection (``task/rendezvous.py``, :func:`~spark_imagenet.training.task.rendezvous.rendezvous`).
The answer is the same list, in rank order, as ``allGather``'s. Pure standard library.

Wire format, one connection per task, each message one line of UTF-8 text::

    task -> driver   SECRET                                  the job's secret, first
    task -> driver   {"stage": S, "tasks": N, "rank": R}      hello, when the task starts
    driver -> task   {"mode": "tcp"} | {"mode": "allgather"}                once decided
    task -> driver   {"entry": "<the allGather message>"}                   tcp mode, at the rendezvous
    driver -> task   {"entries": ["<message of rank 0>", ...]}              once all N have come
    driver -> task   {"error": "<why>"}                                     instead, on a protocol error

**Every task of a stage meets the same way** (a stage is Spark's stage id: a barrier result stage is
not retried, and a relaunch after a lost worker is a new job with a new stage). A task that cannot reach the driver (a firewall that
lets only Spark's own ports through) cannot say so over this connection, so the driver decides for the
whole stage: ``tcp`` once all N hellos have come, ``allgather`` when they have not all come within
:data:`HELLO_WINDOW_S` of the first (the tasks of a barrier stage start together, and the hello is sent at
the task's start, before its shards are staged). A task that could not connect uses ``allGather``, and so
do all the others, which the driver told ``allgather``. The cost of that case is the window, once per job,
and one warning on the driver.

Security: as the log channel (:mod:`spark_imagenet.training.job.logchannel`): the server binds the driver's
address on an ephemeral port, the per-job secret comes first (``hmac.compare_digest``), every line is
bounded (:data:`MAX_LINE_BYTES`), and the traffic is plaintext: addresses and failure reasons only.
"""

from __future__ import annotations

import json
from typing import Any

#: Seconds after a stage's first hello within which all its tasks must say hello for ``tcp`` mode.
HELLO_WINDOW_S = 30.0
#: Seconds a task waits to connect to the driver (and to send its secret and hello) before it meets through
#: ``allGather``.
CONNECT_TIMEOUT_S = 5.0
#: Longest line either side accepts, in bytes (an answer holds one entry per task).
MAX_LINE_BYTES = 16 << 20
#: The two ways a stage meets.
MODES = ("tcp", "allgather")


def encode(message: dict[str, Any]) -> bytes:
    """One protocol line: ``message`` as compact JSON and a newline."""
    return json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n"


def decode(line: bytes, where: str) -> dict[str, Any]:
    """The JSON object of one protocol line.

    Raises:
        ValueError: not a JSON object (the message names ``where``).
    """
    try:
        message = json.loads(line.decode("utf-8"))
    except ValueError as e:
        raise ValueError(f"{where}: not a JSON line ({e})") from None
    if not isinstance(message, dict):
        raise ValueError(f"{where}: not a JSON object")
    return message
