"""The ``pyspark.ml`` Params of :class:`~spark_imagenet.ml.classifier.ImageClassifier` and its model, and the one
mapping of their values onto the package's functions and settings.

Each Param feeds one argument: a keyword of :func:`~spark_imagenet.dataset.dataframe.shard_dataframe` or of
:func:`~spark_imagenet.training.driver.batch_predict.predict_dataframe`, or a training setting of
:class:`~spark_imagenet.training.job.config.TrainConfig`. The training Params are generated from the settings
themselves (name in camelCase, doc from the setting's help, default from the setting's), so a setting added to
the configuration is a Param too; the others come from :data:`SHARD` and :data:`PREDICT`, whose defaults are
read from the functions' signatures. No Param converts or checks its value: the functions and the configuration
check them when ``fit``/``transform`` run (:meth:`ParamTable.train_config`, :meth:`ParamTable.arguments`), and
:meth:`ParamTable.naming` rewrites their :class:`~spark_imagenet.errors.ConfigError` to name the Param.

No Spark and no TensorFlow here: importing this module imports ``pyspark.ml.param`` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from typing import Any, Callable, Iterator, Mapping

from pyspark.ml.param import Param, Params

from spark_imagenet.dataset.dataframe import shard_dataframe
from spark_imagenet.errors import ConfigError
from spark_imagenet.training.driver.batch_predict import predict_dataframe
from spark_imagenet.training.job.config import TrainConfig

#: The training settings that are no Param: the session is the DataFrame's (``train()`` with a session of one's
#: own ignores ``master`` and ``conf``).
NOT_PARAMS = ("master", "conf")
#: Training settings whose Param has another name than the setting's camelCase.
RENAMED = {"output": "outputPath", "results": "resultsPath"}
#: The command line's name of the settings (``--output``), for the messages that name one.
_OPTION = re.compile(r"--[a-z][a-z0-9-]*")


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One Param: its name, the argument it feeds, its doc and its default.

    Attributes:
        name: the Param's name, pyspark.ml's camelCase (``batchSize``).
        target: the keyword or setting name it feeds (``batch_size``).
        doc: one line for ``explainParams()``.
        default: its default; ``inspect.Parameter.empty``: none (required).
        option: the command line's option of a training setting (``--batch-size``), or None.
    """

    name: str
    target: str
    doc: str
    default: Any = inspect.Parameter.empty
    option: str | None = None

    @property
    def required(self) -> bool:
        """Whether the Param has no default."""
        return self.default is inspect.Parameter.empty


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _from_signature(function: Callable, docs: Mapping[str, tuple[str, str]]) -> tuple[ParamSpec, ...]:
    """``{keyword: (Param name, doc)}`` of ``function`` as Params, with its keywords' defaults."""
    parameters = inspect.signature(function).parameters
    return tuple(ParamSpec(name, keyword, doc, parameters[keyword].default) for keyword, (name, doc) in docs.items())


def _training() -> tuple[ParamSpec, ...]:
    """One Param per training setting but :data:`NOT_PARAMS`, from its rule (:meth:`TrainConfig.settings`)."""
    specs = []
    for _, field in TrainConfig.settings():
        if field.name in NOT_PARAMS:
            continue
        rule = field.metadata["rule"]
        doc = f"{rule.help} (train's {rule.option})" if rule.option else rule.help
        if rule.option and rule.option.startswith("--no-"):  # the help says what the option does: False
            doc = f"False: {doc}"
        specs.append(ParamSpec(RENAMED.get(field.name, _camel(field.name)), field.name, doc, field.default,
                               rule.option))
    return tuple(specs)


#: ``shard_dataframe``'s keywords as Params (``seed`` is the training setting's, which feeds both).
SHARD = _from_signature(shard_dataframe, {
    "out": ("datasetPath", "folder or bucket URL where fit() writes the TFRecord shards and manifest.json"),
    "image_col": ("imageCol", "the column of encoded image bytes (binary)"),
    "label_col": ("labelCol", "the class of each row: a name (string) or a class id 0..K-1 (integer)"),
    "split_col": ("splitCol", "a column of 'train'/'val' (null: by valFraction); None: none"),
    "name_col": ("nameCol", "a string column naming each row's file; None: path, else a hash of the bytes"),
    "val_fraction": ("valFraction", "share of the rows without a split that go to validation"),
    "train_shards": ("trainShards", "train shards (None: about 128 MiB each)"),
    "val_shards": ("valShards", "val shards (None: as train, at least 4)"),
    "verify": ("verify", "how images are checked while sharding: decode or header"),
    "on_corrupt": ("onCorrupt", "a bad image: error (fit fails, listing them) or skip (left out)"),
    "overwrite": ("overwriteDataset", "replace a different dataset already at datasetPath"),
    "max_image_pixels": ("maxImagePixels", "the most pixels (width x height) an image may have"),
    "resize": ("resize", "store the images as N x N (shorter side to N, centre kept; 256: the paper's form); "
                         "None: as the rows hold them"),
    "max_side": ("maxSide", "store the images with the longer side at most N, aspect kept; None: as they are"),
    "jpeg_quality": ("jpegQuality", "JPEG quality 1-100 of the images resize/maxSide re-encodes (None: 90)"),
    "seed": ("seed", "also the seed of the shards' split and order in fit()"),
})
#: ``predict_dataframe``'s keywords as Params.
PREDICT = _from_signature(predict_dataframe, {
    "model_url": ("outputPath", "the training run's --output folder: fit() trains into it, transform() "
                                "scores with its serving/ model"),
    "image_col": ("imageCol", "the column of encoded image bytes (binary)"),
    "top_k": ("topK", "classes per image, most probable first"),
    "batch_size": ("predictionBatchSize", "images per call of the model in transform()"),
    "output_col": ("predictionCol", "the column transform() adds: class_ids, wnids, names, probabilities, error"),
    "max_image_pixels": ("maxImagePixels", "the most pixels (width x height) an image may have"),
})
#: The training settings as Params.
TRAINING = _training()


