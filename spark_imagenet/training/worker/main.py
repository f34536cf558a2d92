"""The TensorFlow worker process of one barrier task: one worker of the job's strategy.

The strategy is ``config.scaling.strategy`` (docs/design.md, 'Strategies'):
``multiworker`` (MultiWorkerMirroredStrategy, every local GPU of the worker),
``mirrored`` (MirroredStrategy over every local GPU, one worker, no cluster)
or ``default`` (one device); the all-reduce is ``config.scaling.cross_device_ops``.

Usage::

    python -m spark_imagenet.training.worker.main [--preload ENV_JSON] WORKER_SPEC_JSON RESULT_JSON

The barrier task starts this in a fresh process (collectives can be configured
once per process: docs/design.md, 'One TensorFlow process per task') with
``TF_USE_LEGACY_KERAS=1`` (:func:`main` also sets it, and ``TF_CPP_MIN_LOG_LEVEL=2``, as defaults
before TensorFlow is imported: :func:`~spark_imagenet.training.worker.environment.prepare_tensorflow_process`;
this module imports TensorFlow only then). Without ``TF_CONFIG`` the strategy has one worker, which tests use.
One worker may hold several replicas (one per local GPU).

Input: WORKER_SPEC_JSON, a :class:`~spark_imagenet.training.job.plan.WorkerSpec`
(``to_json``); nothing else is read.

With ``--preload ENV_JSON`` (how the barrier task starts it, through the host's
fork server: :mod:`spark_imagenet.training.worker.forkserver`) the process first
imports TensorFlow and this package's training modules (:func:`preload`; no
strategy, no device, no op), then waits for one line ``run`` on its stdin (its
go; the end of stdin instead: exit 1 without a word). Only then does it read
ENV_JSON, a JSON object of environment variables known only after the
rendezvous (:func:`spark_imagenet.training.task.environment.job_env`), which it
puts into ``os.environ`` before building the strategy (TensorFlow reads them
when the strategy and its devices are created, not at import), and then
WORKER_SPEC_JSON. ENV_JSON holds ``TF_CONFIG`` (the cluster) for the
``multiworker`` strategy only, and ``TF_FORCE_GPU_ALLOW_GROWTH=true`` only when
the task got no GPU resource from Spark, several workers share the host (they
may then all see the same GPUs) and the executor's environment does not set it
already; otherwise it may be empty. Started without ``--preload``, the process
sets neither: its environment is used as it is.

What it does (:func:`~spark_imagenet.training.worker.training.run_worker`; the strategy:
:mod:`spark_imagenet.training.worker.strategy`): threads and seed; the strategy, then one
all-gather of every worker's shared settings (a mismatch is a
:class:`TrainingError` instead of a hang in a collective); datasets through
``strategy.distribute_datasets_from_function`` with
:func:`spark_imagenet.training.worker.pipeline.train_dataset` / ``eval_dataset``
(each worker reads only its own files); the model built and compiled inside
``strategy.scope()``; ``fit(epochs, steps_per_epoch)``; then
``evaluate(steps=val_steps)`` on ``(image, label, weight)`` batches whose
zero-weight padding rows do not count, so the metrics are exact over the real
validation examples of all workers.

Output: RESULT_JSON, a :class:`~spark_imagenet.training.job.outcome.WorkerResult` (``to_json``: the versioned
envelope with ``rank``, ``workers``, ``replicas_in_sync``, ``strategy``, ``all_reduce``, ``devices``,
``train_examples``, ``train_images``, ``steps``, ``images_per_sec``, ``epoch_seconds``, ``train_seconds``,
``train_loss``, ``train_top1``, ``history``, ``val`` and ``params``). ``images_per_sec`` leaves the first epoch
out when there are several (it includes tracing, the first collective handshakes and filling the pipeline);
``train_seconds`` is the whole ``fit``. ``train_loss`` and ``val.loss`` are the cross-entropy without weight
decay; ``history["loss"]`` is Keras' objective with it. Metrics are all-reduced over the workers by the strategy.

Exit status 0 with the result written; 1 on any failure, with RESULT_JSON holding a
:class:`~spark_imagenet.training.job.outcome.Failure` (the stage, the rank, the message, the error class; a
collective aborted because a peer is gone is ``WorkerLost`` with the peers TensorFlow's text names) and one stderr
line ``worker rank R failed while STAGE: ExceptionType: message`` for the user (data errors inside
``fit``/``evaluate`` name the shard file and record, see
:func:`spark_imagenet.training.worker.pipeline.naming_bad_records`); 2 on wrong usage; 3
(:data:`~spark_imagenet.training.job.config.EXIT_STEP_TIMEOUT`) when the step watchdog ends it, with its
failure written. Waiting for the other workers is bounded by ``startup_timeout_s``: the process then exits 1
printing ``Timeout`` and its stack, and RESULT_JSON holds the failure written before the wait (docs/design.md,
'Waiting for peers at start-up'). Parents should end it with SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Callable, Sequence

from spark_imagenet.errors import SparkImagenetError
from spark_imagenet.logs import worker_console
from spark_imagenet.training.job.outcome import Failure, LostPeer, describe_lost, write_outcome
from spark_imagenet.training.job.outputs import LOCAL_OUTPUT_DIR
from spark_imagenet.training.job.plan import WorkerSpec
from spark_imagenet.training.worker.environment import prepare_tensorflow_process


#: TensorFlow's errors (``tf.errors``) of a collective whose peer is gone (or of its coordination service): the
#: worker was lost.
_LOST_ERRORS = ("UnavailableError", "CancelledError", "DeadlineExceededError", "AbortedError")


def _is_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is one of :data:`_LOST_ERRORS` (never, when TensorFlow is not imported)."""
    errors = getattr(sys.modules.get("tensorflow"), "errors", None)
    return errors is not None and isinstance(exc, tuple(getattr(errors, name) for name in _LOST_ERRORS))


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line.

    A :class:`SparkImagenetError` message is kept whole. Other messages keep
    their informative lines joined with " | " (at most 2000 characters):
    TensorFlow's "Graph execution error" header, the "Detected at node"
    Python stack and the ``[[{{node ...}}]]`` context are dropped.
    """
    message = str(exc)
    if isinstance(exc, SparkImagenetError):
        return f"{type(exc).__name__}: {message}"
    skip = ("[[", "Executing op", "Graph execution error", "Detected at node", 'File "', "<stack traces unavailable>")
    lines = [ln.strip() for ln in message.splitlines()]
    message = " | ".join(ln for ln in lines if ln and not ln.startswith(skip))
    if len(message) > 2000:
        message = message[:2000] + " ..."
    return f"{type(exc).__name__}: {message}"


def failure_of(exc: BaseException, stage: str, rank: int | None, peers: Sequence[str] = ()) -> Failure:
    """The :class:`Failure` of an exception caught in the worker while running ``stage``.

    A collective TensorFlow aborted because a peer is gone (``UnavailableError``, ``CancelledError``,
    ``DeadlineExceededError``, ``AbortedError``) is a lost worker (``error="WorkerLost"``), with the peers its
    text names (:func:`lost_peers`) or, when it names none, a hint to read the other workers' messages. A
    :class:`SparkImagenetError` keeps its class; anything else is a ``TrainingError``.
    """
    message = _one_line(exc)
    error = type(exc).__name__ if isinstance(exc, SparkImagenetError) else "TrainingError"
    lost: tuple[LostPeer, ...] = ()
    if _is_lost(exc):
        error = "WorkerLost"
        lost = lost_peers(str(exc), peers)
        if not lost:
            message += " (another worker probably failed or became unreachable: see the other workers' messages)"
    return Failure(stage=stage, message=message, error=error, rank=rank if isinstance(rank, int) else None,
                   lost_peers=lost)


def lost_peers(message: str, peers: Sequence[str] = ()) -> tuple[LostPeer, ...]:
    """Who is missing, from the text of a collective that TensorFlow's coordination service aborted.

    The service (on the chief) fails every worker's collectives once a worker stops sending heartbeats
    (killed, SIGSTOPped, its machine gone) with "The following tasks are unhealthy (stopped
    sending heartbeats): /job:worker/replica:0/task:R ..."; when the chief itself stops, the others' heartbeat
    RPC times out ("Deadline Exceeded ... CoordinationService/Heartbeat"). A peer whose process was killed
    mid-collective is named sooner by gRPC: "Connection reset by peer ... from remote target
    /job:worker/replica:0/task:R". docs/design.md, 'No hangs'.

    Args:
        message: the error's text (TensorFlow's).
        peers: every worker's ``host:port`` in rank order (named beside each rank when given).

    Returns:
        The lost peers (empty when the text names none).
    """
    def peer(r: int, why: str) -> LostPeer:
        return LostPeer(r, peers[r] if 0 <= r < len(peers) else None, why)

    if "stopped sending heartbeats" in message:
        tail = message.split("stopped sending heartbeats", 1)[1]
        ranks = sorted({int(r) for r in re.findall(r"/job:worker/replica:\d+/task:(\d+)", tail)})
        if ranks:
            return tuple(peer(r, "stopped sending heartbeats (stopped, killed or unreachable)") for r in ranks)
    if "CoordinationService/Heartbeat" in message:
        return (peer(0, "does not answer heartbeats: it is the chief, which runs TensorFlow's coordination "
                        "service (stopped, killed or unreachable)"),)
    if any(reset in message for reset in _CONNECTION_ENDED):
        ranks = sorted({int(r) for r in re.findall(r"from remote target /job:worker/replica:\d+/task:(\d+)", message)})
        return tuple(peer(r, "closed its connection (killed, or its process ended)") for r in ranks)
    return ()


#: gRPC's words for a peer's connection that ended under a collective (its process killed or gone).
_CONNECTION_ENDED = ("Connection reset by peer", "Socket closed", "Broken pipe")


#: The modules the training imports (TensorFlow and tf-keras with the first), imported by :func:`preload`.
PRELOADED_MODULES = ("spark_imagenet.training.worker.training", "spark_imagenet.training.worker.pipeline",
                     "spark_imagenet.training.worker.models.compile", "spark_imagenet.training.worker.models.registry",
                     "spark_imagenet.training.worker.keras_schedule", "spark_imagenet.training.job.schedules",
                     "spark_imagenet.training.job.checkpoints", "spark_imagenet.training.worker.model_state",
                     "spark_imagenet.storage")


def preload() -> None:
    """Import :data:`PRELOADED_MODULES`: what the training would import anyway, without building a strategy or
    touching a device (after :func:`~spark_imagenet.training.worker.environment.prepare_tensorflow_process`)."""
    import importlib

    for name in PRELOADED_MODULES:
        importlib.import_module(name)


def _await_go(env_path: str) -> bool:
    """:func:`preload`, wait for the ``run`` line on stdin, then set the environment variables of the JSON
    object at ``env_path``. Returns False on the end of stdin (no go).

    Raises:
        OSError, ValueError: ``env_path`` unreadable, or not an object of strings.
    """
    preload()
    if sys.stdin.readline().strip() != "run":
        return False
    with open(env_path, encoding="utf-8") as f:
        environ = json.load(f)
    if not isinstance(environ, dict) or not all(isinstance(v, str) for v in environ.values()):
        raise ValueError(f"{env_path}: not a JSON object of strings")
    os.environ.update(environ)
    return True


def _report(failure: Failure, result_path: str) -> None:
    """Write ``failure`` to ``result_path`` (for the task) and say it in one stderr line (for the user)."""
    lost = f"lost its peer: {describe_lost(failure.lost_peers)}; " if failure.lost_peers else ""
    rank = "?" if failure.rank is None else failure.rank
    print(f"worker rank {rank} failed while {failure.stage}: {lost}{failure.message}", file=sys.stderr, flush=True)
    try:
        write_outcome(result_path, failure)
    except Exception as e:  # noqa: BLE001 - the exit status still tells the task
        print(f"worker rank {rank}: could not write {result_path}: {e}", file=sys.stderr, flush=True)


def _step_timeout_exit(result_path: str, rank: int) -> Callable[[str, tuple[LostPeer, ...]], None]:
    """The step watchdog's action: report the timeout with the peers that did not answer, then end the
    process with :data:`~spark_imagenet.training.job.config.EXIT_STEP_TIMEOUT`."""
    from spark_imagenet.training.job.config import EXIT_STEP_TIMEOUT
    from spark_imagenet.training.worker.training import STAGE_FIT

    def expire(message: str, lost: tuple[LostPeer, ...]) -> None:
        try:
            _report(Failure(stage=STAGE_FIT, message=message, error="WorkerLost", rank=rank, lost_peers=lost),
                    result_path)
        finally:
            os._exit(EXIT_STEP_TIMEOUT)

    return expire


def _read_spec(spec_path: str, status: dict) -> WorkerSpec:
    """The worker spec at ``spec_path``; its rank goes into ``status`` as soon as it can be read."""
    with open(spec_path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict) and isinstance(data.get("rank"), int):
        status["rank"] = data["rank"]
    return WorkerSpec.from_json(data, f"worker spec {spec_path}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``python -m spark_imagenet.training.worker.main [--preload ENV_JSON] WORKER_SPEC_JSON
    RESULT_JSON``.

    Returns:
        0 on success (RESULT_JSON holds the :class:`WorkerResult`), 1 on any failure (RESULT_JSON holds the
        :class:`Failure`, and one line on stderr says it; the full traceback too with
        ``SPARK_IMAGENET_DEBUG=1``) and on a ``--preload`` process's stdin ending without a go (silently,
        nothing written), 2 on wrong usage.
    """
    argv = sys.argv[1:] if argv is None else argv
    env_path = None
    if len(argv) == 4 and argv[0] == "--preload":
        env_path, argv = argv[1], argv[2:]
    if len(argv) != 2:
        print("usage: python -m spark_imagenet.training.worker.main [--preload ENV_JSON] WORKER_SPEC_JSON RESULT_JSON",
              file=sys.stderr, flush=True)
        return 2
    prepare_tensorflow_process()
    # the training's modules import TensorFlow: only after its set-up
    from spark_imagenet.training.worker.training import STAGE_RESULT, STAGE_SPEC, run_worker

    spec_path, result_path = argv
    status: dict[str, Any] = {"stage": STAGE_SPEC, "rank": None, "result_path": result_path}
    try:
        if env_path is not None and not _await_go(env_path):
            return 1
        spec = _read_spec(spec_path, status)
        status["peers"] = spec.peers
        output_dir = os.path.join(os.path.dirname(os.path.abspath(result_path)), LOCAL_OUTPUT_DIR)
        with worker_console():  # progress lines, plain, on stdout: the task prefixes and forwards them
            result = run_worker(spec, status=status, output_dir=output_dir,
                                on_step_timeout=_step_timeout_exit(result_path, spec.rank))
        status["stage"] = STAGE_RESULT
        write_outcome(result_path, result)
    except BaseException as exc:  # noqa: BLE001 - report everything, including KeyboardInterrupt
        _report(failure_of(exc, status["stage"], status["rank"], status.get("peers", ())), result_path)
        if os.environ.get("SPARK_IMAGENET_DEBUG"):
            import traceback

            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.stdout.reconfigure(line_buffering=True)  # progress lines reach the parent as they happen
    except (AttributeError, ValueError):
        pass
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit without interpreter teardown: TensorFlow's gRPC server and the MWMS
    # health-check thread can block or crash a normal shutdown after training.
    os._exit(code)
