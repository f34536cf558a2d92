"""Publishing a dataset (spark_imagenet.dataset.transfer): check_destination, publish, commit_manifest,
remove_replaced and upload, between real local folders and against the GCS emulator (fake-gcs-server,
the real google-cloud-storage client; the gcs_bucket fixture). Nothing is mocked."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from pathlib import Path

import pytest

from bucket_util import make_bucket
from data_util import all_shards, gcs_generations
from spark_imagenet.dataset.cache import fetch
from spark_imagenet.dataset.manifest import MANIFEST_NAME, Manifest
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME, partial_name
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.dataset.transfer import (
    PublishStats,
    check_destination,
    commit_manifest,
    publish,
    remove_replaced,
    upload,
)
from spark_imagenet.errors import ConfigError, IntegrityError, ManifestError, StorageError
from spark_imagenet.storage import GCSStorage, LocalStorage, crc32c_bytes, open_storage


@pytest.fixture
def fake_ds(tmp_path):
    """A small dataset of random-bytes shards (bucket_util.make_bucket: 4 train + 1 val): folder, manifest."""
    root = make_bucket(tmp_path / "a", train=4, val=1)
    return root, Manifest.load(LocalStorage(root))


def _state(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: content and st_mtime_ns (LocalStorage's generation)."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- upload, local folder to local folder -----------------------------------------------------------


def test_upload_local_to_local_copies_the_dataset_and_its_report(log_lines, local_ds, tmp_path):
    local, manifest = local_ds
    dest = tmp_path / "dest"
    lines = log_lines
    lines.clear()  # the lines from here on
    stats = upload(local, dest, transfers=3)
    assert (stats.uploaded, stats.skipped, stats.manifest_written) == (6, 0, True)
    assert stats.bytes_uploaded == sum(s.bytes for s in all_shards(manifest))
    assert Manifest.load(LocalStorage(dest)) == manifest
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [MANIFEST_NAME, QUALITY_REPORT_NAME] + [s.name for s in all_shards(manifest)])
    for name in [QUALITY_REPORT_NAME] + [s.name for s in all_shards(manifest)]:
        assert (dest / name).read_bytes() == (local / name).read_bytes()
    assert f"{dest / MANIFEST_NAME} written" in lines[-1] and "uploaded 6 shard(s)" in lines[-1]


def test_upload_rerun_transfers_nothing(log_lines, local_ds, tmp_path):
    """The same upload again rewrites no file (same bytes and mtimes) and reports everything skipped."""
    local, _ = local_ds
    dest = tmp_path / "dest"
    upload(f"file://{local}", f"file://{dest}")  # URLs and paths alike
    before = _state(dest)
    lines = log_lines
    lines.clear()  # the lines from here on
    again = upload(local, dest)
    assert (again.uploaded, again.skipped, again.bytes_uploaded, again.manifest_written) == (0, 6, 0, False)
    assert _state(dest) == before
    dataset_id = Manifest.load(LocalStorage(local)).dataset_id
    assert lines == [f"{dest} already holds this dataset (id {dataset_id}), every shard intact; nothing to do"]


def test_upload_reuploads_a_corrupted_or_missing_destination_object(fake_ds, tmp_path):
    """A destination shard with flipped bytes (same size) and a deleted one are uploaded again, nothing else;
    the committed manifest is left as it is."""
    src, manifest = fake_ds
    dest = tmp_path / "dest"
    upload(src, dest)
    names = [s.name for s in all_shards(manifest)]
    data = bytearray((dest / names[1]).read_bytes())
    data[7] ^= 0x01
    (dest / names[1]).write_bytes(bytes(data))
    (dest / names[3]).unlink()
    before = _state(dest)
    stats = upload(src, dest)
    assert (stats.uploaded, stats.skipped, stats.manifest_written) == (2, 3, False)
    after = _state(dest)
    assert sorted(n for n in after if after[n] != before.get(n)) == sorted([names[1], names[3]])
    for s in all_shards(manifest):
        assert crc32c_bytes((dest / s.name).read_bytes()) == s.crc32c
    assert after[MANIFEST_NAME] == before[MANIFEST_NAME]


def test_upload_resumes_a_run_interrupted_before_the_commit(fake_ds, tmp_path):
    """Shards already there from an interrupted upload (no manifest yet) are skipped; the manifest is written."""
    src, manifest = fake_ds
    dest = tmp_path / "dest"
    dest.mkdir()
    for s in all_shards(manifest)[:3]:
        shutil.copyfile(src / s.name, dest / s.name)
    stats = upload(src, dest)
    assert (stats.uploaded, stats.skipped, stats.manifest_written) == (2, 3, True)
    assert Manifest.load(LocalStorage(dest)) == manifest


def test_upload_refuses_a_different_dataset_unless_overwrite(fake_ds, tmp_path):
    """Another dataset at the destination is named and left untouched; with overwrite it is replaced and
    its shards (and a leftover partial file) removed. Wording test (destinations): the folder, the dataset
    already there and what to do."""
    src, new = fake_ds
    dest = make_bucket(tmp_path / "old", train=3, val=1)
    old = Manifest.load(LocalStorage(dest))
    assert old.dataset_id != new.dataset_id
    (dest / partial_name(all_shards(new)[0].name, "123-abc")).write_bytes(b"half")
    before = _state(dest)
    with pytest.raises(ConfigError, match=rf"upload DEST {dest} already holds a different dataset \(id "
                                          rf"{old.dataset_id}, 2 classes, 15 train images.*pass --overwrite"):
        upload(src, dest)
    assert _state(dest) == before

    stats = upload(src, dest, overwrite=True)
    assert (stats.uploaded, stats.manifest_written) == (5, True)
    assert Manifest.load(LocalStorage(dest)) == new
    assert sorted(p.name for p in dest.iterdir()) == sorted([MANIFEST_NAME] + [s.name for s in all_shards(new)])
    for s in all_shards(new):  # the val shard's name is the same in both datasets: its bytes are the new ones
        assert (dest / s.name).read_bytes() == (src / s.name).read_bytes()


def test_upload_refuses_a_folder_of_other_files_unless_overwrite(fake_ds, tmp_path):
    src, _manifest = fake_ds
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"\(e.g. notes.txt\)") as e:
        upload(src, dest)
    assert type(e.value) is ConfigError and (e.value.key, e.value.value) == ("upload DEST", str(dest))
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt"]
    stats = upload(src, dest, overwrite=True)
    assert stats.manifest_written and (dest / "notes.txt").read_text() == "mine"  # not a shard: kept


def test_upload_checks_its_arguments_before_touching_anything(fake_ds, tmp_path):
    src, _ = fake_ds
    for args, kwargs, key, value in (((src, tmp_path / "d"), {"transfers": 0}, "--transfers", 0),
                                     (("gs://b/ds", tmp_path / "d"), {}, "SOURCE", "gs://b/ds"),  # before any client
                                     ((src, f"file://{src}/"), {}, "DEST", f"file://{src}/")):
        with pytest.raises(ConfigError) as e:
            upload(*args, **kwargs)
        assert type(e.value) is ConfigError and (e.value.key, e.value.value) == (key, value)
    with pytest.raises(ManifestError, match=rf"the dataset folder {tmp_path / 'empty'} does not exist"):
        upload(tmp_path / "empty", tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_upload_refuses_missing_or_resized_localall_shards(fake_ds, tmp_path):
    src, manifest = fake_ds
    first, second = all_shards(manifest)[:2]
    (src / first.name).unlink()
    with open(src / second.name, "ab") as f:
        f.write(b"x")
    with pytest.raises(ManifestError) as err:
        upload(src, tmp_path / "dest")
    msg = str(err.value)
    assert msg.startswith(f"2 local shard(s) in {src} do not match its manifest.json; nothing was uploaded")
    assert f"{src / first.name}: missing" in msg
    assert f"{src / second.name}: {second.bytes + 1} bytes, the manifest says {second.bytes}" in msg
    assert not (tmp_path / "dest").exists()


def test_a_repair_upload_brings_the_quality_report_back_in_line(local_ds, tmp_path):
    """The shard builder's report travels with its shards: a rerun that has shards to upload also replaces
    a destination report that differs from the source's."""
    local, manifest = local_ds
    dest = tmp_path / "dest"
    upload(local, dest)
    (dest / QUALITY_REPORT_NAME).write_text("{}")
    (dest / all_shards(manifest)[0].name).unlink()
    stats = upload(local, dest)
    assert (stats.uploaded, stats.manifest_written) == (1, False)
    assert (dest / QUALITY_REPORT_NAME).read_bytes() == (local / QUALITY_REPORT_NAME).read_bytes()


