"""Sharding at ImageNet's entry count: a Kaggle-form zip of 1,331,167 tiny JPEGs (ImageNet-1k's train and val
entries), sharded by the local path (``shard ZIP``, this machine's processes) and as a Spark job
(``shard ZIP --master local[2]``); images/s and the driver's peak memory of each; a projection for
ImageNet-21k on 16 and 64 executor cores.

Usage (from the repository root; a full run takes about half an hour on 2 cores and 3 GB of disk)::

    .venv/bin/python benchmarks/scale.py [--quick] [--reps 1] [--json [FILE]] [--entries N] [--classes K]
        [--master 'local[2]'] [--keep DIR]

The zip is written once per run (``ZIP_STORED``, as the Kaggle download stores its JPEGs): ``--classes`` 1000
synthetic wnids, one ``val`` image per 26.6 entries (50,000 of 1,331,167, as ImageNet), every image a 16x16
colour JPEG of about 640 bytes made unique by a comment segment holding its number (identical bytes would be
reported as duplicates; grey ones would each be listed in the quality report as greyscale, a cost per image that
real photos, nearly all colour, do not have). Tiny images put the per-entry costs in front: listing, the driver's bookkeeping,
scheduling, the shard writer's framing; decoding real photos costs per byte (benchmarks/shard.py measures it).

Measured, each call in a fresh ``python`` process running ``spark_imagenet.cli.main`` (``--train-shards``
and ``--val-shards`` fixed, so both paths write the same number of shards):

* **local path**: ``shard ZIP --out DIR`` with all cores: wall seconds, images/s, and the peak resident memory
  (``VmHWM`` of ``/proc/self/status``) of the main process, which holds the listing of every entry.
* **Spark job**: ``shard ZIP --master M --out DIR``: the same, for the driver's Python process (the JVM of a
  ``local`` master, which is also the executor there, is not counted: on a cluster it is elsewhere).

Derived: Spark / local images/s; and hours to shard ImageNet-21k (14,197,122 images, ASSUMED 1.31 TB) on 16
and 64 executor cores, as the sum of a per-entry part (this run's Spark core-seconds per image, ASSUMING
the cores scale linearly) and a per-byte part (the committed zip rate of benchmarks/shard.py, ASSUMED
40.5 MB per core-second), and the I/O bound of reading and writing 1.31 TB at an ASSUMED 10 Gbit/s.

``--quick``: 80 entries of 2 classes (the fewest the script takes) in 2 train and 1 val shards; it checks the
script, and its numbers are process and JVM start-up, not rates.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from common import REPO, Report, add_options, repetitions

#: ImageNet-1k's train and val entries, and its val share.
IMAGENET_ENTRIES, IMAGENET_VAL = 1_331_167, 50_000
#: ImageNet-21k (fall 2011 release): images and ASSUMED total bytes.
IN21K_IMAGES, IN21K_BYTES = 14_197_122, 1.31e12
#: ASSUMED per-byte rate of a build per core (benchmarks/results/shard.jsonl: zip, steady MB per CPU-second).
ASSUMED_MB_PER_CORE_S = 40.5
#: ASSUMED network link of a cluster's store (10 Gbit/s).
ASSUMED_LINK_MB_S = 1250.0
#: --quick: the fewest entries and classes the script takes (its numbers are process and JVM start-up), written
#: into the fewest shards (2 train, 1 val; a full run writes 16 or more train and 8 val shards).
QUICK = {"entries": 80, "classes": 2, "train_shards": 2, "val_shards": 1}
#: What each measured call runs in its child: argv after the code; prints wall seconds and peak RSS (KiB).
CHILD = """
import json, resource, sys, time
from spark_imagenet.cli import main
start = time.perf_counter()
rc = main(sys.argv[1:])
wall = time.perf_counter() - start
try:  # this process's own peak: ru_maxrss can start at the forking parent's resident size and survive exec
    rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except (OSError, StopIteration):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rc": rc, "wall": wall, "rss_kib": rss}))
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, reps=1, quick_reps=1)
    p.add_argument("--entries", type=int, default=None, help=f"images in the zip (default {IMAGENET_ENTRIES:,}; "
                   f"--quick {QUICK['entries']})")
    p.add_argument("--classes", type=int, default=None, help=f"classes (default 1000; --quick {QUICK['classes']})")
    p.add_argument("--master", default="local[2]", help="the Spark job's master (default local[2])")
    p.add_argument("--keep", metavar="DIR", help="build the zip in DIR and keep it (reused when it is there)")
    args = p.parse_args(argv)
    args.entries = args.entries or (QUICK["entries"] if args.quick else IMAGENET_ENTRIES)
    args.classes = args.classes or (QUICK["classes"] if args.quick else 1000)
    if args.classes < 2 or args.entries < 40 * args.classes:
        p.error(f"--entries {args.entries} --classes {args.classes}: give at least 2 classes and 40 entries per class")
    return args


