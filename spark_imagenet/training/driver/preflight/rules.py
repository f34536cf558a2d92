"""The checks that need no Spark: each takes plain values and returns its :class:`~.findings.Finding`.

* the results file can be written (:func:`check_results_path`);
* ``--master yarn`` finds its cluster's configuration (:func:`check_yarn_conf`);
* a master on this machine has the slots (:func:`check_slots_of_master_url`; the same message as the session's
  count, :func:`too_few_slots`);
* a path on the driver's disk is reachable from where the tasks run (:func:`check_dataset_reachable`,
  :func:`check_output_reachable`), and the run's folders are not the dataset's (:func:`check_apart_from_dataset`);
* ``--output`` holds no earlier run's outputs unless ``--overwrite`` (:func:`check_output_unused`);
* every worker has a train shard (:func:`check_train_shards`);
* Spark's network encryption or SSL is not on while TensorFlow's gRPC is plaintext, unless allowed
  (:func:`check_encryption`, over a conf getter: a classic session's, a Connect server's, or the session's
  facts).

A problem's finding carries a :class:`~spark_imagenet.errors.ConfigError` naming the setting to change and the
numbers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

from spark_imagenet.errors import ConfigError
from spark_imagenet.storage import Storage, is_remote_url
from spark_imagenet.training.driver.preflight.findings import Finding
from spark_imagenet.training.driver.spark_session import yarn_conf_dir
from spark_imagenet.training.job.master import Master
from spark_imagenet.training.job.outputs import earlier_outputs

#: A conf getter: ``get(key, default)`` returns the setting's text or ``default``. ``sc.getConf().get``
#: (classic), ``spark.conf.get`` (Spark Connect) and :meth:`~.session.SessionFacts.get` have this shape.
ConfGetter = Callable[[str, "str | None"], "str | None"]


def check_results_path(results: str | os.PathLike | None) -> Finding | None:
    """Check that ``--results`` names a file in an existing, writable folder.

    Returns:
        Finding | None: ``results path``: a problem when the folder is missing or not writable, or the path is
        a folder; None without ``results``.
    """
    if results is None:
        return None
    target = Path(results).expanduser().absolute()
    parent = target.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return Finding.problem("results path", f"--results {results}: folder {parent} does not exist or is not "
                                               "writable",
                               key="--results", value=results)
    if target.is_dir():
        return Finding.problem("results path", f"--results {results} is a folder; give a file name such as "
                                               f"{target / 'results.json'}",
                               key="--results", value=results)
    return Finding.ok("results path", f"{target} can be written")


def check_yarn_conf(master: str | None, environ: Mapping[str, str] | None = None) -> Finding | None:
    """Refuse ``--master yarn`` where Spark cannot find the cluster, before a JVM starts
    (:func:`~spark_imagenet.training.driver.spark_session.yarn_conf_dir` as a finding).

    Args:
        master: the job's master URL (anything but ``yarn`` passes).
        environ: the environment to look in (default ``os.environ``).

    Returns:
        Finding | None: ``yarn``: a problem with neither ``HADOOP_CONF_DIR`` nor ``YARN_CONF_DIR`` set, or with no
        ``yarn-site.xml`` in the folder it names; None for another master.
    """
    try:
        folder = yarn_conf_dir(master, environ)
    except ConfigError as e:
        return Finding.problem("yarn", e)
    return None if folder is None else Finding.ok("yarn", f"yarn-site.xml in {folder}")


def check_slots_of_master_url(master: str | None, workers: int, conf: Mapping[str, str]) -> Finding | None:
    """Refuse more workers than a master on this machine has task slots, from its URL alone (before Spark starts).

    ``local[N]`` has N slots and ``local-cluster[E,C,MB]`` E x C, divided by ``spark.task.cpus``; a
    cluster's master (whose executors register later) and no master give no finding: the session's facts
    count them (:func:`~.session.read_session_facts`).

    Args:
        master: the job's master URL, or None.
        workers: barrier tasks wanted.
        conf: the job's extra Spark settings (``spark.task.cpus``).

    Returns:
        Finding | None: ``barrier slots``: a problem for fewer slots than workers (as the session's count says
        it), or a ``spark.task.cpus`` that is not a positive integer.
    """
    parsed = Master.parse(master, check=False)
    if not parsed.runs_on_this_host:
        return None
    text = str(conf.get("spark.task.cpus", "1")).strip()
    if not text.isdigit() or int(text) < 1:
        return Finding.problem("barrier slots", f"--conf spark.task.cpus={text}: must be a positive integer "
                                                "(CPUs per task)",
                               key="spark.task.cpus", value=text)
    task_cpus = int(text)
    cores = parsed.cores(cpu_count=os.cpu_count() or 1)
    slots = parsed.slots(task_cpus, cpu_count=os.cpu_count() or 1)
    how = f"from the master URL and spark.task.cpus={text}" + (
        f": each task takes {task_cpus} of its {cores} core(s)" if task_cpus > 1 else "")
    if slots < workers:
        return Finding.problem("barrier slots", too_few_slots(workers, slots, f"{slots} available", master.strip(),
                                                              how, task_cpus), key="--workers", value=workers)
    return Finding.ok("barrier slots", f"{slots} ({how}); enough for --workers {workers}")


def too_few_slots(workers: int, slots: int, available: str, master: str, how: str, task_cpus: int = 1) -> str:
    """The message of too few barrier slots, counted by the session or told by the master URL.

    Args:
        workers: barrier tasks wanted.
        slots: the slots there are.
        available: how the message says them (``"1 available"``, with the wait for executors).
        master: the master URL.
        how: how they were counted.
        task_cpus: ``spark.task.cpus``: the remedy asks for ``workers`` x ``task_cpus`` cores, or a lower
            ``spark.task.cpus``, never the master the job already has.
    """
    return (f"--workers {workers} needs {workers} barrier task slots, only {available} (master {master}; {how}). "
            f"Use --workers <= {max(1, slots)}, or give Spark more slots: {_more_slots(master, workers, task_cpus)}.")


def _more_slots(master: str, workers: int, task_cpus: int = 1) -> str:
    """How to get ``workers`` slots of ``task_cpus`` cores each on this kind of master (for :func:`too_few_slots`)."""
    kind = Master.parse(master, check=False).kind
    fewer = f", or a lower spark.task.cpus (each task now takes {task_cpus} cores)" if task_cpus > 1 else ""
    if kind == "local":
        return f"--master local[{workers * task_cpus}]{fewer}"
    if kind == "local-cluster":
        return (f"--master 'local-cluster[{workers},{task_cpus},2048]' (executors x cores each){fewer}, and with GPU "
                "task resources enough GPUs per executor (spark.executor.resource.gpu.amount / "
                "spark.task.resource.gpu.amount tasks each)")
    return (f"more executors (spark.executor.instances) or cores each (spark.executor.cores){fewer}; with GPU task "
            "resources, enough GPUs per executor (spark.executor.resource.gpu.amount / "
            "spark.task.resource.gpu.amount tasks each)")


def check_dataset_reachable(url: str, master: str | None, shared_filesystem: bool) -> Finding:
    """Refuse a dataset on the driver's own disk when executors run on other hosts.

    Args:
        url: the dataset's storage URL (a local path, ``file://``, or a bucket URL of any store).
        master: where the tasks run: the session's master URL (under Spark Connect: the server's master when
            the server is on this machine, else its ``sc://`` URL).
        shared_filesystem: the user says every host mounts that path.

    Returns:
        Finding: ``dataset reachable``: a problem for a local path with a cluster master and
        ``shared_filesystem`` false.
    """
    from spark_imagenet.storage import url_forms

    here = Master.parse(master, check=False).runs_on_this_host
    if shared_filesystem or here or is_remote_url(url):
        how = ("a bucket" if is_remote_url(url) else "on every host (--shared-filesystem)" if shared_filesystem
               else "on this machine, as the tasks are")
        return Finding.ok("dataset reachable", f"{url}: {how}")
    return Finding.problem("dataset reachable", (
        f"the dataset {url} is a path on the driver's disk, but master {master} runs the barrier tasks on "
        "executors that may be on other hosts, which cannot read it. Put the dataset in a bucket "
        f"(spark-imagenet upload LOCAL URL, URL one of {url_forms(local=False)}) or on a path every host "
        "mounts, and then add --shared-filesystem (shared_filesystem = true in a job file)"), key="url", value=url)


def check_output_reachable(output: str | None, master: str | None, shared_filesystem: bool,
                           option: str = "--output") -> Finding | None:
    """Refuse an ``--output`` (or ``--checkpoint-dir``) on the driver's own disk when the chief may run on
    another host.

    The chief's barrier task writes ``model.keras``, the TensorBoard logs and the checkpoints from its
    executor's host (and every task reads a checkpoint to resume from).

    Returns:
        Finding | None: ``<option> reachable`` (``--output reachable``): a problem for a local path with a
        cluster master and ``shared_filesystem`` false; None without ``output``.
    """
    from spark_imagenet.storage import url_forms

    if output is None:
        return None
    check = f"{option} reachable"
    if shared_filesystem or Master.parse(master, check=False).runs_on_this_host or is_remote_url(output):
        return Finding.ok(check, output)
    what = "the checkpoints" if option == "--checkpoint-dir" else "the model and TensorBoard logs"
    return Finding.problem(check, (
        f"{option} {output} is a path on the driver's disk, but master {master} runs the chief (rank 0), which "
        f"writes {what}, on an executor that may be on another host. Give a bucket "
        f"({option} URL, URL one of {url_forms(local=False)}), or a path every host mounts and --shared-filesystem"),
        key=option, value=output)


def check_apart_from_dataset(dataset: Storage, written: Storage | None, option: str) -> Finding | None:
    """Refuse an ``--output`` (or ``--checkpoint-dir``) that is the dataset's own folder: the run's files would
    sit among the shards and the manifest.

    Args:
        dataset: the opened dataset folder.
        written: the opened folder the job writes, or None.
        option: the option that named it, for the message.

    Returns:
        Finding | None: ``<option> apart from the dataset``: a problem when both are the same folder (the same
        URL, or local paths that resolve to the same folder through ``..`` or symbolic links); None without
        ``written``.
    """
    def where(storage: Storage) -> str:
        url = storage.url.rstrip("/")
        return url if is_remote_url(url) else os.path.realpath(url)

    if written is None:
        return None
    check = f"{option} apart from the dataset"
    if where(written) == where(dataset):
        return Finding.problem(check, f"{option} {written.url} is the dataset's own folder: give a folder of its "
                                      f"own for the run's files, e.g. {written.url.rstrip('/')}-runs/1",
                               key=option, value=written.url)
    return Finding.ok(check, written.url)


def check_output_unused(storage: Storage, output: str, overwrite: bool) -> Finding:
    """Refuse an ``--output`` folder that holds the outputs of an earlier run, unless ``overwrite``.

    ``shard --out`` and ``--checkpoint-dir`` refuse another job's data the same way; without this, a second
    run would replace ``model.keras``, ``labels.json`` and ``results.json`` and mix both runs' TensorBoard
    logs. With ``overwrite`` nothing is deleted here: this run's outputs replace the earlier ones when they
    are written, and the earlier TensorBoard files are deleted then
    (:func:`~spark_imagenet.training.job.outputs.publish`), so a job that fails leaves them as they were.

    Args:
        storage: the opened output folder (:func:`~spark_imagenet.training.job.outputs.open_output`).
        output: the ``--output`` value, for the message.
        overwrite: the job's ``overwrite`` (``--overwrite``).

    Returns:
        Finding: ``--output unused``: a problem when the folder holds such objects and ``overwrite`` is false
        (the message names the folder, what it holds and the flag).

    Raises:
        StorageError: the folder cannot be listed.
    """
    if overwrite:
        return Finding.ok("--output unused", f"{output}: --overwrite")
    found = earlier_outputs(storage)
    if found:
        shown = sorted({name.split("/", 1)[0] + ("/" if "/" in name else "") for name in found})
        return Finding.problem("--output unused", (
            f"--output {output} already holds the outputs of an earlier run ({', '.join(shown)}). Give another "
            "folder, or add --overwrite (overwrite = true in a job file) to replace them"),
            key="--output", value=output)
    return Finding.ok("--output unused", f"{output} holds no earlier run's outputs")


def check_train_shards(train_shards: int, workers: int) -> Finding:
    """Check that every worker gets a train shard of its own.

    The same rule as :func:`spark_imagenet.training.job.assignment.assign` (which the plan applies to a
    manifest), for a shard count known without assigning them (``doctor``).

    Returns:
        Finding: ``train shards``: a problem for ``train_shards < workers``, naming both numbers and the fix.
    """
    if train_shards < workers:
        return Finding.problem("train shards", (
            f"the dataset has {train_shards} train shard(s) but --workers is {workers}: every worker needs at "
            f"least one train shard of its own. Reshard with --train-shards >= {workers} (a multiple of "
            f"{workers} balances best) or use --workers <= {train_shards}."), key="--workers", value=workers)
    return Finding.ok("train shards", f"{train_shards} for {workers} worker(s)")


#: Spark settings that encrypt traffic between Spark's processes, and what each one is.
NETWORK_ENCRYPTION_KEYS = {
    "spark.network.crypto.enabled": "AES-based encryption of Spark's RPC",
    "spark.ssl.enabled": "SSL for Spark's protocols",
    "spark.ssl.rpc.enabled": "SSL for Spark's RPC",
}

#: What crosses the network in the clear between TensorFlow workers (said in every message).
UNENCRYPTED_TRAFFIC = ("TensorFlow's gRPC between the workers (MultiWorkerMirroredStrategy's collective all-reduce "
                       "of the gradients, the model's variables and weights broadcast at start-up, the "
                       "rendezvous addresses) is plaintext, not encrypted")


def conf_true(get: ConfGetter, key: str) -> bool:
    """Whether a boolean Spark setting is on (``true`` in any case, blanks ignored; unset = off)."""
    value = get(key, None)
    return value is not None and str(value).strip().lower() == "true"


def encryption_settings_on(get: ConfGetter) -> list[str]:
    """The settings of :data:`NETWORK_ENCRYPTION_KEYS` that are on, as ``key=true`` (in that order)."""
    return [f"{key}=true" for key in NETWORK_ENCRYPTION_KEYS if conf_true(get, key)]


def check_encryption(get: ConfGetter, workers: int, allow_unencrypted: bool) -> Finding:
    """Refuse to train in the clear on a cluster whose Spark traffic is encrypted.

    A cluster set up with Spark's network encryption or SSL expects its
    traffic encrypted; TensorFlow's gRPC between the workers is not (PySpark's
    TorchDistributor refuses the same way). One worker exchanges nothing with
    other workers, so ``workers == 1`` passes. It never reads ``spark.python.worker.reuse``: each task runs
    TensorFlow in a child process of its own, so reused and fresh Python workers both work.

    Args:
        get: a conf getter (:data:`ConfGetter`).
        workers: TensorFlow workers of the job.
        allow_unencrypted: the user's ``allow_unencrypted`` (``--allow-unencrypted``).

    Returns:
        Finding: ``encryption``: a warning when encryption is on and ``allow_unencrypted`` is true; a problem
        when it is on, ``workers > 1`` and ``allow_unencrypted`` is false (the message names the settings
        found, what travels unencrypted and how to allow it).
    """
    found = encryption_settings_on(get)
    if not found or workers <= 1:
        return Finding.ok("encryption", "Spark's network encryption and SSL are off (or one worker): nothing to "
                                        "refuse")
    what = f"Spark's network encryption or SSL is on ({', '.join(found)}), but {UNENCRYPTED_TRAFFIC}"
    if allow_unencrypted:
        return Finding.warning("encryption", f"{what}; training anyway because allow_unencrypted is set "
                                             "(--allow-unencrypted)")
    return Finding.problem("encryption", (
        f"{what}: {workers} workers would send it across the network unencrypted. Run on a private network "
        "and add --allow-unencrypted (allow_unencrypted = true in a job file) to train anyway, "
        "or use --workers 1 (nothing travels between workers)."), key=found[0].partition("=")[0], value="true")
