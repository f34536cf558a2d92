"""The TensorFlow child process of one barrier task: one MWMS worker.

Usage::

    python -m spark_imagenet.training.worker CONFIG_JSON RESULT_JSON

The barrier task starts this in a fresh process (a Python worker that already
ran one MultiWorkerMirroredStrategy job cannot configure collectives again,
tensorflow#34568) with ``TF_CONFIG`` naming every worker, and
``TF_USE_LEGACY_KERAS=1`` / ``TF_CPP_MIN_LOG_LEVEL=2`` (this module sets those
two as defaults too, before TensorFlow is imported). Without ``TF_CONFIG``
the strategy has one worker, which tests use.

CONFIG_JSON (see contracts.md; every key required unless marked optional)::

    {"rank": 0, "workers": 4,
     "train_files": [...], "train_examples": 150,
     "val_files": [...], "val_record_shard": [4, 0] or null, "val_examples": 75,
     "steps_per_epoch": 9, "val_steps": 3,
     "num_classes": 100, "model": "alexnet", "epochs": 2, "batch_size": 16,
     "image_size": 96, "width": 0.25, "learning_rate": 0.01, "parallel": 2,
     "seed": 0, "threads": 1,
     "val_examples_total": 300,          # optional, checked if present
     "startup_timeout_s": 600}           # optional (default 600; 0 = wait forever)

``batch_size`` is per worker; ``steps_per_epoch`` and ``val_steps`` must be
equal on every worker (checked: the workers exchange their settings with one
all-gather right after the strategy is built, and fail with a clear
:class:`TrainingError` instead of hanging in a collective).

What one run does: threading from ``threads`` (intra- and inter-op pools;
0/null = TensorFlow's default), ``MultiWorkerMirroredStrategy()``, datasets
through ``strategy.distribute_datasets_from_function`` with
:func:`spark_imagenet.training.pipeline.train_dataset` / ``eval_dataset`` (each worker
reads only its own files), model built and compiled inside
``strategy.scope()``, ``fit(epochs, steps_per_epoch, verbose=2)``, then
``evaluate(steps=val_steps)`` on ``(image, label, weight)`` batches whose
zero-weight padding rows do not count, so the metrics are exact over the
real validation examples of all workers.

RESULT_JSON::

    {"rank": 0, "workers": 4, "replicas_in_sync": 4,
     "train_examples": 150,        # examples in this worker's train shards (from the config)
     "train_images": 288,          # images this worker trained on = steps * batch_size
     "steps": 18,                  # epochs * steps_per_epoch
     "batch_size": 16, "epochs": 2,
     "images_per_sec": 12.3,       # see "Throughput" below
     "timed_epochs": 1, "epoch_seconds": [14.2, 11.7], "train_seconds": 26.0,
     "train_loss": 4.1,            # last epoch's mean cross-entropy ("xent"), no weight decay
     "train_top1": 0.05,           # last epoch's top-1 accuracy (all workers)
     "val": {"images": 300, "top1": 0.2, "top5": 0.5, "loss": 3.9},
     "eval_seconds": 3.2,
     "history": {"loss": [...], "top1": [...], "top5": [...], "xent": [...]},
     "params": 1361252}

Throughput: ``images_per_sec`` = images this worker trained on in the timed
epochs / wall seconds of those epochs (Keras ``on_epoch_begin`` to
``on_epoch_end``). With more than one epoch the first epoch is left out: it
includes tracing the training function, the first collective handshakes and
filling the input pipeline. With one epoch that epoch is timed (warm-up
included). Training is synchronous, so each worker's rate is about the global
rate divided by the number of workers. ``train_seconds`` is the wall time of
the whole ``fit`` call.

Losses: ``train_loss`` and ``val.loss`` are the mean cross-entropy per example
(metric ``xent``) without the weight-decay term, so they compare with each
other; ``history["loss"]`` is Keras' training objective including weight
decay. All metrics are summed over the workers by the strategy (global).

On failure the process prints one line to stderr,
``replica rank R failed while STAGE: ExceptionType: message`` (a
:class:`SparkImagenetError` message is printed whole) and exits with status 1;
no RESULT_JSON is written. Data errors inside ``fit``/``evaluate`` are
translated by :func:`spark_imagenet.training.pipeline.naming_bad_records` into an
error naming the shard file and record.

Waiting for the other workers: building the strategy blocks until every
worker in TF_CONFIG is up (measured: a lone worker of two waited more than
10 minutes), holding the GIL, and with TF_CONFIG set TensorFlow installs
its own SIGTERM handler (measured: SIGTERM left the waiting process running;
presumably its preemption notifier), so neither a Python timer nor SIGTERM
ends it. A :mod:`faulthandler` watchdog (a C
thread) therefore ends the process after ``startup_timeout_s`` seconds with
status 1, printing ``Timeout (h:mm:ss)!`` and the Python stack (showing
``MultiWorkerMirroredStrategy``) to stderr, after the stdout line
``strategy: waiting for N worker(s) ...``. Parents should end a replica with
SIGKILL.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from typing import Any, Callable

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from spark_imagenet.errors import ConfigError, SparkImagenetError, TrainingError  # noqa: E402

#: Config keys and the Python types they must have (bool excluded from int).
_INT_KEYS = (
    "rank",
    "workers",
    "train_examples",
    "val_examples",
    "steps_per_epoch",
    "val_steps",
    "num_classes",
    "epochs",
    "batch_size",
    "image_size",
    "parallel",
)
_NUMBER_KEYS = ("width", "learning_rate")
_REQUIRED_KEYS = _INT_KEYS + _NUMBER_KEYS + (
    "train_files",
    "val_files",
    "val_record_shard",
    "model",
    "seed",
    "threads",
)

#: Settings every worker must agree on (order matters: it is the all-gather layout).
_SHARED_KEYS = ("workers", "steps_per_epoch", "val_steps", "epochs", "batch_size", "image_size", "num_classes")

#: Default limit (seconds) on waiting for the other workers while building the
#: strategy (config key ``startup_timeout_s``; 0 = no limit).
DEFAULT_STARTUP_TIMEOUT_S = 600

# Stages reported in the failure line.
STAGE_CONFIG = "reading the config"
STAGE_STRATEGY = "building the strategy"
STAGE_DATA = "reading data"
STAGE_MODEL = "building the model"
STAGE_FIT = "training (fit)"
STAGE_EVALUATE = "evaluating"
STAGE_RESULT = "writing the result"


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def validate_config(config: dict) -> dict:
    """Check a replica config and return a normalised copy.

    Args:
        config: the CONFIG_JSON object (see the module docstring).

    Returns:
        A new dict with the same keys; ``seed`` and ``threads`` may be None.

    Raises:
        ConfigError: a key is missing, has the wrong type or an impossible value
            (the message names the key and the value).
    """
    if not isinstance(config, dict):
        raise ConfigError(f"replica config must be a JSON object, got {type(config).__name__}")
    missing = [k for k in _REQUIRED_KEYS if k not in config]
    if missing:
        raise ConfigError(f"replica config is missing key(s): {', '.join(missing)}")
    cfg = dict(config)
    for key in _INT_KEYS:
        if not _is_int(cfg[key]):
            raise ConfigError(f"replica config key {key!r} must be an integer, got {cfg[key]!r}")
        cfg[key] = int(cfg[key])
    for key in _NUMBER_KEYS:
        if not (_is_int(cfg[key]) or isinstance(cfg[key], float)) or not cfg[key] > 0:
            raise ConfigError(f"replica config key {key!r} must be a positive number, got {cfg[key]!r}")
        cfg[key] = float(cfg[key])
    positive = ("workers", "steps_per_epoch", "num_classes", "epochs", "batch_size", "image_size", "parallel")
    for key in positive:
        if cfg[key] < 1:
            raise ConfigError(f"replica config key {key!r} must be at least 1, got {cfg[key]}")
    for key in ("train_examples", "val_examples", "val_steps"):
        if cfg[key] < 0:
            raise ConfigError(f"replica config key {key!r} must not be negative, got {cfg[key]}")
    if not 0 <= cfg["rank"] < cfg["workers"]:
        raise ConfigError(f"replica config: rank {cfg['rank']} is not in 0..workers-1 (workers = {cfg['workers']})")
    for key in ("train_files", "val_files"):
        files = cfg[key]
        if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
            raise ConfigError(f"replica config key {key!r} must be a list of file paths, got {files!r:.200}")
    if not cfg["train_files"]:
        raise ConfigError(f"replica config: rank {cfg['rank']} has no train_files; every worker needs its own shards")
    shard = cfg["val_record_shard"]
    if shard is not None:
        if not (isinstance(shard, (list, tuple)) and len(shard) == 2 and all(_is_int(v) for v in shard)
                and shard[0] >= 1 and 0 <= shard[1] < shard[0]):
            raise ConfigError(
                f"replica config key 'val_record_shard' must be null or [n, i] with 0 <= i < n, got {shard!r}"
            )
        cfg["val_record_shard"] = (int(shard[0]), int(shard[1]))
    if cfg["val_steps"] * cfg["batch_size"] < cfg["val_examples"]:
        raise ConfigError(
            f"replica config: val_steps {cfg['val_steps']} * batch_size {cfg['batch_size']} is less than this "
            f"worker's val_examples {cfg['val_examples']}; val_steps must be ceil(max val_examples / batch_size)"
        )
    if cfg["val_examples"] > 0 and not cfg["val_files"]:
        raise ConfigError(f"replica config: val_examples is {cfg['val_examples']} but val_files is empty")
    if not isinstance(cfg["model"], str):
        raise ConfigError(f"replica config key 'model' must be a string, got {cfg['model']!r}")
    for key in ("seed", "threads"):
        value = cfg[key]
        if value is not None and (not _is_int(value) or value < 0):
            raise ConfigError(f"replica config key {key!r} must be null or a non-negative integer, got {value!r}")
        cfg[key] = None if value is None else int(value)
    total = cfg.get("val_examples_total")
    if total is not None and (not _is_int(total) or total < 0):
        raise ConfigError(f"replica config key 'val_examples_total' must be a non-negative integer, got {total!r}")
    timeout = cfg.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S)
    if timeout is None:
        timeout = 0
    if not (_is_int(timeout) or isinstance(timeout, float)) or timeout < 0:
        raise ConfigError(f"replica config key 'startup_timeout_s' must be a non-negative number, got {timeout!r}")
    cfg["startup_timeout_s"] = float(timeout)
    return cfg


class _EpochTimer(keras.callbacks.Callback):
    """Records the wall seconds of each training epoch (``time.perf_counter``)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Start the clock of epoch ``epoch`` (0-based)."""
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Append the seconds since ``on_epoch_begin`` to :attr:`seconds`."""
        self.seconds.append(time.perf_counter() - self._start)


