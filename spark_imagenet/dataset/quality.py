"""Data quality of the source images: classify each file from its bytes, repair what can be repaired.

Real ImageNet holds files TensorFlow's ``decode_jpeg`` cannot use as they are:
CMYK JPEGs (22 in train, at least one in val), a PNG named ``.JPEG``,
images with an EXIF orientation tag (TensorFlow ignores the tag, so the
pixels come out rotated), grayscale JPEGs, and copies of it may hold truncated
or empty files. :func:`classify` finds them from the bytes alone (Pillow, no
list of names); :func:`repair` turns a repairable file into an upright RGB
JPEG. The shard builder (:mod:`spark_imagenet.dataset.sharding`) calls both for every
image; only files that need a repair are decoded at full size and
re-encoded, every other file is stored byte for byte.

Categories (:data:`CATEGORIES`), most serious first; a file gets the first
that applies, and :attr:`Finding.reason` names every problem found:

``empty``
    zero bytes. Unusable.
``corrupt``
    Pillow does not recognise the bytes as an image, the header gives more
    pixels than the limit (:mod:`spark_imagenet.dataset.pixels`; nothing is
    decoded then), or the image does not
    decode completely (a truncated JPEG, a scan cut short, an error libjpeg
    cannot recover from). Unusable. Damage inside the entropy-coded data that
    libjpeg only warns about (a bad Huffman code, a scan's data ending early,
    extraneous bytes before a marker) is not found: Pillow ignores libjpeg's
    warnings, as TensorFlow's ``decode_jpeg`` does (docs/design.md, 'Image
    quality while sharding').
``not_jpeg``
    another format named like a JPEG (PNG, GIF, WebP, BMP, ...; the real
    format is in :attr:`Finding.format`). Repaired: decoded (first frame of
    an animation; the alpha channel of a transparent image dropped, keeping
    the colours stored under it; 16-bit and 32-bit integer or float
    greyscale scaled to 8 bits first) and re-encoded as an RGB JPEG.
``ycck``
    a 4-channel JPEG whose Adobe APP14 marker says transform 2 (YCCK).
    Pillow (libjpeg) converts YCCK to CMYK while decoding. Repaired like ``cmyk``.
``cmyk``
    a 4-channel JPEG (Adobe transform 0 or no marker). Repaired: Pillow's
    ``convert("RGB")``, which assumes the Adobe convention (inverted samples)
    for every CMYK JPEG (docs/design.md, 'Image quality while sharding').
``exif_rotated``
    an EXIF orientation tag (0x0112) other than 1. Repaired:
    ``PIL.ImageOps.exif_transpose`` so the stored pixels are upright, and the
    tag is dropped (no EXIF is written). Any repair of the categories above
    also applies the orientation.
``grayscale``
    a 1-channel JPEG. **Kept as it is** (stored byte for byte): TensorFlow's
    ``decode_jpeg(channels=3)`` expands it to three equal channels.
``ok``
    a 3-channel JPEG (YCbCr, or RGB when its Adobe marker says transform 0),
    no orientation to apply, decodes.

Repaired files are re-encoded with Pillow as baseline JPEG, quality 95
(:data:`REPAIR_QUALITY`), 4:2:0 chroma subsampling, without EXIF. A dataset
stored in another form (``shard --resize N``, ``--max-side N``:
:mod:`spark_imagenet.dataset.image_form`) re-encodes the images it scales the
same way, in the same call (:func:`repair`), at its own JPEG quality.
"""

from __future__ import annotations

import dataclasses
import io
import re
import warnings

import numpy as np

from PIL import Image, ImageOps

from spark_imagenet.dataset.image_form import ORIGINAL, ImageForm
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, ImageTooLarge, open_image

