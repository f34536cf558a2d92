"""gs:// error behaviour against a real GCS emulator behind a fault-injecting proxy.

What the storage layer promises (see ``GCSStorage``): transient failures
(429, 5xx, reset connections, truncated bodies) are retried by the client
with backoff until the operation succeeds; a missing bucket, a missing
manifest, a 401 or a 403 fails at once, with a message naming the bucket or
object and what to check. Every test here runs the real
``google-cloud-storage`` client against fake-gcs-server, through
:class:`fault_proxy.FaultProxy`, which forwards requests and injects the
faults; nothing is mocked.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest

from data_util import small_layout
from fault_proxy import FaultProxy
from spark_imagenet.storage import committed
from spark_imagenet.training.task.staging import fetch_rank
from spark_imagenet.errors import ManifestError, StorageError
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.storage import GCSStorage, crc32c_file, open_storage
from spark_imagenet.dataset.transfer import upload

@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, Manifest]:
    """A small dataset built on local disk once: its folder and manifest."""
    root = tmp_path_factory.mktemp("faults")
    out = root / "out"
    shard(small_layout(root / "src"), out, train_shards=4, val_shards=2, processes=2, progress=False)
    return out, Manifest.load(open_storage(out))


@pytest.fixture
def proxy(gcs_emulator):
    """A fault proxy in front of the session's emulator, with no rules yet."""
    with FaultProxy(gcs_emulator.endpoint) as p:
        yield p


def storage_requests(proxy: FaultProxy) -> list:
    """Requests the proxy saw for objects (JSON API, uploads, downloads),
    leaving out token requests and the bucket-metadata GET
    (``/storage/v1/b/NAME?``) that google-cloud-storage 3.x sends from a
    background thread the first time a client touches a bucket."""
    return [s for s in proxy.seen
            if re.match(r"^/(storage|upload|download)/", s.path) and not re.match(r"^/storage/v1/b/[^/?]+\?", s.path)]


def assert_failed_at_once(proxy: FaultProxy, most: int = 1) -> None:
    """No request was retried (each at most ``most`` times): no backoff loop (DEFAULT_RETRY would resend
    for up to 120 s)."""
    seen = storage_requests(proxy)
    assert seen, "the operation sent no request through the proxy"
    repeats = collections.Counter((s.method, s.path) for s in seen)
    assert max(repeats.values()) <= most, f"requests were retried: {repeats}"
    assert len(seen) <= 2 * most, [(s.method, s.path, s.outcome) for s in seen]


def test_round_trip_survives_429_5xx_resets_and_truncation(log_lines, dataset, gcs_bucket, gcs_emulator, proxy, tmp_path,
                                                            monkeypatch):
    """503/429/resets/cut bodies on uploads, listings and downloads: the client retries until the copy is exact."""
    out, manifest = dataset
    # Our own second attempt (committed.ATTEMPTS=2, shared by uploads and downloads) is turned off, so
    # only the client's backoff can absorb the faults.
    monkeypatch.setattr(committed, "ATTEMPTS", 1)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    url = f"gs://{gcs_bucket}/ds"
    b = re.escape(gcs_bucket)

    commit = proxy.add_rule(503, method="POST", path=r"ifGenerationMatch=0")  # the manifest's create-only write
    uploads = [proxy.add_rule(a, method="POST", path=rf"^/upload/storage/v1/b/{b}/o\?") for a in (503, 429, "reset")]
    listing = [proxy.add_rule(a, method="GET", path=rf"^/storage/v1/b/{b}/o\?") for a in (503, "truncate")]
    lines = log_lines
    lines.clear()  # the lines from here on
    stats = upload(out, url, transfers=4)
    for rule in [commit, *uploads, *listing]:
        assert rule.injected == rule.times, rule
    shards = [s for split in manifest.splits.values() for s in split.shards]
    assert stats.uploaded == len(shards) and stats.manifest_written
    assert not [line for line in lines if "(retry)" in line], lines

    # What the bucket holds, read past the proxy: every object as the manifest says.
    direct = open_storage(url, endpoint=gcs_emulator.endpoint)
    listed = {o.name: o for o in direct.list()}
    assert set(listed) == {MANIFEST_NAME, QUALITY_REPORT_NAME} | {s.name for s in shards}
    for s in shards:
        assert (listed[s.name].size, listed[s.name].crc32c) == (s.bytes, s.crc32c)
    assert Manifest.load(direct).dataset_id == manifest.dataset_id

    proxy.clear()
    stat = proxy.add_rule(429, method="GET", path=rf"^/storage/v1/b/{b}/o/ds%2F{MANIFEST_NAME}")
    read = proxy.add_rule("reset", method="GET", path=rf"^/download/storage/v1/b/{b}/o/ds%2F{MANIFEST_NAME}")
    downloads = [proxy.add_rule(a, method="GET", path=rf"^/download/storage/v1/b/{b}/o/ds%2F(train|val)-")
                 for a in (503, 429, "reset", "truncate", 502)]
    train, val = fetch_rank(open_storage(url, endpoint=proxy.url), 0, 1, tmp_path / "cache", transfers=4)
    for rule in [stat, read, *downloads]:
        assert rule.injected == rule.times, rule
    assert train.downloaded + val.downloaded == len(shards)
    by_name = {s.name: s for s in shards}
    for path in [*train, *val]:
        entry = by_name[Path(path).name]
        assert crc32c_file(path) == entry.crc32c
        assert Path(path).read_bytes() == (out / entry.name).read_bytes()
    assert proxy.faults == 7


