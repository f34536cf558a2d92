"""The log channel (tasks -> driver console) over real sockets on 127.0.0.1: order, security bounds, rate
bound, and a sender that never blocks or fails whatever the server does."""

from __future__ import annotations

import pickle
import socket
import threading
import time

import pytest

from spark_imagenet.errors import ConfigError, TrainingError
from spark_imagenet.training.driver.logserver import LogServer
from spark_imagenet.training.driver.preflight import SessionFacts
from spark_imagenet.training.job.logchannel import ChannelSpec
from spark_imagenet.training.task.logsender import LogSender

HOST = "127.0.0.1"


def wait_until(predicate, timeout: float = 20.0) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Lines:
    """An on_line callback that records ``(rank, host, text)`` and the calling thread."""

    def __init__(self) -> None:
        self.got: list[tuple[int, str, str]] = []
        self.threads: set[str] = set()

    def __call__(self, rank: int, host: str, text: str) -> None:
        self.threads.add(threading.current_thread().name)
        self.got.append((rank, host, text))

    def texts(self, rank: int | None = None) -> list[str]:
        return [t for r, _, t in list(self.got) if rank is None or r == rank]


def raw_client(spec: ChannelSpec, first: bytes | None = None) -> socket.socket:
    """A plain TCP connection to the server; sends ``first`` (default: the right secret line)."""
    sock = socket.create_connection((spec.host, spec.port), timeout=20)
    sock.sendall(spec.secret.encode() + b"\n" if first is None else first)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closes ``sock`` within 20 s (end of stream or reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def in_thread(fn, limit_s: float = 60.0) -> bool:
    """Run ``fn`` in a thread; True when it finished within ``limit_s`` (a blocked call fails, not hangs)."""
    done = threading.Event()

    def target() -> None:
        fn()
        done.set()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit_s)
    return done.is_set()


# ------------------------------------------------------------------ delivery
def test_two_senders_in_order_with_rank_host_tabs_and_odd_text():
    lines = Lines()
    with LogServer(HOST, lines) as server:
        with LogSender(server.spec, 0, "host-a") as s0, LogSender(server.spec, 1, "host\tb\nc") as s1:
            for i in range(200):
                s0.send(f"r0 line {i}")
                s1.send(f"r1 line {i}")
            s0.send("a\tb\tc")  # TEXT may hold tabs
            s1.send("caf\udce9 \u00e9 \u2603")  # a lone surrogate cannot be UTF-8: replaced, not fatal
            s1.send("two\nlines")
        assert s0.dropped == s1.dropped == 0 and s0.error is None and s1.error is None
        assert wait_until(lambda: len(lines.got) == 404)
        sock = raw_client(server.spec)
        sock.sendall(b"7\traw\tbad \xff\xfe bytes\n")
        sock.close()
        assert wait_until(lambda: len(lines.got) == 405)
    assert lines.texts(0) == [f"r0 line {i}" for i in range(200)] + ["a\tb\tc"]
    assert lines.texts(1) == [f"r1 line {i}" for i in range(200)] + ["caf? \u00e9 \u2603", "two", "lines"]
    assert {h for r, h, _ in lines.got if r == 0} == {"host-a"}
    assert {h for r, h, _ in lines.got if r == 1} == {"host b c"}
    assert lines.got[-1] == (7, "raw", "bad \ufffd\ufffd bytes")
    assert server.connections == 3 and server.rejected == 0 and server.dropped == 0
    assert threading.main_thread().name not in lines.threads


def test_on_line_exceptions_do_not_stop_the_server():
    got = []

    def on_line(rank, host, text):
        if text == "boom":
            raise RuntimeError("callback bug")
        got.append(text)

    with LogServer(HOST, on_line) as server:
        with LogSender(server.spec, 0, "h") as sender:
            for text in ("one", "boom", "two"):
                sender.send(text)
        assert wait_until(lambda: got == ["one", "two"])
        assert server.callback_errors == 1


