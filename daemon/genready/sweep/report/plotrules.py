"""What keeps every plot of the html report readable, once for all of them (issue 37 §3), and what each plot
needs to be drawn at all: a value as a coordinate or as text, and the SVG it becomes.

- An axis whose values are all integers (concurrencies, GPU counts) gets integer ticks: no "1.25 users".
- Over LEGEND_INSIDE lines, the legend goes outside the axes, on the right: inside it would hide the lines.
- Over MAX_CONFIGURATIONS lines, small multiples (a grid of small plots sharing both axes, one per
  configuration or per group of lines) instead of one plot whose lines no one can tell apart.

matplotlib is imported by the functions that need it, only when the html report is written (sweep/report/html.py).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

from genready.redact import escape

LEGEND_INSIDE: Final = 6  # lines a legend inside the axes may list
MAX_CONFIGURATIONS: Final = 12  # lines one plot may hold; past that, small multiples
MAX_PANELS: Final = 16  # small plots in one grid (4 x 4): past that, the first ones and a title that says so; each
# costs ~20 ms to draw, and a 1,000-point report draws a grid per figure
PANEL_COLUMNS: Final = 4
# The largest magnitude a plot shows: matplotlib cannot lay out an axis spanning ±1.7e308 (its limits and
# ticks overflow, "arange: cannot compute length"); ±1e307 still draws, so 1e300 leaves room.
PLOT_LIMIT: Final = 1e300


def text(v: object) -> str:
    """For matplotlib: control characters shown escaped, and `$` escaped (mathtext would read `$...$` in a
    value as a formula)."""
    return escape(str(v)).replace("$", r"\$")


def shown(v: Any, width: int = 40) -> str:
    """A value's text, cut for a note, a tick or a legend (an integer of 400 digits is a valid point value)."""
    t = escape(str(v))
    return t if len(t) <= width else t[:width - 3] + "..."


def legend_label(label: str) -> str:
    """matplotlib before 3.7 (Debian 12's 3.6) leaves out of a legend every label that starts with "_", even
    one given outright, and an axis may be named `_tp`: a space first keeps it."""
    return " " + label if label.startswith("_") else label


def number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)  # True is a category ("true"), not 1


def plottable(v: Any) -> float | None:
    """`v` as a plot's coordinate, or None: a number within ±PLOT_LIMIT (an integer beyond any float, an
    infinity, a NaN and ±1.7e308 are not)."""
    if not number(v):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) and abs(f) <= PLOT_LIMIT else None


def svg(fig: Any, *, tight: bool = True) -> str:
    """The figure as an SVG document, the same for the same figure (no date; svg.hashsalt set by html.py).
    `tight`: cropped to what is drawn (a legend outside the axes kept), at the price of drawing it twice; a
    grid() lays itself out instead."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight" if tight else None, metadata={"Date": None})
    return buf.getvalue()


def integral(values: Iterable[float]) -> bool:
    """Every value a whole number (and there is one)."""
    got = list(values)
    return bool(got) and all(float(v).is_integer() for v in got)


def integer_ticks(ax: Any, xs: Iterable[float] = (), ys: Iterable[float] = (), *, nbins: int | None = None) -> None:
    """Integer ticks on each axis whose plotted values are all integers (an axis of categories, given its
    ticks outright, is passed no values). `nbins`: at most that many ticks on both axes, whole or not (a small
    multiple's: its ticks are most of its drawing time, and a small panel cannot show more)."""
    from matplotlib.ticker import MaxNLocator

    for axis, values in ((ax.xaxis, xs), (ax.yaxis, ys)):
        whole = integral(values)
        if whole or nbins is not None:
            axis.set_major_locator(MaxNLocator(nbins=nbins or "auto", integer=whole))


def legend(ax: Any, handles: Sequence[Any], labels: Sequence[str], *, fontsize: float = 7) -> Any:
    """The legend, given outright (an automatic one drops "_" labels): inside the axes up to LEGEND_INSIDE
    entries, else outside on the right, where bbox_inches="tight" keeps it in the SVG."""
    labels = [legend_label(lb) for lb in labels]
    if len(labels) <= LEGEND_INSIDE:
        return ax.legend(handles, labels, fontsize=fontsize, loc="best")
    return ax.legend(handles, labels, fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                     borderaxespad=0.0)


def panels(keys: Sequence[tuple[str, ...]]) -> list[tuple[str, list[tuple[str, ...]]]]:
    """Small multiples for more than MAX_CONFIGURATIONS lines (each key a line's `name=value` words, the
    first axis first): one panel per value of the first axis when that makes 2 to MAX_PANELS panels of at
    most LEGEND_INSIDE lines each, else one panel per line. (title, its lines), in the lines' order."""
    by_first: dict[str, list[tuple[str, ...]]] = {}
    for k in keys:
        by_first.setdefault(k[0] if k else "all", []).append(k)
    if 2 <= len(by_first) <= MAX_PANELS and all(len(g) <= LEGEND_INSIDE for g in by_first.values()) \
            and all(len(k) > 1 for k in keys):
        return list(by_first.items())
    return [(" ".join(k) or "all", [k]) for k in keys]


def grid(mpl: Any, n: int, *, width: float = 2.6, height: float = 2.0) -> tuple[Any, list[Any]]:
    """A figure of `n` small plots sharing both axes, PANEL_COLUMNS to a row: (figure, the n axes); the
    grid's unused cells are hidden."""
    cols = min(PANEL_COLUMNS, n)
    rows = -(-n // cols)
    w, h = width * cols + 0.6, height * rows + 0.4
    fig = mpl(figsize=(w, h))
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    # laid out here, in inches, not by svg(tight=True): that draws the whole grid twice to measure it
    fig.subplots_adjust(left=0.75 / w, right=1 - 0.15 / w, bottom=0.6 / h, top=1 - 0.6 / h, wspace=0.15,
                        hspace=0.55)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    for ax in flat[:n]:
        ax.tick_params(labelsize=6)
        ax.xaxis.set_tick_params(labelbottom=True)  # every panel labelled: a hidden last row leaves gaps
    return fig, flat[:n]
