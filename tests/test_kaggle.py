"""`spark-imagenet download`: the real ``kaggle`` client against a local server that plays Kaggle.

The served archive is a zip built here from generated images in the Kaggle
layout (``ILSVRC/`` and the ``LOC_*`` files at its root), about 2.4 MB so that
a connection cut after 1.5 MB leaves the client's first 1 MiB chunk on disk.
Credentials come from environment variables or files under a temporary HOME /
KAGGLE_CONFIG_DIR, never the real home folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from data_util import REPO, small_layout
from fake_kaggle import RULES_MESSAGE, FakeKaggle, listing_for_tree
from spark_imagenet.source import kaggle as dl
from spark_imagenet.source.kaggle import DEFAULT_COMPETITION, download, find_credentials, rules_url
from spark_imagenet.errors import DownloadError
from spark_imagenet.logs import collect

ARCHIVE = f"{DEFAULT_COMPETITION}.zip"
CHUNK = 1 << 20  # the client writes in chunks of 1 MiB


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(zip bytes, file listing, LOC_synset_mapping.txt bytes) of a small Kaggle-layout tree."""
    tmp = tmp_path_factory.mktemp("kaggle-archive")
    root = small_layout(tmp / "tree", size=(320, 240), quality=95)
    path = tmp / ARCHIVE
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(root.rglob("*")):
            z.write(p, p.relative_to(root).as_posix())  # ILSVRC/... and LOC_* at the zip's root
    data = path.read_bytes()
    assert len(data) > 2 * CHUNK
    return data, listing_for_tree(root), (root / "LOC_synset_mapping.txt").read_bytes()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty HOME, and no Kaggle settings from the machine's environment."""
    for name in list(os.environ):
        if name.startswith("KAGGLE_") or name in ("XDG_CONFIG_HOME", "VERBOSE", "VERBOSE_OUTPUT"):
            monkeypatch.delenv(name)
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def fake(served, home, monkeypatch):
    """Fake Kaggle serving the archive (and LOC_synset_mapping.txt), with the client pointed at it."""
    data, listing, mapping = served
    server = FakeKaggle({ARCHIVE: data, "LOC_synset_mapping.txt": mapping}, listing)
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    yield server
    server.stop()


@pytest.fixture
def api_key(fake, monkeypatch):
    """The accepted legacy API key in KAGGLE_USERNAME/KAGGLE_KEY."""
    monkeypatch.setenv("KAGGLE_USERNAME", fake.username)
    monkeypatch.setenv("KAGGLE_KEY", fake.key)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(dest: Path, **kw) -> tuple[Path, list[str]]:
    kw.setdefault("progress", False)
    with collect() as lines:
        path = download(dest=dest, **kw)
    return path, lines


def test_full_download(fake, api_key, served, tmp_path):
    path, lines = run(tmp_path / "dl")
    assert path == tmp_path / "dl" / ARCHIVE
    assert sha256(path.read_bytes()) == sha256(served[0])
    assert not Path(str(path) + ".kaggle-partial").exists()
    assert [s.status for s in fake.api_calls("ListDataFiles")] == [200]
    assert [s.status for s in fake.api_calls("DownloadDataFiles")] == [302]
    get, *resumed = fake.file_requests()
    assert get.status == 200 and "Range" not in get.headers and get.headers["Authorization"].startswith("Basic ")
    # on a loaded machine the client may time out a slow read: it then resumes the partial file, never restarts it
    assert all("Range" in r.headers for r in resumed), [(r.status, r.headers) for r in resumed]
    assert any("KAGGLE_USERNAME and KAGGLE_KEY" in ln for ln in lines)
    assert any("from the sizes in the competition's file list" in ln for ln in lines)
    assert os.listdir(tmp_path / "dl") == [ARCHIVE]  # the lock file is gone


