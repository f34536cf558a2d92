"""Rendezvous of the barrier tasks: who is rank r, and where does it listen.

TensorFlow's MultiWorkerMirroredStrategy reads the cluster from the
``TF_CONFIG`` environment variable (the format documented in the TensorFlow
"Multi-worker training with Keras" guide)::

    {"cluster": {"worker": ["host0:port0", "host1:port1", ...]},
     "task": {"type": "worker", "index": rank}}

Every worker must see the same ``worker`` list in the same order, and
``index`` must be its own position in it. In a Spark barrier stage:

* rank = the task's partition id (0..N-1, one partition per worker);
* host = the executor address Spark reports for that partition
  (``BarrierTaskContext.getTaskInfos()`` is ordered by partition id);
* port = chosen at run time on the executor by binding port 0 (never a fixed
  port: under ``local[N]`` all tasks share one host), then exchanged with
  ``BarrierTaskContext.allGather``. Spark's BarrierCoordinator stores each
  message at the index of the sender's partition id, so the gathered list is
  in rank order; :func:`rendezvous` checks that its own entry sits at its rank.

The port is probed, released, and then bound again by TensorFlow's gRPC
server in the child process: another process could take it in between
(tensorflow#35383). The window is kept short: the probe socket is held until
every task has gathered, and the child starts right after.
"""

from __future__ import annotations

import json
import logging
import socket
from typing import Any, Sequence

from spark_imagenet.errors import ConfigError, PeerFailed, TrainingError
from spark_imagenet.training.job.logchannel import ChannelSpec, one_line
from spark_imagenet.training.job.meeting import CONNECT_TIMEOUT_S, MAX_LINE_BYTES, MODES, decode, encode

logger = logging.getLogger(__name__)


def split_host_port(address: str) -> tuple[str, int | None]:
    """Split ``host:port`` (IPv6 in brackets: ``[::1]:7077``) into its parts.

    Args:
        address: ``"host:port"``, ``"[v6]:port"``, a bare host name or IPv4
            address, or a bare IPv6 address.

    Returns:
        ``(host, port)``; port is None when the address has none. IPv6 hosts
        come back without brackets.

    Raises:
        ValueError: empty address, or a port that is not a number.
    """
    a = address.strip()
    if not a:
        raise ValueError("empty address")
    if a.startswith("["):
        end = a.find("]")
        if end < 0:
            raise ValueError(f"unbalanced '[' in address {address!r}")
        host, rest = a[1:end], a[end + 1:]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"junk after ']' in address {address!r}")
        return host, int(rest[1:])
    if a.count(":") > 1:  # bare IPv6 address, no port
        return a, None
    if ":" in a:
        host, port = a.rsplit(":", 1)
        return host, int(port)
    return a, None


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (``[::1]:2222``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def build_tf_config(addresses: Sequence[str], rank: int) -> dict[str, Any]:
    """The ``TF_CONFIG`` dict of worker ``rank`` in a cluster of workers.

    Args:
        addresses: every worker's ``host:port``, in rank order.
        rank: this worker's index into ``addresses``.

    Returns:
        ``{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": rank}}``
        (serialise with ``json.dumps`` into the ``TF_CONFIG`` variable).

    Raises:
        ConfigError: no addresses, an address without a valid port
            (1..65535), duplicate addresses, or a rank outside
            ``0..len(addresses)-1``.
    """
    addresses = list(addresses)
    if not addresses:
        raise ConfigError("TF_CONFIG needs at least one worker address")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(addresses):
        raise ConfigError(f"worker rank {rank!r} is outside 0..{len(addresses) - 1}")
    for a in addresses:
        if not isinstance(a, str):
            raise ConfigError(f"worker address {a!r} is not a string")
        try:
            host, port = split_host_port(a)
        except ValueError as e:
            raise ConfigError(f"worker address {a!r} is not host:port ({e})") from None
        if not host or port is None or not 0 < port < 65536:
            raise ConfigError(f"worker address {a!r} is not host:port with a port in 1..65535")
    dupes = sorted({a for a in addresses if addresses.count(a) > 1})
    if dupes:
        raise ConfigError(f"duplicate worker addresses {dupes}: every worker needs its own port")
    return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}


