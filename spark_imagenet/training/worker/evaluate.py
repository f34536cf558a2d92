"""``spark-imagenet evaluate MODEL_URL DATA_URL``: top-1/top-5 of a saved model on a dataset's validation shards.

Run as ``python -m spark_imagenet.training.worker.evaluate MODEL_URL DATA_URL [--json] [--cache DIR]
[--batch-size B]``; the command line starts it in a child Python (the driver side never imports
TensorFlow). On one machine: the validation shards are fetched verified into the local shard cache
(:func:`spark_imagenet.dataset.cache.fetch`), read with the same central crops as training's evaluation
(:func:`spark_imagenet.training.worker.pipeline.eval_dataset`), padded to whole batches with zero-weight rows,
and scored with the same weighted metrics (:func:`spark_imagenet.training.worker.models.compile.compile_model`),
so the numbers are those a training run reports for the same model.

``MODEL_URL`` is a ``model.keras`` file (a local path or a bucket URL of any store) or the ``--output``
folder that holds one. Exit status 0 with the scores printed, 2 with one ``spark-imagenet: error:`` line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Any, Iterator


from spark_imagenet.dataset.cache import fetch  # noqa: E402
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest  # noqa: E402
from spark_imagenet.arguments import ArgumentParser  # noqa: E402
from spark_imagenet.errors import ConfigError, SparkImagenetError  # noqa: E402
from spark_imagenet.storage import open_storage, store_schemes  # noqa: E402
from spark_imagenet.training.job.outputs import MODEL_FILE  # noqa: E402
from spark_imagenet.training.worker.environment import prepare_tensorflow_process  # noqa: E402

if TYPE_CHECKING:  # TensorFlow is imported only once the URLs are checked (see main)
    import tf_keras as keras

#: Images per evaluation batch (the padding makes the result independent of it).
DEFAULT_BATCH = 64


@contextlib.contextmanager
def fetched_model(url: str) -> Iterator[str]:
    """Context manager: a local copy of the model at ``url``, deleted on exit.

    Fetches without TensorFlow (so a wrong URL is reported in a moment, before
    TensorFlow starts) into a new folder ``spark-imagenet-model-*`` under the
    temporary directory (``$TMPDIR``), and deletes that folder when the block
    ends, whether it ends normally or with an exception.

    Args:
        url: a ``.keras`` file, or a folder holding ``model.keras``; a local
            path or a bucket URL of any store.

    Yields:
        str: the path of the local copy (valid inside the block only).

    Raises:
        ConfigError: nothing there (names the URL).

    Example::

        >>> import os
        >>> from spark_imagenet.training.worker.models.registry import build_model
        >>> os.makedirs("bucket/run1")
        >>> build_model("alexnet", num_classes=4, image_size=67, width=0.25).save("bucket/run1/model.keras")
        >>> with fetched_model("gs://bucket/run1") as local:
        ...     model = load_model("gs://bucket/run1", local)
        >>> model.output_shape
        (None, 4)
    """
    folder, name = (url.rsplit("/", 1) if url.endswith(".keras") else (url.rstrip("/"), MODEL_FILE))
    with tempfile.TemporaryDirectory(prefix="spark-imagenet-model-") as tmp:
        local = os.path.join(tmp, name)
        try:
            open_storage(folder or ".").get_file(name, local)
        except SparkImagenetError as e:
            raise ConfigError(f"model {url}: cannot read {name} ({e}); give a model.keras file or the --output "
                              "folder of a training run") from None
        yield local


def load_model(url: str, local: str | None = None) -> keras.Model:
    """Load the model at ``url`` as an uncompiled Keras model.

    Args:
        url: as in :func:`fetched_model` (named in errors).
        local: the already fetched copy of ``url`` (None: fetch it now, into a
            temporary folder deleted before this returns).

    Returns:
        keras.Model: the model, uncompiled.

    Raises:
        ConfigError: nothing loadable there (names the URL).
    """
    import tf_keras as keras

    if local is None:
        with fetched_model(url) as fetched:
            return load_model(url, fetched)
    try:
        return keras.models.load_model(local, compile=False)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model {url}: {os.path.basename(local)} is not a Keras model "
                          f"({type(e).__name__}: {e})") from None


def evaluate(model: keras.Model, data_url: str, *, cache: str | None = None,
             batch_size: int = DEFAULT_BATCH) -> dict[str, Any]:
    """Top-1, top-5 and cross-entropy of ``model`` over every validation image of the dataset at ``data_url``.

    Args:
        model: a classifier taking float32 ``[B, S, S, 3]`` normalized images, returning logits ``[B, C]``.
        data_url: the dataset (holding ``manifest.json`` and its shards).
        cache: the local shard cache (None: the default one).
        batch_size: images per batch.

    Returns:
        dict: ``{"images", "top1", "top5", "loss", "model_classes", "image_size"}``.

    Raises:
        ConfigError: the model's class count differs from the dataset's, or the dataset has no validation split.
        StorageError, ManifestError: the dataset cannot be read intact.
    """
    from spark_imagenet.training.worker import pipeline
    from spark_imagenet.training.worker.bad_records import naming_bad_records
    from spark_imagenet.training.worker.models.compile import compile_model

    storage = open_storage(data_url)
    manifest = Manifest.load(storage)
    classes, size = int(model.output_shape[-1]), int(model.input_shape[1])
    if classes != manifest.num_classes:
        raise ConfigError(f"the model has {classes} outputs but the dataset {data_url} has {manifest.num_classes} "
                          "classes: evaluate a model trained on this dataset")
    if "val" not in manifest.splits or not manifest.splits["val"].shards:
        raise ConfigError(f"the dataset {data_url} has no validation shards")
    shards = list(manifest.splits["val"].shards)
    files = fetch(storage, shards, cache, dataset_id=manifest.dataset_id)
    total = sum(s.examples for s in shards)
    steps = math.ceil(total / batch_size)
    ds = pipeline.eval_dataset(list(files), batch_size, size, None, record_shard=None, examples=total, steps=steps)
    compile_model(model, 0.01)  # the optimizer is unused; the weighted metrics are the training run's
    with naming_bad_records(list(files)):
        scores = model.evaluate(ds, steps=steps, return_dict=True, verbose=0)
    return {"images": total, "top1": float(scores["top1"]), "top5": float(scores["top5"]),
            "loss": float(scores["xent"]), "model_classes": classes, "image_size": size}


@contextlib.contextmanager
def _swapped_hint(model_url: str, data_url: str) -> Iterator[None]:
    """Context manager: a :class:`ConfigError` about either URL gets a hint when ``model_url`` holds a
    dataset's ``manifest.json`` (the two arguments given the other way round, or a dataset given twice)."""
    try:
        yield
    except ConfigError as e:
        if not _is_dataset(model_url):
            raise
        order = ("give the model as the first argument" if _is_dataset(data_url) else
                 f"e.g. evaluate {data_url} {model_url}")
        raise ConfigError(f"{e} (hint: {model_url} is a dataset, it holds {MANIFEST_NAME}: the model comes "
                          f"first, evaluate MODEL_URL DATA_URL: {order})") from None


