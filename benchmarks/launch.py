"""Launch latency: seconds from the call to the first training step, and for a whole tiny job, on local[2].

Usage (from the repository root)::

    .venv/bin/python benchmarks/launch.py [--reps 5] [--root DIR] [--json [FILE]]
    .venv/bin/python benchmarks/launch.py --quick        # 1 repetition of the tiniest job, ours and plain
    .venv/bin/python benchmarks/launch.py --quick --variants ours,peer,plain   # with the peer too

Three ways to run the same two-worker MultiWorkerMirroredStrategy job (AlexNet at width 0.25, 72 px, batch 4
per worker, 1 epoch, on the same TFRecord shards of a small synthetic Kaggle tree, built first with
:func:`spark_imagenet.dataset.sharding.shard`):

* **ours**: :func:`spark_imagenet.training.driver.launch.train` (what ``spark-imagenet train`` runs): driver checks,
  one barrier stage; each task starts its TensorFlow worker process (``spark_imagenet.training.worker.main
  --preload``, forked by the host's TensorFlow fork server, which the first job's first task starts and which
  imports TensorFlow once), stages its shards into a fresh shard cache and meets the other task meanwhile, then
  gives the process its go; after training it also evaluates the validation images (``val_images`` in the
  params).
* **peer**: spark-tensorflow-distributor 1.0.0, ``MirroredStrategyRunner(num_slots=2, local_mode=False,
  use_gpu=False).run(fn)``: its tasks import TensorFlow in the reused PySpark Python worker itself and run
  ``fn`` inside their own strategy scope. ``fn`` (:func:`train_fn`) builds our model (models registry,
  ``compile_model`` with ours' recipe) and our pipeline (``pipeline.train_dataset``, the rank's shards, the
  same files ours assigns) and calls ``fit`` for the same steps. No evaluation. Left out, with a sentence
  saying how to install it, when the package is missing.
* **plain**: two ``python`` processes started with :mod:`subprocess`, each with a hand-written
  ``TF_CONFIG`` (two free localhost ports), running the same ``fn`` under their own
  MultiWorkerMirroredStrategy: the floor of what any launcher can do (no Spark at all).

Cold and warm: each repetition of ours and of the peer is a fresh driver process (a child of this script:
new SparkSession, JVM and Python workers) that runs the job twice: the first job is **cold**, the second
(same session) **warm**, right after the first. The SparkSession start itself is timed apart and is in neither. The plain processes
are fresh each time, so plain has one kind, compared with both. Repetitions alternate the order of the
variants (ours, peer, plain, then plain, peer, ours, ...) so drifting load hits them alike.

The markers (``time.time()`` on one machine, all processes):

* **call**: just before ``train(...)``, ``MirroredStrategyRunner(...).run(fn)``, or the first ``Popen``.
* **first step**: the end of the first training batch, a tf_keras callback's ``on_train_batch_end`` of
  batch 0, on the LAST worker to finish it. In ``fn`` that is its own callback; in ours it is the same hook
  of the step watchdog callback every fit of ours carries (``StepWatchdog.on_train_batch_end``), observed by
  a probe (below). Log lines are not used: ours' first line after the first step is the epoch's line.
* **whole job**: the call until it returns on the driver (plain: until both processes have exited).

The probe: a ``sitecustomize.py`` written into the run's folder, put on ``PYTHONPATH`` of every child and
active only with ``SPARK_IMAGENET_LAUNCH_PROBE`` set; every Python process of a job (driver, PySpark
workers, the fork server, TensorFlow workers) appends timestamped events to one file: interpreter start,
``import tensorflow`` start and end, MultiWorkerMirroredStrategy's set-up (its ``CollectiveAllReduceExtended``
constructor), the models' ``build_model`` (registry) and ``compile_model`` (compile), ours' task functions (``_stage``,
``rendezvous``, ``_run_worker``) and the watchdog callback's fit / first batch / evaluation hooks. It only
wraps those functions to write one line each; it changes nothing they do. Each event of a job is taken on
the last process to reach it, the TensorFlow workers' events only from the processes that trained in that
job, so the fork server's import, in a process that never trains, is in no job's breakdown: a cold job shows it
as the gap before ``strategy start``. The breakdown records order a variant's events by their median time and
give, per repetition, the gap from the latest earlier event to each event (0 where it overlapped the one
before), so the gaps add up to the call-to-first-step time.

A loaded shared machine skews the comparison: with the kernel's autogroup scheduling
(``/proc/sys/kernel/sched_autogroup_enabled``) every session gets an equal share of the CPUs, and ours'
fork server runs each TensorFlow process in a session of its own (so do the plain workers here), while the
peer imports and trains inside PySpark's Python workers, in the driver's session. Under load the peer then
gets less CPU than ours; on a quiet machine this plays no part. Each record's params hold the 1-minute load
after each repetition.

Records (``--json``, benchmarks/common.py): ``{ours,peer} {cold,warm}: call to first step`` and ``...: whole
job``, ``plain: call to first step`` / ``plain: whole job``, the per-repetition ratios ``ours/peer
{cold,warm}: ...`` and ``ours/plain {cold,warm}: ...`` (ours' time divided by the other's: above 1 = ours is
slower), ``{ours,peer}: SparkSession start (outside the timings)``, and the breakdown ``VARIANT KIND:
breakdown: EVENT to EVENT`` (kind measured, seconds).

Goal (issue 42): ours/peer cold and warm each <= 1.1, first step and whole job.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import Report, add_options, repetitions  # noqa: E402

VARIANTS = ("ours", "peer", "plain")
#: --quick's variants without --variants: the peer's child (its own SparkSession and two jobs, about 28 s on
#: this machine) would take --quick over a minute (about 80 s with all three).
QUICK_VARIANTS = ("ours", "plain")
#: The job of a full run and of --quick: the synthetic tree (classes x train / val images per class) and the
#: per-worker batch; steps per epoch = train images // (batch x 2 workers).
FULL = {"classes": 5, "train_per_class": 12, "val_per_class": 6, "batch_size": 4}  # 7 steps, 30 val images
QUICK = {"classes": 4, "train_per_class": 4, "val_per_class": 2, "batch_size": 4}  # 2 steps, 8 val images
#: The training settings every variant uses (ours through TrainConfig; fn through the same registry calls).
SETTINGS = {"model": "alexnet", "image_size": 72, "width": 0.25, "learning_rate": 0.01, "lr_schedule": "constant",
            "warmup_epochs": 0.0, "epochs": 1}
WORKERS = 2
PEER = "spark-tensorflow-distributor"
PEER_INSTALL = "pip install --no-deps spark-tensorflow-distributor==1.0.0"
PROBE_ENV = "SPARK_IMAGENET_LAUNCH_PROBE"
RESULT_PREFIX = "LAUNCH-RESULT "
#: Seconds one child (a driver running two jobs) may take before it counts as hung.
CHILD_TIMEOUT_S = 600
#: The probe's events in their usual order: the breakdown orders a variant's events by their median time and
#: uses this order only between events of equal median.
EVENTS = ("call", "planned", "checked", "submitted", "task started", "shards staged", "worker python start",
          "tensorflow import start", "rendezvous done", "run_worker called", "tensorflow imported",
          "strategy start", "strategy created", "model build start", "model built", "model compiled", "datasets start",
          "datasets built", "fit called", "fit start", "first step", "training done", "evaluation done", "returned")
#: Events of the TensorFlow worker processes: counted only from the processes that trained in the job (that
#: reached its first step), not from the fork server (which imports TensorFlow and never trains).
WORKER_EVENTS = {"worker python start", "tensorflow import start", "tensorflow imported", "strategy start",
                 "strategy created", "model build start", "model built", "model compiled", "datasets start",
                 "datasets built", "fit called", "fit start", "first step", "training done", "evaluation done"}

PROBE = r'''"""Written by benchmarks/launch.py: a job's launch events (active with $SPARK_IMAGENET_LAUNCH_PROBE).

