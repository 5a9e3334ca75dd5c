"""Which server configurations the sweep loads, and in what order: the plan's `strategy` (sweep/explore.py).

The runner asks an Order for its groups (`for n, group in order`) and tells it each group once its points are
done (`told`). `grid` is the schedule as it always was: every configuration, with the baseline's rounds among
them (baseline.py). `pattern` loads what the search asks for, one configuration at a time, the baseline's round
1 first and, with `baseline_every = N`, a round after every N configurations loaded and after the last; its
rounds are the grid schedule's own points (the same numbers), so a resumed or a grid sweep's lines match.

The search is told each configuration's output tok/s per client setting from its lines in results.jsonl: the
lines this run wrote, and with --resume the ok lines an earlier run left (the runner skips those points, so
nothing is loaded for them) and so a resumed sweep makes the same decisions and continues the same search.
Each load's decision goes to DIR/explore.jsonl as it is made, and the summary at the end; the configurations
never loaded get a `skipped` results line each, with the reason and no figures. A search's reload (explore.py)
yields its configuration's group again with `reload` = K: the runner loads it anew and writes K into its lines,
and the search is told that load's lines only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from genready.sweep import explore, noise
from genready.sweep.files import EXPLORE_FILE, reload_of
from genready.sweep.plan import Plan, Point, text_of
from genready.sweep.rows import row_of
from genready.sweep.run import baseline as sweepbaseline
from genready.sweep.run.results import Results, Status, json_text, writing
from genready.tools import benchline

TPS = benchline.OUTPUT_TOKENS_PER_SECOND.key  # the figure the search climbs, as the Decision ranks by


def setting_of(plan: Plan, point: Point) -> str:
    """A point's client setting in words, `concurrency=4` (the search keeps a best per setting)."""
    return " ".join(f"{k}={text_of(v)}" for k, v in sweepbaseline.client_of(plan, point).items()) or "(one setting)"


class Order:
    """The grid: every group of the schedule, in order; told nothing."""

    def __init__(self, groups: Sequence[tuple[Point, ...]]) -> None:
        self.groups = list(groups)
        self.unloaded: dict[int, str] = {}  # point index -> why it was never loaded (a search's)
        self.reload = 0  # which load of its configuration the group yielded last is: 0 its first, K a reload

    def __iter__(self) -> Iterator[tuple[int, tuple[Point, ...]]]:
        yield from enumerate(self.groups, 1)

    def told(self, group: tuple[Point, ...]) -> None:
        """The group's points are done (ok, failed or skipped): their lines are in the runner's Results."""

    def finish(self, record: Callable[[Point, int, str], None]) -> None:
        """The search is over: `record` a line for each point never loaded (nothing for the grid)."""

    def stop(self, left: Sequence[Point], why: str) -> list[Point]:
        """The sweep stops (a budget) with `left` not run of the grid's schedule: the points it does not reach."""
        return list(left)

    def knows(self, spread: noise.Components) -> None:
        """The A/A start measured the output tok/s' spread between loads (noisecheck.py): nothing for the grid."""


