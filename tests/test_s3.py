"""What only s3:// does, against moto's standalone S3 server (tests/s3_server.py) with the real boto3 client: the
CRC32C the server keeps (trusted or not), clear errors, URLs and reopen options. The contract every store
passes (tests/test_store_contract.py) runs on S3 too. The server starts once per session; it is skipped (with
the reason) where moto is not installed."""

from __future__ import annotations

import pickle

import pytest

from spark_imagenet.errors import AccessError, StorageError
from spark_imagenet.storage import open_storage
from test_store_contract import check_files_and_pickling

boto3 = pytest.importorskip("boto3", reason="the s3 extra (boto3) is not installed: pip install '.[test]'")
from spark_imagenet.storage.s3 import S3Storage  # noqa: E402


def test_server_checksums_off_reads_every_upload_back(s3_url, tmp_path):
    """With server_checksums=False nothing the server reports is trusted: stat has no CRC32C, and an upload is
    verified by reading it back (the option travels with a pickled or reopened copy)."""
    storage = S3Storage(s3_url, server_checksums=False)
    storage.write_bytes("y", b"abc")
    assert storage.stat("y").crc32c is None
    check_files_and_pickling(storage, tmp_path)
    assert open_storage(s3_url, **storage.reopen_options()).server_checksums is False
    assert pickle.loads(pickle.dumps(storage)).server_checksums is False


def test_get_file_checks_the_servers_crc32c(s3_url, moto_s3, tmp_path):
    """A download whose bytes differ from the CRC32C the server keeps is an IntegrityError naming the object."""
    storage = open_storage(s3_url)
    storage.write_bytes("obj", b"0123456789" * 100)
    moto_s3.rot(storage.bucket, storage._key("obj"))
    from spark_imagenet.errors import IntegrityError

    with pytest.raises(IntegrityError) as e:
        storage.get_file("obj", tmp_path / "obj")
    assert type(e.value) is IntegrityError and (e.value.key, e.value.value) == ("url", storage.where("obj"))


def test_missing_bucket_and_bad_credentials_are_named(moto_s3, s3_url, monkeypatch):
    """Wording test (a missing bucket): it says how to create it; refused credentials say what to check and print
    no secret."""
    with pytest.raises(AccessError, match=r"bucket s3://no-such-bucket-here does not exist at the endpoint "
                                          r".*aws s3 mb s3://no-such-bucket-here"):
        open_storage("s3://no-such-bucket-here/ds").stat("manifest.json")
    with pytest.raises(AccessError) as e:
        open_storage("s3://no-such-bucket-here/ds").list()
    assert type(e.value) is AccessError and (e.value.key, e.value.value) == ("url", "s3://no-such-bucket-here")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(AccessError, match=r"no usable AWS credentials .*AWS_ACCESS_KEY_ID") as err:
        open_storage(s3_url).write_bytes("k", b"v")
    assert "testing" not in str(err.value)


def test_dead_endpoint_is_named(monkeypatch):
    from gcs_emulator import free_port
    from s3_server import CREDENTIALS

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    endpoint = f"http://127.0.0.1:{free_port()}"
    storage = S3Storage("s3://bkt/ds", endpoint=endpoint, max_attempts=1)
    with pytest.raises(StorageError, match=rf"cannot reach the endpoint {endpoint} \(from AWS_ENDPOINT_URL"):
        storage.list()


@pytest.mark.parametrize("url, message", [
    ("s3://", r"no bucket name; write s3://BUCKET/PREFIX"),
    ("s3://bkt/a?versionId=3", r"'\?' and '#' are not allowed in a s3:// URL"),
])
def test_bad_urls_are_refused(url, message):
    with pytest.raises(StorageError, match=message):
        open_storage(url)


def test_url_and_reopen_options(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    storage = open_storage("s3://bkt/a/b/")
    assert (storage.url, storage.bucket, storage.prefix) == ("s3://bkt/a/b", "bkt", "a/b")
    assert storage.where("c/d") == "s3://bkt/a/b/c/d"
    opts = storage.reopen_options()
    assert opts["endpoint"] == "http://127.0.0.1:9" and opts["region"] == "eu-west-1"
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert open_storage("s3://bkt/a/b", **opts).endpoint == "http://127.0.0.1:9"
