"""ResNet-50 (He, Zhang, Ren and Sun 2016) as a ``tf_keras`` model: ``tf_keras.applications.ResNet50``.

Reference: K. He, X. Zhang, S. Ren, J. Sun, "Deep Residual Learning for Image Recognition", CVPR 2016
(table 1, the 50-layer column: a 7x7/2 stem and a 3x3/2 max pool, then 3, 4, 6 and 3 bottleneck blocks,
global average pooling and one dense layer). The model is Keras' own implementation, built from scratch
(``weights=None``, random initialisation); this module only fixes its inputs and outputs to the ones every model
of the registry has.

With 1000 classes it has 25,636,712 parameters (25,583,592 trainable and 53,120 batch-norm moving statistics),
at any image size: the global average pooling makes the count independent of ``image_size``.
``tests/test_models.py`` checks the count.

Training recipe (its row of :data:`spark_imagenet.training.job.model_specs.MODELS`): Goyal et al. 2017. Weight
decay is not part of the model: :func:`spark_imagenet.training.worker.models.compile.compile_model` adds it for every model, so this
module adds no kernel regularisers.

The module imports ``tf_keras`` only when :func:`build_resnet50` runs (importing the module itself is free of
TensorFlow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_imagenet.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import tf_keras as keras

#: Smallest input side ``tf_keras.applications.ResNet50`` accepts (five stride-2 stages); also
#: ``min_image_size`` of its row of :data:`spark_imagenet.training.job.model_specs.MODELS`.
MIN_IMAGE_SIZE = 32


def build_resnet50(num_classes: int, image_size: int, width: float = 1.0) -> "keras.Model":
    """Build an (uncompiled) ResNet-50 with random weights.

    Args:
        num_classes: number of output classes (>= 1); the width of the final dense layer (``"predictions"``).
        image_size: input height (= width) in pixels, >= :data:`MIN_IMAGE_SIZE` (32); 224 is the standard size.
        width: must be 1.0: ResNet-50's layer widths are fixed.

    Returns:
        A ``tf_keras.Model`` named ``"resnet50"`` mapping float32 ``[B, image_size, image_size, 3]`` images,
        normalised (ImageNet mean/std; the train and test steps normalise the pipeline's uint8 batches), to float32 logits ``[B, num_classes]`` (no
        softmax). Create it inside ``strategy.scope()`` when training under a distribution strategy.

    Raises:
        ConfigError: ``width`` other than 1.0 (names ``--width``), ``image_size`` below 32 (names
            ``--image-size``), or ``num_classes`` below 1.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}",
                          key="num_classes", value=num_classes)
    if not isinstance(width, (int, float)) or width != 1.0:
        raise ConfigError(f"--width {width!r} does not apply to resnet50, whose layer widths are fixed: "
                          "leave --width at 1.0", key="width", value=width)
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < MIN_IMAGE_SIZE:
        raise ConfigError(f"--image-size {image_size!r} is too small for resnet50: its five stride-2 stages need "
                          f"at least {MIN_IMAGE_SIZE} pixels; use --image-size {MIN_IMAGE_SIZE} or more "
                          "(224 is the standard size)", key="image_size", value=image_size)
    import tf_keras as keras  # docs/design.md, 'Keras 2 (tf-keras) under MultiWorkerMirroredStrategy'

    return keras.applications.ResNet50(weights=None, include_top=True, input_shape=(image_size, image_size, 3),
                                       classes=num_classes, classifier_activation=None)


__all__ = ["MIN_IMAGE_SIZE", "build_resnet50"]
