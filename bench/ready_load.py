#!/usr/bin/env python3
"""/ready under load, against an aiohttp hello-world handler measured in the same run.

64 concurrent keep-alive clients (wrk -t2). Every 200 from /ready is backed by a systemd read that
began after the request arrived (reads are shared between concurrent requests; the table shows how
many were made). The two servers run side by side and are measured in alternating rounds, so a
busy machine slows both alike; the ratio is taken per round, and its median is the figure.
Goals: >= 2,000 req/s and p99 <= 25 ms; p99 <= 2x hello world's.

Run as root: .venv/bin/python bench/ready_load.py [--rounds 4] [--seconds 5] [--connections 64]
(installs wrk from Debian if it is missing)
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from genready_dev.harness import Genready, booted_manager, free_port, http, sim_unit, wait_for

HELLO = """
import sys
from aiohttp import web
async def hello(request): return web.json_response({"hello": "world"})
app = web.Application(); app.router.add_get("/", hello)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


def wrk(url: str, seconds: int, connections: int) -> dict[str, float]:
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", url],
                         capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert m, out
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    assert rps, out
    return {"rps": float(rps.group(1)), "p50": ms("50"), "p99": ms("99"),
            "non2xx": float(non2xx.group(1)) if non2xx else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    hport = free_port()
    hello = subprocess.Popen([sys.executable, "-c", HELLO, str(hport)])
    rows: list[tuple[dict[str, float], dict[str, float], int]] = []
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{hport}/")[0] == 200, 20, "hello world")
        with booted_manager(tmp / "sd") as um:
            port = free_port()
            um.install_unit("bench-sim.service", sim_unit(port))
            um.systemctl("start", "bench-sim.service")
            with Genready(um, tmp, {"sim": {"unit": "bench-sim.service", "url": f"http://127.0.0.1:{port}"}},
                          log_level="info") as g:
                wait_for(lambda: g.get("/ready/sim")[0] == 200, 30, "ready")
                for _ in range(args.rounds):
                    base = wrk(f"http://127.0.0.1:{hport}/", args.seconds, args.connections)
                    reads0 = g.status()["fresh_reads"]
                    ready = wrk(f"{g.base}/ready/sim", args.seconds, args.connections)
                    rows.append((ready, base, g.status()["fresh_reads"] - reads0))
            um.systemctl("stop", "bench-sim.service")
    finally:
        hello.terminate()
        hello.wait()
    print(f"\n{args.connections} keep-alive clients (wrk -t2), {args.rounds} alternating rounds of "
          f"{args.seconds} s each, same machine\n")
    print("| round | /ready req/s | /ready p50 ms | /ready p99 ms | non-2xx | systemd reads/s "
          "| hello req/s | hello p99 ms | p99 ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for i, (ready, base, reads) in enumerate(rows, 1):
        ratios.append(ready["p99"] / base["p99"])
        print(f"| {i} | {ready['rps']:.0f} | {ready['p50']:.2f} | {ready['p99']:.2f} | {ready['non2xx']:.0f} | "
              f"{reads / args.seconds:.0f} | {base['rps']:.0f} | {base['p99']:.2f} | {ratios[-1]:.2f} |")
    worst = max(r[0]["p99"] for r in rows)
    print(f"\nmedian p99 ratio /ready : hello world = {statistics.median(ratios):.2f} (goal <= 2); "
          f"/ready min req/s {min(r[0]['rps'] for r in rows):.0f} (goal >= 2000), worst p99 {worst:.2f} ms "
          "(goal <= 25)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
