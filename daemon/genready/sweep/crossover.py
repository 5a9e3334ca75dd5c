"""Where a configuration's speedup over the baseline falls below 1 along a load search (issue 39 §2).

Pure: `curve(spec, done)` is a search's output tok/s against offered load, `find(config, base)` the crossover of
two such curves. The two searches step at loads of their own, so each curve is taken as piecewise linear between
its steps (a model: nothing is measured between two steps) and the crossover is the first load, in the range both
searched, where the configuration's interpolated tok/s falls below the baseline's by more than the plan's
noise_limit. That margin is linear between the union of both curves' loads, so the crossing within a segment is
exact for the two interpolants.

The offered load is on the search's axis: requests/s (a rate step's offered rate; a closed loop, the synchronous
and throughput runs, offers what it achieves), or with `mode = "slo"` and `axis = "concurrency"` the requests in
flight. On the rate axis, below both saturation points, both configurations serve what is offered, so the speedup
there is 1 up to noise: the crossover then mostly marks where the configuration stops keeping up.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from genready.compat import StrEnum
from genready.sweep.search import Axis, Mode, Outcome, SearchSpec

Curve = tuple[tuple[float, float], ...]  # (offered load, output tok/s), ascending by load, one per load


class Status(StrEnum):
    INTERPOLATED = "interpolated"  # the speedup fell below 1 between two loads: `crossover` is that load
    PAYS_THROUGHOUT = "pays_throughout"  # it never fell below 1 in the range both searched
    NEVER_PAYS = "never_pays"  # it was below 1 from the first load both searched
    NO_BASELINE = "no_baseline"  # no baseline search to compare with (none in the plan, none measured, no shared load)
    WITHIN_NOISE = "within_noise"  # within the plan's noise_limit of the baseline at every load: neither pays nor loses


@dataclass(frozen=True)
class Crossover:
    """A configuration's crossover: the load (None unless interpolated), its status, and the loads both searched."""

    load: float | None
    status: Status
    within: tuple[float, float] | None = None

    def fields(self) -> dict[str, object]:
        """As a found line's fields (DIR/search.jsonl)."""
        return {"crossover": self.load, "crossover_status": str(self.status),
                "crossover_range": list(self.within) if self.within else None}


def offered(spec: SearchSpec, o: Outcome) -> float:
    """A step's offered load on the search's axis (a closed loop on the rate axis: the rate it achieved)."""
    if spec.mode is Mode.SLO and spec.axis is Axis.CONCURRENCY:
        return float(o.step.concurrency)
    return o.step.rate if o.step.rate is not None else o.achieved_rate


def curve(spec: SearchSpec, done: Sequence[Outcome]) -> Curve:
    """The steps' output tok/s against offered load; steps with no tok/s left out, two at one load averaged."""
    at: dict[float, list[float]] = {}
    for o in done:
        if o.output_tps is not None:
            at.setdefault(offered(spec, o), []).append(o.output_tps)
    return tuple((x, statistics.fmean(ys)) for x, ys in sorted(at.items()))


def value_at(c: Curve, x: float) -> float:
    """The curve's piecewise-linear value at `x`, which lies within its loads."""
    for (x0, y0), (x1, y1) in pairwise(c):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return c[0][1] if x <= c[0][0] else c[-1][1]


def find(config: Curve, base: Curve | None, noise_limit: float = 0.0) -> Crossover:
    """The first load, in the range both curves cover, at which config's tok/s falls below base's by more than
    `noise_limit` (the speedup's rule without an interval, speedup.Ratio.within_noise: a ratio within noise_limit
    of 1 neither pays nor loses). A configuration within it at every load is WITHIN_NOISE: the same server as the
    baseline once "paid up to 35.3 req/s" on differences of 0.2-1 %."""
    if not config or not base:
        return Crossover(None, Status.NO_BASELINE)
    lo, hi = max(config[0][0], base[0][0]), min(config[-1][0], base[-1][0])
    if lo > hi:
        return Crossover(None, Status.NO_BASELINE)
    xs = sorted({lo, hi, *(x for x, _ in (*config, *base) if lo <= x <= hi)})
    # The margin over losing: negative where config is slower than the baseline beyond the noise. Both curves are
    # linear between the loads of xs, so the margin is too, and its crossing within a segment is exact.
    margin = [value_at(config, x) - (1 - noise_limit) * value_at(base, x) for x in xs]
    if margin[0] < 0:
        return Crossover(None, Status.NEVER_PAYS, (lo, hi))
    for (x0, d0), (x1, d1) in pairwise(zip(xs, margin, strict=True)):
        if d1 < 0:  # d0 >= 0: linear on [x0, x1], so it crosses 0 once there
            return Crossover(x0 + d0 / (d0 - d1) * (x1 - x0), Status.INTERPOLATED, (lo, hi))
    if all(value_at(config, x) <= (1 + noise_limit) * value_at(base, x) for x in xs):
        return Crossover(None, Status.WITHIN_NOISE, (lo, hi))
    return Crossover(None, Status.PAYS_THROUGHOUT, (lo, hi))
