"""What is reported about a dataset: the quality report of its build
(``quality-report.json``) and the manifest summary ``spark-imagenet inspect`` prints.

The quality report (format ``spark-imagenet-quality-report``, version 1)::

    {"format": "spark-imagenet-quality-report", "format_version": 1,
     "dataset_id": ..., "verify": "decode" | "header", "on_corrupt": "error" | "skip",
     "splits": {"train": {"files", "examples", "repaired", "skipped", "categories": {<category>: n}}, "val": ...},
     "files": [{"split", "file", "category", "action": "repaired" | "skipped", "reason"}, ...],
     "duplicates": [{"split", "count", "files", "classes", "splits"}, ...],
     "duplicate_totals": {"groups", "images", "train+val"}}

``files`` found = ``examples`` written + ``skipped`` in every split
(docs/design.md, 'Image quality while sharding'). ``duplicates``: groups of
identical images, all kept (:mod:`spark_imagenet.dataset.duplicates`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from spark_imagenet.dataset.duplicates import Duplicates
from spark_imagenet.dataset.manifest import Manifest
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME, shard_name
from spark_imagenet.dataset.quality import CATEGORIES, Finding
from spark_imagenet.source.base import ImageFile, SourceDataset
from spark_imagenet.storage import Storage, open_storage
from spark_imagenet.storage.envelope import Envelope

__all__ = ["QUALITY_REPORT", "QUALITY_REPORT_NAME", "Quality", "format_quality", "format_summary", "inspect", "note",
           "quality_report", "quality_totals", "write_quality_report"]

#: The quality report's versioned-JSON form.
QUALITY_REPORT = Envelope("spark-imagenet-quality-report", 1, "spark-imagenet quality report",
                          remedy="build the shards again to write a new one")

#: The quality tally of one shard's images: the count per category, and per repaired or skipped
#: image ``(index in the shard, category, reason, action)`` with action ``"repaired"`` or ``"skipped"``.
Quality = tuple[dict[str, int], list[tuple[int, str, str, str]]]


def note(quality: Quality, k: int, finding: Finding, stored: bytes | None) -> None:
    """Add image ``k`` of a shard to its tally.

    Args:
        quality: the shard's tally (changed in place).
        k: the image's index in the shard.
        finding: what :func:`spark_imagenet.dataset.quality.classify` found.
        stored: the bytes stored for it, ``None`` when it was left out.
    """
    counts, files = quality
    counts[finding.category] = counts.get(finding.category, 0) + 1
    if stored is None:
        files.append((k, finding.category, finding.reason or "", "skipped"))
    elif finding.needs_repair:
        files.append((k, finding.category, finding.reason or "", "repaired"))


def quality_report(src: SourceDataset, plan: dict[str, Sequence[tuple[ImageFile, ...]]],
                   quality: dict[str, Quality], dataset_id: str, verify: str, on_corrupt: str,
                   duplicates: Duplicates) -> dict[str, Any]:
    """The content of ``quality-report.json``.

    Args:
        src: the source the images were listed from (names files relative to the Kaggle root).
        plan: per split, the images of each shard (see
            :func:`spark_imagenet.dataset.sharding.plan_shards`).
        quality: per shard object name, its tally (shards without one count nothing).
        dataset_id: the dataset id (names the shards).
        verify: ``"decode"`` or ``"header"``.
        on_corrupt: ``"error"`` or ``"skip"``.
        duplicates: the identical images found.

    Returns:
        dict: ``dataset_id``, ``verify``, ``on_corrupt``; per split
        (``splits``) the files found, examples written, files repaired and
        skipped, and the count per category (:data:`spark_imagenet.dataset.quality.CATEGORIES`);
        ``files``: every repaired or skipped file (``split``, ``file``
        relative to the Kaggle root, ``category``, ``action``, ``reason``),
        sorted by split and file; ``duplicates`` and ``duplicate_totals``
        (:meth:`spark_imagenet.dataset.duplicates.Duplicates.fields`).
    """
    splits: dict[str, dict[str, Any]] = {}
    files: list[dict[str, str]] = []
    for split, shards in plan.items():
        found = sum(len(images) for images in shards)
        counts = dict.fromkeys(CATEGORIES, 0)
        repaired = skipped = 0
        for k, images in enumerate(shards):
            name = shard_name(split, k, len(shards), dataset_id)
            if name not in quality:
                continue
            tally, listed = quality[name]
            for category, n in tally.items():
                counts[category] += n
            for i, category, reason, action in listed:
                files.append({"split": split, "file": src.relpath(images[i]), "category": category,
                              "action": action, "reason": reason})
                repaired += action == "repaired"
                skipped += action == "skipped"
        splits[split] = {"files": found, "examples": found - skipped, "repaired": repaired, "skipped": skipped,
                         "categories": counts}
    files.sort(key=lambda f: (f["split"] != "train", f["file"]))
    return QUALITY_REPORT.to_json({
        "dataset_id": dataset_id,
        "verify": verify,
        "on_corrupt": on_corrupt,
        "splits": splits,
        "files": files,
        **duplicates.fields(),
    })


def quality_totals(report: dict[str, Any]) -> dict[str, Any]:
    """What the manifest's ``selection["quality"]`` holds: the report's name, and per split the
    files found, examples written, repaired and skipped (``files = examples + skipped``)."""
    return {
        "report": QUALITY_REPORT_NAME,
        **{split: {key: s[key] for key in ("files", "examples", "repaired", "skipped")}
           for split, s in report["splits"].items()},
    }


def write_quality_report(storage: Storage, report: dict[str, Any]) -> None:
    """Write ``report`` as :data:`QUALITY_REPORT_NAME` (indented JSON) to ``storage``.

    Raises:
        StorageError: it cannot be written.
    """
    storage.write_bytes(QUALITY_REPORT_NAME, (json.dumps(report, indent=1) + "\n").encode("utf-8"))


def format_quality(report: dict[str, Any]) -> list[str]:
    """The short summary of a quality report the CLI prints: one line per
    category that occurred (train and val counts), and the totals."""
    lines = ["image quality (train / val):"]
    splits = report["splits"]
    for category in CATEGORIES:
        counts = [splits[s]["categories"].get(category, 0) for s in ("train", "val") if s in splits]
        if any(counts):
            lines.append(f"  {category:<13} " + " / ".join(str(c) for c in counts))
    total = {key: sum(s[key] for s in splits.values()) for key in ("files", "examples", "repaired", "skipped")}
    lines.append(f"  {total['files']} files found = {total['examples']} examples written + {total['skipped']} "
                 f"skipped; {total['repaired']} repaired (see {QUALITY_REPORT_NAME})")
    return lines


def format_summary(manifest: Manifest, url: str = "") -> str:
    """A human-readable summary of a manifest (what ``spark-imagenet inspect`` prints).

    Args:
        manifest: the manifest.
        url: the bucket URL to show in the first line.

    Returns:
        str: several lines: dataset id, how the images are stored (``original``, ``resize 256 q90``), classes
        (first few wnids), and per
        split the shard count, examples, bytes and min/max examples per shard.
    """
    lines = [
        f"dataset {url}".rstrip(),
        f"  id        {manifest.dataset_id}",
        f"  created   {manifest.created}",
        f"  images    {manifest.image_form.label}",
        f"  classes   {manifest.num_classes} (label base 0): "
        + ", ".join(f"{c.id}={c.wnid}" for c in manifest.classes[:5])
        + (" ..." if manifest.num_classes > 5 else ""),
    ]
    for name, split in manifest.splits.items():
        counts = [s.examples for s in split.shards]
        lines.append(
            f"  {name:<9} {len(split.shards)} shards, {split.examples} examples, {split.bytes / 1e6:.1f} MB "
            f"({min(counts)}-{max(counts)} examples per shard)"
        )
    total_ex = sum(s.examples for s in manifest.splits.values())
    total_b = sum(s.bytes for s in manifest.splits.values())
    lines.append(f"  total     {total_ex} examples, {total_b / 1e6:.1f} MB")
    return "\n".join(lines)


def inspect(url: str | os.PathLike) -> Manifest:
    """Load the manifest of a sharded dataset.

    Args:
        url: bucket URL.

    Returns:
        Manifest: the parsed manifest.

    Raises:
        ManifestError: no manifest at ``url``, or an invalid one.
        StorageError: the URL cannot be opened.
    """
    return Manifest.load(open_storage(url))
