"""The training job's one configuration type.

:class:`TrainConfig`: every setting of a training job (what ``spark-imagenet
train`` takes as options or as keys of a TOML job file, and what
:func:`spark_imagenet.training.driver.launch.train` takes as a config object), in five sections
(:mod:`spark_imagenet.training.job.sections`): ``scaling``, ``data``, ``recipe``, ``run`` and ``tracking``.
Validated once, when it is built. What each TensorFlow worker process reads is
:class:`spark_imagenet.training.job.plan.WorkerSpec`.

A frozen dataclass serialised with ``to_json``/``from_json``, a versioned document
(:class:`~spark_imagenet.storage.envelope.Envelope`) like :class:`spark_imagenet.dataset.manifest.Manifest`.
Job files: :mod:`spark_imagenet.training.job.jobfile`; how each setting is checked:
:mod:`spark_imagenet.training.job.settings`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from spark_imagenet.errors import ConfigError
from spark_imagenet.storage.envelope import Envelope
from spark_imagenet.training.job.sections import (  # noqa: F401 - the constants, importable from here too
    CROSS_DEVICE_OPS,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_STEP_TIMEOUT_S,
    OPTIMIZERS,
    PRECISIONS,
    RECIPE_KEYS,
    SECTION_OF,
    SECTIONS,
    STRATEGIES,
    DataConfig,
    RecipeConfig,
    RunConfig,
    ScalingConfig,
    TrackingConfig,
)
from spark_imagenet.training.job.settings import (
    check_unknown_keys,
    setting_error,
)

#: The JSON form of a :class:`TrainConfig` (inside a worker spec; ``to_json``).
ENVELOPE = Envelope("spark-imagenet-train-config", 1, "spark-imagenet training config",
                    remedy="use the same spark-imagenet version on the driver and executors")
#: The TensorFlow worker's exit status when ``--step-timeout`` passed without a finished step
#: (:mod:`spark_imagenet.training.worker.watchdog`); its barrier task then raises WorkerLost.
EXIT_STEP_TIMEOUT = 3
#: The largest seed TensorFlow and NumPy take (2**32 - 1).
MAX_SEED = 2**32 - 1


# -------------------------------------------------------------- the job
@dataclasses.dataclass(frozen=True, init=False)
class TrainConfig:
    """Every setting of one training job, in five sections; validated when built.

    Build it from sections, from settings by name, or both (a setting by name replaces its section's)::

        >>> by_name = TrainConfig(workers=8, epochs=90, output="gs://b/runs/a")
        >>> by_section = TrainConfig(scaling=ScalingConfig(workers=8), recipe=RecipeConfig(epochs=90),
        ...                          run=RunConfig(output="gs://b/runs/a"))
        >>> by_name == by_section
        True

    Each setting is read in its section (``config.recipe.epochs``); :meth:`keys` lists the names, and
    :meth:`replace` and the constructor take settings by name.

    Attributes:
        scaling: workers, GPUs, strategy and Spark master (:class:`~.sections.ScalingConfig`).
        data: shard fetching and the input pipeline (:class:`~.sections.DataConfig`).
        recipe: the model and how it is trained (:class:`~.sections.RecipeConfig`).
        run: outputs, checkpoints, restarts and time limits (:class:`~.sections.RunConfig`).
        tracking: MLflow tracking (:class:`~.sections.TrackingConfig`).

    Raises:
        ConfigError: an unknown setting name (with the closest one), a section of the wrong type, or
            what a section raises (a value of the wrong type or out of range, an unknown model, ...);
            the message names the key and its command-line option.

    Example:

    ```python
    >>> from spark_imagenet import RecipeConfig, TrainConfig
    >>> config = TrainConfig(workers=8, recipe=RecipeConfig(model="resnet50", epochs=90),
    ...                      output="gs://my-bucket/runs/resnet-8")
    >>> longer = config.replace(epochs=120)
    >>> print(config.recipe.epochs, longer.recipe.epochs, config.global_batch_size)
    90 120 256

    ```
    """

    scaling: ScalingConfig
    data: DataConfig
    recipe: RecipeConfig
    run: RunConfig
    tracking: TrackingConfig

    def __init__(self, scaling: ScalingConfig | Mapping[str, Any] | None = None,
                 data: DataConfig | Mapping[str, Any] | None = None,
                 recipe: RecipeConfig | Mapping[str, Any] | None = None,
                 run: RunConfig | Mapping[str, Any] | None = None,
                 tracking: TrackingConfig | Mapping[str, Any] | None = None, **settings: Any) -> None:
        check_unknown_keys(settings, self.keys(), "TrainConfig")
        given = {"scaling": scaling, "data": data, "recipe": recipe, "run": run, "tracking": tracking}
        for name, cls in SECTIONS:
            mine = {key: value for key, value in settings.items() if SECTION_OF[key] == name}
            object.__setattr__(self, name, _section(name, cls, given[name], mine))
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.data.seed + self.scaling.workers - 1 > MAX_SEED:  # each worker seeds with seed + rank
            raise setting_error("seed", f"seed (--seed) {self.data.seed} is too large: with {self.scaling.workers} worker(s) it "
                                        f"must be at most {MAX_SEED - self.scaling.workers + 1} (worker seeds are seed + "
                                        "rank, at most 2**32 - 1)", self.data.seed)

    # ---------------------------------------------------------- building
    @classmethod
    def keys(cls) -> list[str]:
        """The setting names, section by section, in job-file order."""
        return list(SECTION_OF)

    @classmethod
    def settings(cls) -> list[tuple[str, dataclasses.Field]]:
        """Every setting's definition: ``(section name, field)`` pairs in job-file order; the field's
        ``metadata["rule"]`` is its :class:`~spark_imagenet.training.job.settings.Rule`."""
        return [(name, f) for name, section in SECTIONS for f in dataclasses.fields(section)]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "the training settings") -> "TrainConfig":
        """Build from ``{key: value}`` (a job file's settings, keyword arguments).

        Args:
            values: settings by name (sections by name too); missing keys take their defaults.
            where: named in the message of an unknown key.

        Raises:
            ConfigError: an unknown key (with the closest known name and the
                list of known keys), or an invalid value.
        """
        check_unknown_keys(values, [*(name for name, _ in SECTIONS), *cls.keys()], where)
        return cls(**values)

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with ``changes`` (settings or sections by name) applied, validated again."""
        return dataclasses.replace(self, **changes)

    @property
    def spark_conf(self) -> dict[str, str]:
        """:attr:`conf` as a dict."""
        return self.scaling.spark_conf

    @property
    def global_batch_size(self) -> int:
        """``workers * batch_size``: images per synchronous step of the whole cluster."""
        return self.scaling.workers * self.recipe.batch_size

    # ------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        """A JSON object with the format name and version, then every setting by name (flat)."""
        data: dict[str, Any] = {key: getattr(getattr(self, SECTION_OF[key]), key) for key in self.keys()}
        data["conf"] = dict(self.scaling.conf)
        return ENVELOPE.to_json(data)

    @classmethod
    def from_json(cls, data: Any, where: str = "train config") -> "TrainConfig":
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: not an object of this format and version, or invalid values.
        """
        fields = ENVELOPE.from_json(data, where)
        return cls.from_mapping(fields, where)


def _section(name: str, cls: type, given: Any, settings: Mapping[str, Any]) -> Any:
    """Section ``name`` of a :class:`TrainConfig`: ``given`` (a section or a mapping of its settings, or None)
    with ``settings`` applied.

    Raises:
        ConfigError: ``given`` is neither, or a setting is invalid.
    """
    if given is None:
        return cls(**settings)
    if isinstance(given, Mapping):
        check_unknown_keys(given, [f.name for f in dataclasses.fields(cls)], f"TrainConfig section {name!r}")
        return cls(**{**given, **settings})
    if not isinstance(given, cls):
        raise ConfigError(f"TrainConfig section {name!r} must be a {cls.__name__} (or a mapping of its settings), "
                          f"got {type(given).__name__}", key=name, value=given)
    return dataclasses.replace(given, **settings) if settings else given