class PatternOrder(Order):
    """strategy = "pattern": the groups the search asks for (module doc)."""

    def __init__(self, plan: Plan, groups: Sequence[tuple[Point, ...]], results: Results, folder: Path,
                 round_before: dict[int, int]) -> None:
        super().__init__(groups)
        self.plan, self.results, self.folder, self.round_before = plan, results, folder, round_before
        self.axes = explore.axes_of(plan.server_axes, [p.as_dict() for p in plan.points])
        self.by_config = {self.axes.config_of(g[0].as_dict()): g for g in groups if not (g[0].baseline or g[0].aa)}
        self.rounds = [g for g in groups if g[0].baseline]
        self.aa = [g for g in groups if g[0].aa]  # noise_check's loads (noisecheck.py): before anything else
        self.search = explore.Pattern(self.axes, start=self.axes.config_of(dict(plan.start)) if plan.start else None,
                                      audit=plan.audit, seed=plan.audit_seed, min_gain=plan.min_gain,
                                      reloads=plan.reloads)
        self.loaded = 0

    def __iter__(self) -> Iterator[tuple[int, tuple[Point, ...]]]:
        n, every, done = 0, self.plan.baseline_every, 0  # done: baseline rounds yielded
        for n, group in enumerate(self.aa, 1):
            yield n, group
        if self.rounds:
            n, done = n + 1, 1
            yield n, self.rounds[0]
        while (c := self.search.next_load()) is not None:
            group = self.by_config[c]
            self.reload = self.search.reload_of(c)
            for p in group:
                self.round_before[p.index] = self.rounds[done - 1][0].baseline if done else 0
            n += 1
            yield n, group
            self.loaded += 1
            self.reload = 0
            if every and self.loaded % every == 0 and done < len(self.rounds):
                n, done = n + 1, done + 1
                yield n, self.rounds[done - 1]
        if every and self.loaded % every and done < len(self.rounds):  # the round after the last
            yield n + 1, self.rounds[done]

    def told(self, group: tuple[Point, ...]) -> None:
        if group[0].baseline or group[0].aa:  # evidence of the noise, not a configuration the search loaded
            return
        figures: dict[str, list[float]] = {}
        for p in group:
            runs = []
            for rec in self.results.lines(p.index):
                if rec.get("status") == Status.OK.value and reload_of(rec) == self.reload and \
                        isinstance(v := (row_of(rec, self.folder).figures or {}).get(TPS), int | float):
                    runs.append(float(v))
            if runs:
                figures[setting_of(self.plan, p)] = runs
        self.search.told(self.axes.config_of(group[0].as_dict()), figures)
        self._write()

    def knows(self, spread: noise.Components) -> None:
        """The reloads' prior is the A/A start's measured spread between loads (explore.Noise), not BETWEEN_PRIOR."""
        if spread.df_between:
            self.search.noise = explore.Noise(math.sqrt(spread.between), spread.df_between)

    def stop(self, left: Sequence[Point], why: str) -> list[Point]:
        """The search stops before it is over: its rounds left, and the configurations it never loaded, all `why`
        (the runner records their lines); explore.jsonl's summary says it stopped."""
        self.search.stop(why)
        unloaded = self.search.unloaded()
        gone = [p for p in left if p.baseline or p.aa or self.axes.config_of(p.as_dict()) in unloaded]
        self.unloaded.update({p.index: why for p in gone if not (p.baseline or p.aa)})
        self._write(summary=True)
        return gone

    def finish(self, record: Callable[[Point, int, str], None]) -> None:
        for c, why in self.search.unloaded().items():
            for p in self.by_config[c]:
                self.unloaded[p.index] = why
                record(p, 0, why)
        self._write(summary=True)

    def _write(self, *, summary: bool = False) -> None:
        """DIR/explore.jsonl whole: a line per load so far, and the summary once the search is over."""
        lines: list[dict[str, Any]] = [{"strategy": explore.PATTERN, **m} for m in self.search.moves]
        if summary:
            lines.append(self.search.summary())
        with writing(self.folder):
            (self.folder / EXPLORE_FILE).write_text("".join(json_text(rec) + "\n" for rec in lines))


def of(plan: Plan, groups: Sequence[tuple[Point, ...]], results: Results, folder: Path,
       round_before: dict[int, int]) -> Order:
    """The plan's strategy over `groups` (the schedule, baseline rounds included)."""
    if plan.strategy == explore.PATTERN:
        return PatternOrder(plan, groups, results, folder, round_before)
    return Order(groups)


def dry_run_words(plan: Plan) -> str:
    """What --dry-run says of the strategy: what loads first, how the search moves, the most it can load."""
    if plan.strategy != explore.PATTERN:
        return ""
    axes = explore.axes_of(plan.server_axes, [p.as_dict() for p in plan.points])
    start = axes.config_of(dict(plan.start)) if plan.start else axes.middle()
    return (f'strategy = "pattern": the listing below is the grid; the search loads {axes.label(start)} first, then '
            f"neighbours of each client setting's best (one step on one axis, or on two for a ridge) while a best "
            f"improves by more than min_gain = {plan.min_gain:g}, then audit = {plan.audit} at random (audit_seed = "
            f"{plan.audit_seed}), then at most reloads = {plan.reloads} loads again of close contenders (the best "
            f"named by its mean over loads): at most {axes.size + plan.reloads} loads (the whole grid and the "
            "reloads; each load is decided by the one before, so which ones cannot be listed before they run)")
