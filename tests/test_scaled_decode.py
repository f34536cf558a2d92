"""Decoding the training crop at a reduced DCT scale (preprocessing.decode_window, issue 35 part 2).

Small synthetic JPEGs made with Pillow (smooth, photo-like: a horizontal and a vertical ramp and a slow wave,
so a misplaced window shows as a level shift). What is checked: the window is drawn as without the scaled
decode (the same pixels are asked for); the ratio is the largest that keeps S pixels a side, and 1 below 2S;
the scaled window's coordinates (those decode_and_crop_jpeg takes with a ratio: docs/design.md, 'Decoding at
a reduced scale'); and how close the two outputs are.
"""

from __future__ import annotations

import io
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

from spark_imagenet.training.worker import preprocessing  # noqa: E402

RATIOS = preprocessing.DECODE_RATIOS
#: (height, width) of the test images: odd sides, so the scaled image's last row and column are partial.
SHAPES = ((241, 321), (333, 250))
#: Output sides S: with these images, every ratio of RATIOS is chosen for some window.
SIZES = (16, 40, 100)
#: Largest mean absolute difference, in 0..255 levels, between train_image's output with and without the
#: scaled decode, per ratio (measured on these images, TF 2.21: 2.04, 3.02 and 5.92; it grows with the ratio
#: because each window edge may move by up to ratio / 2 stored pixels). Real photos: docs/design.md.
MAX_MEAN_ABS_DIFF = {2: 3.0, 4: 4.5, 8: 8.0}


def smooth_jpeg(height: int, width: int) -> bytes:
    """A photo-like test image: red rises left to right, green top to bottom, blue a slow wave (quality 90)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 17.0) * np.cos(y / 23.0)], -1)
    out = io.BytesIO()
    Image.fromarray(pixels.round().astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def windows(height: int, width: int, count: int):
    """``count`` training crop windows of an image of this shape (the pipeline's stateless draw)."""
    shape = tf.constant([height, width, 3])
    for k in range(count):
        yield preprocessing.random_crop_window(shape, stateless_seed=tf.constant([5, k], tf.int64))


def test_the_ratio_is_the_largest_that_keeps_s_pixels_a_side():
    chosen = set()
    for height, width in SHAPES:
        for window in windows(height, width, 50):
            side = int(tf.minimum(window[2], window[3]))
            for size in SIZES:
                ratio = RATIOS[int(preprocessing.decode_ratio(window, size))]
                chosen.add(ratio)
                assert ratio == 1 or side >= ratio * size  # never below the output size
                assert ratio == RATIOS[-1] or side < 2 * ratio * size  # the largest such ratio
                if side < 2 * size:
                    assert ratio == 1
    assert chosen == set(RATIOS)


def test_the_scaled_window_is_the_window_divided_by_the_ratio():
    for height, width in SHAPES:
        for window in windows(height, width, 50):
            y, x, h, w = window.numpy().tolist()
            for ratio in RATIOS:
                sy, sx, sh, sw = preprocessing.scaled_window(window, ratio).numpy().tolist()
                for scaled, edge in ((sy, y), (sx, x), (sy + sh, y + h), (sx + sw, x + w)):
                    assert abs(scaled * ratio - edge) <= ratio / 2  # each edge within half a scaled pixel
                assert sh >= h // ratio and sw >= w // ratio
                assert sy + sh <= -(-height // ratio) and sx + sw <= -(-width // ratio)  # inside ceil(side / r)


def test_decode_window_cuts_the_scaled_image_at_the_scaled_window():
    height, width = SHAPES[0]
    jpeg = tf.constant(smooth_jpeg(height, width))
    scaled_images = {r: tf.io.decode_jpeg(jpeg, channels=3, ratio=r).numpy() for r in RATIOS}
    assert {r: im.shape[:2] for r, im in scaled_images.items()} == {
        r: (-(-height // r), -(-width // r)) for r in RATIOS}  # libjpeg rounds the scaled sides up
    for window in windows(height, width, 12):
        for size in SIZES:
            ratio = RATIOS[int(preprocessing.decode_ratio(window, size))]
            sy, sx, sh, sw = preprocessing.scaled_window(window, ratio).numpy().tolist()
            crop = preprocessing.decode_window(jpeg, window, size, scaled=True).numpy()
            assert crop.shape == (sh, sw, 3)
            assert ratio == 1 or (sh >= size and sw >= size)  # never decoded below the output size
            expected = scaled_images[ratio][sy:sy + sh, sx:sx + sw]
            if ratio > 1:
                np.testing.assert_array_equal(crop, expected)
            else:  # at full scale the cut's edge column may differ by a few levels (chroma upsampling)
                assert np.abs(crop.astype(np.float32) - expected).mean() < 0.05
            full = preprocessing.decode_window(jpeg, window, size).numpy()  # the default: full scale
            assert full.shape[:2] == tuple(window.numpy()[2:])


@pytest.mark.parametrize("height,width", SHAPES)
def test_train_image_takes_the_same_window_and_nearly_the_same_pixels(height, width):
    jpeg = tf.constant(smooth_jpeg(height, width))
    shape = tf.constant([height, width, 3])
    worst = {ratio: 0.0 for ratio in RATIOS[1:]}
    for k in range(20):
        seed = tf.constant([5, k], tf.int64)
        window = preprocessing.random_crop_window(shape, stateless_seed=seed)
        for size in SIZES:
            on = preprocessing.train_image(jpeg, size, seed, None, scaled_decode=True).numpy()
            off = preprocessing.train_image(jpeg, size, seed, None).numpy()
            ratio = RATIOS[int(preprocessing.decode_ratio(window, size))]
            expected = tf.image.decode_and_crop_jpeg(jpeg, preprocessing.scaled_window(window, ratio), channels=3,
                                                     ratio=ratio)
            # Both are the window drawn from (shape, seed): the full-scale one exactly, the scaled one exactly
            # its scaled window.
            np.testing.assert_array_equal(on, preprocessing._resize_uint8(expected, size).numpy())
            np.testing.assert_array_equal(off, preprocessing._resize_uint8(
                tf.image.decode_and_crop_jpeg(jpeg, window, channels=3), size).numpy())
            if ratio == 1:
                np.testing.assert_array_equal(on, off)
            else:
                worst[ratio] = max(worst[ratio], float(np.abs(on.astype(np.float32) - off).mean()))
    assert all(0.0 < worst[ratio] <= MAX_MEAN_ABS_DIFF[ratio] for ratio in worst), worst  # each ratio drawn