def shard_counts(args: argparse.Namespace) -> tuple[int, int]:
    """(train, val) shards both paths write: one train shard per 10,000 entries but at least 16, and 8 val;
    --quick: 2 and 1."""
    if args.quick:
        return QUICK["train_shards"], QUICK["val_shards"]
    return max(16, args.entries // 10_000), 8


def tiny_jpeg(number: int, base: bytes) -> bytes:
    """``base`` (a JPEG) with a comment segment holding ``number`` after its start marker: unique bytes."""
    text = str(number).encode()
    return base[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + base[2:]


def write_zip(path: Path, entries: int, classes: int) -> tuple[int, int]:
    """A Kaggle-form zip (current form) of ``entries`` tiny JPEGs; returns (train, val) images."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (128, 96, 64)).save(buf, "JPEG", quality=50)
    base = buf.getvalue()
    val = max(classes, round(entries * IMAGENET_VAL / IMAGENET_ENTRIES))
    train = entries - val
    wnids = [f"n{90000000 + k:08d}" for k in range(classes)]
    data = "ILSVRC/Data/CLS-LOC"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("LOC_synset_mapping.txt", "".join(f"{w} class {k}\n" for k, w in enumerate(wnids)))
        z.writestr("LOC_train_solution.csv", "ImageId,PredictionString\n")
        z.writestr("LOC_sample_submission.csv", "ImageId,PredictionString\n")
        for i in range(train):
            w = wnids[i % classes]
            z.writestr(f"{data}/train/{w}/{w}_{i + 1}.JPEG", tiny_jpeg(i, base))
        rows = []
        for i in range(val):
            name = f"ILSVRC2012_val_{i + 1:08d}"
            z.writestr(f"{data}/val/{name}.JPEG", tiny_jpeg(train + i, base))
            rows.append(f"{name},{wnids[i % classes]} 0 0 8 8 \n")
        z.writestr("LOC_val_solution.csv", "ImageId,PredictionString\n" + "".join(rows))
    return train, val


def run_child(argv: list[str]) -> dict:
    """Run ``spark_imagenet.cli.main(argv)`` in a fresh Python; returns its wall seconds and peak RSS."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, env=env, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines or json.loads(lines[-1])["rc"] != 0:
        raise SystemExit(f"scale.py: {' '.join(argv[:3])} ... failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    report = Report("scale", args)
    reps = repetitions(args)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="spark-imagenet-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        archive = base / f"imagenet-{args.entries}x{args.classes}.zip"
        if not archive.exists():
            report.say(f"scale: writing {archive} ({args.entries:,} entries) ...")
            write_zip(archive.with_suffix(".partial"), args.entries, args.classes)
            archive.with_suffix(".partial").rename(archive)
        train_shards, val_shards = shard_counts(args)
        shards = ["--train-shards", str(train_shards), "--val-shards", str(val_shards), "--no-progress"]
        runs: dict[str, list[dict]] = {"local": [], "spark": []}
        for rep in range(reps):
            for kind in (("local", "spark") if rep % 2 == 0 else ("spark", "local")):
                out = base / f"out-{kind}"
                shutil.rmtree(out, ignore_errors=True)
                extra = ["--master", args.master] if kind == "spark" else []
                runs[kind].append(run_child(["shard", str(archive), "--out", str(out), *shards, *extra]))
                shutil.rmtree(out, ignore_errors=True)
        record(report, args, runs)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    report.close()
    return 0


def record(report: Report, args: argparse.Namespace, runs: dict[str, list[dict]]) -> None:
    """Record the measured calls, their ratio and the ImageNet-21k projection."""
    n = args.entries
    train_shards, val_shards = shard_counts(args)
    params = {"entries": n, "classes": args.classes, "master": args.master, "cores": os.cpu_count(),
              "train_shards": train_shards, "val_shards": val_shards}
    rate = {}
    for kind, label in (("local", "local path (all cores)"), ("spark", f"Spark job ({args.master})")):
        rate[kind] = [n / r["wall"] for r in runs[kind]]
        report.add(f"{label}: whole call", "s", [r["wall"] for r in runs[kind]], **params)
        report.add(f"{label}: images/s", "images/s", rate[kind], **params)
        report.add(f"{label}: driver's peak RSS", "MB", [r["rss_kib"] * 1024 / 1e6 for r in runs[kind]], **params)
    report.ratio("Spark job / local path, images/s", rate["spark"], rate["local"], **params)
    cores = int(args.master[6:-1].split(",")[0]) if args.master.startswith("local[") and args.master[6:-1][:1].isdigit() \
        else os.cpu_count() or 1
    per_image_core_s = cores / sorted(rate["spark"])[len(rate["spark"]) // 2]
    for executors in (16, 64):
        hours = (IN21K_IMAGES * per_image_core_s + IN21K_BYTES / (ASSUMED_MB_PER_CORE_S * 1e6)) / executors / 3600
        report.derived(f"projection: ImageNet-21k as a Spark job on {executors} executor cores", "h", hours,
                       per_image_core_s=per_image_core_s, assumed_mb_per_core_s=ASSUMED_MB_PER_CORE_S,
                       images=IN21K_IMAGES, assumed_bytes=IN21K_BYTES)
    report.derived("projection: ImageNet-21k read + written at an ASSUMED 10 Gbit/s (I/O bound)", "h",
                   2 * IN21K_BYTES / (ASSUMED_LINK_MB_S * 1e6) / 3600, assumed_link_mb_s=ASSUMED_LINK_MB_S)


if __name__ == "__main__":
    sys.exit(main())
