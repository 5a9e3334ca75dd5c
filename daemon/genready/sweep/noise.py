"""The statistics both sides of a sweep use (run/ for `repeats = "auto"` and the A/A start, report/ for every
interval it gives): Student's t, the ratio of two sets of runs with its interval, and the spread of a figure
within one load and between loads of the same configuration.

Why between loads: two runs on one load share that load's level (where the weights landed, the allocator's
layout, the clocks the GPU settled on), so repeats within a load measure only the run to run part. A second
load of the same configuration moves every run of it together. An interval built from one load's repeats
therefore misses that part; it is estimated from loads of one configuration (an A/A start, `noise_check`;
the baseline's rounds, `baseline_every`) as one-way random-effects variance components on the log scale:

    log x = level of the configuration + load effect (variance `between`) + run effect (variance `within`)

`within` is the pooled variance of the runs around their load's mean; `between` is (MSB - MSW) / n0, the
mean square between the loads of a configuration less the within part it carries, over n0 (the runs per load,
corrected for unequal loads), and 0 when that is negative (the loads agree as well as their runs do). A ratio
of two configurations, each measured on its own load, then has the variance of its log
within_a/na + within_b/nb + 2 * between: `ratio(..., loads=)`. Its t takes the doubt of each part in
(Welch-Satterthwaite): the within parts' n - 1 degrees of freedom, the between part's `df_between` (loads less
configurations: 1 for an A/A start of two loads, whose intervals are then wide; more loads, or the baseline's
rounds, narrow them; client settings measured on the same loads count those loads once). More repeats never
shrink the between part; only steadier loads do.

That interval is about the true ratio. Where a second sweep of the same plan measures it is another question,
with a wider answer (the second estimate has its own noise): `Ratio.rep_low`/`rep_high`, the replication
interval.

Pure functions: no file, clock or random state.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

LEVEL: Final = 0.95
MAX_DF: Final = 1000.0  # a t with more degrees of freedom is the normal to 3 digits: no slower search past it


@dataclass(frozen=True)
class Ratio:
    """A over B: the ratio of geometric means, and its interval (None with one run on each side)."""

    value: float
    low: float | None = None
    high: float | None = None
    # the replication interval: where the same ratio measured by a second sweep of the same plan lands with the
    # same level (`replication`); wider than [low, high], which is about the true ratio
    rep_low: float | None = None
    rep_high: float | None = None

    def within_noise(self, noise_limit: float) -> bool:
        """The interval holds 1; without one, the ratio is within `noise_limit` of 1."""
        if self.low is None or self.high is None:
            return abs(self.value - 1.0) <= noise_limit
        return self.low <= 1.0 <= self.high


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


def variance(xs: Sequence[float]) -> float:
    """The sample variance in floats (statistics.variance computes in exact fractions: a 1,000-point report
    asks for thousands); 0 when every value is the same, as there."""
    if all(x == xs[0] for x in xs):
        return 0.0
    m = math.fsum(xs) / len(xs)
    return math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1)


@dataclass(frozen=True)
class LogRatio:
    """A ratio on the log scale: the difference of the two sides' mean logs, its estimated variance and the
    degrees of freedom of that estimate (`ratio`'s interval is diff +- t(df) sqrt(variance))."""

    diff: float
    variance: float
    df: float


def log_ratio(a: Sequence[float], b: Sequence[float], loads: Components | None = None) -> LogRatio | None:
    """`ratio`'s arithmetic on the log scale; None when a side has no run or a value that is not finite and
    positive, or when neither side has two runs (no variance to estimate)."""
    if not a or not b or any(not (math.isfinite(v) and v > 0) for v in (*a, *b)):
        return None
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    diff = statistics.fmean(la) - statistics.fmean(lb)
    na, nb = len(la), len(lb)
    if na < 2 and nb < 2:
        return None
    if na >= 2 and nb >= 2:
        va, vb = variance(la) / na, variance(lb) / nb
        within, spread = va + vb, va * va / (na - 1) + vb * vb / (nb - 1)
        fallback = float(na + nb - 2)
    else:
        s2, m = variance(la if na >= 2 else lb), max(na, nb) - 1
        within = s2 * (1 / na + 1 / nb)
        spread, fallback = within * within / m, float(m)
    return LogRatio(diff, within + loads_part(loads), interval_df(within, spread, loads, fallback))


def ratio(a: Sequence[float], b: Sequence[float], level: float = LEVEL, loads: Components | None = None
          ) -> Ratio | None:
    """mean-of-logs ratio of the runs `a` over the runs `b`, with its `level` interval; None when a side has no
    run, or a value that is not finite and positive (no ratio of a zero throughput). `loads`: the figure's spread
    between loads (`components`), whose `between` variance each side's load adds (module doc); None for an
    interval of one load's repeats.

    The ratio is taken on the log scale, as the ratio of the two sides' geometric means, and its interval is
    Welch's t interval for that difference of means, exponentiated (docs/sweeps.md, "Speedup against a
    baseline"). With one run on one side, the other side's variance stands for both (df = n - 1); with one run
    on each side there is no interval, and the plan's `noise_limit` says what is noise.

    The replication interval (`rep_low`, `rep_high`) answers another question: where a second sweep of the same
    plan measures this ratio. That estimate has its own noise, of the same variance as this one's (its own
    loads and repeats), so the difference of the two has twice the variance: the half-width times sqrt(2), at
    the same degrees of freedom (the second variance is this one's estimate again). A `level` interval about
    the true ratio holds another sweep's estimate only about 83 % of the time at 95 % (P(|Z| < 1.96 / sqrt 2))."""
    if not a or not b or any(not (math.isfinite(v) and v > 0) for v in (*a, *b)):
        return None
    got = log_ratio(a, b, loads)
    if got is None:
        return Ratio(math.exp(statistics.fmean(map(math.log, a)) - statistics.fmean(map(math.log, b))))
    half = t_quantile(1 - (1 - level) / 2, got.df) * math.sqrt(got.variance)
    rep = half * math.sqrt(2.0)
    return Ratio(math.exp(got.diff), math.exp(got.diff - half), math.exp(got.diff + half),
                 math.exp(got.diff - rep), math.exp(got.diff + rep))


def loads_part(loads: Components | None) -> float:
    """What two sides' loads add to a ratio's variance of the log: twice the between-load variance."""
    return 2.0 * loads.between if loads is not None else 0.0


def interval_df(within: float, spread: float, loads: Components | None, fallback: float) -> float:
    """Welch-Satterthwaite's degrees of freedom of `within` (its terms' squares over their df summed in `spread`)
    plus the loads' part, whose own estimate has the A/A start's and baseline rounds' df_between; with no spread
    at all, `fallback` (the interval is then the value itself)."""
    part = loads_part(loads)
    total = within + part
    if total <= 0:
        return fallback
    terms = spread + (part * part / loads.df_between if loads is not None and part > 0 else 0.0)
    return min(MAX_DF, total * total / terms) if terms > 0 else MAX_DF


@dataclass(frozen=True)
class Components:
    """One figure's spread on the log scale: between the runs of one load (`within`) and between the loads of
    one configuration (`between`), variances, with what they rest on."""

    within: float
    between: float
    loads: int  # loads counted (of configurations loaded twice or more)
    runs: int
    df_within: int  # runs less loads: 0 when every load ran once (within unmeasured; `between` then holds it)
    df_between: int  # loads less configurations

    def sd_words(self) -> str:
        """`within a load 1.9 %, between loads 4.8 %`: each as the standard deviation of the log (a ratio's scale)."""
        w = f"{math.expm1(math.sqrt(self.within)):.1%}" if self.df_within else "not measured (one run per load)"
        return f"within a load {w}, between loads {math.expm1(math.sqrt(self.between)):.1%}"

    def smallest_speedup(self, repeats: int, level: float = LEVEL) -> float:
        """The smallest ratio of two configurations, each on its own load with `repeats` runs, whose `level`
        interval leaves 1 out at these variances: exp(t * sqrt(2 within / n + 2 between)), t at the degrees of
        freedom `ratio` gives two such sides (with one run each, the within part's df are the A/A start's)."""
        n = max(1, repeats)
        side = self.within / n
        spread = 2 * side * side / (n - 1 if n >= 2 else max(1, self.df_within))
        half = t_quantile(1 - (1 - level) / 2, interval_df(2 * side, spread, self, float(max(1, 2 * n - 2))))
        return math.exp(half * math.sqrt(2 * side + loads_part(self)))


def components(configs: Sequence[Sequence[Sequence[float]]], shared: Sequence[Hashable] | None = None
               ) -> Components | None:
    """The variance components of a figure from `configs`: per configuration its loads, per load its runs'
    values (finite and positive; others dropped). Configurations loaded once give nothing (no load to
    compare); None when no configuration has two loads with a run each.

    `shared`: per configuration, what loads it was measured on; configurations with the same key ran on the same
    loads (the client settings of one server configuration: a baseline round runs every setting on one load),
    so their load effects are one draw, not several. Each still gives an unbiased `between`, pooled as before,
    but the evidence is only as firm as its distinct loads: `loads` and `df_between` count each shared load once
    (counting it per client setting overstated the df, and a t at too many df gave intervals too narrow)."""
    keys = list(shared) if shared is not None else list(range(len(configs)))
    loads_of = [[[math.log(v) for v in load if math.isfinite(v) and v > 0] for load in c] for c in configs]
    kept_of = [(k, kept) for c, k in zip(loads_of, keys, strict=True) if len(kept := [load for load in c if load]) >= 2]
    if not kept_of:
        return None
    ssw = ssb = n0_sum = 0.0
    runs = loads = 0
    distinct: dict[Hashable, int] = {}  # per shared key, the most loads one of its configurations kept
    for k, c in kept_of:
        sizes = [len(load) for load in c]
        total = sum(sizes)
        grand = math.fsum(math.fsum(load) for load in c) / total
        for load in c:
            m = math.fsum(load) / len(load)
            ssw += math.fsum((x - m) ** 2 for x in load)
            ssb += len(load) * (m - grand) ** 2
        n0_sum += total - sum(n * n for n in sizes) / total
        runs, loads = runs + total, loads + len(c)
        distinct[k] = max(distinct.get(k, 0), len(c))
    df_w, df_b = runs - loads, loads - len(kept_of)
    msw = ssw / df_w if df_w else 0.0
    msb = ssb / df_b
    between = max(0.0, (msb - msw) / (n0_sum / df_b))
    return Components(msw, between, sum(distinct.values()), runs, df_w, sum(n - 1 for n in distinct.values()))


@dataclass(frozen=True)
class Estimate:
    """The report's (and the sweep's) spread per figure key, and the loads it rests on."""

    by_key: Mapping[str, Components]
    aa_loads: int = 0  # loads of an A/A start (noise_check)
    baseline_loads: int = 0  # baseline rounds at a client setting the baseline ran at more than once

    def loads(self, key: str) -> Components | None:
        """Figure `key`'s spread between loads, which its intervals take in; None without evidence."""
        return self.by_key.get(key)

    def source(self) -> str:
        """What the estimate rests on, in words."""
        parts = []
        if self.aa_loads:
            parts.append(f"an A/A start of {self.aa_loads} loads of one configuration")
        if self.baseline_loads:
            parts.append(f"{self.baseline_loads} loads of the baseline (its rounds)")
        return " and ".join(parts) or "nothing"


def estimate(configs: Sequence[Sequence[Mapping[str, Sequence[float]]]], *, aa_loads: int = 0,
             baseline_loads: int = 0, shared: Sequence[Hashable] | None = None) -> Estimate | None:
    """Components per figure key over `configs` (per configuration its loads, per load each figure's runs;
    `shared` as in `components`: configurations measured on the same loads); None when no figure has two loads
    of one configuration."""
    keys = dict.fromkeys(k for c in configs for load in c for k in load)
    got = {k: comp for k in keys
           if (comp := components([[load.get(k, ()) for load in c] for c in configs], shared))}
    return Estimate(got, aa_loads, baseline_loads) if got else None


def words(c: Components, repeats: int, noise_limit: float, what: str) -> tuple[str, bool]:
    """The noise said one way on stderr and in the report: `what`'s spread, the smallest speedup told from 1
    with `repeats`, and whether that is larger than `noise_limit` (the differences the plan looks for: the
    Decision's within-noise band), with the warning's words then."""
    smallest = c.smallest_speedup(repeats)
    text = (f"{what}: {c.sd_words()} ({c.loads} loads, {c.runs} runs); the smallest speedup the plan can tell "
            f"from 1 with {repeats} repeat{'s' if repeats != 1 else ''} a point: {smallest:.3f}x")
    warn = smallest - 1.0 > noise_limit
    if warn:
        text += (f"; warning: larger than the plan's noise_limit ({noise_limit:.0%}), so differences of that size "
                 "will not be told apart" + (" (repeats shrink only the within-load part; more loads, a larger "
                                              "noise_check or baseline_every, firm up the between-load part)"
                                              if c.between else ""))
    return text, warn


