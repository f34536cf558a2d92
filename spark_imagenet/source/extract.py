"""Unpacking the Kaggle zip (either form) into a folder, safely: :func:`extract`.

See :func:`extract` for what is checked before anything is written and how
an interrupted extract is finished by a rerun (docs/design.md, 'The Kaggle
archive'). The checks of the members are in
:mod:`spark_imagenet.source.extract_members`, the writing in
:mod:`spark_imagenet.source.extract_write`; this module decides what to do
with the files already in the folder (keep, rewrite or refuse) and checks the
free space.

Example::

    root = extract("imagenet-object-localization-challenge.zip", "/data/kaggle")
    # root: /data/kaggle, in the Kaggle layout that spark-imagenet shard reads
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
import zlib
from pathlib import Path

from spark_imagenet.errors import ConfigError
from spark_imagenet.source.extract_members import (
    CHUNK, SPACE_MARGIN, WRITTEN_LIST, Item, nearest_existing, survey)
from spark_imagenet.source.extract_write import WrittenList, Writer, write_tar_files, write_zip_files
from spark_imagenet.source.layout import EXTRACT_MARKER, check_layout
from spark_imagenet.source.tar_stream import TarStreamSource
from spark_imagenet.source.zip_archive import FORM_NESTED, inspect_zip, listing, open_zip, progress_bar
from spark_imagenet.units import human_size

logger = logging.getLogger(__name__)


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
      run of this function wrote them (:data:`WRITTEN_LIST`); a differing
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
