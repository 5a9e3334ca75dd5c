"""A load search per server configuration (issue 39 §2): the plan's `[search]` table, and what to run next.

Pure decisions: `next_step(spec, done)` is the next step from the steps run so far (None: the search is over),
`bench_args(spec, step)` the bench client flags that run it, `found(spec, done)` what the search found. Running a
step, verifying the instance, flushing and warming it are the runner's, as for any run.

- `mode = "saturation"` follows guidellm's `--profile sweep`: a synchronous run (one at a time), a throughput
  run (all at once, at most `max_concurrency` in flight), then `steps` rates strictly between the two rates they
  achieved, evenly (`spacing = "linear"`) or geometrically spaced, in ascending order, stopping after the first
  step the bench client calls `saturated`.
- `mode = "slo"` finds the highest `axis = "rate"` (requests/s) or `"concurrency"` meeting `slo` (the bench
  client's `--slo` text): it brackets (doubling from `start`, or halving when `start` already fails), then
  bisects the bracket, within `max_steps` steps in all; a step meets the SLO when the bench client says
  `slo_met` and, on the rate axis, the run was not `saturated` (a rate it could not keep up with is not served).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from genready.compat import StrEnum
from genready.config import ConfigError
from genready.tools import benchline
from genready.tools.benchload import parse_slo


class Mode(StrEnum):
    SATURATION = "saturation"
    SLO = "slo"


class Axis(StrEnum):
    RATE = "rate"
    CONCURRENCY = "concurrency"


class Spacing(StrEnum):
    LINEAR = "linear"
    GEOMETRIC = "geometric"


@dataclass(frozen=True)
class SearchSpec:
    """A plan's `[search]` table, checked."""

    mode: Mode
    axis: Axis = Axis.RATE
    steps: int = 5
    spacing: Spacing = Spacing.LINEAR
    max_concurrency: int = 64
    max_steps: int = 8
    slo: str | None = None
    start: float = 1.0  # slo mode: the first rate (requests/s) or concurrency tried
    max_requests_per_step: int = 200
    max_step_seconds: float = 60.0


@dataclass(frozen=True)
class Step:
    """One step of a search: `rate` None is a closed loop of `concurrency` requests back to back."""

    index: int  # 1-based: the results line's `search_step`
    kind: str  # synchronous, throughput, rate; bracket, bisect
    rate: float | None
    concurrency: int


@dataclass(frozen=True)
class Outcome:
    """What a step's results line says: requests/s achieved, `saturated`, `slo_met` (None: not judged), and
    the output tok/s (None: not given), which the crossover (crossover.py) compares."""

    step: Step
    achieved_rate: float
    saturated: bool | None = None
    slo_met: bool | None = None
    output_tps: float | None = None

    @classmethod
    def of_line(cls, step: Step, line: Mapping[str, Any]) -> Outcome:
        """From a bench client results line (`requests_per_second`, `saturated`, `slo_met`,
        `output_tokens_per_second`)."""
        tps = line.get(benchline.OUTPUT_TOKENS_PER_SECOND.key)
        return cls(step, float(line.get(benchline.REQUESTS_PER_SECOND.key) or 0.0), line.get(benchline.SATURATED.key),
                   line.get(benchline.SLO_MET.key),
                   float(tps) if isinstance(tps, int | float) and not isinstance(tps, bool) else None)


# --- the [search] table ----------------------------------------------------------------------------

_INT_KEYS: Final = {"steps": (1, 100), "max_concurrency": (1, 100_000), "max_steps": (2, 100),
                    "max_requests_per_step": (1, 10_000_000)}
_FLOAT_KEYS: Final = {"start": "a number > 0", "max_step_seconds": "a number of seconds > 0"}
_ENUM_KEYS: Final[dict[str, type[StrEnum]]] = {"mode": Mode, "axis": Axis, "spacing": Spacing}
KEYS: Final = ("mode", "axis", "steps", "spacing", "max_concurrency", "max_steps", "slo", "start",
               "max_requests_per_step", "max_step_seconds")