def local_worker_count(addresses: Sequence[str], host: str) -> int:
    """How many workers listen on ``host`` (used to share a host's cores).

    Args:
        addresses: every worker's ``host:port``.
        host: the host (without port or brackets).

    Returns:
        int: the number of addresses whose host part equals ``host`` (>= 1
        when ``host`` is one of them).
    """
    return sum(1 for a in addresses if split_host_port(a)[0] == host)


def _probe_port(host: str) -> socket.socket:
    """A bound TCP socket on an ephemeral port; the caller closes it.

    Binds on all IPv4 interfaces first: TensorFlow's gRPC server listens on
    every interface, so a port free there is free on ``host`` too. Falls back
    to ``host`` itself (for example an IPv6-only executor).
    """
    errors = []
    for family, bind_host in ((socket.AF_INET, "0.0.0.0"), (None, host)):
        try:
            if family is None:
                infos = socket.getaddrinfo(bind_host, 0, type=socket.SOCK_STREAM)
                family, _, _, _, sockaddr = infos[0]
            else:
                sockaddr = (bind_host, 0)
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.bind(sockaddr)
            except OSError:
                s.close()
                raise
            return s
        except OSError as e:
            errors.append(f"{bind_host}: {e}")
    raise TrainingError(f"cannot bind any TCP port on this executor ({'; '.join(errors)})")


class DriverMeeting:
    """This task's connection to the rendezvous on the driver (protocol: :mod:`spark_imagenet.training.job.meeting`).

    Open it with :meth:`open` when the task starts (its hello); :func:`rendezvous` then gathers through it
    when the driver says ``tcp``, else through ``allGather``. Close it when the task ends.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._mode: str | None = None

    @classmethod
    def open(cls, spec: ChannelSpec | None, ctx) -> "DriverMeeting | None":
        """Connect to the driver's rendezvous at ``spec`` and say hello for ``ctx``'s task.

        Returns:
            DriverMeeting, or None without a ``spec`` or when the driver cannot be reached within
            :data:`~spark_imagenet.training.job.meeting.CONNECT_TIMEOUT_S` (one log line says so; the task then
            meets through ``allGather``, and so does every task of its stage).
        """
        if spec is None:
            return None
        hello = {"stage": ctx.stageId(), "tasks": len(ctx.getTaskInfos()), "rank": ctx.partitionId()}
        try:
            sock = socket.create_connection((spec.host, spec.port), timeout=CONNECT_TIMEOUT_S)
        except OSError as e:
            logger.info(f"rendezvous: the driver at {join_host_port(spec.host, spec.port)} cannot be reached "
                        f"({one_line(e)}): meeting through Spark's allGather")
            return None
        try:
            sock.sendall(spec.secret.encode("utf-8") + b"\n" + encode(hello))
            sock.settimeout(None)  # the answers come when the peers do, as allGather's
        except OSError as e:
            sock.close()
            logger.info(f"rendezvous: the driver's rendezvous went away ({one_line(e)}): meeting through allGather")
            return None
        return cls(sock)

    def _read(self, what: str) -> dict[str, Any]:
        try:
            line, reason = self._reader.readline(MAX_LINE_BYTES), "the driver is gone, or the job was cancelled"
        except OSError as e:  # a reset: the driver closed before reading all this task sent
            line, reason = b"", one_line(e)
        if not line:
            raise TrainingError(f"the driver's rendezvous closed the connection while this task waited for {what} "
                                f"({reason})")
        message = decode(line, f"the driver's answer ({what})")
        if "error" in message:
            raise TrainingError(f"the driver's rendezvous refused this task: {message['error']}")
        return message

    def mode(self) -> str:
        """How this stage meets, as the driver decided: ``"tcp"`` or ``"allgather"`` (waits for it).

        Raises:
            TrainingError: the driver refused the hello, went away, or answered something else.
        """
        if self._mode is None:
            mode = self._read("the way to meet").get("mode")
            if mode not in MODES:
                raise TrainingError(f"the driver's rendezvous answered an unknown mode {mode!r}")
            self._mode = mode
        return self._mode

    def gather(self, message: str) -> list[str]:
        """Send this task's ``message`` and return every task's, in rank order (``tcp`` mode).

        Raises:
            TrainingError: as :meth:`mode`.
        """
        try:
            self._sock.sendall(encode({"entry": message}))
        except OSError as e:
            raise TrainingError(f"the driver's rendezvous failed: {one_line(e)}") from None
        entries = self._read("its peers").get("entries")
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise TrainingError("the driver's rendezvous answered no list of entries")
        return entries

    def close(self) -> None:
        """Close the connection."""
        for closing in (self._reader, self._sock):
            try:
                closing.close()
            except OSError:
                pass


def _gather(ctx, meeting: DriverMeeting | None, message: str) -> list[str]:
    """Every task's ``message`` in rank order: through the driver when it said ``tcp``, else ``allGather``."""
    if meeting is not None and meeting.mode() == "tcp":
        return meeting.gather(message)
    return ctx.allGather(message)


