"""When a server's warmup is done: windows of requests whose median TTFT and ITL have stopped moving.

A fresh engine is slower for its first requests (SGLang issue #28706: TTFT 6,350 ms right after a
restart, 3,661 ms once converged, after 50 to 100 requests: JIT compilation, CUDA-graph capture,
kernel autotuning, the first collectives), so a fixed count of warmup requests leaves a bias that
depends on the engine. `warmup = "stable"` sends requests in windows of `window` and stops when
the last window's median TTFT and ITL are both within `tolerance` of the window before's and show no trend
since the earliest of the last TREND_WINDOWS windows (within half the tolerance of it, or within the windows'
own noise), or at `max_requests` / `max_seconds`
(not converged: the run is marked unstable). Pure functions: the requests are sent by
servercache.warm_until_stable.

Why the second comparison: two neighbouring windows are no plateau when the figure drifts a little per
window. On a simulator whose first 75 generations decay from 1.73x (bench/warmup.py), windows of 8 within
10 % of each other stopped the warmup at 16 requests and left the run +20 % above the converged TTFT. A
drift of d per window adds up to 2d over the last three windows, so the span test stops only once d is
under a quarter of the tolerance (2.5 %): that decay is then 3 % from its plateau at 72 requests (5 % at 80
for one over 100 generations). An engine warm from the start costs two windows, as before, when they agree
within half the tolerance; on a host whose jitter moves a window's median more than that, a difference
within the windows' own noise (TREND_Z standard errors) is no trend either: a drift smaller than the noise
cannot be seen in so few requests, and a busy host would never settle otherwise (20 jittered warm engines:
400 requests in all against the old rule's 392; tests/test_sweep_warmup.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# A difference below this many seconds is within tolerance whatever the ratio: a fast server's medians of
# a few milliseconds move by more than 10 % on timer and loopback noise alone, and never would converge.
NOISE_FLOOR: Final = 0.001
# Requests in a row that failed and end a warmup as failing: a server refusing every request (a prompt beyond
# its context, a wrong route) is not "not stable yet", and sending the rest of warmup_max only hides its words.
FAILING_AFTER: Final = 4
# The windows the trend is judged over: the last one against the earliest of these (fewer early on).
TREND_WINDOWS: Final = 3
# Standard errors of the difference of two windows' medians beyond which a difference is a trend, not noise.
TREND_Z: Final = 2.0


@dataclass(frozen=True)
class Rule:
    """The plan's warmup_window, warmup_tolerance, warmup_max and warmup_max_seconds."""

    window: int = 8
    tolerance: float = 0.10
    max_requests: int = 96
    max_seconds: float = 600.0
    trend_windows: int = TREND_WINDOWS  # 1: neighbouring windows alone (the rule before issue 51; bench/warmup.py)


@dataclass(frozen=True)
class Sample:
    """One warmup request: its TTFT and the gaps between its tokens (seconds); ttft None: it failed."""

    ttft: float | None
    itl: tuple[float, ...] = ()


@dataclass(frozen=True)
class Medians:
    """A window's median TTFT and median ITL (over all its gaps; None when it had no second token)."""

    ttft: float
    itl: float | None


@dataclass(frozen=True)
class Verdict:
    """How a warmup ended: converged, or which bound stopped it ("warmup_max", "warmup_max_seconds")."""

    converged: bool
    requests: int
    stopped_by: str  # "converged", "failing" (FAILING_AFTER failures in a row), "warmup_max" or "warmup_max_seconds"
    last: Medians | None = None  # the last window's medians
    before: Medians | None = None  # the window before's


def medians(window: Sequence[Sample]) -> Medians | None:
    """The window's medians, or None if a request of it failed (a server that fails is not stable)."""
    if not window or any(s.ttft is None for s in window):
        return None
    gaps = [g for s in window for g in s.itl]
    return Medians(statistics.median(s.ttft for s in window if s.ttft is not None),
                   statistics.median(gaps) if gaps else None)


def close(now: float, before: float, tolerance: float) -> bool:
    """`now` within `tolerance` of `before` (relative to `before`), or within NOISE_FLOOR of it."""
    return abs(now - before) <= max(tolerance * abs(before), NOISE_FLOOR)