# -- check_destination ------------------------------------------------------------------------------


def test_check_destination_of_an_empty_or_missing_folder(tmp_path):
    for storage in (LocalStorage(tmp_path / "missing"), LocalStorage(tmp_path)):
        d = check_destination(storage, "id", overwrite=False)
        assert (d.existing, d.generation, d.objects, d.replaced, d.committed) == (None, 0, {}, None, None)
    assert not (tmp_path / "missing").exists()


def test_check_destination_ignores_leftovers_of_a_failed_build(tmp_path):
    """A partial shard file, shard objects and a quality report without a manifest are not 'foreign'."""
    storage = LocalStorage(tmp_path)
    for name in (partial_name("train-00000-of-00002-0123abcd.tfrecord", "1-x"),
                 "val-00001-of-00002-0123abcd.tfrecord", QUALITY_REPORT_NAME):
        storage.write_bytes(name, b"x")
    d = check_destination(storage, "id", overwrite=False)
    assert d.generation == 0 and len(d.objects) == 3
    storage.write_bytes("README", b"x")
    with pytest.raises(ConfigError, match=r"\(e.g. README\)") as e:
        check_destination(storage, "id", overwrite=False)
    assert (e.value.key, e.value.value) == ("--out", str(tmp_path))


def test_check_destination_of_the_same_dataset(fake_ds):
    root, manifest = fake_ds
    storage = LocalStorage(root)
    d = check_destination(storage, manifest.dataset_id, overwrite=False)
    assert d.existing == manifest and d.committed == manifest and d.replaced is None
    assert d.generation == storage.stat(MANIFEST_NAME).generation != 0
    assert set(d.objects) == {MANIFEST_NAME} | {s.name for s in all_shards(manifest)}
    # one shard damaged: not intact (existing None), but still committed (no new manifest needed)
    victim = all_shards(manifest)[0]
    (root / victim.name).write_bytes(b"\0" * victim.bytes)
    d = check_destination(storage, manifest.dataset_id, overwrite=False)
    assert d.existing is None and d.committed == manifest and d.generation != 0


