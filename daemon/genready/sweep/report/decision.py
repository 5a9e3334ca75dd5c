"""The report's "Decision" section (issue 37 §3, issue 39 §3): what a sweep answers, in sentences, first.

One sentence per client setting (a point's values for the axes its drop-in does not use; baseline.client_of):
the best configuration by output tok/s, its speedup over the baseline with the 95 % interval (speedup.py; a
speedup below 1 is called a slowdown), the configurations *within noise* of it, and, with the plan's `slo`
key, the best configuration among those that met it and which part each other one failed. Then, from
DIR/search.jsonl's found lines (searchrun.py), the configuration that serves the most load under the
search's SLO (or before saturating) and, with a baseline, up to which load speculation pays (its crossover).

Within noise of the best: the ratio of the two configurations' output tok/s over their repeats (noise.ratio: log
scale, Welch's t, with the spread between loads where the sweep measured one) has a 95 % interval that holds 1;
with one run on each side, the ratio is within the plan's `noise_limit` of 1 (Ratio.within_noise, the test every
speedup takes).

An SLO part (the bench client's `--slo` names: METRIC_pNN_ms) is judged on the bench line's figure of the same
name (ttft, itl, e2e at p50 and p99), the worst over the point's ok repeats, as a search step is judged by its
worst run; a part no bench line carries (p90) is said to be not measured, never taken as met.

Pure functions of the report's rows and what `Facts` holds: the files are read by the caller (report/main.py).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from genready.redact import escape
from genready.sweep import budget as sweepbudget
from genready.sweep import noise
from genready.sweep.noise import Ratio
from genready.sweep.report import outputs, slower, speedup
from genready.sweep.rows import Row
from genready.tools import benchline
from genready.tools.benchload import SloPart, parse_slo
from genready.web import htmlpage

TPS: Final = benchline.OUTPUT_TOKENS_PER_SECOND.key
MAX_NAMED: Final = 8  # configurations named in one list of a sentence, then "and N more"
TITLE: Final = "Decision"
WITHIN_NOISE: Final = ("within noise: their output tok/s over the best's has a 95 % interval holding 1 (over their "
                       "repeats); with one run each, no further from 1 than the plan's noise_limit")


# --- what the report knows besides its rows ---------------------------------------------------------------------

def slo_from(value: object) -> tuple[SloPart, ...] | None:
    """A results line's `slo` ({"ttft_p99_ms": 500, ...}, the plan's key as recorded) as SloParts; None when it is
    not one (absent, or written by something else)."""
    if not isinstance(value, Mapping) or not value:
        return None
    if not all(isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) for k, v in value.items()):
        return None
    try:
        return parse_slo(",".join(f"{k}={v!r}" for k, v in value.items()))
    except ValueError:
        return None


def slo_text(parts: Sequence[SloPart]) -> str:
    return ", ".join(f"{p.key} <= {p.limit_ms:g} ms" for p in parts)


@dataclass(frozen=True)
class Facts:
    """The plan's SLO as the results lines recorded it, and DIR/search.jsonl's found lines (in file order)."""

    slo: tuple[SloPart, ...] = ()
    found: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    deploy: str = ""  # what to run, the Decision's last sentence (issue 52 §5: report/schedule.py's deploy_line)
    # the plan's `budget` stopped the sweep (sweep/budget.py): the lines of the points it did not reach
    not_reached: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, lines: Iterable[Mapping[str, Any]], found: Iterable[Mapping[str, Any]] = ()) -> Facts:
        """From every results line read (the last line's SLO counts: a plan edited and resumed judges by its
        latest) and every search.jsonl line; lines from before the `slo` key have none."""
        slos: dict[str, tuple[SloPart, ...]] = {}
        last: tuple[SloPart, ...] = ()
        lines = list(lines)
        for rec in lines:
            if (got := slo_from(rec.get("slo"))) is not None:
                slos[slo_text(got)] = last = got
        notes = (f"the results lines hold {len(slos)} different SLOs; judged against the last: {slo_text(last)}",) \
            if len(slos) > 1 else ()
        return cls(last, tuple(f for f in found if isinstance(f, Mapping)), notes,
                   not_reached=tuple(sweepbudget.not_reached(lines)))

    @property
    def provisional(self) -> str | None:
        """The sentence saying the Decision is provisional, and what the budget left unreached; None if nothing."""
        return sweepbudget.provisional_words(self.not_reached, line_label)


# --- per client setting ---------------------------------------------------------------------------------------

def _key(values: Mapping[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def _value_key(v: Any) -> object:
    """What tells two point values apart, as _key does (1, 1.0 and true differ; NaN is NaN), made cheaply
    for a scalar: a 64 MiB results file has a value per line and axis (issue 41 #9d)."""
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return t.__name__, v
    if t is float:
        return "float", repr(v)
    return "json", _key({"v": v})


def values_words(values: Mapping[str, Any]) -> str:
    """A point's (or client setting's) values as the report writes them: `steps=3 topk=2`."""
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in values.items())