Every event is one JSON line {"t": time.time(), "pid", "event"} appended to the file the variable names. The
hooks only wrap functions to write a line before or after them; they change nothing those functions do.
"""
import os
import sys
import time

PATH = os.environ.get("SPARK_IMAGENET_LAUNCH_PROBE")


def mark(event, **extra):
    if not PATH:
        return
    import json

    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **extra}) + "\n"
    fd = os.open(PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def wrap(owner, name, before=None, after=None, when=None):
    import functools

    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        on = when is None or when(*args, **kwargs)
        if before and on:
            mark(before)
        try:
            return original(*args, **kwargs)
        finally:
            if after and on:
                mark(after)

    setattr(owner, name, wrapper)


def _tensorflow(module):
    from tensorflow.python.distribute import collective_all_reduce_strategy as c

    wrap(c.CollectiveAllReduceExtended, "__init__", "strategy start", "strategy created")


def _task(module):
    wrap(module, "_stage", "task started", "shards staged")
    wrap(module, "_run_worker", "run_worker called")


def _watchdog(module):
    cls = module.StepWatchdog
    wrap(cls, "on_train_begin", "fit start")
    wrap(cls, "on_train_batch_end", None, "first step", when=lambda self, batch, logs=None: batch == 0)
    wrap(cls, "on_train_end", None, "training done")
    wrap(cls, "on_test_end", None, "evaluation done")


def _registry(module):
    wrap(module, "build_model", "model build start", "model built")


def _compile(module):
    wrap(module, "compile_model", None, "model compiled")


def _training(module):
    wrap(module, "_datasets", "datasets start", "datasets built")
    wrap(module, "_fit", "fit called")


HOOKS = {
    "spark_imagenet.training.worker.training": (None, None, _training),
    "tensorflow": ("tensorflow import start", "tensorflow imported", _tensorflow),
    "spark_imagenet.training.task.barrier_task": (None, None, _task),
    "spark_imagenet.training.task.rendezvous": (None, None, lambda m: wrap(m, "rendezvous", None, "rendezvous done")),
    "spark_imagenet.training.worker.watchdog": (None, None, _watchdog),
    "spark_imagenet.training.worker.models.registry": (None, None, _registry),
    "spark_imagenet.training.worker.models.compile": (None, None, _compile),
}


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name not in HOOKS:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        before, after, patch = HOOKS[name]
        run = spec.loader.exec_module

        def exec_module(module):
            if before:
                mark(before)
            run(module)
            if after:
                mark(after)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if PATH:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            _cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:400]
    except OSError:
        _cmd = ""
    mark("python start", cmd=_cmd)
    sys.meta_path.insert(0, _Finder())
'''


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=None,
                   help="folder for the temporary dataset, caches and probe files (default: a new temporary "
                        "folder); what this run writes there is removed at the end")
    p.add_argument("--variants", default=None,
                   help="comma-separated subset of ours,peer,plain, with ours (default: all three; with --quick "
                        "ours,plain, which keeps it under a minute)")
    p.add_argument("--_child", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--_worker", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--_job", type=Path, default=None, help=argparse.SUPPRESS)
    add_options(p, reps=5, quick_reps=1)
    args = p.parse_args(argv)
    if args.variants is None:
        args.variants = ",".join(QUICK_VARIANTS if args.quick else VARIANTS)
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or "ours" not in chosen:
        p.error(f"--variants {args.variants}: give ours and any of peer, plain (comma-separated)")
    args.variants = [v for v in VARIANTS if v in chosen]
    return args


# ------------------------------------------------------------------ the job and fn (peer and plain)
def train_fn(job: dict[str, Any]) -> dict[str, Any]:
    """The training function of the peer and of the plain processes: our model and pipeline, ``fit``.

    Inside the peer's strategy scope it uses that strategy; otherwise (plain) it builds its own
    MultiWorkerMirroredStrategy from ``TF_CONFIG``. Writes the probe's ``fit start``, ``first step`` and
    ``training done`` events to ``job["marks"]``. Self-contained (imports inside): the peer pickles it.
    """
    import contextlib
    import json
    import os
    import time

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

    def mark(event: str) -> None:
        line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event}) + "\n"
        fd = os.open(job["marks"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    import tensorflow as tf
    import tf_keras as keras

    from spark_imagenet.training.worker import pipeline
    from spark_imagenet.training.worker.models.compile import float32_logits
    from spark_imagenet.training.worker.models.compile import compile_model
    from spark_imagenet.training.worker.models.registry import build_model

    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if tf.distribute.has_strategy():  # the peer's own scope
        strategy, scope = tf.distribute.get_strategy(), contextlib.nullcontext()
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        scope = strategy.scope()

    class FirstStep(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            mark("fit start")

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                mark("first step")

        def on_train_end(self, logs=None):
            mark("training done")

    with scope:
        model = float32_logits(build_model(job["model"], job["num_classes"], job["image_size"], job["width"]))
        compile_model(model, job["learning_rate"], optimizer=job["optimizer"], momentum=job["momentum"],
                      weight_decay=job["weight_decay"], label_smoothing=job["label_smoothing"])
    files, global_batch, steps = job["files"][rank], job["batch_size"] * job["workers"], job["steps"]

    def dataset_fn(ctx):  # as ours' worker: one batch per replica and step, this worker's files only
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        return pipeline.train_dataset(files, per_replica, job["image_size"], job["parallel"], seed=job["seed"],
                                      records_per_epoch=steps * per_replica, epochs=1)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    history = model.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=[FirstStep()], verbose=0)
    return {"rank": rank, "loss": float(history.history["loss"][-1])}


def build_dataset(root: Path, quick: bool) -> tuple[Path, dict[str, Any]]:
    """The synthetic Kaggle tree and its shards (2 train, 1 val) under ``root``; returns (dataset, sizes)."""
    from spark_imagenet.dataset.sharding import shard
    from spark_imagenet.demo.synthetic import generate_kaggle_layout

    size = QUICK if quick else FULL
    tree = generate_kaggle_layout(root / "kaggle", num_classes=size["classes"],
                                  train_per_class=size["train_per_class"], val_per_class=size["val_per_class"],
                                  test_images=0, size=(64, 48), seed=1)
    out = root / "dataset"
    shard(tree, out, train_shards=2, val_shards=1, processes=1, progress=False)
    return out, size


def fn_job(dataset: Path, size: dict[str, Any], marks: Path) -> dict[str, Any]:
    """What :func:`train_fn` is given: ours' settings (the recipe TrainConfig resolves) and the shards ours
    assigns to each rank (:func:`~spark_imagenet.training.job.assignment.assign`)."""
    from spark_imagenet.dataset.manifest import Manifest
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.job.assignment import assign

    config = train_config(size, None)
    manifest = Manifest.load(open_storage(str(dataset)))
    plan = assign(manifest, WORKERS, config.recipe.batch_size)
    return {"model": config.recipe.model, "num_classes": manifest.num_classes, "image_size": config.recipe.image_size,
            "width": config.recipe.width, "learning_rate": config.recipe.learning_rate, "optimizer": config.recipe.optimizer,
            "momentum": config.recipe.momentum, "weight_decay": config.recipe.weight_decay,
            "label_smoothing": config.recipe.label_smoothing, "batch_size": config.recipe.batch_size, "workers": WORKERS,
            "steps": plan.steps_per_epoch, "parallel": 1, "seed": config.data.seed, "marks": str(marks),
            "files": [[str(dataset / s.name) for s in w.train_shards] for w in plan.workers],
            "val_images": plan.val_examples_total}


def train_config(size: dict[str, Any], cache: Path | None):
    """Ours' TrainConfig of the job (2 workers, 1 epoch, SETTINGS, the batch of ``size``)."""
    from spark_imagenet.training.job.config import TrainConfig

    return TrainConfig.from_mapping({**SETTINGS, "workers": WORKERS, "batch_size": size["batch_size"],
                                     **({"cache": str(cache)} if cache else {})}, "benchmarks/launch.py")


