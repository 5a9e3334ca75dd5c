"""Who gets slower: a mean speedup hides who pays (issue 50 §4).

Per-category speedups on one model range from 1.36x to 1.91x, and long answers can get slower while short ones
get faster. The baseline and each point answer the same prompts (outputs.py pairs them by prompt id), so each
prompt is its own comparison: the baseline's end-to-end time over the point's (the median over each side's
answers to it; below 1: that prompt got slower), and the same in time per output token. `of` gives the share of
prompts that got slower with its 95 % Wilson interval (a share of n independent prompts: the score interval
keeps its coverage near 0 and 1, where most shares of a good configuration are), by category and by the
baseline answer's length, and the category whose median per-prompt speedup is the lowest. Pure functions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

from genready.redact import escape
from genready.sweep.rows import Row, Slower

Z: Final = 1.959963984540054  # the standard normal's 97.5th percentile
LENGTHS: Final = ((32, "<=32 tokens"), (128, "33-128 tokens"), (512, "129-512 tokens"), (math.inf, ">512 tokens"))
MAX_SPEEDUPS: Final = 1000  # per-prompt speedups kept per point for the page's ECDF


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of a share k / n (n > 0)."""
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _bucket(tokens: int) -> str:
    return next(name for top, name in LENGTHS if tokens <= top)


class Pair(NamedTuple):
    """One prompt on both sides: its category, each side's output tokens and end-to-end times (outputs.py)."""

    category: str
    tokens: int  # the point's answer's
    base_tokens: int
    e2e_ms: Sequence[float]
    base_e2e_ms: Sequence[float]


def of(pairs: Mapping[str, Pair]) -> Slower | None:
    """Who got slower over the prompts both sides answered with a time; None without any."""
    speed: list[tuple[str, float, float | None]] = []  # (prompt id, e2e speedup, per-token speedup)
    for pid, p in pairs.items():
        if not p.e2e_ms or not p.base_e2e_ms:
            continue
        mine, theirs = statistics.median(p.e2e_ms), statistics.median(p.base_e2e_ms)
        if mine <= 0 or theirs <= 0:
            continue
        per_token = (theirs / p.base_tokens) / (mine / p.tokens) if p.tokens and p.base_tokens else None
        speed.append((pid, theirs / mine, per_token))
    if not speed:
        return None
    n = len(speed)
    k = sum(s < 1 for _, s, _ in speed)
    low, high = wilson(k, n)
    by_category: dict[str, tuple[int, int]] = {}
    by_length: dict[str, tuple[int, int]] = {}
    per_category: dict[str, list[float]] = {}
    for pid, s, _ in speed:
        for table, key in ((by_category, pairs[pid].category or "-"), (by_length, _bucket(pairs[pid].base_tokens))):
            slow, count = table.get(key, (0, 0))
            table[key] = (slow + (s < 1), count + 1)
        per_category.setdefault(pairs[pid].category or "-", []).append(s)
    slowest = min(per_category, key=lambda c: statistics.median(per_category[c])) if len(per_category) > 1 else None
    tokens = [t for _, _, t in speed if t is not None]
    ordered = sorted(s for _, s, _ in speed)
    if len(ordered) > MAX_SPEEDUPS:  # evenly picked, the ends kept: an ECDF of 1,000 steps looks the same
        ordered = [ordered[round(i * (len(ordered) - 1) / (MAX_SPEEDUPS - 1))] for i in range(MAX_SPEEDUPS)]
    return Slower(k / n, low, high, n, dict(sorted(by_category.items())),
                  {name: by_length[name] for _, name in LENGTHS if name in by_length}, slowest,
                  statistics.median(tokens) if tokens else None, tuple(ordered))


def words(s: Slower | None) -> str:
    """The Decision's words: "12 % of prompts slower [7-19 %], slowest category coding"; "" without figures."""
    if s is None:
        return ""
    text = f"{s.share:.0%} of prompts slower [{s.low:.0%}-{s.high:.0%}]"
    return text + (f", slowest category {s.slowest}" if s.slowest else "")


def as_json(s: Slower | None) -> dict[str, object] | None:
    if s is None:
        return None
    return {"share": s.share, "low": s.low, "high": s.high, "compared": s.prompts,
            "by_category": {k: {"slower": a, "compared": b} for k, (a, b) in s.by_category.items()},
            "by_length": {k: {"slower": a, "compared": b} for k, (a, b) in s.by_length.items()},
            "slowest_category": s.slowest, "median_per_token_speedup": s.median_per_token}


def table(rows: Sequence[Row]) -> str:
    """The text report's "who gets slower" lines, a point a line: its share with the interval, and per category;
    "" when no point has figures."""
    lines = []
    for r in rows:
        s = r.outputs.slower if r.outputs else None
        if s is not None:
            cats = ", ".join(f"{escape(c)} {a}/{b}" for c, (a, b) in s.by_category.items())
            lines.append(f"  {escape(r.label)}: {words(s)}; by category (slower/prompts): {cats}")
    if not lines:
        return ""
    return ("prompts slower than on the baseline (each prompt's e2e on the baseline / on the point, below 1; "
            "[95 % Wilson interval]):\n" + "\n".join(lines) + "\n")
