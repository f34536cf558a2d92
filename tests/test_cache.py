"""The per-host shard cache: verified downloads, reuse, repair, locking."""

from __future__ import annotations

import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path

import pytest

from spark_imagenet.dataset.cache import default_cache_dir, fetch
from spark_imagenet.dataset.manifest import ShardInfo
from spark_imagenet.errors import StorageError
from spark_imagenet.storage import LocalStorage, crc32c_file


class CountingStorage(LocalStorage):
    """A real LocalStorage that records every get_file call (in memory and,
    for calls from other processes, as lines in ``log``)."""

    def __init__(self, root, log: Path | None = None, delay: float = 0.0):
        super().__init__(root)
        self.calls: list[str] = []
        self.log = log
        self.delay = delay

    def get_file(self, name, local_path):
        self.calls.append(name)
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()} {name}\n")
        super().get_file(name, local_path)
        if self.delay:
            time.sleep(self.delay)  # widens the window in which a second process could race


def make_shards(root: Path, count: int = 3, seed: int = 0) -> list[ShardInfo]:
    """Write ``count`` random shard files under ``root`` and describe them."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(count):
        name = f"train-{i:05d}-of-{count:05d}.tfrecord"
        data = rng.randbytes(1000 + 137 * i)
        (root / name).write_bytes(data)
        out.append(ShardInfo(name, 10, len(data), crc32c_file(root / name)))
    return out


@pytest.fixture
def bucket(tmp_path):
    shards = make_shards(tmp_path / "bucket")
    return CountingStorage(tmp_path / "bucket"), shards, tmp_path / "cache"


def test_fetch_copies_into_a_dataset_folder_and_verifies(bucket):
    storage, shards, cache = bucket
    paths = fetch(storage, shards, cache, dataset_id="ds1")
    assert paths == [str(cache / "ds1" / s.name) for s in shards]
    for p, s in zip(paths, shards):
        assert Path(p).read_bytes() == (Path(storage.root) / s.name).read_bytes()
        assert Path(p + ".verified").is_file()
    assert storage.calls == [s.name for s in shards]
    # no temporary files left
    assert not [p for p in (cache / "ds1").iterdir() if ".tmp-" in p.name]


def test_second_fetch_downloads_nothing_and_rehashes_nothing(bucket, monkeypatch):
    storage, shards, cache = bucket
    paths = fetch(storage, shards, cache, dataset_id="ds1")
    before = [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths]
    storage.calls.clear()
    hashed = []
    import spark_imagenet.dataset.cache as cache_mod

    real = cache_mod.crc32c_file
    monkeypatch.setattr(cache_mod, "crc32c_file", lambda p: hashed.append(p) or real(p))
    assert fetch(storage, shards, cache, dataset_id="ds1") == paths
    assert storage.calls == []
    assert hashed == []  # the .verified markers saved the re-hash
    assert [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths] == before


def test_cached_file_without_marker_is_hashed_once_not_downloaded(bucket):
    storage, shards, cache = bucket
    paths = fetch(storage, shards[:1], cache, dataset_id="ds1")
    os.unlink(paths[0] + ".verified")
    storage.calls.clear()
    fetch(storage, shards[:1], cache, dataset_id="ds1")
    assert storage.calls == []
    assert Path(paths[0] + ".verified").is_file()


def test_corrupted_source_shard_is_retried_once_then_named(bucket):
    storage, shards, cache = bucket
    bad = Path(storage.root) / shards[1].name
    data = bytearray(bad.read_bytes())
    data[10] ^= 0xFF  # same size, different content
    bad.write_bytes(bytes(data))
    with pytest.raises(StorageError) as e:
        fetch(storage, shards, cache, dataset_id="ds1")
    assert shards[1].name in str(e.value) and "crc32c" in str(e.value)
    assert storage.calls.count(shards[1].name) == 2
    leftovers = [p.name for p in (cache / "ds1").iterdir() if p.name.startswith(f".{shards[1].name}")
                 or p.name in (shards[1].name, shards[1].name + ".verified")]
    assert leftovers == []


def test_missing_source_shard_is_a_storage_error(bucket):
    storage, shards, cache = bucket
    os.unlink(Path(storage.root) / shards[0].name)
    with pytest.raises(StorageError, match=shards[0].name):
        fetch(storage, shards[:1], cache, dataset_id="ds1")


def test_truncated_cached_file_is_fetched_again(bucket):
    storage, shards, cache = bucket
    paths = fetch(storage, shards, cache, dataset_id="ds1")
    with open(paths[2], "r+b") as f:
        f.truncate(100)
    storage.calls.clear()
    fetch(storage, shards, cache, dataset_id="ds1")
    assert storage.calls == [shards[2].name]
    assert crc32c_file(paths[2]) == shards[2].crc32c


def test_cached_file_rewritten_in_place_is_fetched_again(bucket):
    storage, shards, cache = bucket
    paths = fetch(storage, shards[:1], cache, dataset_id="ds1")
    st = os.stat(paths[0])
    with open(paths[0], "r+b") as f:  # same size, other bytes, marker still there
        f.write(b"\0" * 16)
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    storage.calls.clear()
    fetch(storage, shards[:1], cache, dataset_id="ds1")
    assert storage.calls == [shards[0].name]
    assert crc32c_file(paths[0]) == shards[0].crc32c


def test_half_written_temp_file_is_removed_and_shard_fetched(bucket):
    storage, shards, cache = bucket
    folder = cache / "ds1"
    folder.mkdir(parents=True)
    stale = folder / f".{shards[0].name}.tmp-99999-deadbeef"
    stale.write_bytes(b"partial")
    paths = fetch(storage, shards[:1], cache, dataset_id="ds1")
    assert not stale.exists()
    assert crc32c_file(paths[0]) == shards[0].crc32c


def test_datasets_have_separate_folders(bucket):
    storage, shards, cache = bucket
    a = fetch(storage, shards[:1], cache, dataset_id="ds1")
    b = fetch(storage, shards[:1], cache, dataset_id="ds2")
    assert a != b and Path(a[0]).parent.name == "ds1" and Path(b[0]).parent.name == "ds2"
    c = fetch(storage, shards[:1], cache)  # no dataset id: a folder named after the URL
    assert Path(c[0]).parent.name.startswith("url-")


def test_bad_shard_name_is_refused(bucket):
    storage, shards, cache = bucket
    evil = ShardInfo("../escape.tfrecord", 1, 1, "AAAAAA==")
    with pytest.raises(StorageError, match="not a relative path"):
        fetch(storage, [evil], cache, dataset_id="ds1")


def _fetch_in_child(root, log, cache, shards, out_q):
    storage = CountingStorage(root, log=Path(log), delay=0.3)
    out_q.put(fetch(storage, shards, cache, dataset_id="ds1"))


def test_two_processes_on_one_host_download_each_shard_once(tmp_path):
    shards = make_shards(tmp_path / "bucket", count=2)
    log = tmp_path / "downloads.log"
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_fetch_in_child, args=(str(tmp_path / "bucket"), str(log), str(tmp_path / "cache"),
                                                      shards, q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    downloads = [line.split()[1] for line in log.read_text().splitlines()]
    assert sorted(downloads) == sorted(s.name for s in shards)  # each exactly once


def test_default_cache_dir_follows_spark_local_dirs(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path}/a,{tmp_path}/b")
    assert default_cache_dir() == tmp_path / "a" / "spark-imagenet-cache"
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    assert default_cache_dir() == Path(tempfile.gettempdir()) / "spark-imagenet-cache"


def test_default_cache_dir_outlives_the_spark_application(monkeypatch, tmp_path):
    """Spark's per-application folders (blockmgr-*, YARN appcache) are deleted with the application: the
    cache goes beside them."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path}/local/blockmgr-1234,{tmp_path}/other")
    assert default_cache_dir() == tmp_path / "local" / "spark-imagenet-cache"
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path}/nm/usercache/ann/appcache/application_1_2/blockmgr-9")
    assert default_cache_dir() == tmp_path / "nm" / "usercache" / "ann" / "spark-imagenet-cache"


