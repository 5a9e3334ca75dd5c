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
against a simulator without speculation, with requests of a given `Shape` (steps x step time; with no token
latency there is no wait, and the wake-up's cost, about a third of the whole, is missed). The cost depends on the
shape: side by side on a 2-core VM (docs/benchmarks.md), 24 steps of 16 ms cost 0.7-1.3 ms a request more than
one (the earlier events' handling does not all hide in the next step's wait), one step of 158 ms 0.3-1.1 ms more
than one of 16 ms (a vCPU that idled longer wakes later); the same runs a few minutes later move by up to 1 ms.
So the truth is known only as well as the cost over the shapes a sweep sends: `true_range` gives the speedup at
the measured overheads' median and over their spread, from one side's lowest against the other's highest.
"""

from __future__ import annotations

import argparse
import functools
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
from dataclasses import dataclass
from pathlib import Path

from genready.tools import prompts
from genready_dev import sim, simspec


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The simulator's parser, built once: building it takes 50 times as long as a parse, and a test asks for the
    truth of thousands of generated runs."""
    return sim.parser()


def model_of(flags: str | Sequence[str]) -> tuple[simspec.SpecModel | None, float]:
    """(the speculative model, --token-latency) of a simulator started with `flags`."""
    argv = shlex.split(flags) if isinstance(flags, str) else list(flags)
    a = _parser().parse_args(argv)
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


def overhead_of(wall: float, requests: int, concurrency: int, token_latency: float = 0.0, tokens: int = 1) -> float:
    """Seconds per request beyond its decode of a run that took `wall` seconds for `requests` requests of `tokens`
    tokens to a simulator of `token_latency` without speculation."""
    return wall / math.ceil(requests / max(1, concurrency)) - tokens * token_latency


@dataclass(frozen=True)
class Shape:
    """Requests of `tokens` one-token steps to the simulator at `url`, started with --token-latency
    `token_latency` and no speculation."""

    url: str
    token_latency: float
    tokens: int = 1


def client_overheads(shapes: Sequence[Shape], *, requests: int, concurrency: int, seed: int,
                     runs: int = 5) -> list[list[float]]:
    """Per shape, each of `runs` runs' seconds per request beyond its decode: the bench client's `requests`
    requests from `concurrency` slots, as a sweep's run sends them (--seed). The shapes take turns after one
    unmeasured round, so that a simulator's first requests (a sweep warms its server up) and the machine's drift
    over the minute fall on all of them alike."""
    walls: list[list[float]] = [[] for _ in shapes]
    with tempfile.TemporaryDirectory(prefix="genready-overhead-") as tmp:
        for round_ in range(runs + 1):
            for i, shape in enumerate(shapes):
                out = Path(tmp) / f"{i}-{round_}.jsonl"
                p = subprocess.run([sys.executable, "-m", "genready.benchclient", "--url", shape.url, "-n",
                                    str(requests), "-c", str(concurrency), "--max-tokens", str(shape.tokens),
                                    "--seed", str(seed), "--output", str(out)], capture_output=True, text=True,
                                   timeout=120)
                if p.returncode != 0:
                    raise RuntimeError(f"the bench client exited {p.returncode}: {p.stdout}{p.stderr}")
                if round_:
                    walls[i].append(json.loads(out.read_text().splitlines()[-1])["wall_seconds"])
    return [[overhead_of(w, requests, concurrency, shape.token_latency, shape.tokens) for w in ws]
            for shape, ws in zip(shapes, walls, strict=True)]


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
