#!/usr/bin/env python3
"""A sweep that decides, against a simulator that knows the answer (issue 37 §4).

A real `genready sweep` under a private systemd user manager, watched by a real genready, of `genready simulate`
with the speculative model (`--spec-alpha 0.6`, docs/sweeps.md "The simulator knows the truth"): a baseline
without speculation, then SGLang's --speculative-num-steps [1, 3, 8] x --speculative-eagle-topk [1, 2, 8], each
at two client settings (-c 2 and -c 4), 3 repeats, 12 requests of 24 tokens from the built-in categorised
prompts (--seed 1). The simulator's true speedup of each configuration is simtruth.true_range: the model's, with
the bench client's own per-request time (5 runs of 1-token requests at each client setting against a simulator of
the same token latency), at that time's median and over its lowest to highest.

Printed:
- the report's Decision section (`genready sweep report --format table`, from "Decision" to the first blank
  line after it); without one, the best point by speedup at each client setting, from the JSON report;
- each point's speedup with its 95 % interval, the simulator's true value with its range, and whether the true
  value lies inside (or the point is marked within noise or drifted), or else the interval meets the range
  (shown, not passed: the exit code is 1 unless every true value lies inside or is marked noisy);
- the report's time over 1,000 points (3,000 runs) with a baseline, written here: `--format table` (the one
  with the Decision; goal: under 5 s) and `--format html`.

Run as root: .venv/bin/python bench/sweep_decide.py [--repeats 3]   (about 8 minutes on a shared 2-core VM)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from genready_dev import simspec, simtruth
from genready_dev.harness import GENREADY, PY, Genready, booted_manager, free_port, wait_for

UNIT = "sweep-sim.service"
T0, ALPHA, TOKENS, N, SEED = 0.016, 0.6, 24, 12, 1
STEPS, TOPK, CLIENTS = [1, 3, 8], [1, 2, 8], [2, 4]
PLAIN = f"--token-latency {T0}"


def flags(steps: int, topk: int) -> str:
    return f"{PLAIN} --spec-alpha {ALPHA} --speculative-num-steps {steps} --speculative-eagle-topk {topk}"


def client_overheads(tmp: Path, c: int) -> list[float]:
    """Each of 5 runs' seconds per request of the bench client, HTTP and the last step's wake-up at concurrency
    `c`: 1-token requests to a simulator of the sweep's token latency, without speculation (simtruth's doc)."""
    port = free_port()
    log = tmp / f"sim-{port}.log"
    with log.open("wb") as f:
        p = subprocess.Popen([PY, "-m", "genready.cli", "simulate", "--port", str(port), "--token-latency", str(T0)],
                             stdout=f, stderr=f, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: " ready" in log.read_text() or p.poll() is not None, 30, "the simulator")
        return simtruth.client_overheads(f"http://127.0.0.1:{port}", requests=N, concurrency=c, seed=SEED,
                                         token_latency=T0)
    finally:
        p.terminate()
        p.wait(10)


def decision(table: str) -> str | None:
    """The report's text from its "Decision" line to the first blank line after it; None without one."""
    lines = table.splitlines()
    start = next((i for i, ln in enumerate(lines) if "Decision" in ln), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def interval(s: dict[str, Any]) -> str:
    low, high = s.get("low"), s.get("high")
    return f"{s['value']:.3f}x" + ("" if low is None or high is None else f" [{low:.3f}-{high:.3f}]")


def write_points(folder: Path, n: int = 1000, repeats: int = 3) -> None:
    """A results folder of `n` points (10 steps x 10 topk x n/100 concurrencies) and a baseline at every
    concurrency, `repeats` runs each, bench lines with per-category figures from the model plus noise."""
    rng = random.Random(37)
    lines: list[str] = []
    clients = list(range(1, n // 100 + 1))

    def run(index: int, point: dict[str, Any], tps: float, accept: float, extra: dict[str, Any]) -> None:
        for r in range(1, repeats + 1):
            out = f"{index:04d}/repeat-{r}/attempt-1"
            (folder / out).mkdir(parents=True)
            got = tps * math.exp(rng.gauss(0, 0.02))
            cats = {c: {"requests": 8, "ok": 8, "output_tokens": 384, "output_tokens_per_second": got * f,
                        "accept_length": accept * f, "accept_length_source": "meta_info.spec_verify_ct",
                        "draft_acceptance": None} for c, f in simspec.CATEGORY_FACTORS.items()}
            (folder / out / "bench.jsonl").write_text(json.dumps({
                "accept_length": accept, "output_tokens_per_second": got, "ttft_p50_ms": 20.0, "ttft_p99_ms": 40.0,
                "itl_p50_ms": 1000 / got, "e2e_p50_ms": 48000 / got, "categories": cats}) + "\n")
            lines.append(json.dumps({"point": point, "index": index, "status": "ok", "attempt": 1, "out": out,
                                     "repeat": r, "noise_limit": 0.1, "client": {"c": point["c"]},
                                     "plan_points": n, **extra}))

    for j, c in enumerate(clients):
        run(n + j + 1, {"steps": 0, "topk": 0, "c": c}, 100.0 * c, 1.0, {"baseline": 1})
    i = 0
    for steps in range(1, 11):
        for topk in range(1, 11):
            m = simspec.SpecModel(alpha=ALPHA, steps=steps, topk=topk)
            for c in clients:
                i += 1
                run(i, {"steps": steps, "topk": topk, "c": c}, 100.0 * c * m.mean_accept() / m.step_factor,
                    m.mean_accept(), {"baseline_round": 1})
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")


def report_time(tmp: Path) -> dict[str, float]:
    folder = tmp / "thousand"
    folder.mkdir()
    write_points(folder)
    took = {}
    for fmt in ("table", "html"):
        t0 = time.perf_counter()
        subprocess.run([*GENREADY, "sweep", "report", str(folder), "--format", fmt, "--output",
                        str(tmp / f"thousand.{fmt}")], check=True)
        took[fmt] = time.perf_counter() - t0
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    overheads = {c: client_overheads(tmp, c) for c in CLIENTS}
    t_sweep = time.monotonic()
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        sim = f"{PY} -m genready.cli simulate --port {port} --load-seconds 0.5 $SIM_FLAGS"
        um.install_unit(UNIT, f"[Unit]\nStartLimitIntervalSec=0\n[Service]\nEnvironment=SIM_FLAGS=\nExecStart={sim}\n"
                        "TimeoutStopSec=10\n")
        um.systemctl("start", UNIT)
        with Genready(um, tmp, {"sim": {"unit": UNIT, "url": url, "backoff_initial": 0.05, "backoff_max": 0.3}},
                      log_level="info") as g:
            wait_for(lambda: g.get("/ready/sim")[0] == 200, 60, "the first start verified")
            plan = tmp / "plan.toml"
            plan.write_text(tomli_w.dumps({
                "target": "sim", "timeout": 120, "repeats": args.repeats,
                "command": [PY, "-m", "genready.benchclient", "--url", url, "-n", str(N), "-c", "{c}", "--max-tokens",
                            str(TOKENS), "--seed", str(SEED), "--output", "{out}/bench.jsonl"],
                "dropin": f'[Service]\nEnvironment="SIM_FLAGS={PLAIN} --spec-alpha {ALPHA} --speculative-num-steps '
                          '{steps} --speculative-eagle-topk {topk}"\n',
                "baseline": {"steps": 0, "topk": 0, "dropin": f'[Service]\nEnvironment="SIM_FLAGS={PLAIN}"\n'},
                "matrix": {"steps": STEPS, "topk": TOPK, "c": CLIENTS},
            }))
            results = tmp / "results"
            p = subprocess.run([*GENREADY, "sweep", str(plan), "--results", str(results), "--config",
                                str(g.config_path)], env=um.env, capture_output=True, text=True, timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"sweep exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        um.systemctl("stop", UNIT)
    sweep_s = time.monotonic() - t_sweep
    table = subprocess.run([*GENREADY, "sweep", "report", str(results)], capture_output=True, text=True,
                           check=True).stdout
    rows = [r for r in json.loads(subprocess.run([*GENREADY, "sweep", "report", str(results), "--format", "json"],
                                                 capture_output=True, text=True, check=True).stdout)["rows"]
            if r.get("speedup")]
    cats = simtruth.categories(N, SEED)
    print(f"\nsteps {STEPS} x topk {TOPK} x c {CLIENTS} on the simulator (--spec-alpha {ALPHA}, --token-latency "
          f"{T0}, {N} requests of {TOKENS} tokens, {args.repeats} repeats): sweep {sweep_s:.0f} s; client overhead "
          "(median, lowest-highest of 5 runs) " + ", ".join(
              f"c={c} {1000 * statistics.median(o):.1f} ms/request ({1000 * min(o):.1f}-{1000 * max(o):.1f})"
              for c, o in overheads.items()) + "\n")
    said = decision(table)
    if said is not None:
        print(said)
    else:
        print("Decision (the report has no Decision section: the best point by speedup, from its JSON):")
        for c in CLIENTS:
            best = max((r for r in rows if r["point"].endswith(f" c={c}")), key=lambda r: r["speedup"]["value"])
            print(f"  c={c}: {best['point']} {interval(best['speedup'])}")

    def truth(steps: int, topk: int, c: int) -> tuple[float, float, float]:
        return simtruth.true_range(flags(steps, topk), PLAIN, tokens=TOKENS, cats=cats, concurrency=c,
                                   overheads=overheads[c])

    truth_best = {c: max(((s, k) for s in STEPS for k in TOPK), key=lambda sk: truth(sk[0], sk[1], c)[1])
                  for c in CLIENTS}
    print("the simulator's best: " + ", ".join(f"c={c}: steps={s} topk={k}" for c, (s, k) in truth_best.items()))
    print("\n| point | speedup [95 % interval] | true [over the overhead's spread] | measured / true | inside |\n"
          "|---|---|---|---:|---|")
    inside = consistent = 0
    for r in rows:
        pt = dict(kv.split("=") for kv in r["point"].split())
        low, true, high = truth(int(pt["steps"]), int(pt["topk"]), int(pt["c"]))
        s = r["speedup"]
        bounded = s.get("low") is not None and s.get("high") is not None
        held = bounded and s["low"] <= true <= s["high"]
        overlaps = bounded and s["low"] <= high and low <= s["high"]
        noisy = bool(s.get("within_noise") or s.get("drifted"))
        mark = "yes" if held else "noisy" if noisy else "the truth's spread" if overlaps else "NO"
        inside += held or noisy
        consistent += held or noisy or overlaps
        print(f"| {r['point']} | {interval(s)}{' ~' if s.get('within_noise') else ''} | {true:.3f}x "
              f"[{low:.3f}-{high:.3f}] | {100 * (s['value'] / true - 1):+.1f} % | {mark} |")
    print(f"\n{inside}/{len(rows)} true speedups inside their interval or marked noisy; {consistent}/{len(rows)} "
          "when the truth's own spread counts (an interval that meets the true value's range over the client "
          "overhead's lowest to highest)")
    took = report_time(tmp)
    print(f"\nreport over 1,000 points (3,000 runs, a baseline at each of 10 concurrencies): --format table "
          f"{took['table']:.2f} s (goal < 5 s), --format html {took['html']:.2f} s")
    return 0 if inside == len(rows) and took["table"] < 5 else 1


if __name__ == "__main__":
    sys.exit(main())
