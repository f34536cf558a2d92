"""Unpacking the Kaggle zip (either form) into a folder, safely: :func:`extract`.

See :func:`extract` for what is checked before anything is written and how
an interrupted extract is finished by a rerun (docs/design.md, 'The Kaggle
archive'). Its phases: the archive's members are surveyed and checked
(:mod:`spark_imagenet.source.extract_members`); then, here, each file already
in the folder is kept, rewritten or refused (:func:`_plan`), the free space is
checked, and the files are written (:class:`Writer`, :func:`write_zip_files`,
:func:`write_tar_files`), each listed in the folder's record of what extract
wrote (:mod:`spark_imagenet.source.extract_dest`).

Example::

    root = extract("imagenet-object-localization-challenge.zip", "/data/kaggle")
    # root: /data/kaggle, in the Kaggle layout that spark-imagenet shard reads
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import posixpath
import shlex
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable

from spark_imagenet.errors import ArchiveError, ConfigError
from spark_imagenet.source.extract_dest import CHUNK, WRITTEN_LIST, WrittenList, nearest_existing, partial_name
from spark_imagenet.source.extract_members import Item, clean_name, survey, tar_folder, unsafe_name
from spark_imagenet.source.layout import EXTRACT_MARKER, check_layout
from spark_imagenet.source.tar_stream import TarStreamSource
from spark_imagenet.source.zip_archive import FORM_NESTED, inspect_zip, listing, open_zip, progress_bar
from spark_imagenet.units import human_size

logger = logging.getLogger(__name__)

#: Free space :func:`extract` keeps in reserve beyond the files' bytes and one block per file and folder.
SPACE_MARGIN = 64 * 2**20


def extract(
    zip_path: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Unpack the Kaggle zip (either form) into a folder, safely.

    The nested form's tar.gz is unpacked too (streaming), so ``dest`` ends up
    with the unpacked Kaggle layout that ``spark-imagenet shard`` reads.
    Before anything is written:

    * every member is checked, and all those refused are listed in one error:
      a name that is absolute or has a ``..`` component (zip-slip and
      tar-slip), any symbolic or hard link (the Kaggle archive has none, so
      none is made, wherever it points), a device or FIFO, a name given twice
      (also written differently: ``a/./b``, ``a//b``), a file that is also the
      folder of other members or whose name ends in ``/.``, and a name longer
      than ``dest``'s file system allows (a component over its NAME_MAX, or
      the whole path under ``dest``, also under the temporary name a file is
      written under first, over its PATH_MAX; from :func:`os.pathconf`).
      The nested form costs two passes over its gzip stream: one to check the
      names, sum the sizes and compute each file's CRC-32, one to unpack.
    * each file already in ``dest`` is compared with its member (size, then
      CRC-32): the same bytes are kept, others are rewritten if a previous
      run of this function wrote them
      (:data:`~spark_imagenet.source.extract_dest.WRITTEN_LIST`); a differing
      file it did not write is listed and refused unless ``overwrite``.
    * the free space of ``dest``'s file system is compared with the bytes to
      write plus one block per file and folder plus :data:`SPACE_MARGIN`, and
      its free inodes with the files and folders to create.

    Then :data:`~spark_imagenet.source.layout.EXTRACT_MARKER` is written in
    ``dest`` (and in the Kaggle root under it), which ``shard`` refuses, and
    removed only once every member is written; files are written under a
    temporary name and renamed when complete, and each file's name is added
    to :data:`WRITTEN_LIST` (handed to the operating system) before it is
    renamed. So after an interruption (Ctrl-C, a full disk, a damaged member,
    even the process killed with SIGKILL) a rerun keeps the complete files,
    rewrites those it wrote that were changed since, and writes the rest. A
    power loss is not covered: the names the operating system had not yet
    written to disk are then missing from the list, and a rerun refuses such a
    file if it differs from its member (unless ``overwrite``).

    Args:
        zip_path: the downloaded ``imagenet-object-localization-challenge.zip``.
        dest: the folder to unpack into (created if needed).
        overwrite: replace files in ``dest`` that differ from their member
            although this function did not write them (``--overwrite``).
        progress: show tqdm bars (bytes) on stderr.

    Returns:
        Path: the unpacked Kaggle root (``dest``, or ``dest/<top folder>``
        when the zip holds the tree in one top folder).

    Raises:
        ArchiveError: the zip is truncated or damaged, is not a Kaggle
            archive, or holds members that are refused (all listed, nothing
            written).
        ConfigError: not enough free space or inodes (the numbers needed and
            free, and the folder, are in the message); ``dest`` is a file;
            files in ``dest`` differ from their members and were not written
            by extract (all listed; pass ``overwrite`` to replace them).
        LayoutError: the unpacked tree is not in the Kaggle layout.
        KeyboardInterrupt: passed on after a line saying that a rerun finishes
            the extract.
    """
    zip_path = os.path.abspath(Path(zip_path).expanduser())
    dest = Path(dest).expanduser().absolute()
    try:
        return _extract(zip_path, dest, overwrite, progress)
    except KeyboardInterrupt:
        if (dest / EXTRACT_MARKER).exists():
            logger.info(f"interrupted: {dest} is incomplete (spark-imagenet shard refuses it); rerun `spark-imagenet "
                f"extract {shlex.quote(zip_path)} {shlex.quote(str(dest))}` to finish it: the files already written "
                "are kept and only the rest is written")
        else:
            logger.info("interrupted before anything was written")
        raise


