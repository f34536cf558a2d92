"""A per-host, verified cache of shard files on local disk.

Training reads shards with tf.data from local files, so every barrier task
first stages its shards here (TensorFlow's own ``gs://`` filesystem cannot be
pointed at an emulator; docs/design.md, 'Storage, checksums and the GCS
emulator'). Layout::

    <cache_dir>/<dataset_id>/<shard name>            the verified shard
    <cache_dir>/<dataset_id>/<shard name>.verified   JSON marker: crc32c, size, mtime_ns, inode
    <cache_dir>/<dataset_id>/<shard name>.lock       flock(2) target, never deleted
    <cache_dir>/<dataset_id>/.<shard name>.tmp-<pid>-<random>   download in progress

Rules:

* A cached file is reused when its size matches the manifest and either its
  marker matches (same crc32c as the manifest, same size, mtime and inode, so
  nothing rewrote the file since it was hashed) or, without a marker, its
  CRC32C is computed once and matches (the marker is then written).
* Otherwise the shard is downloaded (several in parallel) to a temporary name
  unique to this process and attempt, checked (size, then CRC32C against the
  manifest, of the file read back from disk, in the transfer's own thread as
  soon as its download ends), and renamed into place (atomic on one filesystem); a mismatching
  download is tried once more, then :class:`StorageError` naming the shard
  (:func:`spark_imagenet.storage.committed.download_verified`). A file at the final name is never
  partial: a download killed midway leaves only its temporary file.
* All of this happens under an exclusive ``fcntl.flock`` on the shard's
  ``.lock`` file, so two tasks on one host never fetch the same shard at once:
  the second waits and then reuses the first one's file. Temporary files left
  by a killed task are removed under the lock (nobody else can be writing them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator, Sequence

from spark_imagenet.errors import StorageError
from spark_imagenet.dataset.manifest import ShardInfo
from spark_imagenet.storage import DEFAULT_TRANSFERS, Storage, crc32c_file
from spark_imagenet.storage.base import check_transfers
from spark_imagenet.storage.committed import Entry, download_verified

logger = logging.getLogger(__name__)

#: Folder name of the cache under the Spark local dir.
CACHE_FOLDER = "spark-imagenet-cache"
#: Shards whose locks one task holds at a time (bounds open descriptors).
LOCK_GROUP = 64
MARKER_SUFFIX = ".verified"
LOCK_SUFFIX = ".lock"


def default_cache_dir() -> Path:
    """Where shards are cached when no folder is given: a folder that
    outlives the Spark application, so the next job on the host reuses it.

    Inside a Spark task, ``SPARK_LOCAL_DIRS`` names the application's own
    scratch folders (``<spark.local.dir>/blockmgr-<uuid>`` standalone and
    local; ``.../usercache/<user>/appcache/<application>/...`` on YARN),
    which Spark or YARN deletes when the application ends. The cache goes
    beside them instead: in the folder holding ``blockmgr-*``/``spark-*``
    (the node's configured local dir), or on YARN in the user's
    ``usercache/<user>`` folder above ``appcache``. Kubernetes executors
    usually get an ``emptyDir`` that dies with the pod: give ``--cache`` a
    hostPath or persistent volume there.

    Returns:
        Path: ``<that folder>/spark-imagenet-cache``; outside Spark
        (``SPARK_LOCAL_DIRS`` unset): ``<tempfile.gettempdir()>/spark-imagenet-cache``
        (what ``spark-imagenet fetch`` uses by default, the same folder as
        tasks of a ``local[N]`` job with the default ``spark.local.dir``).
    """
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = next((d.strip() for d in local_dirs.split(",") if d.strip()), None)
    if not first:
        return Path(tempfile.gettempdir()) / CACHE_FOLDER
    path = Path(first)
    parts = path.parts
    if "appcache" in parts:  # YARN: <nm-local-dir>/usercache/<user>/appcache/<app>/...
        return Path(*parts[:parts.index("appcache")]) / CACHE_FOLDER
    while path.name.startswith(("blockmgr-", "spark-")) and path.parent != path:
        path = path.parent
    return path / CACHE_FOLDER


def dataset_cache_dir(cache_dir: str | os.PathLike | None, dataset_id: str | None, storage: Storage) -> Path:
    """The cache folder of one dataset.

    Args:
        cache_dir: the cache root, or None for :func:`default_cache_dir`.
        dataset_id: the manifest's ``dataset_id``; when empty, a hash of the
            storage URL stands in (the CRC32C check still guards the content).
        storage: the dataset's storage.

    Returns:
        Path: ``<cache_dir>/<dataset_id>``.
    """
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if dataset_id:
        key = "".join(c if c.isalnum() or c in "-_." else "_" for c in dataset_id)
    else:
        key = "url-" + hashlib.sha256(storage.url.encode("utf-8")).hexdigest()[:16]
    return root.absolute() / key


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``<path>.lock`` (blocks until free)."""
    lock_path = path.with_name(path.name + LOCK_SUFFIX)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + MARKER_SUFFIX)


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _write_marker(path: Path, crc: str) -> None:
    marker = _marker_path(path)
    tmp = marker.with_name(f".{marker.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps({"crc32c": crc, **_stat_key(path)}))
    os.replace(tmp, marker)


def _cached_ok(path: Path, shard: ShardInfo) -> bool:
    """Whether ``path`` holds ``shard`` (hashing it at most once)."""
    try:
        key = _stat_key(path)
    except FileNotFoundError:
        return False
    if key["size"] != shard.bytes:
        return False
    try:
        marker = json.loads(_marker_path(path).read_text())
        if marker == {"crc32c": shard.crc32c, **key}:
            return True
    except (OSError, ValueError):
        pass
    if crc32c_file(path) != shard.crc32c:
        return False
    _write_marker(path, shard.crc32c)
    return True


def _temp_files(paths: Sequence[Path]) -> dict[Path, list[Path]]:
    """The leftover temp files (``.<name>.tmp-*``) of each shard in ``paths``, found by listing each of
    their folders once (not once per shard: a folder of N shards would cost N listings of N names)."""
    wanted = {(path.parent, f".{path.name}.tmp-"): path for path in paths}
    found: dict[Path, list[Path]] = {path: [] for path in paths}
    for folder in {path.parent for path in paths}:
        for entry in os.scandir(folder):
            head, sep, _ = entry.name.rpartition(".tmp-")  # the suffix -<pid>-<hex> holds no ".tmp-"
            shard = wanted.get((folder, head + sep)) if sep else None
            if shard is not None:
                found[shard].append(folder / entry.name)
    return found


def _remove_stale(path: Path, temp_files: Sequence[Path]) -> None:
    """Delete the shard's marker, its leftover temp files (``temp_files``, from :func:`_temp_files`) and
    the shard itself."""
    for p in (*temp_files, _marker_path(path), path):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


class FetchResult(list):
    """The local paths :func:`fetch` returns (a ``list[str]``, in the order of
    the shards asked for), with what it took.

    Attributes:
        downloaded: shards transferred from the bucket in this call.
        reused: shards found verified in the cache (nothing transferred).
        bytes_downloaded: bytes transferred (verified shards only).
        seconds: wall time of the call, in seconds.
    """

    downloaded: int = 0
    reused: int = 0
    bytes_downloaded: int = 0
    seconds: float = 0.0

    @property
    def mb_per_sec(self) -> float:
        """Download rate in MB/s (10**6 bytes per second); 0 when nothing moved."""
        return self.bytes_downloaded / 1e6 / self.seconds if self.bytes_downloaded and self.seconds > 0 else 0.0


def _download_group(storage: Storage, todo: list[tuple[ShardInfo, Path]], transfers: int,
                    result: FetchResult) -> None:
    """Download ``todo`` (locks held by the caller) verified against the manifest
    (:func:`~spark_imagenet.storage.committed.download_verified`), each renamed into
    place and marked in the thread that downloaded it, as soon as its download ends;
    the failures are tried once more, then StorageError names every one."""
    start = time.monotonic()
    counting = threading.Lock()  # verified() runs in the transfers' threads

    def verified(entry: Entry, path: Path) -> None:
        _write_marker(path, entry.crc32c)
        with counting:
            result.downloaded += 1
            result.bytes_downloaded += entry.size
        logger.info(f"fetched {entry.name} ({entry.size} bytes) in {time.monotonic() - start:.1f} s")

    download_verified(
        storage, [(Entry(s.name, s.bytes, s.crc32c), path) for s, path in todo], transfers=transfers,
        noun="shard", reference="the manifest", on_verified=verified,
        remedy="If the bucket's file changed, rebuild the shards or restore the file; if the local disk is full, "
               "free space or choose another --cache folder.")


def fetch(storage: Storage, shards: Sequence[ShardInfo], cache_dir: str | os.PathLike | None = None, *,
          dataset_id: str | None = None, transfers: int = DEFAULT_TRANSFERS) -> FetchResult:
    """Make verified local copies of shards, reusing cached ones.

    Shards are handled in groups of :data:`LOCK_GROUP`: the group's locks are
    taken in name order (so two tasks with overlapping shard lists cannot
    deadlock), cached copies are checked, the missing ones are downloaded
    with ``transfers`` parallel transfers (``Storage.get_files``), each is
    verified (size, then CRC32C against the manifest, read back from disk) and
    renamed into place by the thread that downloaded it while the others go on;
    failures get one more try.

    Args:
        storage: the dataset's bucket.
        shards: the shards to fetch (from the manifest, with size and crc32c).
        cache_dir: the cache root (a local folder); None for
            :func:`default_cache_dir`.
        dataset_id: the manifest's ``dataset_id`` (names the sub-folder).
        transfers: downloads in parallel (``--transfers``), at least 1.

    Returns:
        FetchResult: absolute local paths, in the order of ``shards``, with
        counts of downloaded and reused shards, bytes and seconds.

    Raises:
        StorageError: a shard name that is not a relative path inside the
            dataset, a shard that is missing or does not match its size and
            CRC32C after two downloads (every such shard is named), or a
            cache folder that cannot be created.
        ConfigError: ``transfers`` < 1.
    """
    check_transfers(transfers)
    start = time.monotonic()
    base = dataset_cache_dir(cache_dir, dataset_id, storage)
    result = FetchResult()
    paths: dict[str, tuple[ShardInfo, Path]] = {}
    for shard in shards:
        parts = shard.name.split("/")
        if not shard.name or shard.name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise StorageError(f"shard name {shard.name!r} is not a relative path inside the dataset")
        path = base.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create the cache folder {path.parent}: {e}; choose another --cache") from e
        paths[shard.name] = (shard, path)
        result.append(str(path))
    ordered = sorted(paths.values(), key=lambda sp: str(sp[1]))
    for i in range(0, len(ordered), LOCK_GROUP):
        group = ordered[i:i + LOCK_GROUP]
        try:
            with contextlib.ExitStack() as locks:
                for _shard, path in group:
                    locks.enter_context(_locked(path))
                todo = [(shard, path) for shard, path in group if not _cached_ok(path, shard)]
                result.reused += len(group) - len(todo)
                temp_files = _temp_files([path for _shard, path in todo])
                for _shard, path in todo:
                    _remove_stale(path, temp_files[path])
                _download_group(storage, todo, transfers, result)
        except OSError as e:  # lock files, markers, stale copies: the cache folder itself
            raise StorageError(
                f"cannot use the cache folder {base} ({e.strerror or e}"
                f"{': ' + str(e.filename) if e.filename else ''}); make it writable by this user, "
                "or choose another --cache"
            ) from None
    result.seconds = time.monotonic() - start
    return result
