"""Test helpers: small Kaggle-layout trees (generated) and the shared real data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_imagenet.demo.synthetic import generate_kaggle_layout

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SPARK_IMAGENET_SHARED_DATA", REPO.parent / "shared" / "data"))
ILSVRC_MINI = SHARED_DATA / "ilsvrc-mini"
IMAGENET_SAMPLE = SHARED_DATA / "imagenet-sample"


def requires_shared(path: Path):
    """Skip marker for tests that need ../shared/data (absent on a fresh clone elsewhere)."""
    return pytest.mark.skipif(not path.is_dir(), reason=f"real ILSVRC data not found at {path} (../shared/data; "
                                                        "set SPARK_IMAGENET_SHARED_DATA to its data folder)")


def small_layout(dest: Path, **kw) -> Path:
    """A tiny synthetic Kaggle tree (4 classes x 6 train, 3 val each, 64x48 px) unless overridden."""
    args = dict(num_classes=4, train_per_class=6, val_per_class=3, test_images=2, size=(64, 48), seed=1)
    args.update(kw)
    return generate_kaggle_layout(dest, **args)


def small_bucket(root: Path, train_per_class: int) -> Path:
    """``root/bucket``: a :func:`small_layout` tree (in ``root/kaggle``) of ``train_per_class`` train images per
    class, sharded into 2 train and 1 val shards in this process."""
    from spark_imagenet.dataset.sharding import shard

    tree = small_layout(root / "kaggle", train_per_class=train_per_class)
    shard(tree, root / "bucket", train_shards=2, val_shards=1, processes=1, progress=False)
    return root / "bucket"


def build(tree: Path, out: Path, **kw):
    """``shard`` a tree quietly into ``out`` (4 train and 2 val shards, 2 processes, unless overridden)."""
    from spark_imagenet.dataset.sharding import shard

    kw.setdefault("train_shards", 4)
    kw.setdefault("val_shards", 2)
    return shard(tree, out, processes=2, progress=False, **kw)


def all_shards(manifest) -> list:
    """Every shard of every split of a manifest."""
    return [s for split in manifest.splits.values() for s in split.shards]


def gcs_generations(bucket: str, prefix: str) -> dict[str, int]:
    """``{object name: generation}`` under ``gs://bucket/prefix``."""
    from spark_imagenet.storage import GCSStorage

    return {o.name: o.generation for o in GCSStorage(f"gs://{bucket}/{prefix}").list()}
