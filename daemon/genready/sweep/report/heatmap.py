"""The html report's speedup heatmap (issue 37 §3): which configuration beats the baseline, by how much,
and how sure, over two server axes at a glance.

When the plan has at least two server-side axes (constant inside a server configuration; html.axes_of), the
heatmap covers the two with the most values among the plan's points (`sweep report --heatmap X,Y` chooses),
one per client setting (and per value of any other server axis). Each cell is a configuration's speedup
against the baseline (speedup.py), its value and 95 % interval written in it; the colour is diverging and
centred on 1 on a log scale (blue faster, red slower: 0.5x as red as 2x is blue), so a slowdown never looks
like a small speedup; a noisy cell (within the noise, or drifted) is hatched and its value marked `~`.
Without a baseline there is no speedup, so no heatmap: the page says why in one line.

The table and markdown reports hold the same heatmap as text (text()): the same axes, panels and cells, each
cell the speedup in the table's words (report.ratio_text: `1.43x [1.38-1.49]`, `0.82x slower [...]`, `~`,
`drifted -23%`), Y's values from the top down as the page draws them; without a heatmap, nothing.

matplotlib is imported only when the html report is written (sweep/report/html.py calls section()).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from genready.redact import escape
from genready.sweep.report import plotrules, speedup
from genready.sweep.report.table import ratio_text, with_baseline
from genready.sweep.rows import Row, label_of
from genready.web import htmlpage

MAX_HEATMAPS: Final = 24  # client settings x other server values drawn; past that the page says how many more
MAX_WRITTEN: Final = 400  # cells whose values are written: past that the text would be smaller than legible
# cells whose interval (and drift) is written under the value: past that, the value alone (the hatching still marks
# the noisy ones; the table and the text heatmap have the intervals), as three lines a cell crowd a 10 x 10 grid,
# and a cell's lines are most of a heatmap's drawing time
MAX_WITH_INTERVAL: Final = 49
CAPTION: Final = (
    "Each cell: a server configuration's speedup, its output tok/s / the baseline's at the same client "
    "setting, with its 95 % interval. Blue: faster than the baseline; red: slower (a slowdown); white: the "
    "same; grey: no speedup (the point did not run ok, or had no baseline run). Hatched: noisy, not a "
    "difference to act on: ~ within the noise (the interval holds 1; without repeats, the speedup is no "
    "further from 1 than the plan's noise_limit), or drifted (the baseline's own tok/s moved by that much "
    "around the point).")


@dataclass(frozen=True)
class Choice:
    """The heatmap's two axes (x, y), or None with why there is no heatmap."""

    axes: tuple[str, str] | None
    why: str = ""


def _distinct(rows: Sequence[Row], name: str) -> int:
    return len({repr(r.point.get(name)) for r in rows if not r.baseline})


def choose(rows: Sequence[Row], server: Sequence[str], flag: str | None) -> Choice:
    """The axes: `flag` ("X,Y", --heatmap) when given, else the two server axes (`server`, in plan order) with
    the most values among the plan's points (not the baseline's), the first in plan order on a tie.
    ValueError for a flag that is not two distinct server axes, naming those there are."""
    if flag is not None:
        names = [n.strip() for n in flag.split(",")]
        if len(names) != 2 or names[0] == names[1] or any(n not in server for n in names):
            there = ", ".join(server) if server else "none"
            raise ValueError(f"--heatmap: expected two server-side axes X,Y of the plan (its server-side axes: "
                             f"{there}), found {flag!r}")
        axes = (names[0], names[1])
    elif len(server) < 2:
        return Choice(None, f"a speedup heatmap needs two server-side axes; this plan has {len(server)}"
                      + (f" ({', '.join(server)})" if server else ""))
    else:
        ranked = sorted(server, key=lambda n: -_distinct(rows, n))  # stable: plan order between equals
        x, y = ranked[0], ranked[1]
        axes = (x, y) if server.index(x) < server.index(y) else (y, x)
    if not with_baseline(rows):
        return Choice(None, "no speedup heatmap: the plan has no baseline (the plan key `baseline`) to measure "
                      "speedups against")
    return Choice(axes)


def _order(values: Sequence[Any]) -> list[Any]:
    """An axis's values: numbers in order, anything else in plan order (as html's figure plots)."""
    seen = list({repr(v): v for v in values}.values())
    if all(plotrules.number(v) for v in seen):
        return sorted(seen)
    return seen


def _text(v: Any) -> str:
    return label_of({"": v})[1:]


def axis_values(rows: Sequence[Row], axes: tuple[str, str]) -> tuple[list[Any], list[Any]]:
    """The values of the heatmap's x and y axes among the plan's points (not the baseline's), every panel's."""
    plan_rows = [r for r in rows if not r.baseline]
    x, y = axes
    return (_order([r.point[x] for r in plan_rows if x in r.point]),
            _order([r.point[y] for r in plan_rows if y in r.point]))


