"""The object names of a dataset at its bucket URL (besides ``manifest.json``,
:data:`spark_imagenet.dataset.manifest.MANIFEST_NAME`).

Shard names carry the first 8 hex digits of the dataset id
(``train-00003-of-01024-3fa2c1d9.tfrecord``), so two different datasets never
write the same object (docs/design.md, 'Storage, checksums and the GCS emulator').
"""

from __future__ import annotations

import re

#: Object names of shards: ``<split>-<index>-of-<count>[-<dataset id[:8]>].tfrecord`` (the id part is optional:
#: names without it are read too), and ``<split>-<index>-of-<count>-<run>-a<attempt>.tfrecord`` from a Spark job
#: (:func:`attempt_shard_name`).
SHARD_NAME_RE = re.compile(r"^(train|val)-\d{5}-of-\d{5}(-[0-9a-f]{8})?(-a\d+)?\.tfrecord$")
#: Temporary names of shards being written in a local ``--out`` folder (:func:`partial_name`).
PARTIAL_RE = re.compile(r"^\.(train|val)-\d{5}-of-\d{5}(-[0-9a-f]{8})?\.tfrecord\.partial-")
#: The quality report's object name, beside ``manifest.json`` (:mod:`spark_imagenet.dataset.report`).
QUALITY_REPORT_NAME = "quality-report.json"


def shard_name(split: str, index: int, count: int, dataset_id: str = "") -> str:
    """Object name of shard ``index`` of ``count``.

    Args:
        split: ``"train"`` or ``"val"``.
        index: 0-based shard index.
        count: shards in the split.
        dataset_id: the dataset id (hex); its first 8 digits make the name
            unique to the dataset. Empty: no id part.

    Returns:
        str: e.g. ``train-00003-of-01024-3fa2c1d9.tfrecord``.
    """
    tag = f"-{dataset_id[:8]}" if dataset_id else ""
    return f"{split}-{index:05d}-of-{count:05d}{tag}.tfrecord"


def partial_name(name: str, token: str) -> str:
    """The temporary name shard ``name`` is written under before it is published
    (matched by :data:`PARTIAL_RE`, so the next build removes a leftover).

    Args:
        name: the shard's object name (:func:`shard_name`).
        token: unique to the build (process id and a random part).

    Returns:
        str: ``.<name>.partial-<token>``.
    """
    return f".{name}.partial-{token}"


def attempt_shard_name(split: str, index: int, count: int, run: str, attempt: int) -> str:
    """Object name of shard ``index`` of ``count`` as one Spark task attempt writes it
    (:mod:`spark_imagenet.dataset.dataframe`): unique to the run and the attempt, so a retried or
    speculative attempt never writes over another's object; the manifest names the one the driver kept.

    Args:
        split: ``"train"`` or ``"val"``.
        index: 0-based shard index.
        count: shards in the split.
        run: the run's token (8 hex digits).
        attempt: the task attempt's id (``TaskContext.taskAttemptId()``, unique in a Spark application).

    Returns:
        str: e.g. ``train-00003-of-01024-3fa2c1d9-a17.tfrecord`` (matched by :data:`SHARD_NAME_RE`).
    """
    return f"{split}-{index:05d}-of-{count:05d}-{run}-a{attempt}.tfrecord"


def of_run(name: str, run: str) -> bool:
    """Whether object ``name`` is a shard some attempt of the Spark run ``run`` wrote (:func:`attempt_shard_name`)."""
    return SHARD_NAME_RE.match(name) is not None and f"-{run}-a" in name
