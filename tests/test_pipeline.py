"""Tests of the tf.data input pipeline (spark_imagenet.training.worker.pipeline) on small
generated JPEGs in TFRecord shards written with the project's own record
writer (spark_imagenet.dataset.tfrecord, the format spark_imagenet.dataset.sharding writes)."""

from __future__ import annotations

import io
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

from spark_imagenet.training.worker import bad_records, pipeline, preprocessing  # noqa: E402
from spark_imagenet.errors import ConfigError, ImageError, ManifestError  # noqa: E402
from spark_imagenet.dataset.tfrecord import encode_example, write_record  # noqa: E402

MEAN = np.array(preprocessing.MEAN_RGB, np.float32)
STD = np.array(preprocessing.STD_RGB, np.float32)


def jpeg_bytes(pixels: np.ndarray, quality: int = 95) -> bytes:
    """uint8 [h,w,3] or [h,w] -> JPEG bytes (4:4:4, so colours stay sharp)."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality, subsampling=0)
    return buf.getvalue()


def random_image(rng: np.random.Generator, gray: bool = False) -> np.ndarray:
    """Random noise image, 24 to 69 px per side, RGB or grayscale (uint8)."""
    h, w = int(rng.integers(24, 70)), int(rng.integers(24, 70))
    return rng.integers(0, 256, (h, w) if gray else (h, w, 3), dtype=np.uint8)


def write_shard(path, records: list[tuple[bytes, int, str]]) -> str:
    """Write (jpeg bytes, label, file name) records as the shard builder does."""
    with open(path, "wb") as f:
        for data, label, name in records:
            write_record(
                f,
                encode_example(
                    {
                        "image/encoded": data,
                        "image/format": b"JPEG",
                        "image/class/label": label,
                        "image/class/synset": f"n{label:08d}",
                        "image/height": 0,
                        "image/width": 0,
                        "image/filename": name,
                    }
                ),
            )
    return str(path)


def make_shards(tmp_path, shards: int, per_shard: int, seed: int = 0, split: str = "train") -> list[str]:
    """``shards`` files of ``per_shard`` random JPEGs; record k overall has label k."""
    rng = np.random.default_rng(seed)
    files = []
    for s in range(shards):
        records = []
        for j in range(per_shard):
            k = s * per_shard + j
            records.append((jpeg_bytes(random_image(rng, gray=(k % 5 == 4))), k, f"img_{k}.JPEG"))
        files.append(write_shard(tmp_path / f"{split}-{s:05d}-of-{shards:05d}.tfrecord", records))
    return files


def unnormalize(images) -> np.ndarray:
    """Pipeline output (uint8 pixels) or the model's input (float32, normalized by the step) as 0..255 pixel
    values (float)."""
    images = np.asarray(images)
    return images.astype(np.float32) if images.dtype == np.uint8 else images * STD + MEAN


def test_train_batches_shapes_dtypes_labels(tmp_path):
    files = make_shards(tmp_path, shards=3, per_shard=5)
    ds = pipeline.train_dataset(files, batch_size=4, image_size=32, parallel=2, seed=1, shuffle_buffer=8)
    assert ds.element_spec[0].shape.as_list() == [4, 32, 32, 3]
    assert ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    seen = []
    for images, labels in ds.take(12):  # 15 records: more than three epochs, so it repeats
        assert images.shape == (4, 32, 32, 3) and images.dtype == tf.uint8  # the step normalizes
        assert labels.shape == (4,) and labels.dtype == tf.int32
        pixels = unnormalize(images)
        assert pixels.min() > -0.5 and pixels.max() < 255.5
        seen += labels.numpy().tolist()
    assert set(seen) <= set(range(15))
    assert len(set(seen)) == 15  # every record is read within 48 draws of a 15-record repeat


def test_train_normalization_of_a_solid_colour(tmp_path):
    colour = np.array([200, 100, 50], np.uint8)
    data = jpeg_bytes(np.tile(colour, (40, 60, 1)))
    files = [write_shard(tmp_path / "train-00000-of-00001.tfrecord", [(data, 3, "solid.JPEG")] * 4)]
    images, labels = next(iter(pipeline.train_dataset(files, 8, 16, 2, seed=0)))
    images = preprocessing.normalize_batch(images)  # what the model's train step does first
    assert images.dtype == tf.float32
    expected = (colour.astype(np.float32) - MEAN) / STD
    assert np.abs(images.numpy() - expected).max() <= 2.0 / STD.min()  # JPEG rounding: a level or two
    assert labels.numpy().tolist() == [3] * 8


def test_normalizer_matches_the_formula():
    x = np.random.default_rng(3).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    got = preprocessing.normalizer(8)(tf.constant(x)).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, (x.astype(np.float32) - MEAN) / STD, rtol=0, atol=1e-5)


def test_batches_are_uint8_and_normalize_batch_matches_the_normalizers(tmp_path):
    files = make_shards(tmp_path, shards=1, per_shard=4)
    lit = pipeline.train_dataset(files, 2, 16, 1, seed=0, lighting=0.1)
    (images, shifts), labels = lit.element_spec
    assert (images.dtype, images.shape.as_list(), shifts.dtype, shifts.shape.as_list()) == (
        tf.uint8, [2, 16, 16, 3], tf.float32, [2, 3])
    assert pipeline.eval_dataset(files, 2, 16, 1, None, examples=4, steps=2).element_spec[0].dtype == tf.uint8
    x = np.random.default_rng(3).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    shift = np.random.default_rng(4).normal(0, 5, (2, 3)).astype(np.float32)
    np.testing.assert_array_equal(preprocessing.normalize_batch(tf.constant(x)).numpy(),
                                  preprocessing.normalizer(8)(tf.constant(x)).numpy())
    got = preprocessing.normalize_batch((tf.constant(x), tf.constant(shift))).numpy()
    np.testing.assert_allclose(got, (x + shift[:, None, None, :] - MEAN) / STD, rtol=0, atol=1e-5)
    normalized = tf.constant(got)
    assert preprocessing.normalize_batch(normalized) is normalized  # float32 input: already normalized


def test_train_crops_and_flips_vary(tmp_path):
    # A horizontal ramp: different crops/flips give different images.
    ramp = np.tile(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], (48, 1, 3))
    files = [write_shard(tmp_path / "train-00000-of-00001.tfrecord", [(jpeg_bytes(ramp), 0, "ramp.JPEG")])]
    images, _ = next(iter(pipeline.train_dataset(files, 16, 16, 2, seed=5)))
    flat = images.numpy().reshape(16, -1)
    assert len({row.round(3).tobytes() for row in flat}) > 8
    # Both orientations of the ramp occur (left-to-right mean increasing and decreasing).
    slopes = np.sign(images.numpy()[:, :, -1, 0].mean(1) - images.numpy()[:, :, 0, 0].mean(1))
    assert set(slopes.tolist()) == {-1.0, 1.0}


def test_eval_center_crop(tmp_path):
    # 80x64 image: a green frame exactly as wide as the crop margins
    # (side = floor(0.875 * 64) = 56, offsets y = (64-56+1)//2 = 4, x = (80-56+1)//2 = 12),
    # inside it the left half red, the right half blue.
    img = np.zeros((64, 80, 3), np.uint8)
    img[:] = (0, 255, 0)
    img[4:60, 12:40] = (255, 0, 0)
    img[4:60, 40:68] = (0, 0, 255)
    data = jpeg_bytes(img, quality=100)
    files = [write_shard(tmp_path / "val-00000-of-00001.tfrecord", [(data, 7, "frame.JPEG")])]
    window = preprocessing.center_crop_window(tf.constant([64, 80, 3])).numpy().tolist()
    assert window == [4, 12, 56, 56]
    batches = list(pipeline.eval_dataset(files, 1, 56, 1, None, examples=1, steps=1))
    assert len(batches) == 1
    images, labels, weights = batches[0]
    out = unnormalize(images[0])
    # Same pixels as decoding the whole file and cutting the window (resize 56 -> 56 is the identity).
    full = tf.io.decode_jpeg(data, channels=3).numpy().astype(np.float32)
    np.testing.assert_allclose(out, full[4:60, 12:68], atol=1.5)
    assert (out[:, :26, 0] > 200).all() and (out[:, :26, 1:] < 60).all()  # red half
    assert (out[:, 30:, 2] > 200).all() and (out[:, 30:, :2] < 60).all()  # blue half
    assert labels.numpy().tolist() == [7] and weights.numpy().tolist() == [1.0]


def test_eval_padding_and_record_shard(tmp_path):
    files = make_shards(tmp_path, shards=2, per_shard=6, split="val")  # labels 0..11 in file order
    n, batch, steps = 3, 2, 3
    seen: list[int] = []
    for rank in range(n):
        examples = len(range(rank, 12, n))  # 4 each
        ds = pipeline.eval_dataset(files, batch, 24, 2, (n, rank), examples=examples, steps=steps)
        batches = list(ds)
        assert len(batches) == steps
        weights = np.concatenate([w.numpy() for _, _, w in batches])
        labels = np.concatenate([lab.numpy() for _, lab, _ in batches])
        images = np.concatenate([im.numpy() for im, _, _ in batches])
        assert weights.dtype == np.float32 and labels.dtype == np.int32 and images.shape == (6, 24, 24, 3)
        assert weights.sum() == examples
        assert weights.tolist() == [1.0] * examples + [0.0] * (steps * batch - examples)
        assert labels[:examples].tolist() == list(range(rank, 12, n))  # files in order, every n-th record
        np.testing.assert_allclose(unnormalize(images[examples:]), 0.0, atol=1e-3)  # zero padding images
        seen += labels[weights == 1.0].tolist()
    assert sorted(seen) == list(range(12))  # disjoint and complete


def test_eval_record_count_must_match(tmp_path):
    files = make_shards(tmp_path, shards=1, per_shard=3, split="val")
    ds = pipeline.eval_dataset(files, 2, 16, 1, None, examples=4, steps=2)
    with pytest.raises(ManifestError, match="hold only 3 records for this worker, but exactly 4"):
        with pipeline.naming_bad_records(files):
            list(ds)
    ds = pipeline.eval_dataset(files, 2, 16, 1, None, examples=2, steps=2)
    with pytest.raises(ManifestError, match="hold at least 3 records for this worker, but exactly 2"):
        with pipeline.naming_bad_records(files):
            list(ds)
    with pytest.raises(ConfigError, match="do not fit"):
        pipeline.eval_dataset(files, 2, 16, 1, None, examples=5, steps=2)


def test_bad_jpeg_names_shard_and_record(tmp_path):
    good = make_shards(tmp_path, shards=1, per_shard=4)
    rng = np.random.default_rng(9)
    real = jpeg_bytes(random_image(rng))
    records = [(jpeg_bytes(random_image(rng)), k, f"ok_{k}.JPEG") for k in range(5)]
    records[2] = (real[:20] + b"this is not JPEG data" * 4, 2, "broken.JPEG")
    bad_file = write_shard(tmp_path / "train-00001-of-00002.tfrecord", records)
    files = good + [bad_file]

    found = bad_records.find_bad_records(files, limit=None)
    assert [(b.path, b.index, b.filename) for b in found] == [(bad_file, 2, "broken.JPEG")]

    ds = pipeline.train_dataset(files, 3, 16, 2, seed=0, shuffle_buffer=4)
    with pytest.raises(ImageError) as info:
        with pipeline.naming_bad_records(files):
            for _ in ds.take(20):
                pass
    message = str(info.value)
    assert bad_file in message and "record 2" in message and "broken.JPEG" in message
    assert "Rebuild the shards" in message
    # the file named may be a cached copy damaged after it was verified: say how to make the next run fetch it again
    assert "spark-imagenet-cache" in message and "train-00001-of-00002.tfrecord.verified" in message
    assert "delete it and its marker" in message and "the next run fetches it again" in message
    assert isinstance(info.value.__cause__, tf.errors.InvalidArgumentError)

    ds = pipeline.eval_dataset(files, 3, 16, 2, None, examples=9, steps=3)
    with pytest.raises(ImageError, match=r"train-00001-of-00002\.tfrecord, record 2 \(image broken\.JPEG\)"):
        with pipeline.naming_bad_records(files):
            list(ds)


def test_find_bad_records_truncated_jpeg_and_corrupt_file(tmp_path):
    rng = np.random.default_rng(4)
    data = jpeg_bytes(random_image(rng))
    truncated = write_shard(tmp_path / "a.tfrecord", [(data, 0, "a.JPEG"), (data[: len(data) // 2], 1, "half.JPEG")])
    found = bad_records.find_bad_records([truncated])
    assert [(b.index, b.filename) for b in found] == [(1, "half.JPEG")]

    # Flip one byte inside the second record's payload: TFRecord's CRC catches it.
    intact = write_shard(tmp_path / "b.tfrecord", [(data, 0, "x.JPEG"), (data, 1, "y.JPEG")])
    raw = bytearray(open(intact, "rb").read())
    raw[len(raw) - 40] ^= 0xFF
    open(intact, "wb").write(bytes(raw))
    found = bad_records.find_bad_records([truncated, intact], limit=None)
    assert [(os.path.basename(b.path), b.index) for b in found] == [("a.tfrecord", 1), ("b.tfrecord", 1)]
    assert "corrupted record" in found[1].reason
    with pytest.raises(ImageError, match=r"b\.tfrecord, record 1: unreadable TFRecord"):
        with pipeline.naming_bad_records([intact]):
            list(tf.data.TFRecordDataset([intact]))


def test_other_errors_pass_through(tmp_path):
    files = make_shards(tmp_path, shards=1, per_shard=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="reshape"):
        with pipeline.naming_bad_records(files):
            tf.reshape(tf.zeros([6]), [4])
    with pytest.raises(ZeroDivisionError):
        with pipeline.naming_bad_records(files):
            1 / 0


def test_argument_errors(tmp_path):
    files = make_shards(tmp_path, shards=1, per_shard=2)
    with pytest.raises(ConfigError, match="no TFRecord files"):
        pipeline.train_dataset([], 4, 32, 2)
    with pytest.raises(ConfigError) as e:
        pipeline.train_dataset(files, 4, 32, 0)
    assert (e.value.key, e.value.value) == ("parallel", 0)
    with pytest.raises(ConfigError) as e:
        pipeline.eval_dataset(files, 2, 16, 1, (2, 2), examples=1, steps=1)
    assert (e.value.key, e.value.value) == ("record_shard", (2, 2))
    assert pipeline.default_parallel(None) == max(1, os.cpu_count() or 1)


def epoch_batches(files, seed=3, **kwargs) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every batch of a finite train_dataset stream, as (images, labels) NumPy arrays: the images as the model
    sees them (float32, after the step's normalization, lighting shifts added)."""
    args = dict(batch_size=4, image_size=16, parallel=2, seed=seed, shuffle_buffer=6, deterministic=True)
    args.update(kwargs)
    return [(preprocessing.normalize_batch(x).numpy(), lab.numpy()) for x, lab in pipeline.train_dataset(files, **args)]


