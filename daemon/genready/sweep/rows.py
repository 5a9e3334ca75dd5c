"""A report's row: one point of a plan, read back from its results lines and its bench line.

`row_of` makes the row of one results.jsonl line: the line's own fields, and when the point's command wrote
`{out}/bench.jsonl` (files.bench_line), the FIGURES a speculative-decoding sweep compares (accept length, draft
acceptance, output tokens/s, TTFT p50, ITL p50, ...); a figure the bench line lacks is taken from the results
line where its Figure's `from_results` names one. `point_row` merges a point's repeats: per repeat an ok
attempt wins, each figure the median over the ok repeats with its Spread (a point a search loaded again: the
mean over its loads of each load's median). `mark_best` marks each ranked figure's best value. The ratios
against the plan's baseline (`noise.Ratio`) are the report's to attach (report/speedup.py); the row only holds them.

A line whose fields have the wrong types, or whose bench.jsonl cannot be read, shows its point as
unreadable, with a warning. This module is the one shape of a row: the run's summary (run/runner.py) and every
report module (decision, speedup, categories, html, heatmap, compare) read `Row`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from genready.redact import escape
from genready.store import bounded
from genready.sweep.files import bench_line, reload_of, warn_line
from genready.sweep.noise import Estimate, Ratio
from genready.tools import benchline
from genready.tools.benchline import Field

UNREADABLE: Final = "unreadable"


@dataclass(frozen=True)
class Figure:
    """A figure a report compares: its field (key, title, which way is better, digits: tools/benchline.py) and
    where its value comes from: the point's bench line, else, where `from_results` names one, that field of
    its results line (the sweep's own read of the server's /metrics, or of the GPUs: run/results.py,
    run/gpucost.py)."""

    field: Field
    optional: bool = False  # a column only when some row has the figure
    ranked: bool = True  # a best value is marked (not for a figure that describes the run, not its result)
    column: bool = True  # False: read, and plotted in the HTML report, but no table column
    from_results: str | None = None  # the results line's field that stands in when the bench line lacks the figure

    @property
    def key(self) -> str:
        return self.field.key

    @property
    def title(self) -> str:
        return self.field.title

    @property
    def higher_is_better(self) -> bool:
        return self.field.higher_is_better is True

    @property
    def digits(self) -> int:
        return self.field.digits or 0


# The figures the results line alone carries (the bench client measures no GPU): run/gpucost.py records them.
# The output tokens over the energy the GPUs drew during the run.
TOKENS_PER_JOULE: Final = Field("tokens_per_joule", "TOK/J", "tok/J", True, 3)
# The GPUs' mean power over the run: the HTML report's tok/s-power plot.
MEAN_POWER_W: Final = Field("mean_power_w", "POWER W", "W", None, 1)

FIGURES: Final = (
    Figure(benchline.ACCEPT_LENGTH, from_results="metrics_accept_length"),
    Figure(benchline.DRAFT_ACCEPTANCE, optional=True),
    Figure(benchline.OUTPUT_TOKENS_PER_SECOND),
    Figure(TOKENS_PER_JOULE, optional=True, from_results="tokens_per_joule"),
    Figure(benchline.TTFT_P50_MS),
    Figure(benchline.ITL_P50_MS),
    Figure(benchline.PREFIX_CACHE_HIT_RATE, optional=True, ranked=False, from_results="prefix_cache_hit_rate"),
    Figure(benchline.TTFT_P99_MS, ranked=False, column=False),
    Figure(benchline.E2E_P50_MS, ranked=False, column=False),  # for the baseline's e2e ratio
    # the p99s a plan's `slo` may name (sweep/report/decision.py judges points by the bench line's percentiles)
    Figure(benchline.ITL_P99_MS, ranked=False, column=False),
    Figure(benchline.E2E_P99_MS, ranked=False, column=False),
    Figure(MEAN_POWER_W, optional=True, ranked=False, column=False, from_results="mean_power_w"),
    # The bench line's -c: the HTML report's tokens/s per user (vLLM's Pareto; sweep/report/html.py).
    Figure(benchline.CONCURRENCY, optional=True, ranked=False, column=False),
)
_FROM_RESULTS: Final = tuple((f.key, f.from_results) for f in FIGURES if f.from_results is not None)
_NO_FIGURES: Final[dict[str, float | None]] = {f.key: None for f in FIGURES}  # copied per row, not built per row
MAX_POSITIONS: Final = 64  # per-position acceptance kept per point: a draft tree is never that deep


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _as_float(v: Any) -> float | None:
    """A JSON number as a float (an integer beyond any float is infinite), anything else None."""
    if not _number(v):
        return None
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def bench_figures(folder: Path) -> dict[str, float | None] | None:
    """The figures of the last bench line in `folder`/bench.jsonl, or None without one. bounded.FileError
    for a bench.jsonl that cannot be read (a directory, a FIFO, a symlink loop, a device, too big)."""
    last = bench_line(folder)
    return None if last is None else {f.key: _as_float(last.get(f.key)) for f in FIGURES}



def positions_of(v: Any) -> list[float] | None:
    """An `accept_per_position` value (bench line, results line) as finite numbers, or None when it is not a
    non-empty list of them (the first MAX_POSITIONS kept)."""
    if not isinstance(v, list) or not v:
        return None
    got = [_as_float(x) for x in v[:MAX_POSITIONS]]
    return None if any(x is None or not math.isfinite(x) for x in got) else [x for x in got if x is not None]



# The fields of a results.jsonl line a row shows, and what each must be (None is always fine).
_FIELDS: Final = (("index", int, "an integer"), ("status", str, "a string"), ("attempt", int, "an integer"),
                  ("pid", int, "an integer"), ("load_seconds", float, "a number"), ("run_seconds", float, "a number"),
                  ("restarted", bool, "true or false"), ("host", str, "a string"), ("out", str, "a string"))


def field_problem(rec: dict[str, Any]) -> str | None:
    """What is wrong with a results line's fields, or None."""
    for key, kind, words in _FIELDS:
        v = rec.get(key)
        if v is None or type(v) is kind or (kind is float and type(v) is int):  # the lines a sweep writes
            continue
        ok = _number(v) if kind is float else isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
        if not ok:
            return f"{key}: expected {words}, found {type(v).__name__} {escape(repr(v))[:60]}"
    out = rec.get("out")
    if isinstance(out, str) and ("\0" in out or out.startswith("/") or (".." in out and ".." in Path(out).parts)):
        return f"out: expected a folder name inside the results folder, found {escape(repr(out))[:60]}"
    return None


