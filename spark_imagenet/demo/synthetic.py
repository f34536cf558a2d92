"""A small, learnable, procedurally drawn dataset in the exact Kaggle layout.

It is the built-in default of ``spark-imagenet demo`` and the data of the
tests: it needs nothing but the package (Pillow and NumPy). Each class is a
texture that fills the whole picture (stripes of a class-specific angle and
period, checks, rings, dots, ...) in a class-specific hue, with random phase,
jitter, noise and a random overlaid shape, so random crops of any part of an
image still show its class, and no two images are equal.

The tree it writes (:func:`generate_kaggle_layout`) has the same files and
quirks as the real download: ``LOC_synset_mapping.txt``,
``LOC_train_solution.csv``, ``LOC_val_solution.csv`` (several boxes in some
rows, trailing spaces), ``LOC_sample_submission.csv``, the train folders per
wnid, and flat ``val/`` and ``test/`` folders.
"""

from __future__ import annotations

import colorsys
import math
import os
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

#: The textures, one per class (cycled when there are more classes).
PATTERNS = (
    "horizontal stripes",
    "vertical stripes",
    "diagonal stripes",
    "checks",
    "rings",
    "dots",
    "anti-diagonal stripes",
    "fine grid",
    "waves",
    "plain gradient",
)


def synthetic_wnid(k: int) -> str:
    """The made-up wnid of synthetic class ``k`` (``n9000000k``; real wnids start below n15)."""
    return f"n9{k:07d}"


def class_names(k: int) -> str:
    """Human-readable name of synthetic class ``k``, e.g. ``"red horizontal stripes"``."""
    hue_names = ("red", "orange", "yellow", "lime", "green", "teal", "cyan", "blue", "violet", "magenta")
    return f"{hue_names[k % 10]} {PATTERNS[(k * 3) % len(PATTERNS)]}"


