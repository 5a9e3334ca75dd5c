"""`noise_check = true`: the A/A start. Before anything else the sweep loads the first configuration it would
run (the first point of its first group, baseline rounds aside) several times, each load a start of its own
(restarted, verified, warmed and flushed like any other) with a few runs on it: load 1's runs, a restart, load
2's runs. Each load is a point of its own (numbered past the plan's and the baseline's; `aa` on its results
lines), never a point of the plan: the report reads these lines as noise evidence only.

From those loads, and from the baseline's rounds where `baseline_every` loads it again at a client setting,
sweep/noise.py estimates the figure's spread within a load and between loads; after the last A/A load the sweep
says it on stderr, with the smallest speedup the plan can tell from 1 at its repeats and a warning when that is
larger than the plan's `noise_limit`. `repeats = "auto"` (autorepeat.py) takes the between-load part into its
intervals as the report does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final, Protocol

from genready.sweep import noise
from genready.sweep.plan import Plan, Point
from genready.sweep.rows import Benches, point_row
from genready.sweep.run.lines import Console
from genready.sweep.run.results import Results
from genready.sweep.run.steps import SweepOptions
from genready.tools import benchline

AA_RUNS: Final = 3  # runs per A/A load at least: a within-load spread needs two; three make it less of a guess
TPS: Final = benchline.OUTPUT_TOKENS_PER_SECOND.key


class Sweep(Protocol):
    """What of the runner's Sweep these hooks read (runner.py hands itself in; it imports them)."""

    opts: SweepOptions
    groups: list[tuple[Point, ...]]
    results: Results
    console: Console


def schedule(plan: Plan, groups: Sequence[tuple[Point, ...]]) -> list[tuple[Point, ...]]:
    """`groups` (in run order) with the A/A start's loads first: each a group of one point with the first plan
    point's values, numbered past every point of `groups`; `groups` alone without `noise_check`."""
    first = next((p for g in groups for p in g if not p.baseline), None)
    if not plan.noise_check or first is None:
        return list(groups)
    past = max(p.index for g in groups for p in g)
    return [*((Point(past + k, first.values, aa=k),) for k in range(1, plan.noise_check + 1)), *groups]


def runs(plan: Plan) -> int:
    """Runs on each A/A load: the plan's repeats, at least AA_RUNS (with repeats = "auto": AA_RUNS)."""
    return AA_RUNS if plan.repeats_auto else max(AA_RUNS, plan.repeats)


def samples(sweep: Sweep, point: Point, benches: Benches) -> dict[str, list[float]]:
    """A point's figures over its ok runs so far (its results lines, this sweep's and a resumed one's)."""
    return samples_of(sweep, sweep.results.lines(point.index), benches)


def samples_of(sweep: Sweep, lines: Sequence[dict[str, Any]], benches: Benches) -> dict[str, list[float]]:
    """Each figure over the ok runs of one point's results `lines` (rows.point_row's samples)."""
    if not lines:
        return {}
    return point_row([(rec, sweep.opts.results, "") for rec in lines], benches).samples


def evidence(sweep: Sweep, benches: Benches) -> noise.Estimate | None:
    """The spread within and between loads so far: the A/A loads (one configuration) and the baseline's runs,
    each client setting's rounds the loads of one configuration."""
    aa: list[dict[str, list[float]]] = []
    rounds: dict[str, list[dict[str, list[float]]]] = {}
    for g in sweep.groups:
        for p in g:
            if not (p.aa or p.baseline) or not (got := samples(sweep, p, benches)):
                continue
            if p.aa:
                aa.append(got)
            else:
                rounds.setdefault(json.dumps(p.as_dict(), sort_keys=True), []).append(got)
    repeated = [loads for loads in rounds.values() if len(loads) >= 2]
    # a baseline round runs every client setting on one load: the settings' rounds share their loads
    return noise.estimate([aa, *repeated], aa_loads=len(aa) if len(aa) >= 2 else 0,
                          baseline_loads=max((len(loads) for loads in repeated), default=0),
                          shared=["aa", *("baseline" for _ in repeated)])


def after_load(sweep: Sweep, point: Point) -> noise.Components | None:
    """After the A/A start's last load: its spread on stderr, and the warning when the plan cannot tell the
    differences it looks for (noise.words); the output tok/s' spread (None before then, or without one)."""
    if point.aa != sweep.opts.plan.noise_check:
        return None
    plan = sweep.opts.plan
    est = evidence(sweep, {})
    got = est.by_key.get(TPS) if est is not None else None
    if got is None:
        sweep.console.say("noise check: no two loads of the A/A start ran ok with an output tok/s; the intervals "
                          "cover one load only")
        return None
    text, _ = noise.words(got, plan.repeats, plan.noise_limit, "noise check, output tok/s")
    sweep.console.say(text)
    return got
