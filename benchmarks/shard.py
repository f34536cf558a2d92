"""Shard builder throughput per image against a converter that decodes and re-encodes every image.

Usage (from the repository root)::

    .venv/bin/python benchmarks/shard.py [--data DIR] [--rounds 3] [--limit N]

What it does, on one core, with the JPEGs of ``--data`` (default
``../shared/data/imagenet-sample``, 1000 real ILSVRC-2012 images, one per
class) read into memory first (so the disk is out of the measurement and
both sides do the same TFRecord framing):

1. **Ours** (``verify=decode``, the default): the shard builder's per-image
   step, the one function every build path shares
   (:func:`spark_imagenet.dataset.sharding.check_image`: classify with Pillow, decode at
   1/8 DCT scale, repair only the files that need it), then the record
   (:func:`spark_imagenet.dataset.sharding._example`, ``write_record``).
2. **Ours, verify=header**: the same with ``--verify header`` (header and
   end-of-image marker only).
3. **Re-encode all**: what a converter that "cleans" every file does (as
   TensorFlow's reference converter does for its problem files): Pillow
   decode at full size, ``convert("RGB")``, encode as JPEG quality 95, then
   the same record framing.

Rounds alternate the three (the machine may be shared); the best round of
each counts. Printed: images/s of each, the ratio ours / re-encode, and the
quality categories of the files (:mod:`spark_imagenet.dataset.quality`). A full
build runs the per-image step in one worker process per core, so its
images/s scale with the cores until the disk or the bucket is the limit.

Measured on the 2-core development machine (AMD EPYC, shared; Pillow 13.0),
the 1000 sample files (976 ok, 23 grayscale, 1 with EXIF orientation 6:
``n02951585_can_opener.JPEG``, repaired), best of 3 rounds, one core: ours
902 images/s (verify=decode; rounds 676 to 902) and 8,650 images/s
(verify=header), re-encode all 386 images/s: ratio 2.3x (decode) and 22x
(header). The default decode check is bounded by the 1/8-scale decode that
proves each file complete, not by the store; the re-encode is bounded by the
full-size decode plus the encode.
"""

from __future__ import annotations

import argparse
import collections
import io
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_DATA = REPO.parent / "shared" / "data" / "imagenet-sample"


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of JPEG files (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N files")
    return p.parse_args(argv)


def load(folder: Path, limit: int | None) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of the sorted ``*.jpeg``/``*.jpg`` files of ``folder``, at most ``limit``."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpeg", ".jpg") and p.is_file())
    return [(p.name, p.read_bytes()) for p in (files[:limit] if limit else files)]


def _frame(name: str, data: bytes, height: int, width: int) -> bytes:
    from spark_imagenet.source.base import ImageFile
    from spark_imagenet.dataset.sharding import _example
    from spark_imagenet.dataset.tfrecord import write_record

    buf = io.BytesIO()
    write_record(buf, _example(ImageFile(name, 0, name.split("_")[0], len(data)), data, height, width))
    return buf.getvalue()


def ours(files: list[tuple[str, bytes]], verify: str) -> int:
    """The shard builder's per-image step on every file; returns the bytes framed."""
    from spark_imagenet.dataset.sharding import check_image

    total = 0
    for name, data in files:
        stored, height, width, _ = check_image(data, name, verify)
        if stored is not None:
            total += len(_frame(name, stored, height, width))
    return total


def reencode_all(files: list[tuple[str, bytes]]) -> int:
    """Decode and re-encode every file (Pillow, RGB, quality 95); returns the bytes framed."""
    from PIL import Image

    total = 0
    for name, data in files:
        with Image.open(io.BytesIO(data)) as im:
            rgb = im.convert("RGB")
        out = io.BytesIO()
        rgb.save(out, "JPEG", quality=95)
        total += len(_frame(name, out.getvalue(), rgb.height, rgb.width))
    return total


def main(argv=None) -> int:
    """Run the benchmark; print one line per round and the RESULT line."""
    args = parse_args(argv)
    if not args.data.is_dir():
        print(f"benchmarks/shard.py: {args.data} is not a folder (../shared/data/imagenet-sample?)", file=sys.stderr)
        return 2
    files = load(args.data, args.limit)
    if not files:
        print(f"benchmarks/shard.py: no JPEG files in {args.data}", file=sys.stderr)
        return 2
    from spark_imagenet.dataset.quality import classify

    categories = collections.Counter(classify(data, name).category for name, data in files)
    mb = sum(len(d) for _, d in files) / 1e6
    print(f"{len(files)} files ({mb:.1f} MB) from {args.data}, one core, {args.rounds} rounds; "
          f"categories: {dict(sorted(categories.items()))}", flush=True)
    runs = {"ours (verify=decode)": lambda: ours(files, "decode"),
            "ours (verify=header)": lambda: ours(files, "header"),
            "re-encode all (Pillow q95)": lambda: reencode_all(files)}
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for label, run in runs.items():
            t0 = time.perf_counter()
            nbytes = run()
            rate = len(files) / (time.perf_counter() - t0)
            best[label] = max(best.get(label, 0.0), rate)
            print(f"  round {r + 1}: {label:<27} {rate:8.0f} images/s ({nbytes / 1e6:.1f} MB of records)", flush=True)
    decode, header, reenc = best.values()
    print(
        f"RESULT: ours {decode:.0f} images/s (verify=decode), {header:.0f} images/s (verify=header); "
        f"re-encode all {reenc:.0f} images/s; ratio {decode / reenc:.1f}x (decode), {header / reenc:.1f}x (header); "
        f"best of {args.rounds} rounds, one core"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
