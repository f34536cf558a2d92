"""Where the images come from: the Kaggle ImageNet download.

* :mod:`.kaggle`: download the archive with the official ``kaggle`` client.
* :mod:`.synset`: WordNet synsets (classes), ``LOC_synset_mapping.txt``, class selection.
* :mod:`.layout`: the Kaggle ILSVRC CLS-LOC layout, its CSV files and the image selection.
* :mod:`.base`: :class:`~.base.ImageSource`, the one interface the shard builder reads every kind of source through.
* :mod:`.folder`, :mod:`.zip_archive`, :mod:`.tar_stream`: the three kinds (the unpacked folder; the zip in its
  current form; the zip in its older form, whose images are a nested tar.gz read as a stream).
* :mod:`.extract`: unpack the zip (either form) safely (``extract``).

:func:`open_source` picks the kind of a path.

Layer: above :mod:`spark_imagenet.storage`, below :mod:`spark_imagenet.dataset`.
"""

from __future__ import annotations

import os

from spark_imagenet.source.base import ImageSource


def open_source(path: str | os.PathLike) -> ImageSource:
    """Open a Kaggle source, whichever kind it is.

    Args:
        path: the unpacked Kaggle folder, or the downloaded zip in either form.

    Returns:
        ImageSource: a :class:`~spark_imagenet.source.folder.FolderSource`,
        :class:`~spark_imagenet.source.zip_archive.ZipSource` or
        :class:`~spark_imagenet.source.tar_stream.TarStreamSource`, with its
        path resolved.

    Raises:
        LayoutError: a folder that is not in the Kaggle layout (what is missing).
        ArchiveError: a zip that is missing, truncated, damaged or not the
            Kaggle archive.
    """
    from spark_imagenet.source.zip_archive import is_zip_source, open_zip_source

    if is_zip_source(path):
        return open_zip_source(path)
    from spark_imagenet.source.folder import FolderSource

    return FolderSource.open(path)
