"""Building TFRecord shards and their manifest from a Kaggle source: :func:`shard`.

What a build does:

1. open the source (:func:`spark_imagenet.source.open_source`: the unpacked
   folder, or the downloaded zip in either form, read in place) and list the
   chosen labelled images;
2. shuffle the train images across classes with the seed and deal them
   round-robin to the shards (so shard sizes differ by at most one example and
   every shard mixes classes); val images are dealt in file-name order
   (:func:`plan_shards`);
3. write the shards in parallel worker processes, each image checked first
   (:func:`check_image`, :mod:`spark_imagenet.dataset.quality`): stored byte
   for byte, or repaired, or (unusable) failing the build or left out
   (``on_corrupt``); how, for a random-access and for a stream source:
   :mod:`spark_imagenet.dataset.shard_writer`. Either way the shards are byte
   for byte the same; the workers also return a digest of every image;
4. only when every image passed (or was skipped): publish the shards under
   their final names (a remote ``out``: each uploaded, verified, as soon as it
   is written), compare the digests across all shards and both splits
   (identical images are reported and kept: :mod:`spark_imagenet.dataset.duplicates`),
   write ``quality-report.json``, then ``manifest.json`` last
   (:mod:`spark_imagenet.dataset.transfer`).

An interrupted or failed build leaves no manifest (so nothing can train on a
partial dataset) and no half-written shard under a final name.

Feature keys of every record are those of TensorFlow's reference ImageNet
converter (tensorflow/models ``build_imagenet_data.py``), with 0-based labels:
see :data:`FEATURE_KEYS`.

Example::

    >>> manifest = shard("/data/kaggle", "gs://my-bucket/imagenet-2", classes=2, processes=1, progress=False)
    >>> manifest.num_classes, len(manifest.dataset_id)
    (2, 32)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime as _dt
import hashlib
import logging
import math
import multiprocessing as mp
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from spark_imagenet.dataset.duplicates import DigestTable, Duplicates
from spark_imagenet.dataset.image_form import ORIGINAL, ImageForm, image_form
from spark_imagenet.dataset.manifest import FORMAT_VERSION, Manifest, ShardInfo, SplitInfo
from spark_imagenet.dataset.naming import PARTIAL_RE, partial_name, shard_name
from spark_imagenet.dataset.pixels import DEFAULT_MAX_PIXELS, check_max_pixels
from spark_imagenet.dataset.report import Quality, format_quality, quality_report, quality_totals, write_quality_report
from spark_imagenet.dataset.shard_writer import (
    READ_FAILED, ShardJob, assemble_shard, check_image, init_worker, spill_path, stream_images, write_shard)  # noqa: F401  (check_image: also this module's)
from spark_imagenet.dataset.transfer import Destination, check_destination, commit_manifest, publish, remove_replaced
from spark_imagenet.errors import ConfigError, ImageError, StorageError
from spark_imagenet.source import open_source
from spark_imagenet.source.base import ImageFile, ImageSource, SourceDataset
from spark_imagenet.storage import (
    DEFAULT_TRANSFERS,
    LocalStorage,
    Storage,
    check_transfers,
    is_remote_url,
    open_storage,
)

logger = logging.getLogger(__name__)

FEATURE_KEYS = (
    "image/encoded",
    "image/format",
    "image/class/label",
    "image/class/synset",
    "image/height",
    "image/width",
    "image/filename",
)
#: Target shard size for the automatic shard count, in bytes (128 MiB; the
#: TF reference converter's 1024 train shards of full ImageNet are ~140 MB).
TARGET_SHARD_BYTES = 128 * 1024 * 1024
#: The automatic count never goes below these, so up to 16 workers can train.
MIN_AUTO_TRAIN_SHARDS = 16
MIN_AUTO_VAL_SHARDS = 4
VERIFY_MODES = ("decode", "header")
ON_CORRUPT_MODES = ("error", "skip")
#: How many bad files the error of a failed build lists.
MAX_LISTED = 50


def _auto_shards(images: Sequence[ImageFile], minimum: int) -> int:
    nbytes = sum(i.size for i in images)
    return max(1, min(len(images), max(minimum, math.ceil(nbytes / TARGET_SHARD_BYTES))))


def _deal(images: Sequence[ImageFile], count: int) -> list[tuple[ImageFile, ...]]:
    """Round-robin: shard ``k`` gets images ``k, k+count, ...`` (sizes differ by <= 1)."""
    return [tuple(images[k::count]) for k in range(count)]


def plan_shards(
    source: SourceDataset, train_shards: int | None, val_shards: int | None, seed: int
) -> dict[str, list[tuple[ImageFile, ...]]]:
    """Decide which image goes to which shard.

    Args:
        source: the listed source images.
        train_shards: number of train shards, or ``None`` for automatic
            (about 128 MiB per shard, at least 16, at most one per image).
        val_shards: number of val shards, or ``None`` for automatic (at least 4).
        seed: seed of the train shuffle (``random.Random(seed)``).

    Returns:
        dict[str, list[tuple[ImageFile, ...]]]: per split, the images of each
        shard in record order.

    Raises:
        ConfigError: a shard count below 1 or above the number of images.
    """
    plan = {}
    train = list(source.train)
    random.Random(seed).shuffle(train)
    for split, images, count, option, minimum in (
        ("train", train, train_shards, "--train-shards", MIN_AUTO_TRAIN_SHARDS),
        ("val", list(source.val), val_shards, "--val-shards", MIN_AUTO_VAL_SHARDS),
    ):
        if count is None:
            count = _auto_shards(images, minimum)
        if not 1 <= count <= len(images):
            raise ConfigError(
                f"{option} {count}: must be between 1 and the number of {split} images ({len(images)}), "
                "so that no shard is empty", key=option, value=count
            )
        plan[split] = _deal(images, count)
    return plan


def dataset_fingerprint(plan: dict[str, list[tuple[ImageFile, ...]]], source: SourceDataset,
                        on_corrupt: str = "error", form: ImageForm = ORIGINAL) -> str:
    """SHA-256 (hex, first 16 bytes) of what a build would write: the format
    version, the classes, and per shard the file names (relative to the
    Kaggle root, so a directory and the zip it came from give the same id),
    sizes and labels in record order. Equal fingerprints mean equal datasets.

    ``on_corrupt="skip"`` is part of the fingerprint (the default ``"error"``
    adds nothing, so ids of earlier builds stay the same): a skip build leaves
    out the unusable files, which are known only after reading them, so its
    dataset may differ from the planned one, and is never taken for an error
    build's (which holds every planned file). So is a stored form other than
    ``original`` (``--resize``, ``--max-side``, the JPEG quality), likewise."""
    h = hashlib.sha256(f"spark-imagenet/{FORMAT_VERSION}\n".encode())
    if on_corrupt != "error":
        h.update(f"on-corrupt {on_corrupt}\n".encode())
    if form != ORIGINAL:
        h.update(f"form {form.label}\n".encode())
    for c in source.classes:
        h.update(f"class {c.id} {c.wnid}\n".encode())
    for split, shards in plan.items():
        for k, images in enumerate(shards):
            h.update(f"shard {split} {k} {len(shards)}\n".encode())
            for img in images:
                h.update(f"{source.relpath(img)} {img.size} {img.label}\n".encode())
    return h.hexdigest()[:32]


def shard(
    source: str | os.PathLike | ImageSource,
    out: str | os.PathLike,
    *,
    train_shards: int | None = None,
    val_shards: int | None = None,
    classes: int | None = None,
    class_list: str | os.PathLike | None = None,
    per_class: int | None = None,
    seed: int = 0,
    val_fraction: float | None = None,
    processes: int | None = None,
    verify: str = "decode",
    on_corrupt: str = "error",
    overwrite: bool = False,
    transfers: int = DEFAULT_TRANSFERS,
    progress: bool = True, max_image_pixels: int = DEFAULT_MAX_PIXELS,
    resize: int | None = None, max_side: int | None = None, jpeg_quality: int | None = None,
) -> Manifest:
    """Build TFRecord shards and ``manifest.json`` from ImageNet in the Kaggle layout, or one's own images.

    Args:
        source: the unpacked Kaggle ``imagenet-object-localization-challenge`` folder (see
            :mod:`spark_imagenet.source.layout`), or the downloaded zip in either of its forms, read without
            unpacking (see :mod:`spark_imagenet.source.zip_archive`; the older form with a nested tar.gz is read
            as a stream, twice: :mod:`spark_imagenet.source.tar_stream`), or a class-folder tree
            (:mod:`spark_imagenet.source.class_folders`); or an opened source, e.g. a labels file
            (:func:`spark_imagenet.source.open_labels`). The manifest records its resolved absolute path.
        out: bucket URL for the shards: a local path, ``file://`` URL or ``gs://bucket/prefix`` (shards are then
            staged in a temporary folder and uploaded, see :mod:`spark_imagenet.dataset.transfer`).
        train_shards: number of train shards (``None``: about 128 MiB each, at least 16). Training needs at
            least as many as workers.
        val_shards: number of val shards (``None``: automatic, at least 4).
        classes: keep the first K classes (``--classes``).
        class_list: file of wnids to keep (``--class-list``).
        per_class: at most M train images per class (``--per-class``).
        seed: seed of the per-class sample, of the train shuffle and of the
            ``val_fraction`` split.
        val_fraction: the share of each class drawn for validation from a class-folder tree without ``val/``
            (``None``: 0.1); refused for the Kaggle layout. For an opened ``source``, give it to its opener.
        processes: worker processes (``None``: all cores).
        verify: ``"decode"`` (default) or ``"header"``, see :func:`spark_imagenet.dataset.quality.classify`.
        on_corrupt: what to do with unusable (empty, truncated, undecodable) files: ``"error"`` (default)
            fails the build listing every one; ``"skip"`` leaves them out and records each in
            ``quality-report.json``. Repairable files (CMYK, YCCK, other formats, EXIF orientation) are repaired
            either way, see :mod:`spark_imagenet.dataset.quality`.
        overwrite: replace a different dataset already at ``out``.
        transfers: parallel uploads to a remote ``out`` (``--transfers``).
        progress: show a tqdm progress bar on stderr (images/s).
        max_image_pixels: the most pixels (width x height) an image may have (``--max-image-pixels``); a
            larger one is refused from its header before it is decoded, as an unusable file
            (:mod:`spark_imagenet.dataset.pixels`).
        resize, max_side, jpeg_quality: store the images as N x N pixels (``--resize N``: shorter side to N, up
            too, centre kept; 256: the paper's form) or with the longer side at most N (``--max-side N``), re-encoded
            at JPEG quality 1-100 (None: 90; :mod:`spark_imagenet.dataset.image_form`). None: as the source holds them.

    Returns:
        Manifest: the manifest that was written (or found, when ``out``
        already holds exactly this dataset: then nothing is rewritten).

    Raises:
        LayoutError: ``source`` is not in the Kaggle layout or inconsistent;
            for a zip also :class:`~spark_imagenet.errors.ArchiveError`
            (truncated, damaged, or not a Kaggle archive).
        ConfigError: bad option values, ``out`` holds a different dataset,
            or another run committed a different dataset to ``out`` while
            this one was building (this run's shards are removed again).
        ImageError: some images are unusable (``on_corrupt="error"``); lists every one.
        StorageError: ``out`` cannot be written, or an upload fails
            verification twice.

    Example:

    ```python
    >>> manifest = shard("/data/kaggle", "gs://my-bucket/imagenet", train_shards=2, processes=1, progress=False)
    >>> print(manifest.num_classes, manifest.splits["train"].examples)
    4 24

    ```
    """
    check_out_apart(source, out)
    options = _Options(verify, on_corrupt, processes, transfers, progress, max_image_pixels,
                       image_form(resize, max_side, jpeg_quality))
    src = _open(source, val_fraction).list_images(num_classes=classes, class_list=class_list, per_class=per_class,
                                          seed=seed, progress=progress)
    plan = plan_shards(src, train_shards, val_shards, seed)
    dataset_id = dataset_fingerprint(plan, src, on_corrupt, options.form)
    storage = open_storage(out)
    dest = check_destination(storage, dataset_id, overwrite)
    if dest.existing is not None:
        logger.info(f"{storage.url} already holds this dataset (id {dataset_id}); nothing to do")
        return dest.existing

    created_root = not storage.root_exists()
    try:
        return _build(storage, dest, src, plan, dataset_id, options)
    except BaseException:
        if created_root:
            storage.remove_empty_root()  # "nothing was written" includes the folder itself
        raise


def check_out_apart(source: str | os.PathLike | ImageSource | None, out: str | os.PathLike) -> None:
    """Refuse a local ``out`` that is the folder ``source`` or inside it: its shards would become images (or
    stray folders) of the source, which a later ``shard`` of it then refuses.

    Args:
        source: the images' folder or zip (an opened source or None: nothing to compare).
        out: the shards' bucket URL or path.

    Raises:
        ConfigError: ``out`` is ``source`` or inside it (``.key`` ``"--out"``).
    """
    if source is None or isinstance(source, ImageSource) or is_remote_url(source) or is_remote_url(out):
        return
    storage = open_storage(out)  # its URL parsing (file:///PATH) is the one place that reads a local URL
    if not isinstance(storage, LocalStorage):
        return
    here, there = Path(source).expanduser().resolve(), storage.root.resolve()
    if here.is_dir() and (there == here or here in there.parents):
        raise ConfigError(f"--out {out} is inside the source {source}: its shards would become part of the "
                          "source; give a folder outside it", key="--out", value=str(out))


def _open(source: str | os.PathLike | ImageSource, val_fraction: float | None) -> ImageSource:
    """``source`` opened (:func:`spark_imagenet.source.open_source`) unless it is open already.

    Raises:
        ConfigError: ``val_fraction`` with an opened source (it belongs to its opener).
    """
    if not isinstance(source, ImageSource):
        return open_source(source, val_fraction=val_fraction)
    if val_fraction is not None:
        raise ConfigError("val_fraction: give it to the opener of the source (open_source, open_labels)")
    return source


@dataclasses.dataclass(frozen=True)
class _Options:
    """The settings of one build (see :func:`shard`)."""

    verify: str
    on_corrupt: str
    processes: int | None
    transfers: int
    progress: bool
    max_pixels: int = DEFAULT_MAX_PIXELS
    form: ImageForm = ORIGINAL

    def __post_init__(self) -> None:
        """Refuse values that cannot work.

        Raises:
            ConfigError: names the option and what to give.
        """
        if self.verify not in VERIFY_MODES:
            raise ConfigError(f"--verify {self.verify!r}: choose one of {', '.join(VERIFY_MODES)}",
                              key="--verify", value=self.verify)
        if self.on_corrupt not in ON_CORRUPT_MODES:
            raise ConfigError(f"--on-corrupt {self.on_corrupt!r}: choose one of {', '.join(ON_CORRUPT_MODES)}",
                              key="--on-corrupt", value=self.on_corrupt)
        if self.processes is not None and self.processes < 1:
            raise ConfigError(f"processes={self.processes}: must be at least 1", key="processes", value=self.processes)
        check_transfers(self.transfers)
        check_max_pixels(self.max_pixels)


def _build(storage: Storage, dest: Destination, src: SourceDataset, plan: dict, dataset_id: str,
           options: _Options) -> Manifest:
    """Write the shards of ``plan``, publish them, then commit the manifest
    (see :func:`shard` and :mod:`spark_imagenet.dataset.transfer`)."""
    staging, tmp_root = _staging(storage, dest)
    remote = tmp_root is not None
    jobs = _jobs(src, plan, staging, dataset_id, options)
    total = sum(len(j.images) for j in jobs)
    n_proc = min(options.processes or os.cpu_count() or 1, len(jobs))
    logger.info(
        f"sharding {len(src.train)} train + {len(src.val)} val images of {len(src.classes)} classes "
        f"into {len(plan['train'])} + {len(plan['val'])} shards with {n_proc} processes"
    )
    start = time.perf_counter()
    # A remote --out gets each shard uploaded (verified) as soon as it is written, so the local staging
    # folder holds only shards in flight; nothing is visible to readers before the manifest commit.
    uploader = _Uploader(storage, dest, options.transfers) if remote else None
    try:
        digests = DigestTable({j.name: len(j.images) for j in jobs})
        results, problems, quality = _run_pool(jobs, src, n_proc, staging, remote, uploader, options, total, digests)
        if uploader is not None:
            uploader.finish(problems)
        if problems:
            raise _image_error(problems, storage.url, options.on_corrupt)
        if uploader is None:  # staged beside the objects: publish by renaming
            for j in jobs:
                storage.put_file(j.tmp_path, j.name, move=True)
        else:
            logger.info(f"uploaded {len(uploader.uploads)} shard(s) to {storage.url}, each verified against its CRC32C "
                        f"({options.transfers} parallel transfer(s))")
    except BaseException:
        if uploader is not None:
            uploader.abort()
        raise
    finally:
        for j in jobs:
            for path in (j.tmp_path, spill_path(j)):
                if os.path.exists(path):
                    os.unlink(path)
        if tmp_root is not None:
            tmp_root.cleanup()
    seconds = time.perf_counter() - start
    duplicates = digests.find(lambda j, k: (jobs[j].split, src.relpath(jobs[j].images[k]), jobs[j].images[k].wnid))
    manifest, splits = _commit(storage, dest, src, plan, results, quality, duplicates, dataset_id, options)
    logger.info(
        f"wrote {sum(s.examples for s in splits.values())} examples "
        f"({sum(s.bytes for s in splits.values()) / 1e6:.1f} MB) from {total} files in {seconds:.1f} s "
        f"({total / max(seconds, 1e-9):.0f} files/s) to {storage.url}"
    )
    return manifest


def _staging(storage: Storage, dest: Destination) -> tuple[Path, Any]:
    """Where shards are written before they are published, and the temporary folder to clean up
    (``None`` for a local ``out``, whose staging folder is ``out`` itself); removes the leftovers
    of an interrupted build there."""
    staging = storage.staging_dir()
    tmp_root = None
    if staging is None:
        import tempfile

        tmp_root = tempfile.TemporaryDirectory(prefix="spark-imagenet-shard-")
        staging = Path(tmp_root.name)
    for name in dest.objects:  # leftovers of an interrupted build
        if PARTIAL_RE.match(name):
            storage.delete(name)
    return staging, tmp_root


def _jobs(src: SourceDataset, plan: dict, staging: Path, dataset_id: str, options: _Options) -> list[ShardJob]:
    """One job per shard, with a reader of its images when the source has random access."""
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    source = src.source
    return [
        ShardJob(split, k, name, str(staging / partial_name(name, token)), images, options.verify,
                  source.reader(images) if source.random_access else None, options.on_corrupt, options.max_pixels,
                 options.form)
        for split, shards in plan.items()
        for k, images in enumerate(shards)
        for name in [shard_name(split, k, len(shards), dataset_id)]
    ]


class _Uploader:
    """Uploads each shard (verified) as soon as it is written, for a remote ``out``; deletes the local
    file after its upload.

    Attributes:
        uploads: per shard name, its upload.
    """

    def __init__(self, storage: Storage, dest: Destination, transfers: int):
        self._storage = storage
        self._dest = dest
        self._pool = concurrent.futures.ThreadPoolExecutor(transfers, thread_name_prefix="upload")
        self.uploads: dict[str, concurrent.futures.Future] = {}

    def _upload_one(self, path: str, info: ShardInfo) -> None:
        try:
            publish(self._storage, [(path, info)], present=self._dest.objects, transfers=1)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def submit(self, path: str, info: ShardInfo) -> None:
        """Start uploading the shard file ``path`` as ``info.name``."""
        self.uploads[info.name] = self._pool.submit(self._upload_one, path, info)

    def check(self) -> None:
        """Raise the error of the first upload that failed (the client already retried it)."""
        broken = next((f.exception() for f in self.uploads.values() if f.done() and f.exception()), None)
        if broken is not None:
            raise broken

    def finish(self, problems: list[str]) -> None:
        """Wait for every upload.

        Raises:
            StorageError: some failed (unless ``problems``, bad images, will be the error).
        """
        self._pool.shutdown(wait=True)
        failed = [str(f.exception()) for f in self.uploads.values() if f.exception() is not None]
        if failed and not problems:
            raise StorageError(f"{len(failed)} shard(s) could not be uploaded to {self._storage.url}; nothing was "
                               "committed:" + "".join(f"\n  {m}" for m in failed[:20]))

    def abort(self) -> None:
        """Cancel what has not started, and delete the shards uploaded but never committed."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        committed = self._dest.committed
        keep = {s.name for split in committed.splits.values() for s in split.shards} if committed else set()
        for name in self.uploads:
            if name not in keep:
                with contextlib.suppress(StorageError):
                    self._storage.delete(name, best_effort=True)


def _run_pool(jobs: list[ShardJob], src: SourceDataset, n_proc: int, staging: Path, remote: bool,
              uploader: _Uploader | None, options: _Options, total: int,
              digests: DigestTable) -> tuple[dict[str, ShardInfo], list[str], dict[str, Quality]]:
    """Write every shard in a pool of ``n_proc`` processes: each job reads its own images, or
    (a stream source) the main process streams them to the pool (:func:`stream_images`) and the
    pool then assembles each shard from its spill file. The digest of every image goes to ``digests``.

    Returns:
        tuple: the written shards by name, the bad files, and per shard name its quality tally.
    """
    results: dict[str, ShardInfo] = {}
    problems: list[str] = []
    quality: dict[str, Quality] = {}
    ctx = mp.get_context("spawn")
    counter = ctx.Value("q", 0)
    with ctx.Pool(n_proc, initializer=init_worker, initargs=(counter,)) as pool:
        streamed = not src.source.random_access
        pending = [] if streamed else [pool.apply_async(write_shard, (j,)) for j in jobs]
        job_of = dict(zip(pending, jobs))
        if streamed:
            logger.info(f"reading the images from {src.source.where_source()} (pass 2 of 2 over the compressed "
                        "stream)")
        bar = None
        if options.progress:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="img", desc="shard", file=sys.stderr, dynamic_ncols=True)
        try:
            if streamed:
                index, problems, stream_quality = stream_images(pool, src, jobs, options.verify, 2 * n_proc,
                                                                 counter, bar, digests, options.max_pixels,
                                                                 options.form)
                quality.update((j.name, q) for j, q in zip(jobs, stream_quality))
                pending = [] if problems else [pool.apply_async(assemble_shard, (j, index[i]))
                                               for i, j in enumerate(jobs)]
                job_of.update(zip(pending, jobs))
            while pending:
                pending[0].wait(0.2)
                pending = _collect(pending, job_of, results, problems, quality, digests, uploader, staging, remote)
                if uploader is not None:
                    uploader.check()  # stop at the first failed upload
                if bar is not None:
                    bar.update(counter.value - bar.n)
        finally:
            if bar is not None:
                bar.close()
    return results, problems, quality


def _collect(pending: list, job_of: dict, results: dict[str, ShardInfo], problems: list[str],
             quality: dict[str, Quality], digests: DigestTable, uploader: _Uploader | None, staging: Path,
             remote: bool) -> list:
    """Take in the finished jobs of ``pending`` (their shards, bad files, tallies and image digests; a
    finished shard goes to ``uploader`` while no image has failed); return the unfinished ones.

    Raises:
        StorageError: a worker could not write to the staging folder.
    """
    still = []
    for r in pending:
        if not r.ready():
            still.append(r)
            continue
        try:
            outcome = r.get()
        except OSError as e:  # raised in a worker: the staging disk, mostly
            raise StorageError(
                f"cannot write shards to {staging} ({e.strerror or e}"
                f"{': ' + e.filename if getattr(e, 'filename', None) else ''}). Free space "
                "there" + (", or point TMPDIR at a larger disk" if remote else ", or choose another --out")
                + ", and run again"
            ) from None
        problems += outcome.problems
        if outcome.quality[0]:
            quality[job_of[r].name] = outcome.quality
        if outcome.digests:
            digests.put(job_of[r].name, outcome.digests)
        info = outcome.info
        if info is not None:
            results[info.name] = info
            if uploader is not None and not problems:
                uploader.submit(job_of[r].tmp_path, info)
    return still


def _image_error(problems: list[str], url: str, on_corrupt: str) -> ImageError:
    """The error of a build with unusable images (``on_corrupt="error"``) or files that could not be read (either
    mode: a damaged zip member or a read error is never left out, since it says nothing about the image), listing
    them."""
    unread = sum(1 for p in problems if READ_FAILED in p)
    unusable = len(problems) - unread
    what = [f"{unusable} image file(s) are empty, truncated or do not decode"] if unusable else []
    what += [f"{unread} file(s) could not be read"] if unread else []
    advice = []
    if unusable:
        advice.append("Fix or remove the images (or leave their classes out), or pass --on-corrupt skip "
                      "(on_corrupt=\"skip\") to leave them out")
    if unread:
        advice.append(("--on-corrupt skip leaves out images that do not decode, never a file that cannot be read: "
                       if on_corrupt == "skip" else "A file that cannot be read is never left out: ")
                      + "do what its line says (a damaged zip: download it again)")
    return ImageError(
        f"{' and '.join(what)}; nothing was written to {url}. {'. '.join(advice)}; then run again:"
        + "".join(f"\n  {p}" for p in sorted(problems)[:MAX_LISTED])
        + (f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else "")
    )


def _commit(storage: Storage, dest: Destination, src: SourceDataset, plan: dict, results: dict[str, ShardInfo],
            quality: dict[str, Quality], duplicates: Duplicates, dataset_id: str,
            options: _Options) -> tuple[Manifest, dict[str, SplitInfo]]:
    """Write the quality report (with the identical images found), then commit the manifest (unless
    this dataset was committed before), then remove the shards of a dataset it replaced.

    Returns:
        tuple: the committed manifest, and the splits this build wrote.
    """
    report = quality_report(src, plan, quality, dataset_id, options.verify, options.on_corrupt, duplicates)
    for line in format_quality(report):
        logger.info(line)
    duplicates.log(logger)
    splits = {
        split: SplitInfo(tuple(results[shard_name(split, k, len(shards), dataset_id)] for k in range(len(shards))))
        for split, shards in plan.items()
    }
    manifest = Manifest(
        dataset_id=dataset_id,
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        classes=src.classes,
        splits=splits,
        source=src.source.describe(),
        selection={**src.selection, "train_shards": len(plan["train"]), "val_shards": len(plan["val"]),
                   "verify": options.verify, "on_corrupt": options.on_corrupt, "quality": quality_totals(report)},
        feature_keys=FEATURE_KEYS,
        image_form=options.form,
    )
    # The report goes first: a manifest is never visible without the report of its build.
    write_quality_report(storage, report)
    if dest.committed is not None and dest.committed.splits == manifest.splits:
        return dest.committed, splits  # this dataset was committed before; its lost shards are back now
    committed = commit_manifest(storage, manifest, dest.generation)
    if committed is manifest:  # this run committed: the shards of what it replaced (--overwrite) go
        remove_replaced(storage, manifest, dest.objects)
    return committed, splits
