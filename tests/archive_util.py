"""Test helpers: the Kaggle zip in its two forms, built from a small generated tree."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

from spark_imagenet.source.archive import TAR_MEMBER


def tree_files(tree: Path) -> list[Path]:
    """Every file under ``tree``, sorted by relative name."""
    return sorted((p for p in tree.rglob("*") if p.is_file()), key=lambda p: p.relative_to(tree).as_posix())


def zip_root_form(tree: Path, path: Path, *, prefix: str = "", compression: int = zipfile.ZIP_DEFLATED,
                  folders: bool = False) -> Path:
    """The current form: ``LOC_*`` files and ``ILSVRC/`` at the zip's root (or under ``prefix``),
    with folder entries when ``folders``."""
    with zipfile.ZipFile(path, "w", compression) as zf:
        if folders:
            for d in sorted(p for p in tree.rglob("*") if p.is_dir()):
                zf.write(d, prefix + d.relative_to(tree).as_posix())
        for p in tree_files(tree):
            zf.write(p, prefix + p.relative_to(tree).as_posix())
    return path


def tar_gz_of(tree: Path, *, extra: list[tuple[tarfile.TarInfo, bytes]] = (), top: str = "ILSVRC") -> bytes:
    """``ILSVRC/`` of ``tree`` as a tar.gz named ``top`` (folders included, as ``tar czf`` writes them;
    ``top="./ILSVRC"`` gives the names of ``tar czf x.tar.gz .``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(tree / "ILSVRC", top)
        for info, data in extra:
            tf.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


def zip_nested_form(tree: Path, path: Path, *, tar_bytes: bytes | None = None, prefix: str = "") -> Path:
    """The older form: the four ``LOC_*`` files plus the tar.gz holding ``ILSVRC/`` (under ``prefix``)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(tree.glob("LOC_*")):
            zf.write(p, prefix + p.name)
        zf.writestr(zipfile.ZipInfo(prefix + TAR_MEMBER), tar_bytes if tar_bytes is not None else tar_gz_of(tree),
                    compress_type=zipfile.ZIP_STORED)
    return path


def parse_example(record: bytes) -> dict:
    """Decode a serialized ``tf.train.Example`` without TensorFlow (protobuf wire format:
    Example{1: Features{1: map entry{1: key, 2: Feature{1: BytesList{1: bytes}, 3: Int64List{1: packed}}}}})."""

    def varint(buf: bytes, i: int) -> tuple[int, int]:
        shift = value = 0
        while True:
            b = buf[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value, i

    def fields(buf: bytes):
        i = 0
        while i < len(buf):
            key, i = varint(buf, i)
            assert key & 7 == 2, "only length-delimited fields are expected"
            n, i = varint(buf, i)
            yield key >> 3, buf[i:i + n]
            i += n

    out = {}
    for _, features in fields(record):
        for _, entry in fields(features):
            kv = dict(fields(entry))
            (kind, payload), = fields(kv[2])
            if kind == 1:
                out[kv[1].decode()] = [v for _, v in fields(payload)][0]
            else:
                (_, packed), = fields(payload)
                out[kv[1].decode()] = varint(packed, 0)[0]
    return out
