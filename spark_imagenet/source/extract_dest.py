"""The destination folder of :func:`spark_imagenet.source.extract.extract`: what extract keeps there.

Besides the archive's members, an extract leaves its own bookkeeping in the folder: the list of the files it
wrote (:data:`WRITTEN_LIST`, read and appended by :class:`WrittenList`), by which a rerun after any
interruption, even SIGKILL, tells its own files from someone else's; and, while a file is written, its
temporary name (:func:`partial_name`). These names are refused as member names (:data:`OWN_NAMES`).
:func:`nearest_existing` finds the folder whose file system (free space, name limits) an extract reads
before ``dest`` exists.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from spark_imagenet.errors import ConfigError
from spark_imagenet.source.layout import EXTRACT_MARKER

#: The list of the files :func:`~spark_imagenet.source.extract.extract` wrote, kept in its folder (also
#: once it completed): gzip members of ``<relative name>\n`` lines. Each name is appended (compressed,
#: then a zlib sync flush, so that every name written so far can be decompressed) and handed to the
#: operating system before its file is renamed to its final name: a file under its final name is always
#: listed, even if the process is killed (SIGKILL) at any point (docs/design.md, 'The Kaggle archive').
#: A rerun rewrites a file that differs from its member only when it is listed here; any other
#: differing file is someone else's, refused unless ``overwrite``.
WRITTEN_LIST = ".spark-imagenet-extract-written.gz"
#: The temporary name under which a run rewrites :data:`WRITTEN_LIST` left incomplete by a killed run.
WRITTEN_TMP = WRITTEN_LIST + ".spark-imagenet-partial"
#: The suffix of the temporary name a file is written under before it is renamed.
PARTIAL_FILE_SUFFIX = ".spark-imagenet-partial"
#: Names :func:`~spark_imagenet.source.extract.extract` keeps for itself, refused as member names.
OWN_NAMES = frozenset({EXTRACT_MARKER, WRITTEN_LIST, WRITTEN_TMP})
#: Bytes read or written at a time.
CHUNK = 1 << 20


def partial_name(name: str, name_max: int) -> str:
    """The temporary name the file ``name`` is written under before it is renamed: ``.NAME.spark-imagenet-partial``,
    or ``.<CRC-32 of NAME>.spark-imagenet-partial`` where that is over the file system's NAME_MAX."""
    tmp = f".{name}{PARTIAL_FILE_SUFFIX}"
    if len(os.fsencode(tmp)) <= name_max:
        return tmp
    return f".{zlib.crc32(os.fsencode(name)):08x}{PARTIAL_FILE_SUFFIX}"


def nearest_existing(dest: Path) -> Path:
    """``dest`` or its nearest ancestor that exists (where its free space and limits are read)."""
    p = dest
    while not p.exists():
        p = p.parent
    return p


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