def test_check_destination_of_another_or_an_unreadable_dataset(fake_ds):
    root, manifest = fake_ds
    storage = LocalStorage(root)
    with pytest.raises(ConfigError, match=manifest.dataset_id) as e:
        check_destination(storage, "other-id", overwrite=False)
    assert (e.value.key, e.value.value) == ("--out", str(root))
    d = check_destination(storage, "other-id", overwrite=True)
    assert (d.existing, d.committed, d.replaced) == (None, None, manifest.dataset_id)
    assert d.generation == storage.stat(MANIFEST_NAME).generation
    storage.write_bytes(MANIFEST_NAME, b"{not json")
    with pytest.raises(ConfigError, match="unreadable manifest.json") as e:
        check_destination(storage, manifest.dataset_id, overwrite=False, option="DEST")
    assert (e.value.key, e.value.value) == ("DEST", str(root))
    d = check_destination(storage, manifest.dataset_id, overwrite=True)
    assert d.replaced == "(unreadable manifest)" and d.generation == storage.stat(MANIFEST_NAME).generation


# -- publish ----------------------------------------------------------------------------------------


def test_publish_uploads_verifies_and_skips_what_is_there(fake_ds, tmp_path):
    src, manifest = fake_ds
    dest = LocalStorage(tmp_path / "dest")
    files = [(src / s.name, s) for s in all_shards(manifest)]
    dest.put_file(src / files[0][1].name, files[0][1].name)  # already there, intact
    dest.write_bytes(files[1][1].name, b"wrong")  # there, damaged
    stats = publish(dest, files, transfers=2)  # present=None: publish lists the destination itself
    assert (stats.uploaded, stats.skipped) == (4, 1)
    assert stats.bytes_uploaded == sum(s.bytes for _p, s in files[1:])
    assert not dest.exists(MANIFEST_NAME)  # publish never commits
    for _p, s in files:
        assert dest.crc32c(s.name) == s.crc32c
    assert all(p.exists() for p, _s in files)  # the local files are not changed (copied, not moved)
    again = publish(dest, files, stats=stats)  # counters added to
    assert (again.uploaded, again.skipped) == (4, 6) and again is stats


