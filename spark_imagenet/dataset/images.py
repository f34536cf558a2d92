"""The image files a user names on the command line (``spark-imagenet predict IMAGE...``), checked cheaply.

:func:`image_files` expands folders and checks that every file exists, can be read, starts like an
image Pillow knows and has no more pixels than the limit (its header only, unless asked to decode it;
:mod:`spark_imagenet.dataset.pixels`). A file that fails is set aside with its reason (:class:`ImageFiles`):
the others are still predicted, unless none is left. The command line runs it before it
starts the TensorFlow child (seconds of start-up), and ``predict`` runs it again in that child.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, open_image
from spark_imagenet.errors import ConfigError
from spark_imagenet.source.labelled import IMAGE_EXTENSIONS, is_image_name, listing


@dataclasses.dataclass(frozen=True)
class ImageFiles:
    """The image files :func:`image_files` found.

    Attributes:
        files: the usable files, in the order given (a folder's sorted).
        unusable: one error per file that cannot be used, naming it and why (``PATH: not an image ...``), in
            the order given.
    """

    files: tuple[Path, ...]
    unusable: tuple[ConfigError, ...] = ()


def image_files(paths: Sequence[str], max_pixels: int = DEFAULT_MAX_PIXELS, decode: bool = False) -> ImageFiles:
    """The image files that ``paths`` name: files as given, folders as their image files (sorted, not recursive).

    Args:
        paths: files and folders, as the user typed them.
        max_pixels: the most pixels (width x height) an image may have.
        decode: also decode each file with Pillow (a file damaged after its header is unusable too).

    Returns:
        ImageFiles: the files :func:`check_image` accepts, and the error of each other one.

    Raises:
        ConfigError: a path that does not exist, a folder without image files, or no usable file at all: the
            one file's own error (cannot be read, not an image, more pixels than ``max_pixels``:
            ``ImageTooLarge``), or every file's listed.
    """
    found: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.is_file() and is_image_name(p.name))
            if not inside:
                raise ConfigError(f"{path}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in this folder")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise ConfigError(f"{path}: no such file or folder")
    usable, unusable = [], []
    for path in found:
        try:
            check_image(path, max_pixels, decode)
            usable.append(path)
        except ConfigError as e:
            unusable.append(e)
    if not usable and len(unusable) == 1:
        raise unusable[0]
    if not usable:
        raise ConfigError(f"none of the {len(unusable)} image files can be used:"
                          + listing([str(e) for e in unusable]))
    return ImageFiles(tuple(usable), tuple(unusable))


def check_image(path: Path, max_pixels: int = DEFAULT_MAX_PIXELS, decode: bool = False) -> None:
    """Check that ``path`` can be read, that its header is one of an image format Pillow reads, and that the
    image has at most ``max_pixels`` pixels.

    Only the header is read (``PIL.Image.open`` is lazy) unless ``decode``: then the pixels are decoded too,
    so a file damaged further in (a truncated JPEG) is found here.

    Raises:
        ConfigError: the file cannot be opened (permissions), is not an image, or (``decode``) cannot be
            decoded, naming it.
        ImageTooLarge: more pixels than ``max_pixels`` (a ConfigError naming the file, its size and the limit).
    """
    from PIL import UnidentifiedImageError

    try:
        with open_image(str(path), str(path), max_pixels) as image:
            if decode:
                _decode(image, path)
    except UnidentifiedImageError:
        raise ConfigError(f"{path}: not an image (JPEG, PNG or another format Pillow reads)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e.strerror or e})") from None


def _decode(image, path: Path) -> None:
    """Decode the opened ``image`` (of ``path``) with Pillow; raise ConfigError naming the file if it cannot."""
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise ConfigError(f"{path}: not an image that can be read ({e})") from None
