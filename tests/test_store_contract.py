"""The one contract every store is held to, run over a local folder, GCS (fake-gcs-server), S3 (moto), Azure
(Azurite) and HDFS (a MiniDFSCluster) alike, each on an empty folder of a real server: the Storage interface,
conditional writes, the committed-object primitive, shard -> upload -> fetch with a damaged object caught,
a handle pickled to a Spark executor, two concurrent `shard` runs, and training from the store.

What only one store does (S3's server checksums, Azure's credential probe, HDFS's block checksums and extended
attributes, GCS's retries behind a fault proxy) is tested in that store's own module. The servers start once
per session (tests/conftest.py); the HDFS cases are slow (a JVM cluster), like every test of tests/test_hdfs.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from data_util import all_shards
from session_util import executor_env
from spark_imagenet.dataset.cache import fetch
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.dataset.transfer import upload
from spark_imagenet.errors import PreconditionFailed, StorageError
from spark_imagenet.storage import Storage, crc32c_bytes, crc32c_file, open_storage
from spark_imagenet.storage.committed import CommittedSets, Entry, download_verified, local_entries
from spark_imagenet.training.task.staging import fetch_rank


@dataclasses.dataclass(frozen=True)
class Store:
    """One store under test: an empty folder in it, and what the contract needs to know of it.

    Attributes:
        kind: ``"local"``, ``"gcs"``, ``"s3"``, ``"azure"`` or ``"hdfs"``.
        url: the folder (nothing in it yet); the environment variables that reach the server are set for the test.
        rot: flips one byte of object ``name`` (relative to ``url``) where the store keeps it, leaving the
            checksum the store keeps (if any) as it was.
        credentials: what the executors need to reach the store (``spark.executorEnv``), never in a handle.
        stat_crc32c: whether :meth:`Storage.stat` reports the store's own CRC32C (else None).
        list_crc32c: whether :meth:`Storage.list` does.
    """

    kind: str
    url: str
    rot: Callable[[str], None]
    credentials: dict[str, str]
    stat_crc32c: bool
    list_crc32c: bool


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _local(request, tmp_path: Path) -> Store:
    root = tmp_path / "store"
    return Store("local", str(root), lambda name: _flip(root / name), {}, False, False)


def _gcs(request, tmp_path: Path) -> Store:
    bucket, emulator = request.getfixturevalue("gcs_bucket"), request.getfixturevalue("gcs_emulator")
    return Store("gcs", f"gs://{bucket}/t", lambda name: _flip(emulator.object_path(bucket, f"t/{name}")), {},
                 True, True)


def _s3(request, tmp_path: Path) -> Store:
    url, server = request.getfixturevalue("s3_url"), request.getfixturevalue("moto_s3")
    storage = open_storage(url)
    credentials = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    return Store("s3", url, lambda name: server.rot(storage.bucket, storage._key(name)), credentials, True, False)


def _azure(request, tmp_path: Path) -> Store:
    url, server = request.getfixturevalue("az_url"), request.getfixturevalue("azurite")
    storage = open_storage(url)
    credentials = {"AZURE_STORAGE_CONNECTION_STRING": os.environ["AZURE_STORAGE_CONNECTION_STRING"]}
    return Store("azure", url, lambda name: server.rot(storage.container, storage._key(name)), credentials, True,
                 True)


def _hdfs(request, tmp_path: Path) -> Store:
    url = request.getfixturevalue("hdfs_url")
    storage = open_storage(url)

    def rot(name: str) -> None:  # HDFS keeps no file checksum a reader sees: the same bytes, one flipped
        data = bytearray(storage.read_bytes(name))
        data[len(data) // 2] ^= 0xFF
        storage.write_bytes(name, bytes(data))

    return Store("hdfs", url, rot, {}, False, False)


_STORES = {"local": _local, "gcs": _gcs, "s3": _s3, "azure": _azure, "hdfs": _hdfs}


@pytest.fixture(params=["local", "gcs", "s3", "azure", pytest.param("hdfs", marks=pytest.mark.slow)])
def store(request, tmp_path) -> Store:
    """Each store in turn, on an empty folder (a store whose server cannot run here is skipped, saying why)."""
    return _STORES[request.param](request, tmp_path)


# -- the Storage interface --------------------------------------------------------------------------


def test_objects_and_checksums(store):
    """write, read, list, stat (size, CRC32C, generation), delete; the store's own CRC32C where it keeps one;
    a missing object and a name outside the folder are refused, naming them."""
    storage = open_storage(store.url)
    data = {"a.bin": b"alpha" * 1000, "sub/b.bin": b"", "sub/c.bin": bytes(range(256)) * 40}
    for name, content in data.items():
        storage.write_bytes(name, content)
    assert [o.name for o in storage.list()] == sorted(data)
    for name, content in data.items():
        assert storage.read_bytes(name) == content
        info = storage.stat(name)
        assert info is not None and info.size == len(content) and info.generation is not None
        assert info.crc32c == (crc32c_bytes(content) if store.stat_crc32c else None)
        assert storage.crc32c(name) == crc32c_bytes(content)
    assert {o.name: o.crc32c for o in storage.list()} == {
        n: crc32c_bytes(c) if store.list_crc32c else None for n, c in data.items()}
    assert storage.stat("missing.bin") is None and not storage.exists("missing.bin")
    storage.write_bytes("a.bin", b"replaced")  # unconditional replace
    assert storage.read_bytes("a.bin") == b"replaced" and storage.size("a.bin") == 8
    storage.delete("sub/b.bin")
    storage.delete("sub/b.bin")  # deleting what is gone is no error
    assert [o.name for o in storage.list()] == ["a.bin", "sub/c.bin"]
    with pytest.raises(StorageError) as e:
        storage.read_bytes("missing.bin")
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("url", storage.where("missing.bin"))
    with pytest.raises(StorageError) as e:
        storage.write_bytes("../escape", b"x")
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("name", "../escape")


def test_conditional_writes(store):
    """Create-only succeeds once and is refused the second time; compare-and-swap needs the current
    generation, and is refused when the object was deleted since it was read."""
    storage = open_storage(store.url)
    storage.write_bytes("manifest.json", b'{"v": 1}', if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        storage.write_bytes("manifest.json", b'{"v": 2}', if_generation_match=0)
    assert storage.read_bytes("manifest.json") == b'{"v": 1}'
    seen = storage.stat("manifest.json").generation
    storage.write_bytes("manifest.json", b'{"v": 3}', if_generation_match=seen)
    with pytest.raises(PreconditionFailed):  # the generation read before the last write is stale now
        storage.write_bytes("manifest.json", b'{"v": 4}', if_generation_match=seen)
    assert storage.read_bytes("manifest.json") == b'{"v": 3}'
    current = storage.stat("manifest.json").generation
    storage.delete("manifest.json")  # another writer deleted it since it was read
    with pytest.raises(PreconditionFailed):
        storage.write_bytes("manifest.json", b'{"v": 5}', if_generation_match=current)
    assert not storage.exists("manifest.json")


def check_files_and_pickling(storage: Storage, tmp_path: Path) -> None:
    """put_files_info reports each object's size and CRC32C; get_files copies back; a used handle pickles
    without its client and its copy reads the same objects."""
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
    assert copy.url == storage.url and repr(copy) == repr(storage) and copy == storage
    down = tmp_path / "down"
    down.mkdir()
    assert copy.get_files([(f"files/{n}", down / n) for n in names], transfers=3) == [None] * 5
    assert all((down / n).read_bytes() == (local / n).read_bytes() for n in names)


def test_files_and_pickling(store, tmp_path):
    check_files_and_pickling(open_storage(store.url), tmp_path)


# -- the committed-object primitive ---------------------------------------------------------------


def _parse(folder: str, data: bytes, where: str):
    class Marker:
        files = [Entry(*f) for f in json.loads(data)]

    return Marker()


def test_committed_sets(store, tmp_path):
    """A set commits (files verified, marker last) and reads back; committing it again leaves the same objects;
    a byte flipped on the server is caught on download (named, tried twice, never placed). (Skipping intact
    objects on a rerun is the callers' part: see :func:`test_shard_upload_fetch_and_rot`.)"""
    storage = open_storage(store.url)
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

    store.rot("set-1/deep/two.bin")
    bad = tmp_path / "bad"
    with pytest.raises(StorageError) as err:
        download_verified(storage, [(e, bad / e.name) for _p, e in items], prefix="set-1",
                          reference="marker.json")
    assert (err.value.key, err.value.value) == ("url", storage.where("set-1/deep/two.bin"))
    assert str(err.value).count("attempt ") == 2
    assert not (bad / "deep" / "two.bin").exists()
    assert not [p for p in bad.rglob("*") if ".tmp-" in p.name]


# -- the commands on the store (slow: subprocesses, Spark) -------------------------------------------


@pytest.mark.slow
def test_shard_upload_fetch_and_rot(store, tree, local_ds, tmp_path):
    """`shard --out URL` writes straight to the store, a rerun (`spark-imagenet shard`) writes nothing (the
    same listing, generations included: a rewrite changes a GCS generation, an Azure ETag, an HDFS inode id or
    a file's mtime; S3's ETag is the MD5, hence the upload counts); `upload` and `fetch` (the command line, in
    another process) move verified shards; a flipped byte in a shard is caught by fetch, which leaves nothing
    behind."""
    env = dict(os.environ)
    url = f"{store.url}/built"
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
    up_url = f"{store.url}/uploaded"
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
    store.rot(f"uploaded/{victim.name}")
    with pytest.raises(StorageError) as err:
        fetch_rank(open_storage(up_url), 0, 2, tmp_path / "cache0")
    assert type(err.value) is StorageError and err.value.value == open_storage(up_url).where(victim.name)
    assert str(err.value).count("attempt ") == 2
    folder = tmp_path / "cache0" / manifest.dataset_id
    assert not (folder / victim.name).exists()
    assert not [p for p in folder.rglob("*") if ".tmp-" in p.name]


def _read_on_executor(storage: Storage, name: str) -> list:
    return [(os.getpid(), storage.read_bytes(name), storage.stat(name).size)]


@pytest.mark.slow
def test_a_handle_made_on_the_driver_works_on_an_executor(store, spark):
    """A handle used on the driver, pickled into a Spark task, reads there (its client made anew in the Python
    worker, with the endpoint and settings resolved on the driver). Credentials never travel in the handle:
    the executors get their own, here as ``spark.executorEnv`` would give them."""
    import functools

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on the Python workers' path
    storage = open_storage(store.url)
    storage.write_bytes("from-driver", b"driver bytes")
    assert not any(v.encode() in pickle.dumps(storage) for v in store.credentials.values() if len(v) > 8)
    fn = functools.partial(_read_on_executor, storage, "from-driver")
    with executor_env(spark, store.credentials):
        [(pid, data, size)] = spark.sparkContext.parallelize([0], 1).mapPartitions(lambda _it: fn()).collect()
    assert pid != os.getpid() and data == b"driver bytes" and size == 12


def _shard_proc(tree: str, url: str, per_class: int, q) -> None:
    try:
        m = shard(tree, url, train_shards=4, val_shards=2, per_class=per_class, progress=False)
        q.put(("ok", m.dataset_id))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put((type(e).__name__, str(e)))


@pytest.mark.slow
def test_two_concurrent_shard_runs_leave_one_dataset(store, tree, tmp_path):
    """Two `shard` processes started together on one prefix, building different datasets: exactly one commits
    its manifest (the conditional create refuses the other), only its shards remain, and each of them
    matches the manifest."""
    url = f"{store.url}/race"
    outcomes = race_shard_runs(tree, url, (8, 7))
    storage = open_storage(url)
    final = Manifest.load(storage)
    winners = [o for o in outcomes if o[0] == "ok"]
    assert len(winners) == 1 and winners[0][1] == final.dataset_id, outcomes
    loser = next(o for o in outcomes if o[0] != "ok")
    assert loser[0] == "ConfigError" and ("another run committed" in loser[1] or "already holds" in loser[1]), loser
    check_only_its_shards(storage, final, tmp_path / "cache")


def race_shard_runs(tree, url: str, per_class: tuple[int, ...], timeout_s: float = 300) -> list[tuple[str, str]]:
    """Start one `shard` process of ``tree`` into ``url`` per entry of ``per_class`` (images per class: equal
    counts build the same dataset) at once; returns each one's ``("ok", dataset id)`` or ``(error class,
    message)``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_shard_proc, args=(str(tree), url, pc, q)) for pc in per_class]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    return [q.get(timeout=5) for _ in procs]


def check_only_its_shards(storage: Storage, final: Manifest, cache: Path) -> None:
    """The store holds the manifest, the quality report and ``final``'s shards, nothing else, each of them
    matching the manifest."""
    assert sorted(o.name for o in storage.list()) == sorted(
        [MANIFEST_NAME, "quality-report.json"] + [s.name for s in all_shards(final)])
    got = fetch(storage, all_shards(final), cache, dataset_id=final.dataset_id)
    assert got.downloaded == len(all_shards(final))  # every shard present and matching the manifest


#: The smallest AlexNet settings the end-to-end training tests use (tests/test_train_e2e.py).
SMALL_TRAINING = {"batch_size": 4, "image_size": 72, "width": 0.25, "learning_rate": 0.01, "lr_schedule": "constant",
                  "warmup_epochs": 0.0}


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
    assert result.val.images == 12 and [w.rank for w in result.per_worker] == [0, 1]
    assert len(list((tmp_path / "cache").rglob("*.tfrecord"))) == 3
    names = {o.name for o in open_storage(storage_url).list()}
    assert {"run/model.keras", "run/labels.json", "run/results.json"} <= names, sorted(names)
    assert any(n.startswith("ckpt/") for n in names), sorted(names)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["s3", "azure"], indirect=True)
def test_training_reads_and_writes_the_store(store, spark, tree, tmp_path):
    """Training from the store and into it. The other stores train in tests they own already, each a full
    Spark + TensorFlow run not repeated here: a local folder in tests/test_train_e2e.py, GCS there too
    (test_train_from_gs_bucket_on_the_emulator, which reads its data and writes its --output there) and in
    tests/test_checkpoints.py (checkpoints in a bucket), HDFS in tests/test_hdfs.py
    (test_labels_in_s3_sharded_by_spark_into_hdfs_then_training_from_hdfs)."""
    train_from_the_store(spark, store.url, tree, tmp_path, store.credentials)