def draw_image(k: int, num_classes: int, rng: random.Random, width: int, height: int) -> Image.Image:
    """Draw one RGB image of class ``k``.

    Args:
        k: class index, ``0 <= k < num_classes``.
        num_classes: number of classes (spreads the hues).
        rng: random source (phase, jitter, noise, overlay).
        width, height: size in pixels.

    Returns:
        PIL.Image.Image: an RGB image.
    """
    pattern = PATTERNS[(k * 3) % len(PATTERNS)]
    hue = (k / max(num_classes, 1) + rng.uniform(-0.02, 0.02)) % 1.0
    fg = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.7, 1.0), rng.uniform(0.75, 1.0))) * 255
    bg = np.array(colorsys.hsv_to_rgb((hue + 0.5) % 1.0, rng.uniform(0.1, 0.3), rng.uniform(0.1, 0.35))) * 255
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    period = rng.uniform(10, 16) * (1 + (k // len(PATTERNS)) * 0.6)
    phase = rng.uniform(0, 2 * math.pi)
    if pattern == "horizontal stripes":
        m = np.sin(2 * math.pi * y / period + phase)
    elif pattern == "vertical stripes":
        m = np.sin(2 * math.pi * x / period + phase)
    elif pattern == "diagonal stripes":
        m = np.sin(2 * math.pi * (x + y) / (period * 1.4) + phase)
    elif pattern == "anti-diagonal stripes":
        m = np.sin(2 * math.pi * (x - y) / (period * 1.4) + phase)
    elif pattern == "checks":
        m = np.sin(2 * math.pi * x / period + phase) * np.sin(2 * math.pi * y / period + phase)
    elif pattern == "rings":
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        m = np.sin(2 * math.pi * np.hypot(x - cx, y - cy) / period + phase)
    elif pattern == "dots":
        m = np.sin(2 * math.pi * x / period + phase) + np.sin(2 * math.pi * y / period + phase) - 1.0
    elif pattern == "fine grid":
        m = np.maximum(np.cos(2 * math.pi * x / (period / 2)), np.cos(2 * math.pi * y / (period / 2))) * 2 - 1
    elif pattern == "waves":
        m = np.sin(2 * math.pi * (y + 6 * np.sin(2 * math.pi * x / (period * 3))) / period + phase)
    else:  # plain gradient
        m = (x / width + y / height) - 1.0
    mask = (m > 0).astype(np.float32)[..., None]
    pixels = mask * fg + (1 - mask) * bg
    pixels += np.random.default_rng(rng.getrandbits(32)).normal(0, 12, pixels.shape)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(0, 2)):  # distractors shared by all classes
        x0, y0 = rng.uniform(0, width * 0.7), rng.uniform(0, height * 0.7)
        s = rng.uniform(0.1, 0.3) * min(width, height)
        grey = rng.randint(60, 200)
        draw.ellipse([x0, y0, x0 + s, y0 + s], fill=(grey, grey, grey))
    return img


def generate_kaggle_layout(
    dest: str | os.PathLike,
    *,
    num_classes: int = 10,
    train_per_class: int = 40,
    val_per_class: int = 10,
    test_images: int = 5,
    size: tuple[int, int] = (160, 120),
    seed: int = 0,
    quality: int = 90,
) -> Path:
    """Write a synthetic dataset in the Kaggle ILSVRC CLS-LOC layout.

    Args:
        dest: folder to create (must be empty or absent).
        num_classes: number of classes, at least 2.
        train_per_class: train JPEGs per class.
        val_per_class: val JPEGs per class (flat folder, labels in the CSV).
        test_images: unlabeled test JPEGs.
        size: ``(width, height)`` of the images in pixels; each image varies
            by up to 25% around it, like real photos.
        seed: everything drawn depends only on this.
        quality: JPEG quality (Pillow).

    Returns:
        Path: ``dest`` as an absolute path.

    Raises:
        ValueError: ``num_classes < 2``, a count below 0 (below 1 for
            train/val), or a non-empty ``dest``.
    """
    if num_classes < 2 or train_per_class < 1 or val_per_class < 1 or test_images < 0:
        raise ValueError("need num_classes >= 2, train_per_class >= 1, val_per_class >= 1, test_images >= 0")
    dest = Path(dest).absolute()
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"{dest} is not empty")
    rng = random.Random(seed)
    data = dest / "ILSVRC" / "Data" / "CLS-LOC"
    wnids = [synthetic_wnid(k) for k in range(num_classes)]

    def jpeg(path: Path, k: int) -> tuple[int, int]:
        w = int(size[0] * rng.uniform(0.8, 1.25))
        h = int(size[1] * rng.uniform(0.8, 1.25))
        draw_image(k, num_classes, rng, w, h).save(path, "JPEG", quality=quality)
        return w, h

    def boxes(wnid: str, w: int, h: int, n: int) -> str:
        out = []
        for _ in range(n):
            x0, y0 = rng.randint(0, w // 2), rng.randint(0, h // 2)
            out.append(f"{wnid} {x0} {y0} {rng.randint(x0 + 1, w - 1)} {rng.randint(y0 + 1, h - 1)}")
        return " ".join(out)

    (dest).mkdir(parents=True, exist_ok=True)
    with open(dest / "LOC_synset_mapping.txt", "w") as f:
        for k, w in enumerate(wnids):
            f.write(f"{w} {class_names(k)}, synthetic class {k}\n")
    train_rows = []
    for k, wnid in enumerate(wnids):
        folder = data / "train" / wnid
        folder.mkdir(parents=True)
        for n in range(train_per_class):
            name = f"{wnid}_{n + 1}"
            w, h = jpeg(folder / f"{name}.JPEG", k)
            if n % 3 == 0:
                train_rows.append(f"{name},{boxes(wnid, w, h, 1)} ")
    (data / "val").mkdir(parents=True)
    val_rows = []
    order = [k for k in range(num_classes) for _ in range(val_per_class)]
    rng.shuffle(order)
    for i, k in enumerate(order, 1):
        name = f"ILSVRC2012_val_{i:08d}"
        w, h = jpeg(data / "val" / f"{name}.JPEG", k)
        # Real rows: several boxes of the same wnid, a trailing space.
        val_rows.append(f"{name},{boxes(wnids[k], w, h, 1 + i % 3)} ")
    (data / "test").mkdir(parents=True)
    for i in range(1, test_images + 1):
        jpeg(data / "test" / f"ILSVRC2012_test_{i:08d}.JPEG", rng.randrange(num_classes))
    with open(dest / "LOC_train_solution.csv", "w") as f:
        f.write("ImageId,PredictionString\n" + "\n".join(train_rows) + "\n")
    with open(dest / "LOC_val_solution.csv", "w") as f:
        f.write("ImageId,PredictionString\n" + "\n".join(val_rows) + "\n")
    with open(dest / "LOC_sample_submission.csv", "w") as f:
        f.write("ImageId,PredictionString\n")
        for i in range(1, test_images + 1):
            f.write(f"ILSVRC2012_test_{i:08d},{' '.join(wnids[:5])}\n")
    return dest
