"""A log channel from the barrier tasks to the Spark driver's console.

When the executors run on other hosts, what a barrier task (or its
TensorFlow worker process) prints stays in that executor's log. This channel
carries those lines to the driver, which prints them as ``[rank R]`` lines
on its console: :class:`LogServer` listens on the driver, every task opens a
:class:`LogSender` on the :class:`ChannelSpec` that travels inside the job's
task spec. Pure standard library: no TensorFlow, no PySpark.

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
import hmac
import secrets
import selectors
import socket
import threading
import time
from collections import deque
from typing import Callable

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
#: Seconds between the server thread's housekeeping passes (auth deadlines, pending notices).
_TICK_S = 0.1
#: UTF-8 continuation bytes: deleting them from a byte string leaves one byte per character.
_CONTINUATION = bytes(range(0x80, 0xC0))


def _utf8_chars(data: bytes) -> int:
    """How many characters ``data`` holds as UTF-8 (continuation bytes are not counted)."""
    return len(data.translate(None, _CONTINUATION))


def _one_line(exc: BaseException) -> str:
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


class _Conn:
    """The server's state of one connection."""

    __slots__ = ("sock", "authed", "deadline", "buf", "cut", "tokens", "stamp", "run", "rank", "host")

    def __init__(self, sock: socket.socket, deadline: float, tokens: float) -> None:
        self.sock = sock
        self.authed = False
        self.deadline = deadline  # monotonic time by which the secret line must be complete
        self.buf = bytearray()  # the partial line (before authentication: the partial secret line)
        self.cut = 0  # characters of the partial line dropped beyond the buffer bound
        self.tokens = tokens  # token bucket: lines this connection may still pass at once
        self.stamp = time.monotonic()  # when tokens was last refilled
        self.run = 0  # lines dropped in the current over-the-rate run (0: not dropping)
        self.rank, self.host = -1, "?"  # from the last parsed line, for the dropped-run notice


