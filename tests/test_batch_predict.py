"""Batch inference as a Spark job (issue 22, item 4): ``predict_dataframe`` and ``spark-imagenet predict
--source/--table``, with the ``serving/`` SavedModel of a real tiny tf_keras model (written by
``write_serving``) on real ILSVRC JPEGs, a PNG and bad images; answers checked against the SavedModel called
directly and against the one-machine ``predict``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import spark_imagenet.training.worker  # noqa: F401  (TensorFlow's set-up, before it is imported)
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from PIL import Image  # noqa: E402

from data_util import ILSVRC_MINI, requires_shared  # noqa: E402
from own_images import huge_png  # noqa: E402
from spark_imagenet import cli  # noqa: E402
from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.driver.batch_predict import predict_dataframe  # noqa: E402

VAL = ILSVRC_MINI / "ILSVRC" / "Data" / "CLS-LOC" / "val"
CLASSES, SIZE = 5, 32
BAD = b"this is not an image"


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """An --output folder: model.keras of a tiny 5-class model on 32-pixel images, labels.json, serving/."""
    from spark_imagenet.training.worker.export import write_serving

    folder = tmp_path_factory.mktemp("run")
    keras.utils.set_random_seed(3)
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(4, 3, strides=2, activation="relu")(inputs)
    outputs = keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    model.save(str(folder / "model.keras"))
    labels = [{"id": i, "wnid": f"n0000000{i}", "names": [f"class {i}", "other"]} for i in range(CLASSES)]
    (folder / "labels.json").write_text(json.dumps(labels))
    write_serving(model, labels, SIZE, str(folder))
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """A folder of 6 real ILSVRC val JPEGs, one PNG of the first, a file that is not an image and a truncated
    JPEG (the folder is empty where ../shared/data is absent: the tests using it skip)."""
    folder = tmp_path_factory.mktemp("images")
    if not VAL.is_dir():
        return folder
    jpegs = sorted(VAL.glob("*.JPEG"))[:6]
    for path in jpegs:
        (folder / path.name).write_bytes(path.read_bytes())
    Image.open(jpegs[0]).save(folder / "first.png", format="PNG")
    (folder / "bad.jpg").write_bytes(BAD)
    (folder / "truncated.jpg").write_bytes(jpegs[1].read_bytes()[:400])
    return folder


def direct(run_folder: Path, data: list[bytes]) -> np.ndarray:
    """The SavedModel's ``probabilities`` signature called directly, one image at a time: float32 ``[N, C]``."""
    signature = tf.saved_model.load(str(run_folder / "serving")).signatures["probabilities"]
    return np.stack([signature(images=tf.constant([d]))["probabilities"].numpy()[0] for d in data])


def one_machine_predict(run_folder: Path, files: list[Path], top: int) -> list[dict]:
    """``spark-imagenet predict``'s answers (spark_imagenet.training.worker.predict) for JPEG files."""
    from spark_imagenet.training.worker import evaluate, predict

    model = evaluate.load_model(str(run_folder))
    labels = json.loads((run_folder / "labels.json").read_text())
    return predict.predict(model, files, labels, top)


def check_rows(rows: dict[str, dict], folder: Path, run_folder: Path, top: int) -> None:
    """Each good image's top classes and probabilities are the SavedModel's (and ``predict``'s for JPEGs); the
    bad ones have an error and null predictions."""
    good = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpeg", ".png"))
    expected = direct(run_folder, [p.read_bytes() for p in good])
    for path, probabilities in zip(good, expected):
        row = rows[path.name]
        assert row["error"] is None, row
        best = np.argsort(-probabilities, kind="stable")[:top]
        assert list(row["class_ids"]) == best.tolist()
        assert list(row["wnids"]) == [f"n0000000{i}" for i in best]
        assert list(row["names"]) == [f"class {i}" for i in best]
        np.testing.assert_allclose(row["probabilities"], probabilities[best], atol=1e-6)
    jpegs = [p for p in good if p.suffix == ".JPEG"]
    for answer in one_machine_predict(run_folder, jpegs, top):
        row = rows[Path(answer["file"]).name]
        assert list(row["class_ids"]) == [c["id"] for c in answer["top"]]
        np.testing.assert_allclose(row["probabilities"], [c["probability"] for c in answer["top"]], atol=1e-5)
    for name, reason in (("bad.jpg", "Unknown image file format"), ("truncated.jpg", "Invalid JPEG data")):
        row = rows[name]
        assert reason in row["error"], row
        assert row["class_ids"] is None and row["probabilities"] is None and row["wnids"] is None


