"""The Spark master URL, parsed once: its kind, where its tasks run, and the task slots the URL alone tells.

Every place that examines a master (the job's ``master`` setting, the preflight slot count, the GPU check,
the master of a Spark Connect server, the doctor, the command line) asks :meth:`Master.parse` instead of
matching the URL itself. The forms are those Spark's ``SparkContext`` takes, and Spark Connect's:

* no URL (None): kind ``unset``; spark-submit's master, ``SPARK_REMOTE``, else ``local[N]`` decide;
* ``local``: kind ``local``, 1 task thread in the driver's JVM;
* ``local[N]``, ``local[N,F]``: kind ``local``, N task threads (N >= 1; F: the task failures allowed);
* ``local[*]``, ``local[*,F]``: kind ``local``, a task thread per core of the driver's machine;
* ``local-cluster[E,C,MB]``: kind ``local-cluster``, E executor JVMs on this machine, C cores and MB MiB each;
* ``spark://HOST:PORT``, or several comma-separated (high availability): kind ``standalone``;
* ``yarn``: kind ``yarn``, the cluster ``HADOOP_CONF_DIR`` names;
* ``k8s://https://HOST:PORT``: kind ``k8s``, a Kubernetes API server;
* ``sc://HOST[:PORT][/;params]``: kind ``connect``, a Spark Connect server.

Anything else (``yarn-client``, ``mesos://``: forms Spark 4 no longer takes) is no master here.

Pure: no Spark, no I/O. ``local[*]`` counts the cores of the machine the driver runs on, which only the caller
knows (:meth:`Master.cores` takes that count; the driver passes ``os.cpu_count()``).
"""

from __future__ import annotations

import dataclasses
import re
from urllib.parse import urlsplit

from spark_imagenet.errors import ConfigError

#: The kinds of master :meth:`Master.parse` tells apart (the module's list of forms); ``other`` is a URL of no
#: form Spark takes, given where unknown forms are let through (``check=False``).
KINDS = ("unset", "local", "local-cluster", "standalone", "yarn", "k8s", "connect", "other")
#: The master URLs a user may give, as every message lists them.
FORMS = ("local, local[N], local[*], local[N,F] (F: task failures allowed), local-cluster[E,C,MB], "
         "spark://HOST:PORT, yarn, k8s://https://HOST:PORT, or sc://HOST:PORT for a Spark Connect server")

_LOCAL = re.compile(r"local\[(\d+|\*)(?:\s*,\s*(\d+))?\]")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]")


