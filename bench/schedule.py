#!/usr/bin/env python3
"""A speculation schedule written from a sweep and run in one more load, on the simulator (issue 52).

A real `genready sweep` under a private systemd user manager, watched by a real genready, of `genready simulate`
with its batch model and depth-aware speculative model (`--batch-max-running 64 --spec-alpha 0.75
--spec-draft-cost 0.05 --token-latency 0.02 --batch-token-seconds 0.001`: genready_dev/simbatch.py, where the
best depth moves with load): vLLM's num_speculative_tokens [1, 3, 5] x -c [1, 8, 32, 64], a baseline without
speculation, REPEATS repeats of N requests of TOKENS tokens. Then:

- `genready sweep report --schedule vllm` writes the schedule (sweep/report/schedule.py);
- `genready sweep replay DIR --schedule vllm` (sweep/replay.py) proves it in one more load: the simulator started
  with that schedule in its `--speculative-config` (num_speculative_tokens_per_batch_size, switched per step as
  vLLM does), verified and confirmed by its own report like any start, at the same concurrencies, prompts, seed
  and repeats, into DIR/replay;
- per load, from `sweep report --schedule vllm --format json`'s `replay` (sweep/report/replay.py): the schedule's
  output tok/s over the best static configuration's at that load (the baseline standing as depth 0), with its
  95 % interval over the repeats, and its latency; goal >= 0.97x at every load, a load below 0.90x is flagged as
  a regression (vLLM #49548's shape) and the Decision then deploys the static configuration;
- a second sweep where one depth wins everywhere (`--batch-token-seconds 0`: no per-token cost, so the deepest
  draft always pays) at -c [1, 64]: the report must say no schedule is needed.

Run as root: .venv/bin/python bench/schedule.py [--repeats 2]   (about 10 minutes on a shared 2-core VM)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from genready.sweep.report import decision
from genready_dev.harness import GENREADY, PY, Genready, booted_manager, free_port, wait_for

UNIT = "sweep-sim.service"
T0, S, ALPHA, DRAFT_COST, MAX_RUNNING = 0.02, 0.001, 0.75, 0.05, 64
DEPTHS, LOADS, FLAT_LOADS = [1, 3, 5], [1, 8, 32, 64], [1, 64]
N, TOKENS, SEED = 64, 16, 1
GOAL, REGRESSION = 0.97, 0.90
API = "openai-completions"  # the vLLM profile's generation route


def braces(text: str) -> str:
    """Literal text inside a plan's drop-in template: its braces doubled (`{name}` is a placeholder)."""
    return text.replace("{", "{{").replace("}", "}}")


def execstart(port: int, token_seconds: float, spec: str) -> str:
    # --profile vllm: the start's "non-default args" line is vLLM's report, which the replay's confirm reads
    sim = (f"{PY} -m genready.cli simulate --profile vllm --port {port} --load-seconds 0.5 --token-latency {T0} "
           f"--batch-max-running {MAX_RUNNING} --batch-token-seconds {token_seconds}")
    return f"[Service]\nExecStart=\nExecStart={sim}{spec}\n"


def spec_flags(config: str) -> str:
    """The speculative flags, `config` the --speculative-config JSON as template text (no spaces: systemd splits
    ExecStart= at whitespace outside quotes, and the JSON is single-quoted)."""
    return f" --spec-alpha {ALPHA} --spec-draft-cost {DRAFT_COST} --speculative-config '{config}'"


def plan(path: Path, url: str, port: int, repeats: int, dropin: str, loads: list[int], depths: list[int],
         token_seconds: float) -> None:
    body: dict[str, Any] = {
        "target": "sim", "timeout": 300, "repeats": repeats,
        "command": [PY, "-m", "genready.benchclient", "--url", url, "--api", API, "-n", str(N), "-c", "{c}",
                    "--max-tokens", str(TOKENS), "--seed", str(SEED), "--output", "{out}/bench.jsonl"],
        "dropin": dropin, "matrix": {"num_speculative_tokens": depths, "c": loads},
        "baseline": {"num_speculative_tokens": 0, "dropin": execstart(port, token_seconds, "")}}
    path.write_text(tomli_w.dumps(body))


def sweep(g: Genready, env: dict[str, str], plan_path: Path, results: Path) -> None:
    p = subprocess.run([*GENREADY, "sweep", str(plan_path), "--results", str(results), "--config",
                        str(g.config_path)], env=env, capture_output=True, text=True, timeout=3000)
    if p.returncode != 0:
        raise SystemExit(f"sweep {plan_path.name} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")


