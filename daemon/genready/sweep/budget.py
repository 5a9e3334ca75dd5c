"""A plan's `budget` (issue 51 §4): how long a plan is expected to take, from the unit's own load history, and the
rule that stops a sweep before a load it expects to overrun; what the budget left out, for the report.

The history: the median load of the unit's last EXPECTED_FROM verified starts, as genready's start records keep
them (the daemon's /status; the daemon's own expected_load_seconds is the same median, of the same ExecStart= where
it has one), else of the `load_seconds` an earlier sweep recorded in the results folder; the run, the mean
`run_seconds` of that folder's ok lines (the ETA's mean, run/lines.py). No history: the estimate counts loads and
says the hours are unknown.

The rule (`fits`): before each planned load, the time spent plus what that load and its runs are expected to take
(Timings.left with one_load: the load, and every run up to the next planned load) must not exceed the budget; a load
whose time cannot be estimated yet goes ahead. The points a stop leaves are recorded `skipped`, each line's
BUDGET_FIELD saying the budget, the time spent and what the next load was expected to take; the sweep exits 1.

Pure functions of what the callers read (run/budgetrun.py: the daemon and the folder; report/decision.py: the lines).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from genready.rule.history import EXPECTED_FROM
from genready.timewords import duration, from_iso

BUDGET_FIELD: Final = "budget"  # a results line's field: the budget stopped the sweep before this point's load
BUDGET_KEYS: Final = ("budget_seconds", "spent_seconds", "expected_seconds")  # that field's (budget_json)


@dataclass(frozen=True)
class History:
    """The unit's recent loads and an earlier sweep's runs: what an estimate is made of."""

    load: float | None  # median seconds of the recent verified starts; None: no history
    loads: int  # how many starts that median is of
    load_from: str  # where they were read: words
    run: float | None  # mean seconds of earlier ok runs; None: none timed
    runs: int
    # what those ok runs took on the clock (from their load or their reuse to their end: warmups and flushes too) over
    # their loads and commands alone, at least 1; 1 without any
    scale: float = 1.0

    def words(self) -> str:
        load = (f"a load takes {duration(self.load)}: the median of {_n(self.loads, 'verified start')} "
                f"({self.load_from})") if self.load is not None else \
            "no load history (no verified start in genready's records or the results folder): hours unknown"
        run = (f"a run {duration(self.run)}: the mean of {_n(self.runs, 'ok run')} in the results folder"
               if self.run is not None else "no run timed in the results folder: the hours count the loads alone")
        scale = f"; x{self.scale:.2f} for their warmups and flushes (the clock's time of those runs over their loads " \
            "and commands)" if self.scale > 1 else ""
        return f"{load}; {run}{scale}"


def _n(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else None


def record_loads(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """The load seconds of the verified starts among genready's start records (newest first, as /status lists
    them), the newest EXPECTED_FROM."""
    got = [s for r in records if r.get("ready_at") and (s := _number(r.get("load_seconds"))) is not None]
    return got[:EXPECTED_FROM]


def results_times(lines: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[float]]:
    """An earlier sweep's results lines (file order): the load seconds of its restarts, newest EXPECTED_FROM, and
    the run seconds of its ok runs."""
    loads = [s for r in lines if r.get("restarted") and (s := _number(r.get("load_seconds"))) is not None]
    runs = [s for r in lines if r.get("status") == "ok" and (s := _number(r.get("run_seconds"))) is not None]
    return loads[::-1][:EXPECTED_FROM], runs


def clock_scale(lines: Sequence[Mapping[str, Any]]) -> float:
    """Over an earlier sweep's ok lines, per loaded instance (its invocation): the time on the clock from its restart
    (or the first reuse of it the folder has) to its last run's end, over its load and its commands (run_seconds) alone;
    at least 1, and 1 without any. What a run costs besides its command: its warmup, its flush, the checks between."""
    spans: dict[tuple[object, object], list[float]] = {}  # instance -> [first start, last end, load + commands]
    for r in lines:
        run, load = _number(r.get("run_seconds")), _number(r.get("load_seconds")) if r.get("restarted") else 0.0
        try:
            began, ended = from_iso(r.get("started_at")), from_iso(r.get("ended_at"))
        except (TypeError, ValueError):
            continue
        if r.get("status") != "ok" or run is None or load is None or began is None or ended is None or ended < began:
            continue
        span = spans.setdefault((r.get("host"), r.get("invocation_id")), [began, ended, 0.0])
        span[0], span[1], span[2] = min(span[0], began), max(span[1], ended), span[2] + load + run
    took, alone = sum(e - b for b, e, _ in spans.values()), sum(x for _, _, x in spans.values())
    return max(1.0, took / alone) if alone > 0 else 1.0


def history(records: Iterable[Mapping[str, Any]] | None, lines: Sequence[Mapping[str, Any]]) -> History:
    """The history an estimate is made of: genready's records when they hold a verified start (None: the daemon
    was not asked, or did not answer), else the results folder's loads."""
    from_records = record_loads(records) if records is not None else []
    folder_loads, runs = results_times(lines)
    loads, where = (from_records, "genready's records of the unit") if from_records else \
        (folder_loads, "the results folder's earlier loads")
    return History(statistics.median(loads) if loads else None, len(loads), where,
                   statistics.fmean(runs) if runs else None, len(runs), clock_scale(lines))


