"""A TCP proxy that models a network path: a delay and a per-connection rate cap.

Usage (normally started by ``benchmarks/fetch.py``)::

    .venv/bin/python benchmarks/throttle_proxy.py --upstream 127.0.0.1:PORT
        [--rtt-ms 40] [--mbps-per-connection 40] [--log FILE]

It listens on 127.0.0.1 on a free port, prints ``listening http://127.0.0.1:PORT``
on one line of stdout once ready, and relays every accepted TCP connection to
a new connection to ``--upstream`` byte for byte (it does not parse HTTP), until
it is terminated. Each connection gets this model of a network path, in each
direction separately:

* **delay**: every chunk of bytes is forwarded no earlier than ``RTT / 2``
  after the proxy received it (a one-way propagation delay; bytes stay in
  order). So an HTTP request's first byte reaches the server half a round
  trip late, and the first byte of its response reaches the client half a
  round trip after the server sent it: one full round trip per request.
* **connection set-up**: a new connection's first bytes towards the server
  also wait one extra round trip after the connection was accepted (the TCP
  handshake the client would wait for; TLS, one or two more round trips on
  an https endpoint, is not modelled).
* **rate cap**: each connection and direction is paced like a link of
  ``--mbps-per-connection`` MB/s (10**6 bytes per second, not megabits): a
  chunk of n bytes leaves n / rate after the link became free for it (the
  later of the chunk being due and the previous chunk having left). This is
  a token bucket that fills only while bytes wait, so an idle connection
  saves no burst; it may make up for a late timer wake-up by at most
  :data:`LAG_CREDIT` bytes, so timer jitter does not lower the rate.
* **window**: at most :data:`WINDOW_CHUNKS` chunks of up to :data:`CHUNK`
  bytes wait in the proxy per connection and direction; beyond that it stops
  reading, so the sender is held back by TCP flow control, as by a receive
  window (8 MiB is well above the bandwidth-delay product of the defaults,
  40 MB/s x 20 ms = 0.8 MB, so the window does not limit the rate).

Not modelled: slow start and congestion (a connection runs at the cap from
its first byte), packet loss, a bandwidth limit shared by all connections
(the client's NIC), and the server's own time to first byte beyond the
emulator's.

With ``--log FILE`` it appends one line per event: ``connection`` for each
accepted connection and ``request`` each time the client starts sending again
after the server spoke (one per request for HTTP/1.1 without pipelining).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

#: Bytes read from a socket at a time.
CHUNK = 64 * 1024
#: Chunks that may wait per connection and direction (the modelled window).
WINDOW_CHUNKS = 128
#: Bytes' worth of time by which a late timer wake-up may be made up (4 chunks).
LAG_CREDIT = 4 * CHUNK


class Model:
    """The network model's parameters and the event log.

    Args:
        rtt: round-trip time in seconds.
        rate: bytes per second per connection and direction.
        log: an open text file for ``connection``/``request`` lines, or None.
    """

    def __init__(self, rtt: float, rate: float, log=None):
        self.rtt = rtt
        self.rate = rate
        self.log = log

    def event(self, what: str) -> None:
        if self.log is not None:
            self.log.write(what + "\n")
            self.log.flush()


class Direction:
    """One direction of a proxied connection: reads chunks, delays and paces them."""

    def __init__(self, model: Model, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 not_before: float = 0.0, on_start=None):
        self.model = model
        self.reader = reader
        self.writer = writer
        self.not_before = not_before  # no byte leaves before this loop time (+ one-way delay)
        self.on_start = on_start  # called when a new burst of data starts after the other side spoke
        self.queue: asyncio.Queue = asyncio.Queue(WINDOW_CHUNKS)
        self.spoke = False  # set when data went through since the other side last spoke
        self.other: Direction | None = None

    async def pump_in(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await self.reader.read(CHUNK)
            if data and not self.spoke:
                self.spoke = True
                if self.other is not None:
                    self.other.spoke = False
                if self.on_start is not None:
                    self.on_start()
            await self.queue.put((loop.time(), data))
            if not data:
                return

    async def pump_out(self) -> None:
        loop = asyncio.get_running_loop()
        one_way = self.model.rtt / 2
        link_free = 0.0  # when the modelled link finishes sending what it was given so far
        while True:
            arrived, data = await self.queue.get()
            due = max(arrived, self.not_before) + one_way
            if not data:
                if (wait := max(due, link_free) - loop.time()) > 0:
                    await asyncio.sleep(wait)
                with contextlib.suppress(OSError):
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                return
            # The link starts on this chunk when it is due and the link is free; a late timer
            # wake-up is made up for (start in the past) by at most LAG_CREDIT bytes' time, an
            # idle link saves no credit (start never before the chunk is due).
            start = max(due, link_free, loop.time() - LAG_CREDIT / self.model.rate)
            link_free = start + len(data) / self.model.rate
            if (wait := link_free - loop.time()) > 0:
                await asyncio.sleep(wait)
            self.writer.write(data)
            await self.writer.drain()


async def relay(model: Model, upstream: tuple[str, int], c_reader, c_writer) -> None:
    """Proxy one accepted client connection to a new upstream connection."""
    loop = asyncio.get_running_loop()
    accepted = loop.time()
    model.event("connection")
    try:
        u_reader, u_writer = await asyncio.open_connection(*upstream)
    except OSError:
        c_writer.close()
        return
    up = Direction(model, c_reader, u_writer, not_before=accepted + model.rtt,
                   on_start=lambda: model.event("request"))
    down = Direction(model, u_reader, c_writer)
    up.other, down.other = down, up
    tasks = [asyncio.ensure_future(t) for t in (up.pump_in(), up.pump_out(), down.pump_in(), down.pump_out())]
    try:
        # Done when both directions have delivered their end of stream, or on the first error.
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        if any(t.exception() for t in done if not t.cancelled()):
            for t in pending:
                t.cancel()
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in (u_writer, c_writer):
            w.close()
            with contextlib.suppress(Exception):
                await w.wait_closed()


async def serve(model: Model, upstream: tuple[str, int], port: int = 0) -> None:
    server = await asyncio.start_server(lambda r, w: relay(model, upstream, r, w), "127.0.0.1", port)
    print(f"listening http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="HOST:PORT (or http://HOST:PORT) to forward to")
    p.add_argument("--rtt-ms", type=float, default=40.0, help="round-trip time in ms (default: %(default)s)")
    p.add_argument("--mbps-per-connection", type=float, default=40.0,
                   help="MB/s (10**6 bytes/s) per connection and direction (default: %(default)s)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--log", help="append connection/request events to this file")
    args = p.parse_args(argv)
    if args.rtt_ms < 0 or args.mbps_per_connection <= 0:
        p.error("--rtt-ms must be >= 0 and --mbps-per-connection > 0")
    host, _, port = args.upstream.split("://")[-1].rstrip("/").rpartition(":")
    log = open(args.log, "a") if args.log else None
    model = Model(args.rtt_ms / 1000, args.mbps_per_connection * 1e6, log)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(model, (host, int(port)), args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