#: Categories, most serious first (see the module docstring).
CATEGORIES = ("empty", "corrupt", "not_jpeg", "ycck", "cmyk", "exif_rotated", "grayscale", "ok")
#: Categories that cannot be stored (``--on-corrupt`` decides: error or skip).
UNUSABLE = frozenset({"empty", "corrupt"})
#: Categories that :func:`repair` decodes and re-encodes.
REPAIRED = frozenset({"not_jpeg", "ycck", "cmyk", "exif_rotated"})
#: JPEG quality of repaired files.
REPAIR_QUALITY = 95
#: EXIF tag of the orientation.
ORIENTATION_TAG = 0x0112
#: What Pillow raises for bytes it cannot decode (``UnidentifiedImageError`` is an ``OSError``), and the pixel
#: limit's error; the only errors of :func:`repair` that mean a bad file. Anything else it raises is a bug.
DECODE_ERRORS = (OSError, SyntaxError, EOFError, ImageTooLarge)
#: A JPEG marker inside entropy-coded data: 0xFF followed by neither a stuffed 0x00, a restart marker
#: (RST0-7) nor a fill byte.
_MARKER_RE = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


@dataclasses.dataclass(frozen=True)
class Finding:
    """What :func:`classify` found about one file.

    Attributes:
        name: the file's name (for messages).
        category: one of :data:`CATEGORIES`.
        format: Pillow's format name (``"JPEG"``, ``"PNG"``, ...), ``None``
            when not recognised.
        colorspace: for a JPEG ``"L"``, ``"YCbCr"``, ``"RGB"``, ``"CMYK"`` or
            ``"YCCK"``; else Pillow's mode.
        width: in pixels as stored in the file (before any rotation).
        height: in pixels as stored in the file.
        orientation: the EXIF orientation (1 when there is none).
        reason: ``None`` for ``ok``; else what was found, in words.
    """

    name: str
    category: str
    format: str | None = None
    colorspace: str | None = None
    width: int = 0
    height: int = 0
    orientation: int = 1
    reason: str | None = None

    @property
    def usable(self) -> bool:
        """Whether the file can be stored (as it is or repaired)."""
        return self.category not in UNUSABLE

    @property
    def needs_repair(self) -> bool:
        """Whether :func:`repair` must re-encode the file before it is stored."""
        return self.category in REPAIRED


def _jpeg_colorspace(im: Image.Image) -> str:
    transform = im.info.get("adobe_transform")
    if im.mode == "CMYK":
        return "YCCK" if transform == 2 else "CMYK"
    if im.mode == "RGB":
        return "RGB" if ("adobe" in im.info and transform == 0) else "YCbCr"
    return im.mode


def _orientation(im: Image.Image) -> int:
    try:
        value = im.getexif().get(ORIENTATION_TAG, 1)
        return int(value) if isinstance(value, int) else 1
    except Exception:  # a damaged EXIF block: no orientation to apply
        return 1


def _jpeg_end(data: bytes) -> int | None:
    """The offset just after the end-of-image marker that ends a JPEG's first image, or None.

    Walks the marker segments from the start-of-image marker by their lengths,
    and the entropy-coded data after each start-of-scan to the next marker, so
    an EOI inside an EXIF thumbnail (APP1) is not taken for the image's own,
    and whatever follows the image's EOI (padding, a newline, an appended
    second image) is allowed, as TensorFlow and Pillow allow it.
    """
    if not data.startswith(b"\xff\xd8"):
        return None
    pos, n = 2, len(data)
    while pos < n:
        if data[pos] != 0xFF:
            return None  # no marker where one must be: damaged or cut short
        while pos < n and data[pos] == 0xFF:  # fill bytes before the marker code
            pos += 1
        if pos >= n:
            return None
        code = data[pos]
        pos += 1
        if code == 0xD9:
            return pos
        if code == 0xD8:  # a second start of image before this one ended: cut short, then something else
            return None
        if code == 0x01 or 0xD0 <= code <= 0xD7:  # TEM, RSTn: no length field
            continue
        if pos + 2 > n:
            return None
        pos += int.from_bytes(data[pos:pos + 2], "big")
        if pos > n:
            return None
        if code == 0xDA:  # start of scan: entropy-coded data up to the next marker
            found = _MARKER_RE.search(data, pos)
            if found is None:
                return None
            pos = found.start()
    return None


