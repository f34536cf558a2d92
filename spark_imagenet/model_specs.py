"""What the driver knows about each model without importing TensorFlow.

The models themselves (:mod:`spark_imagenet.models`) import tf_keras and are
only imported in the TensorFlow child process; the driver checks ``--model``
and ``--image-size`` against this table before it starts any Spark job, so a
typo fails in a second instead of after every worker has started TensorFlow.
``tests/test_models.py`` checks the table against the models' own arithmetic.
"""

from __future__ import annotations

from .errors import ConfigError

#: Model name -> smallest input side in pixels (AlexNet: conv1 11x11/4 and
#: three 3x3/2 pools need 4 * 14 + 11 = 67 px; see spark_imagenet.models.alexnet).
MIN_IMAGE_SIZE: dict[str, int] = {"alexnet": 67}


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
