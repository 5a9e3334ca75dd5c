"""Speedup against the sweep's baseline: ratios with a 95 % interval over repeats, and the drift check.

The method (docs/sweeps.md, "Speedup against a baseline"): a ratio is taken on the log scale, as the
ratio of the two sides' geometric means, exp(mean(log a) - mean(log b)), and its interval is Welch's t
interval for that difference of means, exponentiated. Throughput and latency are positive and their run
to run noise is multiplicative, so on the log scale it is close to normal and of like size on both sides;
Welch's t carries the uncertainty of variances estimated from 2 to 5 repeats in its few degrees of freedom
(t(0.975, 2) = 4.30), where a bootstrap over 2 or 3 repeats has 3 to 10 distinct resamples and an interval
far too narrow. With one run on one side, the other side's variance stands for both (df = n - 1); with one
run on each side there is no interval, and the plan's `noise_limit` says what is noise (as --compare does).

Pure functions: no file, clock or random state (the tests' generator is theirs).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Sequence
from typing import Final

from genready.sweep.rows import Ratio, Row
from genready.tools import benchline

LEVEL: Final = 0.95
# (results/report name, the figure it is the ratio of): speedup is a point's output tok/s over the baseline's;
# the latency ratios are the point's p50 over the baseline's (below 1: faster).
RATIOS: Final = (("speedup", benchline.OUTPUT_TOKENS_PER_SECOND.key), ("ttft_ratio", benchline.TTFT_P50_MS.key),
                 ("itl_ratio", benchline.ITL_P50_MS.key), ("e2e_ratio", benchline.E2E_P50_MS.key))


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _ibeta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function with `df` > 0 degrees of freedom (need not be an integer)."""
    tail = 0.5 * _ibeta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_pdf(t: float, df: float) -> float:
    """Student's t density with `df` > 0 degrees of freedom."""
    return math.exp(math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
                    - (df + 1.0) / 2.0 * math.log1p(t * t / df))


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The t value below which a fraction `p` (0.5 < p < 1) of Student's t with `df` lies: Halley's method
    kept inside a shrinking bracket (a bisection step whenever Halley would leave it). A report of 1,000
    points asks for ~11,000 of these, many with degrees of freedom asked before (no spread on either side
    gives n_a + n_b - 2; a latency that moves with the throughput, the throughput's): hence the cache, and
    Halley's cubic steps (the density's slope is in closed form) over Newton's."""
    z = statistics.NormalDist().inv_cdf(p)  # Cornish-Fisher's start: a few steps, not dozens
    guess = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df * df)
    lo, hi = 0.0, max(1.0, 2.0 * guess)
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    t = guess if lo < guess < hi else (lo + hi) / 2.0
    for _ in range(200):
        f = t_cdf(t, df) - p
        lo, hi = (t, hi) if f < 0 else (lo, t)
        pdf = t_pdf(t, df)
        if pdf > 0:
            step = f / pdf  # Newton's; Halley's divides it by 1 - step * f''/(2 f'), f'' = -f' (df + 1) t / (df + t^2)
            nt = t - step / (1.0 + step * (df + 1.0) * t / (2.0 * (df + t * t)))
        else:
            nt = (lo + hi) / 2.0
        # converged first: a step within the distribution function's own rounding may cross the root, and
        # bisecting after it would throw away a bracket side that never moved (40 steps back instead of none)
        if abs(nt - t) < 1e-12 * max(1.0, t) or hi - lo < 1e-12 * max(1.0, hi):
            return nt if lo <= nt <= hi else t
        if not lo < nt < hi:
            nt = (lo + hi) / 2.0
        t = nt
    return t


