"""Identical images (the same bytes twice) found by the local builder across shards and splits, for each source kind
(Kaggle folder and nested zip, class folders, a labels file), reported in quality-report.json and the log, never
failing the build; and the driver's digest table itself (groups, what is left out, its memory)."""

from __future__ import annotations

import json
import shutil
import tracemalloc

import numpy as np
import pytest

from archive_util import zip_nested_form
from data_util import small_layout
from own_images import class_tree, image_bytes, write_labels
from spark_imagenet.dataset.duplicates import DIGEST_SIZE, MAX_FILES, MAX_GROUPS, NO_DIGEST, DigestTable, digest
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.source import open_labels

DATA = ("ILSVRC", "Data", "CLS-LOC")
QUIET = {"processes": 2, "progress": False}
TRAIN = "ILSVRC/Data/CLS-LOC/train/"
VAL = "ILSVRC/Data/CLS-LOC/val/"


def report_of(out) -> dict:
    return json.loads((out / QUALITY_REPORT_NAME).read_text())


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory):
    """A Kaggle tree (3 classes x 6 train, 2 val each) where one train image is copied into another class and
    over a val image (the leak), and a second train image is copied within its class; plus its nested-zip form."""
    base = tmp_path_factory.mktemp("dups")
    tree = small_layout(base / "src", num_classes=3, train_per_class=6, val_per_class=2)
    train, val = tree.joinpath(*DATA, "train"), tree.joinpath(*DATA, "val")
    first = (train / "n90000000" / "n90000000_1.JPEG").read_bytes()
    (train / "n90000001" / "n90000001_3.JPEG").write_bytes(first)  # another class
    (val / "ILSVRC2012_val_00000004.JPEG").write_bytes(first)  # a val image also in train
    shutil.copy(train / "n90000002" / "n90000002_2.JPEG", train / "n90000002" / "n90000002_5.JPEG")
    return tree, zip_nested_form(tree, base / "nested.zip")


def test_kaggle_copies_across_shards_and_splits_are_reported(kaggle, tmp_path, log_lines):
    tree, _ = kaggle
    out = tmp_path / "out"
    manifest = shard(tree, out, train_shards=3, val_shards=2, **QUIET)
    assert manifest.splits["train"].examples == 18 and manifest.splits["val"].examples == 6  # all kept
    report = report_of(out)
    assert report["duplicate_totals"] == {"groups": 2, "images": 5, "train+val": 1}
    leak, within = report["duplicates"]
    assert leak == {"split": "train+val", "count": 3,
                    "files": [TRAIN + "n90000000/n90000000_1.JPEG", TRAIN + "n90000001/n90000001_3.JPEG",
                              VAL + "ILSVRC2012_val_00000004.JPEG"],
                    "classes": ["n90000000", "n90000001", "n90000000"], "splits": ["train", "train", "val"]}
    assert within == {"split": "train", "count": 2,
                      "files": [TRAIN + "n90000002/n90000002_2.JPEG", TRAIN + "n90000002/n90000002_5.JPEG"],
                      "classes": ["n90000002"] * 2, "splits": ["train"] * 2}
    assert manifest.selection["quality"]["train"]["examples"] == 18  # the manifest says nothing new
    assert "duplicates" not in manifest.selection
    assert any(line.startswith("identical images (the same bytes twice): 2 group(s) of 5 images, all kept")
               for line in log_lines)
    assert any("1 group(s) hold the same image in train and in val: those validation images are also trained on"
               in line for line in log_lines)
    assert f"  train+val: 3 copies: {', '.join(leak['files'])} (different classes!)" in log_lines
    assert f"  train: 2 copies: {', '.join(within['files'])}" in log_lines

    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert shard(tree, out, train_shards=3, val_shards=2, **QUIET) == manifest  # a rerun: nothing read or written
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_the_stream_form_finds_the_same(kaggle, tmp_path):
    tree, nested = kaggle
    shard(tree, tmp_path / "folder", train_shards=3, val_shards=2, **QUIET)
    shard(nested, tmp_path / "stream", train_shards=3, val_shards=2, **QUIET)
    folder, stream = report_of(tmp_path / "folder"), report_of(tmp_path / "stream")
    assert stream["duplicates"] == folder["duplicates"] and stream["duplicate_totals"]["groups"] == 2


