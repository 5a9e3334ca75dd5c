"""`repeats = "auto"`: a point gets another run only while the answer about it is unclear.

After each ok run, the point's output tok/s over its runs so far is compared with the *leader* at its client
setting: the configuration with the highest median among those run before it there (the baseline's rounds
included; another round of its own configuration never counts). The comparison is the report's (noise.ratio:
log scale, Welch's t, with the spread between loads the A/A start or the baseline's rounds measured so far). Its
95 % interval decides (`rule`):

    behind   the interval lies below 1: clearly slower than the leader, no more runs
    ahead    the interval lies above 1: clearly faster, it leads now
    tied     the interval holds 1, and at the ratio measured so far even max_repeats runs of it (at its runs'
             spread now) could not leave 1 out: the leader's runs are done and the between-load part never
             shrinks, so more runs would not tell them apart (a futility stop on the current estimate)
    alone    no other configuration at its setting yet (the first there, often the baseline): its own interval
             is within half the plan's noise_limit either side, so a later comparison is limited by the other
    cap      max_repeats runs, the interval still holding 1
    failed   its last run did not end ok (after its attempts)

Each run needs at least MIN_RUNS (a spread needs two). Every run is a run like any other (runner.tries:
a verified instance, the warmup, the flush), in the point's repeat folder. Each of its results lines carries
`repeats_auto`: {"stop": one of the words above or null (another run follows), "runs": the ok runs so far,
"leader": the leader's point index or null, "ratio": {"value", "low", "high"} against it or null}; --resume
reads them back (a point whose last line says stop is done).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from genready.compat import StrEnum
from genready.sweep import noise
from genready.sweep.noise import Ratio
from genready.sweep.plan import Point
from genready.sweep.rows import Benches
from genready.sweep.run import baseline as sweepbaseline
from genready.sweep.run import noisecheck
from genready.sweep.run.noisecheck import Sweep
from genready.sweep.run.results import Status

MIN_RUNS: Final = 2
FIELD: Final = "repeats_auto"  # the results line's field
TPS: Final = noisecheck.TPS


class Stop(StrEnum):
    BEHIND = "behind"
    AHEAD = "ahead"
    TIED = "tied"
    ALONE = "alone"
    CAP = "cap"
    FAILED = "failed"


@dataclass(frozen=True)
class Verdict:
    stop: Stop | None  # None: another run
    runs: int
    leader: int | None = None
    ratio: Ratio | None = None

    def to_json(self) -> dict[str, Any]:
        r = self.ratio
        return {"stop": self.stop.value if self.stop else None, "runs": self.runs, "leader": self.leader,
                "ratio": None if r is None else {"value": r.value, "low": r.low, "high": r.high}}

    def words(self) -> str:
        against = f" against point {self.leader}: {self.ratio.value:.3f}x [{self.ratio.low:.3f}-" \
            f"{self.ratio.high:.3f}]" if self.ratio is not None and self.ratio.low is not None else ""
        what = f"stop ({self.stop.value})" if self.stop else "another run"
        return f"repeats auto: {self.runs} runs{against}; {what}"


def _half(runs: Sequence[float], level: float = noise.LEVEL) -> float:
    """The half-width of the `level` interval of the runs' mean log (no between-load part: one load)."""
    logs = [math.log(v) for v in runs]
    return noise.t_quantile(1 - (1 - level) / 2, len(logs) - 1) * math.sqrt(noise.variance(logs) / len(logs))


def rule(mine: Sequence[float], leader: Sequence[float] | None, *, loads: noise.Components | None, cap: int,
         noise_limit: float) -> tuple[Stop | None, Ratio | None]:
    """Whether a point with the ok runs `mine` (output tok/s) stops, against the leader's runs (None: no other
    configuration at its setting yet), with the spread between loads measured so far (`loads`); the ratio it was
    judged by (module doc)."""
    n = len(mine)
    if n < MIN_RUNS:
        return (Stop.CAP if n >= cap else None), None
    if not leader:
        if _half(mine) <= math.log1p(noise_limit) / 2:
            return Stop.ALONE, None
        return (Stop.CAP if n >= cap else None), None
    got = noise.ratio(mine, leader, loads=loads)
    if got is None or got.low is None or got.high is None:
        return (Stop.CAP if n >= cap else None), got
    if got.high < 1.0:
        return Stop.BEHIND, got
    if got.low > 1.0:
        return Stop.AHEAD, got
    if n >= cap:
        return Stop.CAP, got
    if _at_cap_holds(mine, leader, got.value, loads, cap):
        return Stop.TIED, got
    return None, got


