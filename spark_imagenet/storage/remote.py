"""What the object stores beside GCS share: a bucket and a prefix, picklable handles, entity tags as generations.

:class:`RemoteStorage` is the base of :class:`~spark_imagenet.storage.s3.S3Storage`,
:class:`~spark_imagenet.storage.azure.AzureStorage` and :class:`~spark_imagenet.storage.hdfs.HDFSStorage`:
object names under a prefix, a client made on first use and never pickled, and the entity tag (ETag) of
stores that have one carried as :attr:`ObjectInfo.generation` (an integer, as the interface wants) and
turned back into the ETag for a compare-and-swap.
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any, Iterable
from urllib.parse import urlparse

import google_crc32c

from spark_imagenet.errors import StorageError
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
        raise StorageError(f"{url}: '?' and '#' are not allowed in a {scheme}:// URL; write {example}")
    parsed = urlparse(url)
    if not parsed.netloc:
        raise StorageError(f"{url}: no {'host' if scheme in ('hdfs', 'webhdfs') else 'bucket name'}; write {example}")
    return parsed.netloc, parsed.path.strip("/")


class RemoteStorage(Storage):
    """A store reached through a client library: objects ``prefix/name`` in a bucket (or container).

    Subclasses set :attr:`url`, :attr:`prefix` and :attr:`_root` (the URL of the bucket itself, for
    :meth:`where`) and create their client in :meth:`_make_client`. Pickling keeps the settings, not the
    client (clients hold connections and credentials): the copy makes its own on first use.
    """

    prefix: str
    _root: str
    _client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

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
            raise StorageError(f"invalid object name {name!r} in {self.url}")
        return f"{self.prefix}/{name}" if self.prefix else name

    def where(self, name: str) -> str:
        return f"{self._root}/{self._key(name)}"
