"""A plan's `[search]` run per server configuration (issue 39 §2): search.py decides, the runner runs.

Each step is a run like any other (runner.Sweep.tries: re-verified, flushed, warmed, its repeats, its attempts),
its bench flags (search.bench_args) in the command's word `{search}`, its results line carrying `search_step`,
`search_kind`, `search_rate` (the offered requests/s; null: a closed loop) and `search_concurrency`. The next
step is decided from the steps' bench lines ({out}/bench.jsonl, read as report.py reads it). What the search
found is a line of DIR/search.jsonl per configuration (results.jsonl's readers see only runs). `--resume`
reuses a step's ok lines of the same fingerprint: the decisions are pure, so the same steps come again.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from genready.config import FileError
from genready.store import durable
from genready.sweep import report, search
from genready.sweep.lines import Console
from genready.sweep.plan import Plan, Point
from genready.sweep.report import BENCH_FILE, RESULTS_FILE, read_results
from genready.sweep.results import Attempt, Results, ResultsLog, Status, differing, json_text, same_point, writing
from genready.sweep.steps import Ctx, SweepOptions, Verified
from genready.timewords import iso

SEARCH_FILE: Final = "search.jsonl"  # DIR/search.jsonl: what each configuration's search found, a line each


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


class Sweep(Protocol):
    """What a search asks of the runner that calls it (runner.Sweep), so that this module need not import it:
    its options, console, store and fingerprints, and one run tried up to `attempts` times."""

    opts: SweepOptions
    console: Console
    results: Results
    fingerprints: dict[int, dict[str, Any]]
    searched_earlier: set[int]

    def tries(self, ctx: Ctx, log: ResultsLog, point: Point, group: int, repeat: int, instance: Verified | None,
              step: SearchStep | None = None) -> tuple[Attempt, Verified | None]: ...


def bench_line(results: Path, rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The last bench client line of a run's {out}/bench.jsonl, or None (none written, or unreadable)."""
    out = rec.get("out")
    if not isinstance(out, str):
        return None
    try:
        return report.bench_line(results / out)
    except FileError:
        return None


def outcome(step: search.Step, lines: Sequence[Mapping[str, Any]]) -> search.Outcome:
    """A step's outcome over its repeats' bench lines: the median achieved rate; saturated if any repeat was,
    the SLO met only if every repeat met it (a step is judged by its worst run)."""
    if not lines:
        return search.Outcome(step, 0.0)
    each = [search.Outcome.of_line(step, x) for x in lines]
    sat = True if any(o.saturated is True for o in each) else (None if any(o.saturated is None for o in each)
                                                                  else False)
    met = None if any(o.slo_met is None for o in each) else all(o.slo_met for o in each)
    return search.Outcome(step, statistics.median(o.achieved_rate for o in each), sat, met)


def earlier_steps(plan: Plan, results: Path, point: Point, fp: Mapping[str, Any]
                  ) -> dict[tuple[int, int], dict[str, Any]]:
    """(search_step, repeat) -> an ok line an earlier run left for `point` under fingerprint `fp`."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for r in read_results(results / RESULTS_FILE, warn=False):
        step, rep = r.get("search_step"), r.get("repeat", 1)
        if r.get("status") == Status.OK.value and same_point(r.get("point"), point.as_dict()) and \
                isinstance(step, int) and isinstance(rep, int) and 1 <= rep <= plan.repeats and \
                not differing(r.get("fingerprint"), fp):
            out.setdefault((step, rep), r)
    return out


def _same(rec: Mapping[str, Any], s: SearchStep) -> bool:
    return all(rec.get(k) == v for k, v in s.fields.items())


def run(sweep: Sweep, ctx: Ctx, log: ResultsLog, point: Point, group: int, instance: Verified | None
        ) -> Verified | None:
    """The point's search on the group's one instance: steps until next_step says it is over, or a step has no
    ok run; then its line in DIR/search.jsonl. The instance a next point of the group may reuse."""
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
                sweep.results.earlier.setdefault(point.index, []).append(rec)
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
    _found_line(sweep, point, group, spec, done, stopped)
    if not ran and not stopped:
        sweep.searched_earlier.add(point.index)  # the summary's "ok (earlier run)": nothing loaded for it
    return instance


def found_fields(spec: search.SearchSpec, done: Sequence[search.Outcome]) -> dict[str, Any]:
    """What a search found as line fields: saturation mode its bracket of the saturation point, slo mode
    `max_rate_under_slo` (a concurrency on that axis)."""
    f = search.found(spec, done)
    if spec.mode is search.Mode.SLO:
        return {"max_rate_under_slo": f.max_under_slo}
    return {"last_unsaturated_rate": f.last_unsaturated, "first_saturated_rate": f.first_saturated,
            "saturation_rate": f.last_unsaturated if f.last_unsaturated is not None else f.first_saturated}


def _found_line(sweep: Sweep, point: Point, group: int, spec: search.SearchSpec, done: Sequence[search.Outcome],
                stopped: str) -> None:
    rec: dict[str, Any] = {"point": point.as_dict(), "index": point.index, "group": group, "mode": str(spec.mode),
                           "axis": str(spec.axis), "steps": len(done), "complete": not stopped,
                           **found_fields(spec, done), "fingerprint": sweep.fingerprints[point.index],
                           "at": iso(time.time())}
    if stopped:
        rec["reason"] = stopped
    with writing(sweep.opts.results):
        fd = durable.open_append(sweep.opts.results / SEARCH_FILE)
        try:
            durable.append(fd, (json_text(rec, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii"))
        finally:
            os.close(fd)
    what = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in found_fields(spec, done)
                     .items())
    sweep.console.progress(point, f"search: {len(done)} steps, {what}" + (f"; stopped: {stopped}" if stopped else ""))