def same_batches(a, b) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(ia, ib) and np.array_equal(la, lb) for (ia, la), (ib, lb) in zip(a, b))


def test_resumed_stream_repeats_the_epochs_of_an_uninterrupted_one(tmp_path):
    files = make_shards(tmp_path, shards=3, per_shard=4)  # 12 records, labels 0..11
    full = epoch_batches(files, records_per_epoch=8, initial_epoch=0, epochs=3)
    assert len(full) == 3 * 8 // 4  # then the stream ends
    resumed = epoch_batches(files, records_per_epoch=8, initial_epoch=2, epochs=3)
    assert len(resumed) == 2
    assert same_batches(full[4:6], resumed)  # epoch 2: the same images (crops, flips) and labels, same order
    # An epoch in the middle, and a stream without an end, agree too.
    middle = epoch_batches(files, records_per_epoch=8, initial_epoch=1, epochs=2)
    assert same_batches(full[2:4], middle)
    endless = pipeline.train_dataset(files, 4, 16, 2, seed=3, shuffle_buffer=6, records_per_epoch=8,
                                     initial_epoch=1, deterministic=True)
    assert same_batches(full[2:6], [(preprocessing.normalize_batch(x).numpy(), lab.numpy())
                                    for x, lab in endless.take(4)])


def test_the_global_seed_plays_no_part(tmp_path):
    # A global seed of 0 (the worker of rank 0 with --seed 0 sets it) once made the shuffle fail to trace.
    files = make_shards(tmp_path, shards=2, per_shard=3)
    try:
        runs = []
        for global_seed in (0, 5, None):
            tf.random.set_seed(global_seed)
            runs.append(epoch_batches(files, records_per_epoch=4, epochs=2))
    finally:
        tf.random.set_seed(None)
    assert len(runs[0]) == 2 and same_batches(runs[0], runs[1]) and same_batches(runs[0], runs[2])


