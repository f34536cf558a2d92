"""submit/k8s.sh, run for real: the real spark-submit, cluster deploy mode, against a stand-in Kubernetes API
server (tests/k8s_apiserver.py) that records what the client posts. No cluster runs here, so the driver pod
is only asked for, never started: the test checks the request (image, pod template merged, the Spark conf
the driver will read, GPU requests, the shard cache volume, the driver's arguments), not the pods running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_apiserver import APPLY, FakeApiServer

#: Every test here starts a server or a cluster (seconds to tens of seconds): the slow tier.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "submit" / "k8s.sh"
CONF = REPO / "conf"
DRIVER_TEMPLATE = CONF / "k8s-driver-pod-template.yaml"
EXECUTOR_TEMPLATE = CONF / "k8s-executor-pod-template.yaml"
#: Bounded wait (seconds) for one spark-submit: it takes seconds here; this only stops a hang.
SUBMIT_TIMEOUT_S = 300
IMAGE = "registry.example/spark-imagenet:0.1.0"
#: The driver program's path inside the image (docker/Dockerfile) and the main resource k8s.sh names.
IN_IMAGE = "/opt/spark-imagenet/submit.py"
URL = "gs://bucket/imagenet"
#: Job options, one with a space in it: they must reach the driver container's arguments unchanged.
JOB = ("--workers", "3", "--epochs", "2", "--results", "/var/data/local/my results.json")
#: Where Spark mounts the executor pod template (from a configmap) in the driver pod.
TEMPLATE_IN_DRIVER = "/opt/spark/pod-template/pod-spec-template.yml"
#: The local dir both templates mount (a volume named spark-local-dir-1).
LOCAL_DIR = "/var/data/local"


def run_k8s(*args: str, extra: str = "", **env: str | None) -> subprocess.CompletedProcess:
    """Run submit/k8s.sh with this interpreter as PYTHON, no kubeconfig of the user's, ``env`` set (None:
    removed) and ``extra`` as SPARK_SUBMIT_OPTS_EXTRA, after waitAppCompletion=false (so the client returns
    once the driver pod is posted)."""
    full = {**os.environ, "PYTHON": sys.executable, "KUBECONFIG": str(REPO / "no-such-kubeconfig")}
    full["PYTHONPATH"] = str(REPO) + (os.pathsep + full["PYTHONPATH"] if full.get("PYTHONPATH") else "")
    full["SPARK_SUBMIT_OPTS_EXTRA"] = f"--conf spark.kubernetes.submission.waitAppCompletion=false {extra}"
    for name in ("PYSPARK_GATEWAY_PORT", "SPARK_LOCAL_DIRS", "SPARK_CONF_DIR"):
        full.pop(name, None)
    for name, value in env.items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return subprocess.run(["bash", str(SCRIPT), *args], check=False, capture_output=True, text=True,
                          timeout=SUBMIT_TIMEOUT_S, env=full, cwd=REPO)


def java_properties(text: str) -> dict[str, str]:
    """A ``java.util.Properties.store`` text as a dict: ``#`` comments, ``key=value``, backslash escapes."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "!")):
            continue
        m = re.match(r"((?:\\.|[^=:\\])*)[=:](.*)$", line)
        assert m, f"not a properties line: {line!r}"
        key, value = (re.sub(r"\\(.)", r"\1", part) for part in m.groups())
        out[key] = value
    return out


def test_java_properties():
    assert java_properties("#c\na=1\nspark.master=k8s\\://http\\://h\\:1\nb\\=c=d\n") == {
        "a": "1", "spark.master": "k8s://http://h:1", "b=c": "d"}


class Submission:
    """One run of submit/k8s.sh against a fresh stand-in: the result and what the stand-in got."""

    def __init__(self, *args: str, extra: str = "", **env: str | None) -> None:
        self.api = FakeApiServer()
        self.api.start()
        try:
            self.result = run_k8s(*args, extra=extra, MASTER=self.api.master, IMAGE=IMAGE, **env)
        finally:
            self.api.stop()
        out = self.result.stdout + self.result.stderr
        assert self.result.returncode == 0, out[-4000:]
        pods = self.api.stored("pods")
        assert len(pods) == 1, f"one driver pod expected, got {len(pods)}\n{out[-4000:]}"
        self.pod = pods[0]
        self.container = self.pod["spec"]["containers"][0]
        maps = {m["metadata"]["name"]: m for m in self.api.stored("configmaps")}
        (self.conf_map,) = [m for m in maps.values() if "spark.properties" in m["data"]]
        self.conf = java_properties(self.conf_map["data"]["spark.properties"])
        self.template_map = maps[self.volumes()["pod-template-volume"]["configMap"]["name"]]

    def volumes(self) -> dict[str, dict]:
        """The driver pod's volumes by name."""
        return {v["name"]: v for v in self.pod["spec"]["volumes"]}

    def mounts(self) -> dict[str, str]:
        """The driver container's mounts: volume name -> mount path."""
        return {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}

    def env(self) -> dict[str, str]:
        """The driver container's environment (None for a value taken from elsewhere, valueFrom)."""
        return {e["name"]: e.get("value") for e in self.container["env"]}


