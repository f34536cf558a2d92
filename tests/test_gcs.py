"""gs:// buckets end to end against a real GCS emulator (fake-gcs-server over
HTTP, the real google-cloud-storage client): upload, fetch, idempotent
reruns, corruption, half-written cache files, paging, missing bucket or
manifest, concurrent writers of one dataset (transfer.py's own logic:
tests/test_transfer.py). The contract every store passes
(tests/test_store_contract.py) runs on GCS too; errors behind a
fault-injecting proxy: tests/test_gcs_faults.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from data_util import all_shards, gcs_generations
from test_store_contract import check_only_its_shards, race_shard_runs
from spark_imagenet.dataset.cache import fetch
from spark_imagenet.training.task.staging import fetch_rank
from spark_imagenet.errors import ConfigError, IntegrityError, ManifestError, StorageError
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.storage import GCSStorage, crc32c_file, open_storage
from spark_imagenet.dataset.transfer import upload


def test_upload_then_fetch_round_trip_is_verified(local_ds, gcs_bucket, tmp_path):
    """Local shards uploaded to the emulator come back byte-identical into the cache, CRC32C-checked."""
    local, manifest = local_ds
    url = f"gs://{gcs_bucket}/imagenet"
    stats = upload(local, url, transfers=4)
    assert (stats.uploaded, stats.skipped, stats.manifest_written) == (6, 0, True)
    assert stats.bytes_uploaded == sum(s.bytes for s in all_shards(manifest))
    remote = open_storage(url)
    assert Manifest.load(remote) == manifest
    for s in all_shards(manifest):  # the bucket's own checksum agrees with the manifest
        assert remote.stat(s.name).crc32c == s.crc32c

    train, val = fetch_rank(open_storage(url), 0, 2, tmp_path / "cache", transfers=4)
    assert train.downloaded == 2 and val.downloaded == 1 and train.reused == 0
    for path in [*train, *val]:
        name = Path(path).name
        assert Path(path).read_bytes() == (local / name).read_bytes()
        assert crc32c_file(path) == next(s.crc32c for s in all_shards(manifest) if s.name == name)


def test_rerun_of_upload_and_fetch_transfers_nothing(local_ds, gcs_bucket, tmp_path):
    """A second upload and a second fetch move no bytes and rewrite no object (same generations)."""
    local, _ = local_ds
    url = f"gs://{gcs_bucket}/ds"
    upload(local, url)
    before = gcs_generations(gcs_bucket, "ds")
    again = upload(local, url)
    assert (again.uploaded, again.bytes_uploaded, again.manifest_written) == (0, 0, False)
    assert again.skipped == 6
    assert gcs_generations(gcs_bucket, "ds") == before

    first = fetch_rank(open_storage(url), 1, 2, tmp_path / "cache")
    second = fetch_rank(open_storage(url), 1, 2, tmp_path / "cache")
    assert sum(r.downloaded for r in first) == 3
    assert sum(r.downloaded for r in second) == 0 and sum(r.bytes_downloaded for r in second) == 0
    assert [list(r) for r in first] == [list(r) for r in second]


def test_corrupt_object_in_emulator_storage_is_detected_and_never_used(local_ds, gcs_bucket, gcs_emulator, tmp_path):
    """Flipping bytes of an object on the emulator's disk makes fetch fail naming the shard; nothing lands in the cache."""
    local, manifest = local_ds
    url = f"gs://{gcs_bucket}/ds"
    upload(local, url)
    victim = manifest.splits["train"].shards[0]  # rank 0's first train shard
    path = gcs_emulator.object_path(gcs_bucket, f"ds/{victim.name}")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    cache = tmp_path / "cache"
    with pytest.raises(StorageError) as err:
        fetch_rank(open_storage(url), 0, 2, cache)
    msg = str(err.value)
    assert victim.name in msg and "attempt 2" in msg  # named, and retried once
    ds_dir = cache / manifest.dataset_id
    assert not (ds_dir / victim.name).exists()
    assert not [p for p in ds_dir.iterdir() if ".tmp-" in p.name]