def test_epochs_and_seeds_differ(tmp_path):
    files = make_shards(tmp_path, shards=2, per_shard=4)
    batches = epoch_batches(files, records_per_epoch=8, epochs=2)
    assert not same_batches(batches[0:2], batches[2:4])  # epoch 0 vs epoch 1
    assert not np.array_equal(batches[0][0], batches[2][0])
    order = [np.concatenate([lab for _, lab in batches[2 * e:2 * e + 2]]).tolist() for e in range(2)]
    assert order[0] != order[1]  # another file order and record shuffle
    again = epoch_batches(files, records_per_epoch=8, epochs=2)
    assert same_batches(batches, again)  # deterministic: a second run is bit-identical
    other = epoch_batches(files, seed=4, records_per_epoch=8, epochs=2)
    assert not same_batches(batches, other)
    assert not np.array_equal(batches[0][0], other[0][0])


def test_same_records_get_new_augmentation_each_epoch(tmp_path):
    # One record only: every epoch has the same labels, so only the crops and flips can differ.
    ramp = np.tile(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], (48, 1, 3))
    files = [write_shard(tmp_path / "train-00000-of-00001.tfrecord", [(jpeg_bytes(ramp), 0, "ramp.JPEG")])]
    batches = epoch_batches(files, records_per_epoch=8, epochs=2)
    assert len(batches) == 4 and all(lab.tolist() == [0] * 4 for _, lab in batches)
    epoch0 = np.concatenate([im for im, _ in batches[:2]])
    epoch1 = np.concatenate([im for im, _ in batches[2:]])
    assert not np.array_equal(epoch0, epoch1)
    assert len({im.round(3).tobytes() for im in epoch0}) > 4  # records of one epoch differ among themselves


