#!/usr/bin/env python3
"""A/A: does a second sweep of the same plan land inside the first's 95 % intervals? (issue 51 §1)

Real `genready sweep`s under a private systemd user manager, watched by a real genready, of `genready simulate`
with the speculative model (`--spec-alpha 0.6`) and load-to-load noise (`--load-noise 0.04`: every start draws
one factor on every step's time, as a real engine's load lands a little faster or slower): a baseline without
speculation, then --speculative-num-steps [1, 3, 8] x --speculative-eagle-topk [1, 4] at -c 1 and -c 2, 3
repeats, 8 requests of 16 tokens, `noise_check = true` (an A/A start of 2 loads of the first configuration)
and the baseline once more after every 3 configurations (`baseline_every = 3`: its rounds are loads of one
configuration too). The same plan is swept `--sweeps` times.

Printed, per sweep and point: the true speedup and whether the report's 95 % interval holds it. Per ordered pair
of sweeps (A, B) and point: whether B's speedup lies inside A's 95 % interval, as the report gives it (with the
spread between loads the sweep measured), inside A's replication interval, and inside the interval one load's
repeats give (noise.ratio without the spread); the share of such (pair, point)s inside each (goal: >= 90 %
inside the replication interval; the exit code is 1 below it); and each sweep's own estimate of the spread
(the report's JSON `decision.noise`).

Also printed, per unordered pair and point: whether the two speedups differ by more than their intervals'
combined half-width (the root sum of squares on the log scale), which intervals honest about a second sweep
allow about 5 % of the time. A 95 % interval for the true speedup holds another sweep's *estimate* less often
than 95 %: that estimate has its own noise (with both intervals' variances known, about 83 %; more with the
few degrees of freedom a between-load part from a handful of loads has).

So three shares tell whether a low A/A share is intervals too narrow or the nature of the comparison:
- the truth: the share of each sweep's 95 % intervals that hold the simulator's TRUE speedup (simtruth: the
  load factor has mean 1, so the true speedup is the noiseless model's, with the bench client's own time per
  request measured here against a simulator without load noise); an honest 95 % interval holds it ~95 %;
- the A/A share against the confidence interval, and against the report's replication interval (JSON
  `replication`: where a second sweep of the same plan lands, 95 %; the done-when's goal >= 90 % is about it);
- the expected share of each: for each (pair, point), the probability that B's estimate lands inside A's
  interval were both intervals honest, from their own variances and degrees of freedom: the two estimates
  differ by a t of the two variances' Welch-Satterthwaite df, so P = 2 T(h_A / sqrt(v_A + v_B)) - 1 with h_A
  A's half-width on the log scale (noise.log_ratio gives v and df).

Run as root: .venv/bin/python bench/aa.py [--sweeps 3]   (about 2.5 minutes a sweep on a shared 2-core VM)
             .venv/bin/python bench/aa.py --agree /tmp/genready-aa-*/s*/results
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genready.sweep import noise
from genready.sweep.report import collect, decision
from genready_dev import simtruth
from genready_dev.harness import GENREADY, PY, Simulator
from simsweep import sweep

T0, ALPHA, TOKENS, N, SEED, LOAD_NOISE = 0.016, 0.6, 16, 8, 1, 0.04
TPS = decision.TPS


def plan_doc(url: str, **keys: Any) -> dict[str, Any]:
    """The plan both benches sweep: the speculative simulator with load noise; `keys` on top."""
    plain = f"--token-latency {T0} --load-noise {LOAD_NOISE}"
    return {
        "target": "sim", "timeout": 120, "warmup": 2,
        "command": [PY, "-m", "genready.benchclient", "--url", url, "-n", str(N), "-c", "{c}", "--max-tokens",
                    str(TOKENS), "--seed", str(SEED), "--output", "{out}/bench.jsonl"],
        "dropin": f'[Service]\nEnvironment="SIM_FLAGS={plain} --spec-alpha {ALPHA} --speculative-num-steps {{steps}} '
                  '--speculative-eagle-topk {topk}"\n',
        "baseline": {"steps": 0, "topk": 0, "dropin": f'[Service]\nEnvironment="SIM_FLAGS={plain}"\n'},
        "matrix": {"steps": [1, 3, 8], "topk": [1, 4], "c": [1, 2]}, **keys}


@dataclass(frozen=True)
class Point:
    """One point's speedup in one sweep: as the report gives it (with the between-load part), its log-scale
    variance and df (noise.log_ratio), and from one load's repeats alone."""

    report: noise.Ratio
    log: noise.LogRatio | None
    one: noise.Ratio | None


