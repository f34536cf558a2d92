"""The downloaded Kaggle zip read in place, and its current form as an image source.

The Kaggle competition ``imagenet-object-localization-challenge`` is one zip
(about 155 GiB) in one of two forms (docs/design.md, 'The Kaggle archive'):

``root`` (the current form, :class:`ZipSource`)
    ``LOC_synset_mapping.txt``, ``LOC_val_solution.csv`` (and the other two
    ``LOC_*`` files) and ``ILSVRC/`` at the top of the zip, or under one top
    folder (the prefix is detected). Every image is a zip member, read on its
    own (random access) by :class:`ZipMemberReader` at the location the
    central directory gives, without :class:`zipfile.ZipFile`.
``nested-tar`` (the older form, :class:`spark_imagenet.source.tar_stream.TarStreamSource`)
    the ``LOC_*`` files plus ``imagenet_object_localization_patched2019.tar.gz``,
    which holds ``ILSVRC/``, read as a stream.

:func:`spark_imagenet.source.open_zip_source` opens either form (it imports this module and
:mod:`spark_imagenet.source.tar_stream`, which imports this one). This module also holds what both
forms share: opening the zip with
errors a user can act on (:func:`open_zip`), finding its form
(:func:`inspect_zip`), the index of the tree inside (:class:`Index`,
:class:`ArchiveTree`) and the refusal of link members.

For ``shard ZIP --master M``, :meth:`ZipSource.list_images` would hold every member (docs/design.md, 'Sharding a
DataFrame as a Spark job'), so the driver instead reads the central directory as a stream
(:mod:`spark_imagenet.source.zip_directory`) twice (:func:`plan_kaggle_zip`): once to find the zip's form
(:func:`inspect_names`), once to count each class folder's images, check the layout exactly as the local path
does (the same messages) and cut the directory into slices of :data:`ENTRIES_PER_SLICE` entries. What it keeps
grows with the classes, the validation set (its CSV is read whole anyway) and the slices, plus 8 bytes per member
to find names given twice. Each Spark task then lists its own slice again (:func:`chosen_in_slice`) and reads the
chosen members at the locations the directory gives. The images chosen are the local path's (same classes, class
ids and validation rows); ``--per-class`` needs every member of a class at once and is not planned (the caller
lists the zip as without ``--master``).

Example:

>>> zip_path = "kaggle.zip"
>>> with zipfile.ZipFile(zip_path, "w") as zf:
...     for path in sorted(Path("/data/kaggle").rglob("*")):
...         zf.write(path, path.relative_to("/data/kaggle").as_posix())
>>> plan = plan_kaggle_zip(zip_path, num_classes=2)
>>> plan.counts
{'train': 12, 'val': 6}
>>> images = [image for start, stop in plan.slices for image in chosen_in_slice(plan.choice, start, stop)]
>>> len(images), images[0][1:3]
(18, (0, 'train'))
"""

from __future__ import annotations

import array
import collections
import dataclasses
import functools
import io
import os
import re
import stat
import struct
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from spark_imagenet.errors import ArchiveError, ConfigError
from spark_imagenet.source.base import ImageFile, ImageReader, ImageSource, SourceDataset
from spark_imagenet.source.kaggle import PARTIAL_SUFFIX
from spark_imagenet.source.labelled import listing
from spark_imagenet.source.layout import (DATA_REL, MAPPING, MAX_LISTED, VAL_CSV, check_train_folders, match_val,
                                          parse_val_solution, select_images)
from spark_imagenet.source.synset import SynsetClass, parse_synset_mapping, read_class_list, select_classes
from spark_imagenet.source.zip_directory import DirEntry, Directory, find_directory, iter_entries
from spark_imagenet.units import human_size

#: The tar.gz member of the older form, holding ``ILSVRC/``.
TAR_MEMBER = "imagenet_object_localization_patched2019.tar.gz"
FORM_ROOT = "root"
FORM_NESTED = "nested-tar"
#: The manifest's ``source.kind`` of a zip (either form).
KIND = "kaggle-cls-loc-zip"
#: Names under ``ILSVRC/Data/CLS-LOC/{train,val}``; group 1 is what comes before ``ILSVRC/``.
TREE_RE = re.compile(r"^(.*?)ILSVRC/Data/CLS-LOC/(train|val)(/|$)")
#: A name under a Kaggle root's data folder at the top or one folder deep: group 1 the prefix, 2 the part.
_DATA_PART_RE = re.compile(r"^((?:[^/]+/)?)ILSVRC/Data/CLS-LOC/([^/]+)")
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # APPNOTE 4.3.7: local file header, 30 bytes


