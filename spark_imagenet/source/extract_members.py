"""What :func:`spark_imagenet.source.extract.extract` checks before it writes anything: the members.

:func:`survey` lists every member of the Kaggle zip (and, in the nested form,
of its tar.gz, in pass 1 of 2 over the stream, with each file's CRC-32) as
:class:`Item` s, and refuses, all together in one error, names that would land
outside the destination, links, special files, names given twice, a file that
is also a folder, names extract keeps for its own bookkeeping
(:data:`~spark_imagenet.source.extract_dest.OWN_NAMES`), and names too long for
the destination's file system (:func:`name_limits`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import re
import stat
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

from spark_imagenet.errors import ArchiveError
from spark_imagenet.source.extract_dest import CHUNK, OWN_NAMES, PARTIAL_FILE_SUFFIX, nearest_existing, partial_name
from spark_imagenet.source.tar_stream import TarStreamSource
from spark_imagenet.source.zip_archive import (
    FORM_ROOT, TREE_RE, KaggleZip, link_text, listing, zip_link_target)

logger = logging.getLogger(__name__)


def unsafe_name(name: str) -> str | None:
    """Why a member name could land outside the destination (or cannot be listed), or None.

    Args:
        name: the member's name as the archive gives it.

    Returns:
        str | None: e.g. ``"a '..' component"``, ``"an absolute path"``, ``"a NUL byte in the name"``,
        ``"a line break in the name"`` (the written-files list is one name per line); None for a safe name.
    """
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


def clean_name(name: str) -> str:
    """A safe member name (:func:`unsafe_name` None) as a relative path: ``\\`` as ``/``, without empty and
    ``.`` components (``a/./b//c`` -> ``a/b/c``; ``""`` for the destination itself)."""
    return "/".join(p for p in name.replace("\\", "/").split("/") if p not in ("", "."))


@dataclasses.dataclass
class Item:
    """One thing :func:`~spark_imagenet.source.extract.extract` writes: a folder or a file."""

    rel: str  # relative to the destination
    kind: str  # "dir" or "file"
    size: int = 0
    crc: int = 0  # CRC-32 of the member's bytes (the zip's, or computed in pass 1 for the nested tar)
    info: zipfile.ZipInfo | None = None  # the zip member (zip-level files); None for the nested tar's
    action: str = "write"  # files: "write" (absent), "rewrite" (differs), "keep" (same bytes already there)
    name: str = ""  # the member's name as the archive gives it, for messages


class Members:
    """The members :func:`~spark_imagenet.source.extract.extract` writes, and those it refuses.

    Refused (all listed together, before anything is written): links, unsafe names, special files,
    duplicates, a file that is also a folder, names too long for the destination.

    Attributes:
        items: the accepted members, in archive order.
        refused: one line per refused member (``"NAME: why"``).
        kinds: the kinds of refusal seen (``"path"``, ``"link"``, ``"duplicate"``, ...), for :meth:`error`.
    """

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.refused: list[str] = []
        self.kinds: set[str] = set()
        self._seen: dict[str, tuple[str, str]] = {}  # normalized name -> (kind, the name as given first)

    def refuse(self, kind: str, name: str, why: str) -> None:
        """Refuse the member ``name`` for ``why`` (a refusal of kind ``kind``)."""
        self.refused.append(f"{name}: {why}")
        self.kinds.add(kind)

    def add(self, name: str, kind: str, *, base: str = "", size: int = 0, crc: int = 0,
            info: zipfile.ZipInfo | None = None) -> None:
        """Accept the member ``name`` (of a tar whose folder in the zip is ``base``), or refuse it."""
        why = unsafe_name(name)
        if why is not None:
            self.refuse("path", name, why)
            return
        rel = clean_name(posixpath.join(base, name) if base else name)
        if kind == "file" and name.replace("\\", "/").rpartition("/")[2] in ("", "."):
            self.refuse("dot", name, f"a file member whose name ends in '/.', so it names the folder {rel}/, not a "
                        "file" if rel else "a file member whose name is the destination folder itself, not a file")
            return
        if not rel:
            return
        if rel.rpartition("/")[2] in OWN_NAMES:
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
                self.kinds.add("duplicate-image")  # listing the zip refuses it too (it compares names as given)
            return
        self._seen[rel] = (kind, name)
        self.items.append(Item(rel, kind, size, crc, info, name=name))

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
            if item.kind == "file":  # the same length as partial_name gives, without building it
                tmp = len(leaf) + suffix if len(leaf) + suffix <= name_max else len(
                    os.fsencode(partial_name(item.rel.rpartition("/")[2], name_max)))
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


def name_limits(dest: Path) -> tuple[int, int]:
    """NAME_MAX and PATH_MAX (bytes) of the file system ``dest`` is (or will be) on."""
    folder = nearest_existing(dest)
    limits = []
    for key, default in (("PC_NAME_MAX", 255), ("PC_PATH_MAX", 4096)):
        try:
            value = os.pathconf(folder, key)
        except (OSError, ValueError):
            value = default
        limits.append(value if value is not None and value > 0 else sys.maxsize)  # -1: no limit
    return limits[0], limits[1]


def tar_folder(source: TarStreamSource) -> str:
    """The zip folder the nested tar.gz lies in (its members are unpacked there)."""
    return posixpath.dirname(source.tar_member)


def survey(zf: zipfile.ZipFile, kz: KaggleZip, source: TarStreamSource | None, dest: Path,
           progress: bool) -> tuple[Members, int, tuple[int, int]]:
    """Check every member before anything is written: the zip's, then (nested form) the tar's, in
    pass 1 of 2 over its stream, which also computes each file's CRC-32.

    Args:
        zf: the open zip.
        kz: its form (:func:`~spark_imagenet.source.zip_archive.inspect_zip`).
        source: the nested tar.gz as a stream (nested form), else None.
        dest: the destination folder (its file system's name limits are checked).
        progress: show a tqdm bar for pass 1.

    Returns:
        tuple: the members, how many of them are the zip's own (the rest are the tar's), and
        ``dest``'s NAME_MAX and PATH_MAX.

    Raises:
        ArchiveError: every refused member listed (zip-slip or tar-slip, links, special files,
            duplicates, names too long for ``dest``).
    """
    members = Members()
    for info in zf.infolist():
        mode = info.external_attr >> 16
        if info.filename == kz.tar_member:
            why = unsafe_name(info.orig_filename)
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
    limits = name_limits(dest)
    if members.refused:
        members.check(dest, limits)
        raise members.error(kz.path, dest, "zip-slip")
    if source is not None:
        logger.info(f"checking {source.where_source()} (pass 1 of 2 over the compressed stream)")
        survey_tar(members, source, progress)
    members.check(dest, limits)
    if members.refused:
        where = kz.path if kz.form == FORM_ROOT else source.where_source()
        raise members.error(where, dest, "zip-slip" if kz.form == FORM_ROOT else "tar-slip")
    return members, zip_count, limits


def survey_tar(members: Members, source: TarStreamSource, progress: bool) -> None:
    """Add (or refuse) every member of the nested tar, with the CRC-32 of each file."""
    tar_base = tar_folder(source)
    for ti, tf in source.members(progress=progress, desc="check"):
        if ti.issym() or ti.islnk():
            members.refuse("link", ti.name, link_text("symbolic" if ti.issym() else "hard", ti.linkname))
        elif ti.isdir():
            members.add(ti.name, "dir", base=tar_base)
        elif not ti.isfile():
            members.refuse("special", ti.name, "a device, FIFO or other special file")
        elif unsafe_name(ti.name) is not None:
            members.add(ti.name, "file", base=tar_base)  # refused for its name
        else:
            crc = 0
            try:
                member = tf.extractfile(ti)
                while chunk := member.read(CHUNK):
                    crc = zlib.crc32(chunk, crc)
            except (tarfile.TarError, zlib.error, EOFError, OSError) as e:
                raise source.stream_error(e) from None
            members.add(ti.name, "file", base=tar_base, size=ti.size, crc=crc)
