"""The machine-side prerequisites of Spark, and a ready-to-use local session.

PySpark 4 starts a JVM and needs Java 17 or newer (Spark 4.0 dropped Java 8
and 11). Without it PySpark only says "Java gateway process exited before
sending its port number", so :func:`check_java` looks first and says what to
install. :func:`local_session` builds a ``local[N]`` session whose Python
workers run this very interpreter (``sys.executable``), so a virtualenv's
packages (TensorFlow, this package) are what the tasks see. A driver JVM
started here logs through the package's quiet log4j2 configuration unless the
user configures logging (:func:`quiet_logging_conf`).

Nothing here imports pyspark at module import time: the CLI can print a
clear Java error even where importing pyspark would be slow, and a missing
pyspark (the optional extra ``spark``) is one message
(:func:`require_pyspark`, the first check of
:func:`session_for` and :func:`local_session`).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

from spark_imagenet.errors import ConfigError, EnvironmentSetupError, install_hint
from spark_imagenet.resources import QUIET_LOG4J2, resource_path
from spark_imagenet.training.job.master import Master

#: Oldest Java major version PySpark 4.x runs on (Spark 4.0 release notes: "Java 17 and 21").
MIN_JAVA_MAJOR = 17

_INSTALL_HINT = (
    "Install Java 17 or newer (Debian/Ubuntu: `sudo apt-get install openjdk-17-jre-headless`; "
    "elsewhere any OpenJDK 17/21 build) and put its `java` on PATH or set JAVA_HOME to its folder."
)

# `java -version` prints e.g. `openjdk version "17.0.15" 2025-04-15`,
# `java version "1.8.0_292"` or `openjdk version "21" 2023-09-19` on stderr.
_VERSION_RE = re.compile(r'version\s+"([^"]+)"')


def require_pyspark():
    """The ``pyspark`` package, or one clear error where it cannot be imported.

    pyspark is the optional extra ``spark`` (pyproject.toml), not a requirement of the wheel: a Spark platform
    (Databricks, EMR, Dataproc) puts its own pyspark on the interpreter's path, often where pip does not see it,
    and a pyspark from PyPI beside it would shadow it (docs/design.md, 'Databricks: the runtime the jobs name, and
    what installing the wheel changes'). Every place that first needs pyspark calls this: starting a session, the
    commands that run a Spark job, :mod:`spark_imagenet.ml`, ``doctor``. A function of the driver's: the
    TensorFlow worker and the job contract never import pyspark (pyproject.toml's import-linter contracts).

    Returns:
        module: ``pyspark``.

    Raises:
        EnvironmentSetupError: pyspark is not installed, or importing it fails (a module it needs, e.g. py4j, is
            missing); the message says how to install it, and that a Spark platform's own Python has it.
    """
    try:
        import pyspark
    except ImportError as e:
        missing = getattr(e, "name", None) or ""
        what = "pyspark is not installed" if missing.split(".")[0] == "pyspark" else f"pyspark cannot be imported ({e})"
        raise EnvironmentSetupError(f"{what}: {install_hint('spark')}; a Spark platform such as Databricks, EMR or "
                                    "Dataproc brings its own pyspark: run spark-imagenet with that platform's "
                                    "Python") from None
    return pyspark


def parse_java_version(text: str) -> tuple[int, str]:
    """Java major version from the output of ``java -version``.

    Args:
        text: what ``java -version`` printed (stderr and stdout together).

    Returns:
        ``(major, version_string)``: e.g. ``(17, "17.0.15")``; the old
        ``1.x`` scheme maps to ``x`` (``"1.8.0_292"`` -> 8).

    Raises:
        ValueError: no ``version "..."`` in the text.
    """
    m = _VERSION_RE.search(text)
    if not m:
        raise ValueError(f"no version string in {text.strip()[:200]!r}")
    version = m.group(1)
    parts = re.split(r"[._+\-]", version)
    try:
        major = int(parts[0])
        if major == 1 and len(parts) > 1:
            major = int(parts[1])
    except ValueError:
        raise ValueError(f"cannot read the major version of {version!r}") from None
    return major, version


def find_java() -> tuple[str, str]:
    """Locate the ``java`` executable the way Spark's launcher does.

    Spark's ``bin/spark-class`` runs ``$JAVA_HOME/bin/java`` when JAVA_HOME is
    set, otherwise the first ``java`` on PATH.

    Returns:
        ``(path, how)``: the executable and where it came from
        (``"JAVA_HOME=..."`` or ``"PATH"``).

    Raises:
        EnvironmentSetupError: JAVA_HOME is set but holds no ``bin/java``, or
            there is no ``java`` on PATH.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            raise EnvironmentSetupError(
                f"JAVA_HOME={java_home} has no executable bin/java, and Spark uses JAVA_HOME when it is "
                f"set. Point JAVA_HOME at a Java 17+ installation or unset it. {_INSTALL_HINT}"
            )
        return str(candidate), f"JAVA_HOME={java_home}"
    found = shutil.which("java")
    if not found:
        raise EnvironmentSetupError(f"No Java found: JAVA_HOME is not set and there is no `java` on PATH. "
                                    f"PySpark 4 needs Java {MIN_JAVA_MAJOR}+. {_INSTALL_HINT}")
    return found, "PATH"


def check_java() -> int:
    """Check that Spark will find a Java it can run on.

    Returns:
        int: the Java major version found (>= 17).

    Raises:
        EnvironmentSetupError: no Java, a JAVA_HOME without ``bin/java``, a
            ``java`` that does not run or prints no version, or a version older
            than 17; the message names what was found and what to install.
    """
    java, how = find_java()
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EnvironmentSetupError(f"Cannot run {java} (found via {how}): {e}. {_INSTALL_HINT}") from e
    output = (proc.stderr or "") + (proc.stdout or "")
    try:
        major, version = parse_java_version(output)
    except ValueError:
        raise EnvironmentSetupError(
            f"`{java} -version` (found via {how}) exited with {proc.returncode} and printed no Java version: "
            f"{output.strip()[:300]!r}. {_INSTALL_HINT}"
        ) from None
    if major < MIN_JAVA_MAJOR:
        raise EnvironmentSetupError(
            f"{java} (found via {how}) is Java {version}; PySpark 4 needs Java {MIN_JAVA_MAJOR} or newer. "
            f"{_INSTALL_HINT}"
        )
    return major


#: The driver JVM's options setting, where the quiet log4j2 configuration is named.
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: Environment variables whose JVM options reach the driver JVM spark-submit starts; one that names a log4j
#: configuration is the user's own logging.
_JVM_OPTION_VARIABLES = ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")


def quiet_logging_conf(conf: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The setting that makes a driver JVM this process starts log quietly, unless the user set up logging.

    The setting is ``spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=FILE_URL``
    with the package's ``log4j2-quiet.properties``
    (:data:`spark_imagenet.resources.QUIET_LOG4J2`): warnings and errors
    are logged, Spark's start-up chatter is not (docs/design.md, 'Preflight and
    doctor'). PySpark passes the builder's settings to the ``spark-submit``
    that starts the JVM, so only a JVM not yet started is affected. Nothing is
    returned (the user's logging wins) when:

    * this process did not start the JVM: under ``spark-submit``
      (``PYSPARK_GATEWAY_PORT``), on Databricks (``DATABRICKS_RUNTIME_VERSION``),
      or a SparkContext is already running;
    * ``conf``'s driver Java options name a log4j configuration (other options
      of the user's are kept, with ours after them), or ``PYSPARK_SUBMIT_ARGS``
      sets the driver's Java options;
      ``SPARK_SUBMIT_OPTS``, ``JAVA_TOOL_OPTIONS`` or ``JDK_JAVA_OPTIONS``
      names a log4j configuration; or Spark's conf folder (``SPARK_CONF_DIR``,
      else ``$SPARK_HOME/conf``, else pyspark's own) holds a ``log4j2*`` file
      or a ``spark-defaults.conf`` that sets the driver's Java options;
    * the configuration file is missing from the installation.

    Args:
        conf: the Spark settings the session will be built with.

    The configuration also writes Spark's whole log to :func:`spark_log_path`
    (``-Dspark_imagenet.spark_log=PATH``), including the two records of a failed
    task (the executor's "Exception in task" and the scheduler's "Lost task",
    each a Python traceback inside a JVM stack trace), which it keeps off the
    console: the driver prints the task's own error once.

    Returns:
        dict[str, str]: ``{"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=file:...
        -Dspark_imagenet.spark_log=..."}``, or ``{}``.
    """
    env = os.environ
    users = str((conf or {}).get(DRIVER_JAVA_OPTIONS, "")).strip()
    if "PYSPARK_GATEWAY_PORT" in env or "DATABRICKS_RUNTIME_VERSION" in env or "log4j" in users:
        return {}
    submit_args = env.get("PYSPARK_SUBMIT_ARGS", "")
    if DRIVER_JAVA_OPTIONS in submit_args or "--driver-java-options" in submit_args:
        return {}
    if any("log4j" in env.get(name, "") for name in _JVM_OPTION_VARIABLES):
        return {}
    pyspark = require_pyspark()
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        return {}
    spark_home = Path(env.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    conf_dir = Path(env.get("SPARK_CONF_DIR") or spark_home / "conf")
    if conf_dir.is_dir():
        if any(p.name.startswith("log4j2") and not p.name.endswith(".template") for p in conf_dir.iterdir()):
            return {}
        defaults = conf_dir / "spark-defaults.conf"
        if defaults.is_file() and DRIVER_JAVA_OPTIONS in defaults.read_text(errors="replace"):
            return {}
    options = quiet_java_options()
    if not options:
        return {}
    return {DRIVER_JAVA_OPTIONS: f"{users} {options}".strip()}  # the user's own options first, kept


def quiet_java_options() -> str:
    """The driver JVM options of the quiet log4j2 configuration, whoever starts the JVM.

    :func:`quiet_logging_conf` gives them to a JVM this process starts; ``submit/local.sh`` gives them to
    ``spark-submit --driver-java-options`` (``python -m spark_imagenet.submit --quiet-java-options``).

    Returns:
        str: ``-Dlog4j2.configurationFile=FILE_URL -Dspark_imagenet.spark_log=PATH`` (the log file left out
        when its path holds white space, at which Spark splits the options), or ``""`` when the
        configuration file is missing from the installation (the logging is then Spark's own).
    """
    try:
        path = resource_path(QUIET_LOG4J2)
    except EnvironmentSetupError:
        return ""  # a broken installation only loses the quiet logging
    options = f"-Dlog4j2.configurationFile={path.resolve().as_uri()}"
    log_file = str(spark_log_path())
    if not any(c.isspace() for c in log_file):
        options += f" -D{SPARK_LOG_PROPERTY}={log_file}"
    return options


#: The JVM system property naming the file of Spark's log under the quiet configuration.
SPARK_LOG_PROPERTY = "spark_imagenet.spark_log"


@functools.lru_cache(maxsize=1)
def spark_log_path() -> Path:
    """Where a driver JVM this process starts with :func:`quiet_logging_conf` writes Spark's log.

    One file per process: ``$TMPDIR/spark-imagenet-logs/spark-YYYYmmdd-HHMMSS-PID.log``, made by log4j on
    its first record (the folder is made here). It holds every warning and error Spark logs, with the
    stack traces of failed tasks that the console leaves out.

    Returns:
        pathlib.Path: the file's path (it may not exist yet).
    """
    folder = Path(tempfile.gettempdir()) / "spark-imagenet-logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"spark-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def spark_log_written() -> Path | None:
    """:func:`spark_log_path` when this process's Spark wrote to it (non-empty), else None."""
    if spark_log_path.cache_info().currsize == 0:
        return None  # no quiet session was started here
    path = spark_log_path()
    try:
        return path if path.stat().st_size > 0 else None
    except OSError:
        return None


def _after_start(spark) -> None:
    """Log level WARN on a classic session (a Connect session, e.g. Databricks serverless, has no SparkContext)."""
    if not is_connect_session(spark):
        spark.sparkContext.setLogLevel("WARN")


def local_session(master: str = "local[4]", app_name: str = "spark-imagenet",
                  conf: Mapping[str, Any] | None = None):
    """Create (or get) a SparkSession, ready for barrier training.

    Checks Java first (:func:`check_java`). For local masters the Python
    workers run ``sys.executable`` (``PYSPARK_PYTHON``,
    ``PYSPARK_DRIVER_PYTHON`` and ``spark.pyspark.python``), so the tasks see
    this interpreter's packages. The log level is set to WARN and Spark's
    console progress bar is off (``spark.ui.showConsoleProgress``, unless
    ``conf`` sets it), since the tasks print ``[rank R]`` progress lines.
    ``spark.python.worker.reuse`` keeps Spark's default: each barrier task runs
    TensorFlow in a fresh child process (see :mod:`spark_imagenet.training.task.barrier_task`).
    A JVM started here gets the quiet log4j2 configuration unless the user
    configures logging (:func:`quiet_logging_conf`).

    Args:
        master: Spark master URL (default ``local[4]``).
        app_name: application name shown in the Spark UI.
        conf: extra Spark configuration (``{"spark.ui.enabled": "false"}``);
            values are converted with ``str``.

    Returns:
        pyspark.sql.SparkSession

    Raises:
        EnvironmentSetupError: pyspark not installed (:func:`require_pyspark`), Java
            missing or too old.
    """
    require_pyspark()
    check_java()
    conf = dict(conf or {})
    if Master.parse(master, check=False).runs_on_this_host:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        conf.setdefault("spark.pyspark.python", sys.executable)
    # the tasks' "[rank R] ..." lines are the progress report; Spark's console
    # progress bar would be drawn over them
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    conf.update(quiet_logging_conf(conf))
    return _classic_session(master, app_name, conf, start_jvm=True)


def _classic_session(master: str | None, app_name: str, conf: Mapping[str, Any], *, start_jvm: bool):
    """``SparkSession.builder`` with ``master``, ``app_name`` and ``conf``, ``getOrCreate()``; with ``start_jvm``
    the JVM, when none runs yet, is started by :func:`~spark_imagenet.training.driver.gateway.start_gateway`
    (its incubator-module warning left out of the console)."""
    from pyspark.sql import SparkSession

    from spark_imagenet.training.driver.gateway import start_gateway

    options = {"spark.app.name": app_name, **({} if master is None else {"spark.master": master})}
    options.update({key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in conf.items()})
    if start_jvm:
        start_gateway(options)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _after_start(spark)
    return spark


def oversubscription_warning(workers: int, cores: int) -> str | None:
    """What to say when the default ``local[workers]`` has more workers than the machine has cores.

    Returns:
        str | None: the warning, or None when ``workers <= cores``.
    """
    if workers <= cores:
        return None
    return (f"--workers {workers} without --master runs local[{workers}] on this machine's {cores} core(s): "
            f"{workers} TensorFlow workers oversubscribe them (each gets about {cores / workers:.2g} of a core, "
            f"so training is slower than with --workers {cores}). Give --master to use a cluster.")


def connect_session(url: str, app_name: str = "spark-imagenet", conf: Mapping[str, Any] | None = None):
    """A Spark Connect session (``SparkSession.builder.remote(url)``); no Java or JVM needed here.

    The session connects on first use, so an unreachable server is reported
    by the first call (:func:`spark_imagenet.training.driver.preflight.read_session_facts`
    names the URL).

    Args:
        url: ``sc://HOST:PORT`` (with optional ``/;token=...`` parameters).
        app_name: application name.
        conf: session settings sent to the server (``builder.config``).

    Returns:
        pyspark.sql.connect.session.SparkSession

    Raises:
        EnvironmentSetupError: the Spark Connect client's packages are missing
            (``pip install 'spark-imagenet[connect]'``).
    """
    try:  # what pyspark[connect] adds (pyspark.sql.connect.utils.check_dependencies, which may sys.exit)
        for module in ("pandas", "pyarrow", "grpc", "grpc_status", "google.rpc", "zstandard"):
            importlib.import_module(module)
    except ImportError as e:
        raise EnvironmentSetupError(
            f"--master {url} needs the Spark Connect client, which is missing: {e}. Install it with "
            f"{install_hint('connect')}, or pip install 'pyspark[connect]'") from None
    check_connect_reachable(url)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(url).appName(app_name)
    for key, value in dict(conf or {}).items():
        builder = builder.config(key, str(value).lower() if isinstance(value, bool) else str(value))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spark = builder.getOrCreate()
    for message in dict.fromkeys(str(w.message) for w in caught):  # pyspark may warn twice: once each
        _explain_connect_warning(message, url)
    return spark


def _explain_connect_warning(message: str, url: str) -> None:
    """Print pyspark's warning from building a Connect session as one line of ours (its refused settings named)."""
    refused = re.match(r"Failed to set (\S+) to Some\((.*?)\) due to \[?([A-Z_]+)", message)
    if refused:
        key, value, why = refused.groups()
        text = (f"--conf {key}={value} was not applied: the Spark Connect server {url} does not let a client change "
                f"it ({why}); the server's own value holds. Set it in the server's (the cluster's) Spark config")
    else:
        text = " ".join(message.split())[:300]
    print(f"spark-imagenet: warning: {text}", file=sys.stderr, flush=True)


#: Seconds to wait for a Spark Connect server's port to accept a connection (the client's own retries
#: would otherwise wait about 10 minutes before saying anything).
CONNECT_REACH_TIMEOUT_S = 10.0
#: The port of an ``sc://HOST`` URL without one (Spark Connect's default).
CONNECT_DEFAULT_PORT = 15002


def check_connect_reachable(url: str, timeout_s: float = CONNECT_REACH_TIMEOUT_S) -> None:
    """Check that a Spark Connect server's port accepts a TCP connection, within ``timeout_s`` seconds.

    Args:
        url: ``sc://HOST[:PORT][/;params]``.
        timeout_s: how long to wait for the connection.

    Raises:
        ConfigError: the URL has no host or a port that is not a number
            (:meth:`~spark_imagenet.training.job.master.Master.parse`), or nothing accepts connections there.
    """
    host, port = Master.parse(url).addresses[0]
    port = port or CONNECT_DEFAULT_PORT
    why = tcp_unreachable(host, port, timeout_s)
    if why is not None:
        raise ConfigError(
            f"cannot reach the Spark Connect server at {url} ({host}:{port}: {why}). Start the server (for a "
            "local test: spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer ...; it "
            "takes 20-30 s to accept connections), or check the host and port", key="--master", value=url) from None


def tcp_unreachable(host: str, port: int, timeout_s: float) -> str | None:
    """Why ``host:port`` does not accept a TCP connection within ``timeout_s`` seconds, or None when it does."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except socket.timeout:
        return f"no answer within {timeout_s:.0f} s"
    except OSError as e:
        return str(e.strerror or e)
    return None


#: Seconds allowed for a standalone master's port to accept a TCP connection before Spark starts.
MASTER_REACH_TIMEOUT_S = 10.0


def check_standalone_reachable(master: str, timeout_s: float = MASTER_REACH_TIMEOUT_S) -> None:
    """Check that a standalone master ``spark://HOST:PORT[,HOST:PORT...]`` accepts TCP connections.

    Spark itself retries an unreachable master for about a minute and then reports only "Cannot call
    methods on a stopped SparkContext"; this says what is wrong at once. With several masters (high
    availability) one that answers is enough.

    Raises:
        ConfigError: an address without HOST:PORT (:meth:`~spark_imagenet.training.job.master.Master.parse`), or
            no listed master accepts a connection (each named, with the reason).
    """
    failures = []
    for host, port in Master.parse(master).addresses:
        why = tcp_unreachable(host, port, timeout_s)
        if why is None:
            return
        failures.append(f"{host}:{port}: {why}")
    raise ConfigError(f"cannot reach the Spark standalone master {master} ({'; '.join(failures)}). Start the "
                      "master (sbin/start-master.sh) or check the host and port of --master (its web UI, port "
                      "8080 by default, shows the spark:// URL to use)", key="--master", value=master)


def yarn_conf_dir(master: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The folder of the cluster's ``yarn-site.xml`` for ``--master yarn``, checked before a JVM starts.

    Spark's YARN client reads the ResourceManager's address from the ``yarn-site.xml`` in
    ``HADOOP_CONF_DIR`` (or ``YARN_CONF_DIR``); without the variable its JVM exits with a Java stack
    (``[JAVA_GATEWAY_EXITED]`` in PySpark), and without the file it retries ``0.0.0.0:8032`` for minutes.
    ``submit/yarn.sh`` makes the same check.

    Args:
        master: the job's master URL (anything but ``yarn`` passes).
        environ: the environment to look in (default ``os.environ``).

    Returns:
        str | None: the folder, for ``yarn``; None for another master.

    Raises:
        ConfigError: ``yarn`` with neither variable set, or with no ``yarn-site.xml`` in the folder it names.
    """
    if Master.parse(master, check=False).kind != "yarn":
        return None
    env = os.environ if environ is None else environ
    folder = env.get("HADOOP_CONF_DIR") or env.get("YARN_CONF_DIR")
    if not folder:
        raise ConfigError("--master yarn: set HADOOP_CONF_DIR to the folder with the cluster's yarn-site.xml and "
                          "core-site.xml (often /etc/hadoop/conf on a cluster node)", key="HADOOP_CONF_DIR")
    if not (Path(folder) / "yarn-site.xml").is_file():
        name = "HADOOP_CONF_DIR" if env.get("HADOOP_CONF_DIR") else "YARN_CONF_DIR"
        raise ConfigError(f"--master yarn: no yarn-site.xml in {folder} ({name}): point it at the folder with the "
                          "cluster's yarn-site.xml and core-site.xml (often /etc/hadoop/conf on a cluster node)",
                          key=name, value=folder)
    return folder


def is_connect_session(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (``pyspark.sql.connect``), not a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def is_connect_url(master: str | None) -> bool:
    """Whether a ``master`` is a Spark Connect URL (``sc://HOST:PORT``; its details unchecked)."""
    return Master.parse(master, check=False).kind == "connect"


def session_for(master: str | None, workers: int, conf: Mapping[str, Any] | None = None,
                app_name: str = "spark-imagenet", *, warn_oversubscription: bool = True):
    """The SparkSession the command line trains with.

    Args:
        master: a Spark master URL, or ``sc://HOST:PORT`` for a Spark Connect
            session (:func:`connect_session`; also when ``master`` is None and
            ``SPARK_REMOTE`` is set outside spark-submit); None means the master ``spark-submit``
            passed (when this driver was launched by ``spark-submit``, which
            sets ``PYSPARK_GATEWAY_PORT``, or runs on a Databricks cluster,
            which sets ``DATABRICKS_RUNTIME_VERSION``), else ``local[workers]``.
        workers: barrier tasks the job will run (sizes the default
            ``local[N]``).
        conf: extra Spark configuration.
        app_name: application name.
        warn_oversubscription: warn on stderr when the default
            ``local[workers]`` has more workers than this machine has cores
            (:func:`oversubscription_warning`).

    Returns:
        pyspark.sql.SparkSession

    Raises:
        EnvironmentSetupError: pyspark not installed (:func:`require_pyspark`: the
            first check); Java missing or too old (only checked when this process starts the JVM itself).
        ConfigError: a ``master`` given under ``spark-submit`` (whose own
            ``--master`` decides); ``yarn`` without its configuration
            (:func:`yarn_conf_dir`).
    """
    require_pyspark()
    # spark-submit passes its JVM's port; a Databricks cluster's Python (a job's wheel task) runs beside its own
    # session and says so with DATABRICKS_RUNTIME_VERSION: either way, use that session, never a local one.
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ or "DATABRICKS_RUNTIME_VERSION" in os.environ
    if under_submit and master is not None:
        raise ConfigError(f"--master {master} (or master in the job file): under spark-submit the master is "
                          "spark-submit's own option; give it there (spark-submit --master MASTER ...) and leave it "
                          "out of the job, which would otherwise replace it", key="--master", value=master)
    if master is None and not under_submit and os.environ.get("SPARK_REMOTE"):
        master = os.environ["SPARK_REMOTE"]
    if is_connect_url(master):
        return connect_session(master.strip(), app_name, conf)
    if master is None and not under_submit:
        master = f"local[{max(1, int(workers))}]"
        warning = oversubscription_warning(workers, os.cpu_count() or 1) if warn_oversubscription else None
        if warning:
            print(f"spark-imagenet: warning: {warning}", file=sys.stderr, flush=True)
    if master is not None and Master.parse(master, check=False).runs_on_this_host:
        return local_session(master, app_name, conf)
    conf = dict(conf or {})
    if not under_submit:
        yarn_conf_dir(master)
        check_java()
        if Master.parse(master, check=False).kind == "standalone":
            check_standalone_reachable(master)
        conf.update(quiet_logging_conf(conf))
    return _classic_session(master, app_name, conf, start_jvm=not under_submit)
