"""The unpacked Kaggle folder as an image source (spark_imagenet.source.folder), and open_source."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from archive_util import zip_nested_form, zip_root_form
from data_util import small_layout
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.errors import ArchiveError, LayoutError
from spark_imagenet.source import open_source
from spark_imagenet.source.folder import FileReader, FolderSource
from spark_imagenet.source.tar_stream import TarStreamSource
from spark_imagenet.source.zip_archive import ZipSource


@pytest.fixture
def tree(tmp_path):
    return small_layout(tmp_path / "data" / "kaggle", num_classes=3, train_per_class=4, val_per_class=2)


def test_open_source_picks_the_kind(tree, tmp_path):
    assert isinstance(open_source(tree), FolderSource)
    assert isinstance(open_source(zip_root_form(tree, tmp_path / "root.zip")), ZipSource)
    assert isinstance(open_source(zip_nested_form(tree, tmp_path / "nested.zip")), TarStreamSource)
    with pytest.raises(LayoutError, match="not in the Kaggle ILSVRC CLS-LOC layout"):
        open_source(tmp_path)
    with pytest.raises(ArchiveError, match="does not exist"):
        open_source(tmp_path / "missing.zip")


def test_folder_source_lists_names_and_reads_its_images(tree):
    source = FolderSource.open(tree)
    assert source.random_access and source.describe() == {"kind": "kaggle-cls-loc-dir", "path": str(tree)}
    src = source.list_images(num_classes=2)
    assert src.source is source and src.root == str(tree) and len(src.train) == 8 and len(src.val) == 4
    image = src.train[0]
    assert src.relpath(image) == f"ILSVRC/Data/CLS-LOC/train/{image.wnid}/{image.filename}"
    assert src.where(image) == image.path == str(tree.joinpath(src.relpath(image)))
    reader = pickle.loads(pickle.dumps(source.reader(src.train)))  # what a worker process gets
    assert isinstance(reader, FileReader) and reader.read(image) == open(image.path, "rb").read()
    streamed = list(source.stream(src.val))
    assert [img for img, _ in streamed] == list(src.val)
    assert all(data == open(img.path, "rb").read() for img, data in streamed)


def test_the_source_path_is_resolved(tree, tmp_path, monkeypatch):
    """The path as given (``..``, a relative path, a symbolic link) is resolved, in the source and the manifest."""
    os.symlink(tree, tmp_path / "link")
    monkeypatch.chdir(tmp_path / "data")
    spellings = [tmp_path / "data" / ".." / "data" / "kaggle", "kaggle", tmp_path / "link"]
    for given in spellings:
        assert FolderSource.open(given).path == str(tree.resolve())
    kw = dict(train_shards=2, val_shards=1, processes=1, progress=False)
    out = tmp_path / "out"
    first = shard(spellings[0], out, **kw)
    assert first.source == {"kind": "kaggle-cls-loc-dir", "path": str(tree.resolve())}
    assert json.loads((out / "manifest.json").read_text())["source"]["path"] == str(tree.resolve())
    # The dataset id does not depend on how the path is written: a rerun by another spelling does nothing.
    mtime = (out / "manifest.json").stat().st_mtime_ns
    for given in spellings[1:]:
        assert shard(given, out, **kw) == first
    assert (out / "manifest.json").stat().st_mtime_ns == mtime


def test_zip_source_path_is_resolved(tree, tmp_path, monkeypatch):
    z = zip_root_form(tree, tmp_path / "root.zip")
    os.symlink(z, tmp_path / "link.zip")
    monkeypatch.chdir(tmp_path / "data")
    for given in ("../root.zip", tmp_path / "data" / ".." / "root.zip", tmp_path / "link.zip"):
        assert open_source(given).path == str(z.resolve())
    m = shard("../link.zip", tmp_path / "out", train_shards=2, val_shards=1, processes=1, progress=False)
    assert m.source == {"kind": "kaggle-cls-loc-zip", "path": str(z.resolve()), "form": "root"}
