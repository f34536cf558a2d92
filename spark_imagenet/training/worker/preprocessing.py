"""Per-image preprocessing of the input pipeline: one Example -> one uint8 image, and batch normalization.

The building blocks of :mod:`spark_imagenet.training.worker.pipeline` (which
assembles them into tf.data datasets) and of ``predict`` (which applies the
evaluation view to single files):

* the record format: :func:`parse_example` reads ``image/encoded`` (JPEG
  bytes) and ``image/class/label`` (0-based class id) of the
  ``tf.train.Example`` s written by :mod:`spark_imagenet.dataset.sharding`;
* the training view (:func:`train_image`: random crop window chosen from the
  JPEG header, only that window decoded (:func:`decode_window`; on request
  at a reduced DCT scale where the window is at least twice S), bilinear
  resize to ``[S, S, 3]`` uint8, optional flip; all draws stateless) and the evaluation view
  (:func:`eval_image`: central crop of :data:`CENTER_CROP_FRACTION` of the
  shorter side);
* AlexNet's PCA colour noise (:func:`lighting_shift`);
* the batch normalizers (:func:`normalizer`, :func:`lighting_normalizer`):
  uint8 ``[B, S, S, 3]`` -> float32, ``(x - MEAN_RGB) / STD_RGB``; :func:`normalize_batch`,
  the one the training and evaluation steps apply to the pipeline's uint8 batches (on the step's device).

Why the crop is decoded from the JPEG directly and images stay uint8 until
batched: docs/design.md, 'Input pipeline speed'.

Example::

    >>> jpeg = tf.io.encode_jpeg(tf.zeros([300, 400, 3], tf.uint8))   # or tf.io.read_file("cat.jpg")
    >>> x = normalizer(224)(eval_image(jpeg, 224)[tf.newaxis])
    >>> x.dtype.name, x.shape.as_list()
    ('float32', [1, 224, 224, 3])
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Sequence

import tensorflow as tf

from spark_imagenet.errors import ConfigError

#: ImageNet per-channel mean of the RGB training pixels, in 0..255 units (the
#: constants of the reference ResNet/torchvision preprocessing: 0.485, 0.456,
#: 0.406 times 255).
MEAN_RGB = (123.675, 116.28, 103.53)
#: ImageNet per-channel standard deviation, 0..255 units (0.229, 0.224, 0.225
#: times 255, same source as :data:`MEAN_RGB`).
STD_RGB = (58.395, 57.12, 57.375)

#: Evaluation crop: the central square whose side is this fraction of the
#: shorter image side (224/256 = 0.875, the reference ResNet evaluation
#: preprocessing: resize-256-then-crop-224 expressed as a crop fraction).
#: It holds for every stored form (``shard --resize``, ``--max-side``:
#: :mod:`spark_imagenet.dataset.image_form`): on shards of the paper's form
#: (``--resize 256``, every image 256 x 256) it is exactly the paper's centre
#: 224 x 224 of the 256 x 256 image, the same pixels, resized to the model's
#: input only when that is not 224.
CENTER_CROP_FRACTION = 0.875

#: Random crop ("Inception-style" scale augmentation, Szegedy et al. 2015,
#: "Going deeper with convolutions", section 6: patches of 8% to 100% of the
#: image area with aspect ratio in [3/4, 4/3]; the same values as the
#: reference ResNet preprocessing in tensorflow/models and torchvision's
#: RandomResizedCrop).
CROP_AREA_RANGE = (0.08, 1.0)
CROP_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)
#: PCA colour ("lighting") noise of Krizhevsky et al. (2012), "ImageNet Classification with Deep
#: Convolutional Neural Networks", section 4.1: the eigenvalues and unit eigenvectors (the COLUMNS of
#: :data:`LIGHTING_EIGVEC`, R/G/B rows) of the 3x3 covariance of ImageNet's RGB training pixels, on
#: the 0..1 pixel scale. The paper does not publish its values; these are the ones commonly used, as
#: given in Facebook's fb.resnet.torch (datasets/imagenet.lua, applied there to 0..1 images before the
#: mean/std normalization). :func:`lighting_shift` converts to the 0..255 scale of this pipeline.
LIGHTING_EIGVAL = (0.2175, 0.0188, 0.0045)
LIGHTING_EIGVEC = (
    (-0.5675, 0.7192, 0.4009),
    (-0.5808, -0.0045, -0.8140),
    (-0.5836, -0.6948, 0.4203),
)

#: Attempts of ``sample_distorted_bounding_box`` before it falls back to the
#: whole image (10, as in the reference ResNet preprocessing).
CROP_MAX_ATTEMPTS = 10

#: The DCT scales libjpeg decodes at (``ratio`` of ``tf.io.decode_and_crop_jpeg``): an image of ``h x w``
#: pixels decodes to ``ceil(h / r) x ceil(w / r)``, each pixel computed from the DCT coefficients of an
#: ``r x r`` block (close to its average; docs/design.md, 'Decoding at a reduced scale').
DECODE_RATIOS = (1, 2, 4, 8)

#: Random-number algorithm of the stateless draws of the training pipeline
#: (file order, per-epoch and per-record seeds, colour noise): fixed, so that
#: the draws do not depend on the device that runs them.
RNG_ALG = "philox"

#: Feature keys of the records (see :mod:`spark_imagenet.dataset.sharding`).
IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
FILENAME_KEY = "image/filename"
_FEATURES = {
    IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
    LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
}



def default_parallel(parallel: int | None) -> int:
    """The decode parallelism to use.

    Args:
        parallel: requested number of parallel decode calls, or ``None``.

    Returns:
        int: ``parallel``, or ``os.cpu_count()`` (at least 1) when ``None``.

    Raises:
        ConfigError: ``parallel`` is less than 1.
    """
    if parallel is None:
        return max(1, os.cpu_count() or 1)
    if int(parallel) < 1:
        raise ConfigError(f"parallel={parallel}: the number of parallel decode calls must be at least 1",
                          key="parallel", value=parallel)
    return int(parallel)


def parse_example(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Read the image and the label of one serialized ``tf.train.Example``.

    Args:
        record: string scalar, the serialized Example.

    Returns:
        tuple: ``(jpeg, label)``: the JPEG bytes (string scalar) and the 0-based
        class id (int32 scalar).
    """
    parsed = tf.io.parse_single_example(record, _FEATURES)
    return parsed[IMAGE_KEY], tf.cast(parsed[LABEL_KEY], tf.int32)


