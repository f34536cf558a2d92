"""A step watchdog for the TensorFlow worker process: ends a worker whose training makes no progress.

A worker of a synchronous job waits, inside a step, for every other worker at
each all-reduce. When a peer is killed, SIGSTOPped or stuck (or this worker's
own step is stuck), nothing in the step returns and ``fit`` can block for a
long time or for ever. :class:`StepWatchdog` is a Keras callback with a
daemon thread: once ``timeout_s`` seconds pass without progress (a finished
train or test batch, an epoch begin or end, or an explicit :meth:`feed`), it
probes every peer with TensorFlow's collective peer health check, prints one
line naming who is missing, and ends the process with
:data:`EXIT_STEP_TIMEOUT`.

The thread can run while the main thread is blocked in a step: TensorFlow
releases the GIL while it executes a function, and the peer probe works from
this thread then (checked with two local workers, one of them SIGSTOPped or
stuck, in ``tests/test_watchdog.py``).

What TensorFlow does by itself (docs/design.md, 'No hangs'): its
coordination service (enabled by MultiWorkerMirroredStrategy) aborts the
collectives when a peer stops sending heartbeats (a peer SIGSTOPped or
SIGKILLed). A peer that is alive but stuck (in its input pipeline, a
callback, a storage call) keeps sending heartbeats and answering probes:
TensorFlow then waits for ever, which is the case this watchdog exists for.

Typical use in the worker::

    >>> import numpy as np
    >>> watchdog = StepWatchdog(600.0, rank=0, peers=[])   # spec.config.run.step_timeout, spec.rank, peers_from_tf_config()
    >>> model = keras.Sequential([keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> history = model.fit(np.zeros((4, 2)), np.zeros((4, 1)), epochs=1, verbose=0, callbacks=[watchdog])
    >>> with watchdog.pause():
    ...     model.save("model.keras")          # a long, known operation: no deadline meanwhile
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Callable, Iterator, Sequence


import tf_keras as keras  # noqa: E402

# Exit status of a worker process the watchdog ends (no progress within the step timeout; 1 is any other
# failure of the worker, 2 wrong usage), stated once in config so the barrier task can read it without TF.
from spark_imagenet.training.job.config import EXIT_STEP_TIMEOUT  # noqa: E402,F401
from spark_imagenet.training.job.outcome import LostPeer  # noqa: E402

#: Seconds each peer probe waits for an answer.
DEFAULT_PROBE_TIMEOUT_S = 5.0

#: The one-line reason of a peer that did not answer the probe.
NO_ANSWER = "does not answer (stopped, stuck or unreachable)"

#: The diagnosis when every peer answered.
ALL_ANSWER = "every peer answers: the step itself is stuck on this worker or in the all-reduce"


def peers_from_tf_config(tf_config: str | None = None) -> list[str]:
    """Every worker's ``"host:port"`` in rank order, from ``TF_CONFIG``'s cluster.

    The ranks are MultiWorkerMirroredStrategy's: a ``chief`` task (if any)
    first, then the ``worker`` tasks in their order.

    Args:
        tf_config: str, the JSON text; None reads the ``TF_CONFIG`` environment
            variable.

    Returns:
        list[str]: the addresses, index = rank; empty without ``TF_CONFIG`` or
        when it cannot be read (the watchdog then names no peer).
    """
    text = os.environ.get("TF_CONFIG", "") if tf_config is None else tf_config
    try:
        cluster = json.loads(text).get("cluster", {}) if text else {}
        return [str(a) for a in list(cluster.get("chief", [])) + list(cluster.get("worker", []))]
    except (ValueError, AttributeError, TypeError):
        return []


def _task_name(peers: Sequence[str], rank: int, tf_config: str | None = None) -> str:
    """TensorFlow's task name of worker ``rank``, e.g. ``/job:worker/replica:0/task:1``.

    With a ``chief`` job in ``TF_CONFIG``, rank 0 is ``/job:chief/replica:0/task:0``
    and rank r > 0 is worker task r - 1.
    """
    text = os.environ.get("TF_CONFIG", "") if tf_config is None else tf_config
    try:
        chiefs = len(json.loads(text).get("cluster", {}).get("chief", [])) if text else 0
    except (ValueError, AttributeError, TypeError):
        chiefs = 0
    if rank < chiefs:
        return f"/job:chief/replica:0/task:{rank}"
    return f"/job:worker/replica:0/task:{rank - chiefs}"


def probe_peers(peers: Sequence[str], rank: int, timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
                probe: Callable[[str, float], None] | None = None) -> str:
    """Probe every other worker in parallel; describe those that do not answer.

    The words of :func:`probe_lost_peers`' answer: ``"rank 1 (host:port) does not answer (stopped, stuck or
    unreachable)"`` (several joined by ``", "``), :data:`ALL_ANSWER` when every peer answers, or a sentence
    saying there is no peer to probe.
    """
    if len(peers) < 2:
        return "no peer to probe (one worker): the step itself is stuck on this worker"
    lost = probe_lost_peers(peers, rank, timeout_s, probe)
    return ", ".join(f"{p.name()} {p.why}" for p in lost) if lost else ALL_ANSWER


def probe_lost_peers(peers: Sequence[str], rank: int, timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
                     probe: Callable[[str, float], None] | None = None) -> tuple[LostPeer, ...]:
    """Probe every other worker in parallel; return those that do not answer.

    Each probe runs in its own daemon thread; the whole takes at most about
    ``timeout_s + 2`` seconds, whatever the probes do (one still running then
    counts as not answering).

    Args:
        peers: list[str], every worker's ``"host:port"``, index = rank.
        rank: int, this worker's rank (not probed).
        timeout_s: float, seconds each probe waits for an answer.
        probe: callable ``(task_name, timeout_s)`` that returns when the peer
            answers and raises otherwise; default:
            :func:`~spark_imagenet.training.worker.tf_internals.check_peer_health`.

    Returns:
        The peers that did not answer, by rank (``why`` :data:`NO_ANSWER`, or ``"has restarted (it is another
        process now)"`` for a peer that is another process now); empty when every peer answers.
    """
    if probe is None:
        from spark_imagenet.training.worker.tf_internals import check_peer_health as probe
    others = [r for r in range(len(peers)) if r != rank]
    answers: dict[int, str] = {}

    def run(r: int) -> None:
        try:
            probe(_task_name(peers, r), timeout_s)
            answers[r] = ""
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the diagnosis
            restarted = type(exc).__name__ == "FailedPreconditionError"
            answers[r] = "has restarted (it is another process now)" if restarted else NO_ANSWER

    threads = [threading.Thread(target=run, args=(r,), name=f"step-watchdog-probe-{r}", daemon=True) for r in others]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s + 2.0
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return tuple(LostPeer(r, peers[r], answers.get(r, NO_ANSWER)) for r in others if answers.get(r, NO_ANSWER))


def _exit_on_expiry(message: str) -> None:
    """The default expiry action: ``message`` as one stderr line, then ``os._exit(EXIT_STEP_TIMEOUT)``."""
    try:
        print(message, file=sys.stderr, flush=True)
    finally:
        os._exit(EXIT_STEP_TIMEOUT)


class StepWatchdog(keras.callbacks.Callback):
    """Ends the worker when training makes no progress for ``timeout_s`` seconds.

    Armed by ``on_train_begin``, fed by every train and test batch end and
    every epoch begin and end (and by :meth:`feed`), disarmed by
    ``on_train_end``. A daemon thread checks the deadline on a monotonic clock;
    on expiry it probes the peers (:func:`probe_peers`) and calls
    ``on_expire`` once with the message::

        worker rank R: no training step finished in E s (--step-timeout S); DIAGNOSIS; last progress: WHAT

    where DIAGNOSIS names the ranks that do not answer, or says that every
    peer answers. The thread then stops: the watchdog fires at most once.

    Args:
        timeout_s: float, seconds without progress before it fires; 0 (or
            less) turns it off (it never arms, no thread starts).
        rank: int, this worker's rank.
        peers: list[str], every worker's ``"host:port"`` (index = rank), e.g.
            :func:`peers_from_tf_config`; may be empty (nothing to probe).
        on_expire: callable taking the message; default: print it as one line
            to stderr and ``os._exit(EXIT_STEP_TIMEOUT)`` (3).
        probe_timeout_s: float, seconds each peer probe waits.
        probe: callable ``(task_name, timeout_s)`` for the peer probes (see
            :func:`probe_peers`); default: TensorFlow's peer health check.
        clock: callable returning seconds; default ``time.monotonic`` (tests
            pass a fake one).
        poll_s: float, seconds between the thread's checks; default
            ``min(1, timeout_s / 4)``.
    """

    def __init__(self, timeout_s: float, rank: int = 0, peers: Sequence[str] = (),
                 on_expire: Callable[[str], None] | None = None, *,
                 probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
                 probe: Callable[[str, float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, poll_s: float | None = None) -> None:
        super().__init__()
        self.timeout_s = float(timeout_s)
        self.rank, self.peers = int(rank), list(peers)
        self._on_expire = _exit_on_expiry if on_expire is None else on_expire
        self._probe_timeout_s, self._probe, self._clock = probe_timeout_s, probe, clock
        self._poll_s = poll_s if poll_s is not None else min(1.0, max(self.timeout_s, 0.0) / 4 or 1.0)
        self._lock = threading.Lock()
        self._last = 0.0
        self._what = "training began"
        self._pauses = 0
        self._armed = False
        self._fired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._epoch = 0
        self._armed_by_test = False
        #: The peers that did not answer the probe when the watchdog fired (set before ``on_expire``).
        self.lost: tuple[LostPeer, ...] = ()
        # Keras may pass the batch logs as tensors: they are never read, so no per-batch device sync
        self._supports_tf_logs = True

    @property
    def enabled(self) -> bool:
        """bool: whether a timeout is set (``timeout_s > 0``)."""
        return self.timeout_s > 0

    @property
    def fired(self) -> bool:
        """bool: whether the watchdog has expired (``on_expire`` was called or is being called)."""
        return self._fired

    def arm(self) -> None:
        """Start the deadline (``timeout_s`` from now) and the checking thread; nothing when off or armed."""
        if not self.enabled:
            return
        with self._lock:
            if self._armed:
                return
            self._armed, self._last, self._what = True, self._clock(), "training began"
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="step-watchdog", daemon=True)
            self._thread.start()

    def disarm(self) -> None:
        """Stop checking; ``on_expire`` is not called afterwards (unless it is already running)."""
        with self._lock:
            self._armed = False
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._poll_s + 1.0)

    def feed(self, what: str = "reported by the worker (feed)") -> None:
        """Record progress now: the deadline restarts (``timeout_s`` from now).

        Args:
            what: str, what made progress, shown as ``last progress`` in the message.
        """
        with self._lock:
            self._last, self._what = self._clock(), what

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """A context in which the watchdog never fires (a long known operation such as saving a checkpoint).

        The deadline restarts when the context ends. Contexts may nest.
        """
        with self._lock:
            self._pauses += 1
        try:
            yield
        finally:
            with self._lock:
                self._pauses -= 1
                self._last = self._clock()

    def expired(self) -> float | None:
        """The seconds since the last progress if they exceed the timeout while armed and not paused, else None."""
        with self._lock:
            if not self._armed or self._pauses or self._fired:
                return None
            elapsed = self._clock() - self._last
            return elapsed if elapsed >= self.timeout_s else None

    def message(self, elapsed: float) -> str:
        """The expiry message after ``elapsed`` seconds without progress, with the peers' diagnosis (probes them).

        Args:
            elapsed: float, seconds since the last progress.

        Returns:
            str: one line (see the class docstring).
        """
        try:
            if len(self.peers) < 2:
                diagnosis = probe_peers(self.peers, self.rank)
            else:
                self.lost = probe_lost_peers(self.peers, self.rank, self._probe_timeout_s, self._probe)
                diagnosis = ", ".join(f"{p.name()} {p.why}" for p in self.lost) if self.lost else ALL_ANSWER
        except Exception as exc:  # noqa: BLE001 - the message must come out anyway
            diagnosis = f"the peers could not be probed ({type(exc).__name__}: {exc})"
        return (f"worker rank {self.rank}: no training step finished in {elapsed:.0f} s "
                f"(--step-timeout {self.timeout_s:g}); {diagnosis}; last progress: {self._what}")

    def _run(self) -> None:
        """The thread: check every ``poll_s`` seconds; on expiry build the message and call ``on_expire`` once."""
        while not self._stop.wait(self._poll_s):
            elapsed = self.expired()
            if elapsed is None:
                continue
            with self._lock:
                self._fired = True
            text = self.message(elapsed)
            with self._lock:
                still_armed = self._armed
            if still_armed:
                self._on_expire(text)
            return

    # Keras hooks ------------------------------------------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Arm the watchdog."""
        self.arm()

    def on_train_end(self, logs: dict | None = None) -> None:
        """Disarm the watchdog."""
        self.disarm()

    def on_test_begin(self, logs: dict | None = None) -> None:
        """Arm the watchdog for an ``evaluate`` outside ``fit`` (inside ``fit`` it is armed already)."""
        if self.enabled and not self._armed:
            self.arm()
            self._armed_by_test = True
        self.feed("evaluation began")

    def on_test_end(self, logs: dict | None = None) -> None:
        """Disarm the watchdog if :meth:`on_test_begin` armed it; else progress: the evaluation ended."""
        if self._armed_by_test:
            self._armed_by_test = False
            self.disarm()
        else:
            self.feed("evaluation ended")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Progress: epoch ``epoch`` (0-based) begins."""
        self._epoch = epoch + 1
        self.feed(f"epoch {epoch + 1} began")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Progress: epoch ``epoch`` (0-based) ended."""
        self.feed(f"epoch {epoch + 1} ended")

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Progress: train batch ``batch`` (0-based, within the epoch) finished."""
        self.feed(f"train batch {batch + 1} of epoch {self._epoch} finished")

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Progress: test (validation) batch ``batch`` (0-based) finished."""
        self.feed(f"test batch {batch + 1} finished")
