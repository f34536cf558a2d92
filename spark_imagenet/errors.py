"""Exceptions raised by spark-imagenet.

Every error a user can cause (bad input, bad setting, missing tool) is a
:class:`SparkImagenetError` whose message names the file or setting at fault
and says what to do. The command line prints the message alone, without a
traceback; library callers can catch the subclasses.
"""

from __future__ import annotations

import re


class SparkImagenetError(Exception):
    """Base class of every error this package raises on purpose.

    Args:
        message: the whole message: what is wrong, the setting or file at fault and what to do.
        key: the setting, option or field at fault, when there is one (``"batch_size"``, ``"--train-shards"``,
            ``"spark.executor.cores"``, ``"url"``); None otherwise.
        value: the bad value as it was given; None when there is none (a missing setting) or no ``key``.

    Attributes:
        key: ``key`` as given, so that callers and tests can tell which setting an error is about without
            reading its message.
        value: ``value`` as given.
    """

    def __init__(self, *args: object, key: str | None = None, value: object = None):
        super().__init__(*args)
        self.key = key
        self.value = value


class LayoutError(SparkImagenetError):
    """A source directory is not in the Kaggle ILSVRC CLS-LOC layout, or its
    CSV/mapping files disagree with its image folders."""


class ArchiveError(LayoutError):
    """A zip archive (the Kaggle download) cannot be used: truncated or
    corrupt, not one of the two Kaggle forms, or holding link members or
    members given twice."""


class ImageError(SparkImagenetError):
    """One or more image files cannot be stored (not a decodable JPEG)."""


class DataError(SparkImagenetError):
    """The rows of a DataFrame or table cannot be sharded as they are: none at all, a label that is
    null or of mixed kinds, a split value other than train/val (the message names the column and what to do)."""


class ManifestError(SparkImagenetError):
    """A manifest is missing, unreadable, of an unknown format version, or
    does not match the shards beside it."""


class StorageError(SparkImagenetError):
    """A bucket URL cannot be opened, read or written."""


class AccessError(StorageError):
    """Retrying cannot help: the bucket does not exist, or the credentials
    are missing, rejected (401) or lack a permission (403)."""


class IntegrityError(StorageError):
    """Bytes transferred do not match a checksum (the store's own or the
    manifest's): the one storage failure worth one more transfer."""


class PreconditionFailed(StorageError):
    """A create-only or compare-and-swap write lost: the object already
    exists, or changed since it was read (another writer got there first)."""


class ConfigError(SparkImagenetError):
    """A setting (command-line option, function argument or Spark
    configuration) has a value that cannot work."""


class ImageTooLarge(ConfigError):
    """An image has more pixels than the limit (``--max-image-pixels``; the check is
    :func:`spark_imagenet.dataset.pixels.open_image`).

    Args:
        message: the whole message: the file, its size, the limit and what to do.
        name: the file, as messages name it ("" when rebuilt from a message alone).
        reason: the message without the name (a shard build's list names the file its own way); the message
            when not given.
    """

    def __init__(self, message: str, *, name: str = "", reason: str = ""):
        super().__init__(message, key="max_image_pixels")
        self.name = name
        self.reason = reason or message


class EnvironmentSetupError(SparkImagenetError):
    """Something the job needs from the machine is missing (Java, a
    package, an interpreter)."""


class TrainingError(SparkImagenetError):
    """A barrier task or its TensorFlow child process failed.

    Attributes:
        failure: the :class:`~spark_imagenet.training.job.outcome.Failure` it was made from (its ``stage``,
            ``kind``, ``rank``, ...), set by ``Failure.to_error``/``as_error``; None for an error raised
            without one.
    """

    failure = None


class WorkerLost(TrainingError):
    """A worker died, stopped making progress or lost its peers while training: its TensorFlow process was
    killed or exited at start-up, a collective aborted, or ``--step-timeout`` passed without a step. Such a
    failure may not recur, so the driver launches the barrier stage again (``--max-restarts``) from the
    latest checkpoint; any other error (bad data, bad settings) ends the job at once."""


class PeerFailed(TrainingError):
    """Raised inside every barrier task when a task of the stage came to the rendezvous with a failure
    (:func:`spark_imagenet.training.task.rendezvous.rendezvous`); the failing task then raises its own error.

    Attributes:
        failures: ``{rank: reason}`` of the tasks that failed before the rendezvous.
    """

    def __init__(self, message: str, failures: dict[int, str] | None = None):
        super().__init__(message)
        self.failures = dict(failures or {})


class DownloadError(SparkImagenetError):
    """A download from Kaggle cannot start or did not finish: credentials
    missing or rejected, competition rules not accepted, unknown competition,
    not enough disk space, or a transfer the client could not complete (run
    the same command again to resume)."""


def spark_reason(exc: BaseException) -> str:
    """The reason in a Py4J/PySpark error, for a one-line message.

    Args:
        exc: the exception PySpark or Py4J raised.

    Returns:
        str: the first line that is neither a JVM stack frame nor Py4J's
        "An error occurred while calling ..." preamble; a Java exception's
        line loses its package name (``IllegalArgumentException: ...``).
    """
    lines = [ln.strip().removeprefix(": ") for ln in str(exc).splitlines()
             if ln.strip() and not ln.strip().startswith("at ")]
    reasons = [ln for ln in lines if not ln.startswith("An error occurred while calling")]
    if not reasons:
        return lines[0] if lines else type(exc).__name__
    first = reasons[0]
    java = re.match(r"^(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error)): (.*)$", first)
    return f"{java.group(1)}: {java.group(2)}" if java else first


def install_hint(extra: str) -> str:
    """How to install the optional packages of ``extra`` (a ``[project.optional-dependencies]`` name of
    pyproject.toml), for a clone (the README's install) and for an index.

    Returns:
        str: e.g. ``"pip install '.[mlflow]' in the project's folder (or 'spark-imagenet[mlflow]' from a package
        index)"``.
    """
    return f"pip install '.[{extra}]' in the project's folder (or 'spark-imagenet[{extra}]' from a package index)"
