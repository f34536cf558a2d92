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
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

from spark_imagenet.errors import StorageError
from spark_imagenet.storage.base import (
    CHUNK_BYTES,
    DEFAULT_TRANSFERS,
    ObjectInfo,
    Storage,
    crc32c_bytes,
    crc32c_file,
    unretryable,
)
from spark_imagenet.storage.gcs import GCSStorage, report_retries
from spark_imagenet.storage.local import LocalStorage

__all__ = [
    "CHUNK_BYTES", "DEFAULT_TRANSFERS", "GCSStorage", "LocalStorage", "ObjectInfo", "Storage", "crc32c_bytes",
    "crc32c_file", "open_storage", "report_retries", "unretryable",
]


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
        StorageError: the scheme is unknown, the URL is empty, a ``file://``
            URL names a host, or a ``gs://`` URL names no bucket or holds
            ``?`` or ``#``.
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
