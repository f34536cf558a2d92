"""Azure Blob Storage and ADLS Gen2 (``abfs://container@account.dfs.core.windows.net/prefix``,
``az://container/prefix``) as storage, on ``azure-storage-blob``."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from azure.core import MatchConditions
from azure.core import exceptions as aexc
from azure.storage.blob import BlobServiceClient

from spark_imagenet.errors import AccessError, IntegrityError, StorageError, install_hint
from spark_imagenet.storage.base import ObjectInfo, crc32c_bytes
from spark_imagenet.storage.remote import (
    Fault,
    Kind,
    RemoteStorage,
    RootWords,
    crc32c_chunks,
    etag_generation,
    file_digests,
    generation_etag,
    split_url,
    write_chunks,
)

#: The blob metadata key that holds an object's CRC32C (form of :func:`~spark_imagenet.storage.crc32c_bytes`).
CRC32C_METADATA = "crc32c"
#: The environment variable of a connection string (Azurite, or an account key / SAS).
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
#: The environment variable naming the account of ``az://`` URLs when no connection string is set.
ACCOUNT_ENV = "AZURE_STORAGE_ACCOUNT_NAME"
#: The scope of an Azure Storage token (what the credential probe asks DefaultAzureCredential for).
STORAGE_SCOPE = "https://storage.azure.com/.default"
#: Attempts of a new client's first request (:meth:`AzureStorage._probe`), each without azure-core's retries, and
#: the seconds each may take to connect: an endpoint where nothing listens fails in seconds, not after the
#: minutes of the blob service's exponential retries (15 s, then x3).
PROBE_ATTEMPTS = 3
PROBE_CONNECT_TIMEOUT_S = 5
#: What to set when no credential works (every message of missing credentials says it).
CREDENTIAL_HINT = (f"set {CONNECTION_STRING_ENV} (an account key or SAS connection string: "
                   "DefaultEndpointsProtocol=https;AccountName=ACCOUNT;AccountKey=KEY), or sign in for "
                   "DefaultAzureCredential: `az login`, a managed identity on an Azure VM/AKS, or a service principal "
                   "in AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET")
#: The Azure SDK loggers whose multi-line warnings (DefaultAzureCredential's list of failed credentials, retries)
#: the probe silences: its own one-line error says it.
_AZURE_LOGGERS = ("azure.identity", "azure.core")
_quiet_lock = threading.Lock()


def _connection_account(connection_string: str) -> str | None:
    """The ``AccountName`` of a connection string (no other part of it is ever looked at or shown)."""
    for part in connection_string.split(";"):
        key, _sep, value = part.partition("=")
        if key.strip().lower() == "accountname":
            return value.strip()
    return None


@contextlib.contextmanager
def _quiet_azure_logs() -> Iterator[None]:
    """While inside, the Azure SDK's warnings are not shown (:data:`_AZURE_LOGGERS` at ERROR), unless a user
    asked those loggers for more (a level below WARNING): restored after."""
    with _quiet_lock:
        loggers = [logging.getLogger(name) for name in _AZURE_LOGGERS]
        saved = [(logger, logger.level) for logger in loggers if logger.getEffectiveLevel() >= logging.WARNING]
        for logger, _level in saved:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in saved:
                logger.setLevel(level)


def error_code(e: BaseException) -> str:
    """The service's error code of an azure-core exception (``ContainerNotFound``), "" when it has none.

    azure-storage-blob gives a known code as a ``StorageErrorCode`` member, whose ``str()`` is
    ``StorageErrorCode.CONTAINER_NOT_FOUND``: its value is the service's text.
    """
    code = getattr(e, "error_code", None) or ""
    return str(getattr(code, "value", code))


def tried_credentials(message: str) -> list[str]:
    """The credential types DefaultAzureCredential's error lists as attempted (``\\tEnvironmentCredential: ...``
    lines), in order; empty when its text names none."""
    return re.findall(r"^\s+(\w+Credential): ", message, flags=re.MULTILINE)


class AzureStorage(RemoteStorage):
    """Objects under a prefix of an Azure Blob container (an ADLS Gen2 file system included).

    Methods behave as documented on :class:`~spark_imagenet.storage.Storage`. Azure keeps no CRC32C of a
    blob, so every write computes the CRC32C of its bytes here and stores it in the blob's metadata
    (``crc32c``) in the same request, and sends the bytes with ``validate_content`` (an MD5 of every
    request's body, checked by the service): the blob then holds exactly the bytes the CRC32C was computed
    from, and :meth:`stat` and :meth:`list` report it without reading the data. A blob written by another
    tool has no such metadata; its CRC32C is computed by reading it. Downloads check each range's MD5
    (``validate_content``) and the whole object's CRC32C against the metadata
    (:class:`~spark_imagenet.errors.IntegrityError` otherwise).

    Conditional writes use the blob service's conditions: create only = ``If-None-Match: *``; replace only
    the blob read before = ``If-Match: <ETag>`` (the ETag is :attr:`ObjectInfo.generation`, see
    :func:`~spark_imagenet.storage.remote.etag_generation`).

    Credentials: ``AZURE_STORAGE_CONNECTION_STRING`` when set (Azurite, an account key or a SAS; its
    ``AccountName`` must be the URL's account); else ``azure-identity``'s ``DefaultAzureCredential`` chain
    (a service principal in ``AZURE_CLIENT_ID``/``AZURE_TENANT_ID``/``AZURE_CLIENT_SECRET``, workload or
    managed identity, ``az login``) on ``https://ACCOUNT.blob.core.windows.net``. Neither is printed nor
    pickled: a copy on a Spark executor finds its own the same way.

    Failing fast: a new client (first use in a process) asks DefaultAzureCredential for a token once, and
    makes one request (the container's properties) in up to :data:`PROBE_ATTEMPTS` quick attempts without
    azure-core's retries. No credential, an endpoint where nothing listens, rejected credentials or a missing
    container are then one clear error within seconds (the Azure SDK's own multi-line warnings silenced while
    it runs), instead of every request retrying for minutes.

    Args:
        url: ``abfs[s]://container@account.dfs.core.windows.net/prefix`` (also ``...blob.core.windows.net``),
            or ``az://container/prefix`` (the account from the connection string or
            ``AZURE_STORAGE_ACCOUNT_NAME``).
        account_url: the blob endpoint to use with ``DefaultAzureCredential`` instead of
            ``https://ACCOUNT.blob.core.windows.net`` (a sovereign cloud, a private endpoint).
        retry_total: retries per request (azure-core's exponential retry).
        client: an existing ``BlobServiceClient`` to use instead (not pickled).

    Raises:
        StorageError: the URL names no container or account, or holds ``?`` or ``#``.

    Example::

        >>> from spark_imagenet import open_storage
        >>> storage = open_storage("abfs://data@myaccount.dfs.core.windows.net/imagenet")
    >>> type(storage).__name__
    'AzureStorage'
    """

    def __init__(self, url: str, *, account_url: str | None = None, retry_total: int = 10, client: Any = None):
        scheme = url.split("://", 1)[0].lower()
        example = "az://CONTAINER/PREFIX" if scheme == "az" else "abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX"
        netloc, self.prefix = split_url(url, scheme, example)
        container, at, host = netloc.partition("@")
        self.container = container
        self.account = host.split(".", 1)[0] if at else None
        if at and not self.account or not container:
            raise StorageError(f"{url}: no container or account; write {example}", key="url", value=url)
        if self.account is None:
            conn = os.environ.get(CONNECTION_STRING_ENV)
            self.account = (_connection_account(conn) if conn else None) or os.environ.get(ACCOUNT_ENV)
            if not self.account:
                raise StorageError(f"{url}: an az:// URL names no storage account; set {CONNECTION_STRING_ENV} or "
                                   f"{ACCOUNT_ENV}, or write abfs://{container}@ACCOUNT.dfs.core.windows.net/...",
                                   key="url", value=url)
        self._root = f"{scheme}://{netloc}"
        self.url = self._root + (f"/{self.prefix}" if self.prefix else "")
        self.account_url = account_url
        self.retry_total = retry_total
        self._client = client

    def reopen_options(self) -> dict[str, Any]:
        return {"account_url": self.account_url}

    def _make_client(self) -> Any:
        """A ``BlobServiceClient`` on the connection string or DefaultAzureCredential, checked by :meth:`_probe`.

        Raises:
            AccessError: no usable credential, a connection string of another account or not valid, credentials
                the service rejects, or a missing container.
            StorageError: the endpoint cannot be reached (after :data:`PROBE_ATTEMPTS` quick attempts), or
                azure-identity is not installed.
        """
        conn = os.environ.get(CONNECTION_STRING_ENV)
        client = self._connection_string_client(conn) if conn else self._identity_client()
        with _quiet_azure_logs():
            self._probe(client)
        return client

    def _connection_string_client(self, conn: str) -> Any:
        named = _connection_account(conn)
        if named and named != self.account:
            raise AccessError(f"{self.url}: {CONNECTION_STRING_ENV} is for the account {named!r}, the URL names "
                              f"{self.account!r}; set the connection string of that account, or unset it to use "
                              "DefaultAzureCredential", key=CONNECTION_STRING_ENV, value=named)
        try:
            return BlobServiceClient.from_connection_string(conn, retry_total=self.retry_total)
        except ValueError:
            raise AccessError(f"{self.url}: {CONNECTION_STRING_ENV} is not a valid connection string",
                              key=CONNECTION_STRING_ENV) from None

    def _identity_client(self) -> Any:
        """A client on DefaultAzureCredential, whose chain is asked for a token once here: no credential fails now,
        in one message, instead of each request retrying the whole chain for minutes."""
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:
            raise StorageError(f"{self.url}: without {CONNECTION_STRING_ENV}, Azure credentials come from "
                               f"azure-identity: {install_hint('azure')} (azure-storage-blob, "
                               "azure-identity)", key="url", value=self.url) from None
        credential = DefaultAzureCredential()
        try:
            with _quiet_azure_logs():
                credential.get_token(STORAGE_SCOPE)
        except aexc.ClientAuthenticationError as e:
            tried = tried_credentials(str(e.message))
            raise AccessError(
                f"{self.url}: no usable Azure credentials for the storage account {self.account}: "
                f"{CONNECTION_STRING_ENV} is not set, and DefaultAzureCredential found no token"
                + (f" (tried {', '.join(tried)})" if tried else f" ({type(e).__name__})")
                + f". To fix it, {CREDENTIAL_HINT}", key="url", value=self.url) from None
        return BlobServiceClient(self.account_url or f"https://{self.account}.blob.core.windows.net",
                                 credential=credential, retry_total=self.retry_total)

    def _probe(self, client: Any) -> None:
        """The first request of a new client: the container's properties, with :data:`PROBE_ATTEMPTS` quick
        attempts and no azure-core retries, so a dead endpoint, rejected credentials or a missing container are
        said in seconds. A 403 other than rejected credentials (blob access without container read), a 429 or
        a 5xx leave the answer to the requests that follow (with their full retries).

        Raises:
            AccessError, StorageError: see :meth:`_make_client`.
        """
        container = client.get_container_client(self.container)
        for attempt in range(1, PROBE_ATTEMPTS + 1):
            try:
                container.get_container_properties(retry_total=0, connection_timeout=PROBE_CONNECT_TIMEOUT_S)
            except aexc.ResourceNotFoundError:
                raise self._missing_root() from None
            except aexc.ServiceRequestError as e:
                if attempt == PROBE_ATTEMPTS:
                    raise self._unreachable(client, e, attempt) from None
                time.sleep(attempt)
                continue
            except aexc.HttpResponseError as e:
                code = error_code(e)
                if (e.status_code == 403 and code != "AuthenticationFailed") or e.status_code == 429 or (
                        e.status_code or 0) >= 500:
                    return
                raise self._error(e, self._root) from None
            self._root_ok = True
            return

    def _unreachable(self, client: Any, e: BaseException, attempts: int) -> StorageError:
        endpoint = f"{client.scheme}://{client.primary_hostname}"
        return StorageError(f"{self._root}: cannot reach the blob endpoint {endpoint} of the account {self.account} "
                            f"({attempts} attempts, {type(e).__name__}); check that it is running, the endpoint in "
                            f"{CONNECTION_STRING_ENV} or account_url= (scheme and port), the network and proxy "
                            "settings", key="url", value=self._root)

    def _blob(self, name: str) -> Any:
        return self.client.get_blob_client(self.container, self._key(name))

    # -- errors ---------------------------------------------------------------------------------------

    def _probe_root(self) -> None:
        self.client.get_container_client(self.container).get_container_properties()

    def _root_words(self) -> RootWords:
        return RootWords("container", self.container, f"in the storage account {self.account}",
                         f"with `az storage container create --name {self.container} --account-name {self.account} "
                         "--auth-mode login`")

    def _classify(self, e: BaseException, action: str) -> Fault | None:
        """What an azure-core exception means (never naming the credentials)."""
        code = error_code(e)
        status = getattr(e, "status_code", None)
        if isinstance(e, (aexc.ResourceExistsError, aexc.ResourceModifiedError)) or status == 412:
            return Fault(Kind.PRECONDITION, str(status))
        if code == "ContainerNotFound":
            return Fault(Kind.MISSING_ROOT)
        if type(e).__name__ == "CredentialUnavailableError" or (
                isinstance(e, aexc.ClientAuthenticationError) and status is None):
            return Fault(Kind.CREDENTIALS, f"no usable Azure credentials for the storage account {self.account} "
                                           f"({type(e).__name__})", f"To fix it, {CREDENTIAL_HINT}")
        if status == 401 or code == "AuthenticationFailed":
            return Fault(Kind.CREDENTIALS, f"the credentials were rejected ({status} {code})",
                         f"Check the key or SAS in {CONNECTION_STRING_ENV}, or the identity DefaultAzureCredential "
                         "finds")
        if status == 403:
            need = "Storage Blob Data Contributor" if action == "write" else "Storage Blob Data Reader"
            return Fault(Kind.DENIED, f"403 {code}", f"The identity in use needs the role {need} on the account "
                                                     f"{self.account} or its container {self.container}, or the "
                                                     "connection string's key or SAS is wrong or expired")
        if isinstance(e, aexc.ResourceNotFoundError) or status == 404:
            return Fault(Kind.MISSING)
        if isinstance(e, aexc.ServiceRequestError):
            return Fault(Kind.UNREACHABLE, f"the blob endpoint of {self.account} (from {CONNECTION_STRING_ENV} or "
                                           "account_url=); check that it is running, its scheme and port, the "
                                           f"network and proxy settings ({type(e).__name__})")
        if isinstance(e, aexc.HttpResponseError):
            return Fault(Kind.FAILED, f"{code or type(e).__name__}, HTTP {status}")
        return None

    # -- Storage interface ------------------------------------------------------------------------------

    def _info(self, name: str, size: int, etag: str | None, metadata: dict | None) -> ObjectInfo:
        return ObjectInfo(name, size, (metadata or {}).get(CRC32C_METADATA) or None, etag_generation(etag))

    def stat(self, name: str) -> ObjectInfo | None:
        try:
            props = self._blob(name).get_blob_properties()
        except aexc.ResourceNotFoundError as e:
            if error_code(e) == "ContainerNotFound":
                raise self._missing_root() from None
            self._check_root()
            return None
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None
        return self._info(name, int(props.size), props.etag, props.metadata)

    def _computed_crc32c(self, name: str) -> str:
        """From a streamed read of the blob (:meth:`crc32c` uses the one in its metadata first)."""
        try:
            return crc32c_chunks(self._blob(name).download_blob(validate_content=True).chunks())
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def read_bytes(self, name: str) -> bytes:
        try:
            return self._blob(name).download_blob(validate_content=True).readall()
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def _upload(self, name: str, data: Any, crc: str, **conditions: Any) -> str:
        """One upload with its CRC32C in the metadata; returns the new ETag."""
        reply = self._blob(name).upload_blob(data, validate_content=True, metadata={CRC32C_METADATA: crc},
                                             **conditions)
        return reply.get("etag")

    def write_bytes(self, name: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        conditions: dict[str, Any] = {"overwrite": if_generation_match != 0}
        if if_generation_match:
            conditions.update(etag=generation_etag(if_generation_match), match_condition=MatchConditions.IfNotModified)
        try:
            self._upload(name, data, crc32c_bytes(data), **conditions)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write", replacing=bool(if_generation_match)) from None

    def _put_and_stat(self, local_path: str | os.PathLike, name: str) -> ObjectInfo:
        """One upload; the object's size and CRC32C are those of the bytes the service checked (MD5 per
        request) and stored with their CRC32C in one request: no request after it."""
        try:
            size, crc, _md5 = file_digests(local_path)
            with open(local_path, "rb") as f:
                etag = self._upload(name, f, crc, overwrite=True, length=size)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None
        return ObjectInfo(name, size, crc, etag_generation(etag))

    def put_file(self, local_path: str | os.PathLike, name: str, *, move: bool = False) -> None:
        self._put_and_stat(local_path, name)

    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        """Stream blob ``name`` to ``local_path``, every range MD5-checked and, where the blob's metadata holds
        its CRC32C, the whole against it.

        Raises:
            IntegrityError: the bytes received do not match.
            StorageError: the blob does not exist or cannot be read.
        """
        try:
            stream = self._blob(name).download_blob(validate_content=True)
            got = write_chunks(stream.chunks(), local_path)
            expected = (stream.properties.metadata or {}).get(CRC32C_METADATA)
        except aexc.HttpResponseError as e:
            raise self._error(e, self.where(name), "read") from None
        except Exception as e:  # noqa: BLE001 - azure-storage-blob raises a plain exception for an MD5 mismatch
            if "md5" in str(e).lower():
                raise IntegrityError(f"{self.where(name)}: a downloaded range does not match its MD5 (damaged "
                                     "transfer)", key="url", value=self.where(name)) from None
            raise self._error(e, self.where(name), "read") from None
        if expected and got != expected:
            raise IntegrityError(f"{self.where(name)}: the downloaded bytes have crc32c {got}, the blob's metadata "
                                 f"says {expected} (corrupt blob or transfer)", key="url", value=self.where(name))

    def list(self) -> list[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            blobs = self.client.get_container_client(self.container).list_blobs(name_starts_with=base,
                                                                                include=["metadata"])
            # ADLS Gen2 (hierarchical namespace) lists folders as empty blobs marked hdi_isfolder: not objects.
            out = [self._info(b.name[len(base):], int(b.size), b.etag, b.metadata) for b in blobs
                   if (b.metadata or {}).get("hdi_isfolder") != "true"]
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.url, "list") from None
        return sorted(out, key=lambda o: o.name)

    def delete(self, name: str, *, best_effort: bool = False) -> None:
        try:
            self._blob(name).delete_blob(**({"retry_total": 0} if best_effort else {}))
        except Exception as e:  # noqa: BLE001
            if not self._gone(e):
                raise self._error(e, self.where(name), "write") from None