@dataclass
class Panel:
    title: str  # the client setting (and other server values) it is drawn for
    cells: dict[tuple[str, str], Row]  # (x value's repr, y value's repr) -> the point's row


def panels(rows: Sequence[Row], axes: tuple[str, str], client: Sequence[str], server: Sequence[str]
           ) -> list[Panel]:
    """The plan's points in panels, one per client setting and value of the server axes other than `axes`,
    in plan order; the first point of a cell kept."""
    x, y = axes
    others = [n for n in server if n not in axes]
    out: dict[str, Panel] = {}
    for r in rows:
        if r.baseline or x not in r.point or y not in r.point:
            continue
        setting = r.client if r.client is not None else {n: r.point[n] for n in client if n in r.point}
        title = " ".join(p for p in (label_of(setting) if setting else "",
                                     label_of({n: r.point[n] for n in others if n in r.point}) if others else "")
                         if p and p != "(no values)") or "all points"
        panel = out.setdefault(json.dumps(title), Panel(title, {}))
        panel.cells.setdefault((repr(r.point[x]), repr(r.point[y])), r)
    return list(out.values())


def _cell(r: Row | None) -> tuple[float | None, str, bool]:
    """(the speedup, the cell's text, noisy)."""
    if r is None:
        return None, "", False
    got = r.ratios.get("speedup")
    if r.status != "ok" or got is None:
        return None, plotrules.shown(r.status if r.status != "ok" else "-", 12), False
    within = got.within_noise(r.noise_limit)
    text = f"{got.value:.2f}x" + (" ~" if within else "")
    if got.low is not None and got.high is not None:
        text += f"\n[{got.low:.2f}-{got.high:.2f}]"
    if r.drifted is not None:
        text += f"\ndrifted {speedup.drift_text(r.drifted)}"
    return got.value, text, within or r.drifted is not None


