"""The sweep's results as one table: the summary at the end of a sweep, and `genready sweep report`.

A row is one point of a plan: its last attempt in DIR/results.jsonl (an `ok` one if there is one), and,
when the point's command wrote `{out}/bench.jsonl` (the bench client's `--output`), the figures a
speculative-decoding sweep compares: accept length, draft acceptance (llama.cpp; a column only when some
point has it), output tokens/s, TTFT p50 and ITL p50. `report` merges several results folders (the shards
of one plan, run on several hosts) into one table in plan order and marks the best value of each figure column.

Every file is read through the one bounded reader (bounded.read_file): a FIFO, a device, a directory
or a symlink loop where a file should be is named, never waited on or read without end. A line that
is not JSON is a warning; a line whose fields have the wrong types, or whose bench.jsonl cannot be
read, shows its point as unreadable. What the files hold is escaped for a terminal, a CSV cell a
spreadsheet would run is quoted with `'`, and the JSON output is strict (null for NaN and ±Infinity,
which are never marked best).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from genready import console
from genready.redact import escape
from genready.servers import engineconfig
from genready.store import bounded
from genready.sweep import categories, decision, speedup

RESULTS_FILE: Final = "results.jsonl"
BENCH_FILE: Final = "bench.jsonl"  # what a point's command writes into {out}: `--output {out}/bench.jsonl`
SEARCH_FILE: Final = "search.jsonl"  # DIR/search.jsonl: what each configuration's search found, a line each
FORMATS: Final = ("table", "csv", "markdown", "json")
MAX_RESULTS_BYTES: Final = 64 << 20  # a results.jsonl or bench.jsonl: lines of a few KiB each
UNREADABLE: Final = "unreadable"


@dataclass(frozen=True)
class Figure:
    key: str  # in the bench client's JSON line
    title: str
    higher_is_better: bool
    digits: int
    optional: bool = False  # a column only when some row has the figure
    ranked: bool = True  # a best value is marked (not for a figure that describes the run, not its result)
    column: bool = True  # False: read, and plotted in the HTML report, but no table column


FIGURES: Final = (
    Figure("accept_length", "ACCEPT", True, 2),
    # llama.cpp's llama-server: Σ timings.draft_n_accepted / Σ timings.draft_n over the point's answers.
    Figure("draft_acceptance", "DRAFT ACC", True, 3, optional=True),
    Figure("output_tokens_per_second", "OUT tok/s", True, 1),
    # The run's output tokens over the energy its GPUs drew meanwhile (sweep/gpucost.py; results line).
    Figure("tokens_per_joule", "TOK/J", True, 3, optional=True),
    Figure("ttft_p50_ms", "TTFT p50 ms", False, 1),
    Figure("itl_p50_ms", "ITL p50 ms", False, 2),
    # The server's own prefix-cache hit rate over the run (servermetrics.py): near 0 after a flush.
    Figure("prefix_cache_hit_rate", "PREFIX HIT", False, 3, optional=True, ranked=False),
    Figure("ttft_p99_ms", "TTFT p99 ms", False, 1, ranked=False, column=False),
    Figure("e2e_p50_ms", "E2E p50 ms", False, 1, ranked=False, column=False),  # for the baseline's e2e ratio
    # the p99s a plan's `slo` may name (sweep/decision.py judges points by the bench line's percentiles)
    Figure("itl_p99_ms", "ITL p99 ms", False, 2, ranked=False, column=False),
    Figure("e2e_p99_ms", "E2E p99 ms", False, 1, ranked=False, column=False),
    # The GPUs' mean power over the run (sweep/gpucost.py; results line): the HTML report's tok/s-power plot.
    Figure("mean_power_w", "POWER W", False, 1, optional=True, ranked=False, column=False),
    # The bench line's -c: the HTML report's tokens/s per user (vLLM's Pareto; sweep/html.py).
    Figure("concurrency", "CONC", False, 0, optional=True, ranked=False, column=False),
)
# A figure the bench line lacks, taken from the results line (the sweep's own read of the server's /metrics).
FROM_RESULTS: Final = {"prefix_cache_hit_rate": "prefix_cache_hit_rate", "accept_length": "metrics_accept_length",
                       "tokens_per_joule": "tokens_per_joule", "mean_power_w": "mean_power_w"}
_NO_FIGURES: Final[dict[str, float | None]] = {f.key: None for f in FIGURES}  # copied per row, not built per row
MAX_POSITIONS: Final = 64  # per-position acceptance kept per point: a draft tree is never that deep
SHOWN_POSITIONS: Final = 6  # in a table cell, then how many more


class ReportError(Exception):
    """A folder that holds no sweep results; the message names it."""


def warn_line(text: str) -> None:
    console.err(f"genready sweep: warning: {text}")


def numbered_lines(path: Path, *, warn: bool = True) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every complete, readable line of a JSON Lines file ([] if there is
    none); a line that is not a JSON object (a torn last line, from a crash) is skipped, with a warning
    naming FILE:LINE unless `warn` is False. bounded.FileError for a file that is no regular file or
    is over MAX_RESULTS_BYTES."""
    try:
        data = bounded.read_file(path, MAX_RESULTS_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError):
            rec = None
        if isinstance(rec, dict):
            out.append((lineno, rec))
        elif warn:
            warn_line(f"{path}:{lineno}: skipping a line that is not a JSON object")
    return out