def _at_cap_holds(mine: Sequence[float], leader: Sequence[float], value: float, loads: noise.Components | None,
                  cap: int) -> bool:
    """The interval of `value` still holds 1 with `cap` runs of the point at its runs' variance now."""
    lm, ll = [math.log(v) for v in mine], [math.log(v) for v in leader]
    va = noise.variance(lm) / cap
    vb = noise.variance(ll if len(ll) >= 2 else lm) / len(ll)
    df = noise.interval_df(va + vb, va * va / (cap - 1) + vb * vb / max(1, len(ll) - 1), loads, float(cap - 1))
    half = noise.t_quantile(1 - (1 - noise.LEVEL) / 2, df) * math.sqrt(va + vb + noise.loads_part(loads))
    return half >= abs(math.log(value))


class Auto:
    """The rule applied in a sweep: `repeats` for the runner's loop, `fields` for each results line."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.benches: Benches = {}  # bench lines read so far (a finished run's never changes)

    def repeats(self, point: Point, reload: int = 0) -> Iterator[int]:
        """The repeat numbers to run on this load of the point (a search's `reload`: a load of its own), one at a
        time: the next while the last line's verdict says another run."""
        cap = self.sweep.opts.plan.repeats
        done = self.sweep.results.done_repeats(point.index, reload)
        for r in range(1, cap + 1):
            if r not in done:
                yield r
            verdict = self._last(point)
            if verdict is None or verdict.get("stop") is not None:
                return

    def _last(self, point: Point) -> Mapping[str, Any] | None:
        """The verdict of the point's last line; None when it has none (a run that did not end ok: stop)."""
        lines = self.sweep.results.lines(point.index)
        got = lines[-1].get(FIELD) if lines else None
        return got if isinstance(got, Mapping) else None

    def fields(self, point: Point, rec: dict[str, Any]) -> dict[str, Any]:
        """The `repeats_auto` field of a point's results line `rec` (before it is written); {} for a line that is
        not a run of a point under the rule (an A/A load) or not ok (the loop stops on it: `failed`)."""
        if point.aa or rec.get("status") != Status.OK.value:
            return {}
        lines = [*self.sweep.results.lines(point.index), rec]
        mine = noisecheck.samples_of(self.sweep, lines, self.benches).get(TPS, [])
        if not mine:
            return {FIELD: Verdict(Stop.FAILED, 0).to_json()}
        leader, runs = self._leader(point)
        est = noisecheck.evidence(self.sweep, self.benches)
        plan = self.sweep.opts.plan
        stop, got = rule(mine, runs, loads=est.loads(TPS) if est is not None else None, cap=plan.repeats,
                         noise_limit=plan.noise_limit)
        verdict = Verdict(stop, len(mine), leader, got)
        self.sweep.console.progress(point, verdict.words())
        return {FIELD: verdict.to_json()}

    def _leader(self, point: Point) -> tuple[int | None, list[float] | None]:
        """The leader at the point's client setting: the highest median output tok/s among the other
        configurations run there so far (another baseline round is not another configuration)."""
        plan = self.sweep.opts.plan
        key = sweepbaseline.setting_key(plan, point)
        best: tuple[float, int, list[float]] | None = None
        for g in self.sweep.groups:
            for p in g:
                if p.index == point.index or p.aa or (p.baseline and point.baseline) or \
                        sweepbaseline.setting_key(plan, p) != key:
                    continue
                runs = noisecheck.samples(self.sweep, p, self.benches).get(TPS, [])
                if runs and (best is None or statistics.median(runs) > best[0]):
                    best = (statistics.median(runs), p.index, runs)
        return (best[1], best[2]) if best is not None else (None, None)


def finished(lines: Sequence[Mapping[str, Any]]) -> bool:
    """--resume: an earlier run's ok lines of a point (in file order) end with a verdict that stopped it."""
    got = lines[-1].get(FIELD) if lines else None
    return isinstance(got, Mapping) and got.get("stop") is not None