def _found(v: object) -> str:
    return f"{type(v).__name__} {v!r}"[:80]


def parse(table: object, file: str, prefix: str = "search") -> SearchSpec:
    """A plan's `[search]` table as a SearchSpec; ConfigError naming the key, what it takes and what it found."""
    if not isinstance(table, Mapping):
        raise ConfigError(file, prefix, "a table", _found(table))
    for key in table:
        if key not in KEYS:
            raise ConfigError(file, f"{prefix}.{key}", "one of the known keys: " + ", ".join(KEYS), repr(key))
    if "mode" not in table:
        raise ConfigError(file, f"{prefix}.mode", " or ".join(f'"{m}"' for m in Mode), "nothing")
    got: dict[str, Any] = {}
    for key, enum in _ENUM_KEYS.items():
        if key in table:
            v = table[key]
            if not isinstance(v, str) or v not in tuple(enum):
                raise ConfigError(file, f"{prefix}.{key}", " or ".join(f'"{e}"' for e in enum), _found(v))
            got[key] = enum(v)
    for key, (low, high) in _INT_KEYS.items():
        if key in table:
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ConfigError(file, f"{prefix}.{key}", f"an integer from {low} to {high}", _found(v))
            got[key] = v
    for key, expected in _FLOAT_KEYS.items():
        if key in table:
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
                raise ConfigError(file, f"{prefix}.{key}", expected, _found(v))
            got[key] = float(v)
    if "slo" in table:
        v = table["slo"]
        try:
            if not isinstance(v, str):
                raise ValueError("not a string")
            parse_slo(v)
        except ValueError as e:
            raise ConfigError(file, f"{prefix}.slo", "the bench client's --slo text, e.g. "
                              f'"ttft_p99_ms=500,itl_p50_ms=40" ({e})', _found(v)) from None
        got["slo"] = v
    spec = SearchSpec(**got)
    if spec.mode is Mode.SLO and spec.slo is None:
        raise ConfigError(file, f"{prefix}.slo", 'a latency target for mode = "slo"', "nothing")
    return spec


# --- the decisions -----------------------------------------------------------------------------------

def rates_between(low: float, high: float, n: int, spacing: Spacing) -> list[float]:
    """`n` rates strictly between `low` and `high`, ascending; none when there is no room between them."""
    if n < 1 or not 0 < low < high:
        return []
    if spacing is Spacing.GEOMETRIC:
        ratio = (high / low) ** (1 / (n + 1))
        return [low * ratio ** i for i in range(1, n + 1)]
    return [low + (high - low) * i / (n + 1) for i in range(1, n + 1)]


def passes(spec: SearchSpec, o: Outcome) -> bool:
    """A step meets the SLO: the client says so, and on the rate axis it kept up with the offered rate."""
    return o.slo_met is True and not (spec.axis is Axis.RATE and o.saturated is True)


def _value(spec: SearchSpec, o: Outcome) -> float:
    return o.step.concurrency if spec.axis is Axis.CONCURRENCY else (o.step.rate or 0.0)


def _make(spec: SearchSpec, index: int, kind: str, v: float) -> Step:
    if spec.axis is Axis.CONCURRENCY:
        return Step(index, kind, None, int(v))
    return Step(index, kind, v, spec.max_concurrency)


def _saturation_next(spec: SearchSpec, done: Sequence[Outcome]) -> Step | None:
    if not done:
        return Step(1, "synchronous", None, 1)
    if len(done) == 1:
        return Step(2, "throughput", None, spec.max_concurrency)
    if any(o.saturated is True for o in done[2:]):
        return None  # stop early: the load past the first saturated step is only more of it
    rates = rates_between(done[0].achieved_rate, done[1].achieved_rate, spec.steps, spec.spacing)
    i = len(done) - 2
    return Step(len(done) + 1, "rate", rates[i], spec.max_concurrency) if i < len(rates) else None


