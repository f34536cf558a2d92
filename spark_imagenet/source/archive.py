"""Reading the Kaggle ImageNet download (one zip) without unpacking it, and unpacking it safely.

The Kaggle competition ``imagenet-object-localization-challenge`` is one zip
(about 155 GiB) in one of two forms, both handled here:

``root`` (the current form)
    ``LOC_synset_mapping.txt``, ``LOC_val_solution.csv`` (and the other two
    ``LOC_*`` files) and ``ILSVRC/`` at the top of the zip, or under one top
    folder (the prefix is detected). Every image is a zip member, so it can
    be read on its own (random access).
``nested-tar`` (the older form)
    the ``LOC_*`` files plus ``imagenet_object_localization_patched2019.tar.gz``,
    which holds ``ILSVRC/``. A gzip stream can only be read from its start,
    in order: the images are read as a stream (:mod:`tarfile` stream mode over
    the zip member), never extracted to disk and never held whole in memory.

:func:`read_zip_layout` lists the images of either form like
:func:`spark_imagenet.source.layout.read_layout` lists a directory (same checks,
same selection, same order, so the same dataset id). How the shard builder
then reads them (:mod:`spark_imagenet.dataset.sharding`):

* ``root``: each worker process reads its shard's members itself, by the
  location the zip's central directory gives (:class:`ZipMemberReader`:
  local header, then the stored or deflated bytes, CRC-32 checked). Workers do
  not open the zip with :class:`zipfile.ZipFile`, which would parse the whole
  central directory in every process (measured: 2.7 s and 260 MB for 400,000
  members, so about 9 s and 0.9 GB per process for full ImageNet).
* ``nested-tar``: **two passes over the gzip stream.** Pass 1 (here, in
  :func:`read_zip_layout`) only lists the members: the plan needs every name
  and size first (the train shuffle, the automatic shard counts). Pass 2
  (:meth:`ZipSource.stream`) yields the planned images in archive order; the
  shard builder hands them to its process pool in batches to be checked and
  encoded, appends each record to a spill file of the shard it is planned
  for (a writer thread), then has the pool put every shard's records into
  plan order (one local copy per shard), so the shards are byte for byte
  those built from the unpacked directory. Cost: the tar.gz is decompressed
  twice, each time by one core (the main process: a few hundred MB/s), and
  all shards are on local disk until the stream ends (the whole selected
  dataset, also with a ``gs://`` ``--out``). Measured on 2 cores
  (``benchmarks/shard_sources.py``, 1,500 real JPEGs): about half the
  images/s of the folder or the current form, listing pass included.

:func:`extract` unpacks either form into a folder (the nested tar.gz too,
streaming). Before it writes anything it refuses unsafe member names, every
link (the Kaggle archive has none), special files, duplicate names, names
too long for the destination's file system, files already there that differ
from their member and that it did not write, and a
lack of free space or inodes; while it writes, a marker in the folder makes
``shard`` refuse it as an interrupted extract. ``shard`` refuses link members
of a zip too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import io
import json
import os
import posixpath
import re
import shlex
import stat
import struct
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple

from spark_imagenet.source.kaggle import PARTIAL_SUFFIX
from spark_imagenet.units import human_size
from spark_imagenet.errors import ArchiveError, ConfigError
from spark_imagenet.source.layout import (
    DATA_REL,
    EXTRACT_MARKER,
    MAPPING,
    VAL_CSV,
    ImageFile,
    SourceDataset,
    check_layout,
    parse_val_solution,
    select_images,
)
from spark_imagenet.source.synset import SynsetClass, parse_synset_mapping

#: The tar.gz member of the older form, holding ``ILSVRC/``.
TAR_MEMBER = "imagenet_object_localization_patched2019.tar.gz"
FORM_ROOT = "root"
FORM_NESTED = "nested-tar"
#: Read size of the tar stream (64 KiB was the fastest of 10 KiB, 64 KiB and 1 MiB).
STREAM_BUFSIZE = 64 * 1024
#: How many offending members an error lists before "... and N more".
MAX_LISTED = 20
_TREE_RE = re.compile(r"^(.*?)ILSVRC/Data/CLS-LOC/(train|val)(/|$)")
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # APPNOTE 4.3.7: local file header, 30 bytes


def _listing(items: list[str]) -> str:
    shown = "".join(f"\n  {p}" for p in items[:MAX_LISTED])
    return shown + (f"\n  ... and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")


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
        raise ArchiveError(
            f"{path} is not a complete zip archive ({e}; {human_size(size)}, {size} bytes): the file is "
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
    """Find the form and the prefix of a Kaggle zip.

    Args:
        zf: the open zip.
        path: its path, for messages.

    Returns:
        KaggleZip: the form and prefix.

    Raises:
        ArchiveError: the zip is not a Kaggle ImageNet archive (the message
            lists what is missing and a few names it does hold), or holds
            several candidate trees.
    """
    names = zf.namelist()
    name_set = set(names)
    prefixes = {p for p in map(_prefix_of, names) if p is not None}
    prefix = "" if "" in prefixes or not prefixes else min(prefixes)
    if len(prefixes) > 1 and "" not in prefixes:
        raise ArchiveError(
            f"{path} holds several folders that look like the Kaggle ImageNet tree ({', '.join(sorted(prefixes))}); "
            "make a zip of one of them, or extract it and pass its folder"
        )
    data = f"{prefix}{DATA_REL}/"
    has = {"train": False, "val": False}
    tars = []
    for n in names:
        if n.startswith(data):
            part = n[len(data):].partition("/")[0]
            if part in has:
                has[part] = True
        elif n.startswith(prefix) and "/" not in n[len(prefix):] and n.endswith((".tar.gz", ".tgz")):
            tars.append(n)
    missing = [prefix + f for f in (MAPPING, VAL_CSV) if prefix + f not in name_set]
    if has["train"] or has["val"]:
        form, tar = FORM_ROOT, None
        missing += [f"{data}{k}/" for k, v in has.items() if not v]
    elif prefix + TAR_MEMBER in name_set or len(tars) == 1:
        form = FORM_NESTED
        tar = prefix + TAR_MEMBER if prefix + TAR_MEMBER in name_set else tars[0]
    else:
        form, tar = FORM_ROOT, None
        missing += [f"{data}train/", f"{data}val/", f"(or instead of both: {prefix}{TAR_MEMBER} holding ILSVRC/)"]
    if missing:
        sample = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "") if names else "nothing"
        raise ArchiveError(
            f"{path} is not the Kaggle imagenet-object-localization-challenge archive; missing:{_listing(missing)}\n"
            f"It holds {len(names)} member(s): {sample}\n"
            f"Expected {MAPPING}, {VAL_CSV} and either ILSVRC/Data/CLS-LOC/train/ and val/ or {TAR_MEMBER} "
            "(holding ILSVRC/), at the top of the zip or in one top folder."
        )
    return KaggleZip(os.path.abspath(path), form, prefix, tar)


class _Entry(NamedTuple):
    """A file of the index: its base name, full member name and size in bytes."""

    name: str
    member: str
    size: int


class _Index:
    """Folders and files under ``ILSVRC/Data/CLS-LOC/{train,val}`` of an
    archive, by name relative to the Kaggle root."""

    def __init__(self) -> None:
        self.subfolders: dict[str, set[str]] = {}
        self.files: dict[str, list[_Entry]] = {}
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
        self.files.setdefault(folder, []).append(_Entry(name, member, size))


class _ArchiveTree:
    """:class:`spark_imagenet.source.layout.SourceTree` over a zip (and its nested tar)."""

    def __init__(self, source: "ZipSource", zf: zipfile.ZipFile, index: _Index):
        self.root = source.path
        self._source = source
        self._zf = zf
        self._index = index

    def where(self, rel: str) -> str:
        if not rel:
            return self._source.path
        if self._source.form == FORM_NESTED and rel.startswith("ILSVRC"):
            return self._source.where_member(self._source.tar_prefix + rel)
        return f"{self._source.path} member {self._source.prefix}{rel}"

    def _open_text(self, rel: str) -> io.TextIOWrapper:
        return io.TextIOWrapper(self._zf.open(self._source.prefix + rel), encoding="utf-8", newline="")

    def _damaged(self, rel: str, e: BaseException) -> ArchiveError:
        return ArchiveError(f"{self.where(rel)} cannot be read ({e}); the zip is damaged: download it again")

    def read_mapping(self) -> tuple[SynsetClass, ...]:
        try:
            with self._open_text(MAPPING) as f:
                text = f.read()
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            raise self._damaged(MAPPING, e) from None
        return parse_synset_mapping(text, self.where(MAPPING))

    def read_val_labels(self, known_wnids: set[str]) -> dict[str, str]:
        try:
            with self._open_text(VAL_CSV) as f:
                return parse_val_solution(f, self.where(VAL_CSV), known_wnids)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            raise self._damaged(VAL_CSV, e) from None

    def folders(self, rel: str) -> set[str]:
        return {f for f in self._index.subfolders.get(rel, ()) if not f.startswith(".")}

    def files(self, rel: str) -> list[_Entry]:
        return sorted((e for e in self._index.files.get(rel, ()) if not e.name.startswith(".")), key=lambda e: e.name)

    def image(self, entry: _Entry, label: int, wnid: str) -> ImageFile:
        return ImageFile(entry.member, label, wnid, entry.size)


class _Counting(io.RawIOBase):
    """A read-only stream that reports how many bytes were read through it."""

    def __init__(self, raw: BinaryIO, report: Callable[[int], None]):
        self._raw = raw
        self._report = report

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._raw.read(len(b))
        b[: len(data)] = data
        self._report(len(data))
        return len(data)


def _bar(progress: bool, total: int, desc: str):
    """A tqdm bar of bytes on stderr, or None."""
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr,
                dynamic_ncols=True)


@dataclasses.dataclass
class ZipSource:
    """Where the images of a zip source are and how to read them
    (:attr:`spark_imagenet.source.layout.SourceDataset.archive` of a zip source).

    Attributes:
        path: the zip file (absolute).
        form: :data:`FORM_ROOT` or :data:`FORM_NESTED`.
        prefix: the zip folder holding the Kaggle root (``""`` or ``"top/"``).
        tar_member: for the nested form, the tar.gz member's name.
        tar_prefix: for the nested form, the folder of the tar holding
            ``ILSVRC/`` (``""``, ``"./"``, ...).
        locations: for the root form, per image member name, where its bytes
            are: ``(header_offset, compress_size, file_size, compress_type,
            CRC-32, flag_bits, original name)``.
    """

    path: str
    form: str
    prefix: str
    tar_member: str | None = None
    tar_prefix: str = ""
    locations: dict[str, tuple] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def streamed(self) -> bool:
        """True when the images can only be read as one stream (the nested form)."""
        return self.form == FORM_NESTED

    def relpath(self, member: str) -> str:
        """A member's name relative to the Kaggle root.

        Args:
            member: an image's member name (:attr:`ImageFile.path`).

        Returns:
            str: e.g. ``ILSVRC/Data/CLS-LOC/train/n01440764/n01440764_18.JPEG``,
            the same as for the unpacked folder (so the dataset id is too).
        """
        return member[len(self.tar_prefix if self.streamed else self.prefix):]

    def where_member(self, member: str) -> str:
        """How messages name an image member.

        Args:
            member: an image's member name (:attr:`ImageFile.path`).

        Returns:
            str: ``<zip> member <name>``, or ``<zip> member <tar.gz> member
            <name>`` for the nested form.
        """
        if self.streamed:
            return f"{self.path} member {self.tar_member} member {member}"
        return f"{self.path} member {member}"

    def describe(self) -> dict[str, Any]:
        """The manifest's ``source`` entry.

        Returns:
            dict[str, Any]: ``{"kind": "kaggle-cls-loc-zip", "path": <zip>,
            "form": "root" | "nested-tar"}``, plus ``"prefix"`` (the top
            folder, when there is one) and ``"member"`` (the tar.gz, nested
            form).
        """
        out: dict[str, Any] = {"kind": "kaggle-cls-loc-zip", "path": self.path, "form": self.form}
        if self.prefix:
            out["prefix"] = self.prefix
        if self.streamed:
            out["member"] = self.tar_member
        return out

    def reader(self, images: tuple[ImageFile, ...]) -> "ZipMemberReader":
        """A reader of some images for a worker process (root form only).

        Args:
            images: the images one worker job reads (one shard's).

        Returns:
            ZipMemberReader: picklable; holds only these members' locations.

        Raises:
            ValueError: the nested form, which is read with :meth:`stream`.
        """
        if self.streamed:
            raise ValueError("the nested-tar form is read with stream(), not by member")
        return ZipMemberReader(self.path, {img.path: self.locations[img.path] for img in images})

    def _open_tar(self, zf: zipfile.ZipFile, report: Callable[[int], None] | None) -> tarfile.TarFile:
        raw: BinaryIO = zf.open(self.tar_member)
        if report is not None:
            raw = io.BufferedReader(_Counting(raw, report), STREAM_BUFSIZE)
        return tarfile.open(fileobj=raw, mode="r|*", bufsize=STREAM_BUFSIZE)

    def _stream_error(self, e: BaseException) -> ArchiveError:
        return ArchiveError(
            f"{self.path} member {self.tar_member} cannot be read ({type(e).__name__}: {e}); the archive is "
            "truncated or damaged: download it again"
        )

    def members(self, *, progress: bool = False,
                desc: str = "read") -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
        """Every member of the nested tar, in archive order (one pass over the stream).

        Args:
            progress: show a tqdm bar of the tar.gz bytes read (stderr).
            desc: the bar's label.

        Yields:
            tuple[tarfile.TarInfo, tarfile.TarFile]: each member, and the tar
            it belongs to (``tar.extractfile(info)`` reads the member's bytes;
            only while it is the current member).

        Raises:
            ArchiveError: the zip or the tar stream is truncated or corrupt.
        """
        zf = open_zip(self.path)
        bar = None
        try:
            info = zf.getinfo(self.tar_member)
            bar = _bar(progress, info.file_size, desc)
            try:
                with self._open_tar(zf, bar.update if bar is not None else None) as tf:
                    while True:
                        ti = tf.next()
                        if ti is None:
                            return
                        tf.members.clear()  # stream mode would keep every TarInfo (1.4M for ImageNet)
                        yield ti, tf
            except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                raise self._stream_error(e) from None
        finally:
            if bar is not None:
                bar.close()
            zf.close()

    def stream(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        """Read the planned images of the nested tar as one stream.

        Stops as soon as every wanted member was read (so a subset of the
        classes does not read the rest of the archive).

        Args:
            wanted: tar member names (:attr:`ImageFile.path`) to read.

        Yields:
            tuple[str, bytes]: member name and bytes, in archive order.

        Raises:
            ArchiveError: the stream is truncated or corrupt, or ends before
                every wanted member was read (the archive changed since it
                was listed).
        """
        left = set(wanted)
        if not left:
            return
        for ti, tf in self.members():
            if ti.isfile() and ti.name in left:
                try:
                    data = tf.extractfile(ti).read()
                except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                    raise self._stream_error(e) from None
                left.discard(ti.name)
                yield ti.name, data
                if not left:
                    return
        raise ArchiveError(
            f"{self.path} member {self.tar_member}: {len(left)} member(s) listed in the first pass were not found "
            f"in the second (e.g. {sorted(left)[0]}); the archive changed while it was read. Run again."
        )


_FD_CACHE: dict[str, int] = {}
_ZIP_CACHE: dict[str, zipfile.ZipFile] = {}


@dataclasses.dataclass(frozen=True)
class ZipMemberReader:
    """Reads members of a zip by their location (in a shard worker process).

    Attributes:
        zip_path: the zip file.
        members: member name to ``(header_offset, compress_size, file_size,
            compress_type, CRC-32, flag_bits, original name)`` as the central
            directory gives them (:attr:`ZipSource.locations`).
    """

    zip_path: str
    members: dict[str, tuple]

    def where(self, name: str) -> str:
        """How messages name a member: ``<zip> member <name>``."""
        return f"{self.zip_path} member {name}"

    def read(self, name: str) -> bytes:
        """The bytes of member ``name``, CRC-32 checked.

        Each process opens the zip once (a file descriptor, read with
        ``os.pread``); stored and deflated members are read directly from
        their local header, other compression methods through
        :class:`zipfile.ZipFile`.

        Args:
            name: a member of :attr:`members`.

        Returns:
            bytes: the member's uncompressed bytes.

        Raises:
            ArchiveError: the local header is missing or names another member,
                the member is encrypted, truncated, or fails its CRC-32 check.
            OSError: the zip cannot be opened or read.
        """
        offset, csize, size, method, crc, flags, orig = self.members[name]
        if flags & 0x1:
            raise ArchiveError("the member is encrypted; the Kaggle archive never is: download it again")
        if method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            zf = _ZIP_CACHE.get(self.zip_path)
            if zf is None:
                zf = _ZIP_CACHE[self.zip_path] = zipfile.ZipFile(self.zip_path)
            try:
                return zf.read(name)
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
                raise ArchiveError(f"{e}; download the archive again") from None
        fd = _FD_CACHE.get(self.zip_path)
        if fd is None:
            fd = _FD_CACHE[self.zip_path] = os.open(self.zip_path, os.O_RDONLY)
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


def read_zip_layout(
    path: str | os.PathLike,
    *,
    num_classes: int | None = None,
    class_list: str | os.PathLike | None = None,
    per_class: int | None = None,
    seed: int = 0,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> SourceDataset:
    """List the labelled images of the Kaggle zip, in either form, without unpacking it.

    The same checks, selection and order as
    :func:`spark_imagenet.source.layout.read_layout` on the unpacked folder; for
    the nested form this is pass 1 of 2 over its tar.gz (see the module doc).

    Args:
        path: the downloaded ``imagenet-object-localization-challenge.zip``.
        num_classes: keep the first K classes (``--classes``).
        class_list: file of wnids to keep (``--class-list``).
        per_class: at most M train images per class (``--per-class``).
        seed: seed of the per-class sample.
        progress: show a tqdm bar while the nested tar.gz is listed (stderr).
        log: where to print one-line status messages (``None``: nowhere).

    Returns:
        SourceDataset: the chosen images; ``root`` is the zip, each
        :attr:`ImageFile.path` a member name (of the zip, or of the nested
        tar), ``archive`` the :class:`ZipSource` to read them with.

    Raises:
        ArchiveError: the zip is truncated, damaged, not a Kaggle archive
            (what is missing is listed), holds an image member twice, or holds
            any symbolic or hard link (the Kaggle archive has none; all listed).
        LayoutError: the tree inside is inconsistent (as for a folder; each
            problem names the zip and the member).
        ConfigError: a bad ``--classes``/``--class-list``/``--per-class``.
    """
    path = os.path.abspath(Path(path).expanduser())
    zf = open_zip(path)
    try:
        kz = inspect_zip(zf, path)
        source = ZipSource(path, kz.form, kz.prefix, kz.tar_member)
        index = _Index()
        links = [f"{info.orig_filename}: {_link_text('symbolic', _zip_link_target(zf, info))}"
                 for info in zf.infolist() if _is_zip_symlink(info)]
        if links:
            raise _links_refused(path, links)
        if kz.form == FORM_ROOT:
            base = kz.prefix
            for info in zf.infolist():
                n = info.filename
                if not n.startswith(base):
                    continue
                rel = n[len(base):]
                if not rel.startswith(DATA_REL + "/"):
                    continue
                if _TREE_RE.match(rel) is None:
                    continue
                if info.is_dir():
                    index.add_dir(rel)
                else:
                    index.add_file(rel, n, info.file_size)
                    source.locations[n] = (info.header_offset, info.compress_size, info.file_size,
                                           info.compress_type, info.CRC, info.flag_bits, info.orig_filename)
        else:
            if log is not None:
                log(f"listing {path} member {kz.tar_member} (pass 1 of 2 over the compressed stream; the images "
                    "are read in pass 2)")
            tar_prefix = None
            for ti, _tf in source.members(progress=progress, desc="list"):
                if ti.issym() or ti.islnk():
                    links.append(f"{ti.name}: {_link_text('symbolic' if ti.issym() else 'hard', ti.linkname)}")
                    continue
                m = _TREE_RE.match(ti.name)
                if m is None or not (ti.isfile() or ti.isdir()):
                    continue
                if tar_prefix is None:
                    tar_prefix = m.group(1)
                elif m.group(1) != tar_prefix:
                    raise ArchiveError(
                        f"{source.where_member(ti.name)}: a second ILSVRC/ tree in the tar (the first is under "
                        f"{tar_prefix or 'its top level'}); the archive is not the Kaggle download"
                    )
                rel = ti.name[len(tar_prefix):]
                if ti.isdir():
                    index.add_dir(rel)
                else:
                    index.add_file(rel, ti.name, ti.size)
            if links:
                raise _links_refused(f"{path} member {kz.tar_member}", links)
            source.tar_prefix = tar_prefix or ""
            missing = [f"{DATA_REL}/{k}/" for k in ("train", "val") if k not in index.subfolders.get(DATA_REL, ())]
            if missing:
                raise ArchiveError(
                    f"{path} member {kz.tar_member} is not the ImageNet tar of the Kaggle archive; missing:"
                    f"{_listing(missing)}"
                )
        if index.duplicates:
            raise ArchiveError(
                f"{path} holds {len(index.duplicates)} image member(s) twice (which copy is meant?):"
                f"{_listing(index.duplicates)}\nDownload the archive again."
            )
        return select_images(_ArchiveTree(source, zf, index), num_classes=num_classes, class_list=class_list,
                             per_class=per_class, seed=seed, archive=source)
    finally:
        zf.close()


def _is_zip_symlink(info: zipfile.ZipInfo) -> bool:
    """Whether a zip member is a symbolic link (Unix mode in the high 16 bits of its external attributes)."""
    return stat.S_ISLNK(info.external_attr >> 16)


def _zip_link_target(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    """A zip symlink's target (the member's data), for messages."""
    if info.file_size > 4096:
        return f"<{info.file_size} bytes>"
    try:
        return zf.read(info).decode("utf-8", "replace")
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as e:
        return f"<unreadable: {e}>"


def _link_text(kind: str, target: str) -> str:
    """How a refusal names a link member: its kind, its target and what is wrong with the target."""
    t = target.replace("\\", "/")
    if t.startswith("/") or re.match(r"^[A-Za-z]:", t):
        return f"a {kind} link to {target}: the link target is an absolute path"
    if ".." in t.split("/"):
        return f"a {kind} link to {target}: the link target has a '..' component"
    return f"a {kind} link to {target}"


def _links_refused(where: str, links: list[str]) -> ArchiveError:
    return ArchiveError(
        f"{where} holds {len(links)} link member(s) (symbolic or hard links); the Kaggle archive has none, so "
        f"this is not a genuine Kaggle download and is refused:{_listing(links)}\n"
        "Download the archive again from Kaggle (spark-imagenet download)."
    )


# --------------------------------------------------------------------------------------------- extract


#: The list of the files :func:`extract` wrote, kept in its folder (also once it completed): gzip members
#: of ``<relative name>\n`` lines. Each name is appended (compressed, then a zlib sync flush, so that
#: every name written so far can be decompressed) and handed to the operating system before its file is
#: renamed to its final name: a file under its final name is always listed, even if the process is
#: killed (SIGKILL) at any point. Measured: 15 MB for 1.33 M ImageNet image names (75 MB as plain text).
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
            if seen_name == name and kind == seen_kind == "file" and _TREE_RE.match(name):
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
            f"{_listing(self.refused)}" + "".join("\n" + n for n in [" ".join(notes)] if n) + genuine
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
    bar = _bar(progress and bool(same_size), sum(i.size for i in same_size), "verify")
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
        members = _Members()
        for info in zf.infolist():
            mode = info.external_attr >> 16
            if info.filename == kz.tar_member:
                why = _unsafe(info.orig_filename)
                if why is not None:
                    members.refuse("path", info.orig_filename, why)
            elif stat.S_ISLNK(mode):
                members.refuse("link", info.orig_filename, _link_text("symbolic", _zip_link_target(zf, info)))
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
            raise members.error(zip_path, dest, "zip-slip")
        source = ZipSource(zip_path, kz.form, kz.prefix, kz.tar_member)
        tar_base = posixpath.dirname(kz.tar_member) if kz.tar_member else ""
        if kz.form == FORM_NESTED:
            log(f"checking {zip_path} member {kz.tar_member} (pass 1 of 2 over the compressed stream)")
            for ti, tf in source.members(progress=progress, desc="check"):
                if ti.issym() or ti.islnk():
                    members.refuse("link", ti.name, _link_text("symbolic" if ti.issym() else "hard", ti.linkname))
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
                        raise source._stream_error(e) from None
                    members.add(ti.name, "file", base=tar_base, size=ti.size, crc=crc)
        members.check(dest, limits)
        if members.refused:
            where = zip_path if kz.form == FORM_ROOT else f"{zip_path} member {kz.tar_member}"
            raise members.error(where, dest, "zip-slip" if kz.form == FORM_ROOT else "tar-slip")
        items, tar_items = members.items[:zip_count], members.items[zip_count:]

        conflicts = _plan(members.items, dest, overwrite, progress, log)
        if conflicts:
            raise ConfigError(
                f"{dest} already holds {len(conflicts)} file(s) or folder(s) that differ from {zip_path}'s members "
                f"and that spark-imagenet extract did not write; nothing was written:{_listing(conflicts)}\n"
                "Move them away, or pass --overwrite to replace the differing files with the archive's "
                "(folders in the way of a file are never removed)."
            )
        to_write = [i for i in members.items if i.kind == "file" and i.action != "keep"]
        _check_free_space(zip_path, dest, members.items, to_write)

        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create {dest} ({e.strerror or e}); choose a folder you can write") from None
        real_dest = os.path.realpath(dest)
        need = sum(i.size for i in to_write)
        written = [0]

        def inside(folder: Path, rel: str) -> None:
            real = os.path.realpath(folder)
            if real != real_dest and not real.startswith(real_dest + os.sep):
                raise ArchiveError(f"{zip_path}: {rel} would be written to {real}, outside {dest} (through a "
                                   f"link already in {dest}); stopped")

        def folder(path: Path, rel: str) -> None:
            """Create the folder ``path`` (for ``rel``), checking that it is inside ``dest`` (links followed)."""
            inside(_free_space_folder(path), rel)  # the nearest existing folder, before creating any
            path.mkdir(parents=True, exist_ok=True)
            inside(path, rel)

        def target_of(rel: str) -> Path:
            """``dest/rel`` once its folder exists and is inside ``dest``."""
            path = dest / rel
            folder(path.parent, rel)
            return path

        def cannot_write(path: Path, e: OSError) -> ConfigError:
            hint = ("check the length of its name and path" if e.errno == errno.ENAMETOOLONG else
                    "check the folder's permissions and free space")
            return ConfigError(
                f"cannot write {path} ({e.strerror or e}) while extracting {zip_path}; {hint}, then rerun "
                f"`spark-imagenet extract {shlex.quote(zip_path)} "
                f"{shlex.quote(str(dest))}` (it keeps the files already written)"
            )

        markers = [EXTRACT_MARKER] + ([f"{kz.prefix}{EXTRACT_MARKER}"] if kz.prefix else [])
        note = json.dumps({"zip": zip_path, "dest": str(dest)})
        try:
            for rel in markers:
                target_of(rel).write_text(note + "\n", encoding="utf-8")
            for item in members.items:
                if item.kind == "dir":
                    folder(dest / item.rel, item.rel)
        except OSError as e:
            raise cannot_write(dest / markers[0], e) from None
        written_list = _WrittenList(dest / WRITTEN_LIST)
        bar = _bar(progress, need, "extract")

        def write(item: _Item, opener: Callable[[], BinaryIO], where: str) -> None:
            path = dest / item.rel
            try:
                path = target_of(item.rel)
                tmp = path.with_name(_partial_name(path.name, limits[0]))
                crc = got = 0
                try:
                    with opener() as src, open(tmp, "wb") as out:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)
                            crc = zlib.crc32(chunk, crc)
                            got += len(chunk)
                            if bar is not None:
                                bar.update(len(chunk))
                    if got != item.size:
                        raise ArchiveError(f"{where}: {got} bytes read where the archive declares {item.size}; the "
                                           "archive is damaged: download it again")
                    if crc != item.crc:
                        raise ArchiveError(f"{where}: its bytes changed since they were checked (CRC-32 {crc:08x}, "
                                           f"then {item.crc:08x}); the archive changed while it was read. Run again.")
                    try:  # listed first: a file under its final name is always in the list, even after a kill
                        written_list.add(item.rel)
                    except OSError as e:
                        raise cannot_write(written_list.path, e) from None
                    os.replace(tmp, path)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
            except OSError as e:
                raise cannot_write(path, e) from None
            written[0] += item.size

        try:
            for item in items:
                if item.kind != "file" or item.action == "keep":
                    continue
                try:
                    write(item, lambda: zf.open(item.info), f"{zip_path} member {item.info.orig_filename}")
                except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError) as e:
                    raise ArchiveError(f"{zip_path} member {item.info.orig_filename} cannot be read ({e}); the zip "
                                       "is damaged: download it again") from None
            left = {i.rel: i for i in tar_items if i.kind == "file" and i.action != "keep"}
            if left:
                log(f"unpacking {zip_path} member {kz.tar_member} (pass 2 of 2)")
                known = {i.rel for i in tar_items}
                for ti, tf in source.members():
                    rel = _clean(posixpath.join(tar_base, ti.name)) if _unsafe(ti.name) is None else None
                    if rel not in known:
                        if ti.isfile() or ti.issym() or ti.islnk() or rel is None:
                            raise ArchiveError(f"{zip_path} member {kz.tar_member}: {ti.name} was not there in pass "
                                               "1; the archive changed while it was read. Run again.")
                        continue
                    item = left.pop(rel, None)
                    if item is None:
                        continue
                    try:
                        write(item, lambda: tf.extractfile(ti), source.where_member(ti.name))
                    except (tarfile.TarError, zlib.error, EOFError) as e:
                        raise source._stream_error(e) from None
                    if not left:
                        break
                if left:
                    raise ArchiveError(f"{zip_path} member {kz.tar_member}: {len(left)} file(s) of pass 1 were not "
                                       f"found in pass 2 (e.g. {sorted(left)[0]}); the archive changed while it was "
                                       "read. Run again.")
        finally:
            if bar is not None:
                bar.close()
            with contextlib.suppress(OSError):  # a full disk: the error that stopped the extract says more
                written_list.close()  # (a kill leaves its last member without a trailer: the next run mends it)
        for rel in reversed(markers):
            (dest / rel).unlink(missing_ok=True)
    root = dest / kz.prefix if kz.prefix else dest
    check_layout(root)
    kept = sum(1 for i in members.items if i.kind == "file" and i.action == "keep")
    log(f"extracted {zip_path} ({kz.form} form, {human_size(written[0])} written in {len(to_write)} file(s), "
        f"{kept} file(s) already there kept) to {root}; next: spark-imagenet shard {root} --out URL")
    return root


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
