#!/usr/bin/env python3
"""The warm-cache bias of a grouped sweep, and its removal by a flush between points.

The simulator keeps a prefix cache (`--prefill-latency 0.002`: 2 ms per prompt word before the first
token, skipped for a prompt it has seen since start or the last flush), under a private systemd user
manager, watched by a real genready. The plan is one server configuration x 3 client settings (the
bench client's concurrency), the same 16 prompts (`--seed 1`) at every point: one load, the later two
points on the first one's instance. It runs with `between_points = "none"` and with `"flush"`.
Printed: each point's TTFT p50, its cache and the server's prefix-cache hit rate, and the bias of the
second point (its TTFT p50 against the first point's, in %).

Run as root: .venv/bin/python bench/sweep_cache.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import tomli_w

from genready_dev.harness import GENREADY, PY, Genready, booted_manager, free_port, wait_for

UNIT = "sweep-cache-sim.service"


def sweep(g: Genready, env: dict[str, str], plan: Path, results: Path) -> list[dict[str, Any]]:
    """The results lines of one `genready sweep`, each with its bench line's TTFT p50."""
    p = subprocess.run([*GENREADY, "sweep", str(plan), "--results", str(results), "--config", str(g.config_path)],
                       env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"sweep exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    lines = [json.loads(ln) for ln in (results / "results.jsonl").read_text().splitlines()]
    for ln in lines:
        ln["ttft"] = json.loads((results / ln["out"] / "bench.jsonl").read_text())["ttft_p50_ms"]
    return lines


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        um.install_unit(UNIT, f"""[Unit]
StartLimitIntervalSec=0
[Service]
ExecStart={PY} -m genready.cli simulate --port {port} --load-seconds 0.5 --prefill-latency 0.002 \
    --token-latency 0.001
TimeoutStopSec=10
""")
        um.systemctl("start", UNIT)
        with Genready(um, tmp, {"sim": {"unit": UNIT, "url": url, "api": "openai-completions",
                                        "backoff_initial": 0.05, "backoff_max": 0.3}}, log_level="info") as g:
            wait_for(lambda: g.get("/ready/sim")[0] == 200, 60, "the first start verified")
            runs = {}
            for between in ("none", "flush"):
                plan = tmp / f"plan-{between}.toml"
                plan.write_text(tomli_w.dumps({
                    "target": "sim", "timeout": 60, "between_points": between,
                    "command": [PY, "-m", "genready.benchclient", "--url", url, "--api", "openai-completions",
                                "-n", "16", "-c", "{concurrency}", "--max-tokens", "4", "--seed", "1", "--output",
                                "{out}/bench.jsonl"],
                    "matrix": {"concurrency": [1, 2, 4]},
                }))
                runs[between] = sweep(g, um.env, plan, tmp / f"results-{between}")
        um.systemctl("stop", UNIT)
    print("\n1 server configuration x 3 client settings, one load; 16 prompts, 2 ms prefill per prompt word\n")
    print("| between_points | point | restarted | cache | prefix-cache hit rate | TTFT p50 ms |")
    print("|---|---|---|---|---|---|")
    for between, lines in runs.items():
        for ln in lines:
            print(f"| {between} | concurrency={ln['point']['concurrency']} | {str(ln['restarted']).lower()} | "
                  f"{ln['cache']} | {ln.get('prefix_cache_hit_rate')} | {ln['ttft']:.1f} |")
    print()
    for between, lines in runs.items():
        bias = 100 * (lines[1]["ttft"] - lines[0]["ttft"]) / lines[0]["ttft"]
        print(f"between_points = {between!r}: the second point's TTFT p50 is {bias:+.0f}% against the first's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
