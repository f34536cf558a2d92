"""The storage interface every bucket URL is served through, and CRC32C as GCS reports it.

Checksums are CRC32C (Castagnoli), encoded as the base64 of the 4-byte
big-endian value: the exact form Google Cloud Storage reports in an object's
``crc32Hash`` metadata, so a manifest written to local disk can later be
verified against a bucket without recomputing anything.
"""

from __future__ import annotations

import abc
import base64
import concurrent.futures
import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import google_crc32c

from spark_imagenet.errors import AccessError, ConfigError, IntegrityError, StorageError

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


def check_transfers(transfers: int, option: str = "--transfers") -> int:
    """Refuse a number of parallel transfers below 1.

    Args:
        transfers: the value given.
        option: the option or argument that set it, for the message.

    Returns:
        int: ``transfers``.

    Raises:
        ConfigError: ``transfers`` is not an integer >= 1 (names ``option``).
    """
    if isinstance(transfers, bool) or not isinstance(transfers, int) or transfers < 1:
        raise ConfigError(f"{option} {transfers}: must be at least 1", key=option, value=transfers)
    return transfers


def _run_parallel(fn, pairs: Sequence[tuple], transfers: int) -> list[Any]:
    """Call ``fn(*pair)`` for every pair on ``transfers`` threads; one result
    per pair, in order: what ``fn`` returned (None for the ``put_file``-like
    functions that return nothing), else the exception it raised."""
    def one(pair):
        try:
            return fn(*pair)
        except Exception as e:  # reported per pair, like transfer_manager does
            return e

    if transfers <= 1 or len(pairs) <= 1:
        return [one(p) for p in pairs]
    with concurrent.futures.ThreadPoolExecutor(min(transfers, len(pairs))) as pool:
        return list(pool.map(one, pairs))


def unretryable(errors: Sequence[BaseException | None], what: str, noun: str = "shard") -> StorageError | None:
    """The error that should end a batch of transfers now, or None.

    A batch's failures (as :meth:`Storage.put_files`/:meth:`Storage.get_files`
    return them) are worth one more transfer only when they are checksum
    mismatches (:class:`IntegrityError`): everything else was already
    retried with backoff by the client.

    Args:
        errors: one entry per transfer, None for a success.
        what: the start of the message, e.g. ``"could not be fetched from gs://b/p"``.
        noun: what one transfer moves, for the message (``"shard"``, ``"file"``).

    Returns:
        StorageError | None: the first :class:`AccessError` (a missing
        bucket, 401, 403) as it is; else a StorageError ``"N shard(s) <what>:
        <the first 5 errors>"`` when any failure is not a mismatch (each
        error names its object; its ``key`` and ``value`` are the first
        such error's); else None.
    """
    denied = next((e for e in errors if isinstance(e, AccessError)), None)
    if denied is not None:
        return denied
    fatal = [e for e in errors if e is not None and not isinstance(e, IntegrityError)]
    if not fatal:
        return None
    return StorageError(f"{len(fatal)} {noun}(s) {what}: " + "; ".join(str(e) for e in fatal[:5])
                        + (f"; ... and {len(fatal) - 5} more" if len(fatal) > 5 else ""),
                        key=getattr(fatal[0], "key", None), value=getattr(fatal[0], "value", None))


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
            raise StorageError(f"{self.where(name)} does not exist", key="url", value=self.where(name))
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
            raise StorageError(f"{self.where(name)} does not exist", key="url", value=self.where(name))
        if info.crc32c is not None:
            return info.crc32c
        return self._computed_crc32c(name)

    def _computed_crc32c(self, name: str) -> str:
        """CRC32C of object ``name`` computed from its bytes (:meth:`crc32c` when :meth:`stat` has none); this
        reads it whole, a store that can stream overrides it.

        Raises:
            StorageError: the object cannot be read.
        """
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
        manifest, see :mod:`spark_imagenet.dataset.cache`.

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

    def put_files_info(self, pairs: Sequence[tuple[str | os.PathLike, str]],
                       transfers: int = DEFAULT_TRANSFERS) -> list[ObjectInfo | BaseException]:
        """:meth:`put_files`, and what the store holds for each object written,
        to verify it against a manifest without one more request per object
        after the batch.

        Args:
            pairs: what to publish, ``(local_path, name)``.
            transfers: how many transfers run in parallel (threads).

        Returns:
            list: one entry per pair, in order: the object's
            :class:`ObjectInfo` as the store reports it after the write, with
            ``crc32c`` always set (the store's own checksum where it keeps one;
            else computed by reading the object back, locally), or the
            :class:`StorageError` the pair failed with (an
            :class:`IntegrityError` when the object is not there after its
            write). Nothing is raised. This default writes, stats and (where
            needed) checksums each object in the same thread as its write;
            stores whose write replies carry the metadata (GCS) override it.
        """
        return _run_parallel(self._put_and_stat, pairs, transfers)

    def _put_and_stat(self, local_path: str | os.PathLike, name: str) -> ObjectInfo:
        """:meth:`put_file`, then :meth:`_written`."""
        self.put_file(local_path, name)
        return self._written(name)

    def _written(self, name: str) -> ObjectInfo:
        """What the store holds as ``name`` right after writing it, with its
        CRC32C (computed by reading it where the store keeps none).

        Raises:
            IntegrityError: the object is not there.
            StorageError: it cannot be read.
        """
        info = self.stat(name)
        if info is None:
            raise IntegrityError(f"{self.where(name)}: the object is not there after the upload", key="url",
                                 value=self.where(name))
        if info.crc32c is None:
            info = dataclasses.replace(info, crc32c=self.crc32c(name))
        return info

    def get_files(self, pairs: Sequence[tuple[str, str | os.PathLike]], transfers: int = DEFAULT_TRANSFERS, *,
                  check: Callable[[str, str | os.PathLike], None] | None = None) -> list[BaseException | None]:
        """:meth:`get_file` for many ``(name, local_path)`` pairs at once.

        Args:
            pairs: what to download where.
            transfers: how many transfers run in parallel (threads).
            check: called as ``check(name, local_path)`` right after each download that succeeded, in
                the thread that made it, while the other transfers go on (so work on a downloaded file,
                such as re-reading it to verify it, is not left for after the whole batch); an
                exception it raises becomes that pair's result. None: no call.

        Returns:
            list: one entry per pair, None on success or the
            :class:`StorageError` it failed with (or the exception ``check``
            raised).
        """
        def one(name: str, local_path: str | os.PathLike) -> None:
            self.get_file(name, local_path)
            if check is not None:
                check(name, local_path)

        return _run_parallel(one, pairs, transfers)

    @abc.abstractmethod
    def list(self) -> list[ObjectInfo]:
        """Every object under this URL, sorted by name (all pages); a write in
        flight (or one a killed process left unfinished) is not an object.

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

    def tidy(self, prefix: str) -> None:
        """After the objects under ``prefix/`` were deleted: remove what is left of that folder on a local
        filesystem (temporary files a killed writer left, empty directories); nothing for buckets, whose
        prefixes are not objects. Never raises."""

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

    def __eq__(self, other: object) -> bool:
        """Handles of the same store and folder, reopened the same way, are equal (a pickled copy equals its
        original; clients and caches are not compared)."""
        if not isinstance(other, Storage):
            return NotImplemented
        return (type(self), self.url, self.reopen_options()) == (type(other), other.url, other.reopen_options())

    def __hash__(self) -> int:
        return hash((type(self), self.url))
