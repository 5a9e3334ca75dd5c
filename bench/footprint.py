#!/usr/bin/env python3
"""Footprint of `genready serve`: RSS and CPU over a window, idle-ready and while probing.

Phase 1: one target ready and idle (goal: RSS <= 60 MB, CPU <= 0.5 %).
Phase 2: one target loading, binding its port late (a long --load-seconds): genready watches
the port every 0.1 s and probes every backoff_max (2 s).
Phase 3: one target loading, bound early and answering 503 (--bind-early): genready probes
every 0.2 s (goal: CPU <= 1 % while a target loads).
CPU is utime+stime from /proc/PID/stat over the window; RSS is VmRSS at the end (and peak VmHWM).

Run as root: .venv/bin/python bench/footprint.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from genready_dev.harness import Genready, booted_manager, free_port, sim_unit, wait_for

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def mem_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(pid: int, seconds: float) -> tuple[float, float, float]:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)  # the measurement window itself, not synchronisation
    c1, t1 = cpu_seconds(pid), time.monotonic()
    return (c1 - c0) / (t1 - t0) * 100, mem_mb(pid, "VmRSS"), mem_mb(pid, "VmHWM")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    rows = []
    with booted_manager(tmp / "sd") as um:
        phases: list[tuple[str, tuple[str, ...]]] = [
            ("one target ready, idle", ()),
            ("one target loading, bind-late (watching the port)", ("--load-seconds", "3600")),
            ("one target loading, bind-early (503 every probe)", ("--load-seconds", "3600", "--bind-early")),
        ]
        for i, (phase, flags) in enumerate(phases):
            port = free_port()
            unit = "bench-foot.service"
            um.install_unit(unit, sim_unit(port, *flags))
            um.systemctl("restart", unit)
            d = tmp / f"phase{i + 1}"
            d.mkdir()
            with Genready(um, d, {"sim": {"unit": unit, "url": f"http://127.0.0.1:{port}"}}, log_level="info") as g:
                assert g.proc is not None
                want = "ready" if not flags else "loading"
                wait_for(lambda want=want: g.status()["targets"]["sim"]["state"] == want, 30, want)  # type: ignore[misc]
                cpu, rss, hwm = measure(g.proc.pid, args.seconds)
                probes = g.status()["targets"]["sim"]["probes"]
                rows.append((phase, cpu, rss, hwm, probes))
            um.systemctl("stop", unit)
    print(f"\n`genready serve` over {args.seconds:g} s per phase (goals: idle RSS <= 60 MB and CPU <= 0.5 %; "
          "loading CPU <= 1 %)\n")
    print("| phase | CPU % | RSS MB | peak RSS MB | probes so far |")
    print("|---|---|---|---|---|")
    for phase, cpu, rss, hwm, probes in rows:
        print(f"| {phase} | {cpu:.2f} | {rss:.1f} | {hwm:.1f} | {probes} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
