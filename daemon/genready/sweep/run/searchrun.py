"""A plan's `[search]` run per server configuration (issue 39 §2): search.py decides, the runner runs.

Each step is a run like any other (runner.Sweep.tries: re-verified, flushed, warmed, its repeats, its attempts),
its bench flags (search.bench_args) in the command's word `{search}`, its results line carrying `search_step`,
`search_kind`, `search_rate` (the offered requests/s; null: a closed loop) and `search_concurrency`. The next
step is decided from the steps' bench lines ({out}/bench.jsonl, files.bench_line). What the search
found is a line of DIR/search.jsonl per configuration (results.jsonl's readers see only runs), with its curve
and, with a `baseline`, its crossover against the baseline's search (crossover.py). `--resume` reuses a step's
ok lines of the same fingerprint: the decisions are pure, so the same steps come again. A search that stops
before its end makes the sweep exit 1 (runner.py).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from genready.store import durable
from genready.store.bounded import FileError
from genready.sweep import crossover, files, search
from genready.sweep.files import BENCH_FILE, RESULTS_FILE, SEARCH_FILE, read_results
from genready.sweep.plan import Plan, Point
from genready.sweep.run import baseline as sweepbaseline
from genready.sweep.run.lines import Console
from genready.sweep.run.results import Attempt, Results, ResultsLog, Status, differing, json_text, same_point, writing
from genready.sweep.run.steps import Ctx, SweepOptions, Verified
from genready.timewords import iso


@dataclass(frozen=True)
class SearchStep:
    """A step as the runner runs it: its folder (step-SS), its bench flags, its results line's fields."""

    step: search.Step
    args: tuple[str, ...]

    @property
    def index(self) -> int:
        return self.step.index

    @property
    def fields(self) -> dict[str, Any]:
        return {"search_step": self.step.index, "search_kind": self.step.kind, "search_rate": self.step.rate,
                "search_concurrency": self.step.concurrency}


@dataclass
class Searched:
    """A search this sweep ran (or read back on --resume): its point, its curve (crossover.curve) and, for a
    configuration, its found line as last written (a later baseline search fills in its crossover)."""

    point: Point
    curve: crossover.Curve
    rec: dict[str, Any]


@dataclass(frozen=True)
class Found:
    """What a point's search came to, for the runner to keep: the instance a next point of the group may reuse,
    why it stopped before its end ("" when it did not: the sweep exits 1 otherwise), and whether it ran
    anything (a search whose every step an earlier run did is the summary's `ok (earlier run)`)."""

    instance: Verified | None
    stopped: str
    ran: bool


class Sweep(Protocol):
    """What a search asks of the runner that calls it (runner.Sweep), so that this module need not import it:
    its options, console, store and fingerprints, and one run tried up to `attempts` times; it keeps the
    searches so far on it (each crossover needs the baseline's, which may be searched later)."""

    opts: SweepOptions
    console: Console
    results: Results
    fingerprints: dict[int, dict[str, Any]]
    searched: dict[int, Searched]
    round_before: dict[int, int]

    def tries(self, ctx: Ctx, log: ResultsLog, point: Point, group: int, repeat: int, instance: Verified | None,
              step: SearchStep | None = None) -> tuple[Attempt, Verified | None]: ...


