"""The product's own limit on the pixels of one image, checked from the header before anything is decoded.

Every place that opens an image with Pillow (``shard`` on every path, ``predict`` on single files and as a
Spark job) opens it with :func:`open_image`: the width and height come from the header (Pillow's open is
lazy), and an image of more than ``max_pixels`` pixels is refused with :class:`ImageTooLarge`, one line
naming the file, its width x height, its megapixels, the limit and the setting that raises it
(``--max-image-pixels``, ``max_image_pixels=``). Pillow's own decompression-bomb check
(``PIL.Image.MAX_IMAGE_PIXELS``: a warning above it, an error above twice it) is left out of that open, so
this limit alone decides, and neither Pillow's warning nor its error reaches the user. Why the default:
docs/design.md, 'The pixel limit'.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import IO, Iterator

from PIL import Image

from spark_imagenet.errors import ConfigError, ImageTooLarge

#: The default limit, in pixels (width x height): 100 megapixels.
DEFAULT_MAX_PIXELS = 100_000_000
#: The command-line option that sets the limit (``max_image_pixels=`` in the Python API).
OPTION = "--max-image-pixels"

#: Held while ``PIL.Image.MAX_IMAGE_PIXELS`` is lifted for one open, so two threads never restore it wrongly.
_PILLOW_LIMIT = threading.Lock()


def check_max_pixels(value: object, where: str = "max_image_pixels") -> int:
    """The limit ``value`` as given, checked.

    Args:
        value: the limit in pixels.
        where: how the message names the setting.

    Returns:
        int: ``value``.

    Raises:
        ConfigError: not a whole number of 1 or more (names ``where``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}={value!r}: give the largest image to accept as a whole number of pixels "
                          f"(width x height), 1 or more (default {DEFAULT_MAX_PIXELS})")
    return value


def _limit(max_pixels: int) -> str:
    """The limit for messages: ``100 megapixels``, or ``5,000 pixels`` below a megapixel."""
    return f"{max_pixels / 1e6:g} megapixels" if max_pixels >= 1_000_000 else f"{max_pixels:,} pixels"


def _too_large(name: str, reason: str) -> ImageTooLarge:
    """The error naming ``name``, for ``reason`` (what is wrong and what to do)."""
    return ImageTooLarge(f"{name}: {reason}", name=name, reason=reason)


def too_large(name: str, width: int, height: int, max_pixels: int) -> ImageTooLarge:
    """The error for an image of ``width`` x ``height`` pixels above ``max_pixels`` (one line, naming ``name``)."""
    return _too_large(name, f"{width} x {height} pixels ({width * height / 1e6:.1f} megapixels) is above the limit of "
        f"{_limit(max_pixels)}; resize the image, or raise the limit with {OPTION} "
        f"(max_image_pixels= in Python) where there is memory to decode it (about 4 bytes a pixel, several "
        "copies)")


@contextlib.contextmanager
def open_image(source: str | IO[bytes], name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> Iterator[Image.Image]:
    """Context manager: the image ``source`` opened lazily with Pillow, once its header is within the limit.

    Args:
        source: a path, or a binary file object (e.g. ``io.BytesIO(data)``).
        name: how the message names the file.
        max_pixels: the most pixels (width x height) accepted.

    Yields:
        PIL.Image.Image: the opened image (header parsed, nothing decoded yet), closed when the block ends.

    Raises:
        ImageTooLarge: more than ``max_pixels`` pixels (also when a later frame that Pillow checks on its own
            is too large for Pillow).
        PIL.UnidentifiedImageError, OSError and the rest of what ``PIL.Image.open`` raises: as it raises them.
    """
    with _PILLOW_LIMIT:
        saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            image = Image.open(source)
        finally:
            Image.MAX_IMAGE_PIXELS = saved
    with image, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        width, height = image.size
        if width * height > max_pixels:
            raise too_large(name, width, height, max_pixels)
        try:
            yield image
        except Image.DecompressionBombError as e:  # a GIF frame or a crop Pillow checks itself, above its limit
            raise _too_large(name, f"{e}; resize the image") from None
