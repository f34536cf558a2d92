"""Amazon S3 and S3-compatible servers (``s3://bucket/prefix``) as storage, on ``boto3``/``botocore``."""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore import exceptions as bexc
from botocore.config import Config

from spark_imagenet.errors import AccessError, IntegrityError, StorageError
from spark_imagenet.storage.base import CHUNK_BYTES, ObjectInfo, crc32c_bytes
from spark_imagenet.storage.remote import (
    Fault,
    Kind,
    RemoteStorage,
    RootWords,
    crc32c_chunks,
    etag_generation,
    file_digests,
    generation_etag,
    split_url,
    write_chunks,
)

#: The largest object one PutObject request may carry (S3's limit, 5 GiB).
MAX_PUT_BYTES = 5 * 1024 ** 3
#: ClientError codes that mean the credentials were refused (not just lacking a permission).
_BAD_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                    "TokenRefreshRequired", "InvalidClientTokenId", "UnrecognizedClientException"}
_CHECKSUM_REFUSED = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "XAmzContentSHA256Mismatch"}


class S3Storage(RemoteStorage):
    """Objects under ``s3://bucket/prefix`` in Amazon S3 or an S3-compatible server.

    Methods behave as documented on :class:`~spark_imagenet.storage.Storage`. Every object is written with
    one PutObject request carrying its CRC32C (``x-amz-checksum-crc32c``, computed here from the bytes sent):
    S3 checks the body against it, refuses a mismatch (``BadDigest``, raised as
    :class:`~spark_imagenet.errors.IntegrityError`) and keeps it, so :meth:`stat` reports the object's
    CRC32C (``HeadObject`` with ``ChecksumMode=ENABLED``) without reading the data: the same form
    (base64 of the big-endian value) GCS reports. Where the server keeps no full-object CRC32C (an object
    written by another tool, a multipart upload's composite checksum, a server without flexible checksums)
    the CRC32C is computed by reading the object. An S3-compatible server that stores the header without
    checking it (moto does) makes the upload check only as good as that server: pass
    ``server_checksums=False`` to have every upload read back and checksummed here instead. Downloads are
    verified by the callers against the manifest (:mod:`spark_imagenet.storage.committed`).

    Conditional writes use S3's conditional PutObject: ``If-None-Match: *`` to create only, ``If-Match:
    <ETag>`` to replace only the object read before (the ETag is :attr:`ObjectInfo.generation`, see
    :func:`~spark_imagenet.storage.remote.etag_generation`). A server that ignores these headers (older
    S3-compatible servers) cannot refuse a concurrent writer's manifest.

    Credentials come from botocore's standard chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
    ``AWS_PROFILE`` and ``~/.aws``, web identity, the instance or container role) and are never printed
    nor pickled. Transient errors are retried by botocore's ``standard`` retry mode.

    Args:
        url: ``s3://bucket`` or ``s3://bucket/prefix`` (a trailing ``/`` is ignored).
        endpoint: the S3 API endpoint of an S3-compatible server (MinIO, Ceph, moto:
            ``http://127.0.0.1:9000``); None: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` if set, else AWS.
            The resolved value travels with a pickled copy.
        region: the bucket's region; None: ``AWS_REGION``/``AWS_DEFAULT_REGION``, else the profile's.
        profile: a named profile of ``~/.aws/config`` (None: botocore's default choice).
        server_checksums: trust the CRC32C the server reports (see above).
        max_attempts: attempts per request, first included (botocore's ``standard`` retry mode).
        client: an existing ``botocore`` S3 client to use instead (not pickled).

    Raises:
        StorageError: the URL has no bucket name, or holds ``?`` or ``#``.

    Example::

        >>> from spark_imagenet import open_storage
        >>> storage = open_storage("s3://my-bucket/imagenet")     # AWS, the standard credential chain
        >>> minio = S3Storage("s3://bkt/ds", endpoint="http://127.0.0.1:9000")   # MinIO
        >>> type(storage).__name__, type(minio).__name__
        ('S3Storage', 'S3Storage')
    """

    def __init__(self, url: str, *, endpoint: str | None = None, region: str | None = None,
                 profile: str | None = None, server_checksums: bool = True, max_attempts: int = 10,
                 client: Any = None):
        self.bucket, self.prefix = split_url(url, "s3", "s3://BUCKET/PREFIX")
        self._root = f"s3://{self.bucket}"
        self.url = self._root + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
        self.profile = profile
        self.server_checksums = server_checksums
        self.max_attempts = max_attempts
        self._client = client

    def _make_client(self) -> Any:
        config = Config(retries={"mode": "standard", "max_attempts": self.max_attempts},
                        # The CRC32C is sent by this class; botocore's own default (a CRC32 trailer) is not needed.
                        request_checksum_calculation="when_required", response_checksum_validation="when_required",
                        s3={"addressing_style": "path"} if self.endpoint else None)
        try:
            session = boto3.session.Session(profile_name=self.profile)
            return session.client("s3", endpoint_url=self.endpoint, region_name=self.region, config=config)
        except Exception as e:  # noqa: BLE001 - a missing profile, a bad endpoint: one message
            raise AccessError(f"{self.url}: cannot create the S3 client ({type(e).__name__}: {e}); check "
                              "AWS_PROFILE / profile=, the endpoint (AWS_ENDPOINT_URL) and the region",
                              key="url", value=self.url) from None

    def reopen_options(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "region": self.region, "profile": self.profile,
                "server_checksums": self.server_checksums}

    # -- errors ---------------------------------------------------------------------------------------

    def _endpoint_text(self) -> str:
        return f"the endpoint {self.endpoint} (from AWS_ENDPOINT_URL or endpoint=)" if self.endpoint else "AWS S3"

    def _probe_root(self) -> None:
        self.client.head_bucket(Bucket=self.bucket)

    def _root_words(self) -> RootWords:
        return RootWords("bucket", f"s3://{self.bucket}", f"at {self._endpoint_text()}",
                         f"in the region of your Spark workers: `aws s3 mb s3://{self.bucket} --region REGION`")

    def _classify(self, e: BaseException, action: str) -> Fault | None:
        """What a botocore exception means (never naming the credentials)."""
        if isinstance(e, (bexc.NoCredentialsError, bexc.PartialCredentialsError, bexc.ProfileNotFound)):
            return Fault(Kind.CREDENTIALS, f"no usable AWS credentials ({type(e).__name__})",
                         "Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (see `aws configure`), or "
                         "run where an instance or container role provides them")
        if isinstance(e, bexc.FlexibleChecksumError):
            return Fault(Kind.CORRUPT, "the downloaded bytes do not match the object's checksum (corrupt object or "
                                       "transfer)")
        if isinstance(e, (bexc.EndpointConnectionError, bexc.ConnectionError)):
            return Fault(Kind.UNREACHABLE, f"{self._endpoint_text()}; check that it is running, its scheme "
                                           "(http/https) and port, the network and proxy settings "
                                           f"({type(e).__name__})")
        if not isinstance(e, bexc.ClientError):
            return None
        code, status = _code(e), _status(e)
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412:
            return Fault(Kind.PRECONDITION, str(status))
        if code == "NoSuchBucket":
            return Fault(Kind.MISSING_ROOT)
        if code in _CHECKSUM_REFUSED:
            return Fault(Kind.CORRUPT, f"the server refused the bytes sent: they do not match their checksum "
                                       f"({code}); the transfer was damaged")
        if code in _BAD_CREDENTIALS or status == 401:
            return Fault(Kind.CREDENTIALS, f"the credentials were rejected ({code})",
                         f"Check AWS_ACCESS_KEY_ID / AWS_PROFILE, and that they belong to {self._endpoint_text()}")
        if status == 403 or code == "AccessDenied":
            need = "s3:PutObject and s3:DeleteObject" if action == "write" else "s3:GetObject and s3:ListBucket"
            return Fault(Kind.DENIED, "403", f"The identity in use needs {need} on s3://{self.bucket}; check its "
                                             "IAM policy and the bucket policy")
        if status == 404 or code in ("NoSuchKey", "NotFound"):
            return Fault(Kind.MISSING)
        return Fault(Kind.FAILED, f"{code}, HTTP {status}")

    # -- Storage interface ------------------------------------------------------------------------------

    def _info(self, name: str, size: int, etag: str | None, crc: str | None, kind: str | None) -> ObjectInfo:
        """An ObjectInfo with the server's CRC32C only where it is trusted and covers the whole object."""
        if not self.server_checksums or kind == "COMPOSITE" or (crc and "-" in crc):
            crc = None
        return ObjectInfo(name, size, crc or None, etag_generation(etag))

    def stat(self, name: str) -> ObjectInfo | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(name), ChecksumMode="ENABLED")
        except bexc.ClientError as e:
            if _status(e) == 404:
                self._check_root()
                return None
            raise self._error(e, self.where(name), "read") from None
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None
        return self._info(name, int(head["ContentLength"]), head.get("ETag"), head.get("ChecksumCRC32C"),
                          head.get("ChecksumType"))

    def _computed_crc32c(self, name: str) -> str:
        """From a streamed read of the object (:meth:`crc32c` uses the one the server keeps first)."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"]
            return crc32c_chunks(body.iter_chunks(CHUNK_BYTES))
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def read_bytes(self, name: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def _put(self, name: str, body: Any, crc: str, **conditions: str) -> ObjectInfo | None:
        """One PutObject of ``body`` with its CRC32C; the object's info from the reply (None without a CRC32C)."""
        reply = self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=body,
                                       ChecksumAlgorithm="CRC32C", ChecksumCRC32C=crc, **conditions)
        info = self._info(name, -1, reply.get("ETag"), reply.get("ChecksumCRC32C"), reply.get("ChecksumType"))
        return info if info.crc32c == crc else None

    def write_bytes(self, name: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        conditions = {}
        if if_generation_match == 0:
            conditions["IfNoneMatch"] = "*"
        elif if_generation_match is not None:
            conditions["IfMatch"] = generation_etag(if_generation_match)
        try:
            self._put(name, data, crc32c_bytes(data), **conditions)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write", replacing=bool(if_generation_match)) from None

    def _put_file(self, local_path: str | os.PathLike, name: str) -> ObjectInfo | None:
        size, crc, _md5 = file_digests(local_path)
        if size > MAX_PUT_BYTES:
            raise StorageError(f"{local_path}: {size} bytes is more than one S3 PutObject takes (5 GiB); "
                               "write smaller shards or checkpoints", key="local_path", value=str(local_path))
        with open(local_path, "rb") as f:
            info = self._put(name, f, crc)
        return None if info is None else ObjectInfo(name, size, info.crc32c, info.generation)

    def put_file(self, local_path: str | os.PathLike, name: str, *, move: bool = False) -> None:
        try:
            self._put_file(local_path, name)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None

    def _put_and_stat(self, local_path: str | os.PathLike, name: str) -> ObjectInfo:
        """One PutObject; its reply carries the CRC32C the server checked and kept (no request after it),
        else the object is stat'ed and read back (:meth:`Storage._written`)."""
        try:
            info = self._put_file(local_path, name)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None
        return info if info is not None else self._written(name)

    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        """Stream object ``name`` to ``local_path``; when the server reports the object's CRC32C, the bytes
        received are checked against it.

        Raises:
            IntegrityError: the bytes received do not match the server's CRC32C.
            StorageError: the object does not exist or cannot be read.
        """
        try:
            reply = self.client.get_object(Bucket=self.bucket, Key=self._key(name), ChecksumMode="ENABLED")
            got = write_chunks(reply["Body"].iter_chunks(CHUNK_BYTES), local_path)
            expected = self._info(name, 0, None, reply.get("ChecksumCRC32C"), reply.get("ChecksumType")).crc32c
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None
        if expected is not None and got != expected:
            raise IntegrityError(f"{self.where(name)}: the downloaded bytes have crc32c {got}, the server reports "
                                 f"{expected} (corrupt object or transfer)", key="url", value=self.where(name))

    def list(self) -> list[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        out = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                for obj in page.get("Contents", []):
                    out.append(ObjectInfo(obj["Key"][len(base):], int(obj["Size"]), None,
                                          etag_generation(obj.get("ETag"))))
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.url, "list") from None
        return sorted(out, key=lambda o: o.name)

    def delete(self, name: str, *, best_effort: bool = False) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except Exception as e:  # noqa: BLE001
            if not self._gone(e):
                raise self._error(e, self.where(name), "write") from None


def _code(e: Any) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: Any) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
