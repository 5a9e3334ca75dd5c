"""The sweep's loop: for each server configuration, for each point, for each repeat, attempts until one
counts; each attempt's steps (steps.py) return values, and the attempt is recorded once, whole.

On SIGINT/SIGTERM/SIGHUP the running command is stopped (SIGINT, SIGTERM, SIGKILL: guard's ladder),
the attempt recorded as interrupted, and the unit restored; a second signal exits at once, naming
what is left to clean up.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Final, NoReturn, TextIO

from genready.exitcodes import Exit
from genready.sweep import explore
from genready.sweep import search as searchmod
from genready.sweep.files import RESULTS_FILE, SEARCH_FILE
from genready.sweep.plan import Point
from genready.sweep.rows import Row, point_row
from genready.sweep.run import autorepeat, budgetrun, confirm, noisecheck, order, searchrun, steps, strays
from genready.sweep.run import baseline as sweepbaseline
from genready.sweep.run.dropin import DropinLife
from genready.sweep.run.lines import Console, Timings
from genready.sweep.run.prune import Pruner, Source, failed_start
from genready.sweep.run.results import RETRIED, Attempt, Results, ResultsLog, Status, SweepError, fingerprint, writing
from genready.sweep.run.searchrun import SearchStep
from genready.sweep.run.steps import Ctx, Interrupted, NotReady, Ran, Signals, SweepOptions, Verified
from genready.timewords import duration
from genready.tools import servercache

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal went away


class Stopped(Exception):
    """An attempt the sweep's signal ended: recorded, then the sweep cleans up."""

    def __init__(self, attempt: Attempt) -> None:
        super().__init__(attempt.reason)
        self.attempt = attempt


