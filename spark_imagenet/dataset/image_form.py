"""How a dataset stores its images: as the sources hold them, or re-encoded smaller (``shard --resize N``,
``--max-side N``, ``--jpeg-quality Q``).

Three forms (:class:`ImageForm`):

``original``
    every image as its source holds it (byte for byte, unless :func:`spark_imagenet.dataset.quality.repair`
    must repair it). The default.
``resize N``
    the shorter side scaled to ``N`` pixels, then the centre ``N x N`` square cut out: what Krizhevsky et al.
    did to ImageNet before training (``--resize 256``, the paper's section 2). Smaller images are scaled *up*, as
    the paper's were, so every stored image is ``N x N``.
``max-side N``
    the aspect ratio kept, the longer side at most ``N`` pixels; an image already within ``N`` is stored as it
    is (never scaled up).

A re-encoded image is an upright RGB baseline JPEG of quality ``Q`` (default :data:`DEFAULT_JPEG_QUALITY`); the
one re-encode is :func:`spark_imagenet.dataset.quality.repair`. The manifest records the form
(:attr:`ImageForm.label`: ``original``, ``resize 256 q90``, ``max-side 320 q90``), and the dataset id depends on
it. This module is pure arithmetic: no Pillow, Spark or TensorFlow. Why: docs/design.md, 'Stored image forms'.
"""

from __future__ import annotations

import dataclasses
import re

from spark_imagenet.errors import ConfigError

#: The kinds of form, in the manifest's words.
KINDS = ("original", "resize", "max-side")
#: The JPEG quality of re-encoded images when ``--jpeg-quality`` is not given.
DEFAULT_JPEG_QUALITY = 90
#: The largest ``--resize`` / ``--max-side`` accepted, in pixels (above it nothing is gained over the originals).
MAX_SIZE = 8192
#: The smallest, in pixels: below it a photo keeps too little to classify (tests store 16 px images).
MIN_SIZE = 16
#: A label of a re-encoded form, as :attr:`ImageForm.label` writes it.
_LABEL = re.compile(r"(resize|max-side) ([0-9]+) q([0-9]+)")


@dataclasses.dataclass(frozen=True)
class ImageForm:
    """How images are stored (see the module doc).

    Attributes:
        kind: ``"original"``, ``"resize"`` or ``"max-side"``.
        size: ``N`` in pixels (the square's side, or the longest side); 0 for ``original``.
        quality: the JPEG quality (1-100) of re-encoded images; unused for ``original``.
    """

    kind: str = "original"
    size: int = 0
    quality: int = DEFAULT_JPEG_QUALITY

    def __post_init__(self) -> None:
        """Raises ConfigError: a kind not in :data:`KINDS` (build forms with :func:`image_form`, which checks all)."""
        if self.kind not in KINDS:
            raise ConfigError(f"image form {self.kind!r}: choose one of {', '.join(KINDS)}")

    @property
    def label(self) -> str:
        """The form in words, as the manifest records it: ``original``, ``resize 256 q90``, ``max-side 320 q90``."""
        return "original" if self.kind == "original" else f"{self.kind} {self.size} q{self.quality}"

    @classmethod
    def parse(cls, label: str) -> "ImageForm":
        """The form :attr:`label` wrote.

        Raises:
            ValueError: ``label`` is no such form.
        """
        if label == "original":
            return ORIGINAL
        found = _LABEL.fullmatch(label)
        if found is None:
            raise ValueError(f"{label!r} is not 'original', 'resize N qQ' or 'max-side N qQ'")
        return image_form(**{found[1].replace("-", "_"): int(found[2])}, jpeg_quality=int(found[3]))

    def target(self, width: int, height: int) -> tuple[int, int] | None:
        """The stored size of an upright ``width`` x ``height`` image, or None when it is stored as it is.

        Args:
            width: the image's width in pixels, after its EXIF orientation is applied.
            height: its height in pixels, likewise.

        Returns:
            tuple[int, int] | None: ``(width, height)`` in pixels: ``(N, N)`` for ``resize`` (None when the image
            already is ``N x N``); the size with the longer side ``N`` (each side rounded, at least 1) for
            ``max-side`` (None when the longer side is ``N`` or less); None for ``original``.
        """
        if self.kind == "resize":
            return None if (width, height) == (self.size, self.size) else (self.size, self.size)
        if self.kind == "max-side" and max(width, height) > self.size:
            scale = self.size / max(width, height)
            return max(1, round(width * scale)), max(1, round(height * scale))
        return None

    def crop_box(self, width: int, height: int) -> tuple[float, float, float, float] | None:
        """The part of an upright ``width`` x ``height`` image that is scaled to :meth:`target`: the centre square
        of side ``min(width, height)`` for ``resize`` (left, top, right, bottom in pixels), None (all of it) for
        the other forms."""
        if self.kind != "resize":
            return None
        side = min(width, height)
        left, top = (width - side) / 2, (height - side) / 2
        return left, top, left + side, top + side