def progress_bar(progress: bool, total: int, desc: str):
    """A tqdm bar of bytes on stderr, or None."""
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr,
                dynamic_ncols=True)



def is_zip_source(path: str | os.PathLike) -> bool:
    """Whether ``shard`` should read ``path`` as a zip rather than a folder.

    Args:
        path: the ``SOURCE`` argument.

    Returns:
        bool: True for a file named ``*.zip`` (even a truncated one, so that it
        gets the zip's error message), any file that is a zip archive, and a
        ``*.zip`` path that does not exist (so that the message says so).
    """
    p = Path(path).expanduser()
    if p.is_file():
        return p.suffix.lower() == ".zip" or zipfile.is_zipfile(p)
    return p.suffix.lower() == ".zip" and not p.exists()


def open_zip(path: str | os.PathLike) -> zipfile.ZipFile:
    """Open a zip for reading, with errors a user can act on.

    Args:
        path: the zip file.

    Returns:
        zipfile.ZipFile: the open archive (its central directory read).

    Raises:
        ArchiveError: the file is missing, unreadable, or not a complete zip
            (a truncated download has no end-of-central-directory record).
    """
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArchiveError(
            f"{path} does not exist: give the downloaded Kaggle zip (spark-imagenet download --dest DIR fetches "
            "it) or the folder it was extracted to"
        ) from None
    except zipfile.BadZipFile as e:
        size = os.path.getsize(path)
        marker = f"{path}{PARTIAL_SUFFIX}"
        if os.path.exists(marker):
            fix = (f"Its download is not finished ({marker} is there): run spark-imagenet download again with the "
                   f"same --dest ({os.path.dirname(os.path.abspath(path))}); it resumes where it stopped.")
        else:
            fix = ("Delete it and run spark-imagenet download again (a rerun of download also finds a truncated "
                   "zip by itself and downloads it again from the start).")
        sized = human_size(size) + (f", {size} bytes" if size >= 1000 else "")  # "0 bytes" once, not twice
        raise ArchiveError(
            f"{path} is not a complete zip archive ({e}; {sized}): the file is "
            f"truncated or damaged. {fix}"
        ) from None
    except OSError as e:
        raise ArchiveError(f"{path} cannot be read ({e.strerror or e})") from None


@dataclasses.dataclass(frozen=True)
class KaggleZip:
    """Which form a zip is in and where its Kaggle root is.

    Attributes:
        path: the zip file (absolute).
        form: :data:`FORM_ROOT` or :data:`FORM_NESTED`.
        prefix: the folder of the zip that holds the ``LOC_*`` files, ``""``
            or ``"<top folder>/"``.
        tar_member: for :data:`FORM_NESTED`, the tar.gz member's name.
    """

    path: str
    form: str
    prefix: str
    tar_member: str | None = None


def _prefix_of(name: str) -> str | None:
    """The Kaggle-root prefix a member name implies (top level or one folder deep), or None."""
    for marker in (MAPPING, VAL_CSV, TAR_MEMBER):
        if name == marker:
            return ""
        head, sep, rest = name.partition("/")
        if sep and rest == marker:
            return head + "/"
    if name.startswith("ILSVRC/"):
        return ""
    head, sep, rest = name.partition("/")
    if sep and rest.startswith("ILSVRC/"):
        return head + "/"
    return None


def inspect_zip(zf: zipfile.ZipFile, path: str) -> KaggleZip:
    """Find the form and the prefix of a Kaggle zip (see :func:`inspect_names`)."""
    return inspect_names(zf.namelist(), path)