def report(results: Path, *flags: str) -> str:
    return subprocess.run([*GENREADY, "sweep", "report", str(results), *flags], capture_output=True, text=True,
                          check=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-schedule-"))
    began = time.monotonic()
    with booted_manager(tmp / "sd") as um:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        um.install_unit(UNIT, "[Unit]\nStartLimitIntervalSec=0\n[Service]\n"
                        f"ExecStart={PY} -m genready.cli simulate --port {port} --load-seconds 0.5\n"
                        # no journald here: vLLM's report (its start's args line) is read from the unit's output
                        f"TimeoutStopSec=10\nStandardError=append:{tmp / 'sim.log'}\n")
        um.systemctl("start", UNIT)
        with Genready(um, tmp, {"sim": {"unit": UNIT, "url": url, "api": API, "backoff_initial": 0.05,
                                        "backoff_max": 0.3}},
                      log_level="info") as g:
            wait_for(lambda: g.get("/ready/sim")[0] == 200, 60, "the first start verified")
            static = tmp / "static"
            plan(tmp / "static.toml", url, port, args.repeats,
                 execstart(port, S, spec_flags(braces('{"num_speculative_tokens":') + "{num_speculative_tokens}"
                                               + braces("}"))), LOADS, DEPTHS, S)
            sweep(g, um.env, tmp / "static.toml", static)
            t_static = time.monotonic() - began
            got = json.loads(report(static, "--schedule", "vllm", "--format", "json"))
            if got["schedule"]["worth_it"]:
                p = subprocess.run([*GENREADY, "sweep", "replay", str(static), "--schedule", "vllm", "--config",
                                    str(g.config_path)], env=um.env, capture_output=True, text=True, timeout=3000)
                if p.returncode not in (0, 1):  # 1: a load regressed, which the table below shows
                    raise SystemExit(f"sweep replay exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
            t_replay = time.monotonic() - began - t_static
            flat = tmp / "flat"
            plan(tmp / "flat.toml", url, port, args.repeats,
                 execstart(port, 0.0, spec_flags(braces('{"num_speculative_tokens":') + "{num_speculative_tokens}"
                                                 + braces("}"))), FLAT_LOADS, DEPTHS, 0.0)
            sweep(g, um.env, tmp / "flat.toml", flat)
        um.systemctl("stop", UNIT)
    took = time.monotonic() - began
    print(f"\nnum_speculative_tokens {DEPTHS} x c {LOADS} on the simulator (--spec-alpha {ALPHA}, --spec-draft-cost "
          f"{DRAFT_COST}, --token-latency {T0}, --batch-token-seconds {S}, --batch-max-running {MAX_RUNNING}; "
          f"{N} requests of {TOKENS} tokens, {args.repeats} repeats): static sweep {t_static:.0f} s, the "
          f"schedule's load {t_replay:.0f} s, {took:.0f} s in all\n")
    text = report(static, "--schedule", "vllm")
    print(text.split("\n\n")[0])  # the Decision, its Deploy line with the replay's verdict
    print(text[text.index("Schedule (vllm)"):])
    got = json.loads(report(static, "--schedule", "vllm", "--format", "json"))
    replayed = got["schedule"].get("replay")
    ok = True
    if not got["schedule"]["worth_it"] or replayed is None:
        print("the static sweep found no schedule worth writing, or it was not replayed")
        ok = False
    else:
        print("| c | best static | its tok/s | the schedule's tok/s | schedule / best static [95 % interval] | "
              "TTFT p50 ms | ITL p50 ms | |\n|---:|---|---:|---:|---|---:|---:|---|")
        for lv in replayed["levels"]:
            r = lv["speedup"]
            if r is None:
                print(f"| {lv['concurrency']} | depth {lv['static']} | - | - | no run | | | FAILED |")
                ok = False
                continue
            mark = "regression" if lv["regression"] else "ok" if r["value"] >= GOAL else "below the goal"
            ok = ok and r["value"] >= GOAL
            ci = "" if r["low"] is None else f" [{r['low']:.3f}-{r['high']:.3f}]"
            static_words = "off" if lv["static"] == 0 else f"depth {lv['static']}"
            print(f"| {lv['concurrency']} | {static_words} | {lv['static_' + decision.TPS]:.1f} | "
                  f"{lv[decision.TPS]:.1f} | {r['value']:.3f}x{ci} | {lv['ttft_p50_ms']:.1f} | "
                  f"{lv['itl_p50_ms']:.2f} | {mark} |")
    flat_text = report(flat, "--schedule", "vllm")
    said = [ln.strip() for ln in flat_text.splitlines() if ln.strip().startswith(("No schedule:", "Deploy:"))]
    print("\none depth best everywhere (--batch-token-seconds 0, c " + str(FLAT_LOADS) + "):\n  " + "\n  ".join(said))
    ok = ok and any(s.startswith("No schedule:") for s in said)
    print(f"\nresults: {static}, {static / 'replay'}, {flat}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