def test_epoch_larger_than_the_workers_records(tmp_path):
    files = make_shards(tmp_path, shards=1, per_shard=5)  # 5 records, labels 0..4
    batches = epoch_batches(files, records_per_epoch=12, initial_epoch=1, epochs=4, shuffle_buffer=4)
    assert len(batches) == 3 * 12 // 4
    for e in range(3):
        labels = np.concatenate([lab for _, lab in batches[3 * e:3 * e + 3]]).tolist()
        assert len(labels) == 12 and set(labels) == set(range(5))  # more than two passes: every record
        # 12 records taken through a 4-record buffer come from the first 16 of the passes: at most 4 copies each.
        assert max(labels.count(k) for k in range(5)) <= 4


def epoch_labels(files, **kwargs) -> list[int]:
    """The labels of a finite train_dataset stream, in order (batch 4, 16 px, default shuffle buffer)."""
    ds = pipeline.train_dataset(files, 4, 16, 2, seed=kwargs.pop("seed", 3), **kwargs)
    return np.concatenate([lab.numpy() for _, lab in ds]).tolist()


@pytest.mark.parametrize("deterministic", [True, False])
def test_an_epoch_is_one_pass_when_the_buffer_exceeds_the_share(tmp_path, deterministic):
    # 240 records (labels 0..239) in 4 files, an epoch of 240, the default 1,024-record buffer: once the buffer
    # spanned several passes and an epoch held about two thirds of the records, some of them two or more times.
    assert pipeline.DEFAULT_SHUFFLE_BUFFER > 240
    files = make_shards(tmp_path, shards=4, per_shard=60)
    labels = epoch_labels(files, records_per_epoch=240, epochs=2, deterministic=deterministic)
    epochs = [labels[:240], labels[240:]]
    assert all(sorted(epoch) == list(range(240)) for epoch in epochs)  # each record exactly once per epoch
    assert epochs[0] != epochs[1]  # each pass in its own order
    assert epochs[0] != sorted(epochs[0])  # shuffled within the pass
    # An epoch of fewer records than the share (full batches aside): each record at most once.
    short = epoch_labels(files, records_per_epoch=232, epochs=1, deterministic=deterministic)
    assert len(short) == len(set(short)) == 232


