"""The replay's verdict (issue 52 §2): the schedule, run in one more load, against the best static configuration.

`genready sweep replay DIR --schedule ENGINE` (sweep/replay.py) loaded the unit once more with the schedule and
ran each load level of the sweep with the same command (prompts, seed) and repeats into DIR/replay/, beside
DIR/replay/schedule.json (the engine, the tiers it ran). Here, per level: the schedule's output tok/s over the
best static configuration's at that level (the best depth by its estimate, the baseline standing as depth 0),
with its 95 % interval over the repeats (noise.ratio: with the sweep's spread between loads where it measured
one), and its latency figures (TTFT, ITL and end-to-end p50, each with its ratio to the static's; below 1 is
faster).

A level below REGRESSION (0.90x) of the best static is a regression: vLLM #49548's shape, a table whose
threshold collapses throughput at one load. The Decision then does not recommend the schedule: its Deploy line
names the best single static configuration over the loads (the depth whose output tok/s has the highest
geometric mean over the levels, the shallower of equals) and says why. A replay of another schedule than the
one the sweep's results give now (the folder was measured again since, or the engine differs) is not used, and
the report says so.

Pure functions of the rows and the replay's schedule file: report/main.py reads the folders.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from genready.store import bounded
from genready.sweep import noise
from genready.sweep.noise import Ratio
from genready.sweep.report import decision
from genready.sweep.report import schedule as sweepschedule
from genready.sweep.rows import Row
from genready.tools import benchline

REPLAY_DIR: Final = "replay"  # DIR/replay: the replay's results folder, beside the sweep's
SCHEDULE_FILE: Final = "schedule.json"  # DIR/replay/schedule.json: what the replay ran
REGRESSION: Final = 0.90  # a level below this fraction of the best static's output tok/s is a regression
LATENCIES: Final = (benchline.TTFT_P50_MS, benchline.ITL_P50_MS, benchline.E2E_P50_MS)
MAX_SCHEDULE_BYTES: Final = 1 << 20


@dataclass(frozen=True)
class Level:
    """One load level of the replay."""

    load: int  # requests in flight
    depth: int  # the schedule's depth here
    static: int  # the best static depth here, by its estimate (0: speculation off)
    static_tps: float
    tps: float | None  # the schedule's output tok/s (None: no ok run at this level)
    ratio: Ratio | None  # the schedule's output tok/s over the static's
    latency: tuple[tuple[str, float | None, Ratio | None], ...]  # (figure key, the schedule's p50, over the static's)
    status: str = "ok"  # the replay's run at this load: its status (config_mismatch, failed...), "not run" when none

    @property
    def regression(self) -> bool:
        return self.ratio is not None and self.ratio.value < REGRESSION


@dataclass(frozen=True)
class Replay:
    engine: str
    axis: str
    held: dict[str, Any]
    levels: tuple[Level, ...]
    fallback: int  # the best single static depth over the loads: what runs instead of a schedule that regressed
    folder: str

    @property
    def regressed(self) -> list[Level]:
        return [lv for lv in self.levels if lv.regression]

    @property
    def missing(self) -> list[Level]:
        return [lv for lv in self.levels if lv.ratio is None]

    @property
    def verified(self) -> bool:
        return not self.regressed and not self.missing


def read_schedule(folder: Path) -> dict[str, Any] | None:
    """DIR/replay/schedule.json, or None when there is no replay; bounded.FileError when it cannot be read."""
    path = folder / REPLAY_DIR / SCHEDULE_FILE
    try:
        raw = bounded.read_file(path, MAX_SCHEDULE_BYTES)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise bounded.FileError(path, f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise bounded.FileError(path, "expected a JSON object")
    return doc


def stale(planned: sweepschedule.Schedule, ran: Mapping[str, Any], engine: str | None) -> str:
    """Why the replay that ran `ran` (its schedule.json) does not prove `planned` for `engine` ("" when it does)."""
    if engine is not None and ran.get("engine") != engine:
        return f"it ran the {ran.get('engine')} schedule, not {engine}'s"
    if ran.get("tiers") != [list(t) for t in planned.tiers()] or ran.get("axis") != planned.axis:
        return "it ran another schedule than the sweep's results give now (they were measured again since)"
    return ""


def _values(r: Row, key: str) -> list[float]:
    got = [v for v in r.samples.get(key, []) if math.isfinite(v)]
    v = (r.figures or {}).get(key)
    return got or ([v] if v is not None and math.isfinite(v) else [])


def fallback(planned: sweepschedule.Schedule) -> int:
    """The best single static depth: measured at every level, the highest geometric mean of output tok/s over
    them; the shallower of equals."""
    common = set.intersection(*(set(lv.rows) for lv in planned.levels))

    def score(d: int) -> float:
        return sum(math.log(decision.tps(lv.rows[d]) or 1e-300) for lv in planned.levels)

    return max(sorted(common), key=score) if common else planned.levels[0].best


def replay_of(planned: sweepschedule.Schedule, client: set[str], rows: Sequence[Row], engine: str,
              folder: str) -> Replay:
    """The replay's rows (DIR/replay's) level by level against the sweep's schedule; `client`: the sweep's client
    axes, which name a replay row's load level."""
    mine: dict[int, Row] = {}
    for r in rows:
        try:
            load = sweepschedule.load_of({k: v for k, v in r.point.items() if k in client})
        except sweepschedule.NoSchedule:
            continue
        if load not in mine or decision.tps(r) is not None:
            mine[load] = r
    levels = []
    for lv in planned.levels:
        best = lv.rows.get(lv.best)
        got = mine.get(lv.load)
        static_tps = decision.tps(best) if best is not None else None
        if best is None or static_tps is None or got is None or decision.tps(got) is None:
            levels.append(Level(lv.load, lv.depth, lv.best, static_tps or 0.0, None, None, (),
                                got.status if got is not None else "not run"))
            continue
        latency = tuple((f.key, (got.figures or {}).get(f.key), _ratio(got, best, f.key)) for f in LATENCIES)
        levels.append(Level(lv.load, lv.depth, lv.best, static_tps, decision.tps(got),
                            _ratio(got, best, decision.TPS), latency))
    return Replay(engine, planned.axis, dict(planned.held), tuple(levels), fallback(planned), folder)


