"""What only hdfs:// and webhdfs:// do, against Hadoop's MiniDFSCluster with WebHDFS on (tests/hdfs_cluster.py),
through fsspec's webhdfs client: webhdfs:// URLs and where the HTTP port comes from, temporary files, a block
rotten on a DataNode's disk, the CRC32C kept in an extended attribute, clear errors, and a dataset sharded by
Spark from S3 into HDFS then trained from. The contract every store passes (tests/test_store_contract.py) runs
on HDFS too. The cluster starts once per session (tests/conftest.py; its jars come from Maven, as for the YARN
tests); without Java or Maven the tests skip, saying why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from session_util import executor_env
from spark_imagenet.errors import StorageError
from spark_imagenet.storage import open_storage
from test_store_contract import train_from_the_store

pytest.importorskip("fsspec", reason="the hdfs extra (fsspec) is not installed: pip install '.[test]'")
from spark_imagenet.storage.hdfs import HDFSStorage  # noqa: E402

#: Every test here starts a server or a cluster (seconds to tens of seconds): the slow tier.
pytestmark = pytest.mark.slow


def test_webhdfs_url_names_the_same_files(hdfs_url, mini_dfs):
    """hdfs://host:rpc-port finds WebHDFS's port in $HADOOP_CONF_DIR/hdfs-site.xml; webhdfs://host:http-port
    names it: both reach the same files."""
    storage = open_storage(hdfs_url)
    assert isinstance(storage, HDFSStorage) and storage.http_port == mini_dfs.http_port  # from hdfs-site.xml
    storage.write_bytes("same", b"1")
    other = open_storage(f"webhdfs://127.0.0.1:{mini_dfs.http_port}/{storage.prefix}")
    assert other.read_bytes("same") == b"1"


def test_writes_leave_no_temporary_files_and_folders_tidy(hdfs_url):
    storage = open_storage(hdfs_url)
    storage.write_bytes("d/a", b"a")
    storage.write_bytes("d/a", b"b")
    raw = storage._call("LISTSTATUS", storage._path("d")).json()["FileStatuses"]["FileStatus"]
    assert [s["pathSuffix"] for s in raw] == ["a"]
    storage.delete("d/a")
    storage.tidy("d")
    assert storage._status(storage._path("d")) is None


def test_dead_webhdfs_port_is_named(mini_dfs, monkeypatch):
    from gcs_emulator import free_port

    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    port = free_port()
    storage = HDFSStorage("hdfs://127.0.0.1:8020/x", webhdfs_port=port, retries=0)
    with pytest.raises(StorageError, match=rf"cannot reach WebHDFS at http://127.0.0.1:{port} \(the NameNode's HTTP"):
        storage.list()


def test_url_forms_and_port_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    assert open_storage("hdfs://nn:8020/a/b/").http_port == 9870
    assert open_storage("hdfs://nn/a").where("c") == "hdfs://nn/a/c"
    assert open_storage("webhdfs://nn:50070/a").http_port == 50070
    (tmp_path / "hdfs-site.xml").write_text("<configuration><property><name>dfs.namenode.http-address</name>"
                                            "<value>0.0.0.0:9999</value></property></configuration>")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    s = open_storage("hdfs://nn:8020/a")
    assert s.http_port == 9999 and s.reopen_options()["webhdfs_port"] == 9999
    with pytest.raises(StorageError, match=r"a webhdfs:// URL needs the NameNode's HTTP port"):
        open_storage("webhdfs://nn/a")
    with pytest.raises(StorageError, match=r"no host"):
        open_storage("hdfs:///a")


def _block_file(mini_dfs, data: bytes):
    """The DataNode's file holding ``data`` (one block)."""
    found = [p for p in mini_dfs.blocks.rglob("blk_*") if p.suffix != ".meta" and p.stat().st_size == len(data)
             and p.read_bytes() == data]
    assert len(found) == 1, found
    return found[0]


