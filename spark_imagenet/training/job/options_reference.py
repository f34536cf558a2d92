"""The reference of every ``spark-imagenet train`` setting, as Markdown, generated from :class:`TrainConfig`.

Each setting of :class:`~spark_imagenet.training.job.config.TrainConfig` is one row of its section's table: its command-line option,
its job-file (TOML) key, its type, its default and its help, read from the same field definitions that the
command line and the job file are generated from. ``docs/options.md`` is this module's output;
``tests/test_docs.py`` regenerates it and compares, so the committed file cannot drift from the code.

Usage::

    python -m spark_imagenet.training.job.options_reference > docs/options.md

No TensorFlow and no Spark are imported.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from spark_imagenet.storage import url_forms
from spark_imagenet.training.job.config import RECIPE_KEYS, TrainConfig
from spark_imagenet.training.job.sections import SECTIONS
from spark_imagenet.training.job.model_specs import MODELS

#: The text above the table.
HEADER = """\
# `spark-imagenet train` options

Generated from `spark_imagenet.training.job.config.TrainConfig` by
`python -m spark_imagenet.training.job.options_reference > docs/options.md`; `tests/test_docs.py` checks that
this file is what that command prints. Do not edit it by hand.

Every option is also a key of a TOML job file (`--config JOB.toml`; `conf/job.example.toml` lists them
with their defaults) and a keyword of `spark_imagenet.train(spark, url, ...)` and of `TrainConfig(...)`.
Options given on the command line override the job file; `--print-config` prints the resolved job as TOML.
A value is checked once, when the job is built, and a bad one is refused naming the key and its option.

The settings come in five sections, one table each in a job file (`[scaling]`, `[data]`, `[recipe]`,
`[run]`, `[tracking]`); `TrainConfig(scaling=ScalingConfig(...), ...)` takes them by section, `TrainConfig(workers=8)` and
a flat job file by name.

| option | job-file key | type | default | what it does |
|---|---|---|---|---|
| `URL` (argument) | `url` | dataset URL | (required) | the sharded dataset, holding `manifest.json`: @URL_FORMS@ |
| `--config JOB.toml` | | path | | read the settings from this TOML job file |
| `--print-config` | | flag | | print the resolved job as TOML and exit, without starting Spark |
"""

#: The head of each section's table.
TABLE_HEAD = "| option | job-file key | type | default | what it does |\n|---|---|---|---|---|\n"


def _kind(rule: Any) -> str:
    """The type column: what a value of this field is, in a user's words."""
    names = {"int": "integer", "float": "number", "bool": "true/false", "path": "local path",
             "str": "string", "epochs": "epochs, e.g. `30,60,80`", "range": "two fractions `MIN MAX`",
             "conf": "`KEY=VALUE` (repeatable); a table in a job file"}
    text = names.get(rule.kind, rule.kind)
    if rule.choices:
        text = "one of " + ", ".join(f"`{c}`" for c in rule.choices)
    elif rule.kind in ("int", "float") and rule.minimum is not None:
        text += f" ≥ {rule.minimum:g}"
    elif rule.kind == "float" and rule.positive:
        text += " > 0"
    return text


def _value(value: Any) -> str:
    """A default as it reads in a job file: ``true``, ``0.5``, ``"alexnet"``, ``[0.08, 1.0]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return f"{value:g}" if value != int(value) else f"{value:.1f}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _default(field: dataclasses.Field, rule: Any) -> str:
    """The default column: the value, the models' recipe values, or what an unset setting means."""
    if field.name in RECIPE_KEYS:
        parts = []
        for model in sorted(MODELS):
            value = getattr(MODELS[model].recipe, field.name)
            parts.append(f"{model} `{_value(value)}`")
        scaled = " epochs of 90, scaled to `epochs`" if field.name == "warmup_epochs" else ""
        return "the model's recipe: " + ", ".join(parts) + scaled
    if field.default is None:
        return "(required)" if not rule.optional else "none"
    if field.default == ():
        return "none"
    return f"`{_value(field.default)}`"


def _option(field: dataclasses.Field, rule: Any) -> str:
    """The option column: the flag and its argument (a ``--no-...`` flag sets the key to false)."""
    if rule.kind == "bool":
        return f"`{rule.option}`" + (" (sets `false`)" if field.default is True else "")
    metavar = {"range": "MIN MAX", "epochs": "E1,E2,...", "conf": "KEY=VALUE"}.get(rule.kind,
                                                                                    field.name.upper())
    return f"`{rule.option} {metavar}`"


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def rows(section: str) -> list[str]:
    """One Markdown table row per setting of the section named ``section``, in the job file's order."""
    out = []
    for name, field in TrainConfig.settings():
        if name != section:
            continue
        rule = field.metadata["rule"]
        help_text = rule.help
        if field.name == "model":
            sizes = (f"`{m}` (image size ≥ {MODELS[m].min_image_size})" for m in sorted(MODELS))
            help_text += ": " + ", ".join(sizes) \
                + ", or `package.module:function`, your own builder"
        cells = [_option(field, rule), f"`{field.name}`", _kind(rule), _default(field, rule), help_text]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return out


def render() -> str:
    """The whole reference as Markdown (what ``docs/options.md`` holds).

    Returns:
        str: the header, the table of every setting, and a closing newline.
    """
    parts = [HEADER.replace("@URL_FORMS@", url_forms())]
    for section, cls in SECTIONS:
        summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        summary = summary.replace(f" (``[{section}]``)", "").replace("``", "`")
        parts.append(f"\n## `[{section}]`\n\n{summary}\n\n" + TABLE_HEAD + "\n".join(rows(section)) + "\n")
    return "".join(parts)


def main() -> int:
    """Print :func:`render` to stdout; exit status 0."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
