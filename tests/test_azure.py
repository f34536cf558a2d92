"""What only abfs:// and az:// do, against Azurite's blob service (tests/azurite.py) with the real
azure-storage-blob client: az:// URLs, the CRC32C kept in the blob's metadata, the credential probe that fails
fast, clear errors. The contract every store passes (tests/test_store_contract.py) runs on Azure too. Azurite
starts once per session (tests/conftest.py); without it the tests skip, saying why."""

from __future__ import annotations

import os

import pytest

from spark_imagenet.errors import AccessError, StorageError
from spark_imagenet.storage import open_storage

pytest.importorskip("azure.storage.blob", reason="the azure extra is not installed: pip install '.[test]'")


def test_az_url_names_the_same_blobs(az_url):
    """az://container/prefix takes the account from the connection string and reaches the same objects."""
    storage = open_storage(az_url)
    storage.write_bytes("same", b"1")
    other = open_storage(f"az://{storage.container}/t")
    assert other.read_bytes("same") == b"1" and other.account == storage.account


def test_get_file_checks_the_metadata_crc32c(az_url, azurite, tmp_path):
    from spark_imagenet.errors import IntegrityError

    storage = open_storage(az_url)
    storage.write_bytes("obj", b"0123456789" * 100)
    azurite.rot(storage.container, storage._key("obj"))
    with pytest.raises(IntegrityError, match=r"the downloaded bytes have crc32c .* the blob's metadata says"):
        storage.get_file("obj", tmp_path / "obj")


def test_missing_container_wrong_account_and_bad_key_are_named(azurite, az_url, monkeypatch):
    from azurite import ACCOUNT

    with pytest.raises(AccessError, match=r"container no-such-container does not exist .*az storage container create"):
        open_storage(f"abfs://no-such-container@{ACCOUNT}.dfs.core.windows.net/ds").stat("manifest.json")
    with pytest.raises(AccessError, match=r"AZURE_STORAGE_CONNECTION_STRING is for the account 'devstoreaccount1', "
                                          r"the URL names 'otheraccount'"):
        open_storage("abfs://c@otheraccount.dfs.core.windows.net/ds").list()
    bad = azurite.connection_string.replace("AccountKey=Eby8", "AccountKey=Xby8")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", bad)
    with pytest.raises(AccessError, match=r"credentials were rejected|access denied") as err:
        open_storage(az_url).write_bytes("k", b"v")
    assert "Xby8" not in str(err.value) and "AccountKey" not in str(err.value)


def test_url_forms(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    s = open_storage("abfss://data@acct.dfs.core.windows.net/a/b/")
    assert (s.url, s.container, s.account, s.prefix) == (
        "abfss://data@acct.dfs.core.windows.net/a/b", "data", "acct", "a/b")
    assert s.where("c") == "abfss://data@acct.dfs.core.windows.net/a/b/c"
    with pytest.raises(StorageError, match=r"az://data/x: an az:// URL names no storage account; set "
                                           r"AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_NAME"):
        open_storage("az://data/x")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct2")
    assert open_storage("az://data/x").account == "acct2"
    with pytest.raises(StorageError, match=r"'\?' and '#' are not allowed in a abfs:// URL"):
        open_storage("abfs://data@acct.dfs.core.windows.net/x?sv=1")


def _no_azure_credentials(monkeypatch, tmp_path):
    """No connection string, no service principal, no `az`/`azd`/`pwsh` on PATH, an empty home: nothing for
    DefaultAzureCredential to find (a managed identity endpoint is not reachable here either)."""
    for name in list(os.environ):
        if name.startswith(("AZURE_", "IDENTITY_", "MSI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))


def test_no_credentials_fail_at_once_in_one_message(monkeypatch, tmp_path, caplog, capfd):
    """Without any credential the first request fails in seconds (it retried the whole DefaultAzureCredential
    chain for over 5 minutes before), naming the account, the sources tried and what to set; the Azure SDK's
    multi-line warnings are not shown."""
    import time

    _no_azure_credentials(monkeypatch, tmp_path)
    storage = open_storage("abfs://data@nosuchaccount.dfs.core.windows.net/ds")
    started = time.monotonic()
    with pytest.raises(AccessError) as err:
        storage.stat("manifest.json")
    assert time.monotonic() - started < 20
    message = str(err.value)
    assert message.startswith("abfs://data@nosuchaccount.dfs.core.windows.net/ds: no usable Azure credentials for "
                              "the storage account nosuchaccount"), message
    assert "tried EnvironmentCredential, " in message and "ManagedIdentityCredential" in message
    assert "AzureCliCredential" in message and "\n" not in message
    for fix in ("AZURE_STORAGE_CONNECTION_STRING", "AccountKey=KEY", "`az login`", "managed identity",
                "AZURE_CLIENT_SECRET"):
        assert fix in message
    assert not [r for r in caplog.records if r.name.startswith("azure") and r.levelno >= 30]
    assert "DefaultAzureCredential failed" not in capfd.readouterr().err


def test_a_dead_endpoint_fails_in_seconds(monkeypatch):
    """A connection string whose blob endpoint has nothing listening: a clear error in seconds (86 s of
    retries before), naming the endpoint and the account."""
    import time

    from azurite import ACCOUNT, KEY
    from gcs_emulator import free_port

    port = free_port()  # closed again: nothing listens there
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};"
                       f"AccountKey={KEY};BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")
    storage = open_storage(f"abfs://c@{ACCOUNT}.dfs.core.windows.net/ds")
    started = time.monotonic()
    with pytest.raises(StorageError, match=rf"cannot reach the blob endpoint http://127.0.0.1:{port}/{ACCOUNT} of "
                                           rf"the account {ACCOUNT} \(3 attempts, ServiceRequestError\)"):
        storage.list()
    assert time.monotonic() - started < 15


def test_the_first_request_finds_a_missing_container(azurite, monkeypatch):
    """The probe (one quick request of a new client) names a missing container before a write, which would
    otherwise only get a 404; the service's error codes are compared by their text (not the enum's name)."""
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob._generated.models import StorageErrorCode
    from azurite import ACCOUNT

    from spark_imagenet.storage.azure import error_code

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    storage = open_storage(f"abfs://not-created@{ACCOUNT}.dfs.core.windows.net/ds")
    with pytest.raises(AccessError, match=r"container not-created does not exist"):
        storage.write_bytes("x", b"1")
    e = HttpResponseError("x")
    e.error_code = StorageErrorCode.AUTHENTICATION_FAILED
    assert error_code(e) == "AuthenticationFailed" and error_code(HttpResponseError("x")) == ""
