"""Our TF-free TFRecord/Example writer against TensorFlow's own writer and parser."""

from __future__ import annotations

import io
import os

import pytest

from record_util import read_records
from spark_imagenet.dataset.tfrecord import encode_example, write_record

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")


def tf_example(features: dict) -> bytes:
    feats = {}
    for k, v in features.items():
        if isinstance(v, int):
            feats[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        elif isinstance(v, list):
            feats[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=v))
        else:
            feats[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode() if isinstance(v, str) else v]))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


CASES = [
    {"image/encoded": b"\xff\xd8" + bytes(range(256)) * 3, "image/class/label": 999, "image/filename": "n0_1.JPEG"},
    {"big": 2**40, "neg": -5, "zero": 0, "many": [1, 300, 70000]},
    {"empty": b"", "unicode": "café"},
    # varints of one and two bytes at every level, and an image-sized value (lengths of three bytes)
    {"one": 127, "two": 128, "s127": b"x" * 127, "s128": "y" * 128, "image/encoded": os.urandom(200_000)},
]


@pytest.mark.parametrize("features", CASES)
def test_example_bytes_parse_to_the_same_example(features):
    ours = encode_example(features)
    assert tf.train.Example.FromString(ours) == tf.train.Example.FromString(tf_example(features))


def test_records_read_back_by_tensorflow(tmp_path):
    path = tmp_path / "x.tfrecord"
    payloads = [encode_example(c) for c in CASES] + [b"", b"x" * 100_000]
    with open(path, "wb") as f:
        sizes = [write_record(f, p) for p in payloads]
    assert sizes == [len(p) + 16 for p in payloads] and path.stat().st_size == sum(sizes)
    got = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    assert got == payloads
    # And byte-identical to TensorFlow's writer.
    ref = tmp_path / "ref.tfrecord"
    with tf.io.TFRecordWriter(str(ref)) as w:
        for p in payloads:
            w.write(p)
    assert ref.read_bytes() == path.read_bytes()


def test_reader_detects_corruption():
    buf = io.BytesIO()
    write_record(buf, b"hello world")
    data = bytearray(buf.getvalue())
    assert list(read_records(io.BytesIO(bytes(data)))) == [b"hello world"]
    data[14] ^= 1
    with pytest.raises(ValueError, match="corrupt data CRC"):
        list(read_records(io.BytesIO(bytes(data))))
    with pytest.raises(ValueError, match="truncated"):
        list(read_records(io.BytesIO(buf.getvalue()[:-3])))


@pytest.mark.parametrize("bad", [{"flag": True}, {"mixed": [1, b"x"]}, {"float": 1.5}])
def test_values_of_other_kinds_are_refused(bad):
    with pytest.raises(TypeError):
        encode_example(bad)
