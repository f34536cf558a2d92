"""The tf.data input pipeline: TFRecord shards -> uint8 image batches (normalized in the model's step).

Runs in the TensorFlow worker process (it imports TensorFlow at module level). Records are the
``tf.train.Example`` s written by :mod:`spark_imagenet.dataset.sharding` (image/encoded: JPEG bytes,
image/class/label: 0-based class id).

Training (:func:`train_dataset`), one stream of epochs e = initial_epoch, initial_epoch + 1, ...::

    range(initial_epoch, epochs) -> flat_map(epoch e's records:
        range(passes) -> flat_map(pass p:
            shard paths in a stateless random order seeded by (seed, e, p)
            -> interleave(TFRecordDataset) -> shuffle(records, its own buffer, seed from (seed, e, p)))
        -> take(records_per_epoch))
      -> enumerate (position e * records_per_epoch + index in epoch e)
      -> map(parse + stateless random crop box + decode_and_crop_jpeg + resize
         + stateless flip, seeded by (seed, position) -> uint8 [S,S,3])  (``parallel`` calls)
      -> batch(B, drop_remainder) -> prefetch   (uint8 [B,S,S,3]; the model's train step normalizes it:
         preprocessing.normalize_batch, on the step's device)

An epoch is one pass over the worker's files: each pass shuffles its own records through its own buffer,
so a pass holds every record once and the next pass starts only after the last record of this one. An
epoch of fewer records than the files hold (it ends on a full batch) trains each of them at most once; a longer one
(a worker whose shards hold fewer records than the epoch needs) trains all of them, then the first
records of the next pass.

Epoch e's records and their augmentation depend only on (files, seed, records_per_epoch, e), so a
run resumed at an epoch boundary (``initial_epoch``) sees the same data as an
uninterrupted one (bit for bit with ``deterministic=True``). Without
``records_per_epoch`` the stream is one endless "epoch 0" (pass after pass).

Evaluation (:func:`eval_dataset`): the files in order, every n-th record when
the records of the files are split among workers, central crop, then zero-weight
padding up to exactly ``steps`` batches.

Per-image work (parsing, crops, colour noise) and the normalization the steps apply are in
:mod:`spark_imagenet.training.worker.preprocessing`; naming the record behind a
data error (:func:`naming_bad_records`, also importable from here) in
:mod:`spark_imagenet.training.worker.bad_records`. tf.data's autotuner is off
and the parallelism fixed (``parallel`` calls); why, and what the other
choices cost and save: docs/design.md, 'Input pipeline speed'.

Example::

    >>> import glob
    >>> import tensorflow as tf
    >>> from spark_imagenet import shard
    >>> manifest = shard("/data/kaggle", "shards", train_shards=2, processes=1, progress=False)
    >>> files = sorted(glob.glob("shards/train-*.tfrecord"))
    >>> ds = train_dataset(files, batch_size=4, image_size=32, parallel=None, seed=7,
    ...                    records_per_epoch=24, epochs=1)
    >>> for images, labels in ds.take(1):   # uint8 [B, S, S, 3] pixels 0..255, int32 [B]
    ...     print(images.dtype.name, images.shape.as_list(), labels.dtype.name, labels.shape.as_list())
    uint8 [4, 32, 32, 3] int32 [4]
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from typing import Callable, Sequence

import tensorflow as tf

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.worker.bad_records import naming_bad_records  # noqa: F401  (used with the datasets)
from spark_imagenet.training.worker.preprocessing import (
    CROP_AREA_RANGE, RNG_ALG, check_augmentation, default_parallel, eval_image, lighting_shift, parse_example,
    train_image)

#: Records held by the training shuffle buffer (about 110 KB each on
#: ImageNet, so ~110 MB of memory). Files are also read in shuffled order and
#: interleaved, so the buffer only has to mix records of a few files.
DEFAULT_SHUFFLE_BUFFER = 1024

#: Batches prefetched.
PREFETCH_BATCHES = 2

#: Tags folded into the epoch key (seed, e) to derive its two independent streams: the file order and the
#: record shuffle seed of each pass.
_FILE_ORDER_TAG, _RECORD_SHUFFLE_TAG = 0, 1
#: Graph-level seed of the functions that build an epoch's records and its passes (any
#: nonzero constant): tf.data's record shuffle combines it with the shuffle's
#: own seed, so it replaces the process's global seed there (see _pin_graph_seed).
_EPOCH_GRAPH_SEED = 0x5EED


# --------------------------------------------------------------------------- helpers


def _check_common(files: Sequence[str], batch_size: int, image_size: int) -> list[str]:
    files = [os.fspath(f) for f in files]
    if not files:
        raise ConfigError("no TFRecord files given to the input pipeline (this worker has no shards)")
    if int(batch_size) < 1:
        raise ConfigError(f"batch_size={batch_size}: must be at least 1", key="batch_size", value=batch_size)
    if int(image_size) < 1:
        raise ConfigError(f"image_size={image_size}: must be at least 1 pixel", key="image_size", value=image_size)
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
                              "need records_per_epoch (without it the stream is one endless epoch 0)",
                              key="initial_epoch", value=initial_epoch)
        return
    if records_per_epoch < 1 or records_per_epoch % batch_size:
        raise ConfigError(f"records_per_epoch={records_per_epoch} must be a positive multiple of "
                          f"batch_size={batch_size}, so that every epoch ends on a batch boundary",
                          key="records_per_epoch", value=records_per_epoch)
    if initial_epoch < 0:
        raise ConfigError(f"initial_epoch={initial_epoch}: must not be negative",
                          key="initial_epoch", value=initial_epoch)
    if epochs is not None and epochs < initial_epoch:
        raise ConfigError(f"epochs={epochs} is smaller than initial_epoch={initial_epoch}", key="epochs", value=epochs)


def _as_written(fn: Callable) -> Callable:
    """``fn``, marked for tf.data to trace as written, without AutoGraph's conversion: no function of this
    pipeline branches or loops on a tensor in Python, and the conversion (parsing and rewriting each
    function's source) was most of a job's dataset set-up: 2.6 to 4.0 s of a warm job's 10 to 12 s on a loaded
    2-core machine."""
    return tf.autograph.experimental.do_not_convert(fn)


def _pin_graph_seed() -> None:
    """Give the graph being traced a fixed graph-level seed (:data:`_EPOCH_GRAPH_SEED`).

    While tf.data traces a function, its graph-level seed is the global seed (``tf.random.set_seed``), and
    ``Dataset.shuffle`` combines it with its op seed: the shuffle would depend on it, and a global seed of 0
    with a tensor op seed even fails to trace (TensorFlow's seed check takes the tensor's truth value:
    OperatorNotAllowedInGraphError). A fixed seed of the graph avoids both. No-op when running eagerly
    (tf.data's debug mode).
    """
    if not tf.executing_eagerly():
        tf.compat.v1.get_default_graph().seed = _EPOCH_GRAPH_SEED


def _pass_records(files: list[str], parallel: int, shuffle_buffer: int, deterministic: bool):
    """A function: ``(order_key, shuffle_seed)`` -> dataset of one pass over ``files``.

    The pass reads every record of ``files`` once: the files in the order ``stateless_shuffle`` draws from
    ``order_key`` (int64 [2]), read interleaved (``min(len(files), parallel)`` at a time, one record from each
    in turn), mixed through a ``shuffle_buffer``-record buffer seeded by ``shuffle_seed`` (int64 scalar). The
    buffer holds this pass's records only, so the pass ends when its last record has come out.

    Returns:
        Callable: ``(int64 [2], int64 scalar) -> tf.data.Dataset`` of serialized records (string scalars).
    """
    file_names = tf.constant(files, tf.string)
    cycle = min(len(files), parallel)

    def one_pass(order_key: tf.Tensor, shuffle_seed: tf.Tensor) -> tf.data.Dataset:
        _pin_graph_seed()
        paths = tf.data.Dataset.from_tensor_slices(
            tf.random.experimental.stateless_shuffle(file_names, order_key, alg=RNG_ALG))
        ds = paths.interleave(tf.data.TFRecordDataset, cycle_length=cycle, block_length=1,
                              num_parallel_calls=cycle, deterministic=deterministic)
        return ds.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=False)

    return _as_written(one_pass)


def _epoch_records(files: list[str], base_seed: int, parallel: int, shuffle_buffer: int,
                   records_per_epoch: int | None, deterministic: bool):
    """A function: epoch e (int64 scalar tensor) -> dataset of epoch e's serialized records (string scalars).

    Epoch e is passes 0, 1, 2, ... over ``files`` one after the other (:func:`_pass_records`), cut to
    ``records_per_epoch`` records (endless when ``None``). Pass p's file order and its shuffle seed are drawn
    statelessly from (base_seed, e, p), so the epoch is a pure function of (files, base_seed, e) when
    ``deterministic``. Since each pass has its own shuffle buffer, an epoch of at most one pass's records
    holds each record at most once, and a record comes a second time only after every record of the files has
    come once.
    """
    one_pass = _pass_records(files, parallel, shuffle_buffer, deterministic)

    def records(epoch: tf.Tensor) -> tf.data.Dataset:
        _pin_graph_seed()
        epoch_key = tf.stack([tf.constant(base_seed, tf.int64), epoch])
        order_key = tf.random.experimental.stateless_fold_in(epoch_key, _FILE_ORDER_TAG, alg=RNG_ALG)
        shuffle_key = tf.random.experimental.stateless_fold_in(epoch_key, _RECORD_SHUFFLE_TAG, alg=RNG_ALG)

        def pass_keys(n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            shuffle_seed = tf.random.stateless_uniform(
                [], tf.random.experimental.stateless_fold_in(shuffle_key, n, alg=RNG_ALG), minval=None,
                maxval=None, dtype=tf.int64, alg=RNG_ALG)
            return tf.random.experimental.stateless_fold_in(order_key, n, alg=RNG_ALG), shuffle_seed

        passes = tf.data.Dataset.range(tf.int64.max).map(_as_written(pass_keys)).flat_map(one_pass)
        return passes if records_per_epoch is None else passes.take(records_per_epoch)

    return _as_written(records)


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
    are independent draws (why not ``stateless_fold_in``: docs/design.md,
    'Input pipeline speed'). The crop and flip draws do not depend on ``lighting``."""
    base = tf.constant(base_seed, tf.int64)

    def decode(position: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, ...]:
        jpeg, label = parse_example(record)
        crop_seed = tf.stack([base, 2 * position])
        image = train_image(jpeg, image_size, crop_seed, crop_seed + [0, 1] if flip else None, crop_area)
        if lighting > 0:
            return image, lighting_shift(lighting, tf.stack([base, -1 - position])), label
        return image, label

    return _as_written(decode)


#: glibc ``mallopt`` parameters (malloc.h) and the values :func:`_reuse_freed_memory` sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES = 64 << 20
_TRIM_THRESHOLD_BYTES = 128 << 20
_MALLOC_TUNED = False


def _reuse_freed_memory() -> bool:
    """Make glibc's malloc reuse freed batch buffers instead of unmapping them (once per process).

    Sets ``M_MMAP_THRESHOLD`` to 64 MiB and ``M_TRIM_THRESHOLD`` to 128 MiB
    (``mallopt``), so that a float32 batch below 64 MiB is served from reused
    memory instead of fresh zero-filled pages. Process-wide: freed memory up
    to these sizes stays with the process. Why and what it saves:
    docs/design.md, 'Input pipeline speed' (page faults).

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

    Each pass starts by filling its shuffle buffer (``shuffle_buffer`` records
    read before the first comes out; about 110 MB on ImageNet), a short pause
    per pass that the prefetched batches partly hide.

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
    holds up the ones decoded after it; measured: docs/design.md, 'Input pipeline speed').

    Returns:
        tf.data.Dataset: elements ``(uint8 [S,S,3] image, int32 label)``, or
        ``(image, float32 [3] lighting shift, label)`` when ``lighting > 0``.
    """
    return records.map(_train_decoder(args.base_seed, args.image_size, args.flip, args.crop_area, args.lighting),
                       num_parallel_calls=args.parallel, deterministic=args.deterministic)


def _batches(images: tf.data.Dataset, batch_size: int, lighting: float) -> tf.data.Dataset:
    """Batch the decoded training images (full batches only), as uint8: the model's steps normalize them
    (:func:`~spark_imagenet.training.worker.preprocessing.normalize_batch`; why: docs/design.md,
    'Input pipeline speed').

    Args:
        images: elements as returned by :func:`_decode_for_training`.
        batch_size: B, images per batch.
        lighting: the colour-noise standard deviation (> 0: the elements carry shifts).

    Returns:
        tf.data.Dataset: elements ``(images uint8 [B,S,S,3], labels int32 [B])``, or with ``lighting > 0``
        ``((images uint8 [B,S,S,3], shifts float32 [B,3]), labels int32 [B])``.
    """
    ds = images.batch(batch_size, drop_remainder=True)
    if lighting > 0:
        return ds.map(_as_written(lambda images, shifts, labels: ((images, shifts), labels)))
    return ds


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
    skip_records: int = 0,
) -> tf.data.Dataset:
    """The shuffled, augmented training dataset of one worker, epoch by epoch.

    With ``records_per_epoch`` the stream is, for each epoch ``e`` in ``range(initial_epoch, epochs)`` in
    turn (forever when ``epochs`` is ``None``), exactly ``records_per_epoch`` records of this worker's files:
    passes ``p = 0, 1, ...`` over the files one after the other, each the files in an order drawn from
    ``(seed, e, p)``, read interleaved, mixed through its own ``shuffle_buffer``-record buffer with a seed
    drawn from ``(seed, e, p)``; cut to ``records_per_epoch``. So, whatever ``shuffle_buffer``, an epoch
    holds each record at most once when the files hold at least ``records_per_epoch`` records, and when they
    hold fewer, every record once, then the first records of pass 1. The crop window and flip of the record
    at index ``i`` of epoch ``e`` are drawn with stateless random ops from ``(seed, e * records_per_epoch +
    i)``. So epoch ``e``'s batches depend only on (files, seed, records_per_epoch, e), not on the epoch the
    stream starts at: a run resumed with ``initial_epoch=k`` gets the epochs ``k, k+1, ...`` of an
    uninterrupted run, exactly (bit for bit, same order) with ``deterministic=True``. Pass the same ``seed``
    in every run; TensorFlow's global seed (``tf.random.set_seed``) plays no part. Without
    ``records_per_epoch`` the stream is one endless epoch 0 (pass after pass, each shuffled on its own).

    With ``deterministic=False`` (the default) the parallel interleave and the
    parallel decode hand on elements in completion order: faster, but which
    records fill an epoch and which index (hence augmentation) each gets vary
    slightly from run to run, and records may cross an epoch boundary by a few
    positions. ``deterministic=True`` keeps the order at a cost in throughput
    (docs/design.md, 'Input pipeline speed').

    Augmentation (all drawn from ``(seed, position)`` as above, so resume and
    ``deterministic`` hold with any of them): the random crop (area in
    ``crop_area``, aspect ratio in :data:`CROP_ASPECT_RANGE`), the random
    horizontal flip (``flip``) and, with ``lighting > 0``, AlexNet's PCA
    colour noise (:func:`lighting_shift`, one RGB offset per image, beside the batch). ``lighting=0`` adds no
    op to the pipeline. (Each pass's first batch waits for its shuffle buffer to fill.)

    Args:
        files: local paths of this worker's TFRecord shards (train split).
        batch_size: B, images per batch (per replica).
        image_size: S, output side in pixels.
        parallel: parallel JPEG decode calls (``None``: ``os.cpu_count()``).
        seed: int, base seed of the file orders, the record shuffles and the
            crop/flip draws (``None``: a random one, drawn once by this call).
        shuffle_buffer: records in the shuffle buffer of each pass (at least 1).
        records_per_epoch: records of one epoch on this worker, a multiple of
            ``batch_size``: the steps of an epoch times the records this
            worker's dataset feeds per step (all its local replicas together),
            or ``None`` for one endless epoch.
        initial_epoch: the first epoch of the stream (needs ``records_per_epoch``).
        epochs: the stream ends before this epoch (``None``: never; needs
            ``records_per_epoch``).
        deterministic: keep the element order through the parallel stages (tf.data's
            ``deterministic``), so equal inputs give bit-identical batches.
        flip: bool, random horizontal flips (``False``: none; ``--no-flip``).
        crop_area: ``(lo, hi)``, the random crop's area range as fractions of
            the image's, ``0 < lo <= hi <= 1`` (``--crop-area``; ``(1.0, 1.0)``:
            the whole image, resized).
        lighting: float >= 0, the standard deviation of alpha of the PCA
            colour noise (``--lighting``; the paper: 0.1; 0: none).
        skip_records: records of epoch ``initial_epoch`` left out before decoding (a resume
            inside it); the others keep their positions. Below ``records_per_epoch``.

    Returns:
        tf.data.Dataset: elements ``(images uint8 [B,S,S,3] RGB 0..255, labels int32 [B])``, with
        ``lighting > 0`` ``((images, shifts float32 [B,3]), labels)``, which the train step of ``compile_model``
        normalizes (:func:`~spark_imagenet.training.worker.preprocessing.normalize_batch`); only full batches, each epoch
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
    if skip_records and not 0 <= skip_records < (records_per_epoch or 0):
        raise ConfigError(f"skip_records={skip_records}: must be below records_per_epoch={records_per_epoch}",
                          key="skip_records", value=skip_records)
    _reuse_freed_memory()
    ds = _decode_for_training(_train_record_stream(args).skip(int(skip_records)), args)
    ds = _batches(ds, args.batch_size, args.lighting)
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
        tf.data.Dataset: exactly ``steps`` elements ``(images uint8
        [B,S,S,3] RGB 0..255, labels int32 [B], weights float32 [B])`` (the
        model's test step normalizes them, as :func:`train_dataset`'s): the
        ``examples`` real images (central crop of side
        ``CENTER_CROP_FRACTION * min(h, w)``, resized to S) with weight 1.0,
        then zero images (all-zero pixels, label 0) with
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
        raise ConfigError(f"examples={examples}, steps={steps}: must not be negative", key="examples", value=examples)
    if examples > steps * batch_size:
        raise ConfigError(
            f"{examples} evaluation examples do not fit in {steps} step(s) of batch {batch_size}; "
            f"steps must be at least ceil(examples / batch) = {math.ceil(examples / batch_size)}"
        )

    def decode(record):
        jpeg, label = parse_example(record)
        return eval_image(jpeg, image_size), label, tf.constant(1.0, tf.float32)

    ds = tf.data.TFRecordDataset(files)
    if record_shard is not None:
        n, i = (int(v) for v in record_shard)
        if n < 1 or not 0 <= i < n:
            raise ConfigError(f"record_shard={tuple(record_shard)}: need (n, i) with n >= 1 and 0 <= i < n",
                              key="record_shard", value=tuple(record_shard))
        ds = ds.shard(n, i)
    # Raises at iteration when the files hold fewer or more records than expected.
    ds = ds.apply(tf.data.experimental.assert_cardinality(examples))
    ds = ds.map(_as_written(decode), num_parallel_calls=parallel, deterministic=True)
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
    ds = ds.prefetch(PREFETCH_BATCHES)
    return ds.with_options(_options(deterministic=True))
