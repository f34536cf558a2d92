"""moto's standalone S3 server started for tests.

``python -m moto.server`` (the ``moto[server]`` package of the ``test`` extra) runs as its own process on
127.0.0.1 on a free port; the real ``boto3`` client talks to it over HTTP with dummy credentials. moto
keeps a CRC32C header as it is sent, without checking it against the body: :meth:`MotoS3.rot` uses that
to store other bytes under an object's checksum, the way a disk that rots would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gcs_emulator import free_port
from server_util import stop_server, wait_for_http

#: Dummy credentials moto accepts (never real ones).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class Unavailable(Exception):
    """moto is not installed; the message says what to install."""


class MotoS3:
    """A running moto server.

    Attributes:
        endpoint: ``http://127.0.0.1:PORT`` (the value for AWS_ENDPOINT_URL).
    """

    def __init__(self, work: Path):
        try:
            import moto.server  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"moto is not installed ({e}); pip install 'moto[server]'") from None
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(work) / "moto.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        if not wait_for_http(f"{self.endpoint}/moto-api/", self.proc, 60):
            self.stop()
            raise RuntimeError(f"moto did not start (see {self.log.name})")

    def client(self):
        """A boto3 S3 client on the server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def rot(self, bucket: str, key: str) -> None:
        """Flip one byte in the middle of an object while the server keeps reporting its old CRC32C."""
        client = self.client()
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        data[len(data) // 2] ^= 0xFF
        crc = head.get("ChecksumCRC32C")
        extra = {"ChecksumAlgorithm": "CRC32C", "ChecksumCRC32C": crc} if crc else {}
        client.put_object(Bucket=bucket, Key=key, Body=bytes(data), **extra)

    def stop(self) -> None:
        stop_server(self.proc, self.log)