@dataclasses.dataclass(frozen=True)
class ParamTable:
    """The Params of one ``pyspark.ml`` class and how their values become arguments.

    Attributes:
        owner: the class's name, for messages (``"ImageClassifier"``).
        groups: ``{group: specs}``: ``"shard"``, ``"predict"`` and/or ``"train"``; a Param may feed several
            groups (``imageCol``), and is declared once, with the default of its first spec and the docs of all.
    """

    owner: str
    groups: Mapping[str, tuple[ParamSpec, ...]]

    @property
    def specs(self) -> dict[str, ParamSpec]:
        """Every Param's first spec, by Param name, with the docs of all its specs."""
        found: dict[str, list[ParamSpec]] = {}
        for specs in self.groups.values():
            for spec in specs:
                found.setdefault(spec.name, []).append(spec)
        return {name: dataclasses.replace(specs[0], doc="; ".join(dict.fromkeys(s.doc for s in specs)))
                for name, specs in found.items()}

    def declare(self, cls: type) -> type:
        """Add each Param to ``cls`` as a class attribute with its ``getX``/``setX`` methods (pyspark.ml's
        convention); a class decorator."""
        for name, spec in self.specs.items():
            setattr(cls, name, Param(Params._dummy(), name, spec.doc))
            accessor = name[0].upper() + name[1:]
            setattr(cls, f"get{accessor}", _getter(name))
            setattr(cls, f"set{accessor}", _setter(name))
        return cls

    def defaults(self) -> dict[str, Any]:
        """``{Param name: default}`` of the Params that have one."""
        return {name: plain(spec.default) for name, spec in self.specs.items() if not spec.required}

    def check_names(self, given: Mapping[str, Any]) -> None:
        """Raise a ConfigError naming each unknown Param of ``given`` (with the closest name)."""
        from spark_imagenet.training.job.settings import check_unknown_keys

        check_unknown_keys(given, list(self.specs), f"{self.owner} params")

    def arguments(self, instance: Params, group: str) -> dict[str, Any]:
        """The keyword arguments (or settings) of ``group`` from ``instance``'s values.

        Raises:
            ConfigError: a required Param not set, named.
        """
        values = {}
        for spec in self.groups[group]:
            param = instance.getParam(spec.name)
            value = instance.getOrDefault(param) if instance.isDefined(param) else None
            if value is None and spec.required:
                raise ConfigError(f"{self.owner} param {spec.name!r} is required ({spec.doc}): set it, e.g. "
                                  f"{self.owner}({spec.name}=...)", key=spec.name)
            values[spec.target] = value
        return values

    def train_config(self, instance: Params) -> TrainConfig:
        """The :class:`TrainConfig` of ``instance``'s training Params, checked by the configuration itself.

        Raises:
            ConfigError: what :class:`TrainConfig` raises, naming the Param (:meth:`naming`).
        """
        with self.naming("train"):
            return TrainConfig(**self.arguments(instance, "train"))

    @contextlib.contextmanager
    def naming(self, group: str) -> Iterator[None]:
        """Inside, a :class:`ConfigError` about one argument of ``group`` is raised again naming its Param.

        The argument is the error's ``key`` (a training setting: :func:`~spark_imagenet.training.job.settings.
        setting_error`) or the ``keyword=`` its message begins with (``top_k=0: ...``); the message of one
        that names command-line options (the plan's checks: ``--output``) gets which Param each is.
        """
        try:
            yield
        except ConfigError as e:
            raise self.named(e, group) from None

    def named(self, error: ConfigError, group: str) -> ConfigError:
        """``error`` with its Param named (see :meth:`naming`), or ``error`` itself when no Param fits."""
        targets = {spec.target: spec.name for spec in self.groups[group]}
        key = error.key or str(error).partition("=")[0]
        if key in targets:
            return ConfigError(f"{self.owner} param {targets[key]!r}: {error}", key=targets[key], value=error.value)
        options = {spec.option: spec.name for spec in self.groups[group] if spec.option}
        named = [f"{option} is {options[option]!r}" for option in dict.fromkeys(_OPTION.findall(str(error)))
                 if option in options]
        return ConfigError(f"{error} (as {self.owner} params: {', '.join(named)})") if named else error


def plain(value: Any) -> Any:
    """``value`` with its tuples as lists, the form a Param holds: its JSON when saved, and what
    ``explainParams()`` can print (``"%s" % (0.08, 1.0)`` fails)."""
    return [plain(v) for v in value] if isinstance(value, tuple) else value


def _getter(name: str) -> Callable[[Params], Any]:
    def get(self: Params) -> Any:
        return self.getOrDefault(name)

    get.__name__, get.__doc__ = f"get{name[0].upper()}{name[1:]}", f"The value of Param ``{name}`` (or its default)."
    return get


def _setter(name: str) -> Callable[[Params, Any], Params]:
    def set_(self: Params, value: Any) -> Params:
        return self._set(**{name: plain(value)})

    set_.__name__, set_.__doc__ = f"set{name[0].upper()}{name[1:]}", f"Set Param ``{name}``; returns ``self``."
    return set_
