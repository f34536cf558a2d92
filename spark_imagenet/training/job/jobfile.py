"""TOML job files: read (:func:`load_job_file`), written (:func:`dump_job`) and merged (:func:`resolve_job`).

A job file holds the dataset's ``url`` and the settings of
:class:`~spark_imagenet.training.job.config.TrainConfig`, each in the table of its section; every key is
optional and the command line overrides the file::

    url = "gs://bucket/imagenet"      # the dataset (or give it on the command line)

    [scaling]
    workers = 8

    [scaling.conf]                    # extra Spark configuration
    "spark.executor.memory" = "8g"

    [recipe]
    epochs = 90
    batch_size = 128

Files written before the sections existed (every setting at the top level, Spark settings under
``[conf]``) are read as they are. ``conf/job.example.toml`` lists every key with its default. Files are
read with :mod:`tomllib` and written with ``tomli_w``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Mapping

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.job.config import TrainConfig
from spark_imagenet.training.job.sections import RECIPE_KEYS, SECTION_OF, SECTIONS
from spark_imagenet.training.job.settings import check_unknown_keys

#: Keys of a job file besides the settings and their sections.
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
            _check_not_a_broken_url(key, value)
            out[key] = str(Path(base, Path(value).expanduser()).absolute())
    return out


def _check_not_a_broken_url(key: str, value: str) -> None:
    """Refuse a store URL written without its ``//`` (``gs:/bucket/x``, ``s3:bucket``), which would otherwise be
    taken as a relative local path and reported missing in the working directory.

    Raises:
        ConfigError: ``value`` begins with a store's scheme and a colon (names ``key`` and the URL it means).
    """
    from spark_imagenet.storage import is_remote_url

    if is_remote_url(value):
        scheme, rest = value.split(":", 1)
        raise ConfigError(f"{key} {value!r} is not a URL: a {scheme}:// URL has two slashes after '{scheme}:'; "
                          f"write {scheme}://{rest.lstrip('/')}", key=key, value=value)


def load_job_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML job file into ``{setting: value}``, every key checked.

    Values are checked later, when the :class:`TrainConfig` is built (the
    command line merges its options over these first). Relative paths
    (``url``, ``cache``, ``results``, ``output``, ``checkpoint_dir``) are
    relative to the job file's folder, and are returned absolute.

    Args:
        path: the job file.

    Returns:
        dict: the file's settings by name (``url`` and the settings of every section, flat).

    Raises:
        ConfigError: the file is missing or unreadable, is not valid TOML
            (with the line), has an unknown key (with the closest known
            name and the list of known keys), a setting in another section's
            table (naming the right one), or the same setting twice.
    """
    p = Path(path).expanduser()
    try:
        text = p.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {path}: cannot read the job file ({e})", key="--config", value=str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not a valid TOML file: {e}", key="--config", value=str(path)) from None
    where = f"job file {path}"
    sections = [name for name, _ in SECTIONS]
    check_unknown_keys(data, [*JOB_FILE_EXTRA_KEYS, *sections, *TrainConfig.keys()], where)
    values = {key: value for key, value in data.items() if key not in sections}  # the flat form of old files
    for name in sections:
        if name in data:
            _merge_section(values, name, data[name], where)
    if "url" in values and (not isinstance(values["url"], str) or not values["url"]):
        raise ConfigError(f"{where}: url must be a dataset URL string, got {values['url']!r}", key="url",
                          value=values["url"])
    for key, table in (("conf", "[scaling.conf] with \"spark.key\" = \"value\" lines"),
                       ("mlflow_tags", "[tracking.mlflow_tags] with key = \"value\" lines, or { key = \"value\" }")):
        if key in values and not isinstance(values[key], dict):
            raise ConfigError(f"{where}: {key} must be a table ({table}), got {values[key]!r:.200}", key=key,
                              value=values[key])
    return absolute_paths(values, p.absolute().parent)


