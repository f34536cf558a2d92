"""The driver side of training: check, plan, launch the barrier stage, report.

:func:`train` runs one MultiWorkerMirroredStrategy job as one Spark barrier
stage of N tasks (``sc.parallelize(range(N), N).barrier().mapPartitions``),
one TensorFlow worker per task (see :mod:`spark_imagenet.training.barrier_task` for the
task side). Before anything is launched it checks what would otherwise fail
late or hang:

* the settings (:class:`ConfigError` naming the option);
* the dataset's manifest, and that it has at least N train shards
  (:func:`spark_imagenet.training.assignment.assign`);
* ``spark.dynamicAllocation.enabled`` is not true: barrier stages refuse
  dynamic allocation (SPARK-24942);
* there are at least N task slots: Spark otherwise fails the barrier stage
  with "requires N slots, only M available" after many retries.

After the job it combines the per-worker records into one results dict (and
optionally a JSON file) and prints a table.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from spark_imagenet.errors import ConfigError, SparkImagenetError, TrainingError

#: Seconds to wait for executors to register on a cluster master before the
#: slot check gives up (executors of a freshly started application register
#: a few seconds after the SparkContext).
EXECUTOR_WAIT_SECONDS = 60.0
#: Tolerance for "all workers report the same all-reduced val metrics".
VAL_REL_TOL = 1e-3
VAL_ABS_TOL = 1e-4

_ERROR_CLASSES = {cls.__name__: cls for cls in (SparkImagenetError, *SparkImagenetError.__subclasses__())}


# ----------------------------------------------------------------- settings
def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def validate_settings(workers: Any, model: Any, epochs: Any, batch_size: Any, image_size: Any, width: Any,
                      learning_rate: Any, parallel: Any, seed: Any) -> None:
    """Check the training settings before anything starts.

    Raises:
        ConfigError: naming the option (``--workers``, ``--batch-size``, ...)
            and the bad value; an unknown ``--model`` or an ``--image-size``
            below the model's minimum (:mod:`spark_imagenet.training.models.specs`).
    """
    _check_int("--workers", workers, 1)
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"--model must be a model name such as 'alexnet', got {model!r}")
    _check_int("--epochs", epochs, 1)
    _check_int("--batch-size", batch_size, 1)
    _check_int("--image-size", image_size, 1)
    _check_positive("--width", width)
    _check_positive("--learning-rate", learning_rate)
    if parallel is not None:
        _check_int("--parallel", parallel, 1)
    _check_int("--seed", seed, 0)
    from spark_imagenet.training.models.specs import check_model_settings

    check_model_settings(model, int(image_size))


# -------------------------------------------------------------------- spark
def spark_context(spark):
    """The SparkContext of a session, or a clear error for Spark Connect.

    Raises:
        ConfigError: the session is a Spark Connect session (no RDD API).
    """
    why = (
        "this is a Spark Connect session (e.g. Databricks shared or serverless compute), which has no "
        "SparkContext or RDD barrier API. Use a classic session (local[N], standalone, YARN, Kubernetes). "
        "Barrier training through DataFrame.mapInArrow(..., barrier=True) on Spark Connect is future work."
    )
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        raise ConfigError(why)
    try:
        sc = spark.sparkContext
    except Exception as e:  # Connect raises a PySpark error here
        raise ConfigError(why) from e
    if sc is None:
        raise ConfigError(why)
    return sc


def slots_from_master(master: str, task_cpus: int, default_parallelism: int) -> int:
    """Barrier task slots estimated from the master URL alone.

    Args:
        master: ``local``, ``local[N]``, ``local[*]``, ``local[N,F]``,
            ``local-cluster[E,C,M]`` or a cluster URL.
        task_cpus: ``spark.task.cpus``.
        default_parallelism: ``sc.defaultParallelism`` (for cluster URLs: the
            registered executors' total cores, unless
            ``spark.default.parallelism`` overrides it).

    Returns:
        int: cores // task_cpus.
    """
    m = master.strip()
    cores: int
    if m == "local":
        cores = 1
    elif mm := re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", m):
        cores = (os.cpu_count() or 1) if mm.group(1) == "*" else int(mm.group(1))
    elif mm := re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", m):
        cores = int(mm.group(1)) * int(mm.group(2))
    else:
        cores = default_parallelism
    return cores // max(1, task_cpus)


def available_slots(sc) -> tuple[int, str]:
    """How many barrier tasks the application can run at once.

    Asks the scheduler backend the same question Spark's own barrier check
    asks (``SparkContext.maxNumConcurrentTasks`` for the default resource
    profile: executor cores / ``spark.task.cpus``, also limited by GPU and
    other task resources). When that JVM call is unavailable, falls back to
    :func:`slots_from_master`. Slots busy with other jobs are not subtracted.

    Returns:
        ``(slots, how)``: the count and a short description of its source.
    """
    task_cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile)), f"executor cores / spark.task.cpus={task_cpus}"
    except Exception:
        slots = slots_from_master(sc.master, task_cpus, sc.defaultParallelism)
        return slots, f"estimated from master {sc.master} and spark.task.cpus={task_cpus}"


def check_spark(sc, workers: int, wait_seconds: float = EXECUTOR_WAIT_SECONDS) -> int:
    """Check that a barrier stage of ``workers`` tasks can start now.

    Args:
        sc: the SparkContext.
        workers: barrier tasks wanted.
        wait_seconds: on a cluster master, how long to wait for executors
            to register before giving up (0 under ``local``).

    Returns:
        int: the free slot count found.

    Raises:
        ConfigError: dynamic allocation is on, or fewer slots than workers.
    """
    conf = sc.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        raise ConfigError(
            "spark.dynamicAllocation.enabled is true, and Spark barrier stages refuse dynamic allocation "
            "(SPARK-24942). Set spark.dynamicAllocation.enabled=false (and give the application at least "
            f"{workers} task slots, e.g. spark.executor.instances x spark.executor.cores)."
        )
    slots, how = available_slots(sc)
    from spark_imagenet.training.spark_session import is_local_master

    deadline = time.monotonic() + (0 if is_local_master(sc.master) else wait_seconds)
    while slots < workers and time.monotonic() < deadline:
        time.sleep(1.0)
        slots, how = available_slots(sc)
    if slots < workers:
        raise ConfigError(
            f"--workers {workers} needs {workers} barrier task slots, only {slots} available "
            f"(master {sc.master}; {how}). Use --workers <= {slots}, or give Spark more cores "
            f"(local[{workers}], more executors or spark.executor.cores)."
        )
    return slots


# ------------------------------------------------------------ task failures
def task_error(text: str) -> SparkImagenetError:
    """The user-facing error inside a failed Spark job's message.

    A barrier task's Python exception reaches the driver as text inside the
    JVM's exception (``...spark_imagenet.errors.TrainingError: <message>``
    followed by `` SQLSTATE``/``\\tat`` stack lines). This finds the last
    such error of this package (the outermost of a chained traceback; Spark
    repeats the failing task's traceback in the job's message) and rebuilds
    it with its own class and message; anything else becomes a
    :class:`TrainingError` holding the Spark failure reason and the last
    Python exception line, without JVM frames.

    Args:
        text: ``str()`` of the exception raised by ``collect()``.

    Returns:
        SparkImagenetError: to be raised by the caller.
    """
    matches = list(re.finditer(r"spark_imagenet\.errors\.(\w+): ", text))
    if matches:
        m = matches[-1]  # the outermost error of a chained traceback
        cls = _ERROR_CLASSES.get(m.group(1), TrainingError)
        rest = text[m.end():]
        end = re.search(r"\(end of rank \d+ output\)", rest)
        if end:
            message = rest[:end.end()]
        else:
            stop = re.search(r"\n\s*SQLSTATE|\n\tat |\n\s+at [\w$.]+\(|\nDriver stacktrace", rest)
            message = rest[:stop.start()] if stop else rest[:4000]
        return cls(message.strip())
    lines = [ln for ln in text.splitlines() if ln.strip() and not re.match(r"\s+at |\s*\.\.\. \d+ more", ln)]
    reason = next((ln.strip() for ln in lines if "Job aborted" in ln or "SparkException" in ln),
                  lines[0] if lines else "")
    exc_lines = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", ln)
                 and not ln.startswith(("org.apache.", "java.", "scala.", "py4j."))]
    detail = f"\nlast Python exception: {exc_lines[-1]}" if exc_lines else ""
    return TrainingError(f"the Spark training job failed: {reason[:1500]}{detail}\n"
                         "(see the [rank R] lines above or the executor logs for each worker's output)")


# ------------------------------------------------------------------ results
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
    keys = ("rank", "host", "train_images", "steps", "images_per_sec", "train_loss", "train_top1", "train_seconds")
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


# -------------------------------------------------------------------- train
def train(spark, url: str, workers: int, *, model: str = "alexnet", epochs: int = 1, batch_size: int = 32,
          image_size: int = 224, width: float = 1.0, learning_rate: float = 0.01, parallel: int | None = None,
          cache: str | os.PathLike | None = None, results: str | os.PathLike | None = None, seed: int = 0,
          transfers: int = 8, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train a model on a sharded dataset with N Spark barrier tasks.

    Args:
        spark: a classic SparkSession (not Spark Connect).
        url: the dataset bucket URL (holding ``manifest.json`` and shards).
        workers: N, the number of TensorFlow workers (= barrier tasks).
        model: model name (``"alexnet"``).
        epochs: training epochs; one epoch is one pass over the train split
            by the whole cluster.
        batch_size: per-worker batch size (the global batch is N x this).
        image_size: training/eval image side in pixels.
        width: multiplier of every layer width (1.0 = the paper's AlexNet).
        learning_rate: SGD learning rate.
        parallel: tf.data parallel calls per worker; None = the worker's
            thread count (the host's CPUs / workers on that host).
        cache: shard cache folder on every executor host; None = under the
            Spark local dir (see :func:`spark_imagenet.dataset.cache.default_cache_dir`).
        results: write the results JSON here (atomically) when given.
        seed: random seed.
        transfers: parallel shard downloads per task (``--transfers``).
        log: called with each line of the summary (default ``print``).

    Returns:
        dict: ``{"workers", "per_worker": [{"rank", "host", "train_images",
        "steps", "images_per_sec", "train_loss", "train_top1",
        "train_seconds"}], "val": {"images", "top1", "top5", "loss"},
        "images_per_sec" (sum over workers), "history" (rank 0's Keras
        history), "config": {...}, "wall_seconds"}`` where ``wall_seconds``
        is the barrier job's wall time (shard staging, TensorFlow start-up,
        training and evaluation).

    Raises:
        ConfigError: a bad setting, Spark Connect, dynamic allocation, too few
            task slots, too few train shards, an unwritable ``results`` path.
        ManifestError: no or invalid manifest at ``url``.
        StorageError: a shard cannot be staged intact (from a task).
        TrainingError: a TensorFlow worker failed (message: rank, host, exit
            status and its last output lines).
    """
    import functools

    from spark_imagenet.training.assignment import assign
    from spark_imagenet.training.barrier_task import TaskSpec, run_task
    from spark_imagenet.dataset.manifest import Manifest
    from spark_imagenet.storage import open_storage

    validate_settings(workers, model, epochs, batch_size, image_size, width, learning_rate, parallel, seed)
    if isinstance(transfers, bool) or not isinstance(transfers, int) or transfers < 1:
        raise ConfigError(f"--transfers {transfers!r}: must be a positive integer")
    if results is not None:
        target = Path(results).expanduser().absolute()
        parent = target.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise ConfigError(f"--results {results}: folder {parent} does not exist or is not writable")
        if target.is_dir():
            raise ConfigError(f"--results {results} is a folder; give a file name such as {target / 'results.json'}")
    sc = spark_context(spark)
    storage = open_storage(url)
    manifest = Manifest.load(storage)
    plan = assign(manifest, workers, batch_size)
    check_spark(sc, workers)

    settings = {"model": model, "epochs": epochs, "batch_size": batch_size, "image_size": image_size,
                "width": float(width), "learning_rate": float(learning_rate), "parallel": parallel, "seed": seed}
    cache_dir = str(Path(cache).expanduser().absolute()) if cache is not None else None
    spec = TaskSpec(url=storage.url, dataset_id=manifest.dataset_id, num_classes=manifest.num_classes,
                    assignment=plan, settings=settings, cache_dir=cache_dir,
                    storage_options=storage.reopen_options(), transfers=transfers)
    smallest = min(p.train_examples for p in plan.workers)
    if batch_size > smallest:
        log(f"warning: --batch-size {batch_size} is larger than the {smallest} train images of the smallest "
            "worker; its batches repeat images within one step (use a smaller batch or fewer workers)")
    log(f"training {model} on {storage.url}: {workers} worker(s), {plan.train_examples_total} train / "
        f"{plan.val_examples_total} val images, {epochs} epoch(s) x {plan.steps_per_epoch} steps, "
        f"batch {batch_size} per worker")

    start = time.monotonic()
    sc.setJobDescription(f"spark-imagenet train {model} x{workers}")
    try:
        rdd = sc.parallelize(range(workers), workers).barrier().mapPartitions(functools.partial(run_task, spec))
        lines = rdd.collect()
    except Exception as e:
        raise task_error(str(e)) from None
    finally:
        sc.setJobDescription(None)
    wall = time.monotonic() - start

    records = [json.loads(s) for s in lines]
    per_worker, val = combine(records, workers, log)
    rank0 = min(records, key=lambda r: r["rank"])
    out = {
        "workers": workers,
        "per_worker": per_worker,
        "val": val,
        "images_per_sec": sum(w["images_per_sec"] or 0.0 for w in per_worker),
        "history": rank0.get("history"),
        "config": {
            "url": storage.url, "dataset_id": manifest.dataset_id, "master": sc.master,
            **settings, "cache": cache_dir, "num_classes": manifest.num_classes,
            "train_examples": plan.train_examples_total, "val_examples": plan.val_examples_total,
            "steps_per_epoch": plan.steps_per_epoch, "val_steps": plan.val_steps,
            "global_batch_size": batch_size * workers,
            "assignment": [p.to_json() for p in plan.workers],
        },
        "wall_seconds": wall,
    }
    for line in format_table(out).splitlines():
        log(line)
    if results is not None:
        write_json_atomic(Path(results).expanduser(), out)
        log(f"results written to {results}")
    return out
