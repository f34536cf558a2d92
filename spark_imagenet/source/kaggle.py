"""Download a Kaggle competition's archive (ImageNet) with the official ``kaggle`` client.

:func:`download` fetches the ``imagenet-object-localization-challenge``
archive (one zip of about 155 GiB) or any other competition's, through
``kaggle.api.kaggle_api_extended.KaggleApi`` (PyPI ``kaggle`` 2.x). One module, in the order a download runs:

* The credentials: :func:`find_credentials` looks where the client looks, in its order, without contacting
  Kaggle: an access token (``KAGGLE_API_TOKEN``, its value or the path of a file holding it; else
  ``~/.kaggle/access_token``; inside a Kaggle notebook the notebook's own token first), then the legacy API key
  (``KAGGLE_USERNAME``/``KAGGLE_KEY``, else ``kaggle.json`` in :func:`kaggle_config_dir`), then the OAuth login
  of ``kaggle auth login``. It names the one it will use, so that a rejection can say which and how to repair
  them (:attr:`Credentials.remedy`), and says where credentials go when there are none. The access token is
  looked up with the client's own function (``kagglesdk.get_access_token_from_env``).
* The client: :func:`authenticated_api` imports ``KaggleApi`` only when needed (importing the package
  authenticates and prints) and signs in with the current environment's settings; :func:`list_files` and
  :func:`probe_download` read the competition's file list and the download's headers; :func:`api_error` turns
  any failure of a client call into a :class:`~spark_imagenet.errors.DownloadError` naming the credentials
  used, the competition and the fix.
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

Example:

>>> rules_url(DEFAULT_COMPETITION)
'https://www.kaggle.com/competitions/imagenet-object-localization-challenge/rules'
>>> lock_path("downloads")
PosixPath('downloads/.imagenet-object-localization-challenge.download-lock')
>>> path = download(dest="downloads")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import io
import json
import logging
import os
import shutil
import stat
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable, Iterator

from spark_imagenet.errors import ConfigError, DownloadError, EnvironmentSetupError
from spark_imagenet.units import human_size

logger = logging.getLogger(__name__)


# -- the credentials ----------------------------------------------------------------------------------------

#: Where a Kaggle user creates an API token.
TOKEN_PAGE = "https://www.kaggle.com/settings/api"
#: Package versions to install when the client is missing (kept in step with pyproject.toml).
CLIENT_REQUIREMENT = "'kaggle>=2.2.5,<3' 'six>=1.16'"


def kaggle_config_dir() -> Path:
    """The folder where the ``kaggle`` client looks for ``kaggle.json``, as it decides it.

    Returns:
        Path: ``$KAGGLE_CONFIG_DIR`` when set; else ``~/.kaggle`` when it exists
        (or on a system other than Linux); else ``$XDG_CONFIG_HOME/kaggle``
        (default ``~/.config/kaggle``).
    """
    configured = os.environ.get("KAGGLE_CONFIG_DIR")
    if configured:
        return Path(configured).expanduser()
    home = _home_kaggle()
    if sys.platform.startswith("linux") and not home.exists():
        xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        return Path(xdg) / "kaggle"
    return home


@dataclasses.dataclass(frozen=True)
class Credentials:
    """The Kaggle credentials the client will send, as found by :func:`find_credentials`.

    Attributes:
        kind: ``"token"`` (access token, sent as ``Bearer``), ``"api_key"``
            (legacy username and key, sent as HTTP Basic) or ``"oauth"``
            (the login saved by ``kaggle auth login``).
        source: where they come from, for messages (e.g. ``"the
            KAGGLE_API_TOKEN environment variable"``, ``"/home/me/.kaggle/kaggle.json"``).
        kaggle_json: the ``kaggle.json`` file the client reads, when one exists
            (whatever the kind: the client reads it anyway).
    """

    kind: str
    source: str
    kaggle_json: Path | None = None

    @property
    def remedy(self) -> str:
        """str: the sentence that tells how to repair these credentials once Kaggle rejected them."""
        if self.kind == "oauth":
            return "Sign in again with `kaggle auth login`, then run the same command again."
        return (f"Check those credentials, or create a new API token at {TOKEN_PAGE} and export "
                "KAGGLE_API_TOKEN=<token> (or save it in ~/.kaggle/access_token; a token takes precedence over "
                "a username/key), then run the same command again.")


def _client_missing(package: str) -> EnvironmentSetupError:
    """The error for a missing package of the client (``six``: kaggle 2.2.5 imports it undeclared)."""
    why = ("kaggle 2.2.5 imports it without declaring it as a dependency"
           if package == "six" else "the download needs the official Kaggle client")
    return EnvironmentSetupError(
        f"The Python package {package!r} is missing ({why}). Install the client with: "
        f"pip install {CLIENT_REQUIREMENT} (or reinstall spark-imagenet, which declares both).")


def _home_kaggle() -> Path:
    """``~/.kaggle``, where the client keeps its access token and OAuth login."""
    return Path(os.path.expanduser("~")) / ".kaggle"


def _token_source() -> str | None:
    """Where the client's access token comes from, as the client finds it, or None.

    Raises:
        EnvironmentSetupError: the client's ``kagglesdk`` package is missing.
        DownloadError: the token file cannot be read.
    """
    try:
        from kagglesdk.kaggle_env import KAGGLE_API_V1_TOKEN_PATH, get_access_token_from_env
    except ImportError as e:
        raise _client_missing(e.name or "kagglesdk") from None
    try:
        token, source = get_access_token_from_env()
    except OSError as e:
        raise DownloadError(f"Cannot read the Kaggle access token file {e.filename} ({e.strerror or e}); "
                            "fix its permissions or remove it.") from None
    if not token:
        return None
    if source == "KAGGLE_API_TOKEN":
        value = os.environ.get("KAGGLE_API_TOKEN", "")
        if Path(value).exists():
            return f"the file {value} named by KAGGLE_API_TOKEN"
        return "the KAGGLE_API_TOKEN environment variable"
    if source == KAGGLE_API_V1_TOKEN_PATH:
        return f"the Kaggle notebook's token (the file named by {KAGGLE_API_V1_TOKEN_PATH})"
    for name in ("access_token", "access_token.txt"):  # the client's order
        path = _home_kaggle() / name
        if path.is_file() and path.read_text().strip():
            return str(path)
    return f"the client's access token ({source})"


def _read_kaggle_json(path: Path) -> tuple[dict, str | None]:
    """A JSON credentials file as a dict (``{}`` when unreadable, as the client treats it), and
    what is wrong with it (None when it is a JSON object)."""
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError) as e:
        problem = f"it is not valid JSON ({e})" if isinstance(e, ValueError) else f"it cannot be read ({e})"
        logger.warning(f"warning: {path} is malformed: {problem}; the kaggle client ignores it")
        return {}, problem
    if not isinstance(data, dict):
        problem = f"it holds a JSON {type(data).__name__}, not an object"
        logger.warning(f"warning: {path} is malformed: {problem}; the kaggle client ignores it")
        return {}, problem
    return data, None


def find_credentials() -> Credentials:
    """Which Kaggle credentials the client will use, without contacting Kaggle.

    Looks where the ``kaggle`` client looks, in its order: an access token
    (``KAGGLE_API_TOKEN``, else ``~/.kaggle/access_token``), the legacy API key
    (``KAGGLE_USERNAME``/``KAGGLE_KEY``, each else from ``kaggle.json`` in
    :func:`kaggle_config_dir`), then ``~/.kaggle/credentials.json`` (OAuth).
    Logs a warning when that ``kaggle.json`` is readable by group or
    others, or malformed.

    Returns:
        Credentials: the kind and source found first.

    Raises:
        DownloadError: no credentials anywhere; the message lists every place
            they can go, and names a malformed ``kaggle.json`` as such.
    """
    config = kaggle_config_dir() / "kaggle.json"
    kaggle_json = config if config.is_file() else None
    file_values: dict = {}
    malformed: str | None = None
    if kaggle_json is not None:
        mode = stat.S_IMODE(kaggle_json.stat().st_mode)
        if mode & 0o044:
            logger.warning(f"warning: {kaggle_json} (your Kaggle API key) is readable by other users of this machine "
                           f"(mode {mode:o}); run: chmod 600 {kaggle_json}")
        file_values, malformed = _read_kaggle_json(kaggle_json)

    token = _token_source()
    if token:
        return Credentials("token", token, kaggle_json)

    def origin(field: str) -> str | None:
        if os.environ.get(f"KAGGLE_{field.upper()}"):
            return f"KAGGLE_{field.upper()}"
        if file_values.get(field):
            return str(kaggle_json)
        return None

    user, key = origin("username"), origin("key")
    if user and key:
        if user == key:
            source = user
        elif user.startswith("KAGGLE_") and key.startswith("KAGGLE_"):
            source = "the KAGGLE_USERNAME and KAGGLE_KEY environment variables"
        else:
            source = f"username from {user}, key from {key}"
        return Credentials("api_key", source, kaggle_json)

    oauth = _home_kaggle() / "credentials.json"
    if oauth.is_file() and _read_kaggle_json(oauth)[0].get("refresh_token"):
        return Credentials("oauth", f"the OAuth login in {oauth} (kaggle auth login)", kaggle_json)

    partial = ""
    if user or key:
        partial = (f" ({'a username' if user else 'a key'} was found in {user or key}, "
                   f"but no {'key' if user else 'username'})")
    if malformed is not None:
        head = (f"The Kaggle credentials file {kaggle_json} is malformed: {malformed}. It must be a JSON "
                "object, {\"username\": \"<user>\", \"key\": \"<key>\"}: fix it or replace it. No other "
                f"Kaggle credentials were found{partial}; instead of that file you can also create an API token "
                f"at {TOKEN_PAGE} (Account -> API -> Create New Token) and give it in one of these ways: ")
    else:
        head = (f"No Kaggle credentials found{partial}. Create an API token at {TOKEN_PAGE} "
                "(Account -> API -> Create New Token) and give it in one of these ways: ")
    raise DownloadError(
        head +
        "export KAGGLE_API_TOKEN=<token> (the token, or the path of a file holding it); "
        "or save the token alone in ~/.kaggle/access_token; "
        "or, with a legacy API key, export KAGGLE_USERNAME=<user> KAGGLE_KEY=<key>, "
        f"or save it as {config} ({{\"username\": ..., \"key\": ...}}; the folder is KAGGLE_CONFIG_DIR "
        "when set, else ~/.kaggle if it exists, else ~/.config/kaggle) and run chmod 600 on it; "
        "or sign in once with `kaggle auth login`. Then run the same command again."
    )


# -- the client --------------------------------------------------------------------------------------------

#: The competition whose archive holds ImageNet (ILSVRC CLS-LOC) in the Kaggle layout.
DEFAULT_COMPETITION = "imagenet-object-localization-challenge"
#: Entries asked for per ListDataFiles page.
LIST_PAGE_SIZE = 200
#: Pages of the file list read at most; a longer list gives the size from the download's Content-Length.
LIST_PAGES = 5


def rules_url(competition: str) -> str:
    """The page where a signed-in user reads and accepts a competition's rules.

    Args:
        competition: the competition's name (the last part of its URL).

    Returns:
        str: ``https://www.kaggle.com/competitions/<competition>/rules``.
    """
    return f"https://www.kaggle.com/competitions/{competition}/rules"


class LineLog(io.TextIOBase):
    """A text stream that logs each complete, non-empty line (INFO) to ``logger``."""

    def __init__(self, logger: logging.Logger):
        self._log = logger.info
        self._buf = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self._buf += s
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            if line.strip():
                self._log(line.rstrip())
        return len(s)

    def flush(self) -> None:
        if self._buf.strip():
            self._log(self._buf.rstrip())
        self._buf = ""


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Swallow what the client prints (its auth help, its own warnings)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        yield out


def client_class():
    """Import ``KaggleApi`` (only now: the import authenticates and prints)."""
    try:
        with quiet():
            from kaggle.api.kaggle_api_extended import KaggleApi
    except ModuleNotFoundError as e:
        raise _client_missing(e.name or "?") from None
    except (Exception, SystemExit) as e:
        raise EnvironmentSetupError(
            f"The kaggle package failed to load ({type(e).__name__}: {e}). Check KAGGLE_CONFIG_DIR "
            f"(the client creates that folder) and reinstall the client: pip install {CLIENT_REQUIREMENT}."
        ) from None
    return KaggleApi


def api_args() -> list[str]:
    """The client's environment switches as they are now (it reads them once, at import)."""
    args = []
    if os.environ.get("KAGGLE_API_ENVIRONMENT") == "LOCALHOST":
        args.append("--local")
    if (os.environ.get("VERBOSE") or os.environ.get("VERBOSE_OUTPUT") or "").lower() in ("1", "true", "yes"):
        args.append("--verbose")
    return args


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a ``requests`` error, or None when there was no response."""
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None) if response is not None else None


def reason(exc: BaseException) -> str:
    """An exception's text on one line, at most about 300 characters."""
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else (text or type(exc).__name__)


def api_error(exc: Exception, competition: str, creds: Credentials, what: str,
              file_name: str | None = None) -> DownloadError:
    """The error to raise for a failed Kaggle API call: what happened and what to do.

    Args:
        exc: what the client raised (a ``requests`` error with or without a response, or anything else).
        competition: the competition asked for (named in 403 and 404 messages).
        creds: the credentials used (named in 401 and 403 messages).
        what: the call, as a phrase after "while" (e.g. ``"listing the competition's files"``).
        file_name: the single file asked for, if any (a 404 then names it).

    Returns:
        DownloadError: per HTTP status (401 rejected credentials, 403 rules not accepted, 404 unknown
        competition or file, 429 rate limit, others), no response (network), or a client failure.
    """
    import requests

    status = http_status(exc)
    if status == 401:
        return DownloadError(
            f"Kaggle rejected the credentials from {creds.source} (HTTP 401 while {what}: {reason(exc)}). "
            + creds.remedy)
    if status == 403:
        rules = "rules" in str(exc).lower()
        return DownloadError(
            f"Kaggle refused access to competition {competition!r} (HTTP 403 while {what}: {reason(exc)}). "
            + ("The competition's rules have not been accepted yet with this account"
               if rules else "Usually the competition's rules have not been accepted yet with this account")
            + f": open {rules_url(competition)}, sign in with the account of your credentials ({creds.source}), "
            "read and accept the rules (this cannot be done through the API), then run the same command again.")
    if status == 404:
        if file_name:
            return DownloadError(
                f"Competition {competition!r} has no file {file_name!r}, or no such competition exists "
                f"(HTTP 404 while {what}: {reason(exc)}). Check the names; the competition's files are "
                f"listed on https://www.kaggle.com/competitions/{competition}/data.")
        return DownloadError(
            f"Kaggle has no competition named {competition!r} (HTTP 404 while {what}: {reason(exc)}). "
            "The name is the last part of the competition's URL, https://www.kaggle.com/competitions/<name> "
            f"(ImageNet: {DEFAULT_COMPETITION}); check --competition.")
    if status == 429:
        return DownloadError(f"Kaggle is rate-limiting these requests (HTTP 429 while {what}). "
                             "Wait a few minutes, then run the same command again.")
    if status is not None:
        side = "a problem on Kaggle's side; " if status >= 500 else ""
        return DownloadError(f"Kaggle answered HTTP {status} while {what}: {reason(exc)} ({side}"
                             "run the same command again later).")
    if isinstance(exc, requests.RequestException):
        return DownloadError(
            f"Could not reach Kaggle while {what} ({type(exc).__name__}: {reason(exc)}). Check the network "
            "connection and any HTTPS_PROXY/HTTP_PROXY setting, then run the same command again.")
    return DownloadError(f"The kaggle client failed while {what} ({type(exc).__name__}: {reason(exc)}). "
                         "Run the same command again; if it keeps failing, upgrade the client: "
                         f"pip install -U {CLIENT_REQUIREMENT}.")


def authenticated_api(creds: Credentials, competition: str):
    """A ``KaggleApi`` signed in with the current environment's settings.

    The class is imported now (:func:`client_class`); the settings it reads once at import
    (``KAGGLE_CONFIG_DIR``, ``KAGGLE_API_ENVIRONMENT``) are applied again; what it prints is swallowed.

    Args:
        creds: the credentials it will use (:func:`find_credentials`),
            named in the errors.
        competition: the competition (for :func:`api_error`).

    Returns:
        kaggle.api.kaggle_api_extended.KaggleApi: authenticated.

    Raises:
        DownloadError: the credentials were not accepted (says which and how to fix them), or the sign-in failed.
        EnvironmentSetupError: the client is missing or fails to load.
    """
    KaggleApi = client_class()
    api = KaggleApi()
    config_dir = kaggle_config_dir()
    api.config_dir = str(config_dir)          # the class read KAGGLE_CONFIG_DIR at import
    api.config = str(config_dir / "kaggle.json")
    api.args = api_args()                    # and KAGGLE_API_ENVIRONMENT
    try:
        with quiet():
            api.authenticate()
    except SystemExit:
        if creds.kind == "token":
            raise DownloadError(
                f"Kaggle did not accept the access token from {creds.source} (invalid or expired), and no "
                "other credentials were accepted. " + creds.remedy) from None
        if creds.kind == "oauth":
            raise DownloadError(f"The Kaggle login in {creds.source} has expired or was revoked. "
                                + creds.remedy) from None
        raise DownloadError(f"The kaggle client did not accept the credentials from {creds.source}. "
                            + creds.remedy) from None
    except Exception as e:
        raise api_error(e, competition, creds, "signing in") from None
    return api


@dataclasses.dataclass
class Listing:
    """The file list as read: name -> bytes; ``complete`` when its last page was reached."""

    sizes: dict[str, int]
    complete: bool


def list_files(api, competition: str, creds: Credentials) -> Listing:
    """The competition's file list, up to :data:`LIST_PAGES` pages of :data:`LIST_PAGE_SIZE` entries.

    Args:
        api: an authenticated ``KaggleApi``.
        competition: the competition.
        creds: the credentials used (for :func:`api_error`).

    Returns:
        Listing: file name -> bytes, and whether the last page was reached (an empty page that claims more,
        a known Kaggle paging bug, ends the reading as incomplete).

    Raises:
        DownloadError: the API call failed (:func:`api_error`).
    """
    sizes: dict[str, int] = {}
    token = None
    for _ in range(LIST_PAGES):
        try:
            with quiet():
                page = api.competition_list_files(competition, page_token=token, page_size=LIST_PAGE_SIZE)
        except (Exception, SystemExit) as e:
            raise api_error(e, competition, creds, "listing the competition's files") from None
        files = list(page.files or [])
        for f in files:
            sizes[f.name] = int(f.total_bytes or 0)
        token = page.next_page_token or None
        if not token:
            return Listing(sizes, True)
        if not files:  # a known Kaggle paging bug: an empty page that claims more
            break
    return Listing(sizes, False)


def probe_download(api, competition: str, file_name: str | None, creds: Credentials) -> tuple[int | None, str]:
    """Start the download the client would start, read its headers only, close it.

    Args:
        api: an authenticated ``KaggleApi``.
        competition: the competition.
        file_name: one file of it, or None for the whole archive.
        creds: the credentials used (for :func:`api_error`).

    Returns:
        tuple: the download's ``Content-Length`` in bytes (None when absent) and the file name its URL
        gives (the name the client saves it under).

    Raises:
        DownloadError: the API call failed (:func:`api_error`).
    """
    from kagglesdk.competitions.types.competition_api_service import (
        ApiDownloadDataFileRequest,
        ApiDownloadDataFilesRequest,
    )

    try:
        with quiet(), api.build_kaggle_client() as client:
            service = client.competitions.competition_api_client
            if file_name is None:
                request = ApiDownloadDataFilesRequest()
                request.competition_name = competition
                response = service.download_data_files(request)
            else:
                request = ApiDownloadDataFileRequest()
                request.competition_name = competition
                request.file_name = file_name
                response = service.download_data_file(request)
            try:
                length = response.headers.get("Content-Length")
                url_name = response.url.split("?")[0].rsplit("/", 1)[-1]
            finally:
                response.close()
    except (Exception, SystemExit) as e:
        raise api_error(e, competition, creds, "starting the download", file_name) from None
    return (int(length) if length and length.isdigit() else None), url_name


# -- the download ------------------------------------------------------------------------------------------

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


def _already(path: Path) -> Path:
    """``path``, a finished download, after a log line saying so."""
    logger.info(f"{path} is already complete ({human_size(path.stat().st_size)}); nothing to download "
                "(delete it to download it again)")
    return path


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
            return _already(state.complete)

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
        return _already(state.complete)
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