def test_a_block_rotten_on_the_datanodes_disk_is_caught(hdfs_url, mini_dfs, tmp_path):
    """A byte flipped in a block file on the DataNode's disk: HDFS's own block checksum stops the read, reported
    as an IntegrityError naming the file; the committed-object download retries once, then names it."""
    from spark_imagenet.errors import IntegrityError
    from spark_imagenet.storage.committed import Entry, download_verified
    from spark_imagenet.storage import crc32c_bytes

    storage = open_storage(hdfs_url)
    data = bytes(range(256)) * 512 + b"rot-test"
    storage.write_bytes("shard", data)
    block = _block_file(mini_dfs, data)
    raw = bytearray(block.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    block.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match=rf"{storage.where('shard')}: the DataNode broke off the transfer"):
        storage.get_file("shard", tmp_path / "shard")
    with pytest.raises(StorageError, match=r"shard \(attempt 1: .*attempt 2: "):
        download_verified(storage, [(Entry("shard", len(data), crc32c_bytes(data)), tmp_path / "out" / "shard")])
    assert not (tmp_path / "out" / "shard").exists()


def test_labels_in_s3_sharded_by_spark_into_hdfs_then_training_from_hdfs(hdfs_url, s3_url, spark, tree, tmp_path):
    """A labels file in S3 naming images in S3 (moto), sharded as a Spark job (``shard --labels URL --master``:
    the executors read the images from S3 and write the shards into HDFS), then one training job reading its
    dataset, and writing its checkpoints and model, in HDFS."""
    import csv

    from s3_server import CREDENTIALS
    from spark_imagenet.cli import main
    from spark_imagenet.dataset.manifest import Manifest

    images, cls_loc, rows = open_storage(s3_url), Path(tree) / "ILSVRC" / "Data" / "CLS-LOC", []
    for f in sorted((cls_loc / "train").rglob("*.JPEG")):
        rows.append((f.relative_to(cls_loc).as_posix(), f.parent.name, "train"))
    with open(Path(tree) / "LOC_val_solution.csv") as fh:
        rows += [(f"val/{r['ImageId']}.JPEG", r["PredictionString"].split()[0], "val") for r in csv.DictReader(fh)]
    for rel, _, _ in rows:
        images.write_bytes(rel, (cls_loc / rel).read_bytes())
    images.write_bytes("labels.csv", "".join(f"{a},{b},{c}\n" for a, b, c in [("path", "label", "split"), *rows])
                       .encode())
    dataset = f"{hdfs_url}/from-s3"
    s3_env = {k: os.environ[k] for k in (*CREDENTIALS, "AWS_ENDPOINT_URL")}
    with executor_env(spark, s3_env):
        assert main(["shard", "--labels", f"{s3_url}/labels.csv", "--master", "local[2]", "--out", dataset,
                     "--train-shards", "2", "--val-shards", "1", "--no-progress"]) == 0
    manifest = Manifest.load(open_storage(dataset))
    assert (manifest.splits["train"].examples, manifest.splits["val"].examples) == (32, 12)
    assert manifest.source["path"] == f"{s3_url}/labels.csv" and manifest.source["sharded_by"] == "spark"
    train_from_the_store(spark, hdfs_url, tree, tmp_path, {}, dataset=dataset)


def test_the_crc32c_is_kept_in_an_extended_attribute(hdfs_url):
    """A write records its checked CRC32C in an extended attribute (a rerun's check reads no data); a file
    written by another client has none and is checksummed by reading it."""
    from spark_imagenet.storage import crc32c_bytes
    from spark_imagenet.storage.hdfs import CRC32C_XATTR

    storage = open_storage(hdfs_url)
    storage.write_bytes("ours", b"abc" * 1000)
    assert storage._crc32c_xattr(storage._path("ours")) == crc32c_bytes(b"abc" * 1000)
    assert storage.crc32c("ours") == crc32c_bytes(b"abc" * 1000)
    storage._send(storage._path("theirs"), b"xyz" * 7)  # a plain WebHDFS CREATE, as another client writes
    assert storage._crc32c_xattr(storage._path("theirs")) is None
    assert storage.crc32c("theirs") == crc32c_bytes(b"xyz" * 7)
    raw = storage._call("GETXATTRS", storage._path("ours"), encoding="text").json()["XAttrs"]
    assert [a["name"] for a in raw] == [CRC32C_XATTR]
