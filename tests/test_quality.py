"""Data quality while sharding: each kind of bad file, generated with Pillow, classified, repaired or skipped."""

from __future__ import annotations

import io
import json
import os
import random

import numpy as np
import pytest
from PIL import Image, ImageOps

from data_util import small_layout
from own_images import huge_png
from record_util import read_records
from spark_imagenet.errors import ImageError
from spark_imagenet.dataset.quality import classify, repair
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME
from spark_imagenet.dataset.sharding import shard

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DATA = ("ILSVRC", "Data", "CLS-LOC")
#: Mean absolute difference (0..255 levels) allowed between a repaired image as TensorFlow decodes it and
#: the original as Pillow decodes it (one quality-95 re-encode plus decoder differences).
TOLERANCE = 4.0
#: kind -> (category, action in the report or None when stored as it is)
KINDS = {
    "cmyk": ("cmyk", "repaired"),
    "ycck": ("ycck", "repaired"),
    "png": ("not_jpeg", "repaired"),
    "gif": ("not_jpeg", "repaired"),
    "gray": ("grayscale", None),
    "exif6": ("exif_rotated", "repaired"),
    "truncated": ("corrupt", "skipped"),
    "empty": ("empty", "skipped"),
}


def content(width: int = 64, height: int = 48) -> Image.Image:
    """An RGB image whose orientation shows: smooth gradients and a red block in the top-left corner."""
    y, x = np.mgrid[0:height, 0:width]
    arr = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x + y) * 255 // (width + height - 2)], -1)
    arr[: height // 4, : width // 4] = (220, 30, 30)
    return Image.fromarray(arr.astype(np.uint8), "RGB")


def jpeg_bytes(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=95, **kw)
    return buf.getvalue()


def ycck_jpeg(im: Image.Image) -> bytes:
    """A YCCK JPEG of ``im``. Pillow cannot write YCCK (its JPEG encoder has no YCCK mode), so: take
    ``im``'s CMYK planes (c, m, y, k) as Pillow reads them, compute the YCC of (c, m, y) (what libjpeg's
    YCCK decoder turns back into inverted CMY), write the planes (Y, Cb, Cr, k) as an Adobe CMYK JPEG
    (Pillow writes the inverted samples, the Adobe convention, so they are given inverted) and patch
    the Adobe APP14 transform byte from 0 (CMYK) to 2 (YCCK)."""
    c, m, y, k = (np.asarray(p) for p in im.convert("CMYK").split())
    ycc = Image.fromarray(np.dstack([c, m, y]), "RGB").convert("YCbCr")
    planes = [255 - np.asarray(p) for p in ycc.split()] + [k]
    data = bytearray(jpeg_bytes(Image.fromarray(np.dstack(planes).astype(np.uint8), "CMYK")))
    at = data.index(b"\xff\xee")  # APP14: marker, 2 length bytes, "Adobe", version(2), flags0(2), flags1(2), transform
    assert data[at + 4: at + 9] == b"Adobe" and data[at + 15] == 0
    data[at + 15] = 2
    return bytes(data)


def make(kind: str) -> bytes:
    im = content()
    if kind == "cmyk":
        return jpeg_bytes(im.convert("CMYK"))
    if kind == "ycck":
        return ycck_jpeg(im)
    if kind in ("png", "gif"):
        buf = io.BytesIO()
        im.save(buf, kind.upper())
        return buf.getvalue()
    if kind == "gray":
        return jpeg_bytes(im.convert("L"))
    if kind == "exif6":
        exif = Image.Exif()
        exif[0x0112] = 6  # display = stored pixels rotated 90 degrees clockwise
        return jpeg_bytes(im, exif=exif)
    if kind == "truncated":
        data = jpeg_bytes(im)
        return data[: len(data) // 2]
    assert kind == "empty"
    return b""


def expected_rgb(data: bytes) -> np.ndarray:
    """What the stored image must look like: the original as Pillow decodes it, upright, RGB."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"), dtype=np.float32)


@pytest.fixture
def bad_tree(tmp_path):
    """A small Kaggle tree with one file of each kind in train and in val; returns (tree, {path: kind})."""
    tree = small_layout(tmp_path / "src", num_classes=4, train_per_class=4, val_per_class=3)
    train = sorted(tree.joinpath(*DATA, "train").rglob("*.JPEG"))
    val = sorted(tree.joinpath(*DATA, "val").glob("*.JPEG"))
    kinds = {}
    for files in (train, val):
        for path, kind in zip(files[::1], KINDS):
            path.write_bytes(make(kind))
            kinds[path] = kind
    return tree, kinds


def build(tree, out, **kw):
    return shard(tree, out, train_shards=3, val_shards=2, processes=2, progress=False, **kw)


def all_records(out, manifest) -> dict[str, dict]:
    import tensorflow as tf

    recs = {}
    for split in manifest.splits.values():
        for s in split.shards:
            with open(out / s.name, "rb") as f:
                for raw in read_records(f):
                    feats = tf.train.Example.FromString(raw).features.feature
                    rec = {k: getattr(v, v.WhichOneof("kind")).value[0] for k, v in feats.items()}
                    recs[rec["image/filename"].decode()] = rec
    return recs


def test_classify_each_kind():
    found = {kind: classify(make(kind), kind) for kind in KINDS}
    for kind, (category, _) in KINDS.items():
        assert found[kind].category == category, (kind, found[kind])
    assert found["cmyk"].colorspace == "CMYK" and found["ycck"].colorspace == "YCCK"
    assert found["png"].format == "PNG" and found["gif"].format == "GIF"
    assert found["gray"].colorspace == "L" and found["exif6"].orientation == 6
    assert classify(jpeg_bytes(content()), "ok").colorspace == "YCbCr"
    assert classify(jpeg_bytes(content()), "ok").category == "ok"
    assert "does not decode" in found["truncated"].reason and found["empty"].reason == "empty file (0 bytes)"
    with pytest.raises(ValueError):
        repair(b"", found["empty"])
    # A file that needs nothing is returned as it is, not decoded.
    gray = make("gray")
    assert repair(gray, found["gray"])[0] is gray


@pytest.mark.parametrize("kind", ["cmyk", "ycck"])
def test_cmyk_and_ycck_repair_to_the_right_colours(kind):
    """Known colours: CMYK (0, 255, 255, 0) is red, (255, 0, 255, 0) green, (0, 0, 0, 255) black (Pillow's
    Adobe-inverted reading of the file; the file holds the inverted samples, as Photoshop writes them)."""
    for cmyk, rgb in (((0, 255, 255, 0), (255, 0, 0)), ((255, 0, 255, 0), (0, 255, 0)), ((0, 0, 0, 255), (0, 0, 0)),
                      ((0, 0, 0, 0), (255, 255, 255))):
        im = Image.new("CMYK", (16, 16), cmyk)
        data = jpeg_bytes(im) if kind == "cmyk" else ycck_jpeg(im)
        finding = classify(data, kind)
        assert finding.category == kind
        fixed, h, w = repair(data, finding)
        with Image.open(io.BytesIO(fixed)) as out:
            assert out.mode == "RGB" and (h, w) == (16, 16)
            mean = np.asarray(out, dtype=np.float32).reshape(-1, 3).mean(0)
        assert np.abs(mean - rgb).max() < 4, (cmyk, mean)


def test_shard_repairs_skips_and_reports_every_kind(log_lines, bad_tree, tmp_path):
    import tensorflow as tf

    tree, kinds = bad_tree
    out = tmp_path / "bucket"
    logged = log_lines
    logged.clear()  # the lines from here on
    m = build(tree, out, on_corrupt="skip")
    report = json.loads((out / QUALITY_REPORT_NAME).read_text())
    by_file = {f["file"]: f for f in report["files"]}
    for path, kind in kinds.items():
        category, action = KINDS[kind]
        rel = path.relative_to(tree).as_posix()
        if action is None:
            assert rel not in by_file
        else:
            assert (by_file[rel]["category"], by_file[rel]["action"]) == (category, action), rel
            assert by_file[rel]["reason"]
    assert len(report["files"]) == 2 * sum(action is not None for _, action in KINDS.values())
    # Counts per category per split; totals reconcile: files found = examples written + files skipped.
    for split, total in (("train", 16), ("val", 12)):
        s = report["splits"][split]
        assert s["categories"] == {"empty": 1, "corrupt": 1, "not_jpeg": 2, "ycck": 1, "cmyk": 1,
                                   "exif_rotated": 1, "grayscale": 1, "ok": total - 8}
        assert (s["files"], s["examples"], s["skipped"], s["repaired"]) == (total, total - 2, 2, 5)
        assert m.splits[split].examples == total - 2
        assert m.selection["quality"][split] == {k: s[k] for k in ("files", "examples", "repaired", "skipped")}
    assert m.selection["on_corrupt"] == "skip"
    assert any("grayscale" in line for line in logged) and any("28 files found = 24 examples" in line for line in logged)

    recs = all_records(out, m)
    assert len(recs) == 24
    for path in sorted(tree.joinpath(*DATA).rglob("*.JPEG")):
        if "test" in path.parts:
            continue
        kind = kinds.get(path)
        original = path.read_bytes()
        if kind in ("truncated", "empty"):
            assert path.name not in recs  # skipped
            continue
        rec = recs[path.name]  # the record keeps the original file name
        stored = rec["image/encoded"]
        if kind is None or kind == "gray":
            assert stored == original, path.name  # untouched: byte for byte
        else:
            assert stored != original and stored[:3] == b"\xff\xd8\xff"
        image = tf.io.decode_jpeg(stored, channels=3).numpy()
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
        assert (rec["image/height"], rec["image/width"]) == image.shape[:2]
        want = expected_rgb(original)
        assert image.shape == want.shape, (path.name, image.shape, want.shape)
        diff = np.abs(image.astype(np.float32) - want).mean()
        assert diff < TOLERANCE, (path.name, kind, diff)
        if kind == "exif6":  # upright: the red block is now in the top-right corner, and the image is portrait
            assert image.shape[:2] == (64, 48)
            assert image[:8, -6:, 0].mean() > 180 and image[:8, :6, 0].mean() < 150
            assert 0x0112 not in Image.open(io.BytesIO(stored)).getexif()  # the tag is dropped

    # The training pipeline's eval path reads every record (no decode error left).
    from spark_imagenet.training.worker import pipeline

    files = [str(out / s.name) for s in m.splits["val"].shards]
    n = m.splits["val"].examples
    for images, labels, weights in pipeline.eval_dataset(files, 5, 32, 1, None, n, 2):
        assert images.shape == (5, 32, 32, 3)


def test_error_mode_lists_every_corrupt_file_and_writes_nothing(bad_tree, tmp_path):
    tree, kinds = bad_tree
    out = tmp_path / "bucket"
    with pytest.raises(ImageError) as e:
        build(tree, out)
    msg = str(e.value)
    bad = sorted(p for p, k in kinds.items() if k in ("truncated", "empty"))
    assert f"{len(bad)} image file(s)" in msg and len(bad) == 4
    for p in bad:
        assert str(p) in msg
    assert not out.exists()


def test_skip_mode_is_another_dataset(tmp_path):
    tree = small_layout(tmp_path / "src", num_classes=2, train_per_class=3, val_per_class=2)
    a = build(tree, tmp_path / "a")
    b = build(tree, tmp_path / "b", on_corrupt="skip")
    assert a.dataset_id != b.dataset_id and a.splits["train"].examples == b.splits["train"].examples == 6
    from spark_imagenet.errors import ConfigError

    with pytest.raises(ConfigError, match="--on-corrupt"):
        build(tree, tmp_path / "c", on_corrupt="ignore")


def test_decode_failure_in_training_names_shard_and_record(tmp_path):
    """A bad JPEG that still reaches training (here written past the builder) is named, not a bare
    InvalidArgumentError."""
    import tensorflow as tf

    from spark_imagenet.training.worker import pipeline
    from spark_imagenet.dataset.tfrecord import encode_example, write_record

    shard_path = tmp_path / "val-00000-of-00001.tfrecord"
    good = jpeg_bytes(content())
    with open(shard_path, "wb") as f:
        for k, data in enumerate([good, good[: len(good) // 2], good]):
            write_record(f, encode_example({
                "image/encoded": data, "image/format": b"JPEG", "image/class/label": 0,
                "image/class/synset": b"n90000000", "image/height": 48, "image/width": 64,
                "image/filename": f"img_{k}.JPEG"}))
    files = [str(shard_path)]
    with pytest.raises(ImageError) as e:
        with pipeline.naming_bad_records(files, parallel=1):
            for _ in pipeline.eval_dataset(files, 3, 32, 1, None, 3, 1):
                pass
    assert not isinstance(e.value, tf.errors.InvalidArgumentError)
    assert str(shard_path) in str(e.value) and "img_1.JPEG" in str(e.value)


def test_cli_on_corrupt_skip_prints_the_summary(bad_tree, tmp_path, capsys):
    from spark_imagenet.cli import run

    tree, _ = bad_tree
    out = tmp_path / "bucket"
    assert run(["shard", str(tree), "--out", str(out), "--train-shards", "2", "--val-shards", "1",
                "--processes", "1", "--no-progress", "--on-corrupt", "skip"]) == 0
    err = capsys.readouterr().err
    assert "image quality (train / val):" in err
    assert "  cmyk          1 / 1" in err and "  corrupt       1 / 1" in err and "  ok            8 / 4" in err
    assert "28 files found = 24 examples written + 4 skipped; 10 repaired" in err
    assert json.loads((out / QUALITY_REPORT_NAME).read_text())["on_corrupt"] == "skip"


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
def test_high_bit_depth_images_are_scaled_not_clipped(mode):
    """A 16-bit or 32-bit greyscale file is repaired to the same picture at 8 bits (Pillow's convert("RGB")
    alone clips such values to a white or black image)."""
    ramp8 = np.tile(np.arange(256, dtype=np.uint16), (32, 1))  # a left-to-right grey ramp
    if mode == "F":
        im = Image.fromarray((ramp8 / 255.0).astype(np.float32), "F")
        fmt = "TIFF"
    else:
        im = Image.fromarray(ramp8 * 257).convert(mode) if mode == "I" else Image.fromarray(ramp8 * 257)
        fmt = "PNG" if mode == "I;16" else "TIFF"
    buf = io.BytesIO()
    im.save(buf, fmt)
    finding = classify(buf.getvalue(), "deep.JPEG")
    assert finding.category == "not_jpeg", finding
    jpeg, height, width = repair(buf.getvalue(), finding)
    got = np.asarray(Image.open(io.BytesIO(jpeg)).convert("L"), dtype=np.float64)
    assert (height, width) == (32, 256)
    assert abs(got.mean() - ramp8.mean()) < 3 and np.abs(got - ramp8).mean() < 3


def test_the_pixel_limit_is_read_from_the_header_and_pillows_own_check_never_shows(monkeypatch):
    """Above the limit: ``corrupt``, the reason naming the size, the limit and the option, nothing decoded (the
    900-megapixel PNG holds a few dozen bytes). At or below it: classified and repaired as usual, also where
    Pillow's own limit (PIL.Image.MAX_IMAGE_PIXELS) is far lower; Pillow warns of nothing, and its setting is left
    as it was."""
    import warnings

    from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, check_max_pixels
    from spark_imagenet.errors import ConfigError

    found = classify(huge_png(30000, 30000), "bomb.png")
    assert found.category == "corrupt" and found.reason.startswith(
        "30000 x 30000 pixels (900.0 megapixels) is above the limit of 100 megapixels; "), found
    assert "--max-image-pixels" in found.reason and DEFAULT_MAX_PIXELS == 100_000_000
    png = io.BytesIO()
    Image.new("RGB", (100, 50), (10, 200, 30)).save(png, "PNG")
    assert classify(png.getvalue(), "p.png", max_pixels=4999).reason.startswith("100 x 50 pixels (0.0 megapixels)")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow alone: an error above 2,000 pixels
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        finding = classify(png.getvalue(), "p.png", max_pixels=5000)
        assert finding.category == "not_jpeg", finding
        assert repair(png.getvalue(), finding, max_pixels=5000)[1:] == (50, 100)
    assert Image.MAX_IMAGE_PIXELS == 1000
    for bad in (0, -1, 1.5, True, "100"):
        with pytest.raises(ConfigError, match="max_image_pixels="):
            check_max_pixels(bad)


def test_unrecognised_bytes_have_a_stable_reason():
    """Bytes of no format get one plain reason (no memory address), the same on every run. Seeded bytes: some
    random ones start like a format Pillow tries (0x1C, IPTC), which gives another, also stable, reason."""
    noise = [random.Random(seed).randbytes(1000).replace(b"\x1c", b"\x00") for seed in range(3)]
    reasons = {classify(b"\x00" + data[1:], "x.JPEG").reason for data in noise}
    assert reasons == {"not an image in any format Pillow recognises"}


def test_header_mode_catches_truncation_by_end_marker():
    raw = jpeg_bytes(content())
    assert classify(raw, "a", "header").category == "ok"
    cut = classify(raw[:-100], "a", "header")
    assert cut.category == "corrupt" and "no end-of-image marker" in cut.reason
    found = classify(raw, "a", "decode")
    assert found.category == "ok" and found.height > 0 and found.width > 0


def _with_thumbnail(data: bytes) -> bytes:
    """``data`` with a JPEG (holding its own end-of-image marker) inside an APP1 segment after SOI."""
    thumb = jpeg_bytes(content(16, 12))
    body = b"Exif\x00\x00" + thumb  # not a valid EXIF block: Pillow ignores it; the marker walk must skip it
    return data[:2] + b"\xff\xe1" + (len(body) + 2).to_bytes(2, "big") + body + data[2:]


TRAILERS = {"newline": b"\n", "padding": b"\x00" * 512, "garbage": b"\x12\x34not an image",
            "second jpeg": jpeg_bytes(content(32, 24))}


@pytest.mark.parametrize("verify", ["header", "decode"])
@pytest.mark.parametrize("trailer", sorted(TRAILERS))
@pytest.mark.parametrize("variant", ["baseline", "progressive", "thumbnail"])
def test_bytes_after_the_end_of_image_marker_are_accepted(verify, trailer, variant):
    """TensorFlow and Pillow decode a JPEG followed by other bytes; so does the check, in both modes."""
    raw = jpeg_bytes(content(), progressive=variant == "progressive")
    if variant == "thumbnail":
        raw = _with_thumbnail(raw)
    assert classify(raw, "a", verify).category == "ok"
    found = classify(raw + TRAILERS[trailer], "a", verify)
    assert found.category == "ok", found.reason
    # Cut inside its first scan, the same file is still caught (the thumbnail's marker is not the image's).
    cut = raw.index(b"\xff\xda") + 20
    assert classify(raw[:cut] + TRAILERS[trailer], "a", "header").category == "corrupt"


def test_a_real_jpeg_with_trailing_bytes_is_stored_as_read(tmp_path):
    """Through shard, in both verify modes: nothing is dropped, and the bytes are stored as they are."""
    import tensorflow as tf

    tree = small_layout(tmp_path / "src", num_classes=2, train_per_class=4, val_per_class=1)
    files = sorted(tree.joinpath(*DATA, "train").rglob("*.JPEG"))
    for path, trailer in zip(files, TRAILERS.values()):
        path.write_bytes(path.read_bytes() + trailer)
    for verify in ("header", "decode"):
        out = tmp_path / verify
        m = shard(tree, out, train_shards=1, val_shards=1, processes=1, verify=verify, progress=False)
        assert m.selection["quality"]["train"] == {"files": 8, "examples": 8, "repaired": 0, "skipped": 0}
        stored = {r["image/filename"].decode(): r for r in all_records(out, m).values()}
        for path in files[: len(TRAILERS)]:
            rec = stored[path.name]
            assert rec["image/encoded"] == path.read_bytes()
            assert tf.io.decode_jpeg(rec["image/encoded"], channels=3).shape[:2] == (rec["image/height"],
                                                                                    rec["image/width"])


def _full_decode_refuses(data: bytes) -> bool:
    """The reference: Pillow decodes the file at full size in its own colour mode (what the converter does)."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
        return False
    except Exception:
        return True


def _damaged(raw: bytes, rng) -> dict[str, bytes]:
    """Cut and damaged variants of a JPEG: cut at the end of every scan's data and inside it, entropy-coded
    bytes changed, runs of them removed or zeroed."""
    scans = [i for i in range(len(raw) - 1) if raw[i:i + 2] == b"\xff\xda"]
    out = {"cut before EOI": raw[:-2]}
    for k, at in enumerate(scans):
        out[f"cut in scan {k}"] = raw[:at + 12 + (len(raw) - at) // 3]
        out[f"cut at scan {k}"] = raw[:at]
    start = scans[0] + 14
    for k in range(12):
        p = rng.randrange(start, len(raw) - 4)
        flipped = bytearray(raw)
        flipped[p] ^= rng.randrange(1, 256)
        out[f"flip {k}"] = bytes(flipped)
        out[f"hole {k}"] = raw[:p] + raw[p + rng.randrange(1, 200):]
        out[f"zeros {k}"] = raw[:p] + bytes(64) + raw[p + 64:]
    return out


@pytest.mark.parametrize("mode", ["YCbCr", "RGB", "L"])
@pytest.mark.parametrize("progressive", [False, True])
def test_decode_check_refuses_exactly_what_a_full_colour_decode_refuses(mode, progressive):
    """The decode check (1/8 scale, grayscale output, the whole file in one decoder call) still reads every
    coefficient of every component in every scan: on cut and damaged baseline and progressive JPEGs (YCbCr,
    Adobe RGB, grayscale), it refuses exactly the files that Pillow's full-size decode in the file's own mode
    refuses, and every file cut short (any scan, or only the end-of-image marker) is refused."""
    import random

    rng = random.Random(f"{mode}{progressive}")
    noise = np.random.default_rng(3).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    im = Image.blend(content(160, 120), Image.fromarray(noise, "RGB"), 0.3).convert("L" if mode == "L" else "RGB")
    raw = jpeg_bytes(im, progressive=progressive, keep_rgb=mode == "RGB")
    found = classify(raw, "a")
    assert (found.category, found.colorspace) == ("grayscale" if mode == "L" else "ok", mode)
    for what, data in _damaged(raw, rng).items():
        found = classify(data, what)
        assert (found.category == "corrupt") == _full_decode_refuses(data), (what, found)
        if what.startswith("cut"):
            assert found.category == "corrupt" and "does not decode" in found.reason, (what, found)
