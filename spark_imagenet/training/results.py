"""The results of a training job: per-worker rows, validation metrics, the table and the JSON file."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from spark_imagenet.errors import ConfigError, TrainingError

#: Tolerance for "all workers report the same all-reduced val metrics".
VAL_REL_TOL = 1e-3
VAL_ABS_TOL = 1e-4


def combine(records: list[dict[str, Any]], workers: int, log: Callable[[str], None]) -> tuple[list, dict]:
    """Per-worker rows (sorted by rank) and the val metrics of rank 0.

    Args:
        records: the RESULT_JSON dicts (plus ``host``) of every rank.
        workers: N.
        log: where to warn when ranks disagree on the val metrics.

    Returns:
        ``(per_worker, val)``.

    Raises:
        TrainingError: missing or duplicate ranks.
    """
    records = sorted(records, key=lambda r: r.get("rank", -1))
    ranks = [r.get("rank") for r in records]
    if ranks != list(range(workers)):
        raise TrainingError(f"expected results from ranks 0..{workers - 1}, got ranks {ranks}")
    keys = ("rank", "host", "python", "strategy", "all_reduce", "devices", "train_images", "steps", "images_per_sec",
            "train_loss", "train_top1", "train_seconds")
    per_worker = [{k: r.get(k) for k in keys} for r in records]
    val = dict(records[0].get("val") or {})
    for r in records[1:]:
        other = r.get("val") or {}
        for k, v in val.items():
            w = other.get(k)
            if not (isinstance(v, (int, float)) and isinstance(w, (int, float))
                    and math.isclose(v, w, rel_tol=VAL_REL_TOL, abs_tol=VAL_ABS_TOL)):
                log(f"warning: rank {r['rank']} reports val {k}={w!r} but rank 0 reports {v!r}; "
                    "the all-reduced metrics should agree (using rank 0's)")
    return per_worker, val


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def format_table(results: dict[str, Any]) -> str:
    """A readable summary: one row per worker and a global line."""
    rows = [f"{'rank':>4}  {'host':<22} {'train imgs':>10} {'steps':>6} {'images/s':>9} {'loss':>8} {'top1':>7}"]
    for w in results["per_worker"]:
        rows.append(f"{w['rank']:>4}  {str(w['host'])[:22]:<22} {_fmt(w['train_images'], 'd'):>10} "
                    f"{_fmt(w['steps'], 'd'):>6} {_fmt(w['images_per_sec'], '.1f'):>9} "
                    f"{_fmt(w['train_loss'], '.4f'):>8} {_fmt(w['train_top1'], '.4f'):>7}")
    val = results["val"]
    rows.append(f"val: {_fmt(val.get('images'), 'd')} images, top1 {_fmt(val.get('top1'), '.4f')}, "
                f"top5 {_fmt(val.get('top5'), '.4f')}, loss {_fmt(val.get('loss'), '.4f')}; "
                f"total {_fmt(results['images_per_sec'], '.1f')} train images/s; "
                f"wall {results['wall_seconds']:.1f} s")
    return "\n".join(rows)


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write JSON to ``path`` atomically (:meth:`spark_imagenet.storage.LocalStorage.write_bytes`).

    Raises:
        ConfigError: the file cannot be written (names ``--results``).
    """
    from spark_imagenet.errors import StorageError
    from spark_imagenet.storage import LocalStorage

    path = Path(path).absolute()
    try:
        LocalStorage(path.parent).write_bytes(path.name, (json.dumps(data, indent=2) + "\n").encode("utf-8"))
    except StorageError as e:
        raise ConfigError(f"cannot write --results {path}: {e}") from e


def build_results(records: list[dict[str, Any]], job, *, master: str, wall_seconds: float,
                  log: Callable[[str], None], restarts: int = 0) -> dict[str, Any]:
    """The results dict of a finished job (see :func:`spark_imagenet.training.driver.train`).

    Args:
        records: every rank's record (the worker's result plus ``host``).
        job: the :class:`~spark_imagenet.training.driver.JobPlan` that ran.
        master: the Spark master URL it ran on.
        wall_seconds: the barrier stage's wall time (every launch of it).
        log: where disagreements between ranks are reported.
        restarts: how many times the stage was launched again after a lost worker.

    Raises:
        TrainingError: missing or duplicate ranks.
    """
    config, plan, manifest = job.config, job.assignment, job.manifest
    per_worker, val = combine(records, config.workers, log)
    rank0 = min(records, key=lambda r: r["rank"])
    settings = {key: getattr(config, key) for key in
                ("model", "epochs", "batch_size", "image_size", "width", "learning_rate", "lr_schedule",
                 "lr_boundaries", "warmup_epochs", "lr_scaling", "optimizer", "momentum", "weight_decay",
                 "label_smoothing", "flip", "crop_area", "lighting", "precision", "jit_compile", "parallel", "seed",
                 "checkpoint_dir", "deterministic")}
    return {
        "workers": config.workers,
        "per_worker": per_worker,
        "val": val,
        "images_per_sec": sum(w["images_per_sec"] or 0.0 for w in per_worker),
        "history": rank0.get("history"),
        "config": {
            "url": job.url, "dataset_id": manifest.dataset_id, "master": master,
            **settings, "cache": config.cache, "num_classes": manifest.num_classes,
            "train_examples": plan.train_examples_total, "val_examples": plan.val_examples_total,
            "steps_per_epoch": plan.steps_per_epoch, "val_steps": plan.val_steps,
            "global_batch_size": config.global_batch_size,
            "assignment": [p.to_json() for p in plan.workers],
        },
        "wall_seconds": wall_seconds,
        "restarts": restarts,
    }
