"""The storage layer (spark_imagenet.storage): URL parsing in open_storage, LocalStorage on real files,
CRC32C in the form GCS reports it, the batch helpers (_run_parallel, unretryable), and what GCSStorage
does without contacting anything (URL parsing, reopen options, error mapping, the retry reporter).

No mocks: local tests use real files under tmp_path; the gs:// tests stop before a client is created.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_imagenet.errors import AccessError, IntegrityError, PreconditionFailed, StorageError
from spark_imagenet.storage import (
    CHUNK_BYTES,
    GCSStorage,
    LocalStorage,
    ObjectInfo,
    crc32c_bytes,
    crc32c_file,
    open_storage,
    report_retries,
    unretryable,
)
from spark_imagenet.storage.base import _run_parallel


def _files(folder: Path) -> list[str]:
    """Every file under ``folder``, relative, sorted (hidden temp files included)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# -- open_storage -----------------------------------------------------------------------------------


def test_plain_path_opens_local_storage(tmp_path):
    storage = open_storage(tmp_path / "bucket")
    assert isinstance(storage, LocalStorage)
    assert storage.root == tmp_path / "bucket" and storage.url == str(tmp_path / "bucket")
    assert open_storage(str(tmp_path / "bucket")).root == storage.root  # str and PathLike alike
    assert not (tmp_path / "bucket").exists()  # opening creates nothing


def test_relative_path_and_home_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage = open_storage("shards/imagenet")
    assert storage.root == tmp_path / "shards" / "imagenet" and storage.root.is_absolute()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert open_storage("~/ds").root == tmp_path / "home" / "ds"


@pytest.mark.parametrize("prefix", ["file://", "file://localhost", "FILE://"])
def test_file_urls_open_the_local_folder(tmp_path, prefix):
    target = tmp_path / "with space" / "ds"
    storage = open_storage(prefix + str(tmp_path) + "/with%20space/ds")  # percent-escapes decoded
    assert isinstance(storage, LocalStorage) and storage.root == target


def test_file_url_with_a_host_is_refused():
    """Wording test (bucket URLs): the URL, what is wrong with it and what to write."""
    with pytest.raises(StorageError, match=r"^file:// URL with a host is not supported: 'file://server/data'; "
                                           r"use file:///absolute/path$") as e:
        open_storage("file://server/data")
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("url", "file://server/data")