# ------------------------------------------------------------------ the children
def read_marks(path: Path, start: float, end: float) -> dict[str, float]:
    """The latest time of each event in ``[start, end]``, relative to ``start``. Events of TensorFlow worker
    processes (:data:`WORKER_EVENTS`; a ``python start`` there is ``worker python start``) count only from the
    processes that reached the job's first step; an event before the call (the fork server's import, done
    before a warm job) is not in the job's breakdown."""
    marks = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            marks.append(json.loads(line))
        except ValueError:
            continue
    inside = [m for m in marks if start <= m["t"] <= end]
    trained = {m["pid"] for m in inside if m["event"] == "first step"}
    latest: dict[str, float] = {}
    for m in inside:
        event = "worker python start" if m["event"] == "python start" else m["event"]
        if event in WORKER_EVENTS and m["pid"] not in trained:
            continue
        latest[event] = max(latest.get(event, 0.0), m["t"] - start)
    return latest


def run_ours(spark, job: dict[str, Any], marks: Path, probe) -> dict[str, Any]:
    """One job of ours: ``driver.train``; its call-to-first-step and whole-job seconds and its events."""
    from spark_imagenet.logs import collect
    from spark_imagenet.training.driver import launch as driver

    if not getattr(driver, "_launch_bench_patched", False):  # the driver-side events (once per process)
        probe.wrap(driver, "plan_job", None, "planned")
        probe.wrap(driver, "check_job", None, "checked")
        probe.wrap(driver, "_launch", "submitted")
        driver._launch_bench_patched = True
    config = train_config(job["size"], Path(job["cache"]))
    start = time.time()
    with collect():  # the job's lines are not printed
        result = driver.train(spark, job["dataset"], config)
    end = time.time()
    events = read_marks(marks, start, end)
    return {"events": events, "whole": end - start, "val_images": result.val.images,
            "steps": result.config.get("steps_per_epoch")}


