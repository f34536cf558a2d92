"""The driver's check of Spark's GPU settings for ``--gpus-per-worker``, before any task starts.

Spark gives each task its GPU addresses (``TaskContext.resources()["gpu"]``)
only when the task, the executor and the GPU discovery all ask for GPUs
(docs/design.md, 'GPUs and CUDA_VISIBLE_DEVICES'). :func:`check_gpu_conf`
checks the settings the driver can see and says exactly which ones to add, with the numbers.
"""

from __future__ import annotations

from typing import Callable

from spark_imagenet.errors import ConfigError
from spark_imagenet.training.driver.preflight.findings import Finding
from spark_imagenet.training.job.gpus import host_has_gpus
from spark_imagenet.training.job.master import Master

TASK_AMOUNT = "spark.task.resource.gpu.amount"
EXECUTOR_AMOUNT = "spark.executor.resource.gpu.amount"
EXECUTOR_SCRIPT = "spark.executor.resource.gpu.discoveryScript"
WORKER_AMOUNT = "spark.worker.resource.gpu.amount"
WORKER_SCRIPT = "spark.worker.resource.gpu.discoveryScript"
WORKER_FILE = "spark.worker.resourcesFile"
#: The discovery script of this repository (prints the GPUs nvidia-smi sees).
DISCOVERY_SCRIPT = "conf/gpu-discovery.sh"


def _amount(get: Callable[[str], str | None], key: str) -> float | None:
    """``float(get(key))``; None when unset or empty.

    Raises:
        ConfigError: a value that is not a number (names the key).
    """
    raw = get(key)
    if raw is None or not str(raw).strip():
        return None
    try:
        return float(str(raw).strip())
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number", key=key, value=raw) from None


def _fmt(x: float) -> str:
    return f"{x:g}"


