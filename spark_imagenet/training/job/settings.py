"""How each training setting is checked: the rules behind :class:`~spark_imagenet.training.job.config.TrainConfig`.

A setting is a dataclass field made with :func:`setting`, which keeps its :class:`Rule` (kind, bounds,
choices, command-line option, help) in the field's metadata. From that one definition
:func:`validate_fields` checks and normalises every field when a section is built, the command line
generates its options (:mod:`spark_imagenet.training.job.options`) and the job file is read and written
(:mod:`spark_imagenet.training.job.jobfile`). Errors are :class:`~spark_imagenet.errors.ConfigError`
naming the setting and its option (``workers (--workers) must be an integer, got 'two'``), with the
setting kept as ``.key``.

The same rules check the values of the job's records that other processes read: a checkpoint's
``checkpoint.json`` (:mod:`spark_imagenet.training.job.checkpoints`: a setting's value by the setting's
rule) and the TensorFlow worker's ``worker.json`` (:class:`~spark_imagenet.training.job.plan.WorkerSpec`);
:data:`FACTS` holds the rules of the values they share that are not settings, and :func:`check_value`'s
``place`` words where the value is (``worker.json: key 'rank'``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from typing import Any, Mapping

from spark_imagenet.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one field is checked: its kind, bounds and the option that sets it."""

    kind: str  # "int", "float", "str", "bool", "path", "strings", "epochs", "range", "conf"
    minimum: float | None = None
    positive: bool = False
    optional: bool = False
    option: str | None = None
    help: str = ""
    choices: tuple[str, ...] = ()  # for kind "str": the allowed values (empty = any)


#: The rules of the values a job's records carry that are not settings, one per name, shared by every record
#: that carries one: the dataset's id and class count (``checkpoint.json``, ``worker.json``).
FACTS = {"dataset_id": Rule("str"), "num_classes": Rule("int", minimum=1)}