def run_peer(job: dict[str, Any], marks: Path) -> dict[str, Any]:
    """One job of the peer: ``MirroredStrategyRunner(num_slots=2, local_mode=False, use_gpu=False).run(fn)``."""
    from spark_tensorflow_distributor import MirroredStrategyRunner

    start = time.time()
    MirroredStrategyRunner(num_slots=WORKERS, local_mode=False, use_gpu=False).run(train_fn, job=job)
    end = time.time()
    return {"events": read_marks(marks, start, end), "whole": end - start}


def free_ports(count: int) -> list[int]:
    """``count`` distinct free localhost ports (bound to port 0, then released)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def run_plain(job_file: Path, marks: Path) -> dict[str, Any]:
    """One job of plain: two fresh ``python launch.py --_worker`` processes with hand-written TF_CONFIG."""
    ports = free_ports(WORKERS)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    start = time.time()
    procs = []
    for rank in range(WORKERS):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})}
        # a session of its own, as ours' fork server gives its TensorFlow worker: with the kernel's autogroup
        # scheduling a loaded machine then shares the CPUs between them as between ours' workers
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--_worker", str(job_file)],
                                      env=env, start_new_session=True))
    try:
        while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
            time.sleep(0.02)
        codes = [p.poll() for p in procs]
    finally:
        for p in procs:  # a failed or interrupted peer leaves the other waiting for it
            if p.poll() is None:
                p.kill()
                p.wait()
    end = time.time()
    if any(codes):
        raise RuntimeError(f"a plain worker process exited {codes}")
    return {"events": read_marks(marks, start, end), "whole": end - start}


def child(args) -> int:
    """A --_child: one fresh driver process running the variant's job twice (plain: once); prints the result."""
    job = json.loads(args._job.read_text())
    marks = Path(os.environ[PROBE_ENV])
    import sitecustomize as probe  # the probe written by the parent (on PYTHONPATH)

    out: dict[str, Any] = {"variant": args._child, "jobs": []}
    if args._child == "plain":
        out["jobs"].append(run_plain(args._job, marks))
    else:
        from spark_imagenet.training.driver.spark_session import local_session

        t = time.time()
        spark = local_session("local[2]", app_name=f"launch-benchmark-{args._child}",
                              conf={"spark.ui.enabled": "false"})
        out["session_s"] = time.time() - t
        try:
            for n in range(2):  # cold, then warm in the same session
                out["jobs"].append(run_ours(spark, job, marks, probe) if args._child == "ours"
                                   else run_peer(job["fn"], marks))
        finally:
            spark.stop()
    print(RESULT_PREFIX + json.dumps(out), flush=True)
    return 0


