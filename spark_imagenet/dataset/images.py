"""The image files a user names on the command line (``spark-imagenet predict IMAGE...``), checked cheaply.

:func:`image_files` expands folders and checks that every file exists, can be read and starts like an
image Pillow knows (its header only; the pixels are decoded later). The command line runs it before it
starts the TensorFlow child (seconds of start-up), and ``predict`` runs it again in that child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from spark_imagenet.errors import ConfigError
from spark_imagenet.source.labelled import IMAGE_EXTENSIONS, is_image_name



def image_files(paths: Sequence[str]) -> list[Path]:
    """The image files that ``paths`` name: files as given, folders as their image files (sorted, not recursive).

    Args:
        paths: files and folders, as the user typed them.

    Returns:
        list[pathlib.Path]: the files, each checked with :func:`check_image`.

    Raises:
        ConfigError: a path that does not exist, a folder without image files, or a file that cannot be
            read or is not an image (each names the path).
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
        check_image(path)
    return found


def check_image(path: Path) -> None:
    """Check that ``path`` can be read and that its header is one of an image format Pillow reads.

    Only the header is read (``PIL.Image.open`` is lazy): a file damaged further in is found when it is
    decoded.

    Raises:
        ConfigError: the file cannot be opened (permissions) or is not an image, naming it.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.format  # noqa: B018 - the header was parsed to get here
    except UnidentifiedImageError:
        raise ConfigError(f"{path}: not an image (JPEG, PNG or another format Pillow reads)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e.strerror or e})") from None