def _draft_check(im: Image.Image, size: int) -> None:
    """Set up the cheapest complete decode of a JPEG that :meth:`~PIL.Image.Image.load` then runs.

    1/8 DCT scale (each block's DC coefficient only, no inverse transform of
    the AC ones) and, for a YCbCr, RGB or grayscale JPEG, grayscale output (no
    colour conversion or upsampling of the chroma). libjpeg still
    entropy-decodes every coefficient of every component in every scan (it
    must, to find where the next block starts, and it reads on to the
    end-of-image marker), so a file cut short or damaged fails exactly as in a
    full-size colour decode (docs/design.md, 'Image quality while sharding'). The whole file is handed
    to the decoder in one call (``decodermaxblock``) instead of 64 KiB blocks,
    which saves a suspension and a copy of the rest per block. CMYK and YCCK
    JPEGs are decoded in their own mode (libjpeg has no gray output for them).
    """
    im.decodermaxblock = max(size, 1) + 1
    im.draft("L" if im.mode in ("L", "RGB") else im.mode, (max(1, im.width // 8), max(1, im.height // 8)))


def classify(data: bytes, name: str = "", verify: str = "decode", max_pixels: int = DEFAULT_MAX_PIXELS) -> Finding:
    """Classify one image file from its bytes.

    Args:
        data: the file's bytes.
        name: its name (only for :attr:`Finding.name` and messages).
        verify: ``"decode"`` decodes a JPEG completely at 1/8 scale, to
            grayscale where it can (JPEG DCT scaling: every coefficient of
            every scan is still entropy-decoded, so a file cut short or one
            libjpeg cannot decode fails; see :func:`_draft_check`); ``"header"`` parses
            only the header and checks that the
            image ends with an end-of-image marker, which may be followed by
            other bytes (misses damage inside the file). Files of other
            formats are always decoded completely.
        max_pixels: the most pixels (width x height) an image may have; a larger one is ``corrupt``, found
            from its header before anything is decoded (:func:`spark_imagenet.dataset.pixels.open_image`).

    Returns:
        Finding: the category and what was found (see the module docstring).
    """
    if len(data) == 0:
        return Finding(name, "empty", reason="empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with open_image(io.BytesIO(data), name, max_pixels) as im:
                fmt, width, height = im.format, im.width, im.height
                is_jpeg = fmt in ("JPEG", "MPO")  # MPO: a JPEG with extra frames (first frame = the image)
                colorspace = _jpeg_colorspace(im) if is_jpeg else im.mode
                orientation = _orientation(im)
                if not is_jpeg or verify == "decode":
                    if is_jpeg:
                        _draft_check(im, len(data))
                    im.load()
                elif _jpeg_end(data) is None:
                    return Finding(name, "corrupt", fmt, colorspace, width, height, orientation,
                                   "truncated JPEG (no end-of-image marker)")
    except ImageTooLarge as e:
        return Finding(name, "corrupt", reason=e.reason)
    except Image.UnidentifiedImageError:
        return Finding(name, "corrupt", reason="not an image in any format Pillow recognises")
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError...
        detail = re.sub(r" at 0x[0-9a-fA-F]+", "", str(e))  # no memory addresses in reports
        if data.startswith(b"\xff\xd8\xff"):
            return Finding(name, "corrupt", "JPEG", reason=f"JPEG does not decode: {detail}")
        return Finding(name, "corrupt", reason=f"not an image that decodes ({type(e).__name__}: {detail})")
    if width < 1 or height < 1:
        return Finding(name, "corrupt", fmt, colorspace, width, height, orientation,
                       f"invalid size {width}x{height}")
    problems = []
    if not is_jpeg:
        problems.append(("not_jpeg", f"a {fmt} image ({colorspace}) named like a JPEG"))
    elif colorspace == "YCCK":
        problems.append(("ycck", "YCCK JPEG (Adobe transform 2): converted to RGB"))
    elif colorspace == "CMYK":
        problems.append(("cmyk", "CMYK JPEG: converted to RGB"))
    if 2 <= orientation <= 8:
        problems.append(("exif_rotated", f"EXIF orientation {orientation}: TensorFlow ignores it"))
    if is_jpeg and colorspace == "L":
        problems.append(("grayscale", "grayscale JPEG (kept: decoded with 3 equal channels)"))
    if not problems:
        return Finding(name, "ok", fmt, colorspace, width, height, orientation)
    category = min((c for c, _ in problems), key=CATEGORIES.index)
    return Finding(name, category, fmt, colorspace, width, height, orientation,
                   "; ".join(r for _, r in problems))


#: Pillow modes whose values exceed 8 bits; ``convert("RGB")`` would clip them (a white or black picture).
_WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def _to_8bit(im: Image.Image) -> Image.Image:
    """An 8-bit greyscale copy of a 16/32-bit integer or float image, scaled
    by its value range: values up to 255 as they are, up to 65535 divided by
    257 (the 16-bit to 8-bit map), larger ones by max/255; floats up to 1.0
    multiplied by 255. Other modes are returned unchanged."""
    if im.mode not in _WIDE_MODES:
        return im
    a = np.array(im, dtype=np.float32)  # one float copy (writable), scaled in place: memory per pixel bounded
    hi = float(a.max()) if a.size else 0.0
    if im.mode == "F" and hi <= 1.0:
        a *= 255.0
    elif hi > 65535:
        a *= 255.0 / hi
    elif hi > 255:
        a /= 257.0
    np.rint(a, out=a)
    np.clip(a, 0, 255, out=a)
    return Image.fromarray(a.astype(np.uint8), "L")


def repair(data: bytes, finding: Finding, max_pixels: int = DEFAULT_MAX_PIXELS,
           form: ImageForm = ORIGINAL) -> tuple[bytes, int, int]:
    """The bytes to store for a usable file: the file itself, or an upright RGB JPEG re-encoded from it (the one
    re-encode of the package).

    A file is re-encoded when it needs a repair (:attr:`Finding.needs_repair`) or when ``form`` gives it another
    size (:meth:`~spark_imagenet.dataset.image_form.ImageForm.target`); then the EXIF orientation is applied,
    16/32-bit values scaled to 8 bits, the colours converted to RGB (CMYK as Adobe-inverted, grayscale to three
    equal channels, alpha dropped), the image scaled (Lanczos; a JPEG first decoded at the smallest DCT scale
    that keeps at least twice the target size) and saved as a baseline 4:2:0 JPEG without EXIF, of quality
    ``form.quality`` (:data:`REPAIR_QUALITY` for ``original``).

    Args:
        data: the file's bytes.
        finding: its :func:`classify` result.
        max_pixels: the pixel limit :func:`classify` applied (the image is opened under it again).
        form: how the dataset stores images (:mod:`spark_imagenet.dataset.image_form`).

    Returns:
        tuple[bytes, int, int]: ``(jpeg, height, width)``, the height and width in pixels. ``data`` itself (not
        decoded) and the finding's size when the file needs neither a repair nor another size.

    Raises:
        ValueError: the finding is of an unusable file (``empty``, ``corrupt``).
        OSError, SyntaxError, EOFError, ImageTooLarge (:data:`DECODE_ERRORS`): Pillow cannot decode the file
            after all, or it is above ``max_pixels``.
    """
    if not finding.usable:
        raise ValueError(f"{finding.name}: {finding.category} files cannot be repaired ({finding.reason})")
    turned = 5 <= finding.orientation <= 8  # a quarter turn: width and height swap
    upright = (finding.height, finding.width) if turned else (finding.width, finding.height)
    target = form.target(*upright)
    if not finding.needs_repair and target is None:
        return data, finding.height, finding.width
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with open_image(io.BytesIO(data), finding.name, max_pixels) as im:
            if target is not None:  # the JPEG decoded at a reduced DCT scale, still >= twice the target
                scale = max(target[0] / upright[0], target[1] / upright[1])
                im.draft(None, (int(finding.width * scale * 2), int(finding.height * scale * 2)))
            im.load()  # first frame of an animation
            # the orientation classify found applied (it found none in a damaged EXIF block); 16/32-bit scaled
            rgb = _to_8bit(ImageOps.exif_transpose(im) if 2 <= finding.orientation <= 8 else im)
            # CMYK (Adobe-inverted, as Pillow reads it), P, LA, RGBA...; an RGB image as it is (no second copy)
            rgb = rgb if rgb.mode == "RGB" else rgb.convert("RGB")
            if target is not None:
                rgb = rgb.resize(target, Image.Resampling.LANCZOS, box=form.crop_box(rgb.width, rgb.height))
            out = io.BytesIO()
            quality = REPAIR_QUALITY if form.kind == "original" else form.quality
            rgb.save(out, "JPEG", quality=quality, subsampling="4:2:0")  # no exif=: the tag is dropped
    return out.getvalue(), rgb.height, rgb.width
