"""Files shipped inside the package (package data), found where the package is installed.

* ``gpu-discovery.sh`` (:data:`GPU_DISCOVERY_SCRIPT`): Spark's GPU resource
  discovery script, the same file as ``conf/gpu-discovery.sh`` of the
  repository (in the repository this package's copy is a symbolic link to it;
  a wheel holds its content). ``python -m spark_imagenet.submit
  --gpu-discovery-script`` prints its installed path.
* ``log4j2-quiet.properties`` (:data:`QUIET_LOG4J2`): the log4j2 configuration
  given to the driver JVMs the command line starts itself
  (:func:`spark_imagenet.training.driver.spark_session.quiet_logging_conf`).

``[tool.setuptools.package-data]`` in ``pyproject.toml`` puts them in the wheel.
"""

from __future__ import annotations

import os
from pathlib import Path

from spark_imagenet.errors import EnvironmentSetupError

#: File name of the GPU discovery script (``spark.executor.resource.gpu.discoveryScript``).
GPU_DISCOVERY_SCRIPT = "gpu-discovery.sh"
#: File name of the quiet log4j2 configuration of the driver JVMs this package starts.
QUIET_LOG4J2 = "log4j2-quiet.properties"

_HERE = Path(__file__).resolve().parent


def resource_path(name: str) -> Path:
    """The absolute path of a file shipped in this package, where it is installed.

    Args:
        name: the file's name, e.g. ``"gpu-discovery.sh"`` (a plain name, no folders).

    Returns:
        pathlib.Path: the installed file (in a source checkout, the package's
        symbolic link where the file is one; it is not resolved).

    Raises:
        EnvironmentSetupError: ``name`` is not a plain file name, or no such
            file is installed (the message names it, the folder looked in and
            the files that are there).
    """
    if not name or name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        raise EnvironmentSetupError(f"{name!r} is not the name of a file shipped with spark-imagenet "
                                    "(give a plain file name such as 'gpu-discovery.sh')")
    path = _HERE / name
    if not path.is_file():
        shipped = sorted(p.name for p in _HERE.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc"))
        raise EnvironmentSetupError(
            f"spark-imagenet ships no file {name!r}: {path} does not exist (or is a broken link). The package's "
            f"files there: {', '.join(shipped) or 'none'}. If it should be one of them, reinstall spark-imagenet")
    return path


def gpu_discovery_script() -> Path:
    """The installed path of the GPU discovery script, for ``spark.executor.resource.gpu.discoveryScript``.

    Spark runs the script itself (it executes the path it is given, not
    ``bash PATH``), so the file must be executable by the user the executor
    runs as. pip installs it executable (the wheel records the mode, which
    pip restores); a copy made otherwise needs ``chmod +x``. The path is on
    this machine: for a cluster, the same path must exist on every worker
    host, so copy the file there (or ship it with ``--files`` and name
    ``./gpu-discovery.sh``).

    Returns:
        pathlib.Path: the absolute path of ``gpu-discovery.sh``.

    Raises:
        EnvironmentSetupError: the file is missing from the installation.
    """
    return resource_path(GPU_DISCOVERY_SCRIPT)
