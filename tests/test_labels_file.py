"""A labels file (CSV, JSON Lines, Parquet) as an image source: paths resolved against its folder, class names or
ids, its split column or the seeded --val-fraction, images in an s3:// store (moto), and every bad file refused
with its lines before anything is written."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from archive_util import decoded
from own_images import class_tree, write_labels
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.errors import ConfigError, ImageError, LayoutError
from spark_imagenet.source import open_labels

QUIET = {"processes": 1, "progress": False}


@pytest.fixture
def images(tmp_path):
    """``tmp_path/data/img/<class>/<class>_<i>.jpg``: cat 5, dog 4, ant 3."""
    class_tree(tmp_path / "data" / "img", {"cat": 5, "dog": 4, "ant": 3})
    return tmp_path / "data"


def rows_of(folder, split=True):
    """One row per image of ``folder/img``, relative paths, class-name labels (the first two of a class: val)."""
    rows = []
    for cls_dir in sorted((folder / "img").iterdir()):
        for i, p in enumerate(sorted(cls_dir.iterdir())):
            row = {"path": p.relative_to(folder).as_posix(), "label": cls_dir.name}
            if split:
                row["split"] = "val" if i < 1 else "train"
            rows.append(row)
    return rows


def test_csv_with_names_and_a_split_column(images, tmp_path):
    import spark_imagenet

    labels = write_labels(images / "labels.csv", rows_of(images))
    source = spark_imagenet.open_labels(labels)
    src = source.list_images()
    assert [c.wnid for c in src.classes] == ["ant", "cat", "dog"] and len(src.val) == 3 and len(src.train) == 9
    assert [source.relpath(i) for i in src.val] == ["img/ant/ant_0.jpg", "img/cat/cat_0.jpg", "img/dog/dog_0.jpg"]
    assert src.selection["val_fraction"] is None
    out = tmp_path / "shards"
    manifest = shard(source, out, train_shards=2, val_shards=1, **QUIET)
    data = json.loads((out / "manifest.json").read_text())
    assert data["source"] == {"kind": "labels-file", "path": str(labels),
                              "columns": {"path": None, "label": "label", "split": None}}
    assert [c["wnid"] for c in data["classes"]] == ["ant", "cat", "dog"]
    examples = decoded(out, manifest)
    assert len(examples["train"]) == 9 and len(examples["val"]) == 3
    for ex in examples["train"] + examples["val"]:
        assert ex["image/filename"].decode().startswith(ex["image/class/synset"].decode() + "_")
        assert ["ant", "cat", "dog"][ex["image/class/label"]] == ex["image/class/synset"].decode()
    # the same images listed by a class-folder tree give the same classes and labels
    with pytest.raises(ConfigError, match="has a split column") as e:
        open_labels(labels, val_fraction=0.2).list_images()
    assert (e.value.key, e.value.value) == ("--val-fraction", 0.2)


@pytest.mark.parametrize("ending", [".jsonl", ".parquet"])
def test_integer_labels_without_a_split_are_kept_and_split_by_fraction(images, ending):
    ids = {"ant": 2, "cat": 0, "dog": 1}
    rows = [{"url": str(images / r["path"]), "label": ids[r["label"]]} for r in rows_of(images, split=False)]
    source = open_labels(write_labels(images / f"labels{ending}", rows), val_fraction=0.25)
    src = source.list_images(seed=7)
    assert [(c.id, c.wnid) for c in src.classes] == [(0, "0"), (1, "1"), (2, "2")]
    assert all(i.label == ids[i.path.split("/")[-2]] for i in src.train + src.val)
    assert sorted(i.label for i in src.val) == [0, 1, 2] and src.selection["val_fraction"] == 0.25


def test_a_categorical_label_column(images):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = rows_of(images)
    table = pa.Table.from_pylist(rows)
    table = table.set_column(1, "label", table.column("label").dictionary_encode())
    pq.write_table(table, images / "labels.parquet")
    src = open_labels(images / "labels.parquet").list_images()
    assert [c.wnid for c in src.classes] == ["ant", "cat", "dog"] and len(src.val) == 3


def test_paths_absolute_file_urls_and_outside_the_folder(images, tmp_path):
    elsewhere = class_tree(tmp_path / "elsewhere", {"cat": 2}, start=40)
    rows = rows_of(images)
    rows[0]["path"] = f"file://{images / rows[0]['path']}"
    rows.append({"path": str(elsewhere / "cat" / "cat_1.jpg"), "label": "cat", "split": "train"})
    rows.append({"path": "../elsewhere/cat/cat_0.jpg", "label": "cat", "split": "train"})
    source = open_labels(write_labels(images / "labels.csv", rows))
    src = source.list_images()
    rel = sorted(source.relpath(i) for i in src.train + src.val)
    assert str(elsewhere / "cat" / "cat_0.jpg") in rel and "img/ant/ant_0.jpg" in rel and len(rel) == 14


def test_columns_named_by_options(images):
    rows = [{"file": r["path"], "class": r["label"], "part": "validation" if r["split"] == "val" else "TRAIN"}
            for r in rows_of(images)]
    labels = write_labels(images / "labels.csv", rows)
    src = open_labels(labels, path_column="file", label_column="class", split_column="part").list_images()
    assert len(src.val) == 3
    # wording test (labels files): the file, the columns found and the option that names the right one
    with pytest.raises(ConfigError, match=r"no 'path' \(or 'url'\) column; the columns are file, class, part. Name "
                                          "the right one with --path-column") as e:
        open_labels(labels).list_images()
    assert (e.value.key, e.value.value) == ("--path-column", None)
    with pytest.raises(ConfigError) as e:
        open_labels(labels, path_column="file").list_images()
    assert (e.value.key, e.value.value) == ("--label-column", "label")
    with pytest.raises(ConfigError) as e:
        open_labels(labels, path_column="file", label_column="class", split_column="split").list_images()
    assert (e.value.key, e.value.value) == ("--split-column", "split")


def bad(images, rows, ending=".csv", **kw) -> str:
    with pytest.raises((LayoutError, ConfigError)) as e:
        shard(open_labels(write_labels(images / f"labels{ending}", rows), **kw), images / "out", **QUIET)
    assert not (images / "out").exists()
    return str(e.value)


def test_rows_that_name_missing_files_are_listed_with_their_lines(images):
    rows = rows_of(images)
    for k in range(12):
        rows.append({"path": f"img/gone/{k}.jpg", "label": "cat", "split": "train"})
    msg = bad(images, rows)
    assert f"labels.csv: 12 image(s) it names do not exist; fix their paths (relative ones are resolved against {images})" in msg
    assert f"line 14: {images}/img/gone/0.jpg does not exist" in msg and "line 23: " in msg
    assert "line 24:" not in msg and "... and 2 more" in msg


def test_bad_labels_are_refused(images):
    rows = rows_of(images)
    rows[3]["label"] = None
    rows[5]["label"] = ""
    assert re.search(r"labels.csv column 'label': 2 row\(s\) without a label; .*\n  line 5\n  line 7$", bad(images, rows))
    rows = rows_of(images)
    rows[0]["label"] = 3
    msg = bad(images, rows)
    assert "column 'label': mixed types: 1 row(s) hold integers and 11 hold names" in msg and "line 2: '3'" in msg
    rows = [{**r, "label": 1 if r["label"] == "cat" else "dog"} for r in rows_of(images)]
    msg = bad(images, rows, ".jsonl")
    assert "Column(/label) changed from string to number" in msg and "numbers in some rows and strings in others" in msg
    rows = [{**r, "label": 0.5} for r in rows_of(images)]
    assert "labels of type double; they must be class names (strings) or class ids" in bad(images, rows, ".parquet")
    rows = [{**r, "label": {"ant": 0, "cat": 2, "dog": 4}[r["label"]]} for r in rows_of(images)]
    assert "2 id(s) below the largest (4) have no image: 1, 3" in bad(images, rows, ".parquet")


def test_bad_rows_and_files_are_refused(images):
    rows = rows_of(images)
    rows[4]["split"] = "test"
    assert "column 'split': 1 row(s) whose split is not train or val" in bad(images, rows)
    rows = rows_of(images) + [rows_of(images)[2]]
    assert f"line 14: {images}/img/ant/ant_2.jpg (also line 4)" in bad(images, rows)
    rows = rows_of(images)
    rows[1]["path"] = None
    assert "column 'path': 1 row(s) without a path" in bad(images, rows, ".parquet")
    (images / "broken.parquet").write_bytes(b"PAR1 not really")
    for name, reason in (("nothing.csv", "No such file"), ("broken.parquet", "as PARQUET"),
                         ("labels.txt", "cannot tell its format")):
        with pytest.raises(ConfigError, match=reason) as e:
            open_labels(images / name).list_images()
        assert e.value.key == "--labels" and str(e.value.value).endswith(name)
    (images / "empty.csv").write_text("path,label\n")
    with pytest.raises(LayoutError, match="empty.csv: no rows"):
        open_labels(images / "empty.csv").list_images()


@pytest.mark.slow
def test_a_labels_file_in_s3_pointing_into_s3(moto_s3, images, tmp_path, monkeypatch):
    from s3_server import CREDENTIALS
    from spark_imagenet.storage import open_storage

    bucket = "labels-" + uuid.uuid4().hex[:8]
    moto_s3.create_bucket(bucket)
    for k, v in {**CREDENTIALS, "AWS_ENDPOINT_URL": moto_s3.endpoint}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    store = open_storage(f"s3://{bucket}/set")
    rows = rows_of(images)
    for r in rows:
        store.write_bytes(r["path"], (images / r["path"]).read_bytes())
    rows[0]["path"] = f"s3://{bucket}/set/{rows[0]['path']}"  # a URL beside the relative paths
    store.write_bytes("labels.csv", write_labels(tmp_path / "l.csv", rows).read_bytes())
    store.write_bytes("broken/x.jpg", b"\xff\xd8 not a jpeg")

    source = open_labels(f"s3://{bucket}/set/labels.csv")
    out = tmp_path / "shards"
    manifest = shard(source, out, train_shards=2, val_shards=1, processes=2, progress=False)
    examples = decoded(out, manifest)
    assert len(examples["train"]) == 9 and len(examples["val"]) == 3
    assert {ex["image/encoded"] for ex in examples["val"]} == {(images / r["path"].split("/set/")[-1]).read_bytes()
                                                                for r in rows if r["split"] == "val"}
    assert json.loads((out / "manifest.json").read_text())["source"]["path"] == f"s3://{bucket}/set/labels.csv"

    rows.append({"path": "img/cat/missing.jpg", "label": "cat", "split": "train"})
    store.write_bytes("labels.csv", write_labels(tmp_path / "l.csv", rows).read_bytes())
    with pytest.raises(LayoutError, match=rf"line 14: s3://{bucket}/set/img/cat/missing.jpg does not exist"):
        open_labels(f"s3://{bucket}/set/labels.csv").list_images()
    rows[-1]["path"] = "broken/x.jpg"
    store.write_bytes("labels.csv", write_labels(tmp_path / "l.csv", rows).read_bytes())
    with pytest.raises(ImageError, match=rf"s3://{bucket}/set/broken/x.jpg: "):
        shard(open_labels(f"s3://{bucket}/set/labels.csv"), tmp_path / "o2", train_shards=2, val_shards=1, **QUIET)