def _extract(zip_path: str, dest: Path, overwrite: bool, progress: bool) -> Path:
    """:func:`extract` without its Ctrl-C message."""
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"{dest} is a file; give a folder to unpack {zip_path} into")
    zf = open_zip(zip_path)
    with zf:
        kz = inspect_zip(zf, zip_path)
        source = TarStreamSource(zip_path, kz.prefix, kz.tar_member) if kz.form == FORM_NESTED else None
        members, zip_count, limits = survey(zf, kz, source, dest, progress)
        items, tar_items = members.items[:zip_count], members.items[zip_count:]

        conflicts = _plan(members.items, dest, overwrite, progress)
        if conflicts:
            raise ConfigError(
                f"{dest} already holds {len(conflicts)} file(s) or folder(s) that differ from {zip_path}'s members "
                f"and that spark-imagenet extract did not write; nothing was written:{listing(conflicts)}\n"
                "Move them away, or pass --overwrite to replace the differing files with the archive's "
                "(folders in the way of a file are never removed)."
            )
        to_write = [i for i in members.items if i.kind == "file" and i.action != "keep"]
        _check_free_space(zip_path, dest, members.items, to_write)

        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create {dest} ({e.strerror or e}); choose a folder you can write") from None
        writer = Writer(zip_path, dest, limits[0])
        markers = [EXTRACT_MARKER] + ([f"{kz.prefix}{EXTRACT_MARKER}"] if kz.prefix else [])
        writer.begin(markers, [i for i in members.items if i.kind == "dir"])
        writer.bar = progress_bar(progress, sum(i.size for i in to_write), "extract")
        try:
            write_zip_files(writer, zf, items)
            if source is not None:
                write_tar_files(writer, source, tar_items)
        finally:
            writer.close()
        for rel in reversed(markers):
            (dest / rel).unlink(missing_ok=True)
    root = dest / kz.prefix if kz.prefix else dest
    check_layout(root)
    kept = sum(1 for i in members.items if i.kind == "file" and i.action == "keep")
    logger.info(f"extracted {zip_path} ({kz.form} form, {human_size(writer.written)} written in "
                f"{len(to_write)} file(s), "
                f"{kept} file(s) already there kept) to {root}; next: spark-imagenet shard {root} --out URL")
    return root