def inspect_names(names: Iterable[str], path: str) -> KaggleZip:
    """Find the form and the prefix of a Kaggle zip from its member names, in one pass that keeps only what
    it needs (a handful of names), however many members the zip has.

    Args:
        names: every member name, in the zip's order.
        path: the zip's path, for messages.

    Returns:
        KaggleZip: the form and prefix.

    Raises:
        ArchiveError: the zip is not a Kaggle ImageNet archive (the message
            lists what is missing and a few names it does hold), or holds
            several candidate trees.
    """
    prefixes: set[str] = set()
    markers: set[str] = set()       # the names of the LOC_* files and the tar member, wherever they are
    parts: set[tuple[str, str]] = set()  # (prefix, "train" or "val") of each name under a prefix's data folder
    tops: list[str] = []            # .tar.gz / .tgz names one folder deep at most
    sample: list[str] = []
    count = 0
    for n in names:
        count += 1
        if len(sample) < 5:
            sample.append(n)
        p = _prefix_of(n)
        if p is not None:
            prefixes.add(p)
        if n.rpartition("/")[2] in (MAPPING, VAL_CSV, TAR_MEMBER):
            markers.add(n)
        m = _DATA_PART_RE.match(n)
        if m is not None:
            parts.add((m.group(1), m.group(2)))
        if n.count("/") <= 1 and n.endswith((".tar.gz", ".tgz")):
            tops.append(n)
    prefix = "" if "" in prefixes or not prefixes else min(prefixes)
    if len(prefixes) > 1 and "" not in prefixes:
        raise ArchiveError(
            f"{path} holds several folders that look like the Kaggle ImageNet tree ({', '.join(sorted(prefixes))}); "
            "make a zip of one of them, or extract it and pass its folder"
        )
    data = f"{prefix}{DATA_REL}/"
    has = {part: (prefix, part) in parts for part in ("train", "val")}
    tars = [n for n in tops if n.startswith(prefix) and "/" not in n[len(prefix):]]
    missing = [prefix + f for f in (MAPPING, VAL_CSV) if prefix + f not in markers]
    if has["train"] or has["val"]:
        form, tar = FORM_ROOT, None
        missing += [f"{data}{k}/" for k, v in has.items() if not v]
    elif prefix + TAR_MEMBER in markers or len(tars) == 1:
        form = FORM_NESTED
        tar = prefix + TAR_MEMBER if prefix + TAR_MEMBER in markers else tars[0]
    else:
        form, tar = FORM_ROOT, None
        missing += [f"{data}train/", f"{data}val/", f"(or instead of both: {prefix}{TAR_MEMBER} holding ILSVRC/)"]
    if missing:
        held = ", ".join(sample) + (" ..." if count > 5 else "") if count else "nothing"
        raise ArchiveError(
            f"{path} is not the Kaggle imagenet-object-localization-challenge archive; missing:{listing(missing, MAX_LISTED)}\n"
            f"It holds {count} member(s): {held}\n"
            f"Expected {MAPPING}, {VAL_CSV} and either ILSVRC/Data/CLS-LOC/train/ and val/ or {TAR_MEMBER} "
            "(holding ILSVRC/), at the top of the zip or in one top folder."
        )
    return KaggleZip(os.path.abspath(path), form, prefix, tar)


class Entry(NamedTuple):
    """A file of the index: its base name, full member name and size in bytes."""

    name: str
    member: str
    size: int


class Index:
    """Folders and files under ``ILSVRC/Data/CLS-LOC/{train,val}`` of an
    archive, by name relative to the Kaggle root."""

    def __init__(self) -> None:
        self.subfolders: dict[str, set[str]] = {}
        self.files: dict[str, list[Entry]] = {}
        self.duplicates: list[str] = []
        self._seen: set[str] = set()

    def _folder(self, rel: str) -> None:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            self.subfolders.setdefault("/".join(parts[:i]), set()).add(parts[i])

    def add_dir(self, rel: str) -> None:
        self._folder(rel.rstrip("/"))

    def add_file(self, rel: str, member: str, size: int) -> None:
        folder, _, name = rel.rpartition("/")
        self._folder(folder)
        if rel in self._seen:
            self.duplicates.append(member)
            return
        self._seen.add(rel)
        self.files.setdefault(folder, []).append(Entry(name, member, size))