def test_access_token_file(fake, served, home, tmp_path):
    (home / ".kaggle").mkdir()
    (home / ".kaggle" / "access_token").write_text(fake.token + "\n")
    path, lines = run(tmp_path / "dl")
    assert sha256(path.read_bytes()) == sha256(served[0])
    assert fake.api_calls("IntrospectToken"), "the client checks a token before using it"
    assert fake.api_calls("ListDataFiles")[0].headers["Authorization"] == f"Bearer {fake.token}"
    assert any(str(home / ".kaggle" / "access_token") in ln for ln in lines)


def test_second_run_downloads_nothing(fake, api_key, served, tmp_path):
    path, _ = run(tmp_path / "dl")
    before = len(fake.seen)
    again, lines = run(tmp_path / "dl")
    assert again == path and sha256(path.read_bytes()) == sha256(served[0])
    assert len(fake.seen) == before, "a complete archive must not be requested again"
    assert any("already complete" in ln and "nothing to download" in ln for ln in lines)


def test_truncated_archive_without_marker_is_downloaded_again(fake, api_key, served, tmp_path):
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / ARCHIVE).write_bytes(served[0][: len(served[0]) // 2])  # cut short, and no .kaggle-partial marker
    path, lines = run(dest)
    assert sha256(path.read_bytes()) == sha256(served[0])
    [get] = fake.file_requests()
    assert get.status == 200 and "Range" not in get.headers
    [line] = [ln for ln in lines if "downloading it again from the start" in ln]
    assert line.startswith(f"{dest / ARCHIVE} is not a complete download (it is not a complete zip (")
    assert "no end-of-zip record" in line and "has no .kaggle-partial marker to resume from" in line
    assert not any("already complete" in ln for ln in lines)


def test_single_file_of_another_size_is_downloaded_again(fake, api_key, served, tmp_path):
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "LOC_synset_mapping.txt").write_bytes(served[2] + b"appended by mistake\n")
    path, lines = run(dest, file_name="LOC_synset_mapping.txt")
    assert path.read_bytes() == served[2]
    size = len(served[2])
    assert any(f"is not a complete download (it has {dl.human_size(size + 20)} ({size + 20} bytes) where Kaggle "
               f"gives {dl.human_size(size)} ({size} bytes))" in ln and "downloading it again from the start" in ln
               for ln in lines), lines


def test_second_concurrent_download_fails_at_once(fake, api_key, served, cli_env, tmp_path):
    dest = tmp_path / "dl"
    fake.hold_files()  # the first download stays in progress until released
    first = subprocess.Popen([sys.executable, "-m", "spark_imagenet", "download", "--dest", str(dest),
                              "--no-progress"], env=cli_env, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    safety = threading.Timer(60, fake.release_files)  # without a lock the second run would wait as well
    try:
        deadline = time.monotonic() + 60
        while not fake.file_requests() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fake.file_requests(), first.communicate()[1] if first.poll() is not None else "no request"
        lock = dl.lock_path(dest)
        assert lock.read_text().strip() == str(first.pid)
        safety.start()
        with pytest.raises(DownloadError) as err:
            run(dest)  # at once: the first download is still held (so is the only file request)
        msg = str(err.value)
        assert (f"Another download of the '{DEFAULT_COMPETITION}' archive into {dest} is running (process "
                f"{first.pid} holds the lock {lock})") in msg and "corrupt each other's resume" in msg
        assert len(fake.file_requests()) == 1
    finally:
        safety.cancel()
        fake.release_files()
        out, errors = first.communicate(timeout=120)
    assert first.returncode == 0, errors
    assert sha256((dest / ARCHIVE).read_bytes()) == sha256(served[0])
    assert not dl.lock_path(dest).exists()
    path, lines = run(dest)  # the lock was released: a later run finds the archive complete
    assert any("already complete" in ln for ln in lines)


def test_single_file_and_rerun(fake, api_key, served, tmp_path):
    path, _ = run(tmp_path / "dl", file_name="LOC_synset_mapping.txt")
    assert path == tmp_path / "dl" / "LOC_synset_mapping.txt" and path.read_bytes() == served[2]
    files = len(fake.file_requests())
    run(tmp_path / "dl", file_name="LOC_synset_mapping.txt")
    assert len(fake.file_requests()) == files


def test_dropped_connection_resumes_within_the_call(fake, api_key, served, tmp_path):
    fake.cut_file_responses(1_500_000)  # 1 MiB reaches the disk, then the connection drops
    path, lines = run(tmp_path / "dl", progress=True)  # the client waits 2-3 s, then resumes by itself
    assert sha256(path.read_bytes()) == sha256(served[0])
    # the cut request, then the client's resume; under load the HTTP layer may send one more request on a
    # connection the server had just closed (seen in CI): the count is the client's business, the resume ours
    seen = fake.file_requests()
    first, second = seen[0], seen[-1]
    assert 2 <= len(seen) <= 3, [(s.status, s.sent, s.headers.get("Range")) for s in seen]
    assert first.sent == 1_500_000 and "Range" not in first.headers
    assert second.headers["Range"] == f"bytes={CHUNK}-" and second.status == 206
    assert second.sent == len(served[0]) - CHUNK
    assert second.headers["If-Range"] == fake.etags[ARCHIVE]
    assert any("Resuming from" in ln for ln in lines), lines


def test_interrupted_download_resumes_on_the_next_run(fake, api_key, served, tmp_path, monkeypatch):
    # First run: every attempt (the first and the client's 5 retries) is cut; skip the client's
    # backoff waits (2 + 4 + 8 + 16 + 32 s) so that the test stays short.
    fake.cut_file_responses(1_500_000, 0, 0, 0, 0, 0)
    with monkeypatch.context() as m, pytest.raises(DownloadError) as err:
        m.setattr(time, "sleep", lambda seconds: None)
        run(tmp_path / "dl")
    msg = str(err.value)
    assert "interrupted" in msg and "run the same command again to resume" in msg.lower(), msg
    partial = tmp_path / "dl" / ARCHIVE
    assert str(partial) in msg and partial.stat().st_size == CHUNK
    assert Path(str(partial) + ".kaggle-partial").exists()
    # the first attempt and the client's 5 retries, every one cut (under load the HTTP layer may send one
    # more on a connection the server had just closed: the count is the client's business, the cuts ours)
    first = fake.file_requests()
    assert len(first) >= 6 and all(s.sent < len(served[0]) for s in first), [(s.status, s.sent) for s in first]

    path, lines = run(tmp_path / "dl")
    assert sha256(path.read_bytes()) == sha256(served[0])
    assert not Path(str(path) + ".kaggle-partial").exists()
    last = fake.file_requests()[-1]
    assert last.headers["Range"] == f"bytes={CHUNK}-" and last.status == 206
    assert last.sent == len(served[0]) - CHUNK
    assert any(ln.startswith("resuming ") for ln in lines)


def test_rules_not_accepted(fake, api_key, tmp_path):
    fake.fail = 403
    with pytest.raises(DownloadError) as err:
        run(tmp_path / "dl")
    msg = str(err.value)
    assert "403" in msg and "accept" in msg and rules_url(DEFAULT_COMPETITION) in msg
    assert RULES_MESSAGE in msg
    assert rules_url(DEFAULT_COMPETITION) == f"https://www.kaggle.com/competitions/{DEFAULT_COMPETITION}/rules"
    assert not fake.file_requests()


@pytest.mark.parametrize("where", ["env", "kaggle.json"])
def test_bad_api_key(fake, tmp_path, monkeypatch, where):
    if where == "env":
        monkeypatch.setenv("KAGGLE_USERNAME", fake.username)
        monkeypatch.setenv("KAGGLE_KEY", "wrong-key")
        source = "KAGGLE_USERNAME and KAGGLE_KEY environment variables"
    else:
        config = tmp_path / "cfg"
        config.mkdir()
        (config / "kaggle.json").write_text('{"username": "alice", "key": "wrong-key"}')
        (config / "kaggle.json").chmod(0o600)
        monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(config))
        source = str(config / "kaggle.json")
    with pytest.raises(DownloadError) as err:
        run(tmp_path / "dl")
    msg = str(err.value)
    assert "401" in msg and "rejected" in msg and source in msg, msg
    assert "https://www.kaggle.com/settings/api" in msg
    assert not (tmp_path / "dl").exists()  # --dest is created only once Kaggle accepted the credentials


def test_server_says_401(fake, api_key, tmp_path):
    fake.fail = 401
    with pytest.raises(DownloadError, match="rejected the credentials from the KAGGLE_USERNAME and KAGGLE_KEY "
                       "environment variables \\(HTTP 401"):
        run(tmp_path / "dl")


def test_bad_access_token(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("KAGGLE_API_TOKEN", "KGAT_expired")
    with pytest.raises(DownloadError) as err:
        run(tmp_path / "dl")
    msg = str(err.value)
    assert "did not accept the access token from the KAGGLE_API_TOKEN environment variable" in msg, msg
    assert "SystemExit" not in msg


def test_unknown_competition(fake, api_key, tmp_path):
    with pytest.raises(DownloadError) as err:
        run(tmp_path / "dl", competition="no-such-competition")
    msg = str(err.value)
    assert "404" in msg and "no competition named 'no-such-competition'" in msg, msg


def test_no_credentials(fake, tmp_path):
    with pytest.raises(DownloadError) as err:
        run(tmp_path / "dl")
    msg = str(err.value)
    for where in ("KAGGLE_API_TOKEN", "~/.kaggle/access_token", "KAGGLE_USERNAME", "KAGGLE_KEY", "kaggle.json",
                  "KAGGLE_CONFIG_DIR", "https://www.kaggle.com/settings/api", "chmod 600"):
        assert where in msg, (where, msg)
    assert not fake.seen, "nothing is sent without credentials"
    assert not (tmp_path / "dl").exists()


def test_credentials_follow_the_clients_own_token_lookup(home, tmp_path, monkeypatch):
    """The access token is found by the client's function (kagglesdk), so places only it knows count too: inside a
    Kaggle notebook, the notebook's token file comes before KAGGLE_API_TOKEN and ~/.kaggle/access_token."""
    (home / ".kaggle").mkdir()
    (home / ".kaggle" / "access_token").write_text("KGAT_file\n")
    assert find_credentials() == dl.Credentials("token", str(home / ".kaggle" / "access_token"))
    token_file = tmp_path / "token"
    token_file.write_text("KGAT_named\n")
    monkeypatch.setenv("KAGGLE_API_TOKEN", str(token_file))
    assert find_credentials().source == f"the file {token_file} named by KAGGLE_API_TOKEN"
    notebook = tmp_path / "notebook-token"
    notebook.write_text("KGAT_notebook\n")
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setenv("KAGGLE_DATA_PROXY_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("KAGGLE_API_V1_TOKEN", str(notebook))
    found = find_credentials()
    assert found.kind == "token" and "Kaggle notebook" in found.source, found


def test_malformed_kaggle_json_is_named(fake, tmp_path, monkeypatch):
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "kaggle.json").write_text('{"username": "alice", "key": "s3cret-key"')  # the closing brace lost
    (config / "kaggle.json").chmod(0o600)
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(config))
    with pytest.raises(DownloadError) as err:
        run(tmp_path / "dl")
    msg = str(err.value)
    assert msg.startswith(f"The Kaggle credentials file {config / 'kaggle.json'} is malformed: it is not valid "
                          "JSON ("), msg
    assert "No Kaggle credentials found" not in msg and "KAGGLE_API_TOKEN" in msg
    assert not fake.seen and not (tmp_path / "dl").exists()


def test_not_enough_disk(fake, api_key, served, tmp_path):
    fake.claimed_sizes[served[1][0]["name"]] = 10**15  # the list claims a 1 PB file
    dest = tmp_path / "dl"
    with pytest.raises(DownloadError) as err:
        run(dest)
    msg = str(err.value)
    assert "Not enough free disk space" in msg and str(dest) in msg
    need = 10**15 + sum(f["totalBytes"] for f in served[1][1:])
    assert f"needs {dl.human_size(need)} more ({need} bytes)" in msg, msg
    free = int(re.search(r"only \S+ [KMGTP]?B \((\d+) bytes\) are free", msg).group(1))
    assert abs(free - shutil.disk_usage(tmp_path).free) < 2**30, msg
    assert not fake.file_requests() and not dest.exists()  # nothing left behind, not even the folder


def test_kaggle_json_permission_warning(fake, served, tmp_path, monkeypatch):
    config = tmp_path / "cfg"
    config.mkdir()
    key_file = config / "kaggle.json"
    key_file.write_text(f'{{"username": "{fake.username}", "key": "{fake.key}"}}')
    key_file.chmod(0o644)
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(config))
    path, lines = run(tmp_path / "dl")
    assert sha256(path.read_bytes()) == sha256(served[0])
    assert any("readable by other users" in ln and f"chmod 600 {key_file}" in ln for ln in lines), lines
    assert any(f"Kaggle credentials: {key_file}" == ln for ln in lines), lines

    key_file.chmod(0o600)
    path.unlink()
    _, lines = run(tmp_path / "dl")
    assert not any("readable by other users" in ln for ln in lines)


