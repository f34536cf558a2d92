"""shard_dataframe and ``spark-imagenet shard --table``: a DataFrame or table of image bytes sharded as a Spark job
(spark_imagenet.dataset.dataframe), on a real ``local[2,2]`` session (two tries per task)."""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import random
from pathlib import Path

import pytest
from PIL import Image

from archive_util import parse_example
from session_util import module_spark
from record_util import read_records
from spark_imagenet.dataset.dataframe import shard_dataframe
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest, ShardInfo
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME
from spark_imagenet.dataset.tables import read_table
from spark_imagenet.errors import ConfigError, DataError
from spark_imagenet.storage import crc32c_file

CLASSES = ("cat", "dog", "fox")


@pytest.fixture(scope="module")
def spark():
    """``local[2,2]``: two cores, and a failed task is tried once more (the retry test needs it)."""
    yield from module_spark("local[2,2]", "spark-imagenet-shard-dataframe")


def jpeg(k: int, seed: int, fmt: str = "JPEG") -> bytes:
    """A tiny distinct image: a colour of class ``k`` with seeded noise."""
    rng = random.Random(seed)
    im = Image.new("RGB", (20, 16), (80 * k % 256, 40 + 50 * k % 200, rng.randrange(256)))
    for _ in range(30):
        im.putpixel((rng.randrange(20), rng.randrange(16)), (rng.randrange(256),) * 3)
    out = io.BytesIO()
    im.save(out, fmt, quality=90) if fmt == "JPEG" else im.save(out, fmt)
    return out.getvalue()


def rows(per_class: int = 12) -> list[tuple[bytes, str, str]]:
    """``(content, label, name)`` rows: ``per_class`` images of each class."""
    return [(jpeg(k, 1000 * k + i), c, f"{c}/{c}_{i}.jpg") for k, c in enumerate(CLASSES) for i in range(per_class)]


def records(out: Path, manifest: Manifest) -> dict[str, list[dict]]:
    """Per split, every record of every shard, after checking each shard's size and CRC32C."""
    result = {}
    for split, info in manifest.splits.items():
        result[split] = []
        for s in info.shards:
            path = out / s.name
            assert path.stat().st_size == s.bytes and crc32c_file(path) == s.crc32c
            with open(path, "rb") as f:
                result[split] += [parse_example(r) for r in read_records(f)]
    return result


def objects(out: Path) -> set[str]:
    return {p.name for p in out.iterdir()}


def after_upload(monkeypatch, hook) -> None:
    """Make every shard task of the job call ``hook(object name)`` in each attempt right after its upload."""
    from spark_imagenet.dataset import dataframe
    from spark_imagenet.dataset.dataframe import ShardTask

    monkeypatch.setattr(dataframe, "ShardTask", functools.partial(ShardTask, after_upload=hook))


