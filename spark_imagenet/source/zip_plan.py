"""The Kaggle zip planned for a Spark job, in memory that does not grow with its images.

:meth:`ZipSource.list_images <spark_imagenet.source.zip_archive.ZipSource.list_images>` holds every member
(docs/design.md, 'Sharding a DataFrame as a Spark job'). For ``shard ZIP --master M`` the driver instead reads
the central directory as a stream (:mod:`spark_imagenet.source.zip_directory`) twice: once to find the zip's
form (:func:`~spark_imagenet.source.zip_archive.inspect_names`), once to count each class folder's images, check
the layout exactly as the local path does (the same messages) and cut the directory into slices of
:data:`ENTRIES_PER_SLICE` entries. What it keeps grows with the classes, the validation set (its CSV is read
whole anyway) and the slices, plus 8 bytes per member to find names given twice. Each Spark task then lists its
own slice again (:func:`chosen_in_slice`) and reads the chosen members at the locations the directory gives.

The images chosen are the local path's (same classes, class ids and validation rows); ``--per-class``
needs every member of a class at once and is not planned here (the caller lists the zip as without
``--master``).

Example::

    >>> import shutil
    >>> path = shutil.make_archive("imagenet-object-localization-challenge", "zip", "/data/kaggle")
    >>> plan = plan_kaggle_zip(path, num_classes=2)
    >>> chosen = [(name, label, split) for start, stop in plan.slices          # one Spark task each
    ...           for name, label, split, location in chosen_in_slice(plan.choice, start, stop)]
    >>> len(chosen)
    18
"""

from __future__ import annotations

import array
import collections
import dataclasses
import io
import os
from typing import Any, Iterator, NamedTuple

from spark_imagenet.errors import ArchiveError, ConfigError
from spark_imagenet.source.layout import DATA_REL, MAPPING, VAL_CSV, check_train_folders, match_val, parse_val_solution
from spark_imagenet.source.synset import SynsetClass, parse_synset_mapping, read_class_list, select_classes
from spark_imagenet.source.zip_archive import (FORM_NESTED, TREE_RE, inspect_names, link_target, link_text,
                                               links_refused, listing, open_zip, read_located)
from spark_imagenet.source.zip_directory import DirEntry, Directory, find_directory, iter_entries

#: Directory entries per slice (one Spark task lists and reads one slice).
ENTRIES_PER_SLICE = 10_000
_TRAIN = f"{DATA_REL}/train/"
_VAL = f"{DATA_REL}/val/"


@dataclasses.dataclass(frozen=True)
class ZipChoice:
    """What a task needs to pick the chosen images out of its slice (picklable; sent once per executor).

    Attributes:
        path: the zip file.
        prefix: the folder of the zip holding the Kaggle root (``""`` or ``"top/"``).
        shift: :attr:`~spark_imagenet.source.zip_directory.Directory.shift`.
        train_ids: the chosen classes, wnid to class id.
        val_ids: the validation files of the chosen classes, file name to class id.
    """

    path: str
    prefix: str
    shift: int
    train_ids: dict[str, int]
    val_ids: dict[str, int]


@dataclasses.dataclass(frozen=True)
class ZipPlan:
    """The chosen images of a Kaggle zip, known by their counts, and the slices that list them.

    Attributes:
        choice: what each task needs.
        classes: the chosen classes.
        counts: chosen images per split (``train``, ``val``).
        size: bytes of the chosen images (uncompressed).
        slices: ``(start, stop)`` byte ranges of the central directory, in order.
        selection: the manifest's selection record (as :func:`~spark_imagenet.source.layout.select_images`).
    """

    choice: ZipChoice
    classes: tuple[SynsetClass, ...]
    counts: dict[str, int]
    size: int
    slices: tuple[tuple[int, int], ...]
    selection: dict[str, Any]


class _ValFile(NamedTuple):
    name: str
    size: int


@dataclasses.dataclass
class _Census:
    """What one pass over the directory counts (see the module doc)."""

    folders: set[str] = dataclasses.field(default_factory=set)
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    sizes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    val: list[_ValFile] = dataclasses.field(default_factory=list)
    files: dict[str, DirEntry] = dataclasses.field(default_factory=dict)  # the LOC_* files
    links: list[DirEntry] = dataclasses.field(default_factory=list)
    hashes: array.array = dataclasses.field(default_factory=lambda: array.array("q"))
    slices: list[tuple[int, int]] = dataclasses.field(default_factory=list)