@dataclass(frozen=True)
class Slower:
    """Who gets slower (sweep/report/slower.py, issue 50 §4): per prompt the baseline's end-to-end time over the
    point's; the share of prompts below 1 with its 95 % (Wilson) interval, by category and by output length."""

    share: float
    low: float
    high: float
    prompts: int
    by_category: dict[str, tuple[int, int]]  # category -> (prompts slower, prompts)
    by_length: dict[str, tuple[int, int]]  # the baseline answer's output tokens, bucketed -> (slower, prompts)
    slowest: str | None  # the category with the lowest median per-prompt speedup (2 categories or more)
    median_per_token: float | None  # the median per-prompt speedup in time per output token
    speedups: tuple[float, ...]  # per prompt, sorted (at most MAX_SPEEDUPS, evenly picked): the page's ECDF


@dataclass(frozen=True)
class OutputCheck:
    """A point's answers against its baseline round's, prompt by prompt (sweep/report/outputs.py, issue 50 §2-3).
    `ran` False: `why` says why the check did not run (no baseline, temperature above 0, no request lines)."""

    ran: bool
    why: str = ""
    compared: int = 0  # prompts answered by both
    match: float | None = None  # the share of them whose output equals the baseline's
    prefix_median: float | None = None  # the matching prefix before the first divergence, as a share of the answer
    prefix_p10: float | None = None
    early: float | None = None  # the share that diverge before half their length
    diverged: bool = False  # early > the plan's max_divergence: marked, never best
    loops: int = 0  # answers ending in a loop
    new_loops: int = 0  # of them, on prompts whose baseline answer does not (or: of the compared, degenerate)
    degenerate: bool = False  # loops the baseline does not have (without one: loops on many answers): never best
    claim: str = ""  # what the marks rest on, in words
    first: tuple[str, str, str] | None = None  # the first early-diverging prompt: (prompt id, its answer, the base's)
    slower: Slower | None = None  # who gets slower against the baseline, prompt by prompt

    @property
    def marked(self) -> bool:
        return self.diverged or self.degenerate


