"""AlexNet (Krizhevsky, Sutskever and Hinton 2012) as a ``tf_keras`` model.

Reference: A. Krizhevsky, I. Sutskever, G. E. Hinton, "ImageNet Classification
with Deep Convolutional Neural Networks", NIPS 2012 (section 3.5 for the
architecture, section 5 for the training details: SGD, momentum 0.9, weight
decay 0.0005, batch 128, dropout 0.5).

Architecture (``width`` = 1.0, input ``S x S x 3``):

====  =====================================  ==========================
layer  operation                               output at S = 224
====  =====================================  ==========================
conv1  96 filters 11x11, stride 4, 'valid', ReLU   54 x 54 x 96
pool1  max 3x3, stride 2, 'valid'                  26 x 26 x 96
conv2  256 filters 5x5, stride 1, 'same', ReLU     26 x 26 x 256
pool2  max 3x3, stride 2, 'valid'                  12 x 12 x 256
conv3  384 filters 3x3, 'same', ReLU               12 x 12 x 384
conv4  384 filters 3x3, 'same', ReLU               12 x 12 x 384
conv5  256 filters 3x3, 'same', ReLU               12 x 12 x 256
pool5  max 3x3, stride 2, 'valid'                   5 x  5 x 256 (6400 wide)
fc6    dense 4096, ReLU, dropout 0.5               4096
fc7    dense 4096, ReLU, dropout 0.5               4096
fc8    dense ``num_classes``, linear (logits)      num_classes
====  =====================================  ==========================

With 1000 classes this has 50,844,008 parameters (the paper's 60M counts a
227-pixel input, i.e. a 6x6x256 = 9216-wide flatten).

Departures from the paper, all deliberate:

* **One tower, no grouped convolutions.** The paper split conv2, conv4 and
  conv5 across two GPUs (each filter saw half of the previous layer's
  channels). That was a memory workaround; the single-tower form used here is
  the common one (it is also the form in Krizhevsky 2014, "One weird trick for
  parallelizing convolutional neural networks", arXiv:1404.5997).
* **No local response normalisation (LRN).** The paper applied LRN after
  conv1 and conv2 (reporting -1.4% top-1 error). Omitting it is common
  practice: Simonyan and Zisserman (2014, "Very Deep Convolutional Networks
  for Large-Scale Image Recognition", section 4.1) found LRN did not improve
  their ILSVRC results, and common single-tower reimplementations (e.g.
  torchvision's, after Krizhevsky 2014) have none. It also costs time on
  CPUs for little gain.
* **Initialisation.** He normal (std = sqrt(2 / fan_in); He et al., ICCV
  2015) for the five ReLU convolutions, Glorot uniform (Glorot and Bengio,
  AISTATS 2010) for the three dense layers, zero biases; the paper's N(0, 0.01)
  does not learn here. The measurements behind this: docs/design.md, 'AlexNet'.
* **Weight decay** is not part of the model: the layers carry no regularisers.
  :func:`spark_imagenet.training.worker.models.compile.compile_model` adds it for
  every model (``--weight-decay``, the paper's 5e-4 by default for AlexNet:
  the loss term 2.5e-4 * sum(w^2) over the conv/dense kernels, whose gradient
  is 5e-4 * w, the paper's update rule term; biases are not decayed), so a
  saved ``model.keras`` holds no training-only losses.
* ``width`` scales every conv and hidden dense layer (not the class count);
  tests use 0.25, which makes a model that trains quickly on a CPU.

The model takes float32 images ``[B, S, S, 3]`` already normalised (ImageNet mean/std: the train and test
steps normalise the input pipeline's uint8 batches, see
:func:`spark_imagenet.training.worker.preprocessing.normalize_batch`) and returns
float32 logits ``[B, num_classes]`` (no softmax; the loss uses
``from_logits=True``, see :func:`spark_imagenet.training.worker.models.compile.compile_model`).
Under a mixed-precision policy the logits come in its compute dtype:
:func:`spark_imagenet.training.worker.models.compile.float32_logits` casts them.
"""

