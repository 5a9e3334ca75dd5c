"""The strategy over server configurations (issue 51 §3): load the whole grid, or search its ordered axes.

Pure decisions, no I/O: a `Pattern` is asked for the next configuration to load (`next_load`) and told what each
load measured (`told`); run/order.py loads what it asks for and tells it the figures, and `sweep report` reads
the moves it recorded. With `strategy = "grid"` (the default) none of this runs: every configuration is loaded.

`strategy = "pattern"` is a pattern (compass) search over the server axes, each ordered as the plan's matrix
lists its values; a configuration is a position on each axis, and its neighbours are one step away on one axis:
- the first load is the plan's `start` configuration, else the middle of each axis;
- every load runs all the client settings of its configuration (concurrency, rate: the command's axes), and
  each client setting has its own best so far. The next load is the first unloaded neighbour of a best (client
  settings in plan order; a best's neighbours in the direction that last improved it first, then each axis
  down and up): a neighbour replaces a best when its figure (output tok/s) is higher by more than `min_gain`
  and more than the two runs' 95 % interval (with repeats), so noise alone does not move the search;
- when every neighbour of every best is loaded and none is better, a ridge step: one step on two axes at once,
  on the two whose own neighbours lost least (each its better way, neither more than RIDGE), at most RIDGES a
  best. Speculative decoding's axes are coupled (a deeper tree pays only with more tokens to verify), so a best
  no single step improves can fall to a step on both;
- the search stops when no best has an untried neighbour or ridge step: each best is a local optimum. Then
  `audit = N` configurations not loaded yet are loaded at random (`audit_seed`), one at a time, to catch a
  second optimum; one that beats a best becomes it and the search goes on from it.
So the search continues while the best at ANY client setting improves. A configuration that could not be
measured (its start failed, `prune` skipped it) is a neighbour that is never a best.

Then the reloads (`reloads = N`: at most N loads more). With one load a configuration and a few per cent of
load-to-load noise, which of two close configurations measured higher is a coin toss, and what a user gets is
the configuration the sweep names: at each client setting the one whose mean over its loads is highest
(`named`). A contender is a loaded configuration that may truly beat that leader by more than `min_gain`: its
mean is below the leader's by less than Z95 times the between-load spread of the difference (`between_sd`
times sqrt(1/n + 1/n_leader), n the loads of each) less `min_gain`. While
some client setting has a contender and the cap allows, the leader or contender with the fewest loads (then the
one in contention at the most client settings) is loaded again, a real load like any other, and the means and
the spread are updated. The between-load spread (the relative SD of one load's figure) is pooled from the
reloads themselves (each configuration's log figures about their mean), shrunk towards a prior worth its own
degrees of freedom: `noise`, an A/A start's measurement where a plan has one, else BETWEEN_PRIOR.

The decisions depend only on what the loads measured, in order: a resumed sweep tells the search the loads
its earlier run made (their lines in results.jsonl) and so continues the same search.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from genready.config import ConfigError

GRID: Final = "grid"
PATTERN: Final = "pattern"
STRATEGIES: Final = (GRID, PATTERN)
Scalar = str | int | float | bool
Config = tuple[int, ...]  # a position on each server axis
# why a configuration was never loaded (the summary's and the report's words)
NOT_CLOSE: Final = "never predicted close: no neighbour of a best led to it"
Z95: Final = 1.96
RIDGES: Final = 2  # ridge steps tried from each best
RIDGE: Final = 0.2  # a ridge step is tried only where each axis alone lost at most this share
RELOADS: Final = 4  # the plan key `reloads`' default: the most loads again of close contenders
RELOAD: Final = "reload"  # a reload's `why` starts so (explore.jsonl); its results lines carry `reload`: K


@dataclass(frozen=True)
class Noise:
    """A between-load spread known before the reloads (an A/A start's, issue 51 §1): the relative SD of one load's
    figure and the degrees of freedom behind it. The reloads' own evidence is pooled with it."""

    sd: float
    df: int


# Before anything measured it: a few per cent from load to load (issue 51 §1: the last round's hosts; the bench's
# simulator draws --load-noise 0.02), worth as much as four reloads' evidence.
BETWEEN_PRIOR: Final = Noise(0.02, 4)


@dataclass(frozen=True)
class Axes:
    """The server axes, each with its values in the plan's order: the grid a search moves on."""

    names: tuple[str, ...]
    values: tuple[tuple[Scalar, ...], ...]

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.values)

    def all(self) -> list[Config]:
        return list(itertools.product(*(range(len(v)) for v in self.values)))

    def config_of(self, values: Mapping[str, Scalar]) -> Config:
        return tuple(self.values[a].index(values[n]) for a, n in enumerate(self.names))

    def values_of(self, c: Config) -> dict[str, Scalar]:
        return {n: self.values[a][i] for a, (n, i) in enumerate(zip(self.names, c, strict=True))}

    def label(self, c: Config) -> str:
        return " ".join(f"{k}={json.dumps(v)}" for k, v in self.values_of(c).items())

    def middle(self) -> Config:
        return tuple((len(v) - 1) // 2 for v in self.values)


def axes_of(server_axes: Sequence[str], points: Sequence[Mapping[str, Scalar]]) -> Axes:
    """The server axes and their values in first-seen order (a [matrix] lists them so)."""
    return Axes(tuple(server_axes), tuple(tuple(dict.fromkeys(p[a] for p in points)) for a in server_axes))


def check(data: Mapping[str, Any], file: str, strategy: str, server_axes: Sequence[str],
          points: Sequence[Mapping[str, Scalar]]) -> tuple[tuple[str, Scalar], ...] | None:
    """The plan's strategy keys beyond their own readers' checks (plankeys.KEYS): `pattern` needs server axes whose
    values make a full grid (a neighbour must exist to be loaded), `start` a configuration of that grid, `audit`
    and `start` a strategy that uses them. The start's values, or None. ConfigError names file, key, expected and
    found."""
    if strategy == GRID:
        for key in ("start", "audit", "audit_seed", "min_gain", "reloads"):
            if key in data:
                raise ConfigError(file, key, 'strategy = "pattern" (the grid loads every configuration)',
                                  f"strategy {strategy!r}")
        return None
    if "search" in data:
        raise ConfigError(file, "strategy", '"grid" with a [search] table (a load search per configuration has no '
                          "one figure per client setting to climb)", f"strategy {strategy!r}")
    if not server_axes:
        raise ConfigError(file, "strategy", 'server axes to search: a drop-in using {name} placeholders ("grid" '
                          "for a plan without)", "no drop-in placeholders")
    axes = axes_of(server_axes, points)
    configs = {tuple(p[a] for a in server_axes) for p in points}
    if len(configs) != axes.size:
        raise ConfigError(file, "strategy", "server axes whose values make a full grid (every combination a point; "
                          "a [matrix] does), for the search's neighbours", f"{len(configs)} of the {axes.size} "
                          f"combinations of {', '.join(server_axes)}")
    if "start" not in data:
        return None
    raw = data["start"]
    expected = "a table giving each server axis one of its values: " + ", ".join(server_axes)
    if not isinstance(raw, dict) or set(raw) != set(server_axes):
        raise ConfigError(file, "start", expected, ("a table of " + ", ".join(raw) if isinstance(raw, dict)
                                                    else type(raw).__name__)[:80])
    for a, vs in zip(axes.names, axes.values, strict=True):
        if raw[a] not in vs or isinstance(raw[a], bool) != any(isinstance(v, bool) for v in vs):
            raise ConfigError(file, f"start.{a}", "one of the matrix's values: " + ", ".join(map(json.dumps, vs)),
                              repr(raw[a])[:80])
    return tuple((a, raw[a]) for a in server_axes)


@dataclass(frozen=True)
class Measured:
    """One configuration's figure at one client setting: its runs' values (output tok/s)."""

    runs: tuple[float, ...]

    @property
    def value(self) -> float:
        return statistics.median(self.runs)

    @property
    def rel_sd(self) -> float:
        """The relative standard error of the mean (0 with one run: a load's runs are its only noise known)."""
        if len(self.runs) < 2 or self.value <= 0:
            return 0.0
        return statistics.stdev(self.runs) / self.value / math.sqrt(len(self.runs))


def beats(new: Measured, best: Measured, min_gain: float) -> bool:
    """`new` is higher than `best` by more than `min_gain` and more than their ratio's 95 % half-width."""
    half = Z95 * math.hypot(new.rel_sd, best.rel_sd)
    return new.value > best.value * (1.0 + max(min_gain, half))


@dataclass
class Pattern:
    """The pattern search's state (module doc): ask `next_load`, load it, `told` it what the load measured."""

    axes: Axes
    start: Config | None = None
    audit: int = 0
    seed: int = 0
    min_gain: float = 0.02
    reloads: int = 0  # the cap on loads again of close contenders (module doc)
    noise: Noise = BETWEEN_PRIOR  # the between-load spread known before the reloads (run/order.knows: an A/A start's)
    measured: dict[Config, dict[str, Measured]] = field(default_factory=dict)  # each configuration's first load
    again: dict[Config, list[dict[str, Measured]]] = field(default_factory=dict)  # its reloads' figures
    tries: dict[Config, int] = field(default_factory=dict)  # its reloads, those without a figure too
    failed: set[Config] = field(default_factory=set)  # loaded (or skipped) without a figure
    best: dict[str, Config] = field(default_factory=dict)  # client setting -> its best so far
    went: dict[str, tuple[int, int]] = field(default_factory=dict)  # client setting -> (axis, +-1) that improved it
    audited: list[Config] = field(default_factory=list)
    audit_better: list[Config] = field(default_factory=list)  # audits that beat a best
    moves: list[dict[str, Any]] = field(default_factory=list)  # one per load: what it was for, what it changed
    stopped: str = ""  # why the search stopped before it was over (a budget): the unloaded ones' reason
    _why: dict[Config, str] = field(default_factory=dict)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @property
    def visited(self) -> set[Config]:
        return set(self.measured) | self.failed

    def next_load(self) -> Config | None:
        """The next configuration to load; None when the search (and its audit) is over."""
        if self.stopped:
            return None
        if not self.visited:
            c = self.start if self.start is not None else self.axes.middle()
            self._why[c] = "start" + ("" if self.start is not None else " (the middle of each axis)")
            return c
        # no best yet (every load so far failed): the failed ones' neighbours, to find one that starts
        around = list(self.best.items()) or [("no figure yet", f) for f in sorted(self.failed)]
        for setting, b in around:
            for c, axis, step in self._neighbours(b, self.went.get(setting)):
                if c not in self.visited:
                    what = "a failed load" if setting == "no figure yet" else f"the best at {setting}"
                    self._why[c] = f"neighbour of {what} ({self.axes.names[axis]} {'+-'[step < 0]}1)"
                    return c
        for setting, b in self.best.items():
            for c in self._ridge(b, setting):
                if c not in self.visited:
                    self._why[c] = f"ridge step from the best at {setting} (two axes at once)"
                    return c
        left = [c for c in self.axes.all() if c not in self.visited]
        if len(self.audited) < self.audit and left:
            c = self._rng.choice(left)
            self._why[c] = f"audit {len(self.audited) + 1} of {self.audit}"
            return c
        return self._reload()

    @property
    def loads(self) -> int:
        """The loads told so far: each configuration's first, and the reloads."""
        return len(self.visited) + sum(self.tries.values())

    def reload_of(self, c: Config) -> int:
        """Which load of `c` the next one is: 0 its first, K its K-th reload (its results lines' `reload`)."""
        return self.tries.get(c, 0) + 1 if c in self.visited else 0

    def figures(self, c: Config, setting: str) -> list[float]:
        """`c`'s figure at `setting` from each of its loads that measured one (first load first)."""
        loads = [self.measured.get(c, {}), *self.again.get(c, [])]
        return [m[setting].value for m in loads if setting in m]

    def mean(self, c: Config, setting: str) -> float:
        return statistics.fmean(self.figures(c, setting))

    def named(self) -> dict[str, Config]:
        """The best the sweep names at each client setting: the highest mean over its loads."""
        out: dict[str, Config] = {}
        for setting in self.best:
            out[setting] = max((c for c in self.measured if setting in self.measured[c]),
                               key=lambda c: self.mean(c, setting))
        return out

    def between_sd(self) -> float:
        """The relative SD of one load's figure: the prior (`noise`) pooled with the reloads' evidence. A load's
        factor is shared by its client settings, so a configuration's degrees of freedom are counted once (its
        loads less one), its squares averaged over the settings."""
        ss, df = self.noise.sd ** 2 * self.noise.df, self.noise.df
        for c, again in self.again.items():
            sq = []
            for setting in self.measured[c]:
                logs = [math.log(v) for v in self.figures(c, setting) if v > 0]
                if len(logs) >= 2:
                    mu = statistics.fmean(logs)
                    sq.append(sum((x - mu) ** 2 for x in logs) / (len(logs) - 1))
            if sq:
                ss, df = ss + statistics.fmean(sq) * len(again), df + len(again)
        return math.sqrt(ss / df) if df else 0.0

    def contenders(self, setting: str) -> list[Config]:
        """The loaded configurations whose mean at `setting` is within the noise of the named best's: the truth could
        put them above it by more than `min_gain` (a smaller difference is not worth a load to settle)."""
        lead = self.named()[setting]
        top, n_lead, sd = self.mean(lead, setting), len(self.figures(lead, setting)), self.between_sd()
        out = []
        for c in self.measured:
            n = len(self.figures(c, setting))
            if c != lead and n and self.mean(c, setting) >= top * (1.0 + self.min_gain - Z95 * sd * math.sqrt(
                    1 / n + 1 / n_lead)):
                out.append(c)
        return out

    def _reload(self) -> Config | None:
        """The next close call to load again (module doc), or None: none left, or the cap reached."""
        if sum(self.tries.values()) >= self.reloads:
            return None
        roles: dict[Config, list[str]] = {}  # a configuration in contention -> its role at each client setting
        named = self.named()
        for setting, lead in named.items():
            if rivals := self.contenders(setting):
                roles.setdefault(lead, []).append(f"leader at {setting}")
                for c in rivals:
                    roles.setdefault(c, []).append(f"contender at {setting}")
        if not roles:
            return None
        c = min(roles, key=lambda c: (1 + self.tries.get(c, 0), -len(roles[c])))  # first seen wins a tie
        self._why[c] = f"{RELOAD}: " + ", ".join(roles[c])
        return c

    def _neighbours(self, c: Config, first: tuple[int, int] | None) -> list[tuple[Config, int, int]]:
        order = [(a, s) for a in range(len(c)) for s in (-1, 1)]
        if first is not None:
            order.remove(first)
            order.insert(0, first)
        out = []
        for a, s in order:
            i = c[a] + s
            if 0 <= i < len(self.axes.values[a]):
                out.append(((*c[:a], i, *c[a + 1:]), a, s))
        return out

    def _ridge(self, b: Config, setting: str) -> list[Config]:
        """Where two axes together may climb a ridge that each alone cannot: one step on two axes at once, each in
        the direction its own neighbour measured higher, where neither lost more than RIDGE; the pairs whose two
        neighbours lost least first, at most RIDGES of them."""
        top = self.measured[b][setting].value
        way: dict[int, tuple[float, int]] = {}  # axis -> (its better neighbour's value, its direction)
        for c, a, s in self._neighbours(b, None):
            m = self.measured.get(c, {}).get(setting)
            if m is not None and m.value >= top * (1.0 - RIDGE) and m.value > way.get(a, (-math.inf, 0))[0]:
                way[a] = (m.value, s)
        pairs = sorted(itertools.combinations(sorted(way), 2), key=lambda p: -(way[p[0]][0] + way[p[1]][0]))
        out: list[Config] = []
        for a1, a2 in pairs[:RIDGES]:
            step = list(b)
            step[a1] += way[a1][1]
            step[a2] += way[a2][1]
            out.append(tuple(step))
        return out

    def told(self, c: Config, figures: Mapping[str, Sequence[float]] | None) -> None:
        """What the load of `c` measured: each client setting's run values (None or empty: no figure, as a
        failed start or a pruned configuration)."""
        got = {s: Measured(tuple(v)) for s, v in (figures or {}).items() if v}
        if c in self.visited:  # a reload: its figures join the configuration's, and the named best may move
            named, k = self.named(), self.reload_of(c)
            self.tries[c] = k
            if got:
                self.again.setdefault(c, []).append(got)
            now = self.named()
            self.moves.append({"load": self.loads, "config": self.axes.values_of(c),
                               "why": self._why.pop(c, RELOAD), "reload": k,
                               "measured": {s: round(m.value, 3) for s, m in got.items()},
                               "best_moved": [s for s in now if now[s] != named.get(s)],
                               "best": {s: self.axes.values_of(b) for s, b in now.items()}})
            return
        why = self._why.pop(c, "resumed")
        if why.startswith("audit"):
            self.audited.append(c)
        if not got:
            self.failed.add(c)
        else:
            self.measured[c] = got
        moved = []
        for setting, m in got.items():
            old = self.best.get(setting)
            if old is None:
                self.best[setting] = c
            elif beats(m, self.measured[old][setting], self.min_gain):
                self.best[setting] = c
                diff = [(a, c[a] - old[a]) for a in range(len(c)) if c[a] != old[a]]
                if len(diff) == 1 and abs(diff[0][1]) == 1:
                    self.went[setting] = diff[0]
                else:
                    self.went.pop(setting, None)
                moved.append(setting)
                if why.startswith("audit") and c not in self.audit_better:
                    self.audit_better.append(c)
        self.moves.append({"load": self.loads, "config": self.axes.values_of(c),
                           "why": why, "measured": {s: round(m.value, 3) for s, m in got.items()},
                           "best_moved": moved,
                           "best": {s: self.axes.values_of(b) for s, b in self.best.items()}})

    def stop(self, reason: str) -> None:
        """Stop the search before it is over (a budget): the configurations left get `reason`."""
        self.stopped = reason

    def unloaded(self) -> dict[Config, str]:
        """The configurations never loaded, each with why."""
        return {c: self.stopped or NOT_CLOSE for c in self.axes.all() if c not in self.visited}

    def summary(self) -> dict[str, Any]:
        """What the search did, for DIR/explore.jsonl's last line and the report's Decision."""
        return {"strategy": PATTERN, "done": True, "configurations": self.axes.size,
                "loaded": len(self.visited), "unloaded": len(self.unloaded()),
                "unloaded_why": sorted(set(self.unloaded().values())), "audit": self.audit,
                "audited": [self.axes.values_of(c) for c in self.audited],
                "audit_better": [self.axes.values_of(c) for c in self.audit_better],
                "best": {s: self.axes.values_of(b) for s, b in self.named().items()},
                "search_best": {s: self.axes.values_of(b) for s, b in self.best.items()},
                "loads": self.loads, "reloads": self.reloads, "reloaded": sum(self.tries.values()),
                "between_sd": round(self.between_sd(), 4), "stopped": self.stopped or None}


def coverage_note(summary: Mapping[str, Any]) -> str:
    """The Decision's sentence on the search's coverage, from explore.jsonl's summary line ("" if unreadable)."""
    try:
        loaded, n, audit = int(summary["loaded"]), int(summary["configurations"]), int(summary["audit"])
        better, why = list(summary["audit_better"]), [str(w) for w in summary["unloaded_why"]]
    except (KeyError, TypeError, ValueError):
        return ""
    text = f"the pattern search loaded {loaded} of {n} server configurations"
    if n > loaded:
        text += f"; {n - loaded} never loaded ({'; '.join(why)}): no figures for them, and a best among the loaded"
    if audit:
        text += f"; its audit of {audit} random unloaded configurations " + (
            f"found {len(better)} better (the search went on from there)" if better else "found nothing better")
    reloaded = summary.get("reloaded")
    if isinstance(reloaded, int) and not isinstance(reloaded, bool) and reloaded > 0:
        sd = summary.get("between_sd")
        text += (f"; {reloaded} reloaded close contenders (of at most {summary.get('reloads')}), each best named by "
                 "its mean over its loads" + (f", between-load spread {100 * sd:.1f} %" if isinstance(sd, float)
                                               else ""))
    return text


def report_text(lines: Sequence[Mapping[str, Any]]) -> str:
    """DIR/explore.jsonl as the report's section: a line per load, what it was for and which bests it moved."""
    loads = [rec for rec in lines if "load" in rec and isinstance(rec.get("config"), dict)]
    if not loads:
        return ""
    out = ["", "The pattern search's loads (explore.jsonl), in order:"]
    for rec in loads:
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in rec["config"].items())
        moved = rec.get("best_moved") or []
        out.append(f"  {rec['load']:>3}  {config}: {rec.get('why', '')}"
                   + (f"; the best moved at {', '.join(map(str, moved))}" if moved else "")
                   + ("" if rec.get("measured") else "; no figure (not started, or pruned)"))
    summary = next((rec for rec in reversed(lines) if rec.get("done")), None)
    out.append(f"  {coverage_note(summary)}" if summary else "  (the search did not finish: no summary line)")
    return "\n".join(out) + "\n"
