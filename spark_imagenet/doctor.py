"""``spark-imagenet doctor``: what this machine and a Spark master offer a training job.

:func:`run_doctor` prints one line per finding, ``ok``, ``warn`` or
``PROBLEM`` (a problem's line says what to change), in this order:

* versions: Python, Java (:func:`~spark_imagenet.training.driver.spark_session.check_java`),
  Spark (``pyspark.__version__`` and its folder, or its absence with the fix: it is the optional extra
  ``spark``), TensorFlow and tf-keras, and the GPUs
  TensorFlow sees (asked in a child Python, so the doctor itself never
  imports TensorFlow), and ``nvidia-smi``'s GPU list where it is installed;
* the GPU mapping rule: what ``CUDA_VISIBLE_DEVICES`` a task that Spark
  gives the GPU addresses ``['0', '1']`` would get in this environment
  (:func:`~spark_imagenet.training.task.environment.cuda_visible_devices`);
* bucket credentials: which source Google's client would use
  (``STORAGE_EMULATOR_HOST``, ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's
  application default credentials file), by name and path only, never content;
* the checks ``train`` makes of a session, from the same functions
  (:mod:`spark_imagenet.training.driver.preflight`): a session is started
  (:func:`~spark_imagenet.training.driver.spark_session.session_for`), its facts read once
  (:func:`~spark_imagenet.training.driver.preflight.read_session_facts`, a classic session or a Spark Connect
  server) and checked (:func:`~spark_imagenet.training.driver.preflight.check_session`: the master, dynamic
  allocation, barrier slots, reach of a local dataset from the executors, encryption, GPU settings for
  ``--gpus-per-worker``; under Connect a ``warn not checked`` line names what Connect cannot check) for the
  given ``--workers`` (else for as many workers as there are slots); each finding is printed under its
  check's name, and the session is stopped (not run, one ``PROBLEM preflight`` line, without Java or pyspark);
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


def check_versions(report: Report) -> list[str]:
    """Python, Java, Spark, TensorFlow, tf-keras and the GPUs.

    Returns:
        list[str]: what a Spark session started here lacks, by the name of its line (``java``, ``spark``); empty
        when Java and pyspark are usable.
    """
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
    spark_ok = check_spark(report)
    _check_tensorflow(report)
    _check_nvidia_smi(report)
    return [name for name, usable in (("java", java_ok), ("spark", spark_ok)) if not usable]


def check_spark(report: Report) -> bool:
    """pyspark's version and folder (a Spark platform's own, or one installed with the extra ``spark``), or its
    absence with the fix (:func:`~spark_imagenet.training.driver.spark_session.require_pyspark`); returns whether pyspark imports."""
    from spark_imagenet.training.driver.spark_session import require_pyspark

    try:
        pyspark = require_pyspark()
    except SparkImagenetError as e:
        report.problem("spark", str(e))
        return False
    report.ok("spark", f"pyspark {pyspark.__version__} ({Path(pyspark.__file__).parent})")
    return True


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
                 allow_unencrypted: bool, gpus_per_worker: int = 0, url: str | None = None) -> int | None:
    """Start a session for ``master``, print the findings of the checks ``train`` makes of a session, stop it.

    The session's facts are read once (:func:`~spark_imagenet.training.driver.preflight.read_session_facts`,
    classic or Spark Connect) and checked as ``train`` checks them
    (:func:`~spark_imagenet.training.driver.preflight.check_session`): each finding is one line.

    Args:
        report: where the lines go.
        master: the master (None: the session ``train`` would get).
        conf: extra Spark settings.
        workers: the workers to check for (None: one per slot found).
        allow_unencrypted: as ``train --allow-unencrypted``.
        gpus_per_worker: as ``train --gpus-per-worker``.
        url: a dataset URL, checked for reach from the executors (None: not checked).

    Returns:
        int | None: the barrier task slots found (under Connect: the slots its local master gives, else the
        workers checked for), or None when no session started.
    """
    from spark_imagenet.training.driver.spark_session import session_for
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
        return _check_session(report, spark, master, workers, allow_unencrypted, gpus_per_worker, url)
    finally:
        spark.stop()


def _check_session(report: Report, spark, master: str | None, workers: int | None, allow_unencrypted: bool,
                   gpus_per_worker: int, url: str | None) -> int | None:
    """The session's line, then one line per finding of its checks; returns the slots (see :func:`check_master`)."""
    from spark_imagenet.training.driver.preflight import check_session, read_session_facts
    from spark_imagenet.training.job.config import TrainConfig

    try:
        facts = read_session_facts(spark, workers or 0, master=master)
    except SparkImagenetError as e:
        report.problem("spark session", str(e))
        return None
    if facts.is_connect:
        report.ok("spark session", f"Spark Connect server {facts.connect_url}, Spark {spark.version}, the server's "
                  f"master {facts.master or '(not readable)'}")
    else:
        report.ok("spark session", f"master {facts.master}, Spark {spark.version}")
    n = workers or max(1, facts.slots or 1)
    if not workers:
        report.ok("workers", f"no --workers given: checked for one per slot ({n})")
    config = TrainConfig(workers=n, allow_unencrypted=allow_unencrypted, gpus_per_worker=gpus_per_worker)
    print_findings(report, check_session(facts, config, url))
    return facts.slots if facts.slots is not None else n


def print_findings(report: Report, findings) -> None:
    """One line per :class:`~spark_imagenet.training.driver.preflight.Finding`: ``ok``, ``warn`` or ``PROBLEM``
    with its check's name and message."""
    for finding in findings:
        {"ok": report.ok, "warning": report.warn, "problem": report.problem}[finding.level](finding.check,
                                                                                           finding.message)


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
        print_findings(report, [check_train_shards(train, workers)])


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
    lacking = check_versions(report)
    check_gpu_mapping(report)
    check_credentials(report, url)
    if not lacking:
        check_master(report, master, conf, workers, allow_unencrypted, gpus_per_worker, url)
    else:
        needs = " and ".join({"java": "Java", "spark": "pyspark"}[name] for name in lacking)
        report.problem("preflight", f"not run: Spark needs {needs} (see the {' and '.join(lacking)} line)")
    if url is not None:
        check_dataset(report, url, workers)
    report.out(f"{report.problems} problem(s) found" if report.problems else "no problems found")
    return 1 if report.problems else 0