from __future__ import annotations



import tf_keras as keras  # noqa: E402  (docs/design.md, 'Keras 2 (tf-keras) under MultiWorkerMirroredStrategy')

from spark_imagenet.errors import ConfigError  # noqa: E402
from spark_imagenet.training.job.alexnet_layers import (  # noqa: E402
    CONV_LAYERS,
    POOL_AFTER,
    POOL_SIZE,
    POOL_STRIDE,
    min_image_size,
)

#: Width of the two hidden fully connected layers (paper section 3.5).
DENSE_UNITS = 4096
#: Dropout rate of the two hidden fully connected layers (paper section 4.2).
DROPOUT = 0.5


def _scaled(units: int, width: float) -> int:
    """``units * width`` rounded to the nearest integer, at least 1."""
    return max(1, int(round(units * width)))


def build_alexnet(num_classes: int, image_size: int, width: float = 1.0) -> keras.Model:
    """Build an (uncompiled) AlexNet.

    Args:
        num_classes: number of output classes (>= 1); the logits layer width.
        image_size: input height (= width) in pixels, >= :func:`min_image_size`
            (67). 224 gives the 6400-wide flatten of the standard model.
        width: multiplier for every conv and hidden dense width (> 0); 1.0 is
            the paper's model, tests use 0.25.

    Returns:
        A ``tf_keras.Model`` named ``"alexnet"`` mapping float32
        ``[B, image_size, image_size, 3]`` normalised images to logits
        ``[B, num_classes]`` (float32; the compute dtype of a mixed-precision
        global policy, see ``float32_logits``). Create it inside
        ``strategy.scope()`` when training under a distribution strategy.

    Raises:
        ConfigError: ``image_size`` below the minimum (names ``--image-size``
            and the minimum), ``width`` not positive (names ``--width``) or
            ``num_classes`` below 1.
    """
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}",
                          key="num_classes", value=num_classes)
    if not isinstance(width, (int, float)) or not width > 0:
        raise ConfigError(f"--width must be a positive number (1.0 = the paper's AlexNet), got {width!r}",
                          key="width", value=width)
    minimum = min_image_size()
    if not isinstance(image_size, int) or image_size < minimum:
        raise ConfigError(
            f"--image-size {image_size!r} is too small for AlexNet: its 11x11/4 conv1 and three 3x3/2 "
            f"max pools need at least {minimum} pixels; use --image-size {minimum} or more "
            f"(224 is the standard size)", key="image_size", value=image_size
        )

    def kernel_args(initializer: type) -> dict:
        # A fresh initializer object per layer (Keras warns when an initializer
        # instance is shared between layers).
        return {"kernel_initializer": initializer(), "bias_initializer": "zeros"}

    inputs = keras.Input(shape=(image_size, image_size, 3), dtype="float32", name="image")
    x = inputs
    for i, (filters, kernel, stride, padding) in enumerate(CONV_LAYERS):
        x = keras.layers.Conv2D(
            _scaled(filters, width),
            kernel,
            strides=stride,
            padding=padding,
            activation="relu",
            name=f"conv{i + 1}",
            **kernel_args(keras.initializers.HeNormal),
        )(x)
        if i in POOL_AFTER:
            x = keras.layers.MaxPooling2D(POOL_SIZE, strides=POOL_STRIDE, padding="valid", name=f"pool{i + 1}")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    for name in ("fc6", "fc7"):
        x = keras.layers.Dense(
            _scaled(DENSE_UNITS, width), activation="relu", name=name, **kernel_args(keras.initializers.GlorotUniform)
        )(x)
        x = keras.layers.Dropout(DROPOUT, name=f"{name}_dropout")(x)
    logits = keras.layers.Dense(
        num_classes, activation=None, name="logits", **kernel_args(keras.initializers.GlorotUniform)
    )(x)
    return keras.Model(inputs, logits, name="alexnet")
