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
:func:`spark_imagenet.layout.read_layout` lists a directory (same checks,
same selection, same order, so the same dataset id). How the shard builder
then reads them (:mod:`spark_imagenet.shard`):

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
streaming), refusing unsafe member names and checking free space first.
"""

from __future__ import annotations

import dataclasses
import io
import os
import posixpath
import re
import shutil
import stat
import struct
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple

from .errors import ArchiveError, ConfigError
from .layout import (
    DATA_REL,
    MAPPING,
    VAL_CSV,
    ImageFile,
    SourceDataset,
    check_layout,
    parse_val_solution,
    select_images,
)
from .manifest import SynsetClass
from .synset import parse_synset_mapping

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
        gets the zip's error message) or any file that is a zip archive.
    """
    p = Path(path).expanduser()
    return p.is_file() and (p.suffix.lower() == ".zip" or zipfile.is_zipfile(p))


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
        raise ArchiveError(f"{path} does not exist") from None
    except zipfile.BadZipFile as e:
        size = os.path.getsize(path)
        raise ArchiveError(
            f"{path} is not a complete zip archive ({e}; {size} bytes): the download is truncated or damaged. "
            "Download it again (spark-imagenet download resumes an interrupted download)."
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
    """:class:`spark_imagenet.layout.SourceTree` over a zip (and its nested tar)."""

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
    (:attr:`spark_imagenet.layout.SourceDataset.archive` of a zip source).

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
    :func:`spark_imagenet.layout.read_layout` on the unpacked folder; for
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
            (what is missing is listed), or holds a member twice.
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


# --------------------------------------------------------------------------------------------- extract


def _unsafe(name: str) -> str | None:
    """Why a member name could land outside the destination, or None if it cannot."""
    if "\x00" in name:
        return "a NUL byte in the name"
    n = name.replace("\\", "/")
    if n.startswith("/") or re.match(r"^[A-Za-z]:", n):
        return "an absolute path"
    if ".." in n.split("/"):
        return "a '..' component"
    return None


def _clean(name: str) -> str:
    return "/".join(p for p in name.replace("\\", "/").split("/") if p not in ("", "."))


def _link_problem(link_rel: str, target: str, *, hard: bool) -> str | None:
    """Why a link at ``link_rel`` (relative to the destination) pointing at
    ``target`` would escape the destination, or None."""
    if not target:
        return "a link with an empty target"
    t = target.replace("\\", "/")
    if t.startswith("/") or re.match(r"^[A-Za-z]:", t):
        return f"a {'hard' if hard else 'symbolic'} link to the absolute path {target}"
    joined = posixpath.normpath(t if hard else posixpath.join(posixpath.dirname(link_rel), t))
    if joined == ".." or joined.startswith("../"):
        return f"a {'hard' if hard else 'symbolic'} link to {target}, outside the destination"
    return None


@dataclasses.dataclass
class _Item:
    """One thing :func:`extract` writes: a folder, a file, or a link."""

    rel: str  # relative to the destination
    kind: str  # "dir", "file", "symlink", "hardlink"
    size: int = 0
    target: str = ""  # link target (hard links: relative to the destination)
    member: str = ""  # the zip member's name (zip-level files)


def _free_space_folder(dest: Path) -> Path:
    p = dest
    while not p.exists():
        p = p.parent
    return p


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def extract(
    zip_path: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Unpack the Kaggle zip (either form) into a folder, safely.

    The nested form's tar.gz is unpacked too (streaming), so ``dest`` ends up
    with the unpacked Kaggle layout that ``spark-imagenet shard`` reads.
    Before anything is written, every member name is checked (no absolute
    path, no ``..`` component, no link pointing outside ``dest``, no device
    or FIFO) and the free space of ``dest``'s file system is compared with
    the bytes to write. The nested form costs two passes over its gzip
    stream: one to check names and sum sizes, one to unpack. Files are
    written under a temporary name and renamed when complete; a file already
    there with the member's size is kept, so a rerun after an interruption
    writes only what is missing.

    Args:
        zip_path: the downloaded ``imagenet-object-localization-challenge.zip``.
        dest: the folder to unpack into (created if needed).
        progress: show tqdm bars (bytes) on stderr.
        log: where to print one-line status messages (``None``: stderr).

    Returns:
        Path: the unpacked Kaggle root (``dest``, or ``dest/<top folder>``
        when the zip holds the tree in one top folder).

    Raises:
        ArchiveError: the zip is truncated or damaged, is not a Kaggle
            archive, or holds unsafe members (all listed, nothing written).
        ConfigError: not enough free space (both numbers and the folder are
            in the message), or ``dest`` is a file.
        LayoutError: the unpacked tree is not in the Kaggle layout.
    """
    if log is None:
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    zip_path = os.path.abspath(Path(zip_path).expanduser())
    dest = Path(dest).expanduser().absolute()
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"{dest} is a file; give a folder to unpack {zip_path} into")
    zf = open_zip(zip_path)
    with zf:
        kz = inspect_zip(zf, zip_path)
        items: list[_Item] = []
        unsafe: list[str] = []
        for info in zf.infolist():
            if info.filename == kz.tar_member:
                continue
            why = _unsafe(info.orig_filename)
            if why is not None:
                unsafe.append(f"{info.orig_filename}: {why}")
                continue
            rel = _clean(info.filename)
            if not rel:
                continue
            mode = info.external_attr >> 16
            if info.is_dir():
                items.append(_Item(rel, "dir"))
            elif stat.S_ISLNK(mode):
                target = zf.read(info).decode("utf-8", "replace")
                why = _link_problem(rel, target, hard=False)
                if why is not None:
                    unsafe.append(f"{info.orig_filename}: {why}")
                else:
                    items.append(_Item(rel, "symlink", target=target))
            elif stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):  # 0: no file type recorded (a file)
                unsafe.append(f"{info.orig_filename}: not a regular file, folder or link (mode {oct(mode)})")
            else:
                items.append(_Item(rel, "file", info.file_size, member=info.filename))
        if unsafe:
            raise ArchiveError(
                f"{zip_path}: refused to extract {len(unsafe)} unsafe member(s) (a path or link leading outside "
                f"{dest}, or a special file: zip-slip); nothing was written:{_listing(unsafe)}\n"
                "This is not a genuine Kaggle download."
            )
        source = ZipSource(zip_path, kz.form, kz.prefix, kz.tar_member)
        tar_base = posixpath.dirname(kz.tar_member) if kz.tar_member else ""
        tar_items: list[_Item] = []
        if kz.form == FORM_NESTED:
            log(f"checking {zip_path} member {kz.tar_member} (pass 1 of 2 over the compressed stream)")
            for ti, _tf in source.members(progress=progress, desc="check"):
                why = _unsafe(ti.name)
                rel = _clean(posixpath.join(tar_base, ti.name)) if why is None else ""
                if why is None and ti.issym():
                    why = _link_problem(rel, ti.linkname, hard=False)
                elif why is None and ti.islnk():
                    why = _unsafe(ti.linkname) or _link_problem(rel, ti.linkname, hard=True)
                elif why is None and not (ti.isfile() or ti.isdir()):
                    why = "a device, FIFO or other special file"
                if why is not None:
                    unsafe.append(f"{ti.name}: {why}")
                elif rel:
                    kind = "dir" if ti.isdir() else "symlink" if ti.issym() else "hardlink" if ti.islnk() else "file"
                    target = _clean(posixpath.join(tar_base, ti.linkname)) if kind == "hardlink" else ti.linkname
                    tar_items.append(_Item(rel, kind, ti.size if kind == "file" else 0, target))
            if unsafe:
                raise ArchiveError(
                    f"{zip_path} member {kz.tar_member}: refused to extract {len(unsafe)} unsafe member(s) (a path "
                    f"or link leading outside {dest}, or a special file: tar-slip); nothing was written:"
                    f"{_listing(unsafe)}\nThis is not a genuine Kaggle download."
                )

        def needed(item: _Item) -> int:
            if item.kind != "file":
                return 0
            try:
                return 0 if (dest / item.rel).stat().st_size == item.size else item.size
            except OSError:
                return item.size

        need = sum(map(needed, items)) + sum(map(needed, tar_items))
        folder = _free_space_folder(dest)
        free = shutil.disk_usage(folder).free
        if need > free:
            raise ConfigError(
                f"not enough free space to extract {zip_path}: it needs {need} bytes ({_gib(need)}), "
                f"{folder} has {free} bytes ({_gib(free)}) free. Free some space or choose another folder "
                "(or skip extracting: spark-imagenet shard reads the zip directly)."
            )
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create {dest} ({e.strerror or e}); choose a folder you can write") from None
        real_dest = os.path.realpath(dest)
        bar = _bar(progress, need, "extract")
        written = [0]

        def inside(folder: Path, rel: str) -> None:
            real = os.path.realpath(folder)
            if real != real_dest and not real.startswith(real_dest + os.sep):
                raise ArchiveError(f"{zip_path}: {rel} would be written to {real}, outside {dest} (through a "
                                   "link the archive made); stopped")

        def target_of(rel: str) -> Path:
            """``dest/rel`` once its folder exists and is inside ``dest`` (links followed)."""
            path = dest / rel
            inside(_free_space_folder(path.parent), rel)  # the nearest existing folder, before creating any
            path.parent.mkdir(parents=True, exist_ok=True)
            inside(path.parent, rel)
            return path

        def write(item: _Item, opener: Callable[[], BinaryIO]) -> None:
            try:
                _write(item, opener)
            except OSError as e:
                raise ConfigError(
                    f"cannot write {dest / item.rel} ({e.strerror or e}) while extracting {zip_path}; check the "
                    "folder's permissions and free space, then run again (complete files are kept)"
                ) from None

        def _write(item: _Item, opener: Callable[[], BinaryIO]) -> None:
            path = target_of(item.rel)
            if item.kind == "dir":
                path.mkdir(parents=True, exist_ok=True)
                return
            if item.kind in ("symlink", "hardlink"):
                if path.is_symlink() or path.exists():
                    path.unlink()
                if item.kind == "symlink":
                    os.symlink(item.target, path)
                else:
                    os.link(target_of(item.target), path)
                return
            if needed(item) == 0:
                return
            tmp = path.with_name(f".{path.name}.spark-imagenet-partial")
            try:
                with opener() as src, open(tmp, "wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            written[0] += item.size

        try:
            for item in items:
                try:
                    write(item, lambda: zf.open(item.member))
                except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                    raise ArchiveError(f"{zip_path} member {item.rel} cannot be read ({e}); the zip is damaged: "
                                       "download it again") from None
            if kz.form == FORM_NESTED:
                log(f"unpacking {zip_path} member {kz.tar_member} (pass 2 of 2)")
                by_rel = {i.rel: i for i in tar_items}
                for ti, tf in source.members():
                    item = by_rel.get(_clean(posixpath.join(tar_base, ti.name))) if _unsafe(ti.name) is None else None
                    if item is None:
                        if ti.isfile() or ti.issym() or ti.islnk():
                            raise ArchiveError(f"{zip_path} member {kz.tar_member}: {ti.name} was not there in pass 1; "
                                               "the archive changed while it was read. Run again.")
                        continue
                    try:
                        write(item, lambda: tf.extractfile(ti))
                    except (tarfile.TarError, zlib.error, EOFError) as e:
                        raise source._stream_error(e) from None
        finally:
            if bar is not None:
                bar.close()
    root = dest / kz.prefix if kz.prefix else dest
    check_layout(root)
    log(f"extracted {zip_path} ({kz.form} form, {written[0]} bytes written) to {root}; "
        f"next: spark-imagenet shard {root} --out URL")
    return root
