"""AlexNet's layer table and its size arithmetic, without TensorFlow.

The driver checks ``--image-size`` with :func:`min_image_size` before any
task starts; :mod:`spark_imagenet.training.worker.models.alexnet` builds the Keras
model from the same table, so the two can never disagree.
"""

from __future__ import annotations

#: (filters, kernel, strides, padding) of the five convolutions, paper section 3.5.
CONV_LAYERS: tuple[tuple[int, int, int, str], ...] = (
    (96, 11, 4, "valid"),
    (256, 5, 1, "same"),
    (384, 3, 1, "same"),
    (384, 3, 1, "same"),
    (256, 3, 1, "same"),
)
#: Max pooling (window 3, stride 2, 'valid': the paper's "overlapping pooling",
#: section 3.4) follows these conv layers (0-based indices into CONV_LAYERS).
POOL_AFTER: frozenset[int] = frozenset({0, 1, 4})
POOL_SIZE = 3
POOL_STRIDE = 2


def _out_size(size: int, kernel: int, stride: int, padding: str) -> int:
    """Spatial output size of a conv/pool layer (Keras/TF arithmetic).

    Args:
        size: input height (= width) in pixels.
        kernel: window size in pixels.
        stride: stride in pixels.
        padding: ``"valid"`` (floor((size - kernel) / stride) + 1, 0 if the
            window does not fit) or ``"same"`` (ceil(size / stride)).

    Returns:
        The output height (= width); 0 or less means the layer has no output.
    """
    if padding == "same":
        return -(-size // stride)
    if size < kernel:
        return 0
    return (size - kernel) // stride + 1


def feature_map_size(image_size: int) -> int:
    """Height (= width) of the last pooled feature map for an input size.

    Args:
        image_size: input height (= width) in pixels.

    Returns:
        Size of pool5's output (5 for 224, 6 for 227, 1 for 67..98), or 0 when
        the image is too small for the conv/pool chain.
    """
    size = image_size
    for i, (_, kernel, stride, padding) in enumerate(CONV_LAYERS):
        size = _out_size(size, kernel, stride, padding)
        if size <= 0:
            return 0
        if i in POOL_AFTER:
            size = _out_size(size, POOL_SIZE, POOL_STRIDE, "valid")
            if size <= 0:
                return 0
    return size


def min_image_size() -> int:
    """Smallest input size (pixels) for which every layer has an output.

    Computed from the layer arithmetic in :data:`CONV_LAYERS` and the pools:
    pool5 needs 3 inputs, so pool2 must give 3, pool1 7, conv1 15, and
    conv1 (11x11 stride 4, valid) needs 4 * 14 + 11 = 67 pixels.

    Returns:
        67 for this architecture.
    """
    size = 1
    while feature_map_size(size) < 1:
        size += 1
    return size
