"""The bench client's load: when requests arrive (gamma inter-arrival times, `--burstiness`), what a
latency target asks of each request (`--slo`, goodput), and whether the run outran the server
(offered against achieved rate, TTFT growing through the run: `saturated`).

Pure functions over the run's Outcomes: the run (benchrun) records when each request was due, sent
and done; this module judges. A load search reads the results line's `saturated`, `goodput`,
`slo_attainment`, `offered_rate` and `achieved_rate`, all computed here.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from genready.tools.benchfigures import Outcome, percentile

# A run is saturated when it completes fewer than this share of the requests/s it was offered.
ACHIEVED_SHARE: Final = 0.9
# The share of the earliest and of the latest events a rate leaves out (rate_of): a run's start and its drain.
RATE_TRIM: Final = 0.1
# ... or when the time from a request's arrival to its first token grows through the run: the median of
# the last third of the requests (in arrival order) over TREND_FACTOR times that of the first third, and
# longer by at least TREND_FLOOR_MS (a 1 ms -> 3 ms change on an idle server is noise, not a queue).
TREND_FACTOR: Final = 2.0
TREND_FLOOR_MS: Final = 10.0
TREND_MIN_REQUESTS: Final = 9  # three per third: fewer says nothing about a trend

SLO_METRICS: Final = ("ttft", "itl", "e2e")
_SLO_KEY: Final = re.compile(r"(ttft|itl|e2e)_p(\d+(?:\.\d+)?)_ms")


def arrival_times(rate: float, burstiness: float, seed: int | None, *, count: int,
                  until: float | None = None) -> Iterator[float]:
    """Seconds after the run's start at which requests arrive: the first at 0, then gaps drawn from a gamma
    distribution of shape `burstiness` and mean 1/`rate`; at most `count`, none after `until`.

    As vLLM's benchmark defines burstiness (vllm/benchmarks/serve.py, get_request: np.random.gamma(shape=
    burstiness, scale=1 / (request_rate * burstiness))): 1 is a Poisson process, below 1 burstier, above 1
    more even. Unlike vLLM the gaps are not rescaled so that the last arrival falls at N/rate: a --duration
    run has no last arrival to rescale to, and one rule for both kinds of run keeps the seed's times the same.
    Shape 1 draws with expovariate, which the client used before --burstiness: the same seed, the same times."""
    if not (rate > 0 and burstiness > 0 and math.isfinite(rate) and math.isfinite(burstiness)):
        raise ValueError(f"rate and burstiness must be positive numbers, not {rate!r}, {burstiness!r}")
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    t = 0.0
    for _ in range(count):  # bounded by count; `until` ends it sooner
        if until is not None and t > until:
            return
        yield t
        t += rng.expovariate(rate) if burstiness == 1.0 else rng.gammavariate(burstiness, scale)


# --- the latency target ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SloPart:
    """One part of --slo: `metric`'s `pct` percentile over the run at most `limit_ms`; per request, that
    request's own figure at most `limit_ms`."""

    metric: str  # ttft | itl (the request's mean gap between tokens) | e2e
    pct: float
    limit_ms: float

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.pct:g}_ms"


def parse_slo(text: str) -> tuple[SloPart, ...]:
    """`ttft_p99_ms=500,itl_p50_ms=40,e2e_p99_ms=9000` as SloParts; ValueError naming the part that is wrong."""
    parts: dict[str, SloPart] = {}
    for raw in text.split(","):
        item = raw.strip()
        name, eq, value = item.partition("=")
        name = name.strip()
        m = _SLO_KEY.fullmatch(name)
        if not eq or m is None:
            raise ValueError(f"{item!r}: expected METRIC_pNN_ms=MILLISECONDS with METRIC one of "
                             f"{', '.join(SLO_METRICS)} (e.g. ttft_p99_ms=500)")
        pct = float(m.group(2))
        if not 0 < pct <= 100:
            raise ValueError(f"{item!r}: the percentile must be above 0 and at most 100, not {m.group(2)}")
        try:
            limit = float(value)
        except ValueError:
            limit = math.nan
        if not (limit > 0 and math.isfinite(limit)):
            raise ValueError(f"{item!r}: expected a positive number of milliseconds, found {value.strip()!r}")
        part = SloPart(m.group(1), pct, limit)
        if part.key in parts or any(p.metric == part.metric for p in parts.values()):
            raise ValueError(f"{item!r}: {part.metric} is named twice (one limit per request figure)")
        parts[part.key] = part
    return tuple(parts.values())


def request_ms(o: Outcome, metric: str) -> float | None:
    """One request's figure for `metric` in ms: its TTFT, its mean gap between tokens (0 with fewer than
    two tokens, as vLLM's goodput takes its TPOT), its end-to-end latency; None when it has none."""
    if metric == "ttft":
        return None if o.ttft is None else o.ttft * 1000
    if metric == "itl":
        return statistics.fmean(o.itl) * 1000 if o.itl else (0.0 if o.ttft is not None else None)
    return o.seconds * 1000


def meets(o: Outcome, parts: Sequence[SloPart]) -> bool:
    """Whether one request met every part: it succeeded and each of its figures is within the limit."""
    if not o.ok:
        return False
    for p in parts:
        v = request_ms(o, p.metric)
        if v is None or v > p.limit_ms:
            return False
    return True


