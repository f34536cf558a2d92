"""``--output URL``: what a training job leaves behind, and where.

The output folder (a local path or ``gs://bucket/prefix``, through
:func:`spark_imagenet.storage.open_storage`) receives:

* ``model.keras``: the trained model in Keras format (from the chief, rank 0);
* ``labels.json``: the class list, ``[{"id": 0, "wnid": "n01440764",
  "names": ["tench", "Tinca tinca"]}, ...]`` in output order (from the driver);
* ``results.json``: the job's results dict (from the driver);
* ``tensorboard/train/`` and ``tensorboard/validation/``: TensorBoard event
  files (from the chief): per epoch ``xent``, ``top1``, ``top5``,
  ``learning_rate`` and ``images_per_sec`` under ``train``; ``xent``,
  ``top1`` and ``top5`` of the final evaluation under ``validation``.

This module is the driver's part (no TensorFlow import): the output is opened
and refused before any task starts, and the driver's two files written after
the job. The chief's part lives in :mod:`spark_imagenet.training.worker`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from spark_imagenet.errors import ConfigError, StorageError
from spark_imagenet.storage import Storage, open_storage

MODEL_FILE = "model.keras"
LABELS_FILE = "labels.json"
RESULTS_FILE = "results.json"
TENSORBOARD_DIR = "tensorboard"
#: The chief's local folder, beside its RESULT_JSON in the task's child folder, that its task publishes.
LOCAL_OUTPUT_DIR = "output"


def open_output(output: str, option: str = "--output") -> Storage:
    """Open (and for a local path, create) the ``--output`` (or ``--checkpoint-dir``) folder; refuse one that
    cannot be written.

    A marker object is written and removed, so a read-only bucket or folder is
    found before any task starts.

    Args:
        output: a local path, ``file://`` URL or ``gs://bucket/prefix``.
        option: the command-line option named in the message.

    Returns:
        Storage: the output's storage.

    Raises:
        ConfigError: the URL is malformed, or the folder or bucket cannot be
            written (names ``option`` and the reason).
    """
    try:
        storage = open_storage(output)
        storage.write_bytes(".spark-imagenet-write-test", b"")
        storage.delete(".spark-imagenet-write-test", best_effort=True)
    except StorageError as e:
        raise ConfigError(f"{option} {output}: cannot write there ({e}). Give a folder or gs://BUCKET/PREFIX you "
                          "can write to") from None
    return storage


def labels(classes: Any) -> list[dict[str, Any]]:
    """The ``labels.json`` content of a manifest's ``classes`` (``SynsetClass`` items), in output order."""
    return [{"id": int(c.id), "wnid": str(c.wnid), "names": list(c.names)} for c in classes]


def write_driver_outputs(storage: Storage, classes: Any, results: Mapping[str, Any]) -> list[str]:
    """Write ``labels.json`` and ``results.json`` into the output folder.

    Returns:
        list[str]: the object names written.

    Raises:
        StorageError: an object cannot be written.
    """
    storage.write_bytes(LABELS_FILE, json.dumps(labels(classes), indent=1).encode())
    storage.write_bytes(RESULTS_FILE, json.dumps(dict(results), indent=1, sort_keys=True).encode())
    return [LABELS_FILE, RESULTS_FILE]


def publish(local: str, output: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """Copy every file under the local folder ``local`` into the output folder (names relative to ``local``).

    Args:
        local: the chief's local output folder.
        output: the ``--output`` URL.
        options: :meth:`Storage.reopen_options` of the driver's output storage (the emulator endpoint, ...).

    Returns:
        list[str]: the object names written, sorted.

    Raises:
        StorageError: a file cannot be written (names how many and the first).
    """
    pairs = sorted((os.path.join(folder, f), os.path.relpath(os.path.join(folder, f), local).replace(os.sep, "/"))
                   for folder, _, files in os.walk(local) for f in files)
    storage = open_storage(output, **dict(options or {}))
    failed = [(name, e) for (_, name), e in zip(pairs, storage.put_files(pairs)) if e is not None]
    if failed:
        raise StorageError(f"--output {output}: {len(failed)} of {len(pairs)} file(s) could not be written, "
                           f"first {failed[0][0]}: {failed[0][1]}")
    return [name for _, name in pairs]