def client_axes(rows: Sequence[Row]) -> set[str]:
    """Without a baseline the lines name no client setting: the axes whose value changes inside a server
    configuration (a group; a line without one is a configuration of its own), as the HTML report's axes."""
    seen: dict[tuple[str, int, str], object] = {}  # (host, group, axis): merged shards number their groups alike
    out: set[str] = set()
    for r in rows:
        g = r.group if r.group is not None else -r.index
        for k, v in r.point.items():
            if k in out:  # a 64 MiB file's rows: decided once, no more keys to make
                continue
            key = _value_key(v)
            if seen.setdefault((r.host, g, k), key) != key:
                out.add(k)
    return out


def settings(rows: Sequence[Row]) -> list[tuple[dict[str, Any], list[Row]]]:
    """The plan's points (not the baseline's runs) by client setting, in plan order."""
    points = [r for r in rows if not r.baseline]
    named = {k for r in points for k in (r.client or {})}  # a baseline plan's lines name it (not a skipped one's)
    axes = named if any(r.client is not None for r in points) else client_axes(points)
    out: dict[tuple[tuple[str, object], ...], tuple[dict[str, Any], list[Row]]] = {}
    for r in points:
        client = {k: v for k, v in r.point.items() if k in axes}
        out.setdefault(tuple(sorted((k, _value_key(v)) for k, v in client.items())), (client, []))[1].append(r)
    return list(out.values())


def line_label(rec: Mapping[str, Any]) -> str:
    """A line's point (a results line's, a search found line's) as the report writes it."""
    point = rec.get("point")
    return escape(values_words(point) if isinstance(point, Mapping) else str(point)) or "(no values)"


def config_label(r: Row, client: Mapping[str, Any]) -> str:
    """A configuration's name in a sentence: its server-side values (the row's label when it has none)."""
    words = values_words({k: v for k, v in r.point.items() if k not in client})
    return escape(words or r.label)


def tps(r: Row) -> float | None:
    v = (r.figures or {}).get(TPS)
    return v if r.status == "ok" and v is not None and math.isfinite(v) and v > 0 else None


def _runs(r: Row, key: str) -> list[float]:
    got = [v for v in r.samples.get(key, []) if math.isfinite(v)]
    v = (r.figures or {}).get(key)
    return got or ([v] if v is not None and math.isfinite(v) else [])


def _loads(r: Row) -> noise.Components | None:
    """The spread between loads of output tok/s that an interval of `r` takes in (noise.py; None without it)."""
    return r.noise.loads(TPS) if r.noise is not None else None


def within_noise(r: Row, best: Row) -> bool:
    """`r`'s output tok/s is within noise of `best`'s (module doc)."""
    got = noise.ratio(_runs(r, TPS), _runs(best, TPS), loads=_loads(r))
    return got is not None and got.within_noise(max(r.noise_limit, best.noise_limit))


@dataclass(frozen=True)
class Verdict:
    """A point against the SLO: the parts it failed (with the worst figure over its repeats), the parts no figure
    of it measures; met when it failed none and every part was measured."""

    failed: tuple[tuple[SloPart, float], ...] = ()
    unmeasured: tuple[SloPart, ...] = ()

    @property
    def met(self) -> bool | None:
        return False if self.failed else (None if self.unmeasured else True)

    def words(self) -> str:
        out = [f"{p.key} {v:.4g} > {p.limit_ms:g}" for p, v in self.failed]
        out += [f"{p.key} not measured" for p in self.unmeasured]
        return ", ".join(out)


def judge(r: Row, parts: Sequence[SloPart]) -> Verdict:
    failed, unmeasured = [], []
    for p in parts:
        runs = _runs(r, p.key)
        if not runs:
            unmeasured.append(p)
        elif (worst := max(runs)) > p.limit_ms:
            failed.append((p, worst))
    return Verdict(tuple(failed), tuple(unmeasured))