@pytest.mark.slow
def test_a_parquet_table_written_by_spark(spark, tmp_path, log_lines):
    data = rows()
    png = jpeg(1, 77, "PNG")  # repaired: a PNG stored as an RGB JPEG
    data += [(png, "dog", "dog/odd.png"), (data[0][0], "cat", "cat/copy_of_0.jpg")]  # and a duplicate
    spark.createDataFrame(data, "content binary, label string, name string").write.parquet(str(tmp_path / "t"))
    df = read_table(spark, str(tmp_path / "t"), "parquet")
    out = tmp_path / "shards"
    manifest = shard_dataframe(df, str(out), name_col="name", train_shards=2, val_shards=1, val_fraction=0.25)

    loaded = Manifest.load(__import__("spark_imagenet").open_storage(str(out)))
    assert loaded == manifest and [c.wnid for c in manifest.classes] == list(CLASSES)
    assert objects(out) == {MANIFEST_NAME, QUALITY_REPORT_NAME} | {
        s.name for split in manifest.splits.values() for s in split.shards}
    got = records(out, manifest)
    assert sum(len(r) for r in got.values()) == len(data) and got["val"] and got["train"]
    by_name = {r["image/filename"].decode(): r for split in got.values() for r in split}
    for content, label, name in data:
        r = by_name[name.split("/")[-1]]
        assert r["image/class/synset"].decode() == label and r["image/class/label"] == CLASSES.index(label)
        assert (r["image/encoded"] == content) == (name != "dog/odd.png")  # stored byte for byte unless repaired
    assert by_name["odd.png"]["image/encoded"][:2] == b"\xff\xd8"
    report = __import__("json").loads((out / QUALITY_REPORT_NAME).read_text())
    assert [f["file"] for f in report["files"]] == ["dog/odd.png"] and report["files"][0]["action"] == "repaired"
    assert [sorted(d["files"]) for d in report["duplicates"]] == [["cat/cat_0.jpg", "cat/copy_of_0.jpg"]]
    assert report["duplicates"][0]["count"] == 2 and report["duplicate_totals"]["groups"] == 1
    assert manifest.selection["duplicates"] == 1
    assert any("sharding: 3 of 3 shards written" in line for line in log_lines)

    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = shard_dataframe(df, str(out), name_col="name", train_shards=2, val_shards=1, val_fraction=0.25)
    assert again == manifest  # the same rows: the same dataset id, nothing rewritten, this run's shards removed
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def class_tree(root: Path, per_class: int = 8, val: int = 3) -> dict[str, bytes]:
    """``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``; returns ``{relative path: bytes}``."""
    written = {}
    for k, c in enumerate(CLASSES):
        for split, n in (("train", per_class), ("val", val)):
            for i in range(n):
                rel = f"{split}/{c}/{c}_{i}.jpg"
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_bytes(written.setdefault(rel, jpeg(k, hash((split, k, i)) % 10**6)))
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    return written


@pytest.mark.slow
def test_a_binary_file_read_of_class_folders_via_the_command_line(spark, tmp_path):
    """``shard --table PHOTOS --format binaryFile``, and shard_dataframe of a plain binaryFile read of the same
    tree: class from each image's folder, split from its train/val folder."""
    from spark_imagenet.cli import main

    written = class_tree(tmp_path / "photos")
    out = tmp_path / "shards"
    assert main(["shard", "--table", str(tmp_path / "photos"), "--format", "binaryFile", "--out", str(out),
                 "--train-shards", "2", "--val-shards", "1", "--no-progress"]) == 0
    manifest = Manifest.load(__import__("spark_imagenet").open_storage(str(out)))
    # The same tree as the most natural DataFrame, a plain binaryFile read: labelled by folder as the command does.
    plain = (spark.read.format("binaryFile").option("pathGlobFilter", "*.jpg").option("recursiveFileLookup", "true")
             .load(str(tmp_path / "photos")))
    from_api = shard_dataframe(plain, str(tmp_path / "api"), train_shards=2, val_shards=1, progress=False)
    assert from_api.source["columns"] == manifest.source["columns"]
    for folder, built in ((out, manifest), (tmp_path / "api", from_api)):
        got = records(folder, built)
        for split in ("train", "val"):
            expected = sorted((rel.split("/")[1], hashlib.sha256(b).hexdigest()) for rel, b in written.items()
                              if rel.startswith(split + "/"))
            assert sorted((r["image/class/synset"].decode(), hashlib.sha256(r["image/encoded"]).hexdigest())
                          for r in got[split]) == expected
    assert manifest.source["columns"]["name"] == "path"


@pytest.mark.slow
def test_a_task_that_fails_once_leaves_exactly_one_shard(spark, tmp_path, log_lines, monkeypatch):
    df = spark.createDataFrame(rows(8), "content binary, label string, name string")

    def fail_first_attempt(name: str) -> None:
        from pyspark import TaskContext

        if name.startswith("train-00000-") and TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("failing on purpose after the upload")

    out = tmp_path / "shards"
    after_upload(monkeypatch, fail_first_attempt)
    manifest = shard_dataframe(df, str(out), name_col="name", train_shards=2, val_shards=1, val_fraction=0.25)
    names = {s.name for split in manifest.splits.values() for s in split.shards}
    assert objects(out) == {MANIFEST_NAME, QUALITY_REPORT_NAME} | names  # the first attempt's object is gone
    assert sum(len(r) for r in records(out, manifest).values()) == 24
    assert any("removed 1 object(s) of failed or duplicate task attempts" in line for line in log_lines)


