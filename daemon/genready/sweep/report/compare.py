"""`genready sweep report A B --compare`: did this change help? The same points of two sweeps side by side.

Points are matched by their plan values. For each figure: A's value, B's, and the change in % of A's,
better or worse by the figure's direction. A change no larger than the noise is marked as inside
it (`~`): the noise is the larger relative median absolute deviation of the two sides' repeats, or,
without repeats, the plan's noise_limit (a difference of one run against one run says no more).
With a baseline on either side, a SPEEDUP column: each side's speedup over its own baseline with its 95 %
interval (speedup.py), and the change; a change whose two intervals overlap is no real change, marked `~` (without
intervals on either side, within the plan's noise_limit, as the figures).
Text (a table) or HTML (one self-contained page through web/htmlpage, no plots: it needs no matplotlib).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from genready.redact import escape
from genready.sweep.noise import Ratio
from genready.sweep.report.table import with_baseline
from genready.sweep.rows import FIGURES, Figure, Row
from genready.web import htmlpage

COMPARED: Final = tuple(f for f in FIGURES if f.ranked)
SPEEDUP_NOTE: Final = ("(SPEEDUP: each side's output tok/s over its own baseline's, [95 % interval]; the change in % "
                       "of A's; ~ the two intervals overlap: not a real change)")


@dataclass(frozen=True)
class Change:
    a: float | None
    b: float | None
    pct: float | None  # (b - a) / |a|, in %
    noise_pct: float  # the band a change must leave to count
    better: bool | None  # None: no change to judge, or inside the noise

    @property
    def inside_noise(self) -> bool:
        return self.pct is not None and abs(self.pct) <= self.noise_pct


def change(f: Figure, ra: Row | None, rb: Row | None) -> Change:
    a = (ra.figures or {}).get(f.key) if ra is not None and ra.status == "ok" else None
    b = (rb.figures or {}).get(f.key) if rb is not None and rb.status == "ok" else None
    spreads = [r.spread[f.key].rmad for r in (ra, rb) if r is not None and f.key in r.spread]
    limits = [r.noise_limit for r in (ra, rb) if r is not None]
    noise = 100 * (max(spreads) if spreads else max(limits, default=0.10))
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or a == 0:
        return Change(a, b, None, noise, None)
    pct = 100 * (b - a) / abs(a)
    better = None if abs(pct) <= noise else (pct > 0) == f.higher_is_better
    return Change(a, b, pct, noise, better)


@dataclass(frozen=True)
class SpeedupChange:
    """A point's speedup over its sweep's baseline in A and in B (None: none there)."""

    a: Ratio | None
    b: Ratio | None
    noise_limit: float

    @property
    def pct(self) -> float | None:
        return None if self.a is None or self.b is None else 100 * (self.b.value - self.a.value) / self.a.value

    @property
    def inside_noise(self) -> bool:
        """The two 95 % intervals overlap (a side without one counts as its value); with no interval on either
        side, the change is within the noise_limit."""
        if self.a is None or self.b is None or self.pct is None:
            return False
        a, b = self.a, self.b
        if a.low is None and b.low is None:
            return abs(self.pct) <= 100 * self.noise_limit
        a_lo, a_hi = (a.low, a.high) if a.low is not None and a.high is not None else (a.value, a.value)
        b_lo, b_hi = (b.low, b.high) if b.low is not None and b.high is not None else (b.value, b.value)
        return a_lo <= b_hi and b_lo <= a_hi

    @property
    def better(self) -> bool | None:
        return None if self.pct is None or self.inside_noise else self.pct > 0


def speedup_change(ra: Row | None, rb: Row | None) -> SpeedupChange:
    a = ra.ratios.get("speedup") if ra is not None and ra.status == "ok" else None
    b = rb.ratios.get("speedup") if rb is not None and rb.status == "ok" else None
    return SpeedupChange(a, b, max((r.noise_limit for r in (ra, rb) if r is not None), default=0.10))


def _ratio(r: Ratio | None) -> str:
    if r is None:
        return "-"
    ci = f" [{r.low:.2f}-{r.high:.2f}]" if r.low is not None and r.high is not None else ""
    return f"{r.value:.2f}x" + (" slower" if r.value < 1 else "") + ci


def speedup_cell(ra: Row | None, rb: Row | None) -> str:
    """`2.01x [1.93-2.09] -> 2.50x [2.30-2.70] +24.4% better`; `~` when the intervals overlap."""
    if (ra is None or ra.baseline) and (rb is None or rb.baseline):
        return "baseline"
    c = speedup_change(ra, rb)
    text = f"{_ratio(c.a)} -> {_ratio(c.b)}"
    if c.pct is None:
        return text
    word = "~" if c.better is None else ("better" if c.better else "worse")
    return f"{text} {c.pct:+.1f}% {word}"


def _key(r: Row) -> str:
    if r.baseline:  # a baseline run may hold a plan point's very values: matched by its round, never with that point
        return json.dumps([r.point, r.baseline], sort_keys=True)
    return json.dumps(r.point, sort_keys=True) if r.point else r.label


def pairs(rows_a: Sequence[Row], rows_b: Sequence[Row]) -> list[tuple[str, Row | None, Row | None]]:
    """(label, A's row, B's row) for every point of either, A's order first, then B's own points."""
    by_b = {_key(r): r for r in rows_b}
    seen = set()
    out: list[tuple[str, Row | None, Row | None]] = []
    for r in rows_a:
        seen.add(_key(r))
        out.append((r.label, r, by_b.get(_key(r))))
    out += [(r.label, None, r) for r in rows_b if _key(r) not in seen]
    return out


def _num(v: float | None, digits: int) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def cell(f: Figure, c: Change) -> str:
    """`61.2 -> 58.8 -3.9% better`; `~` after a change inside the noise."""
    text = f"{_num(c.a, f.digits)} -> {_num(c.b, f.digits)}"
    if c.pct is None:
        return text
    word = "~" if c.better is None else ("better" if c.better else "worse")
    return f"{text} {c.pct:+.1f}% {word}"


def _status(ra: Row | None, rb: Row | None) -> str:
    return f"{ra.status if ra else 'absent'} / {rb.status if rb else 'absent'}"


def compared(rows: Sequence[Row]) -> list[Figure]:
    """The ranked figures, an optional one only when some point has it."""
    return [f for f in COMPARED if not f.optional or any((r.figures or {}).get(f.key) is not None for r in rows)]


def render_text(rows_a: Sequence[Row], rows_b: Sequence[Row], a: str, b: str) -> str:
    figures = compared([*rows_a, *rows_b])
    ratios = with_baseline([*rows_a, *rows_b])
    table = [["POINT", "STATUS A / B", *(f.title for f in figures), *(["SPEEDUP"] if ratios else [])]]
    for label, ra, rb in pairs(rows_a, rows_b):
        table.append([escape(label), escape(_status(ra, rb)), *(cell(f, change(f, ra, rb)) for f in figures),
                      *([speedup_cell(ra, rb)] if ratios else [])])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    text = "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in table)
    return (f"A: {escape(a)}\nB: {escape(b)}\n" + text +
            "(change in % of A; better/worse by the figure's direction; ~ inside the noise: the larger relative "
            "median absolute deviation of the two sides' repeats, else the plan's noise_limit)\n" +
            (SPEEDUP_NOTE + "\n" if ratios else ""))


def render_html(rows_a: Sequence[Row], rows_b: Sequence[Row], a: str, b: str) -> str:
    e = htmlpage.text
    figures = compared([*rows_a, *rows_b])
    ratios = with_baseline([*rows_a, *rows_b])
    head = "".join(f"<th>{e(h)}</th>" for h in ["point", "status A / B", *(f.title for f in figures),
                                                 *(["speedup"] if ratios else [])])
    body = []
    for label, ra, rb in pairs(rows_a, rows_b):
        cells = [f"<td>{e(label)}</td>", f"<td>{e(_status(ra, rb))}</td>"]
        for f in figures:
            c = change(f, ra, rb)
            cls = "noise" if c.inside_noise else {True: "better", False: "worse", None: ""}[c.better]
            cells.append(f'<td class="{cls}">{e(cell(f, c))}</td>')
        if ratios:
            sc = speedup_change(ra, rb)
            cls = "noise" if sc.inside_noise else {True: "better", False: "worse", None: ""}[sc.better]
            cells.append(f'<td class="{cls}">{e(speedup_cell(ra, rb))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    body_html = (f"<h1>genready sweep comparison</h1><p>A: {e(a)}<br>B: {e(b)}</p>"
                 f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
                 "<p>Change in % of A. Green better, red worse by the figure's direction; grey inside the noise (the "
                 "larger relative median absolute deviation of the two sides' repeats, else the plan's noise_limit)."
                 "</p>" + (f"<p>{e(SPEEDUP_NOTE[1:-1])}</p>" if ratios else ""))
    return htmlpage.REPORT.page("genready sweep comparison", body_html).html