@pytest.fixture(scope="module")
def submitted() -> Submission:
    """submit/k8s.sh URL JOB... with NAMESPACE and SERVICE_ACCOUNT given."""
    return Submission(URL, *JOB, NAMESPACE="training", SERVICE_ACCOUNT="trainer")


@pytest.fixture(scope="module")
def submitted_defaults() -> Submission:
    """Default namespace and service account, no --workers in the job options (spark.executor.instances
    given by SPARK_SUBMIT_OPTS_EXTRA instead), and the executor pod template given as the driver's: the
    client then loads it as it loads a pod template for the executors (with the same fabric8 parser) and
    merges it into the pod it posts, which shows the template's parts as Kubernetes gets them. (The
    template's path goes through SPARK_SUBMIT_OPTS_EXTRA, split on spaces as the scripts do: a checkout
    path with a space in it would break it.)"""
    return Submission(URL, "--workers", "4", "--epochs", "1", NAMESPACE=None, SERVICE_ACCOUNT=None,
                      extra=f"--conf spark.executor.instances=5 "
                            f"--conf spark.kubernetes.driver.podTemplateFile={EXECUTOR_TEMPLATE}")


def test_the_client_posts_the_driver_pod_then_applies_what_goes_with_it(submitted):
    seen = submitted.api.seen
    assert [s.status for s in seen if s.status >= 400] == [], [(s.method, s.path, s.status) for s in seen]
    first = seen[0]
    assert (first.method, first.path) == ("POST", "/api/v1/namespaces/training/pods")
    rest = seen[1:]
    assert rest and all(s.method == "PATCH" and s.content_type.startswith(APPLY)
                        and s.query == {"fieldManager": "fabric8", "force": "true"} for s in rest)
    assert {"services", "configmaps"} <= {s.plural for s in rest}
    assert all("/namespaces/training/" in s.path for s in rest)
    # each one is owned by the driver pod, by the uid the stand-in gave it: deleting the pod deletes them
    uid = submitted.pod["metadata"]["uid"]
    for s in rest:
        (owner,) = s.body["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["name"]) == ("Pod", uid, submitted.pod["metadata"]["name"])


def test_the_driver_pod_runs_the_image_s_driver_program_with_the_job_options_unchanged(submitted):
    c = submitted.container
    assert c["image"] == IMAGE
    assert c["args"] == ["driver", "--properties-file", "/opt/spark/conf/spark.properties",
                         "--class", "org.apache.spark.deploy.PythonRunner", f"local://{IN_IMAGE}", URL, *JOB]
    env = submitted.env()
    # the image's interpreter, not the PYSPARK_PYTHON of the machine that submitted (this test's venv)
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == "/usr/local/bin/python3"
    assert env["SPARK_LOCAL_DIRS"] == LOCAL_DIR


def test_the_namespace_and_service_account_come_from_the_environment(submitted, submitted_defaults):
    assert submitted.pod["metadata"]["namespace"] == "training"
    assert submitted.pod["spec"]["serviceAccountName"] == "trainer"
    assert submitted.conf["spark.kubernetes.namespace"] == "training"
    assert submitted.conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "trainer"
    assert submitted_defaults.api.seen[0].path == "/api/v1/namespaces/default/pods"
    assert submitted_defaults.pod["spec"]["serviceAccountName"] == "spark"


def test_the_driver_pod_template_is_merged(submitted):
    labels = submitted.pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "spark-imagenet" and labels["app.kubernetes.io/component"] == "driver"
    assert labels["spark-role"] == "driver"  # Spark's own, beside the template's
    assert submitted.container["name"] == "spark-kubernetes-driver"
    assert submitted.volumes()["spark-local-dir-1"] == {"name": "spark-local-dir-1", "emptyDir": {"sizeLimit": "10Gi"}}
    assert submitted.mounts()["spark-local-dir-1"] == LOCAL_DIR
    # the driver asks for no GPU and tolerates no GPU node's taint
    assert not submitted.pod["spec"].get("tolerations")
    resources = submitted.container["resources"]
    assert "nvidia.com/gpu" not in {**resources.get("requests", {}), **resources.get("limits", {})}


def test_the_spark_conf_the_driver_reads_has_what_a_barrier_job_needs(submitted, submitted_defaults):
    conf = submitted.conf
    assert conf["spark.master"] == submitted.api.master and conf["spark.submit.deployMode"] == "cluster"
    assert conf["spark.dynamicAllocation.enabled"] == "false"
    assert conf["spark.barrier.sync.timeout"] == "3600s"
    assert conf["spark.executor.instances"] == "3"  # = --workers 3
    assert conf["spark.executor.cores"] == conf["spark.task.cpus"] == "4"
    assert conf["spark.scheduler.minRegisteredResourcesRatio"] == "1.0"
    assert conf["spark.kubernetes.container.image"] == IMAGE  # driver and executors
    assert conf["spark.executor.resource.gpu.amount"] == conf["spark.task.resource.gpu.amount"] == "1"
    assert conf["spark.executor.resource.gpu.vendor"] == "nvidia.com"
    assert conf["spark.executor.resource.gpu.discoveryScript"] == "/opt/spark-imagenet/conf/gpu-discovery.sh"
    assert conf["spark.pyspark.python"] == "/usr/local/bin/python3"
    assert conf["spark.kubernetes.submission.waitAppCompletion"] == "false"  # SPARK_SUBMIT_OPTS_EXTRA
    assert int(conf["spark.kubernetes.allocation.batch.size"]) >= 3
    # the driver finds the executor pod template where Spark mounts it from its configmap
    assert conf["spark.kubernetes.executor.podTemplateFile"] == TEMPLATE_IN_DRIVER
    assert submitted.mounts()["pod-template-volume"] == str(Path(TEMPLATE_IN_DRIVER).parent)
    # and SPARK_SUBMIT_OPTS_EXTRA's spark.executor.instances wins over --workers (it comes later)
    assert submitted_defaults.conf["spark.executor.instances"] == "5"


def test_the_executor_pod_template_is_carried_as_written(submitted):
    (text,) = submitted.template_map["data"].values()
    assert text == EXECUTOR_TEMPLATE.read_text()


def test_the_executor_pod_template_asks_for_a_gpu_shm_and_the_shard_cache(submitted_defaults):
    """What the executor template gives a pod, merged by the client as it merges a template: one GPU, a
    toleration of GPU nodes' taint, a memory-backed /dev/shm, and Spark's local dir on a sized emptyDir."""
    pod, c = submitted_defaults.pod, submitted_defaults.container
    assert c["name"] == "spark-kubernetes-executor"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"]  # Spark's own, kept
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    volumes, mounts = submitted_defaults.volumes(), submitted_defaults.mounts()
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"} and mounts["dshm"] == "/dev/shm"
    assert volumes["spark-local-dir-1"]["emptyDir"] == {"sizeLimit": "200Gi"}
    assert mounts["spark-local-dir-1"] == LOCAL_DIR
    assert submitted_defaults.env()["SPARK_LOCAL_DIRS"] == LOCAL_DIR
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "executor"


def test_the_default_shard_cache_is_on_the_executor_template_s_volume(monkeypatch):
    """A barrier task's SPARK_LOCAL_DIRS is the executor's block manager folder in Spark's local dir, the
    template's volume; the cache (no --cache given) goes beside it, on that volume."""
    from spark_imagenet.dataset.cache import default_cache_dir

    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{LOCAL_DIR}/blockmgr-0d1e2f")
    assert default_cache_dir() == Path(LOCAL_DIR) / "spark-imagenet-cache"


def test_the_image_has_the_driver_program_where_the_script_names_it():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert f'cp "$(python -m spark_imagenet.submit --path)" {IN_IMAGE}' in dockerfile
    assert f"driver_in_image={IN_IMAGE}" in SCRIPT.read_text()


def test_the_gpu_amounts_agree_between_the_template_and_the_spark_conf():
    text = (CONF / "spark-defaults.k8s.conf").read_text()
    amount = re.search(r"^spark\.executor\.resource\.gpu\.amount\s+(\d+)", text, re.MULTILINE).group(1)
    template = EXECUTOR_TEMPLATE.read_text()
    assert re.findall(r"^\s+nvidia\.com/gpu: (\d+)$", template, re.MULTILINE) == [amount, amount]


@pytest.mark.parametrize("env, args, message", [
    ({"MASTER": "yarn", "IMAGE": IMAGE}, (URL,),
     "set MASTER to the cluster's API server, k8s://https://HOST:PORT (got 'yarn')"),
    ({"MASTER": None, "IMAGE": IMAGE}, (URL,), "(got '')"),
    ({"MASTER": "k8s://https://h:443", "IMAGE": None}, (URL, "--workers", "2"),
     "set IMAGE to the spark-imagenet image the cluster pulls"),
    ({"MASTER": "k8s://https://h:443", "IMAGE": ""}, (URL,), "set IMAGE"),
    ({"MASTER": "k8s://https://h:443", "IMAGE": IMAGE}, (URL, "--workers=two"),
     "argument --workers: 'two' is not an integer"),
    ({"MASTER": "k8s://https://h:443", "IMAGE": IMAGE}, (URL, "--workers", "0"), "0 must be at least 1"),
    ({"MASTER": "k8s://https://h:443", "IMAGE": IMAGE}, (URL,), "workers (--workers) is required"),
    ({"MASTER": "k8s://https://h:443", "IMAGE": IMAGE}, (URL, "--config", "job.toml"),
     "--config: in cluster deploy mode the driver runs on a cluster host, which cannot read this machine's job"),
    ({"MASTER": "k8s://https://h:443", "IMAGE": IMAGE}, (), "usage: k8s.sh URL [spark-imagenet train options ...]"),
    ({"MASTER": "k8s://https://h:443", "IMAGE": IMAGE}, ("--workers", "2"), "usage: k8s.sh URL"),
])
def test_the_script_refuses_bad_settings_before_starting_spark(env, args, message):
    p = run_k8s(*args, **env)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert "spark" not in p.stdout.lower() and "Exception" not in p.stderr