def _is_dataset(url: str) -> bool:
    """Whether ``url`` is a folder holding a dataset's ``manifest.json`` (False where that cannot be read)."""
    try:
        return not url.endswith(".keras") and open_storage(url).exists(MANIFEST_NAME)
    except SparkImagenetError:
        return False


def main(argv: list[str] | None = None) -> int:
    """The ``evaluate`` command (see the module docstring); returns the exit status."""
    parser = ArgumentParser(prog="spark-imagenet evaluate",
                                     description="top-1/top-5 of a saved model on a dataset's validation shards")
    parser.add_argument("model", help="a model.keras file or the --output folder of a run (a local path or a "
                        f"bucket URL: {store_schemes()})")
    parser.add_argument("data", help="the dataset URL (manifest.json and shards)")
    parser.add_argument("--cache", help="local shard cache folder (default: the user's cache)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help="images per batch (default 64)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = parser.parse_args(argv)
    prepare_tensorflow_process()
    try:
        if args.batch_size < 1:
            raise ConfigError(f"--batch-size {args.batch_size} must be at least 1",
                              key="--batch-size", value=args.batch_size)
        with _swapped_hint(args.model, args.data), fetched_model(args.model) as local:
            Manifest.load(open_storage(args.data))  # both URLs are checked before TensorFlow starts
            model = load_model(args.model, local)
        scores = evaluate(model, args.data, cache=args.cache, batch_size=args.batch_size)
    except SparkImagenetError as e:
        print(f"spark-imagenet: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(scores, sort_keys=True))
    else:
        print(f"val: {scores['images']} images, top1 {scores['top1']:.4f}, top5 {scores['top5']:.4f}, "
              f"loss {scores['loss']:.4f} ({scores['model_classes']} classes, {scores['image_size']} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
