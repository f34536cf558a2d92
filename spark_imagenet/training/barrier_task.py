"""The task side of training: what runs inside each Spark barrier task.

:func:`run_task` is the function given to
``rdd.barrier().mapPartitions`` (bound to a :class:`TaskSpec` with
``functools.partial``; both are picklable module-level objects). Each task:

1. stages its own train shards and its val shards into the host's shard
   cache (:mod:`spark_imagenet.dataset.cache`);
2. meets the other tasks (:func:`spark_imagenet.training.rendezvous.rendezvous`):
   rank = partition id, every worker's ``host:port``. This happens after the
   downloads, so the probed ports are released only just before TensorFlow
   binds them, and all workers start TensorFlow within moments of each other;
3. writes the worker's :class:`~spark_imagenet.training.config.WorkerSpec` as
   JSON into a per-task temporary folder;
4. runs ``python -m spark_imagenet.training.worker WORKER_SPEC_JSON RESULT_JSON`` in a
   fresh child process (TensorFlow's collective ops can be configured once
   per process, and PySpark reuses its Python workers: tensorflow#34568),
   with TF_CONFIG, TF_USE_LEGACY_KERAS=1 and the task's GPUs in its
   environment (set here, inside the executor: the driver's environment does
   not reach executors on a cluster);
5. streams the child's output line by line to the task's stderr prefixed
   with ``[rank R]`` (the driver console under ``local[N]``, the executor
   log on a cluster), keeping the last lines for the error message;
6. yields the child's RESULT_JSON, plus ``host``, as one JSON string.

The child dies with the task: it gets ``PR_SET_PDEATHSIG`` = SIGKILL (Linux),
so it is killed when the Python worker dies (Spark kills the workers of a
barrier stage when any task fails), and a ``finally`` block kills it when
the task ends any other way.

No TensorFlow import here: the Python worker stays light; only the child
imports TensorFlow.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Iterable, Iterator, Mapping, Sequence

from spark_imagenet.training.assignment import Assignment
from spark_imagenet.training.config import TrainConfig, WorkerSpec
from spark_imagenet.errors import ConfigError, SparkImagenetError, TrainingError

#: The module run in the child process: the TensorFlow worker (reads a :class:`WorkerSpec`).
WORKER_MODULE = "spark_imagenet.training.worker"
#: Lines of child output kept for the error message of a failed rank.
TAIL_LINES = 40
#: Linux prctl(2) option: signal sent to this process when its parent thread dies.
PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs, built on the driver and pickled.

    Attributes:
        url: the dataset bucket URL (as given to :func:`open_storage`).
        dataset_id: the manifest's dataset id (names the cache sub-folder).
        num_classes: the model's output width.
        assignment: the cluster plan (:func:`spark_imagenet.training.assignment.assign`).
        config: the job's settings (``cache`` already absolute).
        storage_options: :meth:`Storage.reopen_options` of the driver's
            storage (e.g. the emulator endpoint), to reopen it in the task.
        child_module: module run with ``python -m`` in the child.
    """

    url: str
    dataset_id: str
    num_classes: int
    assignment: Assignment
    config: TrainConfig
    storage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    child_module: str = WORKER_MODULE


