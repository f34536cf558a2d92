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

    >>> from spark_imagenet.source import open_source
    >>> dataset = open_source("/data/kaggle").list_images(seed=0)
    >>> manifest = shard_source_job(spark, dataset, "gs://my-bucket/photos-shards")
    >>> manifest.num_classes
    4
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterator

from spark_imagenet.dataset.dataframe import Columns, JobSettings, Survey, build_shards, shard_counts
from spark_imagenet.dataset.image_form import image_form
from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, check_max_pixels
from spark_imagenet.errors import ArchiveError, ConfigError, StorageError
from spark_imagenet.source.base import ImageFile, ImageReader, SourceDataset
from spark_imagenet.source.zip_archive import ZipPlan, ZipSource, chosen_in_slice, read_located

logger = logging.getLogger(__name__)

#: Rows per task of the reading stage (the images are read there, before the shuffle into shards).
ROWS_PER_READ_TASK = 2000
#: The columns of the job's rows: the row's image (path in its source), class id, split, file name, bytes.
COLUMNS = Columns(image="content", label="label", split="split", name="name", integer_labels=True)
ROW_SCHEMA = "label long, split string, name string, content binary"
#: Images per Arrow batch a :class:`ListZipSlice` task yields.
BATCH_ROWS = 256


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


@dataclasses.dataclass(frozen=True)
class ListZipSlice:
    """``mapInArrow`` function: for each ``(start, stop)`` slice of a zip's central directory, the chosen
    images in it with their bytes (``label``, ``split``, ``name``, ``content``), in batches of
    :data:`BATCH_ROWS`.

    Raises:
        ArchiveError: a member that cannot be read (named; Spark retries the task first), a damaged directory.
    """

    choice: Any  # a pyspark Broadcast of a ZipChoice

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        choice = self.choice.value
        for batch in batches:
            for start, stop in zip(batch.column("start").to_pylist(), batch.column("stop").to_pylist()):
                rows: list[tuple] = []
                for rel, label, split, location in chosen_in_slice(choice, start, stop):
                    rows.append((label, split, rel, self._read(choice.path, location)))
                    if len(rows) == BATCH_ROWS:
                        yield self._batch(rows)
                        rows = []
                if rows:
                    yield self._batch(rows)

    @staticmethod
    def _read(path: str, location: tuple) -> bytes:
        try:
            return read_located(path, location)
        except ArchiveError as e:
            raise ArchiveError(f"{path} member {location[-1]}: {e}") from None
        except OSError as e:
            raise StorageError(f"{path} member {location[-1]}: cannot read it on this executor ({e.strerror or e}); "
                               "the zip must be where every executor reads it (a shared folder)") from None

    @staticmethod
    def _batch(rows: list[tuple]) -> Any:
        import pyarrow as pa

        labels, splits, names, contents = zip(*rows)
        return pa.RecordBatch.from_arrays([pa.array(labels, pa.int64()), pa.array(splits, pa.string()),
                                           pa.array(names, pa.string()), pa.array(contents, pa.binary())],
                                          names=["label", "split", "name", "content"])


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
    return spark.createDataFrame(frame).repartition(tasks).mapInArrow(ReadImages(reader), ROW_SCHEMA)


