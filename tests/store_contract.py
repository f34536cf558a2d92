"""The checks every store is held to, run by tests/test_s3.py, test_azure.py and test_hdfs.py against a real
server: the Storage contract, the committed-object primitive, and shard -> fetch of a small dataset.

Each function takes a storage opened on an empty prefix of a real server (and, where it needs one, a way to
damage an object's bytes on the server); the test files start the servers and call these.
"""

from __future__ import annotations

import contextlib

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from data_util import all_shards
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.dataset.transfer import upload
from spark_imagenet.errors import PreconditionFailed, StorageError
from spark_imagenet.storage import Storage, crc32c_bytes, crc32c_file, open_storage
from spark_imagenet.storage.committed import CommittedSets, download_verified, local_entries
from spark_imagenet.training.task.staging import fetch_rank


def objects_and_checksums(storage: Storage) -> None:
    """write, read, list, stat (size, CRC32C), delete; a name outside the prefix is refused."""
    data = {"a.bin": b"alpha" * 1000, "sub/b.bin": b"", "sub/c.bin": bytes(range(256)) * 40}
    for name, content in data.items():
        storage.write_bytes(name, content)
    assert [o.name for o in storage.list()] == sorted(data)
    for name, content in data.items():
        assert storage.read_bytes(name) == content
        info = storage.stat(name)
        assert info is not None and info.size == len(content) and info.generation is not None
        assert storage.crc32c(name) == crc32c_bytes(content)
        if info.crc32c is not None:  # the store's own checksum, where it keeps one, is the same value
            assert info.crc32c == crc32c_bytes(content)
    assert storage.stat("missing.bin") is None and not storage.exists("missing.bin")
    storage.write_bytes("a.bin", b"replaced")  # unconditional replace
    assert storage.read_bytes("a.bin") == b"replaced" and storage.size("a.bin") == 8
    storage.delete("sub/b.bin")
    storage.delete("sub/b.bin")  # deleting what is gone is no error
    assert [o.name for o in storage.list()] == ["a.bin", "sub/c.bin"]
    with pytest.raises(StorageError, match="missing.bin does not exist"):
        storage.read_bytes("missing.bin")
    with pytest.raises(StorageError, match="invalid object name"):
        storage.write_bytes("../escape", b"x")


