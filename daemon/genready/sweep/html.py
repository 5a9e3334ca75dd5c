"""`genready sweep report DIR... --format html`: one self-contained HTML file to look at and attach.

No network and nothing external: the CSS is inline, there is no script, and every plot is an SVG
drawn by matplotlib (its text drawn as paths, so no font is needed) embedded in the page, so the
file opens on an offline GPU host. matplotlib is the optional extra `genready[report]` (Debian:
python3-matplotlib), imported here only, and only when the report is written: the daemon never
imports this module. Everything the results hold is escaped: a point value holding `<script>`
shows as text.

The page holds the run's context (host, genready version, target, unit, plan, time), the table
(best values, noisy, warm, failed and invalidated points marked, each point's PID, InvocationID
and load time), one plot per figure against the plan's axes (x: one axis, `--x`, by default the
client-side axis with the most values; one line per value of the other axes, `--lines` first,
by default one per server configuration; repeats as error bars from min to max), and output
tokens/s against TTFT p50 and against ITL p50, one mark per point, with the Pareto front drawn
and its points labelled.
"""

from __future__ import annotations

import html
import io
import math
import socket
import time
from collections.abc import Sequence
from typing import Any, Final

from genready import __version__
from genready.redact import escape
from genready.sweep.report import FIGURES, Figure, Row, figure_text, label_of

PLOTTED: Final = ("accept_length", "output_tokens_per_second", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms")
PARETO: Final = (("ttft_p50_ms", "TTFT p50 ms"), ("itl_p50_ms", "ITL p50 ms"))
MAX_LINES: Final = 12  # lines per plot: past that, the legend would hide the plot
EXTRA: Final = "genready[report]"


class NoMatplotlib(Exception):
    """matplotlib is not installed: the message names the extra (exit 69)."""


def _matplotlib() -> Any:
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


def _text(v: object) -> str:
    """For matplotlib: control characters shown escaped, and `$` escaped (mathtext would read `$...$` in a
    value as a formula)."""
    return escape(str(v)).replace("$", r"\$")


def _e(v: object) -> str:
    """For the page: control characters shown escaped (`\\x1b`), then HTML-escaped (`<script>` is text)."""
    return html.escape(escape(str(v)))


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]  # inline: no XML declaration or DOCTYPE inside HTML


def axes_of(rows: Sequence[Row]) -> tuple[list[str], list[str]]:
    """(client-side axes, server-side axes): an axis whose value changes inside a server configuration (a
    group) is the client's; one that is constant in every group is the server's."""
    names: list[str] = []
    for r in rows:
        names += [k for k in r.point if k not in names]
    by_group: dict[int, list[Row]] = {}
    for r in rows:
        by_group.setdefault(r.group if r.group is not None else r.index, []).append(r)
    client = [n for n in names if any(len({repr(r.point.get(n)) for r in g}) > 1 for g in by_group.values())]
    return client, [n for n in names if n not in client]


def default_x(rows: Sequence[Row]) -> str | None:
    client, server = axes_of(rows)
    pool = client or server
    return max(pool, key=lambda n: len({repr(r.point.get(n)) for r in rows})) if pool else None


def _value_key(v: Any) -> tuple[int, float, str]:
    return (0, float(v), "") if isinstance(v, int | float) and not isinstance(v, bool) else (1, 0.0, str(v))


def figure_plot(mpl: Any, rows: Sequence[Row], f: Figure, x: str, lines: str | None) -> str | None:
    """One figure against axis `x`, a line per value of the other axes (`lines` first); None without data."""
    others = [n for r in rows for n in r.point if n != x]
    others = list(dict.fromkeys(([lines] if lines in others else []) + others))
    series: dict[tuple[str, ...], list[tuple[Any, float, float, float]]] = {}
    for r in rows:
        v = (r.figures or {}).get(f.key)
        if r.status != "ok" or v is None or not math.isfinite(v) or x not in r.point:
            continue
        sp = r.spread.get(f.key)
        key = tuple(f"{n}={label_of({n: r.point.get(n)}).split('=', 1)[1]}" for n in others if n in r.point)
        series.setdefault(key, []).append((r.point[x], v, sp.low if sp else v, sp.high if sp else v))
    if not series:
        return None
    # numbers in order; any other values in the plan's order (their first point's)
    xs = list(dict.fromkeys(p[0] for pts in series.values() for p in pts))
    numeric = all(_value_key(v)[0] == 0 for v in xs)
    if numeric:
        xs.sort(key=_value_key)
    fig = mpl(figsize=(6.4, 3.6))
    ax = fig.add_subplot()
    for key, pts in list(series.items())[:MAX_LINES]:
        pts.sort(key=lambda p: _value_key(p[0]) if numeric else (0, float(xs.index(p[0])), ""))
        pos = [p[0] if numeric else xs.index(p[0]) for p in pts]
        ys = [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(pos, ys, yerr=err if any(any(e) for e in err) else None, marker="o", capsize=3,
                    label=_text(" ".join(key) or "all"))
    if not numeric:
        ax.set_xticks(range(len(xs)), [_text(v) for v in xs])
    ax.set_xlabel(_text(x))
    ax.set_ylabel(_text(f.title))
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=7, loc="best")
    if len(series) > MAX_LINES:
        ax.set_title(f"first {MAX_LINES} of {len(series)} lines", fontsize=8)
    return _svg(fig)