def test_publish_retries_a_mismatch_once_then_fails_naming_it(log_lines, fake_ds, tmp_path):
    """An object whose bytes do not match its manifest entry is uploaded twice, then deleted and reported."""
    src, manifest = fake_ds
    good, bad = all_shards(manifest)[:2]
    wrong_crc = dataclasses.replace(bad, crc32c=crc32c_bytes(b"something else"))
    wrong_size = dataclasses.replace(all_shards(manifest)[2], bytes=1)
    dest = LocalStorage(tmp_path / "dest")
    lines = log_lines
    lines.clear()  # the lines from here on
    with pytest.raises(StorageError) as err:
        publish(dest, [(src / good.name, good), (src / bad.name, wrong_crc),
                       (src / wrong_size.name, wrong_size)], announce=True)
    msg = str(err.value)
    assert msg.startswith(f"2 shard(s) could not be uploaded intact to {dest.url}: ")
    assert (f"{bad.name} (attempt 1: the bucket reports crc32c {bad.crc32c}, the manifest says "
            f"{wrong_crc.crc32c}, attempt 2: the bucket reports crc32c {bad.crc32c}") in msg
    assert (f"{wrong_size.name} (attempt 1: the bucket holds {all_shards(manifest)[2].bytes} bytes, the manifest "
            "says 1, attempt 2: ") in msg
    assert "Nothing was committed" in msg
    assert [o.name for o in dest.list()] == [good.name]  # the bad objects are deleted again
    assert len(lines) == 2 and lines[1].startswith("uploading 2 shard(s)") and lines[1].endswith("(retry)")


def test_publish_stops_at_once_on_a_failure_that_is_not_a_mismatch(log_lines, fake_ds, tmp_path):
    src, manifest = fake_ds
    a, b = all_shards(manifest)[:2]
    dest = LocalStorage(tmp_path / "dest")
    lines = log_lines
    lines.clear()  # the lines from here on
    with pytest.raises(StorageError, match=rf"^1 shard\(s\) could not be uploaded to {dest.url}; nothing was "
                                           rf"committed \(no manifest written\): cannot publish {tmp_path / 'gone'}"):
        publish(dest, [(src / a.name, a), (tmp_path / "gone", b)], announce=True)
    assert len(lines) == 1  # no second round
    assert not dest.exists(b.name)
    with pytest.raises(ConfigError) as e:
        publish(dest, [(src / a.name, a)], transfers=0)
    assert (e.value.key, e.value.value) == ("--transfers", 0)


def test_publish_stats_rate():
    assert PublishStats().mb_per_sec == 0.0
    assert PublishStats(bytes_uploaded=3_000_000, seconds=0.0).mb_per_sec == 0.0
    assert PublishStats(bytes_uploaded=3_000_000, seconds=2.0).mb_per_sec == 1.5


