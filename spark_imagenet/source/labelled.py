"""What the sources of one's own images share: class ids from names, the train/val split, the selection.

Two kinds of source list labelled images without a Kaggle class list:
:mod:`spark_imagenet.source.class_folders` (``root/<class>/*.jpg``) and
:mod:`spark_imagenet.source.labels_file` (a CSV, JSONL or Parquet table of
paths and labels). Each lists :class:`Entry` values (a file, its class name,
its split where the source says it) and :func:`labelled_dataset` turns them
into the :class:`~spark_imagenet.source.base.SourceDataset` the shard builder
takes, the same way for both:

* class ids are the sorted class names (Python's string order), the order of
  Keras' ``image_dataset_from_directory`` and torchvision's ``ImageFolder``;
  integer labels of a labels file are kept as they are (:func:`integer_classes`);
* images the source gives no split are split per class with a seeded
  ``--val-fraction`` (:func:`split_by_fraction`);
* ``--classes K`` keeps the first K classes, ``--per-class M`` samples at most
  M train images per class (``random.Random(f"{seed}/{class}")``, as for the
  Kaggle layout).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from typing import Iterable, Sequence

from spark_imagenet.errors import ConfigError, LayoutError
from spark_imagenet.source.base import ImageFile, ImageSource, SourceDataset
from spark_imagenet.source.synset import SynsetClass

#: The file name endings of images (lower case): those Keras' ``image_dataset_from_directory`` accepts.
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
#: The ``--val-fraction`` used when the source has no validation images of its own.
DEFAULT_VAL_FRACTION = 0.1
#: How many offending files or rows an error message lists before "... and N more".
MAX_LISTED = 10


def is_image_name(name: str) -> bool:
    """Whether a file name ends like an image (:data:`IMAGE_EXTENSIONS`, any case)."""
    return name.lower().endswith(IMAGE_EXTENSIONS)


def listing(problems: Sequence[str], limit: int = MAX_LISTED) -> str:
    """``problems`` as indented lines (at most ``limit``, then "... and N more")."""
    shown = "".join(f"\n  {p}" for p in problems[:limit])
    return shown + (f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else "")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One image a source listed, before class ids are given.

    Attributes:
        path: what :attr:`ImageFile.path` holds (a local absolute path, or a URL).
        rel: the ``/``-separated name relative to the source (what the dataset id and the
            quality report use, and what the seeded split hashes).
        cls: the class name.
        size: the file size in bytes.
        split: ``"train"`` or ``"val"`` where the source says; ``None`` to split by fraction.
    """

    path: str
    rel: str
    cls: str
    size: int
    split: str | None = None


def check_val_fraction(val_fraction: float | None) -> None:
    """Check a ``--val-fraction`` value.

    Raises:
        ConfigError: it is not strictly between 0 and 1.
    """
    if val_fraction is not None and not 0 < val_fraction < 1:
        raise ConfigError(f"--val-fraction {val_fraction}: must be between 0 and 1 (e.g. 0.1 for 10% of each "
                          "class's images)", key="--val-fraction", value=val_fraction)


def split_by_fraction(entries: Sequence[Entry], fraction: float, seed: int) -> list[Entry]:
    """Give every entry without a split one, stratified per class.

    In each class, the files are ordered by the SHA-256 of ``f"{seed}/{rel}"`` (so the order depends on
    the file names and the seed only, not on the listing order or the machine) and the first
    ``round(fraction * n)`` go to ``val``, at least one and at most ``n - 1`` when the class has two or
    more; a class of one image keeps it in ``train``.

    Args:
        entries: the listed images; those with a split keep it.
        fraction: the share of each class that goes to ``val`` (0 < fraction < 1).
        seed: the seed of the order (``--seed``).

    Returns:
        list[Entry]: every entry, each with its split.
    """
    by_class: dict[str, list[Entry]] = {}
    done: list[Entry] = []
    for e in entries:
        if e.split is None:
            by_class.setdefault(e.cls, []).append(e)
        else:
            done.append(e)
    for members in by_class.values():
        n = len(members)
        count = 0 if n < 2 else min(n - 1, max(1, round(fraction * n)))
        ordered = sorted(members, key=lambda e: (hashlib.sha256(f"{seed}/{e.rel}".encode()).digest(), e.rel))
        done += [dataclasses.replace(e, split="val" if k < count else "train") for k, e in enumerate(ordered)]
    return done


def name_classes(names: Iterable[str]) -> tuple[SynsetClass, ...]:
    """Classes numbered in sorted-name order (Keras' and torchvision's order); each class's ``wnid`` field
    and only name are the class name (docs/design.md, 'Your own images')."""
    return tuple(SynsetClass(i, name, (name,)) for i, name in enumerate(sorted(set(names))))


