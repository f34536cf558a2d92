"""Delta Lake tables (spark_imagenet.dataset.delta, delta_jars): where Delta's jars are found (pure), and a table
written by ``deltalake`` read by ``shard --table PATH --format delta`` on a Spark without Delta's connector
(pyspark 4.3: the deltalake path; its Parquet files read by the shared local[2] session)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from own_images import image_bytes
from spark_imagenet.dataset.delta import refused_feature
from spark_imagenet.dataset.delta_jars import (DELTA_SESSION_SETTINGS, delta_jar_settings, find_delta_jars,
                                               names_delta_jars, with_delta_settings)

CONNECTOR = "io.delta:delta-spark_4.1_2.13:4.3.1"
STORAGE = "io.delta:delta-storage:4.3.1"


def _fake_repository(root: Path) -> list[Path]:
    jars = [root / "io/delta/delta-spark_4.1_2.13/4.3.1/delta-spark_4.1_2.13-4.3.1.jar",
            root / "io/delta/delta-storage/4.3.1/delta-storage-4.3.1.jar"]
    for jar in jars:
        jar.parent.mkdir(parents=True)
        jar.write_bytes(b"PK")
    return jars


def test_delta_jars_come_from_the_local_maven_repository_else_as_packages(tmp_path, log_lines):
    jars = _fake_repository(tmp_path / "m2")
    assert find_delta_jars("4.1.1", "4.3.1", tmp_path / "m2") == jars
    assert find_delta_jars("4.2.0", "4.3.1", tmp_path / "m2") is None  # another Spark: another connector
    assert delta_jar_settings({"spark.jars": "/my.jar"}, "4.1.1", "4.3.1", tmp_path / "m2") == {
        "spark.jars": f"/my.jar,{jars[0]},{jars[1]}"}
    assert any("Delta's jars from the local Maven repository" in line for line in log_lines)
    assert delta_jar_settings({}, "4.1.1", "4.3.1", tmp_path / "empty") == {
        "spark.jars.packages": f"{CONNECTOR},{STORAGE}"}
    assert any("Spark downloads them (spark.jars.packages" in line for line in log_lines)
    assert delta_jar_settings({}, "4.3.0", None, tmp_path / "m2") == {}  # no delta-spark: deltalake reads


def test_jars_the_user_gave_are_kept_and_delta_settings_merged():
    assert names_delta_jars({"spark.jars": "/x/delta-spark_4.1_2.13-4.3.1.jar"})
    assert names_delta_jars({"spark.jars.packages": CONNECTOR})
    assert names_delta_jars({}, "--jars /j/delta-spark_4.1_2.13-4.3.1.jar,/j/delta-storage-4.3.1.jar pyspark-shell")
    assert not names_delta_jars({"spark.jars": "/x/other.jar"}, "--master local[2] pyspark-shell")
    assert with_delta_settings({}) == DELTA_SESSION_SETTINGS
    assert with_delta_settings({"spark.sql.extensions": "my.Ext", "spark.sql.catalog.spark_catalog": "my.Cat"}) == {
        "spark.sql.extensions": "my.Ext,io.delta.sql.DeltaSparkSessionExtension"}
    assert with_delta_settings(DELTA_SESSION_SETTINGS) == {}


def test_features_whose_files_are_not_the_rows_are_refused():
    assert refused_feature(None, {}, 0) is None
    assert refused_feature(["deletionVectors", "timestampNtz"], {}, 0) is None  # enabled, none present
    assert refused_feature(["deletionVectors"], {}, 2).startswith("deletion vectors (2 file(s)")
    assert refused_feature(None, {"delta.columnMapping.mode": "name"}, 0) == (
        "column mapping (delta.columnMapping.mode=name)")
    assert refused_feature(["typeWidening", "v2Checkpoint"], {}, 0) == "the reader feature typeWidening"


def _write_table(path: Path) -> list[dict]:
    """A Delta table written by deltalake, partitioned by label: version 0 with 3 classes x 8 images, version 1
    without the first cat."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    rows = [{"content": image_bytes(10 * k + i), "label": c, "name": f"{c}/{c}_{i}.jpg"}
            for k, c in enumerate(("cat", "dog", "fox")) for i in range(8)]
    write_deltalake(str(path), pa.Table.from_pylist(rows), partition_by=["label"])
    DeltaTable(str(path)).delete("name = 'cat/cat_0.jpg'")
    return rows


def _shard(table: Path, out: Path, *more: str) -> int:
    from spark_imagenet.cli import main

    return main(["shard", "--table", str(table), "--format", "delta", "--name-column", "name", "--out", str(out),
                 "--train-shards", "2", "--val-shards", "1", "--val-fraction", "0.3", "--no-progress", *more])


