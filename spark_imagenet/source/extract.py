"""Unpacking the Kaggle zip (either form) into a folder, safely: :func:`extract`.

See :func:`extract` for what is checked before anything is written and how
an interrupted extract is finished by a rerun (docs/design.md, 'The Kaggle
archive').
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import json
import os
import posixpath
import re
import shlex
import stat
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable

from spark_imagenet.errors import ArchiveError, ConfigError
from spark_imagenet.source.layout import EXTRACT_MARKER, check_layout
from spark_imagenet.source.tar_stream import TarStreamSource
from spark_imagenet.source.zip_archive import (
    FORM_NESTED,
    FORM_ROOT,
    TREE_RE,
    KaggleZip,
    inspect_zip,
    link_text,
    listing,
    open_zip,
    progress_bar,
    zip_link_target,
)
from spark_imagenet.units import human_size


#: The list of the files :func:`extract` wrote, kept in its folder (also once it completed): gzip members
#: of ``<relative name>\n`` lines. Each name is appended (compressed, then a zlib sync flush, so that
#: every name written so far can be decompressed) and handed to the operating system before its file is
#: renamed to its final name: a file under its final name is always listed, even if the process is
#: killed (SIGKILL) at any point (docs/design.md, 'The Kaggle archive').
#: A rerun rewrites a file that differs from its member only when it is listed here; any other
#: differing file is someone else's, refused unless ``overwrite``.
WRITTEN_LIST = ".spark-imagenet-extract-written.gz"
#: The temporary name under which a run rewrites :data:`WRITTEN_LIST` left incomplete by a killed run.
_WRITTEN_TMP = WRITTEN_LIST + ".spark-imagenet-partial"
#: The suffix of the temporary name a file is written under before it is renamed.
PARTIAL_FILE_SUFFIX = ".spark-imagenet-partial"
#: Free space :func:`extract` keeps in reserve beyond the files' bytes and one block per file and folder.
SPACE_MARGIN = 64 * 2**20
#: Names :func:`extract` keeps for itself, refused as member names.
_OWN_NAMES = frozenset({EXTRACT_MARKER, WRITTEN_LIST, _WRITTEN_TMP})
_CHUNK = 1 << 20


def _unsafe(name: str) -> str | None:
    """Why a member name could land outside the destination (or cannot be listed), or None."""
    if "\x00" in name:
        return "a NUL byte in the name"
    if "\n" in name or "\r" in name:
        return "a line break in the name"
    n = name.replace("\\", "/")
    if n.startswith("/") or re.match(r"^[A-Za-z]:", n):
        return "an absolute path"
    if ".." in n.split("/"):
        return "a '..' component"
    return None


def _clean(name: str) -> str:
    return "/".join(p for p in name.replace("\\", "/").split("/") if p not in ("", "."))


@dataclasses.dataclass
class _Item:
    """One thing :func:`extract` writes: a folder or a file."""

    rel: str  # relative to the destination
    kind: str  # "dir" or "file"
    size: int = 0
    crc: int = 0  # CRC-32 of the member's bytes (the zip's, or computed in pass 1 for the nested tar)
    info: zipfile.ZipInfo | None = None  # the zip member (zip-level files); None for the nested tar's
    action: str = "write"  # files: "write" (absent), "rewrite" (differs), "keep" (same bytes already there)
    name: str = ""  # the member's name as the archive gives it, for messages


class _Members:
    """The members :func:`extract` writes, and those it refuses (links, unsafe names, special files,
    duplicates, names too long for the destination), listed together before anything is written."""

    def __init__(self) -> None:
        self.items: list[_Item] = []
        self.refused: list[str] = []
        self.kinds: set[str] = set()
        self._seen: dict[str, tuple[str, str]] = {}  # normalized name -> (kind, the name as given first)

    def refuse(self, kind: str, name: str, why: str) -> None:
        self.refused.append(f"{name}: {why}")
        self.kinds.add(kind)

    def add(self, name: str, kind: str, *, base: str = "", size: int = 0, crc: int = 0,
            info: zipfile.ZipInfo | None = None) -> None:
        """Accept the member ``name`` (of a tar whose folder in the zip is ``base``), or refuse it."""
        why = _unsafe(name)
        if why is not None:
            self.refuse("path", name, why)
            return
        rel = _clean(posixpath.join(base, name) if base else name)
        if kind == "file" and name.replace("\\", "/").rpartition("/")[2] in ("", "."):
            self.refuse("dot", name, f"a file member whose name ends in '/.', so it names the folder {rel}/, not a "
                        "file" if rel else "a file member whose name is the destination folder itself, not a file")
            return
        if not rel:
            return
        if rel.rpartition("/")[2] in _OWN_NAMES:
            self.refuse("own", name, "a name spark-imagenet extract keeps for its own bookkeeping")
            return
        seen = self._seen.get(rel)
        if seen is not None:
            seen_kind, seen_name = seen
            if seen_kind == kind == "dir":
                return  # a folder entry given twice changes nothing
            first = f"a {'folder' if seen_kind == 'dir' else 'file'}" + (f" named {seen_name}" if seen_name != name
                                                                          else "")
            then = "folder" if kind == "dir" else "file"
            self.refuse("duplicate", name, f"given twice (as {first}, then as a {then}): which copy is meant?")
            if seen_name == name and kind == seen_kind == "file" and TREE_RE.match(name):
                self.kinds.add("duplicate-image")  # read_zip_layout refuses it too (it compares names as given)
            return
        self._seen[rel] = (kind, name)
        self.items.append(_Item(rel, kind, size, crc, info, name=name))

    def check_folders(self) -> None:
        """Refuse a file whose name is also the folder of other members."""
        folders: dict[str, str] = {}  # folder -> one member under it
        for item in self.items:
            parent = item.rel.rpartition("/")[0]
            while parent and parent not in folders:
                folders[parent] = item.name or item.rel
                parent = parent.rpartition("/")[0]
        for item in self.items:
            if item.kind == "file" and item.rel in folders:
                self.refuse("file-folder", item.name or item.rel,
                            f"a file, and also the folder of other members (such as {folders[item.rel]})")

    def check_lengths(self, dest: Path, limits: tuple[int, int]) -> None:
        """Refuse a member whose name (a component of it, or its whole path under ``dest``, also under the
        temporary name it is written under first) is longer than ``dest``'s file system allows."""
        name_max, path_max = limits
        base = len(os.fsencode(str(dest))) + 1
        suffix = len(PARTIAL_FILE_SUFFIX) + 1
        folders_ok: set[bytes] = {b""}
        for item in self.items:
            shown = item.name or item.rel
            try:
                raw = os.fsencode(item.rel)
            except UnicodeEncodeError:
                self.refuse("path", shown, "a name that cannot be encoded as a file name on this system")
                continue
            folder, _, leaf = raw.rpartition(b"/")
            longest = len(leaf)
            if folder not in folders_ok:
                longest = max(longest, *map(len, folder.split(b"/")))
            if longest > name_max:
                self.refuse("name-long", shown, f"a name component of {longest} bytes; the file system of "
                            f"{dest} allows at most {name_max} (NAME_MAX)")
                continue
            folders_ok.add(folder)
            full = base + len(raw)
            longer = full
            if item.kind == "file":  # the same length as _partial_name gives, without building it
                tmp = len(leaf) + suffix if len(leaf) + suffix <= name_max else len(
                    os.fsencode(_partial_name(item.rel.rpartition("/")[2], name_max)))
                longer = full - len(leaf) + tmp
            if max(full, longer) > path_max - 1:
                tmp_text = f" ({longer} under the temporary name it is written under first)" if longer > full else ""
                self.refuse("path-long", shown, f"{full} bytes as a path under {dest}{tmp_text}; the file system "
                            f"allows at most {path_max - 1} (PATH_MAX {path_max}, with the final NUL)")

    def check(self, dest: Path, limits: tuple[int, int]) -> None:
        """The checks over all members: a file that is also a folder, names too long for ``dest``."""
        self.check_folders()
        self.check_lengths(dest, limits)

    def error(self, where: str, dest: Path, slip: str) -> ArchiveError:
        notes = []
        if "link" in self.kinds:
            notes.append("The Kaggle archive holds no symbolic or hard links: every link member is refused, "
                         "wherever it points.")
        if "path" in self.kinds:
            notes.append(f"A name that is absolute or has a '..' component would be written outside {dest} "
                         f"({slip}).")
        if "special" in self.kinds:
            notes.append("The Kaggle archive holds only folders and regular files.")
        if "duplicate" in self.kinds:
            notes.append("A name given twice (also when written differently, as with './' or '//') is ambiguous"
                         + ("; spark-imagenet shard refuses an image member given twice too." if "duplicate-image"
                            in self.kinds else "."))
        if "file-folder" in self.kinds:
            notes.append("A name cannot be a file and a folder at once.")
        if "name-long" in self.kinds:
            notes.append("A name component over NAME_MAX cannot be created on that file system (the Kaggle "
                         "archive's names are far shorter).")
        if "path-long" in self.kinds:
            notes.append(f"A path over PATH_MAX cannot be written: choose a folder with a shorter path than {dest}.")
        genuine = ("" if self.kinds <= {"path-long"} else
                   "\nThis is not a genuine Kaggle download: download it again (spark-imagenet download).")
        return ArchiveError(
            f"{where}: refused to extract {len(self.refused)} member(s); nothing was written:"
            f"{listing(self.refused)}" + "".join("\n" + n for n in [" ".join(notes)] if n) + genuine
        )


