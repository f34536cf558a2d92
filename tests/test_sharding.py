"""The shard builder and the manifest: balance, class mixing, bytes as read, atomicity, bad input."""

from __future__ import annotations

import collections
import io
import json
import os

import pytest
from PIL import Image

from data_util import ILSVRC_MINI, build, requires_shared, small_layout
from record_util import read_records
from spark_imagenet.errors import ConfigError, ImageError, ManifestError
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.storage import LocalStorage, crc32c_file, open_storage

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DATA = ("ILSVRC", "Data", "CLS-LOC")


def parse(record: bytes) -> dict:
    """Decode a record with TensorFlow's own Example parser."""
    import tensorflow as tf

    ex = tf.train.Example.FromString(record)
    out = {}
    for key, feat in ex.features.feature.items():
        kind = feat.WhichOneof("kind")
        values = list(getattr(feat, kind).value)
        out[key] = values[0]
    return out


def records(path) -> list[dict]:
    with open(path, "rb") as f:
        return [parse(r) for r in read_records(f)]


@pytest.fixture
def tree(tmp_path):
    return small_layout(tmp_path / "src", num_classes=5, train_per_class=9, val_per_class=3)


@pytest.mark.parametrize("form", [{}, {"resize": 32}], ids=["original", "resize"])
def test_manifest_lists_every_shard_with_counts_sizes_checksums(tree, tmp_path, form):
    out = tmp_path / "bucket"
    m = build(tree, out, **form)
    data = json.loads((out / MANIFEST_NAME).read_text())
    assert data["image_form"] == ("resize 32 q90" if form else "original")
    assert data["format_version"] == 1 and data["label_base"] == 0
    assert [c["wnid"] for c in data["classes"]] == [f"n9000000{k}" for k in range(5)]
    assert data["totals"] == {
        "examples": 45 + 15,
        "bytes": sum(s["bytes"] for sp in data["splits"].values() for s in sp["shards"]),
        "shards": 6,
    }
    for split, count in (("train", 4), ("val", 2)):
        shards = data["splits"][split]["shards"]
        assert len(shards) == count
        for s in shards:
            path = out / s["name"]
            assert path.stat().st_size == s["bytes"]
            assert crc32c_file(path) == s["crc32c"]
            assert len(records(path)) == s["examples"]
            if form:  # every image stored as 32 x 32 (the tree's are 64 x 48), the header saying so
                for r in records(path):
                    with Image.open(io.BytesIO(r["image/encoded"])) as im:
                        assert im.size == (r["image/width"], r["image/height"]) == (32, 32) and im.mode == "RGB"
    # Round trip through the parser and the serializer.
    again = Manifest.load(LocalStorage(out))
    assert again == m and Manifest.loads(m.dumps()) == m
    # Nothing else is left in the bucket (no temporary files); the quality report is beside the manifest.
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST_NAME, QUALITY_REPORT_NAME] + [s["name"] for sp in data["splits"].values() for s in sp["shards"]])
    assert data["selection"]["on_corrupt"] == "error"
    assert data["selection"]["quality"]["train"] == {"files": 45, "examples": 45, "repaired": 0, "skipped": 0}


def test_shards_balanced_mixed_and_bytes_stored_as_read(tree, tmp_path):
    out = tmp_path / "bucket"
    m = build(tree, out)
    wnid_of = {c.id: c.wnid for c in m.classes}
    sizes = [s.examples for s in m.splits["train"].shards]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 45
    seen = collections.Counter()
    for s in m.splits["train"].shards:
        recs = records(out / s.name)
        labels = [r["image/class/label"] for r in recs]
        assert len(set(labels)) >= 3, f"{s.name} does not mix classes: {labels}"
        for r in recs:
            src = tree.joinpath(*DATA, "train", wnid_of[r["image/class/label"]], r["image/filename"].decode())
            raw = src.read_bytes()
            assert r["image/encoded"] == raw  # byte for byte, no re-encode
            assert r["image/class/synset"].decode() == wnid_of[r["image/class/label"]]
            assert r["image/format"] == b"JPEG"
            with Image.open(io.BytesIO(raw)) as im:
                assert (r["image/width"], r["image/height"]) == im.size
            seen[src] += 1
    assert len(seen) == 45 and set(seen.values()) == {1}  # every image exactly once
    val = [r for s in m.splits["val"].shards for r in records(out / s.name)]
    assert sorted(r["image/filename"].decode() for r in val) == sorted(
        p.name for p in tree.joinpath(*DATA, "val").iterdir()
    )