def agree(last: Medians, before: Medians, tolerance: float) -> bool:
    """Both windows' TTFT close, and their ITL too (compared only when neither window lacks it: a model
    that ends at its first token has none; one window with and one without is no agreement)."""
    if not close(last.ttft, before.ttft, tolerance):
        return False
    if last.itl is None and before.itl is None:
        return True
    return last.itl is not None and before.itl is not None and close(last.itl, before.itl, tolerance)


def _noise(values: Sequence[float]) -> float:
    """The standard error of a window's median from its own spread: 1.253 sigma / sqrt(n), sigma estimated
    robustly as 1.4826 MAD (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    sigma = 1.4826 * statistics.median(abs(v - mid) for v in values)
    return 1.253 * sigma / math.sqrt(len(values))


def no_trend(last: Sequence[Sample], earliest: Sequence[Sample], tolerance: float) -> bool:
    """The last window's medians (TTFT, ITL) within half the tolerance of the earliest's, or their difference
    within the windows' own noise (TREND_Z standard errors of the difference): a drift smaller than the
    noise cannot be told from none with this many requests, and a busy host would never pass the half
    tolerance on its jitter alone."""
    pairs = [([s.ttft for s in last if s.ttft is not None], [s.ttft for s in earliest if s.ttft is not None])]
    gaps = ([g for s in last for g in s.itl], [g for s in earliest for g in s.itl])
    if gaps[0] and gaps[1]:
        pairs.append(gaps)
    for a, b in pairs:
        if not a or not b:
            return False
        ma, mb = statistics.median(a), statistics.median(b)
        if close(ma, mb, tolerance / 2):
            continue
        if abs(ma - mb) > TREND_Z * math.hypot(_noise(a), _noise(b)):
            return False
    return True


def verdict(samples: Sequence[Sample], elapsed: float, rule: Rule) -> Verdict | None:
    """After each request: None to send another, else how the warmup ended. Windows are consecutive blocks
    of `rule.window` requests, judged each time one completes (from the second on): the last within
    tolerance of the one before, and no trend since the earliest of the last TREND_WINDOWS (no_trend)."""
    n, w = len(samples), rule.window
    last = before = None
    if n >= 2 * w:
        end = n - n % w
        last, before = medians(samples[end - w:end]), medians(samples[end - 2 * w:end - w])
        back = min(rule.trend_windows, end // w)
        if n % w == 0 and last is not None and before is not None and agree(last, before, rule.tolerance) \
                and (back < 2 or no_trend(samples[end - w:end], samples[end - back * w:end - (back - 1) * w],
                                          rule.tolerance)):
            return Verdict(True, n, "converged", last, before)
    if n >= FAILING_AFTER and all(s.ttft is None for s in samples[-FAILING_AFTER:]):
        return Verdict(False, n, "failing", last, before)
    if n >= rule.max_requests:
        return Verdict(False, n, "warmup_max", last, before)
    if elapsed >= rule.max_seconds:
        return Verdict(False, n, "warmup_max_seconds", last, before)
    return None


def words(v: Verdict, rule: Rule) -> str:
    """The warmup's end in a line: `stable after 24 requests (TTFT 41.2 ms, ITL 10.3 ms)`, or why not."""
    def ms(m: Medians | None) -> str:
        if m is None:
            return "a request failed"
        return f"TTFT {1000 * m.ttft:.1f} ms" + (f", ITL {1000 * m.itl:.2f} ms" if m.itl is not None else "")

    if v.converged:
        return f"stable after {v.requests} requests ({ms(v.last)}; within {100 * rule.tolerance:g} % of the " \
            "window before)"
    if v.stopped_by == "failing":
        return f"failing: the last {FAILING_AFTER} of {v.requests} requests failed; the run is marked unstable"
    bound = f"warmup_max ({rule.max_requests} requests)" if v.stopped_by == "warmup_max" else \
        f"warmup_max_seconds ({rule.max_seconds:g} s)"
    seen = f": last window {ms(v.last)}, the one before {ms(v.before)}" if v.before is not None or v.last else ""
    return f"not stable after {v.requests} requests, stopped by {bound}{seen}; the run is marked unstable"
