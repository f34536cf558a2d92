"""``spark-imagenet predict MODEL_URL IMAGE...``: the top-5 classes of each image, with names and probabilities.

Run as ``python -m spark_imagenet.training.worker.predict MODEL_URL IMAGE_OR_FOLDER... [--labels URL] [--top K]
[--json]``; the command line starts it in a child Python. Each image gets the view training evaluates with
(:func:`spark_imagenet.training.worker.preprocessing.eval_image`: central crop, resize, normalization); files that are
not JPEG (PNG, CMYK JPEG, ...) are converted to RGB JPEG with Pillow first, as sharding does. A folder
stands for the image files in it (``.bmp``, ``.gif``, ``.jpeg``, ``.jpg``, ``.png``, any case, sorted; not recursive).

``MODEL_URL`` is a ``model.keras`` file or an ``--output`` folder; the class names come from ``labels.json``
beside the model (or ``--labels``). Exit status 0 when every image is predicted; 1 when some image cannot be
used (not an image, unreadable, damaged, above the pixel limit): the others are predicted and each such file
gets one ``spark-imagenet: warning:`` line naming it and why, after the predictions; 2 with one
``spark-imagenet: error:`` line naming the file or setting at fault when nothing can be predicted (nothing
is skipped silently).
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence


from spark_imagenet.arguments import ArgumentParser, positive_int  # noqa: E402
from spark_imagenet.dataset.images import image_files  # noqa: E402
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, OPTION as PIXELS_OPTION, open_image  # noqa: E402
from spark_imagenet.errors import ConfigError, SparkImagenetError  # noqa: E402
from spark_imagenet.storage import open_storage, store_schemes  # noqa: E402
from spark_imagenet.training.worker.evaluate import fetched_model, load_model  # noqa: E402
from spark_imagenet.training.job.outputs import LABELS_FILE  # noqa: E402
from spark_imagenet.training.worker.environment import prepare_tensorflow_process  # noqa: E402


def jpeg_bytes(path: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """The file's bytes when it is an RGB or greyscale JPEG, else the image re-encoded as RGB JPEG (Pillow).

    Args:
        path: the image file.
        max_pixels: the most pixels (width x height) it may have (:mod:`spark_imagenet.dataset.pixels`).

    Raises:
        ConfigError: not an image Pillow can read, or more pixels than ``max_pixels`` (names the file).
    """
    data = path.read_bytes()
    try:
        with open_image(str(path), str(path), max_pixels) as image:  # a path: Pillow's message names the file
            if image.format == "JPEG" and image.mode in ("RGB", "L"):
                return data
            out = io.BytesIO()
            (image if image.mode == "RGB" else image.convert("RGB")).save(out, format="JPEG", quality=95)
            return out.getvalue()
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not an image that can be read ({e})") from None


def read_labels(model_url: str, labels_url: str | None, classes: int | None) -> list[dict[str, Any]]:
    """The class list for the model's outputs (``labels.json`` beside the model, or ``labels_url``).

    Args:
        model_url: the model's URL (its folder holds the default ``labels.json``).
        labels_url: the labels file, or None for the default.
        classes: the model's output count, or None to read the file without checking its length.

    Raises:
        ConfigError: no readable labels file, or one whose length differs from the model's outputs.
    """
    if labels_url is None:
        folder = model_url.rsplit("/", 1)[0] if model_url.endswith(".keras") else model_url.rstrip("/")
        folder, name = folder or ".", LABELS_FILE
    else:
        folder, name = (labels_url.rsplit("/", 1) + [""])[:2] if "/" in labels_url else (".", labels_url)
    try:
        labels = json.loads(open_storage(folder).read_bytes(name))
    except (SparkImagenetError, ValueError) as e:
        raise ConfigError(f"cannot read the class names {folder}/{name} ({e}); give --labels with the "
                          "labels.json of the run that trained the model") from None
    if not isinstance(labels, list) or (classes is not None and len(labels) != classes):
        raise ConfigError(f"{folder}/{name} lists {len(labels) if isinstance(labels, list) else 'no'} classes "
                          f"but the model has {classes} outputs: give the labels.json of this model's run")
    return labels


def predict(model, files: Sequence[Path], labels: Sequence[dict[str, Any]], top: int = 5,
            jpegs: Sequence[bytes] | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> list[dict[str, Any]]:
    """The ``top`` classes of each image, most probable first.

    Args:
        model: a classifier: float32 ``[B, S, S, 3]`` normalized images -> logits ``[B, C]``.
        files: the image files.
        labels: ``labels.json``'s entries (``id``, ``wnid``, ``names``), one per output.
        top: classes per image.
        jpegs: the files' images as :func:`jpeg_bytes` gives them, when already read (None: read them now).
        max_pixels: the pixel limit of :func:`jpeg_bytes` when it reads them here.

    Returns:
        list[dict]: per image ``{"file", "top": [{"id", "wnid", "name", "probability"}, ...]}``.

    Raises:
        ConfigError: a file that is not a readable image, or above ``max_pixels`` (names it).
    """
    import tensorflow as tf

    from spark_imagenet.training.worker import preprocessing

    size = int(model.input_shape[1])
    normalize = preprocessing.normalizer(size)
    jpegs = [jpeg_bytes(f, max_pixels) for f in files] if jpegs is None else jpegs
    images = tf.stack([preprocessing.eval_image(tf.constant(data), size) for data in jpegs])
    probabilities = tf.nn.softmax(model(normalize(images), training=False), axis=-1).numpy()
    out = []
    for path, row in zip(files, probabilities):
        best = row.argsort()[::-1][:top]
        out.append({"file": str(path), "top": [
            {"id": int(i), "wnid": labels[i]["wnid"], "name": (labels[i]["names"] or [""])[0],
             "probability": float(row[i])} for i in best]})
    return out


def main(argv: list[str] | None = None) -> int:
    """The ``predict`` command (see the module docstring); returns the exit status."""
    parser = ArgumentParser(prog="spark-imagenet predict",
                            description="the top classes of each image, with names and probabilities",
                            epilog="As a Spark job over a folder, a labels file or a table, into Parquet: predict "
                                   "MODEL_URL --source URL|--table NAME --out URL [--master M] (its options: predict "
                                   "MODEL_URL --source X --out Y --help).")
    parser.add_argument("model", help="a model.keras file or the --output folder of a run (a local path or a "
                        f"bucket URL: {store_schemes()})")
    parser.add_argument("images", nargs="+", help="JPEG (or PNG) files, or folders of them; a file that cannot be "
                        "used is named on stderr and the others are predicted (exit status 1)")
    parser.add_argument("--labels", help="the run's labels.json (default: the one beside the model)")
    parser.add_argument("--top", type=positive_int, default=5, help="classes per image (default 5)")
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")
    parser.add_argument(PIXELS_OPTION, type=positive_int, default=DEFAULT_MAX_PIXELS, metavar="PIXELS",
                        help=f"the largest image accepted, in pixels (width x height; default {DEFAULT_MAX_PIXELS:,}): "
                        "a larger one is refused from its header, before it is decoded")
    args = parser.parse_args(argv)
    prepare_tensorflow_process()
    try:
        # the images, labels and model are checked before TensorFlow starts
        found = image_files(args.images, args.max_image_pixels, decode=True)
        jpegs = [jpeg_bytes(f, args.max_image_pixels) for f in found.files]
        with fetched_model(args.model) as local:
            read_labels(args.model, args.labels, None)
            model = load_model(args.model, local)
        labels = read_labels(args.model, args.labels, int(model.output_shape[-1]))
        results = predict(model, found.files, labels, args.top, jpegs)
    except SparkImagenetError as e:
        print(f"spark-imagenet: error: {e}", file=sys.stderr)
        return 2
    try:
        _print_results(results, args.json)
    except BrokenPipeError:  # the reader left (`| head`): nothing more to say to it, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    for e in found.unusable:
        print(f"spark-imagenet: warning: {e}; not predicted", file=sys.stderr)
    return 1 if found.unusable else 0


def _print_results(results: list[dict], as_json: bool) -> None:
    """Print :func:`predict`'s answers on standard output: JSON, or each file with its top classes.

    Raises:
        BrokenPipeError: the reader of standard output closed it.
    """
    if as_json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(r["file"])
            for rank, c in enumerate(r["top"], 1):
                name = "" if c["name"] in ("", c["wnid"]) else f"  {c['name']}"  # a class folder's name is its wnid
                print(f"  {rank}. {c['probability']:7.2%}  {c['wnid']}{name}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
