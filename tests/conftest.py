import sys
from pathlib import Path

# Make tests/ helpers (data_util, ...) importable as plain modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest

from session_util import shared_spark, stop_shared_spark


#: For each test module (its file path), whether the module run after it also takes the ``spark`` fixture.
_NEXT_TAKES_SPARK: dict[str, bool] = {}


#: Fixtures that hand a test a Spark session or cluster (the ``spark`` marker's tests).
SPARK_FIXTURES = frozenset({"spark", "remote", "connect_url", "two_hosts"})
#: Words of a test module's source that say its tests drive Spark themselves.
SPARK_WORDS = ("pyspark", "module_spark", "local_session", "shared_spark")
#: The test modules marked ``part2``: .ci/run's main lane runs the slow tier in two pytest processes side by side,
#: ``-m "slow and not part2"`` and ``-m "slow and part2"``, each about half of its minutes (measured per module;
#: docs/design.md, 'The Spark lanes'). A module is in one part whole; so are the modules that share a session's
#: cluster or server: the network-namespace cluster (batch_predict, shard_dataframe, submit: part 1), YARN and
#: HDFS, the MLflow server (fault_tolerance, mlflow), the Connect server (connect) (part 2).
PART2 = frozenset({
    "test_yarn.py", "test_hdfs.py", "test_connect.py", "test_fault_tolerance.py", "test_mlflow.py",
    "test_benchmarks_launch.py", "test_worker.py", "test_compile.py", "test_benchmarks_pipeline.py",
    "test_benchmarks_scale.py", "test_watchdog.py", "test_train_real.py", "test_elastic.py",
    "test_ml.py",
})


def _drives_spark(item, sources: dict[str, str]) -> bool:
    """Whether a test takes a Spark fixture or sits in a module that drives Spark itself."""
    module = str(item.path)
    if module not in sources:
        sources[module] = item.path.read_text() if item.path.suffix == ".py" else ""
    return bool(SPARK_FIXTURES & set(item.fixturenames)) or any(w in sources[module] for w in SPARK_WORDS)


def pytest_collection_modifyitems(session, config, items):
    """Mark the tests that drive Spark ``spark`` (what the Spark 4.2 lane runs of the fast tier: .ci/run) and those
    of :data:`PART2` ``part2``, and note, in run order, which modules are followed by one that takes the ``spark``
    fixture (see :func:`spark`)."""
    modules: list[str] = []
    takes: dict[str, bool] = {}
    sources: dict[str, str] = {}
    for item in items:
        module = str(item.path)
        if module not in takes:
            modules.append(module)
            takes[module] = False
        takes[module] = takes[module] or "spark" in item.fixturenames
        if _drives_spark(item, sources):
            item.add_marker(pytest.mark.spark)
        if item.path.name in PART2:
            item.add_marker(pytest.mark.part2)
    _NEXT_TAKES_SPARK.clear()
    _NEXT_TAKES_SPARK.update({m: takes[n] for m, n in zip(modules, modules[1:])})


