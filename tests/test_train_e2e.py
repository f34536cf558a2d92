"""End to end: a tiny generated dataset, sharded, trained twice in one SparkSession
on local[2] (two barrier tasks, two TensorFlow workers under MWMS)."""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import pytest

from data_util import small_layout
from spark_imagenet.errors import SparkImagenetError
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.training.driver.launch import train
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.driver.results import Result
from spark_imagenet.training.job.outcome import FAILURE_MARKER

pytestmark = pytest.mark.slow

# AlexNet's smallest input is 67 px (conv1 11x11/4 then three 3x3/2 pools); a little above it keeps CPU time low.
SMALL = {"batch_size": 4, "image_size": 72, "width": 0.25, "learning_rate": 0.01, "lr_schedule": "constant",
         "warmup_epochs": 0.0}  # one rate: the TensorBoard test reads it back


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    tree = small_layout(root / "kaggle")  # 4 classes x 6 train, 3 val each
    # 2 train shards for 2 workers; 1 val shard: the workers split its records (record sharding)
    shard(tree, root / "bucket", train_shards=2, val_shards=1, processes=1, progress=False)
    return root


def _cache_state(cache: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.rglob("*.tfrecord")}


def test_train_twice_in_one_session(log_lines, spark, bucket):
    url, cache = str(bucket / "bucket"), bucket / "cache"
    lines = log_lines
    lines.clear()  # the lines from here on

    first = train(spark, url, TrainConfig(workers=2, epochs=1, cache=cache, results=bucket / "r1.json", **SMALL))
    assert first.workers == 2
    assert [w.rank for w in first.per_worker] == [0, 1]
    steps_per_epoch = 24 // (SMALL["batch_size"] * 2)
    assert first.config["steps_per_epoch"] == steps_per_epoch
    for w in first.per_worker:
        assert w.host and w.steps == steps_per_epoch
        assert w.train_images == steps_per_epoch * SMALL["batch_size"]
        assert w.images_per_sec > 0 and not hasattr(w, "train_loss")  # the job's loss, once, not per worker
    assert first.train.loss > 0 and 0 <= first.train.top1 <= 1
    assert isinstance(first, Result) and first.per_worker[0].rank == 0 and first.val.images == 12
    assert first.checkpoint is None and first.output is None
    # every val image counted exactly once although each worker read half the records of one shard
    assert first.val.images == 12
    assert 0 <= first.val.top1 <= first.val.top5 <= 1
    assert json.loads((bucket / "r1.json").read_text())["val"] == first.val.to_json()
    assert any(line.lstrip().startswith("rank") and "images/s" in line for line in lines)
    assert any(line.startswith("val: 12 images") for line in lines)
    cached = _cache_state(cache)
    assert len(cached) == 3  # 2 train shards + the shared val shard, each once on this host

    # a second MWMS job in the same session: fresh child processes, shards reused from the cache
    second = train(spark, url, TrainConfig(workers=2, epochs=2, cache=cache, **SMALL))
    assert [w.steps for w in second.per_worker] == [2 * steps_per_epoch] * 2
    assert second.val.images == 12
    assert len(second.history["loss"]) == 2
    assert _cache_state(cache) == cached


def test_train_from_gs_bucket_on_the_emulator(log_lines, spark, bucket, gcs_bucket, tmp_path):
    """The same job on a gs:// bucket (fake-gcs-server): tasks fetch their shards over HTTP, verified; a
    second job downloads nothing, and writes its --output to a gs:// folder (read back whole)."""
    from spark_imagenet.dataset.transfer import upload
    from spark_imagenet.storage import open_storage

    url = f"gs://{gcs_bucket}/imagenet-tiny"
    upload(bucket / "bucket", url)
    cache = tmp_path / "cache"
    lines = log_lines
    lines.clear()  # the lines from here on
    out = train(spark, url, TrainConfig(workers=2, epochs=1, cache=cache, transfers=2, **SMALL))
    assert out.config["url"] == url
    assert out.val.images == 12 and [w.rank for w in out.per_worker] == [0, 1]
    cached = _cache_state(cache)
    assert len(cached) == 3
    output = f"gs://{gcs_bucket}/runs/one"
    again = train(spark, url, TrainConfig(workers=2, epochs=1, cache=cache, output=output, **SMALL))
    assert again.val.images == 12
    assert _cache_state(cache) == cached  # nothing downloaded or rewritten
    storage, local = open_storage(output), tmp_path / "copy"
    names = sorted(o.name for o in storage.list())
    assert {"model.keras", "labels.json", "results.json"} <= set(names)
    for name in names:
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        storage.get_file(name, local / name)
    _check_output(local, again, epochs=1)