def worker(job_file: Path) -> int:
    """A --_worker (plain): run :func:`train_fn` once in this fresh process."""
    train_fn(json.loads(job_file.read_text())["fn"])
    return 0


# ------------------------------------------------------------------ the parent
def child_env(run: Path, marks: Path) -> dict[str, str]:
    """A child's environment: the probe first on PYTHONPATH and active, Keras 2 for TensorFlow."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(run / "probe")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[PROBE_ENV] = str(marks)
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


class ChildFailed(Exception):
    """A child run failed; the message says which and shows its last output lines."""


def run_child(variant: str, rep: int, run: Path, dataset: Path, size: dict[str, Any], fn: dict[str, Any]
              ) -> dict[str, Any]:
    """Run one ``--_child VARIANT`` in a folder of its own (marks, job file, a fresh shard cache); its result."""
    folder = run / f"{variant}-{rep}"
    folder.mkdir()
    marks = folder / "marks.jsonl"
    job = {"dataset": str(dataset), "size": size, "cache": str(folder / "cache"), "fn": {**fn, "marks": str(marks)}}
    (folder / "job.json").write_text(json.dumps(job))
    argv = [sys.executable, str(Path(__file__).resolve()), "--_child", variant, "--_job", str(folder / "job.json")]
    try:
        proc = subprocess.run(argv, cwd=REPO, env=child_env(run, marks), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"the {variant} run of repetition {rep + 1} took over {CHILD_TIMEOUT_S} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(f"  | {ln}" for ln in (proc.stderr + proc.stdout).splitlines()[-30:])
        raise ChildFailed(f"the {variant} run of repetition {rep + 1} exited {proc.returncode}"
                          f"{'' if lines else ' without a result'}; its last output lines:\n{tail}")
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    result["load_1min"] = load_1min()
    for i, one in enumerate(result["jobs"]):
        if "first step" not in one["events"]:
            raise ChildFailed(f"the {variant} run of repetition {rep + 1}: job {i + 1} recorded no first step "
                              f"(events: {sorted(one['events'])}; probe file {marks})")
    return result


def load_1min() -> float | None:
    """``/proc/loadavg``'s 1-minute load now (after a child: mostly the load during its run), or None."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def kinds(variant: str) -> tuple[str, ...]:
    """The kinds of a variant's jobs: cold and warm (a driver's first and second job), plain's one."""
    return ("",) if variant == "plain" else ("cold", "warm")


