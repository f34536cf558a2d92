"""``shard`` from the unpacked folder versus the Kaggle zip in its two forms.

Usage (from the repository root)::

    .venv/bin/python benchmarks/shard_sources.py [--classes 10] [--train-per-class 40] [--val-per-class 5]
        [--width 256] [--height 192] [--processes N] [--rounds 3] [--tree KAGGLE_FOLDER]

Generates one synthetic tree in the Kaggle layout (``tests/data_util.py``,
the generated JPEGs of :mod:`spark_imagenet.demo.synthetic`), or takes ``--tree``
(e.g. the real JPEGs of ``../shared/data/ilsvrc-mini``), builds the two zip
forms from it (``tests/archive_util.py``: the current one with deflated
members, the older one with ``LOC_*`` plus the nested tar.gz), then for
``--rounds`` rounds shards each of the three sources into a new folder and
prints, per source, the images per second of the whole ``shard()`` call
(listing included: for the nested form that is pass 1 over the tar.gz) and
of the build step alone (what ``shard`` logs as "wrote N images ... images/s":
checking, writing and, for the nested form, pass 2 and putting records in
plan order). It also checks that all three give the same dataset id.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--train-per-class", type=int, default=40)
    ap.add_argument("--val-per-class", type=int, default=5)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--height", type=int, default=192)
    ap.add_argument("--processes", type=int, default=None, help="shard worker processes (default: all cores)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", type=Path, help="an existing Kaggle-layout folder instead of a generated one")
    args = ap.parse_args()

    from archive_util import zip_nested_form, zip_root_form
    from data_util import small_layout
    from spark_imagenet.dataset.sharding import shard

    with tempfile.TemporaryDirectory(prefix="shard-sources-") as tmp:
        base = Path(tmp)
        if args.tree is not None:
            tree = args.tree.absolute()
        else:
            tree = small_layout(base / "kaggle", num_classes=args.classes, train_per_class=args.train_per_class,
                                val_per_class=args.val_per_class, size=(args.width, args.height))
        sources = {
            "folder": tree,
            "zip (root form)": zip_root_form(tree, base / "root.zip"),
            "zip (nested tar.gz)": zip_nested_form(tree, base / "nested.zip"),
        }
        data = tree / "ILSVRC" / "Data" / "CLS-LOC"
        jpegs = [p for split in ("train", "val") for p in (data / split).rglob("*") if p.is_file()]
        images, mb = len(jpegs), sum(p.stat().st_size for p in jpegs) / 1e6
        print(f"{images} images ({mb:.1f} MB of JPEG), {args.rounds} round(s)")
        total: dict[str, list[float]] = {k: [] for k in sources}
        build: dict[str, list[float]] = {k: [] for k in sources}
        ids = set()
        for r in range(args.rounds):
            for name, src in sources.items():
                logs: list[str] = []
                t = time.perf_counter()
                m = shard(src, base / f"out-{r}-{list(sources).index(name)}", train_shards=8, val_shards=2,
                          processes=args.processes, progress=False, log=logs.append)
                seconds = time.perf_counter() - t
                ids.add(m.dataset_id)
                total[name].append(images / seconds)
                rate = [re.search(r"\(([\d.]+) images/s\)", line) for line in logs]
                build[name].append(float(next(x for x in rate if x).group(1)))
                print(f"round {r}: {name:<20} {images / seconds:7.0f} images/s whole call, "
                      f"{build[name][-1]:7.0f} images/s build step")
        print("medians:")
        for name in sources:
            print(f"  {name:<20} {statistics.median(total[name]):7.0f} images/s whole call, "
                  f"{statistics.median(build[name]):7.0f} images/s build step")
        print("same dataset id from all three:", len(ids) == 1)


if __name__ == "__main__":
    main()
