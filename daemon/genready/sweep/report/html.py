"""`genready sweep report DIR... --format html`: one self-contained HTML file to look at and attach.

No network and nothing external: the page is written through web/htmlpage (the shared stylesheet
inline, no script, a Content-Security-Policy by hash), and every plot is an SVG drawn by matplotlib
(its text drawn as paths, so no font is needed) embedded as a data: image, so the file opens on an
offline GPU host. matplotlib is the optional extra `genready[report]` (Debian:
python3-matplotlib), imported here only, and only when the report is written: the daemon never
imports this module. Everything the results hold is escaped: a point value holding `<script>`
shows as text. The page reads whatever `report --format table` reads: a value no plot can show (a
number beyond plotrules.PLOT_LIMIT or not finite) is left out of its plot, and the page says which; a value
that is no number (a string, a list) is a category on its axis. The time is linear in the lines read.

The page holds the run's context (host, genready version, target, unit, plan, time), the table
(best values, noisy, warm, failed and invalidated points marked, each point's PID, InvocationID
and load time), one plot per figure against the plan's axes (x: one axis, `--x`, by default the
client-side axis with the most values; one line per value of the other axes, `--lines` first,
by default one per server configuration; repeats as error bars from min to max), and output
tokens/s against TTFT p50 and against ITL p50, one mark per point, with the Pareto front drawn
and its points labelled; tokens/s per GPU against tokens/s per user, as vLLM draws it, its front labelled;
where some point has the GPUs' mean power, output tokens/s against it, each point labelled. With a baseline
and two server axes, the speedup heatmap (sweep/report/heatmap.py) comes before the table. Every plot follows
sweep/report/plotrules.py's rules: integer ticks, the legend outside past 6 lines, small multiples past 12.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final

from genready import __version__
from genready.sweep.report import categories, decision, heatmap, outputs, plotrules
from genready.sweep.report import replay as sweepreplay
from genready.sweep.report import schedule as sweepschedule
from genready.sweep.report.plotrules import plottable
from genready.sweep.report.table import (
    RATIO_TITLES,
    figure_text,
    positions_text,
    ratio_text,
    with_baseline,
    with_positions,
)
from genready.sweep.rows import FIGURES, MEAN_POWER_W, Figure, Row
from genready.tools import benchline
from genready.web import htmlpage

PLOTTED: Final = tuple(f.key for f in (benchline.ACCEPT_LENGTH, benchline.OUTPUT_TOKENS_PER_SECOND,
                                        benchline.TTFT_P50_MS, benchline.TTFT_P99_MS, benchline.ITL_P50_MS))
PARETO: Final = tuple((f.key, f.title) for f in (benchline.TTFT_P50_MS, benchline.ITL_P50_MS))
TPS: Final = benchline.OUTPUT_TOKENS_PER_SECOND.key
MAX_TICKS: Final = 40  # labelled categories on an axis: past that, they would overlap
EXTRA: Final = "genready[report]"
SHOWN_NAMES: Final = 20  # axis names listed in the page's context line
SHOWN_LEFT_OUT: Final = 10  # points named in a plot's "left out" note
SHOWN_ID: Final = 12  # hex digits of an InvocationID in the table (the whole on hover)


class NoMatplotlib(Exception):
    """matplotlib is not installed: the message names the extra (exit 69)."""


def figure_class() -> Any:
    """matplotlib's Figure class, drawing SVG with a fixed hash salt; NoMatplotlib without matplotlib. The
    load search's plots (loadreport) draw with it too."""
    try:
        import matplotlib
        matplotlib.use("svg")
        from matplotlib.figure import Figure as MplFigure
    except ImportError:
        raise NoMatplotlib(f"--format html draws its plots with matplotlib, which is not installed: pip install "
                           f"'{EXTRA}' (Debian: apt install python3-matplotlib); every other format works "
                           "without it") from None
    matplotlib.rcParams["svg.hashsalt"] = "genready"  # the same results give the same file
    return MplFigure


