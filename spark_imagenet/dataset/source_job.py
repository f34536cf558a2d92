"""Sharding an image source as a Spark job: ``spark-imagenet shard SOURCE --master M`` (and ``--labels FILE
--master M``).

The images are chosen on the driver exactly as without ``--master`` (:meth:`ImageSource.list_images`: the
same classes and class ids, the same ``--classes``/``--per-class`` sample, the same ``--val-fraction`` split,
every check of the listing), then read, checked, encoded and written by the executors through the job of
:mod:`spark_imagenet.dataset.dataframe`: one task per shard, each shard uploaded verified, the manifest
committed last by the driver. The executors read the images with the source's own picklable reader, sent
once per executor as a broadcast variable, so the source must be where every executor can read it (a
shared or local-mode folder or zip, or a labels file whose images are in a store).

How the result differs from the local path's: each split holds the same images with the same labels, but
an image's shard and place in it come from a hash of its bytes, not from the local path's deal, so shard
contents and the dataset id differ (docs/guide/data.md, 'From a Spark DataFrame or table').

Example::

    from spark_imagenet.source import open_source
    dataset = open_source("/shared/photos").list_images(seed=0)
    manifest = shard_source_job(spark, dataset, "gs://my-bucket/photos-shards")
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterator

from spark_imagenet.dataset.dataframe import Columns, JobSettings, Survey, build_shards, shard_counts
from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.errors import ConfigError, StorageError
from spark_imagenet.source.base import ImageFile, ImageReader, SourceDataset

logger = logging.getLogger(__name__)

#: Rows per task of the reading stage (the images are read there, before the shuffle into shards).
ROWS_PER_READ_TASK = 2000
#: The columns of the job's rows: the row's image (path in its source), class id, split, file name, bytes.
COLUMNS = Columns(image="content", label="label", split="split", name="name", integer_labels=True)


@dataclasses.dataclass(frozen=True)
class ReadImages:
    """``mapInArrow`` function: adds each row's image bytes (``content``), read through the source's reader
    (a broadcast variable, so each executor receives it once).

    Raises:
        StorageError: an image cannot be read (its path and the reason; Spark retries the task first).
    """

    reader: Any  # a pyspark Broadcast of an ImageReader

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        reader: ImageReader = self.reader.value
        for batch in batches:
            contents = [self._read(reader, path, label) for path, label in
                        zip(batch.column("path").to_pylist(), batch.column("label").to_pylist())]
            yield pa.RecordBatch.from_arrays(
                [batch.column("label"), batch.column("split"), batch.column("name"), pa.array(contents, pa.binary())],
                names=["label", "split", "name", "content"])

    @staticmethod
    def _read(reader: ImageReader, path: str, label: int) -> bytes:
        image = ImageFile(path, label, "", 0)
        try:
            return reader.read(image)
        except OSError as e:
            raise StorageError(f"{reader.where(image)}: cannot read it on this executor ({e.strerror or e}); the "
                               "source must be where every executor reads it (a shared folder, or a store)") from None


def image_rows(spark: Any, dataset: SourceDataset) -> Any:
    """The chosen images as a DataFrame of ``label`` (class id), ``split``, ``name`` (the path relative to the
    source) and ``content`` (bytes, read on the executors by :class:`ReadImages`)."""
    import pandas as pd

    images = [(img, split) for split, chosen in (("train", dataset.train), ("val", dataset.val)) for img in chosen]
    frame = pd.DataFrame({"path": [img.path for img, _ in images],
                          "label": pd.Series([img.label for img, _ in images], dtype="int64"),
                          "split": [split for _, split in images],
                          "name": [dataset.relpath(img) for img, _ in images]})
    reader = spark.sparkContext.broadcast(dataset.source.reader([img for img, _ in images]))
    tasks = max(spark.sparkContext.defaultParallelism, -(-len(images) // ROWS_PER_READ_TASK))
    schema = "label long, split string, name string, content binary"
    return spark.createDataFrame(frame).repartition(tasks).mapInArrow(ReadImages(reader), schema)


def shard_source_job(spark: Any, dataset: SourceDataset, out: str, *, train_shards: int | None = None,
                     val_shards: int | None = None, seed: int = 0, verify: str = "decode", on_corrupt: str = "error",
                     overwrite: bool = False, progress: bool = True) -> Manifest:
    """Build the shards and ``manifest.json`` of images chosen from a source, as a Spark job (see the module doc).

    Args:
        spark: a classic SparkSession.
        dataset: the chosen images (:meth:`~spark_imagenet.source.base.ImageSource.list_images`) of a
            random-access source.
        out: the destination URL; every executor must reach it.
        train_shards: train shards (None: about 128 MiB each from the listed sizes, at least 16, at most one
            per 32 images).
        val_shards: val shards (None: as train, at least 4).
        seed: seed of the hashes that choose each image's shard and place.
        verify: ``"decode"`` or ``"header"``.
        on_corrupt: ``"error"`` or ``"skip"``.
        overwrite: replace a different dataset already at ``out``.
        progress: log a progress line every 10 s.

    Returns:
        Manifest: the committed manifest.

    Raises:
        ConfigError: a source read only as a stream (the older Kaggle zip form), a Spark Connect session, a
            shard count above the images of its split, or ``out`` holds a different dataset.
        ImageError, StorageError, DataError: as :func:`spark_imagenet.dataset.dataframe.shard_dataframe`.
    """
    if not dataset.source.random_access:
        raise ConfigError(f"{dataset.root} can only be read in order (the older Kaggle zip, whose images are a "
                          "nested tar.gz): shard it without --master, or extract it first (spark-imagenet extract)")
    if "pyspark.sql.connect" in type(spark).__module__:
        raise ConfigError("shard SOURCE --master needs a classic SparkSession (Spark Connect has no broadcast "
                          "variables or RDD API): give a spark://, yarn, k8s:// or local master")
    sizes = sum(img.size for img in dataset.train) + sum(img.size for img in dataset.val)
    found = Survey(tuple(c.wnid for c in dataset.classes), {"train": len(dataset.train), "val": len(dataset.val)},
                   sizes)
    counts = shard_counts(found, 0.0, train_shards, val_shards)
    job = JobSettings(seed, 0.0, verify, on_corrupt, overwrite, progress)
    source = {**dataset.source.describe(), "selection": dataset.selection, "sharded_by": "spark", "seed": seed}
    logger.info(f"{len(dataset.train)} train and {len(dataset.val)} val images of {len(dataset.classes)} classes "
                f"chosen from {dataset.root}; the executors read them")
    return build_shards(image_rows(spark, dataset), COLUMNS, found, counts, out, job, source)
