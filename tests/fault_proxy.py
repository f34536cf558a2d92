"""A fault-injecting HTTP proxy in front of the GCS emulator, for tests.

:class:`FaultProxy` listens on 127.0.0.1:<free port> and forwards every
request (method, path with query, headers, body) to an upstream endpoint
(fake-gcs-server), then relays the response (status, headers, body). Rules
added with :meth:`FaultProxy.add_rule` make it misbehave instead, the way a
real network or Google's front end can:

* answer with an HTTP error status and a JSON body shaped like a GCS error
  (429, 503, 401, 403, ...), without contacting the upstream;
* ``"reset"``: read the request, then abort the TCP connection (RST) without
  sending a byte of response;
* ``"truncate"``: forward the request, then send the upstream's status and
  headers but only the first half of the body, and abort the connection.

A rule matches a method and a regular expression searched in the request's
path (query included), and fires on the first ``times`` matching requests
(``None``: on every one). Every request seen and every fault injected is
recorded, so a test can assert that retries happened, or that they did not.

``POST /token`` that no rule faults is answered by the proxy itself with a
new OAuth2 access token (``{"access_token": "token-N", ...}``), so real
refreshable credentials (``google.oauth2.credentials.Credentials`` with
``token_uri=<proxy>/token``) can be used against it.

Upstream URLs in ``Location`` headers and JSON bodies (the emulator's
``mediaLink``/``selfLink``, resumable session URLs) are rewritten to the
proxy's own URL, so follow-up requests come back through the proxy too.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

#: Headers that describe one hop of a connection, never forwarded.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "trailers", "transfer-encoding", "upgrade", "content-length", "host"}

#: GCS error reasons by status, for the JSON error bodies.
REASONS = {400: "invalid", 401: "required", 403: "forbidden", 404: "notFound", 408: "requestTimeout",
           429: "rateLimitExceeded", 500: "backendError", 502: "badGateway", 503: "backendError",
           504: "gatewayTimeout"}


@dataclasses.dataclass
class Rule:
    """One kind of fault (see :meth:`FaultProxy.add_rule`)."""

    method: str
    path: re.Pattern
    action: int | str
    times: int | None
    injected: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.injected >= self.times:
            return False
        return self.method in ("*", method) and bool(self.path.search(path))


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request the proxy received and what it answered (a status code,
    ``"reset"`` or ``"truncate"``); ``faulted`` when a rule decided it;
    ``at``: ``time.monotonic()`` when the proxy decided the answer."""

    method: str
    path: str
    outcome: int | str
    faulted: bool
    at: float


def gcs_error_body(status: int) -> bytes:
    """A JSON error body as the GCS JSON API sends it."""
    reason = REASONS.get(status, "unknown")
    message = f"injected {status} ({http.client.responses.get(status, 'error')})"
    return json.dumps({"error": {"code": status, "message": message,
                                 "errors": [{"message": message, "domain": "global", "reason": reason}]}}).encode()


class FaultProxy:
    """A running proxy (see the module docstring).

    Args:
        upstream: the endpoint to forward to, e.g. ``http://127.0.0.1:4443``.

    Attributes:
        url: ``http://127.0.0.1:PORT``, the endpoint to give the client.
        seen: every request received, in order (:class:`Seen`).
    """

    def __init__(self, upstream: str):
        parsed = urlparse(upstream)
        self.upstream = upstream.rstrip("/")
        self._host, self._port = parsed.hostname, parsed.port or 80
        self._lock = threading.Lock()
        self.rules: list[Rule] = []
        self.seen: list[Seen] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # aborted connections are the point
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fault-proxy",
                                        daemon=True)
        self._thread.start()

    # -- control --------------------------------------------------------------

    def add_rule(self, action: int | str, *, method: str = "*", path: str = "", times: int | None = 1) -> Rule:
        """Inject ``action`` on the first ``times`` requests whose method is
        ``method`` (``"*"``: any) and whose path (query included) contains a
        match of the regular expression ``path`` (``""``: any).

        Args:
            action: an HTTP status to answer with (no upstream call),
                ``"reset"`` or ``"truncate"``.
            method: HTTP method, or ``"*"``.
            path: regular expression searched in the path.
            times: how many requests to fault; None: all of them.

        Returns:
            Rule: the rule, whose ``injected`` counts its faults.
        """
        if not (isinstance(action, int) or action in ("reset", "truncate")):
            raise ValueError(f"unknown fault action {action!r}")
        rule = Rule(method.upper(), re.compile(path), action, times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule and forget the requests seen."""
        with self._lock:
            self.rules.clear()
            self.seen.clear()

    @property
    def requests(self) -> int:
        """Requests received so far."""
        with self._lock:
            return len(self.seen)

    @property
    def faults(self) -> int:
        """Faults injected so far."""
        with self._lock:
            return sum(1 for s in self.seen if s.faulted)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------

    def _decide(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, path):
                    rule.injected += 1
                    return rule
        return None

    def _record(self, method: str, path: str, outcome: int | str, faulted: bool) -> None:
        with self._lock:
            self.seen.append(Seen(method, path, outcome, faulted, time.monotonic()))

    def _rewrite(self, data: bytes) -> bytes:
        return data.replace(self.upstream.encode(), self.url.encode())

    def _handler_class(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like GCS

            def log_message(self, format, *args):  # noqa: A002 - quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _abort(self) -> None:
                """Close the connection with a TCP RST, mid-exchange."""
                self.close_connection = True
                try:
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                except OSError:
                    pass

            def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response_only(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                self.wfile.flush()

            def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection(proxy._host, proxy._port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    headers["Host"] = f"{proxy._host}:{proxy._port}"
                    headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    out = []
                    for k, v in resp.getheaders():
                        if k.lower() in HOP_BY_HOP:
                            continue
                        if k.lower() == "location":
                            v = v.replace(proxy.upstream, proxy.url)
                        out.append((k, v))
                    if "json" in (resp.getheader("Content-Type") or ""):
                        data = proxy._rewrite(data)
                    return resp.status, out, data
                finally:
                    conn.close()

            def _handle(self) -> None:
                body = self._body()
                rule = proxy._decide(self.command, self.path)
                if rule is not None and rule.action == "reset":
                    proxy._record(self.command, self.path, "reset", True)
                    self._abort()
                    return
                if rule is not None and isinstance(rule.action, int):
                    proxy._record(self.command, self.path, rule.action, True)
                    self._send(rule.action, [("Content-Type", "application/json; charset=UTF-8")],
                               gcs_error_body(rule.action))
                    return
                if rule is None and self.command == "POST" and self.path.split("?")[0] == "/token":
                    proxy._record(self.command, self.path, 200, False)
                    token = {"access_token": f"token-{proxy.requests}", "expires_in": 3600, "token_type": "Bearer"}
                    self._send(200, [("Content-Type", "application/json")], json.dumps(token).encode())
                    return
                try:
                    status, headers, data = self._forward(body)
                except OSError:
                    proxy._record(self.command, self.path, 502, False)
                    self._send(502, [("Content-Type", "application/json; charset=UTF-8")], gcs_error_body(502))
                    return
                if rule is not None:  # "truncate": half the body, then an abort
                    proxy._record(self.command, self.path, "truncate", True)
                    self.send_response_only(status)
                    for k, v in headers:
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[:len(data) // 2])
                    self._abort()
                    return
                proxy._record(self.command, self.path, status, False)
                self._send(status, headers, data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

        return Handler