def rendezvous(ctx, failure: str | None = None, meeting: DriverMeeting | None = None) -> tuple[int, list[str], str]:
    """Agree on rank and worker addresses inside a barrier task, or on the failure of one.

    Must be called exactly once by every task of the barrier stage (it calls
    ``allGather``, which blocks until all tasks reach it), also by a task
    whose preparation failed: it passes ``failure`` and every task then raises
    :class:`PeerFailed`. So no task is still blocked in ``allGather`` when a
    peer fails (Spark would kill it there, and the JVM prints that kill's
    ``TaskKilledException`` stack trace on the driver's console).

    Args:
        ctx: the task's ``pyspark.BarrierTaskContext``.
        failure: None, or this task's one-line reason for not training (its
            shards could not be staged, its GPUs are missing).
        meeting: this task's :class:`DriverMeeting`, or None (``allGather``).

    Returns:
        ``(rank, addresses, host)``: this task's rank (its partition id),
        every worker's ``host:port`` in rank order, and this task's host.

    Raises:
        PeerFailed: a task (this one included) came with a failure.
        TrainingError: the gathered list is inconsistent (wrong length, or
            this task's entry not at its rank), or no port can be bound.
    """
    rank = ctx.partitionId()
    infos = ctx.getTaskInfos()
    if not 0 <= rank < len(infos):
        raise TrainingError(f"barrier task partition {rank} is outside the {len(infos)} task infos")
    host, _ = split_host_port(infos[rank].address)
    if failure is not None:
        entries = [json.loads(e) for e in _gather(ctx, meeting, json.dumps({"failed": failure}))]
        raise _failures(entries)
    sock = _probe_port(host)
    try:
        mine = join_host_port(host, sock.getsockname()[1])
        entries = [json.loads(e) for e in _gather(ctx, meeting, json.dumps({"address": mine}))]
    finally:
        sock.close()
    if any("failed" in e for e in entries):
        raise _failures(entries)
    addresses = [e.get("address") for e in entries]
    if len(addresses) != len(infos) or addresses[rank] != mine:
        raise TrainingError(
            f"rendezvous of rank {rank} got an inconsistent address list {addresses} (own address {mine}): "
            "the rendezvous did not return one entry per task in partition order"
        )
    return rank, addresses, host


def _failures(entries: list[dict]) -> PeerFailed:
    """The :class:`PeerFailed` for the gathered entries that carry a failure."""
    failures = {r: str(e["failed"]) for r, e in enumerate(entries) if "failed" in e}
    listed = "; ".join(f"rank {r}: {why}" for r, why in sorted(failures.items()))
    return PeerFailed(f"{len(failures)} task(s) failed before the rendezvous: {listed}", failures)