@dataclass(slots=True)
class Row:
    index: int
    label: str
    status: str
    attempt: str = "-"
    pid: str = "-"
    load: float | None = None
    run: float | None = None
    restarted: bool | None = None
    host: str = ""
    figures: dict[str, float | None] | None = None
    best: set[str] = field(default_factory=set)
    bench_unreadable: bool = False  # its bench.jsonl is there but cannot be read: figures shown "unreadable"
    cache: str = ""  # cold_start, flushed or warm (results lines from before caches were recorded: "")
    runs: int = 1  # repeats recorded for the point
    runs_ok: int = 1
    spread: dict[str, Spread] = field(default_factory=dict)  # per figure, over the ok repeats (2 or more)
    noisy: set[str] = field(default_factory=set)  # figures whose relative MAD exceeds the plan's noise_limit
    throttled: bool = False  # a GPU's clocks were held back (not by idling) during a run: its figures marked `~`
    noise_limit: float = 0.10
    point: dict[str, Any] = field(default_factory=dict)  # the plan's values (the HTML report's axes)
    group: int | None = None
    invocation_id: str = ""
    context: dict[str, str] = field(default_factory=dict)  # target, unit, plan, started_at, ended_at
    warmup_requests: int | None = None  # the warmup before the run (the most over repeats)
    unstable: bool = False  # warmup = "stable" stopped at its bound before TTFT and ITL settled (a run of it did)
    engine: dict[str, Any] | None = None  # what its engine said it runs (engine_config's values), where read
    server: str = ""  # its server configuration: the digest of its rendered drop-in (the fingerprint's)
    # Against the plan's baseline (speedup.py): a baseline run's round, or the round a point ran after;
    # the point's client setting; each figure over its ok repeats; the ratios and the drift, at report time.
    baseline: int = 0
    baseline_round: int | None = None
    client: dict[str, Any] | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, Ratio] = field(default_factory=dict)
    drifted: float | None = None
    noise: Estimate | None = None  # the sweep's spread between loads (sweep/noise.py), which its intervals take in
    accept_per_position: list[float] | None = None  # the engine's acceptance at draft position 0, 1, ...
    gpus: int = 1  # the plan's `gpus` (results line): the HTML report's tokens/s per GPU divides by it
    categories: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # by prompt category (categories.py)
    outs: list[Path] = field(default_factory=list)  # its ok runs' {out} folders: their request lines (outputs.py)
    max_divergence: float = 0.10  # the plan's (results line), which outputs.py marks a diverging point by
    outputs: OutputCheck | None = None  # its answers against the baseline's (outputs.py), at report time


@dataclass(frozen=True)
class Spread:
    """A figure over a point's repeats: the median is the row's value."""

    low: float
    high: float
    rmad: float  # the median absolute deviation over the median's magnitude (inf for a median of 0 with spread)


