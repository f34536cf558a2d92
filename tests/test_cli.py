"""The `spark-imagenet` command line as a user runs it: a subprocess, exit codes, messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

from bucket_util import make_bucket
from data_util import small_layout
from own_images import class_tree, huge_png
from spark_imagenet.dataset.sharding import shard


def cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the command line; the result's ``spark_started`` says whether it got as far as starting a JVM."""
    tmp = tempfile.mkdtemp(prefix="spark-imagenet-cli-test-")  # kept when it holds a file: Spark's log of a run
    p = subprocess.run([sys.executable, "-m", "spark_imagenet", *args], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "TMPDIR": tmp, **(env or {})})
    # spark_session.spark_log_path() makes this folder right before the command line starts a JVM
    p.spark_started = os.path.isdir(os.path.join(tmp, "spark-imagenet-logs"))
    for folder, _, files in sorted(os.walk(tmp), key=lambda w: -len(w[0])):  # the empty folders go, deepest first
        if not files and not os.listdir(folder):
            os.rmdir(folder)
    return p


#: What Spark prints while it starts (without the quiet log4j config the command line gives its sessions).
SPARK_START_UP = ("Using incubator modules", "Setting default log level", "NativeCodeLoader", "SparkContext",
                  "Using Spark's default log4j")


def spark_started(*runs: subprocess.CompletedProcess) -> bool:
    """Whether any of these runs started a JVM (a mistake that needs no cluster must be reported before)."""
    return any(p.spark_started or any(s in p.stderr for s in SPARK_START_UP) for p in runs)


def assert_clean_error(p: subprocess.CompletedProcess, *fragments: str) -> None:
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "Py4J" not in p.stderr, p.stderr
    for frag in fragments:
        assert frag in p.stderr, p.stderr


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return small_layout(tmp_path_factory.mktemp("cli") / "kaggle")


@pytest.mark.slow
def test_shard_inspect_and_rerun(tree, tmp_path):
    out = tmp_path / "bucket"
    p = cli("shard", str(tree), "--out", f"file://{out}", "--train-shards", "3", "--val-shards", "2", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "sharding 24 train + 12 val images of 4 classes into 3 + 2 shards" in p.stderr
    p = cli("inspect", str(out))
    assert p.returncode == 0
    assert "classes   4 (label base 0)" in p.stdout and "train     3 shards, 24 examples" in p.stdout
    data = json.loads(cli("inspect", str(out), "--json").stdout)
    assert data["totals"]["examples"] == 36
    p = cli("shard", str(tree), "--out", str(out), "--train-shards", "3", "--val-shards", "2", "--no-progress")
    assert p.returncode == 0 and "already holds this dataset" in p.stderr
    # Same folder, different dataset: refused, nothing changed.
    before = (out / "manifest.json").read_bytes()
    assert_clean_error(cli("shard", str(tree), "--out", str(out), "--classes", "2"), "already holds a different dataset", "--overwrite")
    assert (out / "manifest.json").read_bytes() == before


@pytest.mark.parametrize("reader", ["one line", "gone before output"])
def test_inspect_into_a_reader_that_stops_early(tree, tmp_path, reader):
    # `spark-imagenet inspect URL | head -1`: the reader exits while the command still has output to
    # write. "one line" reads like head -1 (up to the first newline, then closes); unbuffered, print
    # writes the summary and then its final newline separately, and the close usually falls between
    # the two (a race: the summary is far smaller than a pipe). "gone before output" closes the
    # reading end before the command starts, so its first write fails for certain; block-buffered,
    # that write is main()'s flush.
    out = tmp_path / "bucket"
    shard(tree, out, train_shards=3, val_shards=2, progress=False)
    env = dict(os.environ)
    if reader == "one line":
        env["PYTHONUNBUFFERED"] = "1"
    else:
        env.pop("PYTHONUNBUFFERED", None)
    read_end, write_end = os.pipe()
    first = b""
    with os.fdopen(read_end, "rb", buffering=0) as reading:
        with os.fdopen(write_end, "wb") as writing:
            if reader == "gone before output":
                reading.close()
            proc = subprocess.Popen([sys.executable, "-m", "spark_imagenet", "inspect", str(out)],
                                    stdout=writing, stderr=subprocess.PIPE, text=True, env=env)
        while not reading.closed and not first.endswith(b"\n"):  # one line, then close
            chunk = reading.read(1)
            assert chunk, f"the command wrote no line: {proc.communicate(timeout=120)[1]}"
            first += chunk
    _, stderr = proc.communicate(timeout=120)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    if reader == "one line":
        assert first.decode() == f"dataset {out}\n"
        assert proc.returncode in (0, 141), stderr  # 0: the whole summary was out before the close
    else:
        assert proc.returncode == 141, stderr


def test_bad_input_messages(tree, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_clean_error(cli("shard", str(tmp_path / "empty"), "--out", str(tmp_path / "o")),
                       "not in the Kaggle ILSVRC CLS-LOC layout", "LOC_synset_mapping.txt")
    assert_clean_error(cli("shard", str(tree), "--out", str(tree / "shards")), f"--out {tree / 'shards'} is inside "
                       f"the source {tree}", "give a folder outside it")
    assert not (tree / "shards").exists()
    assert_clean_error(cli("inspect", str(tmp_path / "nothing")), f"the dataset folder {tmp_path / 'nothing'} does not "
                       "exist", "spark-imagenet shard")
    assert_clean_error(cli("inspect", str(tmp_path)), f"{tmp_path}/manifest.json does not exist")
    assert_clean_error(cli("shard", str(tree), "--out", "ftp://bucket/x"), "unknown URL scheme 'ftp'")
    p = cli("shard", str(tree), "--out", str(tmp_path / "o"), "--train-shards", "0")
    assert p.returncode == 2 and "argument --train-shards: 0 must be at least 1" in p.stderr


#: The one line every command that needs Spark says where pyspark (the extra ``spark``) is not installed.
NO_PYSPARK = ("spark-imagenet: error: pyspark is not installed: pip install '.[spark]' in the project's folder (or "
              "'spark-imagenet[spark]' from a package index); a Spark platform such as Databricks, EMR or Dataproc "
              "brings its own pyspark: run spark-imagenet with that platform's Python\n")


def without_pyspark(folder) -> dict:
    """The environment of a Python (and of the Pythons it starts) in which ``import pyspark`` (and py4j) fails as
    where neither is installed: a ``sitecustomize`` in ``folder``, first on PYTHONPATH, marks both missing."""
    (folder / "sitecustomize.py").write_text('import sys\nsys.modules.update({"pyspark": None, "py4j": None})\n')
    return {"PYTHONPATH": os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])}