def test_an_epoch_longer_than_the_share_finishes_a_pass_before_the_next(tmp_path):
    files = make_shards(tmp_path, shards=3, per_shard=8)  # 24 records, labels 0..23
    labels = epoch_labels(files, records_per_epoch=40, epochs=2, deterministic=True)
    for epoch in (labels[:40], labels[40:]):
        assert sorted(epoch[:24]) == list(range(24))  # pass 0, whole, before any record of pass 1
        assert len(set(epoch[24:])) == 16  # then the start of pass 1: no record twice in it
    assert labels[:24] != labels[24:48]  # pass 1 in another order than pass 0
    # A resume inside the epoch, past the end of pass 0, skips exactly what the uninterrupted stream trained.
    full = epoch_batches(files, records_per_epoch=40, epochs=2, shuffle_buffer=pipeline.DEFAULT_SHUFFLE_BUFFER)
    resumed = epoch_batches(files, records_per_epoch=40, epochs=2, shuffle_buffer=pipeline.DEFAULT_SHUFFLE_BUFFER,
                            skip_records=28)
    assert same_batches(full[7:], resumed)


def test_nondeterministic_epochs_have_the_right_size(tmp_path):
    files = make_shards(tmp_path, shards=3, per_shard=3)
    ds = pipeline.train_dataset(files, 3, 16, 2, seed=1, records_per_epoch=6, initial_epoch=2, epochs=5)
    assert ds.options().deterministic is False
    labels = [lab.numpy() for _, lab in ds]
    assert len(labels) == 3 * 6 // 3 and all(lab.shape == (3,) for lab in labels)
    assert pipeline.train_dataset(files, 3, 16, 2, seed=1, deterministic=True).options().deterministic is True


