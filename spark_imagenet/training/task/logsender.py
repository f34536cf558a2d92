"""The barrier task's side of the log channel: :class:`LogSender`, its log lines and its rendezvous (the
protocol and its bounds: :mod:`spark_imagenet.training.job.logchannel`)."""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections import deque

from spark_imagenet.errors import ConfigError, TrainingError
from spark_imagenet.training.job.logchannel import (
    CHUNK_BYTES,
    MAX_ANSWER_BYTES,
    MAX_HOST_CHARS,
    SEND_TIMEOUT_S,
    ChannelSpec,
    check_positive,
    meet_line,
    one_line,
    parse_answer,
)

logger = logging.getLogger(__name__)


class LogSender:
    """The task side of the log channel: a bounded queue and a daemon thread that writes it out.

    The thread starts with the sender: it connects once, writes the secret
    line, then the queued lines. It gives up for good (recorded in
    :attr:`error`; everything queued or sent afterwards counts as dropped;
    one warning on this task's own log says why and that its lines stay
    there) when the connection cannot be made, breaks, or takes no data for
    :data:`SEND_TIMEOUT_S` seconds. The task never waits for it to send its lines. Use as a
    context manager or call :meth:`close`.

    The rendezvous is the one exchange that needs the connection: :meth:`reach` waits for it (and raises when
    it cannot be made), :meth:`meet` sends this task's entry, queued behind the lines before it, and waits for
    the driver's answer: every task's entry, in rank order.

    Args:
        spec: ChannelSpec, the job's channel (``LogServer.spec`` on the driver).
        rank: int, this task's rank (>= 0), the first field of every line.
        host: str, this task's host name; tabs and line breaks become spaces,
            and it is cut to 255 characters.
        queue_lines: int, the most lines queued; a line that does not fit is
            dropped and counted in :attr:`dropped`.
        queue_bytes: int, the most bytes queued (encoded lines), likewise.
        connect_timeout_s: float, seconds to wait for the connection.

    Attributes:
        dropped: int, lines that were not sent (queue full, no connection,
            closed).
        sent: int, lines handed to the socket.
        error: str | None, why sending stopped (one line), or None.

    Raises:
        ConfigError: a spec that is not a ChannelSpec, a negative rank, a host
            that is not a string, or a bound that is not positive.
    """

    def __init__(self, spec: ChannelSpec, rank: int, host: str, *, queue_lines: int = 2000,
                 queue_bytes: int = 8 * 2**20, connect_timeout_s: float = 5.0) -> None:
        if not isinstance(spec, ChannelSpec):
            raise ConfigError(f"log sender needs a ChannelSpec, got {type(spec).__name__}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"log sender rank {rank!r} must be an integer >= 0")
        if not isinstance(host, str):
            raise ConfigError(f"log sender host {host!r} must be a string")
        for name, value, integer in (("queue_lines", queue_lines, True), ("queue_bytes", queue_bytes, True),
                                     ("connect_timeout_s", connect_timeout_s, False)):
            check_positive(name, value, integer)
        self._spec, self._connect_timeout, self._rank = spec, float(connect_timeout_s), rank
        self._where = f"{spec.host}:{spec.port}"
        self._reached = threading.Event()  # set once connected and authenticated, or once that failed
        self._unreachable: str | None = None
        safe_host = host.replace("\t", " ").replace("\r", " ").replace("\n", " ")[:MAX_HOST_CHARS]
        self._prefix = f"{rank}\t{safe_host}\t".encode("utf-8", errors="replace")
        self._max_lines, self._max_bytes = queue_lines, queue_bytes
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._inflight = 0  # lines taken off the queue and not yet written
        self._sock: socket.socket | None = None
        self._stopped = False  # no more sending: failed, or closed
        self._closing = False
        self.dropped = self.sent = 0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"spark-imagenet-log-sender-{rank}", daemon=True)
        self._thread.start()

    def send(self, text: str) -> None:
        """Queue ``text`` for the driver; never blocks, never raises.

        Args:
            text: str, one or more lines (split at line breaks; a non-str is
                sent as ``str(text)``). Lines that do not fit the queue, or
                come after the sender stopped, are dropped and counted.
        """
        try:
            lines = [self._prefix + ln.encode("utf-8", errors="replace") + b"\n"
                     for ln in (str(text).splitlines() or [""])]
            with self._lock:
                for line in lines:
                    if (self._stopped or self._closing or len(self._pending) >= self._max_lines
                            or self._pending_bytes + len(line) > self._max_bytes):
                        self.dropped += 1
                    else:
                        self._pending.append(line)
                        self._pending_bytes += len(line)
            self._wake.set()
        except Exception:  # noqa: BLE001 - logging must never fail the task
            with self._lock:
                self.dropped += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what can be sent within ``timeout_s`` seconds, then close; idempotent.

        What is still queued after the timeout is counted as dropped and the
        connection is shut down (the thread, a daemon, ends on its own).

        Args:
            timeout_s: float, seconds to wait for the queue to drain.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._wake.set()
        self._thread.join(max(0.0, timeout_s))
        if self._thread.is_alive():
            self._stop(f"close gave up flushing after {timeout_s:g} s")
            sock = self._sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in sendall
                except OSError:
                    pass

    def reach(self) -> None:
        """Wait until this sender is connected to the driver (at most its connect timeout and a send's).

        Raises:
            TrainingError: the connection could not be made; the message names the driver's address and port.
        """
        if not self._reached.wait(self._connect_timeout + SEND_TIMEOUT_S + 1.0):
            self._unreachable = f"no connection within {self._connect_timeout + SEND_TIMEOUT_S + 1.0:g} s"
        if self._unreachable is not None:
            raise TrainingError(f"cannot connect to the driver's log channel at {self._where} "
                                f"({self._unreachable}), which the rendezvous needs")

    def meet(self, stage: int, tasks: int, entry: str) -> list[str]:
        """Send this task's rendezvous ``entry`` for ``stage`` of ``tasks`` tasks; return every task's, in rank
        order (waits for the peers, as ``allGather`` does).

        Raises:
            TrainingError: the connection could not be made (:meth:`reach`), broke or was closed (the driver is
                gone, or the job was cancelled), or the driver refused the entry (its reason).
        """
        self.reach()
        line = meet_line(stage, tasks, self._rank, entry)
        with self._lock:
            stopped = self._stopped or self._closing
            if not stopped:  # never dropped: past the queue's bounds if need be
                self._pending.append(line)
                self._pending_bytes += len(line)
        if stopped:
            raise TrainingError(f"the connection to the driver's log channel at {self._where} ended before the "
                                f"rendezvous ({self.error or 'closed'})")
        self._wake.set()
        return parse_answer(self._answer(), self._where)

    def _answer(self) -> bytes:
        """The driver's answer line, read off the socket (the sender thread writes, this thread reads)."""
        sock, got = self._sock, bytearray()
        while b"\n" not in got:
            try:
                data = sock.recv(CHUNK_BYTES)
            except TimeoutError:  # the socket's send timeout: the peers are not all there yet
                continue
            except OSError as e:
                raise TrainingError(f"the connection to the driver's log channel at {self._where} broke while this "
                                    f"task waited for its peers ({self.error or one_line(e)})") from None
            if not data:
                raise TrainingError(f"the driver's log channel at {self._where} closed the connection while this "
                                    "task waited for its peers (the driver is gone, or the job was cancelled)")
            got += data
            if len(got) > MAX_ANSWER_BYTES:
                raise TrainingError(f"the driver's answer to the rendezvous is over {MAX_ANSWER_BYTES} bytes")
        return bytes(got[:got.index(b"\n")])

    def __enter__(self) -> LogSender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the sender thread
    def _stop(self, error: str | None) -> None:
        """Stop sending for good: record the first error, count what is queued as dropped."""
        with self._lock:
            if error and self.error is None:
                self.error = error
            self._stopped = True
            self.dropped += len(self._pending) + self._inflight
            self._inflight = 0
            self._pending.clear()
            self._pending_bytes = 0

    def _give_up(self, error: str) -> None:
        """Stop sending (:meth:`_stop`) and say so once on this task's own log (the executor's stderr)."""
        self._stop(error)
        with self._lock:
            closing = self._closing
        if not closing:
            logger.warning(f"warning: {error}; this task's lines stay in this executor's log")

    def _run(self) -> None:
        """The thread: connect, authenticate, then write batches until closed or broken."""
        where = self._where
        try:
            sock = socket.create_connection((self._spec.host, self._spec.port), timeout=self._connect_timeout)
        except OSError as e:
            self._unreachable = one_line(e)
            self._reached.set()
            self._give_up(f"cannot connect to the driver's log channel at {where}: {one_line(e)}")
            return
        with self._lock:
            self._sock = sock
        try:
            sock.settimeout(SEND_TIMEOUT_S)
            try:
                self._write(sock, self._spec.secret.encode("utf-8") + b"\n")
            except OSError as e:
                self._unreachable = one_line(e)
                raise
            finally:
                self._reached.set()
            while self._pump(sock):
                pass
            self._stop(None)
            sock.shutdown(socket.SHUT_WR)
        except TimeoutError:
            self._give_up(f"the driver's log channel at {where} stalled: it took no data for {SEND_TIMEOUT_S:g} s")
        except OSError as e:
            self._give_up(f"the connection to the driver's log channel at {where} broke: {one_line(e)}")
        finally:
            sock.close()

    def _pump(self, sock: socket.socket) -> bool:
        """Wait for lines and write one batch; False when done (closing and drained, or stopped).

        Raises:
            OSError: the connection broke, or the server has closed it.
        """
        if not self._closing:  # closing: drain without waiting (its wake-up may have been consumed already)
            self._wake.wait(0.5)
        self._wake.clear()
        batch = self._take()
        if batch:
            self._write(sock, batch)
            with self._lock:
                self.sent += self._inflight
                self._inflight = 0
            return True
        with self._lock:
            if self._stopped or self._closing:
                return False
        if _peer_closed(sock):
            raise ConnectionResetError("the server closed the connection")
        return True

    def _take(self) -> bytes:
        """Take queued lines, about :data:`CHUNK_BYTES` at most (at least one line), off the queue."""
        out: list[bytes] = []
        size = 0
        with self._lock:
            while self._pending and (not out or size + len(self._pending[0]) <= CHUNK_BYTES):
                line = self._pending.popleft()
                out.append(line)
                size += len(line)
            self._pending_bytes -= size
            self._inflight = len(out)
        return b"".join(out)

    @staticmethod
    def _write(sock: socket.socket, data: bytes) -> None:
        """Write ``data`` in chunks, each within the socket's send timeout (no SIGPIPE)."""
        view = memoryview(data)
        flags = getattr(socket, "MSG_NOSIGNAL", 0)
        for start in range(0, len(view), CHUNK_BYTES):
            sock.sendall(view[start:start + CHUNK_BYTES], flags)


def _peer_closed(sock: socket.socket) -> bool:
    """True when the server has closed its end (its one answer, to the rendezvous, is only peeked at here)."""
    selector = selectors.DefaultSelector()
    try:
        selector.register(sock, selectors.EVENT_READ)
        if not selector.select(0):
            return False
        return sock.recv(1, socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        selector.close()