#: Images stored as the sources hold them.
ORIGINAL = ImageForm()


def _size(value: object, name: str, example: str) -> int:
    """``value`` as a size in pixels, checked; ``name`` is the setting's keyword (``max_side``), ``example`` a
    typical use of its option."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_SIZE <= value <= MAX_SIZE:
        raise ConfigError(f"{name}={value!r} (--{name.replace('_', '-')}): give the size in pixels as a whole number "
                          f"from {MIN_SIZE} to {MAX_SIZE} (e.g. {example})", key=name, value=value)
    return value


def image_form(resize: int | None = None, max_side: int | None = None,
               jpeg_quality: int | None = None) -> ImageForm:
    """The form that ``shard``'s settings name, checked: the one place they are checked, for every path.

    Args:
        resize: ``--resize N`` (``resize=``): the shorter side to ``N`` pixels, then the centre ``N x N``.
        max_side: ``--max-side N`` (``max_side=``): the longer side at most ``N`` pixels.
        jpeg_quality: ``--jpeg-quality Q`` (``jpeg_quality=``), 1-100, of the re-encoded images (None: 90);
            only with one of the two.

    Returns:
        ImageForm: :data:`ORIGINAL` when neither ``resize`` nor ``max_side`` is given.

    Raises:
        ConfigError: both sizes, a size that is not a whole number from :data:`MIN_SIZE` to :data:`MAX_SIZE`, a
            quality that is not one from 1 to 100, or a quality without a size; one line naming the setting
            (``resize=0 (--resize): ...``, the form a Param's message is made from).
    """
    if resize is not None and max_side is not None:
        raise ConfigError(f"resize={resize} and max_side={max_side} (--resize, --max-side): give one of the two "
                          "(--resize N: N x N, the paper's form; --max-side N: the aspect ratio kept)",
                          key="resize", value=resize)
    if jpeg_quality is not None and (isinstance(jpeg_quality, bool) or not isinstance(jpeg_quality, int)
                                     or not 1 <= jpeg_quality <= 100):
        raise ConfigError(f"jpeg_quality={jpeg_quality!r} (--jpeg-quality): give a JPEG quality from 1 to 100 "
                          f"(default {DEFAULT_JPEG_QUALITY})", key="jpeg_quality", value=jpeg_quality)
    if resize is None and max_side is None:
        if jpeg_quality is not None:
            raise ConfigError(f"jpeg_quality={jpeg_quality} (--jpeg-quality): only with --resize N or --max-side N "
                              "(without them the images are stored as they are, not re-encoded)",
                              key="jpeg_quality", value=jpeg_quality)
        return ORIGINAL
    quality = DEFAULT_JPEG_QUALITY if jpeg_quality is None else jpeg_quality
    if resize is not None:
        return ImageForm("resize", _size(resize, "resize", "--resize 256, the paper's form"), quality)
    return ImageForm("max-side", _size(max_side, "max_side", "--max-side 320"), quality)