def _merge_section(values: dict[str, Any], name: str, table: Any, where: str) -> None:
    """Add the settings of the job file's ``[name]`` table to ``values``.

    Raises:
        ConfigError: not a table, a key of another section or of none, or a setting also given elsewhere.
    """
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: {name} must be a table ([{name}] with its settings), got {table!r:.200}", key=name,
                          value=table)
    for key in table:
        if SECTION_OF.get(key) not in (None, name):
            raise ConfigError(f"{where}: [{name}] has no setting {key!r}: it belongs in [{SECTION_OF[key]}]",
                              key=key)
    check_unknown_keys(table, [key for key in TrainConfig.keys() if SECTION_OF[key] == name], f"{where}, [{name}]")
    for key, value in table.items():
        if key in values:
            raise ConfigError(f"{where}: {key} is given twice (at the top level and in [{name}]); keep one", key=key)
        values[key] = value


#: The settings written as a table of ``KEY = "VALUE"`` lines (``[scaling.conf]``, ``[tracking.mlflow_tags]``).
TABLE_KEYS = ("conf", "mlflow_tags")

#: Significant digits of the floats :func:`dump_job` writes (``0.3``, not ``0.30000000000000004``).
FLOAT_DIGITS = 6


def _shown(value: Any) -> Any:
    """``value`` with every float in it (lists and tuples included) rounded to :data:`FLOAT_DIGITS`
    significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{FLOAT_DIGITS}g}")
    if isinstance(value, (list, tuple)):
        return [_shown(v) for v in value]
    return value


def dump_job(config: TrainConfig, url: str | None = None) -> str:
    """The job as TOML text that :func:`load_job_file` reads back to the same job, one table per section.

    Floats are written with :data:`FLOAT_DIGITS` significant digits (``learning_rate = 0.3`` for
    ``0.1 * 3``; a value given with more digits reads back rounded to them).
    Settings left at None (no value) are omitted; ``conf`` becomes a ``[scaling.conf]`` table. A recipe
    setting (:data:`~spark_imagenet.training.job.sections.RECIPE_KEYS`) equal to the model's recipe for these
    epochs is written as a comment: the file then takes the recipe's values again when read with another
    ``--model`` or ``--epochs`` (a warm-up stated as 5 of 90 epochs stays 5 of 90).

    Args:
        config: the resolved job.
        url: the dataset URL, written first when given.

    Returns:
        str: TOML text.
    """
    import tomli_w

    from spark_imagenet.training.job.model_specs import recipe_for

    recipe = recipe_for(config.recipe.model)
    parts = [] if url is None else [tomli_w.dumps({"url": url})]
    for name, _ in SECTIONS:
        table: dict[str, Any] = {}
        derived = []
        for key in (key for key in TrainConfig.keys() if SECTION_OF[key] == name):
            value = getattr(getattr(config, name), key)
            if key in RECIPE_KEYS and value == recipe.value(key, config.recipe.epochs):
                derived.append(f"# {tomli_w.dumps({key: _shown(value)}).strip()}  (the {config.recipe.model} recipe's)\n")
            elif key in TABLE_KEYS:
                if value:
                    table[key] = dict(value)
            elif value is not None:
                table[key] = _shown(value)
        # left to the recipe as comments, so that another --model or --epochs derives its own values
        parts.append(tomli_w.dumps({name: table}) + "".join(derived))
    return "\n".join(parts)


def resolve_job(layers: list[Mapping[str, Any]]) -> TrainConfig:
    """Merge settings, later layers winning (``conf`` merged key by key), and build the config.

    Args:
        layers: e.g. ``[defaults, job file, command line]``, each ``{setting: value}``; None values do
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
            elif key in TABLE_KEYS and value is not None:
                merged[key] = dict(value.items() if isinstance(value, Mapping) else value)
            elif value is not None:
                merged[key] = value
    merged.pop("url", None)
    return TrainConfig.from_mapping({**merged, "conf": conf})