# The answer at a client setting against the baseline (issue 52 §4): no speculation is a candidate at every load.
SPECULATION: Final = "speculation"  # the best configuration is faster than the baseline, beyond the noise
NO_SPECULATION: Final = "no_speculation"  # the baseline is the best by its estimate
WITHIN_BASELINE: Final = "within_noise"  # faster by its estimate, within noise of the baseline: nothing shown
UNDECIDED: Final = "undecided"  # the interval cannot tell a noise_limit gain from a noise_limit loss
MOST_REPEATS: Final = 100  # past this many repeats a side, "more than": lower the noise instead


@dataclass
class Setting:
    """The decision at one client setting."""

    client: dict[str, Any]
    best: Row | None = None
    near: list[Row] = field(default_factory=list)  # within noise of the best
    not_ok: int = 0  # points of the setting without an ok run and a tok/s
    slo_best: Row | None = None
    slo_failed: list[tuple[Row, Verdict]] = field(default_factory=list)
    slo_unjudged: list[tuple[Row, Verdict]] = field(default_factory=list)
    baseline: Row | None = None  # the baseline's run the best is compared with (speedup.attach's)
    answer: str | None = None  # SPECULATION, NO_SPECULATION, WITHIN_BASELINE, UNDECIDED; None: no baseline run
    repeats: int | None = None  # UNDECIDED: the repeats of each side that would tell (None: more than MOST_REPEATS)


def baseline_runs(rows: Sequence[Row]) -> Callable[[Row], Row | None]:
    """The baseline round a point ran after at its client setting on its host (as speedup.attach matches)."""
    bases = {json.dumps([r.host, r.baseline, r.client], sort_keys=True): r for r in rows
             if r.baseline and r.status == "ok" and r.client is not None}
    return lambda r: None if r.baseline or r.client is None or not r.baseline_round else \
        bases.get(json.dumps([r.host, r.baseline_round, r.client], sort_keys=True))


def too_wide(got: Ratio, noise_limit: float) -> bool:
    """The interval holds both a gain and a loss of `noise_limit`: it cannot tell which side is faster."""
    return got.low is not None and got.high is not None and got.low < 1 / (1 + noise_limit) and \
        got.high > 1 + noise_limit


def against_baseline(s: Setting, base: Row | None) -> None:
    """The setting's answer (issue 52 §4): the best configuration's speedup decides, the baseline standing as the
    configuration "no speculation"; an interval too wide to tell says how many repeats would."""
    got = s.best.ratios.get("speedup") if s.best is not None else None
    if s.best is None or got is None:
        return
    s.baseline = base
    limit = max(s.best.noise_limit, base.noise_limit if base is not None else 0.0)
    if too_wide(got, limit):
        s.answer = UNDECIDED
        s.repeats = speedup.repeats_needed(_runs(s.best, TPS), _runs(base, TPS) if base is not None else [],
                                           limit, MOST_REPEATS, loads=_loads(s.best))
    elif got.value < 1:
        s.answer = NO_SPECULATION
    else:
        s.answer = WITHIN_BASELINE if got.within_noise(s.best.noise_limit) else SPECULATION


def decide(rows: Sequence[Row], slo: Sequence[SloPart] = ()) -> list[Setting]:
    out = []
    base_of = baseline_runs(rows)
    for client, group in settings(rows):
        s = Setting(client)
        ok = [r for r in group if tps(r) is not None]
        s.not_ok = len(group) - len(ok)
        ok = [r for r in ok if not (r.outputs and r.outputs.marked)]  # diverged, degenerate: never best (outputs.py)
        if ok:
            s.best = max(ok, key=lambda r: tps(r) or 0.0)  # the first of equals: plan order
            s.near = [r for r in ok if r is not s.best and within_noise(r, s.best)]
            against_baseline(s, base_of(s.best))
        if slo and ok:
            verdicts = [(r, judge(r, slo)) for r in ok]
            met = [r for r, v in verdicts if v.met]
            s.slo_best = max(met, key=lambda r: tps(r) or 0.0) if met else None
            s.slo_failed = [(r, v) for r, v in verdicts if v.met is False]
            s.slo_unjudged = [(r, v) for r, v in verdicts if v.met is None]
        out.append(s)
    return out


