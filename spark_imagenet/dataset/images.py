"""The image files a user names on the command line (``spark-imagenet predict IMAGE...``), checked cheaply.

:func:`image_files` expands folders and checks that every file exists, can be read, starts like an
image Pillow knows and has no more pixels than the limit (its header only; the pixels are decoded later;
:mod:`spark_imagenet.dataset.pixels`). The command line runs it before it
starts the TensorFlow child (seconds of start-up), and ``predict`` runs it again in that child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, open_image
from spark_imagenet.errors import ConfigError
from spark_imagenet.source.labelled import IMAGE_EXTENSIONS, is_image_name



def image_files(paths: Sequence[str], max_pixels: int = DEFAULT_MAX_PIXELS) -> list[Path]:
    """The image files that ``paths`` name: files as given, folders as their image files (sorted, not recursive).

    Args:
        paths: files and folders, as the user typed them.
        max_pixels: the most pixels (width x height) an image may have.

    Returns:
        list[pathlib.Path]: the files, each checked with :func:`check_image`.

    Raises:
        ConfigError: a path that does not exist, a folder without image files, or a file that cannot be
            read, is not an image, or has more pixels than ``max_pixels`` (``ImageTooLarge``; each names the
            path).
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
    for path in found:
        check_image(path, max_pixels)
    return found


def check_image(path: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
    """Check that ``path`` can be read, that its header is one of an image format Pillow reads, and that the
    image has at most ``max_pixels`` pixels.

    Only the header is read (``PIL.Image.open`` is lazy): a file damaged further in is found when it is
    decoded.

    Raises:
        ConfigError: the file cannot be opened (permissions) or is not an image, naming it.
        ImageTooLarge: more pixels than ``max_pixels`` (a ConfigError naming the file, its size and the limit).
    """
    from PIL import UnidentifiedImageError

    try:
        with open_image(str(path), str(path), max_pixels) as image:
            image.format  # noqa: B018 - the header was parsed to get here
    except UnidentifiedImageError:
        raise ConfigError(f"{path}: not an image (JPEG, PNG or another format Pillow reads)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e.strerror or e})") from None
