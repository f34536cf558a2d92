"""``spark-imagenet doctor``: what this machine and a Spark master offer a training job.

:func:`run_doctor` prints one line per finding, ``ok``, ``warn`` or
``PROBLEM`` (a problem's line says what to change), in this order:

* versions: Python, Java (:func:`~spark_imagenet.training.driver.spark_session.check_java`),
  Spark (``pyspark.__version__``), TensorFlow and tf-keras, and the GPUs
  TensorFlow sees (asked in a child Python, so the doctor itself never
  imports TensorFlow), and ``nvidia-smi``'s GPU list where it is installed;
* the GPU mapping rule: what ``CUDA_VISIBLE_DEVICES`` a task that Spark
  gives the GPU addresses ``['0', '1']`` would get in this environment
  (:func:`~spark_imagenet.training.task.environment.cuda_visible_devices`);
* bucket credentials: which source Google's client would use
  (``STORAGE_EMULATOR_HOST``, ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's
  application default credentials file), by name and path only, never content;
* the preflight checks against the master: a session is started
  (:func:`~spark_imagenet.training.driver.spark_session.session_for`), then
  :func:`~spark_imagenet.training.driver.preflight.check_spark` (a Spark Connect
  server: :func:`~spark_imagenet.training.driver.connect.check_connect`, whose
  ``warn not checked`` line names what Connect cannot check),
  :func:`~spark_imagenet.training.driver.preflight.check_cluster_conf` and
  :func:`~spark_imagenet.training.job.gpus.check_gpu_conf` (for
  ``--gpus-per-worker``) run for the given ``--workers`` (else for as many
  workers as there are slots), and the session is stopped;
* with a dataset URL: whether its manifest is readable, and its train shards
  enough for ``--workers``.

Exit status 0 when no problem was found, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from spark_imagenet.errors import SparkImagenetError, spark_reason

#: Seconds allowed for the child Python that imports TensorFlow.
TENSORFLOW_PROBE_TIMEOUT_S = 300

#: Run in a child Python: TensorFlow's and tf-keras's versions and the GPUs TensorFlow sees, as JSON.
_TF_PROBE = """\
import json
out = {}
try:
    import tensorflow as tf
    out["tensorflow"] = tf.__version__
    out["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
except Exception as e:
    out["tensorflow_error"] = f"{type(e).__name__}: {e}"
try:
    import tf_keras
    out["tf_keras"] = tf_keras.__version__
except Exception as e:
    out["tf_keras_error"] = f"{type(e).__name__}: {e}"
print("DOCTOR-JSON " + json.dumps(out))
"""


class Report:
    """The doctor's findings, printed as they come.

    Attributes:
        problems: how many ``PROBLEM`` lines were printed.
    """

    def __init__(self, out: Callable[[str], None] | None = None):
        self.out = out or (lambda line: print(line, flush=True))
        self.problems = 0

    def ok(self, what: str, detail: str) -> None:
        """Print ``ok <what>: <detail>``."""
        self.out(f"ok       {what}: {detail}")

    def warn(self, what: str, detail: str) -> None:
        """Print ``warn <what>: <detail>`` (not counted as a problem)."""
        self.out(f"warn     {what}: {detail}")

    def problem(self, what: str, detail: str) -> None:
        """Print ``PROBLEM <what>: <detail>`` and count it."""
        self.problems += 1
        self.out(f"PROBLEM  {what}: {detail}")


def check_versions(report: Report) -> bool:
    """Python, Java, Spark, TensorFlow, tf-keras and the GPUs; returns whether Java is usable."""
    report.ok("python", f"{platform.python_version()} ({sys.executable})")
    from spark_imagenet.training.driver.spark_session import check_java, find_java

    java_ok = False
    try:
        major = check_java()
        path, how = find_java()
        report.ok("java", f"{major} ({path}, found via {how})")
        java_ok = True
    except SparkImagenetError as e:
        report.problem("java", str(e))
    try:
        import pyspark

        report.ok("spark", f"pyspark {pyspark.__version__}")
    except ImportError as e:
        report.problem("spark", f"pyspark cannot be imported ({e}): pip install 'pyspark>=4'")
    _check_tensorflow(report)
    _check_nvidia_smi(report)
    return java_ok


def tensorflow_probe() -> dict:
    """Ask a child Python (with ``TF_USE_LEGACY_KERAS=1``) for TensorFlow's facts.

    Returns:
        dict: ``tensorflow``, ``tf_keras`` (versions) and ``gpus`` (device
        names), or ``tensorflow_error`` / ``tf_keras_error`` / ``error`` texts.
    """
    from spark_imagenet.training.job.tf_process import tensorflow_environment

    env = tensorflow_environment(os.environ, log_level="3")
    try:
        p = subprocess.run([sys.executable, "-c", _TF_PROBE], capture_output=True, text=True, env=env,
                           timeout=TENSORFLOW_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    for line in p.stdout.splitlines():
        if line.startswith("DOCTOR-JSON "):
            return json.loads(line[len("DOCTOR-JSON "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit status {p.returncode}"]
    return {"error": tail[0][:300]}


def _check_tensorflow(report: Report) -> None:
    """TensorFlow's and tf-keras's versions and TensorFlow's GPUs, from :func:`tensorflow_probe`."""
    facts = tensorflow_probe()
    if "error" in facts:
        report.problem("tensorflow", f"a Python importing TensorFlow failed: {facts['error']}")
        return
    if "tensorflow" in facts:
        report.ok("tensorflow", facts["tensorflow"])
        gpus = facts.get("gpus") or []
        report.ok("gpus (TensorFlow, this machine)", ", ".join(gpus) if gpus else
                  "none here (a worker on this machine trains on the CPU; executors elsewhere have their own)")
    else:
        report.problem("tensorflow", f"cannot import tensorflow ({facts.get('tensorflow_error')}): "
                       "pip install the TensorFlow version this package names")
    if "tf_keras" in facts:
        tf_version = facts.get("tensorflow", "")
        same = tf_version.split(".")[:2] == facts["tf_keras"].split(".")[:2]
        if tf_version and not same:
            report.problem("tf-keras", f"{facts['tf_keras']} does not match TensorFlow {tf_version}: "
                           f"pip install 'tf-keras=={'.'.join(tf_version.split('.')[:2])}.*'")
        else:
            report.ok("tf-keras", facts["tf_keras"])
    else:
        report.problem("tf-keras", f"cannot import tf_keras ({facts.get('tf_keras_error')}): MultiWorkerMirroredStrategy "
                       "needs Keras 2: pip install tf-keras (the same version as TensorFlow)")


def _check_nvidia_smi(report: Report) -> None:
    """The GPUs ``nvidia-smi -L`` lists, where nvidia-smi is installed."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        report.ok("gpus (nvidia-smi, this machine)", "nvidia-smi not installed")
        return
    try:
        p = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        report.warn("gpus (nvidia-smi, this machine)", f"{smi} -L failed: {e}")
        return
    lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
    if p.returncode != 0:
        report.warn("gpus (nvidia-smi, this machine)",
                    f"{smi} -L exited with {p.returncode}: {(p.stderr or '').strip()[:200]}")
    else:
        report.ok("gpus (nvidia-smi, this machine)", "; ".join(lines) if lines else "none listed")


def check_gpu_mapping(report: Report, environ: dict | None = None) -> None:
    """Show what ``CUDA_VISIBLE_DEVICES`` a task given GPU addresses ``['0', '1']`` gets here.

    A mapping that fails (fewer than two devices in an existing
    ``CUDA_VISIBLE_DEVICES``) is a warning, not a problem: tasks of one GPU work.
    """
    from spark_imagenet.training.task.environment import cuda_visible_devices

    env = os.environ if environ is None else environ
    existing = env.get("CUDA_VISIBLE_DEVICES")
    rule = ("Spark's task GPU addresses become CUDA_VISIBLE_DEVICES; with CUDA_VISIBLE_DEVICES already set on the "
            "executor they are indices into it")
    where = f"CUDA_VISIBLE_DEVICES={existing}" if existing is not None else "CUDA_VISIBLE_DEVICES unset"
    try:
        value = cuda_visible_devices(["0", "1"], existing)
    except SparkImagenetError as e:
        # a warning: a host that shows one GPU is fine for tasks of one GPU
        report.warn("gpu mapping", f"{rule}. Here ({where}) a task given addresses ['0', '1'] would fail: {e}")
        return
    report.ok("gpu mapping", f"{rule}. Here ({where}) a task given addresses ['0', '1'] gets "
              f"CUDA_VISIBLE_DEVICES={value}")


def credential_sources(environ: dict | None = None) -> list[str]:
    """The bucket credential sources present, by name and path (never their content).

    Google's client takes the first of: ``STORAGE_EMULATOR_HOST`` (an
    emulator, anonymous), the key file ``GOOGLE_APPLICATION_CREDENTIALS``,
    gcloud's application default credentials file
    (``$CLOUDSDK_CONFIG`` or ``~/.config/gcloud``), a metadata server (GCE, GKE).
    """
    env = os.environ if environ is None else environ
    found = []
    if env.get("STORAGE_EMULATOR_HOST"):
        found.append(f"STORAGE_EMULATOR_HOST={env['STORAGE_EMULATOR_HOST']} (an emulator, anonymous requests)")
    key = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key:
        state = "the file exists" if Path(key).is_file() else "PROBLEM: no such file"
        found.append(f"GOOGLE_APPLICATION_CREDENTIALS={key} ({state}; its content is not read)")
    gcloud = Path(env.get("CLOUDSDK_CONFIG") or Path(env.get("HOME") or Path.home()) / ".config" / "gcloud")
    adc = gcloud / "application_default_credentials.json"
    if adc.is_file():
        found.append(f"gcloud application default credentials {adc} (the file exists; its content is not read)")
    return found


def check_credentials(report: Report, url: str | None) -> None:
    """Report :func:`credential_sources`; a missing key file is a problem."""
    sources = credential_sources()
    if not sources:
        text = ("none found (no STORAGE_EMULATOR_HOST, GOOGLE_APPLICATION_CREDENTIALS or gcloud application default "
                "credentials); on GCE/GKE the metadata server's service account may still serve. For gs:// run "
                "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a key file")
        (report.warn if url and url.startswith("gs://") else report.ok)("bucket credentials", text)
        return
    for source in sources:
        if "PROBLEM" in source:
            report.problem("bucket credentials", source.replace("PROBLEM: ", "") + ": point it at the "
                           "service-account key file, or unset it")
        else:
            report.ok("bucket credentials", source)


def check_master(report: Report, master: str | None, conf: Sequence[tuple[str, str]], workers: int | None,
                 allow_unencrypted: bool, gpus_per_worker: int = 0) -> int | None:
    """Start a session for ``master``, run the preflight checks, stop it.

    A classic master gets :func:`_run_checks`; a Spark Connect server
    (``sc://HOST:PORT``, or ``SPARK_REMOTE``) gets :func:`_run_connect_checks`.

    Returns:
        int | None: the barrier task slots found (under Connect: the slots its
        local master gives, else the workers checked for), or None when no
        session started.
    """
    from spark_imagenet.training.driver.spark_session import is_connect_session, session_for

    from spark_imagenet.training.job.config import TrainConfig

    where = f"master {master or '(default)'}"
    try:
        TrainConfig(workers=1, master=master)  # a master that is no Spark URL: said before Spark starts
        spark = session_for(master, workers or 1, conf=dict(conf), app_name="spark-imagenet doctor",
                            warn_oversubscription=False)
    except SparkImagenetError as e:
        report.problem("spark session", f"{where}: {e}")
        return None
    except Exception as e:  # Py4J / JVM start-up failures: one line, no JVM stack
        report.problem("spark session", f"{where}: Spark could not start: {spark_reason(e)[:300]}. Check the "
                       "master URL (spark://HOST:PORT, yarn, k8s://..., local[N], sc://HOST:PORT), the --conf "
                       "settings, and that the cluster is reachable")
        return None
    try:
        if is_connect_session(spark):
            return _run_connect_checks(report, spark, master, workers, allow_unencrypted, gpus_per_worker)
        sc = spark.sparkContext
        report.ok("spark session", f"master {sc.master}, Spark {spark.version}")
        return _run_checks(report, sc, workers, allow_unencrypted, gpus_per_worker)
    finally:
        spark.stop()


def _run_checks(report: Report, sc, workers: int | None, allow_unencrypted: bool, gpus_per_worker: int) -> int:
    """check_spark (slots, dynamic allocation), then the conf checks, each reported; returns the slots."""
    from spark_imagenet.training.driver.preflight import available_slots, check_spark

    slots, how = available_slots(sc)
    n = workers or max(1, slots)
    try:
        check_spark(sc, n)
        wanted = f"--workers {n}" if workers else f"{n} worker(s) (no --workers given: one per slot)"
        report.ok("barrier slots", f"{slots} ({how}); enough for {wanted}; dynamic allocation off")
    except SparkImagenetError as e:
        report.problem("barrier slots", str(e))
    _check_conf(report, sc.getConf().get, sc.master, n, allow_unencrypted, gpus_per_worker)
    return slots


def _run_connect_checks(report: Report, spark, master: str | None, workers: int | None, allow_unencrypted: bool,
                        gpus_per_worker: int) -> int:
    """What ``train`` checks of a Spark Connect session before launch, each reported, and the warning line
    naming what Connect cannot check; returns the slots a local server master gives (else the workers checked)."""
    from spark_imagenet.training.driver.connect import check_connect, conf_getter, connect_url, server_slots

    url = connect_url(spark, master)
    get = conf_getter(spark)
    server_master = get("spark.master", None)
    report.ok("spark session", f"Spark Connect server {url}, Spark {spark.version}, the server's master "
              f"{server_master or '(not readable)'}")
    slots = server_slots(server_master, int(get("spark.task.cpus", None) or "1"))
    n = workers or max(1, slots or 1)
    try:
        _, warnings = check_connect(spark, n, url)
    except SparkImagenetError as e:
        report.problem("barrier slots", str(e))
    else:
        for line in warnings:
            report.warn("not checked", line.removeprefix("warning: ").removeprefix("Spark Connect session: ")
                        .removeprefix("not checked before launch: "))
        found = f"{slots} (from the server's master)" if slots is not None else "not known through Connect"
        report.ok("barrier slots", f"{found}; --workers {n} checked as far as Connect allows; dynamic allocation off")
    _check_conf(report, get, server_master, n, allow_unencrypted, gpus_per_worker, server=url)
    return slots if slots is not None else n


def _check_conf(report: Report, get, master: str | None, workers: int, allow_unencrypted: bool,
                gpus_per_worker: int, server: str | None = None) -> None:
    """Encryption (:func:`~spark_imagenet.training.driver.preflight.check_cluster_conf`) and the GPU settings
    (:func:`~spark_imagenet.training.job.gpus.check_gpu_conf`) over one conf getter, each reported."""
    from spark_imagenet.training.job.config import TrainConfig
    from spark_imagenet.training.job.gpus import check_gpu_conf
    from spark_imagenet.training.driver.preflight import check_cluster_conf

    try:
        config = TrainConfig(workers=workers, allow_unencrypted=allow_unencrypted)
        warnings = check_cluster_conf(get, config)
    except SparkImagenetError as e:
        report.problem("encryption", str(e))
    else:
        for line in warnings:
            report.warn("encryption", line.removeprefix("warning: "))
        if not warnings:
            report.ok("encryption", "Spark's network encryption and SSL are off (or one worker): nothing to refuse")
    try:
        warning = check_gpu_conf(lambda key: get(key, None), gpus_per_worker, workers, master, server=server)
    except SparkImagenetError as e:
        report.problem("gpu settings", str(e))
        return
    if warning:
        report.warn("gpu settings", warning.removeprefix("warning: "))
    elif gpus_per_worker:
        report.ok("gpu settings", f"Spark gives each of {workers} task(s) {gpus_per_worker} GPU(s) "
                  "(task, executor and discovery settings present)")
    else:
        report.ok("gpu settings", "no GPUs asked for (--gpus-per-worker 0) and none configured")


def check_dataset(report: Report, url: str, workers: int | None) -> None:
    """Whether the manifest at ``url`` is readable, and its train shards enough for ``workers``."""
    from spark_imagenet.dataset.manifest import Manifest
    from spark_imagenet.storage import open_storage
    from spark_imagenet.training.driver.preflight import check_train_shards

    try:
        manifest = Manifest.load(open_storage(url))
    except SparkImagenetError as e:
        report.problem("dataset", f"{url}: {e}")
        return
    train = len(manifest.splits["train"].shards) if "train" in manifest.splits else 0
    report.ok("dataset", f"{url}: manifest readable, {manifest.num_classes} classes, {train} train shard(s)")
    if workers is not None:
        try:
            check_train_shards(train, workers)
        except SparkImagenetError as e:
            report.problem("train shards", str(e))


def run_doctor(*, master: str | None = None, conf: Sequence[tuple[str, str]] = (), workers: int | None = None,
               url: str | None = None, allow_unencrypted: bool = False, gpus_per_worker: int = 0,
               out: Callable[[str], None] | None = None) -> int:
    """Run every check of this module and print its findings.

    Args:
        master: the Spark master to check (None: the session ``train`` would get).
        conf: extra Spark settings, ``(key, value)`` pairs.
        workers: the hypothetical ``--workers`` to check for (None: as many as there are slots).
        url: a dataset URL whose manifest to read.
        allow_unencrypted: check as ``train --allow-unencrypted`` would.
        gpus_per_worker: check the GPU settings as ``train --gpus-per-worker`` would (0: only warn
            when tasks get GPUs anyway).
        out: called with each line (default: print it to stdout at once).

    Returns:
        int: 0 when no check found a problem, else 1.
    """
    report = Report(out)
    java_ok = check_versions(report)
    check_gpu_mapping(report)
    check_credentials(report, url)
    if java_ok:
        check_master(report, master, conf, workers, allow_unencrypted, gpus_per_worker)
    else:
        report.problem("preflight", "not run: Spark needs Java (see the java line)")
    if url is not None:
        check_dataset(report, url, workers)
    report.out(f"{report.problems} problem(s) found" if report.problems else "no problems found")
    return 1 if report.problems else 0