def _limits(dest: Path) -> tuple[int, int]:
    """NAME_MAX and PATH_MAX (bytes) of the file system ``dest`` is (or will be) on."""
    folder = _free_space_folder(dest)
    limits = []
    for key, default in (("PC_NAME_MAX", 255), ("PC_PATH_MAX", 4096)):
        try:
            value = os.pathconf(folder, key)
        except (OSError, ValueError):
            value = default
        limits.append(value if value is not None and value > 0 else sys.maxsize)  # -1: no limit
    return limits[0], limits[1]


def _partial_name(name: str, name_max: int) -> str:
    """The temporary name the file ``name`` is written under before it is renamed: ``.NAME.spark-imagenet-partial``,
    or ``.<CRC-32 of NAME>.spark-imagenet-partial`` where that is over the file system's NAME_MAX."""
    tmp = f".{name}{PARTIAL_FILE_SUFFIX}"
    if len(os.fsencode(tmp)) <= name_max:
        return tmp
    return f".{zlib.crc32(os.fsencode(name)):08x}{PARTIAL_FILE_SUFFIX}"


class _WrittenList:
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
                    text += d.decompress(data[pos:pos + _CHUNK])
                    pos += _CHUNK
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
        return _WrittenList.parse(path)[0]

    def _open(self) -> None:
        """Open the list for appending a new gzip member; first rewrite it (atomically) when a killed run
        left its last member incomplete, since nothing appended after that could be read back."""
        names, complete = self.parse(self.path)
        if not complete:
            tmp = self.path.with_name(_WRITTEN_TMP)
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


