"""The driver's side of the log channel: :class:`LogServer`, the tasks' log lines and their rendezvous (the
protocol and its bounds: :mod:`spark_imagenet.training.job.logchannel`)."""

from __future__ import annotations

import dataclasses
import hmac
import secrets
import selectors
import socket
import threading
import time
from typing import Callable

from spark_imagenet.errors import ConfigError, TrainingError
from spark_imagenet.training.job.logchannel import (
    AUTH_TIMEOUT_S,
    CHUNK_BYTES,
    MAX_AUTH_BYTES,
    MAX_HOST_CHARS,
    MEET,
    ChannelSpec,
    answer_line,
    check_positive,
    one_line,
    parse_meet,
    utf8_chars,
)

#: Seconds between the server thread's housekeeping passes (auth deadlines, pending notices).
_TICK_S = 0.1
#: Seconds a rendezvous waits for its last task by default: Spark's own default of
#: ``spark.barrier.sync.timeout`` (365 days).
MEET_TIMEOUT_S = 365 * 86400.0


def driver_host(sc) -> str:
    """The address executors reach this driver at: ``spark.driver.host``, else this host's name (where the
    driver's log channel listens)."""
    return sc.getConf().get("spark.driver.host", None) or socket.gethostname()


def listen_on(bind_host: str, server: str) -> socket.socket:
    """A TCP socket listening on ``bind_host``, on a port the system chooses (the driver's log channel).

    Args:
        bind_host: the address to listen on (the driver's, ``spark.driver.host``).
        server: what listens, for the messages (``"log server"``).

    Raises:
        ConfigError: ``bind_host`` cannot be resolved, or is not an address of this machine.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            bind_host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ConfigError(f"{server} cannot resolve bind_host {bind_host!r} ({one_line(e)}); "
                          "give the driver's address (spark.driver.host)") from None
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ConfigError(f"{server} cannot listen on {bind_host!r} ({one_line(e)}); "
                          "give an address of this machine (spark.driver.host)") from None
    return sock


class _Conn:
    """The server's state of one connection."""

    __slots__ = ("sock", "authed", "deadline", "buf", "cut", "tokens", "stamp", "run", "rank", "host", "out",
                 "met", "closed")

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
        self.out = bytearray()  # the answer to its rendezvous, as far as the socket has not taken it
        self.met = False  # it has sent its rendezvous line
        self.closed = False


@dataclasses.dataclass
class _Meeting:
    """The rendezvous of one barrier stage: its task count, and each rank's entry and connection so far."""

    tasks: int
    entries: dict[int, str] = dataclasses.field(default_factory=dict)
    conns: dict[int, _Conn] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.monotonic)


