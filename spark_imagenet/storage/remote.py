"""What every network store shares: the template a new store follows.

:class:`RemoteStorage` is the base of :class:`~spark_imagenet.storage.gcs.GCSStorage`,
:class:`~spark_imagenet.storage.s3.S3Storage`, :class:`~spark_imagenet.storage.azure.AzureStorage` and
:class:`~spark_imagenet.storage.hdfs.HDFSStorage`: object names under a prefix, a client made on first use and
never pickled, the check that the root (the bucket or container) exists, and the mapping of the client's
exceptions to :class:`~spark_imagenet.errors.StorageError` and its subclasses, written once here. A store
says only what is its own: how to make its client (:meth:`RemoteStorage._make_client`), what one of its
exceptions means (:meth:`RemoteStorage._classify`, one :class:`Fault`), how to read its root
(:meth:`RemoteStorage._probe_root`) and how messages name that root (:meth:`RemoteStorage._root_words`).
The entity tag (ETag) of stores that have one is carried as :attr:`ObjectInfo.generation` (an integer, as
the interface wants) and turned back into the ETag for a compare-and-swap.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import os
from typing import Any, Iterable
from urllib.parse import urlparse

import google_crc32c

from spark_imagenet.errors import AccessError, IntegrityError, PreconditionFailed, StorageError
from spark_imagenet.storage.base import CHUNK_BYTES, Storage


def etag_generation(etag: str | None) -> int | None:
    """An entity tag as an integer generation (its UTF-8 bytes, big-endian), None for no tag.

    The mapping is reversible (:func:`generation_etag`), so a compare-and-swap sends back the exact tag the
    store gave. Two writes of the same bytes may get the same tag (S3's MD5 ETag): a compare-and-swap
    then succeeds against content that is identical, which is harmless.
    """
    if not etag:
        return None
    return int.from_bytes(etag.encode("utf-8"), "big")


def generation_etag(generation: int) -> str:
    """The entity tag of :func:`etag_generation`'s integer."""
    return generation.to_bytes((generation.bit_length() + 7) // 8, "big").decode("utf-8")


def file_digests(path: str | os.PathLike, md5: bool = False) -> tuple[int, str, str | None]:
    """Size, CRC32C and (when asked) MD5 of a local file, in one read.

    Returns:
        tuple: ``(size in bytes, CRC32C as base64 of the big-endian value, MD5 as base64 or None)``.

    Raises:
        OSError: the file cannot be read.
    """
    crc = google_crc32c.Checksum()
    digest = hashlib.md5(usedforsecurity=False) if md5 else None
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc.update(chunk)
            if digest is not None:
                digest.update(chunk)
            size += len(chunk)
    return (size, base64.b64encode(crc.digest()).decode("ascii"),
            base64.b64encode(digest.digest()).decode("ascii") if digest is not None else None)


def crc32c_chunks(chunks: Iterable[bytes]) -> str:
    """CRC32C of a stream of byte chunks (a download read piece by piece, never whole in memory), in the form
    of :func:`~spark_imagenet.storage.crc32c_bytes`."""
    crc = google_crc32c.Checksum()
    for chunk in chunks:
        crc.update(chunk)
    return base64.b64encode(crc.digest()).decode("ascii")


def write_chunks(chunks: Iterable[bytes], local_path: str | os.PathLike) -> str:
    """Write a stream of byte chunks (a download) to a local file, checksumming them on the way.

    Returns:
        str: the CRC32C of the bytes written, in the form of :func:`~spark_imagenet.storage.crc32c_bytes`.

    Raises:
        OSError: the file cannot be written; whatever iterating ``chunks`` raises.
    """
    crc = google_crc32c.Checksum()
    with open(local_path, "wb") as f:
        for chunk in chunks:
            crc.update(chunk)
            f.write(chunk)
    return base64.b64encode(crc.digest()).decode("ascii")


def split_url(url: str, scheme: str, example: str) -> tuple[str, str]:
    """``(netloc, prefix)`` of a bucket URL, refusing what it cannot name.

    Args:
        url: e.g. ``s3://bucket/a/b/``.
        scheme: the scheme, for messages.
        example: the URL form to suggest, e.g. ``s3://BUCKET/PREFIX``.

    Returns:
        tuple: the network location (bucket, ``container@account...``, ``host:port``) and the prefix without
        leading or trailing ``/``.

    Raises:
        StorageError: ``?`` or ``#`` in the URL (never silently dropped), or no network location.
    """
    if "?" in url or "#" in url:
        raise StorageError(f"{url}: '?' and '#' are not allowed in a {scheme}:// URL; write {example}",
                           key="url", value=url)
    parsed = urlparse(url)
    if not parsed.netloc:
        raise StorageError(f"{url}: no {'host' if scheme in ('hdfs', 'webhdfs') else 'bucket name'}; write {example}",
                           key="url", value=url)
    return parsed.netloc, parsed.path.strip("/")


class Kind(enum.Enum):
    """What a store's exception means, in the same few kinds for every store (:meth:`RemoteStorage._classify`)."""

    #: A create-only or compare-and-swap write lost (:class:`~spark_imagenet.errors.PreconditionFailed`).
    PRECONDITION = "precondition"
    #: The root itself (the bucket, the container) does not exist.
    MISSING_ROOT = "missing root"
    #: The object does not exist; or its root, which only :meth:`RemoteStorage._probe_root` tells apart.
    MISSING = "missing"
    #: No usable credentials, or credentials the store rejected (401).
    CREDENTIALS = "credentials"
    #: The credentials lack a permission (403).
    DENIED = "denied"
    #: Bytes that do not match a checksum (:class:`~spark_imagenet.errors.IntegrityError`).
    CORRUPT = "corrupt"
    #: The store's endpoint cannot be reached.
    UNREACHABLE = "unreachable"
    #: Any other error the store answered with.
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Fault:
    """One exception of a store's client, as the store reads it (:meth:`RemoteStorage._classify`).

    The base turns it into the message of its kind (:meth:`RemoteStorage._error`): ``URL already exists or
    was changed by another writer (REASON)`` (PRECONDITION), ``URL: REASON. ADVICE`` (CREDENTIALS),
    ``URL: access denied (REASON). ADVICE`` (DENIED), ``URL: REASON`` (CORRUPT), ``URL: cannot reach REASON``
    (UNREACHABLE), ``URL: ACTION failed after retries (REASON); ADVICE`` (FAILED); MISSING and MISSING_ROOT
    take no words (the root's are :meth:`RemoteStorage._root_words`).

    Attributes:
        kind: what it means.
        reason: the store's words for it: the status and code (``"403 AuthorizationFailure"``) for
            PRECONDITION, DENIED and FAILED; the whole reason for CREDENTIALS (``"the credentials were rejected
            (InvalidAccessKeyId)"``), CORRUPT and UNREACHABLE (what cannot be reached and what to check).
        advice: what to do, one or more sentences (CREDENTIALS, DENIED; FAILED where there is some).
    """

    kind: Kind
    reason: str = ""
    advice: str = ""


@dataclasses.dataclass(frozen=True)
class RootWords:
    """How messages name a store's root, the bucket or container its objects live in, when it is missing.

    The message reads ``NOUN NAME does not exist PLACE. Check the name in URL[, and CHECK], or create it
    CREATE``.

    Attributes:
        noun: ``"bucket"``, ``"container"``.
        name: the root's name as the user knows it (``"s3://my-bucket"``).
        place: where it was looked for, after "does not exist" (``"at AWS S3"``); empty for nowhere special.
        create: how to create it, after "or create it" (``"with `az storage container create ...`"``).
        check: what else to check beside the name (``"the endpoint"``); empty for nothing.
    """

    noun: str
    name: str
    place: str
    create: str
    check: str = ""


class RemoteStorage(Storage):
    """A store reached through a client library: objects ``prefix/name`` under a root (a bucket, a container,
    a file system).

    Subclasses set :attr:`url`, :attr:`prefix` and :attr:`_root` (the URL of the root itself, for
    :meth:`where`), create their client in :meth:`_make_client` and say what their client's exceptions mean
    in :meth:`_classify`; every method of theirs that calls the client maps what it raises with
    :meth:`_error`. A store whose root must exist before any write (a bucket, a container) reads it in
    :meth:`_probe_root` and names it in :meth:`_root_words`: a 404 then says whether the object or the root
    is missing (:meth:`_check_root`, once per handle). Pickling keeps the settings, not the client (clients
    hold connections and credentials): the copy makes its own on first use.
    """

    prefix: str
    _root: str
    _client: Any = None
    #: Whether the root was found (or could not be checked, 403) by :meth:`_check_root`: not asked again.
    _root_ok: bool = False
    #: Whether the client retries transient errors itself before one reaches :meth:`_error` (messages say so).
    RETRIES = True

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_root_ok": False}

    @property
    def client(self) -> Any:
        """The client library's handle (created on first use)."""
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def _key(self, name: str) -> str:
        """The object key of ``name`` (under :attr:`prefix`).

        Raises:
            StorageError: an empty name, an absolute one, or one with ``..``.
        """
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise StorageError(f"invalid object name {name!r} in {self.url}", key="name", value=name)
        return f"{self.prefix}/{name}" if self.prefix else name

    def where(self, name: str) -> str:
        return f"{self._root}/{self._key(name)}"

    # -- the hooks of a store ---------------------------------------------------------------------------

    def _classify(self, e: BaseException, action: str) -> Fault | None:  # pragma: no cover - overridden
        """What an exception of the store's client means.

        Args:
            e: what the client raised.
            action: ``"read"``, ``"write"``, ``"list"`` or ``"access"`` (for advice that depends on it, such
                as the permission a write needs).

        Returns:
            Fault | None: its kind and the store's words; None for an exception the store does not know
            (a local file's OSError included), which :meth:`_error` reports as it is.
        """
        raise NotImplementedError

    def _probe_root(self) -> None:
        """One request that reads the root (the bucket's or container's own metadata), raising what the client
        raises; :meth:`_check_root` reads the exception with :meth:`_classify`. This default sends nothing: a
        store whose folders are made by its writes (HDFS) has no root that can be missing."""

    def _root_words(self) -> RootWords:  # pragma: no cover - stores that probe their root override it
        """How messages name the root (a store that overrides :meth:`_probe_root` overrides this too)."""
        raise NotImplementedError

    # -- written once -----------------------------------------------------------------------------------

    def _missing_root(self) -> AccessError:
        """The error of a root that does not exist: its name, where it was looked for, how to create it."""
        words = self._root_words()
        also = f", and {words.check}" if words.check else ""
        place = f" {words.place}" if words.place else ""
        return AccessError(f"{words.noun} {words.name} does not exist{place}. Check the name in {self.url}{also}, "
                           f"or create it {words.create}", key="url", value=self._root)

    def _check_root(self) -> None:
        """Raise a clear error when the root itself is missing (a missing object in a missing bucket only says
        404); once per handle. Reading the root without the permission to (a 403: access to objects only)
        cannot tell, and counts as found.

        Raises:
            AccessError: the root does not exist (:meth:`_missing_root`), or the credentials are refused.
            StorageError: the root cannot be read.
        """
        if self._root_ok:
            return
        try:
            self._probe_root()
        except Exception as e:  # noqa: BLE001 - classified below
            fault = self._classify(e, "read")
            kind = fault.kind if fault is not None else None
            if kind in (Kind.MISSING, Kind.MISSING_ROOT):
                raise self._missing_root() from None
            if kind is not Kind.DENIED:
                raise self._error(e, self._root) from None
        self._root_ok = True

    def _not_found(self, what: str) -> StorageError:
        """The error of a 404 on ``what``: the root's when the root is what is missing (:meth:`_check_root`),
        else ``what does not exist``."""
        try:
            self._check_root()
        except StorageError as missing:
            return missing
        return StorageError(f"{what} does not exist", key="url", value=what)

    def _error(self, e: BaseException, what: str, action: str = "access", *,
               replacing: bool = False) -> StorageError:
        """The StorageError (or subclass) that says what happened to ``what`` and what to check, for anything
        the client raised; never names a credential.

        Args:
            e: the exception (a StorageError is returned as it is).
            what: the URL of the object (or of the store) the call was about.
            action: ``"read"``, ``"write"``, ``"list"`` or ``"access"``.
            replacing: the call was a compare-and-swap write (``if_generation_match`` > 0): an object found
                missing was deleted by another writer, which is a :class:`PreconditionFailed`.

        Returns:
            StorageError: :class:`PreconditionFailed`, :class:`AccessError` (missing root, credentials,
            permission), :class:`IntegrityError` (checksum), or a plain StorageError; its ``key`` is ``"url"`` and
            its ``value`` ``what`` (the root's URL for a missing root).
        """
        if isinstance(e, StorageError):
            return e
        fault = self._classify(e, action)
        if fault is None:
            if isinstance(e, OSError):
                return StorageError(f"{what}: local file error during {action}: {e}", key="url", value=what)
            text = str(e).splitlines()[0] if str(e) else ""
            return StorageError(f"{what}: {action} failed ({type(e).__name__}: {text[:300]})", key="url", value=what)
        reason = f" ({fault.reason})" if fault.reason else ""
        if fault.kind is Kind.PRECONDITION:
            return PreconditionFailed(f"{what} already exists or was changed by another writer{reason}", key="url",
                                      value=what)
        if fault.kind is Kind.MISSING_ROOT:
            return self._missing_root()
        if fault.kind is Kind.MISSING:
            missing = self._not_found(what)
            if replacing and type(missing) is StorageError:
                return PreconditionFailed(f"{what} was deleted by another writer since it was read", key="url",
                                          value=what)
            return missing
        if fault.kind is Kind.CREDENTIALS:
            return AccessError(f"{what}: {fault.reason}. {fault.advice}", key="url", value=what)
        if fault.kind is Kind.DENIED:
            return AccessError(f"{what}: access denied{reason}. {fault.advice}", key="url", value=what)
        if fault.kind is Kind.CORRUPT:
            return IntegrityError(f"{what}: {fault.reason}", key="url", value=what)
        if fault.kind is Kind.UNREACHABLE:
            return StorageError(f"{what}: cannot reach {fault.reason}", key="url", value=what)
        advice = f"; {fault.advice}" if fault.advice else ""
        return StorageError(f"{what}: {action} failed{' after retries' if self.RETRIES else ''}{reason}{advice}",
                            key="url", value=what)

    def _gone(self, e: BaseException) -> bool:
        """Whether a delete's exception only says the object is not there (deleting what is gone is no
        error; a missing root is one)."""
        fault = self._classify(e, "write")
        return fault is not None and fault.kind is Kind.MISSING
