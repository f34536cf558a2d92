"""The training job's one configuration type, and the message each TensorFlow worker reads.

* :class:`TrainConfig`: every setting of a training job (what ``spark-imagenet
  train`` takes as options or as keys of a TOML job file, and what
  :func:`spark_imagenet.training.driver.train` takes as a config object).
  Validated once, when it is built.
* :class:`WorkerSpec`: what one TensorFlow worker process is told: the job's
  :class:`TrainConfig` plus that worker's rank, shard files and step counts.
  The worker process reads this and nothing else.

Both are frozen dataclasses serialised with ``to_json``/``from_json``, carrying
a format name and version like :class:`spark_imagenet.dataset.manifest.Manifest`.
Job files are read with :mod:`tomllib` and written with ``tomli_w``
(:func:`load_job_file`, :func:`dump_job`).

Job file (TOML), every key optional; the command line overrides the file::

    url = "gs://bucket/imagenet"      # the dataset (or give it on the command line)
    workers = 8
    epochs = 90
    batch_size = 128
    [conf]                            # extra Spark configuration
    "spark.executor.memory" = "8g"

``conf/job.example.toml`` lists every key with its default.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.schedules import KINDS as LR_KINDS, SCALINGS as LR_SCALINGS

JOB_FORMAT = "spark-imagenet-train-config"
JOB_FORMAT_VERSION = 1
WORKER_FORMAT = "spark-imagenet-worker-spec"
WORKER_FORMAT_VERSION = 1
#: Default limit, in seconds, on waiting for the other workers while the
#: strategy is built (0 = no limit).
DEFAULT_STARTUP_TIMEOUT_S = 600.0
#: The TensorFlow worker's exit status when ``--step-timeout`` passed without a finished step
#: (:mod:`spark_imagenet.training.watchdog`); its barrier task then raises WorkerLost.
EXIT_STEP_TIMEOUT = 3
#: ``--step-timeout``'s default, seconds: far above a real ImageNet step (under a second on a GPU, a few on
#: CPUs) and the first step's tracing, an epoch's evaluation and a checkpoint upload (docs/design.md, 'No hangs').
DEFAULT_STEP_TIMEOUT_S = 900.0
#: The largest seed TensorFlow and NumPy take (2**32 - 1).
MAX_SEED = 2**32 - 1
#: ``--strategy`` values (see :class:`TrainConfig`).
STRATEGIES = ("multiworker", "mirrored", "default")
#: ``--cross-device-ops`` values: MultiWorkerMirroredStrategy's communication (auto, nccl, ring) and
#: MirroredStrategy's cross_device_ops (nccl, reduction-to-one; auto = TensorFlow's choice).
CROSS_DEVICE_OPS = ("auto", "nccl", "ring", "reduction-to-one")
#: ``--optimizer`` values.
OPTIMIZERS = ("sgd", "lars")
#: ``--precision`` values: Keras mixed-precision policies (float16 with loss scaling).
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
#: The settings whose default is the model's recipe (:func:`spark_imagenet.training.models.specs.recipe_for`).
RECIPE_KEYS = ("learning_rate", "lr_schedule", "warmup_epochs", "lr_scaling", "momentum", "weight_decay",
               "label_smoothing")


# ------------------------------------------------------------- field rules
@dataclasses.dataclass(frozen=True)
class _Rule:
    """How one field is checked: its kind, bounds and the option that sets it."""

    kind: str  # "int", "float", "str", "bool", "path", "files", "pair", "conf"
    minimum: float | None = None
    positive: bool = False
    optional: bool = False
    option: str | None = None
    help: str = ""
    choices: tuple[str, ...] = ()  # for kind "str": the allowed values (empty = any)


def _setting(default: Any = dataclasses.MISSING, *, kind: str, help: str = "", minimum: float | None = None,
             positive: bool = False, optional: bool = False, option: str | None = None,
             choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field carrying its :class:`_Rule` in ``metadata["rule"]``."""
    rule = _Rule(kind, minimum, positive, optional, option, help, choices)
    return dataclasses.field(default=default, metadata={"rule": rule})


def _error(key: str, message: str) -> ConfigError:
    """A ConfigError about setting ``key`` (kept as ``.key``, so callers can say where the value came from)."""
    error = ConfigError(message)
    error.key = key
    return error


def _label(name: str, rule: _Rule) -> str:
    return f"{name} ({rule.option})" if rule.option else name


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bound(name: str, value: float, rule: _Rule, label: str, what: str) -> None:
    if rule.minimum is not None and value < rule.minimum:
        raise _error(name, f"{label} must be {what} >= {rule.minimum:g}, got {value!r}")