def test_object_rewritten_with_other_bytes_fails_against_the_manifest(local_ds, gcs_bucket, tmp_path):
    """An object replaced through the API (its own checksum fine) still fails: the manifest's CRC32C decides."""
    local, manifest = local_ds
    url = f"gs://{gcs_bucket}/ds"
    upload(local, url)
    victim = manifest.splits["val"].shards[0]
    good = (local / victim.name).read_bytes()
    open_storage(url).write_bytes(victim.name, good[:-1] + bytes([good[-1] ^ 1]))  # same size
    with pytest.raises(StorageError, match=rf"{victim.name} \(attempt 1: crc32c .* the manifest says {victim.crc32c}"):
        fetch(open_storage(url), [victim], tmp_path / "cache", dataset_id=manifest.dataset_id)
    assert not (tmp_path / "cache" / manifest.dataset_id / victim.name).exists()


def test_half_written_cache_file_is_redone_never_used(local_ds, gcs_bucket, tmp_path):
    """What a killed download can leave (a temp file; a truncated file under the final name, even with an old
    marker) is replaced by a verified download."""
    local, manifest = local_ds
    url = f"gs://{gcs_bucket}/ds"
    upload(local, url)
    storage = open_storage(url)
    shards = manifest.splits["train"].shards[:2]
    cache = tmp_path / "cache"
    first = fetch(storage, shards, cache, dataset_id=manifest.dataset_id)
    a, b = (Path(p) for p in first)
    # a: cut in half under its final name, its .verified marker left from before
    a.write_bytes(a.read_bytes()[: a.stat().st_size // 2])
    # b: same size but garbage (a marker no longer matches: mtime/inode changed)
    b.write_bytes(b"\0" * b.stat().st_size)
    leftover = a.with_name(f".{a.name}.tmp-99999-deadbeef")
    leftover.write_bytes(b"partial")
    again = fetch(storage, shards, cache, dataset_id=manifest.dataset_id)
    assert again.downloaded == 2 and again.reused == 0
    for p, s in zip(again, shards):
        assert crc32c_file(p) == s.crc32c
    assert not leftover.exists()


def _kill_midway(url: str, cache: Path, endpoint: str) -> None:
    """Run `spark-imagenet fetch` and SIGKILL it as soon as a download's temp file appears."""
    env = dict(os.environ, STORAGE_EMULATOR_HOST=endpoint)
    proc = subprocess.Popen([sys.executable, "-m", "spark_imagenet", "fetch", url, "--rank", "0", "--workers", "1",
                             "--cache", str(cache), "--transfers", "1"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if any(".tmp-" in p.name for p in cache.rglob("*")):
                break
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait()


def test_download_killed_midway_is_redone(tmp_path, gcs_bucket, gcs_emulator):
    """A real `spark-imagenet fetch` process killed during a download leaves nothing usable; the next one
    downloads again and verifies."""
    import random

    from spark_imagenet.dataset.manifest import ShardInfo, SplitInfo
    from spark_imagenet.storage import crc32c_bytes
    from spark_imagenet.source.synset import SynsetClass

    # One big train shard (random bytes: the cache never parses shards) so that the kill lands mid-download.
    rng = random.Random(3)
    big = rng.randbytes(48 * 1024 * 1024)
    small = b"val-bytes"
    url = f"gs://{gcs_bucket}/big"
    storage = open_storage(url)
    storage.write_bytes("train-00000-of-00001-00000000.tfrecord", big)
    storage.write_bytes("val-00000-of-00001-00000000.tfrecord", small)
    m = Manifest("big0", "2026-11-30T00:00:00+00:00", (SynsetClass(0, "n00000001", "x"),), {
        "train": SplitInfo((ShardInfo("train-00000-of-00001-00000000.tfrecord", 1, len(big), crc32c_bytes(big)),)),
        "val": SplitInfo((ShardInfo("val-00000-of-00001-00000000.tfrecord", 1, len(small), crc32c_bytes(small)),)),
    })
    m.save(storage)
    cache = tmp_path / "cache"
    _kill_midway(url, cache, gcs_emulator.endpoint)
    final = cache / "big0" / "train-00000-of-00001-00000000.tfrecord"
    assert not final.exists(), "the kill came too late to test anything"  # only a temp file may exist
    train, _val = fetch_rank(open_storage(url), 0, 1, cache)
    assert train.downloaded == 1
    assert crc32c_file(final) == crc32c_bytes(big)
    assert not [p for p in final.parent.iterdir() if ".tmp-" in p.name]


def test_listing_longer_than_one_page(gcs_bucket, gcs_emulator):
    """With 5 objects per page, 23 objects still list completely (and the emulator really pages)."""
    storage = GCSStorage(f"gs://{gcs_bucket}/many", page_size=5)
    names = [f"obj-{i:03d}" for i in range(23)]
    for n in names:
        storage.write_bytes(n, n.encode())
    storage.write_bytes("../outside".replace("../", "x"), b"")  # a sibling under the prefix, listed too
    listed = storage.list()
    assert [o.name for o in listed] == sorted(names + ["xoutside"])
    assert all(o.crc32c for o in listed)
    raw = json.load(urllib.request.urlopen(
        f"{gcs_emulator.endpoint}/storage/v1/b/{gcs_bucket}/o?prefix=many/&maxResults=5"))
    assert len(raw["items"]) == 5 and raw.get("nextPageToken")


def test_missing_bucket_is_a_clear_error(gcs_emulator, monkeypatch, local_ds, tmp_path):
    """A bucket that does not exist is named, with how to create it, for inspect, fetch, upload and shard."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    local, _ = local_ds
    url = "gs://no-such-bucket-here/imagenet"
    for call in (lambda: Manifest.load(open_storage(url)),
                 lambda: fetch_rank(open_storage(url), 0, 1, tmp_path / "cache"),
                 lambda: upload(local, url)):
        with pytest.raises(StorageError, match=r"bucket gs://no-such-bucket-here does not exist.*gcloud storage buckets create"):
            call()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.tfrecord"))


def test_missing_manifest_is_a_clear_error(gcs_bucket, tmp_path):
    """An existing bucket without a dataset says which manifest is missing and how to build one."""
    url = f"gs://{gcs_bucket}/empty"
    with pytest.raises(ManifestError, match=rf"gs://{gcs_bucket}/empty/manifest.json does not exist.*spark-imagenet shard"):
        fetch_rank(open_storage(url), 0, 1, tmp_path / "cache")


def test_two_concurrent_shard_runs_of_the_same_dataset_both_succeed(tree, gcs_bucket, gcs_emulator, tmp_path):
    """Two real `shard` processes started together on one gs:// prefix, building the same dataset: both succeed
    (the one whose manifest commit loses finds the same dataset there) and leave one consistent dataset. (Two
    different datasets, where one run is refused: tests/test_store_contract.py, on every store.)"""
    url = f"gs://{gcs_bucket}/race"
    outcomes = race_shard_runs(tree, url, (8, 8), timeout_s=120)  # STORAGE_EMULATOR_HOST: set by gcs_bucket
    storage = open_storage(url)
    final = Manifest.load(storage)
    winners = [o for o in outcomes if o[0] == "ok"]
    assert len(winners) == 2 and {o[1] for o in winners} == {final.dataset_id}, outcomes
    check_only_its_shards(storage, final, tmp_path / "cache")


def test_overwrite_replaces_a_dataset_and_removes_itsall_shards(tree, gcs_bucket):
    """--overwrite swaps the dataset (compare-and-swap on the manifest) and deletes the replaced shards."""
    url = f"gs://{gcs_bucket}/ow"
    first = shard(tree, url, train_shards=4, val_shards=2, progress=False)
    with pytest.raises(ConfigError, match="already holds a different dataset"):
        shard(tree, url, train_shards=2, val_shards=2, progress=False)
    second = shard(tree, url, train_shards=2, val_shards=2, overwrite=True, progress=False)
    assert second.dataset_id != first.dataset_id
    names = sorted(o.name for o in open_storage(url).list())
    assert names == sorted([MANIFEST_NAME, "quality-report.json"] + [s.name for s in all_shards(second)])


def test_cli_upload_and_fetch(local_ds, gcs_bucket, tmp_path):
    """`spark-imagenet upload` then `fetch --rank --workers --cache` print what they did; paths on stdout."""
    local, manifest = local_ds
    url = f"gs://{gcs_bucket}/cli"
    up = subprocess.run([sys.executable, "-m", "spark_imagenet", "upload", str(local), url, "--transfers", "3"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert "uploaded 6 shard(s)" in up.stderr and f"{url}/manifest.json written" in up.stderr
    fe = subprocess.run([sys.executable, "-m", "spark_imagenet", "fetch", url, "--rank", "1", "--workers", "2",
                         "--cache", str(tmp_path / "c")], capture_output=True, text=True, timeout=120)
    assert fe.returncode == 0, fe.stderr
    paths = fe.stdout.split()
    assert [Path(p).name for p in paths] == [s.name for s in manifest.splits["train"].shards[1::2]] + [
        manifest.splits["val"].shards[1].name]
    assert "downloaded 3" in fe.stderr
    bad = subprocess.run([sys.executable, "-m", "spark_imagenet", "fetch", url, "--rank", "2", "--workers", "2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--rank 2 --workers 2" in bad.stderr and "Traceback" not in bad.stderr


def test_failed_build_to_gs_leaves_the_prefix_empty(tree, gcs_bucket, tmp_path):
    """A build that finds a bad image after some shards were already uploaded removes them: no manifest,
    no shard objects."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tree, src)
    victim = sorted(src.rglob("*.JPEG"))[-1]
    victim.write_bytes(victim.read_bytes()[:200])  # truncated
    url = f"gs://{gcs_bucket}/bad"
    from spark_imagenet.errors import ImageError

    with pytest.raises(ImageError, match=victim.name):
        shard(src, url, train_shards=8, val_shards=2, processes=1, progress=False)
    assert open_storage(url).list() == []


def test_url_mistakes_are_named(local_ds, gcs_bucket):
    """'?'/'#' in a gs:// URL are refused (not silently dropped); a URL naming the manifest itself gets a hint."""
    for bad in (f"gs://{gcs_bucket}/a?v=2", f"gs://{gcs_bucket}/a#b"):
        with pytest.raises(StorageError, match=r"'\?' and '#' are not allowed"):
            open_storage(bad)
    url = f"gs://{gcs_bucket}/ds"
    upload(local_ds[0], url)
    with pytest.raises(ManifestError, match=rf"Give the dataset's folder \({url}\), not its manifest.json"):
        Manifest.load(open_storage(f"{url}/manifest.json"))


def test_dead_endpoint_is_named_after_the_client_gives_up():
    """A refused connection is retried by the client, then reported naming the endpoint and where it came from
    (deadline shortened for the test: the library default is 120 s). In a fresh interpreter: late in the whole
    suite's process the same call once failed with the client's "I/O operation on closed file" instead (not
    reproduced alone; noted in the issue)."""
    import socket

    # a port bound but not listening: refused for sure, and no other test's server can take it meanwhile
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{held.getsockname()[1]}"
        code = ("import sys\nfrom spark_imagenet.storage import GCSStorage\n"
                "from spark_imagenet.dataset.manifest import Manifest\n"
                "from spark_imagenet.errors import StorageError\n"
                f"try:\n    Manifest.load(GCSStorage('gs://bkt/ds', endpoint={endpoint!r}, retry_seconds=2))\n"
                "except StorageError as e:\n    print(e)\n    sys.exit(3)\n")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    msg = p.stdout
    assert p.returncode == 3, p.stdout + p.stderr
    assert f"cannot reach the endpoint {endpoint} (from STORAGE_EMULATOR_HOST or endpoint=)" in msg, msg
    assert "connection refused" in msg and "still failing after retrying with backoff for 2 s" in msg, msg


def test_downloads_read_a_mebibyte_at_a_time_and_stay_byte_identical(gcs_bucket, tmp_path):
    """GCSStorage's downloads make google-cloud-storage read its responses 1 MiB at a time, not its own 8 KiB
    (docs/design.md, 'Storage, checksums and the GCS emulator'); an object of several reads and a size that
    is no multiple of one comes back byte-identical, through get_file, get_files and read_bytes."""
    from google.cloud.storage._media.requests import _request_helpers

    from spark_imagenet.storage.gcs import DOWNLOAD_READ_BYTES

    storage = GCSStorage(f"gs://{gcs_bucket}/reads")
    data = os.urandom(3 * DOWNLOAD_READ_BYTES + 12345)
    storage.write_bytes("obj", data)
    storage.get_file("obj", tmp_path / "one")
    assert _request_helpers._SINGLE_GET_CHUNK_SIZE == DOWNLOAD_READ_BYTES
    assert storage.get_files([("obj", tmp_path / "a"), ("obj", tmp_path / "b")], transfers=2) == [None, None]
    for name in ("one", "a", "b"):
        assert (tmp_path / name).read_bytes() == data
    assert storage.read_bytes("obj") == data


def test_a_read_size_someone_else_set_is_left_alone(monkeypatch):
    """Only the library's own 8 KiB is replaced: a read size a user (or a later release) set stays."""
    from google.cloud.storage._media.requests import _request_helpers

    from spark_imagenet.storage.gcs import DOWNLOAD_READ_BYTES, tune_download_reads

    monkeypatch.setattr(_request_helpers, "_SINGLE_GET_CHUNK_SIZE", 65536)
    assert tune_download_reads() is False
    assert _request_helpers._SINGLE_GET_CHUNK_SIZE == 65536
    monkeypatch.setattr(_request_helpers, "_SINGLE_GET_CHUNK_SIZE", 8192)
    assert tune_download_reads() is True
    assert _request_helpers._SINGLE_GET_CHUNK_SIZE == DOWNLOAD_READ_BYTES


def test_get_files_checks_each_download_in_its_own_thread_while_others_go_on(gcs_bucket, tmp_path):
    """get_files' check follows each download at once, in the thread that made it, with the object's bytes
    already in the closed file: two checks meet at a barrier, which passes only while both run at once
    (checks left for after the batch, one after another, would time out); the exception a check raises
    becomes its pair's result, the other pairs succeed."""
    storage = GCSStorage(f"gs://{gcs_bucket}/checked")
    data = {name: os.urandom(100_000 + i) for i, name in enumerate("abc")}
    for name, payload in data.items():
        storage.write_bytes(name, payload)
    meet, caller, seen = threading.Barrier(2, timeout=30), threading.get_ident(), {}

    def check(name, local_path):
        seen[name] = (Path(local_path).read_bytes() == data[name], threading.get_ident() != caller)
        if name == "c":
            raise IntegrityError("c: wrong bytes")
        meet.wait()

    results = storage.get_files([(n, tmp_path / n) for n in "abc"], transfers=3, check=check)
    assert results[:2] == [None, None]
    assert isinstance(results[2], IntegrityError) and str(results[2]) == "c: wrong bytes"
    assert seen == {n: (True, True) for n in "abc"}


class CorruptingDisk(GCSStorage):
    """The real GCSStorage whose local disk flips one byte of every file it downloads, after the client has
    checked the bytes it received against the object's CRC32C (a bad disk, or a write gone wrong)."""

    def get_file(self, name, local_path):
        super().get_file(name, local_path)
        with open(local_path, "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]))


def test_fetch_verifies_the_file_on_disk_not_only_the_bytes_received(local_ds, gcs_bucket, tmp_path):
    """The cache's own check re-reads each downloaded file from disk: bytes that arrived intact (the client's
    CRC32C check passed) but were changed on the local disk are caught, retried once and named; nothing
    lands in the cache."""
    local, manifest = local_ds
    url = f"gs://{gcs_bucket}/disk"
    upload(local, url)
    victim = manifest.splits["train"].shards[0]
    with pytest.raises(StorageError, match=rf"{victim.name} \(attempt 1: crc32c .* the manifest says "
                                           rf"{victim.crc32c}, attempt 2: crc32c "):
        fetch(CorruptingDisk(url), [victim], tmp_path / "cache", dataset_id=manifest.dataset_id, transfers=2)
    folder = tmp_path / "cache" / manifest.dataset_id
    assert sorted(p.name for p in folder.iterdir()) == [victim.name + ".lock"]