@requires_shared(ILSVRC_MINI)
def test_the_executor_side_scores_a_batch_and_names_each_bad_image(run_folder, images):
    """BatchModel (what each executor's Python worker runs): one batch of good, PNG, bad, truncated and null
    images; the good ones get the SavedModel's answers, each bad one its reason, the rest filler."""
    from spark_imagenet.training.worker.batch_predict import loaded_model

    model = loaded_model(str(run_folder))
    assert loaded_model(str(run_folder)) is model  # once per process and URL
    files = sorted(images.iterdir())
    bomb = huge_png(30000, 30000)  # 900 megapixels in a few dozen bytes: refused from its header, never decoded
    out = model.predict([f.read_bytes() for f in files] + [bomb, None], top_k=3)
    assert out["class_ids"].shape == (len(files) + 2, 3) and out["probabilities"].dtype == np.float32
    assert out["error"][-1] == "no image (the column is null)" and (out["class_ids"][-1] == -1).all()
    assert out["error"][-2].startswith("30000 x 30000 pixels (900.0 megapixels) is above the limit of 100 megapixels")
    assert (out["class_ids"][-2] == -1).all()
    assert model.predict([files[0].read_bytes()], top_k=3, max_pixels=100)["error"][0].startswith("437 x 284 pixels")
    rows = {f.name: {k: (None if out["error"][i] is not None and k != "error" else v[i]) for k, v in out.items()}
            for i, f in enumerate(files)}
    check_rows(rows, images, run_folder, 3)


@pytest.mark.slow  # a server or a Spark job (the fast tier stays under 5 minutes)
def test_predict_dataframe_refuses_before_the_job(spark, tmp_path, run_folder):
    """The mistakes predict_dataframe finds on the driver, before any task: the model's folder, the column."""
    df = spark.createDataFrame([("a", b"x", 1)], "path string, content binary, n int")
    with pytest.raises(ConfigError, match="no serving/saved_model.pb"):
        predict_dataframe(df, str(tmp_path))
    older = tmp_path / "older"
    older.mkdir()
    (older / "model.keras").write_bytes(b"")
    with pytest.raises(ConfigError, match=f"run `spark-imagenet export {older}` first"):
        predict_dataframe(df, str(older))
    for kwargs in (dict(image_col="n"), dict(image_col="pixels"), dict(top_k=0), dict(output_col="path")):
        with pytest.raises(ConfigError) as e:
            predict_dataframe(df, str(run_folder), **kwargs)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == next(iter(kwargs.items()))
    schema = predict_dataframe(df, str(run_folder)).schema["prediction"].dataType.simpleString()
    assert schema == ("struct<class_ids:array<int>,wnids:array<string>,names:array<string>,"
                      "probabilities:array<float>,error:string>")


def _errors(capsys) -> list[str]:
    """The command's stderr lines, less the line naming the Spark log an earlier test's session in this
    process wrote (a command run on its own has none before Spark starts)."""
    return [line for line in capsys.readouterr().err.strip().splitlines()
            if not line.startswith("spark-imagenet: Spark's log of this run")]


