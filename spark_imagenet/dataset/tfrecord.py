"""Writing ``tf.train.Example`` records in TFRecord files without TensorFlow.

The shard builder runs in plain worker processes; importing TensorFlow in
each would cost seconds and hundreds of MB per process for what is a byte
format. This module writes the same bytes TensorFlow's ``TFRecordWriter`` and
``tf.train.Example.SerializeToString`` write:

* TFRecord framing (tensorflow/core/lib/io/record_writer.cc): for each record
  ``uint64 length (little endian)``, ``uint32 masked_crc32c(length bytes)``,
  ``data``, ``uint32 masked_crc32c(data)``, where
  ``masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2**32)``.
* ``Example`` protobuf (tensorflow/core/example/example.proto and
  feature.proto), protobuf wire format (protobuf.dev "Encoding"):
  ``Example{features=1: Features{feature=1: map<string, Feature>}}``,
  ``Feature{bytes_list=1: BytesList{value=1}, int64_list=3: Int64List{value=1 packed}}``.

``tests/test_tfrecord.py`` checks the output against TensorFlow's parser.
"""

from __future__ import annotations

import functools
import struct
from typing import BinaryIO, Mapping, Sequence, Union

import google_crc32c

FeatureValue = Union[bytes, str, int, Sequence[int], Sequence[bytes]]

_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data`` (uint32)."""
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


#: The one-byte varints 0 to 127 (most tags, lengths and the image sizes' bytes).
_SMALL = tuple(bytes((i,)) for i in range(128))
#: The tag of a length-delimited field 1 (Example.features, Features.feature, the map entry's key,
#: Feature.bytes_list, BytesList.value) and of field 2 (the map entry's value).
_TAG1, _TAG2 = b"\x0a", b"\x12"


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:
        n &= (1 << 64) - 1  # int64 two's complement, 10 bytes on the wire
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited (wire type 2) field."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


@functools.lru_cache(maxsize=1024)
def _key(key: str) -> bytes:
    """The key field of a feature's map entry."""
    return _field(1, key.encode("utf-8"))


def _feature(value: FeatureValue) -> bytes:
    if isinstance(value, int) and not isinstance(value, bool):
        return _field(3, _field(1, _varint(value)))  # int64_list, one packed value
    if isinstance(value, (bytes, str)):
        value = [value]
    values = list(value)
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        packed = b"".join(_varint(v) for v in values)
        return _field(3, _field(1, packed))  # int64_list, packed values
    if all(isinstance(v, (bytes, str)) for v in values):
        items = b"".join(_field(1, v.encode("utf-8") if isinstance(v, str) else v) for v in values)
        return _field(1, items)  # bytes_list
    raise TypeError(f"feature values must be all ints or all bytes/str, got {values!r:.80}")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a ``tf.train.Example``.

    Args:
        features: feature key to value: ``bytes``/``str`` (a one-element
            BytesList), ``int`` (a one-element Int64List), or a sequence of
            either kind.

    Returns:
        bytes: what ``tf.train.Example(...).SerializeToString()`` returns for
        the same features (keys in the given order). A single ``bytes`` value
        (an image) is copied once, into the result.

    Raises:
        TypeError: a value mixes kinds or is neither int nor bytes/str.
    """
    pieces: list[bytes] = []
    for key, value in features.items():
        if isinstance(value, bytes):  # Feature{bytes_list: BytesList{value: [value]}} as a header and the value
            item = _varint(len(value))
            head = _TAG1 + _varint(1 + len(item) + len(value)) + _TAG1 + item
            size = len(head) + len(value)
        else:
            head = _feature(value)
            value, size = b"", len(head)
        name = _key(key)
        inner = _TAG2 + _varint(size)
        pieces += (_TAG1 + _varint(len(name) + len(inner) + size), name, inner, head, value)
    return b"".join((_TAG1, _varint(sum(map(len, pieces))), *pieces))


def write_record(f: BinaryIO, data: bytes) -> int:
    """Append one TFRecord to an open binary file.

    Args:
        f: file opened for binary writing.
        data: the record payload (e.g. a serialized Example).

    Returns:
        int: bytes written (``len(data) + 16``).
    """
    length = struct.pack("<Q", len(data))
    f.write(length)
    f.write(struct.pack("<I", masked_crc32c(length)))
    f.write(data)
    f.write(struct.pack("<I", masked_crc32c(data)))
    return len(data) + 16