@pytest.mark.slow
def test_default_cache_dir_in_a_real_spark_task_is_not_the_application_folder(spark):
    """In a task of a real local Spark, SPARK_LOCAL_DIRS is the application's blockmgr folder; the default
    cache is beside it, not inside it."""
    import os

    def probe(_):
        from spark_imagenet.dataset.cache import default_cache_dir

        return os.environ.get("SPARK_LOCAL_DIRS", ""), str(default_cache_dir())

    local_dirs, cache = spark.sparkContext.parallelize([0], 1).map(probe).collect()[0]
    app_dir = Path(local_dirs.split(",")[0])
    assert app_dir.name.startswith("blockmgr-"), local_dirs
    assert Path(cache) == app_dir.parent / "spark-imagenet-cache"


def test_fetch_rank_takes_the_storage_handle_of_a_plan(tmp_path):
    """fetch_rank reads through the Storage it is given (the handle a job's plan carries, pickled as tasks get
    it), not a URL and a dict of options; a URL string is refused, saying what to pass."""
    import pickle

    from bucket_util import make_bucket

    from spark_imagenet.errors import ConfigError
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.task.staging import fetch_rank

    root = make_bucket(tmp_path / "bucket", train=4, val=2)
    handle = pickle.loads(pickle.dumps(open_storage(str(root))))
    train, val = fetch_rank(handle, 1, 2, tmp_path / "cache")
    assert [Path(p).name for p in train] == ["train-00001-of-00004.tfrecord", "train-00003-of-00004.tfrecord"]
    assert [Path(p).name for p in val] == ["val-00001-of-00002.tfrecord"]
    with pytest.raises(ConfigError, match=r"fetch_rank takes the dataset's Storage \(open_storage\(url\)\), got"):
        fetch_rank(str(root), 0, 2, tmp_path / "cache")


def test_temp_files_are_found_per_shard_with_one_listing_per_folder(tmp_path):
    from spark_imagenet.dataset.cache import _temp_files

    a, b = tmp_path / "train-0", tmp_path / "train-0.tmp-x"  # one name runs on past the other's prefix
    sub = tmp_path / "val"
    sub.mkdir()
    c = sub / "val-0"
    names = [".train-0.tmp-1-aaaaaaaa", ".train-0.tmp-2-bbbbbbbb", ".train-0.tmp-x.tmp-3-cccccccc",
             "train-0", ".train-00.tmp-4-dddddddd", ".other.tmp-5-eeeeeeee"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    (sub / ".val-0.tmp-6-ffffffff").write_bytes(b"")
    found = _temp_files([a, b, c])
    assert sorted(p.name for p in found[a]) == [".train-0.tmp-1-aaaaaaaa", ".train-0.tmp-2-bbbbbbbb"]
    assert [p.name for p in found[b]] == [".train-0.tmp-x.tmp-3-cccccccc"]
    assert found[c] == [sub / ".val-0.tmp-6-ffffffff"]
