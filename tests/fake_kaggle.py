"""A local HTTP server that plays Kaggle's API for the real ``kaggle`` client, in tests.

The ``kaggle`` 2.x client has no endpoint setting, but with
``KAGGLE_API_ENVIRONMENT=LOCALHOST`` it sends its API calls to
``http://localhost/api/v1/<service>/<method>``, and with
``HTTP_PROXY=http://127.0.0.1:PORT`` every such request reaches this server
as a proxy request (absolute URL in the request line). :meth:`FakeKaggle.env`
gives those variables. What the client sends (seen in :attr:`FakeKaggle.seen`)
and what is implemented:

* ``POST /api/v1/security.OAuthService/IntrospectToken`` ``{"token": ...}``:
  the client checks an access token (``KAGGLE_API_TOKEN``,
  ``~/.kaggle/access_token``) this way before using it. Answers
  ``{"active": true, "username": ...}`` for :attr:`FakeKaggle.token`, else
  ``{"active": false}``.
* ``POST /api/v1/competitions.CompetitionApiService/ListDataFiles``
  ``{"competitionName", "pageSize", "pageToken"}``: ``{"files": [{"name",
  "totalBytes", "creationDate"}], "nextPageToken"}``, paged (the token is the
  offset as text).
* ``POST .../DownloadDataFiles`` ``{"competitionName"}`` and
  ``POST .../DownloadDataFile`` ``{"competitionName", "fileName"}``: a 302 to
  ``http://localhost/storage/<file>?X-Goog-Signature=...`` (Kaggle redirects
  to a signed Cloud Storage URL; the client names the local file after the
  URL's last path segment, query removed).
* ``GET /storage/<file>``: the bytes, with ``Content-Length``, ``ETag``,
  ``Last-Modified`` and ``Accept-Ranges: bytes``; ``Range: bytes=N-`` gets a
  206 (unless ``If-Range`` names another ETag: then the whole file, 200).

API calls need ``Authorization: Basic user:key`` or ``Bearer <token>`` with
the configured credentials, else 401. Errors are JSON ``{"code", "message"}``
like Kaggle's, which the client raises as ``requests.HTTPError(message)``.
Fault switches: :attr:`FakeKaggle.fail` (401/403/404 on every API call of
the competition; 403 only on the download calls, with Kaggle's rules
message, since listing works without accepting the rules),
:meth:`FakeKaggle.cut_file_responses` (close the connection of the next
file responses after N body bytes), :attr:`FakeKaggle.claimed_sizes` (lie about sizes in the file list),
:meth:`FakeKaggle.hold_files` (file responses wait until :meth:`FakeKaggle.release_files`).
"""

from __future__ import annotations