class LogServer:
    """The driver side of the log channel: one daemon thread serves every sender.

    The thread multiplexes all connections with :mod:`selectors` on
    non-blocking sockets and calls ``on_line`` for each line, in arrival
    order per connection. It also gathers the tasks' rendezvous lines, by stage: once all N tasks of a stage
    have sent theirs, it writes the N entries in rank order back on each one's connection (a line that does
    not fit the stage, a rank said twice, a second rendezvous on one connection, is answered with an error;
    so is every task of a stage whose last task has not come ``meet_timeout_s`` after its first).
    Use as a context manager (``__enter__`` starts, ``__exit__`` closes) or call :meth:`start` and :meth:`close`.

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
        meet_timeout_s: float, seconds a stage's rendezvous waits, from its first task's line, for its last
            (the job's ``spark.barrier.sync.timeout``, which bounds ``allGather`` alike); then every task that
            came is answered with an error naming the ranks that did not.

    Attributes:
        rejected: int, connections closed unheard: wrong, silent or oversized
            first line, or over ``max_connections``.
        dropped: int, lines dropped over the rate.
        connections: int, connections authenticated so far.
        callback_errors: int, exceptions ``on_line`` raised.
        max_buffered: int, the largest partial line any connection held, in
            bytes (never more than :attr:`line_bytes_bound`).
        met: int, tasks that got every entry of their rendezvous.

    Raises:
        ConfigError: a non-callable ``on_line`` or a bound that is not positive.
    """

    def __init__(self, bind_host: str, on_line: Callable[[int, str, str], None], *, max_line_chars: int = 2000,
                 lines_per_s: float = 100.0, burst: int = 300, max_connections: int = 256,
                 auth_timeout_s: float = AUTH_TIMEOUT_S, meet_timeout_s: float = MEET_TIMEOUT_S) -> None:
        if not isinstance(bind_host, str) or not bind_host:
            raise ConfigError(f"log server bind_host {bind_host!r} must be a non-empty address", key="bind_host",
                              value=bind_host)
        if not callable(on_line):
            raise ConfigError(f"log server on_line {on_line!r} is not callable", key="on_line", value=on_line)
        for name, value, integer in (("max_line_chars", max_line_chars, True), ("lines_per_s", lines_per_s, False),
                                     ("burst", burst, True), ("max_connections", max_connections, True),
                                     ("auth_timeout_s", auth_timeout_s, False),
                                     ("meet_timeout_s", meet_timeout_s, False)):
            check_positive(name, value, integer)
        self._bind_host, self._on_line = bind_host, on_line
        self._max_chars, self._rate, self._burst = max_line_chars, float(lines_per_s), burst
        self._resume = max(1, burst // 10)
        self._max_conns, self._auth_timeout = max_connections, float(auth_timeout_s)
        self._meet_timeout = float(meet_timeout_s)
        #: The most bytes a partial line may hold: the text at 4 bytes per character plus the fields before it.
        self.line_bytes_bound = 4 * max_line_chars + 512
        self.rejected = self.dropped = self.connections = self.callback_errors = self.max_buffered = self.met = 0
        self._meetings: dict[int, _Meeting] = {}
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
        self._listener = listen_on(self._bind_host, "log server")
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
                for key, events in self._selector.select(_TICK_S):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        if events & selectors.EVENT_WRITE:
                            self._flush(key.data)
                        if events & selectors.EVENT_READ and not key.data.closed:
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
                conn.cut += utf8_chars(bytes(view[start + room:end]))
            self.max_buffered = max(self.max_buffered, len(conn.buf))
            if nl < 0:
                return
            self._line(conn)
            start = nl + 1

    def _line(self, conn: _Conn) -> None:
        """Pass the connection's complete line on, if the rate allows (a rendezvous line: to :meth:`_meet`);
        clear the line buffer."""
        raw, cut = bytes(conn.buf), conn.cut
        conn.buf, conn.cut = bytearray(), 0
        if raw.startswith(MEET):
            self._meet(conn, raw.rstrip(b"\r"), cut)
            return
        rank, host, text = self._parse(raw, cut)
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

    def _meet(self, conn: _Conn, raw: bytes, cut: int) -> None:
        """Register the connection's rendezvous entry; once its stage has all of them, answer every task."""
        try:
            if cut:
                raise ValueError(f"the rendezvous line is over {self.line_bytes_bound} bytes")
            if conn.met:
                raise ValueError("a second rendezvous on one connection")
            stage, tasks, rank, entry = parse_meet(raw)
            meeting = self._meetings.get(stage) or _Meeting(tasks)  # kept only once an entry fits
            if tasks != meeting.tasks or not 0 <= rank < tasks or rank in meeting.entries:
                raise ValueError(f"rank {rank} of {tasks} task(s) does not fit stage {stage} ({meeting.tasks} "
                                 f"task(s), ranks come: {sorted(meeting.entries)})")
        except ValueError as e:
            self._send(conn, answer_line(error=str(e)))
            return
        conn.met = True
        self._meetings[stage] = meeting
        meeting.entries[rank], meeting.conns[rank] = entry, conn
        if len(meeting.entries) < tasks:
            return
        del self._meetings[stage]
        answer = answer_line([meeting.entries[r] for r in range(tasks)])
        for peer in meeting.conns.values():
            if not peer.closed:  # a task that went away: Spark fails the stage
                self.met += 1
                self._send(peer, answer)

    def _send(self, conn: _Conn, data: bytes) -> None:
        """Queue ``data`` for the connection and write what its socket takes now (the rest when writable)."""
        conn.out += data
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        """Write what the socket takes of the connection's answer; watch for writability while some is left."""
        try:
            del conn.out[:conn.sock.send(conn.out, getattr(socket, "MSG_NOSIGNAL", 0))]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the task went away: its read ends the connection
            conn.out.clear()
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        if self._selector.get_key(conn.sock).events != events:
            self._selector.modify(conn.sock, events, conn)

    def _emit(self, rank: int, host: str, text: str) -> None:
        try:
            self._on_line(rank, host, text)
        except Exception:  # noqa: BLE001 - a faulty callback must not end the server thread
            self.callback_errors += 1

    def _housekeeping(self, now: float) -> None:
        """Close connections silent past their auth deadline; report runs whose bucket refilled; end
        rendezvous past their timeout."""
        for stage, meeting in list(self._meetings.items()):
            if now - meeting.started > self._meet_timeout:
                del self._meetings[stage]
                missing = sorted(set(range(meeting.tasks)) - set(meeting.entries))
                answer = answer_line(error=(
                    f"rank(s) {missing} of the {meeting.tasks} tasks of stage {stage} did not come to the "
                    f"rendezvous within {self._meet_timeout:g} s of the first (spark.barrier.sync.timeout): they "
                    "are stuck before it (a shard fetch?); see their executors' logs, or raise the setting if "
                    "the slowest fetch needs longer"))
                for conn in meeting.conns.values():
                    if not conn.closed:
                        self._send(conn, answer)
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
        conn.closed = True
        self._conns.pop(conn.sock.fileno(), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