def test_epoch_argument_errors(tmp_path):
    files = make_shards(tmp_path, shards=1, per_shard=2)
    for kwargs, key, value in ((dict(records_per_epoch=10), "records_per_epoch", 10),
                               (dict(records_per_epoch=0), "records_per_epoch", 0),
                               (dict(initial_epoch=2), "initial_epoch", 2),
                               (dict(records_per_epoch=8, initial_epoch=-1), "initial_epoch", -1),
                               (dict(records_per_epoch=8, initial_epoch=2, epochs=1), "epochs", 1)):
        with pytest.raises(ConfigError) as e:
            pipeline.train_dataset(files, 4, 16, 1, **kwargs)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value), kwargs
    assert list(pipeline.train_dataset(files, 4, 16, 1, records_per_epoch=8, initial_epoch=2, epochs=2)) == []


def test_stateless_crop_window():
    shape = tf.constant([48, 64, 3])
    seed = tf.constant([7, 11], tf.int64)
    first = preprocessing.random_crop_window(shape, stateless_seed=seed).numpy()
    assert np.array_equal(first, preprocessing.random_crop_window(shape, stateless_seed=seed).numpy())
    windows = {tuple(preprocessing.random_crop_window(shape, stateless_seed=tf.constant([7, k], tf.int64)).numpy())
               for k in range(20)}
    assert len(windows) > 10
    for y, x, h, w in windows:
        assert 0 <= y and 0 <= x and h >= 1 and w >= 1 and y + h <= 48 and x + w <= 64
        assert 0.08 * 48 * 64 * 0.9 <= h * w  # at least (about) 8% of the area


# --------------------------------------------------------------------------- augmentation options

#: The public ImageNet RGB eigen-decomposition the lighting noise is specified with (0..1 pixel scale;
#: eigenvectors in the columns), written out here rather than read from the module under test.
EIGVAL = np.array([0.2175, 0.0188, 0.0045])
EIGVEC = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])


def ramp_shard(tmp_path) -> list[str]:
    """One record: a 64x48 horizontal ramp, dark on the left, bright on the right."""
    ramp = np.tile(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], (48, 1, 3))
    return [write_shard(tmp_path / "train-00000-of-00001.tfrecord", [(jpeg_bytes(ramp), 0, "ramp.JPEG")])]


def test_no_flip_disables_the_flip(tmp_path):
    files = ramp_shard(tmp_path)
    flipped = np.concatenate([im for im, _ in epoch_batches(files, seed=5, records_per_epoch=16, epochs=1)])
    plain = np.concatenate([im for im, _ in epoch_batches(files, seed=5, records_per_epoch=16, epochs=1,
                                                          flip=False)])
    assert flipped.shape == plain.shape == (16, 16, 16, 3)

    def increasing(images):  # the ramp still rises left to right: not mirrored
        return images[:, :, -1, 0].mean(1) > images[:, :, 0, 0].mean(1)

    assert increasing(plain).all()  # no image of the flip=False stream is mirrored
    assert not increasing(flipped).all() and increasing(flipped).any()  # the default stream mirrors some
    # Same seed: the same crops; each flip=True image is the flip=False one, mirrored or not.
    mirrored = flipped[:, :, ::-1, :]
    for k in range(16):
        assert np.array_equal(flipped[k], plain[k]) or np.array_equal(mirrored[k], plain[k])