def _variance(xs: Sequence[float]) -> float:
    """The sample variance in floats (statistics.variance computes in exact fractions: a 1,000-point report
    asks for thousands); 0 when every value is the same, as there."""
    if all(x == xs[0] for x in xs):
        return 0.0
    m = math.fsum(xs) / len(xs)
    return math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def ratio(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Ratio | None:
    """mean-of-logs ratio of the runs `a` over the runs `b`, with its `level` interval (module doc); None when
    a side has no run, or a value that is not finite and positive (no ratio of a zero throughput)."""
    if not a or not b or any(not (math.isfinite(v) and v > 0) for v in (*a, *b)):
        return None
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    diff = statistics.fmean(la) - statistics.fmean(lb)
    na, nb = len(la), len(lb)
    if na < 2 and nb < 2:
        return Ratio(math.exp(diff))
    if na >= 2 and nb >= 2:
        va, vb = _variance(la) / na, _variance(lb) / nb
        se2 = va + vb
        # Welch-Satterthwaite; with no spread on either side the interval is the value itself
        df = se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1)) if se2 > 0 else float(na + nb - 2)
    else:
        s2 = _variance(la if na >= 2 else lb)
        se2, df = s2 * (1 / na + 1 / nb), float(max(na, nb) - 1)
    half = t_quantile(1 - (1 - level) / 2, df) * math.sqrt(se2)
    return Ratio(math.exp(diff), math.exp(diff - half), math.exp(diff + half))


def drift(before: Sequence[float], after: Sequence[float], noise_limit: float) -> float | None:
    """How far the baseline's throughput moved from one round (`before`) to the next (`after`), as a fraction
    (-0.2: 20 % slower), when that is more than its noise; None when it is within the noise or unknown."""
    r = ratio(after, before)
    if r is None or r.within_noise(noise_limit):
        return None
    return r.value - 1.0


def drift_text(drifted: float) -> str:
    """A drift as a signed percentage with two significant digits: `-30%`, `+0.3%`. A move of under 1 %
    still counts as a drift when the baseline's own runs are steadier than that, and `+0%` would say none."""
    pct = 100 * drifted
    return f"{pct:+.0f}%" if abs(pct) >= 9.95 else f"{pct:+.1f}%"


def attach(rows: Sequence[Row]) -> None:
    """Each ok point's ratios against the baseline round that ran before it at its client setting (same host),
    and `drifted` when that round and the next one differ by more than the baseline's noise."""
    bases: dict[str, Row] = {}
    for r in rows:
        if r.baseline and r.status == "ok" and r.client is not None:
            bases[json.dumps([r.host, r.baseline, r.client], sort_keys=True)] = r
    for r in rows:
        if r.baseline or r.status != "ok" or r.client is None or not r.baseline_round:
            continue
        base = bases.get(json.dumps([r.host, r.baseline_round, r.client], sort_keys=True))
        if base is None:
            continue
        for name, key in RATIOS:
            if (got := ratio(r.samples.get(key, []), base.samples.get(key, []))) is not None:
                r.ratios[name] = got
        after = bases.get(json.dumps([r.host, r.baseline_round + 1, r.client], sort_keys=True))
        if after is not None:
            key = RATIOS[0][1]
            r.drifted = drift(base.samples.get(key, []), after.samples.get(key, []), base.noise_limit)


def repeats_needed(a: Sequence[float], b: Sequence[float], noise_limit: float, most: int = 100,
                   level: float = LEVEL) -> int | None:
    """How many repeats of each side would make the ratio's interval narrow enough to tell a gain of
    `noise_limit` from a loss of it (its half-width on the log scale under log(1 + noise_limit)), at the run
    to run noise the runs `a` and `b` measured (one side's variance standing for the other's with one run, as
    in ratio); None when no noise is measured (one run each) or when more than `most` would be needed."""
    if any(not (math.isfinite(v) and v > 0) for v in (*a, *b)) or (len(a) < 2 and len(b) < 2):
        return None
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    s2a = _variance(la) if len(la) >= 2 else _variance(lb)
    s2b = _variance(lb) if len(lb) >= 2 else s2a
    target = math.log1p(noise_limit)
    for n in range(2, most + 1):
        va, vb = s2a / n, s2b / n
        se2 = va + vb
        df = se2 * se2 / ((va * va + vb * vb) / (n - 1)) if se2 > 0 else float(2 * n - 2)
        if t_quantile(1 - (1 - level) / 2, df) * math.sqrt(se2) < target:
            return n
    return None