def test_long_file_list_takes_size_from_the_download(fake, api_key, served, tmp_path, monkeypatch):
    # ImageNet's list has 1.4 million entries: past LIST_PAGES pages the size comes from Content-Length.
    monkeypatch.setattr(dl, "LIST_PAGE_SIZE", 10)
    monkeypatch.setattr(dl, "LIST_PAGES", 2)
    path, lines = run(tmp_path / "dl")
    assert sha256(path.read_bytes()) == sha256(served[0])
    assert len(fake.api_calls("ListDataFiles")) == 2
    assert any(f"{len(served[0]) / 1e6:.2f} MB (from the download's Content-Length)" in ln for ln in lines), lines


# -- the command line -------------------------------------------------------------------------------

def cli(args: list[str], env: dict, pre: str = "") -> subprocess.CompletedProcess:
    code = f"import sys; {pre}from spark_imagenet.cli import main; sys.exit(main(sys.argv[1:]))" if pre else None
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "spark_imagenet", *args]
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.fixture
def cli_env(fake, home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGGLE_")}
    env.update(fake.env(), HOME=str(home), KAGGLE_USERNAME=fake.username, KAGGLE_KEY=fake.key)
    return env


def test_cli_download(fake, served, cli_env, tmp_path):
    dest = tmp_path / "dl"
    proc = cli(["download", "--dest", str(dest), "--no-progress"], cli_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(dest / ARCHIVE)
    assert sha256((dest / ARCHIVE).read_bytes()) == sha256(served[0])


def test_cli_rules_not_accepted(fake, cli_env, tmp_path):
    fake.fail = 403
    proc = cli(["download", "--dest", str(tmp_path / "dl")], cli_env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("spark-imagenet: error:")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr  # one paragraph, last
    assert rules_url(DEFAULT_COMPETITION) in errors[0] and "accept" in errors[0]


def test_cli_missing_six(fake, cli_env, tmp_path):
    # kaggle 2.2.5 imports six without declaring it: a missing six must be named, not a traceback.
    proc = cli(["download", "--dest", str(tmp_path / "dl")], cli_env, pre="sys.modules['six'] = None; ")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "'six' is missing" in proc.stderr and "pip install" in proc.stderr
