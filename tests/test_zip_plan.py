"""The Kaggle zip planned for a Spark job from its streamed central directory (source/zip_directory.py,
source/zip_archive.py): the same entries as zipfile, the same images and the same layout messages as the local
path's listing, slices that cover the directory once."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from archive_util import kaggle, valid_zip_with, zip_with_links  # noqa: F401
from spark_imagenet.errors import ArchiveError, ConfigError, LayoutError
from spark_imagenet.source import open_zip_source
from spark_imagenet.source.zip_directory import find_directory, iter_entries
from spark_imagenet.source.zip_archive import chosen_in_slice, plan_kaggle_zip

CLS = "ILSVRC/Data/CLS-LOC"


@pytest.mark.parametrize("zip64,prepended", [(False, b""), (True, b""), (False, b"#!/bin/sh\nexit 0\n")])
def test_the_streamed_directory_matches_zipfile_in_any_slice(tmp_path, monkeypatch, zip64, prepended):
    """Every entry (name, local header offset, sizes, CRC-32, method) as zipfile reads it, Zip64 extras and
    data prepended to the zip included, read in blocks smaller than an entry; any entry boundary splits the
    listing without losing or repeating an entry."""
    import spark_imagenet.source.zip_directory as zd

    monkeypatch.setattr(zd, "BLOCK_BYTES", 50)
    path = tmp_path / "a.zip"
    with open(path, "wb") as raw:
        raw.write(prepended)
        with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for i in range(40):
                name = f"train/ü{i % 3}/x{i}.JPEG" if i % 7 else f"folder{i}/"
                with zf.open(name, "w", force_zip64=zip64) as f:
                    f.write(os.urandom(i * 10))
    d = find_directory(path)
    listed = list(iter_entries(path, d.start, d.stop, d.shift))
    reference = zipfile.ZipFile(path).infolist()
    assert d.entries == len(listed) == len(reference) == 40
    assert [(e.name, e.offset, e.compress_size, e.file_size, e.crc, e.method, e.is_dir) for _, e in listed] == \
        [(r.orig_filename, r.header_offset, r.compress_size, r.file_size, r.CRC, r.compress_type, r.is_dir())
         for r in reference]
    cut = listed[17][0]
    halves = list(iter_entries(path, d.start, cut, d.shift)) + list(iter_entries(path, cut, d.stop, d.shift))
    assert halves == listed


def test_not_a_directory_entry_is_a_value_error(tmp_path):
    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a.txt", b"x")
    d = find_directory(path)
    with pytest.raises(ValueError, match="no central directory entry"):
        list(iter_entries(path, d.start + 1, d.stop))


def chosen(plan) -> set[tuple[str, int, str]]:
    return {(rel, label, split) for start, stop in plan.slices
            for rel, label, split, _ in chosen_in_slice(plan.choice, start, stop)}


@pytest.mark.parametrize("form", ["root", "top"])
@pytest.mark.parametrize("options", [{}, {"num_classes": 2}, {"class_list": "list"}])
def test_the_plan_chooses_what_list_images_chooses(kaggle, tmp_path, form, options):
    """Classes, class ids, counts per split, bytes and every (image, label, split) equal the local path's
    listing of the same zip, with the directory cut into slices of 7 entries."""
    if "class_list" in options:
        (tmp_path / "list").write_text("n90000003\nn90000001\n")
        options = {"class_list": tmp_path / "list"}
    plan = plan_kaggle_zip(kaggle[form], entries_per_slice=7, **options)
    source = open_zip_source(kaggle[form])
    ds = source.list_images(**options)

    assert plan.classes == ds.classes
    assert plan.counts == {"train": len(ds.train), "val": len(ds.val)}
    assert plan.size == sum(i.size for i in ds.train + ds.val)
    assert chosen(plan) == {(source.relpath(i), i.label, split) for split, images in (("train", ds.train),
                                                                                      ("val", ds.val))
                            for i in images}
    d = find_directory(kaggle[form])
    assert plan.slices[0][0] == d.start and plan.slices[-1][1] == d.stop
    assert all(a[1] == b[0] for a, b in zip(plan.slices, plan.slices[1:]))
    assert len(plan.slices) == -(-d.entries // 7)
    assert plan.selection == {**ds.selection, "per_class": None}


@pytest.mark.parametrize("extra,expected", [
    ({f"{CLS}/train/n99999999/x.JPEG": b"x"}, "folder is not a class of LOC_synset_mapping.txt"),
    ({f"{CLS}/val/ILSVRC2012_val_09999999.JPEG": b"x"}, "no row for ILSVRC2012_val_09999999 in"),
])
def test_a_bad_layout_gets_the_local_paths_message(tmp_path, extra, expected):
    z = valid_zip_with(tmp_path, "bad", extra)
    with pytest.raises(LayoutError) as local:
        open_zip_source(z).list_images()
    with pytest.raises(LayoutError) as planned:
        plan_kaggle_zip(z)
    assert expected in str(planned.value) and str(planned.value) == str(local.value)


def test_links_and_images_given_twice_are_refused_as_by_the_local_path(tmp_path):
    image = f"{CLS}/train/n90000000/n90000000_9.JPEG"
    z = zip_with_links(tmp_path, "links", {image: "n90000000_1.JPEG"})
    with pytest.raises(ArchiveError) as planned:
        plan_kaggle_zip(z)
    with pytest.raises(ArchiveError) as local:
        open_zip_source(z).list_images()
    assert str(planned.value) == str(local.value) and "a symbolic link to n90000000_1.JPEG" in str(planned.value)

    z = valid_zip_with(tmp_path, "twice", {})
    member = next(n for n in zipfile.ZipFile(z).namelist() if "/train/" in n and n.endswith(".JPEG"))
    with pytest.warns(UserWarning), zipfile.ZipFile(z, "a") as zf:
        zf.writestr(member, b"again")
    with pytest.raises(ArchiveError, match=r"holds 1 image member\(s\) twice") as planned:
        plan_kaggle_zip(z)
    assert f"\n  {member}\n" in str(planned.value)


def test_what_is_not_a_current_kaggle_zip_is_refused(kaggle, tmp_path):
    with pytest.raises(ConfigError, match="can only be read in order .* shard it without --master"):
        plan_kaggle_zip(kaggle["nested"])
    truncated = tmp_path / "cut.zip"
    truncated.write_bytes(Path(kaggle["root"]).read_bytes()[:-30])
    with pytest.raises(ArchiveError) as planned:
        plan_kaggle_zip(truncated)
    with pytest.raises(ArchiveError) as local:
        open_zip_source(truncated)
    assert str(planned.value) == str(local.value)
    with pytest.raises(ArchiveError, match="is not the Kaggle imagenet-object-localization-challenge archive; missing"):
        plan_kaggle_zip(_zip_of(tmp_path / "other.zip", {"a.txt": b"x"}))


def _zip_of(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.mark.slow
def test_the_plans_memory_does_not_grow_with_the_members(tmp_path, monkeypatch):
    """Planning a zip of 40,000 train members allocates under a tenth of what listing it for the local path
    does (Python allocations, tracemalloc): the plan keeps counts per class, not members. The directory is
    read in blocks of 256 KiB here, smaller than this zip's 3.5 MB directory as 4 MiB is than ImageNet's."""
    import tracemalloc

    import spark_imagenet.source.zip_directory as zd

    monkeypatch.setattr(zd, "BLOCK_BYTES", 256 << 10)
    z = valid_zip_with(tmp_path, "many", {f"{CLS}/train/n9000000{i % 2}/n9000000{i % 2}_x{i}.JPEG": b"x"
                                          for i in range(40_000)})

    def peak(call) -> int:
        tracemalloc.start()
        try:
            result = call()
            return tracemalloc.get_traced_memory()[1], result
        finally:
            tracemalloc.stop()

    planned, plan = peak(lambda: plan_kaggle_zip(z))
    listed, ds = peak(lambda: open_zip_source(z).list_images())
    assert plan.counts == {"train": len(ds.train), "val": len(ds.val)} and plan.counts["train"] == 40_002
    assert planned * 10 < listed, (planned, listed)
