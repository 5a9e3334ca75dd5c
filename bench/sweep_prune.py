#!/usr/bin/env python3
"""Don't load what cannot start: the loads of a 4 x 3 sweep with and without `prune` (issue 38 §3).

The simulator loads for `--load-seconds` (default 2) under a private systemd user manager, watched by a real
genready. The plan is draft [16, 8, 4, 2] x topk [4, 2, 1] (largest first in the file), 12 server
configurations; every one whose draft x topk exceeds 8 fails at load as an out-of-memory does (`simulate
--fail-load`: a CUDA out-of-memory line, exit 1, after the load time), 6 of the 12. `attempts = 1`. It runs
three times on the same unit: with `prune = ["draft", "topk"]`; with `--no-prune --keep-going` (every
configuration loaded); and with `--no-prune` alone (the stop after `max_failed_starts` = 3 failed starts in a
row). Printed: starts (results lines that restarted the unit: verified or failed), failed starts, skipped
points, ok points, wall time.

Run as root: .venv/bin/python bench/sweep_prune.py [--load-seconds 2]
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

import simsweep
from genready_dev.harness import GENREADY, Genready

LIMIT = 8  # draft x topk above this fails at load


def sweep(g: Genready, env: dict[str, str], plan: Path, results: Path, *flags: str) -> dict[str, float]:
    """What one `genready sweep` run did: its exit status, starts, failed starts, skipped, ok, wall seconds."""
    t0 = time.monotonic()
    p = subprocess.run([*GENREADY, "sweep", str(plan), "--results", str(results), "--config", str(g.config_path),
                        *flags], env=env, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    if p.returncode not in (0, 1):
        raise SystemExit(f"sweep {' '.join(flags)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    lines = [json.loads(ln) for ln in (results / "results.jsonl").read_text().splitlines()]
    failed = sum(1 for ln in lines if ln["status"] == "not_ready")
    return {"rc": p.returncode, "starts": sum(1 for ln in lines if ln["restarted"] and ln["status"] != "skipped"),
            "failed": failed, "skipped": sum(1 for ln in lines if ln["status"] == "skipped"),
            "ok": sum(1 for ln in lines if ln["status"] == "ok"), "wall": wall,
            "stopped": "starts in a row ended before they were verified" in p.stderr}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load-seconds", type=float, default=2.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    with simsweep.sim_target(tmp, args.load_seconds) as (um, g, _, port):
        sim = simsweep.simulate(port, args.load_seconds)
        plan = tmp / "plan.toml"
        # `$$` is systemd's `$`: the shell computes the size and adds --fail-load above LIMIT.
        plan.write_text(tomli_w.dumps({
            "target": "sim", "timeout": 60 + 4 * args.load_seconds, "attempts": 1,
            "command": ["/bin/true"],
            "dropin": "[Service]\nExecStart=\nExecStart=/bin/sh -c 'size=$$(({draft} * {topk})); "
                      f"[ $$size -gt {LIMIT} ] && f=--fail-load=size-$$size; exec {sim} "
                      "--model m-{draft}-{topk} $$f'\n",
            "prune": ["draft", "topk"],
            "matrix": {"draft": [16, 8, 4, 2], "topk": [4, 2, 1]},
        }))
        rows: list[tuple[str, dict[str, float]]] = []
        for name, flags in (("prune = [\"draft\", \"topk\"]", ()),
                            ("--no-prune --keep-going", ("--no-prune", "--keep-going")),
                            ("--no-prune (max_failed_starts = 3)", ("--no-prune",))):
            rows.append((name, sweep(g, um.env, plan, tmp / f"results{len(rows)}", *flags)))
    print(f"\ndraft [16, 8, 4, 2] x topk [4, 2, 1] = 12 configurations; draft x topk > {LIMIT} fails at load "
          f"(6 of 12); simulator load {args.load_seconds:g} s; attempts = 1\n")
    print("| sweep | starts | failed starts | skipped | ok | exit | wall s |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['starts']:.0f} | {r['failed']:.0f} | {r['skipped']:.0f} | {r['ok']:.0f}/12 | "
              f"{r['rc']:.0f}{' (stopped)' if r['stopped'] else ''} | {r['wall']:.1f} |")
    pruned, full = rows[0][1], rows[1][1]
    print(f"\nprune: {full['starts'] - pruned['starts']:.0f} of {full['starts']:.0f} loads saved "
          f"({full['failed'] - pruned['failed']:.0f} fewer failed starts), the same {pruned['ok']:.0f} points ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
