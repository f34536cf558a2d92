"""Sharding throughput: ``shard`` from the folder, the zip and the nested tar.gz zip, against a plain byte copy
of the same files (the I/O limit) and a converter that decodes and re-encodes every image; projected to the
1.28 M images of ImageNet on 16 and 64 cores.

Usage (from the repository root)::

    .venv/bin/python benchmarks/shard.py [--quick] [--reps 5] [--json [FILE]]
        [--data DIR | --tree KAGGLE_DIR] [--limit N] [--val-every 10] [--processes N]

Input. By default the first ``--limit`` 500 of the 1000 real ILSVRC-2012 JPEGs of
``../shared/data/imagenet-sample`` (one per class, mean 110 KB like ImageNet's; ``--data`` for another flat
folder of ``<wnid>_<name>.JPEG`` files) are laid out as a Kaggle tree in a temporary folder: each file once
as a train image of its class, and every ``--val-every``-th file again as a val image (so 500 + 50 images).
``--tree`` takes an existing Kaggle folder instead (e.g. ``../shared/data/ilsvrc-mini``). ``--quick``
generates a small synthetic tree (:func:`spark_imagenet.demo.synthetic.generate_kaggle_layout`) and needs
no shared data. From the tree it builds the Kaggle zip in its two forms: the current one (``LOC_*`` and
``ILSVRC/`` at the root, deflated members) and the older one (``LOC_*`` plus
``imagenet_object_localization_patched2019.tar.gz``). All files are read once first, so every measurement
reads from the page cache: the disk is not measured (see the projection for what it would need).

Measured, each repetition in one run, the order reversed every other repetition (the machine is shared):

* **shard, 1 process / all cores**, per source (folder, zip, nested tar): the whole
  :func:`spark_imagenet.dataset.sharding.shard` call (listing included: for the nested form that is pass 1
  over the tar.gz; then the check of every image, the TFRecords, their CRC32C and the manifest) with
  ``processes=1`` and with all usable cores. Reported: images/s (wall), images and MB of JPEG input per
  CPU-second of this process and its worker processes (what one fully used core does; wall rates on a
  busy shared machine mostly measure the other processes), and in ``params`` the build step's own rate as
  ``shard`` logs it (checking, writing and, for the nested form, pass 2 and the reordering). All three
  sources must give the same dataset id.
* **fixed cost**: ``shard`` of a 5-image tree with ``processes=1`` (the spawned worker's start and imports,
  listing, manifest): subtracted from the calls above for the per-core rate at scale ("steady"), where it
  is paid once per build instead of once per 550 images.
* **byte copy** (the I/O limit): read each of the same JPEG files and append it to one output file.
* **converter**: what a converter that "cleans" every file does (as TensorFlow's reference converter does
  for its problem files): read the file, decode it at full size with Pillow, ``convert("RGB")``, encode as
  JPEG quality 95, then the same TFRecord framing as ours, into one output file.
* **ours per image, in memory**: the per-image step every build path shares
  (:func:`spark_imagenet.dataset.sharding.check_image`: classify with Pillow, decode at 1/8 DCT scale to
  grayscale, repair only the files that need it; then the record), with ``verify=decode`` (the default) and
  ``verify=header`` (header and end-of-image marker only), on bytes already in memory: the CPU the
  per-image work costs, without listing, processes, files or CRC32C.
* **nested tar.gz stream, one pass**: reading every member of the tar.gz in one process as ``shard`` does
  (:meth:`spark_imagenet.source.tar_stream.TarStreamSource.members`): the serial part of the nested form,
  which ``shard`` does twice in its main process, however many cores it has.

Ratios (per repetition, then the median): ours / byte copy (how far from the I/O limit), ours / converter
(what checking instead of re-encoding saves), both per CPU-second with the fixed cost subtracted; ours per
image / converter (the old single-core comparison); all cores / 1 process (wall: the scaling on this
machine). Derived: hours to shard ImageNet train (1,281,167 images, ASSUMED mean 110 KB: the sample's own
mean is printed) on 16 and 64 cores, for each source form, the converter and the byte copy, ASSUMING the
per-core rate scales linearly with cores (the workers share nothing but the disk; for the nested form its
two serial passes are added: one pass, then the larger of the second pass and the parallel work); the
rate of JPEG bytes those cores read (shard writes about as much again), against an ASSUMED local NVMe
drive (3,000 MB/s read) and an ASSUMED 10 Gbit/s network disk or bucket link (1,250 MB/s); and the
bandwidth-bound hours at those assumed rates. Projections scale by bytes (decoding costs about as much
per byte for any image), so a tree of smaller images projects the same ImageNet size.

How to read it: ours / converter > 1 is the claim (checking is cheaper than re-encoding); ours / byte copy
well below 1 says the per-image decode check, not the I/O, bounds a build (compare "ours per image,
in memory" with the whole call to see what the rest costs). The default decode check is bounded by the
1/8-scale decode that proves each file complete; the converter by the full-size decode plus the encode.
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import re
import resource
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from statistics import median

from common import REPO, Report, add_options, machine_busy_seconds, repetitions, shared_data

sys.path.insert(0, str(REPO))

#: ImageNet-1k train images (the Kaggle archive's train folder).
IMAGENET_TRAIN = 1_281_167
#: Images in the nested tar.gz (train + 50,000 val + 100,000 test): a stream pass reads all of them.
IMAGENET_ARCHIVE_IMAGES = IMAGENET_TRAIN + 50_000 + 100_000
#: ASSUMED mean JPEG size of ImageNet train (the 1000-image sample's mean is 109,576 bytes).
ASSUMED_MEAN_BYTES = 110_000
#: ASSUMED sequential read rate of one local NVMe drive, MB/s (order of magnitude of a PCIe 3/4 x4 drive).
ASSUMED_NVME_MB_S = 3000.0
#: ASSUMED rate of a 10 Gbit/s link to a network disk or bucket, MB/s.
ASSUMED_NETWORK_MB_S = 1250.0
#: Core counts of the projection.
PROJECTED_CORES = (16, 64)
SOURCES = ("folder", "zip", "nested tar")
TAR_MEMBER = "imagenet_object_localization_patched2019.tar.gz"
DATA_REL = Path("ILSVRC", "Data", "CLS-LOC")


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=None,
                   help="flat folder of <wnid>_<name>.JPEG files (default: ../shared/data/imagenet-sample)")
    p.add_argument("--tree", type=Path, default=None,
                   help="an existing Kaggle-layout folder instead of --data (e.g. ../shared/data/ilsvrc-mini)")
    p.add_argument("--limit", type=int, default=500,
                   help="use only the first N files of --data, 0 for all (default: %(default)s, so that 5 "
                        "repetitions fit in 10 minutes on a busy 2-core machine)")
    p.add_argument("--val-every", type=int, default=10,
                   help="every Nth file of --data is also a val image (default: %(default)s)")
    p.add_argument("--processes", type=int, default=None,
                   help="worker processes of the all-cores run (default: the usable cores)")
    p.add_argument("--train-shards", type=int, default=8, help="train shards per build (default: %(default)s)")
    p.add_argument("--val-shards", type=int, default=2, help="val shards per build (default: %(default)s)")
    add_options(p)
    args = p.parse_args(argv)
    if args.data is not None and args.tree is not None:
        p.error("give --data or --tree, not both")
    if args.limit == 1 or args.limit < 0 or args.val_every < 1:
        p.error("--limit must be 0 (all) or at least 2, and --val-every at least 1")
    if (args.processes is not None and args.processes < 1) or args.train_shards < 1 or args.val_shards < 1:
        p.error("--processes, --train-shards and --val-shards must be at least 1")
    return args


def fail(message: str) -> None:
    """Print ``benchmarks/shard.py: MESSAGE`` to stderr and exit with status 2 (bad input)."""
    print(f"benchmarks/shard.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its finished (reaped) children so far."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def clocked(fn) -> tuple[float, float, object, float | None]:
    """Run ``fn()``; returns (wall seconds, CPU seconds of this process and its children, its result, the
    cores' worth of CPU the rest of the machine used meanwhile or None)."""
    b0, c0, t0 = machine_busy_seconds(), cpu_seconds(), time.perf_counter()
    result = fn()
    wall, cpu, b1 = time.perf_counter() - t0, cpu_seconds() - c0, machine_busy_seconds()
    others = None if b0 is None or b1 is None else max(0.0, (b1 - b0 - cpu) / wall)
    return wall, cpu, result, others


def tree_from_flat(folder: Path, dest: Path, limit: int | None, val_every: int) -> Path:
    """A Kaggle tree in ``dest`` from a flat folder of ``<wnid>_<name>.JPEG`` files: each file a train image
    of its wnid, every ``val_every``-th also a val image (``LOC_val_solution.csv`` gives its label)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in (".jpeg", ".jpg"))
    files = files[:limit] if limit else files
    wnids = sorted({p.name.split("_", 1)[0] for p in files})
    if len(files) < 2 or len(wnids) < 2 or not all(re.fullmatch(r"n\d{8}", w) for w in wnids):
        fail(f"{folder} needs at least 2 JPEG files named <wnid>_<name>.JPEG "
                         "of at least 2 classes (like ../shared/data/imagenet-sample); pass --data or --tree")
    names = {p.name.split("_", 1)[0]: p.stem.split("_", 1)[-1].replace("_", " ") for p in files}
    dest.mkdir(parents=True)
    (dest / "LOC_synset_mapping.txt").write_text("".join(f"{w} {names[w]}\n" for w in wnids))
    counts: collections.Counter = collections.Counter()
    rows = []
    (dest / DATA_REL / "val").mkdir(parents=True)
    for i, p in enumerate(files):
        wnid = p.name.split("_", 1)[0]
        counts[wnid] += 1
        (dest / DATA_REL / "train" / wnid).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dest / DATA_REL / "train" / wnid / f"{wnid}_{counts[wnid]}.JPEG")
        if i % val_every == 0:
            name = f"ILSVRC2012_val_{len(rows) + 1:08d}"
            shutil.copyfile(p, dest / DATA_REL / "val" / f"{name}.JPEG")
            rows.append(f"{name},{wnid} 0 0 10 10 \n")
    (dest / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "".join(rows))
    return dest


def labelled_files(tree: Path) -> list[Path]:
    """The train and val JPEG files of a Kaggle tree (what ``shard`` reads), sorted."""
    return sorted(p for split in ("train", "val") for p in (tree / DATA_REL / split).rglob("*") if p.is_file())


def zip_forms(tree: Path, base: Path) -> tuple[Path, Path]:
    """The tree as the Kaggle zip in its current form (deflated members) and its older form (nested tar.gz)."""
    root, nested = base / "root-form.zip", base / "nested-form.zip"
    members = sorted((p for p in tree.rglob("*") if p.is_file() and "test" not in p.relative_to(tree).parts),
                     key=lambda p: p.relative_to(tree).as_posix())
    with zipfile.ZipFile(root, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in members:
            zf.write(p, p.relative_to(tree).as_posix())
    tar_path = base / TAR_MEMBER
    with tarfile.open(tar_path, "w:gz") as tf:
        for p in members:
            if p.relative_to(tree).parts[0] == "ILSVRC":
                tf.add(p, p.relative_to(tree).as_posix(), recursive=False)
    with zipfile.ZipFile(nested, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(tree.glob("LOC_*")):
            zf.write(p, p.name)
        zf.write(tar_path, TAR_MEMBER, compress_type=zipfile.ZIP_STORED)
    tar_path.unlink()
    return root, nested


def _frame(name: str, data: bytes, height: int, width: int) -> bytes:
    """The TFRecord of one image, as ``shard`` frames it."""
    from spark_imagenet.dataset.shard_writer import example as _example
    from spark_imagenet.dataset.tfrecord import write_record
    from spark_imagenet.source.base import ImageFile

    buf = io.BytesIO()
    write_record(buf, _example(ImageFile(name, 0, name.split("_")[0], len(data)), data, height, width))
    return buf.getvalue()


def byte_copy(files: list[Path], out: Path) -> int:
    """Read each file and append it to ``out`` (the I/O limit); returns the bytes written."""
    total = 0
    with open(out, "wb") as f:
        for p in files:
            total += f.write(p.read_bytes())
    return total


def convert(files: list[Path], out: Path) -> int:
    """Read, decode and re-encode every file (Pillow, RGB, quality 95), framed into ``out``; returns bytes."""
    from PIL import Image

    total = 0
    with open(out, "wb") as f:
        for p in files:
            with Image.open(io.BytesIO(p.read_bytes())) as im:
                rgb = im.convert("RGB")
            enc = io.BytesIO()
            rgb.save(enc, "JPEG", quality=95)
            total += f.write(_frame(p.name, enc.getvalue(), rgb.height, rgb.width))
    return total


def step(images: list[tuple[str, bytes]], verify: str) -> int:
    """The shard builder's per-image step on bytes in memory; returns the bytes framed."""
    from spark_imagenet.dataset.sharding import check_image

    total = 0
    for name, data in images:
        stored, height, width, _ = check_image(data, name, verify)
        if stored is not None:
            total += len(_frame(name, stored, height, width))
    return total


def stream_pass(nested: Path) -> int:
    """One pass over the nested tar.gz as ``shard`` reads it, every member's bytes read; returns the bytes."""
    from spark_imagenet.source import open_source

    total = 0
    for ti, tf in open_source(nested).members():
        if ti.isfile():
            total += len(tf.extractfile(ti).read())
    return total


def run_shard(source: Path, out: Path, processes: int, args: argparse.Namespace, train_shards: int | None = None,
              val_shards: int | None = None) -> tuple[str, float]:
    """``shard`` ``source`` into ``out`` (removed again); returns (dataset id, the logged build-step files/s)."""
    from spark_imagenet.dataset.sharding import shard
    from spark_imagenet.logs import collect

    try:
        with collect() as logs:
            manifest = shard(source, out, train_shards=train_shards or args.train_shards,
                             val_shards=val_shards or args.val_shards, processes=processes, progress=False)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    rates = [m.group(1) for line in logs if (m := re.search(r"\(([\d.]+) files/s\)", line))]
    if not rates:
        raise RuntimeError("shard logged no '(N files/s)' line; benchmarks/shard.py parses its last log line: "
                           + (logs[-1] if logs else "(no log)"))
    return manifest.dataset_id, float(rates[-1])


def prepare(args: argparse.Namespace, base: Path, report: Report) -> dict:
    """The input tree, its zips, the 5-image tree of the fixed cost and the files in memory."""
    from spark_imagenet.demo.synthetic import generate_kaggle_layout

    if args.tree is not None:
        if not args.tree.is_dir():
            fail(f"--tree {args.tree} is not a folder (a Kaggle-layout tree such "
                             "as ../shared/data/ilsvrc-mini)")
        tree, where = args.tree.resolve(), str(args.tree)
    elif args.quick and args.data is None:
        tree = generate_kaggle_layout(base / "synthetic", num_classes=4, train_per_class=20, val_per_class=4,
                                      test_images=0, size=(160, 120), seed=1)
        where = "synthetic (generated, 4 classes x 20 train + 4 val, ~160x120 px)"
    else:
        data = args.data or shared_data("imagenet-sample")
        if data is None or not data.is_dir():
            fail((f"--data {args.data} is not a folder" if args.data else
                  "no input: ../shared/data/imagenet-sample is absent")
                 + "; pass --data DIR (flat <wnid>_<name>.JPEG files) or --tree KAGGLE_DIR"
                 + ("" if args.data else ", or --quick (it generates a small tree)"))
        tree, where = tree_from_flat(data, base / "tree", args.limit, args.val_every), str(data)
    from spark_imagenet.errors import SparkImagenetError
    from spark_imagenet.source import open_source

    try:
        open_source(tree)
    except SparkImagenetError as e:
        fail(f"{where} is not usable as a Kaggle tree: {e}")
    tiny = generate_kaggle_layout(base / "tiny", num_classes=2, train_per_class=2, val_per_class=1,
                                  test_images=0, size=(64, 48), seed=2)
    zip_root, zip_nested = zip_forms(tree, base)
    files = labelled_files(tree)
    images = [(p.name, p.read_bytes()) for p in files]  # also warms the page cache
    for z in (zip_root, zip_nested):
        z.read_bytes()
    nbytes = sum(len(d) for _, d in images)
    from spark_imagenet.dataset.quality import classify

    categories = collections.Counter(classify(d, n).category for n, d in images)
    report.say(f"input: {len(files)} images, {nbytes / 1e6:.1f} MB of JPEG (mean {nbytes / len(files) / 1e3:.1f} KB; "
               f"the projection assumes {ASSUMED_MEAN_BYTES / 1e3:.0f} KB) from {where}; categories: "
               f"{dict(sorted(categories.items()))}")
    return {"tree": tree, "tiny": tiny, "sources": dict(zip(SOURCES, (tree, zip_root, zip_nested))),
            "files": files, "images": images, "bytes": nbytes, "where": where}


def one_rep(inp: dict, args: argparse.Namespace, processes: int, rep: int, base: Path) -> dict:
    """One repetition of every measurement (order reversed on odd repetitions).

    Returns:
        dict: per measurement key, what :func:`clocked` returns (for a ``shard`` call the result is the
        dataset id and the logged build-step rate).
    """
    tasks = {"copy": lambda: byte_copy(inp["files"], base / "copy.bin"),
             "convert": lambda: convert(inp["files"], base / "convert.bin"),
             "step decode": lambda: step(inp["images"], "decode"),
             "step header": lambda: step(inp["images"], "header"),
             "stream": lambda: stream_pass(inp["sources"]["nested tar"]),
             "fixed": lambda: run_shard(inp["tiny"], base / "out-tiny", 1, args, 2, 1)}
    for name, src in inp["sources"].items():
        for n in (1, processes):
            tasks[(name, n)] = lambda src=src, n=n, name=name: run_shard(src, base / f"out-{name}-{n}", n, args)
    keys = list(tasks) if rep % 2 == 0 else list(tasks)[::-1]
    out = {}
    for key in keys:
        out[key] = clocked(tasks[key])
    for f in ("copy.bin", "convert.bin"):
        (base / f).unlink(missing_ok=True)
    return out


def steady(cpu: float, fixed: float) -> float:
    """A call's CPU seconds less the fixed cost, at least a tenth of the call (a tree barely above the fixed
    cost, e.g. --quick, would otherwise give nonsense rates)."""
    return max(cpu - fixed, 0.1 * cpu)


def record_baselines(report: Report, runs: list[dict], n: int, nbytes: int) -> None:
    """Byte copy, converter, the in-memory per-image step and the stream pass."""
    labels = {"copy": "byte copy (read + append to one file)",
              "convert": "converter (Pillow decode + RGB + JPEG q95 + framing)",
              "step decode": "ours per image in memory, verify=decode",
              "step header": "ours per image in memory, verify=header",
              "stream": "nested tar.gz stream, one pass (serial)"}
    for key, label in labels.items():
        report.add(f"{label}: images per CPU-second", "images/CPU-s", [n / r[key][1] for r in runs],
                   images=n, bytes=nbytes)
        report.add(f"{label}: MB per CPU-second (one core)", "MB/s", [nbytes / 1e6 / r[key][1] for r in runs],
                   images=n, bytes=nbytes)
    report.add("byte copy: wall", "MB/s", [nbytes / 1e6 / r["copy"][0] for r in runs], images=n)
    report.add("converter: wall", "images/s", [n / r["convert"][0] for r in runs], images=n)
    report.add("fixed cost of a shard call (5-image tree, 1 process): CPU", "s", [r["fixed"][1] for r in runs])
    report.add("fixed cost of a shard call (5-image tree, 1 process): wall", "s", [r["fixed"][0] for r in runs])
    for key, label in (("step decode", "verify=decode"), ("step header", "verify=header")):
        report.ratio(f"ours per image in memory ({label}) / converter, per CPU-second",
                     [r["convert"][1] for r in runs], [r[key][1] for r in runs])


def others(runs: list[dict], key) -> float | None:
    """The median cores' worth of CPU other processes used during measurement ``key`` (None if unknown)."""
    values = [r[key][3] for r in runs if r[key][3] is not None]
    return round(median(values), 2) if values else None


def record_sources(report: Report, runs: list[dict], n: int, nbytes: int, processes: int) -> None:
    """Per source: the whole call's rates at 1 process and all cores, and its ratios."""
    for name in SOURCES:
        one, many = (name, 1), (name, processes)
        build = sorted(r[one][2][1] for r in runs)
        report.add(f"shard {name}, 1 process: whole call", "images/s", [n / r[one][0] for r in runs],
                   images=n, bytes=nbytes, build_step_files_per_s_median=build[len(build) // 2],
                   others_cores_median=others(runs, one))
        report.add(f"shard {name}, 1 process: images per CPU-second", "images/CPU-s",
                   [n / r[one][1] for r in runs], images=n, note="this process + its workers")
        report.add(f"shard {name}, 1 process: MB per CPU-second (one core)", "MB/s",
                   [nbytes / 1e6 / r[one][1] for r in runs], images=n, bytes=nbytes)
        report.add(f"shard {name}, 1 process: steady MB per CPU-second (fixed cost subtracted)", "MB/s",
                   [nbytes / 1e6 / steady(r[one][1], r["fixed"][1]) for r in runs], images=n, bytes=nbytes)
        report.add(f"shard {name}, {processes} processes: whole call", "images/s",
                   [n / r[many][0] for r in runs], images=n, processes=processes,
                   others_cores_median=others(runs, many))
        report.add(f"shard {name}, {processes} processes: images per CPU-second", "images/CPU-s",
                   [n / r[many][1] for r in runs], images=n, processes=processes)
        ours = [steady(r[one][1], r["fixed"][1]) for r in runs]
        report.ratio(f"ours ({name}) / byte copy, per CPU-second", [r["copy"][1] for r in runs], ours,
                     note="steady: the fixed cost of a shard call subtracted; 1 = at the I/O limit")
        report.ratio(f"ours ({name}) / converter, per CPU-second", [r["convert"][1] for r in runs], ours,
                     note="steady: the fixed cost of a shard call subtracted")
        report.ratio(f"scaling ({name}): {processes} processes / 1 process, wall",
                     [r[one][0] for r in runs], [r[many][0] for r in runs], processes=processes)


def record_projection(report: Report, runs: list[dict], nbytes: int) -> None:
    """Hours for ImageNet train on 16 and 64 cores; the bandwidth those cores need; the I/O-bound hours."""
    train_bytes = IMAGENET_TRAIN * ASSUMED_MEAN_BYTES

    def per_byte(cpus: list[float]) -> float:  # CPU seconds per JPEG byte, median over the repetitions
        return median([c / nbytes for c in cpus])

    stream = per_byte([r["stream"][1] for r in runs])
    pass_full, pass_train = IMAGENET_ARCHIVE_IMAGES * ASSUMED_MEAN_BYTES * stream, train_bytes * stream
    common = dict(images=IMAGENET_TRAIN, assumed_mean_bytes=ASSUMED_MEAN_BYTES,
                  assumption="per-core rate (CPU-seconds per JPEG byte, measured here) scales linearly with "
                             "cores; the disk is not the limit")
    work = {f"shard {s}": train_bytes * per_byte([steady(r[(s, 1)][1], r["fixed"][1]) for r in runs])
            for s in SOURCES}
    work["converter"] = train_bytes * per_byte([r["convert"][1] for r in runs])
    work["byte copy"] = train_bytes * per_byte([r["copy"][1] for r in runs])
    for cores in PROJECTED_CORES:
        for what, cpu in work.items():
            if what == "shard nested tar":  # two serial passes in the main process, the rest in parallel
                seconds = pass_full + max(pass_full, max(cpu - 2 * pass_train, 0.0) / cores)
                extra = dict(serial_pass_s=round(pass_full, 1),
                             note="one serial pass over the whole tar.gz (1,431,167 images incl. val and test), "
                                  "then the larger of the second pass and the parallel work")
            else:
                seconds, extra = cpu / cores, {}
            report.derived(f"projection: {what}, ImageNet train on {cores} cores", "h", seconds / 3600,
                           cores=cores, core_seconds=round(cpu, 1), **common, **extra)
    for cores in PROJECTED_CORES:
        for s in ("folder", "zip"):
            need = train_bytes / (work[f"shard {s}"] / cores) / 1e6
            report.derived(f"projection: JPEG read rate shard {s} needs on {cores} cores", "MB/s", need,
                           cores=cores, assumed_nvme_mb_s=ASSUMED_NVME_MB_S, assumed_network_mb_s=ASSUMED_NETWORK_MB_S,
                           note="shard writes about as much again (records + CRC32C re-read from the page cache)")
    io_hours = {}
    for label, rate in (("ASSUMED local NVMe", ASSUMED_NVME_MB_S), ("ASSUMED 10 Gbit/s network", ASSUMED_NETWORK_MB_S)):
        io_hours[label] = 2 * train_bytes / (rate * 1e6) / 3600
        report.derived(f"projection: I/O-bound hours, ImageNet train read + written at {label} "
                       f"({rate:,.0f} MB/s)", "h", io_hours[label],
                       bandwidth_mb_s=rate, bytes=2 * train_bytes, assumption="read and write share the bandwidth")
    for cores in PROJECTED_CORES:
        for label, hours in io_hours.items():
            report.derived(f"projection: shard folder on {cores} cores, bounded by the {label}", "h",
                           max(work["shard folder"] / cores / 3600, hours), cores=cores,
                           note="the larger of the CPU-bound and the I/O-bound hours")


def main(argv=None) -> int:
    """Run the benchmark; returns the exit status."""
    args = parse_args(argv)
    reps = repetitions(args)
    processes = args.processes or len(os.sched_getaffinity(0))
    report = Report("shard", args)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-shard-") as tmp:
        base = Path(tmp)
        inp = prepare(args, base, report)
        n, nbytes = len(inp["files"]), inp["bytes"]
        report.say(f"{reps} repetitions of: shard from {', '.join(SOURCES)} with 1 and {processes} processes, "
                   "byte copy, converter, in-memory step (decode, header), stream pass, fixed cost")
        runs = []
        for rep in range(reps):
            runs.append(one_rep(inp, args, processes, rep, base))
            ids = {runs[-1][(s, k)][2][0] for s in SOURCES for k in (1, processes)}
            if len(ids) != 1:
                raise RuntimeError(f"the three sources gave different dataset ids: {sorted(ids)}")
            report.say(f"repetition {rep + 1}/{reps} done ({time.perf_counter() - start:.0f} s); "
                       + ", ".join(f"{s} {n / runs[-1][(s, 1)][1]:.0f}" for s in SOURCES)
                       + f" images per CPU-s (1 process), converter {n / runs[-1]['convert'][1]:.0f}")
        record_sources(report, runs, n, nbytes, processes)
        record_baselines(report, runs, n, nbytes)
        record_projection(report, runs, nbytes)
    report.say(f"same dataset id from all three sources; {time.perf_counter() - start:.0f} s in all")
    report.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
