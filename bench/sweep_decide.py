#!/usr/bin/env python3
"""A sweep that decides, against a simulator that knows the answer (issue 37 §4).

A real `genready sweep` under a private systemd user manager, watched by a real genready, of `genready simulate`
with the speculative model (`--spec-alpha 0.6`, docs/sweeps.md "The simulator knows the truth"): a baseline
without speculation, then SGLang's --speculative-num-steps [1, 3, 8] x --speculative-eagle-topk [1, 2, 8], each
at two client settings (-c 2 and -c 4), 3 repeats, 12 requests of 24 tokens from the built-in categorised
prompts (--seed 1). The simulator's true speedup of each configuration is simtruth.true_range: the model's, with
the bench client's own time per request at that time's median and over its lowest to highest. That time depends on
the request's shape (simtruth's doc) and moves from one load of the server to the next, so it is measured, at each
client setting, in 5 runs against newly started simulators, of three shapes that bound the sweep's: 1-token and
24-token requests to a simulator of the sweep's token latency (the baseline's requests are the latter), and
1-token requests to one whose token takes the sweep's longest verify step.

Printed:
- the report's Decision section (`genready sweep report --format table`, from "Decision" to the first blank
  line after it); without one, the best point by speedup at each client setting, from the JSON report;
- each point's speedup with its 95 % interval, the simulator's true value with its range, and whether the true
  value lies inside the interval, or the point is marked within noise or drifted, or else the interval meets
  the true value's range: the truth is known to that range, wider (+-0.3-0.7 %) than a nearly deterministic
  simulator's intervals often are (+-0.1-0.5 %), so the exit code is 1 unless every interval at least meets it;
- the report's time over 1,000 points (3,000 runs) with a baseline, written here: `--format table` (the one
  with the Decision; goal: under 5 s) and `--format html`.

`--agree RESULTS…` only compares earlier runs' results folders: whether each point's intervals, over repeats,
are honest about what a second sweep of the same plan measures (agreement's doc).

Run as root: .venv/bin/python bench/sweep_decide.py [--repeats 3]   (about 11 minutes on a shared 2-core VM)
             .venv/bin/python bench/sweep_decide.py --agree /tmp/genready-bench-*/results
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
from genready_dev.harness import GENREADY, PY, Genready, Simulator, booted_manager, free_port, wait_for

UNIT = "sweep-sim.service"
T0, ALPHA, TOKENS, N, SEED = 0.016, 0.6, 24, 12, 1
STEPS, TOPK, CLIENTS = [1, 3, 8], [1, 2, 8], [2, 4]
PLAIN = f"--token-latency {T0}"


def flags(steps: int, topk: int) -> str:
    return f"{PLAIN} --spec-alpha {ALPHA} --speculative-num-steps {steps} --speculative-eagle-topk {topk}"


def longest_step() -> float:
    """The sweep's longest verify step, in seconds."""
    return max(T0 * simspec.SpecModel(alpha=ALPHA, steps=s, topk=k).step_factor for s in STEPS for k in TOPK)


def client_overheads(tmp: Path, loads: int = 5) -> dict[int, dict[str, list[float]]]:
    """At each client setting, each shape's seconds per request beyond the decode (the bench client, HTTP, the
    last step's wake-up) in `loads` runs, each against simulators started for it (a sweep's every group is a
    new load, and a load has its own level; the shapes take turns): requests without speculation of 1 and of
    TOKENS steps of T0, and of 1 step as long as the sweep's longest verify step (the module doc)."""
    longest = round(longest_step(), 6)
    shapes = {f"{TOKENS} x {1000 * T0:.0f} ms": (T0, TOKENS), f"1 x {1000 * T0:.0f} ms": (T0, 1),
              f"1 x {1000 * longest:.0f} ms": (longest, 1)}
    got: dict[int, dict[str, list[float]]] = {c: {name: [] for name in shapes} for c in CLIENTS}
    for _ in range(loads):
        with Simulator(tmp, "--token-latency", str(T0)) as short, \
                Simulator(tmp, "--token-latency", str(longest)) as long:
            urls = {T0: short.url, longest: long.url}
            for c in CLIENTS:
                runs = simtruth.client_overheads([simtruth.Shape(urls[latency], latency, tokens)
                                                  for latency, tokens in shapes.values()],
                                                 requests=N, concurrency=c, seed=SEED, runs=1)
                for name, [o] in zip(shapes, runs, strict=True):
                    got[c][name].append(o)
    return got


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


def speedups(results: Path) -> dict[str, dict[str, Any]]:
    """Each point's speedup in a results folder, from the report's JSON."""
    report = subprocess.run([*GENREADY, "sweep", "report", str(results), "--format", "json"], capture_output=True,
                            text=True, check=True).stdout
    return {r["point"]: r["speedup"] for r in json.loads(report)["rows"] if r.get("speedup")}


