"""A class-per-folder tree of one's own images: detection beside the Kaggle layout, class ids in Keras' order,
the seeded stratified split, shards read back, bad trees refused before anything is written."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys

import pytest

from archive_util import decoded, zip_root_form
from data_util import small_layout
from own_images import class_tree, image_bytes, write_labels
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.errors import ConfigError, LayoutError
from spark_imagenet.source import open_source
from spark_imagenet.source.class_folders import ClassFolderSource
from spark_imagenet.source.folder import FolderSource
from spark_imagenet.source.labelled import split_by_fraction

QUIET = {"processes": 1, "progress": False}
#: Names whose sorted order differs from the order they are made in (upper case sorts first, as in Keras).
NAMES = {"zebra": 5, "Ant": 4, "cat": 6, "b_2": 3, "b 1": 4}


def test_class_ids_are_the_sorted_folder_names(tmp_path):
    source = open_source(class_tree(tmp_path / "t", NAMES))
    assert isinstance(source, ClassFolderSource)
    src = source.list_images()
    assert [c.wnid for c in src.classes] == sorted(NAMES) == ["Ant", "b 1", "b_2", "cat", "zebra"]
    assert [c.names for c in src.classes] == [(n,) for n in sorted(NAMES)]
    for img in src.train + src.val:
        assert img.wnid == src.classes[img.label].wnid == os.path.basename(os.path.dirname(img.path))
    assert src.selection == {"classes": None, "class_list": None, "per_class": None, "seed": 0, "val_fraction": 0.1}
    assert source.describe() == {"kind": "class-folders", "path": str(tmp_path / "t"), "layout": "one-folder"}


def test_the_split_is_stratified_seeded_and_per_file_name(tmp_path):
    root = class_tree(tmp_path / "t", {"a": 10, "b": 20, "c": 1})
    src = open_source(root, val_fraction=0.2).list_images(seed=3)
    per_class = collections.Counter(i.wnid for i in src.val)
    assert per_class == {"a": 2, "b": 4}  # round(0.2 * n); a class of one image stays in train
    assert len(src.train) == 31 - 6 and src.selection["val_fraction"] == 0.2
    again = open_source(root, val_fraction=0.2).list_images(seed=3)
    assert again.val == src.val and again.train == src.train
    other = open_source(root, val_fraction=0.2).list_images(seed=4)
    assert {i.path for i in other.val} != {i.path for i in src.val}
    # another class's files change nothing in this one's split
    class_tree(tmp_path / "t", {"d": 7}, start=100)
    more = open_source(root, val_fraction=0.2).list_images(seed=3)
    assert [i.path for i in more.val if i.wnid != "d"] == [i.path for i in src.val]
    # a tiny class still gets one validation image, and keeps one for training
    assert collections.Counter(e.split for e in split_by_fraction(src_entries(2), 0.01, 0)) == {"train": 1, "val": 1}
    assert collections.Counter(e.split for e in split_by_fraction(src_entries(3), 0.99, 0)) == {"train": 1, "val": 2}


def src_entries(n):
    from spark_imagenet.source.labelled import Entry

    return [Entry(f"/x/{i}.jpg", f"x/{i}.jpg", "x", 1) for i in range(n)]


def test_shard_a_class_tree_and_read_it_back(tmp_path):
    root = class_tree(tmp_path / "t", {"dog": 6, "cat": 6, "bird": 6}, png_every=3)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "cat" / ".hidden.jpg").write_bytes(b"")
    (root / "bird" / "more").mkdir()
    (root / "bird" / "more" / "deep.JPEG").write_bytes(image_bytes(99))  # nested and upper case: an image (Keras)
    out = tmp_path / "shards"
    manifest = shard(root, out, train_shards=3, val_shards=1, val_fraction=0.2, **QUIET)
    data = json.loads((out / "manifest.json").read_text())
    assert data["classes"] == [{"id": 0, "wnid": "bird", "names": ["bird"]}, {"id": 1, "wnid": "cat", "names": ["cat"]},
                               {"id": 2, "wnid": "dog", "names": ["dog"]}]
    assert data["source"] == {"kind": "class-folders", "path": str(root), "layout": "one-folder"}
    assert data["selection"]["val_fraction"] == 0.2 and data["totals"]["examples"] == 19
    examples = decoded(out, manifest)
    assert len(examples["train"]) == 16 and len(examples["val"]) == 3  # round(0.2 * 7) = round(0.2 * 6) = 1 per class
    names = ["bird", "cat", "dog"]
    for ex in examples["train"] + examples["val"]:
        assert names[ex["image/class/label"]] == ex["image/class/synset"].decode()
        assert ex["image/encoded"][:2] == b"\xff\xd8" and ex["image/format"] == b"JPEG"  # the PNGs were repaired
    assert "deep.JPEG" in {ex["image/filename"].decode() for split in examples.values() for ex in split}
    report = json.loads((out / QUALITY_REPORT_NAME).read_text())
    repaired = {f["file"] for f in report["files"] if f["action"] == "repaired"}
    assert repaired == {f"{c}/{c}_{i}.png" for c in ("dog", "cat", "bird") for i in (2, 5)}
    assert shard(root, out, train_shards=3, val_shards=1, val_fraction=0.2, **QUIET) == manifest  # rerun: nothing new


def test_train_and_val_folders_are_the_split(tmp_path):
    class_tree(tmp_path / "t" / "train", {"b": 4, "a": 5})
    class_tree(tmp_path / "t" / "val", {"a": 2, "b": 1}, start=50)
    (tmp_path / "t" / "test").mkdir()  # another folder beside them is not read
    source = open_source(tmp_path / "t")
    src = source.list_images()
    assert [c.wnid for c in src.classes] == ["a", "b"] and len(src.train) == 9 and len(src.val) == 3
    assert all("/val/" in i.path for i in src.val) and src.selection["val_fraction"] is None
    assert [source.relpath(i) for i in src.val] == ["val/a/a_0.jpg", "val/a/a_1.jpg", "val/b/b_0.jpg"]
    assert source.describe()["layout"] == "train-val"
    with pytest.raises(ConfigError, match="holds this tree's validation images") as e:
        open_source(tmp_path / "t", val_fraction=0.2)
    assert (e.value.key, e.value.value) == ("--val-fraction", 0.2)
    shutil.rmtree(tmp_path / "t" / "val")  # train/ alone: split with the fraction
    src = open_source(tmp_path / "t").list_images()
    assert [c.wnid for c in src.classes] == ["a", "b"] and len(src.train) + len(src.val) == 9 and len(src.val) == 2


def test_the_kaggle_layout_keeps_priority(tmp_path):
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=2, val_per_class=1)
    assert isinstance(open_source(tree), FolderSource)
    for source in (tree, zip_root_form(tree, tmp_path / "root.zip")):
        with pytest.raises(ConfigError, match="is the Kaggle ImageNet download") as e:
            open_source(source, val_fraction=0.1)
        assert (e.value.key, e.value.value) == ("--val-fraction", 0.1)
    (tree / "LOC_val_solution.csv").unlink()  # a broken Kaggle tree is still reported as one
    with pytest.raises(LayoutError, match="not in the Kaggle ILSVRC CLS-LOC layout; missing:"):
        open_source(tree)


def test_bad_trees_are_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    root = class_tree(tmp_path / "t", {"a": 3, "b": 3})
    (root / "empty").mkdir()
    (root / "c").mkdir()
    (root / "c" / "readme.txt").write_text("x")
    (root / "stray.jpg").write_bytes(image_bytes(1))
    with pytest.raises(LayoutError) as e:
        shard(root, out, **QUIET)
    msg = str(e.value)
    assert f"{root}/c/: class folder with no images" in msg and f"{root}/empty/: class folder with no images" in msg
    assert f"{root}/: 1 image(s) in no class folder (stray.jpg); move them into their class folder" in msg
    assert not out.exists()

    loose = tmp_path / "loose"
    loose.mkdir()
    for k in range(5):
        (loose / f"{k}.jpg").write_bytes(image_bytes(k))
    with pytest.raises(LayoutError) as e:
        shard(loose, out, **QUIET)
    assert "not in the Kaggle ILSVRC CLS-LOC layout" in str(e.value)
    assert "Nor is it a class-folder tree (its 5 image(s) (0.jpg, 1.jpg, 2.jpg, ...) lie loose at the top: move them " \
           "into one sub-folder per class)" in str(e.value) and "--labels" in str(e.value)
    (tmp_path / "nothing" / "sub").mkdir(parents=True)
    with pytest.raises(LayoutError, match="Nor is it a class-folder tree .no sub-folder holds images."):
        open_source(tmp_path / "nothing")
    assert not out.exists()


def test_train_and_val_need_the_same_classes(tmp_path):
    class_tree(tmp_path / "t" / "train", {"a": 2, "b": 2, "c": 2})
    class_tree(tmp_path / "t" / "val", {"a": 1, "b": 1, "d": 1}, start=10)
    with pytest.raises(LayoutError) as e:
        open_source(tmp_path / "t").list_images()
    msg = str(e.value)
    assert f"{tmp_path}/t/train/c/: class 'c' has no folder in {tmp_path}/t/val/" in msg
    assert f"{tmp_path}/t/val/d/: class 'd' has no folder in {tmp_path}/t/train/" in msg


def test_selection_options(tmp_path):
    root = class_tree(tmp_path / "t", {"c": 8, "a": 8, "b": 8})
    src = open_source(root).list_images(num_classes=2, per_class=3, seed=1)
    assert [c.wnid for c in src.classes] == ["a", "b"] and len(src.train) == 6
    assert {i.wnid for i in src.train + src.val} == {"a", "b"}
    with pytest.raises(ConfigError) as e:
        open_source(root).list_images(class_list=tmp_path / "list.txt")
    assert (e.value.key, e.value.value) == ("--class-list", tmp_path / "list.txt")
    with pytest.raises(ConfigError) as e:
        open_source(root).list_images(num_classes=4)
    assert (e.value.key, e.value.value) == ("--classes", 4)
    with pytest.raises(ConfigError) as e:
        open_source(root, val_fraction=1.0)
    assert (e.value.key, e.value.value) == ("--val-fraction", 1.0)


@pytest.mark.slow
def test_class_ids_match_keras_image_dataset_from_directory(tmp_path):
    """Our class ids are Keras' (tf_keras, the Keras the training uses): the class_names list of
    image_dataset_from_directory over the same tree, in the same order."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tf_keras

    root = class_tree(tmp_path / "t", {**NAMES, "10": 2, "9": 2, "Zulu": 2, "_x": 2, "été": 2})
    ds = tf_keras.utils.image_dataset_from_directory(str(root), batch_size=4, image_size=(18, 24), shuffle=False)
    ours = [c.wnid for c in open_source(root).list_images().classes]
    assert ours == list(ds.class_names)


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_imagenet", *args], capture_output=True, text=True, check=False,
                          timeout=timeout)


