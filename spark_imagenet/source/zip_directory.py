"""A zip's central directory read as a stream of entries, in bounded memory.

:class:`zipfile.ZipFile` parses the whole central directory into one :class:`zipfile.ZipInfo` per member when it
opens a zip, memory that grows with the members (docs/design.md, 'Sharding a DataFrame as a Spark job'). When a
zip is sharded as a Spark job, neither the driver nor an executor may hold that. This module reads the directory
(APPNOTE 4.3.12 to 4.3.16, with the Zip64 forms of 4.3.14, 4.3.15 and 4.5.3) in blocks and yields one small
:class:`DirEntry` at a time, from any entry boundary to another, so a Spark task can list its own slice of the
directory.

What it does not read: encrypted directories, multi-disk archives. :func:`find_directory` says so as a
``ValueError``; the caller turns that into a message a user can act on (``zip_archive.open_zip`` does,
for every zip :mod:`zipfile` refuses too).

Example::

    >>> import shutil
    >>> path = shutil.make_archive("imagenet-object-localization-challenge", "zip", "/data/kaggle")
    >>> directory = find_directory(path)
    >>> entries = [entry for position, entry in iter_entries(directory.path, directory.start, directory.stop)]
    >>> len(entries) > 0
    True
"""

from __future__ import annotations

import os
import stat
import struct
from typing import Iterator, NamedTuple

#: End of central directory record (APPNOTE 4.3.16), 22 bytes before its comment.
_END = struct.Struct("<4s4H2LH")
#: Zip64 end of central directory locator (4.3.15), 20 bytes.
_END64_LOCATOR = struct.Struct("<4sLQL")
#: Zip64 end of central directory record (4.3.14), its first 56 bytes.
_END64 = struct.Struct("<4sQ2H2L4Q")
#: Central directory file header (4.3.12), 46 bytes before name, extra field and comment.
_ENTRY = struct.Struct("<4s6H3L5H2L")
#: Bytes read at once from the directory.
BLOCK_BYTES = 4 << 20
_MAX_COMMENT = 0xFFFF


class DirEntry(NamedTuple):
    """One member as the central directory gives it.

    Attributes:
        name: the member name (UTF-8 when its flag says so, else code page 437, as :mod:`zipfile`).
        offset: byte offset of its local file header in the file.
        compress_size: bytes stored.
        file_size: bytes once inflated.
        method: compression method (0 stored, 8 deflated).
        crc: CRC-32 of the inflated bytes.
        flags: general purpose bit flags (bit 0: encrypted).
        mode: the Unix mode bits from the external attributes (0 when the zip gives none).
    """

    name: str
    offset: int
    compress_size: int
    file_size: int
    method: int
    crc: int
    flags: int
    mode: int

    @property
    def is_dir(self) -> bool:
        """Whether the entry is a folder (its name ends with ``/``)."""
        return self.name.endswith("/")

    @property
    def is_link(self) -> bool:
        """Whether the entry is a symbolic link (Unix mode)."""
        return stat.S_ISLNK(self.mode)

    def location(self) -> tuple:
        """Where its bytes are, in the form :class:`~spark_imagenet.source.zip_archive.ZipMemberReader`
        reads: ``(offset, compress_size, file_size, method, crc, flags, name)``."""
        return (self.offset, self.compress_size, self.file_size, self.method, self.crc, self.flags, self.name)


class Directory(NamedTuple):
    """Where a zip's central directory is.

    Attributes:
        path: the zip file.
        start: byte offset of the first entry.
        stop: byte offset just past the last entry.
        entries: how many entries the end record announces.
        shift: bytes to add to every local header offset (data prepended to the zip, as :mod:`zipfile`
            allows).
    """

    path: str
    start: int
    stop: int
    entries: int
    shift: int