@dataclass(frozen=True)
class SloResult:
    good: int  # requests that met every part
    attainment: float | None  # good / every request due (a failed or unsent one did not); None: none due
    goodput: float  # good requests per second of the run (vLLM's request_goodput: good / duration)
    met: bool  # every part's percentile over the run's successful requests within its limit
    parts: dict[str, dict[str, float | bool | None]]  # key -> limit_ms, found_ms, met, attainment


def judge(outcomes: Sequence[Outcome], parts: Sequence[SloPart], wall_seconds: float,
          unsent: int = 0) -> SloResult:
    """The run against the SLO: each request judged on its own figures (goodput, attainment, as vLLM's
    calculate_metrics in vllm/benchmarks/serve.py), and the run's percentiles of the same figures.
    `unsent` arrivals (due, never sent: --duration) count against attainment, as failed requests do."""
    good = sum(1 for o in outcomes if meets(o, parts))
    offered = len(outcomes) + unsent
    table: dict[str, dict[str, float | bool | None]] = {}
    for p in parts:
        values = sorted(v for o in outcomes if o.ok and (v := request_ms(o, p.metric)) is not None)
        found = percentile(values, p.pct)
        within = sum(1 for v in values if v <= p.limit_ms)
        table[p.key] = {"limit_ms": p.limit_ms, "found_ms": None if found is None else round(found, 3),
                        "met": found is not None and found <= p.limit_ms,
                        "attainment": round(within / offered, 6) if offered else None}
    return SloResult(good, good / offered if offered else None, good / max(wall_seconds, 1e-9),
                     bool(table) and all(t["met"] for t in table.values()), table)


# --- offered against achieved -----------------------------------------------------------------------

def rate_of(times: Sequence[float]) -> float | None:
    """Events per second: the least-squares slope of the events' count against their time, over the middle
    RATE_TRIM..1-RATE_TRIM of them; None for fewer than two or a zero span. Arrivals and completions are
    measured alike. Not (n - 1) / (last - first): completions are arrivals shifted by each request's own
    latency, and with output lengths that vary (any real dataset) the first and last completions' latencies
    alone stretched the span, so a server far from its limit read as saturated (issue 53 #2: 3 seeds of 3 at
    2 req/s). The slope spreads that jitter over every event, and the trim drops the run's start and drain."""
    ordered = sorted(times)
    cut = round(RATE_TRIM * (len(ordered) - 1))
    ordered = ordered[cut:len(ordered) - cut]
    n = len(ordered)
    if n < 2:
        return None
    mean_t, mean_k = statistics.fmean(ordered), (n - 1) / 2
    spread = sum((t - mean_t) ** 2 for t in ordered)
    if spread <= 0:
        return None
    return sum((t - mean_t) * (k - mean_k) for k, t in enumerate(ordered)) / spread


def ttft_trend(outcomes: Sequence[Outcome]) -> tuple[float, float, float] | None:
    """(last third's median / first third's, first median ms, last median ms) of the time from each
    successful request's arrival to its first token (to its end, unstreamed), in arrival order: waiting
    for a client slot counts, as a queue in the server would; None with fewer than TREND_MIN_REQUESTS."""
    waits = [((o.arrival if o.arrival is not None else o.sent),
              (o.sent - (o.arrival if o.arrival is not None else o.sent)) * 1000
              + (o.ttft if o.ttft is not None else o.seconds) * 1000)
             for o in outcomes if o.ok]
    if len(waits) < TREND_MIN_REQUESTS:
        return None
    ordered = [w for _, w in sorted(waits)]
    third = len(ordered) // 3
    first, last = statistics.median(ordered[:third]), statistics.median(ordered[-third:])
    return (last / first if first > 0 else math.inf), first, last


@dataclass(frozen=True)
class Load:
    """What the run was offered and what it achieved."""

    offered_rate: float | None  # --request-rate (None: closed loop, C back to back)
    scheduled_rate: float | None  # the drawn arrivals' own rate (rate_of the arrival times)
    achieved_rate: float | None  # rate_of the successful requests' completions
    peak_concurrency: int
    trend: tuple[float, float, float] | None
    saturated: bool | None  # None: neither rule could be applied
    reasons: tuple[str, ...]


def load_of(outcomes: Sequence[Outcome], offered_rate: float | None, peak: int,
            unsent: Sequence[float] = ()) -> Load:
    """Offered, achieved, and `saturated` by its two rules (docs/benchclient.md). `unsent`: the due times of
    arrivals a --duration run never sent (offered, not achieved)."""
    arrivals = [o.arrival for o in outcomes if o.arrival is not None] + list(unsent)
    scheduled = rate_of(arrivals) if offered_rate is not None else None
    achieved = rate_of([o.sent + o.seconds for o in outcomes if o.ok])
    trend = ttft_trend(outcomes)
    reasons: list[str] = []
    judged = False
    if scheduled is not None and achieved is not None:
        judged = True
        if achieved < ACHIEVED_SHARE * scheduled:
            reasons.append(f"achieved {achieved:.2f} requests/s, under {ACHIEVED_SHARE:.0%} of the "
                           f"{scheduled:.2f} offered")
    if trend is not None:
        judged = True
        ratio, first, last = trend
        if ratio > TREND_FACTOR and last - first >= TREND_FLOOR_MS:
            reasons.append(f"time to first token grew from {first:.1f} ms (first third) to {last:.1f} ms "
                           "(last third)")
    return Load(offered_rate, scheduled, achieved, peak, trend, bool(reasons) if judged else None, tuple(reasons))