def shard_source_job(spark: Any, dataset: SourceDataset, out: str, *, train_shards: int | None = None,
                     val_shards: int | None = None, seed: int = 0, verify: str = "decode", on_corrupt: str = "error",
                     overwrite: bool = False, progress: bool = True, max_image_pixels: int = DEFAULT_MAX_PIXELS,
                     resize: int | None = None, max_side: int | None = None,
                     jpeg_quality: int | None = None) -> Manifest:
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
        max_image_pixels: the pixel limit (:mod:`spark_imagenet.dataset.pixels`): a larger image is unusable.
        resize, max_side, jpeg_quality: how the images are stored, as :func:`spark_imagenet.dataset.sharding.shard`'s
            (``--resize``, ``--max-side``, ``--jpeg-quality``: :mod:`spark_imagenet.dataset.image_form`).

    Returns:
        Manifest: the committed manifest.

    Raises:
        ConfigError: a source read only as a stream (the older Kaggle zip form), a Spark Connect session, a
            shard count above the images of its split, or ``out`` holds a different dataset.
        ImageError, StorageError, DataError: as :func:`spark_imagenet.dataset.dataframe.shard_dataframe`.
    """
    settings = _settings(seed, verify, on_corrupt, overwrite, progress, max_image_pixels, resize, max_side,
                         jpeg_quality)
    if not dataset.source.random_access:
        raise ConfigError(f"{dataset.root} can only be read in order (the older Kaggle zip, whose images are a "
                          "nested tar.gz): shard it without --master, or unpack it first (unzip, then tar -xzf its tar.gz)")
    _refuse_connect(spark)
    sizes = sum(img.size for img in dataset.train) + sum(img.size for img in dataset.val)
    found = Survey(tuple(c.wnid for c in dataset.classes), {"train": len(dataset.train), "val": len(dataset.val)},
                   sizes, dataset.classes)
    logger.info(f"{len(dataset.train)} train and {len(dataset.val)} val images of {len(dataset.classes)} classes "
                f"chosen from {dataset.root}; the executors read them")
    source = {**dataset.source.describe(), "selection": dataset.selection}
    return _build(image_rows(spark, dataset), found, out, source, train_shards, val_shards, settings)


def shard_zip_job(spark: Any, plan: ZipPlan, out: str, *, train_shards: int | None = None,
                  val_shards: int | None = None, seed: int = 0, verify: str = "decode", on_corrupt: str = "error",
                  overwrite: bool = False, progress: bool = True, max_image_pixels: int = DEFAULT_MAX_PIXELS,
                  resize: int | None = None, max_side: int | None = None,
                  jpeg_quality: int | None = None) -> Manifest:
    """Build the shards and ``manifest.json`` of a Kaggle zip planned without listing it on the driver
    (:func:`~spark_imagenet.source.zip_archive.plan_kaggle_zip`): each task lists one slice of the zip's
    central directory and reads the chosen members in it (:class:`ListZipSlice`).

    Args:
        spark: a classic SparkSession.
        plan: the plan.
        out, train_shards, val_shards, seed, verify, on_corrupt, overwrite, progress, max_image_pixels, resize,
            max_side, jpeg_quality: as :func:`shard_source_job`.

    Returns:
        Manifest: the committed manifest; its records equal :func:`shard_source_job`'s for the same images.

    Raises:
        ConfigError, ImageError, StorageError, DataError: as :func:`shard_source_job`; ArchiveError: a
        member that cannot be read (after Spark's retries).
    """
    settings = _settings(seed, verify, on_corrupt, overwrite, progress, max_image_pixels, resize, max_side,
                         jpeg_quality)
    _refuse_connect(spark)
    found = Survey(tuple(c.wnid for c in plan.classes), dict(plan.counts), plan.size, plan.classes)
    choice = plan.choice
    logger.info(f"{plan.counts['train']} train and {plan.counts['val']} val images of {len(plan.classes)} classes "
                f"chosen from {choice.path}; {len(plan.slices)} tasks list and read them")
    source = {**ZipSource(choice.path, choice.prefix).describe(), "selection": plan.selection}
    rows = spark.createDataFrame([(a, b) for a, b in plan.slices], "start long, stop long").repartition(
        len(plan.slices)).mapInArrow(ListZipSlice(spark.sparkContext.broadcast(choice)), ROW_SCHEMA)
    return _build(rows, found, out, source, train_shards, val_shards, settings)


def _settings(seed: int, verify: str, on_corrupt: str, overwrite: bool, progress: bool, max_image_pixels: int,
              resize: int | None, max_side: int | None, jpeg_quality: int | None) -> JobSettings:
    """The job's settings, the pixel limit and the stored form checked (ConfigError naming the bad one)."""
    return JobSettings(seed, 0.0, verify, on_corrupt, overwrite, progress, check_max_pixels(max_image_pixels),
                       image_form(resize, max_side, jpeg_quality))


def _refuse_connect(spark: Any) -> None:
    """ConfigError for a Spark Connect session (no broadcast variables there)."""
    if "pyspark.sql.connect" in type(spark).__module__:
        raise ConfigError("shard SOURCE --master needs a classic SparkSession (Spark Connect has no broadcast "
                          "variables or RDD API): give a spark://, yarn, k8s:// or local master")


def _build(rows: Any, found: Survey, out: str, source: dict[str, Any], train_shards: int | None,
           val_shards: int | None, job: JobSettings) -> Manifest:
    """The shard counts, then the job over ``rows`` and the commit (:func:`build_shards`)."""
    counts = shard_counts(found, 0.0, train_shards, val_shards)
    return build_shards(rows, COLUMNS, found, counts, out, job, {**source, "sharded_by": "spark", "seed": job.seed})
