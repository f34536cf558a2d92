"""Test helper: the records of a TFRecord file, read back with both CRCs checked (the package only writes them)."""

from __future__ import annotations

import struct
from typing import BinaryIO

from spark_imagenet.dataset.tfrecord import masked_crc32c


def read_records(f: BinaryIO):
    """Iterate over the payloads of a TFRecord file, checking both CRCs.

    Args:
        f: file opened for binary reading.

    Yields:
        bytes: each record's payload.

    Raises:
        ValueError: a truncated record or a CRC mismatch (with its offset).
    """
    offset = 0
    while True:
        header = f.read(12)
        if not header:
            return
        if len(header) < 12:
            raise ValueError(f"truncated record header at byte {offset}")
        (length,) = struct.unpack("<Q", header[:8])
        (crc,) = struct.unpack("<I", header[8:])
        if crc != masked_crc32c(header[:8]):
            raise ValueError(f"corrupt length CRC at byte {offset}")
        data = f.read(length)
        footer = f.read(4)
        if len(data) < length or len(footer) < 4:
            raise ValueError(f"truncated record at byte {offset}")
        if struct.unpack("<I", footer)[0] != masked_crc32c(data):
            raise ValueError(f"corrupt data CRC in the record at byte {offset}")
        offset += 16 + length
        yield data
