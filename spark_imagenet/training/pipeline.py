"""The tf.data input pipeline: TFRecord shards -> normalized image batches.

Imported only inside the TensorFlow worker process (:mod:`spark_imagenet.training.worker`)
and by tests, never by the driver or the CLI: it imports TensorFlow at module
level (after defaulting ``TF_USE_LEGACY_KERAS=1``, which must be set before
TensorFlow is first imported: docs/design.md, 'Keras 2 (tf-keras) under
MultiWorkerMirroredStrategy').

Records are the ``tf.train.Example`` s written by :mod:`spark_imagenet.dataset.sharding`;
this module reads two of their features, ``image/encoded`` (JPEG bytes) and
``image/class/label`` (0-based class id).

Training (:func:`train_dataset`), one stream of epochs e = initial_epoch, initial_epoch + 1, ...::

    range(initial_epoch, epochs) -> flat_map(epoch e's records:
        shard paths -> stateless shuffle of the file order per pass, seeded by (seed, e),
          passes repeated -> interleave(TFRecordDataset) -> shuffle(records, seed from (seed, e))
          -> take(records_per_epoch))
      -> enumerate (position e * records_per_epoch + index in epoch e)
      -> map(parse + stateless random crop box + decode_and_crop_jpeg + resize
         + stateless flip, seeded by (seed, position) -> uint8 [S,S,3])  (``parallel`` calls)
      -> batch(B, drop_remainder) -> map(normalize, float32) -> prefetch

Epoch e's records and their augmentation depend only on (files, seed, records_per_epoch, e), so a
run resumed at an epoch boundary (``initial_epoch``) sees the same data as an
uninterrupted one (bit for bit with ``deterministic=True``). Without
``records_per_epoch`` the stream is one endless "epoch 0".

Evaluation (:func:`eval_dataset`): the files in order, every n-th record when
the records of the files are split among workers, central crop, then zero-weight
padding up to exactly ``steps`` batches.

Images stay ``uint8`` until after ``batch()`` and are normalised by one fused
XLA kernel per batch (:func:`normalizer`); the random crop is chosen from the
JPEG header and only that window is decoded (``decode_and_crop_jpeg``);
tf.data's autotuner is off and the parallelism fixed (``parallel`` calls,
``deterministic=False`` unless :func:`train_dataset` is asked for
``deterministic=True``). The measurements behind these choices:
docs/design.md, 'Input pipeline speed'.

Decode errors: TensorFlow's JPEG ops fail with a bare
``InvalidArgumentError`` ("Invalid JPEG data or crop window") that cannot name
the record, and a graph op cannot catch an error. Adding per-record checks to
the hot path would cost throughput for a failure that the shard builder
already rules out (it decodes every JPEG before storing it), so the hot path
carries nothing extra; instead :func:`naming_bad_records` (a context manager
around ``fit``/``evaluate``/iteration) catches TensorFlow's data errors and
then locates the bad record by re-reading the worker's own shards
(:func:`find_bad_records`), raising :class:`~spark_imagenet.errors.ImageError`
with the shard path, the record index and the image's file name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import re
from typing import Iterator, Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402  (after the environment default above)

from spark_imagenet.errors import ConfigError, ImageError  # noqa: E402

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

#: Records held by the training shuffle buffer (about 110 KB each on
#: ImageNet, so ~110 MB of memory). Files are also read in shuffled order and
#: interleaved, so the buffer only has to mix records of a few files.
DEFAULT_SHUFFLE_BUFFER = 1024

#: Batches prefetched after normalization.
PREFETCH_BATCHES = 2

#: Random-number algorithm of the stateless draws of the training pipeline
#: (file order, per-epoch and per-record seeds): fixed, so that the draws do
#: not depend on the device that runs them.
_RNG_ALG = "philox"
#: Tags folded into the epoch key (seed, e) to derive its two independent streams.
_FILE_ORDER_TAG, _RECORD_SHUFFLE_TAG = 0, 1
#: Graph-level seed of the function that builds an epoch's records (any
#: nonzero constant): tf.data's record shuffle combines it with the shuffle's
#: own seed, so it replaces the process's global seed there (see _epoch_records).
_EPOCH_GRAPH_SEED = 0x5EED

_IMAGE_KEY = "image/encoded"
_LABEL_KEY = "image/class/label"
_FILENAME_KEY = "image/filename"
_FEATURES = {
    _IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
    _LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
}


# --------------------------------------------------------------------------- helpers


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
        raise ConfigError(f"parallel={parallel}: the number of parallel decode calls must be at least 1")
    return int(parallel)


def _check_common(files: Sequence[str], batch_size: int, image_size: int) -> list[str]:
    files = [os.fspath(f) for f in files]
    if not files:
        raise ConfigError("no TFRecord files given to the input pipeline (this worker has no shards)")
    if int(batch_size) < 1:
        raise ConfigError(f"batch_size={batch_size}: must be at least 1")
    if int(image_size) < 1:
        raise ConfigError(f"image_size={image_size}: must be at least 1 pixel")
    return files


def _options(deterministic: bool) -> tf.data.Options:
    """tf.data options shared by both pipelines: autotune off (fixed
    parallelism, see the module docstring), auto-sharding off (each worker
    reads only the files it is given: docs/design.md, 'Each worker reads only its own shards')."""
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = False
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def _parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Serialized Example -> (JPEG bytes: string scalar, label: int32 scalar)."""
    parsed = tf.io.parse_single_example(record, _FEATURES)
    return parsed[_IMAGE_KEY], tf.cast(parsed[_LABEL_KEY], tf.int32)


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