@pytest.mark.parametrize("url, reason", [
    ("", "empty bucket URL"),
    ("ftp://bucket/ds", "unknown URL scheme 'ftp'"),
    ("https://storage.googleapis.com/b/o", "unknown URL scheme 'https'"),
    ("gs:///ds", "no bucket name"),
    ("gs://", "no bucket name"),
    ("gs://bucket/ds?generation=3", "are not allowed"),
    ("gs://bucket/ds#x", "are not allowed"),
    ("gs://bucket/ds?", "are not allowed"),  # an empty query is not silently dropped either
])
def test_bad_urls_are_refused_with_the_reason(url, reason, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    with pytest.raises(StorageError) as e:
        open_storage(url)
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("url", url)
    assert reason in str(e.value)


def test_gs_url_is_parsed_without_contacting_anything(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    storage = open_storage("gs://my-bucket/a/b/")
    assert isinstance(storage, GCSStorage)
    assert (storage.bucket_name, storage.prefix, storage.url) == ("my-bucket", "a/b", "gs://my-bucket/a/b")
    assert storage.endpoint is None and storage.project is None
    assert storage.where("manifest.json") == "gs://my-bucket/a/b/manifest.json"
    assert storage._client is None  # nothing created, nothing contacted
    root = open_storage("gs://my-bucket")
    assert (root.prefix, root.url, root.where("x/y")) == ("", "gs://my-bucket", "gs://my-bucket/x/y")
    assert repr(root) == "GCSStorage('gs://my-bucket')"


@pytest.mark.parametrize("name", ["", "/abs", "../up", "a/../b", "a/.."])
def test_invalid_object_names_are_refused(tmp_path, name, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    for storage in (LocalStorage(tmp_path), GCSStorage("gs://b/p")):
        with pytest.raises(StorageError) as e:
            storage.where(name)
        assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("name", name)
    with pytest.raises(StorageError) as e:
        LocalStorage(tmp_path).write_bytes(name, b"x")
    assert (e.value.key, e.value.value) == ("name", name)
    assert list(tmp_path.iterdir()) == []


def test_gcs_endpoint_from_environment_or_argument(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    assert GCSStorage("gs://b").endpoint == "http://127.0.0.1:4443"  # a bare host:port gets a scheme
    assert GCSStorage("gs://b", endpoint="https://gcs.example:9000").endpoint == "https://gcs.example:9000"
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    assert GCSStorage("gs://b").endpoint is None
    # open_storage drops options given as None, so the constructor's defaults apply
    s = open_storage("gs://b/p", endpoint=None, project=None, page_size=7)
    assert (s.endpoint, s.project, s.page_size) == (None, None, 7)


def test_reopen_options_round_trip(tmp_path, monkeypatch):
    """What reopen_options returns opens the same storage in a process without the driver's environment."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    gcs = open_storage("gs://bkt/ds", project="proj-1")
    opts = gcs.reopen_options()
    assert opts == {"endpoint": "http://127.0.0.1:1", "project": "proj-1"}
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")  # an executor does not have it
    again = open_storage(gcs.url, **opts)
    assert (again.url, again.endpoint, again.project) == (gcs.url, gcs.endpoint, gcs.project)

    local = open_storage(f"file://{tmp_path}/ds")
    assert local.reopen_options() == {}
    assert open_storage(local.url, **local.reopen_options()).root == local.root


def test_a_used_gcs_storage_pickles_without_its_client(gcs_bucket, monkeypatch):
    """A storage handle made once (and used) on the driver, pickled to a process without the driver's
    environment, reaches the same bucket through the same endpoint with a client of its own."""
    import pickle

    gcs = open_storage(f"gs://{gcs_bucket}/ds")
    gcs.write_bytes("a", b"bytes")  # the client now exists
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")  # an executor does not have it
    again = pickle.loads(pickle.dumps(gcs))
    assert (again.url, again.endpoint) == (gcs.url, gcs.endpoint) and again._client is None
    assert again.read_bytes("a") == b"bytes" and gcs.read_bytes("a") == b"bytes"


# -- LocalStorage -----------------------------------------------------------------------------------


def test_write_read_stat_exists_size_crc32c(tmp_path):
    storage = LocalStorage(tmp_path / "b")
    assert storage.stat("x/obj") is None and not storage.exists("x/obj")
    storage.write_bytes("x/obj", b"hello")  # parent folders created
    info = storage.stat("x/obj")
    st = (tmp_path / "b" / "x" / "obj").stat()
    assert info == ObjectInfo("x/obj", 5, None, st.st_mtime_ns)  # local files keep no checksum
    assert storage.exists("x/obj") and storage.size("x/obj") == 5
    assert storage.read_bytes("x/obj") == b"hello"
    assert storage.crc32c("x/obj") == crc32c_bytes(b"hello")
    assert storage.where("x/obj") == str(tmp_path / "b" / "x" / "obj")
    storage.write_bytes("x/obj", b"")  # replaced unconditionally
    assert storage.read_bytes("x/obj") == b"" and storage.size("x/obj") == 0
    assert storage.stat("x") is None and not storage.exists("x")  # a folder is not an object


@pytest.mark.parametrize("call", ["size", "crc32c", "read_bytes"])
def test_missing_object_is_a_storage_error_naming_it(tmp_path, call):
    storage = LocalStorage(tmp_path)
    """Wording test (a missing object): the object's path, then "does not exist"."""
    with pytest.raises(StorageError, match=rf"^{tmp_path / 'nope'} does not exist$") as e:
        getattr(storage, call)("nope")
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("url", str(tmp_path / "nope"))


def test_write_leaves_no_temp_file_and_uses_a_hidden_temp_name_beside_the_target(tmp_path):
    storage = LocalStorage(tmp_path)
    for i in range(3):
        storage.write_bytes("d/obj", bytes([i]) * 1000)
        storage.write_bytes("d/new", b"n", if_generation_match=None)
    assert _files(tmp_path) == ["d/new", "d/obj"]
    # The temp file is renamed into place: it must sit in the same folder (same filesystem: os.replace is
    # atomic), be hidden, and be unique to the writer.
    target = tmp_path / "d" / "obj"
    a, b = storage._tmp(target), storage._tmp(target)
    assert a.parent == target.parent and a != b
    assert a.name.startswith(f".obj.tmp-{os.getpid()}-")


_FAILING_WRITE = r"""
import resource, signal, sys
from spark_imagenet.errors import StorageError
from spark_imagenet.storage import LocalStorage
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG instead
storage = LocalStorage(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    storage.write_bytes("obj", b"N" * 100_000, if_generation_match=None if sys.argv[2] == "none" else 0)
except StorageError as e:
    print("StorageError:", e)
"""


@pytest.mark.parametrize("condition", ["none", "create-only"])
def test_failed_write_keeps_the_old_content_and_leaves_no_temp_file(tmp_path, condition):
    """A write that fails half-way (the disk refuses more bytes: RLIMIT_FSIZE in a real process) never
    replaces the object with a partial file and removes its temp file."""
    storage = LocalStorage(tmp_path)
    storage.write_bytes("obj", b"old content")
    before = storage.stat("obj")
    out = subprocess.run([sys.executable, "-c", _FAILING_WRITE, str(tmp_path), condition],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"StorageError: cannot write {tmp_path / 'obj'}: "), out.stdout
    assert storage.read_bytes("obj") == b"old content"
    assert storage.stat("obj") == before
    assert _files(tmp_path) == ["obj"]


def test_create_only_write(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.write_bytes("m", b"first", if_generation_match=0)  # absent: created
    assert storage.read_bytes("m") == b"first"
    with pytest.raises(PreconditionFailed, match="already exists") as e:
        storage.write_bytes("m", b"second", if_generation_match=0)
    assert type(e.value) is PreconditionFailed and (e.value.key, e.value.value) == ("url", str(tmp_path / "m"))
    assert storage.read_bytes("m") == b"first"
    assert _files(tmp_path) == ["m"]  # the refused write's temp file is gone


def test_compare_and_swap_write(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.write_bytes("m", b"v1")
    g1 = storage.stat("m").generation
    storage.write_bytes("m", b"v2", if_generation_match=g1)  # the generation just read: replaced
    assert storage.read_bytes("m") == b"v2"
    g2 = storage.stat("m").generation
    assert g2 != g1, "a rewrite must change the generation (it is the compare-and-swap token)"
    for name, generation in [("m", g1),  # stale: another write came in between
                             ("m", g2 + 1),  # any other value
                             ("absent", g2)]:  # a generation, but no object
        with pytest.raises(PreconditionFailed, match="changed by another writer") as e:
            storage.write_bytes(name, b"v3", if_generation_match=generation)
        assert type(e.value) is PreconditionFailed and e.value.value == str(tmp_path / name)
    assert storage.read_bytes("m") == b"v2" and not storage.exists("absent")
    assert _files(tmp_path) == ["m"]
    assert issubclass(PreconditionFailed, StorageError)


def test_list_is_sorted_recursive_and_empty_for_a_missing_folder(tmp_path):
    storage = LocalStorage(tmp_path / "b")
    assert storage.list() == []
    for name in ("z", "a/2", "a/1", "m.json"):
        storage.write_bytes(name, name.encode())
    listed = storage.list()
    assert [o.name for o in listed] == ["a/1", "a/2", "m.json", "z"]
    assert [o.size for o in listed] == [3, 3, 6, 1]
    assert all(o == storage.stat(o.name) for o in listed)


def test_delete(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.write_bytes("a", b"1")
    storage.write_bytes("b", b"2")
    storage.delete("a")
    storage.delete("a")  # gone already: no error
    storage.delete("never", best_effort=True)
    storage.delete("b", best_effort=True)
    assert storage.list() == []


def test_put_file_copies_and_move_renames(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    storage = LocalStorage(tmp_path / "b")
    storage.put_file(src, "x/copied")
    assert src.read_bytes() == b"payload" and storage.read_bytes("x/copied") == b"payload"
    storage.put_file(src, "x/moved", move=True)
    assert not src.exists() and storage.read_bytes("x/moved") == b"payload"
    assert _files(tmp_path / "b") == ["x/copied", "x/moved"]
    # publishing a file that already is the object (staged in staging_dir under its name): nothing changes
    storage.put_file(tmp_path / "b" / "x" / "moved", "x/moved", move=True)
    assert storage.read_bytes("x/moved") == b"payload"
    with pytest.raises(StorageError, match="cannot publish") as e:
        storage.put_file(tmp_path / "absent", "y")
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("url", str(tmp_path / "b" / "y"))
    assert not storage.exists("y") and _files(tmp_path / "b") == ["x/copied", "x/moved"]


def test_get_file_overwrites_the_local_copy(tmp_path):
    storage = LocalStorage(tmp_path / "b")
    storage.write_bytes("obj", b"remote")
    dest = tmp_path / "local"
    dest.write_bytes(b"stale and longer")
    storage.get_file("obj", dest)
    assert dest.read_bytes() == b"remote"
    with pytest.raises(StorageError) as e:
        storage.get_file("missing", tmp_path / "other")
    assert (e.value.key, e.value.value) == ("url", str(tmp_path / "b" / "missing"))
    assert not (tmp_path / "other").exists()
    # an object that exists, to a folder that does not: the message names the folder, not the object
    with pytest.raises(StorageError, match=rf"the folder {tmp_path / 'no' / 'such'} does not exist; create it") as e:
        storage.get_file("obj", tmp_path / "no" / "such" / "copy")
    assert (e.value.key, e.value.value) == ("local_path", str(tmp_path / "no" / "such" / "copy"))


@pytest.mark.parametrize("transfers", [1, 4])
def test_put_files_and_get_files_return_one_entry_per_pair(tmp_path, transfers):
    storage = LocalStorage(tmp_path / "b")
    local = tmp_path / "l"
    local.mkdir()
    for i in range(5):
        (local / f"f{i}").write_bytes(f"data {i}".encode())
    pairs = [(local / f"f{i}", f"o{i}") for i in range(5)]
    pairs.insert(2, (local / "missing", "o-missing"))
    results = storage.put_files(pairs, transfers)
    assert len(results) == 6
    assert [r is None for r in results] == [True, True, False, True, True, True]
    assert type(results[2]) is StorageError and results[2].value == str(tmp_path / "b" / "o-missing")
    assert [o.name for o in storage.list()] == [f"o{i}" for i in range(5)]

    back = tmp_path / "back"
    back.mkdir()
    gets = [(f"o{i}", back / f"o{i}") for i in (4, 0)] + [("o-missing", back / "m"), ("o3", back / "o3")]
    results = storage.get_files(gets, transfers)
    assert [r is None for r in results] == [True, True, False, True]
    assert type(results[2]) is StorageError and results[2].value == str(tmp_path / "b" / "o-missing")
    assert {p.name: p.read_bytes() for p in back.iterdir()} == {"o4": b"data 4", "o0": b"data 0", "o3": b"data 3"}
    assert storage.put_files([], transfers) == [] and storage.get_files([], transfers) == []


def test_staging_dir_is_the_root_and_must_be_writable(tmp_path):
    storage = LocalStorage(tmp_path / "new" / "b")
    assert not storage.root_exists()
    assert storage.staging_dir() == tmp_path / "new" / "b"
    assert storage.root_exists() and _files(tmp_path / "new") == []  # the probe is gone
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="cannot create or write") as e:
        LocalStorage(tmp_path / "file" / "sub").staging_dir()
    assert (e.value.key, e.value.value) == ("url", str(tmp_path / "file" / "sub"))


def test_remove_empty_root(tmp_path):
    storage = LocalStorage(tmp_path / "b")
    storage.remove_empty_root()  # missing: nothing to do, no error
    storage.write_bytes("obj", b"x")
    storage.remove_empty_root()
    assert storage.root_exists() and storage.exists("obj")  # not empty: kept
    storage.delete("obj")
    storage.remove_empty_root()
    assert not storage.root_exists() and not (tmp_path / "b").exists()


def test_bucket_defaults_for_remote_storage(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    gcs = GCSStorage("gs://b/p")
    assert gcs.staging_dir() is None and gcs.root_exists() is True
    gcs.remove_empty_root()  # nothing for buckets (and nothing contacted)
    assert gcs._client is None


# -- CRC32C -----------------------------------------------------------------------------------------


def test_crc32c_in_the_form_gcs_reports():
    assert crc32c_bytes(b"") == "AAAAAA=="
    assert crc32c_bytes(b"123456789") == "4waSgw=="  # the CRC32C check value 0xE3069283, big-endian, base64
    assert crc32c_bytes(b"123456780") != crc32c_bytes(b"123456789")


def test_crc32c_file_equals_crc32c_of_its_bytes(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert crc32c_file(empty) == "AAAAAA=="
    data = os.urandom(CHUNK_BYTES + 12345)  # more than one read chunk
    big = tmp_path / "big"
    big.write_bytes(data)
    assert crc32c_file(big) == crc32c_bytes(data)
    assert crc32c_file(str(big)) == crc32c_bytes(data)
    with pytest.raises(FileNotFoundError):
        crc32c_file(tmp_path / "absent")


# -- batch helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("transfers", [1, 3])
def test_run_parallel_returns_each_pairs_outcome_in_order(transfers):
    seen = []

    def fn(a, b):
        seen.append((a, b))
        if a % 2:
            raise ValueError(f"odd {a}")

    results = _run_parallel(fn, [(i, str(i)) for i in range(6)], transfers)
    assert [None if r is None else str(r) for r in results] == [None, "odd 1", None, "odd 3", None, "odd 5"]
    assert sorted(seen) == [(i, str(i)) for i in range(6)]  # every pair called exactly once
    assert _run_parallel(fn, [], transfers) == []


def test_unretryable_nothing_fatal():
    assert unretryable([], "x") is None
    assert unretryable([None, None], "x") is None
    assert unretryable([IntegrityError("mismatch"), None, IntegrityError("again")], "x") is None


def test_unretryable_returns_an_access_error_as_is():
    denied = AccessError("403 on gs://b")
    errors = [StorageError("timeout"), None, IntegrityError("mismatch"), denied, AccessError("second")]
    assert unretryable(errors, "x") is denied


def test_unretryable_counts_other_failures():
    err = unretryable([IntegrityError("mismatch"), None, StorageError("boom"), OSError("disk")],
                      "could not be fetched from gs://b/p")
    assert type(err) is StorageError
    assert str(err) == "2 shard(s) could not be fetched from gs://b/p: boom; disk"


@pytest.mark.parametrize("count, tail", [(5, ""), (6, "; ... and 1 more"), (9, "; ... and 4 more")])
def test_unretryable_lists_at_most_five(count, tail):
    err = unretryable([StorageError(f"e{i}") for i in range(count)] + [IntegrityError("i")], "failed")
    assert str(err) == f"{count} shard(s) failed: e0; e1; e2; e3; e4{tail}"


# -- GCSStorage without a server --------------------------------------------------------------------


def test_gcs_errors_are_mapped_to_what_to_check(monkeypatch):
    """Wording test (store errors): client exceptions become the package's errors, each naming the object
    (``key="url"``) and what to check (no request sent: _error only classifies)."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exceptions
    from google.cloud.storage.exceptions import DataCorruption

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    gcs = GCSStorage("gs://bkt/p")
    what = "gs://bkt/p/obj"
    own = StorageError("already mapped")
    assert gcs._error(own, what) is own
    e = gcs._error(gexc.PreconditionFailed("412"), what, "write")
    assert type(e) is PreconditionFailed and str(e) == f"{what} already exists or was changed by another writer (412)"
    e = gcs._error(gexc.Forbidden("no"), what, "write")
    assert type(e) is AccessError and "403: no" in str(e) and "roles/storage.objectAdmin" in str(e)
    e = gcs._error(gexc.Forbidden("no"), what, "read")
    assert "roles/storage.objectViewer" in str(e) and "gs://bkt" in str(e)
    e = gcs._error(gexc.Unauthorized("expired"), what)
    assert type(e) is AccessError and "401: expired" in str(e)
    e = gcs._error(auth_exceptions.InvalidOperation("Anonymous credentials cannot be refreshed."), what)
    assert type(e) is AccessError and "sent anonymously" in str(e)
    e = gcs._error(DataCorruption(None, "crc mismatch"), what, "read")
    assert type(e) is IntegrityError and "do not match the object's checksum" in str(e)
    e = gcs._error(gexc.ServiceUnavailable("down"), what, "read")
    assert type(e) is StorageError and "read failed after retries (ServiceUnavailable: down)" in str(e)
    e = gcs._error(gexc.RetryError("deadline", cause=gexc.TooManyRequests("slow down")), what, "write")
    assert type(e) is StorageError and "TooManyRequests" in str(e) and "still failing after retrying" in str(e)
    e = gcs._error(gexc.RetryError("deadline", cause=gexc.Forbidden("no")), what, "write")
    assert type(e) is AccessError  # the class of what kept failing survives the retry wrapper
    e = gcs._error(OSError("disk full"), what, "read")
    assert type(e) is StorageError and "local file error during read: disk full" in str(e)
    assert (e.key, e.value) == ("url", what)
    e = gcs._error(gexc.Forbidden("no"), what, "write")
    assert (e.key, e.value) == ("url", what)


@pytest.fixture
def retry_logger():
    """The google.api_core.retry logger with no reporter, restored afterwards."""
    logger = logging.getLogger("google.api_core.retry")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    for h in saved[0]:
        logger.removeHandler(h)
    yield logger
    for h in list(logger.handlers):
        logger.removeHandler(h)
    for h in saved[0]:
        logger.addHandler(h)
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_report_retries_logs_one_short_line_and_installs_once(retry_logger, log_lines):
    report_retries(every=0.0)
    report_retries(every=0.0)  # a second call installs nothing
    from spark_imagenet.storage.gcs import _RetryReporter

    # exactly one reporter (pytest's own capture handlers may sit beside it)
    assert sum(isinstance(h, _RetryReporter) for h in retry_logger.handlers) == 1
    retry_logger.debug("Retrying due to %s, sleeping %.1fs ...", "503 Service Unavailable", 1.3)
    assert log_lines == ["storage: transient error (503 Service Unavailable); retrying with backoff, "
                         "for up to 120 s per call"]


def test_report_retries_rate_limits(retry_logger, log_lines):
    report_retries(every=1e9)  # only the first line can be logged
    for i in range(3):
        retry_logger.debug(f"Retrying due to error {i}, sleeping 1s")
    assert len(log_lines) == 1 and "error 0" in log_lines[0]


def test_report_retries_outlives_the_stream_that_was_stderr_when_installed(retry_logger, monkeypatch, capsys):
    """The command line installs the reporter once per process; a later retry must not write to the
    sys.stderr of that moment (a test's capture, closed since): that raised ValueError out of the client's
    retry loop and failed the retried call."""
    gone = io.StringIO()
    monkeypatch.setattr(sys, "stderr", gone)
    from spark_imagenet import logs

    with logs.console():
        report_retries(every=0.0)
    monkeypatch.undo()
    gone.close()
    with logs.console():
        retry_logger.debug("Retrying due to ConnectionError, sleeping 1s")  # must not raise
    assert "storage: transient error (ConnectionError)" in capsys.readouterr().err
    retry_logger.debug("Retrying due to ConnectionError, sleeping 1s")  # no console, no handler: still no raise


def test_delete_that_fails_is_a_storage_error(tmp_path):
    from spark_imagenet.errors import StorageError
    from spark_imagenet.storage import LocalStorage

    (tmp_path / "a-folder").mkdir()
    for best_effort in (False, True):
        with pytest.raises(StorageError, match="^cannot delete") as e:
            LocalStorage(tmp_path).delete("a-folder", best_effort=best_effort)
        assert (e.value.key, e.value.value) == ("url", str(tmp_path / "a-folder"))


def test_temp_files_of_writes_in_flight_or_killed_are_not_objects(tmp_path):
    """A write killed between its temp file and the rename leaves ``.<name>.tmp-<pid>-<hex>``:
    not an object, so a later build does not take the folder for someone else's files."""
    from spark_imagenet.dataset.transfer import check_destination
    from spark_imagenet.storage import LocalStorage

    storage = LocalStorage(tmp_path)
    (tmp_path / ".manifest.json.tmp-4242-0123abcd").write_bytes(b"{half")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".x.tmp-1-deadbeef").write_bytes(b"")
    assert storage.list() == []
    assert not storage.exists("manifest.json")
    check_destination(storage, "0" * 64, overwrite=False)  # an empty destination: no error
    (tmp_path / ".hidden.tmp-file").write_bytes(b"not ours")  # not our pattern: an object like any other
    assert [o.name for o in storage.list()] == [".hidden.tmp-file"]
