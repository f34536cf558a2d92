"""One URL-based storage interface for dataset "buckets".

A bucket URL names a folder that holds a dataset's shards and its
``manifest.json``. Callers never look at the scheme: they call
:func:`open_storage` and use the returned :class:`Storage`, so a new scheme
(``gs://bucket/prefix``) plugs in here without touching them: one row of
:data:`STORES` (its schemes, the module and class that serve them) and a
:class:`~spark_imagenet.storage.remote.RemoteStorage` subclass, the template
every network store follows (the root check and the error mapping are
written there once).

Supported:

* a plain local path (``/data/imagenet-shards``, ``./shards``) or a
  ``file://`` URL (``file:///data/imagenet-shards``): :class:`LocalStorage`;
* ``gs://bucket/prefix``: :class:`GCSStorage`, on the ``google-cloud-storage``
  client (its ``transfer_manager`` for parallel uploads, threads of its own
  for parallel downloads, its retry policy for 429/5xx/reset connections). Credentials are found the way Google's
  libraries find them (Application Default Credentials:
  ``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default
  login``, the metadata server of a GCE/Dataproc/GKE machine).
  ``STORAGE_EMULATOR_HOST`` (e.g. ``http://127.0.0.1:4443`` for
  fake-gcs-server) sends every request to an emulator with anonymous
  credentials.
* ``s3://bucket/prefix``: :class:`~spark_imagenet.storage.s3.S3Storage`, on
  ``boto3`` (the ``s3`` extra); botocore's credential chain;
  ``AWS_ENDPOINT_URL`` (or ``endpoint=``) for an S3-compatible server.
* ``abfs://container@account.dfs.core.windows.net/prefix`` (``abfss://``,
  ``az://container/prefix``): :class:`~spark_imagenet.storage.azure.AzureStorage`,
  on ``azure-storage-blob`` (the ``azure`` extra);
  ``AZURE_STORAGE_CONNECTION_STRING`` (Azurite, keys, SAS) or
  ``DefaultAzureCredential``.
* ``hdfs://namenode[:port]/path`` and ``webhdfs://namenode:http-port/path``:
  :class:`~spark_imagenet.storage.hdfs.HDFSStorage`, over WebHDFS with
  fsspec's ``webhdfs`` (the ``hdfs`` extra); the HTTP port from the
  ``webhdfs://`` URL, ``dfs.namenode.http-address`` in
  ``$HADOOP_CONF_DIR/hdfs-site.xml``, or 9870.

On top of :class:`Storage`: :mod:`spark_imagenet.storage.committed` (sets of
objects with size and CRC32C, moved verified, a marker written last: shards
and manifest, checkpoints, ``--output``) and
:mod:`spark_imagenet.storage.envelope` (versioned JSON documents).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any
from urllib.parse import unquote, urlparse

from spark_imagenet.errors import StorageError, install_hint
from spark_imagenet.storage.base import (
    CHUNK_BYTES,
    DEFAULT_TRANSFERS,
    ObjectInfo,
    Storage,
    check_transfers,
    crc32c_bytes,
    crc32c_file,
    unretryable,
)
from spark_imagenet.storage.gcs import GCSStorage, report_retries
from spark_imagenet.storage.local import LocalStorage, write_json_atomic

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_TRANSFERS",
    "LOCAL_FORM",
    "STORES",
    "GCSStorage",
    "LocalStorage",
    "ObjectInfo",
    "Storage",
    "StoreKind",
    "check_transfers",
    "crc32c_bytes",
    "crc32c_file",
    "is_remote_url",
    "open_storage",
    "report_retries",
    "store_schemes",
    "unretryable",
    "url_forms",
    "write_json_atomic",
]


@dataclasses.dataclass(frozen=True)
class StoreKind:
    """One kind of bucket :func:`open_storage` opens: the one definition every message naming URL forms uses.

    Attributes:
        schemes: its URL schemes, the one messages show first.
        form: its URL form as messages show it, e.g. ``gs://BUCKET/PREFIX``.
        module: the module of its :class:`Storage` class (imported on first use).
        cls: that class's name.
        extra: the pip extra that installs its client library; None when always installed.
        packages: the client packages that extra installs (named when one is missing).
    """

    schemes: tuple[str, ...]
    form: str
    module: str
    cls: str
    extra: str | None
    packages: tuple[str, ...]


#: Every kind of bucket besides a local folder, in the order messages name them.
STORES = (
    StoreKind(("gs",), "gs://BUCKET/PREFIX", "spark_imagenet.storage.gcs", "GCSStorage", None,
              ("google-cloud-storage",)),
    StoreKind(("s3",), "s3://BUCKET/PREFIX", "spark_imagenet.storage.s3", "S3Storage", "s3", ("boto3",)),
    StoreKind(("abfs", "abfss", "az"), "abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX",
              "spark_imagenet.storage.azure", "AzureStorage", "azure", ("azure-storage-blob", "azure-identity")),
    StoreKind(("hdfs", "webhdfs"), "hdfs://NAMENODE:PORT/PATH", "spark_imagenet.storage.hdfs", "HDFSStorage", "hdfs",
              ("fsspec", "requests")),
)
#: A folder on this machine's disk, as messages name it.
LOCAL_FORM = "a local path (or file:///PATH)"
_KIND_OF = {scheme: kind for kind in STORES for scheme in kind.schemes}


def url_forms(local: bool = True) -> str:
    """The URL forms of every store for a message: ``"a local path (or file:///PATH), gs://BUCKET/PREFIX,
    s3://BUCKET/PREFIX, abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX or hdfs://NAMENODE:PORT/PATH"``.

    Args:
        local: name a local folder first (False: the network stores only, e.g. where every host must reach it).
    """
    forms = ([LOCAL_FORM] if local else []) + [kind.form for kind in STORES]
    return ", ".join(forms[:-1]) + " or " + forms[-1]


def store_schemes() -> str:
    """The network stores' schemes, short: ``"gs://, s3://, abfs:// or hdfs://"``."""
    schemes = [f"{kind.schemes[0]}://" for kind in STORES]
    return ", ".join(schemes[:-1]) + " or " + schemes[-1]


