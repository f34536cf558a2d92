"""How :func:`spark_imagenet.source.extract.extract` writes: each file under a temporary name, listed, renamed.

:class:`Writer` writes one file at a time under a temporary name, checks its
size and CRC-32 against the archive's, adds its name to :data:`WRITTEN_LIST`
(:class:`WrittenList`, handed to the operating system first) and renames it,
so that a rerun after any interruption, even SIGKILL, knows which files it
wrote. :func:`write_zip_files` and :func:`write_tar_files` (pass 2 of 2 over
the nested tar.gz) feed it.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import logging
import os
import posixpath
import shlex
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable

from spark_imagenet.errors import ArchiveError, ConfigError
from spark_imagenet.source.extract_members import (
    CHUNK, WRITTEN_LIST, WRITTEN_TMP, Item, clean_name, nearest_existing, partial_name, tar_folder, unsafe_name)
from spark_imagenet.source.tar_stream import TarStreamSource

logger = logging.getLogger(__name__)


class WrittenList:
    """:data:`WRITTEN_LIST` of a folder: read it, and append the files this run writes, each one before
    its file gets its final name (:meth:`add`), so that the list survives the process being killed at
    any point. (A power loss can still lose the last names the operating system had not yet written to
    disk; a rerun then refuses those files if they differ from their member, unless ``overwrite``.)"""

    def __init__(self, path: Path):
        self.path = path
        self._file: BinaryIO | None = None
        self._zip: Any = None

    @staticmethod
    def parse(path: Path) -> tuple[set[str], bool]:
        """The names listed (what a run killed while appending left readable, too), and whether the file
        ends with a complete gzip member (False after a run that was killed)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return set(), True
        except OSError as e:
            raise ConfigError(f"cannot read {path} ({e.strerror or e}), extract's list of the files it wrote; "
                              "fix its permissions, or delete it and pass overwrite") from None
        text = bytearray()
        complete = True
        while data:
            d = zlib.decompressobj(wbits=31)
            pos = 0
            try:
                while pos < len(data) and not d.eof:
                    text += d.decompress(data[pos:pos + CHUNK])
                    pos += CHUNK
            except zlib.error:
                complete = False
                break
            if not d.eof:
                complete = False
                break  # a member cut short: its lines up to the last complete one are kept below
            data = d.unused_data + data[pos:]
        lines = bytes(text).decode("utf-8", "replace").split("\n")
        return set(filter(None, lines[:-1])), complete  # the last piece is "" or a line cut short

    @staticmethod
    def read(path: Path) -> set[str]:
        """The names listed."""
        return WrittenList.parse(path)[0]

    def _open(self) -> None:
        """Open the list for appending a new gzip member; first rewrite it (atomically) when a killed run
        left its last member incomplete, since nothing appended after that could be read back."""
        names, complete = self.parse(self.path)
        if not complete:
            tmp = self.path.with_name(WRITTEN_TMP)
            with open(tmp, "wb") as f:
                f.write(gzip.compress("".join(n + "\n" for n in sorted(names)).encode("utf-8"), mtime=0))
            os.replace(tmp, self.path)
        self._file = open(self.path, "ab")
        self._zip = zlib.compressobj(6, zlib.DEFLATED, 31)

    def add(self, rel: str) -> None:
        """List ``rel``: compressed, sync-flushed and handed to the operating system before this returns."""
        if self._file is None:
            self._open()
        self._file.write(self._zip.compress((rel + "\n").encode("utf-8")) + self._zip.flush(zlib.Z_SYNC_FLUSH))
        self._file.flush()

    def close(self) -> None:
        """End this run's gzip member (its trailer) and close the file."""
        if self._file is None:
            return
        f, self._file = self._file, None
        try:
            f.write(self._zip.flush(zlib.Z_FINISH))
            f.flush()
        finally:
            f.close()