class _ThreadRecordingLocal(LocalStorage):
    """A real local folder that records, for every stat and checksum, whether the calling thread is the
    main one (publish's own loop) or one of the upload threads."""

    def __init__(self, root):
        super().__init__(root)
        self.calls: list[tuple[str, str, bool]] = []

    def stat(self, name):
        self.calls.append(("stat", name, threading.current_thread() is threading.main_thread()))
        return super().stat(name)

    def crc32c(self, name):
        self.calls.append(("crc32c", name, threading.current_thread() is threading.main_thread()))
        return super().crc32c(name)


def test_publish_checks_local_objects_in_the_upload_threads(fake_ds, tmp_path):
    """Locally, each uploaded object's size and CRC32C are read in the thread that wrote it (one stat and
    one checksum per object), never one after another in publish's loop after the batch."""
    src, manifest = fake_ds
    dest = _ThreadRecordingLocal(tmp_path / "dest")
    files = [(src / s.name, s) for s in all_shards(manifest)]
    stats = publish(dest, files, present={}, transfers=3)
    assert (stats.uploaded, stats.skipped) == (5, 0)
    names = sorted(s.name for _p, s in files)
    assert sorted(n for kind, n, _main in dest.calls if kind == "stat") == names
    assert sorted(n for kind, n, _main in dest.calls if kind == "crc32c") == names
    assert not any(main for _kind, _n, main in dest.calls)


class _LosingLocal(LocalStorage):
    """A real local folder that loses one object's writes (``put_file`` returns, nothing is there)."""

    def __init__(self, root, lost: str):
        super().__init__(root)
        self.lost = lost

    def put_file(self, local_path, name, *, move=False):
        if name != self.lost:
            super().put_file(local_path, name, move=move)


def test_publish_reports_an_object_missing_after_its_upload(fake_ds, tmp_path):
    """An upload that reports success but leaves no object is a mismatch: uploaded once more, then named."""
    src, manifest = fake_ds
    good, lost = all_shards(manifest)[:2]
    dest = _LosingLocal(tmp_path / "dest", lost.name)
    results = dest.put_files_info([(src / good.name, good.name), (src / lost.name, lost.name),
                                   (tmp_path / "gone", "x")], 2)
    assert results[0] == dataclasses.replace(dest.stat(good.name), crc32c=good.crc32c)
    assert isinstance(results[1], IntegrityError) and "not there after the upload" in str(results[1])
    assert isinstance(results[2], StorageError) and not isinstance(results[2], IntegrityError)
    with pytest.raises(StorageError) as err:
        publish(dest, [(src / good.name, good), (src / lost.name, lost)], present={})
    assert (f"1 shard(s) could not be uploaded intact to {dest.url}: {lost.name} (attempt 1: {dest.where(lost.name)}: "
            "the object is not there after the upload, attempt 2: ") in str(err.value)
    assert [o.name for o in dest.list()] == [good.name]


# -- commit_manifest and remove_replaced ------------------------------------------------------------


def test_commit_manifest_create_only_and_compare_and_swap(fake_ds, tmp_path):
    _src, manifest = fake_ds
    dest = LocalStorage(tmp_path / "dest")
    assert commit_manifest(dest, manifest, 0) is manifest
    assert Manifest.load(dest) == manifest
    newer = dataclasses.replace(manifest, dataset_id="newer")
    gen = dest.stat(MANIFEST_NAME).generation
    assert commit_manifest(dest, newer, gen) is newer  # the generation seen: replaced
    assert Manifest.load(dest) == newer


def test_commit_manifest_when_someone_committed_first(log_lines, fake_ds, tmp_path):
    _src, manifest = fake_ds
    dest = LocalStorage(tmp_path / "dest")
    manifest.save(dest)
    # the same manifest (our own write whose reply was lost): accepted as ours
    assert commit_manifest(dest, manifest, 0) is manifest
    # the same dataset written by another run (another build time): theirs is used
    ours = dataclasses.replace(manifest, created="2030-01-01T00:00:00+00:00")
    lines = log_lines
    lines.clear()  # the lines from here on
    assert commit_manifest(dest, ours, 0) == manifest
    assert lines == [(f"another run committed this same dataset (id {manifest.dataset_id}) to {dest.url} first; "
                      "using it")]
    assert Manifest.load(dest) == manifest