@pytest.mark.parametrize("arguments, message", [
    (["--source", "S", "--table", "T"], "give one of --source URL (a folder or a labels file) and --table NAME"),
    (["--source", "S", "--id-column", "k"], "--id-column goes with --table, not --source"),
    (["--source", "{tmp}/absent"], "--source {tmp}/absent: no such folder or file"),
    (["--table", "T", "--out", "{tmp}/file"], "--out {tmp}/file is a file"),
    (["--table", "T", "--out", "{tmp}/full"], "--out {tmp}/full is a folder with files in it"),
    (["--table", "T", "--out", "{tmp}/file/out"], "--out {tmp}/file/out: cannot write there"),
])
def test_the_spark_form_refuses_bad_options_in_one_line(run_folder, tmp_path, capsys, arguments, message):
    """Bad options of ``predict --source/--table``: one ``spark-imagenet: error:`` line naming the option,
    exit 2, before Spark starts."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "part-0.parquet").write_text("x")
    arguments = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    arguments = arguments if "--out" in arguments else [*arguments, "--out", str(tmp_path / "o")]
    code = cli.main(["predict", str(run_folder), *arguments])
    err = _errors(capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("spark-imagenet: error: "), err
    assert message.replace("{tmp}", str(tmp_path)) in err[0]


def test_the_spark_form_takes_the_pixel_limit():
    from spark_imagenet.training.driver.predict_job import build_parser

    assert build_parser().parse_args(["m", "--table", "T", "--out", "o"]).max_image_pixels == 100_000_000
    assert build_parser().parse_args(["m", "--table", "T", "--out", "o", "--max-image-pixels", "5"]).max_image_pixels == 5


@pytest.mark.parametrize("model, message", [
    ("{tmp}/nothing", "no serving/saved_model.pb there"),
    ("{tmp}/older", "no serving/ SavedModel (an --output written before the serving export): run "
                    "`spark-imagenet export {tmp}/older` first"),
])
def test_the_spark_form_refuses_a_model_without_serving(tmp_path, capsys, model, message):
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "model.keras").write_bytes(b"")
    model = model.replace("{tmp}", str(tmp_path))
    code = cli.main(["predict", model, "--source", str(tmp_path), "--out", str(tmp_path / "o")])
    err = _errors(capsys)
    assert code == 2 and len(err) == 1 and message.replace("{tmp}", str(tmp_path)) in err[0], err


@pytest.mark.slow
def test_an_unknown_table_and_a_missing_id_column_are_named(spark, tmp_path):
    """--table: a name the catalog does not know, a path without files, a key column the table lacks."""
    from spark_imagenet.training.driver.predict_job import build_parser, table_rows

    def args(*extra):
        return build_parser().parse_args([str(tmp_path), "--out", str(tmp_path / "o"), *extra])

    with pytest.raises(ConfigError, match="cannot read the table no_such.images"):
        table_rows(spark, args("--table", "no_such.images"))
    with pytest.raises(ConfigError, match="no such file or folder"):
        table_rows(spark, args("--table", str(tmp_path / "absent.parquet")))
    spark.createDataFrame([("a", b"x")], "key string, content binary").write.parquet(str(tmp_path / "t"))
    with pytest.raises(ConfigError, match="has no such column") as e:
        table_rows(spark, args("--table", str(tmp_path / "t")))
    assert (e.value.key, e.value.value) == ("--id-column", "path")
    df, key = table_rows(spark, args("--table", str(tmp_path / "t"), "--id-column", "key"))
    assert key == "key" and df.count() == 1


@pytest.mark.slow
@requires_shared(ILSVRC_MINI)
def test_predict_dataframe_on_local_2(spark, run_folder, images):
    """predict_dataframe on local[2] over two partitions: every row scored as the SavedModel and predict do,
    the bad rows with their reason and null predictions, a null image named; the job does not fail."""
    files = sorted(images.iterdir())
    rows = [(f.name, f.read_bytes()) for f in files] + [("null", None)]
    df = spark.createDataFrame(rows, "name string, content binary").repartition(2)
    scored = predict_dataframe(df, str(run_folder), top_k=3, batch_size=4)
    got = {r["name"]: r["prediction"].asDict() for r in scored.collect()}
    assert set(got) == {f.name for f in files} | {"null"}
    assert got["null"]["error"] == "no image (the column is null)"
    check_rows(got, images, run_folder, 3)


def _cli(*arguments: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_imagenet", "predict", *arguments], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


def _parquet_rows(out: Path, key: str) -> dict[str, dict]:
    import pyarrow.parquet as pq

    table = pq.ParquetDataset(str(out)).read().to_pylist()
    return {Path(r[key]).name: r for r in table}


@pytest.mark.slow
@requires_shared(ILSVRC_MINI)
def test_the_command_over_a_folder_and_over_a_table(run_folder, images, tmp_path, spark):
    """``spark-imagenet predict RUN --source FOLDER --out OUT --master local[2]``, then the same images as a
    Parquet table with ``--table``: Parquet of (key, class_ids, wnids, names, probabilities, error) equal to the
    SavedModel's answers; the counts printed; the bad images named in one warning; no CUDA start-up line of
    TensorFlow's (``failed call to cuInit``) from the executors."""
    out = tmp_path / "from-folder"
    p = _cli(str(run_folder), "--source", str(images), "--out", str(out), "--master", "local[2]", "--top", "3")
    assert p.returncode == 0, p.stderr[-3000:]
    files = sorted(images.iterdir())
    assert f"predict: {len(files)} images, 2 errors -> {out}" in p.stdout
    warning = [line for line in p.stderr.splitlines() if "have no prediction" in line]
    assert len(warning) == 1 and "bad.jpg" in warning[0] and "truncated.jpg" in warning[0], p.stderr[-2000:]
    assert "cuInit" not in p.stderr and "cuda_platform" not in p.stderr, p.stderr[-2000:]  # TensorFlow's CUDA probing
    rows = _parquet_rows(out, "path")
    assert set(rows) == {f.name for f in files}
    check_rows(rows, images, run_folder, 3)

    table = tmp_path / "table.parquet"
    spark.createDataFrame([(f"photos/{f.name}", f.read_bytes()) for f in files], "key string, image binary") \
        .write.parquet(str(table))
    out2 = tmp_path / "from-table"
    p = _cli(str(run_folder), "--table", str(table), "--image-column", "image", "--id-column", "key",
             "--out", str(out2), "--master", "local[2]", "--top", "3")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"predict: {len(files)} images, 2 errors -> {out2} (Parquet: key, class_ids" in p.stdout
    check_rows(_parquet_rows(out2, "key"), images, run_folder, 3)


