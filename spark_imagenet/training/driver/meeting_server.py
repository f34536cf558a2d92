"""The driver's side of the rendezvous: :class:`MeetingServer` (the protocol: :mod:`spark_imagenet.training.job.meeting`)."""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import logging
import secrets
import socket
import threading
import time
from typing import Any, Iterator

from spark_imagenet.errors import ConfigError, TrainingError
from spark_imagenet.training.driver.logserver import driver_host, listen_on
from spark_imagenet.training.job.logchannel import AUTH_TIMEOUT_S, MAX_AUTH_BYTES, ChannelSpec
from spark_imagenet.training.job.meeting import HELLO_WINDOW_S, MAX_LINE_BYTES, decode, encode

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Attempt:
    """What the server knows of one barrier stage: its tasks' hellos, the decided mode and the entries."""

    tasks: int
    first: float
    hellos: set[int] = dataclasses.field(default_factory=set)
    mode: str | None = None
    entries: dict[int, str] = dataclasses.field(default_factory=dict)


class MeetingServer:
    """The rendezvous of a job's barrier tasks on the driver: one thread accepts, one thread per task serves.

    Use as a context manager (``__enter__`` starts, ``__exit__`` closes) or call :meth:`start` and :meth:`close`.

    Args:
        bind_host: str, the address to listen on: the driver's address as the executors reach it.
        hello_window: float, seconds after a stage's first hello within which all of its tasks must
            say hello for it to meet here (default :data:`~spark_imagenet.training.job.meeting.HELLO_WINDOW_S`).

    Attributes:
        met: the number of tasks that met here (got their ``entries``).
        fell_back: the stages (Spark's stage ids) told to meet through ``allGather``.
    """

    def __init__(self, bind_host: str, hello_window: float = HELLO_WINDOW_S) -> None:
        self._host = bind_host
        self._window = float(hello_window)
        self._secret = secrets.token_hex(16)
        self._listener: socket.socket | None = None
        self._spec: ChannelSpec | None = None
        self._cond = threading.Condition()
        self._attempts: dict[int, _Attempt] = {}
        self._closed = False
        self._conns: set[socket.socket] = set()
        self.met = 0
        self.fell_back: list[int] = []

    def start(self) -> MeetingServer:
        """Bind ``bind_host`` on an ephemeral port and start accepting.

        Returns:
            MeetingServer: ``self``.

        Raises:
            ConfigError: the address cannot be resolved or bound (the message names it).
        """
        listener = self._listener = listen_on(self._host, "the rendezvous server")
        self._spec = ChannelSpec(listener.getsockname()[0], listener.getsockname()[1], self._secret)
        threading.Thread(target=self._accept, name="spark-imagenet-meeting", daemon=True).start()
        return self

    @property
    def spec(self) -> ChannelSpec:
        """ChannelSpec: the address and secret the tasks need (raises TrainingError before :meth:`start`)."""
        if self._spec is None:
            raise TrainingError("the rendezvous server has not been started")
        return self._spec

    def close(self) -> None:
        """Stop accepting and wake every waiting connection (which then closes)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            conns, self._conns = list(self._conns), set()
        for conn in conns:  # a thread blocked reading a task's entry
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()

    def __enter__(self) -> MeetingServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            with self._cond:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="spark-imagenet-meeting-task",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """One task's connection: secret, hello, mode, and in ``tcp`` mode its entry and everyone's."""
        try:
            with conn, contextlib.suppress(OSError, ValueError):
                self._converse(conn)
        finally:
            with self._cond:
                self._conns.discard(conn)

    def _converse(self, conn: socket.socket) -> None:
        """:meth:`_serve`'s exchange (raises OSError when the task goes away, ValueError on a malformed entry)."""
        reader = conn.makefile("rb")
        conn.settimeout(AUTH_TIMEOUT_S)
        secret = reader.readline(MAX_AUTH_BYTES + 2).rstrip(b"\r\n")
        if not hmac.compare_digest(secret, self._secret.encode()):
            return  # not one of this job's tasks: closed unread
        try:
            key, rank = self._hello(decode(reader.readline(MAX_LINE_BYTES), "hello"))
        except ValueError as e:
            conn.sendall(encode({"error": str(e)}))
            return
        conn.settimeout(None)  # from now on the task waits for its peers, as in allGather
        mode = self._decide(key)
        if mode is None:
            return
        conn.sendall(encode({"mode": mode}))
        if mode != "tcp":
            return
        line = reader.readline(MAX_LINE_BYTES)
        if not line:
            return  # the task went away (Spark fails the stage)
        entries = self._gather(key, rank, decode(line, "entry").get("entry"))
        if entries is not None:
            conn.sendall(encode({"entries": entries}))

    def _hello(self, hello: dict[str, Any]) -> tuple[int, int]:
        """Register a task's hello; returns its stage and its rank.

        Raises:
            ValueError: a malformed hello, a rank outside the attempt's tasks, a rank said twice.
        """
        try:
            key, tasks, rank = int(hello["stage"]), int(hello["tasks"]), int(hello["rank"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"hello: needs integer stage, tasks and rank, got {hello}") from None
        with self._cond:
            attempt = self._attempts.setdefault(key, _Attempt(tasks, time.monotonic()))
            if tasks != attempt.tasks or not 0 <= rank < tasks or rank in attempt.hellos:
                raise ValueError(f"hello: rank {rank} of {tasks} task(s) does not fit stage {key} "
                                 f"({attempt.tasks} task(s), ranks said: {sorted(attempt.hellos)})")
            attempt.hellos.add(rank)
            if attempt.mode is None and len(attempt.hellos) == attempt.tasks:
                attempt.mode = "tcp"
            self._cond.notify_all()
        return key, rank

    def _decide(self, key: int) -> str | None:
        """Wait until the attempt's mode is decided: ``tcp`` once all tasks said hello, ``allgather`` once the
        window after the first hello has passed without them. None once the server closes."""
        with self._cond:
            attempt = self._attempts[key]
            while attempt.mode is None and not self._closed:
                left = attempt.first + self._window - time.monotonic()
                if left <= 0:
                    attempt.mode = "allgather"
                    self.fell_back.append(key)
                    logger.warning(
                        f"warning: {attempt.tasks - len(attempt.hellos)} of {attempt.tasks} barrier task(s) did not "
                        f"reach the driver's rendezvous at {self.spec.host}:{self.spec.port} within "
                        f"{self._window:g} s (a firewall, or tasks that started late): the job meets through "
                        "Spark's allGather instead")
                    self._cond.notify_all()
                    break
                self._cond.wait(left)
            return None if self._closed else attempt.mode

    def _gather(self, key: int, rank: int, entry: Any) -> list[str] | None:
        """Register ``rank``'s entry and wait for every task's; the entries in rank order, None once the server
        closes."""
        with self._cond:
            attempt = self._attempts[key]
            attempt.entries[rank] = str(entry)
            self._cond.notify_all()
            while len(attempt.entries) < attempt.tasks and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            self.met += 1
            return [attempt.entries[r] for r in range(attempt.tasks)]


@contextlib.contextmanager
def driver_meeting(sc) -> Iterator[ChannelSpec | None]:
    """A :class:`MeetingServer` on the driver's address (``spark.driver.host``) for one launch of a classic
    session (``sc``, its SparkContext); yields its spec, or None under Spark Connect (``sc`` None: the driver
    runs elsewhere) or when no address can be bound (one warning; the tasks then meet through ``allGather``).
    """
    if sc is None:
        yield None
        return
    host = driver_host(sc)
    try:
        server = MeetingServer(host).start()
    except ConfigError as e:
        logger.warning(f"warning: {e}; the barrier tasks meet through Spark's allGather (about 1 s more per job)")
        yield None
        return
    try:
        yield server.spec
    finally:
        server.close()