@pytest.fixture(scope="module")
def spark(request):
    """A real ``local[2]`` SparkSession for the tests of a module, handed on to the next module when that one
    takes it too.

    Consecutive modules share one SparkContext, so its Python workers (and the host's TensorFlow fork server)
    carry over; it is stopped after the last of a run of such modules, before a module that
    starts a session of its own (another master or settings). A module whose test stops it gets a new one in
    the next module. Later SparkContexts start in the same JVM (PySpark keeps its gateway), much cheaper than
    a JVM start on this 2-core machine. Note: the conf of the session that launches the JVM becomes JVM
    system properties that every later SparkContext in the process inherits; a test needing other settings
    should start the JVM first (``SparkContext._ensure_initialized()``).
    """
    session = shared_spark("local[2]", "spark-imagenet-tests")
    yield session
    if not _NEXT_TAKES_SPARK.get(str(request.path), False):
        stop_shared_spark()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """fake-gcs-server on 127.0.0.1:<free port> for the whole session (see gcs_emulator.py)."""
    from gcs_emulator import GCSEmulator

    emulator = GCSEmulator(tmp_path_factory.mktemp("fake-gcs") / "storage")
    yield emulator
    emulator.stop()


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    """moto's S3 server on 127.0.0.1:<free port> for the whole session (tests/s3_server.py)."""
    pytest.importorskip("boto3", reason="the s3 extra (boto3) is not installed: pip install '.[test]'")
    from s3_server import MotoS3, Unavailable
    from server_util import serving

    yield from serving(MotoS3, Unavailable, tmp_path_factory.mktemp("moto"))


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` (SQLite backend, local artifact root) on 127.0.0.1:<free port> for the whole
    session (tests/mlflow_server.py)."""
    from mlflow_server import MlflowServer, Unavailable
    from server_util import serving

    yield from serving(MlflowServer, Unavailable, tmp_path_factory.mktemp("mlflow"))


@pytest.fixture
def s3_url(moto_s3, monkeypatch, request):
    """``s3://<new bucket>/t`` on the server, with AWS_ENDPOINT_URL and dummy credentials set for this test
    (and the processes it starts)."""
    import re
    import uuid

    from s3_server import CREDENTIALS

    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    moto_s3.create_bucket(bucket)
    for k, v in {**CREDENTIALS, "AWS_ENDPOINT_URL": moto_s3.endpoint}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return f"s3://{bucket}/t"


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """Azurite's blob service on 127.0.0.1:<free port> for the whole session (tests/azurite.py)."""
    pytest.importorskip("azure.storage.blob", reason="the azure extra is not installed: pip install '.[test]'")
    from azurite import Azurite, Unavailable
    from server_util import serving

    yield from serving(Azurite, Unavailable, tmp_path_factory.mktemp("azurite"))


@pytest.fixture
def az_url(azurite, monkeypatch, request):
    """``abfs://<new container>@devstoreaccount1.dfs.core.windows.net/t``, with
    AZURE_STORAGE_CONNECTION_STRING set for this test (and the processes it starts)."""
    import re
    import uuid

    from azurite import ACCOUNT

    container = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    container = re.sub(r"-+", "-", container)
    azurite.create_container(container)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    return f"abfs://{container}@{ACCOUNT}.dfs.core.windows.net/t"


@pytest.fixture(scope="session")
def mini_dfs(tmp_path_factory):
    """A MiniDFSCluster with WebHDFS on, for the whole session (tests/hdfs_cluster.py; its jars from Maven);
    skipped, saying why, without Java or Maven."""
    pytest.importorskip("fsspec", reason="the hdfs extra (fsspec) is not installed: pip install '.[test]'")
    from hdfs_cluster import MiniDFS, Unavailable
    from server_util import serving

    yield from serving(MiniDFS, Unavailable, tmp_path_factory.mktemp("hdfs"))


@pytest.fixture
def hdfs_url(mini_dfs, monkeypatch):
    """``hdfs://127.0.0.1:<rpc port>/tests/<new folder>``, with HADOOP_CONF_DIR naming the WebHDFS address for
    this test (and the processes it starts)."""
    import uuid

    monkeypatch.setenv("HADOOP_CONF_DIR", str(mini_dfs.conf_dir))
    monkeypatch.setenv("HADOOP_USER_NAME", "tester")
    return f"hdfs://127.0.0.1:{mini_dfs.rpc_port}/tests/{uuid.uuid4().hex[:8]}"


@pytest.fixture
def log_lines():
    """The package's log lines (INFO and up) of this test, as a list that fills as they come
    (:func:`spark_imagenet.logs.collect`)."""
    from spark_imagenet.logs import collect

    with collect() as lines:
        yield lines


@pytest.fixture
def gcs_bucket(gcs_emulator, monkeypatch, request):
    """A new empty bucket on the emulator, with STORAGE_EMULATOR_HOST set for
    this test (and the subprocesses it starts). Returns the bucket name."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    gcs_emulator.create_bucket(name)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    return name


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A small synthetic Kaggle tree (4 classes x 8 train, 3 val each), shared by a module's tests."""
    from data_util import small_layout

    return small_layout(tmp_path_factory.mktemp("kaggle") / "src", num_classes=4, train_per_class=8, val_per_class=3)


@pytest.fixture(scope="module")
def local_ds(tree, tmp_path_factory):
    """A real dataset built by shard() on local disk from ``tree`` (with its quality report): folder, manifest."""
    from spark_imagenet.dataset.sharding import shard

    out = tmp_path_factory.mktemp("local") / "shards"
    manifest = shard(tree, out, train_shards=4, val_shards=2, progress=False)
    return out, manifest


@pytest.fixture(scope="session")
def two_hosts(tmp_path_factory):
    """A Spark standalone cluster of two "hosts" (one 1-core worker in each of two network namespaces,
    :func:`cluster_util.two_host_cluster`), started once for the session and shared by every test that needs
    one; yields ``(master URL, [worker addresses], folder)`` where ``folder / "work0"`` and ``"work1"`` are the
    workers' work folders. Skips where namespaces cannot be made here."""
    import contextlib

    import cluster_util

    why = cluster_util.can_make_namespaces()
    if why:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("two-hosts")
    with contextlib.ExitStack() as stack:
        try:
            master, addresses = stack.enter_context(cluster_util.two_host_cluster(folder))
        except cluster_util.ClusterError as e:
            pytest.fail(str(e))
        yield master, addresses, folder