def test_lost_response_of_the_manifest_commit_is_not_a_conflict(dataset, gcs_bucket, proxy, monkeypatch):
    """A manifest commit whose reply is cut after the write landed is retried (412) and resolves to the same dataset."""
    out, manifest = dataset
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    url = f"gs://{gcs_bucket}/ds"
    commit = proxy.add_rule("truncate", method="POST", path=r"ifGenerationMatch=0")
    stats = upload(out, url)
    assert commit.injected == 1
    assert stats.manifest_written  # recognised as this run's own write, not another run's
    commits = [s for s in proxy.seen if "ifGenerationMatch=0" in s.path]
    assert [s.outcome for s in commits] == ["truncate", 412]  # the retry found its own write
    assert Manifest.load(open_storage(url, endpoint=proxy.url)).dataset_id == manifest.dataset_id


def each_fails_at_once(proxy, calls):
    """Run each call (keyed by the URL its message must name; a trailing space keeps keys distinct);
    check it raised StorageError without retrying; yield (URL, message)."""
    for where, call in calls.items():
        proxy.seen.clear()
        with pytest.raises(StorageError) as err:
            call()
        assert_failed_at_once(proxy)
        yield where.strip(), str(err.value)


def _denied_calls(url, out, proxy, tmp_path):
    """load, fetch_rank and upload through the proxy, keyed by the URL their messages must start with."""
    return {
        f"{url}/{MANIFEST_NAME}": lambda: Manifest.load(open_storage(url, endpoint=proxy.url)),
        f"{url}/{MANIFEST_NAME} ": lambda: fetch_rank(open_storage(url, endpoint=proxy.url), 0, 1,
                                                      tmp_path / "cache"),
        url: lambda: upload(out, url),
    }


def test_401_fails_at_once_naming_the_object_and_the_credentials(dataset, gcs_bucket, proxy, tmp_path, monkeypatch):
    """401 everywhere: load, fetch_rank and upload raise StorageError: 401, the URL, what to check; no retry."""
    url = f"gs://{gcs_bucket}/ds"
    proxy.add_rule(401, times=None)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    for where, message in each_fails_at_once(proxy, _denied_calls(url, dataset[0], proxy, tmp_path)):
        assert message.startswith(where + ":"), message
        assert "401" in message and "credentials" in message
        assert "STORAGE_EMULATOR_HOST" in message  # anonymous credentials: what to check


def test_401_with_refreshable_credentials_refreshes_the_token_then_fails(gcs_bucket, proxy):
    """With OAuth credentials a 401 costs only google-auth's token refreshes, then fails with the 401 message."""
    from google.cloud import storage as gcs
    from google.oauth2.credentials import Credentials

    creds = Credentials(token=None, refresh_token="refresh", token_uri=f"{proxy.url}/token", client_id="id",
                        client_secret="secret")
    client = gcs.Client(project="test", credentials=creds, client_options={"api_endpoint": proxy.url})
    storage = GCSStorage(f"gs://{gcs_bucket}/ds", client=client)
    proxy.add_rule(401, path=r"^/(storage|upload|download)/", times=None)
    with pytest.raises(StorageError) as err:
        Manifest.load(storage)
    message = str(err.value)
    assert message.startswith(f"gs://{gcs_bucket}/ds/{MANIFEST_NAME}: the credentials were rejected (401"), message
    assert "gcloud auth application-default login" in message and "GOOGLE_APPLICATION_CREDENTIALS" in message
    # google-auth resends a request that got 401 after refreshing the token, at most twice; two threads
    # do so here (this call and the client's background bucket-metadata GET), each with its own tokens.
    gets = [s for s in storage_requests(proxy) if s.method == "GET"]
    assert 2 <= len(gets) <= 3 and len({s.path for s in gets}) == 1, gets
    assert len([s for s in proxy.seen if s.path == "/token"]) <= 2 * 3  # 1 + 2 refreshes per thread
    assert_failed_at_once(proxy, most=3)  # no backoff loop on top of the refreshes