import base64
import dataclasses
import email.utils
import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMPETITION_SERVICE = "/api/v1/competitions.CompetitionApiService/"
INTROSPECT = "/api/v1/security.OAuthService/IntrospectToken"
#: The message Kaggle sends with the 403 for a competition whose rules were not accepted.
RULES_MESSAGE = "You must accept this competition's rules before you'll be able to download files."


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request the server received, recorded before its answer is sent
    (so a client that has its answer always finds its request here).

    Attributes:
        method: ``GET``/``POST``.
        path: URL path without query (``/api/v1/...`` or ``/storage/<file>``).
        headers: request headers (names as sent).
        body: the JSON body of an API call (``{}`` for none).
        status: the status answered.
        sent: body bytes of a file response: all of them, or the cut point
            when the response is cut on purpose.
    """

    method: str
    path: str
    headers: dict
    body: dict
    status: int
    sent: int


class FakeKaggle:
    """Kaggle's API on 127.0.0.1:<free port> (see the module docstring).

    Args:
        files: served files, name -> bytes (the name the 302 points to, e.g.
            ``imagenet-object-localization-challenge.zip``).
        listing: the competition's file list (``[{"name", "totalBytes",
            "creationDate"}]``), as ListDataFiles pages it.
        competition: the only competition that exists (others: 404).
        bundle: the name in ``files`` that DownloadDataFiles redirects to.
        username, key: accepted legacy API key (HTTP Basic).
        token: accepted access token (Bearer).

    Attributes:
        seen: every request, in order (a list of :class:`Seen`).
        fail: ``None`` or 401/403/404: answer the competition's API calls with
            that error (403: only the download calls, with :data:`RULES_MESSAGE`).
        claimed_sizes: name -> totalBytes to report in the list instead of the truth.
        port, proxy: the port and ``http://127.0.0.1:PORT``.
    """

    def __init__(self, files: dict[str, bytes], listing: list[dict], *,
                 competition: str = "imagenet-object-localization-challenge", bundle: str | None = None,
                 username: str = "alice", key: str = "s3cret-key", token: str = "KGAT_good-token"):
        self.files = dict(files)
        self.listing = list(listing)
        self.competition = competition
        self.bundle = bundle or f"{competition}.zip"
        self.username, self.key, self.token = username, key, token
        self.fail: int | None = None
        self.claimed_sizes: dict[str, int] = {}
        self.seen: list[Seen] = []
        self._cuts: list[int] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()
        self.modified = email.utils.formatdate(time.time() - 86400, usegmt=True)
        self.etags = {name: '"' + hashlib.md5(data).hexdigest() + '"' for name, data in self.files.items()}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.proxy = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        """Environment variables that send the real client here (set them all).

        Returns:
            dict: ``KAGGLE_API_ENVIRONMENT=LOCALHOST``, ``HTTP_PROXY``/``http_proxy``
            = :attr:`proxy`, and empty ``NO_PROXY``/``no_proxy`` (localhost must
            not bypass the proxy).
        """
        return {"KAGGLE_API_ENVIRONMENT": "LOCALHOST", "HTTP_PROXY": self.proxy, "http_proxy": self.proxy,
                "NO_PROXY": "", "no_proxy": ""}

    def cut_file_responses(self, *after_bytes: int) -> None:
        """Close the connection of the next file responses early, one cut point each.

        The status line and headers (with the full ``Content-Length``) are sent,
        then only the first ``after_bytes[i]`` body bytes of the i-th next file
        response, then the connection is shut down: the client sees the body end
        early, as when a connection drops midway.

        Args:
            after_bytes: body bytes to send before closing, one per file
                response to cut, in order (0: no body at all).
        """
        with self._lock:
            self._cuts.extend(after_bytes)

    def hold_files(self) -> None:
        """Make file responses wait (after their request is recorded) until :meth:`release_files`:
        a download stays in progress as long as the test needs."""
        self._released.clear()

    def release_files(self) -> None:
        """Let held file responses (and later ones) go on."""
        self._released.set()

    def file_requests(self) -> list[Seen]:
        """The ``GET /storage/<file>`` requests seen so far. A GCS JSON API request (``/storage/v1/...``) is
        not one: a storage client of an earlier test still retrying against an emulator whose port this
        server now holds was once counted here."""
        return [s for s in self.seen if s.path.startswith("/storage/") and not s.path.startswith("/storage/v1/")]

    def api_calls(self, name: str) -> list[Seen]:
        """The calls of one API method (e.g. ``"ListDataFiles"``) seen so far."""
        return [s for s in self.seen if s.path.rsplit("/", 1)[-1] == name]

    def stop(self) -> None:
        """Shut the server down and close its socket."""
        self.release_files()
        self.server.shutdown()
        self.server.server_close()

    # -- used by the handler -------------------------------------------------------------------

    def _take_cut(self) -> int | None:
        with self._lock:
            return self._cuts.pop(0) if self._cuts else None

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)


def _handler(fake: FakeKaggle):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # keep test output clean
            pass

        # -- helpers -------------------------------------------------------------------------------

        def _seen(self, status: int, sent: int = 0) -> None:
            fake._record(Seen(self.command, self._path(), dict(self.headers.items()), self._body, status, sent))

        def _path(self) -> str:
            return unquote(urlsplit(self.path).path)  # proxy requests carry an absolute URL

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
            self._seen(status)
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: dict) -> None:
            self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

        def _error(self, status: int, message: str) -> None:
            self._json(status, {"code": status, "message": message})

        def _authorized(self) -> bool:
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Bearer "):
                return auth[7:] == fake.token
            if auth.startswith("Basic "):
                try:
                    user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
                except ValueError:
                    return False
                return (user, key) == (fake.username, fake.key)
            return False

        # -- methods -------------------------------------------------------------------------------

        def do_POST(self):
            path = self._path()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            self._body = body
            self._api(path, body)

        def _api(self, path: str, body: dict) -> None:
            if path == INTROSPECT:
                active = body.get("token") == fake.token
                self._json(200, {"active": True, "username": fake.username} if active else {"active": False})
                return
            if not path.startswith(COMPETITION_SERVICE):
                self._error(404, f"no such API method: {path}")
                return
            method = path[len(COMPETITION_SERVICE):]
            if not self._authorized():
                self._error(401, "Unauthenticated")
                return
            name = body.get("competitionName", "")
            if name != fake.competition or fake.fail == 404:
                self._error(404, "Competition not found")
                return
            if fake.fail == 401:
                self._error(401, "Unauthenticated")
                return
            if method == "ListDataFiles":
                size = int(body.get("pageSize") or 20)
                start = int(body.get("pageToken") or 0)
                page = [dict(f, totalBytes=fake.claimed_sizes.get(f["name"], f["totalBytes"]))
                        for f in fake.listing[start:start + size]]
                nxt = str(start + size) if start + size < len(fake.listing) else ""
                self._json(200, {"files": page, "nextPageToken": nxt})
                return
            if method in ("DownloadDataFiles", "DownloadDataFile"):
                if fake.fail == 403:
                    self._error(403, RULES_MESSAGE)
                    return
                target = fake.bundle if method == "DownloadDataFiles" else body.get("fileName", "")
                if target not in fake.files:
                    self._error(404, f"File not found: {target}")
                    return
                location = f"http://localhost/storage/{target}?X-Goog-Signature=abc123&X-Goog-Expires=3600"
                self._send(302, b"", {"Location": location})
                return
            self._error(404, f"no such API method: {method}")

        def do_GET(self):
            path = self._path()
            name = path[len("/storage/"):] if path.startswith("/storage/") else None
            self._body = {}
            if name not in fake.files:
                self._error(404, "No such object")
                return
            data, etag = fake.files[name], fake.etags[name]
            start, status = 0, 200
            rng = self.headers.get("Range", "")
            if_range = self.headers.get("If-Range")
            if rng.startswith("bytes=") and (if_range is None or if_range in (etag, fake.modified)):
                first = rng[len("bytes="):].split("-", 1)[0]
                start = int(first or 0)
                if start >= len(data):
                    self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
                status = 206
            body = data[start:]
            drop = fake._take_cut()
            cut = drop is not None and drop < len(body)
            self._seen(status, drop if cut else len(body))
            fake._released.wait(timeout=120)
            self.send_response(status)
            self.send_header("Content-Type", "application/zip")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", fake.modified)
            self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            try:
                if cut:
                    self.wfile.write(body[:drop])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)  # the peer sees the body end early
                else:
                    self.wfile.write(body)
            except OSError:
                self.close_connection = True  # the client went away (it had read what it wanted)

    return Handler


def listing_for_tree(root: Path, created: str = "2022-09-06T15:55:41.000Z") -> list[dict]:
    """A ListDataFiles listing of every file under ``root``, like Kaggle's (one entry per file).

    Args:
        root: the unpacked competition folder.
        created: the ``creationDate`` of every entry (ISO 8601, UTC).

    Returns:
        list[dict]: ``{"name": relative path with "/", "totalBytes", "creationDate"}``, sorted by name.
    """
    return [{"name": p.relative_to(root).as_posix(), "totalBytes": p.stat().st_size, "creationDate": created}
            for p in sorted(root.rglob("*")) if p.is_file()]