def _train_image(jpeg: tf.Tensor, image_size: int, crop_seed: tf.Tensor, flip_seed: tf.Tensor | None,
                 area_range: tuple[float, float] = CROP_AREA_RANGE) -> tf.Tensor:
    """JPEG bytes -> random crop of ``area_range``, random flip, uint8 [S,S,3]; drawn by
    stateless ops from ``crop_seed`` and ``flip_seed`` (int64 [2] each; ``None``: no flip)."""
    window = random_crop_window(tf.io.extract_jpeg_shape(jpeg), stateless_seed=crop_seed, area_range=area_range)
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    image = _resize_uint8(image, image_size)
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
    alpha = tf.random.stateless_normal([3], seed=seed, stddev=float(std), dtype=tf.float32, alg=_RNG_ALG)
    eigvec = tf.constant(LIGHTING_EIGVEC, tf.float32)
    eigval = tf.constant(LIGHTING_EIGVAL, tf.float32)
    return 255.0 * tf.linalg.matvec(eigvec, alpha * eigval)


def _eval_image(jpeg: tf.Tensor, image_size: int) -> tf.Tensor:
    """JPEG bytes -> central crop, uint8 [S,S,3]."""
    window = center_crop_window(tf.io.extract_jpeg_shape(jpeg))
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    return _resize_uint8(image, image_size)


def eval_image(jpeg: tf.Tensor, image_size: int) -> tf.Tensor:
    """The evaluation view of one image: JPEG bytes (string scalar) -> central crop, uint8 ``[S, S, 3]``
    (what :func:`eval_dataset` feeds the model, before :func:`normalizer`)."""
    return _eval_image(jpeg, image_size)


