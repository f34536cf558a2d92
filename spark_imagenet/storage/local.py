"""Local folders (a path or a ``file://`` URL) as storage."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat as stat_module
import uuid
from pathlib import Path
from typing import Any

from spark_imagenet.errors import PreconditionFailed, StorageError
from spark_imagenet.storage.base import ObjectInfo, Storage, crc32c_file


#: The names of :meth:`LocalStorage._tmp`: ``.<name>.tmp-<pid>-<8 hex digits>``.
_TMP_NAME = re.compile(r"\..+\.tmp-\d+-[0-9a-f]{8}")


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
            raise StorageError(f"invalid object name {name!r} in {self.url}", key="name", value=name)
        return self.root / name

    def where(self, name: str) -> str:
        return str(self._path(name))

    def stat(self, name: str) -> ObjectInfo | None:
        try:
            st = self._path(name).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"cannot read {self._path(name)}: {e}", key="url", value=self.where(name)) from e
        if not stat_module.S_ISREG(st.st_mode):  # a folder is not an object
            return None
        return ObjectInfo(name, st.st_size, None, st.st_mtime_ns)

    def crc32c(self, name: str) -> str:
        try:
            return crc32c_file(self._path(name))
        except FileNotFoundError:
            raise StorageError(f"{self._path(name)} does not exist", key="url", value=self.where(name)) from None
        except OSError as e:
            raise StorageError(f"cannot read {self._path(name)}: {e}", key="url", value=self.where(name)) from e

    def read_bytes(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            raise StorageError(f"{self._path(name)} does not exist", key="url", value=self.where(name)) from None
        except OSError as e:
            raise StorageError(f"cannot read {self._path(name)}: {e}", key="url", value=self.where(name)) from e

    def _tmp(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    @staticmethod
    def _is_tmp(file_name: str) -> bool:
        """Whether a file name is one of :meth:`_tmp`'s (a write in flight, or one a killed process left)."""
        return _TMP_NAME.fullmatch(file_name) is not None

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
                                      "was changed by another writer since it was read"), key="url", value=str(path)
                    )
                os.replace(tmp, path)
        except OSError as e:
            raise StorageError(f"cannot write {path}: {e}", key="url", value=str(path)) from e
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
            raise StorageError(f"cannot publish {local_path} as {path}: {e}", key="url", value=str(path)) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        src = self._path(name)
        try:
            shutil.copyfile(src, local_path)
        except FileNotFoundError as e:  # the object, or the folder of the copy (copyfile names neither apart)
            if src.is_file():
                raise StorageError(f"cannot copy {src} to {local_path}: the folder "
                                   f"{Path(local_path).parent} does not exist; create it first",
                                   key="local_path", value=str(local_path)) from e
            raise StorageError(f"{src} does not exist", key="url", value=str(src)) from None
        except OSError as e:
            raise StorageError(f"cannot copy {src} to {local_path}: {e}", key="url", value=str(src)) from e

    def list(self) -> list[ObjectInfo]:
        if not self.root.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(self.root):
            for fn in files:
                if self._is_tmp(fn):  # not an object: a write in flight or one a killed process left
                    continue
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
        except OSError as e:  # a folder, no permission: as GCSStorage, best_effort only skips retries
            raise StorageError(f"cannot delete {self._path(name)}: {e}", key="url", value=self.where(name)) from e

    def tidy(self, prefix: str) -> None:
        top = self._path(prefix)
        for folder, _dirs, files in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
            for fn in files:
                if self._is_tmp(fn):  # left by a killed writer: nobody writes into a folder being removed
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(folder, fn))
            with contextlib.suppress(OSError):  # not empty: something else lives there, leave it
                os.rmdir(folder)

    def staging_dir(self) -> Path:
        if self.root.is_file():
            raise StorageError(f"{self.url} is a file, not a folder: give a folder for the shards (a new one, or "
                               "the folder of an earlier build of the same dataset)", key="url", value=self.url)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self._tmp(self.root / ".write-probe")
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise StorageError(
                f"{self.url}: cannot create or write this folder ({e.strerror or e}); "
                "choose a writable folder for the shards", key="url", value=self.url
            ) from None
        return self.root

    def root_exists(self) -> bool:
        return self.root.exists()

    def remove_empty_root(self) -> None:
        with contextlib.suppress(OSError):
            if self.root.is_dir() and not any(self.root.iterdir()):
                self.root.rmdir()


def write_json_atomic(path: str | os.PathLike, data: Any, *, indent: int = 2) -> None:
    """Write ``data`` as JSON to the local file ``path`` atomically (:meth:`LocalStorage.write_bytes`: a
    reader sees the old file or the whole new one).

    Args:
        path: the file (its folder is created).
        data: anything :func:`json.dumps` accepts.
        indent: JSON indentation; the text ends with a newline.

    Raises:
        StorageError: the file cannot be written (names it and why).
    """
    target = Path(path).expanduser().absolute()
    LocalStorage(target.parent).write_bytes(target.name, (json.dumps(data, indent=indent) + "\n").encode("utf-8"))