def conditional_writes(storage: Storage) -> None:
    """Create-only succeeds once and is refused the second time; compare-and-swap needs the current generation."""
    storage.write_bytes("manifest.json", b'{"v": 1}', if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        storage.write_bytes("manifest.json", b'{"v": 2}', if_generation_match=0)
    assert storage.read_bytes("manifest.json") == b'{"v": 1}'
    seen = storage.stat("manifest.json").generation
    storage.write_bytes("manifest.json", b'{"v": 3}', if_generation_match=seen)
    with pytest.raises(PreconditionFailed):  # the generation read before the last write is stale now
        storage.write_bytes("manifest.json", b'{"v": 4}', if_generation_match=seen)
    assert storage.read_bytes("manifest.json") == b'{"v": 3}'


def files_and_pickling(storage: Storage, tmp_path: Path) -> None:
    """put_files_info reports each object's size and CRC32C; get_files copies back; a used handle pickles."""
    local = tmp_path / "up"
    local.mkdir()
    names = [f"f{i}.bin" for i in range(5)]
    for i, n in enumerate(names):
        (local / n).write_bytes(bytes([i]) * (1000 * i + 1))
    infos = storage.put_files_info([(local / n, f"files/{n}") for n in names], transfers=3)
    for n, info in zip(names, infos):
        assert not isinstance(info, BaseException), info
        assert (info.name, info.size, info.crc32c) == (f"files/{n}", (local / n).stat().st_size,
                                                       crc32c_file(local / n))
    copy = pickle.loads(pickle.dumps(storage))  # after use: the client stays behind
    assert copy.url == storage.url and repr(copy) == repr(storage)
    down = tmp_path / "down"
    down.mkdir()
    assert copy.get_files([(f"files/{n}", down / n) for n in names], transfers=3) == [None] * 5
    assert all((down / n).read_bytes() == (local / n).read_bytes() for n in names)


def _parse(folder: str, data: bytes, where: str):
    import json

    from spark_imagenet.storage.committed import Entry

    class Marker:
        files = [Entry(*f) for f in json.loads(data)]

    return Marker()


def committed_sets(storage: Storage, tmp_path: Path, rot: Callable[[str], None]) -> None:
    """A set commits (files verified, marker last) and reads back; committing it again leaves the same objects;
    a byte flipped on the server is caught on download (named, tried twice, never placed). (Skipping intact
    objects on a rerun is the callers' part: see :func:`shard_upload_fetch`.)"""
    import json

    src = tmp_path / "set"
    (src / "deep").mkdir(parents=True)
    (src / "one.bin").write_bytes(b"1" * 3000)
    (src / "deep" / "two.bin").write_bytes(bytes(range(200)) * 50)
    items = local_entries(src)
    marker = json.dumps([list(e) for _p, e in items]).encode()
    sets = CommittedSets(storage, "marker.json", key=lambda f: int(f[4:]) if f.startswith("set-") else None)
    sets.commit("set-1", items, marker)
    folder, listing = sets.latest(_parse)
    assert folder == "set-1" and [tuple(e) for e in listing.files] == [tuple(e) for _p, e in items]
    before = {o.name: o for o in storage.list()}
    sets.commit("set-1", items, marker)  # a rerun: the same objects, nothing left over
    after = {o.name: o for o in storage.list()}
    assert sorted(after) == sorted(before)
    assert all(after[n].size == before[n].size for n in after)

    out = tmp_path / "out"
    download_verified(storage, [(e, out / e.name) for _p, e in items], prefix="set-1")
    assert all((out / e.name).read_bytes() == Path(p).read_bytes() for p, e in items)

    rot("set-1/deep/two.bin")
    bad = tmp_path / "bad"
    with pytest.raises(StorageError) as err:
        download_verified(storage, [(e, bad / e.name) for _p, e in items], prefix="set-1",
                          reference="marker.json")
    assert "deep/two.bin" in str(err.value) and "attempt 2" in str(err.value)
    assert not (bad / "deep" / "two.bin").exists()
    assert not [p for p in bad.rglob("*") if ".tmp-" in p.name]


def shard_upload_fetch(storage_url: str, tree: Path, local_ds, tmp_path: Path,
                       rot: Callable[[str], None], env: dict[str, str]) -> None:
    """`shard --out URL` writes straight to the store, a rerun (`spark-imagenet shard`) writes nothing (the same listing, generations
    included: a rewrite changes an Azure ETag or an HDFS inode id; S3's ETag is the MD5, hence the upload
    counts); `upload` and `fetch` (the command line, in another process) move verified shards; a flipped byte
    in a shard is caught by fetch."""
    url = f"{storage_url}/built"
    m = shard(tree, url, train_shards=4, val_shards=2, progress=False)
    remote = open_storage(url)
    names = sorted([MANIFEST_NAME, "quality-report.json"] + [s.name for s in all_shards(m)])
    assert sorted(o.name for o in remote.list()) == names
    before = remote.list()
    rerun = subprocess.run([sys.executable, "-m", "spark_imagenet", "shard", str(tree), "--out", url, "--train-shards",
                            "4", "--val-shards", "2", "--processes", "1"], capture_output=True, text=True,
                           timeout=300, env=env)  # the command line, in another process
    assert rerun.returncode == 0, rerun.stderr
    assert remote.list() == before and Manifest.load(remote) == m

    local, manifest = local_ds
    up_url = f"{storage_url}/uploaded"
    stats = upload(local, up_url, transfers=3)
    assert (stats.uploaded, stats.skipped, stats.manifest_written) == (6, 0, True)
    again = upload(local, up_url)
    assert (again.uploaded, again.bytes_uploaded, again.manifest_written) == (0, 0, False)
    assert Manifest.load(open_storage(up_url)) == manifest

    fe = subprocess.run([sys.executable, "-m", "spark_imagenet", "fetch", up_url, "--rank", "1", "--workers", "2",
                         "--cache", str(tmp_path / "c")], capture_output=True, text=True, timeout=180, env=env)
    assert fe.returncode == 0, fe.stderr
    paths = fe.stdout.split()
    assert [Path(p).name for p in paths] == [s.name for s in manifest.splits["train"].shards[1::2]] + [
        manifest.splits["val"].shards[1].name]
    for p in paths:
        assert Path(p).read_bytes() == (local / Path(p).name).read_bytes()

    victim = manifest.splits["train"].shards[0]  # rank 0's first train shard
    rot(f"uploaded/{victim.name}")
    with pytest.raises(StorageError) as err:
        fetch_rank(open_storage(up_url), 0, 2, tmp_path / "cache0")
    assert victim.name in str(err.value) and "attempt 2" in str(err.value)
    assert not (tmp_path / "cache0" / manifest.dataset_id / victim.name).exists()


def _read_on_executor(storage: Storage, name: str) -> list:
    import os

    return [(os.getpid(), storage.read_bytes(name), storage.stat(name).size)]


def travels_to_an_executor(spark, storage: Storage, credentials: dict[str, str]) -> None:
    """A handle used on the driver, pickled into a Spark task, reads there (its client made anew in the Python
    worker, with the endpoint and settings resolved on the driver). Credentials never travel in the handle:
    the executors get their own, here as ``spark.executorEnv`` would give them (``credentials``)."""
    import functools
    import os

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on the Python workers' path
    storage.write_bytes("from-driver", b"driver bytes")
    assert not any(v.encode() in pickle.dumps(storage) for v in credentials.values() if len(v) > 8)
    fn = functools.partial(_read_on_executor, storage, "from-driver")
    sc = spark.sparkContext
    saved = dict(sc.environment)
    sc.environment.update(credentials)  # what spark.executorEnv.NAME sets for the Python workers
    try:
        [(pid, data, size)] = sc.parallelize([0], 1).mapPartitions(lambda _it: fn()).collect()
    finally:
        sc.environment.clear()
        sc.environment.update(saved)
    assert pid != os.getpid() and data == b"driver bytes" and size == 12


def _shard_proc(tree: str, url: str, per_class: int, q) -> None:
    try:
        m = shard(tree, url, train_shards=4, val_shards=2, per_class=per_class, progress=False)
        q.put(("ok", m.dataset_id))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put((type(e).__name__, str(e)))


def concurrent_shard_runs(storage_url: str, tree: Path) -> None:
    """Two `shard` processes started together on one prefix, building different datasets: exactly one commits
    its manifest (the conditional create refuses the other), and only its shards remain."""
    import multiprocessing as mp

    url = f"{storage_url}/race"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_shard_proc, args=(str(tree), url, pc, q)) for pc in (8, 7)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    outcomes = [q.get(timeout=5) for _ in procs]
    storage = open_storage(url)
    final = Manifest.load(storage)
    winners = [o for o in outcomes if o[0] == "ok"]
    assert len(winners) == 1 and winners[0][1] == final.dataset_id, outcomes
    loser = next(o for o in outcomes if o[0] != "ok")
    assert loser[0] == "ConfigError" and ("another run committed" in loser[1] or "already holds" in loser[1]), loser
    assert sorted(o.name for o in storage.list()) == sorted(
        [MANIFEST_NAME, "quality-report.json"] + [s.name for s in all_shards(final)])


