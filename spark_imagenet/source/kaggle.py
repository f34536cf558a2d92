"""Download a Kaggle competition's archive (ImageNet) with the official ``kaggle`` client.

:func:`download` fetches the ``imagenet-object-localization-challenge``
archive (one zip of about 155 GiB) or any other competition's, through
``kaggle.api.kaggle_api_extended.KaggleApi`` (PyPI ``kaggle`` 2.x):

* Credentials are found where the client looks, in its order
  (:func:`spark_imagenet.source.kaggle_credentials.find_credentials`), and
  named in every message about a rejection; the client itself, and its errors
  as messages, are in :mod:`spark_imagenet.source.kaggle_client`.
* Before anything is transferred, the archive size is taken from the
  competition's file list (the sum of its files' sizes; for a list longer
  than ``LIST_PAGES`` x ``LIST_PAGE_SIZE`` entries, such as ImageNet's 1.4
  million, from the ``Content-Length`` of the download itself, whose body is
  not read) and compared with the free space at ``dest``.
* A complete file at ``dest`` (present, without the client's
  ``<file>.kaggle-partial`` marker, which the client removes only once the
  size is verified, and for a zip with its end-of-central-directory record
  intact: ``zipfile.is_zipfile``) is not downloaded again, and for the whole
  archive nothing is requested. A partial one (with its marker) is resumed by
  the client with an HTTP Range request; within one call the client itself
  retries a dropped connection 5 times, resuming each time. A file without
  the marker that is not complete (a zip cut short, or a size other than the
  one Kaggle gives for it) cannot be resumed safely: it is downloaded again
  from the start, with a log line saying why.
* ``dest`` is created only once Kaggle accepted the credentials, and a
  download holds an exclusive ``flock`` on ``dest/.<competition>.download-lock``
  (:func:`lock_path`) while it runs: a second download into the same folder
  fails at once, naming the first one's process, instead of corrupting its
  resume.

The client's pitfalls and what is done about them are in docs/design.md,
'The kaggle client'. Every failure is a :class:`DownloadError` (or
:class:`EnvironmentSetupError`) whose message says what to do; none leaves as a
traceback or an exit.

Example::

    path = download(dest="/data/kaggle")   # /data/kaggle/imagenet-object-localization-challenge.zip
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import logging
import os
import shutil
import time
import zipfile
from pathlib import Path
from typing import Callable, Iterator

from spark_imagenet.errors import ConfigError, DownloadError
from spark_imagenet.source.kaggle_client import (
    DEFAULT_COMPETITION, LineLog, api_error, authenticated_api, http_status, list_files, probe_download, reason)
from spark_imagenet.source.kaggle_credentials import CLIENT_REQUIREMENT, Credentials, find_credentials
from spark_imagenet.units import human_size

logger = logging.getLogger(__name__)

#: Suffix of the client's resume marker beside a partial download.
PARTIAL_SUFFIX = ".kaggle-partial"


def _marker(path: Path) -> Path:
    """The client's resume marker beside ``path``."""
    return path.with_name(path.name + PARTIAL_SUFFIX)


def _incomplete(path: Path, size: int | None) -> str | None:
    """Why ``path`` (present, without the client's resume marker) is not a finished download, or None.

    Args:
        path: the downloaded file.
        size: its exact size when Kaggle gives it (the file list's size of a
            single file, or the download's ``Content-Length``), else None.

    Returns:
        str | None: e.g. ``"it is not a complete zip: no end-of-zip record
        ..."``; None when nothing is wrong with it (non-empty, the size Kaggle
        gives, and for a zip an end-of-central-directory record where
        ``zipfile.is_zipfile`` looks for it: the last 64 KiB, a cut-short
        download's lost end; the central directory itself, 1.4 million
        entries for ImageNet, is read only when the zip is opened).
    """
    actual = path.stat().st_size
    if actual == 0:
        return "it is empty"
    if size is not None and actual != size:
        return (f"it has {human_size(actual)} ({actual} bytes) where Kaggle gives {human_size(size)} "
                f"({size} bytes)")
    if path.suffix.lower() == ".zip" and not zipfile.is_zipfile(path):
        return (f"it is not a complete zip ({human_size(actual)}): no end-of-zip record in its last 64 KiB; "
                "it was cut short")
    return None


