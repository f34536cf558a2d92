"""The older Kaggle zip form as an image source (spark_imagenet.source.tar_stream): pass 1 lists the
nested tar.gz, pass 2 streams the chosen images in archive order and stops once it has them all."""

from __future__ import annotations

import io
import pickle
import tarfile

import pytest

from archive_util import tar_gz_of, zip_nested_form, zip_root_form
from data_util import small_layout
from spark_imagenet.errors import ArchiveError
from spark_imagenet.source import open_source
from spark_imagenet.source.folder import FolderSource
from spark_imagenet.source.tar_stream import TarStreamSource
from spark_imagenet.source.zip_archive import TAR_MEMBER, ZipMemberReader, ZipSource


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return small_layout(tmp_path_factory.mktemp("tar") / "kaggle", num_classes=3, train_per_class=4, val_per_class=2)


def test_listing_is_the_folder_listing_named_inside_the_tar(tree, tmp_path):
    z = zip_nested_form(tree, tmp_path / "nested.zip", prefix="top/", tar_bytes=tar_gz_of(tree, top="./ILSVRC"))
    source = open_source(z)
    assert isinstance(source, TarStreamSource) and not source.random_access
    src = source.list_images(per_class=3, seed=5)
    ref = FolderSource.open(tree).list_images(per_class=3, seed=5)
    assert source.tar_prefix == "./"
    assert [src.relpath(i) for i in src.train + src.val] == [ref.relpath(i) for i in ref.train + ref.val]
    image = src.train[0]
    assert image.path == "./" + src.relpath(image)
    assert src.where(image) == f"{z} member top/{TAR_MEMBER} member {image.path}"
    assert source.describe() == {"kind": "kaggle-cls-loc-zip", "path": str(z), "form": "nested-tar",
                                 "prefix": "top/", "member": f"top/{TAR_MEMBER}"}
    with pytest.raises(TypeError, match="can only be read in order"):
        source.reader(src.train)


def test_stream_yields_the_wanted_images_in_archive_order_with_their_bytes(tree, tmp_path):
    source = open_source(zip_nested_form(tree, tmp_path / "nested.zip"))
    src = source.list_images()
    wanted = list(reversed(src.val)) + [src.train[5]]
    got = list(source.stream(wanted))
    assert sorted(img.path for img, _ in got) == sorted(img.path for img in wanted)
    assert [img.path for img, _ in got] == sorted(img.path for img in wanted)  # the tar holds them by name
    for img, data in got:
        assert data == tree.joinpath(src.relpath(img)).read_bytes()
    assert list(source.stream([])) == []


def test_stream_of_an_image_the_tar_does_not_hold(tree, tmp_path):
    source = open_source(zip_nested_form(tree, tmp_path / "nested.zip"))
    src = source.list_images()
    gone = src.train[0].__class__("ILSVRC/Data/CLS-LOC/train/n90000000/missing.JPEG", 0, "n90000000", 1)
    with pytest.raises(ArchiveError, match=r"1 member\(s\) listed in the first pass were not found in the second"):
        list(source.stream([src.train[0], gone]))


def test_a_tar_without_train_or_val_and_a_damaged_stream(tree, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(tree / "ILSVRC" / "Data" / "CLS-LOC" / "train", "ILSVRC/Data/CLS-LOC/train")
    source = open_source(zip_nested_form(tree, tmp_path / "noval.zip", tar_bytes=buf.getvalue()))
    with pytest.raises(ArchiveError, match=r"is not the ImageNet tar of the Kaggle archive; missing:\n  "
                                           r"ILSVRC/Data/CLS-LOC/val/"):
        source.list_images()
    data = tar_gz_of(tree)
    source = open_source(zip_nested_form(tree, tmp_path / "cut.zip", tar_bytes=data[: len(data) // 2]))
    with pytest.raises(ArchiveError, match=r"cannot be read \(.*\); the archive is truncated or damaged"):
        source.list_images()


def test_the_current_form_reads_each_member_by_its_location(tree, tmp_path):
    """For comparison: the zip's current form has random access through a picklable reader."""
    z = zip_root_form(tree, tmp_path / "root.zip")
    source = open_source(z)
    assert isinstance(source, ZipSource) and source.random_access
    src = source.list_images()
    reader = pickle.loads(pickle.dumps(source.reader(src.val)))
    assert isinstance(reader, ZipMemberReader) and set(reader.members) == {i.path for i in src.val}
    for img in src.val:
        assert reader.read(img) == tree.joinpath(src.relpath(img)).read_bytes()
        assert reader.where(img) == src.where(img) == f"{z} member {img.path}"
    assert [img for img, _ in source.stream(src.val)] == list(src.val)
