"""The unpacked Kaggle folder as an image source (random access: one file per image)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

from spark_imagenet.source.base import ImageFile, ImageReader, ImageSource, SourceDataset
from spark_imagenet.source.layout import (
    DATA_DIR, MAPPING, VAL_CSV, check_layout, read_val_solution, select_images)
from spark_imagenet.source.synset import SynsetClass, read_synset_mapping

#: The manifest's ``source.kind`` of a folder.
KIND = "kaggle-cls-loc-dir"


def is_kaggle_folder(root: str | os.PathLike) -> bool:
    """Whether folder ``root`` holds any piece of the Kaggle layout (``LOC_synset_mapping.txt``,
    ``LOC_val_solution.csv`` or ``ILSVRC/``): then it is read, and
    checked, as the Kaggle download, never as a class-folder tree."""
    root = Path(root).expanduser()
    return any((root / piece).exists() for piece in (MAPPING, VAL_CSV, DATA_DIR.parts[0]))


class _DirTree:
    """:class:`spark_imagenet.source.layout.SourceTree` over a folder that
    :func:`~spark_imagenet.source.layout.check_layout` checked."""

    def __init__(self, root: Path):
        self.root = str(root)
        self._root = root

    def where(self, rel: str) -> str:
        return str(self._root / rel)

    def read_mapping(self) -> tuple[SynsetClass, ...]:
        return read_synset_mapping(self._root / MAPPING)

    def read_val_labels(self, known_wnids: set[str]) -> dict[str, str]:
        return read_val_solution(self._root / VAL_CSV, known_wnids)

    def folders(self, rel: str) -> set[str]:
        with os.scandir(self._root / rel) as it:
            return {e.name for e in it if e.is_dir() and not e.name.startswith(".")}

    def files(self, rel: str) -> list[os.DirEntry]:
        with os.scandir(self._root / rel) as it:
            entries = [e for e in it if not e.name.startswith(".") and e.is_file()]
        return sorted(entries, key=lambda e: e.name)

    def image(self, entry: os.DirEntry, label: int, wnid: str) -> ImageFile:
        return ImageFile(os.path.abspath(entry.path), label, wnid, entry.stat().st_size)


@dataclasses.dataclass(frozen=True)
class FileReader(ImageReader):
    """Reads image files by their path (:attr:`ImageFile.path`)."""

    def read(self, image: ImageFile) -> bytes:
        with open(image.path, "rb") as f:
            return f.read()

    def where(self, image: ImageFile) -> str:
        return image.path


@dataclasses.dataclass(frozen=True)
class FolderSource(ImageSource):
    """A folder in the Kaggle layout (see :mod:`spark_imagenet.source.layout`).

    Attributes:
        path: the folder, resolved and absolute.
    """

    path: str
    random_access = True

    @classmethod
    def open(cls, root: str | os.PathLike) -> "FolderSource":
        """Check that ``root`` is in the Kaggle layout.

        Raises:
            LayoutError: what is missing (see :func:`~spark_imagenet.source.layout.check_layout`).
        """
        return cls(str(check_layout(root)))

    def list_images(self, *, num_classes: int | None = None, class_list: str | os.PathLike | None = None,
                    per_class: int | None = None, seed: int = 0, progress: bool = False) -> SourceDataset:
        return select_images(_DirTree(Path(self.path)), num_classes=num_classes, class_list=class_list,
                             per_class=per_class, seed=seed, source=self)

    def relpath(self, image: ImageFile) -> str:
        return Path(os.path.relpath(image.path, self.path)).as_posix()

    def where(self, image: ImageFile) -> str:
        return image.path

    def describe(self) -> dict[str, Any]:
        """``{"kind": "kaggle-cls-loc-dir", "path": <folder>}``."""
        return {"kind": KIND, "path": self.path}

    def reader(self, images: Sequence[ImageFile]) -> FileReader:
        return FileReader()