def open_directory(path: str) -> Directory:
    """The zip's central directory.

    Raises:
        ArchiveError: the zip is missing, truncated, damaged or not a zip (the message of
            :func:`~spark_imagenet.source.zip_archive.open_zip`).
    """
    try:
        return find_directory(path)
    except (ValueError, OSError) as e:
        open_zip(path).close()  # raises the message a user can act on
        raise ArchiveError(f"{path}: cannot read its central directory ({e}); download the archive again") from None


def plan_kaggle_zip(path: str | os.PathLike, *, num_classes: int | None = None, class_list: str | os.PathLike | None = None,
                    seed: int = 0, entries_per_slice: int = ENTRIES_PER_SLICE) -> ZipPlan:
    """Choose the images of a Kaggle zip (current form) without holding its members (see the module doc).

    Args:
        path: the zip.
        num_classes: keep the first K classes (``--classes``).
        class_list: file of wnids to keep (``--class-list``).
        seed: recorded in the selection (no sample is drawn).
        entries_per_slice: directory entries per slice.

    Returns:
        ZipPlan: the chosen images' classes, counts and slices.

    Raises:
        ArchiveError: not a Kaggle zip, damaged, link members, members given twice.
        ConfigError: the older form (its images are inside a nested tar.gz), a bad ``--classes``/``--class-list``.
        LayoutError: as :func:`~spark_imagenet.source.layout.select_images`.
    """
    path = os.path.realpath(os.path.expanduser(os.fspath(path)))
    directory = open_directory(path)
    kz = inspect_names((e.name for _, e in _entries(directory)), path)
    if kz.form == FORM_NESTED:
        raise ConfigError(f"{path} can only be read in order (the older Kaggle zip, whose images are a nested "
                          "tar.gz): shard it without --master, or unpack it first (unzip, then tar -xzf its tar.gz)")
    census = _count(directory, kz.prefix, entries_per_slice)
    _refuse_links(path, census.links)
    _refuse_duplicates(directory, kz.prefix, census.hashes)

    def where(rel: str) -> str:
        return path if not rel else f"{path} member {kz.prefix}{rel}"

    all_classes = parse_synset_mapping(_read_text(path, census, kz.prefix + MAPPING), where(MAPPING))
    wnids = read_class_list(class_list) if class_list is not None else None
    classes = select_classes(all_classes, num_classes, wnids)
    known = {c.wnid for c in all_classes}
    check_train_folders(where, census.folders, known, classes, census.counts)
    labels = parse_val_solution(io.StringIO(_read_text(path, census, kz.prefix + VAL_CSV), newline=""),
                                where(VAL_CSV), known)
    val = match_val(where, sorted(census.val), labels, classes)
    choice = ZipChoice(path, kz.prefix, directory.shift, {c.wnid: c.id for c in classes},
                       {f.name: c.id for f, c in val})
    counts = {"train": sum(census.counts[c.wnid] for c in classes), "val": len(val)}
    size = sum(census.sizes[c.wnid] for c in classes) + sum(f.size for f, _ in val)
    selection = {"classes": num_classes, "class_list": str(class_list) if class_list is not None else None,
                 "per_class": None, "seed": seed}
    return ZipPlan(choice, classes, counts, size, tuple(census.slices), selection)


def _entries(directory: Directory) -> Iterator[tuple[int, DirEntry]]:
    """The directory's entries from ``start`` to ``stop``, a damaged directory an :class:`ArchiveError`."""
    try:
        yield from iter_entries(directory.path, directory.start, directory.stop, directory.shift)
    except ValueError as e:
        raise ArchiveError(f"{directory.path}: its central directory is damaged ({e}); download the archive again") from None


def _count(directory: Directory, prefix: str, per_slice: int) -> _Census:
    """One pass over the directory: class folders and their images, the validation files, the ``LOC_*``
    files, link members, a hash of every image name, and the slice boundaries."""
    census, count, slice_start = _Census(), 0, directory.start
    for position, entry in _entries(directory):
        if count and count % per_slice == 0:
            census.slices.append((slice_start, position))
            slice_start = position
        count += 1
        if entry.is_link:
            census.links.append(entry)
        name = entry.name
        if not name.startswith(prefix):
            continue
        rel = name[len(prefix):]
        if rel in (MAPPING, VAL_CSV):
            census.files[name] = entry
        elif rel.startswith((_TRAIN, _VAL)) and TREE_RE.match(rel) is not None:
            _count_image(census, rel, entry)
    census.slices.append((slice_start, directory.stop))
    return census


