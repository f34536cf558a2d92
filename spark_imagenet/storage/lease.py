"""One writer per folder: a lease object that a run creates, renews while it runs and deletes at its end.

A training run writes into ``--checkpoint-dir`` and ``--output``; two runs given the same folder would mix their
files, and a driver killed under YARN leaves a chief that may still commit while the next attempt starts. So
the driver takes a lease in each folder before Spark starts (:func:`acquire`) and renews it
(:class:`Renewal`), and the chief checks it before each commit (:func:`check_held`).

The lease is one small versioned-JSON object, :data:`LEASE_NAME`, written with the storage layer's
conditional writes (``if_generation_match``: 0 creates only, a generation replaces only that version; GCS's
own precondition, the equivalent on the other stores, an exclusive ``flock``'d create locally), so two runs
never both take it. A lease whose ``renewed`` time is older than its ``timeout_s`` belongs to a holder that
is gone: the next run takes it over with a warning. A lease of the same Spark application (a YARN
re-attempt of the driver) is waited for until it goes stale, since its old holder is dead. The times are the
drivers' clocks (UTC): hosts whose clocks differ by more than the timeout would misjudge staleness.

``_run.lease``::

    {"format": "spark-imagenet-lease", "format_version": 1, "run_id": "3f2a...", "app_id": "app-2026...",
     "host": "driver-host", "pid": 4242, "started": "2026-12-03T05:00:00Z", "renewed": 1764738000.5,
     "timeout_s": 120.0}
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from typing import Any

from spark_imagenet.errors import ConfigError, PreconditionFailed, StorageError, TrainingError
from spark_imagenet.storage.base import Storage
from spark_imagenet.storage.envelope import Envelope

logger = logging.getLogger(__name__)

#: The lease's object name in the folder it guards.
LEASE_NAME = "_run.lease"
#: Seconds without renewal after which a lease is stale (its holder gone).
TIMEOUT_S = 120.0
#: Renewals per timeout.
RENEWALS_PER_TIMEOUT = 4
ENVELOPE = Envelope("spark-imagenet-lease", 1, "spark-imagenet run lease", error=StorageError,
                    remedy=f"delete {LEASE_NAME} if no run uses the folder")


@dataclasses.dataclass(frozen=True)
class Lease:
    """Who holds a folder.

    Attributes:
        run_id: the run's id (32 hex digits), unique per ``train`` call.
        app_id: the Spark application's id (the same across a YARN application's attempts), or "".
        host: the driver's host name.
        pid: the driver's process id.
        started: when the run took the lease (ISO-8601 UTC).
        renewed: when it last renewed it (seconds since the epoch, the driver's clock).
        timeout_s: seconds without renewal after which the lease is stale.
    """

    run_id: str
    app_id: str
    host: str
    pid: int
    started: str
    renewed: float
    timeout_s: float = TIMEOUT_S

    @classmethod
    def new(cls, run_id: str, app_id: str = "", timeout_s: float = TIMEOUT_S) -> Lease:
        """A lease of this process, renewed now."""
        return cls(run_id, app_id, socket.gethostname(), os.getpid(),
                   time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.time(), timeout_s)

    def holder(self) -> str:
        """The holder for messages: ``run 3f2a... on host H (pid P) since S``."""
        return f"run {self.run_id[:8]} on host {self.host} (pid {self.pid}) since {self.started}"

    def stale(self, now: float) -> bool:
        """Whether the holder stopped renewing more than ``timeout_s`` ago."""
        return now - self.renewed > self.timeout_s

    def dumps(self) -> bytes:
        return ENVELOPE.dumps(dataclasses.asdict(self)).encode("utf-8")

    @classmethod
    def loads(cls, data: bytes, where: str) -> Lease:
        """Parse a lease object.

        Raises:
            StorageError: not a lease of this format (named, with what to do).
        """
        try:
            return cls(**ENVELOPE.fields_for(cls, ENVELOPE.decode(data, where), where))
        except TypeError as e:
            raise StorageError(f"{where}: {e}; {ENVELOPE.remedy}", key="url", value=where) from None


def read(storage: Storage) -> tuple[Lease, int] | None:
    """The folder's lease and its generation, or None when there is none.

    Raises:
        StorageError: the lease cannot be read or parsed.
    """
    info = storage.stat(LEASE_NAME)
    if info is None:
        return None
    return Lease.loads(storage.read_bytes(LEASE_NAME), storage.where(LEASE_NAME)), int(info.generation or 0)


def acquire(storage: Storage, lease: Lease, option: str, *, wait_s: float | None = None) -> int:
    """Take the folder's lease for ``lease``'s run; returns the lease object's generation.

    A free folder is taken at once; a stale lease, or one whose holder ran on this host and has ended, is
    taken over with a warning; a live lease of the same
    Spark application (a re-attempt of the driver) is waited for until it goes stale; any other live lease
    is refused.

    Args:
        storage: the folder (``--checkpoint-dir`` or ``--output``).
        lease: this run's lease.
        option: the option that names the folder, for messages.
        wait_s: the longest wait for a same-application lease (default: its timeout and 10 s more).

    Raises:
        ConfigError: another run holds the folder (named: run, host, pid, start, last renewal).
        StorageError: the lease cannot be read or written.
    """
    deadline = None
    while True:
        found = read(storage)
        if found is None:
            try:
                return _write(storage, lease, 0)
            except PreconditionFailed:
                continue  # another run created it meanwhile: look at it
        held, generation = found
        now = time.time()
        if held.run_id == lease.run_id:
            return _write(storage, lease, generation)
        if held.stale(now) or _gone(held):
            why = f"not renewed for {now - held.renewed:.0f} s" if held.stale(now) else "its process has ended"
            logger.warning(f"warning: {option} {storage.url}: taking over the lease of {held.holder()}, {why} "
                           "(its holder is gone)")
            try:
                return _write(storage, lease, generation)
            except PreconditionFailed:
                continue
        if not (held.app_id and held.app_id == lease.app_id):
            raise ConfigError(f"{option} {storage.url} is in use by {held.holder()}, renewed {now - held.renewed:.0f} s "
                              "ago: two runs in one folder would mix their files. Wait for that run to end, or give "
                              f"another {option}; a lease not renewed for {held.timeout_s:.0f} s is taken over (a "
                              f"run that was killed: delete {storage.where(LEASE_NAME)} to take it at once)",
                              key=option, value=storage.url)
        if deadline is None:
            deadline = now + (held.timeout_s + 10.0 if wait_s is None else wait_s)
            logger.info(f"{option} {storage.url}: waiting for the lease of an earlier attempt of this application "
                        f"({held.holder()}) to lapse")
        if now > deadline:
            raise ConfigError(f"{option} {storage.url}: the lease of {held.holder()} is still renewed after "
                              f"waiting {now - deadline + (held.timeout_s + 10.0):.0f} s; an earlier attempt of this "
                              "application is still running", key=option, value=storage.url)
        time.sleep(min(5.0, held.timeout_s / RENEWALS_PER_TIMEOUT))


def _gone(held: Lease) -> bool:
    """Whether the holder ran on this host and its process is no longer there (a driver killed here: its lease
    need not be waited for)."""
    if held.host != socket.gethostname() or held.pid == os.getpid():
        return False
    try:
        os.kill(held.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _write(storage: Storage, lease: Lease, generation: int) -> int:
    """Write ``lease`` if the object is still at ``generation`` (0: absent); return the new generation.

    Raises:
        PreconditionFailed: another writer got there first.
    """
    data = dataclasses.replace(lease, renewed=time.time()).dumps()
    storage.write_bytes(LEASE_NAME, data, if_generation_match=generation)
    info = storage.stat(LEASE_NAME)
    if info is None or storage.read_bytes(LEASE_NAME) != data:
        raise PreconditionFailed(f"{storage.where(LEASE_NAME)} changed right after this run wrote it")
    return int(info.generation or 0)


def release(storage: Storage, run_id: str) -> None:
    """Delete the folder's lease if this run still holds it; a failure is logged, never raised."""
    try:
        found = read(storage)
        if found is not None and found[0].run_id == run_id:
            storage.delete(LEASE_NAME)
    except StorageError as e:
        logger.warning(f"warning: could not remove the run's lease {storage.where(LEASE_NAME)}: {e}")


def check_held(storage: Storage, run_id: str) -> None:
    """Raise unless ``run_id``'s lease on the folder is there and live (the chief, before each commit).

    Raises:
        TrainingError: the lease is gone, another run's, or not renewed within its timeout (the driver is
            gone): this run must not write into the folder any more.
        StorageError: the lease cannot be read.
    """
    found = read(storage)
    now = time.time()
    if found is None or found[0].run_id != run_id or found[0].stale(now):
        who = "nobody" if found is None else found[0].holder()
        raise TrainingError(f"{storage.url}: this run no longer holds the folder's lease (now {who}"
                            + (f", not renewed for {now - found[0].renewed:.0f} s" if found else "")
                            + "): its driver is gone or another run took over, so this run stops writing there",
                            key="url", value=storage.url)


class Renewal:
    """Renews leases in a daemon thread, every ``timeout_s / 4`` s, until :meth:`stop`; a lost lease (another
    run took it over) is logged as an error once and not renewed again.

    Args:
        leases: ``(storage, lease, generation, option)`` per folder, as :func:`acquire` left them.
    """

    def __init__(self, leases: list[tuple[Storage, Lease, int, str]]):
        self._leases = list(leases)
        self._stop = threading.Event()
        every = min((lease.timeout_s for _s, lease, _g, _o in leases), default=TIMEOUT_S) / RENEWALS_PER_TIMEOUT
        self._thread = threading.Thread(target=self._run, args=(every,), name="spark-imagenet-lease", daemon=True)
        if self._leases:
            self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            kept = []
            for storage, lease, generation, option in self._leases:
                try:
                    kept.append((storage, lease, _write(storage, lease, generation), option))
                except PreconditionFailed:
                    logger.error(f"{option} {storage.url}: another run took over this run's lease; this run's "
                                 "chief stops committing there")
                except StorageError as e:  # transient: tried again at the next renewal
                    logger.warning(f"warning: could not renew the lease {storage.where(LEASE_NAME)}: {e}")
                    kept.append((storage, lease, generation, option))
            self._leases = kept

    def stop(self) -> None:
        """Stop renewing, then release every lease still held."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)
        for storage, lease, _generation, _option in self._leases:
            release(storage, lease.run_id)


def take(folders: list[tuple[Storage, str]], run_id: str, app_id: str = "", **kwargs: Any) -> Renewal:
    """Take the lease of every folder (``(storage, option)``) for the run and start renewing them; on a
    refusal, the leases already taken are released.

    Raises:
        ConfigError, StorageError: as :func:`acquire`.
    """
    taken: list[tuple[Storage, Lease, int, str]] = []
    lease = Lease.new(run_id, app_id)
    try:
        for storage, option in folders:
            taken.append((storage, lease, acquire(storage, lease, option, **kwargs), option))
    except BaseException:
        for storage, held, _generation, _option in taken:
            release(storage, held.run_id)
        raise
    return Renewal(taken)
