"""Which shards each worker reads: pure functions, decided on the driver.

MultiWorkerMirroredStrategy's own file-based auto-sharding hangs when a
worker gets no file (tensorflow#35878), and uneven data or a partial last
batch hangs or fails an all-reduce (tensorflow#36153, #37112). So the driver
decides the split once, and every worker runs the same number of steps:

* train: shard ``i`` goes to rank ``i mod N``; each worker reads its own
  files pass after pass, and every worker runs
  ``steps_per_epoch = max(1, total_train // (batch_size * N))`` steps, i.e.
  one epoch is one pass over the whole training split by the cluster, and on
  each worker one pass over its shards (full batches aside; a worker with
  fewer records than its steps need goes on into its next pass:
  :func:`spark_imagenet.training.worker.pipeline.train_dataset`).
* val, when there are at least N shards: shard ``i`` to rank ``i mod N``.
* val, when there are fewer shards than workers: every worker reads all val
  files in order and keeps every N-th record starting at its rank
  (``tf.data.Dataset.shard(N, rank)``), so rank ``r`` sees
  ``ceil((total - r) / N)`` records.
* every worker runs ``val_steps = ceil(max_r val_examples_r / batch_size)``
  evaluation steps, padding with weight-0 examples, so the all-reduced
  metrics cover each val example exactly once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from spark_imagenet.errors import ConfigError
from spark_imagenet.dataset.manifest import Manifest, ShardInfo


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """What one worker (one barrier task, one TensorFlow worker process) reads.

    Attributes:
        rank: worker index, 0..N-1 (the barrier partition id).
        train_shards: the train shards this worker reads (shard i -> rank i mod N).
        train_examples: number of examples in ``train_shards``.
        val_shards: the val shards this worker reads.
        val_record_shard: ``(N, rank)`` when the worker keeps every N-th
            record of the concatenated ``val_shards`` (fewer val shards than
            workers), else None (it reads its shards whole).
        val_examples: number of real val examples this worker evaluates.
    """

    rank: int
    train_shards: tuple[ShardInfo, ...]
    train_examples: int
    val_shards: tuple[ShardInfo, ...]
    val_record_shard: tuple[int, int] | None
    val_examples: int

    def to_json(self) -> dict[str, Any]:
        """The plan as a JSON-serialisable dict (shards by name)."""
        return {
            "rank": self.rank,
            "train_shards": [s.name for s in self.train_shards],
            "train_examples": self.train_examples,
            "val_shards": [s.name for s in self.val_shards],
            "val_record_shard": list(self.val_record_shard) if self.val_record_shard else None,
            "val_examples": self.val_examples,
        }


@dataclasses.dataclass(frozen=True)
class Assignment:
    """The whole cluster's plan.

    Attributes:
        workers: one :class:`WorkerPlan` per rank, in rank order.
        batch_size: per-worker batch size the steps were computed for.
        steps_per_epoch: training steps per epoch, identical on every worker.
        val_steps: evaluation steps, identical on every worker (>= 1).
        train_examples_total: examples in the train split.
        val_examples_total: examples in the val split.
    """

    workers: tuple[WorkerPlan, ...]
    batch_size: int
    steps_per_epoch: int
    val_steps: int
    train_examples_total: int
    val_examples_total: int

    def __len__(self) -> int:
        return len(self.workers)

    def __getitem__(self, rank: int) -> WorkerPlan:
        return self.workers[rank]

    def __iter__(self):
        return iter(self.workers)


def record_shard_count(total: int, workers: int, rank: int) -> int:
    """Records that rank ``rank`` keeps from ``total`` records when it keeps
    records ``rank, rank + workers, rank + 2*workers, ...``.

    Args:
        total: number of records (>= 0).
        workers: N (>= 1).
        rank: 0..N-1.

    Returns:
        int: ``ceil((total - rank) / workers)``, or 0 when ``total <= rank``.
    """
    if total <= rank:
        return 0
    return (total - rank + workers - 1) // workers


def assign(manifest: Manifest, workers: int, batch_size: int) -> Assignment:
    """Split a dataset's shards over ``workers`` workers.

    Args:
        manifest: the dataset (needs ``train`` and ``val`` splits).
        workers: number of workers N (>= 1).
        batch_size: per-worker batch size (>= 1).

    Returns:
        Assignment: per-rank plans plus ``steps_per_epoch`` and ``val_steps``
        (rules in the module docstring).

    Raises:
        ConfigError: bad ``workers``/``batch_size``; a split missing; fewer
            train shards than workers (reshard with ``--train-shards >= N`` or
            use fewer ``--workers``); a worker whose train shards hold no
            examples; no val examples.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers must be a positive integer, got {workers!r}", key="--workers", value=workers)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"--batch-size must be a positive integer, got {batch_size!r}", key="--batch-size",
                          value=batch_size)
    for split in ("train", "val"):
        if split not in manifest.splits:
            raise ConfigError(f"the dataset has no {split!r} split (splits: {sorted(manifest.splits)})")
    train = manifest.splits["train"].shards
    val = manifest.splits["val"].shards
    n = workers
    if len(train) < n:
        raise ConfigError(
            f"the dataset has {len(train)} train shard(s) but --workers is {n}: every worker needs at least one "
            f"train shard of its own. Reshard with --train-shards >= {n} (a multiple of {n} balances best) "
            f"or use --workers <= {len(train)}.", key="--workers", value=n
        )
    val_total = sum(s.examples for s in val)
    if val_total == 0:
        raise ConfigError("the dataset's val split holds no examples: rebuild the shards with a val split")
    train_total = sum(s.examples for s in train)

    plans = []
    for rank in range(n):
        mine = tuple(train[rank::n])
        train_examples = sum(s.examples for s in mine)
        if train_examples == 0:
            raise ConfigError(
                f"worker {rank}'s train shards {[s.name for s in mine]} hold no examples; "
                f"reshard with fewer, fuller --train-shards or use fewer --workers", key="--train-shards",
                value=len(train))
        if len(val) >= n:
            val_shards: tuple[ShardInfo, ...] = tuple(val[rank::n])
            record_shard = None
            val_examples = sum(s.examples for s in val_shards)
        else:
            val_shards = tuple(val)
            record_shard = (n, rank)
            val_examples = record_shard_count(val_total, n, rank)
        plans.append(WorkerPlan(rank, mine, train_examples, val_shards, record_shard, val_examples))

    steps_per_epoch = max(1, train_total // (batch_size * n))
    val_steps = max(1, math.ceil(max(p.val_examples for p in plans) / batch_size))
    return Assignment(tuple(plans), batch_size, steps_per_epoch, val_steps, train_total, val_total)


def elastic_counts(workers: int, min_workers: int | None, global_batch: int) -> list[int]:
    """The worker counts a relaunch may go on with after a lost worker: from ``workers - 1`` down to
    ``min_workers``, those that divide ``global_batch`` (so each worker's batch is whole and the checkpoint
    resumes with the same global batch).

    Args:
        workers: the planned worker count.
        min_workers: the fewest allowed (``--min-workers``), or None (no fewer than ``workers``).
        global_batch: images per step over all workers.

    Returns:
        list[int]: largest first; empty when none.
    """
    if min_workers is None:
        return []
    return [m for m in range(workers - 1, min_workers - 1, -1) if global_batch % m == 0]
