#!/usr/bin/env python3
"""Revocation and detection lag of /ready over repeated restarts of a simulator unit.

revocation lag: `systemctl restart --no-block` issued -> first non-200 from /ready.
detection lag:  the new simulator can generate (polled directly every 5 ms) -> first 200 from /ready.
Goals (issue 3): revocation p99 <= 50 ms; detection p99 <= backoff_max + one generation.

Run as root: .venv/bin/python bench/lag.py [--restarts 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from genready_dev.harness import Genready, booted_manager, free_port, http, show, sim_unit, wait_for
from genready_dev.usermanager import UserManager

BACKOFF_MAX = 2.0


def can_generate(port: int) -> bool:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", method="POST",
                                 data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 1}}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]



def one_restart(um: UserManager, g: Genready, unit: str, port: int) -> tuple[float, float]:
    """(revocation lag, detection lag) in seconds for one `systemctl restart --no-block`."""
    old = wait_for(lambda: g.ready_pid("sim"), 60, "ready")
    first_503: list[float] = []

    def poll() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if http(f"{g.base}/ready/sim")[0] != 200:
                first_503.append(time.perf_counter())
                return

    t = threading.Thread(target=poll)
    t.start()
    t_restart = time.perf_counter()
    um.systemctl("restart", "--no-block", unit)
    t.join(31)
    new = wait_for(lambda: (p := show(um, unit)[0]) not in (0, old) and p, 60, "new pid")
    wait_for(lambda: can_generate(port), 60, "the new simulator generating", interval=0.005)
    t_gen = time.perf_counter()
    wait_for(lambda: g.ready_pid("sim") == new, 60, "ready again", interval=0.002)
    return first_503[0] - t_restart, time.perf_counter() - t_gen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--restarts", type=int, default=20)
    ap.add_argument("--load-seconds", type=float, default=2.0)
    ap.add_argument("--linger-seconds", type=float, default=2.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    revocation: list[float] = []
    detection: list[float] = []
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        unit = "bench-sim.service"
        um.install_unit(unit, sim_unit(port, "--load-seconds", str(args.load_seconds), "--linger-seconds",
                                       str(args.linger_seconds)))
        um.systemctl("start", unit)
        with Genready(um, tmp, {"sim": {"unit": unit, "url": f"http://127.0.0.1:{port}",
                                        "backoff_max": BACKOFF_MAX}}) as g:
            for i in range(args.restarts):
                r, d = one_restart(um, g, unit, port)
                revocation.append(r)
                detection.append(d)
                print(f"restart {i + 1}/{args.restarts}: revocation {revocation[-1] * 1000:.1f} ms, "
                      f"detection {detection[-1] * 1000:.0f} ms", file=sys.stderr)
        um.systemctl("stop", unit)

    def row(name: str, xs: list[float], goal: str) -> str:
        return (f"| {name} | {len(xs)} | {statistics.median(xs) * 1000:.1f} | {pct(xs, 99) * 1000:.1f} | "
                f"{max(xs) * 1000:.1f} | {goal} |")

    print(f"\nRestarts of a simulator unit (--load-seconds {args.load_seconds:g} --linger-seconds "
          f"{args.linger_seconds:g}), backoff_max {BACKOFF_MAX:g} s\n")
    print("| lag | n | p50 ms | p99 ms | max ms | goal |")
    print("|---|---|---|---|---|---|")
    print(row("revocation (restart issued -> /ready non-200)", revocation, "p99 <= 50 ms"))
    print(row("detection (able to generate -> /ready 200)", detection, f"p99 <= {BACKOFF_MAX * 1000:.0f} ms + 1 gen"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