def _missing_settings(get: Callable[[str], str | None], k: int, master: Master, workers: int = 1) -> list[str]:
    """One line per setting that must be added or raised for ``k`` GPUs per task on this kind of master.

    On ``local-cluster[E,C,M]`` the amounts are exact: each executor (and its worker) needs
    ``k * ceil(workers / E)`` GPUs, since Spark runs only ``executor amount // k`` tasks on an executor.
    """
    kind = master.kind
    missing = []
    task = _amount(get, TASK_AMOUNT)
    if task is None or task < k:
        now = "unset" if task is None else f"is {_fmt(task)}"
        missing.append(f"{TASK_AMOUNT}={k} (now {now}): the GPUs Spark gives each task (= each worker)")
    executors = master.executors
    need = k * -(-workers // executors) if executors else k
    executor = _amount(get, EXECUTOR_AMOUNT)
    if executor is None or executor < need:
        now = "unset" if executor is None else f"is {_fmt(executor)}"
        if executors:
            missing.append(f"{EXECUTOR_AMOUNT}={need} (now {now}): {workers} worker(s) on {executors} "
                           f"executor(s) of local-cluster, {k} GPU(s) each")
        else:
            missing.append(f"{EXECUTOR_AMOUNT}={k} or more (now {now}; {k} x the workers an executor runs: "
                           "spark.executor.cores / spark.task.cpus)")
    if kind in ("local-cluster", "standalone"):
        worker = _amount(get, WORKER_AMOUNT)
        has_discovery = get(WORKER_SCRIPT) or get(WORKER_FILE)
        if kind == "local-cluster" and (worker is None or worker < need):
            now = "unset" if worker is None else f"is {_fmt(worker)}"
            missing.append(f"{WORKER_AMOUNT}={need} (now {now}): each local-cluster worker's GPUs")
        if kind == "local-cluster" and not has_discovery:
            missing.append(f"{WORKER_SCRIPT}={installed_script()} (or {WORKER_FILE}; now unset): lists each "
                           f"local-cluster worker's GPUs{_no_gpus_here()}")
    elif not get(EXECUTOR_SCRIPT):
        missing.append(f"{EXECUTOR_SCRIPT}=/path/to/{DISCOVERY_SCRIPT} (now unset): the script that lists an "
                       "executor's GPUs, at the same path on every host (or shipped with --files)")
    return missing


def check_gpu_conf(get: Callable[[str], str | None], gpus_per_worker: int, workers: int,
                   master: str | None = None, *, server: str | None = None) -> Finding:
    """Check that Spark's settings give each of ``workers`` tasks ``gpus_per_worker`` GPUs.

    Args:
        get: reads one Spark setting, None when unset (e.g. ``lambda k: facts.get(k)``).
        gpus_per_worker: K, GPUs each worker asks for (``--gpus-per-worker``; 0 = none).
        workers: N, the barrier tasks (named in the message).
        master: the Spark master URL; it decides where the GPUs are
            discovered: ``local-cluster[...]`` and ``spark://`` by the
            standalone workers (``spark.worker.resource.gpu.*``, for
            ``spark://`` in each worker's own configuration, which the driver
            cannot see), YARN, Kubernetes and others by the executors'
            discovery script. ``local[N]`` cannot give tasks GPUs. Under
            Spark Connect: the server's ``spark.master``.
        server: the ``sc://HOST:PORT`` of a Spark Connect session, else
            None. The settings are then the server's (or the Databricks
            cluster's), not this client's, and the message says to set them
            there (``key value`` lines) instead of as ``--conf`` options.

    Returns:
        Finding: ``gpu settings``: ok when all is well; a warning with K = 0 but a GPU task resource configured
        (the tasks get GPUs anyway and train on them); a problem (a
        :class:`~spark_imagenet.errors.ConfigError`) for K > 0 and a setting missing or too small (the message
        lists every setting to add with its value, and the discovery script ``conf/gpu-discovery.sh``), K > 0
        on ``local[N]``, or a GPU amount that is not a number.
    """
    try:
        return _gpu_finding(get, gpus_per_worker, workers, master, server)
    except ConfigError as e:
        return Finding.problem(CHECK, e)


#: The name of the GPU settings' check.
CHECK = "gpu settings"


def _gpu_finding(get: Callable[[str], str | None], k: int, workers: int, master: str | None,
                 server: str | None) -> Finding:
    """:func:`check_gpu_conf`; raises its problem as a ConfigError."""
    parsed = Master.parse(master, check=False)
    kind = parsed.kind
    if k <= 0:
        task = _amount(get, TASK_AMOUNT)
        if task:
            return Finding.warning(CHECK, f"{TASK_AMOUNT}={_fmt(task)} gives each task GPUs but --gpus-per-worker "
                                          f"is 0: the workers train on the GPUs Spark assigns them; pass "
                                          f"--gpus-per-worker {max(1, int(task))} to have the settings checked")
        return Finding.ok(CHECK, "no GPUs asked for (--gpus-per-worker 0) and none configured")
    if kind == "local":
        raise ConfigError(_local_mode_refusal(k, workers, master, server), key="--gpus-per-worker", value=k)
    missing = _missing_settings(get, k, parsed, workers)
    if not missing:
        return Finding.ok(CHECK, f"Spark gives each of {workers} task(s) {k} GPU(s) (task, executor and discovery "
                                 "settings present)")
    where = ""
    if kind == "standalone":
        where = (f"\nAlso give every standalone worker its GPUs in its own configuration (the driver cannot check "
                 f"it): SPARK_WORKER_OPTS=\"-D{WORKER_AMOUNT}=<GPUs on the host> -D{WORKER_SCRIPT}=/path/to/"
                 f"{DISCOVERY_SCRIPT}\" (or {WORKER_FILE}).")
    if server is None:
        add = "Add:\n" + "\n".join(f"  --conf {m}" for m in missing)
    else:
        add = (f"The settings are the Spark Connect server's ({server}), not this client's: set them in the "
               "server's Spark config (on Databricks: the cluster's Spark config) and restart it:\n"
               + "\n".join(f"  {m.replace('=', ' ', 1)}" for m in missing))
    if any(DISCOVERY_SCRIPT in m for m in missing) or where:
        where += ("\nThe discovery script comes with the package (executable): `python -m spark_imagenet.submit "
                  "--gpu-discovery-script` prints its path here; the Docker image has it at "
                  "/opt/spark-imagenet/conf/gpu-discovery.sh.")
    raise ConfigError(
        f"--gpus-per-worker {k} with {workers} worker(s) needs {k * workers} GPU(s) in all, {k} per task, but "
        f"Spark is not configured to hand GPUs to tasks. {add}{where}", key="--gpus-per-worker", value=k
    )


def _no_gpus_here() -> str:
    """A note for advice that runs the discovery script on this host, when it has no GPUs to list."""
    if host_has_gpus():
        return ""
    return ("; this host has no NVIDIA GPUs (no /dev/nvidia*, no nvidia-smi): the script lists none, and Spark "
            "then refuses to start (\"Resource: gpu, with addresses: is less than what the user requested\")")


def installed_script() -> str:
    """The installed package's discovery script's path (``/path/to/conf/gpu-discovery.sh`` where it is missing)."""
    from spark_imagenet.errors import EnvironmentSetupError
    from spark_imagenet.resources import gpu_discovery_script

    try:
        return str(gpu_discovery_script())
    except EnvironmentSetupError:
        return f"/path/to/{DISCOVERY_SCRIPT}"


def _local_mode_refusal(k: int, workers: int, master: str | None, server: str | None) -> str:
    """Why ``local[N]`` cannot give GPUs, and the local-cluster master and ``--conf`` settings that can (the
    discovery script named by its installed path: a local-cluster's workers run on this machine)."""
    settings = [f"{WORKER_AMOUNT}={k * workers}", f"{WORKER_SCRIPT}={installed_script()}",
                f"{EXECUTOR_AMOUNT}={k * workers}", f"{TASK_AMOUNT}={k}"]
    conf = " ".join(f"--conf {s}" for s in settings)
    if server is None:
        return (f"--gpus-per-worker {k}: Spark's local mode ({master}) does not hand GPUs to tasks; use "
                f"--master 'local-cluster[1,{workers},2048]' {conf}, or a cluster{_no_gpus_here()}")
    return (f"--gpus-per-worker {k}: the Spark Connect server {server} runs Spark's local mode ({master}), which "
            f"does not hand GPUs to tasks; start the server with --master 'local-cluster[1,{workers},2048]' "
            f"{conf} (or on a cluster with GPUs), or train without --gpus-per-worker")


