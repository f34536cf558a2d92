"""The committed-object primitive (spark_imagenet.storage.committed), the versioned-JSON envelope
(spark_imagenet.storage.envelope) and the small storage helpers, on real local folders and the fake-gcs
emulator (through the fault proxy, which records every request)."""

from __future__ import annotations

import collections
import json
import pickle
import re
from pathlib import Path

import pytest

from fault_proxy import FaultProxy
from spark_imagenet.errors import ConfigError, ManifestError, StorageError
from spark_imagenet.storage import (
    LocalStorage,
    check_transfers,
    crc32c_bytes,
    crc32c_file,
    open_storage,
    write_json_atomic,
)
from spark_imagenet.storage.committed import (
    CommittedSets,
    Entry,
    download_verified,
    local_entries,
    prune_plan,
    upload_folder,
    upload_verified,
)
from spark_imagenet.storage.envelope import Envelope
from spark_imagenet.training.job import checkpoints as ck
from spark_imagenet.training.job.checkpoints import CheckpointMeta, RunSettings


def files(folder: Path, n: int = 3, size: int = 1000, salt: int = 0) -> list[tuple[str, Entry]]:
    """``n`` local files (one in a subfolder) and their entries."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sub").mkdir(exist_ok=True)
    for i in range(n):
        path = folder / ("sub/f%02d.bin" % i if i == 0 else "f%02d.bin" % i)
        path.write_bytes(bytes((i * 31 + salt + k) % 256 for k in range(size)))
    return local_entries(folder)


def folder_key(name: str) -> int | None:
    """Sets named ``set-N``."""
    return int(name[4:]) if re.fullmatch(r"set-\d+", name) else None


class Marker:
    """A parsed marker: the entries it lists."""

    def __init__(self, files):
        self.files = files


def marker_bytes(items) -> bytes:
    return json.dumps([e._asdict() for _p, e in items]).encode()


def parse(folder: str, data: bytes, where: str) -> Marker | None:
    try:
        return Marker([Entry(**f) for f in json.loads(data)])
    except ValueError:
        return None


# ------------------------------------------------------------------ verified transfers
def test_local_entries_lists_every_file_sorted_with_size_and_crc32c(tmp_path):
    items = files(tmp_path / "a")
    assert [e.name for _p, e in items] == ["f01.bin", "f02.bin", "sub/f00.bin"]
    for path, entry in items:
        assert (entry.size, entry.crc32c) == (1000, crc32c_file(path))
    (tmp_path / "empty").mkdir()
    assert local_entries(tmp_path / "empty") == []
    with pytest.raises(StorageError) as e:
        local_entries(tmp_path / "nope")
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("local_path", str(tmp_path / "nope"))


def test_upload_then_download_verified_round_trip(tmp_path):
    store = LocalStorage(tmp_path / "store")
    items = files(tmp_path / "src")
    infos = upload_verified(store, items, prefix="set-1", transfers=2)
    assert [(i.name, i.size, i.crc32c) for i in infos] == [(f"set-1/{e.name}", e.size, e.crc32c) for _p, e in items]
    seen = []
    download_verified(store, [(e, tmp_path / "dst" / e.name) for _p, e in items], prefix="set-1", transfers=2,
                      on_verified=lambda e, p: seen.append((e.name, p)))
    assert sorted(n for n, _p in seen) == sorted(e.name for _p, e in items)
    for path, entry in items:
        assert (tmp_path / "dst" / entry.name).read_bytes() == Path(path).read_bytes()
    assert not [p for p in (tmp_path / "dst").rglob(".*")]  # no temporary file left


def test_an_upload_that_stays_wrong_is_named_with_both_attempts_and_deleted(log_lines, tmp_path):
    """Wording test (verified transfers): how many, where, each object with every attempt's difference, what
    to do."""
    store = LocalStorage(tmp_path / "store")
    (path_a, a), (path_b, b), _ = files(tmp_path / "src")
    wrong = b._replace(crc32c=crc32c_bytes(b"other"))
    lines = log_lines
    lines.clear()  # the lines from here on
    with pytest.raises(StorageError) as e:
        upload_verified(store, [(path_a, a), (path_b, wrong)], noun="shard", reference="the manifest",
                        uncommitted="nothing was committed", announce=True)
    message = str(e.value)
    assert message.startswith(f"1 shard(s) could not be uploaded intact to {store.url}: {b.name} (attempt 1: the "
                              f"bucket reports crc32c {b.crc32c}, the manifest says {wrong.crc32c}, attempt 2: ")
    assert "Nothing was committed; check the local files and the network, then run again." in message
    assert (e.value.key, e.value.value) == ("url", store.where(b.name))
    assert [line.split(",")[0] for line in lines] == ["uploading 2 shard(s)", "uploading 1 shard(s)"]
    assert [o.name for o in store.list()] == [a.name]


def test_a_download_that_stays_wrong_is_named_and_leaves_nothing(tmp_path):
    store = LocalStorage(tmp_path / "store")
    items = files(tmp_path / "src")
    upload_verified(store, items)
    entry = items[1][1]
    store.write_bytes(entry.name, b"\0" * entry.size)  # replaced after the upload: same size, other bytes
    target = tmp_path / "dst" / entry.name
    with pytest.raises(StorageError) as e:
        download_verified(store, [(entry, target)], reference="the list", remedy="Do something.")
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("url", store.where(entry.name))
    assert str(e.value).count("attempt ") == 2 and str(e.value).endswith(". Do something.")
    assert list((tmp_path / "dst").iterdir()) == []


def test_a_missing_object_is_not_fetched_twice(tmp_path):
    store = LocalStorage(tmp_path / "store")
    with pytest.raises(StorageError, match=r"^1 file\(s\) could not be fetched from ") as e:
        download_verified(store, [(Entry("gone", 1, "AAAAAA=="), tmp_path / "x")])
    assert (e.value.key, e.value.value) == ("url", store.where("gone"))


def test_check_transfers_is_the_one_validator():
    assert check_transfers(3) == 3
    with pytest.raises(ConfigError, match=r"^--transfers 0: must be at least 1$"):  # wording test (--transfers)
        check_transfers(0)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError) as e:
            check_transfers(bad)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("--transfers", bad)
    with pytest.raises(ConfigError) as e:
        check_transfers(0, "upload --jobs")
    assert (e.value.key, e.value.value) == ("upload --jobs", 0)
    with pytest.raises(ConfigError) as e:
        upload_verified(LocalStorage("/nonexistent"), [], transfers=0)
    assert (e.value.key, e.value.value) == ("--transfers", 0)


def test_write_json_atomic(tmp_path):
    target = tmp_path / "new" / "r.json"
    write_json_atomic(target, {"a": [1, 2]}, indent=1)
    assert target.read_text() == '{\n "a": [\n  1,\n  2\n ]\n}\n'
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError) as e:
        write_json_atomic(tmp_path / "file" / "r.json", {})
    assert type(e.value) is StorageError and (e.value.key, e.value.value) == ("url", str(tmp_path / "file" / "r.json"))


# ------------------------------------------------------------------ sets
def test_sets_commit_latest_skip_half_written_and_prune(log_lines, tmp_path):
    sets = CommittedSets(LocalStorage(tmp_path / "store"), "marker.json", folder_key)
    for n in (1, 2, 3):
        items = files(tmp_path / f"src{n}", salt=n)
        sets.commit(f"set-{n}", items, marker_bytes(items))
    assert sets.latest(parse)[0] == "set-3"
    assert [f for f, _m in sets.complete(parse)] == ["set-3", "set-2", "set-1"]
    sets.storage.delete("set-3/f01.bin")
    sets.storage.write_bytes("set-2/f02.bin", b"short")
    lines = log_lines
    lines.clear()  # the lines from here on
    assert [f for f, _m in sets.complete(parse, announce=True)] == ["set-1"]
    assert lines == [f"skipping the half-written set {sets.storage.where('set-3')}: f01.bin is missing",
                     f"skipping the half-written set {sets.storage.where('set-2')}: f02.bin holds 5 bytes, "
                     "marker.json says 1000"]
    # a temporary file a killed writer left in a folder being pruned goes with it
    (tmp_path / "store" / "set-2" / ".f01.bin.tmp-123-0123abcd").write_bytes(b"x")
    groups = sets.folders()
    states = {f: sets.missing(sets.read_marker(f, parse), objects) is None for f, objects in groups.items()}
    assert states == {"set-1": True, "set-2": False, "set-3": False}
    assert sets.prune(states, 1, groups) == ["set-3", "set-2"]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["set-1"]


def test_a_set_written_again_drops_its_old_marker_first_and_files_it_no_longer_has(tmp_path):
    sets = CommittedSets(LocalStorage(tmp_path / "store"), "marker.json", folder_key)
    items = files(tmp_path / "a", n=3)
    sets.commit("set-1", items, marker_bytes(items))
    fewer = files(tmp_path / "b", n=2, salt=9)
    sets.commit("set-1", fewer, marker_bytes(fewer))
    assert sorted(sets.folders()["set-1"]) == ["f01.bin", "marker.json", "sub/f00.bin"]
    assert [f.crc32c for f in sets.latest(parse)[1].files] == [e.crc32c for _p, e in fewer]


def test_prune_plan_keeps_the_newest_complete_sets():
    states = {"set-1": True, "set-2": False, "set-3": True, "set-4": True}
    assert prune_plan(states, 2, folder_key) == ["set-2", "set-1"]
    assert prune_plan(states, 0, folder_key) == ["set-4", "set-3", "set-2", "set-1"]
    assert prune_plan(states, None, folder_key) == ["set-2"]


def test_sets_are_picklable_and_reopen_the_same_folder(tmp_path):
    sets = CommittedSets(LocalStorage(tmp_path / "store"), "checkpoint.json", ck.folder_epoch, kind="checkpoint")
    again = pickle.loads(pickle.dumps(sets))
    assert (again.storage.url, again.marker, again.key("epoch-000002")) == (sets.storage.url, sets.marker, 2)


def test_upload_folder_for_output(tmp_path):
    store = LocalStorage(tmp_path / "out")
    items = files(tmp_path / "local")
    assert upload_folder(store, tmp_path / "local", prefix="run") == [f"run/{e.name}" for _p, e in items]
    assert store.read_bytes("run/sub/f00.bin") == Path(items[2][0]).read_bytes()


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_output_publish_uploads_the_chiefs_folder_verified(tmp_path, request, where):
    from spark_imagenet.training.job import outputs

    items = files(tmp_path / "local")
    url = str(tmp_path / "out") if where == "local" else f"gs://{request.getfixturevalue('gcs_bucket')}/out"
    store = open_storage(url)
    assert outputs.publish(str(tmp_path / "local"), store) == [e.name for _p, e in items]
    assert [(o.name, o.size, store.crc32c(o.name)) for o in store.list()] == [tuple(e) for _p, e in items]
    with pytest.raises(StorageError, match=rf"^--output {re.escape(url)}: ") as e:
        outputs.publish(str(tmp_path / "nope"), store)
    assert (e.value.key, e.value.value) == ("local_path", str(tmp_path / "nope"))


# ------------------------------------------------------------------ the envelope
DOC = Envelope("spark-imagenet-test", 2, "spark-imagenet test document", error=ManifestError,
               remedy="write it again")


def test_envelope_round_trip_and_errors_naming_the_file():
    text = DOC.dumps({"a": 1, "é": "ü"})
    assert json.loads(text) == {"format": "spark-imagenet-test", "format_version": 2, "a": 1, "é": "ü"}
    assert "ü" in text and text.endswith("\n")
    assert DOC.loads(text, "f.json") == {"a": 1, "é": "ü"}
    cases = [({"format": "other", "format_version": 2}, r"^f.json: not a spark-imagenet test document \(expected "
                                                        r"\"format\": \"spark-imagenet-test\"\); write it again$"),
             ({"format": "spark-imagenet-test", "format_version": 3},
              r"^f.json: format_version 3 is not supported by this version of spark-imagenet \(which reads 2\); "
              r"use the version of spark-imagenet that wrote it; write it again$"),
             ({"format": "spark-imagenet-test", "format_version": True}, "format_version True is not supported"),
             ([1], "not a spark-imagenet test document")]
    for data, pattern in cases:
        with pytest.raises(ManifestError, match=pattern):
            DOC.from_json(data, "f.json")
    with pytest.raises(ManifestError, match=r"^g.json: not valid JSON \("):
        DOC.loads("{", "g.json")
    with pytest.raises(ValueError):
        DOC.to_json({"format": "x"})


def test_the_manifest_checkpoint_and_quality_report_share_the_envelope():
    from spark_imagenet.dataset import manifest, report
    from spark_imagenet.training.job import checkpoints

    assert isinstance(manifest.ENVELOPE, Envelope) and manifest.ENVELOPE.error is ManifestError
    assert isinstance(checkpoints.ENVELOPE, Envelope) and checkpoints.ENVELOPE.error is ConfigError
    assert report.QUALITY_REPORT.format == "spark-imagenet-quality-report"


# ------------------------------------------------------------------ request counts against the emulator
SETTINGS = RunSettings(dataset_id="d" * 16, model="alexnet", width=0.25, image_size=96, num_classes=10, workers=2,
                       batch_size=8, seed=3, learning_rate=0.01, epochs=5, optimizer="sgd", precision="float32",
                       lr_schedule="cosine", lr_boundaries=(),
                       warmup_epochs=0.5, lr_scaling="none", momentum=0.9, weight_decay=0.0005, label_smoothing=0.0,
                       flip=True, crop_area=(0.08, 1.0), lighting=0.0)


def object_requests(proxy: FaultProxy) -> collections.Counter:
    """The proxy's requests by kind: uploads, object metadata reads (stat), listings, media reads, deletes;
    the client's one-off bucket-metadata GET and token requests are left out."""
    kinds: collections.Counter = collections.Counter()
    for s in proxy.seen:
        path = s.path.split("?")[0]
        if s.method == "POST" and path.startswith("/upload/"):
            kinds["upload"] += 1
        elif s.method == "GET" and re.fullmatch(r"/storage/v1/b/[^/]+/o", path):
            kinds["list"] += 1
        elif s.method == "GET" and re.fullmatch(r"/storage/v1/b/[^/]+/o/.+", path):
            kinds["media" if "alt=media" in s.path else "stat"] += 1
        elif s.method == "GET" and path.startswith("/download/"):
            kinds["media"] += 1
        elif s.method == "DELETE":
            kinds["delete"] += 1
        elif not re.fullmatch(r"/storage/v1/b/[^/]+", path) and path != "/token":
            kinds[f"{s.method} {path}"] += 1
    return kinds


def test_a_checkpoint_commit_on_gcs_makes_no_request_per_object_after_its_uploads(gcs_bucket, gcs_emulator,
                                                                                   tmp_path, monkeypatch):
    """32 files: one listing, 32 uploads (each verified from its own reply), the meta: 34 requests; the
    loop this replaced also sent a stat per object and a second listing (67)."""
    with FaultProxy(gcs_emulator.endpoint) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        store = open_storage(f"gs://{gcs_bucket}/run/checkpoints")
        local = tmp_path / "tf"
        local.mkdir()
        for i in range(32):
            (local / f"ckpt.data-{i:05d}-of-00032").write_bytes(bytes((i + k) % 256 for k in range(2000)))
        meta = CheckpointMeta.create(SETTINGS, epoch=1, step=12)
        assert ck.commit(store, local, meta, transfers=4) == "epoch-000001"
        assert object_requests(proxy) == {"list": 1, "upload": 33}  # 32 files and checkpoint.json
        name, got = ck.latest(store)
        assert name == "epoch-000001" and len(got.files) == 32
