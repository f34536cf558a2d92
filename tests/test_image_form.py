"""The stored image forms (spark_imagenet.dataset.image_form): ``shard --resize N`` / ``--max-side N`` /
``--jpeg-quality Q`` checked in one place, the one re-encode (``quality.repair``) on real Pillow images, and the
manifest's ``image_form`` (old manifests read as ``original``). No Spark, no TensorFlow."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from spark_imagenet.dataset.image_form import DEFAULT_JPEG_QUALITY, ORIGINAL, ImageForm, image_form
from spark_imagenet.dataset.manifest import Manifest, ShardInfo, SplitInfo
from spark_imagenet.dataset.quality import ORIENTATION_TAG, classify, repair
from spark_imagenet.errors import ConfigError, ManifestError
from spark_imagenet.source.synset import SynsetClass

RESIZE_256 = image_form(resize=256)


def encoded(size: tuple[int, int], mode: str = "RGB", fmt: str = "JPEG", noise: bool = True, **save) -> bytes:
    """An image of ``size`` (width, height): a left/right split of two colours (so a crop or a turn shows), with
    seeded noise (so the JPEG quality matters), in ``mode`` and ``fmt``."""
    import random

    rng = random.Random(7)
    im = Image.new("RGB", size, (200, 30, 30))
    im.paste((30, 30, 200), (size[0] // 2, 0, size[0], size[1]))
    for _ in range(size[0] * size[1] // 20 if noise else 0):
        im.putpixel((rng.randrange(size[0]), rng.randrange(size[1])), tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    im.convert(mode).save(out, fmt, **save)
    return out.getvalue()


def stored(data: bytes, form: ImageForm) -> tuple[bytes, Image.Image]:
    """What ``repair`` stores for ``data`` in ``form``, and that JPEG opened."""
    result, height, width = repair(data, classify(data, "x"), form=form)
    image = Image.open(io.BytesIO(result))
    assert image.size == (width, height)  # the sizes the record states are the stored image's
    return result, image


# ------------------------------------------------------------------ the settings
@pytest.mark.parametrize("given, key, value", [
    (dict(resize=256, max_side=320), "resize", 256), (dict(resize=0), "resize", 0), (dict(max_side=-3), "max_side", -3),
    (dict(max_side=1), "max_side", 1), (dict(max_side=10_000), "max_side", 10_000), (dict(resize=256.0), "resize", 256.0),
    (dict(resize=256, jpeg_quality=0), "jpeg_quality", 0), (dict(max_side=64, jpeg_quality=101), "jpeg_quality", 101),
    (dict(jpeg_quality=80), "jpeg_quality", 80),
])
def test_bad_settings_are_refused_in_one_line_naming_the_option(given, key, value):
    with pytest.raises(ConfigError) as e:
        image_form(**given)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)
    assert "\n" not in str(e.value)


def test_a_bad_size_is_worded_with_the_option_and_the_range():
    """Wording test (image forms): the setting, its option, the range and an example."""
    with pytest.raises(ConfigError, match=r"^resize=0 \(--resize\): give the size in pixels as a whole number from 16 "
                                          r"to 8192 \(e\.g\. --resize 256, the paper's form\)$"):
        image_form(resize=0)


def test_the_forms_their_labels_and_sizes():
    assert image_form() is ORIGINAL and ORIGINAL.label == "original"
    assert RESIZE_256 == ImageForm("resize", 256, DEFAULT_JPEG_QUALITY) and RESIZE_256.label == "resize 256 q90"
    assert image_form(max_side=320, jpeg_quality=75).label == "max-side 320 q75"
    for form in (ORIGINAL, RESIZE_256, image_form(max_side=320, jpeg_quality=75)):
        assert ImageForm.parse(form.label) == form
    for bad in ("resize 256", "resize 0 q90", "thumbnail 64 q90"):
        with pytest.raises((ValueError, ConfigError)):
            ImageForm.parse(bad)
    assert RESIZE_256.target(500, 375) == (256, 256) and RESIZE_256.target(256, 256) is None
    assert RESIZE_256.crop_box(500, 375) == (62.5, 0, 437.5, 375)  # the centre square of the shorter side
    max_320 = image_form(max_side=320)
    assert max_320.target(500, 375) == (320, 240) and max_320.target(375, 500) == (240, 320)
    assert max_320.target(320, 100) is None and max_320.target(2000, 1) == (320, 1)
    assert ORIGINAL.target(5000, 5000) is None


def test_the_command_line_checks_the_form_before_anything_runs(tmp_path):
    from spark_imagenet.cli import build_parser
    from spark_imagenet.dataset.shard_options import check_shard_arguments, form_arguments

    def args(*given: str):
        return build_parser().parse_args(["shard", str(tmp_path / "src"), "--out", str(tmp_path / "o"), *given])

    assert form_arguments(args("--resize", "256")) == {"resize": 256, "max_side": None, "jpeg_quality": None}
    check_shard_arguments(args("--max-side", "320", "--jpeg-quality", "85"))
    for given, message in ((("--resize", "256", "--max-side", "320"), "give one of the two"),
                           (("--jpeg-quality", "90"), "only with --resize N or --max-side N"),
                           (("--resize", "0"), r"resize=0 \(--resize\)")):
        with pytest.raises(ConfigError, match=message):
            check_shard_arguments(args(*given))


# ------------------------------------------------------------------ the re-encode
@pytest.mark.parametrize("size", [(500, 375), (375, 500), (100, 60), (1024, 256)])
def test_resize_stores_the_centre_square_at_the_size_scaling_up_too(size):
    _, image = stored(encoded(size), RESIZE_256)
    assert image.size == (256, 256) and image.format == "JPEG" and image.mode == "RGB"
    if size[0] > size[1]:  # the centre square of a wide image: both colours, split in the middle
        assert image.getpixel((10, 128))[0] > 150 and image.getpixel((245, 128))[2] > 150


@pytest.mark.parametrize("size, expected", [((640, 480), (320, 240)), ((480, 640), (240, 320)),
                                            ((1000, 100), (320, 32))])
def test_max_side_keeps_the_aspect_ratio(size, expected):
    assert stored(encoded(size), image_form(max_side=320))[1].size == expected


def test_max_side_never_scales_up_and_stores_a_small_jpeg_as_it_is():
    small = encoded((200, 150))
    assert repair(small, classify(small, "x"), form=image_form(max_side=320)) == (small, 150, 200)
    exact = encoded((256, 256), noise=False)
    assert repair(exact, classify(exact, "x"), form=RESIZE_256)[0] is exact  # already the paper's form


def test_the_jpeg_quality_changes_the_bytes():
    data = encoded((640, 480))
    low, _ = stored(data, image_form(resize=256, jpeg_quality=30))
    high, _ = stored(data, image_form(resize=256, jpeg_quality=95))
    default, _ = stored(data, RESIZE_256)
    assert len(low) < len(default) < len(high)


def test_the_exif_orientation_is_applied_before_the_scale():
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = 6  # rotate 90 degrees clockwise to view: the stored 640 x 480 is upright 480 x 640
    data = encoded((640, 480), exif=exif.tobytes())
    result, image = stored(data, image_form(max_side=320))
    assert image.size == (240, 320) and ORIENTATION_TAG not in image.getexif()
    assert image.getpixel((120, 10))[0] > 150 and image.getpixel((120, 310))[2] > 150  # red on top after the turn


@pytest.mark.parametrize("mode, fmt", [("CMYK", "JPEG"), ("L", "JPEG"), ("RGBA", "PNG"), ("P", "PNG")])
def test_cmyk_grayscale_and_png_become_rgb_jpegs(mode, fmt):
    for form in (RESIZE_256, image_form(max_side=64)):
        _, image = stored(encoded((300, 200), mode, fmt), form)
        assert image.format == "JPEG" and image.mode == "RGB"
        assert image.size == form.target(300, 200)


def test_the_check_reads_the_source_bytes_not_the_stored_ones():
    """A grayscale JPEG is still found grayscale and a PNG not_jpeg (the quality report's words), whatever the
    form stores for them."""
    from spark_imagenet.dataset.shard_writer import check_image

    for data, category in ((encoded((300, 200), "L"), "grayscale"), (encoded((300, 200), fmt="PNG"), "not_jpeg")):
        result, height, width, finding = check_image(data, "x", form=RESIZE_256)
        assert finding.category == category and (width, height) == (256, 256) and result[:2] == b"\xff\xd8"


# ------------------------------------------------------------------ the manifest
def _manifest(form: ImageForm) -> Manifest:
    shards = (ShardInfo("train-00000-of-00001-ab.tfrecord", 3, 100, "AAAAAA=="),)
    return Manifest("ab" * 16, "2026-01-01T00:00:00+00:00", (SynsetClass(0, "cat", ("cat",)),),
                    {"train": SplitInfo(shards), "val": SplitInfo(shards)}, image_form=form)


def test_the_manifest_records_the_form_and_old_manifests_read_as_original():
    for form in (RESIZE_256, image_form(max_side=320, jpeg_quality=80), ORIGINAL):
        manifest = _manifest(form)
        assert manifest.to_json()["image_form"] == form.label
        assert Manifest.loads(manifest.dumps()) == manifest
    old = _manifest(ORIGINAL).to_json()
    del old["image_form"]  # written before the field existed
    assert Manifest.from_json(old).image_form == ORIGINAL
    old["image_form"] = "thumbnail"
    with pytest.raises(ManifestError, match=r"^manifest: malformed entry .*'thumbnail'"):
        Manifest.from_json(old)
