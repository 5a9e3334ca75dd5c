#!/usr/bin/env python3
"""The bench client's own CPU per request/s (issue 39 §5), so a reader knows the client is not the bottleneck.

One `genready simulate` process (its own CPU is not counted) answers every request after `--token-latency`
per token, with no cap, so the server keeps up with any rate. The bench client runs in this process
(benchclient.run, as `genready bench` runs it) at open-loop Poisson rates for a fixed number of requests
each, and `time.process_time()` around each run counts the client's CPU alone: its scheduler, its HTTP,
its stream parsing and its figures. Printed per rate: achieved requests/s, the client's CPU in cores,
CPU milliseconds per request, its lateness against the arrival schedule (p50/p99 of sent - due), and the
rate at which the client alone would fill one core (1 / CPU per request).

Run: .venv/bin/python bench/bench_client_cpu.py [--rates 25,50,100,200] [--requests 400] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from genready.tools import benchclient
from genready.tools.prompts import Prompt
from genready_dev.harness import PY, free_port, wait_for


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


async def one_rate(url: str, rate: float, n: int, max_tokens: int) -> tuple[float, float, float, list[float]]:
    """(wall seconds, client CPU seconds, ok requests, lateness of each send in seconds) of one run."""
    server = benchclient.ServerOptions(url, "sglang")
    load = benchclient.LoadOptions(n, n, max_tokens, 30, [Prompt(text="hi")], request_rate=rate, seed=1)
    cpu0, t0 = time.process_time(), time.monotonic()
    summary = await benchclient.run(server, load, benchclient.Progress(n, io.StringIO()))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    late = [o.sent - o.arrival for o in summary.outcomes if o.arrival is not None]
    return wall, cpu, summary.ok, late


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="25,50,100,200", help="requests/s, comma-separated")
    ap.add_argument("--requests", type=int, default=400, help="requests per rate")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per answer, streamed")
    ap.add_argument("--token-latency", type=float, default=0.005, help="the simulator's seconds per token")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="genready-bench-")) / "sim.log"
    with log.open("wb") as f:
        sim = subprocess.Popen([PY, "-m", "genready.cli", "simulate", "--port", str(port), "--token-latency",
                                str(args.token_latency)], stdout=f, stderr=f, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: " ready" in log.read_text() or sim.poll() is not None, 20, "the simulator")
        url = f"http://127.0.0.1:{port}"
        asyncio.run(one_rate(url, 20, 20, args.max_tokens))  # warm: imports, the first connections
        print(f"bench client CPU against `genready simulate` ({args.requests} requests per rate, {args.max_tokens} "
              f"streamed tokens each, Poisson arrivals)")
        print(f"{'offered/s':>10} {'achieved/s':>11} {'cpu cores':>10} {'cpu ms/req':>11} {'late p50 ms':>12} "
              f"{'late p99 ms':>12} {'1-core limit/s':>15}")
        per_request: list[float] = []
        for rate in rates:
            wall, cpu, ok, late = asyncio.run(one_rate(url, rate, args.requests, args.max_tokens))
            per = cpu / max(1, ok)
            per_request.append(per)
            print(f"{rate:>10.0f} {ok / wall:>11.1f} {cpu / wall:>10.3f} {per * 1000:>11.2f} "
                  f"{percentile(late, 50) * 1000:>12.2f} {percentile(late, 99) * 1000:>12.2f} {1 / per:>15.0f}")
        print(f"median client CPU per request: {statistics.median(per_request) * 1000:.2f} ms, so one core "
              f"drives about {1 / statistics.median(per_request):.0f} requests/s of {args.max_tokens} streamed tokens "
              f"({statistics.median(per_request):.4f} cores per request/s)")
    finally:
        sim.terminate()
        sim.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
