"""What comes back from a training job: typed, versioned values every process reads (no TensorFlow, no Spark).

* :class:`Failure`: why a rank failed, as the TensorFlow worker or its barrier task knows it: the stage, the rank
  and host, the process's exit status, the peers it lost, the message and the error class to raise on the driver.
* :class:`WorkerResult`: what one TensorFlow worker process writes when it has trained and evaluated.
* :class:`TaskResult`: what one barrier task hands to the driver: its worker's result (or why it did not train),
  its host and interpreter, and which TensorFlow process ran.
* :class:`ResumePoint`: a checkpoint the job resumes from (its folder name and meta).

The worker writes its :class:`WorkerResult`, or its :class:`Failure`, to ``result.json``
(:func:`write_outcome`, :func:`read_outcome`); the task yields a :class:`TaskResult` as one JSON line, or raises
the error :meth:`Failure.to_error` makes, whose message ends with the failure's JSON on one line after
:data:`FAILURE_MARKER`; the driver takes it back with :meth:`Failure.find` (a string search and
:meth:`Failure.from_json`, no pattern over the message's words).

Each JSON form is a versioned document (:class:`~spark_imagenet.storage.envelope.Envelope`:
``{"format": NAME, "format_version": 1, ...fields}``); reading refuses another format or version, a missing or
unknown key, naming it.

Example::

    >>> failure = Failure(stage="reading data", message="StorageError: shard x is corrupt", error="StorageError",
    ...                   rank=1, host="10.0.0.2")
    >>> err = failure.to_error()          # a StorageError whose message ends with the failure's JSON line
    >>> type(err).__name__, Failure.find(str(err)) == failure
    ('StorageError', True)
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from spark_imagenet import errors
from spark_imagenet.errors import ConfigError, SparkImagenetError, TrainingError
from spark_imagenet.storage.envelope import Envelope
from spark_imagenet.training.job.checkpoints import CheckpointMeta

#: What starts the failure's JSON line inside an error message (the task's error, as Spark reports it).
FAILURE_MARKER = "spark-imagenet-failure: "

#: Read by another process of the same job: a document it cannot read means mixed spark-imagenet versions.
SAME_VERSION = "use the same spark-imagenet version on the driver and executors"
FAILURE = Envelope("spark-imagenet-failure", 1, "spark-imagenet failure report", remedy=SAME_VERSION)
WORKER_RESULT = Envelope("spark-imagenet-worker-result", 1, "spark-imagenet worker result", remedy=SAME_VERSION)
TASK_RESULT = Envelope("spark-imagenet-task-result", 1, "spark-imagenet task result", remedy=SAME_VERSION)


def error_class(name: str) -> type[SparkImagenetError]:
    """The error class of this package named ``name`` (:mod:`spark_imagenet.errors`); TrainingError for any other."""
    cls = getattr(errors, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, SparkImagenetError) else TrainingError


@dataclasses.dataclass(frozen=True)
class LostPeer:
    """A peer a worker lost.

    Attributes:
        rank: its rank.
        address: its ``host:port`` (TF_CONFIG's), or None when not known.
        why: what was seen, e.g. ``"stopped sending heartbeats (stopped, killed or unreachable)"``.
    """

    rank: int
    address: str | None = None
    why: str = "does not answer"

    def name(self) -> str:
        """``rank R (HOST:PORT)``, or ``rank R``."""
        return f"rank {self.rank} ({self.address})" if self.address else f"rank {self.rank}"


def describe_lost(peers: Sequence[LostPeer]) -> str:
    """One phrase for the lost peers: ``"rank 1 (h:p), rank 2 (h:p) stopped sending heartbeats (...)"``;
    peers seen differently are joined by ``"; "``."""
    groups: dict[str, list[str]] = {}
    for peer in peers:
        groups.setdefault(peer.why, []).append(peer.name())
    return "; ".join(f"{', '.join(names)} {why}" for why, names in groups.items())


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why one rank failed.

    Attributes:
        stage: what it was doing, e.g. ``"training (fit)"``, ``"staging shards"``.
        message: the cause in one or a few lines (``"UnavailableError: ..."``, or an error's own message).
        error: the name of the error class the driver raises (:mod:`spark_imagenet.errors`); ``"WorkerLost"``
            for a failure that may not recur (a lost process or peer), which the driver may launch again.
        rank: the failed rank, or None when not known.
        host: its host, or None.
        exit_status: the TensorFlow process's exit status (negative: the signal that killed it), or None
            when no process had failed (the task's own failure, e.g. a shard it could not stage).
        lost_peers: the peers this rank lost, when it knows them.
        output: the TensorFlow process's last output lines (its task keeps them), oldest first.
        process: how the process ended, as its task saw it (``"the TensorFlow process
            (spark_imagenet.training.worker.main) was killed by SIGKILL"``), or None.
    """

    stage: str
    message: str
    error: str = "TrainingError"
    rank: int | None = None
    host: str | None = None
    exit_status: int | None = None
    lost_peers: tuple[LostPeer, ...] = ()
    output: tuple[str, ...] = ()
    process: str | None = None

    @property
    def lost(self) -> bool:
        """bool: whether the failure may not recur (:class:`~spark_imagenet.errors.WorkerLost`)."""
        return issubclass(error_class(self.error), errors.WorkerLost)

    def describe(self) -> str:
        """The message a user reads: ``rank R on HOST: [lost its peer: ...; ]the cause``, with the process's exit
        and its last output lines when a process failed, ending ``(end of rank R output)``."""
        where = f"rank {self.rank} on {self.host}: " if self.rank is not None else ""
        lost = f"lost its peer: {describe_lost(self.lost_peers)}; " if self.lost_peers else ""
        if self.exit_status is None:
            return f"{where}{lost}{self.message}"
        shown = "\n".join(f"  | {line}" for line in self.output) or "  | (no output)"
        process = self.process or f"the TensorFlow process ended with status {self.exit_status}"
        return (f"{where}{lost}{process} while {self.stage}: {self.message}; its last {len(self.output)} "
                f"output line(s):\n{shown}\n(end of rank {self.rank} output)")

    def to_json(self) -> dict[str, Any]:
        """The JSON object (versioned envelope)."""
        data = dataclasses.asdict(self)
        data["lost_peers"] = [dataclasses.asdict(p) for p in self.lost_peers]
        data["output"] = list(self.output)
        return FAILURE.to_json(data)

    @classmethod
    def from_json(cls, data: Any, where: str = "failure") -> "Failure":
        """Inverse of :meth:`to_json` (raises ConfigError naming what is wrong)."""
        fields = FAILURE.fields_for(cls, data, where)
        try:
            fields["lost_peers"] = tuple(LostPeer(**p) for p in fields.get("lost_peers", ()))
        except TypeError as e:
            raise ConfigError(f"{where}: lost_peers: {e}") from None
        fields["output"] = tuple(str(line) for line in fields.get("output", ()))
        return cls(**fields)

    def to_error(self) -> SparkImagenetError:
        """The error to raise: of class :attr:`error`, its message :meth:`describe` and, on its last line,
        :data:`FAILURE_MARKER` and this failure's JSON (:meth:`find` reads it back)."""
        line = FAILURE_MARKER + json.dumps(self.to_json(), ensure_ascii=True, separators=(",", ":"))
        err = error_class(self.error)(f"{self.describe()}\n{line}")
        err.failure = self
        return err

    @classmethod
    def find(cls, text: str) -> "Failure | None":
        """The failure of the last :data:`FAILURE_MARKER` line in ``text`` (e.g. a Spark job's error, which
        quotes the failed task's error), or None when there is none or it cannot be read."""
        at = text.rfind(FAILURE_MARKER)
        if at < 0:
            return None
        line = text[at + len(FAILURE_MARKER):].split("\n", 1)[0].strip()
        try:
            return cls.from_json(json.loads(line))
        except (ValueError, ConfigError):
            return None

    def summary(self) -> str:
        """:meth:`describe` without the output lines: one line."""
        return dataclasses.replace(self, exit_status=None, message=(
            f"{self.process or 'the TensorFlow process'} while {self.stage}: {self.message}"
            if self.exit_status is not None else self.message), lost_peers=self.lost_peers).describe()

    def as_error(self) -> SparkImagenetError:
        """The error the driver raises: class :attr:`error`, message :meth:`describe` (no JSON line)."""
        err = error_class(self.error)(self.describe())
        err.failure = self
        return err


@dataclasses.dataclass(frozen=True)
class ValMetrics:
    """Exact validation metrics over every worker's validation images (all-reduced: the same on every rank).

    Attributes:
        images: validation images counted.
        top1, top5: accuracies in [0, 1]; None without validation steps.
        loss: mean cross-entropy without weight decay; None without validation steps.
    """

    images: int
    top1: float | None = None
    top5: float | None = None
    loss: float | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"images", "top1", "top5", "loss"}``."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """What one TensorFlow worker process reports after training and evaluating.

    Attributes:
        rank, workers: this worker's rank and the job's worker count.
        replicas_in_sync: replicas of the strategy (all workers).
        strategy, all_reduce: ``--strategy`` and the all-reduce it used (``"collective AUTO"``).
        devices: this worker's replica devices.
        train_examples: examples in this worker's train shards.
        batch_size, epochs: per-worker batch and the job's epochs.
        train_images: images this worker trained on in this launch (``steps * batch_size``).
        steps: steps this launch trained (epochs not restored from a checkpoint).
        images_per_sec: this worker's images per second over the timed epochs (the first left out of several).
        timed_epochs: epochs timed; epoch_seconds: each epoch's seconds; train_seconds: the whole ``fit``.
        train_loss, train_top1: the last epoch's cross-entropy and top-1 (all-reduced over every worker: the
            job's, the same on every rank); None when no epoch trained.
        history: the Keras history of every epoch, those restored included (``{"loss": [...], ...}``).
        initial_epoch: epochs restored from a checkpoint.
        val: the validation metrics; eval_seconds: their seconds.
        params: the model's parameter count.
    """

    rank: int
    workers: int
    replicas_in_sync: int
    strategy: str
    all_reduce: str
    devices: tuple[str, ...]
    train_examples: int
    batch_size: int
    epochs: int
    train_images: int
    steps: int
    images_per_sec: float
    timed_epochs: int
    epoch_seconds: tuple[float, ...]
    train_seconds: float
    train_loss: float | None
    train_top1: float | None
    history: Mapping[str, Sequence[float]]
    initial_epoch: int
    val: ValMetrics
    eval_seconds: float
    params: int

    def to_json(self) -> dict[str, Any]:
        """The JSON object (versioned envelope)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data.update(devices=list(self.devices), epoch_seconds=list(self.epoch_seconds), val=self.val.to_json(),
                    history={k: list(v) for k, v in self.history.items()})
        return WORKER_RESULT.to_json(data)

    @classmethod
    def from_json(cls, data: Any, where: str = "worker result") -> "WorkerResult":
        """Inverse of :meth:`to_json` (raises ConfigError naming what is wrong)."""
        fields = WORKER_RESULT.fields_for(cls, data, where)
        try:
            fields.update(devices=tuple(fields["devices"]), epoch_seconds=tuple(fields["epoch_seconds"]),
                          val=ValMetrics(**fields["val"]),
                          history={k: tuple(v) for k, v in fields["history"].items()})
        except (TypeError, AttributeError) as e:
            raise ConfigError(f"{where}: {e}") from None
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class TfProcess:
    """Which TensorFlow process ran a task's worker.

    Attributes:
        pid: the TensorFlow process's id.
        task_pid: the task's (PySpark Python worker's) process id.
    """

    pid: int
    task_pid: int


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """What one barrier task hands to the driver (one JSON line).

    Attributes:
        rank, host: the task's rank and host.
        python: the task's interpreter (e.g. a shipped environment's).
        worker: its worker's result; None when it did not train (``peer_failed``).
        peer_failed: why it did not train (another task failed before the rendezvous), or None.
        tf_process: the TensorFlow process that ran, or None when none did.
    """

    rank: int
    host: str
    python: str
    worker: WorkerResult | None = None
    peer_failed: str | None = None
    tf_process: TfProcess | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object (versioned envelope)."""
        return TASK_RESULT.to_json({
            "rank": self.rank, "host": self.host, "python": self.python,
            "worker": None if self.worker is None else self.worker.to_json(), "peer_failed": self.peer_failed,
            "tf_process": None if self.tf_process is None else dataclasses.asdict(self.tf_process)})

    def to_line(self) -> str:
        """:meth:`to_json` as one line of JSON."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Any, where: str = "task result") -> "TaskResult":
        """Inverse of :meth:`to_json` (raises ConfigError naming what is wrong)."""
        fields = TASK_RESULT.fields_for(cls, data, where)
        if fields.get("worker") is not None:
            fields["worker"] = WorkerResult.from_json(fields["worker"], f"{where}, key 'worker'")
        if fields.get("tf_process") is not None:
            try:
                fields["tf_process"] = TfProcess(**fields["tf_process"])
            except TypeError as e:
                raise ConfigError(f"{where}: tf_process: {e}") from None
        return cls(**fields)

    @classmethod
    def from_line(cls, line: str) -> "TaskResult":
        """Inverse of :meth:`to_line`."""
        return cls.from_json(TASK_RESULT.decode(line, "task result"))


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """A complete checkpoint the job resumes from.

    Attributes:
        name: its folder in ``--checkpoint-dir`` (``epoch-000003``).
        meta: its ``checkpoint.json``.
    """

    name: str
    meta: CheckpointMeta

    @property
    def epoch(self) -> int:
        """int: the epochs it holds."""
        return self.meta.epoch


def write_outcome(path: str | os.PathLike, outcome: WorkerResult | Failure) -> None:
    """Write a worker's result or failure to ``path`` as JSON, atomically (a reader never sees half of it)."""
    from spark_imagenet.storage import write_json_atomic

    write_json_atomic(path, outcome.to_json(), indent=1)


def read_outcome(path: str | os.PathLike) -> WorkerResult | Failure | None:
    """What a worker wrote to ``path``: its result, its failure, or None when it wrote nothing.

    Raises:
        ConfigError: the file is not a worker result or failure (names the file and what is wrong).
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not readable as JSON ({e})") from None
    if isinstance(data, dict) and data.get("format") == FAILURE.format:
        return Failure.from_json(data, str(path))
    return WorkerResult.from_json(data, str(path))