def speedups(results: Path) -> dict[str, Point]:
    """Per point label: its speedup as the report gives it, and from one load's repeats alone."""
    rows = collect.rows_of([results])
    base_of = decision.baseline_runs(rows)
    out = {}
    for r in rows:
        got, base = r.ratios.get("speedup"), base_of(r)
        if got is not None and base is not None:
            a, b = r.samples.get(TPS, []), base.samples.get(TPS, [])
            out[r.label] = Point(got, noise.log_ratio(a, b, r.noise.loads(TPS) if r.noise else None),
                                 noise.ratio(a, b))
    return out


def truths(labels: set[str], tmp: Path) -> dict[str, float]:
    """Per point label (`steps=S topk=K c=C`) the simulator's true speedup: the model's, with the bench client's
    own time per request (its median over 3 runs at each client setting, against a simulator of the sweep's
    token latency without load noise: simtruth's module doc) on both sides."""
    cats = simtruth.categories(N, SEED)
    points = {label: {k: int(v) for k, v in (kv.split("=") for kv in label.split())} for label in labels}
    with Simulator(tmp, "--token-latency", str(T0)) as sim:
        overhead = {c: statistics.median(simtruth.client_overheads(
            [simtruth.Shape(sim.url, T0, TOKENS)], requests=N, concurrency=c, seed=SEED, runs=3)[0])
            for c in sorted({p["c"] for p in points.values()})}
    print("the client's own time per request: " + ", ".join(f"c={c} {1000 * o:.1f} ms" for c, o in overhead.items()))
    return {label: simtruth.true_speedup(
        f"--token-latency {T0} --spec-alpha {ALPHA} --speculative-num-steps {p['steps']} --speculative-eagle-topk "
        f"{p['topk']}", f"--token-latency {T0}", tokens=TOKENS, cats=cats, concurrency=p["c"],
        overhead=overhead[p["c"]]) for label, p in points.items()}


def inside(value: float, r: noise.Ratio | None, replication: bool = False) -> bool:
    if r is None:
        return False
    low, high = (r.rep_low, r.rep_high) if replication else (r.low, r.high)
    return low is not None and high is not None and low <= value <= high


def share(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / max(1, n):.1f} %)"


def mean(xs: list[float]) -> float:
    """The mean share in per cent over the (pair, point)s that have one."""
    return 100 * statistics.fmean([x for x in xs if math.isfinite(x)] or [math.nan])


def expected(a: noise.LogRatio | None, b: noise.LogRatio | None, widen: float = 1.0) -> float:
    """The probability that B's estimate lands inside A's interval (its half-width times `widen`: sqrt 2 for the
    replication interval) were both honest: their difference is t-distributed with scale sqrt(v_A + v_B) at
    the two variances' Welch-Satterthwaite df."""
    if a is None or b is None or a.variance + b.variance <= 0:
        return float("nan")
    half = widen * noise.t_quantile(1 - (1 - noise.LEVEL) / 2, a.df) * math.sqrt(a.variance)
    total = a.variance + b.variance
    df = min(noise.MAX_DF, total * total / (a.variance ** 2 / a.df + b.variance ** 2 / b.df))
    return 2 * noise.t_cdf(half / math.sqrt(total), df) - 1