@dataclasses.dataclass(frozen=True)
class _State:
    """What is at the download's target now: at most one of a finished file, a partial one with the
    client's resume marker (resumed), or a stale one (present, no marker, not finished: downloaded
    again from the start, with ``why``)."""

    complete: Path | None = None
    partial: Path | None = None
    stale: Path | None = None
    why: str = ""


def _state(targets: list[Path], exact: Callable[[Path], int | None]) -> _State:
    """Look at the candidate files (finished ones first, then partial, then stale)."""
    present = [p for p in targets if p.is_file()]
    unmarked = [p for p in present if not _marker(p).exists()]
    faults = {p: _incomplete(p, exact(p)) for p in unmarked}
    for p in unmarked:
        if faults[p] is None:
            return _State(complete=p)
    for p in present:
        if p not in faults:
            return _State(partial=p)
    for p in unmarked:
        return _State(stale=p, why=faults[p])
    return _State()


def _candidates(dest: Path, competition: str, file_name: str | None, url_name: str | None = None) -> list[Path]:
    """Where the client puts the file: the URL's last segment names it (large single files come zipped)."""
    if file_name is None:
        names = [f"{competition}{Path(url_name).suffix}"] if url_name else [f"{competition}.zip"]
        return [dest / n for n in names]
    sub = Path(*[p for p in file_name.replace("\\", "/").split("/")[:-1] if p not in ("", ".")])
    base = file_name.replace("\\", "/").rsplit("/", 1)[-1]
    names = [url_name] if url_name else [base, base + ".zip"]
    return [dest / sub / n for n in names]


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_dest(dest: Path) -> None:
    """ConfigError when ``dest`` is a file, or cannot be created or written (nothing is created)."""
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"--dest {dest} is a file, not a folder; give a folder for the archive.")
    folder = _nearest_existing(dest)
    if not folder.is_dir():
        raise ConfigError(f"Cannot create the download folder {dest}: {folder} is a file; choose another --dest.")
    if not os.access(folder, os.W_OK | os.X_OK):
        verb = "is not writable" if folder == dest else f"cannot be created ({folder} is not writable)"
        raise ConfigError(f"The download folder {dest} {verb} by this user; choose another --dest "
                          "or fix its permissions.")


