"""Which Kaggle credentials the ``kaggle`` client will use, found without contacting Kaggle.

The client looks, in this order, for an access token (``KAGGLE_API_TOKEN``,
its value or the path of a file holding it; else ``~/.kaggle/access_token``;
inside a Kaggle notebook the notebook's own token first), then the legacy API
key (``KAGGLE_USERNAME``/``KAGGLE_KEY``, else ``kaggle.json`` in
:func:`kaggle_config_dir`), then the OAuth login of ``kaggle auth login``.
:func:`find_credentials` names the one it will use, so that a rejection can say
which and how to repair them (:attr:`Credentials.remedy`), and says where
credentials go when there are none. The access token is
looked up with the client's own function (``kagglesdk.get_access_token_from_env``);
why the rest is read here: docs/design.md, 'The kaggle client'.

Example::

    creds = find_credentials()   # warnings are logged (spark_imagenet.logs)
    print(creds.kind, creds.source)    # e.g. token the KAGGLE_API_TOKEN environment variable
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import sys
from pathlib import Path

from spark_imagenet.errors import DownloadError, EnvironmentSetupError

logger = logging.getLogger(__name__)

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
    home = Path(os.path.expanduser("~")) / ".kaggle"
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


def _token_source() -> str | None:
    """Where the client's access token comes from, as the client finds it, or None.

    Raises:
        EnvironmentSetupError: the client's ``kagglesdk`` package is missing.
        DownloadError: the token file cannot be read.
    """
    try:
        from kagglesdk.kaggle_env import KAGGLE_API_V1_TOKEN_PATH, get_access_token_from_env
    except ImportError as e:
        raise EnvironmentSetupError(
            f"The Python package {e.name or 'kagglesdk'!r} is missing (the download needs the official Kaggle "
            f"client). Install the client with: pip install {CLIENT_REQUIREMENT} (or reinstall spark-imagenet, "
            "which declares both).") from None
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
    home = Path(os.path.expanduser("~")) / ".kaggle"
    for name in ("access_token", "access_token.txt"):  # the client's order
        path = home / name
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

    oauth = Path(os.path.expanduser("~")) / ".kaggle" / "credentials.json"
    if oauth.is_file() and _read_kaggle_json(oauth, None)[0].get("refresh_token"):
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
