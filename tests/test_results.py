"""Combining the workers' records into the results (spark_imagenet.training.results)."""

from __future__ import annotations

import json

import pytest

from spark_imagenet.errors import ConfigError, TrainingError
from spark_imagenet.training.results import combine, format_table, write_json_atomic


def record(rank: int, top1: float = 0.5, **extra) -> dict:
    return {"rank": rank, "host": f"10.0.0.{rank + 1}", "python": "/env/bin/python", "train_images": 64, "steps": 4, "images_per_sec": 10.0 + rank,
            "train_loss": 1.5, "train_top1": 0.4, "train_seconds": 6.0, "history": {"loss": [2.0, 1.5]},
            "val": {"images": 30, "top1": top1, "top5": 0.9, "loss": 1.2}, "params": 123, **extra}


def test_combine_orders_by_rank_and_keeps_the_per_worker_fields():
    lines = []
    per_worker, val = combine([record(1), record(0)], 2, lines.append)
    assert [w["rank"] for w in per_worker] == [0, 1]
    assert set(per_worker[0]) == {"rank", "host", "python", "strategy", "all_reduce", "devices", "train_images",
                                  "steps", "images_per_sec", "train_loss", "train_top1", "train_seconds"}
    assert val == {"images": 30, "top1": 0.5, "top5": 0.9, "loss": 1.2} and lines == []


def test_combine_warns_when_ranks_disagree_on_the_all_reduced_metrics():
    lines = []
    _, val = combine([record(0, top1=0.5), record(1, top1=0.7)], 2, lines.append)
    assert val["top1"] == 0.5
    assert len(lines) == 1 and "rank 1 reports val top1=0.7 but rank 0 reports 0.5" in lines[0]


@pytest.mark.parametrize("ranks", [[0], [0, 0], [0, 2]])
def test_combine_refuses_missing_or_duplicate_ranks(ranks):
    with pytest.raises(TrainingError, match=r"expected results from ranks 0\.\.1"):
        combine([record(r) for r in ranks], 2, print)


def test_format_table_has_a_row_per_worker_and_a_global_line():
    per_worker, val = combine([record(0), record(1)], 2, print)
    text = format_table({"per_worker": per_worker, "val": val, "images_per_sec": 21.0, "wall_seconds": 12.5})
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].split()[:2] == ["rank", "host"]
    assert lines[1].split()[:2] == ["0", "10.0.0.1"]
    assert lines[3] == ("val: 30 images, top1 0.5000, top5 0.9000, loss 1.2000; total 21.0 train images/s; "
                        "wall 12.5 s")
    empty = format_table({"per_worker": [], "val": {}, "images_per_sec": 0.0, "wall_seconds": 1.0})
    assert "top1 -" in empty


def test_write_json_atomic(tmp_path):
    write_json_atomic(tmp_path / "r.json", {"a": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="cannot write --results"):
        write_json_atomic(tmp_path / "a-file" / "r.json", {"a": 1})
