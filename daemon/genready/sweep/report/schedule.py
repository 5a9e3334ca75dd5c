"""`sweep report --schedule vllm|sglang` (issue 52 §1, §5): the speculation depth per load, in the engine's format.

A sweep whose server axes include the speculation depth (DEPTH_AXES: SGLang's steps, vLLM's
num_speculative_tokens, llama.cpp's draft-max) and whose client settings span loads (a concurrency axis,
LOAD_AXES) measured a surface: depth x load. Per load level, the best depth by output tok/s, the baseline
standing as depth 0 (speculation off: decision.py's judgement, issue 52 §4); a shallower depth ties with it when
it is within noise of the best (decision.within_noise) and its estimate gives up at most TIE_LOSS of the best's,
and the shallowest of the tied wins, as it costs less when the estimate is off. The second condition is what a
tie means: a difference too small to matter, not only one too uncertain to show. With two repeats Welch's
interval takes its degrees of freedom from the noisier side (about 1 when the other's runs agree), and held 1
for a depth 4.4 % slower whose two runs agreed within 1 % (bench/schedule.py, c=1: 94.6 against 98.9 tok/s);
the replay then measured that loss. The server's other axes are held at their best: the values whose best
depths give the highest geometric mean of output tok/s over the levels. When one depth is within noise of the
best at every level (the interval alone: nothing measured tells them apart), a schedule is not worth it and
that depth, run static, is the answer (the shallowest such).

The load level is the client's concurrency, the requests in flight, which is the engine's batch size in its
steady state (both engines count requests, not tokens). Between two levels measured, a level's depth holds up to
the geometric mean of the two (loads are swept on a log scale); below the least, the least's depth; above the
largest, the largest's (each engine carries its last tier on).

Each engine's format is its server kind's (servers/schedules.py, `ServerKind.schedule`).

Pure functions of the report's rows: the caller (report/main.py) prints, and adds the JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from genready.redact import escape
from genready.servers import kinds
from genready.servers.schedules import ScheduleFormat
from genready.sweep.report import decision
from genready.sweep.rows import Row
from genready.tools import benchline

# A server axis whose value is the speculation depth (draft tokens a step): the plan's names for it.
DEPTH_AXES: Final = ("steps", "speculative_num_steps", "num_speculative_tokens", "num_spec_tokens", "draft_max",
                     "depth", "gamma")
# A client axis whose value is the requests in flight (the bench client's -c).
LOAD_AXES: Final = ("c", "concurrency", "max_concurrency", "clients")
# A depth within noise of the best ties with it only if its estimate is at most this fraction below the best's.
TIE_LOSS: Final = 0.02


class NoSchedule(ValueError):
    """The sweep cannot give a schedule (no depth axis, no concurrency, no baseline...); the message says why."""


@dataclass(frozen=True)
class Level:
    """One load level's choice."""

    load: int  # requests in flight
    depth: int  # 0: speculation off
    tps: float  # the chosen depth's output tok/s
    best: int  # the best depth by its estimate
    tied: tuple[int, ...]  # the depths that tie with the best (the best included): `ties`
    within: tuple[int, ...]  # the depths within noise of the best (the best included): the static check
    answer: str | None  # decision.py's answer at this setting
    repeats: int | None  # decision.UNDECIDED: repeats that would tell
    rows: Mapping[int, Row] = field(default_factory=dict, compare=False, repr=False)  # each depth's row (0: off)


@dataclass(frozen=True)
class Schedule:
    axis: str
    held: dict[str, Any]  # the other server axes' values
    levels: tuple[Level, ...]  # by load
    static: int | None  # a depth within noise of the best at every level: no schedule needed

    def tiers(self) -> list[tuple[int, int, int]]:
        """[(first batch size, last batch size, depth)]: from 1, merged where the depth does not change; the last
        tier ends at the largest load measured (the engines carry it on)."""
        out: list[tuple[int, int, int]] = []
        lo = 1
        for i, lv in enumerate(self.levels):
            nxt = self.levels[i + 1].load if i + 1 < len(self.levels) else None
            hi = lv.load if nxt is None else max(lv.load, min(nxt - 1, math.isqrt(lv.load * nxt)))
            if out and out[-1][2] == lv.depth:
                out[-1] = (out[-1][0], hi, lv.depth)
            else:
                out.append((lo, hi, lv.depth))
            lo = hi + 1
        return out


def depth_axis(rows: Sequence[Row], client: set[str]) -> str:
    axes = {k for r in rows if not r.baseline for k in r.point if k not in client}
    found = [a for a in DEPTH_AXES if a in axes]
    if len(found) != 1:
        raise NoSchedule(f"a schedule needs one server axis of the speculation depth ({', '.join(DEPTH_AXES)}); "
                         f"the sweep's server axes: {', '.join(sorted(axes)) or 'none'}")
    return found[0]


