"""The stored image forms of issue 35 side by side, for ``benchmarks/pipeline.py --forms``.

The three forms of the same JPEGs: ``original`` (as read), ``resize 256`` (the paper's: the shorter side
scaled to 256, the centre 256 x 256 kept) and ``max-side 320`` (the aspect ratio kept, the longer side at most
320; smaller images as they are). Re-encoded ones are RGB JPEGs of quality :data:`QUALITY`, 4:2:0, Lanczos
scaling (what ``shard --resize`` / ``--max-side`` store). pipeline.py writes each form into its own shards,
measures the training pipeline on each in its alternating rounds, and the decode ceiling of the originals with
the scaled decode (``train_image(scaled_decode=True)``) beside the one without; :func:`record_forms` turns
those rounds into records:

* ``FORM: stored MB per image`` (the shards' bytes over the images; one value, not a timing),
* ``FORM: pipeline images/CPU-s`` (the original form's is pipeline.py's own ``pipeline images/CPU-s``),
* ``FORM / original: stored MB per image`` and ``FORM / original: pipeline images/CPU-s`` (per round; the goals
  of issue 35 for the 256 form, at most 0.4x the bytes and at least 2x the images per CPU-second, in
  ``params.goal``),
* ``scaled decode: ceiling images/CPU-s`` and ``scaled decode on / off: ceiling images/CPU-s`` (per round, over
  the ceiling of as many decode calls without it; ``params.windows_by_ratio`` counts the first pass's crop
  windows by the DCT scale they are decoded at).

This module is Pillow and arithmetic; pipeline.py does the TensorFlow side.
"""

from __future__ import annotations

from typing import Sequence

from spark_imagenet.dataset.image_form import DEFAULT_JPEG_QUALITY

#: The re-encoded forms, beside the original: (kind, size in pixels), as ``shard --KIND SIZE`` names them.
FORMS = (("resize", 256), ("max-side", 320))
#: The JPEG quality of re-encoded images (``shard``'s default ``--jpeg-quality``).
QUALITY = DEFAULT_JPEG_QUALITY
#: Issue 35's goals for the 256 form against the originals: stored bytes at most, pipeline images/CPU-s at least.
GOALS = {"resize 256": {"bytes": 0.4, "images/CPU-s": 2.0}}


def label(kind: str, size: int) -> str:
    """A form's name in the records: ``resize 256``, ``max-side 320``."""
    return f"{kind} {size}"


def stored_form(data: bytes, kind: str, size: int, quality: int = QUALITY) -> bytes:
    """The JPEG bytes a dataset of this form stores for ``data``: ``shard --KIND SIZE --jpeg-quality QUALITY``'s
    own re-encode (:func:`spark_imagenet.dataset.quality.repair`), so the benchmark measures what the sharder
    writes.

    Args:
        data: a JPEG file's bytes.
        kind: ``"resize"`` (shorter side to ``size``, centre ``size x size``; smaller images scaled up, as the
            paper's) or ``"max-side"`` (longer side at most ``size``, aspect kept, never scaled up).
        size: ``N`` in pixels.
        quality: JPEG quality of the re-encode (1-100).

    Returns:
        bytes: an RGB JPEG, or ``data`` itself when the form keeps it as it is (already ``N x N``, or a longer
        side within ``N``).
    """
    from spark_imagenet.dataset.image_form import image_form
    from spark_imagenet.dataset.quality import classify, repair

    form = image_form(**{kind.replace("-", "_"): size}, jpeg_quality=quality)
    return repair(data, classify(data), form=form)[0]


def form_images(images: Sequence[tuple[str, bytes]], kind: str, size: int) -> list[tuple[str, bytes]]:
    """``(file name, JPEG bytes)`` of ``images`` in the form ``kind size`` (:func:`stored_form`)."""
    return [(name, stored_form(data, kind, size)) for name, data in images]


def windows_by_ratio(jpeg_bytes: Sequence[bytes], image_size: int) -> dict[str, int]:
    """How many of the first pass's crop windows (the seeds pipeline.py's ceiling draws) each DCT scale decodes
    with the scaled decode: ``{"1": n1, "2": n2, "4": n4, "8": n8}``."""
    import tensorflow as tf

    from spark_imagenet.training.worker import preprocessing

    counts = {str(r): 0 for r in preprocessing.DECODE_RATIOS}
    for position, data in enumerate(jpeg_bytes):
        seed = tf.constant([0, 2 * position], tf.int64)
        window = preprocessing.random_crop_window(tf.io.extract_jpeg_shape(data), stateless_seed=seed)
        counts[str(preprocessing.DECODE_RATIOS[int(preprocessing.decode_ratio(window, image_size))])] += 1
    return counts


def record_forms(report, rows: list[dict], stored_mb: dict[str, float], params: dict, off_calls: int,
                 scaled: dict[str, int]) -> None:
    """The forms' records (see the module docstring) from pipeline.py's rounds.

    Args:
        report: the run's ``common.Report``.
        rows: pipeline.py's rounds: ``pipeline`` ``[images/s, images/CPU-s]`` of the originals, ``ceilings``
            ``[calls, images/s, images/CPU-s]``, and ``extra``, by meter name: ``pipeline (FORM)`` and ``ceiling
            (scaled decode)``, each ``[images/s, images/CPU-s]``.
        stored_mb: MB (10**6 bytes) per image of each form's shards, by form name (``original`` too).
        params: the run's settings, put in every record.
        off_calls: the decode calls of the ceiling the scaled one runs beside (the same number).
        scaled: :func:`windows_by_ratio` of the originals.
    """
    original = [r["pipeline"][1] for r in rows]
    for name, mb in stored_mb.items():
        report.add(f"{name}: stored MB per image", "MB", [mb], **params)
    for kind, size in FORMS:
        name = label(kind, size)
        goals = GOALS.get(name, {})
        rates = [r["extra"][f"pipeline ({name})"][1] for r in rows]
        report.add(f"{name}: pipeline images/CPU-s", "images/CPU-s", rates, **params)
        report.ratio(f"{name} / original: stored MB per image", [stored_mb[name]], [stored_mb["original"]],
                     goal=goals.get("bytes"), **params)
        report.ratio(f"{name} / original: pipeline images/CPU-s", rates, original, goal=goals.get("images/CPU-s"),
                     **params)
    on = [r["extra"]["ceiling (scaled decode)"][1] for r in rows]
    off = [next(c[2] for c in r["ceilings"] if c[0] == off_calls) for r in rows]
    scaled_params = dict(params, decode_calls=off_calls, windows_by_ratio=scaled,
                         alternative="the same ceiling without the scaled decode (full-scale decode of the window)")
    report.add("scaled decode: ceiling images/CPU-s", "images/CPU-s", on, **scaled_params)
    report.ratio("scaled decode on / off: ceiling images/CPU-s", on, off, **scaled_params)
