#!/usr/bin/env python3
"""A/A: does a second sweep of the same plan land inside the first's 95 % intervals? (issue 51 §1)

Real `genready sweep`s under a private systemd user manager, watched by a real genready, of `genready simulate`
with the speculative model (`--spec-alpha 0.6`) and load-to-load noise (`--load-noise 0.04`: every start draws
one factor on every step's time, as a real engine's load lands a little faster or slower): a baseline without
speculation, then --speculative-num-steps [1, 3, 8] x --speculative-eagle-topk [1, 4] at -c 1 and -c 2, 3
repeats, 8 requests of 16 tokens, `noise_check = true` (an A/A start of 2 loads of the first configuration)
and the baseline once more after every 3 configurations (`baseline_every = 3`: its rounds are loads of one
configuration too). The same plan is swept `--sweeps` times.

Printed, per ordered pair of sweeps (A, B) and point: whether B's speedup lies inside A's 95 % interval, the
interval as the report gives it (with the spread between loads the sweep measured) and as one load's repeats
give it (noise.ratio without it); the share of such (pair, point)s inside each (goal: >= 90 % with the
between-load part); and each sweep's own estimate of the spread (the report's JSON `decision.noise`).

Also printed, per unordered pair and point: whether the two speedups differ by more than their intervals'
combined half-width (the root sum of squares on the log scale), which intervals honest about a second sweep
allow about 5 % of the time. A 95 % interval for the true speedup holds another sweep's *estimate* less often
than 95 %: that estimate has its own noise (with both intervals' variances known, about 83 %; more with the
few degrees of freedom a between-load part from a handful of loads has).

Run as root: .venv/bin/python bench/aa.py [--sweeps 3]   (about 2.5 minutes a sweep on a shared 2-core VM)
             .venv/bin/python bench/aa.py --agree /tmp/genready-aa-*/s*/results
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from genready.sweep import noise
from genready.sweep.report import collect, decision
from genready_dev.harness import GENREADY, PY, Genready, booted_manager, free_port, wait_for

UNIT = "sweep-sim.service"
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


def sweep(tmp: Path, name: str, doc: dict[str, Any]) -> tuple[Path, float]:
    """One sweep of `doc` (its url placeholder filled) on a fresh manager and genready; its results folder and
    seconds."""
    t0 = time.monotonic()
    (tmp / name).mkdir()
    with booted_manager(tmp / f"sd-{name}") as um:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        sim = f"{PY} -m genready.cli simulate --port {port} --load-seconds 0.3 $SIM_FLAGS"
        um.install_unit(UNIT, f"[Unit]\nStartLimitIntervalSec=0\n[Service]\nEnvironment=SIM_FLAGS=\nExecStart={sim}\n"
                        "TimeoutStopSec=10\n")
        um.systemctl("start", UNIT)
        with Genready(um, tmp / name, {"sim": {"unit": UNIT, "url": url, "backoff_initial": 0.05,
                                               "backoff_max": 0.3}}, log_level="info") as g:
            wait_for(lambda: g.get("/ready/sim")[0] == 200, 60, "the first start verified")
            plan = tmp / f"{name}.toml"
            text = json.dumps(doc).replace("{url}", url)
            plan.write_text(tomli_w.dumps(json.loads(text)))
            results = tmp / name / "results"
            p = subprocess.run([*GENREADY, "sweep", str(plan), "--results", str(results), "--config",
                                str(g.config_path)], env=um.env, capture_output=True, text=True, timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"sweep exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        um.systemctl("stop", UNIT)
    return results, time.monotonic() - t0


def speedups(results: Path) -> dict[str, tuple[noise.Ratio, noise.Ratio | None]]:
    """Per point label: its speedup as the report gives it, and from one load's repeats alone."""
    rows = collect.rows_of([results])
    base_of = decision.baseline_runs(rows)
    out = {}
    for r in rows:
        got, base = r.ratios.get("speedup"), base_of(r)
        if got is not None and base is not None:
            out[r.label] = (got, noise.ratio(r.samples.get(TPS, []), base.samples.get(TPS, [])))
    return out


def inside(value: float, r: noise.Ratio | None) -> bool:
    return r is not None and r.low is not None and r.high is not None and r.low <= value <= r.high


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
    pairs = with_between = without = beyond = beyond_one = 0
    print(f"\n{'A':>2} {'B':>2}  {'point':28} {'B value':>8}  {'A interval (report)':>20} in  "
          f"{'A interval (one load)':>22} in")
    for i, a in enumerate(got):
        for j, b in enumerate(got):
            if i == j:
                continue
            for label, (ra, one) in a.items():
                if label not in b:
                    continue
                v = b[label][0].value
                w, o = inside(v, ra), inside(v, one)
                pairs, with_between, without = pairs + 1, with_between + w, without + o
                if i < j:  # each unordered pair once, with the report's intervals and with one load's
                    beyond += apart(ra, b[label][0])
                    beyond_one += apart(one, b[label][1])
                print(f"{i + 1:>2} {j + 1:>2}  {label:28} {v:8.3f}  [{ra.low or 0:.3f}-{ra.high or 0:.3f}]"
                      f"{'':>5} {'y' if w else 'n'}   "
                      f"[{(one.low or 0) if one else 0:.3f}-{(one.high or 0) if one else 0:.3f}]{'':>7} "
                      f"{'y' if o else 'n'}")
    print(f"\nload noise {LOAD_NOISE:.0%} a start; {len(got)} sweeps, {pairs} (pair, point)s: a second sweep's "
          f"speedup inside the first's 95 % interval in {with_between} ({100 * with_between / max(1, pairs):.1f} %) "
          f"with the between-load part, {without} ({100 * without / max(1, pairs):.1f} %) with one load's repeats "
          "only (goal: >= 90 % with it)")
    print(f"the two sweeps' speedups of a point differ by more than their intervals' combined half-width (root sum "
          f"of squares, log scale) in {beyond} of {pairs // 2} pairs ({100 * beyond / max(1, pairs // 2):.1f} %) with "
          f"the between-load part, {beyond_one} ({100 * beyond_one / max(1, pairs // 2):.1f} %) with one load's "
          "repeats only (about 5 % for intervals honest about a second sweep)")
    for i, e in enumerate(estimates, 1):
        f = e["figures"].get(TPS)
        if f:
            print(f"sweep {i}: output tok/s spread within a load {math.expm1(math.sqrt(f['within'])):.2%}, between "
                  f"loads {math.expm1(math.sqrt(f['between'])):.2%} ({f['loads']} loads: {e['source']})")
    return 0 if with_between >= 0.9 * pairs else 1


if __name__ == "__main__":
    raise SystemExit(main())
