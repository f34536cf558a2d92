"""The command-line options of a training job, generated from the settings' one definition.

:func:`add_train_options` gives an :mod:`argparse` parser one option per setting of
:class:`~spark_imagenet.training.job.config.TrainConfig` (``--workers``, ``--epochs``, ...), in one help
group per section (scaling, data, recipe, run: :mod:`spark_imagenet.training.job.sections`), with the type,
choices and help of the setting's :class:`~spark_imagenet.training.job.settings.Rule`, plus ``--config``
and ``--print-config``. ``spark-imagenet train`` and ``demo`` use it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Mapping

from spark_imagenet.arguments import (
    conf_pair,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    tag_pair,
)
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.sections import RECIPE_KEYS
from spark_imagenet.training.job.settings import Rule

#: The title of each section's group in ``--help``.
SECTION_TITLES = {
    "scaling": "scaling: workers, devices, Spark (each option is also a key of the job file's [scaling])",
    "data": "data: fetching and reading the shards ([data] in the job file)",
    "recipe": "recipe: the model and how it is trained ([recipe] in the job file)",
    "run": "run: outputs, checkpoints, restarts and time limits ([run] in the job file)",
    "tracking": "tracking: the job in MLflow ([tracking] in the job file)",
}


def add_train_options(parser: argparse.ArgumentParser, defaults: Mapping[str, Any]) -> None:
    """Add ``--config``, ``--print-config`` and one option per setting, grouped by section.

    Every setting's option defaults to None (= not given), so a job file's value is only overridden by an
    option the user typed; ``defaults`` (the command's own, e.g. the demo's) are shown in the help.

    Args:
        parser: the command's parser.
        defaults: the command's defaults by setting name, over the settings' own.
    """
    g = parser.add_argument_group("job file")
    g.add_argument("--config", metavar="JOB.toml", help="read the job's settings from this TOML file; options given "
                   "on the command line override it (conf/job.example.toml lists every key)")
    g.add_argument("--print-config", action="store_true",
                   help="print the fully resolved job as TOML and exit (without starting Spark)"
                   + ("; the demo's own --workdir and --classes are not part of it" if "workers" in defaults else ""))
    groups: dict[str, Any] = {}
    for section, f in TrainConfig.settings():
        if section not in groups:
            groups[section] = parser.add_argument_group(SECTION_TITLES[section])
        _add_option(groups[section], f, defaults.get(f.name, f.default))


def _add_option(group: Any, f: dataclasses.Field, default: Any) -> None:
    """The option of setting ``f``, its help ending with ``default`` (or the model's recipe, or required)."""
    from spark_imagenet.training.job.model_specs import MODELS

    rule: Rule = f.metadata["rule"]
    text = rule.help
    if f.name == "model":
        text += ": " + ", ".join(f"{m} (>= {MODELS[m].min_image_size} px)" for m in sorted(MODELS)) \
            + ", or package.module:function, your own builder (num_classes, image_size, width) -> tf_keras.Model"
    if rule.kind == "conf":
        group.add_argument(rule.option, type=conf_pair if f.name == "conf" else tag_pair, action="append", default=None, metavar="KEY=VALUE",
                           dest=f.name,
                           help=text + ", repeatable")
        return
    if rule.kind == "bool":  # an option that turns a default-on setting off is named --no-...
        group.add_argument(rule.option, action="store_const", const=not f.default, default=None, dest=f.name,
                           help=text + (" (default: off)" if not default and not f.default else ""))
        return
    if f.name in RECIPE_KEYS and default is None:
        text += _recipe_help(f.name)
    elif default is not None and default != ():
        text += f" (default: {' '.join(map(str, default)) if isinstance(default, tuple) else default})"
    elif not rule.optional and default != ():
        text += " (required, here or in the job file)"
    group.add_argument(rule.option, type=_option_type(rule), default=None, dest=f.name, help=text,
                       choices=rule.choices or None, **_option_shape(rule))


def _option_type(rule: Rule) -> Callable[[str], Any]:
    """The argparse type of a setting's rule."""
    if rule.kind == "int":
        return nonnegative_int if rule.minimum == 0 else positive_int
    if rule.kind == "float":
        return nonnegative_float if rule.minimum == 0 else positive_float
    if rule.kind == "conf":
        return conf_pair
    if rule.kind == "range":
        return positive_float
    return str


def _recipe_help(key: str) -> str:
    """" (default: the model's recipe; alexnet ..., resnet50 ...)" for a setting of :data:`RECIPE_KEYS`."""
    from spark_imagenet.training.job.model_specs import MODELS

    parts = []
    for model in sorted(MODELS):
        value = getattr(MODELS[model].recipe, key)
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{model} {text}")
    scaled = " epochs of 90, scaled to --epochs" if key == "warmup_epochs" else ""
    return " (default: the model's recipe; " + ", ".join(parts) + scaled + ")"


def _option_shape(rule: Rule) -> dict:
    """argparse's ``nargs``/``metavar`` for a setting kind taking several values."""
    if rule.kind == "range":
        return {"nargs": 2, "metavar": ("MIN", "MAX")}
    if rule.kind == "epochs":
        return {"metavar": "E1,E2,..."}
    return {}
