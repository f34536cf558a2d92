"""A local HTTP server that plays a Kubernetes API server for spark-submit's client, in tests.

``spark-submit --master k8s://http://127.0.0.1:PORT --deploy-mode cluster`` (Spark 4.3, whose
``KubernetesClientApplication`` uses the fabric8 client 7.6) talks to :attr:`FakeApiServer.master`'s
address with plain HTTP and no credentials (give it ``KUBECONFIG`` naming no file, so that a kubeconfig of
the user's adds none). With ``spark.kubernetes.submission.waitAppCompletion=false`` it sends, in this order
(seen with this server logging every request):

1. ``POST /api/v1/namespaces/NS/pods`` (``application/json``): the driver pod. Answered 201 with the pod
   as stored: ``metadata.uid``, ``resourceVersion``, ``namespace``, ``creationTimestamp`` filled in and
   ``status.phase: Pending``. The client takes the uid from this answer for the owner references below.
2. One server-side apply per resource that goes with the driver, each naming the driver pod (its uid) in
   ``metadata.ownerReferences``: ``PATCH .../NS/KIND/NAME?fieldManager=fabric8&force=true`` with
   ``Content-Type: application/apply-patch+yaml`` and a JSON body (JSON is YAML): the driver's headless
   ``services``, a ``networkpolicies`` object (``/apis/networking.k8s.io/v1/...``), the ``configmaps`` of
   the executor pod template and of ``spark.properties``. Answered 201 with the object (200 when it
   existed: then the applied fields replace the stored ones at the top level).

Also served, for a client that reads back or cleans up (after a failure): ``GET`` of a stored object (200),
``PUT`` (replace, 200), ``DELETE`` (200 with the object). Anything else, and an object that is not there,
is answered with a 404 ``Status`` as Kubernetes sends it; every request, answered or not, is in
:attr:`FakeApiServer.seen`, so a test sees an unexpected call.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

#: ``/api/v1/namespaces/NS/PLURAL[/NAME]`` or ``/apis/GROUP/VERSION/namespaces/NS/PLURAL[/NAME]``.
RESOURCE_PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
                           r"(?:/(?P<name>[^/]+))?$")
APPLY = "application/apply-patch+yaml"


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request the server received, recorded before its answer is sent (so a client that has its
    answer always finds its request here).

    Attributes:
        method: ``GET``/``POST``/``PATCH``/``PUT``/``DELETE``.
        path: URL path without query.
        query: the query parameters, one value each (``{"fieldManager": "fabric8", ...}``).
        content_type: the request's ``Content-Type`` (``""`` for none).
        body: the JSON body (``{}`` for none).
        status: the status answered.
    """

    method: str
    path: str
    query: dict
    content_type: str
    body: dict
    status: int

    @property
    def plural(self) -> str | None:
        """The resource kind's plural the path names (``pods``, ``configmaps``, ...), or None."""
        m = RESOURCE_PATH.match(self.path)
        return m.group("plural") if m else None


def failure(code: int, reason: str, message: str) -> dict:
    """A Kubernetes ``Status`` object for a failed request, as the API server sends it."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def not_found(message: str) -> dict:
    """The ``Status`` of a 404."""
    return failure(404, "NotFound", message)


class FakeApiServer:
    """The stand-in API server on 127.0.0.1, a free port, in a thread of this process.

    :meth:`start` it, :meth:`stop` it. :attr:`objects` holds every stored object
    by its path (``/api/v1/namespaces/NS/pods/NAME``); :attr:`seen` every request in arrival order.
    """

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._version = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def master(self) -> str:
        """The spark-submit master URL of this server: ``k8s://http://127.0.0.1:PORT``."""
        return f"k8s://http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> None:
        """Serve requests (in a daemon thread) until :meth:`stop`."""
        self._thread.start()

    def stop(self) -> None:
        """Shut the server down and close its socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=30)

    def stored(self, plural: str) -> list[dict]:
        """The stored objects of one kind (``"pods"``, ``"configmaps"``, ...), in the order they came."""
        with self._lock:
            return [obj for path, obj in self.objects.items()
                    if (m := RESOURCE_PATH.match(path)) and m.group("plural") == plural]

    def handle(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        """The answer ``(status, JSON object)`` to one request, the store updated (under the lock)."""
        m = RESOURCE_PATH.match(path)
        if not m:
            return 404, not_found(f"the stand-in serves no {path}")
        if method == "POST" and not m.group("name"):
            name = body.get("metadata", {}).get("name", "")
            key = f"{path}/{name}"
            if not name:
                return 422, failure(422, "Invalid", "metadata.name: Required value")
            if key in self.objects:
                return 409, failure(409, "AlreadyExists", f"{key} already exists")
            return 201, self._store(key, body, m.group("ns"))
        if not m.group("name"):
            return 404, not_found(f"the stand-in serves no {method} of the collection {path}")
        if method == "GET" and path in self.objects:
            return 200, self.objects[path]
        if method == "DELETE" and path in self.objects:
            return 200, self.objects.pop(path)
        if method in ("PATCH", "PUT"):
            existed = path in self.objects
            merged = {**self.objects[path], **body} if existed and method == "PATCH" else body
            return 200 if existed else 201, self._store(path, merged, m.group("ns"))
        return 404, not_found(f"{path} not found")

    def _store(self, key: str, obj: dict, namespace: str) -> dict:
        """Keep ``obj`` at ``key`` with the fields the API server fills in; returns the stored object."""
        self._version += 1
        obj = json.loads(json.dumps(obj))
        meta = obj.setdefault("metadata", {})
        old = self.objects.get(key, {}).get("metadata", {})
        meta.setdefault("namespace", namespace)
        meta["uid"] = old.get("uid") or str(uuid.uuid4())
        meta["resourceVersion"] = str(self._version)
        meta["creationTimestamp"] = old.get("creationTimestamp", "2026-01-01T00:00:00Z")
        if obj.get("kind") == "Pod":
            obj.setdefault("status", {"phase": "Pending"})
        self.objects[key] = obj
        return obj

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: the test reads server.seen
                pass

            def _any(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                content_type = self.headers.get("Content-Type", "")
                with server._lock:
                    try:
                        body = json.loads(raw) if raw else {}
                        status, obj = server.handle(self.command, url.path, body)
                    except ValueError:  # a YAML apply body that is not JSON: not what the client sends today
                        body = {"unparsed": raw.decode("utf-8", "replace")}
                        status, obj = 415, failure(415, "UnsupportedMediaType", "the stand-in reads JSON only")
                    server.seen.append(Seen(self.command, url.path,
                                            {k: v[-1] for k, v in parse_qs(url.query).items()},
                                            content_type, body, status))
                data = json.dumps(obj).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

        return Handler
