"""The official ``kaggle`` client, signed in, and its errors as messages that say what to do.

:func:`authenticated_api` imports ``KaggleApi`` only when needed (importing the
package authenticates and prints) and signs in with the current environment's
settings; :func:`list_files` and :func:`probe_download` read the competition's
file list and the download's headers; :func:`api_error` turns any failure of a
client call into a :class:`~spark_imagenet.errors.DownloadError` naming the
credentials used, the competition and the fix. The client's pitfalls:
docs/design.md, 'The kaggle client'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
from typing import Iterator

from spark_imagenet.errors import DownloadError, EnvironmentSetupError
from spark_imagenet.source.kaggle_credentials import (
    CLIENT_REQUIREMENT, Credentials, kaggle_config_dir)

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
        missing = e.name or "?"
        why = ("kaggle 2.2.5 imports it without declaring it as a dependency"
               if missing == "six" else "the download needs the official Kaggle client")
        raise EnvironmentSetupError(
            f"The Python package {missing!r} is missing ({why}). Install the client with: "
            f"pip install {CLIENT_REQUIREMENT} (or reinstall spark-imagenet, which declares both)."
        ) from None
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
        creds: the credentials it will use (:func:`~spark_imagenet.source.kaggle_credentials.find_credentials`),
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