def test_class_folders_within_train_and_train_vs_val(tmp_path, log_lines):
    root = tmp_path / "t"
    class_tree(root / "train", {"a": 4, "b": 4})
    class_tree(root / "val", {"a": 2, "b": 2}, start=50)
    (root / "train" / "a" / "a_copy.jpg").write_bytes((root / "train" / "a" / "a_1.jpg").read_bytes())
    (root / "val" / "b" / "b_0.jpg").write_bytes((root / "train" / "b" / "b_2.jpg").read_bytes())
    out = tmp_path / "out"
    shard(root, out, train_shards=2, val_shards=1, **QUIET)
    report = report_of(out)
    assert [(d["split"], d["files"]) for d in report["duplicates"]] == [
        ("train+val", ["train/b/b_2.jpg", "val/b/b_0.jpg"]), ("train", ["train/a/a_1.jpg", "train/a/a_copy.jpg"])]
    assert report["duplicate_totals"] == {"groups": 2, "images": 4, "train+val": 1}
    assert not any("different classes" in line for line in log_lines)


def test_a_labels_file_and_a_drawn_split(tmp_path):
    """A labels file without a split column: the seeded split (seed 4) puts one copy in train, one in val."""
    class_tree(tmp_path / "img", {"cat": 6, "dog": 6})
    (tmp_path / "img" / "dog" / "dog_copy.jpg").write_bytes(image_bytes(0))  # the bytes of cat_0.jpg
    rows = [{"path": p.relative_to(tmp_path).as_posix(), "label": p.parent.name}
            for p in sorted((tmp_path / "img").rglob("*.jpg"))]
    source = open_labels(write_labels(tmp_path / "labels.csv", rows), val_fraction=0.3)
    shard(source, tmp_path / "out", train_shards=2, val_shards=1, seed=4, **QUIET)
    assert report_of(tmp_path / "out")["duplicates"] == [
        {"split": "train+val", "count": 2, "files": ["img/cat/cat_0.jpg", "img/dog/dog_copy.jpg"],
         "classes": ["cat", "dog"], "splits": ["train", "val"]}]


def test_unusable_copies_are_skipped_not_grouped(tmp_path):
    tree = small_layout(tmp_path / "src", num_classes=2, train_per_class=4, val_per_class=1)
    for name in ("n90000000_1.JPEG", "n90000000_2.JPEG"):
        tree.joinpath(*DATA, "train", "n90000000", name).write_bytes(b"")
    shard(tree, tmp_path / "out", train_shards=2, val_shards=1, on_corrupt="skip", **QUIET)
    report = report_of(tmp_path / "out")
    assert report["splits"]["train"]["skipped"] == 2 and report["duplicates"] == []
    assert report["duplicate_totals"] == {"groups": 0, "images": 0, "train+val": 0}


def test_digest_table_groups_limits_and_memory():
    n = 200_000
    rng = np.random.default_rng(0)
    table = DigestTable({"train-0": n // 2, "train-1": n // 2 - 2, "val-0": 2})
    splits = ["train", "train", "val"]
    table.put("train-0", rng.bytes(DIGEST_SIZE * (n // 2)))
    table.put("train-1", rng.bytes(DIGEST_SIZE * (n // 2 - 2)))
    same = digest(b"placeholder")
    for k in range(0, 2 * MAX_FILES, 2):  # one image in many copies
        table.put("train-1", same, k)
    table.put("val-0", same + NO_DIGEST)  # a val copy, and an image without a digest
    table.put("train-0", NO_DIGEST * 3, 10)  # more without one: never a group
    tracemalloc.start()
    found = table.find(lambda s, k: (splits[s], f"{s}/{k:06d}", "c"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert (found.found, found.images, found.across) == (1, MAX_FILES + 1, 1)
    (group,) = found.groups
    assert group.count == MAX_FILES + 1 and len(group.files) == MAX_FILES and group.splits[-1] == "train"
    assert group.files[0] == "1/000000" and not group.mixed
    assert peak / n < 45, f"{peak / n:.1f} bytes per image while finding groups"  # beside the 16 held


def test_the_report_lists_at_most_max_groups_and_counts_all():
    from spark_imagenet.dataset.duplicates import Duplicate, Duplicates

    groups = [Duplicate.of([("val", f"v{i:05d}", "c"), ("val", f"w{i:05d}", "c")]) for i in range(MAX_GROUPS + 5)]
    groups.append(Duplicate.of([("val", "x", "c"), ("train", "y", "d")]))
    found = Duplicates.of(iter(groups))
    assert (found.found, found.images, found.across) == (MAX_GROUPS + 6, 2 * MAX_GROUPS + 12, 1)
    assert len(found.groups) == MAX_GROUPS and found.groups[0].split == "train+val" and found.groups[0].mixed
    assert found.groups[0].files == ("y", "x") and found.groups[1].files == ("v00000", "w00000")
