"""Speedup against the sweep's baseline: ratios with a 95 % interval over repeats, and the drift check.

The method (docs/sweeps.md, "Speedup against a baseline"; the statistics are sweep/noise.py's, which the run side
shares): a ratio is taken on the log scale, as the ratio of the two sides' geometric means, exp(mean(log a) -
mean(log b)), and its interval is Welch's t interval for that difference of means, exponentiated, widened by the
spread between loads where the sweep measured one (noise.Estimate: an A/A start, the baseline's rounds).
Throughput and latency are positive and their run to run noise is multiplicative, so on the log scale it is close
to normal and of like size on both sides; Welch's t carries the uncertainty of variances estimated from 2 to 5
repeats in its few degrees of freedom (t(0.975, 2) = 4.30), where a bootstrap over 2 or 3 repeats has 3 to 10
distinct resamples and an interval far too narrow. With one run on one side, the other side's variance stands for
both (df = n - 1); with one run on each side there is no interval, and the plan's `noise_limit` says what is noise
(as --compare does).

Pure functions: no file, clock or random state (the tests' generator is theirs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Final

from genready.sweep import noise
from genready.sweep.noise import LEVEL, Estimate, ratio, t_quantile, variance
from genready.sweep.rows import Row
from genready.tools import benchline

# (results/report name, the figure it is the ratio of): speedup is a point's output tok/s over the baseline's;
# the latency ratios are the point's p50 over the baseline's (below 1: faster).
RATIOS: Final = (("speedup", benchline.OUTPUT_TOKENS_PER_SECOND.key), ("ttft_ratio", benchline.TTFT_P50_MS.key),
                 ("itl_ratio", benchline.ITL_P50_MS.key), ("e2e_ratio", benchline.E2E_P50_MS.key))


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


def attach(rows: Sequence[Row], est: Estimate | None = None) -> None:
    """Each ok point's ratios against the baseline round that ran before it at its client setting (same host),
    and `drifted` when that round and the next one differ by more than the baseline's noise. `noise`: the
    spread between loads each interval takes in (every row keeps it: the Decision's comparisons use it too)."""
    for r in rows:
        r.noise = est
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
            loads = est.loads(key) if est is not None else None
            if (got := ratio(r.samples.get(key, []), base.samples.get(key, []), loads=loads)) is not None:
                r.ratios[name] = got
        after = bases.get(json.dumps([r.host, r.baseline_round + 1, r.client], sort_keys=True))
        if after is not None:
            key = RATIOS[0][1]
            r.drifted = drift(base.samples.get(key, []), after.samples.get(key, []), base.noise_limit)


def repeats_needed(a: Sequence[float], b: Sequence[float], noise_limit: float, most: int = 100,
                   level: float = LEVEL, loads: noise.Components | None = None) -> int | None:
    """How many repeats of each side would make the ratio's interval narrow enough to tell a gain of
    `noise_limit` from a loss of it (its half-width on the log scale under log(1 + noise_limit)), at the run
    to run noise the runs `a` and `b` measured (one side's variance standing for the other's with one run, as
    in ratio) and the spread between loads each side's load adds (`loads`, which no repeat shrinks); None when no
    noise is measured (one run each) or when more than `most` would be needed."""
    if any(not (math.isfinite(v) and v > 0) for v in (*a, *b)) or (len(a) < 2 and len(b) < 2):
        return None
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    s2a = variance(la) if len(la) >= 2 else variance(lb)
    s2b = variance(lb) if len(lb) >= 2 else s2a
    target = math.log1p(noise_limit)
    for n in range(2, most + 1):
        va, vb = s2a / n, s2b / n
        df = noise.interval_df(va + vb, (va * va + vb * vb) / (n - 1), loads, float(2 * n - 2))
        if t_quantile(1 - (1 - level) / 2, df) * math.sqrt(va + vb + noise.loads_part(loads)) < target:
            return n
    return None


ONE_LOAD: Final = ("the intervals cover one load only: each is built from the repeats on one load of each side, "
                   "and a second load of the same configuration can land outside it (the plan's noise_check = "
                   "true, or baseline_every, measures the spread between loads that the intervals then take in)")


def noise_note(rows: Sequence[Row]) -> tuple[str, bool]:
    """What the report's intervals rest on, said once (its Decision's notes): the spread within and between loads
    that speedup.attach gave the rows (the A/A start's, the baseline's rounds'), the smallest speedup the plan's
    repeats can tell from 1, and the warning when that exceeds its noise_limit (noise.words); or that they cover
    one load only. And whether it warns."""
    est = next((r.noise for r in rows if r.noise is not None), None)
    got = est.by_key.get(RATIOS[0][1]) if est is not None else None
    if est is None or got is None:
        return ONE_LOAD, False
    points = [r for r in rows if not r.baseline and r.runs_ok]
    repeats = max((r.runs_ok for r in points), default=1)
    limit = max((r.noise_limit for r in points), default=0.10)
    text, warn = noise.words(got, repeats, limit, "output tok/s")
    return (f"the intervals take in the spread between loads, measured by {est.source()}: {text}"), warn


def noise_json(rows: Sequence[Row]) -> dict[str, object]:
    """noise_note's figures for --format json: per figure the variances (log scale), the loads and runs."""
    est = next((r.noise for r in rows if r.noise is not None), None)
    note, warn = noise_note(rows)
    return {"note": note, "warning": warn, "one_load": est is None,
            "source": est.source() if est is not None else None,
            "figures": {k: {"within": c.within, "between": c.between, "loads": c.loads, "runs": c.runs,
                            "df_within": c.df_within, "df_between": c.df_between}
                        for k, c in (est.by_key.items() if est is not None else ())}}
