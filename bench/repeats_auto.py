#!/usr/bin/env python3
"""`repeats = "auto"` against a fixed `repeats = 5`: the same Decision with fewer runs? (issue 51 §2)

Real `genready sweep`s under a private systemd user manager, watched by a real genready, of `genready simulate`
with the speculative model at two acceptance rates (`--spec-alpha` 0.6 and 0.3: two plans) and load-to-load noise
(`--load-noise 0.04`, each configuration's start drawn from a seed of its own, `--load-noise-seed`, so both sweeps
of a plan meet the same load levels and differ only in their repeats): a baseline without speculation, then
--speculative-num-steps [1, 3, 8] x --speculative-eagle-topk [1, 4] at -c 1 and -c 2, 4 requests of 16 tokens.
Each plan is swept twice: `repeats = 5`, and `repeats = "auto"` (max_repeats 8).

Printed per plan and client setting: each sweep's Decision (the answer, the best configuration and its speedup,
those within noise of it) and whether they agree (the same answer, and the same best or each one's best within
noise of the other's); then the runs each used (every ok results line: the baseline's too), auto's share of
fixed's (goal: <= 60 %), and why auto's points stopped (their last line's `repeats_auto.stop`).

Run as root: .venv/bin/python bench/repeats_auto.py   (about 6 minutes on a shared 2-core VM)
"""

from __future__ import annotations

import collections
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from genready_dev.harness import GENREADY, PY
from simsweep import sweep

T0, TOKENS, N, SEED, LOAD_NOISE = 0.016, 16, 4, 1, 0.04
STEPS, TOPK, CLIENTS = [1, 3, 8], [1, 4], [1, 2]


def plan_doc(url: str, alpha: float, **keys: Any) -> dict[str, Any]:
    """The speculative simulator with load noise, each configuration's start drawn from its own seed."""
    plain = f"--token-latency {T0} --load-noise {LOAD_NOISE}"
    return {
        "target": "sim", "timeout": 120, "warmup": 2,
        "command": [PY, "-m", "genready.benchclient", "--url", url, "-n", str(N), "-c", "{c}", "--max-tokens",
                    str(TOKENS), "--seed", str(SEED), "--output", "{out}/bench.jsonl"],
        "dropin": f'[Service]\nEnvironment="SIM_FLAGS={plain} --load-noise-seed {{seed}} --spec-alpha {alpha} '
                  '--speculative-num-steps {steps} --speculative-eagle-topk {topk}"\n',
        "baseline": {"steps": 0, "topk": 0, "seed": 0,
                     "dropin": f'[Service]\nEnvironment="SIM_FLAGS={plain} --load-noise-seed 7"\n'},
        "points": [{"steps": s, "topk": k, "seed": 10 * s + k, "c": c} for s in STEPS for k in TOPK for c in CLIENTS],
        **keys}


def decisions(results: Path) -> dict[str, dict[str, Any]]:
    """Per client setting (its words): the report's answer, best configuration, its speedup, those within noise."""
    got = json.loads(subprocess.run([*GENREADY, "sweep", "report", str(results), "--format", "json"],
                                    capture_output=True, text=True, check=True).stdout)["decision"]
    out = {}
    for s in got["settings"]:
        best = s["best"] or {}
        out[json.dumps(s["client"])] = {"answer": s["answer"], "best": best.get("configuration"),
                                        "speedup": (best.get("speedup") or {}).get("value"),
                                        "near": [n["configuration"] for n in s["within_noise"]]}
    return out


def runs_and_stops(results: Path) -> tuple[int, collections.Counter[str]]:
    lines = [json.loads(ln) for ln in (results / "results.jsonl").read_text().splitlines()]
    last: dict[int, dict[str, Any]] = {}
    for ln in lines:
        last[ln["index"]] = ln
    stops = collections.Counter(str((ln.get("repeats_auto") or {}).get("stop")) for ln in last.values()
                                if "repeats_auto" in ln)
    return sum(1 for ln in lines if ln["status"] == "ok"), stops


def agree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    same_best = a["best"] == b["best"] or (a["best"] in b["near"] and b["best"] in a["near"])
    return a["answer"] == b["answer"] and same_best


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="genready-auto-"))
    total = {"fixed": 0, "auto": 0}
    agreed = settings = 0
    for alpha in (0.6, 0.3):
        got = {}
        for how, keys in (("fixed", {"repeats": 5}), ("auto", {"repeats": "auto", "max_repeats": 8})):
            results, took = sweep(tmp, f"{how}-{alpha}", plan_doc("{url}", alpha, **keys))
            runs, stops = runs_and_stops(results)
            total[how] += runs
            got[how] = decisions(results)
            print(f"alpha {alpha} {how}: {runs} runs, {took:.0f} s, {results}"
                  + (f"; points stopped: {dict(stops)}" if stops else ""), flush=True)
        for client, fixed in got["fixed"].items():
            auto = got["auto"].get(client, {})
            ok = bool(auto) and agree(fixed, auto)
            settings, agreed = settings + 1, agreed + ok
            for how, d in (("fixed", fixed), ("auto", auto)):
                print(f"  {client} {how:5}: {d.get('answer')}, best {d.get('best')} at {d.get('speedup') or 0:.3f}x, "
                      f"within noise: {d.get('near')}")
            print(f"  -> {'the same Decision' if ok else 'DIFFERENT'}")
    share = total["auto"] / max(1, total["fixed"])
    print(f"\nruns: fixed 5 {total['fixed']}, auto {total['auto']} ({100 * share:.0f} % of fixed; goal <= 60 %); "
          f"the same Decision at {agreed} of {settings} client settings")
    return 0 if share <= 0.6 and agreed == settings else 1


if __name__ == "__main__":
    raise SystemExit(main())