def _draw(mpl: Any, panel: Panel, n: int, axes: tuple[str, str], xs: list[Any], ys: list[Any], span: float) -> str:
    """One heatmap's SVG: log2(speedup) on a diverging scale from -span to +span (shared by every panel)."""
    import matplotlib
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FuncFormatter

    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="0.85")  # grey: a cell without a speedup
    grid: list[list[float]] = []
    written, full = len(xs) * len(ys) <= MAX_WRITTEN, len(xs) * len(ys) <= MAX_WITH_INTERVAL
    w, h = min(14.0, max(4.0, 1.25 * len(xs) + 1.6)), min(12.0, max(2.6, 0.75 * len(ys) + 1.3))
    fig = mpl(figsize=(w, h))
    # Laid out here, in inches from the longest y tick label (10 pt: ~0.085 in a character), not by svg(tight=True),
    # which draws every cell's text twice to measure it: a 1,000-point report draws a heatmap per client setting.
    widest = max((len(plotrules.shown(_text(v), 16)) for v in ys), default=1)
    fig.subplots_adjust(left=min(0.45, (0.55 + 0.085 * widest) / w), right=1 - 0.35 / w, bottom=0.6 / h,
                        top=1 - 0.2 / h)
    ax = fig.add_subplot()
    texts = []
    for i, yv in enumerate(ys):
        line = []
        for j, xv in enumerate(xs):
            value, text, noisy = _cell(panel.cells.get((repr(xv), repr(yv))))
            line.append(math.log2(value) if value is not None and value > 0 else math.nan)
            if noisy:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.35",
                                       linewidth=0, gid=f"noisy-{n}-{i}-{j}"))
            if text and written:
                dark = value is not None and value > 0 and abs(math.log2(value)) > 0.6 * span
                texts.append((j, i, text if full else text.split("\n")[0], "white" if dark else "black"))
        grid.append(line)
    image = ax.imshow(grid, cmap=cmap, vmin=-span, vmax=span, origin="lower", aspect="auto")
    for j, i, text, colour in texts:
        # each line escaped on its own: the escape would write the line break as \x0a
        ax.text(j, i, "\n".join(plotrules.text(t) for t in text.split("\n")), ha="center", va="center", fontsize=7,
                color=colour)
    ax.set_xticks(range(len(xs)), [plotrules.text(plotrules.shown(_text(v), 16)) for v in xs])
    ax.set_yticks(range(len(ys)), [plotrules.text(plotrules.shown(_text(v), 16)) for v in ys])
    ax.set_xlabel(plotrules.text(plotrules.shown(axes[0], 60)))
    ax.set_ylabel(plotrules.text(plotrules.shown(axes[1], 60)))
    bar = fig.colorbar(image, ax=ax, format=FuncFormatter(lambda v, _: f"{2 ** v:.2g}x"))
    bar.set_label("speedup (log scale)", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    return plotrules.svg(fig, tight=False)


def section(mpl: Any, rows: Sequence[Row], choice: Choice, client: Sequence[str], server: Sequence[str]) -> str:
    """The page's heatmap section: a heading, one plot per panel and the caption; or one line saying why
    there is none."""
    e = htmlpage.text
    if choice.axes is None:
        return f'<p class="note" id="no-heatmap">{e(choice.why[:1].upper() + choice.why[1:])}.</p>'
    x, y = choice.axes
    drawn = panels(rows, choice.axes, client, server)
    plan_rows = [r for r in rows if not r.baseline]
    xs, ys = axis_values(rows, choice.axes)
    logs = [abs(math.log2(got.value)) for r in plan_rows if r.status == "ok"
            and (got := r.ratios.get("speedup")) is not None and got.value > 0]
    span = max([0.25, *logs])  # at least 0.84x-1.19x: a sweep of near-equal configurations is not painted deep
    plots = []
    for n, panel in enumerate(drawn[:MAX_HEATMAPS], 1):
        what = f"SPEEDUP over {x} x {y}, {panel.title}"
        plots.append(f'<div class="plot" id="heatmap-{n}"><h3>{e(what)}</h3>'
                     f"{htmlpage.data_image(_draw(mpl, panel, n, choice.axes, xs, ys, span), what)}</div>")
    more = (f"<p class=\"note\">The first {MAX_HEATMAPS} of {len(drawn)} heatmaps are drawn.</p>"
            if len(drawn) > MAX_HEATMAPS else "")
    return ('<h2 id="heatmap">Speedup against the baseline</h2><div class="plots">' + "".join(plots) + "</div>"
            + more + f'<p class="note heatmap-caption">{e(CAPTION)}</p>')


# --- the table and markdown reports' heatmap: the same cells, as text ---------------------------------------------

TEXT_TITLE: Final = "Speedup against the baseline"
TEXT_NOTE: Final = ("each cell: SPEEDUP as in the table, a configuration's output tok/s / the baseline's at the same "
                    "client setting [95 % interval]; slower: below 1; ~ within the noise; drifted: the baseline moved "
                    "around it; a status: it did not run ok; `sweep report --heatmap X,Y` chooses the axes")


def cell_text(r: Row | None) -> str:
    """A text cell: the speedup in the table's words (report.ratio_text), the status of a point that did not run
    ok, "" where the plan has no such configuration."""
    if r is None:
        return ""
    return ratio_text(r, "speedup") if r.status == "ok" else plotrules.shown(r.status, 24)


def text(rows: Sequence[Row], axes: tuple[Sequence[str], Sequence[str]], flag: str | None, fmt: str) -> str:
    """`sweep report`'s heatmap in `fmt` (table, markdown), to go after the Decision: per panel, Y's values as
    rows (top down, as the page draws them) by X's as columns; "" without a baseline or two server axes.
    `axes`: the plan's (client, server) axes (html.axes_of, which imports this module). ValueError for a
    --heatmap (`flag`) that is not two server-side axes, as the page."""
    client, server = axes
    choice = choose(rows, server, flag)
    if choice.axes is None:
        return ""
    x, y = choice.axes
    xs, ys = axis_values(rows, choice.axes)
    head = [f"{plotrules.shown(y, 24)} \\ {plotrules.shown(x, 24)}", *(plotrules.shown(_text(v), 24) for v in xs)]
    out = [f"## {TEXT_TITLE}\n\n" if fmt == "markdown" else
           f"{TEXT_TITLE} ({escape(x)} across, {escape(y)} up, as the html heatmap draws it)\n"]
    for panel in panels(rows, choice.axes, client, server):
        grid = [head] + [[plotrules.shown(_text(yv), 24)] + [cell_text(panel.cells.get((repr(xv), repr(yv))))
                                                             for xv in xs] for yv in reversed(ys)]
        title = escape(panel.title)
        what = f"SPEEDUP over {escape(x)} x {escape(y)}, {title}"
        if fmt == "markdown":
            cells = [[c.replace("|", "\\|") for c in line] for line in grid]
            out.append(f"**{what}**\n\n" + "".join("| " + " | ".join(line) + " |\n"
                                                   for line in [cells[0], ["---"] * len(head), *cells[1:]]) + "\n")
            continue
        widths = [max(len(line[i]) for line in grid) for i in range(len(head))]
        out.append(f"  {title}\n" + "".join(
            "    " + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n" for line in grid))
    return "".join(out) + f"({TEXT_NOTE})\n\n"
