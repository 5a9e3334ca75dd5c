#!/usr/bin/env python3
"""/ready under load, against an aiohttp hello-world handler measured in the same run.

64 concurrent keep-alive clients (wrk) for 20 s each. Every 200 from /ready is backed by a
systemd read that began after the request arrived (reads are shared between concurrent
requests; the table shows how many were made). Goals (issue 6): >= 2,000 req/s and p99 <= 25 ms.

Run as root: .venv/bin/python bench/ready_load.py [--seconds 20] [--connections 64]
(installs wrk from Debian if it is missing)
"""

from __future__ import annotations

import argparse
import re
import shutil
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
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--connections", type=int, default=64)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        um.install_unit("bench-sim.service", sim_unit(port))
        um.systemctl("start", "bench-sim.service")
        with Genready(um, tmp, {"sim": {"unit": "bench-sim.service", "url": f"http://127.0.0.1:{port}"}},
                      log_level="info") as g:
            wait_for(lambda: g.get("/ready/sim")[0] == 200, 30, "ready")
            reads0 = g.status()["fresh_reads"]
            ready = wrk(f"{g.base}/ready/sim", args.seconds, args.connections)
            reads = g.status()["fresh_reads"] - reads0
        um.systemctl("stop", "bench-sim.service")
    hport = free_port()
    hello = subprocess.Popen([sys.executable, "-c", HELLO, str(hport)])
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{hport}/")[0] == 200, 20, "hello world")
        base = wrk(f"http://127.0.0.1:{hport}/", args.seconds, args.connections)
    finally:
        hello.terminate()
        hello.wait()
    print(f"\n{args.connections} keep-alive clients (wrk -t2), {args.seconds} s each, same machine, same run\n")
    print("| endpoint | req/s | p50 ms | p99 ms | non-2xx | systemd reads |")
    print("|---|---|---|---|---|---|")
    print(f"| genready /ready/sim (fresh read per 200) | {ready['rps']:.0f} | {ready['p50']:.2f} | "
          f"{ready['p99']:.2f} | {ready['non2xx']:.0f} | {reads} ({reads / args.seconds:.0f}/s) |")
    print(f"| aiohttp hello world | {base['rps']:.0f} | {base['p50']:.2f} | {base['p99']:.2f} | "
          f"{base['non2xx']:.0f} | - |")
    print(f"\nratio /ready : hello world = {ready['rps'] / base['rps']:.2f} (throughput); goals: >= 2000 req/s, "
          "p99 <= 25 ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
