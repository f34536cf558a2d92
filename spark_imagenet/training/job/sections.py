"""The five sections of a training job's settings, each a frozen dataclass a user can read on its own.

=========================  =================================================================================
section                    what it holds
=========================  =================================================================================
:class:`ScalingConfig`     how many TensorFlow workers, on which devices and Spark master (``[scaling]``)
:class:`DataConfig`        how the shards are fetched and the images read and augmented (``[data]``)
:class:`RecipeConfig`      the model and how it is trained: epochs, batch, learning rate, optimizer (``[recipe]``)
:class:`RunConfig`         what the run leaves behind and how it survives failures (``[run]``)
:class:`TrackingConfig`    where the run is tracked in MLflow (``[tracking]``)
=========================  =================================================================================

:class:`~spark_imagenet.training.job.config.TrainConfig` holds one of each and
reads a setting only through its section (``config.recipe.epochs``). Every field is made with
:func:`~spark_imagenet.training.job.settings.setting`: its type, bounds, command-line option and help are
that one definition, from which the command line, the TOML job file and the JSON are generated. Each
section checks its own settings when built; the checks across sections are
:class:`~spark_imagenet.training.job.config.TrainConfig`'s.
"""

from __future__ import annotations

import dataclasses

from spark_imagenet.errors import ConfigError
from spark_imagenet.storage import store_schemes
from spark_imagenet.training.job import model_specs as specs
from spark_imagenet.training.job.master import Master
from spark_imagenet.training.job.schedules import KINDS as LR_KINDS, SCALINGS as LR_SCALINGS
from spark_imagenet.training.job.settings import setting, setting_error, validate_fields

#: ``--keep-checkpoints``' default: complete checkpoints a commit keeps, the new one included
#: (:func:`spark_imagenet.training.job.checkpoints.commit`).
DEFAULT_KEEP = 2
#: Default limit, in seconds, on waiting for the other workers while the
#: strategy is built (0 = no limit).
DEFAULT_STARTUP_TIMEOUT_S = 600.0
#: ``--step-timeout``'s default, seconds: far above a real ImageNet step (under a second on a GPU, a few on
#: CPUs) and the first step's tracing, an epoch's evaluation and a checkpoint upload (docs/design.md, 'No hangs').
DEFAULT_STEP_TIMEOUT_S = 900.0
#: ``--strategy`` values (see :class:`ScalingConfig`).
STRATEGIES = ("multiworker", "mirrored", "default")
#: ``--cross-device-ops`` values: MultiWorkerMirroredStrategy's communication (auto, nccl, ring) and
#: MirroredStrategy's cross_device_ops (nccl, reduction-to-one; auto = TensorFlow's choice).
CROSS_DEVICE_OPS = ("auto", "nccl", "ring", "reduction-to-one")
#: ``--optimizer`` values.
OPTIMIZERS = ("sgd", "lars")
#: ``--precision`` values: Keras mixed-precision policies (float16 with loss scaling).
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
#: The settings whose default is the model's recipe (:func:`spark_imagenet.training.job.model_specs.recipe_for`).
RECIPE_KEYS = ("learning_rate", "lr_schedule", "warmup_epochs", "lr_scaling", "momentum", "weight_decay",
               "label_smoothing")

