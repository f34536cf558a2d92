"""Scaling: training images/s of one worker against two, on local[1], local[2] and a 2-host standalone cluster.

Usage (from the repository root)::

    .venv/bin/python benchmarks/scaling.py [--quick] [--reps 5] [--cluster-reps 3] [--json [FILE]]
        [--tree KAGGLE_FOLDER] [--synthetic] [--batch-size 16] [--image-size 72] [--width 0.25] [--epochs 2]
        [--no-cluster]

The same job, ``spark_imagenet.training.driver.launch.train`` on one sharded dataset, run as:

* ``local[1] on 1 core``: one worker, the whole Spark driver (JVM, Python workers, TensorFlow) restricted to one
  CPU (``sched_setaffinity``): the worker sees one CPU and runs TensorFlow with one thread, as a 1-core host.
* ``local[1] on 2 cores``: one worker, two CPUs (TensorFlow with two threads).
* ``local[2] on 2 cores``: two workers (barrier tasks, MultiWorkerMirroredStrategy over gRPC on this machine),
  two CPUs: each worker gets one thread.
* ``2-host cluster``: two workers on the Spark standalone cluster of the tests (``tests/cluster_util.py``: a
  master and two 1-core workers, each in its own network namespace, so TensorFlow's gRPC crosses a bridge), each
  worker's JVM pinned to its own CPU (two 1-core hosts); the driver at the bridge's address, the dataset on this
  disk (``shared_filesystem``). Needs root and ``ip netns``; otherwise the script says why and skips it.
  ``--cluster-cpus shared`` leaves both workers on every CPU instead (as local[2]), to tell the cost of the
  pinning from that of the network.

Weak scaling: the batch is the same per worker (``--batch-size``), so two workers take a global batch twice as
large and half as many steps per epoch. The rate read is the results' ``images_per_sec``, the sum over workers
of each worker's training images/s over the epochs after the first (the worker leaves the first out: tracing,
collective handshakes, pipeline start), so ``--epochs`` must be at least 2. Each repetition is a fresh driver
process (a new JVM), the configurations interleaved (1 core, 2 cores, local[2], cluster, 1 core, ...).

How to read it:

* ``scaling efficiency``: ``rate(2 workers) / (2 x rate(local[1] on 1 core))``; the hardware limit is 1.0
  (two workers on two cores at most double one worker on one core).
* ``local[2] / local[1] on 2 cores``: two 1-thread workers against one 2-thread worker on the same two cores;
  the hardware limit is 1.0 (no more cores): above 1 means one TensorFlow process does not use both cores
  fully, below 1 is what the second worker's all-reduce and its own pipeline cost.

The dataset: ``--tree`` (a Kaggle-layout folder), else ``../shared/data/ilsvrc-mini`` (100 classes, 1200 real
training JPEGs) when present and not ``--quick``, else a generated tree (``tests/data_util.py``
``small_layout``), sharded into 4 train and 2 val shards first. ``--quick``: the generated tree, one
repetition of local[1] and local[2] on 2 cores only, run in one driver process, no cluster.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from common import Report, add_options, repetitions, shared_data  # noqa: E402

#: The line a driver process prints its results on.
RESULT_TAG = "SCALING-RESULT "
#: Seconds the 2-host cluster may take to start (two JVMs pinned to one CPU each, on a busy machine).
CLUSTER_START_S = 300
#: Seconds one driver process may take (a hang is stopped, not waited for).
CHILD_TIMEOUT_S = 900
#: The generated tree (classes, train and val images per class, size), full and --quick.
SYNTHETIC = {"num_classes": 10, "train_per_class": 64, "val_per_class": 4, "size": (96, 72)}
#: --configs: short name -> configuration.
CONFIGS = {"1core": "local[1] on 1 core", "2cores": "local[1] on 2 cores", "local2": "local[2] on 2 cores",
           "cluster": "2-host cluster"}
SYNTHETIC_QUICK = {"num_classes": 4, "train_per_class": 16, "val_per_class": 2, "size": (64, 48)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, default=None, help="a Kaggle-layout folder to shard and train on")
    ap.add_argument("--synthetic", action="store_true", help="a generated tree even when ilsvrc-mini is present")
    ap.add_argument("--batch-size", type=int, default=None, help="per-worker batch (default: 16, --quick 8)")
    ap.add_argument("--image-size", type=int, default=72, help="AlexNet input side (default: %(default)s, >= 67)")
    ap.add_argument("--width", type=float, default=0.25, help="AlexNet width multiplier (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per job, >= 2 (default: %(default)s)")
    ap.add_argument("--cluster-reps", type=int, default=None,
                    help="repetitions on the 2-host cluster (default: --reps)")
    ap.add_argument("--no-cluster", action="store_true", help="leave the 2-host cluster out")
    ap.add_argument("--cluster-cpus", choices=("pinned", "shared"), default="pinned",
                    help="the cluster's worker JVMs each on its own CPU (pinned, default: two 1-core hosts) or "
                         "both on every CPU (shared, as local[2])")
    ap.add_argument("--configs", default=None,
                    help="comma-separated subset of: " + ", ".join(CONFIGS) + " (default: all; --quick: 2cores,local2)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: run jobs in this process
    add_options(ap, quick_reps=1)
    args = ap.parse_args(argv)
    args.batch_size = args.batch_size or (8 if args.quick else 16)
    names = args.configs or ("2cores,local2" if args.quick else ",".join(CONFIGS))
    args.configs = [CONFIGS[c.strip()] for c in names.split(",") if c.strip() in CONFIGS]
    if len(args.configs) != len([c for c in names.split(",") if c.strip()]) or not args.configs:
        ap.error(f"--configs {names!r}: choose from {', '.join(CONFIGS)}")
    if args.no_cluster and "2-host cluster" in args.configs:
        args.configs.remove("2-host cluster")
    if args.epochs < 2:
        ap.error("--epochs must be at least 2: the workers' images/s leave the first epoch out")
    if args.batch_size < 1:
        ap.error("--batch-size must be at least 1")
    if args.tree is not None and not (args.tree / "ILSVRC").is_dir():
        ap.error(f"--tree {args.tree}: not a Kaggle-layout folder (no ILSVRC/ inside); give the folder that holds "
                 "ILSVRC/Data/CLS-LOC and LOC_synset_mapping.txt, or leave --tree out for a generated tree")
    return args


# ------------------------------------------------------------------ the driver process of one repetition
def run_jobs(jobs: list[dict]) -> None:
    """Child side: run ``jobs`` one after the other in this process (one JVM), printing each one's results.

    Each job: ``{"master", "workers", "url", "settings": TrainConfig fields, "conf": Spark conf}``; the
    session is stopped after each (a new master needs a new SparkContext).
    """
    from spark_imagenet.training.driver.launch import train
    from spark_imagenet.training.driver.spark_session import session_for
    from spark_imagenet.training.job.config import TrainConfig

    package = logging.getLogger("spark_imagenet")  # the jobs' lines on stderr, plain (stdout is the JSON)
    package.addHandler(logging.StreamHandler(sys.stderr))
    package.setLevel(logging.INFO)
    package.propagate = False
    for job in jobs:
        spark = session_for(job["master"], job["workers"], job.get("conf") or {}, app_name="scaling-benchmark",
                            warn_oversubscription=False)
        try:
            t0 = time.perf_counter()
            config = TrainConfig.from_mapping({"workers": job["workers"], **job["settings"]}, "benchmarks/scaling.py")
            result = train(spark, job["url"], config)
            summary = {"images_per_sec": result.images_per_sec, "wall_seconds": result.wall_seconds,
                       "call_seconds": time.perf_counter() - t0,
                       "per_worker": [{k: getattr(w, k) for k in ("rank", "host", "images_per_sec", "steps")}
                                      for w in result.per_worker],
                       "steps_per_epoch": result.config["steps_per_epoch"],
                       "global_batch_size": result.config["global_batch_size"]}
            print(RESULT_TAG + json.dumps(summary), flush=True)
        finally:
            spark.stop()


def driver_process(jobs: list[dict], cpus: set[int] | None, env: dict | None = None) -> list[dict]:
    """Run ``jobs`` in a fresh driver process on ``cpus``; returns their summaries.

    Raises:
        RuntimeError: the process failed (its output's tail is in the message) or timed out.
    """
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    child_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    child_env.pop("PYSPARK_GATEWAY_PORT", None)
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(jobs)],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=child_env,
                              preexec_fn=pin, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"a driver process ran past {CHILD_TIMEOUT_S} s; output:\n{str(e.stderr)[-3000:]}") from None
    results = [json.loads(line[len(RESULT_TAG):]) for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if proc.returncode != 0 or len(results) != len(jobs):
        raise RuntimeError(f"the driver process exited {proc.returncode} with {len(results)} of {len(jobs)} "
                           f"results; its output ends:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return results


# ---------------------------------------------------------------------------- the parent: data and jobs
def dataset(args: argparse.Namespace, base: Path) -> tuple[Path, str]:
    """Shard the tree into ``base/shards``; returns (the shards' folder, a description of the data)."""
    from data_util import build, small_layout

    if args.tree is not None:
        tree, what = args.tree.absolute(), f"--tree {args.tree}"
    elif not args.quick and not args.synthetic and shared_data("ilsvrc-mini") is not None:
        tree, what = shared_data("ilsvrc-mini"), "ilsvrc-mini (../shared/data)"
    else:
        layout = SYNTHETIC_QUICK if args.quick else SYNTHETIC
        tree = small_layout(base / "tree", test_images=0, **layout)
        what = (f"generated: {layout['num_classes']} classes x {layout['train_per_class']} train images, "
                f"{layout['size'][0]}x{layout['size'][1]} px")
    manifest = build(tree, base / "shards")
    train_images = manifest.splits["train"].examples
    return base / "shards", f"{what}; {train_images} train images in 4 shards"


def job(url: Path, master: str, workers: int, args: argparse.Namespace, **extra) -> dict:
    """One training job for :func:`run_jobs`."""
    settings = {"epochs": args.epochs, "batch_size": args.batch_size, "image_size": args.image_size,
                "width": args.width, **extra.pop("settings", {})}
    return {"master": master, "workers": workers, "url": str(url), "settings": settings, **extra}


def configurations(args: argparse.Namespace, url: Path) -> dict[str, dict]:
    """The local configurations of ``--configs``: ``{name: {"jobs", "cpus"}}``.

    Raises:
        SystemExit: this process may use fewer than 2 CPUs.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"scaling.py: this process may use {len(cpus)} CPU(s); comparing 1 and 2 workers needs 2")
    one, two = {cpus[0]}, {cpus[0], cpus[1]}
    configs = {"local[1] on 1 core": {"jobs": [job(url, "local[1]", 1, args)], "cpus": one},
               "local[1] on 2 cores": {"jobs": [job(url, "local[1]", 1, args)], "cpus": two},
               "local[2] on 2 cores": {"jobs": [job(url, "local[2]", 2, args)], "cpus": two}}
    return {name: c for name, c in configs.items() if name in args.configs}


def cluster_job(url: Path, master: str, args: argparse.Namespace) -> dict:
    """The job on the 2-host cluster: executors run this interpreter; the dataset is on a disk both "hosts"
    share (they are namespaces of this machine)."""
    conf = {"spark.pyspark.python": sys.executable, "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            "spark.task.cpus": "1", "spark.dynamicAllocation.enabled": "false"}
    return job(url, master, 2, args, conf=conf, settings={"shared_filesystem": True})


def one_rep(name: str, config: dict, rates: dict[str, list[float]], report: Report) -> None:
    """One repetition of configuration ``name``: a driver process; appends its rate(s) to ``rates``."""
    results = driver_process(config["jobs"], config.get("cpus"), config.get("env"))
    for job_name, result in zip(config.get("names", [name]), results):
        rates.setdefault(job_name, []).append(result["images_per_sec"])
        workers = ", ".join(f"rank {w['rank']} on {w['host']} {w['images_per_sec']:.1f}" for w in result["per_worker"])
        report.say(f"scaling: {job_name}: {result['images_per_sec']:.1f} images/s ({workers}; "
                   f"{result['steps_per_epoch']} steps/epoch, global batch {result['global_batch_size']}, "
                   f"job {result['wall_seconds']:.0f} s)")


def measure(args: argparse.Namespace, report: Report, url: Path, reps: int, cluster: str | None,
            cluster_reps: int) -> dict[str, list[float]]:
    """Interleaved repetitions of every configuration (and of the cluster's job when ``cluster`` is its
    master URL); returns the images/s of each by name."""
    configs = configurations(args, url)
    cpu_sets = [c["cpus"] for c in configs.values()]
    if args.quick and cpu_sets and all(c == cpu_sets[0] for c in cpu_sets):  # one driver process, one JVM start
        jobs = [c["jobs"][0] for c in configs.values()]
        configs = {"local": {"jobs": jobs, "cpus": cpu_sets[0], "names": list(configs)}}
    if cluster is not None:
        from cluster_util import DRIVER_ADDRESS

        # PYSPARK_PYTHON: outside spark-submit, PySpark takes the executors' Python from it (not from conf)
        configs["2-host cluster"] = {"jobs": [cluster_job(url, cluster, args)], "cpus": None,
                                     "env": {"SPARK_LOCAL_IP": DRIVER_ADDRESS, "PYSPARK_PYTHON": sys.executable,
                                             "PYSPARK_DRIVER_PYTHON": sys.executable},
                                     "reps": cluster_reps}
    rates: dict[str, list[float]] = {}
    for rep in range(max(reps, cluster_reps if cluster else 0)):
        for name, config in configs.items():
            if rep < config.get("reps", reps):
                one_rep(name, config, rates, report)
    return rates


def record(report: Report, rates: dict[str, list[float]], params: dict) -> None:
    """The records: each configuration's images/s, and the ratios of pairs measured the same number of times."""
    for name, values in rates.items():
        report.add(f"{name}: train images/s", "images/s", values, **params)
    one, two, local2 = (rates.get(k) for k in ("local[1] on 1 core", "local[1] on 2 cores", "local[2] on 2 cores"))
    pairs = [("local[2] on 2 cores", two, "local[2] / local[1] on 2 cores: images/s", 1, "same 2 cores: 1.0")]
    if one:
        pairs += [("local[2] on 2 cores", one, "scaling efficiency local[2] / (2 x local[1] on 1 core)", 2,
                   "2 workers on 2 cores at most double 1 worker on 1 core: 1.0"),
                  ("local[1] on 2 cores", one, "local[1]: 2 cores / 1 core: images/s", 1,
                   "2 cores at most double 1: 2.0")]
    if rates.get("2-host cluster") and one:
        pairs.append(("2-host cluster", one, "scaling efficiency 2-host cluster / (2 x local[1] on 1 core)", 2,
                      "2 one-core hosts at most double 1 worker on 1 core: 1.0"))
    if rates.get("2-host cluster") and local2:
        pairs.append(("2-host cluster", local2, "2-host cluster / local[2] on 2 cores: images/s", 1,
                      "the same 2 cores, gRPC across namespaces: 1.0"))
    for key, base, measurement, factor, limit in pairs:
        top = rates.get(key)
        if top and base:
            n = min(len(top), len(base))
            report.ratio(measurement, top[:n], [factor * b for b in base[:n]], hardware_limit=limit, **params)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        run_jobs(json.loads(args.child))
        return 0
    reps = repetitions(args)
    cluster_reps = args.cluster_reps if args.cluster_reps is not None else reps
    report = Report("scaling", args, extra_versions=("pyspark",))
    with tempfile.TemporaryDirectory(prefix="scaling-bench-") as tmp:
        url, what = dataset(args, Path(tmp))
        params = {"data": what, "batch_size_per_worker": args.batch_size, "image_size": args.image_size,
                  "width": args.width, "epochs": args.epochs, "timed_epochs": args.epochs - 1, "model": "alexnet",
                  "scaling": "weak: the same batch per worker", "cpus": os.cpu_count()}
        report.say(f"scaling: data {what}; AlexNet {args.image_size} px width {args.width:g}, batch "
                   f"{args.batch_size} per worker, {args.epochs} epochs (the first not timed); this machine "
                   f"has {os.cpu_count()} CPU(s): 2 workers on 2 cores at most double 1 worker on 1 core")
        rates = run_all(args, report, url, reps, cluster_reps, Path(tmp))
        record(report, rates, {**params, "reps_cluster": cluster_reps if "2-host cluster" in rates else 0,
                               "cluster_cpus": args.cluster_cpus if "2-host cluster" in rates else None})
    report.close()
    return 0


def run_all(args: argparse.Namespace, report: Report, url: Path, reps: int, cluster_reps: int,
            tmp: Path) -> dict[str, list[float]]:
    """Every configuration, with the 2-host cluster up around them unless --quick, --no-cluster or no
    namespaces here (then the reason is printed)."""
    if args.quick or "2-host cluster" not in args.configs or cluster_reps < 1:
        return measure(args, report, url, reps, None, 0)
    import cluster_util

    why = cluster_util.can_make_namespaces()
    if why:
        report.say(f"scaling: 2-host cluster left out: {why} (it needs root and `ip netns`)")
        return measure(args, report, url, reps, None, 0)
    cpus = sorted(os.sched_getaffinity(0))
    (tmp / "cluster").mkdir()
    pinned = args.cluster_cpus == "pinned"
    try:
        with cluster_util.two_host_cluster(tmp / "cluster", worker_cpus=[{cpus[0]}, {cpus[1]}] if pinned else None,
                                           start_timeout_s=CLUSTER_START_S) as (master, hosts):
            where = f"pinned to CPUs {cpus[0]} and {cpus[1]}" if pinned else "both on every CPU"
            report.say(f"scaling: 2-host cluster {master}, workers {', '.join(hosts)} {where}")
            return measure(args, report, url, reps, master, cluster_reps)
    except cluster_util.ClusterError as e:
        raise SystemExit(f"scaling.py: the 2-host cluster failed: {e}\n(--no-cluster measures without it)") from None


if __name__ == "__main__":
    sys.exit(main())
