"""Azurite (Microsoft's Azure Storage emulator, npm package ``azurite``) started for tests: its blob service.

``.ci/run`` installs it with ``npm install --prefix "$CACHE/azurite" azurite@VERSION``, ``CACHE`` being the
tests' cache folder (``SPARK_IMAGENET_TEST_CACHE``, default ``~/.cache/spark-imagenet-tests``, as for the YARN
tests' virtualenv), outside the repository; an ``azurite-blob`` on PATH is used otherwise. It runs on 127.0.0.1 on a free port with its data in a
scratch folder, and the real ``azure-storage-blob`` client reaches it through the well-known development
account's connection string (a public test key, not a secret).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from gcs_emulator import free_port
from server_util import stop_server, wait_for_http
from yarn_cluster import CACHE

#: Azurite's development account and its published key (the same in every Azurite).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Unavailable(Exception):
    """No Azurite on this machine; the message says how to install it."""


def _binary() -> str:
    local = CACHE / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    found = shutil.which("azurite-blob")
    if found is None:
        raise Unavailable(f"Azurite is not installed: npm install --prefix {CACHE / 'azurite'} azurite "
                          "(as .ci/run does)")
    return found


class Azurite:
    """A running Azurite blob service.

    Attributes:
        connection_string: the value for AZURE_STORAGE_CONNECTION_STRING.
    """

    def __init__(self, work: Path):
        binary = _binary()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        self.connection_string = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                                  f"BlobEndpoint={self.endpoint};")
        data = Path(work) / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.log = open(Path(work) / "azurite.log", "wb")
        self.proc = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                                      "--location", str(data), "--skipApiVersionCheck", "--loose", "--silent"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        # It answers 403 without credentials: any reply means up.
        if not wait_for_http(f"{self.endpoint}?comp=list", self.proc, 60, any_reply=True):
            self.stop()
            raise RuntimeError(f"Azurite did not start (see {self.log.name})")

    def client(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def create_container(self, name: str) -> None:
        self.client().create_container(name)

    def rot(self, container: str, key: str) -> None:
        """Flip one byte in the middle of a blob, keeping its metadata (the CRC32C of the old bytes)."""
        blob = self.client().get_blob_client(container, key)
        props = blob.get_blob_properties()
        data = bytearray(blob.download_blob().readall())
        data[len(data) // 2] ^= 0xFF
        blob.upload_blob(bytes(data), overwrite=True, metadata=props.metadata)

    def stop(self) -> None:
        # Azurite waits for its clients' keep-alive connections before it exits; its data is scratch: kill it.
        stop_server(self.proc, self.log, kill=True)