def label(variant: str, kind: str) -> str:
    return f"{variant} {kind}" if kind else variant


def record_times(report: Report, results: dict[str, list[dict]], base: dict[str, Any]) -> dict[tuple, dict]:
    """The call-to-first-step and whole-job records of every variant and kind (with the machine's load after
    each repetition: the machine is shared); returns their series."""
    series: dict[tuple, dict] = {}
    for variant, runs in results.items():
        for i, kind in enumerate(kinds(variant)):
            jobs = [run["jobs"][i] for run in runs]
            s = series[variant, kind] = {"first step": [j["events"]["first step"] for j in jobs],
                                         "whole job": [j["whole"] for j in jobs]}
            what = ("fresh processes every time: one kind, compared with ours' cold and warm" if variant == "plain"
                    else "the first job of a fresh driver process (new SparkSession, JVM, Python workers)"
                    if kind == "cold" else "the second job in the same SparkSession")
            params = dict(base, load_1min_after_each_rep=[run["load_1min"] for run in runs])
            report.add(f"{label(variant, kind)}: call to first step", "s", s["first step"], **params, job=what,
                       marker="end of the first training batch (on_train_batch_end of batch 0), last worker")
            report.add(f"{label(variant, kind)}: whole job", "s", s["whole job"], **params, job=what,
                       marker="call until it returns on the driver" + (" (both processes exited)"
                                                                       if variant == "plain" else ""))
        if variant != "plain":
            report.add(f"{variant}: SparkSession start (outside the timings)", "s",
                       [run["session_s"] for run in runs], **base)
    return series


def record_ratios(report: Report, series: dict[tuple, dict], params: dict[str, Any]) -> None:
    """ours / peer and ours / plain, cold and warm, first step and whole job (per-repetition ratios)."""
    for other in ("peer", "plain"):
        if (other, kinds(other)[0]) not in series:
            continue
        for kind in ("cold", "warm"):
            for metric in ("first step", "whole job"):
                name = "call to first step" if metric == "first step" else "whole job"
                goal = {"cold": 1.0, "warm": 1.5}[kind] if other == "peer" else None
                report.ratio(f"ours/{other} {kind}: {name}", series["ours", kind][metric],
                             series[other, "" if other == "plain" else kind][metric], **params,
                             meaning=f"ours' seconds / {other}'s, paired by repetition; above 1: ours is slower",
                             **({"goal_at_most": goal} if goal else {}))


def breakdown_order(events: list[dict[str, float]]) -> list[str]:
    """The events every repetition has, by median time (ties: :data:`EVENTS`' order)."""
    names = [n for n in events[0] if all(n in e for e in events)]
    rank = {n: i for i, n in enumerate(EVENTS)}
    return sorted(names, key=lambda n: (statistics.median(e[n] for e in events), rank.get(n, len(EVENTS))))


