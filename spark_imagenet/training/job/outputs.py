"""``--output URL``: what a training job leaves behind, and where.

The output folder (a local path or a bucket URL of any store, through
:func:`spark_imagenet.storage.open_storage`) receives:

* ``model.keras``: the trained model in Keras format, without the optimizer (from the chief, rank 0; it loads
  with plain ``tf_keras.models.load_model``; training state stays in the checkpoints);
* ``preprocessing.json``: how an image becomes the model's input (:mod:`spark_imagenet.training.job.exported`);
* ``serving/``: a TensorFlow SavedModel taking encoded image bytes (from the chief:
  :func:`spark_imagenet.training.worker.export.write_serving`);
* ``labels.json``: the class list, ``[{"id": 0, "wnid": "n01440764",
  "names": ["tench", "Tinca tinca"]}, ...]`` in output order (from the driver);
* ``results.json``: the job's results dict (from the driver);
* ``tensorboard/train/`` and ``tensorboard/validation/``: TensorBoard event
  files (from the chief): per epoch ``xent``, ``top1``, ``top5``,
  ``learning_rate`` and ``images_per_sec`` under ``train``; ``xent``,
  ``top1`` and ``top5`` of the final evaluation under ``validation``.

This module is the driver's part (no TensorFlow import): the output is opened
and refused before any task starts, and the driver's two files written after
the job. The chief's part lives in :mod:`spark_imagenet.training.worker.main`.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Mapping

from spark_imagenet.errors import ConfigError, StorageError
from spark_imagenet.storage import Storage, is_remote_url, open_storage, url_forms
from spark_imagenet.storage.committed import upload_folder
from spark_imagenet.training.job.tracking import MODEL_DIR as MLFLOW_MODEL_DIR, PENDING_FILE

MODEL_FILE = "model.keras"
LABELS_FILE = "labels.json"
RESULTS_FILE = "results.json"
TENSORBOARD_DIR = "tensorboard"
SERVING_DIR = "serving"
PREPROCESSING_FILE = "preprocessing.json"
#: The chief's local folder, beside its RESULT_JSON in the task's child folder, that its task publishes.
LOCAL_OUTPUT_DIR = "output"


def open_output(output: str, option: str = "--output") -> Storage:
    """Open the ``--output`` (or ``--checkpoint-dir``) folder; refuse one that cannot be written.

    A marker object is written and removed, so a read-only bucket or folder is
    found before any task starts. Nothing is left behind: a folder the marker
    needed (a local folder that is not there yet, and its missing parents) is
    removed again, so a job refused later creates nothing; the job's first
    write creates it.

    Args:
        output: a local path, ``file://`` URL or a bucket URL (:func:`~spark_imagenet.storage.url_forms`).
        option: the command-line option named in the message.

    Returns:
        Storage: the output's storage.

    Raises:
        ConfigError: the URL is malformed, a local path names a file, or the
            folder or bucket cannot be written (names ``option`` and the reason).
    """
    _refuse_a_file(output, option)
    try:
        storage = open_storage(output)
        _write_test(storage, _local_path(output))
    except StorageError as e:
        raise ConfigError(f"{option} {output}: cannot write there ({e}). Give a folder or bucket you can write "
                          f"to: {url_forms()}", key=option, value=output) from None
    return storage


def _local_path(output: str) -> Path | None:
    """The absolute path of a local ``output`` (a path or ``file://`` URL); None for a bucket URL."""
    if is_remote_url(output):
        return None
    return Path(output[len("file://"):] if output.startswith("file://") else output).expanduser().absolute()


def _write_test(storage: Storage, local: Path | None) -> None:
    """Write and remove a marker object in ``storage``, then remove the folders that the write made: the
    missing ones of the local path ``local`` (deepest first, each only while empty), or a bucket store's own
    folder that was not there (:meth:`~spark_imagenet.storage.Storage.remove_empty_root`).

    Raises:
        StorageError: the marker cannot be written.
    """
    made = [] if local is None else [p for p in (local, *local.parents) if not p.exists()]
    existed = local is not None or storage.root_exists()
    try:
        storage.write_bytes(".spark-imagenet-write-test", b"")
        storage.delete(".spark-imagenet-write-test", best_effort=True)
    finally:
        for folder in made:
            with contextlib.suppress(OSError):  # not empty: another process wrote there meanwhile, keep it
                folder.rmdir()
        if not existed:
            storage.remove_empty_root()


def _refuse_a_file(output: str, option: str) -> None:
    """Refuse a local ``output`` that is a file, or lies inside one, naming the file (not our write test's)."""
    path = _local_path(output)
    if path is None:
        return
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = f"{option} {output} is" if existing == path else f"{option} {output}: {existing} is"
        raise ConfigError(f"{what} a file, not a folder: give a folder (it is created if absent) or a bucket: "
                          f"{url_forms(local=False)}", key=option, value=output)


def earlier_outputs(storage: Storage) -> list[str]:
    """The objects of an earlier run in an output folder: ``model.keras``, ``labels.json``, ``results.json``,
    ``preprocessing.json``, ``mlflow-pending.json`` and everything under ``tensorboard/``, ``serving/`` and
    ``mlflow-model/``, sorted.

    Raises:
        StorageError: the folder cannot be listed.
    """
    ours = (MODEL_FILE, LABELS_FILE, RESULTS_FILE, PREPROCESSING_FILE, PENDING_FILE)
    return sorted(info.name for info in storage.list() if info.name in ours
                  or info.name.startswith((TENSORBOARD_DIR + "/", SERVING_DIR + "/", MLFLOW_MODEL_DIR + "/")))


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


def publish(local: str, storage: Storage,
            replace: tuple[str, ...] = (TENSORBOARD_DIR, SERVING_DIR, MLFLOW_MODEL_DIR)) -> list[str]:
    """Copy every file under the local folder ``local`` into the output folder (names relative to ``local``),
    then delete the files under the ``replace`` folders there that this run did not write (an earlier run's,
    replaced with ``--overwrite``), so that TensorBoard shows this run alone and ``serving/`` is one SavedModel.

    Args:
        local: the chief's local output folder.
        storage: the ``--output`` folder (the handle the driver opened, pickled to the task).
        replace: the folders whose other objects are deleted.

    Returns:
        list[str]: the object names written, sorted.

    Raises:
        StorageError: a file cannot be written intact, each verified by size and CRC32C
            (:func:`~spark_imagenet.storage.committed.upload_folder`; names every such file), or an
            earlier file under ``replace`` cannot be deleted.
    """
    try:
        written = upload_folder(storage, local)
    except StorageError as e:
        raise type(e)(f"--output {storage.url}: {e}", key=e.key, value=e.value) from None
    ours = set(written)
    stale = tuple(folder + "/" for folder in replace)
    for name in earlier_outputs(storage):  # an earlier run's TensorBoard logs (--overwrite) would mix with ours
        if stale and name.startswith(stale) and name not in ours:
            storage.delete(name)
    return written