@pytest.mark.slow
def test_a_table_written_by_deltalake_and_its_earlier_version(spark, tmp_path, capsys):
    """``shard --table T --format delta`` reads the latest version (a row deleted), ``--table-version 0`` the first;
    partition values come from the log; a null label is refused as in a Parquet table."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from spark_imagenet.dataset.manifest import Manifest
    from spark_imagenet.storage import open_storage

    rows = _write_table(tmp_path / "t")
    counts = {}
    for version, more in (("latest", ()), ("0", ("--table-version", "0"))):
        assert _shard(tmp_path / "t", tmp_path / version, *more) == 0
        assert "this Spark has no Delta connector; " in capsys.readouterr().err
        manifest = Manifest.load(open_storage(str(tmp_path / version)))
        assert [c.wnid for c in manifest.classes] == ["cat", "dog", "fox"]
        counts[version] = sum(s.examples for s in manifest.splits.values())
    assert counts == {"latest": len(rows) - 1, "0": len(rows)}

    write_deltalake(str(tmp_path / "t"), pa.Table.from_pylist([{"content": rows[0]["content"], "label": None,
                                                                "name": "x.jpg"}]), mode="append")
    assert _shard(tmp_path / "t", tmp_path / "bad") == 2
    assert "label column 'label' is null in 1 row(s)" in capsys.readouterr().err
    assert _shard(tmp_path / "t", tmp_path / "v9", "--table-version", "9") == 2
    assert "has no version 9 (its versions run 0 to 2)" in capsys.readouterr().err


def test_a_feature_the_files_need_or_no_reader_is_refused_in_one_line(spark, tmp_path, capsys, monkeypatch):
    """Column mapping (the files' columns are physical ids): named, with the connector as the way out; without
    deltalake either: both ways to read the table named."""
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "mapped"), pa.table({"content": [image_bytes(1)], "label": ["cat"],
                                                        "name": ["a.jpg"]}),
                    configuration={"delta.columnMapping.mode": "name"})
    assert _shard(tmp_path / "mapped", tmp_path / "o") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("spark-imagenet: error:")]
    assert err == [(
        f"spark-imagenet: error: cannot read the Delta table {tmp_path / 'mapped'} (version 0) with deltalake: it uses "
        "column mapping (delta.columnMapping.mode=name), which its Parquet files cannot be read without; use "
        "delta-spark with its jars (io.delta:delta-spark_<spark major.minor>_2.13 and io.delta:delta-storage; "
        "spark-imagenet finds them in ~/.m2) on a Spark it supports (pyspark <= 4.2)")], err

    monkeypatch.setitem(sys.modules, "deltalake", None)  # import deltalake: ImportError
    assert _shard(tmp_path / "mapped", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert "this Spark has no Delta connector and the deltalake package is not installed; install deltalake " \
           "(pip install '.[delta]'" in err and "or use delta-spark with its jars" in err
    assert not (tmp_path / "o").exists()


def test_table_version_and_conf_go_with_a_table(tmp_path, capsys, monkeypatch):
    from spark_imagenet.cli import main
    from spark_imagenet.training.driver import spark_session

    monkeypatch.setattr(spark_session, "session_for", lambda *a, **k: pytest.fail("Spark was started"))
    for args, message in [
        (("--table", "t", "--format", "parquet", "--table-version", "1"), "--table-version: only with --format delta"),
        ((str(tmp_path), "--table-version", "1"), "--table-version: only with --table"),
        ((str(tmp_path), "--conf", "spark.jars=a.jar"), "--conf: only with --table or --master"),
    ]:
        assert main(["shard", *args, "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err, args


def test_a_delta_output_without_the_connector_is_parquet_made_a_table_by_deltalake(spark, tmp_path):
    """What ``predict --out-format delta`` writes on a Spark without Delta's connector, read back as Delta."""
    from deltalake import DeltaTable

    from spark_imagenet.dataset.delta import read_delta, write_delta

    df = spark.createDataFrame([("a.jpg", [3, 1]), ("b.jpg", [0, 2])], "name string, class_ids array<int>")
    write_delta(df, str(tmp_path / "scores"))
    assert sorted(r["name"] for r in DeltaTable(str(tmp_path / "scores")).to_pyarrow_table().to_pylist()) == [
        "a.jpg", "b.jpg"]
    assert sorted(tuple(r) for r in read_delta(spark, str(tmp_path / "scores")).collect()) == [
        ("a.jpg", [3, 1]), ("b.jpg", [0, 2])]