#: The smallest AlexNet settings the end-to-end training tests use (tests/test_train_e2e.py).
SMALL_TRAINING = {"batch_size": 4, "image_size": 72, "width": 0.25, "learning_rate": 0.01, "lr_schedule": "constant",
                  "warmup_epochs": 0.0}


@contextlib.contextmanager
def executor_env(spark, env: dict[str, str]) -> Iterator[None]:
    """Give the executors' Python workers ``env`` for the block (what ``spark.executorEnv.NAME`` does; a local
    session's workers otherwise keep the environment of the JVM's start, before a test set its variables)."""
    sc = spark.sparkContext
    saved = dict(sc.environment)
    sc.environment.update(env)
    try:
        yield
    finally:
        sc.environment.clear()
        sc.environment.update(saved)


def train_from_the_store(spark, storage_url: str, tree: Path, tmp_path: Path, credentials: dict[str, str],
                         dataset: str | None = None) -> None:
    """One training job on local[2] whose dataset, --checkpoint-dir and --output are all in the store: the tasks
    fetch their shards verified, the chief commits a checkpoint and the model there. ``dataset``: the URL of
    ``tree`` sharded already (None: sharded here into the store)."""
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.job.config import TrainConfig

    url = dataset or f"{storage_url}/train-ds"
    if dataset is None:
        shard(tree, url, train_shards=2, val_shards=1, processes=1, progress=False)
    with executor_env(spark, credentials):
        result = train(spark, url, TrainConfig(workers=2, epochs=1, cache=tmp_path / "cache",
                                               checkpoint_dir=f"{storage_url}/ckpt", output=f"{storage_url}/run",
                                               **SMALL_TRAINING))
    assert result["val"]["images"] == 12 and [w["rank"] for w in result["per_worker"]] == [0, 1]
    assert len(list((tmp_path / "cache").rglob("*.tfrecord"))) == 3
    names = {o.name for o in open_storage(storage_url).list()}
    assert {"run/model.keras", "run/labels.json", "run/results.json"} <= names, sorted(names)
    assert any(n.startswith("ckpt/") for n in names), sorted(names)