def _flat_conf(value: Any, label: str, name: str, prefix: str = "") -> list[tuple[str, str]]:
    """Spark settings as ``(key, value)`` pairs from a mapping or pairs; nested tables (TOML's
    unquoted dotted keys: ``spark.executor.memory = "4g"``) are joined with dots."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(i, (list, tuple)) and len(i) == 2 for i in value):
        items = [tuple(i) for i in value]
    else:
        raise _error(name, f"{label} must be a table of Spark settings (KEY = \"VALUE\"), got {value!r:.200}")
    pairs = []
    for key, val in items:
        if not isinstance(key, str) or not key.strip():
            raise _error(name, f"{label}: {key!r} is not a Spark setting name")
        full = f"{prefix}{key.strip()}"
        if isinstance(val, Mapping):
            pairs.extend(_flat_conf(val, label, name, f"{full}."))
        elif isinstance(val, (list, tuple, set)) or val is None:
            raise _error(name, f"{label}: {full} = {val!r} is not a Spark setting value (a string, number or boolean)")
        else:
            pairs.append((full, str(val).lower() if isinstance(val, bool) else str(val).strip()))
    return pairs


def _checked(name: str, rule: _Rule, value: Any) -> Any:
    """``value`` converted to the field's type, or a ConfigError naming the field."""
    label = _label(name, rule)
    if value is None:
        if rule.optional:
            return None
        raise _error(name, f"{label} is required")
    if rule.kind == "int":
        if not _is_int(value):
            raise _error(name, f"{label} must be an integer, got {value!r}")
        _bound(name, value, rule, label, "an integer")
        return int(value)
    if rule.kind == "float":
        if not (_is_int(value) or isinstance(value, float)) or not math.isfinite(value):
            raise _error(name, f"{label} must be a number, got {value!r}")
        if rule.positive and not value > 0:
            raise _error(name, f"{label} must be a positive number, got {value!r}")
        _bound(name, value, rule, label, "a number")
        return float(value)
    if rule.kind == "bool":
        if not isinstance(value, bool):
            raise _error(name, f"{label} must be true or false, got {value!r}")
        return value
    if rule.kind == "path":
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise _error(name, f"{label} must be a path, got {value!r}")
        return os.fspath(value)
    if rule.kind == "str":
        if not isinstance(value, str) or not value.strip():
            raise _error(name, f"{label} must be a non-empty string, got {value!r}")
        if rule.choices and value not in rule.choices:
            raise _error(name, f"{label} must be one of {', '.join(rule.choices)}, got {value!r}")
        return value
    if rule.kind == "files":
        if isinstance(value, (str, bytes)) or not all(isinstance(f, str) and f for f in value):
            raise _error(name, f"{label} must be a list of file paths, got {value!r:.200}")
        return tuple(value)
    if rule.kind == "pair":
        if isinstance(value, (str, bytes)) or len(value) != 2 or not all(_is_int(v) for v in value) \
                or not 0 <= value[1] < value[0]:
            raise _error(name, f"{label} must be null or [n, i] with 0 <= i < n, got {value!r}")
        return (int(value[0]), int(value[1]))
    if rule.kind == "epochs":
        return _epochs(name, label, value)
    if rule.kind == "range":
        return _fraction_range(name, label, value)
    if rule.kind == "options":
        if not isinstance(value, Mapping):
            raise _error(name, f"{label} must be an object, got {value!r:.200}")
        return dict(value)
    if rule.kind == "conf":
        return tuple(sorted(dict(_flat_conf(value, label, name)).items()))
    raise AssertionError(rule.kind)


def _number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _epochs(name: str, label: str, value: Any) -> tuple[float, ...]:
    """Increasing positive epoch numbers, from a list or a comma-separated string ("30,60,80")."""
    if isinstance(value, str):
        try:
            value = [float(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise _error(name, f"{label} must be epochs separated by commas, e.g. 30,60,80, got {value!r}") from None
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, (list, tuple)) \
            or not all(_number(v) and v > 0 for v in value):
        raise _error(name, f"{label} must be a list of positive epoch numbers, e.g. [30, 60, 80], got {value!r:.200}")
    epochs = tuple(float(v) for v in value)
    if any(b <= a for a, b in zip(epochs, epochs[1:])):
        raise _error(name, f"{label} must be increasing, got {', '.join(f'{e:g}' for e in epochs)}")
    return epochs


def _fraction_range(name: str, label: str, value: Any) -> tuple[float, float]:
    """``(low, high)`` with ``0 < low <= high <= 1``."""
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(_number(v) for v in value) \
            or not 0 < value[0] <= value[1] <= 1:
        raise _error(name, f"{label} must be two fractions MIN MAX with 0 < MIN <= MAX <= 1 (e.g. 0.08 1.0), "
                           f"got {value!r:.200}")
    return (float(value[0]), float(value[1]))


def _validate_fields(obj: Any) -> None:
    """Check and normalise every field of a frozen dataclass by its rule."""
    for f in dataclasses.fields(obj):
        rule = f.metadata.get("rule")
        if rule is not None:
            object.__setattr__(obj, f.name, _checked(f.name, rule, getattr(obj, f.name)))


def _unknown_keys(given: Mapping[str, Any], known: list[str], where: str) -> None:
    """Raise a ConfigError naming every unknown key, its closest known name, and the known keys."""
    unknown = [k for k in given if k not in known]
    if not unknown:
        return
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key).replace("-", "_"), known, n=1, cutoff=0.6)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ConfigError(f"{where}: unknown key(s) {', '.join(parts)}; the known keys are: {', '.join(known)}")