class Writer:
    """Writes the files of one extract into ``dest``: each under a temporary name, listed in
    :data:`WRITTEN_LIST`, then renamed; folders are created only inside ``dest`` (links followed).

    Attributes:
        written: bytes written so far.
        bar: the tqdm bar of bytes written, or None.
    """

    def __init__(self, zip_path: str, dest: Path, name_max: int):
        self.zip_path = zip_path
        self.dest = dest
        self.name_max = name_max
        self.real_dest = os.path.realpath(dest)
        self.written = 0
        self.bar: Any = None
        self.written_list = WrittenList(dest / WRITTEN_LIST)

    def _inside(self, folder: Path, rel: str) -> None:
        real = os.path.realpath(folder)
        if real != self.real_dest and not real.startswith(self.real_dest + os.sep):
            raise ArchiveError(f"{self.zip_path}: {rel} would be written to {real}, outside {self.dest} (through a "
                               f"link already in {self.dest}); stopped")

    def folder(self, path: Path, rel: str) -> None:
        """Create the folder ``path`` (for ``rel``), checking that it is inside ``dest`` (links followed)."""
        self._inside(nearest_existing(path), rel)  # the nearest existing folder, before creating any
        path.mkdir(parents=True, exist_ok=True)
        self._inside(path, rel)

    def target_of(self, rel: str) -> Path:
        """``dest/rel`` once its folder exists and is inside ``dest``."""
        path = self.dest / rel
        self.folder(path.parent, rel)
        return path

    def cannot_write(self, path: Path, e: OSError) -> ConfigError:
        hint = ("check the length of its name and path" if e.errno == errno.ENAMETOOLONG else
                "check the folder's permissions and free space")
        return ConfigError(
            f"cannot write {path} ({e.strerror or e}) while extracting {self.zip_path}; {hint}, then rerun "
            f"`spark-imagenet extract {shlex.quote(self.zip_path)} "
            f"{shlex.quote(str(self.dest))}` (it keeps the files already written)"
        )

    def begin(self, markers: list[str], folders: list[Item]) -> None:
        """Write the markers that make ``shard`` refuse the folder until the extract completes, and
        create the archive's folders."""
        note = json.dumps({"zip": self.zip_path, "dest": str(self.dest)})
        try:
            for rel in markers:
                self.target_of(rel).write_text(note + "\n", encoding="utf-8")
            for item in folders:
                self.folder(self.dest / item.rel, item.rel)
        except OSError as e:
            raise self.cannot_write(self.dest / markers[0], e) from None

    def write(self, item: Item, opener: Callable[[], BinaryIO], where: str) -> None:
        """Write one file from ``opener()``, checking its size and CRC-32 against the archive's."""
        path = self.dest / item.rel
        try:
            path = self.target_of(item.rel)
            tmp = path.with_name(partial_name(path.name, self.name_max))
            try:
                crc, got = self._copy(opener, tmp)
                if got != item.size:
                    raise ArchiveError(f"{where}: {got} bytes read where the archive declares {item.size}; the "
                                       "archive is damaged: download it again")
                if crc != item.crc:
                    raise ArchiveError(f"{where}: its bytes changed since they were checked (CRC-32 {crc:08x}, "
                                       f"then {item.crc:08x}); the archive changed while it was read. Run again.")
                try:  # listed first: a file under its final name is always in the list, even after a kill
                    self.written_list.add(item.rel)
                except OSError as e:
                    raise self.cannot_write(self.written_list.path, e) from None
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        except OSError as e:
            raise self.cannot_write(path, e) from None
        self.written += item.size

    def _copy(self, opener: Callable[[], BinaryIO], tmp: Path) -> tuple[int, int]:
        """Copy ``opener()`` to ``tmp``; return its CRC-32 and length."""
        crc = got = 0
        with opener() as src, open(tmp, "wb") as out:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                crc = zlib.crc32(chunk, crc)
                got += len(chunk)
                if self.bar is not None:
                    self.bar.update(len(chunk))
        return crc, got

    def close(self) -> None:
        """Close the bar and end this run's part of :data:`WRITTEN_LIST`."""
        if self.bar is not None:
            self.bar.close()
        with contextlib.suppress(OSError):  # a full disk: the error that stopped the extract says more
            self.written_list.close()  # (a kill leaves its last member without a trailer: the next run mends it)


def write_zip_files(writer: Writer, zf: zipfile.ZipFile, items: list[Item]) -> None:
    """Write the zip's own files that are not already there."""
    for item in items:
        if item.kind != "file" or item.action == "keep":
            continue
        try:
            writer.write(item, lambda: zf.open(item.info), f"{writer.zip_path} member {item.info.orig_filename}")
        except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError) as e:
            raise ArchiveError(f"{writer.zip_path} member {item.info.orig_filename} cannot be read ({e}); the zip "
                               "is damaged: download it again") from None


def write_tar_files(writer: Writer, source: TarStreamSource, tar_items: list[Item]) -> None:
    """Pass 2 of 2 over the nested tar: write its files that are not already there.

    Raises:
        ArchiveError: the stream is damaged, or differs from pass 1 (the archive changed).
    """
    left = {i.rel: i for i in tar_items if i.kind == "file" and i.action != "keep"}
    if not left:
        return
    logger.info(f"unpacking {source.where_source()} (pass 2 of 2)")
    tar_base = tar_folder(source)
    known = {i.rel for i in tar_items}
    for ti, tf in source.members():
        rel = clean_name(posixpath.join(tar_base, ti.name)) if unsafe_name(ti.name) is None else None
        if rel not in known:
            if ti.isfile() or ti.issym() or ti.islnk() or rel is None:
                raise ArchiveError(f"{source.where_source()}: {ti.name} was not there in pass "
                                   "1; the archive changed while it was read. Run again.")
            continue
        item = left.pop(rel, None)
        if item is None:
            continue
        try:
            writer.write(item, lambda: tf.extractfile(ti), source.where_member(ti.name))
        except (tarfile.TarError, zlib.error, EOFError) as e:
            raise source.stream_error(e) from None
        if not left:
            break
    if left:
        raise ArchiveError(f"{source.where_source()}: {len(left)} file(s) of pass 1 were not "
                           f"found in pass 2 (e.g. {sorted(left)[0]}); the archive changed while it was "
                           "read. Run again.")
