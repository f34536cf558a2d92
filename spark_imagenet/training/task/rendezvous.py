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
  port: under ``local[N]`` all tasks share one host), then exchanged over the driver's log channel
  (:meth:`~spark_imagenet.training.task.logsender.LogSender.meet`: the driver answers with the entries in
  rank order as soon as the last has come) or, where the job has no channel (a remote Spark Connect
  server), with ``BarrierTaskContext.allGather`` (Spark's BarrierCoordinator stores each message at the
  index of the sender's partition id, so the gathered list is in rank order; it costs about one second,
  the executor's JVM looking for the answer once a second). The driver chooses before the stage, so every
  task of a stage meets the same way; :func:`rendezvous` checks that its own entry sits at its rank.

The port is probed, released, and then bound again by TensorFlow's gRPC
server in the child process: another process could take it in between
(tensorflow#35383). The window is kept short: the probe socket is held until
every task has gathered, and the child starts right after.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Sequence

from spark_imagenet.errors import ConfigError, PeerFailed, TrainingError
from spark_imagenet.training.job.logchannel import MAX_REASON_CHARS
from spark_imagenet.training.task.logsender import LogSender


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


def _gather(ctx, channel: LogSender | None, message: str) -> list[str]:
    """Every task's ``message`` in rank order: over the driver's log channel, else (no channel) ``allGather``."""
    if channel is None:
        return ctx.allGather(message)
    return channel.meet(ctx.stageId(), len(ctx.getTaskInfos()), message)


def rendezvous(ctx, failure: str | None = None, channel: LogSender | None = None) -> tuple[int, list[str], str]:
    """Agree on rank and worker addresses inside a barrier task, or on the failure of one.

    Must be called exactly once by every task of the barrier stage (it blocks until all tasks reach it),
    also by a task whose preparation failed: it passes ``failure`` and every task then raises
    :class:`PeerFailed`. So no task is still blocked in the rendezvous when a
    peer fails (Spark would kill it there, and the JVM prints that kill's
    ``TaskKilledException`` stack trace on the driver's console).

    Args:
        ctx: the task's ``pyspark.BarrierTaskContext``.
        failure: None, or this task's one-line reason for not training (its
            shards could not be staged, its GPUs are missing); its first
            :data:`~spark_imagenet.training.job.logchannel.MAX_REASON_CHARS` characters reach the peers.
        channel: this task's connection to the driver (:class:`~spark_imagenet.training.task.logsender.LogSender`,
            every task of the stage has one), or None: every task meets through ``allGather``.

    Returns:
        ``(rank, addresses, host)``: this task's rank (its partition id),
        every worker's ``host:port`` in rank order, and this task's host.

    Raises:
        PeerFailed: a task (this one included) came with a failure.
        TrainingError: the gathered list is inconsistent (wrong length, or
            this task's entry not at its rank), no port can be bound, or the channel failed
            (:meth:`~spark_imagenet.training.task.logsender.LogSender.meet`).
    """
    rank = ctx.partitionId()
    infos = ctx.getTaskInfos()
    if not 0 <= rank < len(infos):
        raise TrainingError(f"barrier task partition {rank} is outside the {len(infos)} task infos")
    host, _ = split_host_port(infos[rank].address)
    if failure is not None:
        reason = failure if len(failure) <= MAX_REASON_CHARS else failure[:MAX_REASON_CHARS - 4] + " ..."
        entries = [json.loads(e) for e in _gather(ctx, channel, json.dumps({"failed": reason}))]
        raise _failures(entries)
    sock = _probe_port(host)
    try:
        mine = join_host_port(host, sock.getsockname()[1])
        entries = [json.loads(e) for e in _gather(ctx, channel, json.dumps({"address": mine}))]
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