def _names(items: Sequence[str]) -> str:
    shown = list(items[:MAX_NAMED])
    if len(items) > MAX_NAMED:
        shown.append(f"and {len(items) - MAX_NAMED} more")
    return ", ".join(shown)


def speedup_words(r: Row) -> str:
    """`2.09x the baseline's output tok/s [1.92-2.27]`; a slowdown said as one; within noise said as such."""
    got = r.ratios.get("speedup")
    if got is None:
        return "no baseline run at this setting to compare with"
    ci = f" [95 % interval {got.low:.2f}-{got.high:.2f}]" if got.low is not None and got.high is not None else \
        " (one run each: no interval)"
    if got.within_noise(r.noise_limit):
        text = f"{got.value:.2f}x the baseline's{ci}: within noise of the baseline, no speedup shown"
    elif got.value < 1:
        text = f"{got.value:.2f}x the baseline's{ci}: a slowdown, the baseline is faster"
    else:
        text = f"{got.value:.2f}x the baseline's{ci}"
    if r.drifted is not None:
        text += f" (the baseline drifted {speedup.drift_text(r.drifted)} around it)"
    if who := slower.words(r.outputs.slower if r.outputs else None):  # who pays for the mean (slower.py)
        text += f"; {escape(who)}"
    return text


def _noise(runs: Sequence[float]) -> str:
    """Run to run noise as a percentage: the standard deviation of the runs' logs (a ratio's scale)."""
    logs = [math.log(v) for v in runs if math.isfinite(v) and v > 0]
    return f"{math.expm1(statistics.stdev(logs)):.0%}" if len(logs) >= 2 else "one run"


def undecided_words(s: Setting) -> str:
    """Why an UNDECIDED setting names nothing, and the repeats that would decide it (speedup.repeats_needed)."""
    assert s.best is not None
    got = s.best.ratios["speedup"]
    limit = max(s.best.noise_limit, s.baseline.noise_limit if s.baseline is not None else 0.0)
    text = (f"the best estimate, {config_label(s.best, s.client)} at {tps(s.best):.1f} output tok/s, is "
            f"{got.value:.2f}x the baseline's [95 % interval {got.low:.2f}-{got.high:.2f}], too wide to tell a "
            f"{limit:.0%} gain from a {limit:.0%} loss (the plan's noise_limit)")
    noise = f"the runs' noise: {_noise(_runs(s.best, TPS))} and the baseline's " + \
        (_noise(_runs(s.baseline, TPS)) if s.baseline is not None else "unknown")
    if s.repeats is None:
        return text + f"; more than {MOST_REPEATS} repeats of each would be needed ({noise}): make the runs steadier"
    return text + f"; repeats = {s.repeats} would tell ({noise})"


def sentence(s: Setting, *, with_baseline: bool, slo: Sequence[SloPart]) -> str:
    at = f"At {escape(values_words(s.client))}: " if s.client else ""
    if s.best is None:
        return f"{at}no configuration ran ok with an output tok/s."
    name = config_label(s.best, s.client)
    if s.answer == UNDECIDED:
        text = f"{at}more repeats needed, no configuration named: {undecided_words(s)}"
    elif s.answer == NO_SPECULATION:
        base = tps(s.baseline) if s.baseline is not None else None
        text = (f"{at}no speculation at this load: the baseline" + (f"'s {base:.1f} output tok/s" if base else "") +
                f" is the best; the closest configuration, {name} at {tps(s.best):.1f}, is {speedup_words(s.best)}")
    else:
        text = f"{at}{name} is the best at {tps(s.best):.1f} output tok/s"
        if with_baseline:
            text += ", " + speedup_words(s.best)
    if s.near:
        text += "; within noise of it: " + _names([f"{config_label(r, s.client)} ({tps(r):.1f})" for r in s.near])
    else:
        text += "; no other configuration within noise of it"
    if slo:
        if s.slo_best is None:
            text += "; none met your SLO"
        elif s.slo_best is s.best:
            text += "; it meets your SLO"
        else:
            text += (f"; under your SLO the best is {config_label(s.slo_best, s.client)} at {tps(s.slo_best):.1f} "
                     "tok/s" + (f", {speedup_words(s.slo_best)}" if with_baseline else ""))
        if s.slo_failed:
            text += "; not met by " + _names([f"{config_label(r, s.client)} ({v.words()})" for r, v in s.slo_failed])
        if s.slo_unjudged:
            text += "; not judged: " + _names([f"{config_label(r, s.client)} ({v.words()})"
                                               for r, v in s.slo_unjudged])
    if s.not_ok:
        text += f"; {s.not_ok} point{'s' if s.not_ok != 1 else ''} without an ok run not counted"
    return text + "."