def whole_image_resized(data: bytes, size: int) -> np.ndarray:
    """The whole JPEG decoded and resized bilinearly to size x size, rounded to uint8 levels (float)."""
    full = tf.image.resize(tf.io.decode_jpeg(data, channels=3), [size, size], method="bilinear")
    return np.floor(full.numpy() + 0.5)


@pytest.mark.parametrize("shape", [(48, 60), (40, 60)])  # aspect ratio 1.25 (inside 3/4..4/3) and 1.5 (outside)
def test_crop_area_one_gives_the_whole_image(tmp_path, shape):
    rng = np.random.default_rng(2)
    data = jpeg_bytes(rng.integers(0, 256, (*shape, 3), dtype=np.uint8))
    files = [write_shard(tmp_path / "train-00000-of-00001.tfrecord", [(data, 0, "noise.JPEG")])]
    expected = whole_image_resized(data, 20)
    whole = epoch_batches(files, image_size=20, records_per_epoch=8, epochs=1, flip=False, crop_area=(1.0, 1.0))
    for images, _ in whole:
        for image in unnormalize(images):
            np.testing.assert_allclose(image, expected, atol=1e-3)
    default = epoch_batches(files, image_size=20, records_per_epoch=8, epochs=1, flip=False)
    assert not any(np.allclose(unnormalize(im), expected, atol=1e-3) for images, _ in default for im in images)


def test_crop_area_range_of_the_window():
    shape = tf.constant([48, 64, 3])
    areas = []
    for k in range(30):
        y, x, h, w = preprocessing.random_crop_window(shape, stateless_seed=tf.constant([3, k], tf.int64),
                                                 area_range=(0.4, 0.5)).numpy()
        assert 0 <= y and 0 <= x and y + h <= 48 and x + w <= 64
        areas.append(h * w / (48 * 64))
    # Pixel rounding moves an area by a few percent; the whole image (fallback) would be 1.0.
    assert min(areas) >= 0.37 and max(areas) <= 0.53
    assert max(areas) - min(areas) > 0.03  # drawn from the range, not one fixed size


def test_lighting_adds_the_pca_offset_per_image(tmp_path):
    colour = np.array([120, 110, 100], np.uint8)
    data = jpeg_bytes(np.tile(colour, (40, 60, 1)))
    files = [write_shard(tmp_path / "train-00000-of-00001.tfrecord", [(data, 0, "solid.JPEG")])]
    args = dict(seed=11, records_per_epoch=8, epochs=1, flip=False)
    plain = np.concatenate([unnormalize(im) for im, _ in epoch_batches(files, **args)])
    lit = np.concatenate([unnormalize(im) for im, _ in epoch_batches(files, lighting=0.1, **args)])
    offsets = lit - plain  # [8, 16, 16, 3], 0..255 units
    per_image = offsets.reshape(8, -1, 3)
    np.testing.assert_allclose(per_image, per_image[:, :1, :].repeat(per_image.shape[1], 1), atol=1e-3)
    offset = per_image[:, 0, :]  # [8, 3]: one RGB offset per image
    for position in range(8):  # alpha ~ N(0, 0.1) from the documented seed (seed, -1 - position)
        alpha = tf.random.stateless_normal([3], seed=[11, -1 - position], stddev=0.1, alg="philox").numpy()
        np.testing.assert_allclose(offset[position], 255 * EIGVEC @ (alpha * EIGVAL), atol=1e-3)
    assert len({tuple(o.round(2)) for o in offset}) == 8  # a new draw per image
    # Mostly brightness: nearly all of the offsets' energy lies along the first eigenvector (about -0.58 in
    # each channel; 99% for eigenvalues 0.2175/0.0188/0.0045).
    along_first = offset @ EIGVEC[:, 0]
    assert (along_first ** 2).sum() > 0.9 * (offset ** 2).sum()
    assert 0.3 < np.abs(offset).mean() < 30


