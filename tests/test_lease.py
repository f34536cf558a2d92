"""One writer per folder (spark_imagenet.storage.lease): the run lease on real storage (a local folder and a
fake-gcs-server bucket), and a second training job refused by the command line."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest

from spark_imagenet.errors import ConfigError, TrainingError
from spark_imagenet.storage import open_storage
from spark_imagenet.storage import lease as L


@pytest.fixture(params=["local", "gcs"])
def folder(request, tmp_path):
    if request.param == "local":
        return open_storage(tmp_path / "ck")
    return open_storage(f"gs://{request.getfixturevalue('gcs_bucket')}/run/ck")


def test_a_second_run_is_refused_naming_the_first_until_it_ends(folder):
    first = L.take([(folder, "--checkpoint-dir")], "a" * 32)
    try:
        with pytest.raises(ConfigError) as e:
            L.take([(folder, "--checkpoint-dir")], "b" * 32)
        message = str(e.value)  # wording test (a folder in use)
        assert (e.value.key, e.value.value) == ("--checkpoint-dir", folder.url)
        assert message.startswith(f"--checkpoint-dir {folder.url} is in use by run aaaaaaaa on host ")
        assert "two runs in one folder would mix their files" in message and "renewed 0 s ago" in message
        L.check_held(folder, "a" * 32)
        with pytest.raises(TrainingError, match="no longer holds") as e:
            L.check_held(folder, "b" * 32)
        assert type(e.value) is TrainingError and (e.value.key, e.value.value) == ("url", folder.url)
    finally:
        first.stop()
    assert L.read(folder) is None  # released
    L.take([(folder, "--checkpoint-dir")], "b" * 32).stop()


def test_a_stale_lease_is_taken_over_with_a_warning_and_its_chief_stops(folder, log_lines):
    old = dataclasses.replace(L.Lease.new("a" * 32), host="gone-host", renewed=time.time() - 500)
    folder.write_bytes(L.LEASE_NAME, old.dumps(), if_generation_match=0)
    with pytest.raises(TrainingError, match="not renewed for 5\\d\\d s"):
        L.check_held(folder, "a" * 32)  # the old run's chief, its driver gone: no more commits
    renewal = L.take([(folder, "--checkpoint-dir")], "b" * 32)
    try:
        assert any("taking over the lease of run aaaaaaaa on host gone-host" in line and "not renewed for" in line
                   for line in log_lines)
        assert L.read(folder)[0].run_id == "b" * 32
    finally:
        renewal.stop()


def test_the_lease_of_a_driver_killed_on_this_host_is_taken_at_once(tmp_path, log_lines):
    folder = open_storage(tmp_path / "ck")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    held = dataclasses.replace(L.Lease.new("a" * 32), pid=int(dead.stdout))
    folder.write_bytes(L.LEASE_NAME, held.dumps(), if_generation_match=0)
    L.take([(folder, "--output")], "b" * 32).stop()
    assert any("its process has ended" in line for line in log_lines)


def test_a_reattempt_of_the_same_application_waits_for_the_old_lease(tmp_path, log_lines):
    folder = open_storage(tmp_path / "ck")
    held = dataclasses.replace(L.Lease.new("a" * 32, "application_1_0001", timeout_s=1.0), host="other-host")
    folder.write_bytes(L.LEASE_NAME, held.dumps(), if_generation_match=0)
    start = time.monotonic()
    L.take([(folder, "--checkpoint-dir")], "b" * 32, "application_1_0001").stop()
    assert time.monotonic() - start >= 0.5  # it waited for the lease to lapse
    assert any("waiting for the lease of an earlier attempt of this application" in line for line in log_lines)


def test_renewal_keeps_the_lease_fresh_and_a_lost_lease_is_said(tmp_path, log_lines):
    folder = open_storage(tmp_path / "ck")
    lease = L.Lease.new("a" * 32, timeout_s=0.4)
    generation = L.acquire(folder, lease, "--output")
    renewal = L.Renewal([(folder, lease, generation, "--output")])
    try:
        first = L.read(folder)[0].renewed
        time.sleep(0.5)
        assert L.read(folder)[0].renewed > first  # renewed every timeout / 4
        L.check_held(folder, "a" * 32)
        folder.write_bytes(L.LEASE_NAME, L.Lease.new("c" * 32).dumps())  # someone takes it
        time.sleep(0.3)
        assert any("another run took over this run's lease" in line for line in log_lines)
    finally:
        renewal.stop()
    assert L.read(folder)[0].run_id == "c" * 32  # not ours: left as it is


def test_a_damaged_lease_names_the_file_and_what_to_do(tmp_path):
    from spark_imagenet.errors import StorageError

    folder = open_storage(tmp_path / "ck")
    folder.write_bytes(L.LEASE_NAME, b"{not json")
    with pytest.raises(StorageError, match=f"{L.LEASE_NAME}: not valid JSON .*delete {L.LEASE_NAME} if no run"):
        L.take([(folder, "--checkpoint-dir")], "b" * 32)


@pytest.mark.slow
def test_a_second_training_job_on_a_checkpoint_folder_in_use_is_refused(tmp_path):
    """The command line: while another run holds --checkpoint-dir (this test process, alive and renewing),
    `train` exits 2 with one line naming the holder, and writes nothing into the folder."""
    from data_util import build, small_layout
    from test_cli import assert_clean_error, cli

    data = tmp_path / "bucket"
    build(small_layout(tmp_path / "src"), data)
    folder = open_storage(tmp_path / "ck")
    holder = L.take([(folder, "--checkpoint-dir")], "a" * 32)
    try:
        p = cli("train", str(data), "--workers", "1", "--master", "local[1]", "--epochs", "1", "--image-size", "72",
                "--width", "0.25", "--batch-size", "4", "--checkpoint-dir", str(tmp_path / "ck"))
        assert_clean_error(p, f"--checkpoint-dir {tmp_path / 'ck'} is in use by run aaaaaaaa on host ")
        assert [o.name for o in folder.list()] == [L.LEASE_NAME]
    finally:
        holder.stop()