# --- the load search's found lines (issue 39 §3) ----------------------------------------------------------------

def finite_number(v: object) -> float | None:
    """A JSON number as a finite float, else None (a bool, a string, NaN, an infinity, an integer beyond any
    float): how the report reads a number from a line it did not write itself."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _unit(rec: Mapping[str, Any]) -> str:
    return "concurrent requests" if rec.get("axis") == "concurrency" else "req/s"


def crossover_words(rec: Mapping[str, Any]) -> str | None:
    """Where speculation stops paying for one configuration, from its found line's `crossover` and
    `crossover_status`; None when the line has neither (a search.jsonl from before crossovers)."""
    status, at, unit = rec.get("crossover_status"), finite_number(rec.get("crossover")), _unit(rec)
    if status == "interpolated" and at is not None:
        return f"speculation pays up to {at:.3g} {unit} (interpolated between steps)"
    if status == "pays_throughout":
        return "speculation pays at every load searched"
    if status == "never_pays":
        return "speculation never pays at the loads searched: the baseline is faster at each"
    if status == "within_noise":
        return "speculation neither pays nor loses at the loads searched: within the plan's noise_limit of the " \
            "baseline at each"
    if status == "no_baseline":
        return "no crossover: the baseline was not searched"
    if at is not None:
        return f"speculation pays up to {at:.3g} {unit}"
    return None


def _found_key(rec: Mapping[str, Any]) -> str:
    """A found line's configuration, as a row's point and baseline round name it."""
    b = rec.get("baseline")
    return _key({"p": rec.get("point"), "b": b if isinstance(b, int) and not isinstance(b, bool) else 0})


def latest_found(found: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The last found line per configuration (a resumed search writes its line again, and a configuration's
    again when the baseline's search completes its crossover); a baseline's search is one of its own, though it
    may hold a plan point's values."""
    last: dict[str, Mapping[str, Any]] = {}
    for rec in found:
        last[_found_key(rec)] = rec
    return list(last.values())


def search_sentences(found: Sequence[Mapping[str, Any]], with_baseline: bool) -> list[str]:
    """'Best under your SLO: X, serves up to R req/s; speculation pays up to R' req/s', or the saturation
    mode's like, over the configurations' found lines (the baseline's own, `baseline` in it, left out)."""
    lines = [r for r in latest_found(found) if r.get("baseline") in (None, 0, False)]
    out = []
    for mode, field_name, what in (("slo", "max_rate_under_slo", "Best under your SLO"),
                                   ("saturation", "saturation_rate", "Most load before saturating")):
        mine = [r for r in lines if r.get("mode") == mode]
        if not mine:
            continue
        rated = [(v, r) for r in mine if (v := finite_number(r.get(field_name))) is not None]
        if not rated:
            out.append(f"{what}: no configuration " + ("met the search's SLO at any load tried." if mode == "slo"
                                                       else "kept up at any rate tried."))
            continue
        top, rec = max(rated, key=lambda x: x[0])
        serves = "serves up to" if mode == "slo" else "keeps up to"
        text = f"{what}: {line_label(rec)}, {serves} {top:.3g} {_unit(rec)}"
        if mode == "saturation" and (first := finite_number(rec.get("first_saturated_rate"))) is not None:
            text += f" (saturated by {first:.3g})"
        if with_baseline and (cross := crossover_words(rec)) is not None:
            text += f"; {cross}"
        if rec.get("complete") is False:
            text += f" (its search stopped early: {escape(str(rec.get('reason', '?')))})"
        out.append(text + ".")
    others = [(r, c) for r in lines if (c := crossover_words(r)) is not None]
    if with_baseline and len(others) > 1:
        out.append("Crossovers: " + "; ".join(f"{line_label(r)}: {c}" for r, c in others[:MAX_NAMED]) + ".")
    return out


# --- the section ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Section:
    sentences: tuple[str, ...]
    notes: tuple[str, ...]
    settings: tuple[Setting, ...]
    search: tuple[str, ...]


