"""What the driver knows about each model without importing TensorFlow: sizes and training recipes.

The models themselves (:mod:`spark_imagenet.training.models.registry`) import
tf_keras and are only imported in the TensorFlow worker process; the driver checks ``--model``,
``--image-size`` and ``--width`` against this table before it starts any Spark job, so a
typo fails in a second instead of after every worker has started TensorFlow.
``tests/test_models.py`` checks the table against the models' own arithmetic.

``--model`` is a registered name (:data:`MIN_IMAGE_SIZE`) or ``package.module:function``, a user's own builder
``function(num_classes: int, image_size: int, width: float) -> tf_keras.Model`` (:func:`is_user_builder`).
"""

from __future__ import annotations

import dataclasses
import re

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.models import alexnet_layers

#: Model name -> smallest input side in pixels, from each model's layer
#: arithmetic (AlexNet: 67, see :func:`alexnet_layers.min_image_size`; ResNet-50: 32, the smallest input
#: ``tf_keras.applications.ResNet50`` accepts, five stride-2 stages).
MIN_IMAGE_SIZE: dict[str, int] = {"alexnet": alexnet_layers.min_image_size(), "resnet50": 32}
#: Models whose layer widths are fixed (``--width`` must be 1.0).
FIXED_WIDTH = frozenset({"resnet50"})
#: ``package.module:function``: a user's own model builder.
USER_BUILDER = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A model's default training settings: what ``--learning-rate``, ``--lr-schedule``, ``--warmup-epochs``,
    ``--lr-scaling``, ``--momentum``, ``--weight-decay`` and ``--label-smoothing`` are when not given.

    Attributes:
        learning_rate: base learning rate (per 256 images when ``lr_scaling`` is ``"linear"``).
        lr_schedule: ``"constant"``, ``"step"`` or ``"cosine"``.
        warmup_epochs: linear warm-up epochs.
        lr_scaling: ``"linear"`` or ``"none"``.
        momentum: optimizer momentum.
        weight_decay: L2 weight decay of the kernels (gradient term ``weight_decay * w``).
        label_smoothing: label smoothing of the cross-entropy.
        source: where the values come from (shown in ``--help`` and the docs).
    """

    learning_rate: float
    lr_schedule: str
    warmup_epochs: float
    lr_scaling: str
    momentum: float
    weight_decay: float
    label_smoothing: float
    source: str


#: The registered models' recipes.
RECIPES: dict[str, Recipe] = {
    # Krizhevsky et al. 2012, section 5: batch 128, lr 0.01, momentum 0.9, weight decay 0.0005; the rate divided
    # by 10 three times.
    "alexnet": Recipe(learning_rate=0.01, lr_schedule="constant", warmup_epochs=0.0, lr_scaling="none",
                      momentum=0.9, weight_decay=5e-4, label_smoothing=0.0,
                      source="Krizhevsky et al. 2012"),
    # Goyal et al. 2017 (ResNet-50 at any global batch): 0.1 per 256 images, 5 warm-up epochs, /10 at 30, 60 and
    # 80 of 90 epochs, momentum 0.9, weight decay 1e-4.
    "resnet50": Recipe(learning_rate=0.1, lr_schedule="step", warmup_epochs=5.0, lr_scaling="linear",
                       momentum=0.9, weight_decay=1e-4, label_smoothing=0.0,
                       source="Goyal et al. 2017"),
}
#: The recipe of a user's own builder: plain SGD with momentum, no weight decay added (its layers may carry
#: their own regularisers).
USER_RECIPE = Recipe(learning_rate=0.01, lr_schedule="constant", warmup_epochs=0.0, lr_scaling="none",
                     momentum=0.9, weight_decay=0.0, label_smoothing=0.0, source="a user's builder")


def is_user_builder(model: str) -> bool:
    """Whether ``--model`` names a user's builder (``package.module:function``) rather than a registered model."""
    return isinstance(model, str) and USER_BUILDER.fullmatch(model) is not None


def recipe_for(model: str) -> Recipe:
    """The default training settings of ``--model`` (:data:`RECIPES`, or :data:`USER_RECIPE` for a builder)."""
    return USER_RECIPE if is_user_builder(model) else RECIPES[model]


def check_model_settings(model: str, image_size: int, width: float = 1.0) -> None:
    """Check a model name, input size and width at the driver (without importing TensorFlow).

    Args:
        model: ``--model`` value: a registered name or ``package.module:function``.
        image_size: ``--image-size`` value in pixels.
        width: ``--width`` value.

    Raises:
        ConfigError: unknown model (the message lists the known ones and the builder form), an image size
            below the model's minimum, or a width other than 1.0 for a model of fixed width.
    """
    if is_user_builder(model):
        return
    if model not in MIN_IMAGE_SIZE:
        import difflib

        close = difflib.get_close_matches(model, list(MIN_IMAGE_SIZE), n=1, cutoff=0.8)
        raise ConfigError(f"model (--model) {model!r} is not a known model"
                          + (f" (did you mean {close[0]!r}?)" if close else "")
                          + f"; choose one of: {', '.join(sorted(MIN_IMAGE_SIZE))}, or give your own builder as "
                            "package.module:function")
    if image_size < MIN_IMAGE_SIZE[model]:
        raise ConfigError(f"image_size (--image-size) {image_size} is too small for {model}: its layers need at "
                          f"least {MIN_IMAGE_SIZE[model]} px")
    if model in FIXED_WIDTH and width != 1.0:
        raise ConfigError(f"width (--width) {width:g} does not apply to {model}, whose layer widths are fixed: "
                          "leave --width at 1.0")