def _make_dest(dest: Path) -> None:
    """Create ``dest`` (once the credentials were accepted); ConfigError when that fails."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"Cannot create the download folder {dest} ({e.strerror or e}); "
                          "choose a --dest you can write to.") from None


def lock_path(dest: str | os.PathLike, competition: str = DEFAULT_COMPETITION, file_name: str | None = None) -> Path:
    """The lock file a download into ``dest`` holds while it runs (see :func:`_download_lock`).

    Args:
        dest: the download folder.
        competition: the competition.
        file_name: the single file downloaded, or None for the whole archive.

    Returns:
        Path: ``<dest>/.<competition>.download-lock``, or
        ``<dest>/.<file name, "/" as "_">.download-lock`` for a single file.
    """
    name = competition if file_name is None else file_name.replace("\\", "/").strip("/").replace("/", "_")
    return Path(dest) / f".{name}.download-lock"


@contextlib.contextmanager
def _download_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created) while the block runs; fail at once if another
    process holds it. The file holds the holder's process id and is removed on release."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"Cannot create the lock file {path} ({e.strerror or e}); "
                              "choose a --dest you can write to.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"Cannot lock {path} ({e.strerror or e}); the file system of --dest does not "
                                  "support file locks: choose another --dest.") from None
            who = f"process {holder}" if holder.isdigit() else "another process"
            raise DownloadError(
                f"Another download of {what} into {path.parent} is running ({who} holds the lock {path}). Two "
                "downloads into one folder would corrupt each other's resume: wait for that one to finish (or "
                "stop it), then run the same command again.") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # else its previous holder removed it between our open and our lock: take the new one
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still locked: a waiting process then sees another inode and retries
        os.close(fd)


def _check_space(dest: Path, size: int, present: int, name: str, replaced: int = 0) -> None:
    """DownloadError when ``size - present`` bytes do not fit in the free space at ``dest``
    (plus ``replaced`` bytes of a stale file that the download overwrites)."""
    need = max(size - present, 0)
    free = shutil.disk_usage(dest).free
    if need > free + replaced:
        have = f" ({human_size(present)} of it already downloaded)" if present else ""
        freed = (f" (plus the {human_size(replaced)} of the incomplete file it replaces)" if replaced else "")
        raise DownloadError(
            f"Not enough free disk space in {dest} for {name}: it needs {human_size(need)} more{have} "
            f"({need} bytes), but only {human_size(free)} ({free} bytes) are free there{freed}. Free some space "
            "or choose another --dest on a larger disk, then run the same command again.")


def _interrupted(exc: BaseException, path: Path | None, size: int | None, name: str) -> DownloadError:
    """The error for a transfer the client gave up on: what is kept, and that a rerun resumes."""
    got = path.stat().st_size if path is not None and path.is_file() else 0
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DownloadError(
            f"The disk at {path.parent if path else '--dest'} filled up while downloading {name} "
            f"({human_size(got)} written). Free some space, then run the same command again: "
            "it resumes where it stopped.")
    where = (f"the {human_size(got)} already downloaded" + (f" of {human_size(size)}" if size else "")
             + f" are kept in {path}") if got else "nothing was kept"
    return DownloadError(
        f"The download of {name} was interrupted and the kaggle client could not recover after its retries "
        f"({type(exc).__name__}: {reason(exc)}); {where}. Run the same command again to resume "
        "(check the network connection first if this repeats).")


# -- the command -------------------------------------------------------------------------------------

def download(
    competition: str = DEFAULT_COMPETITION,
    dest: str | os.PathLike = ".",
    *,
    file_name: str | None = None,
    progress: bool = True,
) -> Path:
    """Download a Kaggle competition's archive (default: ImageNet) into ``dest``, resumably.

    Uses the official client (``KaggleApi.competition_download_files``, or
    ``competition_download_file`` for ``file_name``): a progress bar, HTTP
    Range resume of a partial file (its ``.kaggle-partial`` marker proves it
    belongs to the same remote object), 5 retries of a dropped connection.
    Before that: credentials are located (:func:`find_credentials`) and
    accepted by Kaggle, the file list read, and only then is ``dest``
    created and locked (:func:`lock_path`: a second download into the same
    folder fails at once), and the archive size checked against its free
    space. A finished file already there is not downloaded again (delete it
    to download anew); for the whole archive that is decided without
    contacting Kaggle. A file there without the client's marker that is not
    finished (a zip whose end record is missing, or a size other than the
    one Kaggle gives) is downloaded again from the start, with a log line
    saying why. While the client runs, ``sys.stdout`` is redirected to
    this module's logger (the client prints its status lines), so call this from one
    thread at a time. Status lines and warnings, the client's own included, are logged
    (:mod:`spark_imagenet.logs`).

    Args:
        competition: the competition's name, the last part of its URL
            (default ``imagenet-object-localization-challenge``, one zip of
            about 155 GiB).
        dest: the folder for the archive (created if absent, once the
            credentials were accepted; default: the current folder).
        file_name: one file of the competition instead of the whole archive
            (a name from its file list, e.g. ``LOC_synset_mapping.txt``).
        progress: show the client's progress bar (tqdm, on stderr) and its
            status lines.

    Returns:
        Path: the downloaded (or already present) file, absolute:
        ``<dest>/<competition>.zip`` for the whole archive.

    Raises:
        DownloadError: no credentials (says where to put them) or a malformed
            ``kaggle.json``, credentials rejected (HTTP 401; says which source
            was used), competition rules not accepted (HTTP 403; gives the
            rules page), unknown competition or file (HTTP 404), not enough
            disk space (both sizes), another download into ``dest`` running
            (names its lock and process), or a transfer the client could not
            finish after its retries (run again to resume).
        ConfigError: ``dest`` cannot be created or written.
        EnvironmentSetupError: the ``kaggle`` package (or ``six``) is missing
            or fails to load.
        KeyboardInterrupt: passed on after a hint that a rerun resumes.
    """
    if not competition or "/" in competition:
        raise ConfigError(f"--competition {competition!r} is not a competition name; give the last part of the "
                          f"competition's URL, e.g. {DEFAULT_COMPETITION}.")
    dest = Path(dest).expanduser().absolute()
    what = repr(file_name) + f" of {competition!r}" if file_name else f"the {competition!r} archive"
    _check_dest(dest)  # creates nothing: dest is made once Kaggle accepted the credentials

    if file_name is None:  # a single file is checked against its listed size, below
        state = _state(_candidates(dest, competition, None), lambda p: None)
        if state.complete is not None:
            logger.info(f"{state.complete} is already complete ({human_size(state.complete.stat().st_size)}); "
                        "nothing to "
                        "download (delete it to download it again)")
            return state.complete

    creds = find_credentials()
    logger.info(f"Kaggle credentials: {creds.source}")
    api = authenticated_api(creds, competition)

    size, url_name, probed = _remote_size(api, competition, file_name, creds, what)
    exact = _exact_size(size, probed, file_name)
    targets = _candidates(dest, competition, file_name, url_name)
    created = not dest.exists()
    _make_dest(dest)
    try:
        with _download_lock(lock_path(dest, competition, file_name), what):
            return _download_locked(api, competition, file_name, dest, targets, exact, size, what, creds, progress)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                dest.rmdir()  # only when empty: nothing downloaded, so leave no folder behind
        raise


def _exact_size(size: int | None, probed: bool, file_name: str | None) -> Callable[[Path], int | None]:
    """The size Kaggle gives for the file at a path, when it gives the exact one: the download's
    ``Content-Length`` (``probed``), or the listed size of the single file ``file_name``."""

    def exact(path: Path) -> int | None:
        if probed:
            return size
        if file_name is not None and path.name == Path(file_name).name:
            return size
        return None

    return exact


def _remote_size(api, competition: str, file_name: str | None, creds: Credentials,
                 what: str) -> tuple[int | None, str | None, bool]:
    """The size of what will be downloaded, from the file list or else from the download's headers.

    Returns:
        tuple: the size (None when Kaggle does not say), the file name the download's URL gives
        (only when it was probed), and whether the size is the download's exact ``Content-Length``.

    Raises:
        DownloadError: ``file_name`` is not in the competition's (complete) file list, or an API error.
    """
    listing = list_files(api, competition, creds)
    size: int | None = None
    url_name: str | None = None
    probed = False
    if file_name is not None and file_name in listing.sizes:
        size = listing.sizes[file_name]
    elif file_name is None and listing.complete:
        size = sum(listing.sizes.values())  # the unpacked files: an estimate of the zip's size, not its size
    elif file_name is not None and listing.complete:
        names = sorted(listing.sizes, key=lambda n: (n.count("/"), n))  # top-level files first
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        raise DownloadError(f"Competition {competition!r} has no file {file_name!r}; its files are: {shown}. "
                            "Give one of those names with --file.")
    if size is None:
        size, url_name = probe_download(api, competition, file_name, creds)
        probed = size is not None
        source = "the download's Content-Length"
    else:
        source = "the sizes in the competition's file list"
    if size is not None:
        logger.info(f"{what}: {human_size(size)} (from {source})")
    return size, url_name, probed


def _download_locked(api, competition: str, file_name: str | None, dest: Path, targets: list[Path],
                     exact: Callable[[Path], int | None], size: int | None, what: str, creds: Credentials,
                     progress: bool) -> Path:
    """The part of :func:`download` that runs under the lock: look at what is there again, check the
    free space, and let the client resume or start the download."""
    state = _state(targets, exact)  # again, under the lock: another run may have finished it
    if state.complete is not None:
        logger.info(f"{state.complete} is already complete ({human_size(state.complete.stat().st_size)}); "
                    "nothing to download (delete it to download it again)")
        return state.complete
    present = state.partial.stat().st_size if state.partial is not None else 0
    if size is not None:
        _check_space(dest, size, present, what, replaced=state.stale.stat().st_size if state.stale is not None else 0)
    else:
        logger.warning(f"warning: Kaggle did not say how large {what} is; free disk space not checked")
    if state.partial is not None:
        logger.info(f"resuming {state.partial}: {human_size(present)} already there")
    if state.stale is not None:
        logger.info(f"{state.stale} is not a complete download ({state.why}) and has no {PARTIAL_SUFFIX} marker to "
                    "resume from: downloading it again from the start")
    return _run_client(api, competition, file_name, dest, targets, exact, size, what, creds, progress,
                       force=state.stale is not None)


def _run_client(api, competition: str, file_name: str | None, dest: Path, targets: list[Path],
                exact: Callable[[Path], int | None], size: int | None, what: str, creds: Credentials,
                progress: bool, *, force: bool) -> Path:
    """Let the client download (``force``: from the start), then find and check the file it wrote."""
    started = time.monotonic()
    try:
        with contextlib.redirect_stdout(LineLog(logger)) as out:
            try:
                if file_name is None:
                    api.competition_download_files(competition, path=str(dest), force=force, quiet=not progress)
                else:
                    api.competition_download_file(competition, file_name, path=str(dest), force=force,
                                                  quiet=not progress)
            finally:
                out.flush()
    except KeyboardInterrupt:
        logger.info("interrupted: run the same command again to resume the download")
        raise
    except (Exception, SystemExit) as e:
        target = next((p for p in targets if p.is_file()), None)
        if http_status(e) is not None and "/api/v1/" in str(getattr(e.response, "url", "")):
            raise api_error(e, competition, creds, "starting the download", file_name) from None
        kept = target is not None and target.stat().st_size > 0
        if isinstance(e, (OSError, ValueError)) or type(e).__module__.split(".")[0] in ("requests", "urllib3"):
            if not kept and http_status(e) is None and type(e).__name__ in ("ConnectionError", "ProxyError", "SSLError"):
                raise api_error(e, competition, creds, "downloading") from None
            raise _interrupted(e, target, size, what) from None
        raise api_error(e, competition, creds, "downloading") from None

    done = next((p for p in targets if p.is_file() and not _marker(p).exists()), None)
    if done is None:
        done = next((p for p in sorted(dest.glob(f"{Path(targets[0]).stem}*")) if p.is_file()
                     and not p.name.endswith(PARTIAL_SUFFIX) and not p.name.endswith(".download-lock")), None)
    if done is None:
        raise DownloadError(f"The kaggle client finished without error but {targets[0]} is not there; "
                            "run the same command again, and upgrade the client if it repeats: "
                            f"pip install -U {CLIENT_REQUIREMENT}.")
    why = _incomplete(done, exact(done))
    if why is not None:
        raise DownloadError(f"The kaggle client finished without error but {done} is not a complete download ({why}); "
                            "run the same command again (it downloads it again from the start).")
    seconds = time.monotonic() - started
    logger.info(f"{done}: {human_size(done.stat().st_size)}, ready ({seconds:.0f} s)")
    return done
