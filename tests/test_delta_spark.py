"""A Delta table written by Spark with Delta's own library (delta-spark 4.3.1 on pyspark 4.1: the Spark 4.1 lane) ->
``shard --table --format delta`` (the command line, Delta's jars found in ~/.m2 by the command itself) -> train one
epoch -> ``predict --table --format delta --out-format delta``. Skipped where delta-spark or its jars are missing
(the jars: ``mvn -q -f tests/delta/pom.xml dependency:resolve``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spark_imagenet.dataset.delta_jars import find_delta_jars, installed_delta_spark


def _skip_reason() -> str | None:
    if importlib.util.find_spec("delta") is None:
        return "delta-spark is not installed (the Spark 4.1 lane has it)"
    import pyspark

    repository = Path.home() / ".m2" / "repository"
    if find_delta_jars(pyspark.__version__, installed_delta_spark() or "", repository) is None:
        return (f"Delta's jars for pyspark {pyspark.__version__} are not in {repository}: mvn -q -f "
                "tests/delta/pom.xml dependency:resolve")
    return None


pytestmark = [pytest.mark.slow, pytest.mark.lanes,
              pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")]

# Spark with Delta's connector (the settings the command line gives its own session) writes version 0 (3 classes x 8
# images), deletes one row (version 1), and shards version 0 the way a shard_dataframe user reads it.
WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    from own_images import image_bytes
    from spark_imagenet.dataset.dataframe import shard_dataframe
    from spark_imagenet.dataset.delta import read_delta
    from spark_imagenet.dataset.delta_jars import delta_session_conf
    from spark_imagenet.training.driver.spark_session import local_session

    table, out = sys.argv[1], sys.argv[2]
    spark = local_session("local[2]", conf={"spark.ui.enabled": "false", **delta_session_conf({})})
    rows = [(image_bytes(10 * k + i), c, f"{c}/{c}_{i}.jpg") for k, c in enumerate(("cat", "dog", "fox"))
            for i in range(8)]
    spark.createDataFrame(rows, "content binary, label string, name string").write.format("delta").save(table)
    spark.sql(f"DELETE FROM delta.`{table}` WHERE name = 'cat/cat_0.jpg'")
    first = spark.read.format("delta").option("versionAsOf", 0).load(table)
    assert first.count() == 24 and read_delta(spark, table, 0).count() == 24 and read_delta(spark, table).count() == 23
    shard_dataframe(first, out, name_col="name", train_shards=2, val_shards=1, val_fraction=0.3, progress=False)
    spark.stop()
""")


def _run(*arguments: str) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, *arguments], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_a_delta_table_of_spark_sharded_trained_and_scored_into_delta(spark, tmp_path):
    from deltalake import DeltaTable

    from spark_imagenet.dataset.manifest import Manifest
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.job.config import TrainConfig

    table, tests = str(tmp_path / "images"), str(Path(__file__).parent)
    _run("-c", WRITER, table, str(tmp_path / "v0"), tests)
    p = _run("-m", "spark_imagenet", "shard", "--table", table, "--format", "delta", "--table-version", "1",
             "--name-column", "name", "--out", str(tmp_path / "v1"), "--train-shards", "2", "--val-shards", "1",
             "--val-fraction", "0.3", "--no-progress", "--master", "local[2]")
    assert "Delta's jars from the local Maven repository" in p.stderr, p.stderr[-2000:]
    manifests = {v: Manifest.load(open_storage(str(tmp_path / v))) for v in ("v0", "v1")}
    examples = {v: sum(s.examples for s in m.splits.values()) for v, m in manifests.items()}
    assert examples == {"v0": 24, "v1": 23}

    model = tmp_path / "model"
    result = train(spark, str(tmp_path / "v1"), TrainConfig(
        workers=2, epochs=1, cache=tmp_path / "cache", output=str(model), batch_size=4, image_size=72, width=0.25,
        learning_rate=0.01, lr_schedule="constant", warmup_epochs=0.0))
    assert result.workers == 2

    out = tmp_path / "scores"
    p = _run("-m", "spark_imagenet", "predict", str(model), "--table", table, "--format", "delta", "--id-column",
             "name", "--out", str(out), "--out-format", "delta", "--master", "local[2]", "--top", "2")
    assert f"predict: 23 images, 0 errors -> {out} (Delta: name, class_ids" in p.stdout, p.stdout + p.stderr[-2000:]
    scores = DeltaTable(str(out)).to_pyarrow_table().to_pylist()
    assert len(scores) == 23 and "cat/cat_0.jpg" not in {r["name"] for r in scores}
    assert all(len(r["class_ids"]) == 2 and r["error"] is None for r in scores)
    assert os.path.isdir(out / "_delta_log")