class Sweep:
    """One sweep of one plan on one target: `run` it once."""

    def __init__(self, opts: SweepOptions, *, results: Results | None = None, out: TextIO = sys.stdout,
                 err: TextIO = sys.stderr, pruner: Pruner | None = None) -> None:
        self.opts = opts
        self.groups = noisecheck.schedule(opts.plan, sweepbaseline.schedule(
            opts.plan, opts.shard.take(opts.plan.groups()) if opts.shard else opts.plan.groups()))
        self.round_before = sweepbaseline.round_before(self.groups)
        self.out = out
        self.console = Console(err, max([len(opts.plan.points), *(p.index for g in self.groups for p in g)]))
        self.results = results or Results()
        # which groups load, in what order: all (grid), or what a search over them asks for (order.py)
        self.order = order.of(opts.plan, self.groups, self.results, opts.results, self.round_before)
        self.signals = Signals()
        self.timings = Timings(repeats=opts.plan.repeats, every_run_loads=opts.every_run_restarts,
                               steps=searchmod.expected_steps(opts.plan.search) if opts.plan.search else 1)
        self.fingerprints = {p.index: fingerprint(opts.plan, p, opts.target, opts.unit,
                                                  restart_each=opts.every_run_restarts)
                             for p in [*opts.plan.points, *(p for g in self.groups for p in g if p.baseline or p.aa)]}
        self.life: DropinLife | None = None
        # prune.py: the failed starts that prune larger configurations, and the stop after failed starts in a row
        self.pruner = pruner or Pruner(opts.plan.prune, opts.plan.server_axes, opts.plan.max_failed_starts)
        self.pruned: dict[int, Source] = {}  # the points this run did not load, and why
        self.engines: dict[str, confirm.Engine | None] = {}  # the loaded instance's own report (confirm.py)
        self.searched_earlier: set[int] = set()  # search points whose every step an earlier run did (--resume)
        self.searched: dict[int, searchrun.Searched] = {}  # the searches so far: each crossover needs the baseline's
        self.incomplete: set[int] = set()  # search points whose search stopped before it was over: exit 1
        self.skip: set[int] = set()  # the points run() was told to skip (ok in an earlier run)
        # the plan's `budget` (budgetrun.py): checked before each planned load; its `over` once it stopped the sweep
        self.guard = budgetrun.Guard(opts.plan.budget) if opts.plan.budget is not None else None
        self.not_reached: list[Point] = []  # the points the budget stopped the sweep before
        self.auto = autorepeat.Auto(self) if opts.plan.repeats_auto else None  # repeats = "auto"

    def plan_schedule(self, skip: set[int]) -> None:
        """The points to run in order, each marked True where a load is planned (a group's first); the points a
        failed start prunes are left out, so the ETA counts the loads they save."""
        skip = skip | self.pruner.earlier | {p.index for g in self.groups for p in g if self.pruner.pruned_by(p)}
        self.timings.schedule = [(p, self.opts.every_run_restarts or p is next(q for q in g if q.index not in skip))
                                 for g in self.groups for p in g if p.index not in skip]

    def eta(self, point: Point, *, loading: bool) -> str:
        return self.timings.eta(point, loading=loading)

    def run(self, skip: set[int]) -> int:
        """Every point not in `skip`; then clean up. 0 if every point is ok, 1 if not (or a search stopped before
        it was over, or the budget stopped the sweep: its points not reached are `skipped`), 130 if interrupted."""
        old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        interrupted = False
        self.skip = skip
        self.plan_schedule(skip)
        if self.guard is not None:
            self.guard.start()
        log: ResultsLog | None = None
        try:
            o = self.opts
            self.life, state = DropinLife.open(o.bus_kind, o.unit)
            # before anything is touched: a refused drop-in is exit 78, an unwritable results folder 73
            self.life.check_plan(o.plan, [p for p, _ in self.timings.schedule], o.results, state,
                                 user=o.bus_kind == "user", say=self.console.say)
            log = ResultsLog(o.results)
            self.life.take_over_leftover(self.console.say)
            ctx = Ctx(o, self.console, self.life, self.timings, self.signals,
                      servercache.ServerHttp(o.server) if o.server is not None else None, time.time())
            self._groups(ctx, log, skip)
        except Interrupted:
            interrupted = True
        finally:
            self.signals.cleaning = True
            try:
                self._cleanup()
            finally:
                if self.life:
                    self.life.sd.close()
                if log:
                    log.close()
                for s, h in old.items():
                    signal.signal(s, h)
        if interrupted:
            return Exit.INTERRUPTED
        return Exit.OK if self.results.all_ok() and not self.incomplete else Exit.TIMEOUT

    def _groups(self, ctx: Ctx, log: ResultsLog, skip: set[int]) -> None:
        """Each server configuration's points in turn, until the last or until the budget stops the sweep."""
        for n, group in self.order:  # the grid's schedule, or what a search asks for (order.py)
            instance: Verified | None = None  # a new server configuration: its first point restarts
            for point in group:
                if self._earlier(point, skip) or point.index in self.pruner.earlier:
                    continue  # ok in an earlier run; or, with prune, its start failed then (--no-prune: again)
                if (by := self.pruner.pruned_by(point)) is not None:
                    self._skip(log, point, n, by)
                    continue
                if self._out_of_budget(log, point):
                    return
                if self.opts.plan.search is not None:  # its steps, each a run like any other
                    instance = self._searched(point, searchrun.run(self, ctx, log, point, n, instance))
                else:
                    instance = self._point(ctx, log, point, n, instance)
                self._prune_after(point, skip)
            self.order.told(group)
        self.order.finish(lambda point, group, why: self._unloaded(log, point, group, why))

    def _earlier(self, point: Point, skip: set[int]) -> bool:
        """The point's load is ok in an earlier run (--resume): its first load in `skip`, a search's reload by its
        own lines (order.reload: which load of the configuration this group is)."""
        if not self.order.reload:
            return point.index in skip
        return len(self.results.done_repeats(point.index, self.order.reload)) >= self.opts.plan.repeats

    def _out_of_budget(self, log: ResultsLog, point: Point) -> bool:
        """Before a planned load: if the budget does not let it start, every point from `point` on is recorded not
        reached (`skipped`, with the budget's field) and the sweep stops (True)."""
        planned = next((first for p, first in self.timings.schedule if p.index == point.index), False)
        if self.guard is None or not planned or (over := self.guard.check(self.timings, point)) is None:
            return False
        self.not_reached = self.order.stop(budgetrun.left_points(self.timings.schedule, point), over.words)
        self.console.say(f"budget: stopping before point {point.index} ({over.words.removeprefix('not loaded: ')}); "
                         f"{plural(len(self.not_reached), 'point')} not reached")
        group_of = {p.index: n for n, g in enumerate(self.groups, 1) for p in g}
        for p in self.not_reached:
            self._not_loaded(log, p, group_of[p.index], over.words, budget=over.to_json())
        return True

    def _point(self, ctx: Ctx, log: ResultsLog, point: Point, group: int, instance: Verified | None
               ) -> Verified | None:
        """Every repeat of a point not ok yet, each tried up to `attempts` times; the instance a next point of
        the group may reuse."""
        repeats = noisecheck.runs(self.opts.plan) if point.aa else self.opts.plan.repeats
        auto = self.auto is not None and not point.aa
        reload = self.order.reload  # which load of the configuration this is (a search's reloads: loads of their own)
        for r in self.auto.repeats(point, reload) if self.auto is not None and auto else range(1, repeats + 1):
            if r in self.results.done_repeats(point.index, reload):
                continue  # --resume: this repeat (of this load) is ok already
            if repeats > 1:
                self.console.progress(point, f"repeat {r} of {'at most ' if auto else ''}{repeats}")
            _, instance = self.tries(ctx, log, point, group, r, instance)
        if (spread := noisecheck.after_load(self, point)) is not None:
            self.order.knows(spread)  # a search's reloads start from the A/A start's spread, not a guess
        return instance

    def _searched(self, point: Point, found: searchrun.Found) -> Verified | None:
        """What a point's search came to, kept: the instance a next point of the group may reuse."""
        if found.stopped:
            self.incomplete.add(point.index)  # the sweep's exit status is then 1, as for a point that failed
        elif not found.ran:
            self.searched_earlier.add(point.index)  # the summary's "ok (earlier run)": nothing loaded for it
        return found.instance

    def tries(self, ctx: Ctx, log: ResultsLog, point: Point, group: int, repeat: int, instance: Verified | None,
              step: SearchStep | None = None) -> tuple[Attempt, Verified | None]:
        """One repeat (of a search step: its flags, its folder, its line's fields), tried up to `attempts` times,
        each attempt's results line written as it ends (an interrupted one too): its last attempt, and the
        instance a next run may reuse."""
        attempts = self.opts.plan.attempts
        for n in range(1, attempts + 1):
            try:
                att, instance, stop = self._attempt(ctx, point, group, repeat, instance, step)
            except Stopped as e:
                self._record(log, e.attempt, **(step.fields if step else {}))
                raise Interrupted() from None
            self._record(log, att, **(step.fields if step else {}))
            if stop:
                raise SweepError(stop)
            if att.status not in RETRIED or not att.retry or self.signals.count:
                break
            if n < attempts:
                self.console.progress(point, f"retrying ({n + 1} of {attempts} runs)")
        self.signals.check()
        return att, instance

    def _attempt(self, ctx: Ctx, point: Point, group: int, repeat: int, instance: Verified | None,
                 step: SearchStep | None = None) -> tuple[Attempt, Verified | None, str]:
        """One try, its steps in order: strays waited out; a verified instance (reused, else reconfigured and
        started); strays again; the engine's configuration confirmed; the warmup and the flush; the command;
        the drafting verdict. The attempt, whole, for `tries` to record (Stopped carries an interrupted one);
        the instance a next point of the group may reuse; why the sweep cannot go on ("" if it can)."""
        folder, k = self._folder(point, repeat, step.index if step else None)
        att = Attempt(point, k, str(folder.relative_to(self.opts.results)), Status.NOT_READY, time.time(),
                      time.time(), group, repeat=repeat, noise_limit=self.opts.plan.noise_limit,
                      max_divergence=self.opts.plan.max_divergence,
                      plan=self.opts.plan.path, fingerprint=self.fingerprints[point.index],
                      plan_points=len(self.opts.plan.points), shard=str(self.opts.shard) if self.opts.shard else None,
                      client=sweepbaseline.client_of(self.opts.plan, point) if self.opts.plan.baseline else None,
                      baseline_round=self.round_before.get(point.index) if self.opts.plan.baseline else None,
                      gpus=self.opts.plan.gpus, reload=self.order.reload)
        try:
            if stop := strays.wait_out(self.opts, self.console.say, self.signals):  # before a load (CUDA OOM)
                return replace(att, reason=stop, ended_at=time.time(), retry=False), None, stop
            got: Verified | NotReady | None = None
            if instance is not None and not self.opts.every_run_restarts:
                got = steps.reuse(ctx, point, instance, folder)
            if got is None:
                got = steps.reconfigure(ctx, point, folder) or steps.start(ctx, point)
            if isinstance(got, NotReady):
                return not_ready(att, got), None, got.stop
            if stop := strays.wait_out(self.opts, self.console.say, self.signals):  # left by this restart
                return replace(att, status=Status.INVALIDATED, reason=stop, ended_at=time.time(), retry=False,
                               pid=got.pid, invocation_id=got.invocation_id), None, stop
            checked = confirm.confirm(ctx, point, got, self.engines)  # None: the engine cannot be asked
            ran = confirm.refused(ctx, point, got, checked) or steps.stale(ctx, point, got)
            if ran is None:
                cache, warmed = steps.prepare(ctx, point, got)  # the warmup, then the flush
                ran = steps.run_command(ctx, point, got, folder, cache, warmed, step.args if step else None)
                ran = confirm.after_run(checked, ran)  # no_drafting
        except Interrupted:
            raise Stopped(replace(att, status=Status.INVALIDATED, reason="the sweep was interrupted",
                                  ended_at=time.time())) from None
        keep = got if ran.status not in RETRIED and not self.opts.every_run_restarts else None
        att = on_instance(att, got, ran)
        return (replace(att, **checked.records()) if checked is not None else att), keep, ""

    def _folder(self, point: Point, repeat: int = 1, step: int | None = None) -> tuple[Path, int]:
        """A fresh folder for this attempt: DIR/NN-point/attempt-K (DIR/NN-point/repeat-R/attempt-K with
        repeats; DIR/NN-point/step-SS/... for a search step), K one past the last that exists."""
        base = self.opts.results / point.slug(len(str(len(self.opts.plan.points))))
        if step is not None:
            base = base / f"step-{step:02d}"
        if self.opts.plan.repeats > 1 or point.aa:
            base = base / f"repeat-{repeat}"
        k = 1
        while (base / f"attempt-{k}").exists():
            k += 1
        path = base / f"attempt-{k}"
        with writing(self.opts.results):
            path.mkdir(parents=True)
            (path / "point.json").write_text(json.dumps(point.as_dict()) + "\n")
        return path, k

    def _record(self, log: ResultsLog, att: Attempt, **extra: object) -> None:
        rec = att.to_json(self.opts.target, self.opts.unit) | extra
        if self.auto is not None:  # its verdict (autorepeat.py): another run, or why the point stops
            rec |= self.auto.fields(att.point, rec)
        if self.opts.plan.slo:  # the plan's SLO, for `sweep report`'s Decision (it reads results, not the plan)
            rec["slo"] = {p.key: p.limit_ms for p in self.opts.plan.slo}
        log.append(rec)
        self.results.add(att, rec)
        took = f" in {duration(att.run_seconds)}" if att.run_seconds is not None else ""
        why = f": {att.reason}" if att.reason and att.status is not Status.OK else ""
        if att.warmup_converged is False:  # warmup = "stable" hit its bound: the run may have measured a cold server
            why += f"; unstable: the warmup did not settle in {att.warmup_requests} requests"
        self.console.progress(att.point, f"{att.status.value}{took} (pid {att.pid or '-'}, attempt {att.attempt}){why}")
        if att.status is not Status.SKIPPED and (stop := self.pruner.started(rec, att.point)):
            raise SweepError(stop)

    # -- prune.py's hooks ----------------------------------------------------------------------------

    def _skip(self, log: ResultsLog, point: Point, group: int, by: Source) -> None:
        """A point not loaded: recorded `skipped`, its line naming the failed start that pruned it."""
        self.pruned[point.index] = by
        self._not_loaded(log, point, group, f"not loaded: {by.words}", pruned_by=by.to_json())

    def _not_loaded(self, log: ResultsLog, point: Point, group: int, reason: str, **extra: object) -> None:
        """A point not loaded (pruned, or past the budget): its `skipped` line, `extra` naming why."""
        self._record(log, self._skipped(point, group, reason), **extra)

    def _unloaded(self, log: ResultsLog, point: Point, group: int, why: str) -> None:
        """A point a search never loaded: a `skipped` line saying why, with no figures; not one of this run's
        attempts (the sweep's exit status counts none)."""
        log.append(self._skipped(point, group, f"not loaded: {why}").to_json(self.opts.target, self.opts.unit)
                   | {"unloaded": why})

    def _skipped(self, point: Point, group: int, reason: str) -> Attempt:
        now = time.time()
        return Attempt(point, 0, point.slug(len(str(len(self.opts.plan.points)))), Status.SKIPPED, now, now, group,
                       restarted=False, reason=reason, noise_limit=self.opts.plan.noise_limit, plan=self.opts.plan.path,
                       fingerprint=self.fingerprints[point.index], plan_points=len(self.opts.plan.points),
                       shard=str(self.opts.shard) if self.opts.shard else None)

    def _prune_after(self, point: Point, skip: set[int]) -> None:
        """After a point's last attempt: a failed start prunes the configurations at least as large."""
        lines = self.results.lines(point.index)
        if not self.pruner.axes or not lines or (result := failed_start(lines[-1])) is None:
            return
        before = len(self.timings.schedule)
        self.pruner.add(point, result)
        self.plan_schedule(skip)
        if before > len(self.timings.schedule):
            self.console.progress(point, f"its start failed ({result}): {before - len(self.timings.schedule)} later "
                                  f"points are not loaded (prune = {list(self.pruner.axes)}); "
                                  f"{plural(self.loads_saved(), 'load')} saved so far")

    def loads_saved(self) -> int:
        """The server configurations (groups) with a point this run did not load because a start failed."""
        return sum(1 for g in self.groups if any(p.index in self.pruned or self.pruner.pruned_by(p) for p in g))

    # -- signals ---------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.count += 1
        name = signal.Signals(signum).name
        if self.signals.count == 1:
            running = self.signals.group is not None
            self.console.say(f"{name}: stopping{' the running command' if running else ''}, then cleaning up "
                             "(again to exit at once)")
            self.signals.stop_command()
            return
        self._exit_now(name)

    def _exit_now(self, name: str) -> NoReturn:
        left = []
        group = self.signals.group
        if group is not None:
            group.signal(signal.SIGKILL)
            left.append(f"the command (pid {group.child.pid}) was killed; its results are incomplete")
        ctl = "systemctl --user" if self.opts.bus_kind == "user" else "systemctl"
        if self.life is not None and (on_unit := self.life.left_behind(ctl, self.opts.unit, self.opts.target)):
            left.append(on_unit)
        self.console.say(f"{name} again: exiting at once. " + ("Left to clean up: " + "; ".join(left) if left else
                                                               "Nothing left to clean up."))
        os._exit(Exit.INTERRUPTED)

    def _cleanup(self) -> None:
        o = self.opts
        if self.life is None or not self.life.written:
            return
        if o.keep_config:
            self.console.say(f"keeping {self.life.path} (--keep-config); {o.unit} runs the last point's configuration")
            return
        self.life.restore(o.base, o.target, o.timeout, self.console.say)

    # -- the summary (sweep/main.py renders it: table.summary of these rows, then the tally) ---------------

    def summary_rows(self) -> list[Row]:
        """A row per point of the plan (and per baseline run this shard ran): from this run's lines, else what an
        earlier run left (`ok (earlier run)`, `not_ready (earlier run)`) or `not run`."""
        rows = []
        skipped = self.skip | self.searched_earlier
        where = str(self.opts.results / RESULTS_FILE)
        for p in [*self.opts.plan.points, *(p for g in self.groups for p in g if p.baseline or p.aa)]:
            if not self.results.ran(p.index):
                if self.opts.shard is None or any(p in g for g in self.groups):
                    rows.append(Row(p.index, p.label, "ok (earlier run)" if p.index in skipped else
                                    "not_ready (earlier run)" if p.index in self.pruner.earlier else
                                    f"not loaded: {self.order.unloaded[p.index]}" if p.index in self.order.unloaded
                                    else "not run"))
                continue
            rows.append(point_row([(rec, self.opts.results, where) for rec in self.results.lines(p.index)]))
        return rows

    def tally(self) -> str:
        """The summary's last lines: the points ok, the loads, what prune saved, where the results are."""
        ok = self.results.ok_count() + len(self.skip | self.searched_earlier)
        n = sum(len(g) for g in self.groups)
        loads = len(self.timings.load_times)
        pruned = f", {len(self.pruned)} skipped ({plural(self.loads_saved(), 'load')} saved by prune)" if self.pruned \
            else ""
        text = f"{ok}/{n} points ok" + (f" (shard {self.opts.shard})" if self.opts.shard else "") + \
            f", {loads} load{'s' if loads != 1 else ''}{pruned}; results in {self.opts.results / RESULTS_FILE}\n"
        if self.guard is not None and (over := self.guard.over) is not None:
            left = plural(len(self.not_reached), "point")
            text += f"budget {duration(over.budget)}: stopped after {duration(over.spent)}, the next load and its " \
                f"runs expected to take {duration(over.cost)}; {left} not reached (`skipped`, with `budget`, in " \
                f"{self.opts.results / RESULTS_FILE}): exit 1\n"
        if isinstance(self.order, order.PatternOrder) and self.order.unloaded:
            text += explore.coverage_note(self.order.search.summary()) + "\n"
        if self.incomplete:
            n_inc = len(self.incomplete)
            text += f"{n_inc} search{'es' if n_inc != 1 else ''} stopped before the end (`complete`: false in " \
                f"{self.opts.results / SEARCH_FILE}): exit 1\n"
        return text


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def not_ready(att: Attempt, why: NotReady) -> Attempt:
    """The attempt of a start that was never verified: no pid to name, nothing ran."""
    return replace(att, status=Status.NOT_READY, reason=why.reason, started_at=why.started_at, ended_at=time.time(),
                   unit_result=why.unit_result, journal=why.journal, retry=why.retry,
                   invocation_id=why.invocation_id, waited_seconds=why.waited_seconds)


def on_instance(att: Attempt, v: Verified, ran: Ran) -> Attempt:
    """The attempt of a command that ran (or was refused) on the verified instance `v`."""
    return replace(att, status=ran.status, reason=ran.reason, started_at=v.started_at, ended_at=ran.ended_at,
                   restarted=v.restarted, pid=v.pid, invocation_id=v.invocation_id, load_seconds=v.load_seconds,
                   exit_code=ran.exit_code, ran_at=ran.ran_at, cache=ran.cache, counters=ran.counters,
                   warmup_requests=ran.warmed.requests if ran.warmed else None,
                   warmup_converged=ran.warmed.converged if ran.warmed else None, gpu=ran.gpu,
                   categories=ran.categories)