def _check_positive(name: str, value: float, integer: bool) -> None:
    """Raise ConfigError unless ``value`` is a positive number (an int when ``integer``)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ConfigError(f"log server {name}={value!r} must be a positive {'integer' if integer else 'number'}")


class LogServer:
    """The driver side of the log channel: one daemon thread serves every sender.

    The thread multiplexes all connections with :mod:`selectors` on
    non-blocking sockets and calls ``on_line`` for each line, in arrival
    order per connection. Use as a context manager (``__enter__`` starts,
    ``__exit__`` closes) or call :meth:`start` and :meth:`close`.

    Args:
        bind_host: str, the address to listen on: the driver's address as the
            executors reach it (``spark.driver.host``), preferably numeric. The
            port is chosen by the system.
        on_line: Callable[[int, str, str], None], called from the server
            thread with ``(rank, host, text)`` for each line, and for each
            dropped-run notice (``"... N line(s) dropped (over L lines/s)"``).
            Its exceptions are counted in :attr:`callback_errors` and ignored.
            It should be quick: the thread waits for it.
        max_line_chars: int, the longest text passed on, in characters; longer
            ones are cut and end with ``" ... [N chars cut]"``.
        lines_per_s: float, the rate each connection's token bucket refills
            at, in lines per second.
        burst: int, the bucket's size, in lines. Once a connection goes over
            the rate, its lines are dropped until the bucket holds a tenth of
            ``burst`` again (at least one line); then one notice reports the
            run. The hysteresis keeps a sender just above the rate from
            producing a notice every other line.
        max_connections: int, connections open at once (authenticated or
            not); one more is closed at once and counted in :attr:`rejected`.
        auth_timeout_s: float, seconds a new connection has to send the secret.

    Attributes:
        rejected: int, connections closed unheard: wrong, silent or oversized
            first line, or over ``max_connections``.
        dropped: int, lines dropped over the rate.
        connections: int, connections authenticated so far.
        callback_errors: int, exceptions ``on_line`` raised.
        max_buffered: int, the largest partial line any connection held, in
            bytes (never more than :attr:`line_bytes_bound`).

    Raises:
        ConfigError: a non-callable ``on_line`` or a bound that is not positive.
    """

    def __init__(self, bind_host: str, on_line: Callable[[int, str, str], None], *, max_line_chars: int = 2000,
                 lines_per_s: float = 100.0, burst: int = 300, max_connections: int = 256,
                 auth_timeout_s: float = AUTH_TIMEOUT_S) -> None:
        if not isinstance(bind_host, str) or not bind_host:
            raise ConfigError(f"log server bind_host {bind_host!r} must be a non-empty address")
        if not callable(on_line):
            raise ConfigError(f"log server on_line {on_line!r} is not callable")
        for name, value, integer in (("max_line_chars", max_line_chars, True), ("lines_per_s", lines_per_s, False),
                                     ("burst", burst, True), ("max_connections", max_connections, True),
                                     ("auth_timeout_s", auth_timeout_s, False)):
            _check_positive(name, value, integer)
        self._bind_host, self._on_line = bind_host, on_line
        self._max_chars, self._rate, self._burst = max_line_chars, float(lines_per_s), burst
        self._resume = max(1, burst // 10)
        self._max_conns, self._auth_timeout = max_connections, float(auth_timeout_s)
        #: The most bytes a partial line may hold: the text at 4 bytes per character plus the fields before it.
        self.line_bytes_bound = 4 * max_line_chars + 512
        self.rejected = self.dropped = self.connections = self.callback_errors = self.max_buffered = 0
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._thread: threading.Thread | None = None
        self._conns: dict[int, _Conn] = {}
        self._spec: ChannelSpec | None = None
        self._stop = threading.Event()
        self._closed = False

    # ------------------------------------------------------------------ life cycle
    def start(self) -> LogServer:
        """Bind, listen and start the server thread (a no-op when already started).

        Returns:
            LogServer: ``self``.

        Raises:
            ConfigError: ``bind_host`` cannot be resolved or is not an address
                of this machine.
            TrainingError: the server was closed already.
        """
        if self._closed:
            raise TrainingError("the log server is closed; start a new one")
        if self._thread is not None:
            return self
        self._listener = self._bind()
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._listener, self._wake_r):
            s.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._spec = ChannelSpec(self._listener.getsockname()[0], self._listener.getsockname()[1],
                                 secrets.token_hex(16))
        self._thread = threading.Thread(target=self._serve, name="spark-imagenet-log-server", daemon=True)
        self._thread.start()
        return self

    def _bind(self) -> socket.socket:
        """A TCP socket listening on ``bind_host``, port 0 (raises ConfigError)."""
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                self._bind_host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            sock = socket.socket(family, kind, proto)
        except OSError as e:
            raise ConfigError(f"log server cannot resolve bind_host {self._bind_host!r} ({_one_line(e)}); "
                              "give the driver's address (spark.driver.host)") from None
        try:
            sock.bind(address)
            sock.listen(128)
        except OSError as e:
            sock.close()
            raise ConfigError(f"log server cannot listen on {self._bind_host!r} ({_one_line(e)}); "
                              "give an address of this machine (spark.driver.host)") from None
        return sock

    @property
    def spec(self) -> ChannelSpec:
        """ChannelSpec: the address and secret senders need (raises TrainingError before :meth:`start`)."""
        if self._spec is None:
            raise TrainingError("the log server has not been started: no channel spec yet")
        return self._spec

    def close(self) -> None:
        """Stop the thread (within 1 s unless ``on_line`` blocks) and close every socket; idempotent.

        Pending dropped-run notices and partial lines of open connections
        are passed to ``on_line`` (from the server thread) before it ends.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is None:
            return
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is threading.current_thread():  # close() from on_line: the loop ends after it
            return
        self._thread.join(1.0)
        if not self._thread.is_alive():
            self._wake_w.close()

    def __enter__(self) -> LogServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the server thread
    def _serve(self) -> None:
        """The thread's loop: accept, read, housekeeping; on stop, finish every connection."""
        last = time.monotonic()
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(_TICK_S):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._read(key.data)
                now = time.monotonic()
                if now - last >= _TICK_S:
                    self._housekeeping(now)
                    last = now
        finally:
            for conn in list(self._conns.values()):
                self._finish(conn)
            for s in (self._listener, self._wake_r):
                s.close()
            self._selector.close()

    def _drain_wake(self) -> None:
        try:
            self._wake_r.recv(64)
        except OSError:
            pass

    def _accept(self) -> None:
        """Accept what waits (at most 64 at a time); over ``max_connections``, close at once."""
        for _ in range(64):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. the peer reset before accept, or out of descriptors: try later
                return
            if len(self._conns) >= self._max_conns:
                self.rejected += 1
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self._auth_timeout, float(self._burst))
            self._conns[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        """Read what one connection sent; its end (or an error) finishes it."""
        try:
            data = conn.sock.recv(CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data and conn.authed:
            self._finish(conn)
        elif not data:
            self._reject(conn)
        elif conn.authed:
            self._feed(conn, data)
        else:
            self._authenticate(conn, data)

    def _authenticate(self, conn: _Conn, data: bytes) -> None:
        """Collect the first line; the secret admits the connection, anything else closes it."""
        conn.buf += data
        end = conn.buf.find(b"\n")
        if end < 0:
            if len(conn.buf) > MAX_AUTH_BYTES:
                self._reject(conn)
            return
        first, rest = bytes(conn.buf[:end]).rstrip(b"\r"), bytes(conn.buf[end + 1:])
        if end > MAX_AUTH_BYTES or not hmac.compare_digest(first, self._spec.secret.encode("utf-8")):
            self._reject(conn)
            return
        conn.authed, conn.buf = True, bytearray()
        self.connections += 1
        if rest:
            self._feed(conn, rest)

    def _feed(self, conn: _Conn, data: bytes) -> None:
        """Split ``data`` into lines; the partial line keeps at most ``line_bytes_bound`` bytes."""
        view, start = memoryview(data), 0
        while True:
            nl = data.find(b"\n", start)
            end = len(data) if nl < 0 else nl
            room = max(0, self.line_bytes_bound - len(conn.buf))
            conn.buf += view[start:min(end, start + room)]
            if end - start > room:
                conn.cut += _utf8_chars(bytes(view[start + room:end]))
            self.max_buffered = max(self.max_buffered, len(conn.buf))
            if nl < 0:
                return
            self._line(conn)
            start = nl + 1

    def _line(self, conn: _Conn) -> None:
        """Pass the connection's complete line on, if the rate allows; clear the line buffer."""
        rank, host, text = self._parse(bytes(conn.buf), conn.cut)
        conn.buf, conn.cut = bytearray(), 0
        if rank >= 0:
            conn.rank, conn.host = rank, host
        if self._admit(conn, time.monotonic()):
            self._emit(rank, host, text)

    def _parse(self, raw: bytes, cut: int) -> tuple[int, str, str]:
        """``(rank, host, text)`` of one line, text cut to ``max_line_chars`` with the marker."""
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        parts = line.split("\t", 2)
        if len(parts) == 3 and parts[0].isascii() and parts[0].isdigit() and len(parts[0]) <= 12:
            rank, host, text = int(parts[0]), parts[1][:MAX_HOST_CHARS], parts[2]
        else:
            rank, host, text = -1, "?", line
        if len(text) > self._max_chars:
            cut += len(text) - self._max_chars
            text = text[:self._max_chars]
        return rank, host, f"{text} ... [{cut} chars cut]" if cut else text

    def _admit(self, conn: _Conn, now: float) -> bool:
        """Token bucket with hysteresis: True when the line may pass; False counts it as dropped."""
        conn.tokens = min(float(self._burst), conn.tokens + (now - conn.stamp) * self._rate)
        conn.stamp = now
        if conn.run and conn.tokens >= self._resume:
            self._notice(conn)
        if not conn.run and conn.tokens >= 1.0:
            conn.tokens -= 1.0
            return True
        conn.run += 1
        self.dropped += 1
        return False

    def _notice(self, conn: _Conn) -> None:
        """Report the connection's dropped run (if any) with one line, and end the run."""
        if conn.run:
            run, conn.run = conn.run, 0
            self._emit(conn.rank, conn.host, f"... {run} line(s) dropped (over {self._rate:g} lines/s)")

    def _emit(self, rank: int, host: str, text: str) -> None:
        try:
            self._on_line(rank, host, text)
        except Exception:  # noqa: BLE001 - a faulty callback must not end the server thread
            self.callback_errors += 1

    def _housekeeping(self, now: float) -> None:
        """Close connections silent past their auth deadline; report runs whose bucket refilled."""
        for conn in list(self._conns.values()):
            if not conn.authed:
                if now > conn.deadline:
                    self._reject(conn)
            elif conn.run and min(float(self._burst), conn.tokens + (now - conn.stamp) * self._rate) >= self._resume:
                self._notice(conn)

    def _finish(self, conn: _Conn) -> None:
        """An authenticated connection ends: pass its partial line (if allowed) and its pending notice."""
        if conn.authed:
            if conn.buf or conn.cut:
                self._line(conn)
            self._notice(conn)
        self._close_conn(conn)

    def _reject(self, conn: _Conn) -> None:
        self.rejected += 1
        self._close_conn(conn)

    def _close_conn(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


class LogSender:
    """The task side of the log channel: a bounded queue and a daemon thread that writes it out.

    The thread starts with the sender: it connects once, writes the secret
    line, then the queued lines. It gives up for good (recorded in
    :attr:`error`; everything queued or sent afterwards counts as dropped)
    when the connection cannot be made, breaks, or takes no data for
    :data:`SEND_TIMEOUT_S` seconds. Use as a context manager or call
    :meth:`close`.

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
            _check_positive(name, value, integer)
        self._spec, self._connect_timeout = spec, float(connect_timeout_s)
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

    def _run(self) -> None:
        """The thread: connect, authenticate, then write batches until closed or broken."""
        where = f"{self._spec.host}:{self._spec.port}"
        try:
            sock = socket.create_connection((self._spec.host, self._spec.port), timeout=self._connect_timeout)
        except OSError as e:
            self._stop(f"cannot connect to the log server at {where}: {_one_line(e)}")
            return
        with self._lock:
            self._sock = sock
        try:
            sock.settimeout(SEND_TIMEOUT_S)
            self._write(sock, self._spec.secret.encode("utf-8") + b"\n")
            while self._pump(sock):
                pass
            self._stop(None)
            sock.shutdown(socket.SHUT_WR)
        except TimeoutError:
            self._stop(f"the log server at {where} stalled: it took no data for {SEND_TIMEOUT_S:g} s")
        except OSError as e:
            self._stop(f"the connection to the log server at {where} broke: {_one_line(e)}")
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
    """True when the server has closed its end (it never writes, so readable means end or reset)."""
    selector = selectors.DefaultSelector()
    try:
        selector.register(sock, selectors.EVENT_READ)
        if not selector.select(0):
            return False
        return sock.recv(1, socket.MSG_DONTWAIT if hasattr(socket, "MSG_DONTWAIT") else 0) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        selector.close()
