"""Google Cloud Storage (``gs://bucket/prefix``) as storage, on ``google-cloud-storage``."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Sequence

from spark_imagenet.errors import AccessError, StorageError
from spark_imagenet.storage.base import DEFAULT_TRANSFERS, ObjectInfo, _run_parallel
from spark_imagenet.storage.remote import Fault, Kind, RemoteStorage, RootWords, split_url

logger = logging.getLogger(__name__)

#: Bytes google-cloud-storage reads from a download's response at a time once :func:`tune_download_reads` ran
#: (its own default is 8 KiB, read in a Python loop: docs/design.md, 'Storage, checksums and the GCS emulator').
DOWNLOAD_READ_BYTES = 1024 * 1024
#: google-cloud-storage's own read size, the only value :func:`tune_download_reads` replaces.
_LIBRARY_READ_BYTES = 8192


def tune_download_reads() -> bool:
    """Make google-cloud-storage read downloads :data:`DOWNLOAD_READ_BYTES` at a time instead of 8 KiB.

    The library streams a download's body into the file, and through its CRC32C, in pieces of a size
    it fixes in a module constant (``google.cloud.storage._media.requests._request_helpers.
    _SINGLE_GET_CHUNK_SIZE``, 8192, no parameter of any public call sets it). Each piece costs several
    Python calls (requests, urllib3, http.client), a ``recv`` and a file ``write``: 8 KiB pieces make the
    client's CPU, not the network, the limit of parallel downloads (docs/design.md, 'Storage, checksums and
    the GCS emulator'). Only the read size changes (what is read, checked and written is the same); it
    applies to the whole process, to every download of that library, and costs at most this many bytes
    of buffer per download in progress. A value other than the library's own default (set by someone
    else, or changed by a later release) is left as it is.

    Returns:
        bool: True when the read size is now :data:`DOWNLOAD_READ_BYTES`; False when the library has no
        such constant or another value was set (downloads then work as the library does them).
    """
    try:
        from google.cloud.storage._media.requests import _request_helpers as helpers
    except ImportError:  # a release without the module: its own reads, nothing to tune
        return False
    if getattr(helpers, "_SINGLE_GET_CHUNK_SIZE", None) == _LIBRARY_READ_BYTES:
        helpers._SINGLE_GET_CHUNK_SIZE = DOWNLOAD_READ_BYTES
    return getattr(helpers, "_SINGLE_GET_CHUNK_SIZE", None) == DOWNLOAD_READ_BYTES


class GCSStorage(RemoteStorage):
    """Objects under ``gs://bucket/prefix`` in Google Cloud Storage.

    Methods behave as documented on :class:`Storage`; a :class:`~spark_imagenet.storage.remote.RemoteStorage`
    like the other stores (its root check and error mapping). Built on
    ``google-cloud-storage``: every call uses its ``DEFAULT_RETRY`` policy
    (exponential backoff from 1 s, doubling up to 60 s, for at most 120 s of
    retries on 408/429/5xx and reset or refused connections; the library's
    defaults, see ``google.cloud.storage.retry``), uploads included, since
    every object this package writes is either immutable under its name or
    written with a generation precondition. Downloads are checked by the
    client against the object's CRC32C (``DataCorruption`` otherwise);
    :meth:`put_files`/:meth:`put_files_info` use ``transfer_manager`` with
    threads; :meth:`get_files` runs :meth:`get_file` on threads (what
    ``transfer_manager.download_many`` does with threads, here so that each
    download's ``check`` follows it in its own thread). Downloads read their
    response 1 MiB at a time (:func:`tune_download_reads`). A missing bucket,
    401 and 403 fail at once with a message saying what to check.

    Args:
        url: ``gs://bucket`` or ``gs://bucket/prefix`` (a trailing ``/`` is
            ignored).
        endpoint: API endpoint (an emulator such as fake-gcs-server, e.g.
            ``http://127.0.0.1:4443``), used with anonymous credentials. None:
            ``STORAGE_EMULATOR_HOST`` if set, else Google's endpoint with
            Application Default Credentials.
        project: the billing/quota project (None: the credentials' own).
        page_size: objects per listing request (GCS's maximum is 1000).
        retry_seconds: how long one call keeps retrying transient errors,
            in seconds (default 120, the library's own default).
        client: an existing ``google.cloud.storage.Client`` to use instead (not pickled: a copy
            creates its own from ``endpoint`` and ``project``).

    Raises:
        StorageError: the URL has no bucket name, or holds ``?`` or ``#``
            (never silently dropped); on first use, the client cannot be
            created (no credentials: says how to provide them).
    """

    def __init__(self, url: str, *, endpoint: str | None = None, project: str | None = None,
                 page_size: int = 1000, retry_seconds: float = 120.0, client: Any = None):
        self.bucket_name, self.prefix = split_url(url, "gs", "gs://BUCKET/PREFIX")
        self._root = f"gs://{self.bucket_name}"
        self.url = self._root + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or None
        if self.endpoint and "://" not in self.endpoint:
            self.endpoint = "http://" + self.endpoint
        self.project = project
        self.page_size = page_size
        self._retry_seconds = float(retry_seconds)
        self._client = client
        self._bucket = None

    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps: the URL, endpoint, project and settings, not the client nor the bucket handle
        made from it; the copy makes its own on first use, with the endpoint this one resolved (so an executor
        without ``STORAGE_EMULATOR_HOST`` reaches the same emulator)."""
        return {**super().__getstate__(), "_bucket": None}

    # -- plumbing -----------------------------------------------------------

    def _make_client(self) -> Any:
        """A ``google.cloud.storage.Client``: anonymous on an endpoint (an emulator), else on Application Default
        Credentials.

        Raises:
            AccessError: no Google Cloud credentials found (says how to provide them).
        """
        from google.auth import exceptions as auth_exceptions
        from google.cloud import storage as gcs

        try:
            if self.endpoint:
                from google.auth.credentials import AnonymousCredentials

                return gcs.Client(project=self.project or "spark-imagenet", credentials=AnonymousCredentials(),
                                  client_options={"api_endpoint": self.endpoint})
            return gcs.Client(project=self.project)
        except auth_exceptions.DefaultCredentialsError as e:
            raise AccessError(
                f"{self.url}: no Google Cloud credentials found ({e}). Run `gcloud auth application-default "
                "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file; on GCE, "
                "Dataproc or GKE the machine's service account is used", key="url", value=self.url
            ) from None

    @property
    def bucket(self):
        if self._bucket is None:
            self._bucket = self.client.bucket(self.bucket_name)
        return self._bucket

    # -- errors ---------------------------------------------------------------

    def _probe_root(self) -> None:
        self.bucket.reload(timeout=60)

    def _root_words(self) -> RootWords:
        at = f"at the endpoint {self.endpoint} (from STORAGE_EMULATOR_HOST or endpoint=) " if self.endpoint else ""
        return RootWords("bucket", f"gs://{self.bucket_name}", f"{at}(or the project is wrong)",
                         "in the region of your Spark workers: `gcloud storage buckets create "
                         f"gs://{self.bucket_name} --location=REGION`", "the endpoint" if self.endpoint else "")

    def _error(self, e: BaseException, what: str, action: str = "access", *,
               replacing: bool = False) -> StorageError:
        """:meth:`RemoteStorage._error`; a call whose retry deadline passed is said as what kept failing, and
        for how long it was retried."""
        from google.api_core import exceptions as gexc

        if isinstance(e, gexc.RetryError) and e.cause is not None and e.cause is not e:
            inner = super()._error(e.cause, what, action, replacing=replacing)
            return type(inner)(f"{inner} (still failing after retrying with backoff for "
                               f"{self._retry_seconds:.0f} s)")
        return super()._error(e, what, action, replacing=replacing)

    def _classify(self, e: BaseException, action: str) -> Fault | None:
        """What an exception of google-cloud-storage, google-auth or requests means."""
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as auth_exceptions
        from google.cloud.storage.exceptions import DataCorruption

        detail = getattr(e, "message", None) or str(e)
        detail = detail.splitlines()[0] if detail else type(e).__name__
        if isinstance(e, gexc.PreconditionFailed):
            return Fault(Kind.PRECONDITION, "412")
        if isinstance(e, gexc.NotFound):
            return Fault(Kind.MISSING)
        if isinstance(e, gexc.Unauthorized):
            return Fault(Kind.CREDENTIALS, f"the credentials were rejected (401: {detail})",
                         "Refresh them with `gcloud auth application-default login` or check the key file in "
                         "GOOGLE_APPLICATION_CREDENTIALS")
        if isinstance(e, gexc.Forbidden):
            need = "storage.objects.create/delete (roles/storage.objectAdmin)" if action == "write" else \
                "storage.objects.get/list (roles/storage.objectViewer)"
            return Fault(Kind.DENIED, f"403: {detail}",
                         f"The account in use needs {need} on bucket gs://{self.bucket_name}; check the IAM roles, "
                         "or the account (GOOGLE_APPLICATION_CREDENTIALS / gcloud auth application-default login)")
        if isinstance(e, auth_exceptions.InvalidOperation):
            # google-auth answers a 401 by refreshing the credentials and resending; anonymous
            # credentials (an endpoint / STORAGE_EMULATOR_HOST) cannot be refreshed, so a 401 surfaces
            # as this "Anonymous credentials cannot be refreshed" error instead of Unauthorized.
            return Fault(Kind.CREDENTIALS,
                         f"the credentials were rejected (401: {self.endpoint or 'the endpoint'} requires "
                         "credentials, and requests to it are sent anonymously)",
                         "Check the endpoint given by STORAGE_EMULATOR_HOST or endpoint=: an emulator must accept "
                         "anonymous requests; for Google Cloud Storage itself, unset it so Application Default "
                         "Credentials are used (`gcloud auth application-default login` or "
                         "GOOGLE_APPLICATION_CREDENTIALS)")
        if isinstance(e, (auth_exceptions.RefreshError, auth_exceptions.TransportError)):
            return Fault(Kind.CREDENTIALS, f"cannot obtain Google credentials ({detail})",
                         "Check the machine's service account or GOOGLE_APPLICATION_CREDENTIALS")
        if isinstance(e, DataCorruption):
            return Fault(Kind.CORRUPT, "the downloaded bytes do not match the object's checksum (corrupt object or "
                                       "transfer)")
        if isinstance(e, gexc.GoogleAPICallError):
            return Fault(Kind.FAILED, f"{type(e).__name__}: {detail}")
        import requests

        if isinstance(e, requests.exceptions.RequestException):
            where = (f"the endpoint {self.endpoint} (from STORAGE_EMULATOR_HOST or endpoint=); check that it "
                     "is running and its scheme (http/https) and port" if self.endpoint else
                     "storage.googleapis.com; check the network, proxy settings and DNS")
            kind = "connection refused" if "refused" in detail.lower() else type(e).__name__
            return Fault(Kind.UNREACHABLE, f"{where} ({kind}: {detail[:200]})")
        return None

    @property
    def _retry(self):
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY if self._retry_seconds == 120.0 else DEFAULT_RETRY.with_timeout(self._retry_seconds)

    # -- Storage interface ----------------------------------------------------

    def stat(self, name: str) -> ObjectInfo | None:
        try:
            blob = self.bucket.get_blob(self._key(name), retry=self._retry, timeout=60)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None
        if blob is None:
            self._check_root()
            return None
        return ObjectInfo(name, int(blob.size or 0), blob.crc32c, int(blob.generation or 0))

    def read_bytes(self, name: str) -> bytes:
        tune_download_reads()
        try:
            return self.bucket.blob(self._key(name)).download_as_bytes(retry=self._retry, timeout=120)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def write_bytes(self, name: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        try:
            self.bucket.blob(self._key(name)).upload_from_string(
                data, checksum="crc32c", if_generation_match=if_generation_match, retry=self._retry, timeout=120)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write", replacing=bool(if_generation_match)) from None

    def put_file(self, local_path: str | os.PathLike, name: str, *, move: bool = False) -> None:
        try:
            self.bucket.blob(self._key(name)).upload_from_filename(
                os.fspath(local_path), checksum="crc32c", retry=self._retry, timeout=600)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None

    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        tune_download_reads()
        try:
            self.bucket.blob(self._key(name)).download_to_filename(
                os.fspath(local_path), checksum="crc32c", retry=self._retry, timeout=600)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def _upload_many(self, pairs: Sequence[tuple[str | os.PathLike, str]], transfers: int) -> list:
        """``transfer_manager.upload_many`` (threads) of ``pairs``: per pair,
        the blob, whose properties the upload's reply has set (the object
        resource: size, crc32c, generation), or the StorageError it failed with."""
        from google.cloud.storage import transfer_manager

        if not pairs:
            return []
        blobs = [self.bucket.blob(self._key(n)) for _p, n in pairs]
        results = transfer_manager.upload_many(
            [(os.fspath(p), b) for (p, _n), b in zip(pairs, blobs)],
            upload_kwargs={"checksum": "crc32c", "retry": self._retry, "timeout": 600},
            max_workers=max(1, transfers), worker_type=transfer_manager.THREAD, raise_exception=False)
        return [b if r is None else self._error(r, self.where(n), "write")
                for r, b, (_p, n) in zip(results, blobs, pairs)]

    def put_files(self, pairs: Sequence[tuple[str | os.PathLike, str]],
                  transfers: int = DEFAULT_TRANSFERS) -> list[BaseException | None]:
        return [r if isinstance(r, BaseException) else None for r in self._upload_many(pairs, transfers)]

    def put_files_info(self, pairs: Sequence[tuple[str | os.PathLike, str]],
                       transfers: int = DEFAULT_TRANSFERS) -> list[ObjectInfo | BaseException]:
        """:meth:`Storage.put_files_info` with no request after the uploads:
        each object's size, CRC32C and generation come from its upload's
        reply, the object resource GCS stored (an upload whose bytes do not
        match the CRC32C the client sent is refused by the service). Only a
        reply without size or crc32c costs a :meth:`stat` (in parallel)."""
        out: list[ObjectInfo | BaseException | None] = []
        for r, (_p, n) in zip(self._upload_many(pairs, transfers), pairs):
            if isinstance(r, BaseException):
                out.append(r)
            elif r.size is None or r.crc32c is None:
                out.append(None)
            else:
                out.append(ObjectInfo(n, int(r.size), r.crc32c, int(r.generation or 0)))
        unknown = [i for i, o in enumerate(out) if o is None]
        for i, info in zip(unknown, _run_parallel(self._written, [(pairs[i][1],) for i in unknown], transfers)):
            out[i] = info
        return out  # type: ignore[return-value]  # every None was filled in

    def list(self) -> list[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        out = []
        try:
            for blob in self.client.list_blobs(self.bucket_name, prefix=base, page_size=self.page_size,
                                               retry=self._retry, timeout=120):
                out.append(ObjectInfo(blob.name[len(base):], int(blob.size or 0), blob.crc32c,
                                      int(blob.generation or 0)))
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.url, "list") from None
        return sorted(out, key=lambda o: o.name)

    def delete(self, name: str, *, best_effort: bool = False) -> None:
        try:
            if best_effort:
                self.bucket.blob(self._key(name)).delete(retry=None, timeout=10)
            else:
                self.bucket.blob(self._key(name)).delete(retry=self._retry, timeout=60)
        except Exception as e:  # noqa: BLE001
            if not self._gone(e):
                raise self._error(e, self.where(name), "write") from None

    def reopen_options(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "project": self.project}


class _RetryReporter(logging.Handler):
    """Passes google-api-core's "Retrying due to ..." debug records on as one short WARNING line of this
    module's logger, at most once per ``every`` seconds (so whoever shows the package's lines shows it: the
    command line's console on stderr, or a library user's own logging)."""

    def __init__(self, every: float):
        super().__init__(logging.DEBUG)
        self.every, self.last = every, float("-inf")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            now = time.monotonic()
            if now - self.last < self.every:
                return
            self.last = now
            why = record.getMessage().replace("Retrying due to ", "").split(", sleeping")[0][:200]
            logger.warning("storage: transient error (%s); retrying with backoff, for up to 120 s per call", why)
        except Exception:  # noqa: BLE001 - a report that fails must never fail the retried call
            self.handleError(record)


def report_retries(every: float = 10.0) -> None:
    """Make the storage client's retries visible: while google-cloud-storage retries a transient error (429,
    5xx, a refused or reset connection) with backoff, log one WARNING line about it (logger
    ``spark_imagenet.storage.gcs``) every ``every`` seconds at most, instead of waiting silently for up to
    120 s. The command line calls this; library users may, or configure the ``google.api_core.retry`` logger
    themselves. Calling it twice installs one reporter.

    Args:
        every: least interval between two lines, in seconds.
    """
    retry_logger = logging.getLogger("google.api_core.retry")
    if any(isinstance(h, _RetryReporter) for h in retry_logger.handlers):
        return
    retry_logger.addHandler(_RetryReporter(every))
    retry_logger.setLevel(logging.DEBUG)
    retry_logger.propagate = False