def _break_one_jpeg(src: Path, dst: Path) -> str:
    """Copy a bucket, replacing the JPEG of every record of train shard 0 by garbage after its marker, and
    updating the manifest (size, CRC32C) so that only decoding can notice."""
    import shutil

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from spark_imagenet.dataset.manifest import Manifest, ShardInfo, SplitInfo
    from spark_imagenet.storage import LocalStorage, crc32c_file
    from record_util import read_records
    from spark_imagenet.dataset.tfrecord import write_record

    shutil.copytree(src, dst)
    m = Manifest.load(LocalStorage(dst))
    first = m.splits["train"].shards[0]
    with open(dst / first.name, "rb") as f:
        records = list(read_records(f))
    names = []
    for i, record in enumerate(records):  # every record, so that any read of the shard fails
        ex = tf.train.Example.FromString(record)
        jpeg = ex.features.feature["image/encoded"].bytes_list.value[0]
        ex.features.feature["image/encoded"].bytes_list.value[0] = jpeg[:4] + b"not the rest of a JPEG" * 8
        records[i] = ex.SerializeToString()
        names.append(ex.features.feature["image/filename"].bytes_list.value[0].decode())
    with open(dst / first.name, "wb") as f:
        for r in records:
            write_record(f, r)
    fixed = ShardInfo(first.name, first.examples, (dst / first.name).stat().st_size, crc32c_file(dst / first.name))
    splits = dict(m.splits, train=SplitInfo((fixed, *m.splits["train"].shards[1:])))
    Manifest(m.dataset_id + "-broken", m.created, m.classes, splits, m.source, m.selection, m.feature_keys).save(
        LocalStorage(dst))
    return names[0]