def _free_space_folder(dest: Path) -> Path:
    p = dest
    while not p.exists():
        p = p.parent
    return p


def _file_crc(path: Path, bar) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            if bar is not None:
                bar.update(len(chunk))
    return crc


def _plan(items: list[_Item], dest: Path, overwrite: bool, progress: bool, log: Callable[[str], None]) -> list[str]:
    """Decide each file's action (keep, write, rewrite); return the conflicts that stop the extract."""
    conflicts: list[str] = []
    ours = _Ours(dest / WRITTEN_LIST)
    same_size: list[_Item] = []
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
        log(f"comparing the {len(same_size)} file(s) already in {dest} that have their member's size with the archive "
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
            self._names = _WrittenList.read(self._path)
        return rel in self._names


def _differs(item: _Item, path: Path, what: str, ours: _Ours, overwrite: bool, conflicts: list[str]) -> None:
    """A file already there that is not the member's bytes: rewritten if extract wrote it (or with
    overwrite), else a conflict."""
    if overwrite or item.rel in ours:
        item.action = "rewrite"
    else:
        conflicts.append(f"{path}: {what}")


def extract(
    zip_path: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
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
        log: where to print one-line status messages (``None``: stderr).

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
    if log is None:
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    zip_path = os.path.abspath(Path(zip_path).expanduser())
    dest = Path(dest).expanduser().absolute()
    try:
        return _extract(zip_path, dest, overwrite, progress, log)
    except KeyboardInterrupt:
        if (dest / EXTRACT_MARKER).exists():
            log(f"interrupted: {dest} is incomplete (spark-imagenet shard refuses it); rerun `spark-imagenet "
                f"extract {shlex.quote(zip_path)} {shlex.quote(str(dest))}` to finish it: the files already written "
                "are kept and only the rest is written")
        else:
            log("interrupted before anything was written")
        raise


def _extract(zip_path: str, dest: Path, overwrite: bool, progress: bool, log: Callable[[str], None]) -> Path:
    """:func:`extract` without its Ctrl-C message."""
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"{dest} is a file; give a folder to unpack {zip_path} into")
    zf = open_zip(zip_path)
    with zf:
        kz = inspect_zip(zf, zip_path)
        source = TarStreamSource(zip_path, kz.prefix, kz.tar_member) if kz.form == FORM_NESTED else None
        members, zip_count, limits = _survey(zf, kz, source, dest, progress, log)
        items, tar_items = members.items[:zip_count], members.items[zip_count:]

        conflicts = _plan(members.items, dest, overwrite, progress, log)
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
        writer = _Writer(zip_path, dest, limits[0])
        markers = [EXTRACT_MARKER] + ([f"{kz.prefix}{EXTRACT_MARKER}"] if kz.prefix else [])
        writer.begin(markers, [i for i in members.items if i.kind == "dir"])
        writer.bar = progress_bar(progress, sum(i.size for i in to_write), "extract")
        try:
            _write_zip_files(writer, zf, items)
            if source is not None:
                _write_tar_files(writer, source, tar_items, log)
        finally:
            writer.close()
        for rel in reversed(markers):
            (dest / rel).unlink(missing_ok=True)
    root = dest / kz.prefix if kz.prefix else dest
    check_layout(root)
    kept = sum(1 for i in members.items if i.kind == "file" and i.action == "keep")
    log(f"extracted {zip_path} ({kz.form} form, {human_size(writer.written)} written in {len(to_write)} file(s), "
        f"{kept} file(s) already there kept) to {root}; next: spark-imagenet shard {root} --out URL")
    return root


def _tar_base(source: TarStreamSource) -> str:
    """The zip folder the nested tar.gz lies in (its members are unpacked there)."""
    return posixpath.dirname(source.tar_member)


def _survey(zf: zipfile.ZipFile, kz: KaggleZip, source: TarStreamSource | None, dest: Path, progress: bool,
            log: Callable[[str], None]) -> tuple[_Members, int, tuple[int, int]]:
    """Check every member before anything is written: the zip's, then (nested form) the tar's, in
    pass 1 of 2 over its stream, which also computes each file's CRC-32.

    Returns:
        tuple: the members, how many of them are the zip's own (the rest are the tar's), and
        ``dest``'s NAME_MAX and PATH_MAX.

    Raises:
        ArchiveError: every refused member listed (zip-slip or tar-slip, links, special files,
            duplicates, names too long for ``dest``).
    """
    members = _Members()
    for info in zf.infolist():
        mode = info.external_attr >> 16
        if info.filename == kz.tar_member:
            why = _unsafe(info.orig_filename)
            if why is not None:
                members.refuse("path", info.orig_filename, why)
        elif stat.S_ISLNK(mode):
            members.refuse("link", info.orig_filename, link_text("symbolic", zip_link_target(zf, info)))
        elif info.is_dir():
            members.add(info.orig_filename, "dir")
        elif stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):  # 0: no file type recorded (a file)
            members.refuse("special", info.orig_filename, f"not a regular file or folder (mode {oct(mode)})")
        else:
            members.add(info.orig_filename, "file", size=info.file_size, crc=info.CRC, info=info)
    zip_count = len(members.items)
    limits = _limits(dest)
    if members.refused:
        members.check(dest, limits)
        raise members.error(kz.path, dest, "zip-slip")
    if source is not None:
        log(f"checking {source.where_source()} (pass 1 of 2 over the compressed stream)")
        _survey_tar(members, source, progress)
    members.check(dest, limits)
    if members.refused:
        where = kz.path if kz.form == FORM_ROOT else source.where_source()
        raise members.error(where, dest, "zip-slip" if kz.form == FORM_ROOT else "tar-slip")
    return members, zip_count, limits