def integer_classes(labels: Iterable[int], where: str) -> tuple[SynsetClass, ...]:
    """Classes of integer labels, kept as given: ids 0..K-1, each class's ``wnid`` field its id as text.

    Args:
        labels: the labels found.
        where: how messages name the label column (the file and column).

    Raises:
        LayoutError: the labels are not exactly 0..K-1 (the missing ids or the negative ones listed).
    """
    found = set(labels)
    if min(found) < 0:
        raise LayoutError(f"{where}: negative labels {sorted(x for x in found if x < 0)[:MAX_LISTED]}; integer "
                          "labels must be the class ids 0..K-1 (or use class names instead)")
    missing = sorted(set(range(max(found) + 1)) - found)
    if missing:
        shown = ", ".join(map(str, missing[:MAX_LISTED])) + (" ..." if len(missing) > MAX_LISTED else "")
        raise LayoutError(f"{where}: integer labels must be the class ids 0..K-1 with every id used; "
                          f"{len(missing)} id(s) below the largest ({max(found)}) have no image: {shown}. "
                          "Renumber the labels, or use class names (strings) and let them be numbered in "
                          "sorted order")
    return tuple(SynsetClass(i, str(i), ()) for i in range(max(found) + 1))


@dataclasses.dataclass(frozen=True)
class Selection:
    """The selection options of a source of one's own images (see :func:`labelled_dataset`)."""

    num_classes: int | None = None
    class_list: str | os.PathLike | None = None
    per_class: int | None = None
    seed: int = 0
    val_fraction: float | None = None


def _choose(classes: tuple[SynsetClass, ...], sel: Selection) -> tuple[SynsetClass, ...]:
    """The first ``--classes`` classes (all by default), renumbered from 0.

    Raises:
        ConfigError: ``--class-list`` given (it names Kaggle wnids), or K out of range.
    """
    if sel.class_list is not None:
        raise ConfigError("--class-list names WordNet ids of the Kaggle layout; for a class-folder tree or a "
                          "labels file, choose the classes with --classes K (the first K in sorted order) or "
                          "leave the others out of the source", key="--class-list", value=sel.class_list)
    if sel.per_class is not None and sel.per_class < 1:
        raise ConfigError(f"--per-class {sel.per_class}: must be at least 1", key="--per-class", value=sel.per_class)
    if sel.num_classes is None:
        return classes
    if not 1 <= sel.num_classes <= len(classes):
        raise ConfigError(f"--classes {sel.num_classes}: must be between 1 and {len(classes)} (the classes found)",
                          key="--classes", value=sel.num_classes)
    return classes[:sel.num_classes]


def labelled_dataset(source: ImageSource, entries: Sequence[Entry], classes: tuple[SynsetClass, ...],
                     sel: Selection, where: str) -> SourceDataset:
    """The chosen classes and their train and val images.

    Args:
        source: the source the images are read from.
        entries: every listed image (split or not; see :func:`split_by_fraction`).
        classes: every class, ids 0..K-1 (their ``wnid`` field is the name entries carry in ``cls``).
        sel: the selection; ``sel.val_fraction`` (default :data:`DEFAULT_VAL_FRACTION`) splits the
            entries without a split.
        where: how messages name the source.

    Returns:
        SourceDataset: train images grouped by class id and sorted by name, val images sorted by name.

    Raises:
        ConfigError: a bad ``--classes``/``--per-class``, or ``--class-list``.
        LayoutError: no validation image among the chosen classes.
    """
    chosen = _choose(classes, sel)
    ids = {c.wnid: c.id for c in chosen}
    kept = [e for e in entries if e.cls in ids]
    fraction = DEFAULT_VAL_FRACTION if sel.val_fraction is None else sel.val_fraction
    kept = split_by_fraction(kept, fraction, sel.seed)
    by_class: dict[str, list[Entry]] = {}
    for e in kept:
        if e.split == "train":
            by_class.setdefault(e.cls, []).append(e)
    train: list[Entry] = []
    for c in chosen:
        members = sorted(by_class.get(c.wnid, ()), key=lambda e: e.rel)
        if sel.per_class is not None and len(members) > sel.per_class:
            members = sorted(random.Random(f"{sel.seed}/{c.wnid}").sample(members, sel.per_class),
                             key=lambda e: e.rel)
        train += members
    val = sorted((e for e in kept if e.split == "val"), key=lambda e: e.rel)
    if not val:
        raise LayoutError(f"{where}: no validation image among the {len(chosen)} chosen classes; give "
                          "validation images (a val/ folder, a split column) or a larger --val-fraction")
    if not train:
        raise LayoutError(f"{where}: no training image among the {len(chosen)} chosen classes")
    selection = {"classes": sel.num_classes, "class_list": None, "per_class": sel.per_class, "seed": sel.seed,
                 "val_fraction": fraction if any(e.split is None for e in entries) else None}
    return SourceDataset(source, chosen, tuple(_image(e, ids) for e in train), tuple(_image(e, ids) for e in val),
                         selection)


def _image(e: Entry, ids: dict[str, int]) -> ImageFile:
    return ImageFile(e.path, ids[e.cls], e.cls, e.size)