def test_commit_manifest_loser_removes_only_its_ownall_shards(fake_ds, tmp_path):
    winner_root, winner = fake_ds
    loser_root = make_bucket(tmp_path / "loser", train=3, val=1)
    loser = Manifest.load(LocalStorage(loser_root))
    dest = LocalStorage(tmp_path / "dest")
    publish(dest, [(winner_root / s.name, s) for s in all_shards(winner)])
    publish(dest, [(loser_root / s.name, s) for s in all_shards(loser)])
    winner.save(dest)
    with pytest.raises(ConfigError, match=rf"another run committed a different dataset \(id {winner.dataset_id}, "
                                          rf"built .*\) to {dest.url} while this one \(id {loser.dataset_id}\)"):
        commit_manifest(dest, loser, 0)
    # the loser's train shards are gone; the val shard's name is the winner's too (make_bucket's names carry
    # no dataset id, real builds' names do), so it stays
    assert sorted(o.name for o in dest.list()) == sorted([MANIFEST_NAME] + [s.name for s in all_shards(winner)])
    assert Manifest.load(dest) == winner


def test_commit_manifest_reports_an_unreadable_winner(fake_ds, tmp_path):
    _src, manifest = fake_ds
    dest = LocalStorage(tmp_path / "dest")
    dest.write_bytes(MANIFEST_NAME, b"garbage")
    with pytest.raises(StorageError, match=rf"{dest.where(MANIFEST_NAME)} was changed by another writer while "
                                           r"this one was building, and it cannot be read now .*run again"):
        commit_manifest(dest, manifest, 0)
    assert dest.read_bytes(MANIFEST_NAME) == b"garbage"


def test_remove_replaced_deletes_old_shards_and_partials_seen_before(fake_ds, tmp_path):
    _src, manifest = fake_ds
    dest = LocalStorage(tmp_path / "dest")
    current = [s.name for s in all_shards(manifest)]
    old = ["train-00000-of-00009-deadbeef.tfrecord", "val-00000-of-00009-deadbeef.tfrecord"]
    partial = partial_name(current[0], "7-abc")
    for name in current + old + [partial, "notes.txt", QUALITY_REPORT_NAME]:
        dest.write_bytes(name, b"x")
    before = {o.name: o for o in dest.list()}
    dest.write_bytes("train-00001-of-00009-deadbeef.tfrecord", b"concurrent")  # appeared later: not ours
    assert remove_replaced(dest, manifest, before) == 3
    assert sorted(o.name for o in dest.list()) == sorted(
        current + ["notes.txt", QUALITY_REPORT_NAME, "train-00001-of-00009-deadbeef.tfrecord"])


# -- against the GCS emulator -----------------------------------------------------------------------


class _CountingGCS(GCSStorage):
    """The emulator's bucket, counting every call that reads an object's metadata or bytes."""

    def __init__(self, url):
        super().__init__(url)
        self.reads: list[tuple[str, str]] = []

    def stat(self, name):
        self.reads.append(("stat", name))
        return super().stat(name)

    def crc32c(self, name):
        self.reads.append(("crc32c", name))
        return super().crc32c(name)

    def read_bytes(self, name):
        self.reads.append(("read_bytes", name))
        return super().read_bytes(name)

    def list(self):
        self.reads.append(("list", ""))
        return super().list()


class _BareRepliesGCS(_CountingGCS):
    """The emulator's bucket as a store whose upload replies carry no object metadata."""

    def _upload_many(self, pairs, transfers):
        return [r if isinstance(r, BaseException) else self.bucket.blob(r.name)
                for r in super()._upload_many(pairs, transfers)]