def setting(default: Any = dataclasses.MISSING, *, kind: str, help: str = "", minimum: float | None = None,
            positive: bool = False, optional: bool = False, option: str | None = None,
            choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field carrying its :class:`Rule` in ``metadata["rule"]``."""
    rule = Rule(kind, minimum, positive, optional, option, help, choices)
    return dataclasses.field(default=default, metadata={"rule": rule})


def setting_error(key: str, message: str, value: Any = None) -> ConfigError:
    """A ConfigError about setting ``key`` (kept as ``.key``, so callers can say where the value came from),
    its bad ``value`` kept as ``.value``."""
    return ConfigError(message, key=key, value=value)


def _label(name: str, rule: Rule) -> str:
    return f"{name} ({rule.option})" if rule.option else name


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bound(name: str, value: float, rule: Rule, label: str, what: str) -> None:
    if rule.minimum is not None and value < rule.minimum:
        raise setting_error(name, f"{label} must be {what} >= {rule.minimum:g}, got {value!r}", value)


def _flat_conf(value: Any, label: str, name: str, prefix: str = "") -> list[tuple[str, str]]:
    """Spark settings as ``(key, value)`` pairs from a mapping or pairs; nested tables (TOML's
    unquoted dotted keys: ``spark.executor.memory = "4g"``) are joined with dots."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(i, (list, tuple)) and len(i) == 2 for i in value):
        items = [tuple(i) for i in value]
    else:
        raise setting_error(name, f"{label} must be a table of Spark settings (KEY = \"VALUE\"), got {value!r:.200}",
                            value)
    pairs = []
    for key, val in items:
        if not isinstance(key, str) or not key.strip():
            raise setting_error(name, f"{label}: {key!r} is not a Spark setting name", key)
        full = f"{prefix}{key.strip()}"
        if isinstance(val, Mapping):
            pairs.extend(_flat_conf(val, label, name, f"{full}."))
        elif isinstance(val, (list, tuple, set)) or val is None:
            raise setting_error(name, f"{label}: {full} = {val!r} is not a Spark setting value (a string, number "
                                      "or boolean)", val)
        else:
            pairs.append((full, str(val).lower() if isinstance(val, bool) else str(val).strip()))
    return pairs


def check_value(name: str, rule: Rule, value: Any, place: str | None = None) -> Any:
    """Check one value by its rule: a setting's (:func:`validate_fields`), or another record's field by the same
    rule (a checkpoint's ``checkpoint.json``, a worker's ``worker.json``).

    Args:
        name: the field's name.
        rule: how it is checked.
        value: the value.
        place: the words the message starts with, naming where the value is (e.g. ``"worker spec of rank 1: key
            'rank'"``); default: ``name``, with the rule's option if it has one (``"workers (--workers)"``).

    Returns:
        The value converted to the field's type (an int to a float for ``"float"``, a list to a tuple, ...).

    Raises:
        ConfigError: the value is of the wrong type or out of bounds: ``"<place> must be ..., got <value>"``;
            keeps ``name`` as ``.key``.
    """
    label = _label(name, rule) if place is None else place
    if value is None:
        if rule.optional:
            return None
        raise setting_error(name, f"{label} is required")
    if rule.kind == "int":
        if not _is_int(value):
            raise setting_error(name, f"{label} must be an integer, got {value!r}", value)
        _bound(name, value, rule, label, "an integer")
        return int(value)
    if rule.kind == "float":
        if not (_is_int(value) or isinstance(value, float)) or not math.isfinite(value):
            bound = " > 0" if rule.positive else f" >= {rule.minimum:g}" if rule.minimum is not None else ""
            raise setting_error(name, f"{label} must be a number{bound}, got {value!r}", value)
        if rule.positive and not value > 0:
            raise setting_error(name, f"{label} must be a positive number, got {value!r}", value)
        _bound(name, value, rule, label, "a number")
        return float(value)
    if rule.kind == "bool":
        if not isinstance(value, bool):
            raise setting_error(name, f"{label} must be true or false, got {value!r}", value)
        return value
    if rule.kind == "path":
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise setting_error(name, f"{label} must be a path, got {value!r}", value)
        return os.fspath(value)
    if rule.kind == "strings":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
            raise setting_error(name, f"{label} must be a list of non-empty strings, got {value!r:.200}", value)
        return tuple(value)
    if rule.kind == "str":
        if not isinstance(value, str) or not value.strip():
            raise setting_error(name, f"{label} must be a non-empty string, got {value!r}", value)
        if rule.choices and value not in rule.choices:
            raise setting_error(name, f"{label} must be one of {', '.join(rule.choices)}, got {value!r}", value)
        return value
    if rule.kind == "epochs":
        return _epochs(name, label, value)
    if rule.kind == "range":
        return _fraction_range(name, label, value)
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
            raise setting_error(name, f"{label} must be epochs separated by commas, e.g. 30,60,80, "
                                      f"got {value!r}", value) from None
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, (list, tuple)) \
            or not all(_number(v) and v > 0 for v in value):
        raise setting_error(name, f"{label} must be a list of positive epoch numbers, e.g. [30, 60, 80], "
                                  f"got {value!r:.200}", value)
    epochs = tuple(float(v) for v in value)
    if any(b <= a for a, b in zip(epochs, epochs[1:])):
        raise setting_error(name, f"{label} must be increasing, got {', '.join(f'{e:g}' for e in epochs)}", value)
    return epochs


def _fraction_range(name: str, label: str, value: Any) -> tuple[float, float]:
    """``(low, high)`` with ``0 < low <= high <= 1``."""
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(_number(v) for v in value) \
            or not 0 < value[0] <= value[1] <= 1:
        raise setting_error(name, f"{label} must be two fractions MIN MAX with 0 < MIN <= MAX <= 1 (e.g. 0.08 1.0), "
                                  f"got {value!r:.200}", value)
    return (float(value[0]), float(value[1]))


def validate_fields(obj: Any) -> None:
    """Check and normalise every field of a frozen dataclass by its rule."""
    for f in dataclasses.fields(obj):
        rule = f.metadata.get("rule")
        if rule is not None:
            object.__setattr__(obj, f.name, check_value(f.name, rule, getattr(obj, f.name)))


def check_unknown_keys(given: Mapping[str, Any], known: list[str], where: str) -> None:
    """Raise a ConfigError naming every unknown key, its closest known name, and the known keys."""
    unknown = [k for k in given if k not in known]
    if not unknown:
        return
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key).replace("-", "_"), known, n=1, cutoff=0.6)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ConfigError(f"{where}: unknown key(s) {', '.join(parts)}; the known keys are: {', '.join(known)}",
                      key=str(unknown[0]), value=given[unknown[0]])
