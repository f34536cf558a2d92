"""The TensorFlow worker's strategy: threads and seed, the strategy ``config.scaling.strategy`` names, and one
all-gather in which every worker checks the others' settings (a mismatch is a :class:`TrainingError` instead of
a hang in a collective). docs/design.md, 'Strategies'.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import time
from typing import Any, Iterator

import tensorflow as tf
import tf_keras as keras

from spark_imagenet.errors import TrainingError
from spark_imagenet.training.job.outcome import Failure, write_outcome
from spark_imagenet.training.job.plan import WorkerSpec

logger = logging.getLogger(__name__)

#: Settings every worker must agree on, as ``WorkerSpec`` attribute paths
#: (order matters: it is the all-gather layout).
SHARED_SETTINGS = ("workers", "steps_per_epoch", "val_steps", "config.recipe.epochs", "config.recipe.batch_size",
                   "config.recipe.image_size", "num_classes")
#: The stage named in a failure while the strategy is built.
STAGE_STRATEGY = "building the strategy"


def _setting(spec: WorkerSpec, path: str) -> Any:
    """``spec.<path>`` for a dotted attribute path such as ``"config.recipe.epochs"``."""
    value: Any = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _num_workers(strategy: tf.distribute.Strategy) -> int:
    """Number of workers (chief + workers) in the strategy's cluster (1 without TF_CONFIG)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    n = len(spec.get("chief", [])) + len(spec.get("worker", []))
    return max(1, n)


def _gather_worker_settings(strategy: tf.distribute.Strategy, spec: WorkerSpec) -> dict[int, dict[str, int]]:
    """All-gather every worker's rank, shared settings and example counts.

    One collective, run at the same point on every worker right after the
    strategy is built: it checks that all workers are reachable and lets each
    check the others' settings before anything can hang on a mismatch.

    Returns:
        ``{rank: {"train_examples", "val_examples", *SHARED_SETTINGS}}`` for
        every worker (rows of a worker's several local replicas are merged).
    """
    keys = ("rank", "train_examples", "val_examples") + SHARED_SETTINGS
    local = tf.constant([[_setting(spec, k) for k in keys]], dtype=tf.int64)

    @tf.function
    def gather() -> Any:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_gather(local, axis=0))

    rows = strategy.experimental_local_results(gather())[0].numpy()
    return {int(row[0]): dict(zip(keys[1:], (int(v) for v in row[1:]))) for row in rows}


def leave_together(strategy: tf.distribute.Strategy, spec: WorkerSpec) -> None:
    """One all-reduce that every worker of a multi-worker strategy joins last: the other ranks wait in it until
    the chief has written its outputs, so that none ends its process meanwhile (the chief runs TensorFlow's
    coordination service, which reports a peer gone quiet as an error). Nothing for one worker."""
    if spec.config.scaling.strategy != "multiworker" or spec.workers < 2:
        return

    @tf.function
    def meet() -> Any:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0)))

    strategy.experimental_local_results(meet())


def _check_workers(spec: WorkerSpec, workers: dict[int, dict[str, int]]) -> int:
    """Check the gathered settings agree; return the total real val examples.

    Raises:
        TrainingError: ranks missing or duplicated, or a shared setting differs
            between workers (which would make the collectives hang).
    """
    if sorted(workers) != list(range(spec.workers)):
        raise TrainingError(
            f"the MWMS workers report ranks {sorted(workers)} but the spec says workers = {spec.workers}: "
            f"each worker needs a distinct rank 0..{spec.workers - 1}"
        )
    for key in SHARED_SETTINGS:
        values = {rank: w[key] for rank, w in workers.items()}
        if len(set(values.values())) > 1:
            name = key.rpartition(".")[2]
            raise TrainingError(
                f"workers disagree on {name}: {values} (rank: value); every worker must use the same "
                f"{name} or the synchronous training hangs"
            )
    total = sum(w["val_examples"] for w in workers.values())
    if spec.val_examples_total != total:
        raise TrainingError(
            f"val_examples_total in the spec is {spec.val_examples_total} but the workers' val_examples add up "
            f"to {total}"
        )
    return total


def configure(spec: WorkerSpec) -> None:
    """Threads and seed: before TensorFlow's runtime starts (before the strategy)."""
    if spec.threads:
        tf.config.threading.set_intra_op_parallelism_threads(spec.threads)
        tf.config.threading.set_inter_op_parallelism_threads(spec.threads)
    # Per-worker seed (dropout, augmentation); the initial weights are
    # broadcast from the chief by MWMS, so they agree anyway.
    keras.utils.set_random_seed(spec.seed)
    # Dropout draws from a tf.random.Generator, whose state is a variable: checkpoints hold it, so a resumed
    # run draws the masks an uninterrupted one would (Keras' legacy stateful ops restart their streams).
    keras.backend.experimental.enable_tf_random_generator()
    if spec.config.data.deterministic:
        tf.config.experimental.enable_op_determinism()


#: The TensorFlow strategy each ``--strategy`` builds (named in the log line).
_STRATEGY_CLASS = {"multiworker": "MultiWorkerMirroredStrategy", "mirrored": "MirroredStrategy",
                   "default": "the default strategy"}
#: ``--cross-device-ops`` of MultiWorkerMirroredStrategy: its collective implementation.
_MWMS_IMPLEMENTATION = {"auto": "AUTO", "nccl": "NCCL", "ring": "RING"}


