"""Test helpers: the Kaggle zip in its two forms, built from a small generated tree, and what the
tests of the zip and the tar stream share."""

from __future__ import annotations

import io
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from data_util import small_layout
from record_util import read_records
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.source.zip_archive import TAR_MEMBER


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


DATA = ("ILSVRC", "Data", "CLS-LOC")
QUIET = dict(processes=2, progress=False)


def build(source, out, **kw):
    kw.setdefault("train_shards", 3)
    kw.setdefault("val_shards", 2)
    return shard(source, out, **QUIET, **kw)


def decoded(out: Path, manifest) -> dict[str, list[dict]]:
    """Per split, every record of every shard decoded, in shard and record order."""
    result = {}
    for split, info in manifest.splits.items():
        records = []
        for s in info.shards:
            with open(out / s.name, "rb") as f:
                records += [parse_example(r) for r in read_records(f)]
        result[split] = records
    return result


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory):  # imported by the test modules that use it
    """One small tree (val images, LOC_val_solution.csv, test images) and its two zip forms."""
    base = tmp_path_factory.mktemp("archive")
    tree = small_layout(base / "kaggle", num_classes=4, train_per_class=6, val_per_class=3)
    return {
        "tree": tree,
        "root": zip_root_form(tree, base / "root.zip"),  # deflated members
        "top": zip_root_form(tree, base / "top.zip", prefix="imagenet-object-localization-challenge/",
                             compression=zipfile.ZIP_STORED, folders=True),
        "nested": zip_nested_form(tree, base / "nested.zip"),
        # the tar as `tar czf x.tar.gz .` names it, the zip's content in a top folder
        "nested-top": zip_nested_form(tree, base / "nested-top.zip", prefix="top/",
                                      tar_bytes=tar_gz_of(tree, top="./ILSVRC")),
    }


def valid_zip_with(tmp_path: Path, name: str, extra: dict[str, bytes], **info) -> Path:
    tree = small_layout(tmp_path / f"kaggle-{name}", num_classes=2, train_per_class=1, val_per_class=1)
    z = zip_root_form(tree, tmp_path / f"{name}.zip")
    with zipfile.ZipFile(z, "a") as zf:
        for member, data in extra.items():
            zi = zipfile.ZipInfo(member)
            for k, v in info.items():
                setattr(zi, k, v)
            zf.writestr(zi, data)
    return z


LINK = (stat.S_IFLNK | 0o777) << 16  # a zip member's external_attr for a symbolic link


def zip_with_links(tmp_path: Path, name: str, links: dict[str, str]) -> Path:
    z = valid_zip_with(tmp_path, name, {})
    with zipfile.ZipFile(z, "a") as zf:
        for member, target in links.items():
            zi = zipfile.ZipInfo(member)
            zi.external_attr = LINK
            zf.writestr(zi, target)
    return z


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_imagenet", *args], capture_output=True, text=True, timeout=300)