# ------------------------------------------------------------------ who may talk
def test_wrong_secret_oversized_and_silent_first_lines_are_rejected():
    lines = Lines()
    with LogServer(HOST, lines, auth_timeout_s=0.5) as server:
        wrong = raw_client(server.spec, b"0" * 32 + b"\n0\th\tevil\n")
        assert closed_by_server(wrong)
        big = raw_client(server.spec, b"")
        try:
            big.sendall(b"x" * 10_000 + b"\n0\th\tevil\n")
        except OSError:
            pass  # the server may close while the client still writes
        assert closed_by_server(big)
        silent = raw_client(server.spec, b"")  # sends nothing: closed after auth_timeout_s
        assert closed_by_server(silent)
        assert wait_until(lambda: server.rejected == 3)
        for s in (wrong, big, silent):
            s.close()
    assert lines.got == [] and server.connections == 0


def test_connections_over_the_bound_are_closed():
    with LogServer(HOST, Lines(), max_connections=1) as server:
        first = raw_client(server.spec)
        assert wait_until(lambda: server.connections == 1)
        second = raw_client(server.spec, b"")
        assert closed_by_server(second)
        assert wait_until(lambda: server.rejected == 1)
        first.close()
        second.close()


# ------------------------------------------------------------------ bounded lines
def test_long_lines_are_cut_and_a_partial_line_stays_bounded():
    """A line over max_line_chars arrives cut, with the number of characters cut. A client sending 1 MB
    without a newline: the server keeps at most line_bytes_bound bytes of it and counts the rest; the line
    arrives cut when the newline (or, here, the end of the connection) comes."""
    lines = Lines()
    with LogServer(HOST, lines, max_line_chars=2000) as server:
        with LogSender(server.spec, 0, "h") as sender:
            sender.send("x" * 50_000)
            sender.send("\u00e9" * 50_000)  # two bytes each: the count is in characters
        assert wait_until(lambda: len(lines.got) == 2)
        sock = raw_client(server.spec)
        sock.sendall(b"3\th\t" + b"y" * 1_000_000)
        sock.close()
        assert wait_until(lambda: len(lines.got) == 3)
    assert lines.texts(0) == ["x" * 2000 + " ... [48000 chars cut]", "\u00e9" * 2000 + " ... [48000 chars cut]"]
    assert lines.got[2] == (3, "h", "y" * 2000 + " ... [998000 chars cut]")
    assert 0 < server.max_buffered <= server.line_bytes_bound < 10_000


# ------------------------------------------------------------------ bounded rate
def test_rate_bound_drops_the_excess_with_one_notice():
    lines = Lines()
    with LogServer(HOST, lines, lines_per_s=50, burst=100) as server:
        with LogSender(server.spec, 0, "h") as sender:
            for i in range(2000):
                sender.send(f"line {i}")
        assert sender.dropped == 0 and sender.error is None
        assert wait_until(lambda: any("dropped" in t for t in lines.texts()))
        texts = lines.texts()
    delivered = [t for t in texts if "dropped" not in t]
    notices = [t for t in texts if "dropped" in t]
    assert 100 <= len(delivered) <= 120
    assert delivered == [f"line {i}" for i in range(len(delivered))]
    assert server.dropped == 2000 - len(delivered) > 0
    assert notices == [f"... {server.dropped} line(s) dropped (over 50 lines/s)"]
    assert texts[-1] == notices[0]


# ------------------------------------------------------------------ the sender never blocks or fails
def test_sender_without_a_server_drops_and_records_the_error(log_lines):
    taken = socket.socket()
    taken.bind((HOST, 0))  # bound, never listening: connections are refused, and nobody else gets the port
    try:
        sender = LogSender(ChannelSpec(HOST, taken.getsockname()[1], "s" * 32), 0, "h")
        for i in range(10_000):
            sender.send(f"line {i}")
        assert wait_until(lambda: sender.error is not None)
        assert wait_until(lambda: sender.dropped == 10_000)
        assert "cannot connect" in sender.error and "\n" not in sender.error
        assert sender.sent == 0
        warned = [line for line in log_lines if "cannot connect to the driver's log channel" in line]
        assert len(warned) == 1 and warned[0].startswith("warning: ")  # on the task's own log (its stderr)
        assert warned[0].endswith("this task's lines stay in this executor's log")
        assert in_thread(sender.close, 30)
        sender.send("after close")
        assert sender.dropped == 10_001
    finally:
        taken.close()