def _make_strategy(spec: WorkerSpec) -> tuple[tf.distribute.Strategy, str]:
    """The strategy ``spec.config.scaling.strategy`` names, with its all-reduce; and a description of that all-reduce.

    ``multiworker``: ``MultiWorkerMirroredStrategy`` (cluster from
    ``TF_CONFIG``; every local GPU of this worker, else its CPU) with
    ``CommunicationOptions(implementation=AUTO|NCCL|RING)``. ``mirrored``:
    ``MirroredStrategy`` over every local GPU (the CPU if none) with
    ``cross_device_ops`` ``NcclAllReduce()``, ``ReductionToOneDevice()`` or
    None (auto: TensorFlow's choice). ``default``: ``tf.distribute.get_strategy()``,
    one device, no all-reduce. The one-worker strategies drop an inherited
    ``TF_CONFIG`` (they have no cluster).

    Raises:
        TrainingError: ``mirrored`` with ``nccl`` on a worker that sees no GPU.
    """
    config = spec.config
    ops = config.scaling.cross_device_ops
    if config.scaling.strategy == "multiworker":
        implementation = getattr(tf.distribute.experimental.CommunicationImplementation, _MWMS_IMPLEMENTATION[ops])
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        return strategy, f"collective {implementation.name}"
    os.environ.pop("TF_CONFIG", None)
    if config.scaling.strategy == "default":
        return tf.distribute.get_strategy(), "none (one device)"
    gpus = tf.config.list_physical_devices("GPU")  # does not start the runtime
    if ops == "nccl" and not gpus:
        raise TrainingError("cross_device_ops (--cross-device-ops) nccl needs GPUs, but this worker sees none "
                            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); use auto or "
                            "reduction-to-one on CPU")
    cross = {"auto": None, "nccl": tf.distribute.NcclAllReduce,
             "reduction-to-one": tf.distribute.ReductionToOneDevice}[ops]
    strategy = tf.distribute.MirroredStrategy(cross_device_ops=cross() if cross else None)
    if cross is not None:
        return strategy, cross.__name__
    # TensorFlow's choice for auto (a private attribute of TF 2.21's MirroredExtended; read only when present)
    chosen = getattr(strategy.extended, "_inferred_cross_device_ops", None)
    return strategy, f"auto ({type(chosen).__name__})" if chosen is not None else "auto"


def _strategy_devices(strategy: tf.distribute.Strategy) -> list[str]:
    """The devices of this worker's replicas (``extended.worker_devices``; the default strategy's one device)."""
    try:
        return [str(d) for d in strategy.extended.worker_devices]
    except RuntimeError:  # the default strategy has no worker_devices: its one device is TF's first choice
        gpus = tf.config.list_logical_devices("GPU")
        return [gpus[0].name if gpus else tf.config.list_logical_devices("CPU")[0].name]


@contextlib.contextmanager
def startup_report(spec: WorkerSpec, result_path: str | None) -> Iterator[None]:
    """While the strategy waits for the other workers, ``result_path`` holds the failure to report if the wait
    ends the process (``startup_timeout_s``: Python's faulthandler exits without running any Python code); it
    is removed once the strategy is built. Nothing is written without a path, a timeout or several workers."""
    if result_path is None or spec.startup_timeout_s <= 0 or spec.workers < 2:
        yield
        return
    write_outcome(result_path, Failure(
        stage=STAGE_STRATEGY, error="WorkerLost", rank=spec.rank,
        message=f"the other workers did not all come up within --startup-timeout {spec.startup_timeout_s:g} s "
                "(a peer that never started, failed before this point, or cannot be reached)"))
    yield
    with contextlib.suppress(FileNotFoundError):
        os.remove(result_path)


def build_strategy(spec: WorkerSpec) -> tuple[tf.distribute.Strategy, int, dict]:
    """The strategy, once every worker is up and agrees; returns it, the total val examples and its description.

    The description is ``{"strategy", "all_reduce", "devices"}`` (put into
    the result). The one-worker strategies (``mirrored``, ``default``) need no
    all-gather: this worker's settings are the only ones.

    Raises:
        TrainingError: TF_CONFIG's cluster size differs from the spec, or the
            workers disagree (see :func:`_check_workers`).
    """
    t0 = time.perf_counter()
    timeout = spec.startup_timeout_s
    multiworker = spec.config.scaling.strategy == "multiworker"
    if spec.workers > 1:
        limit = f"at most {timeout:g} s" if timeout > 0 else "no time limit"
        logger.info(f"strategy: waiting for {spec.workers} worker(s) ({limit})")
    if timeout > 0:
        # A C-level watchdog: the strategy blocks holding the GIL (docs/design.md, 'Waiting for peers at start-up').
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.stderr)
    try:
        strategy, all_reduce = _make_strategy(spec)
        cluster_workers = _num_workers(strategy)
        if cluster_workers != spec.workers:
            raise TrainingError(
                f"TF_CONFIG describes {cluster_workers} worker(s) but the worker spec says workers = {spec.workers}"
            )
        if multiworker:
            gathered = _gather_worker_settings(strategy, spec)
        else:
            keys = ("train_examples", "val_examples") + SHARED_SETTINGS
            gathered = {spec.rank: {k: int(_setting(spec, k)) for k in keys}}
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()
    val_total = _check_workers(spec, gathered)
    devices = _strategy_devices(strategy)
    logger.info(
        f"strategy: {spec.config.scaling.strategy} ({_STRATEGY_CLASS[spec.config.scaling.strategy]}), {cluster_workers} worker(s), "
        f"{strategy.num_replicas_in_sync} replica(s) in sync on {', '.join(devices)}; all-reduce {all_reduce}; "
        f"{time.perf_counter() - t0:.1f} s; threads {spec.threads or 'default'}"
    )
    return strategy, val_total, {"strategy": spec.config.scaling.strategy, "all_reduce": all_reduce,
                                 "devices": tuple(devices)}
