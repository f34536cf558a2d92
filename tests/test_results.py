"""Combining the tasks' results into the job's Result (spark_imagenet.training.driver.results)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spark_imagenet.errors import ConfigError, TrainingError
from spark_imagenet.training.driver.results import Result, build_results, combine, format_table, write_results
from spark_imagenet.training.job.outcome import TaskResult, TfProcess, ValMetrics, WorkerResult


def record(rank: int, top1: float = 0.5, **extra) -> TaskResult:
    worker = WorkerResult(
        rank=rank, workers=2, replicas_in_sync=2, strategy="multiworker", all_reduce="collective AUTO",
        devices=("/cpu:0",), train_examples=70, batch_size=16, epochs=2, train_images=64, steps=4,
        images_per_sec=10.0 + rank, timed_epochs=1, epoch_seconds=(3.0, 3.0), train_seconds=6.0, train_loss=1.5,
        train_top1=0.4, history={"loss": (2.0, 1.5)}, initial_epoch=0,
        val=ValMetrics(images=30, top1=top1, top5=0.9, loss=1.2), eval_seconds=1.0, params=123, **extra)
    return TaskResult(rank=rank, host=f"10.0.0.{rank + 1}", python="/env/bin/python", worker=worker,
                      tf_process=TfProcess(pid=10 + rank, task_pid=20 + rank))


def test_results_survive_their_json_lines():
    task = record(1)
    assert TaskResult.from_line(task.to_line()) == task
    assert WorkerResult.from_json(task.worker.to_json()) == task.worker
    with pytest.raises(ConfigError, match="unknown key"):
        TaskResult.from_json({**task.to_json(), "extra": 1})
    with pytest.raises(ConfigError, match="version"):
        TaskResult.from_json({**task.to_json(), "format_version": 99})


def test_combine_orders_by_rank_and_keeps_each_workers_own_fields(log_lines):
    lines = log_lines
    per_worker, val = combine([record(1), record(0)], 2)
    assert [w.rank for w in per_worker] == [0, 1]
    assert set(per_worker[0].to_json()) == {"rank", "host", "python", "strategy", "all_reduce", "devices",
                                            "train_images", "steps", "images_per_sec", "train_seconds", "tf_process"}
    assert per_worker[1].images_per_sec == 11.0 and per_worker[1].tf_process.pid == 11
    assert val == ValMetrics(images=30, top1=0.5, top5=0.9, loss=1.2) and lines == []


def test_combine_warns_when_ranks_disagree_on_the_all_reduced_metrics(log_lines):
    lines = log_lines
    _, val = combine([record(0, top1=0.5), record(1, top1=0.7)], 2)
    assert val.top1 == 0.5
    assert len(lines) == 1 and "rank 1 reports val top1=0.7 but rank 0 reports 0.5" in lines[0]


@pytest.mark.parametrize("ranks", [[0], [0, 0], [0, 2]])
def test_combine_refuses_missing_or_duplicate_ranks(ranks):
    with pytest.raises(TrainingError, match=r"expected results from ranks 0\.\.1"):
        combine([record(r) for r in ranks], 2)


def test_combine_names_a_rank_that_did_not_train():
    idle = TaskResult(rank=1, host="h", python="p", peer_failed="rank 0 failed")
    with pytest.raises(TrainingError, match="rank 1 on h did not train: rank 0 failed"):
        combine([record(0), idle], 2)


def _result(tmp_path, **settings) -> Result:
    from bucket_util import make_bucket
    from spark_imagenet.training.driver.launch import plan_job
    from spark_imagenet.training.job.config import TrainConfig

    job = plan_job(str(make_bucket(tmp_path / "b", train=4, val=1)), TrainConfig(workers=2, batch_size=2, **settings))
    return build_results([record(0), record(1)], job, master="local[2]", wall_seconds=12.5)


def test_the_result_is_typed_and_its_json_holds_every_field(tmp_path):
    result = _result(tmp_path, checkpoint_dir=str(tmp_path / "ckpt"), epochs=3)
    assert result.workers == 2 and result.train.loss == 1.5 and result.images_per_sec == 21.0
    assert result.checkpoint is None and result.output is None  # the newest checkpoint there: none was committed
    data = result.to_json()
    assert json.loads(json.dumps(data)) == data
    assert result.val.to_json() == {"images": 30, "top1": 0.5, "top5": 0.9, "loss": 1.2} == data["val"]
    assert result.per_worker[1].host == "10.0.0.2" == data["per_worker"][1]["host"]
    assert result.config["master"] == "local[2]" and data["history"] == {"loss": [2.0, 1.5]}
    assert not hasattr(result, "keys") and not hasattr(result, "__getitem__")  # attributes, one spelling


def test_format_table_shows_each_workers_own_numbers_and_the_jobs_metrics_once(tmp_path):
    result = _result(tmp_path)
    lines = format_table(result).splitlines()
    assert len(lines) == 5 and lines[0].split() == ["rank", "host", "imgs", "seen", "steps", "images/s", "seconds"]
    assert lines[1].split() == ["0", "10.0.0.1", "64", "4", "10.0", "6.0"]
    assert lines[2].split() == ["1", "10.0.0.2", "64", "4", "11.0", "6.0"]
    assert lines[3] == "train (all workers, last epoch): loss 1.5000, top1 0.4000"
    assert lines[4] == ("val: 30 images, top1 0.5000, top5 0.9000, loss 1.2000; total 21.0 train images/s; "
                        "wall 12.5 s")
    empty = SimpleNamespace(per_worker=(), val=ValMetrics(0), train=SimpleNamespace(loss=None, top1=None),
                            images_per_sec=0.0, wall_seconds=1.0)
    assert "top1 -" in format_table(empty)


def test_write_results_writes_the_versioned_document_atomically(tmp_path):
    result = _result(tmp_path / "job")
    write_results(tmp_path / "r.json", result)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["format"] == "spark-imagenet-results" and data["format_version"] == 1
    assert data["val"]["top1"] == result.val.top1 == 0.5 and data == result.to_json()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job", "r.json"]
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="cannot write --results"):
        write_results(tmp_path / "a-file" / "r.json", result)


def test_from_path_reads_back_what_train_returned(tmp_path):
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.job.outputs import write_driver_outputs

    result = _result(tmp_path / "job", checkpoint_dir=str(tmp_path / "ckpt"), crop_area=(0.5, 1.0),
                     lr_schedule="step", lr_boundaries=(1.0,), epochs=2)
    write_driver_outputs(open_storage(str(tmp_path / "out")), [], result.to_json())
    again = Result.from_path(tmp_path / "out")
    assert again == result and again.per_worker[1].tf_process == result.per_worker[1].tf_process
    assert again.config["crop_area"] == [0.5, 1.0] and again.history == {"loss": (2.0, 1.5)}
    assert Result.from_path(f"file://{tmp_path / 'out'}") == result


def test_from_path_says_a_folder_without_results_is_no_finished_run(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"empty holds no results\.json: it is not the --output of a finished"):
        Result.from_path(tmp_path / "empty")
    (tmp_path / "empty" / "results.json").write_text('{"format": "spark-imagenet-manifest"}')
    with pytest.raises(ConfigError, match=r"empty/results\.json: not a spark-imagenet training results"):
        Result.from_path(str(tmp_path / "empty"))
