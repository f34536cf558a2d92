"""Identical images (the same bytes twice) in a build: the digest of an image, a group of copies, and how the
quality report and the log name them. One definition for both build paths:

* the local builder (:mod:`spark_imagenet.dataset.sharding`): each shard worker computes :func:`digest` of
  every usable image's raw bytes as it reads them, the driver keeps them in one :class:`DigestTable` and
  compares them across every shard and both splits (:meth:`DigestTable.find`);
* the Spark job (:mod:`spark_imagenet.dataset.dataframe`): identical bytes sort next to each other in one
  shard, and each task groups them.

A copy in train of a validation image is the case that matters most: the model is trained on an image it is
then scored on, so validation accuracy is too high. The report puts those groups first (``split``
``"train+val"``) and the log warns about them. Duplicates never fail a build; they are listed.

The report's form (``quality-report.json``, beside the keys of :mod:`spark_imagenet.dataset.report`)::

    "duplicates": [{"split": "train+val" | "train" | "val", "count": n,
                    "files": [...], "classes": [...], "splits": [...]}, ...],
    "duplicate_totals": {"groups": g, "images": i, "train+val": l}

``files`` names at most :data:`MAX_FILES` of a group's ``count`` copies (train before val, then by name), with
each one's class and split; at most :data:`MAX_GROUPS` groups are listed (copies across splits first, then
train, then val); ``duplicate_totals`` counts every group found.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import xxhash

#: Bytes of an image's digest (XXH3-128): n different images give two equal ones with a chance of about
#: n^2 / 2^129 (1e-26 for ImageNet's 1.33 M).
DIGEST_SIZE = 16
#: The digest slot of an image that has none (unusable, so left out of the dataset, or not read).
NO_DIGEST = bytes(DIGEST_SIZE)
#: Copies a group names in the report (the count is always whole).
MAX_FILES = 10
#: Groups the report lists (the totals count every one).
MAX_GROUPS = 1000
#: Groups the log names.
LOGGED_GROUPS = 10

#: Order of the groups in the report and the log: copies across splits first.
_RANK = {"train+val": 0, "train": 1, "val": 2}


def digest(data: bytes) -> bytes:
    """The :data:`DIGEST_SIZE`-byte digest of an image's raw bytes, as read (before any repair): XXH3-128, a
    non-cryptographic hash (copies made on purpose to collide would be reported as identical, never removed);
    why this hash: docs/design.md, 'Duplicate images'."""
    return xxhash.xxh3_128_digest(data)


@dataclasses.dataclass(frozen=True)
class Duplicate:
    """One group of images with the same bytes.

    Attributes:
        split: ``"train"``, ``"val"``, or ``"train+val"``: copies in both (validation images also trained on).
        count: how many images hold these bytes (at least 2).
        files: the names of at most :data:`MAX_FILES` of them, train before val, then by name.
        classes: each listed file's class name.
        splits: each listed file's split.
        mixed: whether the copies (all of them, listed or not) have more than one class.
    """

    split: str
    count: int
    files: tuple[str, ...]
    classes: tuple[str, ...]
    splits: tuple[str, ...]
    mixed: bool

    @classmethod
    def of(cls, members: Iterable[tuple[str, str, str]]) -> Duplicate:
        """The group of ``members``, each ``(split, name, class)``."""
        ordered = sorted(members, key=lambda m: (m[0] != "train", m[1], m[2]))
        sides = {m[0] for m in ordered}
        listed = ordered[:MAX_FILES]
        return cls("train+val" if len(sides) > 1 else ordered[0][0], len(ordered), tuple(m[1] for m in listed),
                   tuple(m[2] for m in listed), tuple(m[0] for m in listed), len({m[2] for m in ordered}) > 1)

    def entry(self) -> dict[str, Any]:
        """The group as the quality report lists it."""
        return {"split": self.split, "count": self.count, "files": list(self.files), "classes": list(self.classes),
                "splits": list(self.splits)}

    def key(self) -> tuple[int, tuple[str, ...]]:
        """Where the group is listed: copies across splits first, then train, then val; then by file names."""
        return _RANK[self.split], self.files


@dataclasses.dataclass(frozen=True)
class Duplicates:
    """The identical images of a build.

    Attributes:
        groups: the groups listed (at most :data:`MAX_GROUPS`, in :meth:`Duplicate.key` order).
        found: groups found.
        images: images in those groups.
        across: groups with copies in both train and val.
    """

    groups: tuple[Duplicate, ...] = ()
    found: int = 0
    images: int = 0
    across: int = 0

    @classmethod
    def of(cls, groups: Iterable[Duplicate]) -> Duplicates:
        """Count ``groups`` and keep the first :data:`MAX_GROUPS` of them (holding no more than that at once)."""
        tally = [0, 0, 0]

        def counted() -> Iterator[Duplicate]:
            for g in groups:
                tally[0] += 1
                tally[1] += g.count
                tally[2] += g.split == "train+val"
                yield g

        kept = heapq.nsmallest(MAX_GROUPS, counted(), key=Duplicate.key)
        return cls(tuple(kept), *tally)

    def fields(self) -> dict[str, Any]:
        """The quality report's ``duplicates`` and ``duplicate_totals`` (see the module doc)."""
        return {"duplicates": [g.entry() for g in self.groups],
                "duplicate_totals": {"groups": self.found, "images": self.images, "train+val": self.across}}

    def log(self, log: logging.Logger) -> None:
        """Log what was found: the totals, a warning for copies across train and val, and the first
        :data:`LOGGED_GROUPS` groups (their first 4 files, their count, and whether their classes differ)."""
        if not self.found:
            log.info("identical images (the same bytes twice): none")
            return
        log.info(f"identical images (the same bytes twice): {self.found} group(s) of {self.images} images, all kept; "
                 "quality-report.json lists them under duplicates (to remove copies: docs/guide/data.md, "
                 "'Duplicate images')")
        if self.across:
            log.warning(f"{self.across} group(s) hold the same image in train and in val: those validation images are "
                        "also trained on, so validation scores are too high. Remove the copies from one split and "
                        "shard again")
        for g in self.groups[:LOGGED_GROUPS]:
            names = ", ".join(g.files[:4]) + (" ..." if g.count > 4 else "")
            log.info(f"  {g.split}: {g.count} copies: {names}" + (" (different classes!)" if g.mixed else ""))
        if self.found > LOGGED_GROUPS:
            log.info(f"  ... and {self.found - LOGGED_GROUPS} more group(s)")