def spread_of(values: Sequence[float]) -> tuple[float, Spread]:
    """(median, its spread) of two or more finite values."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    rmad = mad / abs(med) if med else (0.0 if mad == 0 else math.inf)
    return med, Spread(min(values), max(values), rmad)


def label_of(point: Any) -> str:
    if not isinstance(point, dict):
        return str(point)
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in point.items()) or "(no values)"


Benches = dict[Path, "dict[str, Any] | bounded.FileError | None"]  # a report's bench lines by out folder


def row_of(rec: dict[str, Any], folder: Path, where: str = "", benches: Benches | None = None) -> Row:
    """The row of one results.jsonl line of `folder` (`where`: its FILE:LINE, for warnings). A line with
    fields of the wrong type is shown as an unreadable point, with a warning. `benches`: bench lines read."""
    index = rec.get("index")
    if not isinstance(index, int) or isinstance(index, bool):  # from before "index": the out folder starts with it
        m = re.match(r"(\d+)-", str(rec.get("out", "")))
        index = int(m.group(1)) if m else 0
    label = label_of(rec.get("point"))
    if isinstance(b := rec.get("baseline"), int) and not isinstance(b, bool) and b > 0:
        label = f"baseline#{b} {label}"
    if problem := field_problem(rec):
        warn_line(f"{where or folder}: {problem}; the point is shown as {UNREADABLE}")
        return Row(index, label, UNREADABLE)
    out = rec.get("out")
    figures: dict[str, float | None] | None = None
    unreadable, line = False, None
    if isinstance(out, str):
        try:
            line = bench_line(folder / out) if benches is None else bench_once(folder / out, benches)
            figures = None if line is None else {key: _as_float(line.get(key)) for key in _NO_FIGURES}
        except bounded.FileError as e:
            warn_line(f"{e}; the point's figures are shown as {UNREADABLE}")
            unreadable = True
    if not unreadable:
        for key, field_name in _FROM_RESULTS:
            if (v := rec.get(field_name)) is not None and (figures is None or figures.get(key) is None) and \
                    (v := _as_float(v)) is not None:
                if figures is None:
                    figures = _NO_FIGURES.copy()
                figures[key] = v
    cache = rec.get("cache")
    noise = _as_float(rec.get("noise_limit"))
    limit = _as_float(rec.get("max_divergence"))
    point, group, inv = rec.get("point"), rec.get("group"), rec.get("invocation_id")
    base, before, client = rec.get("baseline"), rec.get("baseline_round"), rec.get("client")
    return Row(index, label, str(rec.get("status")), str(rec.get("attempt", "-")),
               str(rec.get("pid") or "-"), _as_float(rec.get("load_seconds")), _as_float(rec.get("run_seconds")),
               rec.get("restarted"), str(rec.get("host") or ""), figures, bench_unreadable=unreadable,
               cache=cache if isinstance(cache, str) else "",
               noise_limit=noise if noise is not None and math.isfinite(noise) and noise >= 0 else 0.10,
               point=point if isinstance(point, dict) else {},
               group=group if isinstance(group, int) and not isinstance(group, bool) else None,
               invocation_id=inv if isinstance(inv, str) else "",
               context={k: v for k in ("target", "unit", "plan", "started_at", "ended_at")
                        if isinstance(v := rec.get(k), str)},
               warmup_requests=w if isinstance(w := rec.get("warmup_requests"), int) and not isinstance(w, bool)
               else None, unstable=rec.get("warmup_converged") is False,
               engine=_engine_values(rec), server=_server_of(rec), throttled=rec.get("throttled") is True,
               baseline=base if isinstance(base, int) and not isinstance(base, bool) and base > 0 else 0,
               baseline_round=before if isinstance(before, int) and not isinstance(before, bool) else None,
               client=client if isinstance(client, dict) else None,
               accept_per_position=None if unreadable
               else positions_of((line or {}).get(benchline.ACCEPT_PER_POSITION.key))
               or positions_of(rec.get("metrics_accept_per_position")),
               samples={k: [v] for k, v in (figures or {}).items() if v is not None and math.isfinite(v)}
               if rec.get("status") == "ok" else {},
               gpus=g if isinstance(g := rec.get("gpus"), int) and not isinstance(g, bool) and g > 0 else 1,
               outs=[folder / out] if rec.get("status") == "ok" and isinstance(out, str) else [],
               max_divergence=limit if limit is not None and 0 <= limit <= 1 else 0.10)


def bench_once(folder: Path, benches: Benches) -> dict[str, Any] | None:
    """bench_line(folder) read once per report (`benches`: what it read), however many lines name the folder."""
    if folder not in benches:
        try:
            benches[folder] = bench_line(folder)
        except bounded.FileError as e:
            benches[folder] = e
    if isinstance(got := benches[folder], bounded.FileError):
        raise got.with_traceback(None)  # a new traceback, not one more on the last
    return got


def _engine_values(rec: dict[str, Any]) -> dict[str, Any] | None:
    got = rec.get("engine_config")
    values = got.get("values") if isinstance(got, dict) else None
    return values if isinstance(values, dict) else None


def _server_of(rec: dict[str, Any]) -> str:
    fp = rec.get("fingerprint")
    return str(fp.get("dropin", "")) if isinstance(fp, dict) else ""


def _repeat(rec: dict[str, Any]) -> int:
    r = rec.get("repeat", 1)
    return r if isinstance(r, int) and not isinstance(r, bool) else 1


def point_row(lines: Sequence[tuple[dict[str, Any], Path, str]], benches: Benches | None = None) -> Row:
    """The row of one point from its results lines (each with its folder and FILE:LINE): per repeat, an ok
    attempt wins over later failed ones; the figures are the medians over the ok repeats, with their spread. A
    point a search loaded more than once (its reloads, explore.py) has repeats on each load: its figure is then
    the mean over its loads of each load's median, so that every load counts alike (not only the last)."""
    if len(lines) == 1:  # most points: one run (the same row as below, without the bookkeeping)
        return row_of(*lines[0], benches)
    per: dict[tuple[int, int], tuple[dict[str, Any], Path, str]] = {}  # (load, repeat) -> its line
    for line in lines:
        r = (reload_of(line[0]), _repeat(line[0]))
        if r not in per or line[0].get("status") == "ok" or per[r][0].get("status") != "ok":
            per[r] = line
    loads = [load for load, _ in sorted(per)]
    rows = [row_of(rec, folder, where, benches) for _, (rec, folder, where) in sorted(per.items())]
    if len(rows) == 1:
        return rows[0]
    oks = [r for r in rows if r.status == "ok"]
    last = rows[-1]
    bad = next((r for r in rows if r.status != "ok"), None)
    row = Row(last.index, last.label, bad.status if bad else "ok", last.attempt, last.pid, last.load,
              None, last.restarted, last.host, None, bench_unreadable=any(r.bench_unreadable for r in rows),
              runs=len(rows), runs_ok=len(oks), noise_limit=last.noise_limit, point=last.point, group=last.group,
              invocation_id=last.invocation_id,
              context={**last.context, "started_at": rows[0].context.get("started_at", "")},
              engine=next((r.engine for r in reversed(rows) if r.engine is not None), None), server=last.server,
              throttled=any(r.throttled for r in oks),
              baseline=last.baseline, baseline_round=last.baseline_round, client=last.client, gpus=last.gpus,
              outs=[o for r in oks for o in r.outs], max_divergence=last.max_divergence)
    row.unstable = any(r.unstable for r in rows if r.status == "ok") or (not oks and any(r.unstable for r in rows))
    row.warmup_requests = max((r.warmup_requests for r in rows if r.warmup_requests is not None), default=None)
    caches = {r.cache for r in rows}
    row.cache = next((c for c in ("warm", "flushed", "cold_start") if c in caches), "")
    runs = [r.run for r in oks if r.run is not None]
    row.run = statistics.median(runs) if runs else last.run
    got = [r.accept_per_position for r in oks if r.accept_per_position]
    if got:  # per position, the median over the ok repeats that reach it
        row.accept_per_position = [statistics.median(p[j] for p in got if j < len(p))
                                   for j in range(max(len(p) for p in got))]
    with_figures = [r.figures for r in oks if r.figures]
    per_load = [(load, r.figures) for load, r in zip(loads, rows, strict=True) if r.status == "ok" and r.figures]
    if with_figures:
        row.figures = {}
        for f in FIGURES:
            vals = [v for fig in with_figures if (v := fig.get(f.key)) is not None and math.isfinite(v)]
            if vals:
                row.samples[f.key] = vals
            if len(vals) >= 2:
                row.figures[f.key], row.spread[f.key] = spread_of(vals)
                if f.ranked and row.spread[f.key].rmad > row.noise_limit:
                    row.noisy.add(f.key)
            else:
                row.figures[f.key] = vals[0] if vals else next((fig.get(f.key) for fig in with_figures), None)
            by_load: dict[int, list[float]] = {}
            for load, fig in per_load:
                if (v := fig.get(f.key)) is not None and math.isfinite(v):
                    by_load.setdefault(load, []).append(v)
            if len(by_load) > 1:  # a reloaded point: each load's median, then their mean
                row.figures[f.key] = statistics.fmean(statistics.median(v) for v in by_load.values())
    return row


def mark_best(rows: Sequence[Row]) -> None:
    """Mark, per figure, the rows of ok points that hold the best value (ties all marked)."""
    # a point whose answers diverged or degenerated (outputs.py) holds no best value: its speed is no win
    ok = [(r, r.figures) for r in rows if r.status == "ok" and r.figures and not (r.outputs and r.outputs.marked)]
    finite = math.isfinite
    for f in FIGURES:
        if not f.ranked:
            continue
        key = f.key
        vals = [v for _, fig in ok if (v := fig.get(key)) is not None and finite(v)]  # NaN, ±Infinity: never best
        if len(vals) < 2:
            continue
        top = (max if f.higher_is_better else min)(vals)  # finite: a row holding NaN or ±Infinity is never equal
        for r, fig in ok:
            if fig.get(key) == top:
                r.best.add(key)
