"""A fake sharded dataset: shard files of random bytes and a valid manifest
(enough for everything the driver and the barrier tasks do before TensorFlow)."""

from __future__ import annotations

import random
from pathlib import Path

from spark_imagenet.dataset.manifest import Manifest, ShardInfo, SplitInfo
from spark_imagenet.source.synset import SynsetClass
from spark_imagenet.storage import LocalStorage, crc32c_file


def make_bucket(root: Path, train: int = 4, val: int = 1, corrupt: str | None = None, image_form=None) -> Path:
    """Shard files of random bytes and a valid manifest (enough for everything before TensorFlow); its
    ``image_form`` when given (an ImageForm), else original."""
    rng = random.Random(0)
    storage = LocalStorage(root)
    splits = {}
    for split, count in (("train", train), ("val", val)):
        shards = []
        for i in range(count):
            name = f"{split}-{i:05d}-of-{count:05d}.tfrecord"
            data = rng.randbytes(500 + i)
            storage.write_bytes(name, data)
            shards.append(ShardInfo(name, 5, len(data), crc32c_file(root / name)))
        splits[split] = SplitInfo(tuple(shards))
    Manifest(dataset_id="fake-" + root.name, created="", classes=(SynsetClass(0, "n0", ("a",)),
             SynsetClass(1, "n1", ("b",))), splits=splits,
             **({"image_form": image_form} if image_form is not None else {})).save(storage)
    if corrupt:
        data = bytearray((root / corrupt).read_bytes())
        data[0] ^= 0xFF
        (root / corrupt).write_bytes(bytes(data))
    return root
