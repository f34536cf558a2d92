"""One URL-based storage interface for dataset "buckets".

A bucket URL names a folder that holds a dataset's shards and its
``manifest.json``. Callers never look at the scheme: they call
:func:`open_storage` and use the returned :class:`Storage`, so a new scheme
(``gs://bucket/prefix``) plugs in here without touching them.

Supported:

* a plain local path (``/data/imagenet-shards``, ``./shards``) or a
  ``file://`` URL (``file:///data/imagenet-shards``): :class:`LocalStorage`;
* ``gs://bucket/prefix``: :class:`GCSStorage`, on the ``google-cloud-storage``
  client (its ``transfer_manager`` for parallel transfers, its retry policy
  for 429/5xx/reset connections). Credentials are found the way Google's
  libraries find them (Application Default Credentials:
  ``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default
  login``, the metadata server of a GCE/Dataproc/GKE machine).
  ``STORAGE_EMULATOR_HOST`` (e.g. ``http://127.0.0.1:4443`` for
  fake-gcs-server) sends every request to an emulator with anonymous
  credentials.

Checksums are CRC32C (Castagnoli), encoded as the base64 of the 4-byte
big-endian value: the exact form Google Cloud Storage reports in an object's
``crc32Hash`` metadata, so a manifest written to local disk can later be
verified against a bucket without recomputing anything.
"""

from __future__ import annotations

import abc
import base64
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import logging
import os
import shutil
import stat as stat_module
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import unquote, urlparse

import google_crc32c

from .errors import AccessError, IntegrityError, PreconditionFailed, StorageError

#: Read size for checksumming and copying files, in bytes (8 MiB).
CHUNK_BYTES = 8 * 1024 * 1024
#: Default number of parallel transfers (``--transfers``).
DEFAULT_TRANSFERS = 8


def crc32c_bytes(data: bytes) -> str:
    """CRC32C of ``data`` as GCS reports it.

    Args:
        data: the bytes to checksum.

    Returns:
        str: base64 of the big-endian 32-bit CRC32C (8 characters), e.g.
        ``"AAAAAA=="`` for empty input.
    """
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode("ascii")


def crc32c_file(path: str | os.PathLike) -> str:
    """CRC32C of a local file, in the form of :func:`crc32c_bytes`.

    Args:
        path: local file path.

    Returns:
        str: base64 of the big-endian 32-bit CRC32C.

    Raises:
        OSError: the file cannot be read.
    """
    crc = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc.update(chunk)
    return base64.b64encode(crc.digest()).decode("ascii")


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """One object (file) in a bucket.

    Attributes:
        name: path relative to the bucket URL, ``/``-separated.
        size: size in bytes.
        crc32c: the CRC32C the store reports without reading the data (GCS
            object metadata, in the form of :func:`crc32c_bytes`); None where
            the store keeps no checksum (local files).
        generation: a number that changes whenever the object is rewritten
            (GCS object generation; the file's ``st_mtime_ns`` locally). Used
            as the compare-and-swap token of :meth:`Storage.write_bytes`.
    """

    name: str
    size: int
    crc32c: str | None = None
    generation: int | None = None


def _run_parallel(fn, pairs: Sequence[tuple], transfers: int) -> list[BaseException | None]:
    """Call ``fn(*pair)`` for every pair on ``transfers`` threads; one result
    per pair: None on success, else the exception it raised."""
    def one(pair):
        try:
            fn(*pair)
            return None
        except Exception as e:  # reported per pair, like transfer_manager does
            return e

    if transfers <= 1 or len(pairs) <= 1:
        return [one(p) for p in pairs]
    with concurrent.futures.ThreadPoolExecutor(min(transfers, len(pairs))) as pool:
        return list(pool.map(one, pairs))


