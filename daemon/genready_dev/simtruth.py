"""The true speedup of a simulator configuration over a baseline (issue 37 §4): what a sweep should measure.

Both sides are `genready simulate` flag lists; the speculative model (simspec, `--spec-alpha`) gives each
generation's decode time exactly (simspec.request_seconds). The bench client sends its requests in a known
order (tools/prompts.schedule with --seed) from `concurrency` slots, each taking the next request when its
last one ends: the run's wall time is that list schedule's makespan, and its output tok/s is tokens over it.
So the true speedup at a client setting (tokens, concurrency, the categories in sending order) is the
baseline's makespan over the configuration's. What the model leaves out, and a measurement adds to both sides:
each request's HTTP round trip and the client's own time, a few milliseconds that pull a measured speedup
towards 1. `overhead` adds it to every request; `overhead_of` measures it from 1-token requests at the same
concurrency against a simulator with no token latency: under the model the simulator streams one event a verify
step, so what a request costs beyond its steps is one event's round trip (the earlier events' handling overlaps
the next step's wait).
"""

from __future__ import annotations

import heapq
import math
import random
import shlex
from collections.abc import Sequence

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


def overhead_of(wall: float, requests: int, concurrency: int) -> float:
    """Seconds per request of a run that took `wall` seconds for `requests` requests of no decode time."""
    return wall / math.ceil(requests / max(1, concurrency))


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
