"""The interface every kind of Kaggle source offers the shard builder.

Three kinds, one module each, all behind :class:`ImageSource`:

* :class:`spark_imagenet.source.folder.FolderSource`: the unpacked folder
  (random access: one file per image);
* :class:`spark_imagenet.source.zip_archive.ZipSource`: the downloaded zip in
  its current form (random access: one member per image);
* :class:`spark_imagenet.source.tar_stream.TarStreamSource`: the zip in its
  older form, whose images sit in a nested tar.gz (a stream, read in order).

:func:`spark_imagenet.source.open_source` picks the kind for a path. A source
lists its images (:meth:`ImageSource.list_images`, the same checks, selection
and order for every kind), names them (:meth:`~ImageSource.relpath`,
:meth:`~ImageSource.where`), and gives their bytes: one image at a time in
any process through a picklable :class:`ImageReader`
(:meth:`~ImageSource.reader`, random-access kinds), or all of them in the
source's own order (:meth:`~ImageSource.stream`, every kind).
"""

from __future__ import annotations

import abc
import dataclasses
import os
from typing import Any, Iterator, Sequence

from spark_imagenet.source.synset import SynsetClass


@dataclasses.dataclass(frozen=True)
class ImageFile:
    """One labelled image of the source.

    Attributes:
        path: for a folder, the file's absolute path; for a zip, the member's
            name inside its archive (the zip's, or the nested tar's).
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


class ImageReader(abc.ABC):
    """Reads single images of a random-access source; picklable, so a worker
    process can read its shard's images itself."""

    @abc.abstractmethod
    def read(self, image: ImageFile) -> bytes:
        """The image file's bytes.

        Raises:
            OSError: the file cannot be read.
            ArchiveError: a zip member is damaged (checked against its CRC-32).
        """

    @abc.abstractmethod
    def where(self, image: ImageFile) -> str:
        """How messages name the image's file (a path, or the zip and member)."""


class ImageSource(abc.ABC):
    """A Kaggle-layout source of images (see the module doc).

    Attributes:
        path: the folder or the zip file, as a resolved absolute path.
        random_access: True when :meth:`reader` can read any single image
            (folder, current zip form); False when the images can only be
            read in order with :meth:`stream` (the nested tar.gz).
    """

    path: str
    random_access: bool = True

    @abc.abstractmethod
    def list_images(
        self,
        *,
        num_classes: int | None = None,
        class_list: str | os.PathLike | None = None,
        per_class: int | None = None,
        seed: int = 0,
        progress: bool = False,
    ) -> SourceDataset:
        """Check the layout and choose the labelled images
        (see :func:`spark_imagenet.source.layout.select_images`).

        Args:
            num_classes: keep the first K classes of the mapping (``--classes``).
            class_list: file of wnids to keep (``--class-list``).
            per_class: at most M train images per class (``--per-class``), a
                sample drawn with ``random.Random(f"{seed}/{wnid}")``.
            seed: seed of the per-class sample.
            progress: show a tqdm bar on stderr where listing reads a stream.

        Returns:
            SourceDataset: the chosen classes and images, the same for every
            kind of source holding the same tree.

        Raises:
            LayoutError: the tree is inconsistent (every problem listed).
            ArchiveError: a zip that is damaged or not the Kaggle archive.
            ConfigError: a bad ``--classes``/``--class-list``/``--per-class``.
        """

    @abc.abstractmethod
    def relpath(self, image: ImageFile) -> str:
        """The image's ``/``-separated name relative to the Kaggle root
        (``ILSVRC/Data/CLS-LOC/train/<wnid>/<file>``), the same for every kind
        (so the dataset id is too)."""

    @abc.abstractmethod
    def where(self, image: ImageFile) -> str:
        """How messages name the image's file: its path, or the zip and member."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """The manifest's ``source`` entry: ``{"kind": ..., "path": ...}`` and
        what else identifies the source."""

    def reader(self, images: Sequence[ImageFile]) -> ImageReader:
        """A picklable reader of ``images`` (random-access kinds only).

        Raises:
            TypeError: the source can only be read as a stream.
        """
        raise TypeError(f"{self.where_source()} can only be read in order, with stream()")

    def stream(self, images: Sequence[ImageFile]) -> Iterator[tuple[ImageFile, bytes]]:
        """Read ``images`` in the order that suits the source (the given order
        for random-access kinds, archive order for a stream).

        Yields:
            tuple[ImageFile, bytes]: each image of ``images`` once, and its bytes.

        Raises:
            OSError, ArchiveError: an image cannot be read.
        """
        reader = self.reader(images)
        for image in images:
            yield image, reader.read(image)

    def where_source(self) -> str:
        """How messages name the whole source (its path)."""
        return self.path


@dataclasses.dataclass(frozen=True)
class SourceDataset:
    """The labelled images chosen from a source (:meth:`ImageSource.list_images`).

    Attributes:
        source: the source the images are read from.
        classes: the chosen classes, ids 0..K-1.
        train: train images (grouped by class, sorted by file name).
        val: validation images of the chosen classes (sorted by file name).
        selection: the selection that was applied, for the manifest.
    """

    source: ImageSource
    classes: tuple[SynsetClass, ...]
    train: tuple[ImageFile, ...]
    val: tuple[ImageFile, ...]
    selection: dict

    @property
    def root(self) -> str:
        """The source folder or zip file (resolved, absolute)."""
        return self.source.path

    def relpath(self, image: ImageFile) -> str:
        """See :meth:`ImageSource.relpath`."""
        return self.source.relpath(image)

    def where(self, image: ImageFile) -> str:
        """See :meth:`ImageSource.where`."""
        return self.source.where(image)