#: Which ``cross_device_ops`` each strategy takes.
_CROSS_DEVICE_HINT = {
    "multiworker": "MultiWorkerMirroredStrategy takes auto, nccl or ring",
    "mirrored": "MirroredStrategy takes auto, nccl or reduction-to-one",
    "default": "one device has no all-reduce: leave it at auto",
}


# -------------------------------------------------------------- the job
#: The master URLs Spark accepts (SparkContext's master parsing), and Spark Connect's sc://.
_MASTER_URL = re.compile(r"local(\[[^\]]+\])?|local-cluster\[[^\]]+\]|spark://\S+|yarn|k8s://\S+|sc://\S+")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of one training job; validated when built.

    Attributes:
        workers: N, TensorFlow workers = Spark barrier tasks (>= 1).
        model: model name (``"alexnet"``; see :mod:`spark_imagenet.training.models.specs`).
        epochs: passes over the train split by the whole cluster (>= 1).
        batch_size: per-worker batch; the global batch is ``workers * batch_size``.
        image_size: square input side in pixels (at least the model's minimum, 67 for AlexNet).
        width: multiplier of every layer width (> 0; 1.0 = the paper's model).
        learning_rate: SGD learning rate (> 0); with ``lr_scaling="linear"`` per 256 images.
        lr_schedule: ``"constant"``, ``"step"`` or ``"cosine"`` over the global step
            (:mod:`spark_imagenet.training.schedules`).
        warmup_epochs: linear warm-up epochs (>= 0).
        lr_scaling: ``"none"`` or ``"linear"`` (peak = learning_rate x global batch / 256).
        seed: random seed of the data order and augmentation draws (>= 0).
        parallel: parallel JPEG decode calls per worker; None = the worker's CPUs.
        transfers: parallel shard downloads per task (>= 1).
        cache: shard cache folder on every executor host; None = under Spark's local dir.
        results: local file to write the results JSON to; None = none written.
        output: folder or ``gs://`` prefix for the trained model, ``labels.json``,
            ``results.json`` and TensorBoard logs (:mod:`spark_imagenet.training.outputs`);
            a local path must be one the chief's host sees; None = none kept.
        checkpoint_dir: folder (every host sees it) or ``gs://`` prefix of the
            training checkpoints (:mod:`spark_imagenet.training.checkpoints`);
            a job launched again resumes from the latest complete one; None = none.
        max_restarts: times the driver launches the barrier stage again after
            a :class:`~spark_imagenet.errors.WorkerLost` failure (>= 0).
        step_timeout: seconds without a finished step before a worker gives up (0 = no limit).
        startup_timeout: seconds a worker waits for its peers while TensorFlow starts (0 = no limit).
        deterministic: the same batches and TensorFlow ops on every run (slower; for reproducibility and tests).
        shared_filesystem: a local dataset path is one every host mounts, so
            a cluster master's executors can read it (else refused).
        gpus_per_worker: GPUs per worker (>= 0), Spark's task GPU resource
            amount; each task trains on the GPUs Spark assigned it.
        strategy: ``"multiworker"`` (MultiWorkerMirroredStrategy across the
            barrier tasks), ``"mirrored"`` (one worker, MirroredStrategy over
            its GPUs) or ``"default"`` (one worker, one device); the last two
            need ``workers == 1``.
        cross_device_ops: the all-reduce: ``"auto"``, ``"nccl"``, ``"ring"``
            (multiworker) or ``"reduction-to-one"`` (mirrored).
        allow_unencrypted: train although Spark's network encryption or SSL
            is on (TensorFlow's gRPC between workers is plaintext).
        spare_worker: each task, once its TensorFlow process has ended, starts
            a spare one (TensorFlow imported, waiting) that the next task in the
            same reused PySpark Python worker takes (docs/design.md, 'Starting
            TensorFlow early, and a spare for the next job'); False: none.
        master: Spark master URL for the command line's session; None = the one
            ``spark-submit`` gives, else ``local[workers]``. :func:`train` with a
            session of your own ignores it.
        conf: extra Spark configuration as sorted ``(key, value)`` pairs (given
            as a mapping or pairs); used like ``master``.

    Raises:
        ConfigError: a value of the wrong type or out of range, an unknown
            model, or an image size below the model's minimum; the message
            names the key and its command-line option.
    """

    workers: int = _setting(None, kind="int", minimum=1, option="--workers", help="barrier tasks = TensorFlow workers")
    model: str = _setting("alexnet", kind="str", option="--model", help="model name")
    epochs: int = _setting(1, kind="int", minimum=1, option="--epochs", help="passes over the train set")
    batch_size: int = _setting(32, kind="int", minimum=1, option="--batch-size",
                               help="per-worker batch; global batch = batch_size x workers")
    image_size: int = _setting(224, kind="int", minimum=1, option="--image-size",
                               help="square input size in pixels")
    width: float = _setting(1.0, kind="float", positive=True, option="--width",
                            help="width multiplier of every layer (1.0 = the paper)")
    learning_rate: float | None = _setting(None, kind="float", positive=True, optional=True,
                                           option="--learning-rate",
                                           help="base learning rate (per 256 images with --lr-scaling linear)")
    lr_schedule: str | None = _setting(None, kind="str", optional=True, option="--lr-schedule", choices=LR_KINDS,
                                       help="learning rate over the steps: constant, step (/10 at --lr-boundaries) "
                                            "or cosine")
    lr_boundaries: tuple[float, ...] = _setting((), kind="epochs", option="--lr-boundaries",
                                                help="epochs after which --lr-schedule step divides the rate by 10, "
                                                     "e.g. 30,60,80 (default: 30, 60 and 80 of 90, scaled to "
                                                     "--epochs)")
    warmup_epochs: float | None = _setting(None, kind="float", minimum=0.0, optional=True, option="--warmup-epochs",
                                           help="linear warm-up of the learning rate over the first W epochs "
                                                "(0 = none)")
    lr_scaling: str | None = _setting(None, kind="str", optional=True, option="--lr-scaling", choices=LR_SCALINGS,
                                      help="linear: --learning-rate is per 256 images, scaled by the global batch "
                                           "(Goyal et al. 2017); none: the rate as given")
    optimizer: str = _setting("sgd", kind="str", option="--optimizer", choices=OPTIMIZERS,
                              help="sgd: SGD with momentum; lars: layer-wise adaptive rate scaling (You et al. "
                                   "2017), for global batches beyond about 8K images")
    momentum: float | None = _setting(None, kind="float", minimum=0.0, optional=True, option="--momentum",
                                      help="momentum of the optimizer, in [0, 1)")
    weight_decay: float | None = _setting(None, kind="float", minimum=0.0, optional=True, option="--weight-decay",
                                          help="L2 weight decay of the conv and dense kernels (the gradient term "
                                               "wd x w; biases and batch norm not decayed)")
    label_smoothing: float | None = _setting(None, kind="float", minimum=0.0, optional=True,
                                             option="--label-smoothing",
                                             help="label smoothing of the cross-entropy, in [0, 1)")
    flip: bool = _setting(True, kind="bool", option="--no-flip",
                          help="no random horizontal flips (for data whose mirror images differ: text, digits)")
    crop_area: tuple[float, float] = _setting((0.08, 1.0), kind="range", option="--crop-area",
                                              help="the random crop's area range as fractions of the image, "
                                                   "MIN MAX (Inception-style crop)")
    lighting: float = _setting(0.0, kind="float", minimum=0.0, option="--lighting",
                               help="standard deviation of AlexNet's PCA colour noise (the paper: 0.1; 0 = none)")
    precision: str = _setting("float32", kind="str", option="--precision", choices=PRECISIONS,
                              help="float32, mixed_float16 (with loss scaling) or mixed_bfloat16; the logits and "
                                   "loss stay float32")
    jit_compile: bool = _setting(False, kind="bool", option="--jit-compile",
                                 help="compile the training step with XLA")
    seed: int = _setting(0, kind="int", minimum=0, option="--seed",
                         help="random seed of data order and augmentation")
    parallel: int | None = _setting(None, kind="int", minimum=1, optional=True, option="--parallel",
                                    help="parallel JPEG decode calls per worker (default: its cores)")
    transfers: int = _setting(8, kind="int", minimum=1, option="--transfers",
                              help="parallel shard downloads per worker")
    cache: str | None = _setting(None, kind="path", optional=True, option="--cache",
                                 help="local folder for fetched shards (default: under Spark's local dir)")
    results: str | None = _setting(None, kind="path", optional=True, option="--results",
                                   help="write the results as JSON to this file")
    output: str | None = _setting(None, kind="str", optional=True, option="--output",
                                  help="folder or gs://BUCKET/PREFIX for the trained model (model.keras), "
                                       "labels.json, results.json and TensorBoard logs")
    checkpoint_dir: str | None = _setting(None, kind="str", optional=True, option="--checkpoint-dir",
                                          help="folder every host sees, or gs://BUCKET/PREFIX: the chief commits the "
                                               "weights and optimizer state after every epoch, and a launch of the "
                                               "same job resumes from the latest complete checkpoint")
    max_restarts: int = _setting(2, kind="int", minimum=0, option="--max-restarts",
                                 help="launch the barrier stage again this many times after a worker is lost "
                                      "(killed, stopped, timed out), from the latest checkpoint (from epoch 1 "
                                      "without --checkpoint-dir)")
    step_timeout: float = _setting(DEFAULT_STEP_TIMEOUT_S, kind="float", minimum=0.0, option="--step-timeout",
                                   help="seconds a worker may go without finishing a training step before it gives "
                                        "up and names the peers that do not answer (0 = no limit)")
    startup_timeout: float = _setting(DEFAULT_STARTUP_TIMEOUT_S, kind="float", minimum=0.0,
                                      option="--startup-timeout",
                                      help="seconds a worker waits for the others while TensorFlow starts "
                                           "(0 = no limit)")
    deterministic: bool = _setting(False, kind="bool", option="--deterministic",
                                   help="reproducible runs: the same data order, augmentation and TensorFlow ops "
                                        "on every run (slower input pipeline)")
    shared_filesystem: bool = _setting(False, kind="bool", option="--shared-filesystem",
                                       help="a local dataset path is mounted on every host (NFS and the like), so a "
                                            "cluster master may read it")
    gpus_per_worker: int = _setting(0, kind="int", minimum=0, option="--gpus-per-worker",
                                    help="GPUs each worker trains on (Spark's task GPU resource; 0 = CPU only)")
    strategy: str = _setting("multiworker", kind="str", option="--strategy", choices=STRATEGIES,
                             help="multiworker: MultiWorkerMirroredStrategy over the barrier tasks; mirrored: one "
                                  "worker on all its GPUs (MirroredStrategy); default: one worker, one device")
    cross_device_ops: str = _setting("auto", kind="str", option="--cross-device-ops", choices=CROSS_DEVICE_OPS,
                                     help="all-reduce: auto, nccl, ring (multiworker) or reduction-to-one (mirrored)")
    allow_unencrypted: bool = _setting(False, kind="bool", option="--allow-unencrypted",
                                       help="train although Spark's network encryption or SSL is on: TensorFlow's "
                                            "gRPC between the workers (gradients, weights) is not encrypted")
    spare_worker: bool = _setting(True, kind="bool", option="--no-spare-worker",
                                  help="leave no spare TensorFlow process (TensorFlow imported, 0.5 to 0.7 GB of "
                                       "memory) in each reused Spark Python worker for the next job")
    master: str | None = _setting(None, kind="str", optional=True, option="--master",
                                  help="Spark master URL, or sc://HOST:PORT for a Spark Connect server (default: the one "
                                       "spark-submit gives, else SPARK_REMOTE, else local[WORKERS])")
    conf: tuple[tuple[str, str], ...] = _setting((), kind="conf", option="--conf",
                                                 help="extra Spark configuration")

    def __post_init__(self) -> None:
        _validate_fields(self)
        self._check_model()
        self._check_recipe()
        if self.strategy != "multiworker" and self.workers != 1:
            what = "all of its GPUs in one process" if self.strategy == "mirrored" else "on one device"
            raise _error("strategy", f"strategy (--strategy) {self.strategy} runs one worker ({what}), but workers "
                                     f"(--workers) is {self.workers}: use --workers 1, or --strategy multiworker "
                                     "for several workers")
        if self.strategy == "default" and self.gpus_per_worker > 1:
            raise _error("gpus_per_worker", f"gpus_per_worker (--gpus-per-worker) {self.gpus_per_worker} with "
                                            "--strategy default, which trains on one device: the other GPUs would "
                                            "sit idle; use --strategy mirrored to train on all of them, or "
                                            "--gpus-per-worker 1")
        if (self.strategy, self.cross_device_ops) in (("multiworker", "reduction-to-one"), ("mirrored", "ring"),
                                                      ("default", "nccl"), ("default", "ring"),
                                                      ("default", "reduction-to-one")):
            raise _error("cross_device_ops", f"cross_device_ops (--cross-device-ops) {self.cross_device_ops} does "
                                             f"not apply to --strategy {self.strategy}; "
                                             + _CROSS_DEVICE_HINT[self.strategy])
        if self.master is not None and not _MASTER_URL.fullmatch(self.master.strip()):
            raise _error("master", f"master (--master) {self.master!r} is not a Spark master URL: use local[N], "
                                   "local-cluster[E,C,MB], spark://HOST:PORT, yarn, k8s://https://HOST:PORT, or "
                                   "sc://HOST:PORT for a Spark Connect server")
        if self.seed + self.workers - 1 > MAX_SEED:  # each worker seeds with seed + rank
            raise _error("seed", f"seed (--seed) {self.seed} is too large: with {self.workers} worker(s) it must be at "
                                 f"most {MAX_SEED - self.workers + 1} (worker seeds are seed + rank, at most 2**32 - 1)")

    def _check_model(self) -> None:
        from spark_imagenet.training.models import specs

        try:
            specs.check_model_settings(self.model, self.image_size, self.width)
        except ConfigError as e:
            named = str(e).partition(" ")[0]  # specs' messages begin with the setting they are about
            raise _error(named if named in ("image_size", "width") else "model", str(e)) from None

    def _check_recipe(self) -> None:
        """Settings left at None take the model's recipe; then the bounds that depend on them."""
        from spark_imagenet.training.models.specs import recipe_for

        recipe = recipe_for(self.model)
        for key in RECIPE_KEYS:
            if getattr(self, key) is None:
                object.__setattr__(self, key, recipe.value(key, self.epochs))
        for key in ("momentum", "label_smoothing"):
            if not getattr(self, key) < 1:
                raise _error(key, f"{key} (--{key.replace('_', '-')}) must be below 1, got {getattr(self, key)!r}")
        if self.lr_boundaries and self.lr_schedule != "step":
            raise _error("lr_boundaries", f"lr_boundaries (--lr-boundaries) only applies to --lr-schedule step, "
                                          f"but the schedule is {self.lr_schedule}")

    # ---------------------------------------------------------- building
    @classmethod
    def keys(cls) -> list[str]:
        """The setting names, in job-file order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "the training settings") -> "TrainConfig":
        """Build from ``{key: value}`` (a job file's table, keyword arguments).

        Args:
            values: settings by field name; missing keys take their defaults.
            where: named in the message of an unknown key.

        Raises:
            ConfigError: an unknown key (with the closest known name and the
                list of known keys), or an invalid value.
        """
        _unknown_keys(values, cls.keys(), where)
        return cls(**values)

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def spark_conf(self) -> dict[str, str]:
        """:attr:`conf` as a dict."""
        return dict(self.conf)

    @property
    def global_batch_size(self) -> int:
        """``workers * batch_size``: images per synchronous step of the whole cluster."""
        return self.workers * self.batch_size

    # ------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        """A JSON object with the format name and version, then every field."""
        data: dict[str, Any] = {"format": JOB_FORMAT, "format_version": JOB_FORMAT_VERSION}
        for key in self.keys():
            data[key] = getattr(self, key)
        data["conf"] = dict(self.conf)
        return data

    @classmethod
    def from_json(cls, data: Any, where: str = "train config") -> "TrainConfig":
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: not an object of this format and version, or invalid values.
        """
        fields = _unwrap(data, JOB_FORMAT, JOB_FORMAT_VERSION, where)
        return cls.from_mapping(fields, where)


def _unwrap(data: Any, fmt: str, version: int, where: str) -> dict[str, Any]:
    """The fields of a versioned JSON object, its format and version checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != fmt:
        raise ConfigError(f"{where}: format is {data.get('format')!r}, expected {fmt!r}")
    if data.get("format_version") != version:
        raise ConfigError(f"{where}: format_version {data.get('format_version')!r} is not supported (this "
                          f"version reads {version}); use the same spark-imagenet version on the driver and executors")
    return {k: v for k, v in data.items() if k not in ("format", "format_version")}


# ---------------------------------------------------------- job files
#: Keys of a job file besides the :class:`TrainConfig` fields.
JOB_FILE_EXTRA_KEYS = ("url",)
#: Keys whose value is a local path (``url`` only when it has no scheme such as ``gs://``).
PATH_KEYS = ("url", "cache", "results", "output", "checkpoint_dir")


def absolute_paths(values: Mapping[str, Any], base: str | os.PathLike) -> dict[str, Any]:
    """``values`` with the local paths of :data:`PATH_KEYS` made absolute against ``base``.

    Args:
        values: settings by key (a job file's, or the command line's).
        base: the folder relative paths are relative to (a job file's own
            folder, or the working directory for the command line).

    Returns:
        dict: a copy; ``gs://`` and ``file://`` URLs and non-strings unchanged.
    """
    out = dict(values)
    for key in PATH_KEYS:
        value = out.get(key)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str) and value and "://" not in value:
            out[key] = str(Path(base, Path(value).expanduser()).absolute())
    return out


def load_job_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML job file into ``{key: value}``, every key checked.

    Values are checked later, when the :class:`TrainConfig` is built (the
    command line merges its options over these first). Relative paths
    (``url``, ``cache``, ``results``) are relative to the job file's folder,
    and are returned absolute.

    Args:
        path: the job file.

    Returns:
        dict: the file's keys (``url`` and :class:`TrainConfig` fields).

    Raises:
        ConfigError: the file is missing or unreadable, is not valid TOML
            (with the line), or has an unknown key (with the closest known
            name and the list of known keys).
    """
    p = Path(path).expanduser()
    try:
        text = p.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {path}: cannot read the job file ({e})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not a valid TOML file: {e}") from None
    _unknown_keys(data, [*JOB_FILE_EXTRA_KEYS, *TrainConfig.keys()], f"job file {path}")
    if "url" in data and (not isinstance(data["url"], str) or not data["url"]):
        raise ConfigError(f"job file {path}: url must be a dataset URL string, got {data['url']!r}")
    if "conf" in data and not isinstance(data["conf"], dict):
        raise ConfigError(f"job file {path}: conf must be a table ([conf] with \"spark.key\" = \"value\" lines), "
                          f"got {data['conf']!r}")
    return absolute_paths(data, p.absolute().parent)


def dump_job(config: TrainConfig, url: str | None = None) -> str:
    """The job as TOML text that :func:`load_job_file` reads back to the same job.

    Settings left at None (no value) are omitted; ``conf`` becomes a ``[conf]`` table. A recipe setting
    (:data:`RECIPE_KEYS`) equal to the model's recipe for these epochs is written as a comment: the file then
    takes the recipe's values again when read with another ``--model`` or ``--epochs`` (a warm-up stated as
    5 of 90 epochs stays 5 of 90).

    Args:
        config: the resolved job.
        url: the dataset URL, written first when given.

    Returns:
        str: TOML text.
    """
    import tomli_w

    from spark_imagenet.training.models.specs import recipe_for

    recipe = recipe_for(config.model)
    data: dict[str, Any] = {} if url is None else {"url": url}
    derived = []
    for key in TrainConfig.keys():
        value = getattr(config, key)
        if key in RECIPE_KEYS and value == recipe.value(key, config.epochs):
            derived.append(f"# {tomli_w.dumps({key: value}).strip()}  (the {config.model} recipe's)")
        elif key != "conf" and value is not None:
            data[key] = value
    text = tomli_w.dumps(data)
    if derived:  # left to the recipe, so that another --model or --epochs derives its own values
        text += "".join(f"{line}\n" for line in derived)
    if config.conf:
        text += "\n" + tomli_w.dumps({"conf": dict(config.conf)})
    return text


def resolve_job(layers: list[Mapping[str, Any]]) -> TrainConfig:
    """Merge settings, later layers winning (``conf`` merged key by key), and build the config.

    Args:
        layers: e.g. ``[defaults, job file, command line]``; None values do
            not override; a ``url`` key is ignored (it is not a setting).

    Returns:
        TrainConfig: validated.

    Raises:
        ConfigError: as :class:`TrainConfig`.
    """
    merged: dict[str, Any] = {}
    conf: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "conf":
                conf.update(dict(value.items() if isinstance(value, Mapping) else value))
            elif value is not None:
                merged[key] = value
    merged.pop("url", None)
    return TrainConfig.from_mapping({**merged, "conf": conf})


# ------------------------------------------------------- one worker
@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What one TensorFlow worker process trains on: the job plus its own part.

    Attributes:
        config: the job.
        rank: this worker's rank, ``0 <= rank < workers`` (0 is the chief).
        workers: the cluster's worker count (equals ``config.workers``).
        num_classes: the dataset's class count (the logits' width).
        train_files: local paths of this worker's train shards (non-empty).
        train_examples: examples in those shards.
        val_files: local paths of the val shards this worker reads.
        val_record_shard: ``(n, i)``: keep every n-th val record from offset i
            (a val shard shared by several workers), or None for all records.
        val_examples: val examples this worker evaluates.
        val_examples_total: val examples of all workers together.
        steps_per_epoch: train steps per epoch (the same on every worker).
        val_steps: evaluation steps (the same on every worker; enough for the
            largest worker's ``val_examples``).
        parallel: tf.data parallel calls (resolved: never None).
        threads: TensorFlow intra/inter-op threads; None = TensorFlow's default.
        startup_timeout_s: seconds to wait for the other workers while the
            strategy is built; 0 = no limit.
        peers: every worker's ``host:port`` in rank order (TF_CONFIG's), named
            by the step watchdog; empty for one worker.
        dataset_id: the manifest's dataset id (recorded in checkpoints).
        restore: a local folder holding the checkpoint to resume from (its
            ``checkpoint.json`` and TensorFlow files), or None to start at epoch 1.
        checkpoint_options: :meth:`Storage.reopen_options` of ``config.checkpoint_dir``.

    Raises:
        ConfigError: a wrong type or impossible value, naming the key.
    """

    config: TrainConfig
    rank: int = _setting(kind="int", minimum=0)
    workers: int = _setting(kind="int", minimum=1)
    num_classes: int = _setting(kind="int", minimum=1)
    train_files: tuple[str, ...] = _setting(kind="files")
    train_examples: int = _setting(kind="int", minimum=0)
    val_files: tuple[str, ...] = _setting(kind="files")
    val_record_shard: tuple[int, int] | None = _setting(kind="pair", optional=True)
    val_examples: int = _setting(kind="int", minimum=0)
    val_examples_total: int = _setting(kind="int", minimum=0)
    steps_per_epoch: int = _setting(kind="int", minimum=1)
    val_steps: int = _setting(kind="int", minimum=0)
    parallel: int = _setting(kind="int", minimum=1)
    threads: int | None = _setting(None, kind="int", minimum=0, optional=True)
    startup_timeout_s: float = _setting(DEFAULT_STARTUP_TIMEOUT_S, kind="float", minimum=0.0)
    peers: tuple[str, ...] = _setting((), kind="files")
    dataset_id: str | None = _setting(None, kind="str", optional=True)
    restore: str | None = _setting(None, kind="path", optional=True)
    checkpoint_options: dict[str, Any] | None = _setting(None, kind="options", optional=True)

    def __post_init__(self) -> None:
        if not isinstance(self.config, TrainConfig):
            raise ConfigError(f"worker spec key 'config' must be a TrainConfig, got {type(self.config).__name__}")
        _validate_fields(self)
        where = f"worker spec of rank {self.rank}"
        if self.rank >= self.workers:
            raise ConfigError(f"{where}: rank {self.rank} is not in 0..workers-1 (workers = {self.workers})")
        if self.workers != self.config.workers:
            raise ConfigError(f"{where}: workers = {self.workers} but the job has {self.config.workers}")
        if not self.train_files:
            raise ConfigError(f"{where}: no train_files; every worker needs its own shards")
        if self.val_steps * self.config.batch_size < self.val_examples:
            raise ConfigError(
                f"{where}: val_steps {self.val_steps} * batch_size {self.config.batch_size} is less than this "
                f"worker's val_examples {self.val_examples}; val_steps must be ceil(max val_examples / batch_size)"
            )
        if self.val_examples > 0 and not self.val_files:
            raise ConfigError(f"{where}: val_examples is {self.val_examples} but val_files is empty")

    @property
    def seed(self) -> int:
        """This worker's seed: the job's seed plus the rank (distinct augmentation per worker)."""
        return self.config.seed + self.rank

    @classmethod
    def keys(cls) -> list[str]:
        """The field names."""
        return [f.name for f in dataclasses.fields(cls)]

    def to_json(self) -> dict[str, Any]:
        """A JSON object: format name and version, the job as ``config``, then this worker's fields."""
        data: dict[str, Any] = {"format": WORKER_FORMAT, "format_version": WORKER_FORMAT_VERSION}
        for key in self.keys():
            value = getattr(self, key)
            data[key] = value.to_json() if key == "config" else list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_json(cls, data: Any, where: str = "worker spec") -> "WorkerSpec":
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: not an object of this format and version, a missing
                or unknown key, or an invalid value (naming the key).
        """
        fields = _unwrap(data, WORKER_FORMAT, WORKER_FORMAT_VERSION, where)
        _unknown_keys(fields, cls.keys(), where)
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in fields and f.default is dataclasses.MISSING]
        if missing:
            raise ConfigError(f"{where} is missing key(s): {', '.join(missing)}")
        fields["config"] = TrainConfig.from_json(fields["config"], f"{where}, key 'config'")
        return cls(**fields)