def preload() -> None:
    """Import matplotlib, where it is installed, before a report reads its results: its import leaves cycles
    (pyparsing's caught exceptions) holding every frame then on the stack, so the rows too until a collection
    walks them all: a second over 64 MiB, at exit. Collected here, they hold nothing of the report's. Only
    after the import that made them: a process that already holds matplotlib (a second report in one
    process, the tests) has no new cycles, and a full collection there walks everything it holds (0.3 s in
    the test process, per report)."""
    importing = "matplotlib.figure" not in sys.modules
    with contextlib.suppress(NoMatplotlib):
        figure_class()
    if importing:
        gc.collect()


def axes_of(rows: Sequence[Row]) -> tuple[list[str], list[str]]:
    """(client-side axes, server-side axes): an axis whose value changes inside a server configuration (a
    group) is the client's; one that is constant in every group is the server's. A point without the axis
    holds None there."""
    client, server, _ = _axes(rows)
    return client, server


def default_x(rows: Sequence[Row]) -> str | None:
    """The client-side axis (else the server-side one) with the most distinct values, None counted where a
    point lacks it; the first such in plan order."""
    return _default_x(_axes(rows))


def _default_x(axes: tuple[list[str], list[str], dict[str, int]]) -> str | None:
    client, server, distinct = axes
    pool = client or server
    return max(pool, key=distinct.__getitem__) if pool else None


def _axes(rows: Sequence[Row]) -> tuple[list[str], list[str], dict[str, int]]:
    """axes_of(), and per axis how many distinct values it has (default_x's measure), in one pass over the
    points' values: linear in the lines, however many axes they name (it was quadratic)."""
    size: Counter[int] = Counter()  # points per group
    first: dict[tuple[int, str], str] = {}  # the axis's first value in the group (its repr)
    count: Counter[tuple[int, str]] = Counter()  # points of the group that have the axis
    values: dict[str, set[str]] = {}  # per axis in plan order, its values (their repr)
    client: set[str] = set()
    for r in rows:
        g = r.group if r.group is not None else r.index
        size[g] += 1
        for n, v in r.point.items():
            rv = repr(v)
            count[g, n] += 1
            values.setdefault(n, set()).add(rv)
            if first.setdefault((g, n), rv) != rv:
                client.add(n)
    have: Counter[str] = Counter()
    for (g, n), c in count.items():
        have[n] += c
        if c != size[g] and first[g, n] != "None":  # a point of the group without the axis: None beside a value
            client.add(n)
    distinct = {n: len(vs) + (have[n] < len(rows) and "None" not in vs) for n, vs in values.items()}
    return [n for n in values if n in client], [n for n in values if n not in client], distinct


def left_out_note(left: Sequence[tuple[str, str]]) -> str:
    """The note under a plot naming the points it leaves out, and why (empty when none)."""
    if not left:
        return ""
    named = "; ".join(f"{plotrules.shown(label)}: {why}" for label, why in left[:SHOWN_LEFT_OUT])
    more = f"; and {len(left) - SHOWN_LEFT_OUT} more" if len(left) > SHOWN_LEFT_OUT else ""
    return (f'<p class="note left-out">Left out of this plot: {len(left)} point{"s" if len(left) != 1 else ""} '
            f"whose value it cannot show ({htmlpage.text(named + more)}).</p>")


def _value_text(v: Any) -> str:
    """A point value's text as the table's label writes it (label_of's rule for one value), without a dict and a
    join per value: a 64 MiB results file has hundreds of thousands (issue 41 #9d)."""
    return json.dumps(v) if isinstance(v, bool) else f"{v}"


def line_keys(rows: Sequence[Row], x: str, lines: str | None) -> list[tuple[str, ...] | None]:
    """Per row, the line it belongs on against axis `x`: its values of the other axes (`lines` first, then
    in plan order); None for a row without `x`. Once per page, for every figure's plot."""
    rank = {lines: 0} if lines is not None and lines != x else {}
    for r in rows:
        for n in r.point:
            if n != x and n not in rank:
                rank[n] = len(rank)
    return [tuple(f"{n}={_value_text(r.point[n])}" for n in sorted((n for n in r.point if n != x),
                                                                  key=rank.__getitem__))
            if x in r.point else None for r in rows]