def _survey_tar(members: _Members, source: TarStreamSource, progress: bool) -> None:
    """Add (or refuse) every member of the nested tar, with the CRC-32 of each file."""
    tar_base = _tar_base(source)
    for ti, tf in source.members(progress=progress, desc="check"):
        if ti.issym() or ti.islnk():
            members.refuse("link", ti.name, link_text("symbolic" if ti.issym() else "hard", ti.linkname))
        elif ti.isdir():
            members.add(ti.name, "dir", base=tar_base)
        elif not ti.isfile():
            members.refuse("special", ti.name, "a device, FIFO or other special file")
        elif _unsafe(ti.name) is not None:
            members.add(ti.name, "file", base=tar_base)  # refused for its name
        else:
            crc = 0
            try:
                member = tf.extractfile(ti)
                while chunk := member.read(_CHUNK):
                    crc = zlib.crc32(chunk, crc)
            except (tarfile.TarError, zlib.error, EOFError, OSError) as e:
                raise source.stream_error(e) from None
            members.add(ti.name, "file", base=tar_base, size=ti.size, crc=crc)


class _Writer:
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
        self.written_list = _WrittenList(dest / WRITTEN_LIST)

    def _inside(self, folder: Path, rel: str) -> None:
        real = os.path.realpath(folder)
        if real != self.real_dest and not real.startswith(self.real_dest + os.sep):
            raise ArchiveError(f"{self.zip_path}: {rel} would be written to {real}, outside {self.dest} (through a "
                               f"link already in {self.dest}); stopped")

    def folder(self, path: Path, rel: str) -> None:
        """Create the folder ``path`` (for ``rel``), checking that it is inside ``dest`` (links followed)."""
        self._inside(_free_space_folder(path), rel)  # the nearest existing folder, before creating any
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

    def begin(self, markers: list[str], folders: list[_Item]) -> None:
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

    def write(self, item: _Item, opener: Callable[[], BinaryIO], where: str) -> None:
        """Write one file from ``opener()``, checking its size and CRC-32 against the archive's."""
        path = self.dest / item.rel
        try:
            path = self.target_of(item.rel)
            tmp = path.with_name(_partial_name(path.name, self.name_max))
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
            while chunk := src.read(_CHUNK):
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