class ArchiveTree:
    """:class:`spark_imagenet.source.layout.SourceTree` over a zip (and its nested tar).

    Args:
        path: the zip file.
        prefix: the zip folder holding the Kaggle root (``""`` or ``"top/"``).
        zf: the open zip (the ``LOC_*`` files are read from it).
        index: the image tree, by name relative to the Kaggle root.
        where_tree: how messages name a name under ``ILSVRC/`` (relative to
            the Kaggle root).
    """

    def __init__(self, path: str, prefix: str, zf: zipfile.ZipFile, index: Index, where_tree: Callable[[str], str]):
        self.root = path
        self._prefix = prefix
        self._zf = zf
        self._index = index
        self._where_tree = where_tree

    def where(self, rel: str) -> str:
        if not rel:
            return self.root
        if rel.startswith("ILSVRC"):
            return self._where_tree(rel)
        return f"{self.root} member {self._prefix}{rel}"

    def _open_text(self, rel: str) -> io.TextIOWrapper:
        return io.TextIOWrapper(self._zf.open(self._prefix + rel), encoding="utf-8", newline="")

    def read_mapping(self) -> tuple[SynsetClass, ...]:
        try:
            with self._open_text(MAPPING) as f:
                text = f.read()
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            raise damaged(self.where(MAPPING), e) from None
        return parse_synset_mapping(text, self.where(MAPPING))

    def read_val_labels(self, known_wnids: set[str]) -> dict[str, str]:
        try:
            with self._open_text(VAL_CSV) as f:
                return parse_val_solution(f, self.where(VAL_CSV), known_wnids)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            raise damaged(self.where(VAL_CSV), e) from None

    def folders(self, rel: str) -> set[str]:
        return {f for f in self._index.subfolders.get(rel, ()) if not f.startswith(".")}

    def files(self, rel: str) -> list[Entry]:
        return sorted((e for e in self._index.files.get(rel, ()) if not e.name.startswith(".")), key=lambda e: e.name)

    def image(self, entry: Entry, label: int, wnid: str) -> ImageFile:
        return ImageFile(entry.member, label, wnid, entry.size)


def link_target(size: int, read: Callable[[], bytes]) -> str:
    """A link member's target for messages: ``read()`` decoded, ``<N bytes>`` past 4 KiB, or why it could
    not be read."""
    if size > 4096:
        return f"<{size} bytes>"
    try:
        return read().decode("utf-8", "replace")
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, ArchiveError) as e:
        return f"<unreadable: {e}>"


def link_text(kind: str, target: str) -> str:
    """How a refusal names a link member: its kind, its target and what is wrong with the target."""
    t = target.replace("\\", "/")
    if t.startswith("/") or re.match(r"^[A-Za-z]:", t):
        return f"a {kind} link to {target}: the link target is an absolute path"
    if ".." in t.split("/"):
        return f"a {kind} link to {target}: the link target has a '..' component"
    return f"a {kind} link to {target}"


def links_refused(where: str, links: list[str]) -> ArchiveError:
    """The error for the link members ``links`` of ``where``."""
    return ArchiveError(
        f"{where} holds {len(links)} link member(s) (symbolic or hard links); the Kaggle archive has none, so "
        f"this is not a genuine Kaggle download and is refused:{listing(links, MAX_LISTED)}\n"
        "Download the archive again from Kaggle (spark-imagenet download)."
    )


def refuse_symlinks(path: str, links: list[tuple[str, int, Callable[[], bytes]]]) -> None:
    """ArchiveError listing every symbolic link member, given as ``(name, size, read its target)`` (the Kaggle
    archive has none)."""
    if links:
        raise links_refused(path, [f"{name}: {link_text('symbolic', link_target(size, read))}"
                                   for name, size, read in links])


def refuse_zip_links(zf: zipfile.ZipFile, path: str) -> None:
    """ArchiveError listing every symbolic link member of the open zip (Unix mode in the high 16 bits of its
    external attributes)."""
    refuse_symlinks(path, [(info.orig_filename, info.file_size, functools.partial(zf.read, info))
                           for info in zf.infolist() if stat.S_ISLNK(info.external_attr >> 16)])


def refuse_duplicates(path: str, members: list[str]) -> None:
    """ArchiveError listing the image members the archive holds twice."""
    if members:
        raise ArchiveError(f"{path} holds {len(members)} image member(s) twice (which copy is meant?):"
                           f"{listing(members, MAX_LISTED)}\nDownload the archive again.")


def damaged(where: str, e: BaseException) -> ArchiveError:
    """The error for a member that cannot be read: the zip is damaged."""
    return ArchiveError(f"{where} cannot be read ({e}); the zip is damaged: download it again")


