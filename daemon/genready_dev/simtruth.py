"""The true speedup of a simulator configuration over a baseline (issue 37 §4): what a sweep should measure.

Both sides are `genready simulate` flag lists; the speculative model (simspec, `--spec-alpha`) gives each
generation's decode time exactly (simspec.request_seconds). The bench client sends its requests in a known
order (tools/prompts.schedule with --seed) from `concurrency` slots, each taking the next request when its
last one ends: the run's wall time is that list schedule's makespan, and its output tok/s is tokens over it.
So the true speedup at a client setting (tokens, concurrency, the categories in sending order) is the
baseline's makespan over the configuration's. What the model leaves out, and a measurement adds to both sides:
each request's HTTP round trip, the client's own time and the event loop's late wake-up at the request's last
step (asyncio waits in whole milliseconds: selectors.EpollSelector rounds a timeout up to 1 ms), 2 to 4 ms
that pull a measured speedup towards 1. `overhead` adds it to every request; `client_overheads` measures it
from 1-token requests at the same concurrency against a simulator with the same token latency (one step,
so one wake-up: with no token latency there is no wait and the wake-up's cost, about a third of the whole,
is missed). Under the model the simulator streams one event a verify step, so what a request costs beyond
its steps is one step's wake-up and one event's round trip (the earlier events' handling overlaps the next
step's wait). That cost is measured, so the truth is known only as well as it: `true_range` gives the
speedup over the measured overheads' spread, from one side's lowest against the other's highest.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from genready.tools import prompts
from genready_dev import sim, simspec


def model_of(flags: str | Sequence[str]) -> tuple[simspec.SpecModel | None, float]:
    """(the speculative model, --token-latency) of a simulator started with `flags`."""
    argv = shlex.split(flags) if isinstance(flags, str) else list(flags)
    a = sim.parser().parse_args(argv)
    return sim.spec_model(a), a.token_latency


def categories(n: int, seed: int | None) -> list[str]:
    """The categories of the bench client's first `n` built-in prompts with --seed `seed`, in sending order
    (benchrun: schedule's order from random.Random(seed))."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        out += [p.category for p in prompts.schedule(prompts.CATEGORIZED, len(prompts.CATEGORIZED), rng)]
    return out[:n]


def makespan(durations: Sequence[float], concurrency: int) -> float:
    """The wall time of requests of `durations`, sent in order from `concurrency` slots (a list schedule)."""
    slots = [0.0] * max(1, concurrency)
    for d in durations:
        heapq.heapreplace(slots, slots[0] + d)
    return max(slots)


def overhead_of(wall: float, requests: int, concurrency: int, token_latency: float = 0.0) -> float:
    """Seconds per request beyond its decode of a run that took `wall` seconds for `requests` 1-token requests
    to a simulator of `token_latency`."""
    return wall / math.ceil(requests / max(1, concurrency)) - token_latency


def client_overheads(url: str, *, requests: int, concurrency: int, seed: int, token_latency: float,
                     runs: int = 5) -> list[float]:
    """Each of `runs` runs' seconds per request beyond its decode: the bench client's 1-token requests to the
    simulator at `url` (started with --token-latency `token_latency` and no speculation), `requests` of them
    from `concurrency` slots, as a sweep's run sends them (--seed)."""
    with tempfile.TemporaryDirectory(prefix="genready-overhead-") as tmp:
        out = Path(tmp) / "bench.jsonl"
        for _ in range(runs):
            p = subprocess.run([sys.executable, "-m", "genready.benchclient", "--url", url, "-n", str(requests),
                                "-c", str(concurrency), "--max-tokens", "1", "--seed", str(seed), "--output",
                                str(out)], capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"the bench client exited {p.returncode}: {p.stdout}{p.stderr}")
        walls = [json.loads(ln)["wall_seconds"] for ln in out.read_text().splitlines()]
    return [overhead_of(w, requests, concurrency, token_latency) for w in walls]


def run_seconds(flags: str | Sequence[str], tokens: int, cats: Sequence[str | None], concurrency: int,
                overhead: float = 0.0) -> float:
    """The model's wall time of a run of len(cats) requests of `tokens` tokens against a simulator of `flags`,
    each request `overhead` seconds longer."""
    model, t0 = model_of(flags)
    return makespan([simspec.request_seconds(model, c, tokens, t0) + overhead for c in cats], concurrency)


def true_speedup(flags: str | Sequence[str], baseline: str | Sequence[str], *, tokens: int,
                 cats: Sequence[str | None], concurrency: int = 1, overhead: float = 0.0) -> float:
    """Output tok/s of a simulator of `flags` over one of `baseline` at the same client setting: `tokens` per
    request, requests of categories `cats` in sending order, `concurrency` at once, each request `overhead`
    seconds more than its decode (the module doc)."""
    return (run_seconds(baseline, tokens, cats, concurrency, overhead)
            / run_seconds(flags, tokens, cats, concurrency, overhead))


def true_range(flags: str | Sequence[str], baseline: str | Sequence[str], *, tokens: int,
               cats: Sequence[str | None], concurrency: int, overheads: Sequence[float]) -> tuple[float, float, float]:
    """(low, true, high): true_speedup at the median of `overheads`, and its bounds when each side's requests
    take any overhead from the lowest to the highest of them (the module doc)."""
    lo, mid, hi = min(overheads), statistics.median(overheads), max(overheads)

    def ratio(base_overhead: float, overhead: float) -> float:
        return (run_seconds(baseline, tokens, cats, concurrency, base_overhead)
                / run_seconds(flags, tokens, cats, concurrency, overhead))

    return ratio(lo, hi), ratio(mid, mid), ratio(hi, lo)
