"""What the stores share without a server: which class each scheme opens, which URLs count as reachable from
every host (the training preflight's check), and the message when a store's client library is missing."""

from __future__ import annotations

import pickle
import re

import pytest

from spark_imagenet.errors import ConfigError, StorageError
from spark_imagenet.storage import GCSStorage, LocalStorage, is_remote_url, open_storage
from spark_imagenet.storage.remote import etag_generation, generation_etag


@pytest.mark.parametrize("url, cls", [
    ("s3://bkt/ds", "S3Storage"),
    ("abfs://c@acct.dfs.core.windows.net/ds", "AzureStorage"),
    ("abfss://c@acct.dfs.core.windows.net/ds", "AzureStorage"),
    ("hdfs://nn:8020/ds", "HDFSStorage"),
    ("webhdfs://nn:9870/ds", "HDFSStorage"),
    ("gs://bkt/ds", "GCSStorage"),
    ("/data/ds", "LocalStorage"),
])
def test_each_scheme_opens_its_store_and_pickles_before_use(url, cls):
    storage = open_storage(url)
    assert type(storage).__name__ == cls
    copy = pickle.loads(pickle.dumps(storage))
    assert type(copy) is type(storage) and copy.url == storage.url


@pytest.mark.parametrize("url, remote", [
    ("s3://b/p", True), ("abfs://c@a.dfs.core.windows.net/p", True), ("az://c/p", True), ("hdfs://nn/p", True),
    ("webhdfs://nn:1/p", True), ("gs://b/p", True), ("/data/p", False), ("file:///data/p", False), ("rel/p", False),
])
def test_is_remote_url(url, remote):
    assert is_remote_url(url) is remote


def test_the_training_preflight_accepts_every_store_on_a_cluster():
    """A dataset, --output or --checkpoint-dir in any store passes with a cluster master; a local path does not."""
    from spark_imagenet.training.driver.preflight import (
        check_dataset_reachable,
        check_output_reachable,
    )

    for url in ("s3://b/ds", "abfs://c@a.dfs.core.windows.net/ds", "hdfs://nn:8020/ds"):
        assert check_dataset_reachable(url, "spark://host:7077", shared_filesystem=False).level == "ok"
        assert check_output_reachable(url, "yarn", shared_filesystem=False, option="--checkpoint-dir").level == "ok"
    with pytest.raises(ConfigError, match="is a path on the driver's disk"):
        check_dataset_reachable("/data/ds", "spark://host:7077", shared_filesystem=False).raise_if_problem()


@pytest.mark.parametrize("url, module, extra, packages", [
    ("s3://b/p", "boto3", "s3", "boto3"),
    ("abfs://c@a.dfs.core.windows.net/p", "azure.storage.blob", "azure", "azure-storage-blob, azure-identity"),
    ("hdfs://nn:8020/p", "requests", "hdfs", "fsspec, requests")])