_FD_CACHE: dict[str, int] = {}
_ZIP_CACHE: dict[str, zipfile.ZipFile] = {}


@dataclasses.dataclass(frozen=True)
class ZipMemberReader(ImageReader):
    """Reads members of a zip by their location (in a shard worker process).

    Attributes:
        zip_path: the zip file.
        members: member name to ``(header_offset, compress_size, file_size,
            compress_type, CRC-32, flag_bits, original name)`` as the central
            directory gives them (:attr:`ZipSource.locations`).
    """

    zip_path: str
    members: dict[str, tuple]

    def where(self, image: ImageFile) -> str:
        """How messages name a member: ``<zip> member <name>``."""
        return f"{self.zip_path} member {image.path}"

    def read(self, image: ImageFile) -> bytes:
        """The bytes of the member ``image.path``, CRC-32 checked.

        Each process opens the zip once (a file descriptor, read with
        ``os.pread``); stored and deflated members are read directly from
        their local header, other compression methods through
        :class:`zipfile.ZipFile`.

        Args:
            image: an image whose member is in :attr:`members`.

        Returns:
            bytes: the member's uncompressed bytes.

        Raises:
            ArchiveError: the local header is missing or names another member,
                the member is encrypted, truncated, or fails its CRC-32 check.
            OSError: the zip cannot be opened or read.
        """
        return read_located(self.zip_path, self.members[image.path])


def read_located(zip_path: str, location: tuple) -> bytes:
    """The bytes of the member at ``location``, CRC-32 checked (see :meth:`ZipMemberReader.read`).

    Args:
        zip_path: the zip file.
        location: ``(header_offset, compress_size, file_size, compress_type, CRC-32, flag_bits, original
            name)``, as the central directory gives them.

    Returns:
        bytes: the member's uncompressed bytes.

    Raises:
        ArchiveError, OSError: as :meth:`ZipMemberReader.read`.
    """
    offset, csize, size, method, crc, flags, orig = location
    if flags & 0x1:
        raise ArchiveError("the member is encrypted; the Kaggle archive never is: download it again")
    if method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        zf = _ZIP_CACHE.get(zip_path)
        if zf is None:
            zf = _ZIP_CACHE[zip_path] = zipfile.ZipFile(zip_path)
        try:
            return zf.read(orig)
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
            raise ArchiveError(f"{e}; download the archive again") from None
    fd = _FD_CACHE.get(zip_path)
    if fd is None:
        fd = _FD_CACHE[zip_path] = os.open(zip_path, os.O_RDONLY)
    header = os.pread(fd, _LOCAL_HEADER.size, offset)
    if len(header) < _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise ArchiveError(f"no local file header at byte {offset}: the zip is damaged; download it again")
    fields = _LOCAL_HEADER.unpack(header)
    name_len, extra_len = fields[-2], fields[-1]
    raw_name = os.pread(fd, name_len, offset + _LOCAL_HEADER.size)
    local_name = raw_name.decode("utf-8" if fields[2] & 0x800 else "cp437", "replace")
    if local_name != orig:
        raise ArchiveError(f"the local header at byte {offset} names {local_name!r}: the zip is damaged")
    start = offset + _LOCAL_HEADER.size + name_len + extra_len
    raw = os.pread(fd, csize, start)
    if len(raw) < csize:
        raise ArchiveError(f"truncated member ({len(raw)} of {csize} bytes): download the archive again")
    try:
        data = raw if method == zipfile.ZIP_STORED else zlib.decompress(raw, -15)
    except zlib.error as e:
        raise ArchiveError(f"corrupt deflate data ({e}): download the archive again") from None
    if len(data) != size or zlib.crc32(data) != crc:
        raise ArchiveError("CRC-32 or size mismatch: the zip is damaged; download it again")
    return data



