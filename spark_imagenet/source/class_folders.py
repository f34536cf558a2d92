"""A class-per-folder tree of one's own images as an image source (random access: one file per image).

Two layouts, the one Keras' ``image_dataset_from_directory`` and torchvision's ``ImageFolder`` read::

    root/<class>/*.jpg                      the validation images drawn with a seeded --val-fraction
    root/train/<class>/*.jpg + root/val/<class>/*.jpg     (``validation/`` too) the tree's own split

The class ids are the sorted class-folder names (their order in both libraries). As in Keras, images are
the files ending in :data:`~spark_imagenet.source.labelled.IMAGE_EXTENSIONS` (any case) anywhere under a
class folder (sub-folders included); other files and hidden ones are left out. A ``root/train/<class>/``
without ``val/`` is the tree, with a ``--val-fraction`` split.

:func:`find_class_tree` decides whether a folder is such a tree (a class folder holding images directly
is what marks one); :func:`spark_imagenet.source.open_source` asks it after the Kaggle layout and the
zip, which keep their priority.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Sequence

from spark_imagenet.errors import ConfigError, LayoutError
from spark_imagenet.source.base import ImageFile, ImageSource, SourceDataset
from spark_imagenet.source.folder import FileReader
from spark_imagenet.source.labelled import (
    Entry, Selection, check_val_fraction, is_image_name, labelled_dataset, listing, name_classes)

logger = logging.getLogger(__name__)

#: The manifest's ``source.kind`` of a class-folder tree.
KIND = "class-folders"
#: Names of the validation folder beside ``train/``.
VAL_NAMES = ("val", "validation")


def _subfolders(folder: Path) -> list[str]:
    """The sorted names of the non-hidden sub-folders of ``folder`` (links to folders included)."""
    with os.scandir(folder) as it:
        return sorted(e.name for e in it if not e.name.startswith(".") and e.is_dir())


def _loose_images(folder: Path) -> list[str]:
    """The sorted names of the image files directly in ``folder``."""
    with os.scandir(folder) as it:
        return sorted(e.name for e in it if not e.name.startswith(".") and e.is_file() and is_image_name(e.name))


def _holds_class_folders(folder: Path) -> bool:
    """Whether some sub-folder of ``folder`` holds an image file directly (what marks a class-folder tree)."""
    return any(_loose_images(folder / name) for name in _subfolders(folder))


@dataclasses.dataclass(frozen=True)
class ClassTree:
    """Where the class folders of a tree are.

    Attributes:
        train: the folder of the (training) class folders.
        val: the folder of the validation class folders, or ``None`` (split by ``--val-fraction``).
    """

    train: Path
    val: Path | None = None


def find_class_tree(root: str | os.PathLike) -> ClassTree | None:
    """Find the class folders of a tree (see the module doc).

    Args:
        root: a folder.

    Returns:
        ClassTree | None: where its class folders are; ``None`` when no class folder holds an image
        directly (not a class-folder tree: the caller says what it expected).
    """
    root = Path(root)
    names = _subfolders(root)
    if "train" in names and not _loose_images(root / "train") and _holds_class_folders(root / "train"):
        val = next((root / v for v in VAL_NAMES if v in names and not _loose_images(root / v)), None)
        return ClassTree(root / "train", val)
    if _holds_class_folders(root):
        return ClassTree(root)
    return None


def not_a_class_tree(root: str | os.PathLike) -> str:
    """Why ``root`` is not a class-folder tree, and how one looks (for the error of a folder that is
    neither that nor the Kaggle layout)."""
    root = Path(root)
    loose = _loose_images(root) if root.is_dir() else []
    why = (f"its {len(loose)} image(s) ({', '.join(loose[:3])}{', ...' if len(loose) > 3 else ''}) lie loose at "
           "the top: move them into one sub-folder per class" if loose else "no sub-folder holds images")
    return (f"Nor is it a class-folder tree ({why}): for your own images give a folder of class folders, "
            "root/<class>/*.jpg (or root/train/<class>/ and root/val/<class>/), or a labels file with --labels.")


def _class_files(folder: Path) -> tuple[list[tuple[str, int]], int]:
    """The image files anywhere under ``folder`` (hidden files and folders left out) as
    ``(absolute path, size)`` sorted by path, and how many other files were left out."""
    found: list[tuple[str, int]] = []
    other = 0
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            if not is_image_name(name):
                other += 1
                continue
            path = os.path.join(top, name)
            found.append((path, os.stat(path).st_size))
    return sorted(found), other


def _list_split(root: Path, folder: Path, split: str | None, problems: list[str]) -> tuple[list[Entry], int]:
    """The images of one folder of class folders (``split`` given to each, ``None``: to split), the
    problems found added to ``problems``; and how many non-image files were left out."""
    loose = _loose_images(folder)
    if loose:
        problems.append(f"{folder}/: {len(loose)} image(s) in no class folder ({', '.join(loose[:3])}"
                        f"{', ...' if len(loose) > 3 else ''}); move them into their class folder or remove them")
    entries: list[Entry] = []
    other = 0
    for name in _subfolders(folder):
        files, skipped = _class_files(folder / name)
        other += skipped
        if not files:
            problems.append(f"{folder / name}/: class folder with no images (.jpg, .jpeg, .png, .bmp or .gif "
                            "files); add its images or remove the folder")
        entries += [Entry(path, Path(os.path.relpath(path, root)).as_posix(), name, size, split)
                    for path, size in files]
    return entries, other


@dataclasses.dataclass(frozen=True)
class ClassFolderSource(ImageSource):
    """A class-per-folder tree (see the module doc).

    Attributes:
        path: the tree's root, resolved and absolute.
        tree: where its class folders are.
        val_fraction: the share of each class drawn for validation when the tree has no ``val/``
            (``None``: :data:`~spark_imagenet.source.labelled.DEFAULT_VAL_FRACTION`).
    """

    path: str
    tree: ClassTree
    val_fraction: float | None = None
    random_access = True

    @classmethod
    def open(cls, root: str | os.PathLike, *, val_fraction: float | None = None) -> "ClassFolderSource":
        """Open a class-folder tree.

        Args:
            root: the tree's root.
            val_fraction: ``--val-fraction``, for a tree without ``val/``.

        Raises:
            LayoutError: ``root`` is not a folder, or not a class-folder tree (why).
            ConfigError: ``val_fraction`` out of range, or given for a tree with its own ``val/``.
        """
        check_val_fraction(val_fraction)
        path = Path(root).expanduser().resolve()
        if not path.is_dir():
            raise LayoutError(f"{path} is not a directory (expected a folder of class folders)")
        tree = find_class_tree(path)
        if tree is None:
            raise LayoutError(f"{path} is not a class-folder tree. " + not_a_class_tree(path))
        if tree.val is not None and val_fraction is not None:
            raise ConfigError(f"--val-fraction {val_fraction}: {tree.val} holds this tree's validation images; "
                              "leave --val-fraction out (or move val/ away to draw them from train/)",
                              key="--val-fraction", value=val_fraction)
        return cls(str(path), tree, val_fraction)

    def list_images(self, *, num_classes: int | None = None, class_list: str | os.PathLike | None = None,
                    per_class: int | None = None, seed: int = 0, progress: bool = False) -> SourceDataset:
        """List the tree's images (see :meth:`ImageSource.list_images`); ``--class-list`` is refused.

        Raises:
            LayoutError: a class folder without images, images outside the class folders, or
                ``train/`` and ``val/`` with different class folders (every one listed).
            ConfigError: a bad ``--classes``/``--per-class``, or ``--class-list``.
        """
        root = Path(self.path)
        problems: list[str] = []
        entries, other = _list_split(root, self.tree.train, None if self.tree.val is None else "train", problems)
        classes = name_classes(e.cls for e in entries)
        if self.tree.val is not None:
            val, skipped = _list_split(root, self.tree.val, "val", problems)
            other += skipped
            problems += _class_set_problems(self.tree, _subfolders(self.tree.train), _subfolders(self.tree.val))
            entries += val
        if problems:
            raise LayoutError(f"{len(problems)} problem(s) with the class folders of {root}:{listing(problems)}")
        if other:
            logger.info(f"{root}: left out {other} file(s) whose names do not end in .jpg, .jpeg, .png, .bmp or .gif")
        sel = Selection(num_classes, class_list, per_class, seed, self.val_fraction)
        return labelled_dataset(self, entries, classes, sel, str(root))

    def relpath(self, image: ImageFile) -> str:
        return Path(os.path.relpath(image.path, self.path)).as_posix()

    def where(self, image: ImageFile) -> str:
        return image.path

    def describe(self) -> dict[str, Any]:
        """``{"kind": "class-folders", "path": <root>, "layout": "train-val" | "one-folder"}``."""
        return {"kind": KIND, "path": self.path, "layout": "one-folder" if self.tree.val is None else "train-val"}

    def reader(self, images: Sequence[ImageFile]) -> FileReader:
        return FileReader()


def _class_set_problems(tree: ClassTree, train: list[str], val: list[str]) -> list[str]:
    """The class folders only one of ``train/`` and ``val/`` has, one line each."""
    return ([f"{tree.train / name}/: class {name!r} has no folder in {tree.val}/ (train/ and val/ need the same "
             "class folders)" for name in sorted(set(train) - set(val))]
            + [f"{tree.val / name}/: class {name!r} has no folder in {tree.train}/ (train/ and val/ need the "
               "same class folders)" for name in sorted(set(val) - set(train))])
