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

:func:`read_layout` checks the layout and lists the labelled images of the
chosen classes. Inconsistencies are errors that list every offending file
(up to a limit), never skipped silently.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import random
from pathlib import Path
from typing import Sequence

from .errors import ConfigError, LayoutError
from .manifest import SynsetClass
from .synset import WNID_RE, read_class_list, read_synset_mapping, select_classes

MAPPING = "LOC_synset_mapping.txt"
VAL_CSV = "LOC_val_solution.csv"
DATA_DIR = Path("ILSVRC", "Data", "CLS-LOC")
#: How many offending files an error message lists before "... and N more".
MAX_LISTED = 20


@dataclasses.dataclass(frozen=True)
class ImageFile:
    """One labelled image of the source.

    Attributes:
        path: absolute path of the file.
        label: 0-based class id in the chosen class list.
        wnid: the class's WordNet id.
        size: file size in bytes.
    """

    path: str
    label: int
    wnid: str
    size: int

    @property
    def filename(self) -> str:
        """The file's base name, e.g. ``n01440764_18.JPEG``."""
        return os.path.basename(self.path)


@dataclasses.dataclass(frozen=True)
class SourceDataset:
    """The labelled images chosen from a Kaggle-layout source.

    Attributes:
        root: the source directory.
        classes: the chosen classes, ids 0..K-1.
        train: train images (grouped by class, sorted by file name).
        val: validation images of the chosen classes (sorted by file name).
        selection: the selection that was applied, for the manifest.
    """

    root: str
    classes: tuple[SynsetClass, ...]
    train: tuple[ImageFile, ...]
    val: tuple[ImageFile, ...]
    selection: dict


def _listing(problems: Sequence[str]) -> str:
    shown = "\n  ".join(problems[:MAX_LISTED])
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return f"\n  {shown}{more}"


def check_layout(root: str | os.PathLike) -> Path:
    """Check that ``root`` is a Kaggle CLS-LOC tree.

    Args:
        root: the source directory.

    Returns:
        Path: ``root`` as an absolute path.

    Raises:
        LayoutError: listing every missing piece (mapping file, val CSV,
            train and val folders).
    """
    root = Path(root).expanduser().absolute()
    if not root.is_dir():
        raise LayoutError(f"{root} is not a directory (expected ImageNet in the Kaggle CLS-LOC layout)")
    missing = [
        str(p) for p in (root / MAPPING, root / VAL_CSV) if not p.is_file()
    ] + [str(p) + "/" for p in (root / DATA_DIR / "train", root / DATA_DIR / "val") if not p.is_dir()]
    if missing:
        raise LayoutError(
            f"{root} is not in the Kaggle ILSVRC CLS-LOC layout; missing:{_listing(missing)}\n"
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
    labels: dict[str, str] = {}
    problems: list[str] = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
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
        raise LayoutError(f"{len(problems)} problem(s) in {path}:{_listing(problems)}")
    return labels


def _image_files(folder: Path) -> list[os.DirEntry]:
    """Regular, non-hidden files of ``folder``, sorted by name."""
    with os.scandir(folder) as it:
        entries = [e for e in it if not e.name.startswith(".") and e.is_file()]
    return sorted(entries, key=lambda e: e.name)


def read_layout(
    root: str | os.PathLike,
    *,
    num_classes: int | None = None,
    class_list: str | os.PathLike | None = None,
    per_class: int | None = None,
    seed: int = 0,
) -> SourceDataset:
    """List the labelled train and val images of a Kaggle-layout source.

    Args:
        root: the source directory (see the module doc).
        num_classes: keep the first K classes of the mapping (``--classes``).
        class_list: file of wnids to keep (``--class-list``).
        per_class: keep at most M train images per class (``--per-class``),
            a sample drawn with ``random.Random(f"{seed}/{wnid}")`` from the
            sorted file names, so the choice depends only on the seed.
        seed: seed of the per-class sample.

    Returns:
        SourceDataset: the chosen classes and their images. Validation is
        restricted to the chosen classes.

    Raises:
        LayoutError: missing pieces of the layout; a chosen class with no
            folder or an empty folder; a train folder not in the mapping; a
            val image without a CSV row or a CSV row without its image; a CSV
            wnid not in the mapping. Every offending path is listed.
        ConfigError: a bad ``--classes``/``--class-list``/``--per-class``.
    """
    root = check_layout(root)
    if per_class is not None and per_class < 1:
        raise ConfigError(f"--per-class {per_class}: must be at least 1")
    all_classes = read_synset_mapping(root / MAPPING)
    wnids = read_class_list(class_list) if class_list is not None else None
    classes = select_classes(all_classes, num_classes, wnids)
    known = {c.wnid for c in all_classes}

    train_dir = root / DATA_DIR / "train"
    problems: list[str] = []
    with os.scandir(train_dir) as it:
        folders = {e.name for e in it if e.is_dir() and not e.name.startswith(".")}
    problems += [f"{train_dir / f}/: folder is not a class of {MAPPING}" for f in sorted(folders - known)]
    train: list[ImageFile] = []
    for c in classes:
        folder = train_dir / c.wnid
        if c.wnid not in folders:
            problems.append(f"{folder}/: missing (class {c.id} {c.wnid} of {MAPPING})")
            continue
        entries = _image_files(folder)
        if not entries:
            problems.append(f"{folder}/: empty class folder (class {c.wnid}); add its images or leave the class out with --class-list")
            continue
        if per_class is not None and len(entries) > per_class:
            entries = sorted(random.Random(f"{seed}/{c.wnid}").sample(entries, per_class), key=lambda e: e.name)
        train += [ImageFile(os.path.abspath(e.path), c.id, c.wnid, e.stat().st_size) for e in entries]
    if problems:
        raise LayoutError(f"{len(problems)} problem(s) with the train folders of {root}:{_listing(problems)}")

    val_labels = read_val_solution(root / VAL_CSV, known)
    val_dir = root / DATA_DIR / "val"
    by_wnid = {c.wnid: c for c in classes}
    val: list[ImageFile] = []
    seen: set[str] = set()
    for e in _image_files(val_dir):
        image_id = os.path.splitext(e.name)[0]
        wnid = val_labels.get(image_id)
        if wnid is None:
            problems.append(f"{val_dir / e.name}: no row for {image_id} in {root / VAL_CSV}")
            continue
        seen.add(image_id)
        if wnid in by_wnid:
            val.append(ImageFile(os.path.abspath(e.path), by_wnid[wnid].id, wnid, e.stat().st_size))
    problems += [
        f"{root / VAL_CSV}: row {image_id} has no image {val_dir / (image_id + '.JPEG')}"
        for image_id in sorted(set(val_labels) - seen)
    ]
    if problems:
        raise LayoutError(f"{len(problems)} problem(s) with the validation set of {root}:{_listing(problems)}")
    if not val:
        raise LayoutError(f"{val_dir}: no validation image belongs to the {len(classes)} chosen classes")
    selection = {
        "classes": num_classes,
        "class_list": str(class_list) if class_list is not None else None,
        "per_class": per_class,
        "seed": seed,
    }
    return SourceDataset(str(root), classes, tuple(train), tuple(val), selection)