@dataclasses.dataclass(eq=False)
class ZipSource(ImageSource):
    """The Kaggle zip in its current form (``root``): every image a zip member.

    Attributes:
        path: the zip file (resolved, absolute).
        prefix: the zip folder holding the Kaggle root (``""`` or ``"top/"``).
        locations: per image member name, where its bytes are:
            ``(header_offset, compress_size, file_size, compress_type,
            CRC-32, flag_bits, original name)``; filled by :meth:`list_images`.
    """

    path: str
    prefix: str = ""
    locations: dict[str, tuple] = dataclasses.field(default_factory=dict, repr=False)
    _zf: zipfile.ZipFile | None = dataclasses.field(default=None, repr=False)
    random_access = True

    def _take_zip(self) -> zipfile.ZipFile:
        """The zip :func:`open_zip_source` opened (once), else a new one."""
        zf, self._zf = self._zf, None
        return zf if zf is not None else open_zip(self.path)

    def list_images(self, *, num_classes: int | None = None, class_list: str | os.PathLike | None = None,
                    per_class: int | None = None, seed: int = 0, progress: bool = False) -> SourceDataset:
        """See :meth:`ImageSource.list_images`; reads the central directory only.

        Raises:
            ArchiveError: also an image member given twice, or any link member.
        """
        with self._take_zip() as zf:
            refuse_zip_links(zf, self.path)
            index = Index()
            for info in zf.infolist():
                n = info.filename
                if not n.startswith(self.prefix):
                    continue
                rel = n[len(self.prefix):]
                if not rel.startswith(DATA_REL + "/") or TREE_RE.match(rel) is None:
                    continue
                if info.is_dir():
                    index.add_dir(rel)
                else:
                    index.add_file(rel, n, info.file_size)
                    self.locations[n] = (info.header_offset, info.compress_size, info.file_size,
                                         info.compress_type, info.CRC, info.flag_bits, info.orig_filename)
            refuse_duplicates(self.path, index.duplicates)
            tree = ArchiveTree(self.path, self.prefix, zf, index, lambda rel: f"{self.path} member {self.prefix}{rel}")
            return select_images(tree, num_classes=num_classes, class_list=class_list, per_class=per_class,
                                 seed=seed, source=self)

    def relpath(self, image: ImageFile) -> str:
        return image.path[len(self.prefix):]

    def where(self, image: ImageFile) -> str:
        """``<zip> member <name>``."""
        return f"{self.path} member {image.path}"

    def describe(self) -> dict[str, Any]:
        """``{"kind": "kaggle-cls-loc-zip", "path": <zip>, "form": "root"}``, plus
        ``"prefix"`` (the top folder, when there is one)."""
        out: dict[str, Any] = {"kind": KIND, "path": self.path, "form": FORM_ROOT}
        if self.prefix:
            out["prefix"] = self.prefix
        return out

    def reader(self, images: Sequence[ImageFile]) -> ZipMemberReader:
        """A picklable reader holding only these images' member locations."""
        return ZipMemberReader(self.path, {img.path: self.locations[img.path] for img in images})


# -- the zip planned for a Spark job --------------------------------------------------------------------------------

#: Directory entries per slice (one Spark task lists and reads one slice).
ENTRIES_PER_SLICE = 10_000
_TRAIN = f"{DATA_REL}/train/"
_VAL = f"{DATA_REL}/val/"


@dataclasses.dataclass(frozen=True)
class ZipChoice:
    """What a task needs to pick the chosen images out of its slice (picklable; sent once per executor).

    Attributes:
        path: the zip file.
        prefix: the folder of the zip holding the Kaggle root (``""`` or ``"top/"``).
        shift: :attr:`~spark_imagenet.source.zip_directory.Directory.shift`.
        train_ids: the chosen classes, wnid to class id.
        val_ids: the validation files of the chosen classes, file name to class id.
    """

    path: str
    prefix: str
    shift: int
    train_ids: dict[str, int]
    val_ids: dict[str, int]


@dataclasses.dataclass(frozen=True)
class ZipPlan:
    """The chosen images of a Kaggle zip, known by their counts, and the slices that list them.

    Attributes:
        choice: what each task needs.
        classes: the chosen classes.
        counts: chosen images per split (``train``, ``val``).
        size: bytes of the chosen images (uncompressed).
        slices: ``(start, stop)`` byte ranges of the central directory, in order.
        selection: the manifest's selection record (as :func:`~spark_imagenet.source.layout.select_images`).
    """

    choice: ZipChoice
    classes: tuple[SynsetClass, ...]
    counts: dict[str, int]
    size: int
    slices: tuple[tuple[int, int], ...]
    selection: dict[str, Any]


class _ValFile(NamedTuple):
    name: str
    size: int


