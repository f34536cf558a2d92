"""HDFS (``hdfs://namenode[:port]/path``, ``webhdfs://namenode:http-port/path``) as storage, over WebHDFS with
fsspec's ``webhdfs`` implementation."""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import requests
import requests.adapters
from fsspec.implementations.webhdfs import WebHDFS
from urllib3.util.retry import Retry

from spark_imagenet.errors import IntegrityError, PreconditionFailed, StorageError
from spark_imagenet.storage.base import CHUNK_BYTES, ObjectInfo, crc32c_bytes
from spark_imagenet.storage.remote import Fault, Kind, RemoteStorage, crc32c_chunks, file_digests, split_url

#: The NameNode's HTTP port in Hadoop 3 (``dfs.namenode.http-address``'s default), where WebHDFS answers.
DEFAULT_WEBHDFS_PORT = 9870
#: The extended attribute holding a file's CRC32C (form of :func:`~spark_imagenet.storage.crc32c_bytes`),
#: recorded by :class:`HDFSStorage` after reading the file back.
CRC32C_XATTR = "user.spark-imagenet.crc32c"
#: Temporary names of writes in flight: ``.<name>.tmp-<pid>-<8 hex digits>`` (left out of listings).
_TMP_NAME = re.compile(r"\..+\.tmp-\d+-[0-9a-f]{8}")


class _Remote(Exception):
    """A WebHDFS error reply: its Java exception's simple name, its message and HTTP status."""

    def __init__(self, exception: str, message: str, status: int):
        super().__init__(f"{exception}: {message}")
        self.exception, self.message, self.status = exception, message, status


def _raise_for_status(reply: Any) -> None:
    """Raise a WebHDFS error reply (NameNode or DataNode, status 400 and above) as :class:`_Remote`.

    Raises:
        _Remote: its RemoteException's name and message's first line, else the HTTP reason.
    """
    if reply.status_code >= 400:
        try:
            remote = reply.json()["RemoteException"]
            raise _Remote(remote.get("exception", ""), (remote.get("message") or "").partition("\n")[0],
                          reply.status_code)
        except (ValueError, KeyError, TypeError):
            raise _Remote("", reply.reason or "", reply.status_code) from None


def webhdfs_port_from_conf(host: str, conf_dir: str | None = None) -> int | None:
    """The NameNode's HTTP port from ``dfs.namenode.http-address`` in ``$HADOOP_CONF_DIR/hdfs-site.xml``.

    Args:
        host: the NameNode host of the URL (the address is used when it names that host, ``0.0.0.0``, or
            when the file has one address only).
        conf_dir: the configuration folder (None: ``HADOOP_CONF_DIR``).

    Returns:
        int | None: the port; None when there is no such file or setting.
    """
    folder = conf_dir or os.environ.get("HADOOP_CONF_DIR")
    if not folder or not (Path(folder) / "hdfs-site.xml").is_file():
        return None
    try:
        root = ET.parse(Path(folder) / "hdfs-site.xml").getroot()
    except (ET.ParseError, OSError):
        return None
    for prop in root.iter("property"):
        if (prop.findtext("name") or "").strip() == "dfs.namenode.http-address":
            addr_host, _sep, port = (prop.findtext("value") or "").strip().rpartition(":")
            if port.isdigit() and addr_host in (host, "0.0.0.0", "localhost", "127.0.0.1", ""):
                return int(port)
    return None