def test_publish_to_gcs_verifies_from_the_upload_replies(fake_ds, gcs_bucket):
    """On GCS each object's size, CRC32C and generation come from its upload's reply: publish makes no
    request per object after the uploads, and what it checked is what the bucket holds."""
    src, manifest = fake_ds
    store = _CountingGCS(f"gs://{gcs_bucket}/ds")
    files = [(src / s.name, s) for s in all_shards(manifest)]
    stats = publish(store, files, present={}, transfers=3)
    assert (stats.uploaded, stats.skipped) == (5, 0)
    assert store.reads == []
    # the replies are the objects' own metadata
    again = store.put_files_info([(src / s.name, s.name) for _p, s in files[:2]], 2)
    assert store.reads == []
    assert again == [store.stat(s.name) for _p, s in files[:2]]
    assert [(i.size, i.crc32c) for i in again] == [(s.bytes, s.crc32c) for _p, s in files[:2]]
    assert gcs_generations(gcs_bucket, "ds")[files[0][1].name] == again[0].generation


def test_publish_to_gcs_without_metadata_in_the_replies_stats_each_object(fake_ds, gcs_bucket):
    src, manifest = fake_ds
    store = _BareRepliesGCS(f"gs://{gcs_bucket}/ds")
    files = [(src / s.name, s) for s in all_shards(manifest)]
    stats = publish(store, files, present={}, transfers=3)
    assert (stats.uploaded, stats.skipped) == (5, 0)
    assert sorted(store.reads) == sorted(("stat", s.name) for _p, s in files)


def test_publish_to_gcs_catches_a_mismatch_and_names_it(log_lines, fake_ds, gcs_bucket):
    """The bucket holding other bytes than the manifest says (CRC32C or size) is caught from the upload
    replies: uploaded once more, then reported by name with what to do, the bad objects deleted."""
    src, manifest = fake_ds
    good, bad, short = all_shards(manifest)[:3]
    wrong_crc = dataclasses.replace(bad, crc32c=crc32c_bytes(b"something else"))
    wrong_size = dataclasses.replace(short, bytes=short.bytes + 1)
    store = _CountingGCS(f"gs://{gcs_bucket}/ds")
    lines = log_lines
    lines.clear()  # the lines from here on
    with pytest.raises(StorageError) as err:
        publish(store, [(src / good.name, good), (src / bad.name, wrong_crc), (src / short.name, wrong_size)],
                present={}, announce=True)
    msg = str(err.value)
    assert msg.startswith(f"2 shard(s) could not be uploaded intact to gs://{gcs_bucket}/ds: ")
    assert (f"{bad.name} (attempt 1: the bucket reports crc32c {bad.crc32c}, the manifest says "
            f"{wrong_crc.crc32c}, attempt 2: the bucket reports crc32c {bad.crc32c}") in msg
    assert (f"{short.name} (attempt 1: the bucket holds {short.bytes} bytes, the manifest says "
            f"{short.bytes + 1}, attempt 2: ") in msg
    assert "Nothing was committed" in msg and "then run again" in msg
    assert len(lines) == 2 and lines[1].startswith("uploading 2 shard(s)")
    assert store.reads == []
    assert [o.name for o in store.list()] == [good.name]


def test_upload_reuploads_only_missing_or_damaged_objects(local_ds, gcs_bucket):
    """After an interrupted upload (one object missing, one replaced), a rerun uploads exactly those two."""
    local, manifest = local_ds
    url = f"gs://{gcs_bucket}/ds"
    upload(local, url)
    remote = open_storage(url)
    names = [s.name for s in all_shards(manifest)]
    remote.delete(names[0])
    remote.write_bytes(names[1], b"not the shard")
    before = gcs_generations(gcs_bucket, "ds")
    stats = upload(local, url)
    assert (stats.uploaded, stats.skipped) == (2, 4)
    after = gcs_generations(gcs_bucket, "ds")
    changed = sorted(n for n in after if after[n] != before.get(n))
    assert changed == sorted(names[:2])
    assert remote.stat(names[1]).crc32c == all_shards(manifest)[1].crc32c


