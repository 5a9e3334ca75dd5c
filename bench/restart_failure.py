#!/usr/bin/env python3
"""From a failed start to `genready restart`'s exit: how long the CLI takes to give up on a start
that ended before it was verified, when systemd will not start the unit again (Restart=no).

A private user manager runs `genready serve` and a unit whose process prints a line and exits 3
after --fail-after seconds. `genready restart` is run N times; each run's exit time is compared
with the unit's ExecMainExitTimestampMonotonic (when its process exited). Goal: < 1 s (issue 31). Before
client/waiting.py, restart waited out its whole --timeout (1800 s by default) here.

Run as root: .venv/bin/python bench/restart_failure.py [--runs 10] [--fail-after 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from genready_dev.harness import GENREADY, Genready, booted_manager, free_port, pct

FAST = {"backoff_initial": 0.05, "backoff_max": 0.2, "probe_timeout": 2.0, "verify_owner": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--fail-after", type=float, default=0.3, help="seconds the failing process lives")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, booted_manager() as um:
        tmp = Path(d)
        script = tmp / "fail.sh"
        script.write_text(f"#!/bin/sh\necho 'cannot open /models/typo' >&2\nsleep {a.fail_after}\nexit 3\n")
        script.chmod(0o755)
        unit = "bench-fail.service"
        um.install_unit(unit, f"[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart={script}\n"
                              f"StandardError=append:{tmp / 'out'}\n")
        g = Genready(um, tmp, {"q": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", **FAST}})
        with g:
            lags, walls = [], []
            for _ in range(a.runs):
                t0 = time.monotonic()
                r = subprocess.run([*GENREADY, "restart", "q", "--config", str(g.config_path), "--timeout", "60"],
                                   env=um.env, capture_output=True, text=True, timeout=120)
                done = time.monotonic()  # CLOCK_MONOTONIC, as systemd's *TimestampMonotonic
                wall = done - t0
                if r.returncode != 1 or "Result=exit-code" not in r.stderr:
                    raise SystemExit(f"unexpected: exit {r.returncode}: {r.stderr}")
                exited = int(um.show(unit, "ExecMainExitTimestampMonotonic")["ExecMainExitTimestampMonotonic"]) / 1e6
                lags.append(done - exited)
                walls.append(wall)
    print(f"genready restart on a unit whose start fails after {a.fail_after:g}s (Restart=no), {a.runs} runs")
    print(f"failure -> exit 1: p50 {statistics.median(lags) * 1000:.0f} ms, p90 {pct(lags, 90) * 1000:.0f} ms, "
          f"max {max(lags) * 1000:.0f} ms (goal < 1000 ms)")
    print(f"whole command:     p50 {statistics.median(walls) * 1000:.0f} ms, max {max(walls) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