def normalizer(image_size: int):
    """A function that normalizes a batch of uint8 images.

    Args:
        image_size: S, the side of the images in pixels.

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

    if xla_available():
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


_XLA_AVAILABLE: bool | None = None


def xla_available() -> bool:
    """Whether XLA can compile a function for the CPU in this process.

    Checked once (a tiny jit-compiled function run on ``/CPU:0``, about
    0.1 s) and cached. tf.data runs dataset functions on the CPU, so this is
    the device that matters even on a GPU machine.

    Returns:
        bool: True when the compiled function ran and gave the right value.
    """
    global _XLA_AVAILABLE
    if _XLA_AVAILABLE is None:
        try:
            with tf.device("/CPU:0"):
                probe = tf.function(lambda x: tf.cast(x, tf.float32) * 2.0 + 1.0, jit_compile=True)
                value = probe(tf.constant([3], tf.uint8))
            _XLA_AVAILABLE = bool(abs(float(value[0]) - 7.0) < 1e-6)
        except Exception:  # noqa: BLE001  (any failure means: do not use XLA)
            _XLA_AVAILABLE = False
    return _XLA_AVAILABLE


# --------------------------------------------------------------------------- datasets


def _base_seed(seed: int | None) -> int:
    """The training stream's base seed: ``seed`` reduced into [0, 2**63), or a
    random one (drawn once per call of :func:`train_dataset`) when ``None``."""
    if seed is None:
        return random.SystemRandom().randrange(1 << 63)
    return int(seed) % (1 << 63)


def _check_epochs(batch_size: int, records_per_epoch: int | None, initial_epoch: int, epochs: int | None) -> None:
    """ConfigError unless the epoch arguments of :func:`train_dataset` fit together."""
    if records_per_epoch is None:
        if initial_epoch != 0 or epochs is not None:
            raise ConfigError(f"initial_epoch={initial_epoch}, epochs={epochs}: epochs of the training stream "
                              "need records_per_epoch (without it the stream is one endless epoch 0)")
        return
    if records_per_epoch < 1 or records_per_epoch % batch_size:
        raise ConfigError(f"records_per_epoch={records_per_epoch} must be a positive multiple of "
                          f"batch_size={batch_size}, so that every epoch ends on a batch boundary")
    if initial_epoch < 0:
        raise ConfigError(f"initial_epoch={initial_epoch}: must not be negative")
    if epochs is not None and epochs < initial_epoch:
        raise ConfigError(f"epochs={epochs} is smaller than initial_epoch={initial_epoch}")


def _epoch_records(files: list[str], base_seed: int, parallel: int, shuffle_buffer: int,
                   records_per_epoch: int | None, deterministic: bool):
    """A function: epoch e (int64 scalar tensor) -> dataset of epoch e's
    serialized records (string scalars), a pure function of (files, base_seed, e)
    when ``deterministic``: passes over the files, each in a file order drawn
    statelessly from (base_seed, e, pass), interleaved, shuffled through
    ``shuffle_buffer`` records with a seed drawn from (base_seed, e), and cut to
    ``records_per_epoch`` records (endless when ``None``)."""
    file_names = tf.constant(files, tf.string)
    cycle = min(len(files), parallel)

    def records(epoch: tf.Tensor) -> tf.data.Dataset:
        # While tracing, this function's graph-level seed is the global seed (tf.random.set_seed), and
        # Dataset.shuffle combines it with its op seed: the shuffle would depend on it, and a global seed
        # of 0 with a tensor op seed even fails to trace (TensorFlow's seed check takes the tensor's truth
        # value: OperatorNotAllowedInGraphError). A fixed seed of this graph avoids both.
        if not tf.executing_eagerly():  # (tf.data's debug mode runs the function eagerly)
            tf.compat.v1.get_default_graph().seed = _EPOCH_GRAPH_SEED
        epoch_key = tf.stack([tf.constant(base_seed, tf.int64), epoch])
        order_key = tf.random.experimental.stateless_fold_in(epoch_key, _FILE_ORDER_TAG, alg=_RNG_ALG)
        shuffle_key = tf.random.experimental.stateless_fold_in(epoch_key, _RECORD_SHUFFLE_TAG, alg=_RNG_ALG)
        shuffle_seed = tf.random.stateless_uniform([], shuffle_key, minval=None, maxval=None, dtype=tf.int64,
                                                   alg=_RNG_ALG)
        paths = tf.data.Dataset.range(tf.int64.max).map(
            lambda n: tf.random.experimental.stateless_shuffle(
                file_names, tf.random.experimental.stateless_fold_in(order_key, n, alg=_RNG_ALG), alg=_RNG_ALG)
        ).unbatch()
        ds = paths.interleave(tf.data.TFRecordDataset, cycle_length=cycle, block_length=1,
                              num_parallel_calls=cycle, deterministic=deterministic)
        ds = ds.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=False)
        return ds if records_per_epoch is None else ds.take(records_per_epoch)

    return records


def _train_decoder(base_seed: int, image_size: int, flip: bool = True,
                   crop_area: tuple[float, float] = CROP_AREA_RANGE, lighting: float = 0.0):
    """A function ``(position, record) -> (uint8 [S,S,3] image, int32 label)``
    for the training map (``(image, float32 [3] lighting shift, label)`` when
    ``lighting > 0``): ``position`` (int64 scalar) is the record's index
    in the stream of all epochs from epoch 0 (``e * records_per_epoch + i``;
    ``i`` without epochs), ``record`` a serialized Example. Its crop and flip
    are drawn statelessly from ``(base_seed, 2 * position)`` and
    ``(base_seed, 2 * position + 1)``, its lighting alpha from
    ``(base_seed, -1 - position)`` (negative, so never a crop or flip seed):
    the stateless ops scramble their seed pair through Philox, so the pairs
    are independent draws (per-record keys derived with ``stateless_fold_in``
    instead cost about 0.1 ms of CPU per image, 5% of a decode: measured).
    The crop and flip draws do not depend on ``lighting``."""
    base = tf.constant(base_seed, tf.int64)

    def decode(position: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, ...]:
        jpeg, label = _parse(record)
        crop_seed = tf.stack([base, 2 * position])
        image = _train_image(jpeg, image_size, crop_seed, crop_seed + [0, 1] if flip else None, crop_area)
        if lighting > 0:
            return image, lighting_shift(lighting, tf.stack([base, -1 - position])), label
        return image, label

    return decode


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
        raise ConfigError(f"flip={flip!r} (--no-flip): must be True or False")
    try:
        lo, hi = (float(v) for v in crop_area)
    except (TypeError, ValueError):
        raise ConfigError(f"crop_area={crop_area!r} (--crop-area MIN MAX): must be two numbers, the smallest and "
                          "largest area of the random crop as fractions of the image (default 0.08 1.0)") from None
    if not (0.0 < lo <= hi <= 1.0):
        raise ConfigError(f"crop_area=({lo:g}, {hi:g}) (--crop-area MIN MAX): need 0 < MIN <= MAX <= 1 "
                          "(fractions of the image area; default 0.08 1.0, 1.0 1.0 = the whole image)")
    try:
        std = float(lighting)
    except (TypeError, ValueError):
        raise ConfigError(f"lighting={lighting!r} (--lighting STD): must be a number, the standard deviation of "
                          "the PCA colour noise (the AlexNet paper: 0.1; 0 = none)") from None
    if not (math.isfinite(std) and std >= 0.0):
        raise ConfigError(f"lighting={lighting!r} (--lighting STD): must be a finite number >= 0 "
                          "(the AlexNet paper: 0.1; 0 = none)")
    return flip, (lo, hi), std


#: glibc ``mallopt`` parameters (malloc.h) and the values :func:`_reuse_freed_memory` sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES = 64 << 20
_TRIM_THRESHOLD_BYTES = 128 << 20
_MALLOC_TUNED = False


def _reuse_freed_memory() -> bool:
    """Make glibc's malloc reuse freed batch buffers instead of unmapping them (once per process).

    A float32 batch of 64 images of 224 px is 38.5 MB. glibc serves blocks
    above its mmap threshold (dynamic, at most 32 MB) with a fresh ``mmap``
    and unmaps them on free, so every batch's output was 9,409 new pages,
    each zero-filled on its first write: about 25 ms of CPU per batch, 0.4 ms
    per image (measured on this project's 2-core machine, a third of a JPEG
    decode). With the mmap threshold at 64 MiB (the most a thread's arena
    serves anyway) and the trim threshold at 128 MiB the blocks are reused:
    no page faults. Process-wide: freed memory up to these sizes stays with
    the process instead of going back to the system. TensorFlow's own pool
    (``TF_CPU_ALLOCATOR_USE_BFC=true`` set before its first op) has the same
    effect and covers any batch size, but cannot be turned on later.

    Returns:
        bool: True when the settings are in place (a no-op returning False
        where the C library is not glibc).
    """
    global _MALLOC_TUNED
    if not _MALLOC_TUNED:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            _MALLOC_TUNED = bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)) and bool(
                libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))
        except (OSError, AttributeError):
            _MALLOC_TUNED = False
    return _MALLOC_TUNED


@dataclasses.dataclass(frozen=True)
class _TrainArgs:
    """The arguments of :func:`train_dataset`, checked and converted (see there
    for each); ``base_seed`` is the seed drawn by :func:`_base_seed`."""

    files: list[str]
    batch_size: int
    image_size: int
    parallel: int
    shuffle_buffer: int
    records_per_epoch: int | None
    initial_epoch: int
    epochs: int | None
    deterministic: bool
    flip: bool
    crop_area: tuple[float, float]
    lighting: float
    base_seed: int


def _train_args(files: Sequence[str], batch_size: int, image_size: int, parallel: int | None, seed: int | None,
                shuffle_buffer: int, records_per_epoch: int | None, initial_epoch: int, epochs: int | None,
                deterministic: bool, flip: bool, crop_area: Sequence[float], lighting: float) -> _TrainArgs:
    """Check and convert the arguments of :func:`train_dataset` (which documents
    them), in this order: files and sizes, augmentation (:func:`check_augmentation`),
    ``parallel`` (``None``: ``os.cpu_count()``), the epoch arguments
    (:func:`_check_epochs`); then draw the base seed (:func:`_base_seed`).
    ``shuffle_buffer`` is raised to at least 1.

    Returns:
        _TrainArgs: the converted values.

    Raises:
        ConfigError: as listed in :func:`train_dataset`.
    """
    files = _check_common(files, batch_size, image_size)
    flip, crop_area, lighting = check_augmentation(flip, crop_area, lighting)
    parallel = default_parallel(parallel)
    batch_size, shuffle_buffer, initial_epoch = int(batch_size), max(1, int(shuffle_buffer)), int(initial_epoch)
    records_per_epoch = None if records_per_epoch is None else int(records_per_epoch)
    epochs = None if epochs is None else int(epochs)
    _check_epochs(batch_size, records_per_epoch, initial_epoch, epochs)
    return _TrainArgs(files=files, batch_size=batch_size, image_size=image_size, parallel=parallel,
                      shuffle_buffer=shuffle_buffer, records_per_epoch=records_per_epoch,
                      initial_epoch=initial_epoch, epochs=epochs, deterministic=deterministic, flip=flip,
                      crop_area=crop_area, lighting=lighting, base_seed=_base_seed(seed))


def _train_record_stream(args: _TrainArgs) -> tf.data.Dataset:
    """The record stream of :func:`train_dataset` before decoding: epochs
    ``range(initial_epoch, epochs)`` (``epochs=None``: up to ``tf.int64.max``;
    without ``records_per_epoch``: the single endless epoch 0), each epoch's
    records (:func:`_epoch_records`) one after the other.

    Each epoch starts by filling its shuffle buffer (``shuffle_buffer`` records
    read before the first comes out; about 110 MB on ImageNet), a short pause
    per epoch that the prefetched batches partly hide.

    Returns:
        tf.data.Dataset: elements ``(position int64 scalar, serialized Example
        string scalar)``, positions counted from ``initial_epoch *
        records_per_epoch`` (from 0 without epochs): the index of the record in
        the stream of all epochs from epoch 0, which seeds its augmentation.
    """
    if args.records_per_epoch is None:
        ds = tf.data.Dataset.range(0, 1)  # one endless epoch 0
    else:
        ds = tf.data.Dataset.range(args.initial_epoch, tf.int64.max if args.epochs is None else args.epochs)
    ds = ds.flat_map(_epoch_records(args.files, args.base_seed, args.parallel, args.shuffle_buffer,
                                    args.records_per_epoch, args.deterministic))
    return ds.enumerate(start=args.initial_epoch * (args.records_per_epoch or 0))


def _decode_for_training(records: tf.data.Dataset, args: _TrainArgs) -> tf.data.Dataset:
    """Map :func:`_train_decoder` (parse, random crop, decode, resize, flip and,
    with ``lighting > 0``, the colour-noise shift) over ``(position, record)``
    elements, with ``parallel`` calls.

    With ``deterministic=False`` the calls hand on images in completion order;
    ``deterministic=True`` keeps the order at a cost in throughput (a slow JPEG
    holds up the ones decoded after it): on 2 CPU cores with 2 parallel decode
    calls, 1% to 5% fewer images per second (about 1000 images/s without;
    224-pixel crops of 500x375 JPEGs, medians of repeated runs on a shared
    machine); more parallel calls likely lose more.

    Returns:
        tf.data.Dataset: elements ``(uint8 [S,S,3] image, int32 label)``, or
        ``(image, float32 [3] lighting shift, label)`` when ``lighting > 0``.
    """
    return records.map(_train_decoder(args.base_seed, args.image_size, args.flip, args.crop_area, args.lighting),
                       num_parallel_calls=args.parallel, deterministic=args.deterministic)


def _normalized_batches(images: tf.data.Dataset, batch_size: int, image_size: int, lighting: float
                        ) -> tf.data.Dataset:
    """Batch the decoded training images (full batches only) and normalize each
    batch (:func:`normalizer`, or :func:`lighting_normalizer` adding the
    per-image shifts when ``lighting > 0``).

    Args:
        images: elements as returned by :func:`_decode_for_training`.
        batch_size: B, images per batch.
        image_size: S, the images' side in pixels.
        lighting: the colour-noise standard deviation (> 0: the elements carry shifts).

    Returns:
        tf.data.Dataset: elements ``(images float32 [B,S,S,3], labels int32 [B])``.
    """
    ds = images.batch(batch_size, drop_remainder=True)
    if lighting > 0:
        normalize_lit = lighting_normalizer(image_size)
        return ds.map(lambda images, shifts, labels: (normalize_lit(images, shifts), labels))
    normalize = normalizer(image_size)
    return ds.map(lambda images, labels: (normalize(images), labels))


def train_dataset(
    files: Sequence[str],
    batch_size: int,
    image_size: int,
    parallel: int | None,
    seed: int | None = None,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    *,
    records_per_epoch: int | None = None,
    initial_epoch: int = 0,
    epochs: int | None = None,
    deterministic: bool = False,
    flip: bool = True,
    crop_area: tuple[float, float] = CROP_AREA_RANGE,
    lighting: float = 0.0,
) -> tf.data.Dataset:
    """The shuffled, augmented training dataset of one worker, epoch by epoch.

    With ``records_per_epoch`` the stream is, for each epoch ``e`` in
    ``range(initial_epoch, epochs)`` in turn (forever when ``epochs`` is
    ``None``), exactly ``records_per_epoch`` records of this worker's files:
    the files in an order drawn from ``(seed, e)``, as many passes over them
    as the epoch needs (so an epoch may hold more records than the files), read
    interleaved, mixed through the ``shuffle_buffer``-record shuffle buffer
    with a seed drawn from ``(seed, e)``, cut to ``records_per_epoch``. The
    crop window and flip of the record at index ``i`` of epoch ``e`` are drawn
    with stateless random ops from ``(seed, e * records_per_epoch + i)``. So
    epoch ``e``'s batches depend only on (files, seed, records_per_epoch, e),
    not on the epoch the stream starts at: a run resumed with
    ``initial_epoch=k`` gets the epochs ``k, k+1, ...`` of an uninterrupted
    run, exactly (bit for bit, same order) with ``deterministic=True``. Pass
    the same ``seed`` in every run; TensorFlow's global seed
    (``tf.random.set_seed``) plays no part.
    Without ``records_per_epoch`` the stream is one endless epoch 0 (passes
    over the files, each in a new order).

    With ``deterministic=False`` (the default) the parallel interleave and the
    parallel decode hand on elements in completion order: faster, but which
    records fill an epoch and which index (hence augmentation) each gets vary
    slightly from run to run, and records may cross an epoch boundary by a few
    positions. ``deterministic=True`` keeps the order at a cost in throughput:
    1% to 5% fewer images per second on 2 CPU cores with 2 parallel decode
    calls (measurement: ``_decode_for_training``); more calls likely lose more.

    Augmentation (all drawn from ``(seed, position)`` as above, so resume and
    ``deterministic`` hold with any of them): the random crop (area in
    ``crop_area``, aspect ratio in :data:`CROP_ASPECT_RANGE`), the random
    horizontal flip (``flip``) and, with ``lighting > 0``, AlexNet's PCA
    colour noise (:func:`lighting_shift`, one RGB offset per image, added to
    the uint8 pixels inside the batch normalization). ``lighting=0`` adds no
    op to the pipeline; the defaults give the same batches as before these
    arguments existed. Each epoch starts by filling its shuffle buffer (about
    110 MB on ImageNet): a short pause that the prefetched batches partly hide.

    Args:
        files: local paths of this worker's TFRecord shards (train split).
        batch_size: B, images per batch (per replica).
        image_size: S, output side in pixels.
        parallel: parallel JPEG decode calls (``None``: ``os.cpu_count()``).
        seed: int, base seed of the file orders, the record shuffles and the
            crop/flip draws (``None``: a random one, drawn once by this call).
        shuffle_buffer: records in the shuffle buffer (at least 1).
        records_per_epoch: records of one epoch on this worker, a multiple of
            ``batch_size``: the steps of an epoch times the records this
            worker's dataset feeds per step (all its local replicas together),
            or ``None`` for one endless epoch.
        initial_epoch: the first epoch of the stream (needs ``records_per_epoch``).
        epochs: the stream ends before this epoch (``None``: never; needs
            ``records_per_epoch``).
        deterministic: keep the element order through the parallel stages
            (tf.data option ``deterministic`` and the interleave's and map's
            argument), so equal inputs give bit-identical batches.
        flip: bool, random horizontal flips (``False``: none; command-line
            ``--no-flip``).
        crop_area: ``(lo, hi)``, the random crop's area range as fractions of
            the image's, ``0 < lo <= hi <= 1`` (``--crop-area``; ``(1.0, 1.0)``:
            the whole image, resized).
        lighting: float >= 0, the standard deviation of alpha of the PCA
            colour noise (``--lighting``; the paper: 0.1; 0: none).

    Returns:
        tf.data.Dataset: elements ``(images float32 [B,S,S,3] normalized with
        MEAN_RGB/STD_RGB, labels int32 [B])``; only full batches, each epoch
        ``records_per_epoch / B`` of them; ``(epochs - initial_epoch) *
        records_per_epoch / B`` batches in all when ``epochs`` is given, else
        endless (cardinality unknown either way). Auto-sharding is off.

    Raises:
        ConfigError: no files, a size/parallelism below 1, a
            ``records_per_epoch`` that is not a positive multiple of
            ``batch_size``, a negative ``initial_epoch``, ``epochs`` below it,
            or ``initial_epoch``/``epochs`` without ``records_per_epoch``;
            a ``flip``, ``crop_area`` or ``lighting`` that :func:`check_augmentation` refuses.
    """
    args = _train_args(files, batch_size, image_size, parallel, seed, shuffle_buffer, records_per_epoch,
                       initial_epoch, epochs, deterministic, flip, crop_area, lighting)
    _reuse_freed_memory()
    ds = _decode_for_training(_train_record_stream(args), args)
    ds = _normalized_batches(ds, args.batch_size, args.image_size, args.lighting)
    return ds.prefetch(PREFETCH_BATCHES).with_options(_options(deterministic=args.deterministic))


def eval_dataset(
    files: Sequence[str],
    batch_size: int,
    image_size: int,
    parallel: int | None,
    record_shard: tuple[int, int] | None,
    examples: int,
    steps: int,
) -> tf.data.Dataset:
    """The finite evaluation dataset of one worker, padded to ``steps`` batches.

    Args:
        files: local paths of the val TFRecord shards, read in this order.
        batch_size: B, images per batch.
        image_size: S, output side in pixels.
        parallel: parallel decode calls (``None``: ``os.cpu_count()``).
        record_shard: ``(n, i)`` to keep only records ``i, i+n, i+2n, ...``
            of the concatenated files (``Dataset.shard(n, i)``), or ``None``
            for all records.
        examples: number of real records this worker gets (after
            ``record_shard``); checked while reading.
        steps: number of batches to yield (the same on every worker).

    Returns:
        tf.data.Dataset: exactly ``steps`` elements ``(images float32
        [B,S,S,3] normalized, labels int32 [B], weights float32 [B])``: the
        ``examples`` real images (central crop of side
        ``CENTER_CROP_FRACTION * min(h, w)``, resized to S) with weight 1.0,
        then zero images (all-zero pixels before normalization, label 0) with
        weight 0.0, so weighted metrics count each real example exactly once.
        Iterating raises ``tf.errors.FailedPreconditionError`` when the
        files hold fewer than ``examples`` records for this worker, or more
        (detected when ``examples < steps * batch_size``, i.e. whenever
        padding follows the real records); :func:`naming_bad_records` turns
        it into a ManifestError.

    Raises:
        ConfigError: no files, a size below 1, a bad ``record_shard``, or
            ``examples`` that do not fit in ``steps * batch_size``.
    """
    files = _check_common(files, batch_size, image_size)
    parallel = default_parallel(parallel)
    examples, steps = int(examples), int(steps)
    if examples < 0 or steps < 0:
        raise ConfigError(f"examples={examples}, steps={steps}: must not be negative")
    if examples > steps * batch_size:
        raise ConfigError(
            f"{examples} evaluation examples do not fit in {steps} step(s) of batch {batch_size}; "
            f"steps must be at least ceil(examples / batch) = {math.ceil(examples / batch_size)}"
        )

    def decode(record):
        jpeg, label = _parse(record)
        return _eval_image(jpeg, image_size), label, tf.constant(1.0, tf.float32)

    ds = tf.data.TFRecordDataset(files)
    if record_shard is not None:
        n, i = (int(v) for v in record_shard)
        if n < 1 or not 0 <= i < n:
            raise ConfigError(f"record_shard={tuple(record_shard)}: need (n, i) with n >= 1 and 0 <= i < n")
        ds = ds.shard(n, i)
    # Raises at iteration when the files hold fewer or more records than expected.
    ds = ds.apply(tf.data.experimental.assert_cardinality(examples))
    ds = ds.map(decode, num_parallel_calls=parallel, deterministic=True)
    padding = tf.data.Dataset.from_tensors(
        (
            tf.zeros([image_size, image_size, 3], tf.uint8),
            tf.constant(0, tf.int32),
            tf.constant(0.0, tf.float32),
        )
    ).repeat()
    ds = ds.concatenate(padding).take(steps * batch_size)
    ds = ds.batch(batch_size, drop_remainder=True)
    _reuse_freed_memory()
    normalize = normalizer(image_size)
    ds = ds.map(lambda images, labels, weights: (normalize(images), labels, weights))
    ds = ds.prefetch(PREFETCH_BATCHES)
    return ds.with_options(_options(deterministic=True))


# --------------------------------------------------------------------------- bad records


@dataclasses.dataclass(frozen=True)
class BadRecord:
    """A record of a shard that the pipeline cannot use.

    Attributes:
        path: the shard file.
        index: 0-based position of the record in the file.
        filename: the record's ``image/filename`` feature (``None`` when it
            cannot be read).
        reason: TensorFlow's error message, first line.
    """

    path: str
    index: int
    filename: str | None
    reason: str

    def describe(self) -> str:
        """One line: ``shard PATH, record N (image NAME): REASON``."""
        image = f" (image {self.filename})" if self.filename else ""
        return f"shard {self.path}, record {self.index}{image}: {self.reason}"


def _first_line(exc: BaseException) -> str:
    """An OpError message without TensorFlow's ``{{function_node ...}}`` and
    ``[Op:...]`` decorations."""
    text = getattr(exc, "message", None) or str(exc)
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[\[.*", "", text, flags=re.S)
    text = re.sub(r"\s*\[Op:[^\]]*\].*", "", text, flags=re.S)
    # Graph-mode errors start with "Graph execution error:" and "Detected at node ..." and a
    # traceback of the Python frames that built the op; the reason is the last such line.
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    reasons = [ln for ln in lines if not _NOISE_RE.match(ln)]
    return reasons[-1] if reasons else (lines[0] if lines else type(exc).__name__)


_NOISE_RE = re.compile(r"^(Graph execution error:?|Detected at node|File \"|Traceback|\w+Error: Graph execution)")


def _check_record(record: tf.Tensor) -> tf.Tensor:
    """Everything the pipelines do to a record that can fail, on the whole
    image: parse, read the JPEG header, decode every scan line."""
    jpeg, _ = _parse(record)
    shape = tf.io.extract_jpeg_shape(jpeg)
    image = tf.io.decode_jpeg(jpeg, channels=3)
    return tf.shape(image)[0] + shape[0]


def _record_filename(record: bytes) -> str | None:
    """The ``image/filename`` feature of a serialized Example, or None."""
    try:
        parsed = tf.io.parse_single_example(
            record, {_FILENAME_KEY: tf.io.FixedLenFeature([], tf.string, default_value="")}
        )
        return parsed[_FILENAME_KEY].numpy().decode("utf-8", "replace") or None
    except Exception:  # noqa: BLE001  (a record too broken to parse has no name)
        return None


def find_bad_records(files: Sequence[str], limit: int | None = 1, parallel: int | None = None) -> list[BadRecord]:
    """Scan shards for records the pipelines cannot decode.

    Each file is read in order; TFRecord framing errors (corrupted or
    truncated records, detected by TFRecord's CRC32C) end the scan of that
    file. Every record is parsed and its JPEG decoded in full (any crop the
    pipelines take then decodes too), ``parallel`` records at a time: about
    as long as one pass of the training pipeline over the files, so meant
    for after a failure, not before every run.

    Args:
        files: TFRecord shard paths.
        limit: stop after this many bad records (``None``: scan everything).
        parallel: parallel decode calls (``None``: ``os.cpu_count()``).

    Returns:
        list[BadRecord]: the bad records found, in file order (empty when
        every record decodes).
    """
    parallel = default_parallel(parallel)
    bad: list[BadRecord] = []
    for path in (os.fspath(f) for f in files):
        # 1. Framing: how many records can be read, and why reading stops early.
        count, framing = 0, None
        try:
            count = int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
        except tf.errors.NotFoundError as exc:
            framing = BadRecord(path, 0, None, f"cannot open the shard ({_first_line(exc)})")
        except tf.errors.OpError:
            try:  # again one record at a time, to count the readable ones
                for _ in tf.data.TFRecordDataset(path):
                    count += 1
            except tf.errors.OpError as exc:
                framing = BadRecord(path, count, None, f"unreadable TFRecord ({_first_line(exc)})")
        # 2. Content: parse and decode each readable record; the indices that
        #    do not come out of ignore_errors() failed.
        good = (
            tf.data.TFRecordDataset(path)
            .take(count)
            .enumerate()
            .map(lambda i, r: (i, _check_record(r)), num_parallel_calls=parallel, deterministic=True)
            .ignore_errors()
            .map(lambda i, _: i)
        )
        ok = set(int(i) for i in good.as_numpy_iterator()) if count else set()
        for index in (i for i in range(count) if i not in ok):
            record = next(iter(tf.data.TFRecordDataset(path).skip(index).take(1))).numpy()
            try:
                _check_record(tf.constant(record))
                reason = "does not decode inside tf.data"
            except tf.errors.OpError as exc:
                reason = _first_line(exc)
            bad.append(BadRecord(path, index, _record_filename(record), reason))
            if limit is not None and len(bad) >= limit:
                return bad
        if framing is not None:
            bad.append(framing)
            if limit is not None and len(bad) >= limit:
                return bad
    return bad


#: TensorFlow error messages that come from reading records (TFRecord framing,
#: Example parsing, JPEG header and decoding).
_DATA_ERROR_RE = re.compile(
    r"jpeg|corrupted record|truncated record|ParseExample|ParseSingleExample|Feature: image/", re.IGNORECASE
)
_CARDINALITY_RE = re.compile(r"expected to contain (\d+) elements but contained ((?:only|at least) \d+)")


def data_error(exc: BaseException, files: Sequence[str], parallel: int | None = None) -> Exception | None:
    """Translate a TensorFlow error raised while reading ``files`` into a
    :class:`~spark_imagenet.errors.SparkImagenetError` that names the record.

    Args:
        exc: the exception (typically from ``fit``, ``evaluate`` or iterating
            a dataset of this module).
        files: the shard files the failing dataset read.
        parallel: decode parallelism of the scan (``None``: all cores).

    Returns:
        ImageError naming the shard file, record index and image file name
        (found with :func:`find_bad_records`) when ``exc`` is a data error and
        the scan finds the bad record; ManifestError when an evaluation
        dataset held fewer or more records than its ``examples``; ``None`` when
        ``exc`` is not a data error of this module or the scan finds nothing
        (the caller then re-raises ``exc`` unchanged).
    """
    if not isinstance(exc, tf.errors.OpError):
        return None
    message = str(exc)
    counted = _CARDINALITY_RE.search(message)
    if isinstance(exc, tf.errors.FailedPreconditionError) and counted:
        from spark_imagenet.errors import ManifestError

        return ManifestError(
            f"the evaluation shards hold {counted.group(2)} records for this worker, but exactly "
            f"{counted.group(1)} were expected (from the manifest); files: {', '.join(map(os.fspath, files))}. "
            "The manifest does not match the shards: rebuild or re-download them."
        )
    if not (isinstance(exc, tf.errors.DataLossError) or
            (isinstance(exc, tf.errors.InvalidArgumentError) and _DATA_ERROR_RE.search(message))):
        return None
    bad = find_bad_records(files, limit=1, parallel=parallel)
    if not bad:
        return None
    from spark_imagenet.dataset.cache import CACHE_FOLDER, MARKER_SUFFIX

    marker = os.path.basename(bad[0].path) + MARKER_SUFFIX
    return ImageError(
        f"bad record in the input data: {bad[0].describe()}. "
        "Rebuild the shards (the shard builder checks that every JPEG decodes) or remove that image from the source. "
        f"If that file is a copy in the shard cache (a {CACHE_FOLDER} folder unless --cache or cache= named "
        "another), the copy may instead have been damaged after it was verified, with the bucket's shard intact, and "
        f"every rerun would fail the same way: delete it and its marker {marker} beside it, and the next run fetches "
        "it again."
    )


@contextlib.contextmanager
def naming_bad_records(files: Sequence[str], parallel: int | None = None) -> Iterator[None]:
    """Context manager: data errors inside it become errors naming the record.

    Use around ``model.fit``/``model.evaluate`` or a loop over a dataset of
    this module::

        with naming_bad_records(train_files + val_files):
            model.fit(...)

    On a TensorFlow data error (bad JPEG, corrupted TFRecord, unparsable
    Example, another number of evaluation records than expected) it raises the error of
    :func:`data_error` (chained to TensorFlow's); anything else passes
    through unchanged. Costs nothing until an error happens; then the scan
    takes about as long as one pass of the pipeline over ``files``.

    Args:
        files: every shard file the datasets inside read.
        parallel: decode parallelism of the scan (``None``: all cores).

    Raises:
        ImageError: a record of ``files`` does not decode (message: shard
            path, record index, image file name, TensorFlow's reason).
        ManifestError: an evaluation dataset held fewer or more records than
            its ``examples`` argument.
    """
    try:
        yield
    except tf.errors.OpError as exc:
        translated = data_error(exc, files, parallel)
        if translated is None:
            raise
        raise translated from exc
