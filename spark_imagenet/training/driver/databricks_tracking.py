"""What the driver checks, before Spark starts, of MLflow tracking to a Databricks workspace (the tracking URI
``databricks`` or ``databricks://PROFILE``): an experiment the workspace can hold, and a workspace to send to.

Without network calls: the workspace's host must be known from the Databricks runtime (a job on a Databricks
cluster), from ``DATABRICKS_HOST``, or from the profile's ``host`` in the Databricks configuration file
(``DATABRICKS_CONFIG_FILE``, default ``~/.databrickscfg``), which is where every authentication method of the
Databricks SDK finds it. Whether the credentials are accepted is left to the workspace: a refusal then is a
warning, and the run is kept to send later (:mod:`spark_imagenet.training.driver.tracking`).
"""

from __future__ import annotations

import configparser
import os
from typing import Mapping

from spark_imagenet.errors import ConfigError

#: The profile of the URI ``databricks`` when ``DATABRICKS_CONFIG_PROFILE`` names none.
DEFAULT_PROFILE = "DEFAULT"


def is_databricks(uri: str) -> bool:
    """Whether the MLflow tracking URI ``uri`` is a Databricks workspace."""
    return uri == "databricks" or uri.startswith("databricks://")


def check_experiment(uri: str, experiment: str, default_experiment: str) -> None:
    """Refuse an experiment that a Databricks workspace cannot hold: it names experiments by workspace path.

    Args:
        uri: the tracking URI (nothing is checked unless :func:`is_databricks`).
        experiment: the experiment's name, or ``id:ID``.
        default_experiment: the name used when the job named none (said as such).

    Raises:
        ConfigError: ``experiment`` is neither an absolute path nor ``id:ID``.
    """
    if not is_databricks(uri) or experiment.startswith(("/", "id:")):
        return
    given = "no experiment was named" if experiment == default_experiment else f"the experiment {experiment!r}"
    raise ConfigError(f"MLflow tracks to the Databricks workspace ({uri}), which names experiments by workspace path, "
                      f"and {given}: pass --mlflow-experiment /Users/<you>/{experiment} (mlflow_experiment in the "
                      "job file, or MLFLOW_EXPERIMENT_NAME), or MLFLOW_EXPERIMENT_ID of an existing experiment")


def _profile_host(path: str, profile: str) -> bool:
    """Whether the Databricks configuration file at ``path`` gives ``profile`` a host (False: no such file).

    Raises:
        ConfigError: the file exists but cannot be read or parsed: a folder, not UTF-8, not INI (names it).
    """
    if not os.path.exists(path):
        return False
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:  # read_file, unlike read, does not skip what it cannot open
            parser.read_file(f)
    except (OSError, ValueError, configparser.Error) as e:  # ValueError: UnicodeDecodeError
        why = " ".join(str(e).split())
        raise ConfigError(f"the Databricks configuration file {path} cannot be read ({type(e).__name__}: {why}): "
                          "fix it (or, for the tracking URI databricks, set DATABRICKS_HOST and DATABRICKS_TOKEN "
                          "instead)") from None
    if profile == DEFAULT_PROFILE:
        return bool(parser.defaults().get("host"))
    return parser.has_section(profile) and bool(parser.get(profile, "host", fallback=""))


def check_workspace_known(uri: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse tracking to a Databricks workspace whose host is known from nowhere (see the module docstring).

    Args:
        uri: the tracking URI (nothing is checked unless :func:`is_databricks`).
        environ: the environment to read (default ``os.environ``).

    Raises:
        ConfigError: no host for ``uri``; names the profile, the configuration file and what to set.
    """
    env = os.environ if environ is None else environ
    if not is_databricks(uri) or env.get("DATABRICKS_RUNTIME_VERSION"):
        return
    named = uri.split("://", 1)[1] if "://" in uri else ""
    profile = named or env.get("DATABRICKS_CONFIG_PROFILE") or DEFAULT_PROFILE
    if not named and env.get("DATABRICKS_HOST"):
        return
    path = env.get("DATABRICKS_CONFIG_FILE") or os.path.join(os.path.expanduser("~"), ".databrickscfg")
    if _profile_host(path, profile):
        return
    raise ConfigError(f"MLflow tracks to the Databricks workspace ({uri}), but no workspace host was found for the "
                      f"profile {profile} in {path}" + ("" if named else " nor in DATABRICKS_HOST") + ": "
                      f"add a [{profile}] profile with host and token to {path} (`databricks auth login --profile "
                      f"{profile}` writes one)" + ("" if named else ", or set DATABRICKS_HOST and DATABRICKS_TOKEN")
                      + ", or give another --mlflow-tracking-uri")