def read_results(path: Path, *, warn: bool = True) -> list[dict[str, Any]]:
    """The objects of numbered_lines(), without their numbers; a file that cannot be read is a warning
    (unless `warn` is False) and holds nothing."""
    try:
        return [rec for _, rec in numbered_lines(path, warn=warn)]
    except bounded.FileError as e:
        if warn:
            warn_line(str(e))
        return []


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


def bench_line(folder: Path) -> dict[str, Any] | None:
    """The last line of `folder`/bench.jsonl, or None without one. bounded.FileError for a bench.jsonl that
    cannot be read (a directory, a FIFO, a symlink loop, a device, too big)."""
    lines = numbered_lines(folder / BENCH_FILE, warn=False)
    return lines[-1][1] if lines else None


def positions_of(v: Any) -> list[float] | None:
    """An `accept_per_position` value (bench line, results line) as finite numbers, or None when it is not a
    non-empty list of them (the first MAX_POSITIONS kept)."""
    if not isinstance(v, list) or not v:
        return None
    got = [_as_float(x) for x in v[:MAX_POSITIONS]]
    return None if any(x is None or not math.isfinite(x) for x in got) else [x for x in got if x is not None]


def positions_text(pos: Sequence[float] | None) -> str:
    """An ACC/POS cell: `0.81 0.62 0.40`, the first SHOWN_POSITIONS then `+N`; `-` without figures."""
    if not pos:
        return "-"
    more = f" +{len(pos) - SHOWN_POSITIONS}" if len(pos) > SHOWN_POSITIONS else ""
    return " ".join(f"{x:.2f}" for x in pos[:SHOWN_POSITIONS]) + more