@pytest.mark.slow
def test_the_command_line_detects_a_class_tree_and_reads_a_labels_file(tmp_path):
    root = class_tree(tmp_path / "t", {"dog": 5, "cat": 5})
    write_labels(tmp_path / "labels.csv", [{"file": f"t/{c}/{c}_{i}.jpg", "label": c} for c in ("dog", "cat")
                                           for i in range(5)])
    p = cli("shard", str(root), "--out", str(tmp_path / "a"), "--train-shards", "2", "--val-shards", "1",
            "--val-fraction", "0.2", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "sharding 8 train + 2 val images of 2 classes into 2 + 1 shards" in p.stderr
    p = cli("shard", "--labels", str(tmp_path / "labels.csv"), "--path-column", "file", "--out", str(tmp_path / "b"),
            "--train-shards", "2", "--val-shards", "1", "--val-fraction", "0.2", "--no-progress")
    assert p.returncode == 0, p.stderr
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in "ab")
    assert a["classes"] == b["classes"] and [c["wnid"] for c in a["classes"]] == ["cat", "dog"]
    assert a["splits"]["val"]["examples"] == b["splits"]["val"]["examples"] == 2
    for args, message in [
        ((str(root), "--labels", str(tmp_path / "labels.csv")), "give the images either as SOURCE"),
        ((), "give SOURCE (a Kaggle folder or zip, or a folder of class folders) or --labels FILE"),
        ((str(root), "--label-column", "x"), "--label-column: only with --labels FILE"),
        ((str(root), "--val-fraction", "1.5"), "argument --val-fraction: 1.5 must be between 0 and 1"),
        (("--labels", str(tmp_path / "labels.csv")), "no 'path' (or 'url') column; the columns are file, label"),
    ]:
        p = cli("shard", *args, "--out", str(tmp_path / "c"))
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_train_on_a_class_folder_dataset(spark, tmp_path):
    """class-folder tree -> `spark-imagenet shard --max-side 16` (smaller than the 24 x 18 images) -> train() on
    the tests' local[2] session (the tiny settings of tests/test_preflight.py; the command line's train is
    test_cli's), evaluated on the scaled val shards; then `predict` on ordinary JPEGs of full size."""
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.job.config import TrainConfig

    root = class_tree(tmp_path / "t" / "train", {"tulip": 12, "rose": 12, "daisy": 12})
    class_tree(tmp_path / "t" / "val", {"tulip": 2, "rose": 2, "daisy": 2}, start=200)
    out = tmp_path / "shards"
    p = cli("shard", str(root.parent), "--out", str(out), "--train-shards", "4", "--val-shards", "2", "--no-progress",
            "--max-side", "16")
    assert p.returncode == 0, p.stderr
    result = train(spark, str(out), TrainConfig(workers=2, epochs=1, batch_size=4, image_size=72, width=0.25,
                                                cache=tmp_path / "cache", output=str(tmp_path / "run")))
    assert result.workers == 2 and result.val.images == 6
    manifest = json.loads((out / "manifest.json").read_text())
    assert [c["wnid"] for c in manifest["classes"]] == ["daisy", "rose", "tulip"]
    assert manifest["image_form"] == "max-side 16 q90"
    photos = sorted((tmp_path / "t" / "val").rglob("*.jpg"))[:2]  # as the tree holds them: 24 x 18
    p = cli("predict", str(tmp_path / "run"), *map(str, photos), "--json", "--top", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    assert [r["file"] for r in json.loads(p.stdout)] == [str(photo) for photo in photos]
    assert all(r["top"][0]["wnid"] in ("daisy", "rose", "tulip") for r in json.loads(p.stdout))


def test_a_path_that_is_no_folder_names_every_kind(tmp_path):
    with pytest.raises(LayoutError, match=r"missing is not a directory \(expected ImageNet in the Kaggle CLS-LOC "
                                          r"layout\), or a folder of class folders .*--labels FILE"):
        open_source(tmp_path / "missing")
    (tmp_path / "labels.csv").write_text("path,label\n")
    with pytest.raises(LayoutError, match="labels.csv is not a directory .*a labels file is given with --labels FILE"):
        open_source(tmp_path / "labels.csv", val_fraction=0.2)
