"""Reading ImageNet in the Kaggle ILSVRC CLS-LOC layout.

The Kaggle competition ``imagenet-object-localization-challenge`` unpacks to::

    LOC_synset_mapping.txt          <wnid> <names>, one class per line (line index = class id)
    LOC_train_solution.csv          boxes of some train images (not needed for classification)
    LOC_val_solution.csv            ImageId,PredictionString: the label of a val image is the
                                    wnid of the first "<wnid> xmin ymin xmax ymax" group
    LOC_sample_submission.csv
    ILSVRC/Data/CLS-LOC/train/<wnid>/<wnid>_<n>.JPEG
    ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_%08d.JPEG       (flat)
    ILSVRC/Data/CLS-LOC/test/ILSVRC2012_test_%08d.JPEG     (flat, unlabeled; not used)

:func:`check_layout` checks a folder for these pieces and
:func:`select_images` lists the labelled images of the chosen classes from
any kind of source (:class:`SourceTree`). Inconsistencies are errors that
list every offending file (up to a limit), never skipped silently.
"""

from __future__ import annotations

import csv
import os
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from spark_imagenet.errors import ConfigError, LayoutError
from spark_imagenet.source.base import ImageFile, ImageSource, SourceDataset
from spark_imagenet.source.labelled import listing
from spark_imagenet.source.synset import SynsetClass, WNID_RE, read_class_list, select_classes

MAPPING = "LOC_synset_mapping.txt"
VAL_CSV = "LOC_val_solution.csv"
DATA_DIR = Path("ILSVRC", "Data", "CLS-LOC")
#: ``DATA_DIR`` as the ``/``-separated relative name archives use.
DATA_REL = DATA_DIR.as_posix()
#: How many offending files an error message lists before "... and N more".
MAX_LISTED = 20


def check_layout(root: str | os.PathLike) -> Path:
    """Check that ``root`` is a Kaggle CLS-LOC tree.

    Args:
        root: the source directory.

    Returns:
        Path: ``root`` as a resolved absolute path (symbolic links and
        ``..`` resolved), the path the manifest records.

    Raises:
        LayoutError: listing every missing piece (mapping file, val CSV,
            train and val folders).
    """
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise LayoutError(f"{root} is not a directory (expected ImageNet in the Kaggle CLS-LOC layout)")
    missing = [
        str(p) for p in (root / MAPPING, root / VAL_CSV) if not p.is_file()
    ] + [str(p) + "/" for p in (root / DATA_DIR / "train", root / DATA_DIR / "val") if not p.is_dir()]
    if missing:
        raise LayoutError(
            f"{root} is not in the Kaggle ILSVRC CLS-LOC layout; missing:{listing(missing, MAX_LISTED)}\n"
            "Expected LOC_synset_mapping.txt, LOC_val_solution.csv, ILSVRC/Data/CLS-LOC/train/<wnid>/ "
            "and ILSVRC/Data/CLS-LOC/val/ (the unpacked Kaggle imagenet-object-localization-challenge download)."
        )
    return root


def read_val_solution(path: str | os.PathLike, known_wnids: set[str]) -> dict[str, str]:
    """Read ``LOC_val_solution.csv``.

    Args:
        path: the CSV file.
        known_wnids: wnids of ``LOC_synset_mapping.txt``.

    Returns:
        dict[str, str]: ImageId (file name without ``.JPEG``) to the wnid of
        the row's first ``<wnid> xmin ymin xmax ymax`` group. Trailing spaces
        and several boxes per row are accepted.

    Raises:
        LayoutError: wrong header, an empty or malformed row, a repeated
            ImageId, or wnids not in the mapping; each problem names its line.
    """
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as f:
        return parse_val_solution(f, str(path), known_wnids)