def agreement(folders: list[Path]) -> str:
    """How well independent sweeps of this plan agree, each pair's speedups at each point: an interval over
    repeats that is honest about them overlaps another sweep's, and two sweeps' values differ by more than
    their intervals' combined half-width (in logs, the half-widths' root sum of squares) about 5 % of the time."""
    runs = [speedups(f) for f in folders]
    pairs = overlap = beyond = 0
    widest = 0.0
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            for point, s in a.items():
                t = b.get(point)
                if t is None or None in (s.get("low"), s.get("high"), t.get("low"), t.get("high")):
                    continue
                d = abs(math.log(s["value"] / t["value"]))
                half = math.hypot(math.log(s["high"] / s["low"]) / 2, math.log(t["high"] / t["low"]) / 2)
                pairs += 1
                overlap += s["low"] <= t["high"] and t["low"] <= s["high"]
                beyond += d > half
                widest = max(widest, d)
    return (f"{len(folders)} sweeps, {pairs} pairs of one point's speedups: the intervals overlap in {overlap}, the "
            f"values differ by more than the intervals' combined half-width in {beyond} "
            f"({100 * beyond / max(1, pairs):.1f} %), by {100 * (math.exp(widest) - 1):.2f} % at most")


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
    ap.add_argument("--agree", type=Path, nargs="+", metavar="RESULTS",
                    help="only compare the results folders of earlier runs (each run says where its folder is)")
    args = ap.parse_args()
    if args.agree:
        print(agreement(args.agree))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-"))
    shapes = client_overheads(tmp)
    overheads = {c: [o for runs in by_shape.values() for o in runs] for c, by_shape in shapes.items()}
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
    rows = speedups(results)
    cats = simtruth.categories(N, SEED)
    print(f"\nsteps {STEPS} x topk {TOPK} x c {CLIENTS} on the simulator (--spec-alpha {ALPHA}, --token-latency "
          f"{T0}, {N} requests of {TOKENS} tokens, {args.repeats} repeats): sweep {sweep_s:.0f} s\nthe client's "
          "own time per request (median, lowest-highest of 5 runs, each a new load), by request shape (steps x "
          "step time):")
    for c, by_shape in shapes.items():
        print(f"  c={c}: " + ", ".join(f"{name} {1000 * statistics.median(o):.1f} ms ({1000 * min(o):.1f}-"
                                       f"{1000 * max(o):.1f})" for name, o in by_shape.items())
              + f"; all {1000 * statistics.median(overheads[c]):.1f} ms")
    print()
    said = decision(table)
    if said is not None:
        print(said)
    else:
        print("Decision (the report has no Decision section: the best point by speedup, from its JSON):")
        for c in CLIENTS:
            best = max((p for p in rows if p.endswith(f" c={c}")), key=lambda p: float(rows[p]["value"]))
            print(f"  c={c}: {best} {interval(rows[best])}")

    def truth(steps: int, topk: int, c: int) -> tuple[float, float, float]:
        return simtruth.true_range(flags(steps, topk), PLAIN, tokens=TOKENS, cats=cats, concurrency=c,
                                   overheads=overheads[c])

    truth_best = {c: max(((s, k) for s in STEPS for k in TOPK), key=lambda sk: truth(sk[0], sk[1], c)[1])
                  for c in CLIENTS}
    print("the simulator's best: " + ", ".join(f"c={c}: steps={s} topk={k}" for c, (s, k) in truth_best.items()))
    print("\n| point | speedup [95 % interval] | true [over the overhead's spread] | measured / true | inside |\n"
          "|---|---|---|---:|---|")
    inside = consistent = 0
    for point, s in rows.items():
        pt = dict(kv.split("=") for kv in point.split())
        low, true, high = truth(int(pt["steps"]), int(pt["topk"]), int(pt["c"]))
        bounded = s.get("low") is not None and s.get("high") is not None
        held = bounded and s["low"] <= true <= s["high"]
        overlaps = bounded and s["low"] <= high and low <= s["high"]
        noisy = bool(s.get("within_noise") or s.get("drifted"))
        mark = "yes" if held else "noisy" if noisy else "the truth's spread" if overlaps else "NO"
        inside += held or noisy
        consistent += held or noisy or overlaps
        print(f"| {point} | {interval(s)}{' ~' if s.get('within_noise') else ''} | {true:.3f}x "
              f"[{low:.3f}-{high:.3f}] | {100 * (s['value'] / true - 1):+.1f} % | {mark} |")
    print(f"\n{inside}/{len(rows)} true speedups inside their interval or marked noisy; {consistent}/{len(rows)} "
          "intervals at least meet the true value's range (over the client's own time per request, lowest to "
          "highest over the three shapes)")
    print(f"\nthis sweep's results: {results} (bench/sweep_decide.py --agree compares runs' folders)")
    took = report_time(tmp)
    print(f"\nreport over 1,000 points (3,000 runs, a baseline at each of 10 concurrencies): --format table "
          f"{took['table']:.2f} s (goal < 5 s), --format html {took['html']:.2f} s")
    return 0 if consistent == len(rows) and took["table"] < 5 else 1


if __name__ == "__main__":
    sys.exit(main())
