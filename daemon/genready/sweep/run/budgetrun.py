"""A plan's `budget` while the sweep runs and in --dry-run (the rule and the history are budget.py's): the unit's
load history read from the daemon and the results folder, the estimate --dry-run prints, and the check before each
planned load.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from genready.client import client
from genready.sweep import budget as sweepbudget
from genready.sweep.budget import History
from genready.sweep.files import RESULTS_FILE, read_results
from genready.sweep.plan import Point
from genready.sweep.run.lines import Left, Timings
from genready.timewords import duration


def daemon_records(base: str, target: str) -> list[dict[str, Any]] | None:
    """genready's start records of `target` (newest first), from the daemon's /status; None when it does not
    answer or has no such target (the estimate then falls back on the results folder)."""
    try:
        code, body = client.request(base, "/status", timeout=5.0)
    except client.Unreachable:
        return None
    t = body.get("targets", {}).get(target) if code == 200 and isinstance(body, dict) else None
    recs = t.get("records") if isinstance(t, dict) else None
    return [r for r in recs if isinstance(r, dict)] if isinstance(recs, list) else None


def read_history(base: str, target: str, results: Path) -> History:
    """The unit's load history (budget.history): the daemon's records, else the results folder's lines."""
    return sweepbudget.history(daemon_records(base, target), read_results(results / RESULTS_FILE, warn=False))


def seeded(timings: Timings, hist: History) -> None:
    """The history as the ETA's expectation before this sweep times a load and a run of its own."""
    if timings.expected_load is None:
        timings.expected_load = hist.load
    if timings.expected_run is None:
        timings.expected_run = hist.run


def scaled(seconds: float | None, scale: float) -> float | None:
    return None if seconds is None else seconds * scale


def load_costs(timings: Timings, scale: float = 1.0) -> list[tuple[Point, float | None]]:
    """Each planned load of the schedule, with what it and its runs are expected to take (times `scale`)."""
    return [(p, scaled(timings.left(p, loading=True, one_load=True).seconds, scale))
            for p, first in timings.schedule if first]


def estimate_lines(timings: Timings, hist: History, budget: float | None) -> list[str]:
    """--dry-run's lines: the expected loads, runs and hours of the schedule (every start taken to succeed), from
    what; with a budget, whether the plan fits, and if not, where the sweep would stop."""
    if not timings.schedule:
        return []
    left = timings.left(timings.schedule[0][0], loading=True)
    secs = scaled(left.seconds, hist.scale)
    hours = "hours unknown" if secs is None else f"{'more than ' if left.run is None else 'about '}{duration(secs)}"
    out = [f"expected: {left.loads} load{'s' if left.loads != 1 else ''} and {left.runs} run"
           f"{'s' if left.runs != 1 else ''}, {hours} ({hist.words()})"]
    if budget is None:
        return out
    costs = load_costs(timings, hist.scale)
    n = sweepbudget.reach([c for _, c in costs], budget)
    if secs is None:
        out.append(f"budget {duration(budget)}: whether the plan fits cannot be told without a load history; the "
                   "sweep checks each load against it once it has timed one")
    elif n == len(costs):
        out.append(f"budget {duration(budget)}: the plan fits ({hours} expected)")
    else:
        stop = costs[n][0]
        points = len(timings.schedule) - next(i for i, (p, _) in enumerate(timings.schedule) if p is stop)
        out.append(f"budget {duration(budget)}: the plan does not fit ({hours} expected): the sweep would stop before "
                   f"load {n + 1} of {len(costs)} (point {stop.index}, {stop.label}), leaving {points} point"
                   f"{'s' if points != 1 else ''} not reached")
    return out


@dataclass(frozen=True)
class Over:
    """A load the budget does not let start: the time spent, and what the load and its runs would take."""

    budget: float
    spent: float
    cost: float

    @property
    def words(self) -> str:
        return sweepbudget.stop_words(self.budget, self.spent, self.cost)

    def to_json(self) -> dict[str, float]:
        return sweepbudget.budget_json(self.budget, self.spent, self.cost)


class Guard:
    """The budget's check before each planned load, on `clock` (monotonic seconds) from the sweep's start.

    Timings counts loads and commands; a load's runs also cost their warmups and flushes, strays waited out and
    retries. So each load and its runs, once done, is timed on the clock and set against what Timings, knowing what
    it knows now, expects of them: the next expected cost is scaled by the ratio of the two so far, when over 1
    (before the first is done, by `scale`: the history's, History.scale)."""

    def __init__(self, budget: float, clock: Callable[[], float] = time.monotonic, scale: float = 1.0) -> None:
        self.budget, self.clock, self.scale = budget, clock, scale
        self.started = clock()
        self.over: Over | None = None  # set once the budget stops the sweep
        self.last: tuple[float, Left] | None = None  # the last load let start: when, and its loads and runs
        self.took = 0.0  # seconds the loads let start took on the clock, with their runs (those done)
        self.expected = 0.0  # what Timings now expects of those

    def start(self) -> None:
        """The sweep begins: the budget counts from here."""
        self.started, self.last, self.took, self.expected = self.clock(), None, 0.0, 0.0

    def check(self, timings: Timings, point: Point) -> Over | None:
        """None if `point`, a planned load, may start; else what stops it (kept in `over`)."""
        now = self.clock()
        left = timings.left(point, loading=True, one_load=True)
        if self.last is not None:  # the load before and its runs are done
            began, before = self.last
            if (expected := replace(before, load=left.load, run=left.run).seconds) is not None:
                self.took, self.expected = self.took + now - began, self.expected + expected
        cost = scaled(left.seconds, max(1.0, self.took / self.expected) if self.expected > 0 else self.scale)
        spent = now - self.started
        if sweepbudget.fits(spent, cost, self.budget):
            self.last = (now, left)
            return None
        assert cost is not None  # fits() lets an unknown cost go ahead
        self.over = Over(self.budget, spent, cost)
        return self.over


def left_points(schedule: Sequence[tuple[Point, bool]], point: Point) -> list[Point]:
    """The points of the schedule from `point` on: what a stop before its load does not reach."""
    at = next((i for i, (p, _) in enumerate(schedule) if p.index == point.index), len(schedule))
    return [p for p, _ in schedule[at:]]