def cuda_visible_devices(addresses: Sequence[str], existing: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES value for the GPUs Spark gave a task.

    Args:
        addresses: ``TaskContext.resources()["gpu"].addresses``, GPU indices
            as strings (``["0", "2"]``).
        existing: the executor's own CUDA_VISIBLE_DEVICES (None or empty when
            unset). When set, Spark's addresses index into that list (the
            executor only sees those devices), so they are mapped through it.

    Returns:
        str: comma-separated device ids, e.g. ``"0,2"``.

    Raises:
        ConfigError: an address that is not a plain non-negative integer, or
            one outside the executor's CUDA_VISIBLE_DEVICES list.
    """
    indices = []
    for a in addresses:
        a = str(a).strip()
        if not a.isdigit() or (len(a) > 1 and a.startswith("0")):
            raise ConfigError(
                f"GPU address {a!r} from Spark is not a plain device index; the GPU discovery script must "
                "report CUDA device indices (0, 1, ...)"
            )
        indices.append(int(a))
    visible = [d.strip() for d in existing.split(",")] if existing and existing.strip() else None
    if visible is None:
        return ",".join(str(i) for i in indices)
    bad = [i for i in indices if i >= len(visible)]
    if bad:
        raise ConfigError(
            f"Spark assigned GPU(s) {bad} but the executor's CUDA_VISIBLE_DEVICES={existing!r} has only "
            f"{len(visible)} device(s); make the discovery script report indices relative to it"
        )
    return ",".join(visible[i] for i in indices)


def child_env(base: Mapping[str, str], tf_config: Mapping[str, Any], gpu_addresses: Sequence[str] | None,
              local_workers: int) -> dict[str, str]:
    """The environment of the TensorFlow worker process.

    Args:
        base: the task's environment (``os.environ``).
        tf_config: from :func:`spark_imagenet.training.rendezvous.build_tf_config`.
        gpu_addresses: the task's GPU addresses from Spark, or None when Spark
            assigned no GPU resource.
        local_workers: workers sharing this host.

    Returns:
        dict: ``base`` plus TF_CONFIG (JSON), TF_USE_LEGACY_KERAS=1 (docs/design.md,
        'Keras 2 (tf-keras) under MultiWorkerMirroredStrategy'),
        TF_CPP_MIN_LOG_LEVEL=2 unless set, PYTHONUNBUFFERED=1,
        CUDA_VISIBLE_DEVICES from ``gpu_addresses`` (see
        :func:`cuda_visible_devices`); with no GPU resource and several
        workers on the host, TF_FORCE_GPU_ALLOW_GROWTH=true unless set, so
        co-located workers do not each reserve a whole GPU's memory; and this
        package's folder first on PYTHONPATH, so ``python -m`` finds it even
        when it is not installed.

    Raises:
        ConfigError: see :func:`cuda_visible_devices`.
    """
    env = dict(base)
    env["TF_CONFIG"] = json.dumps(tf_config)
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    if gpu_addresses:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(gpu_addresses, base.get("CUDA_VISIBLE_DEVICES"))
    elif local_workers > 1:
        env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in paths if p != package_parent])
    return env


def host_cpus() -> int:
    """CPUs this process may run on (affinity mask, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _die_with_parent(parent_pid: int) -> None:
    """preexec_fn of the child: ask Linux to SIGKILL it when the Python worker
    (its parent) dies; exit at once if the parent is already gone."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _exit_description(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def run_child(argv: Sequence[str], env: Mapping[str, str], cwd: str, prefix: str,
              tail_lines: int = TAIL_LINES, out=None) -> tuple[int, list[str]]:
    """Run a child process, echoing its output line by line.

    Args:
        argv: the command.
        env: its environment.
        cwd: its working folder.
        prefix: put before each echoed line, e.g. ``"[rank 1] "``.
        tail_lines: how many of the last lines to keep.
        out: text stream to echo to (default ``sys.stderr``).

    Returns:
        ``(exit_code, last_lines)``; a negative code is the killing signal.
    """
    out = out or sys.stderr
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    parent = os.getpid()
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=dict(env), cwd=cwd, preexec_fn=lambda: _die_with_parent(parent),
    )
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            # a progress bar redraws with \r: keep what the terminal would show
            line = line.rsplit("\r", 1)[-1]
            tail.append(line)
            out.write(f"{prefix}{line}\n")
            out.flush()
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return code, list(tail)


def _log(rank: int, msg: str) -> None:
    sys.stderr.write(f"[rank {rank}] {msg}\n")
    sys.stderr.flush()


def _stage(spec: TaskSpec, rank: int, host: str) -> tuple[list[str], list[str]]:
    """Fetch this rank's train and val shards into the host's cache; return their local paths.

    Raises:
        StorageError: a shard could not be staged (the message names rank, host and shard).
    """
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.staging import stage_shards

    def log(msg: str) -> None:
        _log(rank, msg)

    try:
        storage = open_storage(spec.url, **spec.storage_options)
        staged = stage_shards(storage, spec.assignment[rank], spec.config.cache, spec.dataset_id,
                              transfers=spec.config.transfers, log=log)
    except SparkImagenetError as e:
        raise type(e)(f"rank {rank} on {host}: {e}") from None
    for what, got in zip(("train", "val"), staged):
        if got.downloaded:
            log(f"{what}: downloaded {got.downloaded} shard(s), {got.bytes_downloaded / 1e6:.1f} MB at "
                f"{got.mb_per_sec:.1f} MB/s; {got.reused} already cached")
    return list(staged[0]), list(staged[1])


def worker_spec(spec: TaskSpec, rank: int, train_files: Sequence[str], val_files: Sequence[str],
                threads: int) -> WorkerSpec:
    """The message for rank ``rank``'s TensorFlow worker process.

    Args:
        spec: the job's task spec.
        rank: the worker's rank.
        train_files, val_files: its staged shard files.
        threads: CPUs for this worker (the host's CPUs / workers on the host);
            also the tf.data parallelism unless ``config.parallel`` is set.
    """
    plan = spec.assignment[rank]
    return WorkerSpec(
        config=spec.config, rank=rank, workers=spec.config.workers, num_classes=spec.num_classes,
        train_files=tuple(train_files), train_examples=plan.train_examples,
        val_files=tuple(val_files), val_record_shard=plan.val_record_shard, val_examples=plan.val_examples,
        val_examples_total=spec.assignment.val_examples_total, steps_per_epoch=spec.assignment.steps_per_epoch,
        val_steps=spec.assignment.val_steps, parallel=spec.config.parallel or threads, threads=threads,
    )


def _run_worker(spec: TaskSpec, message: WorkerSpec, env: dict[str, str], host: str) -> dict[str, Any]:
    """Run the TensorFlow worker process in a temporary folder; return its result.

    Raises:
        TrainingError: the process failed (rank, host, exit status and its last
            output lines) or wrote no readable result.
    """
    rank = message.rank
    workdir = tempfile.mkdtemp(prefix=f"spark-imagenet-rank{rank}-")
    # TensorFlow's own temporary files (autograph's generated modules) go into the
    # task's folder, which is removed below even when the child could not clean up.
    env = {**env, "TMPDIR": workdir}
    try:
        spec_path = os.path.join(workdir, "worker.json")
        result_path = os.path.join(workdir, "result.json")
        with open(spec_path, "w") as f:
            json.dump(message.to_json(), f, indent=1)
        code, tail = run_child([sys.executable, "-m", spec.child_module, spec_path, result_path],
                               env, workdir, f"[rank {rank}] ")
        if code != 0:
            shown = "\n".join(f"  | {line}" for line in tail) or "  | (no output)"
            raise TrainingError(
                f"rank {rank} on {host}: the TensorFlow process ({spec.child_module}) {_exit_description(code)}; "
                f"its last {len(tail)} output line(s):\n{shown}\n"
                f"(end of rank {rank} output)"
            )
        try:
            with open(result_path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise TrainingError(
                f"rank {rank} on {host}: the TensorFlow process exited 0 but wrote no readable result "
                f"({result_path}: {e})"
            ) from e
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)


def run_task(spec: TaskSpec, _partition: Iterable[Any]) -> Iterator[str]:
    """Body of one barrier task (see the module docstring).

    Args:
        spec: the job's :class:`TaskSpec`.
        _partition: the partition's items (ignored; one partition per worker).

    Yields:
        str: one JSON object: the worker's result plus ``"host"``.

    Raises:
        TrainingError: the child failed (message: rank, host, exit status and
            its last output lines), or the rendezvous failed.
        StorageError: a shard could not be staged (message names rank, host
            and shard).
    """
    from pyspark import BarrierTaskContext

    from spark_imagenet.training.rendezvous import build_tf_config, local_worker_count, rendezvous, split_host_port

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    host = split_host_port(ctx.getTaskInfos()[rank].address)[0]
    train_files, val_files = _stage(spec, rank, host)

    rank, addresses, host = rendezvous(ctx)
    local_workers = local_worker_count(addresses, host)
    threads = max(1, host_cpus() // max(1, local_workers))
    resources = ctx.resources()
    gpus = list(resources["gpu"].addresses) if "gpu" in resources else None
    message = worker_spec(spec, rank, train_files, val_files, threads)
    env = child_env(os.environ, build_tf_config(addresses, rank), gpus, local_workers)
    _log(rank, f"{host}: {len(train_files)} train + {len(val_files)} val shard(s), {threads} thread(s), "
               f"cluster {addresses}")
    result = _run_worker(spec, message, env, host)
    result["host"] = host
    yield json.dumps(result)