def with_positions(rows: Sequence[Row]) -> bool:
    return any(r.accept_per_position for r in rows)


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
    ratios: dict[str, speedup.Ratio] = field(default_factory=dict)
    drifted: float | None = None
    accept_per_position: list[float] | None = None  # the engine's acceptance at draft position 0, 1, ...
    gpus: int = 1  # the plan's `gpus` (results line): the HTML report's tokens/s per GPU divides by it
    categories: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # by prompt category (categories.py)


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
        for key, field_name in FROM_RESULTS.items():
            if (v := rec.get(field_name)) is not None and (figures is None or figures.get(key) is None) and \
                    (v := _as_float(v)) is not None:
                if figures is None:
                    figures = _NO_FIGURES.copy()
                figures[key] = v
    cache = rec.get("cache")
    noise = _as_float(rec.get("noise_limit"))
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
               accept_per_position=None if unreadable else positions_of((line or {}).get("accept_per_position"))
               or positions_of(rec.get("metrics_accept_per_position")),
               samples={k: [v] for k, v in (figures or {}).items() if v is not None and math.isfinite(v)}
               if rec.get("status") == "ok" else {},
               gpus=g if isinstance(g := rec.get("gpus"), int) and not isinstance(g, bool) and g > 0 else 1)


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
    attempt wins over later failed ones; the figures are the medians over the ok repeats, with their spread."""
    if len(lines) == 1:  # most points: one run (the same row as below, without the bookkeeping)
        return row_of(*lines[0], benches)
    per: dict[int, tuple[dict[str, Any], Path, str]] = {}
    for line in lines:
        r = _repeat(line[0])
        if r not in per or line[0].get("status") == "ok" or per[r][0].get("status") != "ok":
            per[r] = line
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
              baseline=last.baseline, baseline_round=last.baseline_round, client=last.client, gpus=last.gpus)
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
    return row


Read = list[tuple[Path, Path, list[tuple[int, dict[str, Any]]]]]  # (folder, its results file, numbered lines)


def read_folders(folders: Sequence[Path]) -> Read:
    """Every folder's results lines, read once (a report of 64 MiB spends most of its time decoding them):
    rows_from() and results.coverage() both take them. ReportError for a folder without results."""
    read: Read = []
    for folder in folders:
        path = folder / RESULTS_FILE
        try:
            lines = numbered_lines(path)
        except bounded.FileError as e:
            raise ReportError(str(e)) from None
        if not lines and not path.is_file():
            raise ReportError(f"{folder}: no {RESULTS_FILE} (expected the --results folder of a sweep)")
        read.append((folder, path, lines))
    return read


def rows_of(folders: Sequence[Path]) -> list[Row]:
    """One row per point over every folder, in plan order (see point_row)."""
    return rows_from(read_folders(folders))


def rows_from(read: Read) -> list[Row]:
    """The rows of read_folders()' lines: one per point and configuration, in plan order."""
    by_point: dict[str, list[tuple[dict[str, Any], Path, str]]] = {}
    point_of: dict[str, tuple[str, str]] = {}  # a group's key -> its point's key and its fingerprint's JSON
    for folder, path, lines in read:
        where = f"{path}:"
        for lineno, rec in lines:
            # Lines another configuration made (their fingerprint differs) are never merged into one row.
            point = _point_key(rec.get("point"))
            if base := rec.get("baseline"):
                # A baseline run may hold a plan point's values: never that point's row. Each host's shard runs
                # the baseline itself, so its runs stay its own (speedup.attach matches by host).
                point += "\0" + json.dumps([base, rec.get("host")])
            fp = rec.get("fingerprint")
            fp_json = "null" if fp is None else json.dumps(fp, sort_keys=True)
            key = point + "\0" + fp_json
            if key not in by_point:
                by_point[key], point_of[key] = [], (point, fp_json)
            by_point[key].append((rec, folder, where + str(lineno)))
    made: dict[str, str] = {}  # a fingerprint's JSON -> _made_by() of its lines: one digest per configuration
    made_by: dict[str, set[str]] = {}
    for key, group in by_point.items():
        point, fp_json = point_of[key]
        if fp_json not in made:
            made[fp_json] = _made_by(group[0][0])
        made_by.setdefault(point, set()).add(made[fp_json])
    rows = []
    benches: Benches = {}
    for key, group in by_point.items():
        row = point_row(group, benches)
        categories.gather(row, group, lambda path: bench_once(path, benches))
        point, fp_json = point_of[key]
        if len(made_by[point]) > 1:
            row.label += f" [{made[fp_json]}]"  # one point, lines of several configurations
        rows.append(row)
    rows.sort(key=lambda r: r.index)
    mark_best(rows)
    speedup.attach(rows)
    return rows