def test_stalled_server_never_blocks_send_or_close():
    listener = socket.create_server((HOST, 0))
    listener.settimeout(20)
    peer = None
    try:
        sender = LogSender(ChannelSpec(HOST, listener.getsockname()[1], "s" * 32), 0, "h")
        peer, _ = listener.accept()  # accepted, never read
        line = "z" * 1000

        def flood() -> None:
            for _ in range(100_000):
                sender.send(line)

        assert in_thread(flood, 60), "send() blocked on a server that does not read"
        assert in_thread(lambda: sender.close(timeout_s=1), 60), "close() blocked"
        assert sender.dropped > 0 and sender.error is not None
        assert sender.dropped + sender.sent <= 100_000
    finally:
        if peer is not None:
            peer.close()
        listener.close()


def test_server_closed_midway_ends_sending_without_raising():
    lines = Lines()
    server = LogServer(HOST, lines).start()
    sender = LogSender(server.spec, 2, "h")
    try:
        sender.send("before")
        assert wait_until(lambda: lines.texts() == ["before"])
        server.close()

        def poke() -> bool:
            sender.send("after")
            return sender.error is not None

        assert wait_until(poke)
        assert "log channel" in sender.error and "\n" not in sender.error
        for _ in range(1000):
            sender.send("still after")
        assert sender.dropped > 0
    finally:
        assert in_thread(sender.close, 30)
        server.close()
    assert lines.texts() == ["before"]


# ------------------------------------------------------------------ spec and life cycle
def test_channel_spec_pickles_and_hides_its_secret():
    with LogServer(HOST, Lines()) as server:
        spec = server.spec
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec.host == HOST and 0 < spec.port < 65536 and len(spec.secret) == 32
    assert spec.secret not in repr(spec)
    for bad in ((HOST, 0, "s"), ("", 1, "s"), (HOST, 1, ""), (HOST, 1, "a\nb"), (HOST, 1, "s" * 201)):
        with pytest.raises(ConfigError):
            ChannelSpec(*bad)


def test_life_cycle_and_bad_arguments():
    server = LogServer(HOST, Lines())
    with pytest.raises(TrainingError, match="not been started"):
        server.spec
    server.start()
    assert server.start() is server
    server.close()
    server.close()  # idempotent
    with pytest.raises(TrainingError, match="closed"):
        server.start()
    with pytest.raises(ConfigError, match="cannot listen"):
        LogServer("192.0.2.1", Lines()).start()  # TEST-NET-1: not an address of this machine
    with pytest.raises(ConfigError) as e:
        LogServer(HOST, None)
    assert (e.value.key, e.value.value) == ("on_line", None)
    with pytest.raises(ConfigError) as e:
        LogServer(HOST, Lines(), burst=0)
    assert (e.value.key, e.value.value) == ("burst", 0)
    spec = ChannelSpec(HOST, 1, "s")
    with pytest.raises(ConfigError, match="rank"):
        LogSender(spec, -1, "h")
    with pytest.raises(ConfigError) as e:
        LogSender(spec, 0, "h", queue_lines=0)
    assert (e.value.key, e.value.value) == ("queue_lines", 0)


class _Cluster:
    """What ``launch._log_server`` reads of a SparkContext: a cluster master and the driver's host."""

    master = "spark://cluster:7077"

    @staticmethod
    def getConf():
        return type("Conf", (), {"get": staticmethod(lambda key, default=None: HOST)})()


@pytest.mark.parametrize("job_seconds", [0.0, 0.6])
def test_the_driver_warns_once_when_no_task_reaches_its_log_channel(monkeypatch, log_lines, job_seconds):
    """A job shorter than the bound is checked at its end; a longer one when the bound passes (once)."""
    from spark_imagenet.training.driver import launch

    monkeypatch.setattr(launch, "CHANNEL_WARN_S", 0.3)
    with launch._log_server(_Cluster(), SessionFacts(master=_Cluster.master)) as spec:
        assert spec is not None
        time.sleep(job_seconds)
    warned = [line for line in log_lines if "no task reached the driver's log channel" in line]
    assert len(warned) == 1 and f"at {spec.host}:{spec.port}" in warned[0]
    assert "training does not wait for the channel" in warned[0]


