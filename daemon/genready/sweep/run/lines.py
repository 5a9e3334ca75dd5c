"""What a sweep says while it runs: its lines on stderr (redrawn on a terminal), and the ETA in them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from genready import console
from genready.redact import escape
from genready.sweep.plan import Plan, Point
from genready.sweep.plankeys import Between
from genready.timewords import duration


def shown(text: str) -> str:
    """`text` for a terminal, one line per line systemd sees: systemd breaks lines at \\n only, so
    U+2028, U+0085 and other control characters (a terminal might break or act on them) are shown escaped."""
    return escape(text)


class Console:
    """The sweep's lines on stderr: `say` for the sweep, `progress` for a point; a transient line is
    redrawn in place on a terminal. A reader that went away (`genready sweep ... | head`) must not stop
    the sweep half-way with a point's configuration left on the unit: console.write drops the text."""

    def __init__(self, err: TextIO, n_points: int) -> None:
        self.err, self.n_points = err, n_points
        self.tty = err.isatty()
        self._told: set[str] = set()

    def say(self, text: str) -> None:
        text = escape(text)  # it may quote a server's or systemd's words
        console.write(("\r\033[K" if self.tty else "") +
                      (f"genready sweep: {text}\n" if not text.startswith("[") else text + "\n"), self.err)

    def once(self, key: str, text: str) -> None:
        """`say` the first time only: a server that cannot be flushed, or has no /metrics, is said once."""
        if key not in self._told:
            self._told.add(key)
            self.say(text)

    def progress(self, point: Point, text: str, *, transient: bool = False) -> None:
        line = f"[{point.index}/{self.n_points}] {shown(point.label)}: {text}"
        if transient and self.tty:
            console.write("\r\033[K" + line[:200], self.err)
        else:
            self.say(line)


@dataclass(frozen=True)
class Left:
    """What is left from a point on: its loads and runs, and the seconds each is expected to take."""

    loads: int
    runs: int
    load: float | None  # expected seconds per load; None: no load timed and no history
    run: float | None  # mean seconds per run; None: no run timed yet (the time counts the loads alone)

    @property
    def seconds(self) -> float | None:
        """The expected time; None when a load is left and none can be estimated. Without a run time, the loads'
        alone (a lower bound)."""
        if self.load is None and self.loads:
            return None
        return self.loads * (self.load or 0.0) + (self.runs * self.run if self.run is not None else 0.0)


@dataclass
class Timings:
    """What the ETA is computed from: this sweep's loads and runs, or before the first load the
    daemon's expected_load_seconds (with a `budget`, the unit's load history, budget.py, before that)."""

    load_times: list[float] = field(default_factory=list)  # seconds from restart to verified
    expected_load: float | None = None  # the daemon's expected_load_seconds, until a load is timed
    run_times: list[float] = field(default_factory=list)  # seconds of ok commands
    expected_run: float | None = None  # with a `budget`: earlier sweeps' mean run (budget.py), until a run is timed
    last_load: float | None = None
    repeats: int = 1  # the plan's runs per point
    steps: int = 1  # with a [search], the steps a point's search is expected to run (search.expected_steps)
    every_run_loads: bool = False  # --restart-each / between_points = "restart": each repeat is a fresh start
    schedule: Sequence[tuple[Point, bool]] = ()  # the points to run, in order; True: a planned load

    def loaded(self, seconds: float) -> None:
        self.last_load = seconds
        self.load_times.append(seconds)

    def left(self, point: Point, *, loading: bool, one_load: bool = False) -> Left:
        """Loads and runs left from `point` on (`schedule`: the points in order, True where a load is planned; each
        point is `repeats` runs of each of its `steps`, the current one counted whole); `one_load`: only up to the
        next planned load (what a load at `point` brings: the budget's check). The expected load is the mean of
        this sweep's loads, or before the first one the daemon's expected_load_seconds (its recent loads of the
        unit); the run, the mean of this sweep's runs, or before the first one `expected_run`."""
        load = sum(self.load_times) / len(self.load_times) if self.load_times else self.expected_load
        run = sum(self.run_times) / len(self.run_times) if self.run_times else self.expected_run
        at = next((i for i, (p, _) in enumerate(self.schedule) if p.index == point.index), len(self.schedule))
        rest = self.schedule[at:]
        if one_load:
            rest = rest[:next((i for i, (_, first) in enumerate(rest) if i and first), len(rest))]
        runs = len(rest) * self.repeats * self.steps
        if self.every_run_loads:
            loads = runs - (0 if loading else 1)
        else:
            loads = sum(1 for _, first in rest[1:] if first) + (1 if loading else 0)
        return Left(loads, runs, load, run)

    def eta(self, point: Point, *, loading: bool) -> str:
        """`left` as the ETA of a line: until a run is measured it counts the loads alone, and says so."""
        left = self.left(point, loading=loading)
        if left.seconds is None or left.load is None:
            return ""
        if left.run is None:
            loads = left.loads
            return f", ETA > {duration(left.seconds)} ({loads} load{'s' if loads != 1 else ''}, runs not yet timed)"
        return f", ETA {duration(left.seconds)}"


def between_words(plan: Plan) -> str:
    """What happens before each run, in a line: the plan's between_points, warmup and repeats."""
    how = {Between.FLUSH: "the server's prefix cache flushed through its own route before each run on a reused "
           "instance",
           Between.NONE: "no flush between points (reused points run warm)",
           Between.RESTART: "a fresh start for every run"}[plan.between_points]
    warmup = (f"a warmup until TTFT and ITL settle (windows of {plan.warmup_window}, within "
              f"{100 * plan.warmup_tolerance:g} %, at most {plan.warmup_max} requests or {plan.warmup_max_seconds:g} s)"
              if plan.stable else f"{plan.warmup} warmup request{'s' if plan.warmup != 1 else ''}")
    return f"{how}; {warmup} before each run" + (
        f"; {'up to ' if plan.repeats_auto else ''}{plan.repeats} repeats per point" if plan.repeats > 1 else "") + (
        f"; an A/A start of {plan.noise_check} loads first (noise_check)" if plan.noise_check else "")


def loads_line(n_points: int, groups: Sequence[Sequence[Point]], restart_each: bool) -> str:
    """`8 points, 2 server configurations: 2 loads` (every point a load with --restart-each)."""
    loads = n_points if restart_each else len(groups)

    def n(k: int, word: str) -> str:
        return f"{k} {word}{'' if k == 1 else 's'}"
    return f"{n(n_points, 'point')}, {n(len(groups), 'server configuration')}: {n(loads, 'load')}" + \
        (" (--restart-each)" if restart_each else "")
