#!/usr/bin/env python3
"""A sweep at the speed of its loads: one load per server configuration against one per point.

The simulator loads for 3 s (`--load-seconds 3`) under a private systemd user manager, watched
by a real genready. The plan has 2 server settings (the drop-in) x 3 client settings (the bench
client's concurrency), 6 points. It runs twice, on the same unit: with `--restart-each` (every
point on a fresh start, as every point used to be) and without (one verified start per
server configuration, reused while it stays that very instance and ready). Printed: loads (the
results lines with `restarted: true`), wall time of each sweep, and their ratio.

Run as root: .venv/bin/python bench/sweep_loads.py [--load-seconds 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from genready_dev.harness import GENREADY, PY, Genready, booted_manager, free_port, wait_for

UNIT = "sweep-sim.service"


def sweep(g: Genready, env: dict[str, str], plan: Path, results: Path, *flags: str) -> tuple[float, int, int]:
    """(wall seconds, loads, ok points) of one `genready sweep` run."""
    t0 = time.monotonic()
    p = subprocess.run([*GENREADY, "sweep", str(plan), "--results", str(results), "--config", str(g.config_path),
                        *flags], env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"sweep {' '.join(flags)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    lines = [json.loads(ln) for ln in (results / "results.jsonl").read_text().splitlines()]
    return wall, sum(1 for ln in lines if ln["restarted"]), sum(1 for ln in lines if ln["status"] == "ok")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load-seconds", type=float, default=3.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        um.install_unit(UNIT, f"""[Unit]
StartLimitIntervalSec=0
[Service]
Environment=SIM_FLAGS=
ExecStart={PY} -m genready.cli simulate --port {port} --load-seconds {args.load_seconds} $SIM_FLAGS
TimeoutStopSec=10
""")
        um.systemctl("start", UNIT)
        with Genready(um, tmp, {"sim": {"unit": UNIT, "url": url, "backoff_initial": 0.05, "backoff_max": 0.3}},
                      log_level="info") as g:
            wait_for(lambda: g.get("/ready/sim")[0] == 200, 60, "the first start verified")
            plan = tmp / "plan.toml"
            plan.write_text(tomli_w.dumps({
                "target": "sim", "timeout": 60 + 4 * args.load_seconds,
                "command": [PY, "-m", "genready.benchclient", "--url", url, "--api", "sglang", "-n", "16",
                            "-c", "{concurrency}", "--max-tokens", "16", "--seed", "1", "--output",
                            "{out}/bench.jsonl"],
                "dropin": '[Service]\nEnvironment="SIM_FLAGS=--token-latency {token_latency}"\n',
                "matrix": {"token_latency": [0.001, 0.002], "concurrency": [1, 2, 4]},
            }))
            rows: list[tuple[str, int, int, float]] = []
            for name, flags in (("--restart-each (one load per point)", ("--restart-each",)),
                                ("grouped (one load per server configuration)", ())):
                wall, loads, ok = sweep(g, um.env, plan, tmp / f"results{len(rows)}", *flags)
                rows.append((name, loads, ok, wall))
        um.systemctl("stop", UNIT)
    print(f"\n2 server settings x 3 client settings = 6 points; simulator load {args.load_seconds:g} s\n")
    print("| sweep | loads | ok points | wall s |")
    print("|---|---|---|---|")
    for name, loads, ok, wall in rows:
        print(f"| {name} | {loads} | {ok}/6 | {wall:.1f} |")
    (_, l1, _, w1), (_, l2, _, w2) = rows
    print(f"\nratio restart-each : grouped = {l1 / l2:.1f}x the loads, {w1 / w2:.2f}x the wall time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