def figure_plot(mpl: Any, rows: Sequence[Row], f: Figure, x: str, keys: Sequence[tuple[str, ...] | None]
                ) -> tuple[str | None, list[tuple[str, str]]]:
    """One figure against axis `x`, a line per value of the other axes (`keys`: line_keys()): (the SVG, None
    without data; the points left out, each with why). x is numeric when every value is a number, else
    each value is a category, in plan order. Over MAX_CONFIGURATIONS lines, small multiples (plotrules)."""
    series: dict[tuple[str, ...], list[tuple[Any, float, float, float]]] = {}
    left: list[tuple[str, str]] = []
    for r, key in zip(rows, keys, strict=True):
        v = (r.figures or {}).get(f.key)
        if r.status != "ok" or v is None or key is None:
            continue
        xv, sp = r.point[x], r.spread.get(f.key)
        y = plottable(v)
        low, high = (plottable(sp.low), plottable(sp.high)) if sp else (y, y)  # one run: its value, once
        if plotrules.number(xv) and plottable(xv) is None:
            left.append((r.label, f"{x} = {plotrules.shown(xv)}"))
        elif y is None or low is None or high is None:
            left.append((r.label, f"{f.title} = {plotrules.shown(v)}"))
        else:
            series.setdefault(key, []).append((xv, y, low, high))
    if not series:
        return None, left
    numeric = all(plotrules.number(p[0]) for pts in series.values() for p in pts)
    # numbers in order; any other values as categories in the plan's order (their first point's)
    categories: dict[str, int] = {}
    if not numeric:
        for pts in series.values():
            for p in pts:
                categories.setdefault(_value_text(p[0]), len(categories))
    many = len(series) > plotrules.MAX_CONFIGURATIONS
    groups = plotrules.panels(list(series)) if many else [("", list(series))]
    shown_groups = groups[:plotrules.MAX_PANELS]
    if many:
        fig, axes = plotrules.grid(mpl, len(shown_groups))
    else:
        fig = mpl(figsize=(6.4, 3.6))
        axes = [fig.add_subplot()]
    xs: list[float] = []
    for ax, (title, group) in zip(axes, shown_groups, strict=True):
        handles, labels = [], []
        for key in group:
            pts = series[key]
            pos = [float(p[0]) if numeric else float(categories[_value_text(p[0])]) for p in pts]
            order = sorted(range(len(pts)), key=pos.__getitem__)
            ys = [pts[i][1] for i in order]
            err = [[pts[i][1] - pts[i][2] for i in order], [pts[i][3] - pts[i][1] for i in order]]
            handles.append(ax.errorbar([pos[i] for i in order], ys, yerr=err if any(any(e) for e in err) else None,
                                       marker="o", capsize=3, markersize=4 if many else 6))
            xs += pos
            # in a panel of its first axis's value, a line is named by the values of the others
            label = " ".join(key[1:] if many else key)
            labels.append(plotrules.text(plotrules.shown(label or "all", 80)))
        if many:
            ax.set_title(plotrules.text(plotrules.shown(title, 60)), fontsize=7)
        ax.grid(alpha=0.3)
        if len(group) > 1:
            plotrules.legend(ax, handles, labels, fontsize=6 if many else 7)
    ys_all = [p[1] for pts in series.values() for p in pts]
    plotrules.integer_ticks(axes[0], xs if numeric else (), ys_all, nbins=4 if many else None)  # shared axes
    if not numeric:
        # at most MAX_TICKS labelled: a results file may hold a hundred thousand values of one axis
        step = -(-len(categories) // MAX_TICKS)
        axes[0].set_xticks(range(0, len(categories), step),
                           [plotrules.text(plotrules.shown(v)) for v in list(categories)[::step]])
    if many:
        fig.supxlabel(plotrules.text(plotrules.shown(x, 80)), fontsize=8)
        fig.supylabel(plotrules.text(f.title), fontsize=8)
        if len(groups) > len(shown_groups):
            fig.suptitle(f"first {len(shown_groups)} of {len(groups)} panels ({len(series)} lines)", fontsize=8)
    else:
        axes[0].set_xlabel(plotrules.text(plotrules.shown(x, 80)))
        axes[0].set_ylabel(plotrules.text(f.title))
    return plotrules.svg(fig, tight=not many), left


def pareto_front(points: Sequence[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The points no other beats on both: lower latency (first) and higher throughput (second)."""
    front: list[tuple[float, float, str]] = []
    best = -math.inf
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if p[1] > best:
            front.append(p)
            best = p[1]
    return front


def _scatter_front(mpl: Any, pts: Sequence[tuple[float, float, str]], front: Sequence[tuple[float, float, str]],
                   xlabel: str, ylabel: str, *, steps: bool = True) -> str:
    """All points, and the front (sorted by x) drawn through its points, each labelled (the first 20): as the
    steps that bound what it reaches (`steps`), or a plain line, as vLLM's plot_pareto draws its frontier."""
    fig = mpl(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, alpha=0.5, label="points")
    if steps:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="C3", label="Pareto front")
    else:
        ax.plot([p[0] for p in front], [p[1] for p in front], color="C3", label="Pareto front")
    ax.scatter([p[0] for p in front], [p[1] for p in front], s=30, color="C3")
    for p in front[:20]:
        ax.annotate(plotrules.text(plotrules.shown(p[2], 60)), (p[0], p[1]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlabel(plotrules.text(xlabel))
    ax.set_ylabel(plotrules.text(ylabel))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    plotrules.integer_ticks(ax, [p[0] for p in pts], [p[1] for p in pts])
    return plotrules.svg(fig)


def pareto_plot(mpl: Any, rows: Sequence[Row], latency: str, title: str
                ) -> tuple[tuple[str, list[str]] | None, list[tuple[str, str]]]:
    """Output tokens/s against `latency`: ((the SVG, the front's labels), None without data; the points
    left out, each with why)."""
    pts, left = _against_tps(rows, latency, title)
    if not pts:
        return None, left
    front = pareto_front(pts)
    return (_scatter_front(mpl, pts, front, title, "OUT tok/s"), [p[2] for p in front]), left


PER_USER: Final = "tokens/s per user (OUT tok/s / concurrency)"
PER_GPU: Final = "tokens/s per GPU (OUT tok/s / gpus)"


def per_user_points(rows: Sequence[Row]) -> tuple[list[tuple[float, float, str]], list[tuple[str, str]]]:
    """(tokens/s per user, tokens/s per GPU, label) of each ok point that has them, as vLLM's `bench sweep
    plot_pareto` computes them (vllm/benchmarks/sweep/plot_pareto.py, _prepare_records: output throughput
    over the user count, its max_concurrency, and over the GPU count): here over the bench line's
    `concurrency` (the client's -c) and the results line's `gpus` (the plan key; 1 for lines without it).
    And the points left out, each with why."""
    pts, left = [], []
    for r in rows:
        fig_ = r.figures or {}
        tps = fig_.get(TPS)
        if r.status != "ok" or tps is None:
            continue
        users, gpus = fig_.get(benchline.CONCURRENCY.key), r.gpus
        if users is None or not users > 0:
            left.append((r.label, "concurrency = " + (plotrules.shown(users) if users is not None
                                                      else "none in its bench line")))
            continue
        u, g = plottable(tps / users), plottable(tps / gpus)
        if u is None or g is None:
            left.append((r.label, f"OUT tok/s = {plotrules.shown(tps)}"))
        else:
            pts.append((u, g, r.label))
    return pts, left


def per_user_plot(mpl: Any, rows: Sequence[Row]) -> tuple[tuple[str, list[str]] | None, list[tuple[str, str]]]:
    """Tokens/s per GPU against tokens/s per user, the front labelled (higher is better on both: a faster
    answer for each user, or more tokens for each GPU): ((the SVG, the front's labels), None without data; the
    points left out, each with why)."""
    pts, left = per_user_points(rows)
    if not pts:
        return None, left
    # pareto_front's first coordinate is better lower: per user negated, and the front drawn left to right
    front = sorted((-u, g, lb) for u, g, lb in pareto_front([(-u, g, lb) for u, g, lb in pts]))
    return (_scatter_front(mpl, pts, front, PER_USER, PER_GPU, steps=False), [p[2] for p in front]), left


def _per_user(mpl: Any, rows: Sequence[Row]) -> list[str]:
    """The page's per-user/per-GPU Pareto plot, with its front named; or none, without a point to draw."""
    e = htmlpage.text
    got, left = per_user_plot(mpl, rows)
    users = benchline.CONCURRENCY.key
    if not got and not any(r.status == "ok" and (r.figures or {}).get(users) is not None for r in rows):
        return []  # no bench line says its concurrency (another client wrote them): no plot of all left out
    what = "tokens/s per GPU against tokens/s per user"
    image = htmlpage.data_image(got[0], what) if got else ""
    front = f'<p>Pareto front: {e("; ".join(got[1]))}</p>' if got else ""
    return [f'<div class="plot" id="pareto-per-user"><h3>{e(what)}</h3>{image}{front}{left_out_note(left)}</div>']


def _against_tps(rows: Sequence[Row], key: str, title: str
                 ) -> tuple[list[tuple[float, float, str]], list[tuple[str, str]]]:
    """The ok points' (figure `key`, output tokens/s, label) that have both, and the points left out (a value
    no plot can place), each with why: what the Pareto and power plots draw."""
    pts, left = [], []
    for r in rows:
        fig_ = r.figures or {}
        v, tps = fig_.get(key), fig_.get(TPS)
        if r.status != "ok" or v is None or tps is None:
            continue
        x, y = plottable(v), plottable(tps)
        if x is None or y is None:
            left.append((r.label, f"{title} = {plotrules.shown(v)}, OUT tok/s = {plotrules.shown(tps)}"))
        else:
            pts.append((x, y, r.label))
    return pts, left


def power_plot(mpl: Any, rows: Sequence[Row]) -> tuple[str | None, list[tuple[str, str]]]:
    """Output tokens/s against the GPUs' mean power, one labelled mark per ok point that has both: (the SVG,
    None without data; the points left out, each with why)."""
    pts, left = _against_tps(rows, MEAN_POWER_W.key, "mean power W")
    if not pts:
        return None, left
    fig = mpl(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=20)
    for p in pts[:40]:  # past that the labels would cover the marks
        ax.annotate(plotrules.text(plotrules.shown(p[2], 60)), (p[0], p[1]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlabel("mean GPU power W")
    ax.set_ylabel("OUT tok/s")
    ax.grid(alpha=0.3)
    plotrules.integer_ticks(ax, [p[0] for p in pts], [p[1] for p in pts])
    return plotrules.svg(fig), left


def slower_plot(mpl: Any, rows: Sequence[Row]) -> str | None:
    """Who gets slower (slower.py): per configuration the ECDF of its per-prompt speedups (the baseline's e2e over
    its own), a vertical line at 1: the share left of it got slower. None when no point has them."""
    curves = [(r.label, r.outputs.slower.speedups) for r in rows
              if r.outputs is not None and r.outputs.slower is not None and r.outputs.slower.speedups]
    if not curves:
        return None
    fig = mpl(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    handles = []
    for _, xs in curves[:plotrules.MAX_CONFIGURATIONS]:
        (line,) = ax.step(list(xs), [(i + 1) / len(xs) for i in range(len(xs))], where="post")
        handles.append(line)
    ax.axvline(1.0, color="0.3", linestyle="--", linewidth=1)
    ax.set_xlabel("per-prompt speedup: the baseline's e2e / the point's (left of 1: slower)")
    ax.set_ylabel("share of prompts")
    ax.grid(alpha=0.3)
    plotrules.legend(ax, handles, [plotrules.text(plotrules.shown(lb, 60)) for lb, _ in
                                   curves[:plotrules.MAX_CONFIGURATIONS]])
    return plotrules.svg(fig)


def _spread(xs: Sequence[float]) -> tuple[float, float, float] | None:
    """(median, min, max) of a point's runs that a plot can place; None when none can."""
    got = sorted(y for y in map(plottable, xs) if y is not None)
    return (got[len(got) // 2] if len(got) % 2 else (got[len(got) // 2 - 1] + got[len(got) // 2]) / 2,
            got[0], got[-1]) if got else None


def _runs_of(r: Row) -> list[float]:
    return list(r.samples.get(TPS, [])) or [v for v in [(r.figures or {}).get(TPS)] if v is not None]


def schedule_plot(mpl: Any, planned: sweepschedule.Schedule, replayed: sweepreplay.Replay | None = None
                  ) -> str | None:
    """Output tok/s against the load (requests in flight, a log scale): a line per static depth of the sweep
    (speculation off for the baseline), each run's spread as a bar, and the schedule's replay in bold, a load that
    regressed (report/replay.py) marked with a red cross and its ratio. None when nothing can be drawn."""
    depths = sorted({d for lv in planned.levels for d in lv.rows})
    fig = mpl(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    handles, labels, loads = [], [], [lv.load for lv in planned.levels]
    for d in depths:
        pts = [(lv.load, sp) for lv in planned.levels if d in lv.rows
               and (sp := _spread(_runs_of(lv.rows[d]))) is not None]
        if not pts:
            continue
        line = ax.errorbar([x for x, _ in pts], [sp[0] for _, sp in pts],
                           yerr=[[sp[0] - sp[1] for _, sp in pts], [sp[2] - sp[0] for _, sp in pts]],
                           marker="o", markersize=3, linewidth=1, capsize=2, alpha=0.75)
        handles.append(line)
        labels.append("speculation off" if d == 0 else f"{planned.axis}={d}")
    if replayed is not None:
        got = [(lv.load, lv.tps, lv.regression, lv.ratio) for lv in replayed.levels if lv.tps is not None
               and plottable(lv.tps) is not None]
        if got:
            (line,) = ax.plot([g[0] for g in got], [g[1] for g in got], color="black", linewidth=2.2, marker="s",
                              markersize=5, zorder=5)
            handles.append(line)
            labels.append(f"the schedule ({replayed.engine}), replayed")
            for x, y, bad, r in got:
                if bad and r is not None:
                    ax.plot([x], [y], marker="x", color="red", markersize=11, markeredgewidth=2.5, zorder=6)
                    ax.annotate(f"{r.value:.2f}x: regression", (x, y), fontsize=7, color="red", xytext=(4, -12),
                                textcoords="offset points")
    if not handles:
        return None
    ax.set_xscale("log", base=2)
    ax.set_xticks(loads)
    ax.set_xticklabels([str(x) for x in loads])
    ax.set_xlabel("requests in flight (the client's concurrency)")
    ax.set_ylabel("OUT tok/s")
    ax.grid(alpha=0.3)
    plotrules.legend(ax, handles, labels)
    return plotrules.svg(fig)


def _invocation(inv: str) -> str:
    """An InvocationID cell: its first SHOWN_ID characters (the 32 hex digits tell apart by then), the whole on
    hover, monospace."""
    e = htmlpage.text
    return f'<td class="mono" title="{e(inv)}">{e(inv[:SHOWN_ID])}</td>' if inv else '<td class="mono">-</td>'


def _escaped() -> Callable[[str], str]:
    """htmlpage.text, each value escaped once per table: a column such as status or a figure's text holds a
    few values over a hundred thousand rows."""
    seen: dict[str, str] = {}

    def once(v: str) -> str:
        got = seen.get(v)
        if got is None:
            got = seen[v] = htmlpage.text(v)
        return got
    return once


def _names(names: Sequence[str]) -> str:
    """Axis names for a line of text: the first SHOWN_NAMES, then how many more."""
    shown = ", ".join(names[:SHOWN_NAMES]) or "-"
    return shown + (f" and {len(names) - SHOWN_NAMES:,} more" if len(names) > SHOWN_NAMES else "")


def render(rows: Sequence[Row], *, x: str | None = None, lines: str | None = None, sections: Sequence[str] = (),
           heatmap_axes: str | None = None, facts: decision.Facts | None = None) -> str:
    """The whole page, its Decision first (with `facts`: decision.py), `sections` (HTML: loadreport's, which imports
    this module) after its plots. NoMatplotlib without matplotlib; ValueError for an --x or --lines no
    point has, or a --heatmap (`heatmap_axes`) that is not two server-side axes."""
    names = list(dict.fromkeys(n for r in rows for n in r.point))
    for flag, v in (("--x", x), ("--lines", lines)):
        if v is not None and v not in names:
            raise ValueError(f"{flag}: expected one of the plan's axes ({_names(names) if names else 'none'}), "
                             f"found {v!r}")
    axes = _axes(rows)
    hm = heatmap.choose(rows, axes[1], heatmap_axes)
    mpl = figure_class()
    x = x or _default_x(axes)
    e = htmlpage.text
    ctx = [("genready", __version__), ("report written on", socket.gethostname()),
           ("written at", time.strftime("%Y-%m-%d %H:%M:%S %Z"))]
    for key, title in (("target", "target"), ("unit", "unit"), ("plan", "plan")):
        vals = sorted({r.context[key] for r in rows if r.context.get(key)})
        if vals:
            ctx.append((title, ", ".join(vals)))
    hosts = sorted({r.host for r in rows if r.host})
    if hosts:
        ctx.append(("hosts", ", ".join(hosts)))
    starts = sorted(r.context["started_at"] for r in rows if r.context.get("started_at"))
    ends = sorted(r.context["ended_at"] for r in rows if r.context.get("ended_at"))
    if starts:
        ctx.append(("ran", f"{starts[0]} to {ends[-1] if ends else '?'}"))
    client, server, _ = axes
    ctx.append(("axes", f"client: {_names(client)}; server: {_names(server)}"))
    out = ["<h1>genready sweep report</h1>", decision.render(rows, facts, "html"), "<dl>",
           *(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in ctx), "</dl>"]
    out.append(heatmap.section(mpl, rows, hm, axes[0], axes[1]))
    out.append(_table(rows) + outputs.html_section(rows) + categories.html_section(rows))
    plots = []
    if x is not None:
        keys = line_keys(rows, x, lines)
        for key in PLOTTED:
            f = next(fg for fg in FIGURES if fg.key == key)
            svg, left = figure_plot(mpl, rows, f, x, keys)
            if svg or left:
                what = f"{f.title} against {x}"
                image = htmlpage.data_image(svg, what) if svg else ""
                plots.append(f'<div class="plot" id="plot-{e(key)}"><h3>{e(what)}</h3>{image}'
                             f"{left_out_note(left)}</div>")
    plots += _per_user(mpl, rows)
    for latency, title in PARETO:
        got, left = pareto_plot(mpl, rows, latency, title)
        if got or left:
            what = f"OUT tok/s against {title}"
            image = htmlpage.data_image(got[0], what) if got else ""
            front = f'<p>Pareto front: {e("; ".join(got[1]))}</p>' if got else ""
            plots.append(f'<div class="plot" id="pareto-{e(latency)}"><h3>{e(what)}</h3>{image}{front}'
                         f"{left_out_note(left)}</div>")
    if (ecdf := slower_plot(mpl, rows)) is not None:
        what = "who gets slower: per-prompt speedup, ECDF per configuration"
        plots.append(f'<div class="plot" id="slower"><h3>{e(what)}</h3>{htmlpage.data_image(ecdf, what)}</div>')
    svg, left = power_plot(mpl, rows)
    if svg or left:
        what = "OUT tok/s against mean GPU power W"
        image = htmlpage.data_image(svg, what) if svg else ""
        plots.append(f'<div class="plot" id="power"><h3>{e(what)}</h3>{image}{left_out_note(left)}</div>')
    out += ["<h2>Plots</h2>", '<div class="plots">', *plots, "</div>" if plots else "<p>no figures to plot</p></div>"]
    out += sections
    return htmlpage.REPORT.page("genready sweep report", "\n".join(out)).html


def _table(rows: Sequence[Row]) -> str:
    e = htmlpage.text
    once = _escaped()  # for the cells whose few values repeat in every row
    figures = [f for f in FIGURES if f.column and (not f.optional or any((r.figures or {}).get(f.key) is not None
                                                                         for r in rows))]
    ratios = list(RATIO_TITLES) if with_baseline(rows) else []  # against the plan's baseline (speedup.py)
    pos = with_positions(rows)  # the engine's acceptance per draft position, where some point has it
    head = ["point", "status", "cache", "runs", "PID", "InvocationID", "load s", "run s", "host",
            *(f.title for f in figures), *(["ACC/POS"] if pos else []), *(RATIO_TITLES[n] for n in ratios),
            *(["output"] if (checked := outputs.with_outputs(rows)) else [])]
    body = []
    for r in rows:
        unstable = f' <span class="noisy">unstable ({r.warmup_requests})</span>' if r.unstable else ""
        cells = [f'<tr class="{once(r.status.split()[0] if r.status else "")}"><td>{e(r.label)}</td>'
                 f"<td>{once(r.status)}{unstable}</td>"
                 f'<td class="{"warm" if r.cache == "warm" else ""}">{once(r.cache or "-")}</td>'
                 f"<td>{r.runs_ok}/{r.runs}</td><td>{e(r.pid)}</td>{_invocation(r.invocation_id)}"
                 f"<td>{'-' if r.load is None else f'{r.load:.1f}'}</td>"
                 f"<td>{'-' if r.run is None else f'{r.run:.1f}'}</td><td>{once(r.host or '-')}</td>"]
        marked = r.best or r.noisy
        for f in figures:
            cls = " ".join(c for c, on in (("best", f.key in r.best), ("noisy", f.key in r.noisy)) if on) \
                if marked else ""
            cells.append(f'<td class="{cls}">{once(figure_text(r, f))}</td>')
        if pos:
            cells.append(f"<td>{once(positions_text(r.accept_per_position))}</td>")
        for n in ratios:
            got = r.ratios.get(n)
            noisy = got is not None and (got.within_noise(r.noise_limit) or (n == "speedup" and r.drifted is not None))
            cells.append(f'<td class="{"noisy" if noisy else ""}">{once(ratio_text(r, n))}</td>')
        if checked:  # a diverged or degenerate point's cell in red
            cells.append(f'<td class="{"marked" if r.outputs and r.outputs.marked else ""}">{e(outputs.cell(r) or "-")}'
                         "</td>")
        cells.append("</tr>")
        body.append("".join(cells))
    legend = ("<p>Bold green: best of its column. Orange: noisy (relative median absolute deviation over the "
              "plan's noise_limit). Red cache: warm, the point ran on a prefix cache an earlier run filled. Rows: red "
              "failed or not ready, orange invalidated." + (
                  " Unstable: its warmup stopped at warmup_max before TTFT and ITL settled (the requests it sent)."
                  if any(r.unstable for r in rows) else "")
              + (" SPEEDUP: output tok/s / the baseline's before it at the same client settings, [95 % interval]; "
                 "TTFT/ITL/E2E x: the point's p50 / the baseline's; orange: within the noise (~) or drifted (the "
                 "baseline moved around the point)." if ratios else "") + "</p>")
    return ("<h2>Points</h2><table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>" + legend)
