"""What ``--output`` (and ``spark-imagenet export``) writes for use without spark-imagenet: the description of
the model's input, ``preprocessing.json``, and the names of the serving SavedModel's signatures.

No TensorFlow here: the driver and tests read these documents. The values come from the TensorFlow side
(:func:`spark_imagenet.training.worker.export.preprocessing_spec` fills :class:`Preprocessing` from the
constants of :mod:`spark_imagenet.training.worker.preprocessing`, the one source of truth).

``preprocessing.json``::

    {"format": "spark-imagenet-preprocessing", "format_version": 1, "image_size": 224,
     "input": {"dtype": "float32", "layout": "NHWC", "channels": "RGB", "shape": [null, 224, 224, 3]},
     "mean_rgb": [123.675, 116.28, 103.53], "std_rgb": [58.395, 57.12, 57.375],
     "formula": "(pixel - mean_rgb) / std_rgb ...", "center_crop_fraction": 0.875, "crop": "...",
     "resize": "bilinear", "rounding": "...", "output": "...", "labels": "labels.json", "serving": {...}}

Example::

    >>> import numpy as np
    >>> text = Preprocessing.describe(224, [124.0, 117.0, 104.0], [58.4, 57.1, 57.4], 0.875).dumps()
    >>> spec = Preprocessing.loads(text, "run/preprocessing.json")   # e.g. open("run/preprocessing.json").read()
    >>> pixels = np.zeros((1, spec.image_size, spec.image_size, 3), np.float32)
    >>> x = (pixels - spec.mean_rgb) / spec.std_rgb          # numpy, float32 [B, S, S, 3] RGB
    >>> x.shape
    (1, 224, 224, 3)
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from spark_imagenet.errors import ConfigError
from spark_imagenet.storage.envelope import Envelope
from spark_imagenet.training.job.outputs import LABELS_FILE, SERVING_DIR

#: ``preprocessing.json``'s format.
PREPROCESSING = Envelope("spark-imagenet-preprocessing", 1, "spark-imagenet preprocessing description",
                         remedy="export it again with this version: spark-imagenet export MODEL_URL")

#: The SavedModel's signatures: encoded images -> top-K classes, and -> every class' probability.
SERVING_SIGNATURE = "serving_default"
PROBABILITIES_SIGNATURE = "probabilities"
#: The serving signature's input key, and the most classes it returns per image (fewer when the model has fewer).
INPUT_KEY = "images"
TOP_K = 5

#: The serving signatures as documentation (in ``preprocessing.json`` and the docs).
SIGNATURES = {
    SERVING_SIGNATURE: {
        "inputs": {INPUT_KEY: "string [None]: encoded JPEG, PNG, GIF (first frame) or BMP bytes"},
        "outputs": {"class_ids": "int32 [None, K]", "wnids": "string [None, K]", "names": "string [None, K]",
                    "probabilities": "float32 [None, K]"},
        "k": f"min({TOP_K}, classes), most probable first",
    },
    PROBABILITIES_SIGNATURE: {
        "inputs": {INPUT_KEY: "string [None]: as serving_default"},
        "outputs": {"probabilities": "float32 [None, classes]: softmax of the logits, labels.json order"},
    },
}


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """How an image becomes the model's input, and what its output means (``preprocessing.json``'s body).

    Attributes:
        image_size: S, the side of the model's square input in pixels.
        mean_rgb: per-channel mean, 0..255 units, R, G, B.
        std_rgb: per-channel standard deviation, 0..255 units.
        center_crop_fraction: the central square's side as a fraction of the image's shorter side.
        input: the model's input tensor: dtype, layout, channel order, shape.
        formula: the normalisation in words.
        crop: the crop window in words.
        resize: the resize method.
        rounding: how the resized pixels are rounded before normalisation.
        output: the model's output in words.
        labels: the class list file beside the model (``[{"id", "wnid", "names"}]``, output order).
        serving: the folder of the SavedModel and its signatures.
    """

    image_size: int
    mean_rgb: tuple[float, float, float]
    std_rgb: tuple[float, float, float]
    center_crop_fraction: float
    input: dict[str, Any]
    formula: str
    crop: str
    resize: str
    rounding: str
    output: str
    labels: str = LABELS_FILE
    serving: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def describe(cls, image_size: int, mean_rgb: Any, std_rgb: Any, center_crop_fraction: float) -> "Preprocessing":
        """The description of a model with input side ``image_size`` and these constants (the TensorFlow
        side passes :mod:`~spark_imagenet.training.worker.preprocessing`'s)."""
        return cls(
            image_size=int(image_size), mean_rgb=tuple(float(v) for v in mean_rgb),  # type: ignore[arg-type]
            std_rgb=tuple(float(v) for v in std_rgb), center_crop_fraction=float(center_crop_fraction),  # type: ignore[arg-type]
            input={"dtype": "float32", "layout": "NHWC", "channels": "RGB", "shape": [None, image_size, image_size, 3]},
            formula="x = (pixel - mean_rgb) / std_rgb per channel, pixel = the uint8 value 0..255 of the resized "
                    "crop (computed as pixel * (1 / std_rgb) + (-mean_rgb / std_rgb))",
            crop="the central square of side floor(center_crop_fraction * min(height, width)) (at least 1), "
                 "offsets ((height - side + 1) // 2, (width - side + 1) // 2)",
            resize=f"bilinear (tf.image.resize, no antialias) of the crop to {image_size}x{image_size}",
            rounding="uint8(resized + 0.5): rounded to the nearest integer before normalisation",
            output=f"logits float32 [B, classes] in {LABELS_FILE} order (softmax gives probabilities)",
            serving={"folder": SERVING_DIR, "signatures": SIGNATURES})

    def to_json(self) -> dict[str, Any]:
        """The document: format, version, then the fields."""
        body = dataclasses.asdict(self)
        body["mean_rgb"], body["std_rgb"] = list(self.mean_rgb), list(self.std_rgb)
        return PREPROCESSING.to_json(body)

    def dumps(self) -> str:
        """:meth:`to_json` as indented JSON text."""
        return json.dumps(self.to_json(), indent=1)

    @classmethod
    def from_json(cls, data: Any, where: str = PREPROCESSING.format) -> "Preprocessing":
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: not a preprocessing document of a version this reads, or a missing or unknown key
                (names ``where``).
        """
        fields = PREPROCESSING.fields_for(cls, data, where)
        fields["mean_rgb"], fields["std_rgb"] = tuple(fields["mean_rgb"]), tuple(fields["std_rgb"])
        return cls(**fields)

    @classmethod
    def loads(cls, text: str | bytes, where: str) -> "Preprocessing":
        """:meth:`from_json` of JSON text.

        Raises:
            ConfigError: not JSON, or as :meth:`from_json` (names ``where``).
        """
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{where}: not JSON ({e})") from None
        return cls.from_json(data, where)


__all__ = ["INPUT_KEY", "PREPROCESSING", "PROBABILITIES_SIGNATURE", "Preprocessing", "SERVING_SIGNATURE",
           "SIGNATURES", "TOP_K"]
