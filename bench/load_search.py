#!/usr/bin/env python3
"""The load search against a simulator whose saturation and crossover are known (issue 39 §4).

`genready simulate` with the batch model (`--batch-max-running 8`, a decode step of 20 ms + S per token in the
batch, 20-token answers). With S = 1 ms its true capacity is 8 / (20 x 28 ms) = 14.3 requests/s
(simbatch.capacity). With S = 4 ms and `--spec-accept 2.5` (4 tokens per slot a verify step), speculation stops
paying past a batch of t0 (X - 1) / (s (w - X)) = 5 running
requests (simbatch.crossover_batch). The search's decisions are sweep/search.py's; each step is one
`genready bench` run (a subprocess, as a sweep's command is), its results line read back. Printed:
- saturation mode: the bracket it found against simbatch.capacity, and its runs against the grid of the same
  resolution (the synchronous and throughput runs and every rate between);
- slo mode on the concurrency axis, `itl_p50_ms=42` (a step is 20 + 4 c ms below the cap, so 5 meets it and 6
  does not): the concurrency found, and runs against a grid of every concurrency up to max_concurrency;
- the crossover, as a sweep with a `baseline` finds it (sweep/crossover.py): an slo search on the concurrency
  axis, `e2e_p50_ms=920`, of plain decoding (the baseline) and of speculation (the configuration), each
  stepping at its own concurrencies; crossover.find interpolates each one's output tok/s against concurrency
  (piecewise linear) and takes the first concurrency where speculation's falls below plain's, against
  crossover_batch, and the runs of both searches against a grid of every concurrency up to 16 for both.

Run: .venv/bin/python bench/load_search.py   (about six minutes)
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from genready.sweep import crossover, search
from genready.sweep.search import Axis, Mode, Outcome, SearchSpec
from genready_dev import simbatch
from genready_dev.harness import PY, free_port, wait_for

# 20 tokens: 8 verify steps of exactly X = 2.5, so the speculative run's accept length is X, not 20 / ceil(20 / X)
T0, S, CAP, TOKENS, ACCEPT = 0.020, 0.004, 8, 20, 2.5
S_FLAT = 0.001  # the saturation search's server: a step grows 1.4x at the cap, so TTFT's trend means a queue
TMP = Path(tempfile.mkdtemp(prefix="genready-bench-"))


@contextmanager
def simulator(s: float, *flags: str) -> Iterator[str]:
    port = free_port()
    log = TMP / f"sim-{port}.log"
    with log.open("wb") as f:
        p = subprocess.Popen([PY, "-m", "genready.cli", "simulate", "--port", str(port), "--token-latency", str(T0),
                              "--batch-max-running", str(CAP), "--batch-token-seconds", str(s), *flags],
                             stdout=f, stderr=f, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: " ready" in log.read_text() or p.poll() is not None, 20, "the simulator")
        yield f"http://127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(10)


def bench(url: str, args: list[str]) -> dict[str, Any]:
    out = TMP / "results.jsonl"
    out.unlink(missing_ok=True)
    r = subprocess.run([PY, "-m", "genready.benchclient", "--url", url, "--max-tokens", str(TOKENS), "--seed", "1",
                        "--output", str(out), *args], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"bench {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    line: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    return line


def run_search(url: str, spec: SearchSpec) -> list[Outcome]:
    done: list[Outcome] = []
    while (step := search.next_step(spec, done)) is not None:
        line = bench(url, search.bench_args(spec, step))
        done.append(Outcome.of_line(step, line))
        what = f"{step.rate:.2f}/s" if step.rate is not None else f"c={step.concurrency}"
        print(f"    step {step.index} {step.kind:<11} {what:>9}: {line['requests_per_second']:.2f} req/s, itl p50 "
              f"{line['itl_p50_ms']} ms, saturated {line['saturated']}, slo_met {line['slo_met']}", flush=True)
    return done


def main() -> int:
    flat = simbatch.BatchModel(CAP, T0, S_FLAT)
    spec_model = simbatch.BatchModel(CAP, T0, S, ACCEPT)
    true_cap = simbatch.capacity(flat, TOKENS)
    with simulator(S_FLAT) as url:
        sat = SearchSpec(Mode.SATURATION, steps=8, max_concurrency=32, max_requests_per_step=150, max_step_seconds=8)
        print(f"saturation search, step {T0 * 1000:g} + {S_FLAT * 1000:g} ms x batch (true capacity {true_cap:.2f} "
              "requests/s):")
        done = run_search(url, sat)
        f = search.found(sat, done)
        width = (done[1].achieved_rate - done[0].achieved_rate) / (sat.steps + 1)
        grid = 2 + sat.steps
        print(f"  found: saturation between {f.last_unsaturated:.2f} and {f.first_saturated:.2f} requests/s "
              f"(true {true_cap:.2f}; one step = {width:.2f}); runs {len(done)} against a grid of {grid}")
    with simulator(S) as url:
        slo = SearchSpec(Mode.SLO, Axis.CONCURRENCY, slo="itl_p50_ms=42", max_concurrency=16, max_steps=8,
                         max_requests_per_step=60, max_step_seconds=6)
        true_c = int((0.042 - T0) / S)  # t(c) = t0 + s c <= 42 ms
        print(f"slo search, step {T0 * 1000:g} + {S * 1000:g} ms x batch, concurrency axis, itl_p50_ms=42 "
              f"(true {true_c}):")
        done = run_search(url, slo)
        print(f"  found: max concurrency under the SLO {search.found(slo, done).max_under_slo} (true {true_c}); runs "
              f"{len(done)} against a grid of {slo.max_concurrency}")
    b_true = simbatch.crossover_batch(spec_model) or 0.0
    cross = SearchSpec(Mode.SLO, Axis.CONCURRENCY, slo="e2e_p50_ms=920", max_concurrency=16, max_steps=8,
                       max_requests_per_step=48, max_step_seconds=8)
    with simulator(S) as plain, simulator(S, "--spec-accept", str(ACCEPT)) as spec:
        print(f"crossover: speculation (X = {ACCEPT}, w = {spec_model.width}) against plain decoding, an slo search "
              f"each on the concurrency axis, e2e_p50_ms=920 (true crossover at concurrency {b_true:g}):")
        print("  the baseline (plain decoding):")
        base = run_search(plain, cross)
        print("  the configuration (speculation):")
        conf = run_search(spec, cross)
        for name, done in (("plain", base), ("speculation", conf)):
            print(f"    {name} output tok/s at concurrency: " + ", ".join(
                f"{x:g}: {y:.0f}" for x, y in crossover.curve(cross, done)))
        got = crossover.find(crossover.curve(cross, conf), crossover.curve(cross, base))
        runs = len(base) + len(conf)
        off = f"off by {abs(got.load - b_true) / b_true:.0%}" if got.load is not None else "none found"
        print(f"  found: crossover {got.load if got.load is None else round(got.load, 2)} ({got.status}, piecewise "
              f"linear between each search's steps, over concurrency {got.within}; true {b_true:g}, {off}); runs "
              f"{runs} against a grid of {2 * cross.max_concurrency}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