def bench_line(results: Path, rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The last bench client line of a run's {out}/bench.jsonl, or None (none written, or unreadable)."""
    out = rec.get("out")
    if not isinstance(out, str):
        return None
    try:
        return files.bench_line(results / out)
    except FileError:
        return None


def outcome(step: search.Step, lines: Sequence[Mapping[str, Any]]) -> search.Outcome:
    """A step's outcome over its repeats' bench lines: the median achieved rate and output tok/s; saturated if
    any repeat was, the SLO met only if every repeat met it (a step is judged by its worst run)."""
    if not lines:
        return search.Outcome(step, 0.0)
    each = [search.Outcome.of_line(step, x) for x in lines]
    sat = True if any(o.saturated is True for o in each) else (None if any(o.saturated is None for o in each)
                                                                  else False)
    met = None if any(o.slo_met is None for o in each) else all(o.slo_met for o in each)
    tps = [o.output_tps for o in each if o.output_tps is not None]
    return search.Outcome(step, statistics.median(o.achieved_rate for o in each), sat, met,
                          statistics.median(tps) if tps else None)


def earlier_steps(plan: Plan, results: Path, point: Point, fp: Mapping[str, Any]
                  ) -> dict[tuple[int, int], dict[str, Any]]:
    """(search_step, repeat) -> an ok line an earlier run left for `point` under fingerprint `fp`. None for a
    baseline run, which `--resume` runs again (docs/sweeps.md: a baseline measured before an interruption says
    little about the server now); nor is a baseline's line a plan point's, though it may hold the same values."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    if point.baseline:
        return out
    for r in read_results(results / RESULTS_FILE, warn=False):
        step, rep = r.get("search_step"), r.get("repeat", 1)
        if r.get("status") == Status.OK.value and not r.get("baseline") and \
                same_point(r.get("point"), point.as_dict()) and \
                isinstance(step, int) and isinstance(rep, int) and 1 <= rep <= plan.repeats and \
                not differing(r.get("fingerprint"), fp):
            out.setdefault((step, rep), r)
    return out


def _same(rec: Mapping[str, Any], s: SearchStep) -> bool:
    return all(rec.get(k) == v for k, v in s.fields.items())


def run(sweep: Sweep, ctx: Ctx, log: ResultsLog, point: Point, group: int, instance: Verified | None) -> Found:
    """The point's search on the group's one instance: steps until next_step says it is over, or a step has no
    ok run; then its line in DIR/search.jsonl. What it came to (Found)."""
    plan, results = sweep.opts.plan, sweep.opts.results
    spec = plan.search
    assert spec is not None
    earlier = earlier_steps(plan, results, point, sweep.fingerprints[point.index])
    done: list[search.Outcome] = []
    stopped = ""
    ran = False
    while (step := search.next_step(spec, done)) is not None:
        s = SearchStep(step, tuple(search.bench_args(spec, step)))
        load = f"{step.rate:.3g} req/s" if step.rate is not None else "closed loop"
        sweep.console.progress(point, f"search step {step.index} ({step.kind}, {load}, concurrency "
                               f"{step.concurrency})")
        lines: list[dict[str, Any]] = []
        for r in range(1, plan.repeats + 1):
            rec = earlier.get((step.index, r))
            if rec is not None and _same(rec, s):
                sweep.results.reuse(point.index, rec)
            else:
                att, instance = sweep.tries(ctx, log, point, group, r, instance, s)
                ran = True
                if att.status is not Status.OK:
                    stopped = f"step {step.index} did not run ok ({att.status.value})"
                    break
                rec = sweep.results.lines(point.index)[-1]
            if (line := bench_line(results, rec)) is None:
                stopped = f"step {step.index} wrote no bench line ({{out}}/{BENCH_FILE}: the command's --output)"
                break
            lines.append(line)
        if stopped:
            break
        done.append(outcome(step, lines))
    found_line(sweep, point, group, spec, done, stopped)
    return Found(instance, stopped, ran)


def found_fields(spec: search.SearchSpec, done: Sequence[search.Outcome]) -> dict[str, Any]:
    """What a search found as line fields: saturation mode its bracket of the saturation point, slo mode
    `max_rate_under_slo` (a concurrency on that axis)."""
    f = search.found(spec, done)
    if spec.mode is search.Mode.SLO:
        return {"max_rate_under_slo": f.max_under_slo}
    return {"last_unsaturated_rate": f.last_unsaturated, "first_saturated_rate": f.first_saturated,
            "saturation_rate": f.last_unsaturated if f.last_unsaturated is not None else f.first_saturated}


def found_line(sweep: Sweep, point: Point, group: int, spec: search.SearchSpec, done: Sequence[search.Outcome],
                stopped: str) -> None:
    """The point's line in DIR/search.jsonl: what its search found, its curve, and for a configuration its
    crossover against the baseline; after a baseline's search, the crossovers it completes."""
    crv = crossover.curve(spec, done)
    rec: dict[str, Any] = {"point": point.as_dict(), "index": point.index, "group": group, "mode": str(spec.mode),
                           "axis": str(spec.axis), "steps": len(done), "complete": not stopped,
                           **found_fields(spec, done), "curve": [list(xy) for xy in crv],
                           "fingerprint": sweep.fingerprints[point.index], "at": iso(time.time())}
    if point.baseline:
        rec["baseline"] = point.baseline
    else:
        rec |= against_baseline(sweep, point, crv)
    if stopped:
        rec["reason"] = stopped
    _append(sweep, rec)
    sweep.searched[point.index] = Searched(point, crv, rec)
    what = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in found_fields(spec, done)
                     .items())
    sweep.console.progress(point, f"search: {len(done)} steps, {what}" + _crossover_words(rec) +
                           (f"; stopped: {stopped}" if stopped else ""))
    if point.baseline:
        _fill_in(sweep, point)


def _append(sweep: Sweep, rec: Mapping[str, Any]) -> None:
    with writing(sweep.opts.results):
        fd = durable.open_append(sweep.opts.results / SEARCH_FILE)
        try:
            durable.append(fd, (json_text(rec, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii"))
        finally:
            os.close(fd)


def _crossover_words(rec: Mapping[str, Any]) -> str:
    status = rec.get("crossover_status")
    if status is None or status == crossover.Status.NO_BASELINE:
        return ""
    if status == crossover.Status.INTERPOLATED:
        return f"; crossover {rec['crossover']:.3g} (interpolated)"
    return f"; crossover: {str(status).replace('_', ' ')}"


def against_baseline(sweep: Sweep, point: Point, crv: crossover.Curve) -> dict[str, Any]:
    """A configuration's crossover fields against the baseline search of its client setting: the round that ran
    before it, else the latest one searched so far; `no_baseline` while there is none."""
    plan = sweep.opts.plan
    setting = sweepbaseline.setting_key(plan, point)
    cands = [s for s in sweep.searched.values() if s.point.baseline and s.curve
             and sweepbaseline.setting_key(plan, s.point) == setting]
    if not cands:
        return {**crossover.Crossover(None, crossover.Status.NO_BASELINE).fields(), "crossover_baseline": None}
    before = sweep.round_before.get(point.index, 0)
    base = min(cands, key=lambda s: (s.point.baseline != before, -s.point.baseline))
    return {**crossover.find(crv, base.curve, plan.noise_limit).fields(), "crossover_baseline": base.point.index}


def _fill_in(sweep: Sweep, base: Point) -> None:
    """After a baseline search: a new found line for each configuration searched before any baseline of its
    client setting was (its crossover was `no_baseline`), now with its crossover."""
    setting = sweepbaseline.setting_key(sweep.opts.plan, base)
    for s in list(sweep.searched.values()):
        if s.point.baseline or s.rec.get("crossover_status") != crossover.Status.NO_BASELINE or \
                sweepbaseline.setting_key(sweep.opts.plan, s.point) != setting:
            continue
        got = against_baseline(sweep, s.point, s.curve)
        if got["crossover_status"] == crossover.Status.NO_BASELINE:
            continue
        s.rec = {**s.rec, **got, "at": iso(time.time())}
        _append(sweep, s.rec)
        sweep.console.progress(s.point, "search: against the baseline just searched" + _crossover_words(s.rec))

