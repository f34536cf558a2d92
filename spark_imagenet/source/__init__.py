"""Where the images come from: the Kaggle ImageNet download, or one's own images.

* :mod:`.kaggle`: download the archive with the official ``kaggle`` client.
* :mod:`.synset`: WordNet synsets (classes), ``LOC_synset_mapping.txt``, class selection.
* :mod:`.layout`: the Kaggle ILSVRC CLS-LOC layout, its CSV files and the image selection.
* :mod:`.base`: :class:`~.base.ImageSource`, the one interface the shard builder reads every kind of source through.
* :mod:`.folder`, :mod:`.zip_archive`, :mod:`.tar_stream`: the three kinds (the unpacked folder; the zip in its
  current form; the zip in its older form, whose images are a nested tar.gz read as a stream).
* :mod:`.class_folders`: a class-per-folder tree (``root/<class>/*.jpg``); :mod:`.labels_file`: a CSV,
  JSONL or Parquet table of image paths (or URLs) and labels; :mod:`.labelled`: what the two share
  (class ids from names, the seeded ``--val-fraction`` split).

:func:`open_source` picks the kind of a path (:func:`open_labels` opens a labels file).

Layer: above :mod:`spark_imagenet.storage`, below :mod:`spark_imagenet.dataset`.
"""

from __future__ import annotations

import os

from spark_imagenet.errors import ConfigError, LayoutError
from spark_imagenet.source.base import ImageSource


def open_source(path: str | os.PathLike, *, val_fraction: float | None = None) -> ImageSource:
    """Open a source of images, whichever kind it is.

    The Kaggle kinds come first: a zip, or a folder holding any piece of the Kaggle layout
    (``LOC_synset_mapping.txt``, ``LOC_val_solution.csv``, ``ILSVRC/``), is read as the Kaggle
    download. Any other folder that has a class folder
    holding images is a class-folder tree.

    Args:
        path: the unpacked Kaggle folder, the downloaded zip in either form, or a class-folder tree.
        val_fraction: ``--val-fraction``, the share of each class drawn for validation from a
            class-folder tree without ``val/`` (``None``: 0.1 there); the Kaggle kinds refuse it.

    Returns:
        ImageSource: a :class:`~spark_imagenet.source.folder.FolderSource`,
        :class:`~spark_imagenet.source.zip_archive.ZipSource`,
        :class:`~spark_imagenet.source.tar_stream.TarStreamSource` or
        :class:`~spark_imagenet.source.class_folders.ClassFolderSource`, with its path resolved.

    Raises:
        LayoutError: a folder that is neither in the Kaggle layout (what is missing) nor a
            class-folder tree (why not).
        ArchiveError: a zip that is missing, truncated, damaged or not the
            Kaggle archive.
        ConfigError: ``val_fraction`` given for a source with its own validation images, or out of range.
    """
    from spark_imagenet.source.class_folders import ClassFolderSource, find_class_tree, not_a_class_tree
    from spark_imagenet.source.folder import FolderSource, is_kaggle_folder
    from spark_imagenet.source.zip_archive import is_zip_source

    if is_zip_source(path):
        _no_val_fraction(path, val_fraction)  # before the zip is opened
        return open_zip_source(path)
    folder = os.path.expanduser(path)
    if not os.path.isdir(folder):
        try:
            FolderSource.open(path)
        except LayoutError as e:
            raise LayoutError(f"{e}, or a folder of class folders (root/<class>/*.jpg); a labels file is "
                              "given with --labels FILE") from None
    if not is_kaggle_folder(folder):
        if find_class_tree(folder) is not None:
            return ClassFolderSource.open(path, val_fraction=val_fraction)
        try:
            FolderSource.open(path)
        except LayoutError as e:
            raise LayoutError(f"{e}\n{not_a_class_tree(folder)}") from None
    source = FolderSource.open(path)
    _no_val_fraction(path, val_fraction)
    return source


def _no_val_fraction(path: str | os.PathLike, val_fraction: float | None) -> None:
    """Refuse ``--val-fraction`` for the Kaggle download (:class:`ConfigError`)."""
    if val_fraction is not None:
        raise ConfigError(f"--val-fraction {val_fraction}: {path} is the Kaggle ImageNet download, whose "
                          "validation set is its own (LOC_val_solution.csv); leave --val-fraction out",
                          key="--val-fraction", value=val_fraction)


def open_labels(path: str | os.PathLike, *, path_column: str | None = None, label_column: str = "label",
                split_column: str | None = None, val_fraction: float | None = None) -> ImageSource:
    """Open a labels file: see :class:`spark_imagenet.source.labels_file.LabelsFileSource.open`."""
    from spark_imagenet.source.labels_file import LabelsFileSource

    return LabelsFileSource.open(path, path_column=path_column, label_column=label_column,
                                 split_column=split_column, val_fraction=val_fraction)


def open_zip_source(path: str | os.PathLike) -> ImageSource:
    """Open the Kaggle zip in whichever form it is.

    Args:
        path: the downloaded ``imagenet-object-localization-challenge.zip``.

    Returns:
        ImageSource: a :class:`~spark_imagenet.source.zip_archive.ZipSource`
        (current form) or a :class:`~spark_imagenet.source.tar_stream.TarStreamSource`
        (older form), its ``path`` resolved.

    Raises:
        ArchiveError: the zip is missing, truncated, damaged, or not a Kaggle
            archive (what is missing is listed).
    """
    from pathlib import Path

    from spark_imagenet.source.tar_stream import TarStreamSource
    from spark_imagenet.source.zip_archive import FORM_NESTED, ZipSource, inspect_zip, open_zip

    path = os.path.realpath(Path(path).expanduser())
    zf = open_zip(path)
    try:
        kz = inspect_zip(zf, path)
    except BaseException:
        zf.close()
        raise
    if kz.form == FORM_NESTED:
        return TarStreamSource(path, kz.prefix, kz.tar_member, _zf=zf)
    return ZipSource(path, kz.prefix, _zf=zf)