def test_without_pyspark_a_spark_command_says_how_to_install_it_and_the_others_work(tree, tmp_path):
    env = without_pyspark(tmp_path)
    for args in (("demo",), ("train", str(tmp_path / "no-dataset"), "--workers", "2"),
                 ("shard", str(tree), "--out", str(tmp_path / "a"), "--master", "local[2]"),
                 ("shard", "--table", str(tmp_path / "t"), "--format", "parquet", "--out", str(tmp_path / "b")),
                 ("predict", str(tmp_path / "no-model"), "--source", str(tree), "--out", str(tmp_path / "c"))):
        p = cli(*args, env=env, timeout=120)
        assert (p.returncode, p.stderr) == (2, NO_PYSPARK), (args, p.stderr)  # before any input is read
    p = cli("shard", str(tree), "--out", str(tmp_path / "shards"), "--no-progress", env=env, timeout=120)
    assert p.returncode == 0 and "wrote 36 examples" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-c", "import spark_imagenet as s; print(s.shard.__name__); s.ImageClassifier"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert p.stdout == "shard\n" and p.stderr.splitlines()[-1] == (
        "spark_imagenet.errors.EnvironmentSetupError: " + NO_PYSPARK.removeprefix("spark-imagenet: error: ").strip())


@pytest.mark.parametrize("args, command", [
    (("train", "x", "--epochs", "x"), "spark-imagenet train"),
    (("train", "x", "--no-such-option"), "spark-imagenet train"),
    (("shard", "x"), "spark-imagenet shard"),
    (("demo", "--workers", "0"), "spark-imagenet demo"),
    (("doctor", "--workers", "two"), "spark-imagenet doctor"),
    (("nonsense",), "spark-imagenet"),
    ((), "spark-imagenet"),
    (("predict",), "spark-imagenet predict"),
    (("evaluate", "model", "data", "--bogus"), "spark-imagenet evaluate"),
])
def test_an_option_error_is_the_error_and_a_pointer_to_help(args, command):
    p = cli(*args, timeout=120)
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 2, p.stderr
    assert lines[0].startswith(f"{command}: error: ") and lines[1] == f"{command}: see '{command} --help' for the options"
    assert "usage:" not in p.stderr