def test_a_missing_client_library_names_the_extra_and_its_packages(url, module, extra, packages, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # import fails as if it were not installed
    for name in [n for n in sys.modules if n.startswith("spark_imagenet.storage.") and n.split(".")[-1] in (
            "s3", "azure", "hdfs")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(StorageError, match=rf"{re.escape(url)}: this store needs the '{module}' package: "
                                           rf"pip install '\.\[{extra}\]' in the project's folder \(or 'spark-imagenet\[{extra}\]' "
                                           rf"from a package index\) \(installs {packages}\)"):
        open_storage(url)


def test_the_packages_named_are_those_of_each_extra():
    """STORES (which every message uses) names the packages pyproject.toml's extras install."""
    from pathlib import Path

    import tomllib

    from spark_imagenet.storage import STORES

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    for kind in STORES:
        wanted = project["optional-dependencies"][kind.extra] if kind.extra else project["dependencies"]
        names = {re.split(r"[<>=\[ ]", requirement)[0] for requirement in wanted}
        assert set(kind.packages) <= names, (kind, names)


def test_unknown_scheme_lists_the_stores():
    with pytest.raises(StorageError, match=r"ftp://x/y: unknown URL scheme 'ftp'; give a local path \(or "
                                           r"file:///PATH\), gs://BUCKET/PREFIX, s3://BUCKET/PREFIX, "
                                           r"abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX or "
                                           r"hdfs://NAMENODE:PORT/PATH \(also abfss://, az://, webhdfs://\)"):
        open_storage("ftp://x/y")


def test_every_hint_of_a_url_form_names_every_store(tmp_path):
    """Help texts and error hints take their URL forms from STORES: none names gs:// alone."""
    from spark_imagenet.cli import build_parser
    from spark_imagenet.storage import STORES
    from spark_imagenet.training.driver.preflight import (
        check_dataset_reachable,
        check_output_reachable,
    )
    from spark_imagenet.training.job.outputs import open_output

    texts = []
    for command in ("shard", "upload", "train"):
        parser = build_parser()._subparsers._group_actions[0].choices[command]
        texts += [action.help for action in parser._actions
                  if action.help and any(s in action.help for s in ("gs://", "bucket", "URL", "--out"))
                  and any(o in action.option_strings or action.dest == o
                          for o in ("--out", "dest", "--transfers", "--output", "--checkpoint-dir"))]
    assert len(texts) == 6, texts  # shard --out and --transfers, upload DEST and --transfers, --output, --checkpoint-dir
    for call in (lambda: check_dataset_reachable("/d", "yarn", False).raise_if_problem(),
                 lambda: check_output_reachable("/o", "yarn", False).raise_if_problem(),
                 lambda: open_output(str(tmp_path / "file") + "/x")):
        (tmp_path / "file").write_text("")
        with pytest.raises(ConfigError) as err:
            call()
        texts.append(str(err.value))
    for text in texts:
        assert all(kind.schemes[0] + "://" in text for kind in STORES), text


@pytest.mark.parametrize("etag", ['"5eb63bbbe01eeed093cb22bb8f5acdc3"', '"0x8DC1A2B3C4D5E6F"', '"abc-12"', "x"])
def test_etag_generation_round_trips(etag):
    g = etag_generation(etag)
    assert isinstance(g, int) and g > 0 and generation_etag(g) == etag
    assert etag_generation(None) is None and etag_generation("") is None


def test_local_and_gcs_are_unchanged():
    assert isinstance(open_storage("file:///tmp/x"), LocalStorage)
    assert isinstance(open_storage("gs://b/x"), GCSStorage)


def test_hdfs_errors_are_mapped_to_what_to_check():
    """WebHDFS error replies (no request sent: _error only reads them): WebHDFS answers 403 for most of the
    NameNode's IOExceptions, so only a permission exception (or a bare 401/403) is called access denied."""
    pytest.importorskip("fsspec", reason="the hdfs extra (fsspec) is not installed: pip install '.[test]'")
    from spark_imagenet.errors import AccessError, IntegrityError, PreconditionFailed
    from spark_imagenet.storage.hdfs import HDFSStorage, _Remote

    storage, what = HDFSStorage("hdfs://nn:8020/p", user="u"), "hdfs://nn:8020/p/x"
    e = storage._error(_Remote("FileAlreadyExistsException", "exists", 403), what, "write")
    assert type(e) is PreconditionFailed and str(e) == f"{what} already exists or was changed by another writer"
    e = storage._error(_Remote("AccessControlException", "Permission denied: user=u", 403), what, "write")
    assert type(e) is AccessError and str(e).startswith(f"{what}: access denied (AccessControlException: "
                                                        "Permission denied: user=u). The HDFS user 'u' may not write")
    assert type(storage._error(_Remote("", "Unauthorized", 401), what)) is AccessError
    e = storage._error(_Remote("ChecksumException", "bad block", 403), what, "read")
    assert type(e) is IntegrityError and "HDFS found a block whose bytes do not match its checksum" in str(e)
    e = storage._error(_Remote("SafeModeException", "Name node is in safe mode", 403), what, "write")
    assert type(e) is StorageError and str(e) == f"{what}: write failed (SafeModeException 403: Name node is in safe mode)"
    e = storage._error(_Remote("StandbyException", "Operation category READ is not supported", 403), what, "read")
    assert type(e) is StorageError and str(e).endswith("; nn is a standby NameNode: give the active NameNode in the URL")
    e = storage._error(OSError("disk full"), what, "read")
    assert type(e) is StorageError and str(e) == f"{what}: local file error during read: disk full"