def _count_image(census: _Census, rel: str, entry: DirEntry) -> None:
    """Count one entry under ``train/`` or ``val/`` as the local path's index would see it."""
    if not entry.is_dir:
        census.hashes.append(hash(rel))
    if rel.startswith(_TRAIN):
        parts = rel[len(_TRAIN):].rstrip("/").split("/")
        if (entry.is_dir or len(parts) > 1) and parts[0] and not parts[0].startswith("."):
            census.folders.add(parts[0])
    key = None if entry.is_dir else _image_key(rel)
    if key is None:
        return
    split, name = key
    if split == "train":
        census.counts[name] += 1
        census.sizes[name] += entry.file_size
    else:
        census.val.append(_ValFile(name, entry.file_size))


def _image_key(rel: str) -> tuple[str, str] | None:
    """Whether a file (its name relative to the Kaggle root) is an image the local path lists: ``("train",
    wnid)`` for a non-hidden file directly in a train class folder, ``("val", file name)`` for one directly
    in the val folder, else None. The driver counts and the tasks list by this one rule."""
    if rel.startswith(_TRAIN):
        parts = rel[len(_TRAIN):].split("/")
        if len(parts) == 2 and not parts[1].startswith("."):
            return "train", parts[0]
    elif rel.startswith(_VAL):
        rest = rel[len(_VAL):]
        if "/" not in rest and not rest.startswith("."):
            return "val", rest
    return None


def _read_text(path: str, census: _Census, name: str) -> str:
    """A ``LOC_*`` file's text (:func:`inspect_names` found it)."""
    try:
        return read_located(path, census.files[name].location()).decode("utf-8")
    except (ArchiveError, OSError, UnicodeDecodeError) as e:
        raise ArchiveError(f"{path} member {name} cannot be read ({e}); the zip is damaged: download it again") from None


def _refuse_links(path: str, links: list[DirEntry]) -> None:
    """ArchiveError listing every symbolic link member (the Kaggle archive has none)."""
    if links:
        texts = []
        for e in links:
            target = link_target(e.file_size, lambda e=e: read_located(path, e.location()))
            texts.append(f"{e.name}: {link_text('symbolic', target)}")
        raise links_refused(path, texts)


def _refuse_duplicates(directory: Directory, prefix: str, hashes: array.array) -> None:
    """ArchiveError listing the image members given twice (a second pass names them, only when the
    hashes say there are some)."""
    import numpy as np

    ordered = np.sort(np.frombuffer(hashes, dtype=np.int64))
    twice = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not twice:
        return
    seen: set[str] = set()
    duplicates = []
    for _, entry in _entries(directory):
        rel = entry.name[len(prefix):]
        if entry.name.startswith(prefix) and not entry.is_dir and hash(rel) in twice:
            if rel in seen:
                duplicates.append(entry.name)
            seen.add(rel)
    if duplicates:
        raise ArchiveError(f"{directory.path} holds {len(duplicates)} image member(s) twice (which copy is meant?):"
                           f"{listing(duplicates)}\nDownload the archive again.")


def chosen_in_slice(choice: ZipChoice, start: int, stop: int) -> Iterator[tuple[str, int, str, tuple]]:
    """The chosen images of one slice of the directory (on an executor).

    Args:
        choice: the plan's choice.
        start: the slice's first entry (a :attr:`ZipPlan.slices` pair).
        stop: the end of the slice.

    Yields:
        tuple[str, int, str, tuple]: the image's name relative to the Kaggle root, its class id, its
        split (``train`` or ``val``) and its location (for
        :func:`~spark_imagenet.source.zip_archive.read_located`).

    Raises:
        ArchiveError: the directory is damaged.
    """
    for _, entry in _entries(Directory(choice.path, start, stop, 0, choice.shift)):
        if entry.is_dir or not entry.name.startswith(choice.prefix):
            continue
        rel = entry.name[len(choice.prefix):]
        key = _image_key(rel)
        if key is None:
            continue
        split, name = key
        label = (choice.train_ids if split == "train" else choice.val_ids).get(name)
        if label is not None:
            yield rel, label, split, entry.location()