def test_more_workers_than_slots_via_cli(tree, tmp_path):
    out = tmp_path / "bucket"
    assert cli("shard", str(tree), "--out", str(out), "--train-shards", "4", "--no-progress").returncode == 0
    p = cli("train", str(out), "--workers", "3", "--master", "local[2]", "--image-size", "72", "--width", "0.25")
    assert_clean_error(p, "--workers 3 needs 3 barrier task slots", "only 2", "Use --workers <= 2", "--master local[3]")
    assert not spark_started(p), p.stderr  # said from the master URL, before the JVM
    p = cli("train", str(out), "--workers", "2", "--master", "local-cluster[2,2,1024]", "--conf", "spark.task.cpus=4")
    assert_clean_error(p, "--workers 2 needs 2 barrier task slots, only 1 available", "spark.task.cpus=4",
                       "--master 'local-cluster[2,4,2048]'", "or a lower spark.task.cpus")
    assert not spark_started(p), p.stderr


@pytest.mark.slow
def test_a_job_refused_once_spark_runs_shows_no_jvm_start_up_lines(tmp_path):
    """Dynamic allocation is refused once the session runs: the JVM started (its incubator-module warning,
    which every JVM of Spark 4 prints, is left out of the console; nothing else from Spark's start-up shows)."""
    bucket = make_bucket(tmp_path / "bucket")
    p = cli("train", str(bucket), "--workers", "1", "--master", "local[1]", "--conf",
            "spark.dynamicAllocation.enabled=true", timeout=300)
    assert_clean_error(p, "spark.dynamicAllocation.enabled is true")
    assert p.spark_started, p.stderr
    assert not any(s in p.stderr for s in SPARK_START_UP), p.stderr
    assert len(p.stderr.splitlines()) <= 2, p.stderr  # the error, and the line naming Spark's log file


def without_hadoop(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")}
    return {**env, **extra}


def test_yarn_without_its_configuration_is_one_line_before_spark_starts(tmp_path):
    bucket = make_bucket(tmp_path / "bucket")
    args = [sys.executable, "-m", "spark_imagenet", "train", str(bucket), "--workers", "1", "--master", "yarn",
            "--shared-filesystem"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, env=without_hadoop())
    assert_clean_error(p, "--master yarn: set HADOOP_CONF_DIR to the folder with the cluster's yarn-site.xml")
    assert p.stderr.count("\n") == 1 and "JAVA_GATEWAY_EXITED" not in p.stderr, p.stderr
    p = subprocess.run(args, capture_output=True, text=True, timeout=120,
                       env=without_hadoop(HADOOP_CONF_DIR=str(tmp_path)))
    assert_clean_error(p, f"--master yarn: no yarn-site.xml in {tmp_path} (HADOOP_CONF_DIR)")
    assert p.stderr.count("\n") == 1, p.stderr


def test_output_and_checkpoint_dir_naming_a_file_or_an_earlier_run(tmp_path):
    file = tmp_path / "file.txt"
    file.write_text("x")
    p = cli("train", str(tmp_path / "nothing"), "--workers", "1", "--output", str(file))
    assert_clean_error(p, f"--output {file} is a file, not a folder")
    assert "write-test" not in p.stderr and "Errno" not in p.stderr
    p = cli("train", str(tmp_path / "nothing"), "--workers", "1", "--checkpoint-dir", str(file))
    assert_clean_error(p, f"--checkpoint-dir {file} is a file, not a folder")
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.keras").write_text("an earlier run's")
    p = cli("train", str(tmp_path / "nothing"), "--workers", "1", "--output", str(run))
    assert_clean_error(p, f"--output {run} already holds the outputs of an earlier run (model.keras)", "--overwrite")
    p = cli("train", str(tmp_path / "nothing"), "--workers", "1", "--output", str(run), "--overwrite")
    assert_clean_error(p, f"the dataset folder {tmp_path / 'nothing'} does not exist")  # got past the output
    assert (run / "model.keras").read_text() == "an earlier run's"


def test_print_config_round_trips_through_config(tmp_path):
    first = cli("train", str(tmp_path / "data"), "--workers", "2", "--epochs", "3", "--conf", "spark.a=1",
                "--print-config")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f'url = "{tmp_path / "data"}"\n\n[scaling]\nworkers = 2\n')
    assert "[recipe]" in first.stdout and "epochs = 3" in first.stdout
    job = tmp_path / "a.toml"
    job.write_text(first.stdout)
    again = cli("train", "--config", str(job), "--print-config")
    assert again.returncode == 0 and again.stdout == first.stdout
    # options override the file; --conf adds to its table
    over = cli("train", "--config", str(job), "--epochs", "5", "--conf", "spark.b=2", "--print-config")
    assert "epochs = 5" in over.stdout and '"spark.a" = "1"' in over.stdout and '"spark.b" = "2"' in over.stdout
    assert not spark_started(first, again)