def _ratio(got: Row, best: Row, key: str) -> Ratio | None:
    """The replay's figure over the best static's: two loads, so the interval takes in the sweep's spread between
    loads where it measured one (noise.py), as every interval of the report does."""
    return noise.ratio(_values(got, key), _values(best, key), loads=best.noise.loads(key) if best.noise else None)


def _depth(axis: str, d: int) -> str:
    return "speculation off" if d == 0 else f"{axis}={d}"


def _interval(r: Ratio) -> str:
    return f" [95 % interval {r.low:.2f}-{r.high:.2f}]" if r.low is not None and r.high is not None else ""


def level_words(rp: Replay, lv: Level) -> str:
    head = f"c={lv.load}: {_depth(rp.axis, lv.depth)} by the schedule"
    if lv.ratio is None or lv.tps is None:
        return f"{head}: no ok run in the replay ({lv.status}; not verified at this load)"
    lat = ", ".join(f"{key.removesuffix('_ms').replace('_', ' ').upper().replace(' P', ' p')} {v:.1f} ms"
                    + (f" ({r.value:.2f}x)" if r is not None else "")
                    for key, v, r in lv.latency if v is not None)
    verdict = (f"REGRESSION: below {REGRESSION:.2f}x of the best static (vLLM #49548's shape)" if lv.regression
               else "ok")
    return (f"{head}: {lv.tps:.1f} output tok/s, {lv.ratio.value:.2f}x the best static's ({_depth(rp.axis, lv.static)}"
            f", {lv.static_tps:.1f}){_interval(lv.ratio)}" + (f"; {lat}" if lat else "") + f"; {verdict}")


def summary(rp: Replay) -> str:
    if rp.regressed:
        worst = min(rp.regressed, key=lambda lv: lv.ratio.value if lv.ratio else 1.0)
        assert worst.ratio is not None
        return (f"Not recommended: the schedule regressed at {', '.join(f'c={lv.load}' for lv in rp.regressed)} "
                f"({worst.ratio.value:.2f}x the best static at c={worst.load}); run "
                f"{_static_words(rp)} instead")
    if rp.missing:
        return f"Not verified at {', '.join(f'c={lv.load}' for lv in rp.missing)}: run `genready sweep replay` again"
    ratios = [lv.ratio.value for lv in rp.levels if lv.ratio is not None]
    return (f"Verified: {min(ratios):.2f}x-{max(ratios):.2f}x the best static configuration at each load, none below "
            f"{REGRESSION:.2f}x")


def _static_words(rp: Replay) -> str:
    held = decision.values_words(rp.held)
    if rp.fallback == 0:
        return "no speculation (the baseline's drop-in)"
    return f"the plan's drop-in with {rp.axis}={rp.fallback}" + (f" {held}" if held else "")


def text(rp: Replay, fmt: str = "table") -> str:
    head = (f"Replay ({rp.engine}): the schedule loaded once more and run at each load of the sweep ({rp.folder}), "
            "against the best static configuration at each load")
    lines = [level_words(rp, lv) for lv in rp.levels] + [summary(rp)]
    if fmt == "markdown":
        return f"## {head}\n\n" + "".join(f"    {ln}\n" for ln in lines) + "\n"
    return head + "\n" + "".join(f"  {ln}\n" for ln in lines) + "\n"


def deploy_line(rp: Replay, rows: Sequence[Row], engine: str | None) -> str:
    """The Decision's last sentence with the replay's verdict: the static configuration when the schedule
    regressed, else the schedule with its verified figures."""
    if rp.regressed:
        return (f"Deploy: {_static_words(rp)}, the best static configuration over the loads: the schedule is not "
                f"recommended, {summary(rp).removeprefix('Not recommended: ').split('; run ')[0]}, below "
                f"{REGRESSION:.2f}x (vLLM #49548's shape).")
    line = sweepschedule.deploy_line(rows, engine or rp.engine).removesuffix(".")
    return f"{line}. {summary(rp)} (one more load, {rp.folder})."


def as_json(rp: Replay) -> dict[str, Any]:
    def ratio(r: Ratio | None) -> dict[str, float | None] | None:
        return None if r is None else {"value": r.value, "low": r.low, "high": r.high}

    return {"engine": rp.engine, "folder": rp.folder, "verified": rp.verified,
            "recommended": not rp.regressed, "fallback": rp.fallback, "regression_below": REGRESSION,
            "levels": [{benchline.CONCURRENCY.key: lv.load, "status": lv.status, "depth": lv.depth, "static": lv.static,
                        "static_" + decision.TPS: lv.static_tps, decision.TPS: lv.tps,
                        "speedup": ratio(lv.ratio), "regression": lv.regression,
                        **{key: v for key, v, _ in lv.latency},
                        **{key.removesuffix("_ms") + "_ratio": ratio(r) for key, _, r in lv.latency}}
                       for lv in rp.levels]}