@dataclasses.dataclass(frozen=True)
class Master:
    """A Spark master URL, parsed (:meth:`parse`).

    Attributes:
        url: the URL without surrounding blanks; None when no master is given.
        kind: one of :data:`KINDS`.
        threads: the task threads of ``local`` (1) and ``local[N]`` (N); None for ``local[*]`` (see
            :attr:`all_cores`) and every other kind.
        all_cores: ``local[*]``: a task thread per core of the driver's machine.
        max_failures: F of ``local[N,F]``, the task failures allowed; None when not given.
        executors: E of ``local-cluster[E,C,MB]``; None otherwise.
        executor_cores: C of ``local-cluster[E,C,MB]``, cores per executor; None otherwise.
        executor_memory_mb: MB of ``local-cluster[E,C,MB]``, MiB per executor; None otherwise.
        addresses: ``(host, port)`` of each standalone master, or of the Spark Connect server (port None
            when the URL gives none); empty for every other kind. IPv6 hosts come without brackets.

    Example::

        >>> master = Master.parse("local-cluster[2,3,1024]")
        >>> master.kind, master.runs_on_this_host, master.slots(task_cpus=2)
        ('local-cluster', True, 3)
    """

    url: str | None
    kind: str
    threads: int | None = None
    all_cores: bool = False
    max_failures: int | None = None
    executors: int | None = None
    executor_cores: int | None = None
    executor_memory_mb: int | None = None
    addresses: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def parse(cls, url: str | None, *, check: bool = True) -> Master:
        """Parse a Spark master URL.

        Args:
            url: the master URL (surrounding blanks ignored), or None for no master.
            check: refuse a URL Spark would not take. False, for a master Spark already runs with (a
                session's ``sc.master``, a Connect server's ``spark.master``) or one that is only sorted by
                kind: a URL of no known form is kind ``other``, and one of a known kind whose details do not
                parse keeps its kind with those details None.

        Returns:
            Master: the parsed URL.

        Raises:
            ConfigError: with ``check``, a URL of no form Spark takes or a malformed one (``local[x]``,
                ``local[0]``, ``spark://`` without HOST:PORT, ...): the message names ``--master``, the URL,
                every valid form and what is wrong (:func:`master_error`).
        """
        if url is None:
            return cls(None, "unset")
        text = url.strip()
        kind = kind_of(text)
        try:
            return _PARSERS[kind](text)
        except ValueError as e:
            if check:
                raise ConfigError(master_error(url, str(e))) from None
            return cls(text, kind)

    @property
    def runs_in_driver_jvm(self) -> bool:
        """``local`` and ``local[...]``: the tasks run in the driver's JVM (no executors to wait for, their
        stderr is the driver's console, no GPUs for tasks); not ``local-cluster``, whose executors are JVMs
        of their own."""
        return self.kind == "local"

    @property
    def runs_on_this_host(self) -> bool:
        """Every process of the master runs on this machine, with this Python: ``local``, ``local[...]`` and
        ``local-cluster[...]``; a cluster's master (``spark://`` included, whatever its host) is False, its
        executors may be on other hosts."""
        return self.kind in ("local", "local-cluster")

    @property
    def host(self) -> str | None:
        """The host of the first standalone master or of the Spark Connect server; None for other kinds."""
        return self.addresses[0][0] if self.addresses else None

    def cores(self, cpu_count: int | None = None) -> int | None:
        """The cores the master gives its tasks in all, when its URL tells.

        Args:
            cpu_count: the cores of the machine the driver runs on, for ``local[*]``; None when unknown
                (e.g. a Spark Connect server's machine).

        Returns:
            int | None: ``local``: 1; ``local[N]``: N; ``local[*]``: ``cpu_count``; ``local-cluster[E,C,MB]``:
            E x C; None for a cluster's master (its executors register later), and for ``local[*]`` without
            ``cpu_count``.
        """
        if self.kind == "local":
            return cpu_count if self.all_cores else self.threads
        if self.kind == "local-cluster" and self.executors is not None and self.executor_cores is not None:
            return self.executors * self.executor_cores
        return None

    def slots(self, task_cpus: int, cpu_count: int | None = None) -> int | None:
        """Barrier task slots from the URL alone: :meth:`cores` // ``task_cpus``.

        Args:
            task_cpus: ``spark.task.cpus`` (values below 1 count as 1).
            cpu_count: as for :meth:`cores`.

        Returns:
            int | None: the slots, or None when the URL does not tell the cores.
        """
        cores = self.cores(cpu_count)
        return None if cores is None else cores // max(1, task_cpus)


def master_error(url: str, reason: str | None = None) -> str:
    """The message for a master Spark does not take: names ``--master`` (and the job file's ``master``), the
    URL and :data:`FORMS`, then what is wrong with it when known."""
    why = f" ({reason})" if reason else ""
    return f"master (--master) {url!r} is not a Spark master URL: use {FORMS}{why}"


def kind_of(url: str) -> str:
    """The kind (:data:`KINDS`) a master URL's form says, its details unchecked (``local[x]`` is ``local``)."""
    if url == "local" or url.startswith("local["):
        return "local"
    if url.startswith("local-cluster["):
        return "local-cluster"
    if url == "yarn":
        return "yarn"
    for prefix, kind in (("spark://", "standalone"), ("k8s://", "k8s"), ("sc://", "connect")):
        if url.startswith(prefix):
            return kind
    return "other"