def parse_val_solution(lines: Iterable[str], where: str, known_wnids: set[str]) -> dict[str, str]:
    """Parse ``LOC_val_solution.csv`` (see :func:`read_val_solution`).

    Args:
        lines: the file's lines, e.g. a text file opened with ``newline=""``.
        where: how messages name the file (a path, or a zip and its member).
        known_wnids: wnids of ``LOC_synset_mapping.txt``.

    Returns:
        dict[str, str]: ImageId to the wnid of the row's first box.

    Raises:
        LayoutError: as :func:`read_val_solution`, naming ``where`` and the line.
    """
    path = where
    labels: dict[str, str] = {}
    problems: list[str] = []
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or [h.strip() for h in header[:2]] != ["ImageId", "PredictionString"]:
        raise LayoutError(f"{path}:1: expected the header 'ImageId,PredictionString', got {header!r}")
    for row in reader:
        line = reader.line_num
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) < 2:
            problems.append(f"{path}:{line}: expected 'ImageId,PredictionString', got {','.join(row)!r}")
            continue
        image_id, tokens = row[0].strip(), row[1].split()
        if not tokens or not WNID_RE.match(tokens[0]):
            problems.append(f"{path}:{line}: {image_id}: PredictionString does not start with a wnid")
            continue
        wnid = tokens[0]
        if wnid not in known_wnids:
            problems.append(f"{path}:{line}: {image_id}: wnid {wnid} is not in {MAPPING}")
            continue
        if image_id in labels:
            problems.append(f"{path}:{line}: ImageId {image_id} appears twice")
            continue
        labels[image_id] = wnid
    if problems:
        raise LayoutError(f"{len(problems)} problem(s) in {path}:{listing(problems, MAX_LISTED)}")
    return labels


class SourceTree(Protocol):
    """What :func:`select_images` needs from a Kaggle-layout source: a
    folder (:mod:`spark_imagenet.source.folder`) or a zip (:mod:`spark_imagenet.source.zip_archive`,
    :mod:`spark_imagenet.source.tar_stream`).

    Relative names (``rel``) are ``/``-separated and relative to the Kaggle
    root, e.g. ``ILSVRC/Data/CLS-LOC/train/n01440764``; ``""`` is the root.
    """

    root: str

    def where(self, rel: str) -> str:
        """How messages name ``rel`` (a path, or a zip and its member)."""

    def read_mapping(self) -> tuple[SynsetClass, ...]:
        """All classes of ``LOC_synset_mapping.txt``."""

    def read_val_labels(self, known_wnids: set[str]) -> dict[str, str]:
        """``LOC_val_solution.csv`` parsed (see :func:`parse_val_solution`)."""

    def folders(self, rel: str) -> set[str]:
        """Names of the non-hidden sub-folders of folder ``rel``."""

    def files(self, rel: str) -> list[Any]:
        """The non-hidden files of folder ``rel`` sorted by name; each entry
        has a ``name`` attribute and is passed back to :meth:`image`."""

    def image(self, entry: Any, label: int, wnid: str) -> ImageFile:
        """The :class:`ImageFile` of an entry of :meth:`files`."""


def check_train_folders(where: Callable[[str], str], folders: set[str], known: set[str],
                        classes: Sequence[SynsetClass], counts: dict[str, int]) -> None:
    """Check the train class folders of a Kaggle-layout source.

    Args:
        where: how messages name a name relative to the Kaggle root (:meth:`SourceTree.where`).
        folders: the non-hidden folder names under ``ILSVRC/Data/CLS-LOC/train``.
        known: the wnids of ``LOC_synset_mapping.txt``.
        classes: the chosen classes.
        counts: images (non-hidden files) in each chosen class's folder, for the folders that exist.

    Raises:
        LayoutError: a folder not in the mapping, a chosen class with no folder or an empty one (every
            one listed).
    """
    train_rel = f"{DATA_REL}/train"
    problems = [f"{where(f'{train_rel}/{f}')}/: folder is not a class of {MAPPING}" for f in sorted(folders - known)]
    for c in classes:
        folder = where(f"{train_rel}/{c.wnid}")
        if c.wnid not in folders:
            problems.append(f"{folder}/: missing (class {c.id} {c.wnid} of {MAPPING})")
        elif not counts.get(c.wnid):
            problems.append(f"{folder}/: empty class folder (class {c.wnid}); add its images or leave the class out with --class-list")
    if problems:
        raise LayoutError(f"{len(problems)} problem(s) with the train folders of {where('')}:{listing(problems, MAX_LISTED)}")