#: Which ``cross_device_ops`` each strategy takes.
_CROSS_DEVICE_HINT = {
    "multiworker": "MultiWorkerMirroredStrategy takes auto, nccl or ring",
    "mirrored": "MirroredStrategy takes auto, nccl or reduction-to-one",
    "default": "one device has no all-reduce: leave it at auto",
}


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """How many TensorFlow workers run, on which devices, under which Spark master (``[scaling]``).

    Attributes:
        workers: N, TensorFlow workers = Spark barrier tasks (>= 1).
        gpus_per_worker: GPUs per worker (>= 0), Spark's task GPU resource
            amount; each task trains on the GPUs Spark assigned it.
        strategy: ``"multiworker"`` (MultiWorkerMirroredStrategy across the
            barrier tasks), ``"mirrored"`` (one worker, MirroredStrategy over
            its GPUs) or ``"default"`` (one worker, one device); the last two
            need ``workers == 1``.
        cross_device_ops: the all-reduce: ``"auto"``, ``"nccl"``, ``"ring"``
            (multiworker) or ``"reduction-to-one"`` (mirrored).
        master: Spark master URL for the command line's session; None = the one
            ``spark-submit`` gives, else ``local[workers]``. :func:`train` with a
            session of your own ignores it.
        conf: extra Spark configuration as sorted ``(key, value)`` pairs (given
            as a mapping or pairs); used like ``master``.
        allow_unencrypted: train although Spark's network encryption or SSL
            is on (TensorFlow's gRPC between workers is plaintext).
        min_workers: the fewest workers a relaunch after a lost worker may go on with when ``workers`` barrier
            slots are not free within ``regain_timeout`` (the global batch kept); None: always ``workers``.

    Raises:
        ConfigError: a value of the wrong type or out of range, a strategy that does not fit the worker count
            or GPUs, an all-reduce that does not apply to the strategy, or a master that is no Spark URL; the
            message names the key and its command-line option.
    """

    workers: int = setting(None, kind="int", minimum=1, option="--workers", help="barrier tasks = TensorFlow workers")
    gpus_per_worker: int = setting(0, kind="int", minimum=0, option="--gpus-per-worker",
                                   help="GPUs each worker trains on (Spark's task GPU resource; 0 = CPU only)")
    min_workers: int | None = setting(None, kind="int", minimum=1, optional=True, option="--min-workers",
                                      help="after a lost worker, if --workers barrier slots are not free within "
                                           "--regain-timeout, go on with as many as are free (at least this many, "
                                           "dividing the global batch) from the latest checkpoint")
    strategy: str = setting("multiworker", kind="str", option="--strategy", choices=STRATEGIES,
                            help="multiworker: MultiWorkerMirroredStrategy over the barrier tasks; mirrored: one "
                                 "worker on all its GPUs (MirroredStrategy); default: one worker, one device")
    cross_device_ops: str = setting("auto", kind="str", option="--cross-device-ops", choices=CROSS_DEVICE_OPS,
                                    help="all-reduce: auto, nccl, ring (multiworker) or reduction-to-one (mirrored)")
    master: str | None = setting(None, kind="str", optional=True, option="--master",
                                 help="Spark master URL, or sc://HOST:PORT for a Spark Connect server (default: the "
                                      "one spark-submit gives, else SPARK_REMOTE, else local[WORKERS])")
    conf: tuple[tuple[str, str], ...] = setting((), kind="conf", option="--conf",
                                                help="extra Spark configuration")
    allow_unencrypted: bool = setting(False, kind="bool", option="--allow-unencrypted",
                                      help="train although Spark's network encryption or SSL is on: TensorFlow's "
                                           "gRPC between the workers (gradients, weights) is not encrypted")

    def __post_init__(self) -> None:
        validate_fields(self)
        if self.strategy != "multiworker" and self.workers != 1:
            what = "all of its GPUs in one process" if self.strategy == "mirrored" else "on one device"
            raise setting_error("strategy", f"strategy (--strategy) {self.strategy} runs one worker ({what}), but "
                                            f"workers (--workers) is {self.workers}: use --workers 1, or --strategy "
                                            "multiworker for several workers", self.strategy)
        if self.min_workers is not None and self.min_workers > self.workers:
            raise setting_error("min_workers", f"min_workers (--min-workers) {self.min_workers} is more than workers "
                                               f"(--workers) {self.workers}: give at most {self.workers}",
                                self.min_workers)
        if self.strategy == "default" and self.gpus_per_worker > 1:
            raise setting_error("gpus_per_worker", f"gpus_per_worker (--gpus-per-worker) {self.gpus_per_worker} "
                                                   "with --strategy default, which trains on one device: the other "
                                                   "GPUs would sit idle; use --strategy mirrored to train on all of "
                                                   "them, or --gpus-per-worker 1", self.gpus_per_worker)
        if (self.strategy, self.cross_device_ops) in (("multiworker", "reduction-to-one"), ("mirrored", "ring"),
                                                      ("default", "nccl"), ("default", "ring"),
                                                      ("default", "reduction-to-one")):
            raise setting_error("cross_device_ops", f"cross_device_ops (--cross-device-ops) {self.cross_device_ops} "
                                                    f"does not apply to --strategy {self.strategy}; "
                                                    + _CROSS_DEVICE_HINT[self.strategy], self.cross_device_ops)
        try:
            Master.parse(self.master)
        except ConfigError as e:
            raise setting_error("master", str(e), self.master) from None

    @property
    def spark_conf(self) -> dict[str, str]:
        """:attr:`conf` as a dict."""
        return dict(self.conf)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """How each worker's shards are fetched and its images read and augmented (``[data]``).

    Attributes:
        flip: random horizontal flips of the training images (False for data whose mirror images differ).
        crop_area: ``(min, max)`` area of the random crop as fractions of the image (Inception-style).
        lighting: standard deviation of AlexNet's PCA colour noise (0 = none; the paper: 0.1).
        seed: random seed of the data order and augmentation draws (>= 0).
        deterministic: the same batches and TensorFlow ops on every run (slower; for reproducibility and tests).
        parallel: parallel JPEG decode calls per worker; None = the worker's CPUs.
        transfers: parallel shard downloads per task (>= 1).
        cache: shard cache folder on every executor host; None = under Spark's local dir.
        shared_filesystem: a local dataset path is one every host mounts, so
            a cluster master's executors can read it (else refused).

    Raises:
        ConfigError: a value of the wrong type or out of range, naming the key and its option.
    """

    flip: bool = setting(True, kind="bool", option="--no-flip",
                         help="no random horizontal flips (for data whose mirror images differ: text, digits)")
    crop_area: tuple[float, float] = setting((0.08, 1.0), kind="range", option="--crop-area",
                                             help="the random crop's area range as fractions of the image, "
                                                  "MIN MAX (Inception-style crop)")
    lighting: float = setting(0.0, kind="float", minimum=0.0, option="--lighting",
                              help="standard deviation of AlexNet's PCA colour noise (the paper: 0.1; 0 = none)")
    seed: int = setting(0, kind="int", minimum=0, option="--seed",
                        help="random seed of data order and augmentation")
    deterministic: bool = setting(False, kind="bool", option="--deterministic",
                                  help="reproducible runs: the same data order, augmentation and TensorFlow ops "
                                       "on every run (slower input pipeline)")
    parallel: int | None = setting(None, kind="int", minimum=1, optional=True, option="--parallel",
                                   help="parallel JPEG decode calls per worker (default: its cores)")
    transfers: int = setting(8, kind="int", minimum=1, option="--transfers",
                             help="parallel shard downloads per worker")
    cache: str | None = setting(None, kind="path", optional=True, option="--cache",
                                help="local folder for fetched shards (default: under Spark's local dir)")
    shared_filesystem: bool = setting(False, kind="bool", option="--shared-filesystem",
                                      help="a local dataset path is mounted on every host (NFS and the like), so a "
                                           "cluster master may read it")

    def __post_init__(self) -> None:
        validate_fields(self)


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    """The model and how it is trained (``[recipe]``); the settings left at None take the model's recipe.

    Attributes:
        model: model name (``"alexnet"``; see :mod:`spark_imagenet.training.job.model_specs`).
        width: multiplier of every layer width (> 0; 1.0 = the paper's model).
        image_size: square input side in pixels (at least the model's minimum, 67 for AlexNet).
        epochs: passes over the train split by the whole cluster (>= 1).
        batch_size: per-worker batch; the global batch is ``workers * batch_size``.
        learning_rate: SGD learning rate (> 0); with ``lr_scaling="linear"`` per 256 images.
        lr_schedule: ``"constant"``, ``"step"`` or ``"cosine"`` over the global step
            (:mod:`spark_imagenet.training.job.schedules`).
        lr_boundaries: epochs after which ``lr_schedule="step"`` divides the rate by 10 (empty = 30, 60
            and 80 of 90, scaled to ``epochs``).
        warmup_epochs: linear warm-up epochs (>= 0).
        lr_scaling: ``"none"`` or ``"linear"`` (peak = learning_rate x global batch / 256).
        optimizer: ``"sgd"`` (SGD with momentum) or ``"lars"`` (layer-wise adaptive rate scaling).
        momentum: momentum of the optimizer, in [0, 1); None = the model's recipe.
        weight_decay: L2 weight decay of the conv and dense kernels; None = the model's recipe.
        label_smoothing: label smoothing of the cross-entropy, in [0, 1); None = the model's recipe.
        precision: ``"float32"``, ``"mixed_float16"`` (with loss scaling) or ``"mixed_bfloat16"``.
        jit_compile: compile the training step with XLA.

    Raises:
        ConfigError: a value of the wrong type or out of range, an unknown model, an image size below the
            model's minimum, a width for a model of fixed width, or step boundaries without the step schedule.
    """

    model: str = setting("alexnet", kind="str", option="--model", help="model name")
    width: float = setting(1.0, kind="float", positive=True, option="--width",
                           help="width multiplier of every layer (1.0 = the paper)")
    image_size: int = setting(224, kind="int", minimum=1, option="--image-size",
                              help="square input size in pixels")
    epochs: int = setting(1, kind="int", minimum=1, option="--epochs", help="passes over the train set")
    batch_size: int = setting(32, kind="int", minimum=1, option="--batch-size",
                              help="per-worker batch; global batch = batch_size x workers")
    learning_rate: float | None = setting(None, kind="float", positive=True, optional=True,
                                          option="--learning-rate",
                                          help="base learning rate (per 256 images with --lr-scaling linear)")
    lr_schedule: str | None = setting(None, kind="str", optional=True, option="--lr-schedule", choices=LR_KINDS,
                                      help="learning rate over the steps: constant, step (/10 at --lr-boundaries) "
                                           "or cosine")
    lr_boundaries: tuple[float, ...] = setting((), kind="epochs", option="--lr-boundaries",
                                               help="epochs after which --lr-schedule step divides the rate by 10, "
                                                    "e.g. 30,60,80 (default: 30, 60 and 80 of 90, scaled to "
                                                    "--epochs)")
    warmup_epochs: float | None = setting(None, kind="float", minimum=0.0, optional=True, option="--warmup-epochs",
                                          help="linear warm-up of the learning rate over the first W epochs "
                                               "(0 = none)")
    lr_scaling: str | None = setting(None, kind="str", optional=True, option="--lr-scaling", choices=LR_SCALINGS,
                                     help="linear: --learning-rate is per 256 images, scaled by the global batch "
                                          "(Goyal et al. 2017); none: the rate as given")
    optimizer: str = setting("sgd", kind="str", option="--optimizer", choices=OPTIMIZERS,
                             help="sgd: SGD with momentum; lars: layer-wise adaptive rate scaling (You et al. "
                                  "2017), for global batches beyond about 8K images")
    momentum: float | None = setting(None, kind="float", minimum=0.0, optional=True, option="--momentum",
                                     help="momentum of the optimizer, in [0, 1)")
    weight_decay: float | None = setting(None, kind="float", minimum=0.0, optional=True, option="--weight-decay",
                                         help="L2 weight decay of the conv and dense kernels (the gradient term "
                                              "wd x w; biases and batch norm not decayed)")
    label_smoothing: float | None = setting(None, kind="float", minimum=0.0, optional=True,
                                            option="--label-smoothing",
                                            help="label smoothing of the cross-entropy, in [0, 1)")
    precision: str = setting("float32", kind="str", option="--precision", choices=PRECISIONS,
                             help="float32, mixed_float16 (with loss scaling) or mixed_bfloat16; the logits and "
                                  "loss stay float32")
    jit_compile: bool = setting(False, kind="bool", option="--jit-compile",
                                help="compile the training step with XLA")

    def __post_init__(self) -> None:
        validate_fields(self)
        self._check_model()
        self._check_recipe()

    def _check_model(self) -> None:
        try:
            specs.check_model_settings(self.model, self.image_size, self.width)
        except ConfigError as e:
            key = e.key or "model"  # model_specs names the setting it is about
            raise setting_error(key, str(e), getattr(self, key)) from None

    def _check_recipe(self) -> None:
        """Settings left at None take the model's recipe; then the bounds that depend on them."""
        recipe = specs.recipe_for(self.model)
        for key in RECIPE_KEYS:
            if getattr(self, key) is None:
                object.__setattr__(self, key, recipe.value(key, self.epochs))
        for key in ("momentum", "label_smoothing"):
            if not getattr(self, key) < 1:
                raise setting_error(key, f"{key} (--{key.replace('_', '-')}) must be below 1, got "
                                         f"{getattr(self, key)!r}", getattr(self, key))
        if self.lr_boundaries and self.lr_schedule != "step":
            raise setting_error("lr_boundaries", f"lr_boundaries (--lr-boundaries) only applies to --lr-schedule "
                                                 f"step, but the schedule is {self.lr_schedule}", self.lr_boundaries)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What the run leaves behind and how it survives failures (``[run]``).

    Attributes:
        results: local file to write the results JSON to; None = none written.
        output: folder or bucket URL (any store) for the trained model, ``labels.json``,
            ``results.json`` and TensorBoard logs (:mod:`spark_imagenet.training.job.outputs`);
            a local path must be one the chief's host sees; None = none kept.
        overwrite: this run's outputs replace an earlier run's in ``output`` (its TensorBoard files
            deleted when this run's are written); False: such a folder is refused before the job starts.
        checkpoint_dir: folder (every host sees it) or bucket URL (any store) of the
            training checkpoints (:mod:`spark_imagenet.training.job.checkpoints`);
            a job launched again resumes from the latest complete one; None = none.
        keep_checkpoints: complete checkpoints kept in ``checkpoint_dir``, the newest included (>= 1); older
            ones are deleted after each commit, but for the newest one at an epoch's end while only checkpoints
            inside the epoch after it are newer. May differ between the launches of one run.
        checkpoint_every: also commit a checkpoint inside an epoch at every multiple of this many global steps
            (>= 1); None = at epoch ends only. May differ between the launches of one run. Such a checkpoint
            resumes on the worker count that wrote it only.
        regain_timeout: seconds a relaunch waits for ``workers`` free barrier slots before it goes on with
            fewer (only with ``min_workers``).
        max_restarts: times the driver launches the barrier stage again after
            a :class:`~spark_imagenet.errors.WorkerLost` failure (>= 0).
        step_timeout: seconds without a finished step before a worker gives up (0 = no limit).
        startup_timeout: seconds a worker waits for its peers while TensorFlow starts (0 = no limit).

    Raises:
        ConfigError: a value of the wrong type or out of range, naming the key and its option.
    """

    results: str | None = setting(None, kind="path", optional=True, option="--results",
                                  help="write the results as JSON to this file")
    output: str | None = setting(None, kind="str", optional=True, option="--output",
                                 help=f"folder or bucket URL ({store_schemes()}) for the trained model (model.keras), "
                                      "labels.json, results.json and TensorBoard logs")
    overwrite: bool = setting(False, kind="bool", option="--overwrite",
                              help="replace the outputs of an earlier run in --output (its model.keras, "
                                   "labels.json, results.json and TensorBoard logs) when this run's are written; "
                                   "without it such a folder is refused before the job starts")
    checkpoint_dir: str | None = setting(None, kind="str", optional=True, option="--checkpoint-dir",
                                         help=f"folder every host sees, or bucket URL ({store_schemes()}): the "
                                              "chief commits the weights and optimizer state after every epoch, and "
                                              "a launch of the same job resumes from the latest complete checkpoint "
                                              "(the data, model, cluster shape, recipe and augmentation must match "
                                              "it; --epochs may grow; docs/guide/failures.md)")
    keep_checkpoints: int = setting(DEFAULT_KEEP, kind="int", minimum=1, option="--keep-checkpoints",
                                    help="complete checkpoints to keep in --checkpoint-dir, the newest included; "
                                         "older ones are deleted after each commit, but for the newest one at an "
                                         "epoch's end while only checkpoints inside the next epoch are newer")
    checkpoint_every: int | None = setting(None, kind="int", minimum=1, optional=True, option="--checkpoint-every",
                                           help="also commit a checkpoint inside an epoch every N global steps (a "
                                                "resume on the same --workers then continues at that step with the "
                                                "batches an uninterrupted run would see; another worker count is "
                                                "refused)")
    regain_timeout: float = setting(60.0, kind="float", minimum=0.0, option="--regain-timeout",
                                    help="with --min-workers: seconds a relaunch waits for --workers free barrier "
                                         "slots before it goes on with fewer")
    max_restarts: int = setting(2, kind="int", minimum=0, option="--max-restarts",
                                help="launch the barrier stage again this many times after a worker is lost "
                                     "(killed, stopped, timed out), from the latest checkpoint (from epoch 1 "
                                     "without --checkpoint-dir)")
    step_timeout: float = setting(DEFAULT_STEP_TIMEOUT_S, kind="float", minimum=0.0, option="--step-timeout",
                                  help="seconds a worker may go without finishing a training step before it gives "
                                       "up and names the peers that do not answer (0 = no limit)")
    startup_timeout: float = setting(DEFAULT_STARTUP_TIMEOUT_S, kind="float", minimum=0.0,
                                     option="--startup-timeout",
                                     help="seconds a worker waits for the others while TensorFlow starts "
                                          "(0 = no limit)")

    def __post_init__(self) -> None:
        validate_fields(self)


@dataclasses.dataclass(frozen=True)
class TrackingConfig:
    """Where the run is tracked in MLflow (``[tracking]``): one MLflow run per job, logged from the driver and
    the chief only (docs/guide/training.md, 'Tracking in MLflow').

    Attributes:
        mlflow: track the job in MLflow; set to True when any other setting of this section is given.
        mlflow_tracking_uri: the tracking server (``http://host:5000``, ``databricks``, ``sqlite:///path``);
            None = MLflow's own default (``MLFLOW_TRACKING_URI``, or the workspace on Databricks).
        mlflow_experiment: the experiment's name (a workspace path such as ``/Users/me/alexnet`` on
            Databricks); None = ``MLFLOW_EXPERIMENT_NAME``, else ``spark-imagenet``.
        mlflow_run_name: the run's name; None = MLflow's generated one.
        mlflow_tags: extra run tags as sorted ``(key, value)`` pairs.
        register_model: register the logged model under this name (``catalog.schema.model`` in Unity
            Catalog) and log which version; None = logged, not registered.

    Raises:
        ConfigError: a value of the wrong type, naming the key and its option.
    """

    mlflow: bool = setting(False, kind="bool", option="--mlflow",
                           help="track the job in MLflow: the settings, every epoch's metrics, the validation, the "
                                "dataset and the model (with --output), in one run logged by the driver and the chief")
    mlflow_tracking_uri: str | None = setting(None, kind="str", optional=True, option="--mlflow-tracking-uri",
                                              help="the MLflow tracking server (default: MLFLOW_TRACKING_URI, or "
                                                   "the workspace on Databricks); implies --mlflow")
    mlflow_experiment: str | None = setting(None, kind="str", optional=True, option="--mlflow-experiment",
                                            help="the MLflow experiment (default: MLFLOW_EXPERIMENT_NAME, else "
                                                 "spark-imagenet; a workspace path on Databricks); implies --mlflow")
    mlflow_run_name: str | None = setting(None, kind="str", optional=True, option="--mlflow-run-name",
                                          help="the MLflow run's name (default: MLflow's); implies --mlflow")
    mlflow_tags: tuple[tuple[str, str], ...] = setting((), kind="conf", option="--mlflow-tag",
                                                       help="an MLflow run tag; implies --mlflow")
    register_model: str | None = setting(None, kind="str", optional=True, option="--register-model",
                                         help="register the logged model under this name (catalog.schema.model in "
                                              "Unity Catalog); needs --output; implies --mlflow")

    def __post_init__(self) -> None:
        validate_fields(self)
        if (self.mlflow_tracking_uri or self.mlflow_experiment or self.mlflow_run_name or self.mlflow_tags
                or self.register_model):
            object.__setattr__(self, "mlflow", True)  # each implies --mlflow: the resolved job says so

    @property
    def enabled(self) -> bool:
        """Whether the job is tracked (``mlflow``, which any other setting of the section turns on)."""
        return self.mlflow


#: The sections in order: (name in the job file and on :class:`~spark_imagenet.training.job.config.TrainConfig`,
#: class).
SECTIONS: tuple[tuple[str, type], ...] = (("scaling", ScalingConfig), ("data", DataConfig),
                                          ("recipe", RecipeConfig), ("run", RunConfig),
                                          ("tracking", TrackingConfig))
#: Each setting's section name, by setting name.
SECTION_OF: dict[str, str] = {f.name: name for name, cls in SECTIONS for f in dataclasses.fields(cls)}