@pytest.mark.slow
@requires_shared(ILSVRC_MINI)
def test_a_labels_file_source_is_read_by_the_executors(spark, images, tmp_path):
    """--source labels.csv: the images it lists (path,label), read through its source on the executors; a folder
    without images is named."""
    from spark_imagenet.training.driver.predict_job import source_rows

    jpegs = sorted(images.glob("*.JPEG"))
    (tmp_path / "labels.csv").write_text("path,label\n" + "".join(f"{p},c{i % 2}\n" for i, p in enumerate(jpegs)))
    rows = {r["path"]: r["content"] for r in source_rows(spark, str(tmp_path / "labels.csv")).collect()}
    assert {Path(k).name: v for k, v in rows.items()} == {p.name: p.read_bytes() for p in jpegs}
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no image files"):
        source_rows(spark, str(tmp_path / "empty"))


@pytest.mark.slow
@requires_shared(ILSVRC_MINI)
def test_on_a_standalone_cluster_of_two_hosts(two_hosts, run_folder, tmp_path):
    """``spark-imagenet predict RUN --source FOLDER --master spark://...`` on one 1-core worker in each of two
    network namespaces: both hosts score images (each loads the model once), the answers are the SavedModel's."""
    import cluster_util

    master, _addresses, folder = two_hosts
    photos = tmp_path / "photos"
    photos.mkdir()
    jpegs = sorted(VAL.glob("*.JPEG"))[:24]  # enough bytes for two binaryFile partitions
    for path in jpegs:
        (photos / path.name).write_bytes(path.read_bytes())
    before = {p for i in (0, 1) for p in (folder / f"work{i}").glob("app-*")}
    out = tmp_path / "out"
    p = _cli(str(run_folder), "--source", str(photos), "--out", str(out), "--master", master,
             env={"SPARK_LOCAL_IP": cluster_util.DRIVER_ADDRESS, "PYSPARK_PYTHON": sys.executable})
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert f"predict: {len(jpegs)} images, 0 errors" in p.stdout
    rows = _parquet_rows(out, "path")
    expected = direct(run_folder, [p.read_bytes() for p in jpegs])
    for path, probabilities in zip(jpegs, expected):
        assert rows[path.name]["class_ids"] == np.argsort(-probabilities, kind="stable")[:5].tolist()
    executors = [[e for app in (folder / f"work{i}").glob("app-*") if app not in before for e in app.glob("*/stderr")]
                 for i in (0, 1)]
    assert all(executors), executors  # an executor on each "host"