def test_lighting_zero_is_the_default_pipeline(tmp_path):
    files = make_shards(tmp_path, shards=2, per_shard=3)
    default = epoch_batches(files, records_per_epoch=4, epochs=2)
    zero = epoch_batches(files, records_per_epoch=4, epochs=2, lighting=0.0, flip=True, crop_area=(0.08, 1.0))
    assert same_batches(default, zero)
    lit = epoch_batches(files, records_per_epoch=4, epochs=2, lighting=0.1)
    assert not same_batches(default, lit)
    assert [lab.tolist() for _, lab in lit] == [lab.tolist() for _, lab in default]  # same records, same order


def test_lighting_is_deterministic_and_resumable(tmp_path):
    files = make_shards(tmp_path, shards=3, per_shard=4)
    args = dict(records_per_epoch=8, lighting=0.1, crop_area=(0.3, 0.9), flip=False)
    full = epoch_batches(files, initial_epoch=0, epochs=3, **args)
    assert same_batches(full, epoch_batches(files, initial_epoch=0, epochs=3, **args))
    assert same_batches(full[4:6], epoch_batches(files, initial_epoch=2, epochs=3, **args))  # resumed at epoch 2
    assert not same_batches(full, epoch_batches(files, seed=4, initial_epoch=0, epochs=3, **args))


@pytest.mark.parametrize("kwargs, match", [
    (dict(flip="no"), r"flip='no' \(--no-flip\)"),
    (dict(crop_area=(0.0, 1.0)), r"crop_area=\(0, 1\) \(--crop-area MIN MAX\): need 0 < MIN <= MAX <= 1"),
    (dict(crop_area=(0.6, 0.2)), r"crop_area=\(0.6, 0.2\)"),
    (dict(crop_area=(0.5, 1.5)), r"crop_area=\(0.5, 1.5\)"),
    (dict(crop_area=(0.5,)), r"crop_area=\(0.5,\) \(--crop-area MIN MAX\): must be two numbers"),
    (dict(crop_area="ab"), r"must be two numbers"),
    (dict(lighting=-0.1), r"lighting=-0.1 \(--lighting STD\): must be a finite number >= 0"),
    (dict(lighting=float("nan")), r"lighting=nan"),
    (dict(lighting="x"), r"lighting='x' \(--lighting STD\): must be a number"),
])
def test_bad_augmentation_values_are_refused(tmp_path, kwargs, match):
    files = make_shards(tmp_path, shards=1, per_shard=2)
    with pytest.raises(ConfigError, match=match):
        pipeline.train_dataset(files, 2, 16, 1, **kwargs)


_FAULTS_PER_BATCH = """
import resource, sys
from spark_imagenet.training.worker import pipeline
if not pipeline._reuse_freed_memory():
    print("not-glibc")
    sys.exit()
it = iter(pipeline.train_dataset(sys.argv[1:], 64, 224, 2, seed=0, shuffle_buffer=8))
for _ in range(6):  # warm-up: every thread's arena has held a batch
    next(it)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    next(it)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 6)
"""


@pytest.mark.slow  # a whole job or process (the fast tier stays under 5 minutes)
def test_batches_reuse_freed_memory(tmp_path):
    # A float32 batch of 64 x 224 px is 38.5 MB (9,409 pages): without the malloc settings every batch
    # is a fresh mmap whose pages all fault in on first write (measured: 10,300-11,400 faults per batch).
    # With them, 27 fresh processes measured 0-5,100 (median ~400): which glibc arena a tf.data thread
    # gets is chance, and a batch in a thread arena's 64 MiB heap is sometimes unmapped when freed. So the
    # bound is three quarters of a batch, in a fresh process as the TensorFlow worker is one (in pytest's
    # own process, after hundreds of tests, the arenas hold what earlier tests left: CI once saw 7,904).
    import subprocess
    import sys

    files = make_shards(tmp_path, shards=1, per_shard=8)
    out = subprocess.run([sys.executable, "-c", _FAULTS_PER_BATCH, *files], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    if out.stdout.strip() == "not-glibc":
        pytest.skip("not glibc: the malloc settings do not apply")
    faults = float(out.stdout.split()[-1])
    assert faults < 9409 * 3 / 4, f"{faults:.0f} page faults per batch"