def is_remote_url(url: str | os.PathLike) -> bool:
    """Whether a bucket URL names a store every host reaches over the network (a scheme of :data:`STORES`:
    ``gs://``, ``s3://``, ``abfs://``, ``abfss://``, ``az://``, ``hdfs://``, ``webhdfs://``), not a path on
    this machine's disk (a plain path or ``file://``). Pure: opens nothing."""
    return urlparse(os.fspath(url)).scheme.lower() in _KIND_OF


def _store_class(url: str, kind: StoreKind) -> type[Storage]:
    """The class of a store, imported with its client library.

    Raises:
        StorageError: the client library is not installed (names the extra and its packages).
    """
    import importlib

    try:
        return getattr(importlib.import_module(kind.module), kind.cls)
    except ImportError as e:
        install = install_hint(kind.extra) if kind.extra else "pip install spark-imagenet"
        raise StorageError(f"{url}: this store needs the {e.name!r} package: {install} "
                           f"(installs {', '.join(kind.packages)})") from None


def open_storage(url: str | os.PathLike, **options: Any) -> Storage:
    """Open the storage a bucket URL names.

    Args:
        url: a local path, a ``file://`` URL, ``gs://bucket/prefix``,
            ``s3://bucket/prefix``, ``abfs://container@account.dfs.core.windows.net/prefix``
            ``az://container/prefix``, ``hdfs://namenode:port/path`` or
            ``webhdfs://namenode:http-port/path``.
        **options: passed to the implementation (``GCSStorage``: ``endpoint``,
            ``project``, ``page_size``; ``S3Storage``: ``endpoint``,
            ``region``, ``profile``, ``server_checksums``; ``AzureStorage``:
            ``account_url``; ``HDFSStorage``: ``webhdfs_port``, ``user``,
            ``use_https``, ``kerberos``); what
            :meth:`Storage.reopen_options` returned, to open the same storage
            in another process. None values are dropped.

    Returns:
        Storage: the matching implementation.

    Raises:
        StorageError: the scheme is unknown, the URL is empty, a ``file://``
            URL names a host, or a bucket URL names no bucket or holds
            ``?`` or ``#``, or the client library of its scheme is not
            installed (names the extra to install).

    Example:

    ```python
    >>> from spark_imagenet import open_storage
    >>> storage = open_storage("gs://my-bucket/imagenet")
    >>> storage.write_bytes("manifest.json", b'{"dataset_id": "abc"}')
    >>> storage.read_bytes("manifest.json")
    b'{"dataset_id": "abc"}'
    >>> [info.name for info in storage.list()]
    ['manifest.json']

    ```
    """
    text = os.fspath(url)
    if not text:
        raise StorageError(f"empty bucket URL: give {url_forms()}", key="url", value=text)
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        return LocalStorage(text)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"file:// URL with a host is not supported: {text!r}; use file:///absolute/path",
                               key="url", value=text)
        return LocalStorage(unquote(parsed.path))
    if scheme in _KIND_OF:
        cls = _store_class(text, _KIND_OF[scheme])
        return cls(text, **{k: v for k, v in options.items() if v is not None})
    also = ", ".join(f"{other}://" for kind in STORES for other in kind.schemes[1:])
    raise StorageError(f"{text}: unknown URL scheme {scheme!r}; give {url_forms()} (also {also})",
                       key="url", value=text)