def _plan(items: list[Item], dest: Path, overwrite: bool, progress: bool) -> list[str]:
    """Decide each file's action (keep, write, rewrite); return the conflicts that stop the extract."""
    conflicts: list[str] = []
    ours = _Ours(dest / WRITTEN_LIST)
    same_size: list[Item] = []
    for item in items:
        path = dest / item.rel
        try:
            st = os.lstat(path)
            is_dir = stat.S_ISDIR(st.st_mode) or (stat.S_ISLNK(st.st_mode) and os.path.isdir(path))
        except FileNotFoundError:
            item.action = "write"
            continue
        except NotADirectoryError:
            conflicts.append(f"{path}: a file is in the way of its folder")
            continue
        except OSError as e:
            raise ConfigError(
                f"cannot look at {path} ({e.strerror or e}), where the archive's member {item.name or item.rel} "
                "goes; nothing was written. Fix the folder's permissions, or choose another folder."
            ) from None
        if item.kind == "dir":
            if not is_dir:
                conflicts.append(f"{path}: a file is in the way of the archive's folder ({item.rel}/)")
            continue
        if stat.S_ISDIR(st.st_mode):
            conflicts.append(f"{path}: a folder is in the way of the archive's file (overwrite replaces files only)")
        elif stat.S_ISREG(st.st_mode) and st.st_size == item.size:
            same_size.append(item)
        else:
            what = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else
                    f"{st.st_size} bytes where the archive's member has {item.size}"
                    if stat.S_ISREG(st.st_mode) else "not a regular file")
            _differs(item, path, what, ours, overwrite, conflicts)
    if same_size:
        logger.info(f"comparing the {len(same_size)} file(s) already in {dest} that have their member's size "
                    "with the archive "
                    f"(CRC-32, {human_size(sum(i.size for i in same_size))} to read)")
    bar = progress_bar(progress and bool(same_size), sum(i.size for i in same_size), "verify")
    try:
        for item in same_size:
            path = dest / item.rel
            try:
                crc = _file_crc(path, bar)
            except OSError as e:
                _differs(item, path, f"it cannot be read ({e.strerror or e})", ours, overwrite, conflicts)
                continue
            if crc == item.crc:
                item.action = "keep"
            else:
                _differs(item, path, f"same size, other bytes (CRC-32 {crc:08x}, the member's {item.crc:08x})",
                         ours, overwrite, conflicts)
    finally:
        if bar is not None:
            bar.close()
    return conflicts


class _Ours:
    """Membership in :data:`WRITTEN_LIST`, read on first use (only a differing file needs it)."""

    def __init__(self, path: Path):
        self._path = path
        self._names: set[str] | None = None

    def __contains__(self, rel: str) -> bool:
        if self._names is None:
            self._names = WrittenList.read(self._path)
        return rel in self._names


def _differs(item: Item, path: Path, what: str, ours: _Ours, overwrite: bool, conflicts: list[str]) -> None:
    """A file already there that is not the member's bytes: rewritten if extract wrote it (or with
    overwrite), else a conflict."""
    if overwrite or item.rel in ours:
        item.action = "rewrite"
    else:
        conflicts.append(f"{path}: {what}")


def _file_crc(path: Path, bar) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            if bar is not None:
                bar.update(len(chunk))
    return crc


def _check_free_space(zip_path: str, dest: Path, items: list[Item], to_write: list[Item]) -> None:
    """ConfigError when the files to write, with one block each, do not fit in the free space and
    inodes of ``dest``'s file system."""
    folders: set[str] = set()
    for item in items:
        if item.kind == "dir":
            folders.add(item.rel)
    for item in to_write:
        parent = item.rel.rpartition("/")[0]
        while parent and parent not in folders:
            folders.add(parent)
            parent = parent.rpartition("/")[0]
    new_folders = sum(1 for f in folders if not (dest / f).is_dir())
    if not to_write and not new_folders:
        return
    folder = nearest_existing(dest)
    st = os.statvfs(folder)
    data = sum(i.size for i in to_write)
    entries = len(to_write) + new_folders
    need = data + entries * st.f_frsize + SPACE_MARGIN
    free = st.f_bavail * st.f_frsize
    inodes = st.f_favail
    inodes_short = st.f_files > 0 and entries > inodes  # f_files 0: a file system without an inode limit
    if need <= free and not inodes_short:
        return
    inode_text = (f"it creates {entries} files and folders, and the file system has {inodes} free inodes"
                  if st.f_files > 0 else f"it creates {entries} files and folders (this file system has no "
                  "inode limit)")
    short = ("free space" if need > free else "") + (" and " if need > free and inodes_short else "") + (
        "free inodes" if inodes_short else "")
    raise ConfigError(
        f"not enough {short} to extract {zip_path}: it needs {human_size(need)} ({need} bytes: {human_size(data)} in "
        f"{len(to_write)} file(s), one {st.f_frsize}-byte block for each of the {entries} files and folders, and "
        f"{human_size(SPACE_MARGIN)} to spare), {folder} has {human_size(free)} ({free} bytes) free; {inode_text}. "
        "Free some space or choose another folder (or skip extracting: spark-imagenet shard reads the zip directly)."
    )


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