@dataclasses.dataclass
class _Census:
    """What one pass over the directory counts (see the module doc)."""

    folders: set[str] = dataclasses.field(default_factory=set)
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    sizes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    val: list[_ValFile] = dataclasses.field(default_factory=list)
    files: dict[str, DirEntry] = dataclasses.field(default_factory=dict)  # the LOC_* files
    links: list[DirEntry] = dataclasses.field(default_factory=list)
    hashes: array.array = dataclasses.field(default_factory=lambda: array.array("q"))
    slices: list[tuple[int, int]] = dataclasses.field(default_factory=list)


def open_directory(path: str) -> Directory:
    """The zip's central directory.

    Raises:
        ArchiveError: the zip is missing, truncated, damaged or not a zip (the message of
            :func:`open_zip`).
    """
    try:
        return find_directory(path)
    except (ValueError, OSError) as e:
        open_zip(path).close()  # raises the message a user can act on
        raise ArchiveError(f"{path}: cannot read its central directory ({e}); download the archive again") from None


def plan_kaggle_zip(path: str | os.PathLike, *, num_classes: int | None = None, class_list: str | os.PathLike | None = None,
                    seed: int = 0, entries_per_slice: int = ENTRIES_PER_SLICE) -> ZipPlan:
    """Choose the images of a Kaggle zip (current form) without holding its members (see the module doc).

    Args:
        path: the zip.
        num_classes: keep the first K classes (``--classes``).
        class_list: file of wnids to keep (``--class-list``).
        seed: recorded in the selection (no sample is drawn).
        entries_per_slice: directory entries per slice.

    Returns:
        ZipPlan: the chosen images' classes, counts and slices.

    Raises:
        ArchiveError: not a Kaggle zip, damaged, link members, members given twice.
        ConfigError: the older form (its images are inside a nested tar.gz), a bad ``--classes``/``--class-list``.
        LayoutError: as :func:`~spark_imagenet.source.layout.select_images`.
    """
    path = os.path.realpath(os.path.expanduser(os.fspath(path)))
    directory = open_directory(path)
    kz = inspect_names((e.name for _, e in _entries(directory)), path)
    if kz.form == FORM_NESTED:
        raise ConfigError(f"{path} can only be read in order (the older Kaggle zip, whose images are a nested "
                          "tar.gz): shard it without --master, or unpack it first (unzip, then tar -xzf its tar.gz)")
    census = _count(directory, kz.prefix, entries_per_slice)
    refuse_symlinks(path, [(e.name, e.file_size, functools.partial(read_located, path, e.location()))
                           for e in census.links])
    _refuse_duplicates(directory, kz.prefix, census.hashes)

    def where(rel: str) -> str:
        return path if not rel else f"{path} member {kz.prefix}{rel}"

    all_classes = parse_synset_mapping(_read_text(path, census, kz.prefix + MAPPING), where(MAPPING))
    wnids = read_class_list(class_list) if class_list is not None else None
    classes = select_classes(all_classes, num_classes, wnids)
    known = {c.wnid for c in all_classes}
    check_train_folders(where, census.folders, known, classes, census.counts)
    labels = parse_val_solution(io.StringIO(_read_text(path, census, kz.prefix + VAL_CSV), newline=""),
                                where(VAL_CSV), known)
    val = match_val(where, sorted(census.val), labels, classes)
    choice = ZipChoice(path, kz.prefix, directory.shift, {c.wnid: c.id for c in classes},
                       {f.name: c.id for f, c in val})
    counts = {"train": sum(census.counts[c.wnid] for c in classes), "val": len(val)}
    size = sum(census.sizes[c.wnid] for c in classes) + sum(f.size for f, _ in val)
    selection = {"classes": num_classes, "class_list": str(class_list) if class_list is not None else None,
                 "per_class": None, "seed": seed}
    return ZipPlan(choice, classes, counts, size, tuple(census.slices), selection)


def _entries(directory: Directory) -> Iterator[tuple[int, DirEntry]]:
    """The directory's entries from ``start`` to ``stop``, a damaged directory an :class:`ArchiveError`."""
    try:
        yield from iter_entries(directory.path, directory.start, directory.stop, directory.shift)
    except ValueError as e:
        raise ArchiveError(f"{directory.path}: its central directory is damaged ({e}); download the archive again") from None