def record_breakdown(report: Report, results: dict[str, list[dict]], params: dict[str, Any]) -> None:
    """The breakdown of each variant and kind: its events by median time; in each repetition, each event's
    time as the latest of it and the events before it in that order, and the gaps between consecutive
    events. So the gaps add up to the call-to-first-step time; a gap is 0 where that event came earlier in a
    repetition (it overlapped the one before)."""
    for variant, runs in results.items():
        for i, kind in enumerate(kinds(variant)):
            events = [dict(run["jobs"][i]["events"], call=0.0, returned=run["jobs"][i]["whole"]) for run in runs]
            order = breakdown_order(events)
            gaps: dict[str, list[float]] = {}
            for e in events:
                reached = 0.0
                for a, b in zip(order, order[1:]):
                    later = max(reached, e[b])
                    gaps.setdefault(f"{a} to {b}", []).append(later - reached)
                    reached = later
            for name, values in gaps.items():
                report.add(f"{label(variant, kind)}: breakdown: {name}", "s", values, **params,
                           events="each event on the last process to reach it (the probe of benchmarks/launch.py); "
                                  "the events by median time; each gap from the latest earlier event")


def job_params(args, size: dict[str, Any], fn: dict[str, Any], variants: list[str]) -> dict[str, Any]:
    """The params every record carries."""
    return {"master": "local[2]", "workers": WORKERS, "model": SETTINGS["model"], "width": SETTINGS["width"],
            "image_size": SETTINGS["image_size"], "batch_size_per_worker": size["batch_size"], "epochs": 1,
            "steps": fn["steps"], "train_images": size["classes"] * size["train_per_class"],
            "val_images": fn["val_images"], "ours_evaluates_val": True, "variants": variants,
            "order": "repetitions alternate " + ",".join(variants) + " / " + ",".join(reversed(variants)),
            "peer": "spark-tensorflow-distributor 1.0.0 MirroredStrategyRunner(num_slots=2, local_mode=False, "
                    "use_gpu=False)", "plain": "2 subprocesses with hand-written TF_CONFIG (localhost ports)"}


def run_benchmark(args) -> int:
    """The parent: build the dataset, run the children alternating, record everything."""
    reps = repetitions(args)
    variants = list(args.variants)
    if "peer" in variants and importlib.util.find_spec("spark_tensorflow_distributor") is None:
        print(f"benchmarks/launch.py: the peer ({PEER} 1.0.0) is not installed, so it is left out of the "
              f"records; install it with `{PEER_INSTALL}`", file=sys.stderr)
        variants.remove("peer")
    if args.root is not None and args.root.exists() and not args.root.is_dir():
        print(f"benchmarks/launch.py: --root {args.root} is not a folder; give a folder (it is created if "
              "missing) or leave --root out for a temporary one", file=sys.stderr)
        return 2
    if args.root is not None:
        args.root.mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="launch-benchmark-", dir=args.root))
    try:
        report = Report("launch", args, extra_versions=(PEER,))
        (run / "probe").mkdir()
        (run / "probe" / "sitecustomize.py").write_text(PROBE)
        dataset, size = build_dataset(run, args.quick)
        fn = fn_job(dataset, size, run / "unused")
        report.say(f"launch: {WORKERS} workers on local[2], {fn['steps']} step(s), batch {size['batch_size']}, "
                   f"{fn['val_images']} val images (ours evaluates them); {reps} repetition(s) of "
                   f"{', '.join(variants)}" + (" (--quick leaves the peer out; --variants ours,peer,plain adds it)"
                                               if args.quick and "peer" not in args.variants else ""))
        results: dict[str, list[dict]] = {v: [] for v in variants}
        for rep in range(reps):
            for variant in variants if rep % 2 == 0 else variants[::-1]:
                t = time.monotonic()
                results[variant].append(run_child(variant, rep, run, dataset, size, fn))
                report.say(f"  repetition {rep + 1}: {variant} done in {time.monotonic() - t:.1f} s")
        params = job_params(args, size, fn, variants)
        series = record_times(report, results, params)
        record_ratios(report, series, params)
        record_breakdown(report, results, params)
        report.close()
    except ChildFailed as e:
        print(f"benchmarks/launch.py: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(run, ignore_errors=True)
    return 0


def main(argv=None) -> int:
    """Run the benchmark (or, with the hidden options, one child or one plain worker)."""
    args = parse_args(argv)
    if args._worker is not None:
        return worker(args._worker)
    if args._child is not None:
        return child(args)
    return run_benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