def _resize_uint8(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """Bilinear resize of a uint8 [h,w,3] image to uint8 [S,S,3] (rounded)."""
    resized = tf.image.resize(image, [image_size, image_size], method=tf.image.ResizeMethod.BILINEAR)
    # Bilinear interpolation stays inside [0, 255]; +0.5 then truncation rounds.
    return tf.cast(resized + 0.5, tf.uint8)


def random_crop_window(shape: tf.Tensor, seed: int | None = None, *, stateless_seed: tf.Tensor | None = None,
                       area_range: tuple[float, float] = CROP_AREA_RANGE) -> tf.Tensor:
    """A random crop window for an image of the given shape.

    Args:
        shape: int32 [3] tensor ``(height, width, channels)`` of the image
            (e.g. from ``tf.io.extract_jpeg_shape``).
        seed: op-level seed of the (stateful) sampling op (``None``: random).
            Ignored when ``stateless_seed`` is given.
        stateless_seed: int32/int64 [2] tensor: sample with
            ``tf.image.stateless_sample_distorted_bounding_box`` instead, a
            pure function of ``(shape, stateless_seed)`` (the same window on
            every call).
        area_range: ``(lo, hi)``, the crop's area as fractions of the
            image's, ``0 < lo <= hi <= 1`` (checked by
            :func:`check_augmentation`; default :data:`CROP_AREA_RANGE`).
            ``(1.0, 1.0)`` always gives the whole image.

    Returns:
        tf.Tensor: int32 [4] ``(offset_y, offset_x, height, width)`` in
        pixels, as ``tf.image.decode_and_crop_jpeg`` takes it: an area of
        ``area_range`` of the image with an aspect ratio in
        :data:`CROP_ASPECT_RANGE`, sampled by
        ``tf.image.sample_distorted_bounding_box`` (or its stateless variant;
        the whole image when :data:`CROP_MAX_ATTEMPTS` samples all fail).
    """
    whole_image = tf.constant([0.0, 0.0, 1.0, 1.0], dtype=tf.float32, shape=[1, 1, 4])
    sampling = dict(
        bounding_boxes=whole_image,
        min_object_covered=area_range[0],
        aspect_ratio_range=CROP_ASPECT_RANGE,
        area_range=area_range,
        max_attempts=CROP_MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    if stateless_seed is not None:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(shape, seed=stateless_seed, **sampling)
    else:
        begin, size, _ = tf.image.sample_distorted_bounding_box(shape, seed=seed, **sampling)
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def center_crop_window(shape: tf.Tensor) -> tf.Tensor:
    """The evaluation crop window for an image of the given shape.

    Args:
        shape: int32 [3] tensor ``(height, width, channels)``.

    Returns:
        tf.Tensor: int32 [4] ``(offset_y, offset_x, side, side)``: the
        central square with side ``floor(CENTER_CROP_FRACTION * min(h, w))``
        (at least 1), offsets rounded up when the margin is odd.
    """
    height, width = shape[0], shape[1]
    side = tf.cast(CENTER_CROP_FRACTION * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    side = tf.maximum(side, 1)
    offset_y = (height - side + 1) // 2
    offset_x = (width - side + 1) // 2
    return tf.stack([offset_y, offset_x, side, side])



def decode_ratio(window: tf.Tensor, image_size: int) -> tf.Tensor:
    """The DCT scale to decode a crop window at: the largest that leaves it at least S pixels a side.

    Args:
        window: int32 [4] ``(offset_y, offset_x, height, width)`` in pixels of the stored image.
        image_size: S, the side the crop is resized to, in pixels.

    Returns:
        tf.Tensor: int32 scalar, the index in :data:`DECODE_RATIOS` of the largest ratio ``r`` with
        ``height >= r * S`` and ``width >= r * S`` (0, ratio 1, when the window's shorter side is under 2S).
    """
    fits = [tf.minimum(window[2], window[3]) >= r * image_size for r in DECODE_RATIOS[1:]]
    return tf.add_n([tf.cast(f, tf.int32) for f in fits])


def scaled_window(window: tf.Tensor, ratio: int) -> tf.Tensor:
    """A crop window in the coordinates of the image decoded at ``1 / ratio`` scale.

    Args:
        window: int32 [4] ``(offset_y, offset_x, height, width)`` in pixels of the stored image.
        ratio: one of :data:`DECODE_RATIOS`.

    Returns:
        tf.Tensor: int32 [4], the window's edges divided by ``ratio`` and rounded to the nearest pixel
        (halves up), as ``(offset_y, offset_x, height, width)`` of the scaled image (the coordinates
        ``tf.io.decode_and_crop_jpeg`` takes with that ``ratio``). Each edge moves by at most half a
        scaled pixel (``ratio / 2`` stored pixels); the window stays inside the scaled image and its sides
        are at least ``floor(side / ratio)``.
    """
    if ratio == 1:
        return window
    start = (2 * window[:2] + ratio) // (2 * ratio)
    end = (2 * (window[:2] + window[2:]) + ratio) // (2 * ratio)
    return tf.concat([start, end - start], axis=0)


def decode_window(jpeg: tf.Tensor, window: tf.Tensor, image_size: int, scaled: bool = False) -> tf.Tensor:
    """Decode only a crop window of a JPEG; with ``scaled``, at the smallest DCT scale that keeps S pixels a side.

    Decoding at a reduced scale saves the inverse DCT and colour conversion of the pixels left out, not the
    entropy decoding of the window's rows, which dominates for ImageNet photos: it did not pay on them at 224 px
    (docs/design.md, 'Decoding at a reduced scale'), so nothing turns it on by default.

    Args:
        jpeg: string scalar, the JPEG bytes.
        window: int32 [4] ``(offset_y, offset_x, height, width)`` in pixels of the stored image.
        image_size: S, the side the crop will be resized to, in pixels.
        scaled: decode at the ratio of :func:`decode_ratio` (libjpeg's DCT scaling: fewer pixels to compute
            where the window is at least 2S a side); False (the default): at full scale.

    Returns:
        tf.Tensor: uint8 ``[h, w, 3]``, the window's pixels: ``[height, width, 3]`` at full scale, else the
        :func:`scaled_window` of it, at least ``[S, S, 3]`` (never decoded below the output size).
    """
    if not scaled:
        return tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)

    def at(ratio: int):
        return lambda: tf.image.decode_and_crop_jpeg(jpeg, scaled_window(window, ratio), channels=3, ratio=ratio)

    return tf.switch_case(decode_ratio(window, image_size), [at(r) for r in DECODE_RATIOS])


def train_image(jpeg: tf.Tensor, image_size: int, crop_seed: tf.Tensor, flip_seed: tf.Tensor | None,
                area_range: tuple[float, float] = CROP_AREA_RANGE, scaled_decode: bool = False) -> tf.Tensor:
    """The training view of one image: random crop, resize, random flip.

    The crop window is drawn from the JPEG header's shape alone, so ``scaled_decode`` changes how precisely
    its pixels are decoded, never which window is taken.

    Args:
        jpeg: string scalar, the JPEG bytes.
        image_size: S, the output side in pixels.
        crop_seed: int64 [2], stateless seed of the crop window (:func:`random_crop_window`).
        flip_seed: int64 [2], stateless seed of the horizontal flip, or ``None`` for no flip.
        area_range: ``(lo, hi)``, the crop's area as fractions of the image's.
        scaled_decode: decode windows of at least 2S a side at a reduced DCT scale (:func:`decode_window`);
            False (the default, what the pipeline does): at full scale. On: the same window, reduced by the
            decoder to about ``r x r`` block averages before the bilinear resize.

    Returns:
        tf.Tensor: uint8 ``[S, S, 3]``, a pure function of the arguments.
    """
    window = random_crop_window(tf.io.extract_jpeg_shape(jpeg), stateless_seed=crop_seed, area_range=area_range)
    image = _resize_uint8(decode_window(jpeg, window, image_size, scaled_decode), image_size)
    if flip_seed is None:
        return image
    return tf.image.stateless_random_flip_left_right(image, seed=flip_seed)


def lighting_shift(std: float, seed: tf.Tensor) -> tf.Tensor:
    """The PCA colour ("lighting") shift of one image (Krizhevsky et al. 2012, section 4.1).

    Draws ``alpha ~ N(0, std)``, 3 values, with a stateless op, and returns
    ``255 * LIGHTING_EIGVEC @ (alpha * LIGHTING_EIGVAL)``: the offset added
    to every pixel's RGB value of the image. The eigen-decomposition
    (:data:`LIGHTING_EIGVAL`, :data:`LIGHTING_EIGVEC`) is on the 0..1 pixel
    scale, so the factor 255 puts the offset on this pipeline's 0..255
    scale (before the MEAN_RGB/STD_RGB normalization). Mostly along the
    first eigenvector (about -0.58 in each channel: brightness): with
    ``std=0.1`` (the paper's) the offset is typically a few 0..255 levels.

    Args:
        std: float, standard deviation of alpha (> 0).
        seed: int64 [2] tensor, the stateless seed: the same seed gives the
            same shift.

    Returns:
        tf.Tensor: float32 [3], the R, G, B offset in 0..255 units.
    """
    alpha = tf.random.stateless_normal([3], seed=seed, stddev=float(std), dtype=tf.float32, alg=RNG_ALG)
    eigvec = tf.constant(LIGHTING_EIGVEC, tf.float32)
    eigval = tf.constant(LIGHTING_EIGVAL, tf.float32)
    return 255.0 * tf.linalg.matvec(eigvec, alpha * eigval)



def eval_image(jpeg: tf.Tensor, image_size: int) -> tf.Tensor:
    """The evaluation view of one image: central crop (:func:`center_crop_window`), resized.

    Args:
        jpeg: string scalar, the JPEG bytes.
        image_size: S, the output side in pixels.

    Returns:
        tf.Tensor: uint8 ``[S, S, 3]``: what the evaluation dataset feeds the
        model, before :func:`normalizer`.
    """
    window = center_crop_window(tf.io.extract_jpeg_shape(jpeg))
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    return _resize_uint8(image, image_size)


def eval_view(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """The evaluation view of an image already decoded (PNG, GIF, BMP): :func:`eval_image`'s crop and resize.

    Args:
        image: uint8 ``[H, W, 3]``, RGB.
        image_size: S, the output side in pixels.

    Returns:
        tf.Tensor: uint8 ``[S, S, 3]``, the central crop (:func:`center_crop_window`) resized as
        :func:`eval_image` does it (for a JPEG, the same pixels as :func:`eval_image` of its bytes).
    """
    window = center_crop_window(tf.shape(image))
    crop = tf.slice(image, tf.stack([window[0], window[1], 0]), tf.stack([window[2], window[3], 3]))
    return _resize_uint8(crop, image_size)


def normalizer(image_size: int, xla: bool | None = None):
    """A function that normalizes a batch of uint8 images.

    Args:
        image_size: S, the side of the images in pixels.
        xla: compile it with XLA (None: when :func:`xla_available`; False: a plain function, for a SavedModel
            that any TensorFlow runs).

    Returns:
        Callable: ``uint8 [B, S, S, 3] -> float32 [B, S, S, 3]``,
        ``(x - MEAN_RGB) / STD_RGB`` per channel, computed as
        ``x * (1/STD) + (-MEAN/STD)`` (differs from the direct formula by at
        most a few float32 ulps). When XLA compiles here
        (:func:`xla_available`) the cast, multiply and add are one fused XLA
        kernel, one pass over the batch; otherwise both constants are tiled to
        ``[S,S,3]`` beforehand (a ``[3]``-vector broadcast over the channel
        axis is slow in TensorFlow's CPU kernels). Timings: docs/design.md,
        'Input pipeline speed'.
    """
    scale = [1.0 / s for s in STD_RGB]
    offset = [-m / s for m, s in zip(MEAN_RGB, STD_RGB)]
    scale_img = tf.tile(tf.constant(scale, tf.float32)[tf.newaxis, tf.newaxis, :], [image_size, image_size, 1])
    offset_img = tf.tile(tf.constant(offset, tf.float32)[tf.newaxis, tf.newaxis, :], [image_size, image_size, 1])

    def normalize(images: tf.Tensor) -> tf.Tensor:
        return tf.cast(images, tf.float32) * scale_img + offset_img

    if xla_available() if xla is None else xla:
        return tf.function(normalize, jit_compile=True, reduce_retracing=True)
    return normalize


def lighting_normalizer(image_size: int):
    """A function that adds per-image RGB offsets (:func:`lighting_shift`) to a
    batch of uint8 images and normalizes it, in one pass.

    Args:
        image_size: S, the side of the images in pixels.

    Returns:
        Callable: ``(images uint8 [B, S, S, 3], shifts float32 [B, 3] in 0..255
        units) -> float32 [B, S, S, 3]``, ``(x + shift[b] - MEAN_RGB) / STD_RGB``
        per image ``b`` and channel, computed as ``x * (1/STD) + (-MEAN/STD +
        shift[b]/STD)``. Pixel values plus offset are not clipped to 0..255 (as
        in the paper's formula). One fused XLA kernel when
        :func:`xla_available`, as :func:`normalizer`.
    """
    scale = tf.constant([1.0 / s for s in STD_RGB], tf.float32)
    offset = tf.constant([-m / s for m, s in zip(MEAN_RGB, STD_RGB)], tf.float32)
    scale_img = tf.tile(scale[tf.newaxis, tf.newaxis, :], [image_size, image_size, 1])
    offset_img = tf.tile(offset[tf.newaxis, tf.newaxis, :], [image_size, image_size, 1])

    def normalize(images: tf.Tensor, shifts: tf.Tensor) -> tf.Tensor:
        return tf.cast(images, tf.float32) * scale_img + (offset_img + (shifts * scale)[:, tf.newaxis, tf.newaxis, :])

    if xla_available():
        return tf.function(normalize, jit_compile=True, reduce_retracing=True)
    return normalize


def normalize_batch(x: Any) -> Any:
    """The training and evaluation step's input normalization: a batch of the pipeline, as the model takes it.

    The datasets of :mod:`~spark_imagenet.training.worker.pipeline` hand on uint8 pixels; the model's train and
    test steps (:func:`~spark_imagenet.training.worker.models.compile.compile_model`) call this first, on the
    step's device (docs/design.md, 'Input pipeline speed'). Call it outside any XLA
    compilation or inside one; it does not change what the model itself takes (float32, normalized).

    Args:
        x: a batch ``x`` of ``fit``/``evaluate``: uint8 ``[B, S, S, 3]`` RGB pixels 0..255 (S static); or
            ``(images, shifts)``, images as above and float32 ``[B, 3]`` per-image RGB offsets in 0..255 units
            (:func:`lighting_shift`, ``lighting > 0``); or anything else (float32 images already normalized),
            returned as it is.

    Returns:
        float32 ``[B, S, S, 3]``, ``(x - MEAN_RGB) / STD_RGB`` (:func:`normalizer`) or ``(x + shift[b] -
        MEAN_RGB) / STD_RGB`` (:func:`lighting_normalizer`); or ``x`` itself.
    """
    if isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, tf.Tensor) for t in x) \
            and x[0].dtype == tf.uint8:
        images, shifts = x
        return _step_normalizers(int(images.shape[1]))[1](images, shifts)
    if isinstance(x, tf.Tensor) and x.dtype == tf.uint8:
        return _step_normalizers(int(x.shape[1]))[0](x)
    return x


def _step_normalizers(image_size: int) -> tuple[Any, Any]:
    """:func:`normalizer` and :func:`lighting_normalizer` of one image size: made anew while a step is traced
    (their constants then belong to that graph, placed on the replica's device), else made once per process
    (eager callers: no retracing)."""
    if tf.inside_function():
        return normalizer(image_size), lighting_normalizer(image_size)
    return _eager_normalizers(image_size)


@functools.lru_cache(maxsize=None)
def _eager_normalizers(image_size: int) -> tuple[Any, Any]:
    return normalizer(image_size), lighting_normalizer(image_size)


_XLA_AVAILABLE: bool | None = None


def xla_available() -> bool:
    """Whether XLA can compile a function for the CPU in this process.

    Checked once (a tiny jit-compiled function run on ``/CPU:0``; docs/design.md, 'Input pipeline speed') and
    cached. tf.data runs dataset functions on the CPU, so this is
    the device that matters even on a GPU machine.

    Returns:
        bool: True when the compiled function ran and gave the right value.
    """
    global _XLA_AVAILABLE
    if _XLA_AVAILABLE is None:
        try:  # init_scope: run eagerly even when first asked while a step is traced (normalize_batch)
            with tf.init_scope(), tf.device("/CPU:0"):
                probe = tf.function(lambda x: tf.cast(x, tf.float32) * 2.0 + 1.0, jit_compile=True)
                value = probe(tf.constant([3], tf.uint8))
            _XLA_AVAILABLE = bool(abs(float(value[0]) - 7.0) < 1e-6)
        except Exception:  # noqa: BLE001  (any failure means: do not use XLA)
            _XLA_AVAILABLE = False
    return _XLA_AVAILABLE



def check_augmentation(flip: bool, crop_area: Sequence[float], lighting: float
                       ) -> tuple[bool, tuple[float, float], float]:
    """Validate the training augmentation arguments of :func:`train_dataset`.

    Args:
        flip: bool, random horizontal flips on or off.
        crop_area: ``(lo, hi)``, two numbers with ``0 < lo <= hi <= 1``: the
            random crop's area range as fractions of the image's area.
        lighting: standard deviation of the PCA colour noise, a finite
            number ``>= 0`` (0: none).

    Returns:
        tuple: ``(flip, (lo, hi), lighting)`` as bool, two floats, float.

    Raises:
        ConfigError: a value of the wrong type or out of range; the message
            names the argument and its command-line option.
    """
    if not isinstance(flip, bool):
        raise ConfigError(f"flip={flip!r} (--no-flip): must be True or False", key="flip", value=flip)
    try:
        lo, hi = (float(v) for v in crop_area)
    except (TypeError, ValueError):
        raise ConfigError(f"crop_area={crop_area!r} (--crop-area MIN MAX): must be two numbers, the smallest and "
                          "largest area of the random crop as fractions of the image (default 0.08 1.0)",
                          key="crop_area", value=crop_area) from None
    if not (0.0 < lo <= hi <= 1.0):
        raise ConfigError(f"crop_area=({lo:g}, {hi:g}) (--crop-area MIN MAX): need 0 < MIN <= MAX <= 1 "
                          "(fractions of the image area; default 0.08 1.0, 1.0 1.0 = the whole image)")
    try:
        std = float(lighting)
    except (TypeError, ValueError):
        raise ConfigError(f"lighting={lighting!r} (--lighting STD): must be a number, the standard deviation of "
                          "the PCA colour noise (the AlexNet paper: 0.1; 0 = none)",
                          key="lighting", value=lighting) from None
    if not (math.isfinite(std) and std >= 0.0):
        raise ConfigError(f"lighting={lighting!r} (--lighting STD): must be a finite number >= 0 "
                          "(the AlexNet paper: 0.1; 0 = none)", key="lighting", value=lighting)
    return flip, (lo, hi), std