def section(rows: Sequence[Row], facts: Facts) -> Section | None:
    """The decision over the report's rows, None when there is nothing to decide (no point with a tok/s, no
    search found line)."""
    with_baseline = any(r.baseline for r in rows)
    # A searched configuration's row is one step of its search (its last): the search's sentences speak for it.
    searched = {_found_key(f) for f in facts.found}
    decided = decide([r for r in rows if not searched or _key({"p": r.point, "b": r.baseline}) not in searched],
                     facts.slo)
    search = search_sentences(facts.found, with_baseline)
    provisional = [facts.provisional] if facts.provisional else []
    if not search and not provisional and all(s.best is None for s in decided):
        return None
    notes = [WITHIN_NOISE, speedup.noise_note(rows)[0]] if any(s.best is not None for s in decided) else []
    if not with_baseline:
        notes.append("no baseline in this sweep: tok/s only, no speedup (the plan's `baseline` key adds one)")
    if facts.slo:
        notes.append(f"your SLO (the plan's slo key): {slo_text(facts.slo)}, judged on the worst repeat's bench "
                     "figures")
    notes += [*facts.notes, *outputs.notes(rows)]
    sentences = [sentence(s, with_baseline=with_baseline, slo=facts.slo) for s in decided if s.best is not None or
                 len(decided) > 1]
    deploy = [facts.deploy] if facts.deploy else []
    return Section(tuple(provisional + sentences + search + deploy), tuple(notes), tuple(decided), tuple(search))


def render(rows: Sequence[Row], facts: Facts | None, fmt: str) -> str:
    """The section in `fmt` (table, markdown, html), to go first; "" without one (or without `facts`: the
    sweep's own summary is the table alone)."""
    got = section(rows, facts) if facts is not None else None
    if got is None:
        return ""
    if fmt == "markdown":
        return f"## {TITLE}\n\n" + "".join(f"- {s}\n" for s in got.sentences) + \
            "".join(f"\n({n})" for n in got.notes) + "\n\n"
    if fmt == "html":
        items = "".join(f"<li>{htmlpage.text(s)}</li>" for s in got.sentences)
        notes = "".join(f"<p class=\"note\">{htmlpage.text(n)}</p>" for n in got.notes)
        return f'<section id="decision"><h2>{TITLE}</h2><ul>{items}</ul>{notes}</section>'
    return f"{TITLE}\n" + "".join(f"  {s}\n" for s in got.sentences) + "".join(f"({n})\n" for n in got.notes) + "\n"


def _fin(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _ratio_json(r: Ratio | None) -> dict[str, Any] | None:
    return None if r is None else {"value": _fin(r.value), "low": _fin(r.low), "high": _fin(r.high),
                                   "slowdown": r.value < 1}


def as_json(rows: Sequence[Row], facts: Facts | None) -> dict[str, Any] | None:
    """The section for --format json: its sentences, and per client setting the best, the ones within noise of
    it and the SLO's verdicts (labels and figures); None without one."""
    got = section(rows, facts) if facts is not None else None
    if got is None:
        return None

    def point(r: Row | None, client: Mapping[str, Any]) -> dict[str, Any] | None:
        if r is None:
            return None
        return {"point": r.label, "configuration": config_label(r, client), TPS: tps(r),
                "speedup": _ratio_json(r.ratios.get("speedup"))}

    return {"sentences": list(got.sentences), "notes": list(got.notes),
            "slo": {p.key: p.limit_ms for p in facts.slo} if facts is not None and facts.slo else None,
            "settings": [{"client": s.client, "best": point(s.best, s.client),
                          "within_noise": [point(r, s.client) for r in s.near],
                          "answer": s.answer, "repeats_needed": s.repeats,
                          "slo_best": point(s.slo_best, s.client),
                          "slo_not_met": [{**(point(r, s.client) or {}), "failed": {p.key: v for p, v in v.failed}}
                                          for r, v in s.slo_failed]} for s in got.settings],
            "search": list(got.search), "deploy": facts.deploy or None if facts is not None else None,
            # the budget stopped the sweep (sweep/budget.py): the answers are among the points reached only
            "provisional": bool(facts is not None and facts.not_reached),
            "not_reached": [{"point": line_label(r), "baseline": r.get("baseline") or None,
                             **{k: finite_number(r[sweepbudget.BUDGET_FIELD].get(k)) for k in sweepbudget.BUDGET_KEYS}}
                            for r in (facts.not_reached if facts is not None else ())],
            "noise": speedup.noise_json(rows)}