def test_same_inputs_same_dataset_and_rerun_is_a_no_op(tree, tmp_path):
    out = tmp_path / "bucket"
    a = build(tree, out)
    mtime = (out / MANIFEST_NAME).stat().st_mtime_ns
    b = build(tree, out)
    assert a == b and (out / MANIFEST_NAME).stat().st_mtime_ns == mtime
    other = build(tree, tmp_path / "other")
    assert other.dataset_id == a.dataset_id
    assert [s.crc32c for s in other.splits["train"].shards] == [s.crc32c for s in a.splits["train"].shards]
    shuffled = build(tree, tmp_path / "seed1", seed=1)
    assert shuffled.dataset_id != a.dataset_id


def test_out_holding_a_different_dataset_is_refused(tree, tmp_path):
    out = tmp_path / "bucket"
    first = build(tree, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for other in ({"classes": 3}, {"max_side": 4096}):  # another form is another dataset, even of the same bytes
        with pytest.raises(ConfigError, match="already holds a different dataset") as e:
            build(tree, out, **other)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("--out", str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched
    replaced = build(tree, out, classes=3, overwrite=True)
    assert replaced.num_classes == 3 and replaced.dataset_id != first.dataset_id


def test_foreign_folder_refused(tree, tmp_path):
    out = tmp_path / "bucket"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"\(e.g. notes.txt\)") as e:
        build(tree, out)
    assert (e.value.key, e.value.value) == ("--out", str(out))


def test_interrupted_build_leaves_no_manifest_and_reruns(tree, tmp_path):
    out = tmp_path / "bucket"
    out.mkdir()
    # What a killed run leaves: a partial temp file and a shard but no manifest.
    (out / ".train-00000-of-00004.tfrecord.partial-123-abc").write_bytes(b"half")
    (out / "train-00001-of-00004.tfrecord").write_bytes(b"stale")
    with pytest.raises(ManifestError, match="does not exist"):
        Manifest.load(open_storage(out))
    m = build(tree, out)
    assert not any(p.name.startswith(".") for p in out.iterdir())
    assert not (out / "train-00001-of-00004.tfrecord").exists()  # a shard no manifest uses is removed
    second = m.splits["train"].shards[1]
    assert second.name == f"train-00001-of-00004-{m.dataset_id[:8]}.tfrecord"
    assert crc32c_file(out / second.name) == second.crc32c
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", QUALITY_REPORT_NAME] + [s.name for split in m.splits.values() for s in split.shards])


def _corrupt(tree):
    train = tree.joinpath(*DATA, "train")
    good = sorted((train / "n90000000").iterdir())[0].read_bytes()
    (train / "n90000000" / "n90000000_2.JPEG").write_bytes(good[: len(good) // 2])  # truncated
    png = io.BytesIO()
    Image.new("RGB", (20, 20), (1, 2, 3)).save(png, "PNG")
    (train / "n90000001" / "n90000001_3.JPEG").write_bytes(png.getvalue())  # a PNG named .JPEG
    cmyk = io.BytesIO()
    Image.new("CMYK", (20, 20), (10, 20, 30, 0)).save(cmyk, "JPEG")
    (train / "n90000002" / "n90000002_4.JPEG").write_bytes(cmyk.getvalue())
    (tree.joinpath(*DATA, "val") / "ILSVRC2012_val_00000005.JPEG").write_bytes(b"")


def test_bad_images_are_all_listed_and_nothing_is_written(tree, tmp_path):
    _corrupt(tree)
    out = tmp_path / "bucket"
    with pytest.raises(ImageError) as e:
        build(tree, out)
    msg = str(e.value)
    # The PNG and the CMYK JPEG are repaired (spark_imagenet.dataset.quality); the unusable ones are all listed.
    assert "2 image file(s)" in msg and "--on-corrupt skip" in msg
    assert "n90000000_2.JPEG: JPEG does not decode" in msg
    assert "ILSVRC2012_val_00000005.JPEG: empty file (0 bytes)" in msg
    assert "n90000001_3.JPEG" not in msg and "n90000002_4.JPEG" not in msg
    assert not out.exists() or list(out.iterdir()) == []


def test_bad_shard_counts(tree, tmp_path):
    with pytest.raises(ConfigError, match=r"the number of train images \(45\)") as e:
        build(tree, tmp_path / "b", train_shards=46)
    assert (e.value.key, e.value.value) == ("--train-shards", 46)
    with pytest.raises(ConfigError) as e:
        build(tree, tmp_path / "b", verify="none")
    assert (e.value.key, e.value.value) == ("--verify", "none")


@requires_shared(ILSVRC_MINI)
def test_real_ilsvrc_mini_shards(tmp_path):
    m = shard(ILSVRC_MINI, tmp_path / "mini", train_shards=8, val_shards=2, progress=False)
    assert m.num_classes == 100
    assert [s.examples for s in m.splits["train"].shards] == [150] * 8
    assert m.splits["val"].examples == 300


def test_unwritable_out_and_failed_build_leave_nothing(tree, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    from spark_imagenet.errors import StorageError

    with pytest.raises(StorageError, match=r"cannot create or write this folder"):
        build(tree, blocker / "bucket")
    with pytest.raises(StorageError, match=r"a-file is a file, not a folder: give a folder for the shards"):
        build(tree, blocker)
    assert blocker.read_text() == "x"
    _corrupt(tree)
    with pytest.raises(ImageError):
        build(tree, tmp_path / "new-bucket")
    assert not (tmp_path / "new-bucket").exists()


def test_overwrite_removes_the_replaced_shards(tree, tmp_path):
    out = tmp_path / "bucket"
    build(tree, out, train_shards=5)
    m = build(tree, out, train_shards=3, overwrite=True)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([MANIFEST_NAME, QUALITY_REPORT_NAME] + [s.name for sp in m.splits.values() for s in sp.shards])


@pytest.mark.parametrize("inside", [".", "shards", "train/deeper"])
def test_an_out_inside_the_source_is_refused_before_anything_is_written(tree, inside):
    """Shards written into the source would become part of it (a later shard of it fails on them)."""
    before = sorted(p for p in tree.rglob("*"))
    out = tree / inside
    with pytest.raises(ConfigError) as e:
        shard(tree, out, train_shards=2, val_shards=1, processes=1, progress=False)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("--out", str(out))
    assert sorted(p for p in tree.rglob("*")) == before


def _cmyk_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("CMYK", (20, 20), (10, 20, 30, 0)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("bug", [RuntimeError("a bug in the repair"), TypeError("a bug in the repair")])
def test_a_bug_in_the_repair_surfaces_also_with_on_corrupt_skip(tree, tmp_path, monkeypatch, bug):
    """Only the decoder's own errors make an image corrupt; any other error raised while repairing is a bug
    and must not turn every repaired image into a skipped one."""
    import spark_imagenet.dataset.shard_writer as shard_writer
    from spark_imagenet.source.folder import FileReader

    def broken_repair(data, finding, max_pixels, form):
        raise bug

    monkeypatch.setattr(shard_writer, "repair", broken_repair)
    with pytest.raises(type(bug), match="a bug in the repair"):
        shard_writer.check_image(_cmyk_jpeg(), "cmyk.JPEG")
    cmyk = tree.joinpath(*DATA, "train", "n90000000", "n90000000_1.JPEG")
    cmyk.write_bytes(_cmyk_jpeg())
    img = shard_writer.ImageFile(str(cmyk), 0, "n90000000", cmyk.stat().st_size)
    job = shard_writer.ShardJob("train", 0, "train-00000-of-00001.tfrecord", str(tmp_path / "shard.partial"), (img,),
                                "decode", FileReader(), on_corrupt="skip")
    with pytest.raises(type(bug), match="a bug in the repair"):
        shard_writer.write_shard(job)  # what a worker process runs
    with pytest.raises(type(bug), match="a bug in the repair"):
        shard_writer.check_and_frame([(img, cmyk.read_bytes())], "decode")  # the stream form's worker step


@pytest.mark.parametrize("error", [OSError("broken data stream"), SyntaxError("broken PNG file")])
def test_a_decoder_error_in_the_repair_is_a_corrupt_image(monkeypatch, error):
    import spark_imagenet.dataset.shard_writer as shard_writer

    def failing_decode(data, finding, max_pixels, form):
        raise error

    monkeypatch.setattr(shard_writer, "repair", failing_decode)
    stored, _h, _w, finding = shard_writer.check_image(_cmyk_jpeg(), "cmyk.JPEG")
    assert stored is None and finding.category == "corrupt"
    assert finding.reason == f"does not decode for repair: {error}"