def fits(spent: float, cost: float | None, budget: float) -> bool:
    """The stop rule: a load whose expected time (with its runs) `cost` would end past `budget`, `spent` seconds
    in, is not started. A cost that cannot be estimated yet (no load timed, no history) goes ahead."""
    return cost is None or spent + cost <= budget


def reach(costs: Sequence[float | None], budget: float, spent: float = 0.0) -> int:
    """How many of the loads (each its expected `costs`, in order) the stop rule lets start, `spent` seconds in."""
    for i, cost in enumerate(costs):
        if not fits(spent, cost, budget):
            return i
        spent += cost or 0.0
    return len(costs)


def stop_words(budget: float, spent: float, cost: float) -> str:
    """A not-reached point's reason, and the sweep's line when it stops."""
    return (f"not loaded: the budget of {duration(budget)} would be exceeded ({duration(spent)} spent; the next load "
            f"and its runs are expected to take {duration(cost)})")


def budget_json(budget: float, spent: float, cost: float) -> dict[str, float]:
    """A not-reached point's BUDGET_FIELD."""
    return dict(zip(BUDGET_KEYS, (round(budget, 3), round(spent, 3), round(cost, 3)), strict=True))


# --- what the report says (report/decision.py) -------------------------------------------------------------------

def not_reached(lines: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The points whose last line says the budget did not reach them (a later run, with --resume, may have), in
    the order of their lines; a baseline's run is one of its own, though it may hold a plan point's values."""
    last: dict[tuple[object, ...], Mapping[str, Any]] = {}
    for rec in lines:
        key = (rec.get("host"), repr(rec.get("point")), rec.get("baseline") or 0)
        last.pop(key, None)  # re-inserted: the order of the last lines
        last[key] = rec
    return [r for r in last.values() if isinstance(r.get(BUDGET_FIELD), Mapping)]


def provisional_words(left: Sequence[Mapping[str, Any]], label: Callable[[Mapping[str, Any]], str]) -> str | None:
    """The Decision's sentence when the budget stopped the sweep: provisional, and what it did not get to (each
    line's point as `label` writes it); None when nothing was left."""
    if not left:
        return None
    budget = _number(left[0][BUDGET_FIELD].get("budget_seconds"))
    names = [("baseline " if r.get("baseline") else "") + label(r) for r in left]
    shown = names[:8] + ([f"and {len(names) - 8} more"] if len(names) > 8 else [])
    return (f"Provisional: the budget ({duration(budget)}) ran out before {_n(len(left), 'point')} could be loaded, so "
            f"the answers above are among the configurations reached only. Not reached: {', '.join(shown)}.")