def load_of(client: Mapping[str, Any]) -> int:
    numbers = {k: v for k, v in client.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    named = [k for k in LOAD_AXES if k in numbers]
    if named:
        return int(numbers[named[0]])
    if len(numbers) == 1:
        return int(next(iter(numbers.values())))
    raise NoSchedule(f"a schedule needs the client's concurrency (an axis {', '.join(LOAD_AXES)}): the engines "
                     f"switch depth by requests in flight; found the client setting {escape(json.dumps(client))}")


def _depth(r: Row, axis: str) -> int | None:
    v = r.point.get(axis)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def schedule(rows: Sequence[Row]) -> Schedule:
    """The depth per load level (module doc); NoSchedule when the sweep cannot give one."""
    if not any(r.baseline for r in rows):
        raise NoSchedule("a schedule needs the plan's `baseline` (speculation off) measured at every load")
    sets = decision.settings(rows)
    if len(sets) < 2:
        raise NoSchedule("a schedule needs two load levels or more (a concurrency list)")
    client = set(sets[0][0])
    axis = depth_axis(rows, client)
    decided = decision.decide(rows)  # the same settings, in the same order, each with its answer
    base_of = decision.baseline_runs(rows)

    def others(r: Row) -> str:
        return json.dumps({k: v for k, v in r.point.items() if k not in client and k != axis}, sort_keys=True,
                          default=str)

    # per level: held values -> depth -> the row; depth 0 from the baseline where the plan has no depth 0
    grid: list[tuple[int, dict[str, dict[int, Row]], Row | None, decision.Setting]] = []
    for (values, group), s in zip(sets, decided, strict=True):
        by: dict[str, dict[int, Row]] = {}
        for r in group:
            if decision.tps(r) is not None and (d := _depth(r, axis)) is not None:
                by.setdefault(others(r), {})[d] = r
        base = next((b for r in group if (b := base_of(r)) is not None and decision.tps(b) is not None), None)
        grid.append((load_of(values), by, base, s))
    if len({g[0] for g in grid}) != len(grid):
        raise NoSchedule("two client settings share a concurrency: a schedule is by concurrency alone")
    grid.sort(key=lambda g: g[0])
    held = _held(grid)
    levels = []
    for load, by, base, s in grid:
        cands = dict(by.get(held, {}))
        if 0 not in cands and base is not None:
            cands[0] = base
        if not cands:
            raise NoSchedule(f"no depth ran ok at concurrency {load}")
        best = max(sorted(cands), key=lambda d: decision.tps(cands[d]) or 0.0)  # the shallowest of equals
        tied = tuple(d for d in sorted(cands) if d == best or ties(cands[d], cands[best]))
        within = tuple(d for d in sorted(cands) if d == best or decision.within_noise(cands[d], cands[best]))
        levels.append(Level(load, tied[0], decision.tps(cands[tied[0]]) or 0.0, best, tied, within, s.answer,
                            s.repeats, cands))
    everywhere = set.intersection(*(set(lv.within) for lv in levels))
    return Schedule(axis, json.loads(held), tuple(levels), min(everywhere) if everywhere else None)


def ties(r: Row, best: Row) -> bool:
    """`r` ties with `best` (module doc): within noise of it, and its estimate at most TIE_LOSS below."""
    mine, top = decision.tps(r), decision.tps(best)
    return mine is not None and top is not None and mine >= (1.0 - TIE_LOSS) * top and decision.within_noise(r, best)


def _held(grid: Sequence[tuple[int, dict[str, dict[int, Row]], Row | None, decision.Setting]]) -> str:
    """The other server axes' values whose best depths give the highest geometric mean over the levels (among
    those measured at every level)."""
    common = set.intersection(*(set(by) for _, by, _, _ in grid))
    if not common:
        raise NoSchedule("no values of the other server axes were measured at every load")

    def score(key: str) -> float:
        return sum(math.log(max(decision.tps(r) or 1e-300 for r in by[key].values())) for _, by, _, _ in grid)

    return max(sorted(common), key=score)


# The engines that take a schedule, by their kind's name, each with its format (servers/schedules.py).
FORMATS: Final[Mapping[str, ScheduleFormat]] = {k.name: k.schedule for k in kinds.KINDS if k.schedule is not None}
ENGINES: Final = tuple(FORMATS)


def _depth_words(axis: str, d: int) -> str:
    return "speculation off" if d == 0 else f"{axis}={d}"


def static_words(s: Schedule) -> str:
    assert s.static is not None
    held = decision.values_words(s.held)
    what = _depth_words(s.axis, s.static) + (f" {held}" if held and s.static else "")
    return f"{what} at every load: a schedule is not worth it, it is within noise of the best at each load measured"


def text(s: Schedule, engine: str, fmt: str = "table") -> str:
    """The schedule's section: a line per level, then what carries it (or that one static depth does)."""
    head = f"Schedule ({engine}): the best {s.axis} per concurrency" + \
        (f", the other server axes held at {decision.values_words(s.held)}" if s.held else "")
    lines = []
    for lv in s.levels:
        line = f"c={lv.load}: {_depth_words(s.axis, lv.depth)} ({lv.tps:.1f} output tok/s)"
        if lv.best != lv.depth:
            line += f"; the best by its estimate, {_depth_words(s.axis, lv.best)}, is within noise of it and at most " \
                f"{TIE_LOSS:.0%} faster"
        if lv.answer == decision.UNDECIDED:
            line += "; the baseline cannot be told from the best here: " + \
                (f"repeats = {lv.repeats} would" if lv.repeats else "the runs are too noisy")
        lines.append(line)
    if s.static is not None:
        lines.append("No schedule: " + static_words(s))
    else:
        lines += FORMATS[engine].carrier(s.tiers())
    if fmt == "markdown":
        return f"## {head}\n\n" + "".join(f"    {ln}\n" for ln in lines) + "\n"
    return head + "\n" + "".join(f"  {ln}\n" for ln in lines) + "\n"


def as_json(s: Schedule, engine: str) -> dict[str, Any]:
    return {"engine": engine, "axis": s.axis, "held": s.held,
            "levels": [{benchline.CONCURRENCY.key: lv.load, "depth": lv.depth,
                        benchline.OUTPUT_TOKENS_PER_SECOND.key: lv.tps, "best": lv.best,
                        "within_noise": list(lv.within), "ties": list(lv.tied), "answer": lv.answer,
                        "repeats_needed": lv.repeats}
                       for lv in s.levels],
            "tiers": [list(t) for t in s.tiers()],
            "static": s.static, "worth_it": s.static is None,
            engine: FORMATS[engine].data(s.tiers()),
            "carrier": FORMATS[engine].carrier(s.tiers()) if s.static is None else []}


def deploy_line(rows: Sequence[Row], engine: str | None) -> str:
    """The Decision's last sentence (issue 52 §5): what to run. With a depth axis over loads, the schedule (its
    flags when `engine` is given) or the one static depth; otherwise the one configuration the Decision names at
    every setting, or each setting's."""
    try:
        s = schedule(rows)
    except NoSchedule:
        return _static_deploy(rows)
    if s.static is not None:
        held = decision.values_words(s.held)
        values = f"{s.axis}={s.static}" + (f" {held}" if held else "")
        return ("Deploy: no speculation (the baseline's drop-in)" if s.static == 0 else
                f"Deploy: the plan's drop-in with {values}") + f": {static_words(s)}."
    steps = ", ".join(f"{_depth_words(s.axis, lv.depth)} at c={lv.load}" for lv in s.levels)
    if engine is None:
        return (f"Deploy: a schedule by load ({steps}): `genready sweep report DIR --schedule "
                f"{'|'.join(ENGINES)}` writes the engine's lines.")
    return FORMATS[engine].deploy(s.tiers(), steps)


def _static_deploy(rows: Sequence[Row]) -> str:
    sets = [s for s in decision.decide(rows) if s.best is not None]
    if not sets:
        return ""
    if any(s.answer == decision.UNDECIDED for s in sets):
        return "Deploy: not yet: repeat the sweep where more repeats are needed."
    names = [_answer(s) for s in sets]
    if len(set(names)) == 1:
        return ("Deploy: no speculation (the baseline's drop-in)." if names[0] == NONE else
                f"Deploy: the plan's drop-in with {names[0]}." if names[0] else
                "Deploy: the plan's drop-in (its one configuration).")
    return "Deploy: no one configuration is the best at every client setting: " + "; ".join(
        f"{decision.values_words(s.client)}: {name}" for s, name in zip(sets, names, strict=True)) + "."


NONE: Final = "no speculation"


def _answer(s: decision.Setting) -> str:
    """What a setting says to run: no speculation where the baseline is the best or within noise of it (a tie
    goes to the shallower), else the best configuration."""
    assert s.best is not None
    if s.answer in (decision.NO_SPECULATION, decision.WITHIN_BASELINE):
        return NONE
    # its server-side values ("" for a sweep of one configuration, whose rows are named by their client values)
    return escape(decision.values_words({k: v for k, v in s.best.point.items() if k not in s.client}))