class DigestTable:
    """The digests of every image of a local build, in one buffer: :data:`DIGEST_SIZE` (16) bytes per image
    (21 MB for ImageNet's 1.33 M images), plus the sort's index while :meth:`find` sorts them; nothing else per
    image is kept (docs/design.md, 'Duplicate images').

    Args:
        sizes: per shard name, its number of images (the shards' order is the positions :meth:`find` reports).
    """

    def __init__(self, sizes: dict[str, int]):
        self._offsets = np.cumsum([0, *sizes.values()])
        self._start = dict(zip(sizes, self._offsets[:-1].tolist()))
        self._buf = bytearray(DIGEST_SIZE * int(self._offsets[-1]))

    def put(self, shard: str, digests: bytes, first: int = 0) -> None:
        """Store the digests (each :data:`DIGEST_SIZE` bytes, :data:`NO_DIGEST` for none) of shard ``shard``'s
        images ``first, first + 1, ...``."""
        at = DIGEST_SIZE * (self._start[shard] + first)
        self._buf[at:at + len(digests)] = digests

    def find(self, member: Callable[[int, int], tuple[str, str, str]]) -> Duplicates:
        """The groups of images with equal digests, across every shard.

        Args:
            member: ``(shard position, image index in the shard)`` -> ``(split, name, class)`` of that image.

        Returns:
            Duplicates: the groups (images without a digest are never grouped).
        """
        return Duplicates.of(Duplicate.of(member(*self._place(i)) for i in run) for run in self._runs())

    def _runs(self) -> Iterator[Sequence[int]]:
        """The image numbers (in plan order) of each run of two or more equal digests."""
        keys = np.frombuffer(self._buf, dtype="<u8").reshape(-1, 2)
        if len(keys) < 2:
            return
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        ordered = keys[order]
        same = (ordered[1:] == ordered[:-1]).all(axis=1) & (ordered[1:] != 0).any(axis=1)
        edges = np.diff(np.concatenate(([0], same.astype(np.int8), [0])))
        for start, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            yield np.sort(order[start:end + 1]).tolist()

    def _place(self, i: int) -> tuple[int, int]:
        """Image number ``i`` as ``(shard position, index in the shard)``."""
        shard = int(np.searchsorted(self._offsets, i, side="right")) - 1
        return shard, i - int(self._offsets[shard])