def test_the_driver_is_quiet_when_a_task_reached_its_log_channel(monkeypatch, log_lines):
    from spark_imagenet.training.driver import launch

    monkeypatch.setattr(launch, "CHANNEL_WARN_S", 0.3)
    with launch._log_server(_Cluster(), SessionFacts(master=_Cluster.master)) as spec:
        with LogSender(spec, 0, "h") as sender:
            sender.send("hello")
        time.sleep(0.6)
    assert any(line == "[rank 0 on h] hello" for line in log_lines)
    assert not [line for line in log_lines if "no task reached" in line]


def test_the_channel_listens_where_the_tasks_stderr_is_not_this_console_or_they_meet(monkeypatch):
    """Classic: every master but local[N], on spark.driver.host; local[N]: on 127.0.0.1 for the rendezvous
    alone (no lines: the tasks' stderr is this console), none for a one-worker strategy. Connect: only a
    loopback server running local[N] (its tasks' stderr is the server's console), on 127.0.0.1; any other
    server: none (its tasks meet through allGather)."""
    from spark_imagenet.training.driver import launch

    assert launch._channel_host(_Cluster(), SessionFacts(master=_Cluster.master)) == (HOST, True)
    assert launch._channel_host(_Cluster(), SessionFacts(master=_Cluster.master), "mirrored") == (HOST, True)
    assert launch._channel_host(None, SessionFacts(master="local[2]")) == ("127.0.0.1", False)
    assert launch._channel_host(None, SessionFacts(master="local[2]"), "mirrored") is None
    for url, server_master, expected in [("sc://127.0.0.1:15002", "local[2]", ("127.0.0.1", True)),
                                         ("sc://localhost:15002", "local[*]", ("127.0.0.1", True)),
                                         ("sc://127.0.0.1:15002", "spark://m:7077", None),
                                         ("sc://127.0.0.1:15002", None, None),  # the server does not say
                                         ("sc://workspace.example.com:443", "local[2]", None)]:
        facts = SessionFacts(master=server_master, connect_url=url)
        assert launch._channel_host(None, facts) == expected, (url, server_master)


