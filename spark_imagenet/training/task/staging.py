"""Staging a barrier task's shards: the train and val shards one rank reads,
fetched into the host's verified shard cache (:mod:`spark_imagenet.dataset.cache`, which logs one line per
shard downloaded)."""

from __future__ import annotations

import os

from spark_imagenet.dataset.cache import FetchResult, fetch
from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.errors import ConfigError
from spark_imagenet.storage import DEFAULT_TRANSFERS, Storage
from spark_imagenet.training.job.assignment import WorkerPlan, assign


def stage_shards(storage: Storage, plan: WorkerPlan, cache_dir: str | os.PathLike | None, dataset_id: str, *,
                 transfers: int = DEFAULT_TRANSFERS) -> tuple[FetchResult, FetchResult]:
    """Fetch one worker's train shards, then its val shards, into the cache.

    Args:
        storage: the dataset's storage.
        plan: the worker's part of the assignment.
        cache_dir: cache root; None for :func:`spark_imagenet.dataset.cache.default_cache_dir`.
        dataset_id: the manifest's dataset id (names the cache sub-folder).
        transfers: parallel downloads.

    Returns:
        tuple[FetchResult, FetchResult]: the train and the val shards' local paths.

    Raises:
        StorageError: a shard cannot be fetched intact (see :func:`spark_imagenet.dataset.cache.fetch`).
    """
    train = fetch(storage, plan.train_shards, cache_dir, dataset_id=dataset_id, transfers=transfers)
    val = fetch(storage, plan.val_shards, cache_dir, dataset_id=dataset_id, transfers=transfers)
    return train, val


def fetch_rank(storage: Storage, rank: int, workers: int, cache_dir: str | os.PathLike | None = None, *,
               transfers: int = DEFAULT_TRANSFERS) -> tuple[FetchResult, FetchResult]:
    """Fetch what barrier task ``rank`` of ``workers`` trains and validates on
    (``spark-imagenet fetch``): its train shards (shard i goes to rank
    i mod N) and its val shards, as :func:`spark_imagenet.training.job.assignment.assign`
    decides.

    Args:
        storage: the dataset's storage: :func:`spark_imagenet.storage.open_storage` of its URL, or the
            picklable handle a job's plan already carries
            (:attr:`~spark_imagenet.training.job.plan.JobPlan.dataset`), its options included.
        rank: the task's rank, 0 <= rank < workers.
        workers: number of barrier tasks N.
        cache_dir: cache root; None for :func:`spark_imagenet.dataset.cache.default_cache_dir`.
        transfers: parallel downloads.

    Returns:
        tuple[FetchResult, FetchResult]: the train and the val shards' local
        paths (with counts, bytes, seconds).

    Raises:
        ConfigError: ``rank`` outside ``0..workers-1``, an assignment that
            cannot work (fewer train shards than workers), or ``storage`` that is not a Storage.
        ManifestError: no valid manifest in ``storage``.
        StorageError: see :func:`spark_imagenet.dataset.cache.fetch`.
    """
    if not isinstance(storage, Storage):
        raise ConfigError(f"fetch_rank takes the dataset's Storage (open_storage(url)), got {storage!r:.100}")
    if workers < 1 or not 0 <= rank < workers:
        raise ConfigError(f"--rank {rank} --workers {workers}: the rank must be between 0 and workers - 1",
                          key="--rank", value=rank)
    manifest = Manifest.load(storage)
    plan = assign(manifest, workers, 1)[rank]
    return stage_shards(storage, plan, cache_dir, manifest.dataset_id, transfers=transfers)