def _local(url: str) -> Master:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``, ``local[*,F]``.

    Raises:
        ValueError: N not a whole number or ``*``, or 0; F not a whole number.
    """
    if url == "local":
        return Master(url, "local", threads=1)
    m = _LOCAL.fullmatch(url)
    if m is None:
        raise ValueError("local[N] takes N, a whole number of task threads or *, and optionally F, the task "
                         "failures allowed: local[4], local[*], local[4,2]")
    failures = int(m.group(2)) if m.group(2) is not None else None
    if m.group(1) == "*":
        return Master(url, "local", all_cores=True, max_failures=failures)
    if int(m.group(1)) < 1:
        raise ValueError("local[0] has no task thread: N is at least 1")
    return Master(url, "local", threads=int(m.group(1)), max_failures=failures)


def _local_cluster(url: str) -> Master:
    """``local-cluster[E,C,MB]``.

    Raises:
        ValueError: not three whole numbers, or one of them 0.
    """
    m = _LOCAL_CLUSTER.fullmatch(url)
    if m is None:
        raise ValueError("local-cluster takes three whole numbers: executors, cores and MiB each, e.g. "
                         "local-cluster[2,1,1024]")
    executors, cores, memory = (int(g) for g in m.groups())
    if min(executors, cores, memory) < 1:
        raise ValueError("local-cluster[E,C,MB] needs E, C and MB of at least 1")
    return Master(url, "local-cluster", executors=executors, executor_cores=cores, executor_memory_mb=memory)


def _standalone(url: str) -> Master:
    """``spark://HOST:PORT``, or several comma-separated (``spark://H1:P1,H2:P2``, high availability).

    Raises:
        ValueError: an address without host or port (Spark takes no default port), or with more than
            HOST:PORT.
    """
    addresses = []
    for address in url[len("spark://"):].split(","):
        host, port = _address("spark", address.strip(), "not a standalone master URL spark://HOST:PORT")
        if port is None:
            raise ValueError(f"not a standalone master URL spark://HOST:PORT: {address.strip()} has no port "
                             "(the master's web UI, port 8080 by default, shows its spark:// URL)")
        addresses.append((host, port))
    return Master(url, "standalone", addresses=tuple(addresses))


def _connect(url: str) -> Master:
    """``sc://HOST[:PORT][/;params]``.

    Raises:
        ValueError: no host, or a port that is not a number.
    """
    netloc = urlsplit(url.split(";", 1)[0]).netloc
    return Master(url, "connect", addresses=(_address("sc", netloc, "not a Spark Connect URL sc://HOST:PORT"),))


def _k8s(url: str) -> Master:
    """``k8s://[https://]HOST:PORT``.

    Raises:
        ValueError: nothing after ``k8s://``, or a blank in the URL.
    """
    if not url[len("k8s://"):] or any(c.isspace() for c in url):
        raise ValueError("k8s:// names the Kubernetes API server: k8s://https://HOST:PORT")
    return Master(url, "k8s")


def _address(scheme: str, address: str, what: str) -> tuple[str, int | None]:
    """``(host, port)`` of ``HOST[:PORT]`` (IPv6 in brackets), port None when absent.

    Raises:
        ValueError: no host, a port that is not a number, or more than HOST:PORT (``what`` opens the message).
    """
    parts = urlsplit(f"{scheme}://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ValueError(f"{what}: the port of {address!r} is not a number") from None
    if not host:
        raise ValueError(f"{what}: no host")
    extra = parts.path or parts.query or parts.fragment or parts.username is not None
    if extra or any(c.isspace() for c in address):
        raise ValueError(f"{what}: {address!r} is more than HOST:PORT")
    return host, port


def _other(url: str) -> Master:
    """A URL of no form Spark takes.

    Raises:
        ValueError: always (no reason: the forms say it).
    """
    raise ValueError("")


def _yarn(url: str) -> Master:
    """``yarn`` (the cluster's address comes from ``HADOOP_CONF_DIR``, not the URL)."""
    return Master(url, "yarn")


_PARSERS = {"local": _local, "local-cluster": _local_cluster, "standalone": _standalone, "yarn": _yarn,
            "k8s": _k8s, "connect": _connect, "other": _other}