def test_worker_failure_is_reported_with_its_output(spark, bucket):
    # A JPEG that passes the shard checksums but does not decode: rank 0's TensorFlow
    # process fails, names the shard and record, and the job fails with that message.
    broken = bucket / "broken"
    image = _break_one_jpeg(bucket / "bucket", broken)
    with pytest.raises(SparkImagenetError) as e:
        train(spark, str(broken), TrainConfig(workers=2, epochs=1, cache=bucket / "cache", **SMALL))
    msg = str(e.value)
    assert msg.startswith("rank 0 ") and "exited with code 1" in msg, msg
    assert re.search(r"train-00000-of-00002-[0-9a-f]{8}\.tfrecord, record 0", msg) and image in msg, msg
    assert "(end of rank 0" in msg and FAILURE_MARKER not in msg
    failure = e.value.failure  # the same, typed
    assert failure.rank == 0 and failure.exit_status == 1 and failure.stage == "training (fit)"
    assert failure.error == "ImageError" and type(e.value).__name__ == "ImageError" and image in failure.message
    assert "\tat org.apache" not in msg
    # the session survives a failed barrier job
    assert spark.sparkContext.parallelize(range(3), 3).count() == 3
    assert os.path.isdir(bucket / "cache")


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard scalars in the event files of ``folder``: ``{tag: [(step, value), ...]}``."""
    import tensorflow as tf

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((int(event.step), float(tf.make_ndarray(value.tensor))))
    return found


def _check_output(out: Path, result: Result, epochs: int, first_lr: float | None = SMALL["learning_rate"]) -> None:
    """``out`` (a local copy of an --output folder) holds what the run made; ``first_lr``: the learning rate at
    the end of epoch 1 (None: the caller checks it)."""
    labels = json.loads((out / "labels.json").read_text())
    assert [c["id"] for c in labels] == list(range(4)) and all(c["wnid"].startswith("n") for c in labels)
    assert all(isinstance(c["names"], list) and c["names"] for c in labels)
    assert json.loads((out / "results.json").read_text())["val"] == result.val.to_json()
    train_scalars = _scalars(out / "tensorboard" / "train")
    assert set(train_scalars) == {"xent", "top1", "top5", "learning_rate", "images_per_sec"}
    assert [step for step, _ in train_scalars["top1"]] == list(range(1, epochs + 1))
    assert train_scalars["xent"][-1][1] == pytest.approx(result.train.loss, rel=1e-5)
    assert first_lr is None or train_scalars["learning_rate"][0][1] == pytest.approx(first_lr)
    val_scalars = _scalars(out / "tensorboard" / "validation")
    assert val_scalars["top1"] == [(epochs, pytest.approx(result.val.top1))]
    assert val_scalars["xent"] == [(epochs, pytest.approx(result.val.loss, rel=1e-5))]
    import tf_keras as keras

    model = keras.models.load_model(out / "model.keras", compile=False)
    assert model.output_shape == (None, 4) and model.input_shape == (None, 72, 72, 3)


def test_output_holds_the_model_labels_results_and_tensorboard_logs(log_lines, spark, bucket, tmp_path):
    """--output holds the model, labels, results and TensorBoard logs, which `evaluate` and `predict` read; with
    --lr-schedule cosine --warmup-epochs 1 --lr-scaling linear, the learning rate the chief logs to TensorBoard
    at the end of each epoch (that of its last step) is the schedule's formula at that step."""
    from spark_imagenet.training.job.schedules import schedule_for

    out, lines = tmp_path / "run", log_lines
    lines.clear()  # the lines from here on
    settings = {**SMALL, "epochs": 3, "lr_schedule": "cosine", "warmup_epochs": 1.0, "lr_scaling": "linear"}
    result = train(spark, str(bucket / "bucket"), TrainConfig(workers=2, cache=bucket / "cache", output=str(out),
                                                              **settings))
    steps = result.config["steps_per_epoch"]
    schedule = schedule_for(TrainConfig(workers=2, **settings), steps)
    _check_output(out, result, epochs=3, first_lr=None)
    assert any(line.startswith(f"output: labels.json, results.json written to {out}") for line in lines)
    assert schedule.describe() in lines  # the resolved peak, printed before training
    logged = dict(_scalars(out / "tensorboard" / "train")["learning_rate"])
    assert sorted(logged) == [1, 2, 3]
    for epoch, value in logged.items():
        assert value == pytest.approx(schedule.at(epoch * steps - 1), rel=1e-5)
    assert logged[1] == pytest.approx(schedule.peak, rel=1e-5)  # the end of the warm-up reaches the peak
    assert logged[3] < logged[2] < logged[1]
    # `spark-imagenet evaluate` scores the saved model at the run's own validation numbers
    scores = _evaluate(str(out), str(bucket / "bucket"), "--json", "--cache", str(bucket / "cache"))
    assert scores.returncode == 0, scores.stderr[-3000:]
    got = json.loads(scores.stdout)
    assert got["images"] == result.val.images == 12
    for key in ("top1", "top5", "loss"):
        assert abs(got[key] - getattr(result.val, key)) <= 1e-3, (key, got, result.val)
    bad = _evaluate(str(tmp_path / "nothing"), str(bucket / "bucket"))
    assert bad.returncode == 2 and f"spark-imagenet: error: model {tmp_path / 'nothing'}: cannot read model.keras" \
        in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


    # `spark-imagenet predict`: the top classes of training images, as the model sees them in evaluation
    images = sorted((bucket / "kaggle").rglob("*.JPEG"))[:3]
    png = tmp_path / "pngs" / "one.png"
    png.parent.mkdir()
    from PIL import Image

    Image.open(images[0]).save(png)
    p = _cli("predict", str(out), *map(str, images), str(png.parent), "--json", "--top", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    predicted = json.loads(p.stdout)
    assert [r["file"] for r in predicted] == [*map(str, images), str(png)]
    labels = json.loads((out / "labels.json").read_text())
    for r in predicted:
        assert len(r["top"]) == 2 and r["top"][0]["probability"] >= r["top"][1]["probability"]
        assert r["top"][0]["wnid"] == labels[r["top"][0]["id"]]["wnid"]
    expected = _probabilities(out / "model.keras", images[0])
    assert predicted[0]["top"][0]["probability"] == pytest.approx(float(expected.max()), abs=1e-5)
    assert predicted[0]["top"][0]["id"] == int(expected.argmax())
    # the PNG copy of the first image: re-encoded as JPEG, so close to (not equal to) the JPEG's prediction
    assert predicted[-1]["top"][0]["probability"] == pytest.approx(predicted[0]["top"][0]["probability"], abs=0.05)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    bad = _cli("predict", str(out), str(broken))
    assert bad.returncode == 2 and f"spark-imagenet: error: {broken}: not an image" in bad.stderr, bad.stderr


def _probabilities(model_path: Path, image: Path):
    """softmax(model(normalize(eval_image(jpeg)))) for one image, computed here."""
    import tensorflow as tf
    import tf_keras as keras

    from spark_imagenet.training.worker import preprocessing

    model = keras.models.load_model(model_path, compile=False)
    size = int(model.input_shape[1])
    x = preprocessing.normalizer(size)(preprocessing.eval_image(tf.constant(image.read_bytes()), size)[tf.newaxis])
    return tf.nn.softmax(model(x, training=False), axis=-1).numpy()[0]


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "spark_imagenet", *args], capture_output=True, text=True,
                          timeout=600)


def _evaluate(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "spark_imagenet", "evaluate", *args], capture_output=True,
                          text=True, timeout=600)


def test_an_output_that_cannot_be_written_is_refused_before_spark(bucket, tmp_path):
    from spark_imagenet.errors import ConfigError
    from spark_imagenet.training.job.config import TrainConfig
    from spark_imagenet.training.driver.launch import plan_job

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="is a file, not a folder") as e:
        plan_job(str(bucket / "bucket"), TrainConfig(workers=2, output=str(blocker / "run"), **SMALL))
    assert (e.value.key, e.value.value) == ("--output", str(blocker / "run"))