def test_upload_refuses_corrupt_local_shards_and_uploads_nothing(local_ds, gcs_bucket, tmp_path):
    """A local shard that no longer matches its manifest is named; the bucket stays empty."""
    import shutil

    local, manifest = local_ds
    copy = tmp_path / "copy"
    shutil.copytree(local, copy)
    victim = manifest.splits["train"].shards[2]
    data = bytearray((copy / victim.name).read_bytes())
    data[100] ^= 0x55
    (copy / victim.name).write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=rf"{victim.name}: crc32c .* the manifest says {victim.crc32c}"):
        upload(copy, f"gs://{gcs_bucket}/ds")
    assert open_storage(f"gs://{gcs_bucket}/ds").list() == []


def test_concurrent_commits_leave_exactly_one_dataset(tree, gcs_bucket, tmp_path):
    """Two builds of different datasets racing to one prefix (interleaved step by step): the first commit
    wins, the second is refused and removes its own shards; the survivor is complete and intact."""
    url = f"gs://{gcs_bucket}/race"
    storage = open_storage(url)
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    ma = shard(tree, a_dir, train_shards=4, val_shards=2, progress=False)
    mb = shard(tree, b_dir, train_shards=4, val_shards=2, per_class=5, progress=False)
    assert ma.dataset_id != mb.dataset_id
    # both look before either writes
    da = check_destination(storage, ma.dataset_id, overwrite=False)
    db = check_destination(storage, mb.dataset_id, overwrite=False)
    publish(storage, [(a_dir / s.name, s) for s in all_shards(ma)], present=da.objects)
    publish(storage, [(b_dir / s.name, s) for s in all_shards(mb)], present=db.objects)
    assert commit_manifest(storage, mb, db.generation) == mb  # b commits first
    with pytest.raises(ConfigError, match=rf"another run committed a different dataset \(id {mb.dataset_id}"):
        commit_manifest(storage, ma, da.generation)
    assert Manifest.load(storage) == mb
    assert sorted(o.name for o in storage.list()) == sorted([MANIFEST_NAME] + [s.name for s in all_shards(mb)])
    got = fetch(storage, all_shards(mb), tmp_path / "cache", dataset_id=mb.dataset_id)
    assert got.downloaded == len(all_shards(mb))


def test_repair_never_deletes_a_concurrent_overwrite(tree, local_ds, gcs_bucket, tmp_path):
    """A repair upload of dataset X (one shard lost) while an --overwrite build of Y is uploading: the repair
    deletes nothing of Y; Y then commits and removes X's shards; Y is complete."""
    local, mx = local_ds
    url = f"gs://{gcs_bucket}/race"
    storage = open_storage(url)
    upload(local, url)
    storage.delete(mx.splits["train"].shards[3].name)
    my = shard(tree, tmp_path / "y", train_shards=2, val_shards=2, progress=False)
    dy = check_destination(storage, my.dataset_id, overwrite=True)
    publish(storage, [(tmp_path / "y" / s.name, s) for s in all_shards(my)], present=dy.objects)
    repair = upload(local, url)  # the repair runs while Y is not committed yet
    assert (repair.uploaded, repair.manifest_written) == (1, False)
    names = {o.name for o in storage.list()}
    assert {s.name for s in all_shards(my)} <= names  # Y's shards untouched
    assert commit_manifest(storage, my, dy.generation) is my
    from spark_imagenet.dataset.transfer import remove_replaced

    assert remove_replaced(storage, my, dy.objects) == len(all_shards(mx)) - 1  # X's shards seen before Y began
    # The shard the repair re-uploaded after Y began is left (unreferenced, never read); a later --overwrite
    # of this prefix removes it.
    assert sorted(o.name for o in storage.list()) == sorted(
        [MANIFEST_NAME, "quality-report.json", mx.splits["train"].shards[3].name] + [s.name for s in all_shards(my)])
    assert Manifest.load(storage) == my