def _write_zip_files(writer: _Writer, zf: zipfile.ZipFile, items: list[_Item]) -> None:
    """Write the zip's own files that are not already there."""
    for item in items:
        if item.kind != "file" or item.action == "keep":
            continue
        try:
            writer.write(item, lambda: zf.open(item.info), f"{writer.zip_path} member {item.info.orig_filename}")
        except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError) as e:
            raise ArchiveError(f"{writer.zip_path} member {item.info.orig_filename} cannot be read ({e}); the zip "
                               "is damaged: download it again") from None


def _write_tar_files(writer: _Writer, source: TarStreamSource, tar_items: list[_Item],
                     log: Callable[[str], None]) -> None:
    """Pass 2 of 2 over the nested tar: write its files that are not already there.

    Raises:
        ArchiveError: the stream is damaged, or differs from pass 1 (the archive changed).
    """
    left = {i.rel: i for i in tar_items if i.kind == "file" and i.action != "keep"}
    if not left:
        return
    log(f"unpacking {source.where_source()} (pass 2 of 2)")
    tar_base = _tar_base(source)
    known = {i.rel for i in tar_items}
    for ti, tf in source.members():
        rel = _clean(posixpath.join(tar_base, ti.name)) if _unsafe(ti.name) is None else None
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


def _check_free_space(zip_path: str, dest: Path, items: list[_Item], to_write: list[_Item]) -> None:
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
    folder = _free_space_folder(dest)
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