def apart(a: noise.Ratio | None, b: noise.Ratio | None) -> bool:
    """Two sweeps' ratios differ by more than their intervals' combined half-width (log scale)."""
    if a is None or b is None or None in (a.low, a.high, b.low, b.high):
        return False
    half = math.hypot(math.log((a.high or 1) / (a.low or 1)) / 2, math.log((b.high or 1) / (b.low or 1)) / 2)
    return abs(math.log(a.value / b.value)) > half


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--agree", type=Path, nargs="+", metavar="RESULTS",
                    help="only compare the results folders of earlier runs (each run says where its folder is)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-aa-"))
    doc = plan_doc("{url}", repeats=3, noise_check=True, baseline_every=3)
    got, estimates = [], []
    for i in range(len(args.agree) if args.agree else args.sweeps):
        results, took = (args.agree[i], 0.0) if args.agree else sweep(tmp, f"s{i + 1}", doc)
        got.append(speedups(results))
        report = json.loads(subprocess.run([*GENREADY, "sweep", "report", str(results), "--format", "json"],
                                           capture_output=True, text=True, check=True).stdout)
        estimates.append(report["decision"]["noise"])
        print(f"sweep {i + 1}: {took:.0f} s, {results}; {report['decision']['noise']['note']}", flush=True)
    truth = truths({label for g in got for label in g}, tmp)
    held = held_one = points = 0
    print(f"\n{'sweep':>5}  {'point':28} {'true':>7}  {'interval (report)':>17} in  {'one load':>15} in")
    for i, a in enumerate(got, 1):
        for label, pt in a.items():
            t = truth[label]
            w, o = inside(t, pt.report), inside(t, pt.one)
            points, held, held_one = points + 1, held + w, held_one + o
            print(f"{i:>5}  {label:28} {t:7.3f}  [{pt.report.low or 0:.3f}-{pt.report.high or 0:.3f}] "
                  f"{'y' if w else 'n'}   [{(pt.one.low or 0) if pt.one else 0:.3f}-"
                  f"{(pt.one.high or 0) if pt.one else 0:.3f}] {'y' if o else 'n'}")
    pairs = with_between = with_rep = without = beyond = beyond_one = 0
    expect_ci: list[float] = []
    expect_rep: list[float] = []
    print(f"\n{'A':>2} {'B':>2}  {'point':28} {'B value':>8}  {'A interval (report)':>20} in  "
          f"{'A replication':>15} in  {'A interval (one load)':>22} in  expected CI, replication")
    for i, a in enumerate(got):
        for j, b in enumerate(got):
            if i == j:
                continue
            for label, pa in a.items():
                if label not in b:
                    continue
                pb = b[label]
                v = pb.report.value
                w, r, o = inside(v, pa.report), inside(v, pa.report, replication=True), inside(v, pa.one)
                e_ci, e_rep = expected(pa.log, pb.log), expected(pa.log, pb.log, math.sqrt(2))
                expect_ci.append(e_ci)
                expect_rep.append(e_rep)
                pairs, with_between, with_rep, without = pairs + 1, with_between + w, with_rep + r, without + o
                if i < j:  # each unordered pair once, with the report's intervals and with one load's
                    beyond += apart(pa.report, pb.report)
                    beyond_one += apart(pa.one, pb.one)
                ra = pa.report
                print(f"{i + 1:>2} {j + 1:>2}  {label:28} {v:8.3f}  [{ra.low or 0:.3f}-{ra.high or 0:.3f}]"
                      f"{'':>5} {'y' if w else 'n'}   [{ra.rep_low or 0:.3f}-{ra.rep_high or 0:.3f}] "
                      f"{'y' if r else 'n'}   [{(pa.one.low or 0) if pa.one else 0:.3f}-"
                      f"{(pa.one.high or 0) if pa.one else 0:.3f}]{'':>7} {'y' if o else 'n'}   "
                      f"{e_ci:.3f}, {e_rep:.3f}")
    print(f"\nload noise {LOAD_NOISE:.0%} a start; {len(got)} sweeps, {points} (sweep, point)s, {pairs} ordered "
          "(pair, point)s:")
    print(f"  the TRUE speedup inside the report's 95 % interval: {share(held, points)} (an honest 95 % interval: "
          f"~95 %); inside one load's repeats' interval: {share(held_one, points)}")
    print(f"  a second sweep's speedup inside the first's 95 % confidence interval: {share(with_between, pairs)}; "
          f"expected were the intervals honest (each pair's own widths and df): {mean(expect_ci):.1f} %")
    print(f"  ... inside the first's 95 % replication interval (JSON `replication`): {share(with_rep, pairs)}; "
          f"expected were it honest: {mean(expect_rep):.1f} % (goal: >= 90 %)")
    print(f"  ... inside one load's repeats' interval: {share(without, pairs)}")
    print(f"  the two sweeps' speedups of a point differ by more than their intervals' combined half-width (root "
          f"sum of squares, log scale) in {share(beyond, pairs // 2)} pairs with the between-load part, "
          f"{share(beyond_one, pairs // 2)} with one load's repeats only (about 5 % for intervals honest about a "
          "second sweep)")
    for i, e in enumerate(estimates, 1):
        f = e["figures"].get(TPS)
        if f:
            print(f"sweep {i}: output tok/s spread within a load {math.expm1(math.sqrt(f['within'])):.2%}, between "
                  f"loads {math.expm1(math.sqrt(f['between'])):.2%} ({f['loads']} loads: {e['source']})")
    return 0 if with_rep >= 0.9 * pairs else 1


if __name__ == "__main__":
    raise SystemExit(main())
