#!/usr/bin/env python3
"""From a failed start to `genready restart`'s exit: how long the CLI takes to give up on a start
that ended before it was verified, when systemd will not start the unit again (Restart=no).

A private user manager runs `genready serve` and a unit whose process prints a line and exits 3
after --fail-after seconds. `genready restart` is run N times; each run's exit time is compared
with the unit's ExecMainExitTimestampMonotonic (when its process exited). Goal: < 1 s. Before
client/waiting.py, restart waited out its whole --timeout (1800 s by default) here.

Then starts that exit within 0, 1, 10 and 100 ms: for each, whether /status records it whole
(InvocationID, Result, exit status, end, its line) and the time from its exit to its line in /status.

Run as root: .venv/bin/python bench/restart_failure.py [--runs 10] [--fail-after 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from genready_dev.harness import GENREADY, Genready, booted_manager, free_port, pct, wait_for

KEYS = ("InvocationID", "ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")
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
        quick = quick_exits(um, tmp, a.runs)
    print(f"genready restart on a unit whose start fails after {a.fail_after:g}s (Restart=no), {a.runs} runs")
    print(f"failure -> exit 1: p50 {statistics.median(lags) * 1000:.0f} ms, p90 {pct(lags, 90) * 1000:.0f} ms, "
          f"max {max(lags) * 1000:.0f} ms (goal < 1000 ms)")
    print(f"whole command:     p50 {statistics.median(walls) * 1000:.0f} ms, max {max(walls) * 1000:.0f} ms")
    for ms, (whole, seen) in quick.items():
        print(f"a start that exits after {ms:>3} ms: recorded whole {whole}/{a.runs}; exit -> its line in /status "
              f"p50 {statistics.median(seen) * 1000:.0f} ms, max {max(seen) * 1000:.0f} ms")


def quick_exits(um: Any, tmp: Path, runs: int) -> dict[int, tuple[int, list[float]]]:
    """Per lifetime in ms: (starts /status recorded whole, seconds from exit to its line in /status)."""
    out = {}
    for ms in (0, 1, 10, 100):
        unit = f"bench-quick{ms}.service"
        script = tmp / f"quick{ms}.sh"
        pause = f"sleep {ms / 1000:.3f}\n" if ms else ""
        script.write_text(f"#!/bin/sh\necho 'bad path ({ms} ms)' >&2\n{pause}exit 3\n")
        script.chmod(0o755)
        um.install_unit(unit, f"[Unit]\nStartLimitIntervalSec=0\n[Service]\nExecStart={script}\n"
                              f"StandardError=append:{tmp / f'quick{ms}.out'}\n")
        (tmp / f"g{ms}").mkdir()
        g = Genready(um, tmp / f"g{ms}", {"q": {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", **FAST}})
        whole, seen = 0, []
        with g:
            for _ in range(runs):
                before = um.show(unit, "InvocationID")["InvocationID"]
                um.systemctl("start", unit, check=False)
                def over(unit: str = unit, before: str = before) -> dict[str, str] | None:
                    p = um.show(unit, *KEYS)
                    new = p["InvocationID"] not in ("", before)
                    return p if new and int(p[KEYS[2]]) >= int(p[KEYS[1]]) > 0 else None

                p = wait_for(over, 10, "the start over")
                inv, exited = p["InvocationID"], int(p[KEYS[2]]) / 1e6

                def shown(g: Genready = g, inv: str = inv) -> dict[str, Any] | None:
                    t: dict[str, Any] = g.status()["targets"]["q"]
                    f = t["last_failure"]
                    return t if f and f["invocation_id"] == inv and f["journal"] else None

                t = wait_for(shown, 10, f"the {ms} ms start's line in /status", interval=0.005)
                seen.append(time.monotonic() - exited)
                f = t["last_failure"]
                rec = next(r for r in t["records"] if r["invocation_id"] == inv)
                whole += (f["journal"] == [f"bad path ({ms} ms)"] and rec["result"] == "exit-code"
                          and rec["exit_status"] == 3 and bool(rec["ended_at"]) and bool(rec["main_pid"]))
        um.remove_unit(unit)
        out[ms] = (whole, seen)
    return out


if __name__ == "__main__":
    main()
