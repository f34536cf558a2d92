"""One URL-based storage interface for dataset "buckets".

A bucket URL names a folder that holds a dataset's shards and its
``manifest.json``. Callers never look at the scheme: they call
:func:`open_storage` and use the returned :class:`Storage`, so a new scheme
(``gs://bucket/prefix``) plugs in here without touching them.

Supported now:

* a plain local path (``/data/imagenet-shards``, ``./shards``) or a
  ``file://`` URL (``file:///data/imagenet-shards``): :class:`LocalStorage`.

Checksums are CRC32C (Castagnoli), encoded as the base64 of the 4-byte
big-endian value: the exact form Google Cloud Storage reports in an object's
``crc32Hash`` metadata, so a manifest written to local disk can later be
verified against a bucket without recomputing anything.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import os
import shutil
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

import google_crc32c

from .errors import StorageError

#: Read size for checksumming and copying files, in bytes (8 MiB).
CHUNK_BYTES = 8 * 1024 * 1024


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
    """

    name: str
    size: int


class Storage(abc.ABC):
    """A folder of objects addressed by a URL.

    Object names are relative to the storage URL and use ``/`` as separator.
    Every write is atomic: a reader sees either the old object or the whole
    new one, never a partial file.
    """

    #: The URL this storage was opened with, normalised.
    url: str

    @abc.abstractmethod
    def exists(self, name: str) -> bool:
        """Whether object ``name`` exists."""

    @abc.abstractmethod
    def size(self, name: str) -> int:
        """Size of object ``name`` in bytes.

        Raises:
            StorageError: the object does not exist.
        """

    @abc.abstractmethod
    def read_bytes(self, name: str) -> bytes:
        """Whole content of object ``name``.

        Raises:
            StorageError: the object does not exist or cannot be read.
        """

    @abc.abstractmethod
    def write_bytes(self, name: str, data: bytes) -> None:
        """Atomically create or replace object ``name`` with ``data``.

        Raises:
            StorageError: the object cannot be written.
        """

    @abc.abstractmethod
    def put_file(self, local_path: str | os.PathLike, name: str) -> None:
        """Atomically publish a local file as object ``name``.

        The local file may be moved (not copied) when it is on the same
        filesystem; callers must not use ``local_path`` afterwards.

        Raises:
            StorageError: the object cannot be written.
        """

    @abc.abstractmethod
    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        """Copy object ``name`` to ``local_path`` (overwritten if present).

        The copy is not verified here; see :mod:`spark_imagenet.cache`.

        Raises:
            StorageError: the object does not exist or cannot be read.
        """

    @abc.abstractmethod
    def list(self) -> list[ObjectInfo]:
        """Every object under this URL, sorted by name."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Delete object ``name``; no error when it does not exist."""

    def staging_dir(self) -> Path | None:
        """A local folder on the same filesystem as the objects, where files
        can be written and then published with :meth:`put_file` by a rename;
        ``None`` for remote storage (stage in a temporary folder instead)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class LocalStorage(Storage):
    """Objects as files in a local (or network-mounted) directory.

    Methods behave as documented on :class:`Storage` (their docstrings are
    inherited). Writes go to a hidden temporary file in the same folder and
    are renamed into place with ``os.replace`` (atomic on POSIX).

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

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def size(self, name: str) -> int:
        try:
            return self._path(name).stat().st_size
        except FileNotFoundError:
            raise StorageError(f"{self._path(name)} does not exist") from None

    def read_bytes(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            raise StorageError(f"{self._path(name)} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {self._path(name)}: {e}") from e

    def _tmp(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    def write_bytes(self, name: str, data: bytes) -> None:
        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._tmp(path)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            raise StorageError(f"cannot write {path}: {e}") from e

    def put_file(self, local_path: str | os.PathLike, name: str) -> None:
        path = self._path(name)
        local_path = Path(local_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if local_path.resolve() == path.resolve():
                return
            tmp = self._tmp(path)
            try:
                os.replace(local_path, tmp)  # same filesystem: a rename
            except OSError:
                shutil.copyfile(local_path, tmp)
            os.replace(tmp, path)
        except OSError as e:
            raise StorageError(f"cannot publish {local_path} as {path}: {e}") from e

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
                out.append(ObjectInfo(p.relative_to(self.root).as_posix(), p.stat().st_size))
        return sorted(out, key=lambda o: o.name)

    def delete(self, name: str) -> None:
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


def open_storage(url: str | os.PathLike) -> Storage:
    """Open the storage a bucket URL names.

    Args:
        url: a local path, a ``file://`` URL, or (later) ``gs://bucket/prefix``.

    Returns:
        Storage: the matching implementation.

    Raises:
        StorageError: the scheme is unknown or not supported yet, or the URL
            is empty.
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
        raise StorageError(
            f"{text}: gs:// buckets are not supported by this version yet; build the shards on local "
            "disk (a path or file:// URL) and copy them to the bucket's mounted path"
        )
    raise StorageError(f"{text}: unknown URL scheme {scheme!r}; use a local path, file:// URL or gs://bucket/prefix")