def test_bad_job_file_and_settings_are_reported_before_spark_starts(tree, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("workers = 2\nbach_size = 8\n")
    p = cli("train", str(tmp_path), "--config", str(job))
    assert_clean_error(p, f"job file {job}", "'bach_size' (did you mean 'batch_size'?)", "known keys are: url, scaling, data")
    p = cli("train", str(tmp_path / "nothing"), "--workers", "2", "--output", str(tmp_path / "runs" / "1"),
            "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert_clean_error(p, f"the dataset folder {tmp_path / 'nothing'} does not exist")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "ckpt").exists()  # a refused train creates nothing
    p = cli("train", str(tmp_path), "--workers", "2", "--image-size", "32")
    assert_clean_error(p, "--image-size", "32 is too small for alexnet", "at least 67")
    job.write_text('workers = "two"\n')
    assert_clean_error(cli("train", str(tmp_path), "--config", str(job)), "workers (--workers) must be an integer",
                       str(job))
    assert_clean_error(cli("train", "--workers", "2"), "no dataset URL")
    job.write_text("workers = 2\nimage_size = 32\n")  # the file's value is blamed on the file, an option's not
    assert_clean_error(cli("train", str(tmp_path), "--config", str(job)), f"(from the job file {job})")
    p = cli("train", str(tmp_path), "--config", str(job), "--image-size", "48")
    assert_clean_error(p, "image_size (--image-size) 48 is too small")
    assert "from the job file" not in p.stderr
    job.write_text(f'url = "{tmp_path}"\n')
    assert_clean_error(cli("demo", "--config", str(job)), "the demo makes its own dataset")
    for out in (p,):
        assert not spark_started(out), out.stderr


def test_ctrl_c_is_one_line_naming_sparks_log_where_spark_wrote_one(monkeypatch, capsys, tmp_path):
    from spark_imagenet import cli as command_line

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(command_line, "run", interrupted)
    monkeypatch.setattr(command_line, "ignore_sigint", lambda: None)  # not in the test's own process
    monkeypatch.setattr(command_line, "_spark_log", lambda: str(tmp_path / "spark.log"))
    assert command_line.main(["train"]) == 130
    err = capsys.readouterr().err
    assert err == f"spark-imagenet: interrupted (Spark's log of this run: {tmp_path}/spark.log)\n"
    monkeypatch.setattr(command_line, "_spark_log", lambda: None)  # no Spark, or a log it left empty
    assert command_line.main(["train"]) == 130
    assert capsys.readouterr().err == "spark-imagenet: interrupted\n"


def test_debug_prints_the_traceback(tmp_path):
    quiet = cli("inspect", str(tmp_path / "nothing"))
    assert "Traceback" not in quiet.stderr
    loud = cli("inspect", str(tmp_path / "nothing"), env={"SPARK_IMAGENET_DEBUG": "1"})
    assert loud.returncode == 2 and "Traceback (most recent call last)" in loud.stderr
    assert loud.stderr.rstrip().splitlines()[-1].startswith("spark-imagenet: error: ")


def test_help_shows_each_commands_own_defaults():
    demo = " ".join(cli("demo", "--help").stdout.split())
    train = " ".join(cli("train", "--help").stdout.split())
    assert "passes over the train set (default: 15)" in demo  # the demo's own --epochs
    assert "passes over the train set (default: 1)" in train
    assert "demo 10" not in demo + train
    assert "alexnet (>= 67 px)" in train and "--print-config" in train and "--config" in train
    assert "required, here or in the job file" in train and "(default: 4)" in demo  # --workers


@pytest.mark.slow
def test_demo_command(tmp_path):
    results = tmp_path / "results.json"
    p = cli("demo", "--workers", "2", "--workdir", str(tmp_path / "demo"), "--results", str(results))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(results.read_text())
    assert r["workers"] == 2 and len(r["per_worker"]) == 2
    assert r["config"]["num_classes"] == 10 and r["val"]["images"] == 120
    assert r["val"]["top1"] > 0.25, r["val"]  # chance is 0.1; 2 workers x 10 epochs gave 0.44-0.77 in 4 runs
    assert "[rank 1]" in p.stderr + p.stdout  # the children's output reaches the driver's console


@pytest.mark.slow
def test_a_failed_task_is_one_message_and_spark_keeps_its_stack_traces_in_its_log(tree, tmp_path):
    """A shard that changed after sharding fails its task's fetch: the console shows our error once and names
    Spark's log, which holds the task's stack traces (Spark's console would print them twice, 80+ lines)."""
    out = tmp_path / "bucket"
    shard(tree, out, train_shards=2, val_shards=1)
    victim = sorted(out.glob("train-*.tfrecord"))[0]
    data = bytearray(victim.read_bytes())
    data[100:110] = b"x" * 10  # same size, other content: the CRC32C check refuses it
    victim.write_bytes(bytes(data))
    p = cli("train", str(out), "--workers", "2", "--master", "local[2]", "--image-size", "72", "--width", "0.25",
            "--epochs", "1", "--cache", str(tmp_path / "cache"))
    assert p.returncode == 2, p.stderr[-3000:]
    console = (p.stdout + p.stderr).splitlines()
    assert len(console) <= 30, "\n".join(console)
    errors = [ln for ln in console if ln.startswith("spark-imagenet: error: ")]
    assert len(errors) == 1 and victim.name in errors[0] and "could not be fetched intact" in errors[0], console
    assert not any(ln.startswith("\tat ") or "PythonException" in ln for ln in console), console
    named = [ln for ln in console if ln.startswith("spark-imagenet: Spark's log of this run")]
    assert len(named) == 1, console
    log = named[0].rsplit(": ", 1)[1]
    text = open(log).read()
    assert "Lost task" in text and victim.name in text and "\tat org.apache.spark" in text


def test_a_local_dataset_for_a_cluster_master_is_refused_before_spark_starts(tmp_path):
    p = cli("train", str(tmp_path / "nowhere"), "--workers", "2", "--master", "spark://127.0.0.1:1")
    assert_clean_error(p, f"the dataset folder {tmp_path / 'nowhere'} does not exist")
    bucket = tmp_path / "bucket"
    shard(small_layout(tmp_path / "kaggle"), bucket, train_shards=2, val_shards=1)
    p = cli("train", str(bucket), "--workers", "2", "--master", "spark://127.0.0.1:1")
    assert_clean_error(p, f"the dataset {bucket} is a path on the driver's disk", "--shared-filesystem")
    p = cli("train", str(bucket), "--workers", "2", "--master", "spark://127.0.0.1:1", "--shared-filesystem")
    assert_clean_error(p, "cannot reach the Spark standalone master spark://127.0.0.1:1")
    assert not spark_started(p), p.stderr


def test_a_spark_start_up_failure_is_told_by_its_java_reason():
    from spark_imagenet.errors import spark_reason

    e = Exception("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
                  ": java.lang.IllegalArgumentException: Required executor memory (2048 MB) is above the max\n"
                  "\tat org.apache.spark.deploy.yarn.Client.verifyClusterResources(Client.scala:1)")
    assert spark_reason(e) == "IllegalArgumentException: Required executor memory (2048 MB) is above the max"
    assert spark_reason(Exception("Could not parse Master URL: 'x'")) == "Could not parse Master URL: 'x'"


def test_evaluate_and_predict_report_a_wrong_path_before_tensorflow_starts(tmp_path):
    """A missing model, dataset or image is one error line, found before the child imports TensorFlow (whose
    start-up takes seconds and, without a GPU, prints CUDA lines or our one-line notice about them)."""
    for args, fragment in (
        (("evaluate", str(tmp_path / "none"), str(tmp_path)), f"model {tmp_path / 'none'}: cannot read model.keras"),
        (("predict", str(tmp_path / "none"), str(tmp_path / "x.jpg")), f"{tmp_path / 'x.jpg'}: no such file"),
    ):
        p = cli(*args, timeout=120)
        assert p.returncode == 2 and fragment in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1 and "CPU" not in p.stderr and "cuInit" not in p.stderr, p.stderr
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    unreadable = tmp_path / "locked.jpg"
    unreadable.write_bytes(b"\xff\xd8\xff")
    unreadable.chmod(0)
    bomb, big = tmp_path / "bomb.png", tmp_path / "big.png"  # 900 and 169 megapixels, in a few dozen bytes each
    bomb.write_bytes(huge_png(30000, 30000))
    big.write_bytes(huge_png(13000, 13000))
    cases = [(text, f"{text}: not an image"),
             (bomb, f"{bomb}: 30000 x 30000 pixels (900.0 megapixels) is above the limit of 100 megapixels"),
             (big, f"{big}: 13000 x 13000 pixels (169.0 megapixels) is above the limit of 100 megapixels")]
    if os.geteuid() != 0:  # root reads any file
        cases.append((unreadable, f"{unreadable}: cannot read the file (Permission denied)"))
    for image, fragment in cases:  # checked by the command line itself: no child Python, no TensorFlow
        p = cli("predict", str(tmp_path / "none"), str(image), timeout=120)
        assert p.returncode == 2 and fragment in p.stderr and p.stderr.count("\n") == 1, p.stderr
        assert "Traceback" not in p.stderr and "DecompressionBomb" not in p.stderr, p.stderr
    # the limit raised: the header passes, the decode finds the pixels missing; Pillow's own warning never shows
    p = cli("predict", str(tmp_path / "none"), str(big), "--max-image-pixels", "169000000", timeout=120)
    assert p.returncode == 2 and f"{big}: not an image that can be read (image file is truncated" in p.stderr
    assert p.stderr.count("\n") == 1 and "DecompressionBomb" not in p.stderr, p.stderr
    (tmp_path / "model.keras").write_bytes(b"not a model")
    p = cli("evaluate", str(tmp_path), str(tmp_path / "no-dataset"), timeout=120)
    assert p.returncode == 2 and "the dataset folder" in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_shard_names_each_image_above_the_pixel_limit_and_writes_nothing(tmp_path):
    """A 900-megapixel and a 169-megapixel PNG (a few dozen bytes each) among good images: exit 2, one line per
    file naming it and its size, read from the header (nothing decoded), no traceback, nothing written."""
    tree = class_tree(tmp_path / "photos", {"cat": 6, "dog": 6})
    (tree / "cat" / "bomb.png").write_bytes(huge_png(30000, 30000))
    (tree / "dog" / "big.png").write_bytes(huge_png(13000, 13000))
    out = tmp_path / "out"
    p = cli("shard", str(tree), "--out", str(out), "--train-shards", "1", "--val-shards", "1", "--val-fraction",
            "0.34", "--processes", "1", "--no-progress", timeout=300)
    assert_clean_error(p, "2 image file(s)", f"nothing was written to {out}")
    for name, size in (("cat/bomb.png", "30000 x 30000 pixels (900.0 megapixels)"),
                       ("dog/big.png", "13000 x 13000 pixels (169.0 megapixels)")):
        lines = [line for line in p.stderr.splitlines() if name in line]
        assert len(lines) == 1 and f"{size} is above the limit of 100 megapixels" in lines[0], p.stderr
        assert "--max-image-pixels" in lines[0]
    assert "DecompressionBomb" not in p.stderr and not out.exists(), p.stderr


@pytest.mark.parametrize("url", ["s3://bucket/ds", "abfs://data@acct.dfs.core.windows.net/ds",
                                 "hdfs://127.0.0.1:1/ds", "gs://bucket/ds"])
def test_check_for_master_leaves_every_store_url_to_the_job(url, capsys):
    """The submit/ scripts' check reads a dataset's manifest before the JVM only when it is on this machine's
    disk: a URL of any store (not only gs://) is left to the job, whose hosts have the store's credentials."""
    from spark_imagenet.cli import main

    assert main(["train", url, "--check-for-master", "local[2]", "--workers", "2"]) == 0
    assert capsys.readouterr().out == "2\n"


def test_check_for_master_still_reads_a_local_dataset_first(tmp_path, capsys):
    from spark_imagenet.cli import main

    assert main(["train", str(tmp_path / "absent"), "--check-for-master", "local[2]", "--workers", "2"]) == 2
    assert "absent does not exist" in capsys.readouterr().err
