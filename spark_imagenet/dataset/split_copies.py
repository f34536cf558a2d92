"""Images given to both splits by a split column: one aggregation over a DataFrame build's rows, on the driver.

Without a split column, a row's split comes from a hash of its bytes, so copies of one image always share a
split, and the shard tasks find every group of copies (identical bytes sort next to each other in one shard:
:mod:`spark_imagenet.dataset.dataframe`). A split column can put one copy in train and another in val,
in shards that no task sees together: the case that matters most, since validation images are then trained
on. When a split column is given, each task also returns an index row per usable image (its 64-bit order
hash, length, split, name and class; no image bytes), the driver keeps the job's output on the executors'
disks (``persist``), and :func:`copies_across_splits` groups the index: the images are read once
(docs/design.md, 'Sharding a DataFrame as a Spark job').
"""

from __future__ import annotations

from typing import Any

from spark_imagenet.dataset.duplicates import MAX_GROUPS, Duplicate


def copies_across_splits(index: Any) -> tuple[Duplicate, ...]:
    """The groups of identical images with copies in both train and val.

    Args:
        index: the tasks' index rows (:data:`~spark_imagenet.dataset.dataframe.RESULT_SCHEMA`: ``order``,
            a seeded 64-bit hash of the bytes; ``length``; ``val``, 1 for val; ``name``; ``label``, the class
            name), of usable images only.

    Returns:
        tuple[Duplicate, ...]: at most :data:`~spark_imagenet.dataset.duplicates.MAX_GROUPS` groups of split
        ``"train+val"``, each naming its first train copy and its last val copy (by name) and counting all
        of its copies. Images are equal when their hash and length are (a false match among n images has odds
        of about n^2 / 2^65).
    """
    from pyspark.sql import functions as F

    val = F.col("val")
    member = F.struct(val.alias("val"), F.col("name").alias("name"), F.col("label").alias("label"))
    groups = (index.groupBy("order", "length")
              .agg(F.count(F.lit(1)).alias("count"), F.min(val).alias("low"), F.max(val).alias("high"),
                   F.min(member).alias("first"), F.max(member).alias("last"),
                   (F.min(F.col("label")) != F.max(F.col("label"))).alias("mixed"))
              .where(F.col("low") != F.col("high"))
              .orderBy("first")
              .limit(MAX_GROUPS)
              .collect())
    return tuple(_group(g) for g in groups)


def _group(row: Any) -> Duplicate:
    """One aggregated row as a :class:`Duplicate` of split ``"train+val"``."""
    first, last = row["first"], row["last"]
    return Duplicate("train+val", row["count"], (first["name"], last["name"]), (first["label"], last["label"]),
                     ("train", "val"), bool(row["mixed"]))
