"""Images given to both splits by a split column: one aggregation over a DataFrame build's rows, on the driver.

Without a split column, a row's split comes from a hash of its bytes, so copies of one image always share a
split, and the shard tasks find every group of copies (identical bytes sort next to each other in one shard:
:mod:`spark_imagenet.dataset.dataframe_task`). A split column can put one copy in train and another in val,
in shards that no task sees together: the case that matters most, since validation images are then trained
on. :func:`copies_across_splits` finds those groups with one more pass over the image column (a 64-bit hash
and the length of each image, grouped; no image bytes leave the executors), which the job makes only when a
split column is given (docs/design.md, 'Sharding a DataFrame as a Spark job').
"""

from __future__ import annotations

from typing import Any

from spark_imagenet.dataset.duplicates import MAX_GROUPS, Duplicate


def copies_across_splits(table: Any, train_shards: int, classes: tuple[str, ...],
                         integer_labels: bool) -> tuple[Duplicate, ...]:
    """The groups of identical images with copies in both train and val.

    Args:
        table: the build's rows (:func:`spark_imagenet.dataset.dataframe.keyed_table`: ``shard``, ``order``
            (a seeded 64-bit hash of the bytes), ``name``, ``label``, ``image``).
        train_shards: shards of the train split (shard ``s`` below it is train, else val).
        classes: class names by class id.
        integer_labels: whether ``label`` holds class ids.

    Returns:
        tuple[Duplicate, ...]: at most :data:`~spark_imagenet.dataset.duplicates.MAX_GROUPS` groups of split
        ``"train+val"``, each naming its first train copy and its last val copy (by name) and counting all
        of its copies. Images are equal when their hash and length are (a false match among n images has odds
        of about n^2 / 2^65); empty images are left out (the shard tasks report them as unusable).
    """
    from pyspark.sql import functions as F

    val = (F.col("shard") >= F.lit(train_shards)).cast("int")
    member = F.struct(val.alias("val"), F.col("name").alias("name"), F.col("label").cast("string").alias("label"))
    groups = (table.where(F.length("image") > 0)
              .groupBy("order", F.length("image").alias("length"))
              .agg(F.count(F.lit(1)).alias("count"), F.min(val).alias("low"), F.max(val).alias("high"),
                   F.min(member).alias("first"), F.max(member).alias("last"),
                   (F.min(F.col("label")) != F.max(F.col("label"))).alias("mixed"))
              .where(F.col("low") != F.col("high"))
              .orderBy("first")
              .limit(MAX_GROUPS)
              .collect())
    return tuple(_group(g, classes, integer_labels) for g in groups)


def _group(row: Any, classes: tuple[str, ...], integer_labels: bool) -> Duplicate:
    """One aggregated row as a :class:`Duplicate` of split ``"train+val"``."""
    def name_of(label: str) -> str:
        return classes[int(label)] if integer_labels else label

    first, last = row["first"], row["last"]
    return Duplicate("train+val", row["count"], (first["name"], last["name"]),
                     (name_of(first["label"]), name_of(last["label"])), ("train", "val"), bool(row["mixed"]))
