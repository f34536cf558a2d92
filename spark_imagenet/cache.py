"""A per-host, verified cache of shard files on local disk.

Training reads shards with tf.data from local files, so every barrier task
first stages its shards here (remote buckets cannot be read by TensorFlow's
own filesystems in every setup, see FIELD-NOTES). Layout::

    <cache_dir>/<dataset_id>/<shard name>            the verified shard
    <cache_dir>/<dataset_id>/<shard name>.verified   JSON marker: crc32c, size, mtime_ns, inode
    <cache_dir>/<dataset_id>/<shard name>.lock       flock(2) target, never deleted
    <cache_dir>/<dataset_id>/.<shard name>.tmp-<pid>-<random>   download in progress

Rules:

* A cached file is reused when its size matches the manifest and either its
  marker matches (same crc32c as the manifest, same size, mtime and inode, so
  nothing rewrote the file since it was hashed) or, without a marker, its
  CRC32C is computed once and matches (the marker is then written).
* Otherwise the shard is downloaded with ``Storage.get_file`` to a temporary
  name unique to this process and attempt, checked (size, then CRC32C against
  the manifest), and renamed into place (atomic on one filesystem); a failed
  or mismatching download is tried once more, then :class:`StorageError`.
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
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .errors import StorageError
from .manifest import ShardInfo
from .storage import Storage, crc32c_file

#: Folder name of the cache under the Spark local dir.
CACHE_FOLDER = "spark-imagenet-cache"
#: Downloads per shard before giving up (the first try plus one retry).
ATTEMPTS = 2
MARKER_SUFFIX = ".verified"
LOCK_SUFFIX = ".lock"


def default_cache_dir() -> Path:
    """Where shards are cached when no folder is given.

    Returns:
        Path: ``<first entry of SPARK_LOCAL_DIRS>/spark-imagenet-cache`` when
        ``SPARK_LOCAL_DIRS`` is set (Spark sets it in executors of standalone,
        YARN and Kubernetes clusters to the node's scratch disks), else
        ``<tempfile.gettempdir()>/spark-imagenet-cache``.
    """
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = next((d.strip() for d in local_dirs.split(",") if d.strip()), None)
    return Path(first or tempfile.gettempdir()) / CACHE_FOLDER


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


def _remove_stale(path: Path) -> None:
    """Delete the shard's marker, leftover temp files and the shard itself."""
    prefix = f".{path.name}.tmp-"
    for p in path.parent.iterdir():
        if p.name.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    for p in (_marker_path(path), path):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _download(storage: Storage, shard: ShardInfo, path: Path) -> None:
    """Download ``shard`` to ``path`` verified, or raise StorageError."""
    problems = []
    for attempt in range(1, ATTEMPTS + 1):
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            storage.get_file(shard.name, tmp)
            size = tmp.stat().st_size
            if size != shard.bytes:
                problems.append(f"attempt {attempt}: {size} bytes, the manifest says {shard.bytes}")
                continue
            crc = crc32c_file(tmp)
            if crc != shard.crc32c:
                problems.append(f"attempt {attempt}: crc32c {crc}, the manifest says {shard.crc32c}")
                continue
            os.replace(tmp, path)
            _write_marker(path, crc)
            return
        except StorageError as e:
            problems.append(f"attempt {attempt}: {e}")
        except OSError as e:
            problems.append(f"attempt {attempt}: cannot write {tmp}: {e}")
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    raise StorageError(
        f"shard {shard.name} from {storage.url} could not be fetched intact into {path.parent} "
        f"({'; '.join(problems)}). If the bucket's file changed, rebuild the shards or restore the file; "
        f"if the local disk is full, free space or choose another --cache folder."
    )


def fetch(storage: Storage, shards: Sequence[ShardInfo], cache_dir: str | os.PathLike | None = None, *,
          dataset_id: str | None = None, log: Callable[[str], None] | None = None) -> list[str]:
    """Make verified local copies of shards, reusing cached ones.

    Args:
        storage: the dataset's bucket.
        shards: the shards to fetch (from the manifest, with size and crc32c).
        cache_dir: the cache root (a local folder); None for
            :func:`default_cache_dir`.
        dataset_id: the manifest's ``dataset_id`` (names the sub-folder).
        log: called with one line per shard downloaded (not for reused ones).

    Returns:
        list[str]: absolute local paths, in the order of ``shards``.

    Raises:
        StorageError: a shard name that is not a relative path inside the
            dataset, a shard that is missing or does not match its size and
            CRC32C after two downloads, or a cache folder that cannot be
            created.
    """
    base = dataset_cache_dir(cache_dir, dataset_id, storage)
    out = []
    for shard in shards:
        parts = shard.name.split("/")
        if not shard.name or shard.name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise StorageError(f"shard name {shard.name!r} is not a relative path inside the dataset")
        path = base.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create the cache folder {path.parent}: {e}; choose another --cache") from e
        with _locked(path):
            if not _cached_ok(path, shard):
                _remove_stale(path)
                start = time.monotonic()
                _download(storage, shard, path)
                if log:
                    log(f"fetched {shard.name} ({shard.bytes} bytes) in {time.monotonic() - start:.1f} s")
        out.append(str(path))
    return out