def find_directory(path: str | os.PathLike) -> Directory:
    """Find the central directory from the end records.

    Args:
        path: the zip file.

    Returns:
        Directory: where the entries are.

    Raises:
        ValueError: no end record, a multi-disk archive, or a directory outside the file.
        OSError: the file cannot be read.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        tail_start = max(0, size - _END.size - _MAX_COMMENT)
        f.seek(tail_start)
        tail = f.read()
        at = _end_record_at(tail)
        (_, disk, cd_disk, _, entries, cd_size, cd_offset, _) = _END.unpack_from(tail, at)
        end_at = tail_start + at
        if disk != 0 or cd_disk != 0:
            raise ValueError("a multi-disk (split) archive")
        if end_at >= _END64_LOCATOR.size:
            f.seek(end_at - _END64_LOCATOR.size)
            locator = _END64_LOCATOR.unpack(f.read(_END64_LOCATOR.size))
            if locator[0] == b"PK\x06\x07":
                end_at, entries, cd_size, cd_offset = _zip64_end(f, end_at - _END64_LOCATOR.size)
    start = end_at - cd_size
    if start < 0 or cd_offset > start:
        raise ValueError("the central directory lies outside the file")
    return Directory(path, start, end_at, entries, start - cd_offset)


def _end_record_at(tail: bytes) -> int:
    """Where in ``tail`` (the file's last bytes) the end record is whose comment runs to the end."""
    at = tail.rfind(b"PK\x05\x06")
    while at >= 0:
        if at + _END.size <= len(tail) and at + _END.size + _END.unpack_from(tail, at)[-1] == len(tail):
            return at
        at = tail.rfind(b"PK\x05\x06", 0, at)
    raise ValueError("no end of central directory record")


def _zip64_end(f, locator_at: int) -> tuple[int, int, int, int]:
    """``(record position, entries, directory size, directory offset)`` from the Zip64 end record, found
    just before the locator at ``locator_at`` (not where the locator says: prepended data shifts that)."""
    record_at = locator_at - _END64.size
    f.seek(record_at)
    record = f.read(_END64.size)
    if len(record) < _END64.size or record[:4] != b"PK\x06\x06":
        raise ValueError("no Zip64 end of central directory record")
    fields = _END64.unpack(record)
    if fields[4] != 0 or fields[5] != 0:
        raise ValueError("a multi-disk (split) archive")
    return record_at, fields[7], fields[8], fields[9]


def iter_entries(path: str | os.PathLike, start: int, stop: int, shift: int = 0) -> Iterator[tuple[int, DirEntry]]:
    """The entries of a slice of the central directory, in order, read in blocks of :data:`BLOCK_BYTES`.

    Args:
        path: the zip file.
        start: byte offset of an entry (:attr:`Directory.start`, or a position this function yielded).
        stop: byte offset of a later entry boundary (:attr:`Directory.stop`, or a position yielded).
        shift: :attr:`Directory.shift`.

    Yields:
        tuple[int, DirEntry]: each entry's byte offset in the file, and the entry.

    Raises:
        ValueError: bytes that are not a directory entry, or an entry running past ``stop``.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        f.seek(start)
        buffer, base, pos = b"", start, 0  # buffer holds file bytes [base, base + len(buffer))
        while base + pos < stop:
            if len(buffer) - pos < _ENTRY.size or len(buffer) - pos < _entry_length(buffer, pos):
                more = f.read(min(BLOCK_BYTES, stop - base - len(buffer)))
                if not more:
                    raise ValueError(f"a directory entry at byte {base + pos} runs past the directory's end")
                buffer, base, pos = buffer[pos:] + more, base + pos, 0
                continue
            entry = _parse_entry(buffer, pos, shift)
            yield base + pos, entry
            pos += _entry_length(buffer, pos)


def _entry_length(buffer: bytes, pos: int) -> int:
    """The full length of the entry at ``pos`` (0 when its fixed part is not all in ``buffer``)."""
    if len(buffer) - pos < _ENTRY.size:
        return 0
    name_len, extra_len, comment_len = struct.unpack_from("<3H", buffer, pos + 28)
    return _ENTRY.size + name_len + extra_len + comment_len


def _parse_entry(buffer: bytes, pos: int, shift: int) -> DirEntry:
    """The entry at ``pos`` (all of it in ``buffer``)."""
    (sig, _, _, flags, method, _, _, crc, csize, size, name_len, extra_len, _, _, _, attrs,
     offset) = _ENTRY.unpack_from(buffer, pos)
    if sig != b"PK\x01\x02":
        raise ValueError(f"no central directory entry at this position (found {sig!r})")
    at = pos + _ENTRY.size
    raw = buffer[at:at + name_len]
    name = raw.decode("utf-8") if flags & 0x800 else raw.decode("cp437")
    if 0xFFFFFFFF in (size, csize, offset):
        size, csize, offset = _zip64_fields(buffer[at + name_len:at + name_len + extra_len], size, csize, offset)
    return DirEntry(name, offset + shift, csize, size, method, crc, flags, attrs >> 16)


def _zip64_fields(extra: bytes, size: int, csize: int, offset: int) -> tuple[int, int, int]:
    """The 64-bit sizes and offset of the Zip64 extra field (id 1), for the fields the entry marks."""
    at = 0
    while at + 4 <= len(extra):
        kind, length = struct.unpack_from("<2H", extra, at)
        if kind == 1:
            values = list(struct.unpack_from(f"<{min(length, len(extra) - at - 4) // 8}Q", extra, at + 4))
            if sum(v == 0xFFFFFFFF for v in (size, csize, offset)) > len(values):
                raise ValueError("an entry's Zip64 extra field is too short")
            if size == 0xFFFFFFFF:
                size = values.pop(0)
            if csize == 0xFFFFFFFF:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF:
                offset = values.pop(0)
            return size, csize, offset
        at += 4 + length
    raise ValueError("an entry marks Zip64 sizes but has no Zip64 extra field")