# ------------------------------------------------------------------ the rendezvous on the channel
def _meet_all(spec: ChannelSpec, tasks: int, entries: dict[int, str], stage: int = 7) -> list:
    """Every rank's :meth:`LogSender.meet` at once (a thread each, a log line before and after it); each
    answer, or the exception it raised."""
    def one(rank: int):
        with LogSender(spec, rank, f"host-{rank}") as sender:
            sender.send(f"before {rank}")
            try:
                return sender.meet(stage, tasks, entries[rank])
            except TrainingError as e:
                return e
            finally:
                sender.send(f"after {rank}")

    results: list = [None] * len(entries)

    def run(i: int, rank: int) -> None:
        results[i] = one(rank)

    threads = [threading.Thread(target=run, args=(i, r), daemon=True) for i, r in enumerate(entries)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_tasks_meet_on_the_channel_in_rank_order_while_their_lines_flow():
    lines = Lines()
    with LogServer(HOST, lines) as server:
        answers = _meet_all(server.spec, 3, {2: "c", 0: "a", 1: "b"})
        assert wait_until(lambda: len(lines.texts()) == 6)
    assert answers == [["a", "b", "c"]] * 3 and server.met == 3
    assert sorted(lines.texts()) == sorted(f"{w} {r}" for r in range(3) for w in ("before", "after"))
    assert [lines.texts(r) for r in range(3)] == [[f"before {r}", f"after {r}"] for r in range(3)]


def test_a_rendezvous_that_does_not_fit_is_refused_and_the_others_still_meet():
    with LogServer(HOST, Lines()) as server:
        with LogSender(server.spec, 5, "h") as outside:
            with pytest.raises(TrainingError, match="refused this task's rendezvous: rank 5 of 2 task"):
                outside.meet(7, 2, "x")
        assert 7 not in server._meetings  # a refused entry opens no rendezvous (the others' start below waits on it)
        with LogSender(server.spec, 0, "h") as first, LogSender(server.spec, 0, "h") as twice:
            waiting = threading.Thread(target=lambda: first.meet(7, 2, "a"), daemon=True)
            waiting.start()
            assert wait_until(lambda: 7 in server._meetings)
            with pytest.raises(TrainingError, match=r"rank 0 of 2 task\(s\) does not fit stage 7 .*ranks come: \[0\]"):
                twice.meet(7, 2, "again")
            assert _meet_all(server.spec, 2, {1: "b"}) == [["a", "b"]]
            waiting.join(30)
        assert server.met == 2


def test_a_wrong_secret_is_refused_at_the_rendezvous():
    with LogServer(HOST, Lines()) as server:
        wrong = ChannelSpec(server.spec.host, server.spec.port, "0" * 32)
        with LogSender(wrong, 0, "h") as sender:
            with pytest.raises(TrainingError, match="log channel at .* (closed the connection|broke)"):
                sender.meet(7, 1, "a")
        assert wait_until(lambda: server.rejected == 1) and server.met == 0


def test_a_task_that_cannot_connect_is_told_so_at_once_with_the_address():
    taken = socket.socket()
    taken.bind((HOST, 0))  # bound, never listening: connections are refused
    try:
        port = taken.getsockname()[1]
        with LogSender(ChannelSpec(HOST, port, "s" * 32), 0, "h") as sender:
            with pytest.raises(TrainingError, match=f"cannot connect to the driver's log channel at {HOST}:{port} "
                                                    r"\(ConnectionRefusedError"):
                sender.reach()
            with pytest.raises(TrainingError, match=f"{HOST}:{port}"):
                sender.meet(7, 2, "a")
    finally:
        taken.close()


def test_a_driver_that_goes_away_fails_the_waiting_task_with_one_message():
    server = LogServer(HOST, Lines()).start()
    failed: list[BaseException] = []

    def wait() -> None:
        with LogSender(server.spec, 0, "h") as sender:
            try:
                sender.meet(7, 2, "a")
            except TrainingError as e:
                failed.append(e)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    assert wait_until(lambda: 7 in server._meetings)
    server.close()
    thread.join(30)
    assert failed and "closed the connection while this task waited for its peers" in str(failed[0])


def test_a_rendezvous_line_over_the_bound_is_answered_with_an_error():
    with LogServer(HOST, Lines(), max_line_chars=100) as server:
        with LogSender(server.spec, 0, "h") as sender:
            with pytest.raises(TrainingError, match=f"over {server.line_bytes_bound} bytes"):
                sender.meet(7, 1, "x" * 2000)
            assert sender.meet(8, 1, "short") == ["short"]  # the connection goes on


def test_a_rendezvous_whose_last_task_does_not_come_ends_with_the_missing_ranks_and_the_setting():
    """A stuck peer (alive, never at the rendezvous) does not hold the others forever: after the bound
    (``spark.barrier.sync.timeout``) the tasks that came are answered with the ranks that did not."""
    with LogServer(HOST, Lines(), meet_timeout_s=0.5) as server:
        answers = _meet_all(server.spec, 3, {0: "a", 2: "c"})
        assert not server._meetings and server.met == 0
    assert all(isinstance(a, TrainingError) for a in answers), answers
    assert "rank(s) [1] of the 3 tasks of stage 7" in str(answers[0])
    assert "spark.barrier.sync.timeout" in str(answers[1])


def test_the_rendezvous_bound_is_the_sessions_barrier_timeout():
    from spark_imagenet.training.driver.preflight import barrier_timeout_seconds

    assert barrier_timeout_seconds(SessionFacts(master="local[2]")) == 365 * 86400
    facts = SessionFacts(master="local[2]", conf=(("spark.barrier.sync.timeout", "3600s"),))
    assert barrier_timeout_seconds(facts) == 3600
    assert barrier_timeout_seconds({"spark.barrier.sync.timeout": "90"}) == 90  # a job's --conf, a bare number
    with pytest.raises(ConfigError) as e:
        barrier_timeout_seconds(SessionFacts(master="local[2]", conf=(("spark.barrier.sync.timeout", "soon"),)))
    assert (e.value.key, e.value.value) == ("spark.barrier.sync.timeout", "soon")
