#!/usr/bin/env python3
"""The output check against arms that break output on purpose (issue 50 §5): caught, false marks, and what a
speed-only reading would have named best.

Per seed: a baseline simulator (no speculation), two healthy speculative arms (faster, acceptance 2.5 and 3), an
arm whose answers diverge from the baseline's from a token drawn in 2-12 of 40 (`--output-fault diverge:N`,
acceptance 4, faster still) and one whose answers fall into a loop from such a token (`loop:N`, acceptance 6, the
fastest): `genready simulate` processes, each asked by the bench client (`--seed` the seed, 24 requests, 40
tokens, concurrency 2, temperature 0), its request lines compared with the baseline's by the report's own check
(sweep/report/outputs.py, the default max_divergence). Printed: each arm kind's share caught (marked), the
healthy arms' share marked, and how often the fastest arm by output tok/s (a speed-only sweep's best) was a
broken one.

Run: .venv/bin/python bench/lossless.py [--seeds 20]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
from pathlib import Path

from genready.sweep.report import outputs
from genready_dev.harness import PY, Simulator, env_without_notify

MAX_TOKENS = 40
HEALTHY = {"healthy-a": ["--token-latency", "0.003", "--spec-accept", "2.5"],
           "healthy-b": ["--token-latency", "0.0025", "--spec-accept", "3"]}


def run(tmp: Path, name: str, flags: list[str], seed: int) -> tuple[dict[str, outputs.Answer], float]:
    """The arm's answers and output tok/s over one bench run."""
    sim = Simulator(tmp, *flags)
    try:
        out = tmp / f"{name}-{seed}"
        out.mkdir()
        env = {k: v for k, v in env_without_notify().items() if not k.startswith("GENREADY_")}
        r = subprocess.run([PY, "-m", "genready.benchclient", "--url", sim.url, "-n", "24", "-c", "2", "--max-tokens",
                            str(MAX_TOKENS), "--seed", str(seed), "--output", str(out / "bench.jsonl")],
                           env=env, capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise SystemExit(f"{name}: the bench client failed: {r.stderr[-400:]}")
    finally:
        sim.stop()
    got = outputs.read_answers([out])
    assert got is not None
    return got, json.loads((out / "bench.jsonl").read_text())["output_tokens_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    caught = {"diverge": 0, "loop": 0}
    healthy_marked = healthy = speed_only_broken = 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for seed in range(1, args.seeds + 1):
            rng = random.Random(seed)
            arms = {**HEALTHY,
                    "diverge": ["--token-latency", "0.002", "--spec-accept", "4", "--output-fault",
                                f"diverge:{rng.randint(2, 12)}"],
                    "loop": ["--token-latency", "0.0015", "--spec-accept", "6", "--output-fault",
                             f"loop:{rng.randint(2, 12)}"]}
            base, _ = run(tmp, "baseline", ["--token-latency", "0.004"], seed)
            speeds = {}
            for name, flags in arms.items():
                answers, speeds[name] = run(tmp, name, flags, seed)
                check = outputs.check(answers, base, 0.10)
                if name in caught:
                    caught[name] += check.marked
                else:
                    healthy += 1
                    healthy_marked += check.marked
            fastest = max(speeds, key=lambda k: speeds[k])
            speed_only_broken += fastest in caught
            print(f"seed {seed}: fastest {fastest} ({speeds[fastest]:.0f} tok/s); caught so far {caught}, healthy "
                  f"marked {healthy_marked}/{healthy}", flush=True)
    n = args.seeds
    print(f"diverging arms caught: {caught['diverge']}/{n} ({caught['diverge'] / n:.0%}); looping arms caught: "
          f"{caught['loop']}/{n} ({caught['loop'] / n:.0%}); healthy arms marked: {healthy_marked}/{healthy} "
          f"({healthy_marked / max(healthy, 1):.0%}); a speed-only reading named a broken arm best in "
          f"{speed_only_broken}/{n} seeds")


if __name__ == "__main__":
    main()