def _point_key(point: Any) -> str:
    """A point's values as a key, alike in any order (plain values: their sorted items' repr, cheaper than JSON)."""
    plain = isinstance(point, dict) and all(type(v) in (str, int, float, bool) or v is None for v in point.values())
    return repr(sorted(point.items())) if plain else json.dumps(point, sort_keys=True)


def _made_by(rec: dict[str, Any]) -> str:
    """Which configuration made a line, in a few characters: its fingerprint's digest, or that it has none."""
    fp = rec.get("fingerprint")
    if not isinstance(fp, dict):
        return "no fingerprint"
    return "fingerprint " + hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:8]


def mark_best(rows: Sequence[Row]) -> None:
    """Mark, per figure, the rows of ok points that hold the best value (ties all marked)."""
    ok = [(r, r.figures) for r in rows if r.status == "ok" and r.figures]
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


def _num(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _finite(v: Any) -> Any:
    """A value for strict JSON: NaN and ±Infinity as null."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


_PLAIN_NUMBER: Final = re.compile(r"-?\d+(?:\.\d+)?\*?")


def csv_cell(text: str) -> str:
    """A cell a spreadsheet would run as a formula (=, +, -, @, tab, CR first) quoted with a leading '
    (OWASP's advice); a plain number, negative ones too, stays a number."""
    if text[:1] in ("=", "+", "-", "@", "\t", "\r") and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def with_cache(rows: Sequence[Row]) -> bool:
    """A CACHE column: some point ran on a reused instance (flushed, or warm: its figures are biased)."""
    return any(r.cache in ("warm", "flushed") for r in rows)


def figure_text(r: Row, f: Figure, mark: str = "{}") -> str:
    """The figure's value (`mark` formats a best one); over repeats the median, with min-max and the
    relative MAD, `!` when noisy."""
    if r.bench_unreadable:
        return UNREADABLE
    text = _num((r.figures or {}).get(f.key), f.digits)
    if f.key in r.best:
        text = mark.format(text)
    sp = r.spread.get(f.key)
    if sp is not None:
        text += f" ({sp.low:.{f.digits}f}-{sp.high:.{f.digits}f}, {_pct(sp.rmad)})" + ("!" if f.key in r.noisy else "")
    if r.throttled and f.ranked and (r.figures or {}).get(f.key) is not None:
        text += "~"
    return text


def _pct(x: float) -> str:
    return "inf%" if math.isinf(x) else f"{100 * x:.1f}%"


RATIO_TITLES: Final = {"speedup": "SPEEDUP", "ttft_ratio": "TTFT x", "itl_ratio": "ITL x", "e2e_ratio": "E2E x"}


def with_baseline(rows: Sequence[Row]) -> bool:
    return any(r.baseline for r in rows)


def ratio_text(r: Row, name: str) -> str:
    """A ratio against the baseline: `1.52x [1.31-1.77]`; a speedup below 1 says `slower`; `~` within the noise
    (the interval holds 1); `drifted -23%` when the baseline moved around the point (speedup.py)."""
    if r.baseline:
        return "baseline" if name == "speedup" else "-"
    got = r.ratios.get(name)
    if got is None:
        return "-"
    text = f"{got.value:.2f}x"
    if name == "speedup" and got.value < 1:
        text += " slower"
    if got.low is not None and got.high is not None:
        text += f" [{got.low:.2f}-{got.high:.2f}]"
    if got.within_noise(r.noise_limit):
        text += " ~"
    if name == "speedup" and r.drifted is not None:
        text += f" drifted {speedup.drift_text(r.drifted)}"
    return text


def ratio_json(r: Row) -> dict[str, Any]:
    """The ratios of a row for --format json (derived at report time from the results and bench lines)."""
    out: dict[str, Any] = {"baseline": r.baseline or None, "baseline_round": r.baseline_round}
    for name, _ in speedup.RATIOS:
        got = r.ratios.get(name)
        out[name] = None if got is None else {
            "value": _finite(got.value), "low": _finite(got.low), "high": _finite(got.high),
            "within_noise": got.within_noise(r.noise_limit), "slowdown": name == "speedup" and got.value < 1,
            **({"drifted": _finite(r.drifted)} if name == "speedup" and r.drifted is not None else {})}
    return out


def _cells(rows: Sequence[Row], *, mark: str, new_last: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and cells; `new_last`: CACHE and RUNS after the figures, where they do not move a column a
    script reads by position (CSV)."""
    with_bench = any(r.figures for r in rows)
    with_host = len({r.host for r in rows if r.host}) > 1
    cache, repeats = with_cache(rows), any(r.runs > 1 for r in rows)
    figures = [f for f in FIGURES if f.column and (not f.optional or any((r.figures or {}).get(f.key) is not None
                                                                         for r in rows))]
    # What describes the run (its cache, its repeats, the unranked figures such as the prefix-cache hit rate)
    # comes before the result figures in a table, after them in CSV.
    described = [f for f in figures if not f.ranked] if with_bench else []
    figures = [f for f in figures if f.ranked]
    unstable, pos = any(r.unstable for r in rows), with_positions(rows)
    new = (["CACHE"] if cache else []) + [f.title for f in described] + (["RUNS"] if repeats else []) + \
        (["WARMUP"] if unstable else []) + (["ACC/POS"] if pos else [])
    titles = [f.title for f in figures] if with_bench else []
    ratios = list(RATIO_TITLES) if with_baseline(rows) else []
    head = ["POINT", "STATUS", "ATTEMPT", "PID", "LOAD s", "RUN s"] + (["HOST"] if with_host else []) + \
        (titles + new if new_last else new + titles) + [RATIO_TITLES[n] for n in ratios]
    body = []
    for r in rows:
        cells = [escape(r.label), escape(r.status), escape(r.attempt), escape(r.pid), _num(r.load, 1), _num(r.run, 1)]
        if with_host:
            cells.append(escape(r.host) or "-")
        extra = ([escape(r.cache) or "-"] if cache else []) + [figure_text(r, f) for f in described] + \
            ([f"{r.runs_ok}/{r.runs}"] if repeats else []) + ([warmup_text(r)] if unstable else []) + \
            ([positions_text(r.accept_per_position)] if pos else [])
        figs = []
        if with_bench:
            figs = [figure_text(r, f, mark) for f in figures]
        body.append(cells + (figs + extra if new_last else extra + figs) + [ratio_text(r, n) for n in ratios])
    return head, body


def warmup_text(r: Row) -> str:
    """A WARMUP cell: the requests its warmup took, `unstable` when it stopped before TTFT and ITL settled."""
    n = "-" if r.warmup_requests is None else str(r.warmup_requests)
    return f"{n} unstable" if r.unstable else n


def legend(rows: Sequence[Row]) -> str:
    """What the table's marks mean, for the marks it holds."""
    notes = []
    if any(r.best for r in rows):
        notes.append("* best of its column")
    if any(r.spread for r in rows):
        limit = max(r.noise_limit for r in rows)
        notes.append(f"median of the repeats (min-max, relative median absolute deviation); ! noisy: over "
                     f"{_pct(limit)}")
    if with_baseline(rows):
        notes.append("SPEEDUP: output tok/s / the baseline's run before it at the same client settings; TTFT/ITL/E2E "
                     "x: the point's p50 / the baseline's (below 1: faster); [95 % interval over the repeats]; "
                     "~ within the noise; drifted: the baseline's tok/s moved by that much around the point")
    if any(r.unstable for r in rows):
        notes.append("unstable: its warmup stopped at warmup_max (or warmup_max_seconds) before TTFT and ITL "
                     "settled: its figures may be those of a server still warming up")
    if any(r.throttled for r in rows):
        notes.append("~ throttled: a GPU's clocks were held back during the run by something other than idling "
                     "(power cap, heat; its gpu.json says which)")
    if with_positions(rows):
        notes.append("ACC/POS: the share of verify steps that accepted the draft at position 0, 1, ... (the engine's "
                     "per-position counters or the answers' histograms; median over the repeats)")
    if any(r.cache == "warm" for r in rows):
        notes.append("warm: ran on a prefix cache an earlier run filled (not flushed): its TTFT is biased low")
    if any(r.status == engineconfig.CONFIG_MISMATCH for r in rows):
        notes.append(f"{engineconfig.CONFIG_MISMATCH}: its engine reports another configuration than its flags or "
                     "the plan's expect (each line's reason names flag, expected, reported); not run")
    if any(r.status == engineconfig.NO_DRAFTING for r in rows):
        notes.append(f"{engineconfig.NO_DRAFTING}: its server is speculative but drafted no token in the run")
    return "".join(f"({n})\n" for n in notes) + "".join(f"{n}\n" for n in engine_notes(rows))


def engine_notes(rows: Sequence[Row]) -> list[str]:
    """What the engines' own reports say across points: the keys whose values differ, and pairs of server
    configurations whose engines report the same (a flag that did not take, where the plan has no `expect`)."""
    with_engine = [r for r in rows if r.engine is not None]
    if len(with_engine) < 2:
        return []
    out = []
    if keys := engineconfig.differing_keys(r.engine or {} for r in with_engine):
        out.append(f"engine keys that differ across points: {', '.join(keys[:12])}"
                   + (f" (+{len(keys) - 12} more)" if len(keys) > 12 else ""))
    first: dict[str, Row] = {}  # one row per server configuration: its points share one engine
    for r in with_engine:
        first.setdefault(r.server or r.label, r)
    warnings = engineconfig.identical_configs([(r.label, {"dropin": s}, r.engine or {}) for s, r in first.items()])
    return out + [f"warning: {w}" for w in warnings[:6]]


def render(rows: Sequence[Row], fmt: str = "table", facts: decision.Facts | None = None, heatmap: str = "") -> str:
    """The rows in `fmt`; with `facts` (`sweep report`: the plan's SLO, the search's found lines) the Decision
    first (sweep/decision.py; JSON: a `decision` field), without them the table alone (the sweep's summary);
    `heatmap` (table, markdown: sweep/heatmap.text, which imports this module) between the two."""
    if fmt == "json":
        return json.dumps({"rows": [{"index": r.index, "point": r.label, "status": r.status, "attempt": r.attempt,
                                     "pid": r.pid, "load_seconds": _finite(r.load), "run_seconds": _finite(r.run),
                                     "restarted": r.restarted, "host": r.host or None,
                                     **{k: _finite(v) for k, v in (r.figures or {}).items()},
                                     "best": sorted(r.best), "cache": r.cache or None, "runs": r.runs,
                                     "runs_ok": r.runs_ok,
                                     "spread": {k: {"min": _finite(sp.low), "max": _finite(sp.high),
                                                    "rmad": _finite(sp.rmad)} for k, sp in r.spread.items()},
                                     "noisy": sorted(r.noisy), "unstable": r.unstable,
                                     "warmup_requests": r.warmup_requests, "throttled": r.throttled,
                                     "accept_per_position": r.accept_per_position,
                                     **(ratio_json(r) if with_baseline(rows) else {})} for r in rows],
                           "decision": decision.as_json(rows, facts)}, indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        head, body = _cells(rows, mark="{}*", new_last=True)
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([head, *([csv_cell(c) for c in r] for r in body)])
        return buf.getvalue()
    if fmt == "markdown":
        head, body = _cells(rows, mark="**{}**")
        return decision.render(rows, facts, fmt) + heatmap + "".join(
            "| " + " | ".join(c.replace("|", "\\|") for c in r) + " |\n" for r in [head, ["---"] * len(head), *body]
        ) + categories.section(rows, fmt)
    head, body = _cells(rows, mark="{}*")
    table = [head, *body]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    text = "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in table)
    return decision.render(rows, facts, fmt) + heatmap + text + legend(rows) + categories.section(rows, fmt)
