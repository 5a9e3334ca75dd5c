"""The sweep's rows as text: the summary at the end of a sweep, and `genready sweep report` in its formats.

`render` writes rows (rows.py; a report's are read by collect.py) as an aligned table, CSV, markdown or
JSON: a column per figure, the best value of each marked, the spread over repeats, the ratios against the
plan's baseline, and a legend for the marks the table holds; `sweep report` puts the Decision
(decision.py) first. What the files hold is escaped for a terminal, a CSV cell a spreadsheet would run is
quoted with `'`, and the JSON output is strict (null for NaN and ±Infinity, which are never marked best).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from typing import Any, Final

from genready.redact import escape
from genready.servers import engineconfig
from genready.sweep.report import categories, decision, outputs, slower, speedup
from genready.sweep.rows import FIGURES, UNREADABLE, Figure, Row, mark_best
from genready.tools import benchline

FORMATS: Final = ("table", "csv", "markdown", "json")
SHOWN_POSITIONS: Final = 6  # in a table cell, then how many more


def positions_text(pos: Sequence[float] | None) -> str:
    """An ACC/POS cell: `0.81 0.62 0.40`, the first SHOWN_POSITIONS then `+N`; `-` without figures."""
    if not pos:
        return "-"
    more = f" +{len(pos) - SHOWN_POSITIONS}" if len(pos) > SHOWN_POSITIONS else ""
    return " ".join(f"{x:.2f}" for x in pos[:SHOWN_POSITIONS]) + more


def with_positions(rows: Sequence[Row]) -> bool:
    return any(r.accept_per_position for r in rows)


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
            # where a second sweep of the same plan measures it (noise.ratio): wider than low-high, which is
            # about the true ratio
            "replication": None if got.rep_low is None else {"low": _finite(got.rep_low),
                                                             "high": _finite(got.rep_high)},
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
        (titles + new if new_last else new + titles) + [RATIO_TITLES[n] for n in ratios] + \
        (["OUTPUT"] if (checked := outputs.with_outputs(rows)) else [])
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
        body.append(cells + (figs + extra if new_last else extra + figs) + [ratio_text(r, n) for n in ratios] +
                    ([outputs.cell(r) or "-"] if checked else []))
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
                     "x: the point's p50 / the baseline's (below 1: faster); [95 % interval over the repeats, and "
                     "between loads where measured: the Decision's note]; ~ within the noise; drifted: the "
                     "baseline's tok/s moved by that much around the point")
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
    if outputs.with_outputs(rows):
        notes.append("OUTPUT: the share of prompts whose answer equals the baseline's, and the 10th percentile of the "
                     "matching prefix as a share of the answer; DIVERGED: more answers than max_divergence leave "
                     "the baseline's before half their length; DEGENERATE: answers loop where the baseline's do not "
                     "(docs/sweeps.md, \"Same prompts, same tokens\")")
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
        out.append(f"engine keys that differ across points: {escape(', '.join(keys[:12]))}"
                   + (f" (+{len(keys) - 12} more)" if len(keys) > 12 else ""))
    first: dict[str, Row] = {}  # one row per server configuration: its points share one engine
    for r in with_engine:
        first.setdefault(r.server or r.label, r)
    warnings = engineconfig.identical_configs([(r.label, {"dropin": s}, r.engine or {}) for s, r in first.items()])
    return out + [f"warning: {w}" for w in warnings[:6]]


def render(rows: Sequence[Row], fmt: str = "table", facts: decision.Facts | None = None, heatmap: str = "") -> str:
    """The rows in `fmt`; with `facts` (`sweep report`: the plan's SLO, the search's found lines) the Decision
    first (sweep/report/decision.py; JSON: a `decision` field), without them the table alone (the sweep's summary);
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
                                     benchline.ACCEPT_PER_POSITION.key: r.accept_per_position,
                                     **(ratio_json(r) if with_baseline(rows) else {}),
                                     "outputs": outputs.as_json(r.outputs)} for r in rows],
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
    return decision.render(rows, facts, fmt) + heatmap + text + legend(rows) + slower.table(rows) + \
        categories.section(rows, fmt)


def summary(rows: Sequence[Row]) -> str:
    """The table at the end of a sweep: the rows of the points it ran (and those it did not), best values marked
    and ratios attached as `sweep report` does, without the Decision."""
    mark_best(rows)
    speedup.attach(rows)
    return render(rows)