def match_val(where: Callable[[str], str], files: Iterable[Any], val_labels: dict[str, str],
              classes: Sequence[SynsetClass]) -> list[tuple[Any, SynsetClass]]:
    """The validation files of the chosen classes, each with its class, checked against the CSV.

    Args:
        where: how messages name a name relative to the Kaggle root.
        files: the non-hidden files of ``ILSVRC/Data/CLS-LOC/val``, each with a ``name`` attribute.
        val_labels: ``LOC_val_solution.csv`` parsed (ImageId to wnid).
        classes: the chosen classes.

    Returns:
        list[tuple[Any, SynsetClass]]: the files of the chosen classes with their class, in ``files`` order.

    Raises:
        LayoutError: a file without a CSV row, a CSV row without its file (every one listed), or no file
            of a chosen class.
    """
    val_rel = f"{DATA_REL}/val"
    by_wnid = {c.wnid: c for c in classes}
    chosen: list[tuple[Any, SynsetClass]] = []
    problems: list[str] = []
    seen: set[str] = set()
    for e in files:
        image_id = os.path.splitext(e.name)[0]
        wnid = val_labels.get(image_id)
        if wnid is None:
            problems.append(f"{where(f'{val_rel}/{e.name}')}: no row for {image_id} in {where(VAL_CSV)}")
            continue
        seen.add(image_id)
        if wnid in by_wnid:
            chosen.append((e, by_wnid[wnid]))
    problems += [
        f"{where(VAL_CSV)}: row {image_id} has no image {where(f'{val_rel}/{image_id}.JPEG')}"
        for image_id in sorted(set(val_labels) - seen)
    ]
    if problems:
        raise LayoutError(f"{len(problems)} problem(s) with the validation set of {where('')}:{listing(problems, MAX_LISTED)}")
    if not chosen:
        raise LayoutError(f"{where(val_rel)}: no validation image belongs to the {len(classes)} chosen classes")
    return chosen


def select_images(
    tree: SourceTree,
    *,
    num_classes: int | None = None,
    class_list: str | os.PathLike | None = None,
    per_class: int | None = None,
    seed: int = 0,
    source: ImageSource,
) -> SourceDataset:
    """Check a Kaggle-layout source and choose its images (the same for every
    kind of source: :meth:`spark_imagenet.source.base.ImageSource.list_images`).

    Args:
        tree: the source, whose pieces :func:`check_layout` (or its zip
            counterpart) already found.
        num_classes: keep the first K classes (``--classes``).
        class_list: file of wnids to keep (``--class-list``).
        per_class: at most M train images per class (``--per-class``).
        seed: seed of the per-class sample.
        source: the source the images are read from (stored as
            :attr:`SourceDataset.source`).

    Returns:
        SourceDataset: the chosen classes and their images. Validation is
        restricted to the chosen classes.

    Raises:
        LayoutError: a chosen class with no folder or an empty folder; a
            train folder not in the mapping; a val image without a CSV row or
            a CSV row without its image; a CSV wnid not in the mapping. Every
            offending file is listed, named with ``tree.where``.
        ConfigError: a bad ``--classes``/``--class-list``/``--per-class``.
    """
    if per_class is not None and per_class < 1:
        raise ConfigError(f"--per-class {per_class}: must be at least 1", key="--per-class", value=per_class)
    all_classes = tree.read_mapping()
    wnids = read_class_list(class_list) if class_list is not None else None
    classes = select_classes(all_classes, num_classes, wnids)
    known = {c.wnid for c in all_classes}

    train_rel = f"{DATA_REL}/train"
    folders = tree.folders(train_rel)
    members = {c.wnid: tree.files(f"{train_rel}/{c.wnid}") for c in classes if c.wnid in folders}
    check_train_folders(tree.where, folders, known, classes, {wnid: len(m) for wnid, m in members.items()})
    train: list[ImageFile] = []
    for c in classes:
        entries = members[c.wnid]
        if per_class is not None and len(entries) > per_class:
            entries = sorted(random.Random(f"{seed}/{c.wnid}").sample(entries, per_class), key=lambda e: e.name)
        train += [tree.image(e, c.id, c.wnid) for e in entries]

    val_labels = tree.read_val_labels(known)
    val = [tree.image(e, c.id, c.wnid) for e, c in match_val(tree.where, tree.files(f"{DATA_REL}/val"),
                                                               val_labels, classes)]
    selection = {
        "classes": num_classes,
        "class_list": str(class_list) if class_list is not None else None,
        "per_class": per_class,
        "seed": seed,
    }
    return SourceDataset(source, classes, tuple(train), tuple(val), selection)