def _count(directory: Directory, prefix: str, per_slice: int) -> _Census:
    """One pass over the directory: class folders and their images, the validation files, the ``LOC_*``
    files, link members, a hash of every image name, and the slice boundaries."""
    census, count, slice_start = _Census(), 0, directory.start
    for position, entry in _entries(directory):
        if count and count % per_slice == 0:
            census.slices.append((slice_start, position))
            slice_start = position
        count += 1
        if entry.is_link:
            census.links.append(entry)
        name = entry.name
        if not name.startswith(prefix):
            continue
        rel = name[len(prefix):]
        if rel in (MAPPING, VAL_CSV):
            census.files[name] = entry
        elif rel.startswith((_TRAIN, _VAL)) and TREE_RE.match(rel) is not None:
            _count_image(census, rel, entry)
    census.slices.append((slice_start, directory.stop))
    return census


def _count_image(census: _Census, rel: str, entry: DirEntry) -> None:
    """Count one entry under ``train/`` or ``val/`` as the local path's index would see it."""
    if not entry.is_dir:
        census.hashes.append(hash(rel))
    if rel.startswith(_TRAIN):
        parts = rel[len(_TRAIN):].rstrip("/").split("/")
        if (entry.is_dir or len(parts) > 1) and parts[0] and not parts[0].startswith("."):
            census.folders.add(parts[0])
    key = None if entry.is_dir else _image_key(rel)
    if key is None:
        return
    split, name = key
    if split == "train":
        census.counts[name] += 1
        census.sizes[name] += entry.file_size
    else:
        census.val.append(_ValFile(name, entry.file_size))


def _image_key(rel: str) -> tuple[str, str] | None:
    """Whether a file (its name relative to the Kaggle root) is an image the local path lists: ``("train",
    wnid)`` for a non-hidden file directly in a train class folder, ``("val", file name)`` for one directly
    in the val folder, else None. The driver counts and the tasks list by this one rule."""
    if rel.startswith(_TRAIN):
        parts = rel[len(_TRAIN):].split("/")
        if len(parts) == 2 and not parts[1].startswith("."):
            return "train", parts[0]
    elif rel.startswith(_VAL):
        rest = rel[len(_VAL):]
        if "/" not in rest and not rest.startswith("."):
            return "val", rest
    return None


def _read_text(path: str, census: _Census, name: str) -> str:
    """A ``LOC_*`` file's text (:func:`inspect_names` found it)."""
    try:
        return read_located(path, census.files[name].location()).decode("utf-8")
    except (ArchiveError, OSError, UnicodeDecodeError) as e:
        raise damaged(f"{path} member {name}", e) from None


def _refuse_duplicates(directory: Directory, prefix: str, hashes: array.array) -> None:
    """ArchiveError listing the image members given twice (a second pass names them, only when the
    hashes say there are some)."""
    import numpy as np

    ordered = np.sort(np.frombuffer(hashes, dtype=np.int64))
    twice = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not twice:
        return
    seen: set[str] = set()
    duplicates = []
    for _, entry in _entries(directory):
        rel = entry.name[len(prefix):]
        if entry.name.startswith(prefix) and not entry.is_dir and hash(rel) in twice:
            if rel in seen:
                duplicates.append(entry.name)
            seen.add(rel)
    refuse_duplicates(directory.path, duplicates)


def chosen_in_slice(choice: ZipChoice, start: int, stop: int) -> Iterator[tuple[str, int, str, tuple]]:
    """The chosen images of one slice of the directory (on an executor).

    Args:
        choice: the plan's choice.
        start: the slice's first entry (a :attr:`ZipPlan.slices` pair).
        stop: the end of the slice.

    Yields:
        tuple[str, int, str, tuple]: the image's name relative to the Kaggle root, its class id, its
        split (``train`` or ``val``) and its location (for
        :func:`read_located`).

    Raises:
        ArchiveError: the directory is damaged.
    """
    for _, entry in _entries(Directory(choice.path, start, stop, 0, choice.shift)):
        if entry.is_dir or not entry.name.startswith(choice.prefix):
            continue
        rel = entry.name[len(choice.prefix):]
        key = _image_key(rel)
        if key is None:
            continue
        split, name = key
        label = (choice.train_ids if split == "train" else choice.val_ids).get(name)
        if label is not None:
            yield rel, label, split, entry.location()