def _bracket(spec: SearchSpec, done: Sequence[Outcome]) -> tuple[float | None, float | None]:
    """(highest value that passed, lowest value that failed) among the steps so far."""
    ok = [_value(spec, o) for o in done if passes(spec, o)]
    bad = [_value(spec, o) for o in done if not passes(spec, o)]
    return (max(ok) if ok else None), (min(bad) if bad else None)


def _resolved(spec: SearchSpec, lo: float, hi: float) -> bool:
    if spec.axis is Axis.CONCURRENCY:
        return hi - lo <= 1
    return hi - lo <= 0.02 * hi  # 2 % of the rate: finer than a run's own noise


def _slo_next(spec: SearchSpec, done: Sequence[Outcome]) -> Step | None:
    if len(done) >= spec.max_steps:
        return None
    n = len(done) + 1
    start = max(1.0, round(spec.start)) if spec.axis is Axis.CONCURRENCY else spec.start
    if not done:
        return _make(spec, n, "bracket", start)
    lo, hi = _bracket(spec, done)
    top = float(spec.max_concurrency) if spec.axis is Axis.CONCURRENCY else math.inf
    if hi is None:  # everything passed so far: double, up to max_concurrency on that axis
        assert lo is not None
        nxt = min(lo * 2, top)
        return None if nxt <= lo else _make(spec, n, "bracket", nxt)
    if lo is None:  # everything failed: halve, down to 1 request at a time on that axis
        nxt = hi / 2
        if spec.axis is Axis.CONCURRENCY and hi <= 1:
            return None
        return _make(spec, n, "bracket", max(1.0, nxt) if spec.axis is Axis.CONCURRENCY else nxt)
    if _resolved(spec, lo, hi):
        return None
    mid = (lo + hi) / 2 if spec.axis is Axis.RATE else (lo + hi) // 2
    return _make(spec, n, "bisect", mid)


def next_step(spec: SearchSpec, done: Sequence[Outcome]) -> Step | None:
    """The step to run after `done` (every step so far, in order), or None: the search is over."""
    if spec.mode is Mode.SATURATION:
        return _saturation_next(spec, done)
    return _slo_next(spec, done)


def expected_steps(spec: SearchSpec) -> int:
    """The steps a search is expected to run, for the ETA: saturation's 2 + `steps` (fewer if it saturates
    early), slo's `max_steps` (fewer once its bracket is resolved)."""
    return 2 + spec.steps if spec.mode is Mode.SATURATION else spec.max_steps


def bench_args(spec: SearchSpec, step: Step) -> list[str]:
    """The bench client flags of a step: its load, bounded by max_requests_per_step and max_step_seconds."""
    args = ["-n", str(spec.max_requests_per_step), "-c", str(step.concurrency),
            "--duration", f"{spec.max_step_seconds:g}"]
    if step.rate is not None:
        args += ["--request-rate", f"{step.rate:.6g}"]
    if spec.slo is not None:
        args += ["--slo", spec.slo]
    return args


@dataclass(frozen=True)
class Found:
    """What a search found. saturation: the highest rate step that kept up and the first that did not, or when
    all kept up, the throughput run's achieved rate (the saturation point lies between); slo:
    `max_rate_under_slo` (the highest rate, or concurrency, that met it)."""

    steps: int
    last_unsaturated: float | None = None
    first_saturated: float | None = None
    max_under_slo: float | None = None


def found(spec: SearchSpec, done: Sequence[Outcome]) -> Found:
    if spec.mode is Mode.SLO:
        return Found(len(done), max_under_slo=_bracket(spec, done)[0])
    rated = [o for o in done[2:] if o.step.rate is not None]
    ok = [o.step.rate for o in rated if o.saturated is not True and o.step.rate is not None]
    bad = [o.step.rate for o in rated if o.saturated is True and o.step.rate is not None]
    if not bad and len(done) >= 2 and ok:  # every rate kept up: what the throughput run achieved bounds it
        bad = [done[1].achieved_rate]
    return Found(len(done), max(ok) if ok else None, min(bad) if bad else None)
