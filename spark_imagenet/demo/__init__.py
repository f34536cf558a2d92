"""``spark-imagenet demo``: the built-in default job, needing nothing but the package.

It generates a small learnable dataset in the Kaggle layout
(:mod:`spark_imagenet.demo.synthetic`: 10 classes of procedurally drawn
textures), shards it into a local bucket folder, and trains a narrow AlexNet
with 4 barrier workers (``local[4]`` by default), printing per-worker and
global results (its lines are logged: :mod:`spark_imagenet.logs`; with no logging set up they are
printed as on the command line). Importing this package is cheap: the sharding and training
modules are imported when :func:`run_demo` runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_imagenet.logs import ensure_console

if TYPE_CHECKING:  # imported when run_demo runs
    from spark_imagenet.training.driver.results import Result
    from spark_imagenet.training.job.config import TrainConfig

logger = logging.getLogger(__name__)

#: Training settings of the demo: small enough for 2 CPU cores, large enough to
#: learn every time (global batch 96 divides the 480 train images: 5 steps per
#: epoch; why these values: docs/design.md, 'Measurements').
DEMO_TRAIN_DEFAULTS: dict[str, Any] = {
    "workers": 4,
    "epochs": 15,
    "batch_size": 24,
    "image_size": 96,
    "width": 0.25,
    "learning_rate": 0.005,
    # the demo's measured claim (README) is for one constant rate, not AlexNet's default warm-up and cosine
    "lr_schedule": "constant",
    "warmup_epochs": 0.0,
}
DEMO_DATA = {"train_per_class": 48, "val_per_class": 12, "test_images": 4, "size": (128, 96)}


def demo_config(config: TrainConfig | None = None, **settings: Any) -> TrainConfig:
    """The demo's :class:`~spark_imagenet.training.job.config.TrainConfig`.

    Args:
        config: a TrainConfig to use as it is (``settings`` override its
            fields), or None for :data:`DEMO_TRAIN_DEFAULTS`.
        **settings: TrainConfig fields overriding the defaults.

    Raises:
        ConfigError: an unknown setting or an invalid value.
    """
    from spark_imagenet.training.job.config import SECTIONS, TrainConfig

    if config is None:
        return TrainConfig.from_mapping({**DEMO_TRAIN_DEFAULTS, **settings}, "run_demo()")
    if not settings:
        return config
    return TrainConfig.from_mapping({**{name: getattr(config, name) for name, _ in SECTIONS}, **settings},
                                    "run_demo()")


def _generate(source: Path, num_classes: int) -> None:
    """Generate the synthetic Kaggle-layout source once (kept when complete)."""
    from spark_imagenet.demo.synthetic import generate_kaggle_layout

    if (source / "LOC_val_solution.csv").is_file():
        return
    if source.exists():
        shutil.rmtree(source)
    logger.info(f"demo: generating {num_classes} synthetic classes in the Kaggle layout under {source}")
    generate_kaggle_layout(source, num_classes=num_classes, seed=0, **DEMO_DATA)


def run_demo(spark, config: TrainConfig | None = None, *, workdir: str | os.PathLike | None = None,
             num_classes: int = 10, **settings: Any) -> Result:
    """Generate, shard and train: the whole job on a synthetic dataset.

    Args:
        spark: an active ``pyspark.sql.SparkSession`` with at least
            ``workers`` free task slots.
        config: a :class:`~spark_imagenet.training.job.config.TrainConfig`; None
            for :data:`DEMO_TRAIN_DEFAULTS`.
        workdir: folder for the generated source (``kaggle/``) and the shards
            (``bucket/``); reused when run again. ``None``: a temporary folder,
            removed at the end.
        num_classes: synthetic classes (>= 2).
        **settings: TrainConfig fields overriding the demo's defaults (e.g.
            ``workers=2``, ``results="r.json"``).

    Returns:
        Result: what :func:`spark_imagenet.training.driver.launch.train` returned
        (:class:`~spark_imagenet.training.driver.results.Result`).

    Raises:
        SparkImagenetError: as :func:`~spark_imagenet.dataset.sharding.shard`
            and :func:`~spark_imagenet.training.driver.launch.train` raise.
    """
    from spark_imagenet.dataset.sharding import shard
    from spark_imagenet.training.driver.launch import train

    config = demo_config(config, **settings)
    ensure_console()
    temporary = workdir is None
    root = Path(tempfile.mkdtemp(prefix="spark-imagenet-demo-") if temporary else workdir).absolute()
    try:
        source = root / "kaggle"
        _generate(source, num_classes)
        bucket = root / "bucket"
        workers = config.scaling.workers
        shard(source, bucket, train_shards=max(8, workers), val_shards=max(2, min(workers, 4)))
        logger.info(f"demo: training on {bucket} with {workers} barrier workers")
        return train(spark, str(bucket), config)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
