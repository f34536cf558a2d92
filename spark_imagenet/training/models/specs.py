"""What the driver knows about each model without importing TensorFlow.

The models themselves (:mod:`spark_imagenet.training.models.registry`) import
tf_keras and are only imported in the TensorFlow worker process; the driver checks ``--model``
and ``--image-size`` against this table before it starts any Spark job, so a
typo fails in a second instead of after every worker has started TensorFlow.
``tests/test_models.py`` checks the table against the models' own arithmetic.
"""

from __future__ import annotations

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.models import alexnet_layers

#: Model name -> smallest input side in pixels, from each model's layer
#: arithmetic (AlexNet: 67, see :func:`alexnet_layers.min_image_size`).
MIN_IMAGE_SIZE: dict[str, int] = {"alexnet": alexnet_layers.min_image_size()}


def check_model_settings(model: str, image_size: int) -> None:
    """Check a model name and input size at the driver.

    Args:
        model: ``--model`` value.
        image_size: ``--image-size`` value in pixels.

    Raises:
        ConfigError: unknown model (the message lists the known ones), or an
            image size below the model's minimum.
    """
    if model not in MIN_IMAGE_SIZE:
        raise ConfigError(f"--model {model!r} is not a known model; choose one of: {', '.join(sorted(MIN_IMAGE_SIZE))}")
    if image_size < MIN_IMAGE_SIZE[model]:
        raise ConfigError(
            f"--image-size {image_size} is too small for {model}: its layers need at least "
            f"{MIN_IMAGE_SIZE[model]} px"
        )
