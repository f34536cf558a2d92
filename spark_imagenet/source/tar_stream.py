"""The Kaggle zip in its older form as an image source: the images of a nested tar.gz, read as a stream.

The older form holds the ``LOC_*`` files plus
``imagenet_object_localization_patched2019.tar.gz``, which holds ``ILSVRC/``.
A gzip stream can only be read from its start, in order, so this source has
no random access: :meth:`TarStreamSource.list_images` is pass 1 over the
stream (the plan needs every name and size first), :meth:`TarStreamSource.stream`
pass 2 (the chosen images in archive order). Members are read with
:mod:`tarfile` in stream mode over the zip member, never extracted to disk and
never held whole in memory (docs/design.md, 'The Kaggle archive').
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import tarfile
import zipfile
import zlib
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from spark_imagenet.errors import ArchiveError
from spark_imagenet.source.base import ImageFile, ImageSource, SourceDataset
from spark_imagenet.source.layout import DATA_REL, select_images
from spark_imagenet.source.zip_archive import (
    FORM_NESTED,
    KIND,
    TREE_RE,
    ArchiveTree,
    Index,
    link_text,
    links_refused,
    listing,
    open_zip,
    progress_bar,
    refuse_duplicates,
    refuse_zip_links,
)

logger = logging.getLogger(__name__)

#: Read size of the tar stream, in bytes (why 64 KiB: docs/design.md, 'The Kaggle archive').
STREAM_BUFSIZE = 64 * 1024


class _Counting(io.RawIOBase):
    """A read-only stream that reports how many bytes were read through it."""

    def __init__(self, raw: BinaryIO, report: Callable[[int], None]):
        self._raw = raw
        self._report = report

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._raw.read(len(b))
        b[: len(data)] = data
        self._report(len(data))
        return len(data)


@dataclasses.dataclass(eq=False)
class TarStreamSource(ImageSource):
    """The Kaggle zip in its older form (``nested-tar``).

    Attributes:
        path: the zip file (resolved, absolute).
        prefix: the zip folder holding the Kaggle root (``""`` or ``"top/"``).
        tar_member: the tar.gz member's name in the zip.
        tar_prefix: the folder of the tar holding ``ILSVRC/`` (``""``,
            ``"./"``, ...); found by :meth:`list_images`.
    """

    path: str
    prefix: str
    tar_member: str
    tar_prefix: str = ""
    _zf: zipfile.ZipFile | None = dataclasses.field(default=None, repr=False)
    random_access = False

    def where_source(self) -> str:
        """``<zip> member <tar.gz>``."""
        return f"{self.path} member {self.tar_member}"

    def where_member(self, member: str) -> str:
        """How messages name a member of the tar: ``<zip> member <tar.gz> member <name>``."""
        return f"{self.path} member {self.tar_member} member {member}"

    def where(self, image: ImageFile) -> str:
        return self.where_member(image.path)

    def relpath(self, image: ImageFile) -> str:
        return image.path[len(self.tar_prefix):]

    def describe(self) -> dict[str, Any]:
        """``{"kind": "kaggle-cls-loc-zip", "path": <zip>, "form": "nested-tar"}``,
        plus ``"prefix"`` (the top folder, when there is one) and ``"member"`` (the tar.gz)."""
        out: dict[str, Any] = {"kind": KIND, "path": self.path, "form": FORM_NESTED}
        if self.prefix:
            out["prefix"] = self.prefix
        out["member"] = self.tar_member
        return out

    def stream_error(self, e: BaseException) -> ArchiveError:
        """The error for a tar stream that cannot be read."""
        return ArchiveError(
            f"{self.path} member {self.tar_member} cannot be read ({type(e).__name__}: {e}); the archive is "
            "truncated or damaged: download it again"
        )

    def _open_tar(self, zf: zipfile.ZipFile, report: Callable[[int], None] | None) -> tarfile.TarFile:
        raw: BinaryIO = zf.open(self.tar_member)
        if report is not None:
            raw = io.BufferedReader(_Counting(raw, report), STREAM_BUFSIZE)
        return tarfile.open(fileobj=raw, mode="r|*", bufsize=STREAM_BUFSIZE)

    def members(self, *, progress: bool = False,
                desc: str = "read") -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
        """Every member of the nested tar, in archive order (one pass over the stream).

        Args:
            progress: show a tqdm bar of the tar.gz bytes read (stderr).
            desc: the bar's label.

        Yields:
            tuple[tarfile.TarInfo, tarfile.TarFile]: each member, and the tar
            it belongs to (``tar.extractfile(info)`` reads the member's bytes;
            only while it is the current member).

        Raises:
            ArchiveError: the zip or the tar stream is truncated or corrupt.
        """
        zf = open_zip(self.path)
        bar = None
        try:
            info = zf.getinfo(self.tar_member)
            bar = progress_bar(progress, info.file_size, desc)
            try:
                with self._open_tar(zf, bar.update if bar is not None else None) as tf:
                    while True:
                        ti = tf.next()
                        if ti is None:
                            return
                        tf.members.clear()  # stream mode would keep every TarInfo (1.4M for ImageNet)
                        yield ti, tf
            except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                raise self.stream_error(e) from None
        finally:
            if bar is not None:
                bar.close()
            zf.close()

    def list_images(self, *, num_classes: int | None = None, class_list: str | os.PathLike | None = None,
                    per_class: int | None = None, seed: int = 0, progress: bool = False) -> SourceDataset:
        """See :meth:`ImageSource.list_images`: pass 1 of 2 over the tar.gz.

        Raises:
            ArchiveError: also an image member given twice, any link member (of
                the zip or the tar), a second ``ILSVRC/`` tree in the tar, or a
                tar without ``train/`` or ``val/``.
        """
        zf, self._zf = self._zf, None
        with zf if zf is not None else open_zip(self.path) as zf:
            refuse_zip_links(zf, self.path)
            logger.info(f"listing {self.path} member {self.tar_member} (pass 1 of 2 over the compressed stream; "
                        "the images are read in pass 2)")
            index = self._index(progress)
            refuse_duplicates(self.path, index.duplicates)
            tree = ArchiveTree(self.path, self.prefix, zf, index, lambda rel: self.where_member(self.tar_prefix + rel))
            return select_images(tree, num_classes=num_classes, class_list=class_list, per_class=per_class,
                                 seed=seed, source=self)

    def _index(self, progress: bool) -> Index:
        """Pass 1: the tree under ``ILSVRC/Data/CLS-LOC/{train,val}`` of the tar; sets :attr:`tar_prefix`."""
        index = Index()
        links: list[str] = []
        tar_prefix = None
        for ti, _tf in self.members(progress=progress, desc="list"):
            if ti.issym() or ti.islnk():
                links.append(f"{ti.name}: {link_text('symbolic' if ti.issym() else 'hard', ti.linkname)}")
                continue
            m = TREE_RE.match(ti.name)
            if m is None or not (ti.isfile() or ti.isdir()):
                continue
            if tar_prefix is None:
                tar_prefix = m.group(1)
            elif m.group(1) != tar_prefix:
                raise ArchiveError(
                    f"{self.where_member(ti.name)}: a second ILSVRC/ tree in the tar (the first is under "
                    f"{tar_prefix or 'its top level'}); the archive is not the Kaggle download"
                )
            rel = ti.name[len(tar_prefix):]
            if ti.isdir():
                index.add_dir(rel)
            else:
                index.add_file(rel, ti.name, ti.size)
        if links:
            raise links_refused(self.where_source(), links)
        self.tar_prefix = tar_prefix or ""
        missing = [f"{DATA_REL}/{k}/" for k in ("train", "val") if k not in index.subfolders.get(DATA_REL, ())]
        if missing:
            raise ArchiveError(
                f"{self.where_source()} is not the ImageNet tar of the Kaggle archive; missing:{listing(missing)}"
            )
        return index

    def stream(self, images: Sequence[ImageFile]) -> Iterator[tuple[ImageFile, bytes]]:
        """Pass 2: read ``images`` from the tar as one stream, in archive order.

        Stops as soon as every image was read (so a subset of the classes does
        not read the rest of the archive).

        Yields:
            tuple[ImageFile, bytes]: each image of ``images`` and its bytes.

        Raises:
            ArchiveError: the stream is truncated or corrupt, or ends before
                every image was read (the archive changed since it was listed).
        """
        left = {img.path: img for img in images}
        if not left:
            return
        for ti, tf in self.members():
            if ti.isfile() and ti.name in left:
                try:
                    data = tf.extractfile(ti).read()
                except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                    raise self.stream_error(e) from None
                yield left.pop(ti.name), data
                if not left:
                    return
        raise ArchiveError(
            f"{self.path} member {self.tar_member}: {len(left)} member(s) listed in the first pass were not found "
            f"in the second (e.g. {sorted(left)[0]}); the archive changed while it was read. Run again."
        )