def _num_workers(strategy: tf.distribute.Strategy) -> int:
    """Number of workers (chief + workers) in the strategy's cluster (1 without TF_CONFIG)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    n = len(spec.get("chief", [])) + len(spec.get("worker", []))
    return max(1, n)


def _gather_worker_settings(strategy: tf.distribute.Strategy, cfg: dict) -> dict[int, dict[str, int]]:
    """All-gather every worker's rank, shared settings and example counts.

    One collective, run at the same point on every worker right after the
    strategy is built: it checks that all workers are reachable and lets each
    check the others' settings before anything can hang on a mismatch.

    Args:
        strategy: the MultiWorkerMirroredStrategy.
        cfg: this worker's validated config.

    Returns:
        ``{rank: {"train_examples", "val_examples", *_SHARED_KEYS}}`` for every
        worker (rows of a worker's several local replicas are merged).
    """
    keys = ("rank", "train_examples", "val_examples") + _SHARED_KEYS
    local = tf.constant([[cfg[k] for k in keys]], dtype=tf.int64)

    @tf.function
    def gather() -> Any:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_gather(local, axis=0))

    rows = strategy.experimental_local_results(gather())[0].numpy()
    return {int(row[0]): dict(zip(keys[1:], (int(v) for v in row[1:]))) for row in rows}


def _check_workers(cfg: dict, workers: dict[int, dict[str, int]]) -> int:
    """Check the gathered settings agree; return the total real val examples.

    Raises:
        TrainingError: ranks missing or duplicated, or a shared setting differs
            between workers (which would make the collectives hang).
    """
    if sorted(workers) != list(range(cfg["workers"])):
        raise TrainingError(
            f"the MWMS workers report ranks {sorted(workers)} but the config says workers = {cfg['workers']}: "
            f"each worker needs a distinct rank 0..{cfg['workers'] - 1}"
        )
    for key in _SHARED_KEYS:
        values = {rank: w[key] for rank, w in workers.items()}
        if len(set(values.values())) > 1:
            raise TrainingError(
                f"workers disagree on {key}: {values} (rank: value); every worker must use the same "
                f"{key} or the synchronous training hangs"
            )
    total = sum(w["val_examples"] for w in workers.values())
    given = cfg.get("val_examples_total")
    if given is not None and given != total:
        raise TrainingError(
            f"val_examples_total in the config is {given} but the workers' val_examples add up to {total}"
        )
    return total


def _check_files(files: list[str], what: str) -> None:
    """Raise TrainingError naming the first file in ``files`` that does not exist."""
    for path in files:
        if not tf.io.gfile.exists(path):
            raise TrainingError(f"{what} shard {path} does not exist on this worker; it should have been staged here")


def _no_autotune_on_device_datasets() -> bool:
    """Turn tf.data autotuning off on the per-device datasets of MultiWorkerMirroredStrategy.

    ``distribute_datasets_from_function`` feeds each device through a
    MultiDeviceIterator whose per-device datasets carry default options, so
    tf.data's autotune thread runs for them even though our pipeline disables
    autotuning. Destroying those iterators at the end of ``fit`` and
    ``evaluate`` then waits for that thread's current sleep: measured here, a
    20 s stall of a random rank in 8 of 10 runs of 4 workers x 8 epochs, which
    every other rank then waits out at the next collective. This wraps TF's
    private ``multi_device_iterator_ops._create_device_dataset`` (TF 2.21) to
    apply ``autotune.enabled = False``; where that function does not exist, it
    does nothing.

    Returns:
        bool: whether the wrapper is installed.
    """
    from tensorflow.python.data.ops import multi_device_iterator_ops as mdi

    create = getattr(mdi, "_create_device_dataset", None)
    if create is None or getattr(create, "_spark_imagenet", False):
        return create is not None

    def create_without_autotune(*args, **kwargs):
        options = tf.data.Options()
        options.autotune.enabled = False
        return create(*args, **kwargs).with_options(options)

    create_without_autotune._spark_imagenet = True
    mdi._create_device_dataset = create_without_autotune
    return True


def run_replica(config: dict, *, log: Callable[[str], None] | None = None, status: dict | None = None) -> dict:
    """Train and evaluate one MWMS worker; return its result dict.

    Must run in a process that has not built a distribution strategy before
    (collective ops are configured once per process). ``TF_CONFIG`` in the
    environment names the cluster; without it this is the only worker.

    Args:
        config: the replica config (see the module docstring).
        log: called with one progress line at a time; default: print to stdout
            and flush.
        status: optional dict; ``status["stage"]`` is kept set to the stage
            being run (one of the ``STAGE_*`` strings) so a caller can say where
            a failure happened.

    Returns:
        The RESULT_JSON object (see the module docstring).

    Raises:
        ConfigError: the config is invalid, or names an unknown model or
            impossible model settings.
        TrainingError: the workers disagree on shared settings, the cluster
            size differs from ``workers``, or a shard file is missing.
        tf.errors.OpError and others: from TensorFlow while reading data,
            training or evaluating (MWMS aborts a worker whose peer died).
    """
    if log is None:
        def log(line: str) -> None:
            print(line, flush=True)
    if status is None:
        status = {}

    status["stage"] = STAGE_CONFIG
    cfg = validate_config(config)
    # Imported here, not at the top, so that importing this module (e.g. for
    # validate_config) does not load tf_keras and the pipeline.
    from spark_imagenet.training import pipeline
    from spark_imagenet.training.models.registry import build_model, compile_model, get_builder

    get_builder(cfg["model"])  # an unknown model name fails here, before any collective

    threads = cfg["threads"]
    if threads:
        # Must happen before TensorFlow's runtime starts (before the strategy).
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    if cfg["seed"] is not None:
        # Per-worker seed (dropout, augmentation); the initial weights are
        # broadcast from the chief by MWMS, so they agree anyway.
        keras.utils.set_random_seed(cfg["seed"] + cfg["rank"])

    status["stage"] = STAGE_STRATEGY
    t0 = time.perf_counter()
    timeout = cfg["startup_timeout_s"]
    if cfg["workers"] > 1:
        limit = f"at most {timeout:g} s" if timeout > 0 else "no time limit"
        log(f"strategy: waiting for {cfg['workers']} worker(s) ({limit})")
    if timeout > 0:
        # A C-level watchdog: the strategy blocks holding the GIL (see the module docstring).
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.stderr)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        cluster_workers = _num_workers(strategy)
        if cluster_workers != cfg["workers"]:
            raise TrainingError(
                f"TF_CONFIG describes {cluster_workers} worker(s) but the replica config says "
                f"workers = {cfg['workers']}"
            )
        workers = _gather_worker_settings(strategy, cfg)
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()
    val_total = _check_workers(cfg, workers)
    replicas = strategy.num_replicas_in_sync
    log(
        f"strategy: {cluster_workers} worker(s), {replicas} replica(s) in sync, "
        f"{time.perf_counter() - t0:.1f} s; threads {threads or 'default'}"
    )

    status["stage"] = STAGE_DATA
    _check_files(cfg["train_files"], "train")
    _check_files(cfg["val_files"], "val")
    global_batch = cfg["batch_size"] * cfg["workers"]
    seed = None if cfg["seed"] is None else cfg["seed"] + cfg["rank"]

    def train_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return pipeline.train_dataset(
            list(cfg["train_files"]),
            ctx.get_per_replica_batch_size(global_batch),
            cfg["image_size"],
            cfg["parallel"],
            seed=seed,
        )

    def eval_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # Each local replica takes one batch per step from this worker's dataset.
        local_replicas = max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        return pipeline.eval_dataset(
            list(cfg["val_files"]),
            ctx.get_per_replica_batch_size(global_batch),
            cfg["image_size"],
            cfg["parallel"],
            record_shard=cfg["val_record_shard"],
            examples=cfg["val_examples"],
            steps=cfg["val_steps"] * local_replicas,
        )

    _no_autotune_on_device_datasets()
    input_options = None
    train_ds = strategy.distribute_datasets_from_function(train_fn, options=input_options)
    val_ds = (
        strategy.distribute_datasets_from_function(eval_fn, options=input_options) if cfg["val_steps"] > 0 else None
    )
    log(
        f"data: {len(cfg['train_files'])} train file(s), {cfg['train_examples']} examples; "
        f"{len(cfg['val_files'])} val file(s), {cfg['val_examples']} of {val_total} val examples; "
        f"batch {cfg['batch_size']}/worker, {cfg['image_size']} px"
    )

    status["stage"] = STAGE_MODEL
    with strategy.scope():
        model = build_model(cfg["model"], cfg["num_classes"], cfg["image_size"], cfg["width"])
        compile_model(model, cfg["learning_rate"])
    params = int(model.count_params())
    log(f"model: {cfg['model']} width {cfg['width']:g}, {params:,} parameters, {cfg['num_classes']} classes")

    status["stage"] = STAGE_FIT
    timer = _EpochTimer()
    t0 = time.perf_counter()
    with pipeline.naming_bad_records(cfg["train_files"], parallel=cfg["parallel"]):
        history = model.fit(
            train_ds,
            epochs=cfg["epochs"],
            steps_per_epoch=cfg["steps_per_epoch"],
            callbacks=[timer],
            verbose=2,
        )
    train_seconds = time.perf_counter() - t0
    steps = cfg["epochs"] * cfg["steps_per_epoch"]
    images_per_epoch = cfg["steps_per_epoch"] * cfg["batch_size"]
    timed = timer.seconds[1:] if len(timer.seconds) > 1 else timer.seconds
    images_per_sec = images_per_epoch * len(timed) / sum(timed) if timed and sum(timed) > 0 else 0.0
    hist = {k: [float(v) for v in vals] for k, vals in history.history.items()}
    log(
        f"train: {steps} steps, {steps * cfg['batch_size']} images in {train_seconds:.1f} s; "
        f"{images_per_sec:.1f} images/s on this worker over {len(timed)} epoch(s)"
        + (" (first epoch excluded)" if len(timer.seconds) > 1 else "")
    )

    status["stage"] = STAGE_EVALUATE
    val: dict[str, Any] = {"images": val_total, "top1": None, "top5": None, "loss": None}
    eval_seconds = 0.0
    if val_ds is not None:
        t0 = time.perf_counter()
        with pipeline.naming_bad_records(cfg["val_files"], parallel=cfg["parallel"]):
            scores = model.evaluate(val_ds, steps=cfg["val_steps"], return_dict=True, verbose=2)
        eval_seconds = time.perf_counter() - t0
        val.update(top1=float(scores["top1"]), top5=float(scores["top5"]), loss=float(scores["xent"]))
        log(
            f"val: {val_total} images, top1 {val['top1']:.4f}, top5 {val['top5']:.4f}, "
            f"loss {val['loss']:.4f} ({eval_seconds:.1f} s)"
        )
    else:
        log("val: no validation data (val_steps = 0)")

    return {
        "rank": cfg["rank"],
        "workers": cfg["workers"],
        "replicas_in_sync": int(replicas),
        "train_examples": cfg["train_examples"],
        "train_images": steps * cfg["batch_size"],
        "steps": steps,
        "batch_size": cfg["batch_size"],
        "epochs": cfg["epochs"],
        "images_per_sec": images_per_sec,
        "timed_epochs": len(timed),
        "epoch_seconds": timer.seconds,
        "train_seconds": train_seconds,
        "train_loss": hist["xent"][-1],
        "train_top1": hist["top1"][-1],
        "val": val,
        "eval_seconds": eval_seconds,
        "history": hist,
        "params": params,
    }


def _one_line(exc: BaseException) -> str:
    """A one-line description of ``exc`` for stderr.

    A :class:`SparkImagenetError` message is kept whole. Other messages keep
    their informative lines joined with " | " (at most 2000 characters):
    TensorFlow's "Graph execution error" header, the "Detected at node"
    Python stack and the ``[[{{node ...}}]]`` context are dropped. A
    collective aborted because a peer is gone gets a hint to look at the
    other workers' logs.
    """
    message = str(exc)
    if isinstance(exc, SparkImagenetError):
        return f"{type(exc).__name__}: {message}"
    skip = ("[[", "Executing op", "Graph execution error", "Detected at node", 'File "', "<stack traces unavailable>")
    lines = [ln.strip() for ln in message.splitlines()]
    message = " | ".join(ln for ln in lines if ln and not ln.startswith(skip))
    if len(message) > 2000:
        message = message[:2000] + " ..."
    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.DeadlineExceededError)):
        message += " (another worker probably failed or became unreachable: see the other workers' messages)"
    return f"{type(exc).__name__}: {message}"


def _write_json_atomic(path: str, obj: dict) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (``LocalStorage.write_bytes``)."""
    from spark_imagenet.storage import LocalStorage

    target = os.path.abspath(path)
    LocalStorage(os.path.dirname(target)).write_bytes(
        os.path.basename(target), (json.dumps(obj, indent=1) + "\n").encode("utf-8")
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``python -m spark_imagenet.training.worker CONFIG_JSON RESULT_JSON``.

    Returns:
        0 on success (RESULT_JSON written), 1 on any failure (one line on
        stderr, see the module docstring), 2 on wrong usage.
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m spark_imagenet.training.worker CONFIG_JSON RESULT_JSON", file=sys.stderr, flush=True)
        return 2
    config_path, result_path = argv
    status = {"stage": STAGE_CONFIG}
    rank: Any = "?"
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        if isinstance(config, dict):
            rank = config.get("rank", "?")
        result = run_replica(config, status=status)
        status["stage"] = STAGE_RESULT
        _write_json_atomic(result_path, result)
    except BaseException as exc:  # noqa: BLE001 - report everything, including KeyboardInterrupt
        print(f"replica rank {rank} failed while {status['stage']}: {_one_line(exc)}", file=sys.stderr, flush=True)
        if os.environ.get("SPARK_IMAGENET_DEBUG"):
            import traceback

            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.stdout.reconfigure(line_buffering=True)  # progress lines reach the parent as they happen
    except (AttributeError, ValueError):
        pass
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit without interpreter teardown: TensorFlow's gRPC server and the MWMS
    # health-check thread can block or crash a normal shutdown after training.
    os._exit(code)