@pytest.mark.slow
def test_same_images_as_the_local_path_per_class(spark, tree, local_ds, tmp_path):
    """The Kaggle tree of conftest read by Spark (train: class folders; val: LOC_val_solution.csv) holds per
    split and class the same records as the local builder's shards (shard assignment and order differ)."""
    from pyspark.sql import functions as F

    local_out, local_manifest = local_ds
    cls_loc = Path(tree) / "ILSVRC" / "Data" / "CLS-LOC"
    train = read_table(spark, str(cls_loc / "train"), "binaryFile").withColumn("split", F.lit("train"))
    with open(Path(tree) / "LOC_val_solution.csv") as f:
        labels = [(r["ImageId"] + ".JPEG", r["PredictionString"].split()[0]) for r in csv.DictReader(f)]
    val = (spark.read.format("binaryFile").load(str(cls_loc / "val"))
           .withColumn("file", F.element_at(F.split("path", "/"), -1))
           .join(spark.createDataFrame(labels, "file string, label string"), "file")
           .withColumn("split", F.lit("val")))
    df = train.select("path", "content", "label", "split").unionByName(val.select("path", "content", "label", "split"))
    out = tmp_path / "shards"
    manifest = shard_dataframe(df, str(out), split_col="split", train_shards=2, val_shards=1)

    assert per_class(out, manifest) == per_class(local_out, local_manifest)
    assert [c.wnid for c in manifest.classes] == [c.wnid for c in local_manifest.classes]


def per_class(folder: Path, manifest: Manifest) -> dict[str, list[tuple]]:
    """Per split, every record's synset, label, file name and image hash, sorted (shard and order aside)."""
    return {split: sorted((r["image/class/synset"], r["image/class/label"], r["image/filename"],
                           hashlib.sha256(r["image/encoded"]).hexdigest()) for r in recs)
            for split, recs in records(folder, manifest).items()}


@pytest.mark.slow
def test_the_kaggle_tree_sharded_with_master_holds_the_local_paths_images(spark, tree, local_ds, tmp_path, capsys):
    """``shard SOURCE --master``, the Kaggle folder and its zip: the images chosen here as without --master, read
    and written by the executors: per split and class the same records as the local builder's (shard assignment
    and order differ); a second run over the same source leaves the committed dataset as it is."""
    from spark_imagenet.cli import main

    from archive_util import zip_root_form

    local_out, local_manifest = local_ds
    archive = zip_root_form(Path(tree), tmp_path / "imagenet-object-localization-challenge.zip")
    for source, out, runs in ((tree, tmp_path / "shards", 2), (archive, tmp_path / "from-zip", 1)):
        for _ in range(runs):
            assert main(["shard", str(source), "--master", "local[2,2]", "--out", str(out), "--train-shards", "3",
                         "--val-shards", "1", "--no-progress"]) == 0
        manifest = Manifest.load(__import__("spark_imagenet").open_storage(str(out)))
        assert per_class(out, manifest) == per_class(local_out, local_manifest), source
        assert manifest.classes == local_manifest.classes  # ids, wnids and the mapping's names
        assert manifest.source["sharded_by"] == "spark"
        assert objects(out) == {"manifest.json", "quality-report.json", *(s.name for sp in manifest.splits.values()
                                                                            for s in sp.shards)}
    # --resize: the same records, every image 24 x 24 (the tree's are 64 x 48), the manifest saying how
    assert main(["shard", str(tree), "--master", "local[2,2]", "--out", str(tmp_path / "resized"), "--train-shards",
                 "3", "--val-shards", "1", "--no-progress", "--resize", "24", "--jpeg-quality", "80"]) == 0
    resized = Manifest.load(__import__("spark_imagenet").open_storage(str(tmp_path / "resized")))
    assert resized.image_form.label == "resize 24 q80" and resized.source["sharded_by"] == "spark"
    unhashed = {split: [r[:3] for r in recs] for split, recs in per_class(local_out, local_manifest).items()}
    assert {split: [r[:3] for r in recs] for split, recs in per_class(tmp_path / "resized", resized).items()} \
        == unhashed
    assert {stored_size(r) for recs in records(tmp_path / "resized", resized).values() for r in recs} == {(24, 24)}
    # another form into that folder: refused before the job (no image read), naming both forms
    assert main(["shard", str(tree), "--master", "local[2,2]", "--out", str(tmp_path / "resized"), "--no-progress",
                 "--max-side", "32"]) == 2
    assert ("already holds a dataset of images stored as 'resize 24 q80' (id " + resized.dataset_id) in \
        capsys.readouterr().err
    assert Manifest.load(__import__("spark_imagenet").open_storage(str(tmp_path / "resized"))) == resized


