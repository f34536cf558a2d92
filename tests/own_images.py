"""Test helpers: small trees of one's own images (class folders, generated with Pillow) and labels files."""

from __future__ import annotations

import binascii
import io
import json
import struct
import zlib
from pathlib import Path

from PIL import Image


def image_bytes(k: int, fmt: str = "JPEG", size: tuple[int, int] = (24, 18)) -> bytes:
    """A small distinct image (its colour from ``k``) in ``fmt``."""
    buf = io.BytesIO()
    Image.new("RGB", size, ((37 * k) % 256, (11 * k) % 256, (91 * k) % 256)).save(buf, fmt)
    return buf.getvalue()


def huge_png(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` RGB pixels, in a few dozen bytes (one tiny IDAT chunk: it
    does not decode, and nothing of its size is ever allocated here). For checks that read only the header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", binascii.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
            + chunk(b"IEND", b""))


def class_tree(root: Path, classes: dict[str, int], *, start: int = 0, png_every: int = 0) -> Path:
    """``root/<class>/<class>_<i>.jpg`` with ``classes[name]`` images per class (every ``png_every``-th a
    ``.png``, 0: none). Returns ``root``."""
    k = start
    for name, count in classes.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            png = png_every and i % png_every == png_every - 1
            (folder / f"{name}_{i}.{'png' if png else 'jpg'}").write_bytes(image_bytes(k, "PNG" if png else "JPEG"))
            k += 1
    return root


def write_labels(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` as a CSV, JSON Lines or Parquet file (from ``path``'s ending). Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        columns = list(rows[0])
        path.write_text(",".join(columns) + "\n"
                        + "".join(",".join("" if r.get(c) is None else str(r[c]) for c in columns) + "\n" for r in rows))
    return path