def pareto_front(points: Sequence[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The points no other beats on both: lower latency (first) and higher throughput (second)."""
    front: list[tuple[float, float, str]] = []
    best = -math.inf
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if p[1] > best:
            front.append(p)
            best = p[1]
    return front


def pareto_plot(mpl: Any, rows: Sequence[Row], latency: str, title: str) -> tuple[str, list[str]] | None:
    pts = []
    for r in rows:
        fig_ = r.figures or {}
        lat, tps = fig_.get(latency), fig_.get("output_tokens_per_second")
        if r.status == "ok" and lat is not None and tps is not None and math.isfinite(lat) and math.isfinite(tps):
            pts.append((lat, tps, r.label))
    if not pts:
        return None
    front = pareto_front(pts)
    fig = mpl(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, alpha=0.5, label="points")
    ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="C3", label="Pareto front")
    ax.scatter([p[0] for p in front], [p[1] for p in front], s=30, color="C3")
    for p in front[:20]:
        ax.annotate(_text(p[2]), (p[0], p[1]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(_text(title))
    ax.set_ylabel("OUT tok/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _svg(fig), [p[2] for p in front]


CSS: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
td:first-child,th:first-child{text-align:left}tr.failed,tr.not_ready,tr.unreadable{background:#fde2e2}
tr.invalidated{background:#fff0d0}td.best{font-weight:bold;background:#e3f4e3}td.noisy{color:#a05a00}
td.warm{color:#a00;font-weight:bold}.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{max-width:48em}
.plot svg{max-width:100%;height:auto}dl{display:grid;grid-template-columns:max-content auto;gap:0 1em}
dt{font-weight:bold}
"""


def render(rows: Sequence[Row], *, x: str | None = None, lines: str | None = None) -> str:
    """The whole page. NoMatplotlib without matplotlib; ValueError for an --x or --lines no point has."""
    names = list(dict.fromkeys(n for r in rows for n in r.point))
    for flag, v in (("--x", x), ("--lines", lines)):
        if v is not None and v not in names:
            raise ValueError(f"{flag}: expected one of the plan's axes ({', '.join(names) or 'none'}), found {v!r}")
    mpl = _matplotlib()
    x = x or default_x(rows)
    e = _e
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
    client, server = axes_of(rows)
    ctx.append(("axes", f"client: {', '.join(client) or '-'}; server: {', '.join(server) or '-'}"))
    out = ["<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
           "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
           "img-src data:\">",
           f"<title>genready sweep report</title><style>{CSS}</style></head><body>",
           "<h1>genready sweep report</h1><dl>",
           *(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in ctx), "</dl>"]
    out.append(_table(rows))
    plots = []
    if x is not None:
        for key in PLOTTED:
            f = next(fg for fg in FIGURES if fg.key == key)
            svg = figure_plot(mpl, rows, f, x, lines)
            if svg:
                plots.append(f'<div class="plot" id="plot-{e(key)}"><h3>{e(f.title)} against {e(x)}</h3>{svg}</div>')
    for latency, title in PARETO:
        got = pareto_plot(mpl, rows, latency, title)
        if got:
            svg, front = got
            plots.append(f'<div class="plot" id="pareto-{e(latency)}"><h3>OUT tok/s against {e(title)}</h3>{svg}'
                         f'<p>Pareto front: {e("; ".join(front))}</p></div>')
    out += ["<h2>Plots</h2>", '<div class="plots">', *plots, "</div>" if plots else "<p>no figures to plot</p></div>"]
    out.append("</body></html>\n")
    return "\n".join(out)


def _table(rows: Sequence[Row]) -> str:
    e = _e
    figures = [f for f in FIGURES if f.column and (not f.optional or any((r.figures or {}).get(f.key) is not None
                                                                         for r in rows))]
    head = ["point", "status", "cache", "runs", "PID", "InvocationID", "load s", "run s", "host",
            *(f.title for f in figures)]
    body = []
    for r in rows:
        cells = [f"<td>{e(r.label)}</td>", f"<td>{e(r.status)}</td>",
                 f'<td class="{"warm" if r.cache == "warm" else ""}">{e(r.cache or "-")}</td>',
                 f"<td>{r.runs_ok}/{r.runs}</td>", f"<td>{e(r.pid)}</td>", f"<td>{e(r.invocation_id or '-')}</td>",
                 f"<td>{'-' if r.load is None else f'{r.load:.1f}'}</td>",
                 f"<td>{'-' if r.run is None else f'{r.run:.1f}'}</td>", f"<td>{e(r.host or '-')}</td>"]
        for f in figures:
            cls = " ".join(c for c, on in (("best", f.key in r.best), ("noisy", f.key in r.noisy)) if on)
            cells.append(f'<td class="{cls}">{e(figure_text(r, f))}</td>')
        body.append(f'<tr class="{e(r.status.split()[0] if r.status else "")}">{"".join(cells)}</tr>')
    legend = ("<p>Bold green: best of its column. Orange: noisy (relative median absolute deviation over the "
              "plan's noise_limit). Red cache: warm, the point ran on a prefix cache an earlier run filled. Rows: red "
              "failed or not ready, orange invalidated.</p>")
    return ("<h2>Points</h2><table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>" + legend)
