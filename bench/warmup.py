#!/usr/bin/env python3
"""The bias a fixed warmup leaves on a cold server, against `warmup = "stable"` (issue 38 §1).

The simulator's cold profile (`--cold-requests N --cold-factor 1.73`: a fresh process's k-th
generation is 1 + 0.73·e^(−3k/N) times slower, SGLang issue #28706's 6,350 ms against 3,661 ms)
is started afresh for each warmup. Each trial is what a sweep does on a fresh start: the daemon's
probe (one generation), the warmup (servercache.warm_up for a number, warm_until_stable for
"stable": the sweep's own functions), then the run: RUN streamed requests, one at a time, whose
median TTFT and ITL are the measured figures. Then the same process is sent requests until it is
past its N cold ones, and the same run again is the converged truth. Printed per warmup: its
requests, whether it converged, and the run's bias (measured / truth − 1); then, on a process warm from the
start, what the rule costs where there is no trend to see.

No root, no systemd: the simulator runs as a child process.
Run: .venv/bin/python bench/warmup.py [--cold-requests 75] [--token-latency 0.02] [--trials 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
from pathlib import Path

from genready import apis, config
from genready.config import TargetConfig
from genready.tools import benchrun, convergence, servercache
from genready_dev.harness import PY, free_port, stop_process, wait_for

MAX_TOKENS = 8
RUN = 16


def start_sim(tmp: Path, cold: int, token_latency: float) -> tuple[subprocess.Popen[bytes], TargetConfig]:
    port = free_port()
    log = tmp / f"sim-{port}.log"
    with log.open("wb") as f:
        proc = subprocess.Popen([PY, "-m", "genready.cli", "simulate", "--port", str(port), "--warmup-seconds", "0",
                                 "--token-latency", str(token_latency), "--cold-requests", str(cold)],
                                stdout=f, stderr=f, stdin=subprocess.DEVNULL)
    wait_for(lambda: " ready" in log.read_text() or proc.poll() is not None, 30, "the simulator")
    target = config.parse({"targets": {"t": {"unit": "x.service", "url": f"http://127.0.0.1:{port}",
                                             "api": "openai-completions", "max_tokens": MAX_TOKENS}}},
                          service=False).targets["t"]
    return proc, target


def run(http: servercache.ServerHttp, n: int) -> tuple[float, float]:
    """(median TTFT, median ITL) in ms of `n` streamed requests, one at a time (as the bench client's)."""
    t = http.t
    api = apis.APIS[t.api]

    async def main() -> tuple[float, float]:
        async with http.session() as session:
            body = apis.stream_body(api, prompt=t.prompt, max_tokens=MAX_TOKENS, model="sim-model")
            outs = [await benchrun.one_stream(session, http.base, api, body, 30.0) for _ in range(n)]
        assert all(o.ok and o.ttft is not None for o in outs), [o.error for o in outs if not o.ok]
        return (1000 * statistics.median(o.ttft for o in outs if o.ttft is not None),
                1000 * statistics.median(g for o in outs for g in o.itl))
    return asyncio.run(main())


def trial(tmp: Path, warmup: int | convergence.Rule, cold: int, token_latency: float
          ) -> tuple[int, bool | None, float, float]:
    """(warmup requests, converged, TTFT bias, ITL bias) of one fresh start."""
    proc, target = start_sim(tmp, cold, token_latency)
    try:
        http = servercache.ServerHttp(target)
        ok, why = servercache.warm_up(http, 1)  # the daemon's probe, which verified the start
        assert ok == 1, why
        if isinstance(warmup, int):
            if warmup:
                servercache.warm_up(http, warmup)
            sent, converged = warmup, None
        else:
            v, _ = servercache.warm_until_stable(http, warmup)
            sent, converged = v.requests, v.converged
        ttft, itl = run(http, RUN)
        servercache.warm_up(http, max(0, cold - 1 - sent - RUN))  # past the cold ones
        true_ttft, true_itl = run(http, RUN)
        return sent, converged, ttft / true_ttft - 1, itl / true_itl - 1
    finally:
        stop_process(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cold-requests", type=int, default=75, help="the simulator's N (SGLang: 50 to 100)")
    ap.add_argument("--token-latency", type=float, default=0.02, help="seconds per token of a warm process")
    ap.add_argument("--trials", type=int, default=3, help="fresh starts per warmup (the median is printed)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="genready-bench-warmup-"))
    warmups: list[tuple[str, int | convergence.Rule]] = [
        ("warmup = 0", 0), ("warmup = 2 (the old default)", 2),
        ('"stable", neighbouring windows alone (the rule before issue 51)', convergence.Rule(trend_windows=1)),
        ('"stable" (window 8, 10 %, max 96, a trend over 3 windows: the defaults)', convergence.Rule()),
        ('"stable", warmup_window = 16', convergence.Rule(window=16)),
        ('"stable", warmup_tolerance = 0.05', convergence.Rule(tolerance=0.05)),
    ]
    print(f"cold simulator: first {args.cold_requests} generations slower, the first by 1.73x; token latency "
          f"{1000 * args.token_latency:g} ms, {MAX_TOKENS} tokens a request; run = {RUN} requests at concurrency 1; "
          f"median of {args.trials} fresh starts\n")
    print("| warmup | warmup requests | converged | TTFT bias | ITL bias |")
    print("|---|---|---|---|---|")
    for name, w in warmups:
        got = [trial(tmp, w, args.cold_requests, args.token_latency) for _ in range(args.trials)]
        conv = {c for _, c, _, _ in got}
        conv_text = "-" if conv == {None} else f"{sum(1 for _, c, _, _ in got if c)}/{len(got)}"
        print(f"| {name} | {statistics.median(s for s, _, _, _ in got):g} | {conv_text} | "
              f"{100 * statistics.median(b for _, _, b, _ in got):+.1f} % | "
              f"{100 * statistics.median(b for _, _, _, b in got):+.1f} % |", flush=True)
    # What the trend costs where there is none to see: a process warm from the start (its one cold generation is
    # the daemon's probe), the requests each rule sends before it agrees.
    print("\nan engine warm from the start (--cold-requests 1): warmup requests, median of the trials\n")
    print("| warmup | warmup requests | converged |")
    print("|---|---|---|")
    for name, w in warmups[2:4]:
        got = [trial(tmp, w, 1, args.token_latency) for _ in range(args.trials)]
        print(f"| {name} | {statistics.median(s for s, _, _, _ in got):g} | "
              f"{sum(1 for _, c, _, _ in got if c)}/{len(got)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