class HDFSStorage(RemoteStorage):
    """Files under a folder of HDFS, reached over WebHDFS (the NameNode's HTTP API).

    Methods behave as documented on :class:`~spark_imagenet.storage.Storage`. A write goes to a temporary
    file beside its target (``.<name>.tmp-<pid>-<random>``), then is renamed into place, so a reader sees
    the old file or the whole new one: replacing with ``RENAME`` and ``renameoptions=OVERWRITE`` (atomic on
    the NameNode), creating only with ``renameoptions=NONE``, which the NameNode refuses when the target
    exists. :attr:`ObjectInfo.generation` is the file's inode id (``fileId``: new for every write, as every
    write renames a new file); a compare-and-swap renames the current file aside first, checks that it was
    the one read, then renames the new one into place (a reader may find no file between the two renames).

    Checksums: HDFS checks every block against its own CRC32C per 512 bytes, but WebHDFS's
    ``GETFILECHECKSUM`` reports an MD5 of those, not the file's CRC32C. So every write reads its temporary
    file back and checks its CRC32C against the bytes sent (they cross the network twice) before the
    rename, and records it in the extended attribute :data:`CRC32C_XATTR`; :meth:`crc32c` answers from it
    with one small request (a rerun checks a dataset without reading it), else, for a file written by
    another tool or with extended attributes off, by reading the file. :meth:`stat` and :meth:`list` report
    no CRC32C. Downloads are verified by the callers against the manifest.

    Where WebHDFS answers: a ``webhdfs://host:port/path`` URL names the HTTP port itself. For
    ``hdfs://host[:rpc-port]/path`` (the RPC port is not used) it is ``webhdfs_port=`` if given, else the
    port of ``dfs.namenode.http-address`` in ``$HADOOP_CONF_DIR/hdfs-site.xml``, else 9870 (Hadoop 3's
    default). The user is ``user=``, else ``HADOOP_USER_NAME``, else the login name (simple
    authentication); ``kerberos=True`` uses SPNEGO through ``requests-kerberos``.

    Args:
        url: ``hdfs://namenode[:port]/path`` or ``webhdfs://namenode:http-port/path``.
        webhdfs_port: the NameNode's HTTP port (``hdfs://`` URLs only).
        user: the HDFS user for simple authentication.
        use_https: talk to WebHDFS over HTTPS (``swebhdfs``).
        kerberos: authenticate with Kerberos (SPNEGO) instead of a user name.
        retries: retries of a refused connection or a 503 reply, per request.

    Raises:
        StorageError: the URL has no host, or holds ``?`` or ``#``.

    Example::

        >>> from spark_imagenet import open_storage
        >>> storage = open_storage("hdfs://namenode:8020/user/me/imagenet")  # WebHDFS on namenode:9870
    >>> type(storage).__name__
    'HDFSStorage'
    """

    #: Only a refused connection and a 503 are retried (:meth:`_make_client`): other errors are said as they came.
    RETRIES = False

    def __init__(self, url: str, *, webhdfs_port: int | None = None, user: str | None = None,
                 use_https: bool = False, kerberos: bool = False, retries: int = 3):
        scheme = url.split("://", 1)[0].lower()
        netloc, self.prefix = split_url(url, scheme, f"{scheme}://NAMENODE:PORT/PATH")
        host, _sep, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "")
        self.host = host
        if scheme == "webhdfs":
            if not port.isdigit():
                raise StorageError(f"{url}: a webhdfs:// URL needs the NameNode's HTTP port: webhdfs://HOST:PORT/PATH",
                                   key="url", value=url)
            self.http_port = int(port)
        else:
            self.http_port = int(webhdfs_port or webhdfs_port_from_conf(host) or DEFAULT_WEBHDFS_PORT)
        self._root = f"{scheme}://{netloc}"
        self.url = self._root + (f"/{self.prefix}" if self.prefix else "")
        self.user = user or os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
        self.use_https = use_https
        self.kerberos = kerberos
        self.retries = retries

    def reopen_options(self) -> dict[str, Any]:
        return {"webhdfs_port": self.http_port if self._root.startswith("hdfs") else None, "user": self.user,
                "use_https": self.use_https, "kerberos": self.kerberos}

    def _make_client(self) -> Any:
        fs = WebHDFS(self.host, port=self.http_port, user=None if self.kerberos else self.user,
                     kerberos=self.kerberos, use_https=self.use_https, skip_instance_cache=True)
        retry = Retry(total=self.retries, connect=self.retries, read=0, status=self.retries,
                      status_forcelist=(503,), allowed_methods={"GET", "DELETE"}, backoff_factor=0.5,
                      raise_on_status=False)
        for prefix in ("http://", "https://"):
            fs.session.mount(prefix, requests.adapters.HTTPAdapter(max_retries=retry, pool_maxsize=32))
        return fs

    def _path(self, name: str) -> str:
        return "/" + self._key(name)

    @property
    def _endpoint(self) -> str:
        return f"{'https' if self.use_https else 'http'}://{self.host}:{self.http_port}"

    # -- the WebHDFS calls ----------------------------------------------------------------------------

    def _call(self, op: str, path: str, method: str = "GET", *, redirect: bool = True, data: Any = None,
              stream: bool = False, **params: Any) -> Any:
        """One WebHDFS request (``op`` on ``path``); the reply, or :class:`_Remote` for an error reply.

        Raises:
            _Remote: the NameNode or DataNode answered with an error.
            requests.RequestException: it could not be reached.
        """
        fs = self.client
        reply = fs.session.request(method, fs.url + path, params={**fs.pars, "op": op, **params},
                                   allow_redirects=redirect, data=data, stream=stream, timeout=(30, 600))
        _raise_for_status(reply)
        return reply

    def _send(self, path: str, body: Any) -> None:
        """Create ``path`` (refused when it exists) with ``body``: the NameNode's redirect, then the DataNode."""
        location = self._call("CREATE", path, "PUT", redirect=False, overwrite="false").headers["Location"]
        reply = self.client.session.put(location, data=body, headers={"content-type": "application/octet-stream"},
                                        timeout=(30, 3600))
        _raise_for_status(reply)

    def _rename(self, src: str, dst: str, options: str | None) -> bool:
        """Rename ``src`` to ``dst``: ``options`` ``"OVERWRITE"`` / ``"NONE"`` (raises when ``dst`` exists),
        or None (a plain rename: False when it did not happen)."""
        extra = {"renameoptions": options} if options else {}
        reply = self._call("RENAME", src, "PUT", destination=dst, **extra)
        return options is not None or bool(reply.json().get("boolean"))

    def _classify(self, e: BaseException, action: str) -> Fault | None:
        """What a WebHDFS error reply or a connection failure means."""
        if isinstance(e, _Remote):
            if e.exception == "FileAlreadyExistsException":
                return Fault(Kind.PRECONDITION)
            if e.exception == "FileNotFoundException":
                return Fault(Kind.MISSING)
            if e.exception == "ChecksumException":
                return Fault(Kind.CORRUPT, f"HDFS found a block whose bytes do not match its checksum "
                                           f"({e.message[:200]})")
            # WebHDFS answers 403 for most IOExceptions too (safe mode, a standby NameNode): only these, or a bare
            # 401/403 without an exception (authentication), are a permission refused.
            if e.exception in ("AccessControlException", "SecurityException", "AuthorizationException") \
                    or (not e.exception and e.status in (401, 403)):
                return Fault(Kind.DENIED, f"{e.exception or e.status}: {e.message[:200]}",
                             f"The HDFS user {self.user!r} may not {action} there: set HADOOP_USER_NAME (or user=) "
                             "to a user that may, or change the folder's permissions (hdfs dfs -chmod)")
            advice = (f"{self.host} is a standby NameNode: give the active NameNode in the URL"
                      if e.exception == "StandbyException" else "")
            return Fault(Kind.FAILED, f"{e.exception or 'HTTP'} {e.status}: {e.message[:200]}", advice)
        if isinstance(e, (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)):
            return Fault(Kind.CORRUPT, "the DataNode broke off the transfer midway (HDFS does this when a block "
                                       "fails its own CRC32C check, or when the DataNode stops); `hdfs fsck PATH` "
                                       "lists corrupt blocks")
        if isinstance(e, requests.RequestException):
            return Fault(Kind.UNREACHABLE, f"WebHDFS at {self._endpoint} (the NameNode's HTTP port: webhdfs_port=, "
                                           "dfs.namenode.http-address in $HADOOP_CONF_DIR/hdfs-site.xml, or "
                                           f"{DEFAULT_WEBHDFS_PORT}); check that WebHDFS is on "
                                           f"(dfs.webhdfs.enabled) and the network ({type(e).__name__})")
        return None

    # -- Storage interface ------------------------------------------------------------------------------

    def _status(self, path: str) -> dict | None:
        """GETFILESTATUS of ``path``; None when it does not exist."""
        try:
            return self._call("GETFILESTATUS", path).json()["FileStatus"]
        except _Remote as e:
            if e.exception == "FileNotFoundException":
                return None
            raise

    def stat(self, name: str) -> ObjectInfo | None:
        try:
            status = self._status(self._path(name))
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None
        if status is None or status.get("type") != "FILE":
            return None
        return ObjectInfo(name, int(status["length"]), None, int(status["fileId"]))

    def _crc32c_xattr(self, path: str) -> str | None:
        """The CRC32C this class recorded in the file's extended attribute, None without one."""
        try:
            reply = self._call("GETXATTRS", path, **{"xattr.name": CRC32C_XATTR, "encoding": "text"})
        except _Remote as e:
            if e.exception == "FileNotFoundException":
                raise
            return None  # no such attribute, or extended attributes off
        for attr in reply.json().get("XAttrs", []):
            if attr.get("name") == CRC32C_XATTR and attr.get("value"):
                return str(attr["value"]).strip('"')
        return None

    def crc32c(self, name: str) -> str:
        """CRC32C of file ``name``: the one recorded when this class wrote it (checked then by reading the file
        back; the extended attribute :data:`CRC32C_XATTR`, one small request), else from a streamed read.

        Raises:
            StorageError: the file does not exist or cannot be read.
        """
        path = self._path(name)
        try:
            return self._crc32c_xattr(path) or self._read_crc32c(path)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def read_bytes(self, name: str) -> bytes:
        try:
            return self._call("OPEN", self._path(name)).content
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def _tmp(self, path: str) -> str:
        folder, _sep, base = path.rpartition("/")
        return f"{folder}/.{base}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def _read_crc32c(self, path: str) -> str:
        """CRC32C of a file from a streamed read."""
        with self._call("OPEN", path, stream=True) as reply:
            return crc32c_chunks(reply.iter_content(CHUNK_BYTES))

    def _publish(self, name: str, body: Any, crc: str, if_generation_match: int | None) -> None:
        """Write ``body`` (whose CRC32C is ``crc``) to a temporary file, read it back and check it, record the
        CRC32C in the extended attribute :data:`CRC32C_XATTR`, then rename it into place (see the class doc).

        Raises:
            IntegrityError: the file read back does not have ``crc``.
        """
        path = self._path(name)
        tmp = self._tmp(path)
        try:
            self._send(tmp, body)
            got = self._read_crc32c(tmp)
            if got != crc:
                raise IntegrityError(f"{self.where(name)}: the file written has crc32c {got}, the bytes sent {crc} "
                                     "(damaged transfer)", key="url", value=self.where(name))
            with contextlib.suppress(_Remote):  # extended attributes off (dfs.namenode.xattrs.enabled): none kept
                self._call("SETXATTR", tmp, "PUT", **{"xattr.name": CRC32C_XATTR, "xattr.value": f'"{crc}"',
                                                      "flag": "CREATE"})
            if if_generation_match is None:
                self._rename(tmp, path, "OVERWRITE")
            elif if_generation_match == 0:
                self._rename(tmp, path, "NONE")
            else:
                self._swap(name, tmp, if_generation_match)
        except BaseException:
            with contextlib.suppress(Exception):
                self._call("DELETE", tmp, "DELETE", recursive="false")
            raise

    def _swap(self, name: str, tmp: str, generation: int) -> None:
        """Replace ``name`` by ``tmp`` only if ``name`` is still the file of inode ``generation``."""
        path = self._path(name)
        stale = PreconditionFailed(f"{self.where(name)} was changed by another writer since it was read")
        current = self._status(path)
        if current is None or int(current["fileId"]) != generation:
            raise stale
        aside = self._tmp(path)
        if not self._rename(path, aside, None):  # another writer moved it first
            raise stale
        moved = self._status(aside)
        if moved is None or int(moved["fileId"]) != generation:  # replaced between the stat and the rename
            with contextlib.suppress(Exception):
                self._rename(aside, path, "NONE")
            raise stale
        self._rename(tmp, path, "NONE")
        self._call("DELETE", aside, "DELETE", recursive="false")

    def write_bytes(self, name: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        try:
            self._publish(name, data, crc32c_bytes(data), if_generation_match)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write", replacing=bool(if_generation_match)) from None

    def put_file(self, local_path: str | os.PathLike, name: str, *, move: bool = False) -> None:
        try:
            _size, crc, _md5 = file_digests(local_path)
            with open(local_path, "rb") as f:
                self._publish(name, f, crc, None)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None

    def get_file(self, name: str, local_path: str | os.PathLike) -> None:
        try:
            with self._call("OPEN", self._path(name), stream=True) as reply, open(local_path, "wb") as f:
                for chunk in reply.iter_content(CHUNK_BYTES):
                    f.write(chunk)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "read") from None

    def _walk(self, path: str, rel: str, out: list[ObjectInfo]) -> None:
        for st in self._call("LISTSTATUS", path).json()["FileStatuses"]["FileStatus"]:
            name = f"{rel}{st['pathSuffix']}"
            if st["type"] == "DIRECTORY":
                self._walk(f"{path}/{st['pathSuffix']}", f"{name}/", out)
            elif not _TMP_NAME.fullmatch(st["pathSuffix"]):
                out.append(ObjectInfo(name, int(st["length"]), None, int(st["fileId"])))

    def list(self) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        top = "/" + self.prefix if self.prefix else "/"
        try:
            status = self._status(top)
            if status is not None and status["type"] == "DIRECTORY":
                self._walk(top.rstrip("/"), "", out)
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.url, "list") from None
        return sorted(out, key=lambda o: o.name)

    def delete(self, name: str, *, best_effort: bool = False) -> None:
        try:
            status = self._status(self._path(name))
            if status is not None and status["type"] == "FILE":
                self._call("DELETE", self._path(name), "DELETE", recursive="false")
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.where(name), "write") from None

    def tidy(self, prefix: str) -> None:
        """Remove the folder ``prefix`` when nothing but empty folders and temporary files is left in it."""
        with contextlib.suppress(Exception):
            top = self._path(prefix)
            left = []
            self._walk(top, "", left)
            if not left:
                self._call("DELETE", top, "DELETE", recursive="true")

    def root_exists(self) -> bool:
        try:
            return self._status("/" + self.prefix) is not None
        except Exception as e:  # noqa: BLE001
            raise self._error(e, self.url, "read") from None

    def remove_empty_root(self) -> None:
        with contextlib.suppress(Exception):
            if self.prefix and not self._call("LISTSTATUS", "/" + self.prefix).json()["FileStatuses"]["FileStatus"]:
                self._call("DELETE", "/" + self.prefix, "DELETE", recursive="false")