def unretryable(errors: Sequence[BaseException | None], what: str) -> StorageError | None:
    """The error that should end a batch of transfers now, or None.

    A batch's failures (as :meth:`Storage.put_files`/:meth:`Storage.get_files`
    return them) are worth one more transfer only when they are checksum
    mismatches (:class:`IntegrityError`): everything else was already
    retried with backoff by the client.

    Args:
        errors: one entry per transfer, None for a success.
        what: the start of the message, e.g. ``"could not be fetched from gs://b/p"``.

    Returns:
        StorageError | None: the first :class:`AccessError` (a missing
        bucket, 401, 403) as it is; else a StorageError ``"N shard(s) <what>:
        <the first 5 errors>"`` when any failure is not a mismatch; else None.
    """
    denied = next((e for e in errors if isinstance(e, AccessError)), None)
    if denied is not None:
        return denied
    fatal = [e for e in errors if e is not None and not isinstance(e, IntegrityError)]
    if not fatal:
        return None
    return StorageError(f"{len(fatal)} shard(s) {what}: " + "; ".join(str(e) for e in fatal[:5])
                        + (f"; ... and {len(fatal) - 5} more" if len(fatal) > 5 else ""))


class Storage(abc.ABC):
    """A folder of objects addressed by a URL.

    Object names are relative to the storage URL and use ``/`` as separator.
    Every write is atomic: a reader sees either the old object or the whole
    new one, never a partial file. Implementations raise
    :class:`~spark_imagenet.errors.StorageError` (never a client library's
    own exception) with a message naming the URL and what to check.
    """

    #: The URL this storage was opened with, normalised.
    url: str

    @abc.abstractmethod
    def stat(self, name: str) -> ObjectInfo | None:
        """Size, checksum (where known) and generation of object ``name``;
        None when it does not exist.

        Raises:
            StorageError: the store cannot be reached or read (a missing
                bucket included).
        """

    def exists(self, name: str) -> bool:
        """Whether object ``name`` exists (see :meth:`stat`)."""
        return self.stat(name) is not None

    def size(self, name: str) -> int:
        """Size of object ``name`` in bytes.

        Raises:
            StorageError: the object does not exist.
        """
        info = self.stat(name)
        if info is None:
            raise StorageError(f"{self.where(name)} does not exist")
        return info.size

    def where(self, name: str) -> str:
        """The full URL of object ``name``, for messages."""
        return f"{self.url.rstrip('/')}/{name}"

    def crc32c(self, name: str) -> str:
        """CRC32C of object ``name`` (form of :func:`crc32c_bytes`), from the
        store's metadata when it keeps one, else by reading the object.

        Raises:
            StorageError: the object does not exist or cannot be read.
        """
        info = self.stat(name)
        if info is None:
            raise StorageError(f"{self.where(name)} does not exist")
        if info.crc32c is not None:
            return info.crc32c
        return crc32c_bytes(self.read_bytes(name))

    @abc.abstractmethod
    def read_bytes(self, name: str) -> bytes:
        """Whole content of object ``name``.

        Raises:
            StorageError: the object does not exist or cannot be read.
        """

    @abc.abstractmethod
    def write_bytes(self, name: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        """Atomically create or replace object ``name`` with ``data``.

        Args:
            name: object name.
            data: the new content.
            if_generation_match: None writes unconditionally; 0 creates only
                (fails when the object exists); any other value replaces
                only the object whose :attr:`ObjectInfo.generation` is that
                value (compare-and-swap). The GCS precondition of the same
                name; emulated locally under an ``flock`` of the folder.

        Raises:
            PreconditionFailed: ``if_generation_match`` was not met.
            StorageError: the object cannot be written.
        """

    @abc.abstractmethod
    def put_file(self, local_path: str | os.PathLike, name: str, *, move: bool = False) -> None:
        """Atomically publish a local file as object ``name``.

        Args:
            local_path: the file to publish.
            name: the object name.
            move: allow moving the file instead of copying it (a rename when
                it is on the same filesystem); callers must not use
                ``local_path`` afterwards. Ignored by remote stores.

        Raises:
            StorageError: the object cannot be written.
        """

    @abc.abstractmethod
    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        """Copy object ``name`` to ``local_path`` (overwritten if present).

        The copy is checked only where the client checks it (GCS: the
        object's CRC32C/MD5 on whole downloads); callers verify against the
        manifest, see :mod:`spark_imagenet.cache`.

        Raises:
            StorageError: the object does not exist or cannot be read, or
                its bytes do not match the store's own checksum.
        """

    def put_files(self, pairs: Sequence[tuple[str | os.PathLike, str]],
                  transfers: int = DEFAULT_TRANSFERS) -> list[BaseException | None]:
        """:meth:`put_file` for many ``(local_path, name)`` pairs at once.

        Args:
            pairs: what to publish.
            transfers: how many transfers run in parallel (threads).

        Returns:
            list: one entry per pair, None on success or the
            :class:`StorageError` it failed with (nothing is raised, so the
            caller can retry just the failures).
        """
        return _run_parallel(self.put_file, pairs, transfers)

    def get_files(self, pairs: Sequence[tuple[str, str | os.PathLike]],
                  transfers: int = DEFAULT_TRANSFERS) -> list[BaseException | None]:
        """:meth:`get_file` for many ``(name, local_path)`` pairs at once.

        Args:
            pairs: what to download where.
            transfers: how many transfers run in parallel (threads).

        Returns:
            list: one entry per pair, None on success or the
            :class:`StorageError` it failed with.
        """
        return _run_parallel(self.get_file, pairs, transfers)

    @abc.abstractmethod
    def list(self) -> list[ObjectInfo]:
        """Every object under this URL, sorted by name (all pages).

        Raises:
            StorageError: the store cannot be listed (a missing bucket
                included).
        """

    @abc.abstractmethod
    def delete(self, name: str, *, best_effort: bool = False) -> None:
        """Delete object ``name``; no error when it does not exist.

        Args:
            name: the object.
            best_effort: one short try, no retries (clean-up after another
                failure, which is the message that matters).

        Raises:
            StorageError: the object exists and cannot be deleted.
        """

    def staging_dir(self) -> Path | None:
        """A local folder on the same filesystem as the objects, where files
        can be written and then published with :meth:`put_file` by a rename;
        ``None`` for remote storage (stage in a temporary folder instead)."""
        return None

    def root_exists(self) -> bool:
        """Whether the storage's own folder exists (always True for buckets,
        whose prefixes are not objects)."""
        return True

    def remove_empty_root(self) -> None:
        """Remove the storage's own folder when it is empty (after a failed
        first build); nothing for buckets."""

    def reopen_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`open_storage` that reopen this storage
        in another process (a Spark executor), where the driver's environment
        variables are not set."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class LocalStorage(Storage):
    """Objects as files in a local (or network-mounted) directory.

    Methods behave as documented on :class:`Storage` (their docstrings are
    inherited). Writes go to a hidden temporary file in the same folder and
    are renamed into place with ``os.replace`` (atomic on POSIX). Conditional
    writes hold an ``flock`` on the folder (reliable on local filesystems,
    not on every network filesystem).

    Args:
        root: the directory; created on first write.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)

    def _path(self, name: str) -> Path:
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise StorageError(f"invalid object name {name!r} in {self.url}")
        return self.root / name

    def where(self, name: str) -> str:
        return str(self._path(name))

    def stat(self, name: str) -> ObjectInfo | None:
        try:
            st = self._path(name).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"cannot read {self._path(name)}: {e}") from e
        if not stat_module.S_ISREG(st.st_mode):  # a folder is not an object
            return None
        return ObjectInfo(name, st.st_size, None, st.st_mtime_ns)

    def crc32c(self, name: str) -> str:
        try:
            return crc32c_file(self._path(name))
        except FileNotFoundError:
            raise StorageError(f"{self._path(name)} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {self._path(name)}: {e}") from e

    def read_bytes(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            raise StorageError(f"{self._path(name)} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {self._path(name)}: {e}") from e

    def _tmp(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    @contextlib.contextmanager
    def _folder_lock(self, folder: Path):
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def write_bytes(self, name: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        path = self._path(name)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._tmp(path)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if if_generation_match is None:
                os.replace(tmp, path)
                return
            with self._folder_lock(path.parent):
                current = self.stat(name)
                if (current.generation if current else 0) != if_generation_match:
                    raise PreconditionFailed(
                        f"{path} " + ("already exists" if if_generation_match == 0 else
                                      "was changed by another writer since it was read")
                    )
                os.replace(tmp, path)
        except OSError as e:
            raise StorageError(f"cannot write {path}: {e}") from e
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()

    def put_file(self, local_path: str | os.PathLike, name: str, *, move: bool = False) -> None:
        path = self._path(name)
        local_path = Path(local_path)
        tmp = self._tmp(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if local_path.resolve() == path.resolve():
                return
            moved = False
            if move:
                with contextlib.suppress(OSError):
                    os.replace(local_path, tmp)  # same filesystem: a rename
                    moved = True
            if not moved:
                shutil.copyfile(local_path, tmp)
            os.replace(tmp, path)
        except OSError as e:
            raise StorageError(f"cannot publish {local_path} as {path}: {e}") from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        src = self._path(name)
        try:
            shutil.copyfile(src, local_path)
        except FileNotFoundError:
            raise StorageError(f"{src} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot copy {src} to {local_path}: {e}") from e

    def list(self) -> list[ObjectInfo]:
        if not self.root.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(self.root):
            for fn in files:
                p = Path(dirpath) / fn
                with contextlib.suppress(FileNotFoundError):  # a temp file renamed meanwhile
                    st = p.stat()
                    out.append(ObjectInfo(p.relative_to(self.root).as_posix(), st.st_size, None, st.st_mtime_ns))
        return sorted(out, key=lambda o: o.name)

    def delete(self, name: str, *, best_effort: bool = False) -> None:
        try:
            self._path(name).unlink()
        except FileNotFoundError:
            pass

    def staging_dir(self) -> Path:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self._tmp(self.root / ".write-probe")
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise StorageError(
                f"{self.url}: cannot create or write this folder ({e.strerror or e}); "
                "choose a writable folder for the shards"
            ) from None
        return self.root

    def root_exists(self) -> bool:
        return self.root.exists()

    def remove_empty_root(self) -> None:
        with contextlib.suppress(OSError):
            if self.root.is_dir() and not any(self.root.iterdir()):
                self.root.rmdir()


class GCSStorage(Storage):
    """Objects under ``gs://bucket/prefix`` in Google Cloud Storage.

    Methods behave as documented on :class:`Storage`. Built on
    ``google-cloud-storage``: every call uses its ``DEFAULT_RETRY`` policy
    (exponential backoff from 1 s, doubling up to 60 s, for at most 120 s of
    retries on 408/429/5xx and reset or refused connections; the library's
    defaults, see ``google.cloud.storage.retry``), uploads included, since
    every object this package writes is either immutable under its name or
    written with a generation precondition. Downloads are checked by the
    client against the object's CRC32C (``DataCorruption`` otherwise);
    :meth:`put_files`/:meth:`get_files` use ``transfer_manager`` with
    threads. A missing bucket, 401 and 403 fail at once with a message
    saying what to check.

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
        client: an existing ``google.cloud.storage.Client`` to use instead.

    Raises:
        StorageError: the URL has no bucket name, or the client cannot be
            created (no credentials: says how to provide them).
    """

    def __init__(self, url: str, *, endpoint: str | None = None, project: str | None = None,
                 page_size: int = 1000, retry_seconds: float = 120.0, client: Any = None):
        parsed = urlparse(url)
        self.bucket_name = parsed.netloc
        if not self.bucket_name:
            raise StorageError(f"{url}: no bucket name; write gs://BUCKET/PREFIX")
        self.prefix = parsed.path.strip("/")
        self.url = f"gs://{self.bucket_name}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or None
        if self.endpoint and "://" not in self.endpoint:
            self.endpoint = "http://" + self.endpoint
        self.project = project
        self.page_size = page_size
        self._retry_seconds = float(retry_seconds)
        self._client = client
        self._bucket = None
        self._bucket_ok = False

    # -- plumbing -----------------------------------------------------------

    @property
    def client(self):
        """The ``google.cloud.storage.Client`` (created on first use)."""
        if self._client is None:
            from google.auth import exceptions as auth_exceptions
            from google.cloud import storage as gcs

            try:
                if self.endpoint:
                    from google.auth.credentials import AnonymousCredentials

                    self._client = gcs.Client(project=self.project or "spark-imagenet",
                                              credentials=AnonymousCredentials(),
                                              client_options={"api_endpoint": self.endpoint})
                else:
                    self._client = gcs.Client(project=self.project)
            except auth_exceptions.DefaultCredentialsError as e:
                raise AccessError(
                    f"{self.url}: no Google Cloud credentials found ({e}). Run `gcloud auth application-default "
                    "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file; on GCE, "
                    "Dataproc or GKE the machine's service account is used"
                ) from None
        return self._client

    @property
    def bucket(self):
        if self._bucket is None:
            self._bucket = self.client.bucket(self.bucket_name)
        return self._bucket

    def _key(self, name: str) -> str:
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise StorageError(f"invalid object name {name!r} in {self.url}")
        return f"{self.prefix}/{name}" if self.prefix else name

    def where(self, name: str) -> str:
        return f"gs://{self.bucket_name}/{self._key(name)}"

    def _check_bucket(self) -> None:
        """Raise a clear StorageError when the bucket itself is missing (an
        object lookup in a missing bucket only says 'not found')."""
        if self._bucket_ok:
            return
        from google.api_core import exceptions as gexc

        try:
            self.bucket.reload(timeout=60)
        except gexc.NotFound:
            at = f" at the endpoint {self.endpoint} (from STORAGE_EMULATOR_HOST or endpoint=)" if self.endpoint else ""
            raise AccessError(
                f"bucket gs://{self.bucket_name} does not exist{at} (or the project is wrong). Check the name in "
                f"{self.url}" + (", and the endpoint" if self.endpoint else "") + ", or create it in the region of "
                f"your Spark workers: `gcloud storage buckets create gs://{self.bucket_name} --location=REGION`"
            ) from None
        except gexc.Forbidden:
            pass  # object-level access without storage.buckets.get: cannot tell, assume it exists
        except Exception as e:  # noqa: BLE001 - mapped to one message
            raise self._error(e, f"gs://{self.bucket_name}") from None
        self._bucket_ok = True

    def _error(self, e: BaseException, what: str, action: str = "access") -> StorageError:
        """Map a client exception to a StorageError that says what to check."""
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as auth_exceptions

        if isinstance(e, StorageError):
            return e
        detail = getattr(e, "message", None) or str(e)
        detail = detail.splitlines()[0] if detail else type(e).__name__
        if isinstance(e, gexc.PreconditionFailed):
            return PreconditionFailed(f"{what} already exists or was changed by another writer (412)")
        if isinstance(e, gexc.NotFound):
            try:
                self._check_bucket()
            except StorageError as missing:
                return missing
            return StorageError(f"{what} does not exist")
        if isinstance(e, gexc.Unauthorized):
            return AccessError(
                f"{what}: the credentials were rejected (401: {detail}). Refresh them with `gcloud auth "
                "application-default login` or check the key file in GOOGLE_APPLICATION_CREDENTIALS"
            )
        if isinstance(e, gexc.Forbidden):
            need = "storage.objects.create/delete (roles/storage.objectAdmin)" if action == "write" else \
                "storage.objects.get/list (roles/storage.objectViewer)"
            return AccessError(
                f"{what}: access denied (403: {detail}). The account in use needs {need} on bucket "
                f"gs://{self.bucket_name}; check the IAM roles, or the account "
                "(GOOGLE_APPLICATION_CREDENTIALS / gcloud auth application-default login)"
            )
        if isinstance(e, auth_exceptions.InvalidOperation):
            # google-auth answers a 401 by refreshing the credentials and resending; anonymous
            # credentials (an endpoint / STORAGE_EMULATOR_HOST) cannot be refreshed, so a 401 surfaces
            # as this "Anonymous credentials cannot be refreshed" error instead of Unauthorized.
            return AccessError(
                f"{what}: the credentials were rejected (401: {self.endpoint or 'the endpoint'} requires "
                f"credentials, and requests to it are sent anonymously). Check the endpoint given by "
                "STORAGE_EMULATOR_HOST or endpoint=: an emulator must accept anonymous requests; for Google Cloud "
                "Storage itself, unset it so Application Default Credentials are used (`gcloud auth "
                "application-default login` or GOOGLE_APPLICATION_CREDENTIALS)"
            )
        if isinstance(e, (auth_exceptions.RefreshError, auth_exceptions.TransportError)):
            return AccessError(f"{what}: cannot obtain Google credentials ({detail}); check the machine's "
                                "service account or GOOGLE_APPLICATION_CREDENTIALS")
        from google.cloud.storage.exceptions import DataCorruption

        if isinstance(e, DataCorruption):
            return IntegrityError(f"{what}: the downloaded bytes do not match the object's checksum "
                                  "(corrupt object or transfer)")
        if isinstance(e, gexc.RetryError):  # the retry deadline passed: say what kept failing
            cause = e.cause if e.cause is not None else e
            if cause is not e:
                inner = self._error(cause, what, action)
                return type(inner)(f"{inner} (still failing after retrying with backoff for "
                                   f"{self._retry_seconds:.0f} s)")
        if isinstance(e, gexc.GoogleAPICallError):
            return StorageError(f"{what}: {action} failed after retries ({type(e).__name__}: {detail})")
        import requests

        if isinstance(e, requests.exceptions.RequestException):
            where = (f"the endpoint {self.endpoint} (from STORAGE_EMULATOR_HOST or endpoint=); check that it "
                     "is running and its scheme (http/https) and port" if self.endpoint else
                     "storage.googleapis.com; check the network, proxy settings and DNS")
            kind = "connection refused" if "refused" in detail.lower() else type(e).__name__
            return StorageError(f"{what}: cannot reach {where} ({kind}: {detail[:200]})")
        if isinstance(e, OSError):
            return StorageError(f"{what}: local file error during {action}: {e}")
        return StorageError(f"{what}: {action} failed ({type(e).__name__}: {detail})")

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
            self._check_bucket()
            return None
        return ObjectInfo(name, int(blob.size or 0), blob.crc32c, int(blob.generation or 0))

    def read_bytes(self, name: str) -> bytes:
        try:
            return self.bucket.blob(self._key(name)).download_as_bytes(retry=self._retry, timeout=120)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def write_bytes(self, name: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        try:
            self.bucket.blob(self._key(name)).upload_from_string(
                data, checksum="crc32c", if_generation_match=if_generation_match, retry=self._retry, timeout=120)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None

    def put_file(self, local_path: str | os.PathLike, name: str, *, move: bool = False) -> None:
        try:
            self.bucket.blob(self._key(name)).upload_from_filename(
                os.fspath(local_path), checksum="crc32c", retry=self._retry, timeout=600)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None

    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        try:
            self.bucket.blob(self._key(name)).download_to_filename(
                os.fspath(local_path), checksum="crc32c", retry=self._retry, timeout=600)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def put_files(self, pairs: Sequence[tuple[str | os.PathLike, str]],
                  transfers: int = DEFAULT_TRANSFERS) -> list[BaseException | None]:
        from google.cloud.storage import transfer_manager

        if not pairs:
            return []
        results = transfer_manager.upload_many(
            [(os.fspath(p), self.bucket.blob(self._key(n))) for p, n in pairs],
            upload_kwargs={"checksum": "crc32c", "retry": self._retry, "timeout": 600},
            max_workers=max(1, transfers), worker_type=transfer_manager.THREAD, raise_exception=False)
        return [None if r is None else self._error(r, self.where(n), "write") for r, (_p, n) in zip(results, pairs)]

    def get_files(self, pairs: Sequence[tuple[str, str | os.PathLike]],
                  transfers: int = DEFAULT_TRANSFERS) -> list[BaseException | None]:
        from google.cloud.storage import transfer_manager

        if not pairs:
            return []
        results = transfer_manager.download_many(
            [(self.bucket.blob(self._key(n)), os.fspath(p)) for n, p in pairs],
            download_kwargs={"checksum": "crc32c", "retry": self._retry, "timeout": 600},
            max_workers=max(1, transfers), worker_type=transfer_manager.THREAD, raise_exception=False)
        return [None if r is None else self._error(r, self.where(n), "read") for r, (n, _p) in zip(results, pairs)]

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
        from google.api_core import exceptions as gexc

        try:
            if best_effort:
                self.bucket.blob(self._key(name)).delete(retry=None, timeout=10)
            else:
                self.bucket.blob(self._key(name)).delete(retry=self._retry, timeout=60)
        except gexc.NotFound:
            pass
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None

    def reopen_options(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "project": self.project}


class _RetryReporter(logging.Handler):
    """Prints google-api-core's "Retrying due to ..." debug records as one
    short line, at most once per ``every`` seconds."""

    def __init__(self, stream, every: float):
        super().__init__(logging.DEBUG)
        self.stream, self.every, self.last = stream, every, float("-inf")

    def emit(self, record: logging.LogRecord) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        text = record.getMessage().replace("Retrying due to ", "")
        why = text.split(", sleeping")[0][:200]
        print(f"storage: transient error ({why}); retrying with backoff, for up to 120 s per call",
              file=self.stream, flush=True)


def report_retries(stream=None, every: float = 10.0) -> None:
    """Make the storage client's retries visible: while google-cloud-storage
    retries a transient error (429, 5xx, a refused or reset connection) with
    backoff, print one line about it to ``stream`` every ``every`` seconds at
    most, instead of waiting silently for up to 120 s. The command line calls
    this; library users may, or configure the ``google.api_core.retry``
    logger themselves. Calling it twice installs one reporter.

    Args:
        stream: where to print (default ``sys.stderr``).
        every: least interval between two lines, in seconds.
    """
    logger = logging.getLogger("google.api_core.retry")
    if any(isinstance(h, _RetryReporter) for h in logger.handlers):
        return
    logger.addHandler(_RetryReporter(stream or sys.stderr, every))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False


def open_storage(url: str | os.PathLike, **options: Any) -> Storage:
    """Open the storage a bucket URL names.

    Args:
        url: a local path, a ``file://`` URL, or ``gs://bucket/prefix``.
        **options: passed to the implementation (``GCSStorage``: ``endpoint``,
            ``project``, ``page_size``); what :meth:`Storage.reopen_options`
            returned, to open the same storage in another process.

    Returns:
        Storage: the matching implementation.

    Raises:
        StorageError: the scheme is unknown, the URL is empty, or (gs://) it
            names no bucket.
    """
    text = os.fspath(url)
    if not text:
        raise StorageError("empty bucket URL: give a local path, file:// URL or gs://bucket/prefix")
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        return LocalStorage(text)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"file:// URL with a host is not supported: {text!r}; use file:///absolute/path")
        return LocalStorage(unquote(parsed.path))
    if scheme == "gs":
        if parsed.query or parsed.fragment or "?" in text or "#" in text:
            raise StorageError(f"{text}: '?' and '#' are not allowed in a gs:// URL; write gs://BUCKET/PREFIX")
        return GCSStorage(text, **{k: v for k, v in options.items() if v is not None})
    raise StorageError(f"{text}: unknown URL scheme {scheme!r}; use a local path, file:// URL or gs://bucket/prefix")