def stored_size(record: dict) -> tuple[int, int]:
    """The (width, height) of a record's image, after checking that its header says the same."""
    with Image.open(io.BytesIO(record["image/encoded"])) as im:
        assert im.size == (record["image/width"], record["image/height"]) and im.format == "JPEG"
        return im.size


@pytest.mark.slow
def test_a_damaged_zip_member_is_named_and_nothing_is_committed(spark, tree, tmp_path, capsys):
    """``shard ZIP --master --classes 2``: the executors list their slices of the central directory and
    read the members there; a member whose bytes fail its CRC-32 stops the job with one line naming it, and
    the destination holds nothing. A layout error is said before Spark starts (the local path's message)."""
    import zipfile

    from spark_imagenet.cli import main
    from spark_imagenet.training.driver import spark_session

    from archive_util import zip_root_form

    archive = zip_root_form(Path(tree), tmp_path / "stored.zip", compression=zipfile.ZIP_STORED)
    with zipfile.ZipFile(archive) as zf:
        info = next(i for i in zf.infolist() if "/train/" in i.filename and i.filename.endswith(".JPEG"))
    data = bytearray(archive.read_bytes())
    data[info.header_offset + 30 + len(info.filename.encode()) + 200] ^= 0xFF
    archive.write_bytes(bytes(data))
    out = tmp_path / "never"
    assert main(["shard", str(archive), "--master", "local[2]", "--classes", "2", "--out", str(out),
                 "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert f"{archive} member {info.filename}: CRC-32 or size mismatch" in err, err
    assert not out.exists() or not any(out.iterdir())

    (Path(tree) / "LOC_synset_mapping.txt").rename(tmp_path / "mapping")
    try:
        bad = zip_root_form(Path(tree), tmp_path / "bad.zip")
    finally:
        (tmp_path / "mapping").rename(Path(tree) / "LOC_synset_mapping.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spark_session, "session_for", lambda *a, **k: pytest.fail("Spark was started"))
        assert main(["shard", str(bad), "--master", "local[2]", "--out", str(out)]) == 2
    assert "missing:\n  LOC_synset_mapping.txt" in capsys.readouterr().err


@pytest.mark.slow
def test_bad_input_is_refused_before_anything_is_written(spark, tmp_path):
    out = tmp_path / "never"
    good = spark.createDataFrame(rows(2), "content binary, label string, name string")
    with pytest.raises(ConfigError, match=r"image column 'image' is not in the DataFrame; its columns: content "
                                          r"\(binary\), label \(string\), name \(string\)"):
        shard_dataframe(good, str(out), image_col="image")
    with pytest.raises(ConfigError, match="image column 'name' is string, not binary.*binaryFile"):
        shard_dataframe(good, str(out), image_col="name")
    nulls = spark.createDataFrame([(b"x", None), (b"y", "cat")], "content binary, label string")
    with pytest.raises(DataError, match=r"label column 'label' is null in 1 row.*:\n  row 1$"):
        shard_dataframe(nulls, str(out))  # no name column: the row's number
    named = spark.createDataFrame([(b"x", "cat", "a.jpg"), (b"y", None, "b.jpg")], "content binary, label string, "
                                  "path string")
    with pytest.raises(DataError, match=r"label column 'label' is null in 1 row.*:\n  path b.jpg$"):
        shard_dataframe(named, str(out))
    no_image = spark.createDataFrame([(None, "cat", "a.jpg"), (b"y", "cat", "b.jpg")], "content binary, "
                                     "label string, path string")
    with pytest.raises(DataError, match=r"image column 'content' is null in 1 row.*:\n  path a.jpg$"):
        shard_dataframe(no_image, str(out))
    mixed = spark.createDataFrame([(b"x", "3"), (b"y", "cat")], "content binary, label string")
    with pytest.raises(DataError, match="mixes integers .3. and names .cat."):
        shard_dataframe(mixed, str(out))
    with pytest.raises(DataError, match="the DataFrame has no rows"):
        shard_dataframe(good.where("false"), str(out))
    split = spark.createDataFrame([(b"x", "cat", "test")], "content binary, label string, s string")
    with pytest.raises(DataError, match="split column 's' holds 'test'"):
        shard_dataframe(split, str(out), split_col="s")
    gaps = spark.createDataFrame([(b"x", 0), (b"y", 2)], "content binary, label int")
    with pytest.raises(DataError, match=r"label column 'label': integer labels must be the class ids 0..K-1 with "
                                        r"every id used; 1 id\(s\) below the largest \(2\) have no image: 1\."):
        shard_dataframe(gaps, str(out))
    assert not out.exists()


@pytest.mark.slow
def test_a_binary_file_read_of_a_folder_without_class_folders_is_refused(spark, tmp_path):
    from spark_imagenet.dataset.tables import read_table

    flat, empty = tmp_path / "flat", tmp_path / "empty"
    flat.mkdir()
    empty.mkdir()
    for i, (content, _label, _name) in enumerate(rows(1)):
        (flat / f"{i}.jpg").write_bytes(content)
    with pytest.raises(ConfigError, match=r"every image is in one folder \(flat\), so they would all be one "
                                          r"class.*sub-folders are the classes"):
        read_table(spark, str(flat), "binaryFile")
    with pytest.raises(ConfigError, match="holds no image files"):
        read_table(spark, str(empty), "binaryFile")


def test_the_command_line_takes_a_source_or_a_table(tmp_path, capsys, monkeypatch):
    from spark_imagenet.cli import main
    from spark_imagenet.training.driver import spark_session

    monkeypatch.setattr(spark_session, "session_for", lambda *a, **k: pytest.fail("Spark was started"))

    for args, message in [
        ((), "or --labels FILE or --table NAME|PATH"),
        ((str(tmp_path), "--table", "t"), "as --labels FILE or as --table NAME|PATH, not several"),
        ((str(tmp_path), "--format", "parquet"), "--format: only with --table"),
        (("--table", "t", "--classes", "3"), "--classes: only with SOURCE or --labels FILE (filter a --table first)"),
        (("--table", "t", "--path-column", "p"), "--path-column: only with --labels FILE"),
        (("hdfs://nn:8020/photos", "--master", "local[2]", "--per-class", "3"), "--per-class: not with a SOURCE "
         "URL (Spark reads the whole tree there, as --table URL --format binaryFile)"),
        ((str(tmp_path), "--master", "local[2]", "--processes", "2"), "--processes: not with --master"),
        (("--labels", "l.csv", "--master", "local[2]", "--processes", "2"), "--processes: not with --master"),
        ((str(tmp_path), "--master", "local[2]", "--format", "parquet"), "--format: only with --table"),
    ]:
        assert main(["shard", *args, "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err, args
    assert not (tmp_path / "o").exists()


def test_a_local_table_path_or_column_that_is_not_there_is_refused_before_spark(tmp_path, capsys, monkeypatch):
    """Said in a fraction of a second instead of after a minute of Spark start-up: no session is made."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_imagenet.cli import main
    from spark_imagenet.training.driver import spark_session

    monkeypatch.setattr(spark_session, "session_for", lambda *a, **k: pytest.fail("Spark was started"))
    pq.write_table(pa.table({"image": [b"x"], "label": ["cat"]}), tmp_path / "t.parquet")
    (tmp_path / "flat").mkdir()
    for name in ("a.jpg", "b.PNG"):
        (tmp_path / "flat" / name).write_bytes(b"not read here")
    for args, message in [
        (("--table", str(tmp_path / "nope"), "--format", "binaryFile"), "nope: no such file or folder"),
        (("--table", f"file://{tmp_path}/nope.parquet", "--format", "parquet"), "no such file or folder"),
        (("--table", str(tmp_path / "t.parquet"), "--format", "parquet"),
         "no column content in its Parquet files (they have image, label)"),
        (("--table", str(tmp_path / "t.parquet"), "--format", "parquet", "--image-column", "image",
          "--split-column", "s"), "no column s in its Parquet files"),
        (("--table", str(tmp_path / "flat")), "is a path, not a table name: give its --format (binaryFile"),
        (("--table", str(tmp_path / "flat"), "--format", "binaryFile"),
         "every image is in one folder (flat), so they would all be one class"),
        (("--table", str(tmp_path / "flat"), "--format", "parquet"),
         "no .parquet files in this folder (it holds 2 image file(s): --format binaryFile"),
    ]:
        assert main(["shard", *args, "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err, args
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_shards_of_a_dataframe_train(spark, tmp_path):
    """The shards of a DataFrame train: two barrier workers, one epoch, every val image counted once."""
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.job.config import TrainConfig

    df = spark.createDataFrame(rows(12), "content binary, label string, name string")
    out = tmp_path / "shards"
    manifest = shard_dataframe(df, str(out), name_col="name", train_shards=2, val_shards=1, val_fraction=0.25,
                               progress=False)
    result = train(spark, str(out), TrainConfig(workers=2, epochs=1, cache=tmp_path / "cache", batch_size=4,
                                                image_size=72, width=0.25, learning_rate=0.01, lr_schedule="constant",
                                                warmup_epochs=0.0))
    assert result.val.images == manifest.splits["val"].examples
    assert result.workers == 2 and result.train.loss > 0


@pytest.mark.slow
def test_bad_images_fail_the_build_or_are_skipped(spark, tmp_path):
    data = rows(6) + [(jpeg(0, 5)[:-40], "cat", "cat/truncated.jpg"), (b"", "dog", "dog/empty.jpg")]
    df = spark.createDataFrame(data, "content binary, label string, name string")
    out = tmp_path / "shards"
    from spark_imagenet.errors import ImageError

    with pytest.raises(ImageError, match=r"2 image\(s\) are empty, truncated or do not decode; nothing was "
                                         r"committed(.|\n)*cat/truncated.jpg: (.|\n)*dog/empty.jpg: empty file"):
        shard_dataframe(df, str(out), name_col="name", train_shards=1, val_shards=1, val_fraction=0.3, progress=False)
    assert not out.exists() or not list(out.iterdir())  # no shard of any attempt is left
    manifest = shard_dataframe(df, str(out), name_col="name", train_shards=1, val_shards=1, val_fraction=0.3,
                               on_corrupt="skip", progress=False, max_side=16)  # and stored at most 16 wide
    assert sum(s.examples for s in manifest.splits.values()) == 18
    assert manifest.selection["quality"]["train"]["skipped"] + manifest.selection["quality"]["val"]["skipped"] == 2
    assert manifest.image_form.label == "max-side 16 q90"  # the images are 20 x 16: 16 x 13, the check saw those
    assert {stored_size(r) for recs in records(out, manifest).values() for r in recs} == {(16, 13)}


@pytest.mark.slow
def test_to_a_gcs_bucket_on_the_emulator(spark, gcs_bucket, tmp_path):
    """The executors write to the bucket through the pickled handle (the emulator's endpoint travels with it)."""
    from spark_imagenet import open_storage

    df = spark.createDataFrame(rows(8), "content binary, label string, name string")
    url = f"gs://{gcs_bucket}/shards"
    manifest = shard_dataframe(df, url, name_col="name", train_shards=2, val_shards=1, val_fraction=0.25,
                               progress=False)
    storage = open_storage(url)
    assert Manifest.load(storage) == manifest
    listed = {o.name: o for o in storage.list()}
    shards = [s for split in manifest.splits.values() for s in split.shards]
    assert set(listed) == {MANIFEST_NAME, QUALITY_REPORT_NAME} | {s.name for s in shards}
    assert all(listed[s.name].size == s.bytes and listed[s.name].crc32c == s.crc32c for s in shards)


@pytest.mark.slow
def test_on_a_standalone_cluster_of_two_hosts(two_hosts, tmp_path):
    """``spark-imagenet shard PHOTOS --master spark://...`` (a class-folder tree as a Spark job: a binaryFile
    read, as ``--table PHOTOS --format binaryFile``) with one 1-core worker in each of two network namespaces (the session's cluster, tests/conftest.py): both hosts run shard tasks; the driver commits."""
    import os
    import subprocess
    import sys

    import cluster_util

    master, _addresses, folder = two_hosts
    written = class_tree(tmp_path / "photos")
    out = tmp_path / "shards"
    before = {p for i in (0, 1) for p in (folder / f"work{i}").glob("app-*")}
    p = subprocess.run(
        [sys.executable, "-m", "spark_imagenet", "shard", str(tmp_path / "photos"), "--out", str(out), "--train-shards", "4", "--val-shards", "2", "--master", master,
         "--no-progress"],
        env={**os.environ, "SPARK_LOCAL_IP": cluster_util.DRIVER_ADDRESS, "PYSPARK_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    manifest = Manifest.load(__import__("spark_imagenet").open_storage(str(out)))
    assert sum(s.examples for s in manifest.splits.values()) == len(written)
    assert sum(len(r) for r in records(out, manifest).values()) == len(written)
    executors = [[e for app in (folder / f"work{i}").glob("app-*") if app not in before for e in app.glob("*/stderr")]
                 for i in (0, 1)]
    assert all(executors), executors  # an executor on each "host"


@pytest.mark.slow
def test_a_task_that_keeps_failing_is_one_clear_error_and_leaves_nothing(spark, tmp_path, monkeypatch):
    """After Spark's last try the job's error is the task's own (its class and message, no Py4J trace), and no
    object of the run is left."""
    from spark_imagenet.errors import StorageError

    df = spark.createDataFrame(rows(4), "content binary, label string, name string")

    def refuse(name: str) -> None:
        from spark_imagenet.errors import StorageError

        if name.startswith("val-"):
            raise StorageError(f"the store refused {name} (on purpose)")

    out = tmp_path / "shards"
    after_upload(monkeypatch, refuse)
    with pytest.raises(StorageError) as caught:
        shard_dataframe(df, str(out), name_col="name", train_shards=1, val_shards=1, val_fraction=0.3,
                        progress=False)
    assert str(caught.value).startswith("the store refused val-00000-of-00001-") and "Py4J" not in str(caught.value)
    assert not out.exists() or not list(out.iterdir())


def test_a_split_the_hash_left_empty_names_the_fraction_not_the_shard_count(tmp_path):
    """Rows go to validation by a hash of their bytes: a few rows at a small fraction can send it none, and fewer
    val shards cannot help (one is the least), so the message names --val-fraction."""
    from spark_imagenet.dataset.dataframe import Build, ShardResult, _check_results
    from spark_imagenet.storage import open_storage

    def result(split: str, index: int, examples: int) -> ShardResult:
        info = None if examples == 0 else ShardInfo(f"{split}-{index}", examples, 10 * examples, "crc")
        return ShardResult(split, index, info, (), 0, examples, 10 * examples, {}, (), ())

    results = (result("train", 0, 36), result("val", 0, 0))
    build = Build(open_storage(tmp_path), None, "run", ("a", "b"), (1, 1), results, "decode", "error", False, {})
    with pytest.raises(DataError, match=r"the val split got no images: .* give a larger --val-fraction "
                                        r"\(val_fraction=\), or a split column that names some rows 'val'"):
        _check_results(build, {"train": [results[0]], "val": [results[1]]})
    results = (result("train", 0, 30), result("train", 1, 0), result("val", 0, 6))
    with pytest.raises(DataError, match=r"1 of the 2 train shards got no images \(shard 1\): choose fewer train"):
        _check_results(build, {"train": list(results[:2]), "val": [results[2]]})


@pytest.mark.slow  # a whole job or process (the fast tier stays under 5 minutes)
def test_each_shard_is_one_partition_of_the_job(spark):
    """The job's repartition puts shard s, and only it, in partition s (so no task writes two shards while
    another idles), and sorts each partition by (shard, order, name, label)."""
    from pyspark.sql import functions as F

    from spark_imagenet.dataset.dataframe import shard_partitions

    table = spark.range(4000).select((F.col("id") % 37).cast("int").alias("shard"), F.xxhash64("id").alias("order"),
                                     F.col("id").cast("string").alias("name"), F.lit("a").alias("label"))
    got = shard_partitions(table, 37).select("shard", "order", F.spark_partition_id().alias("p")).collect()
    assert len(got) == 4000 and all(row["p"] == row["shard"] for row in got)
    per_partition: dict[int, list[int]] = {}
    for row in got:
        per_partition.setdefault(row["p"], []).append(row["order"])
    assert all(orders == sorted(orders) for orders in per_partition.values())


@pytest.mark.slow  # a whole job or process (the fast tier stays under 5 minutes)
def test_a_split_column_that_puts_one_image_in_both_splits_is_reported(spark, tmp_path, log_lines):
    """Copies that a split column sends to train and to val land in shards no task sees together: the extra
    pass finds them, the report lists them first as train+val, and the log warns. Copies of such a group within
    one split are also that split's group (a task finds them)."""
    data = [(content, label, name, "val" if i % 4 == 0 else "train") for i, (content, label, name) in enumerate(rows(8))]
    leaked = [(data[0][0], data[0][1], "cat/train_copy.jpg", "train"), (data[0][0], "dog", "dog/relabelled.jpg", "train")]
    in_train = [(data[1][0], data[1][1], "cat/twice.jpg", "train")]  # train and train: found by a task
    df = spark.createDataFrame(data + leaked + in_train, "content binary, label string, name string, split string")
    out = tmp_path / "shards"
    shard_dataframe(df, str(out), split_col="split", name_col="name", train_shards=2, val_shards=1, progress=False)
    report = __import__("json").loads((out / QUALITY_REPORT_NAME).read_text())
    across, *within = report["duplicates"]
    assert across == {"split": "train+val", "count": 3, "files": ["cat/train_copy.jpg", "cat/cat_0.jpg"],
                      "classes": ["cat", "cat"], "splits": ["train", "val"]}
    assert sorted(sorted(g["files"]) for g in within) == [["cat/cat_1.jpg", "cat/twice.jpg"],
                                                          ["cat/train_copy.jpg", "dog/relabelled.jpg"]]
    assert report["duplicate_totals"] == {"groups": 3, "images": 7, "train+val": 1}
    assert any("1 group(s) hold the same image in train and in val" in line for line in log_lines)
    assert any("3 copies: cat/train_copy.jpg, cat/cat_0.jpg (different classes!)" in line for line in log_lines)


@pytest.mark.slow  # a server or a Spark job (the fast tier stays under 5 minutes)
def test_shards_left_empty_by_the_hash_are_refused_and_nothing_is_left(spark, tmp_path):
    """More shards than the rows fill (rows go to shards by a hash): refused, naming the empty shards; the job's
    objects are gone and the destination folder it created too."""
    df = spark.createDataFrame(rows(12), "content binary, label string, name string")
    out = tmp_path / "shards"
    with pytest.raises(DataError, match=r"\d+ of the 25 train shards got no images \(shard .*\): choose fewer train"):
        shard_dataframe(df, str(out), name_col="name", train_shards=25, val_shards=1, val_fraction=0.25,
                        progress=False)
    assert not out.exists()


@pytest.mark.slow  # a server or a Spark job (the fast tier stays under 5 minutes)
def test_the_command_line_reads_a_tables_split_column_without_being_told(spark, tmp_path, capsys, monkeypatch):
    """--table with a string column named split: it gives the rows' splits, as --labels reads one, and says so."""
    from spark_imagenet.cli import main
    from spark_imagenet.training.driver import spark_session

    data = [(c, label, name, "val" if i % 3 == 0 else "train") for i, (c, label, name) in enumerate(rows(8))]
    spark.createDataFrame(data, "content binary, label string, name string, split string").write.parquet(
        str(tmp_path / "t"))
    monkeypatch.setattr(spark_session, "session_for", lambda *a, **k: spark)
    assert main(["shard", "--table", str(tmp_path / "t"), "--format", "parquet", "--name-column", "name",
                 "--train-shards", "1", "--val-shards", "1", "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    manifest = Manifest.load(__import__("spark_imagenet").open_storage(str(tmp_path / "o")))
    assert manifest.splits["val"].shards[0].examples == 8 and manifest.splits["train"].shards[0].examples == 16
    assert "the table's 'split' column gives each row's split" in capsys.readouterr().err