def test_403_fails_at_once_naming_the_object_and_the_role(dataset, gcs_bucket, proxy, tmp_path, monkeypatch):
    """403 everywhere: load, fetch_rank and upload raise StorageError: 403, the URL, the role; no retry."""
    url = f"gs://{gcs_bucket}/ds"
    proxy.add_rule(403, times=None)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    for where, message in each_fails_at_once(proxy, _denied_calls(url, dataset[0], proxy, tmp_path)):
        assert message.startswith(where + ": access denied (403"), message
        assert f"on bucket gs://{gcs_bucket};" in message
        assert "roles/storage.objectViewer" in message  # every one of these fails on its first read


def test_403_on_writes_names_the_write_role(dataset, gcs_bucket, proxy, monkeypatch):
    """Reads allowed, writes refused (403): upload fails quickly naming a shard and roles/storage.objectAdmin."""
    out, manifest = dataset
    url = f"gs://{gcs_bucket}/ds"
    proxy.add_rule(403, method="POST", path=r"^/upload/", times=None)
    proxy.add_rule(403, method="DELETE", times=None)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    with pytest.raises(StorageError) as err:
        upload(out, url)
    message = str(err.value)
    assert "access denied (403" in message and "roles/storage.objectAdmin" in message, message
    assert f"{url}/train-" in message or f"{url}/val-" in message
    posts = collections.Counter(s.path for s in proxy.seen if s.method == "POST")
    shards = sum(len(split.shards) for split in manifest.splits.values())
    # A 403 ends the publish at once: each shard's upload is tried once, never retried or backed off.
    assert sum(posts.values()) <= shards
    assert not [s for s in proxy.seen if "ifGenerationMatch=0" in s.path]  # nothing was committed


def test_missing_bucket_fails_at_once_naming_it(dataset, gcs_emulator, proxy, tmp_path, monkeypatch):
    """A bucket that does not exist: load, fetch and upload name gs://BUCKET and how to create it, without retrying."""
    out, _manifest = dataset
    url = "gs://no-such-bucket-for-spark-imagenet/ds"
    calls = [
        lambda: Manifest.load(open_storage(url, endpoint=proxy.url)),
        lambda: fetch_rank(open_storage(url, endpoint=proxy.url), 0, 1, tmp_path / "cache"),
        lambda: upload(out, url),
    ]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    for call in calls:
        proxy.seen.clear()
        with pytest.raises(StorageError) as err:
            call()
        message = str(err.value)
        assert message.startswith("bucket gs://no-such-bucket-for-spark-imagenet does not exist"), message
        assert "gcloud storage buckets create gs://no-such-bucket-for-spark-imagenet" in message
        assert f"Check the name in {url}" in message
        repeats = collections.Counter((s.method, s.path) for s in proxy.seen)
        assert max(repeats.values()) <= 2, repeats  # the bucket GET: at most ours plus the client's background one
        assert all(s.outcome == 404 for s in proxy.seen)


def test_missing_manifest_fails_at_once_saying_how_to_build_it(gcs_bucket, proxy, tmp_path):
    """No manifest.json in the bucket: load and fetch_rank name the manifest URL and how to build one, unretried."""
    url = f"gs://{gcs_bucket}/nothing-here"
    calls = [
        lambda: Manifest.load(open_storage(url, endpoint=proxy.url)),
        lambda: fetch_rank(open_storage(url, endpoint=proxy.url), 0, 1, tmp_path / "cache"),
    ]
    for call in calls:
        proxy.seen.clear()
        with pytest.raises(ManifestError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"{url}/{MANIFEST_NAME} does not exist"), message
        assert "spark-imagenet shard SOURCE --out URL" in message
        assert_failed_at_once(proxy)
