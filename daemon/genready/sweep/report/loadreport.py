"""`sweep report`'s load search section (issue 39 §3): what each configuration's `[search]` ran and found.

Read from a results folder as searchrun.py wrote it: each step's ok results lines (`search_step`, `search_rate`,
`search_concurrency`) and their `{out}/bench.jsonl` lines (offered and achieved rate, output tokens/s, goodput,
`saturated`, the `slo`), and DIR/search.jsonl's found line per configuration (`saturation_rate`,
`max_rate_under_slo`; `crossover` and `crossover_status` where the search had a baseline). A configuration is
a folder's point, on its last search's fingerprint (the steps of an earlier plan for the same point are not
its own). `table()` is the table and markdown reports' lines; `html_section()` the page's plots: throughput and achieved
rate against the offered load (the search's axis) with the saturation point marked, goodput against it with
the SLO written on the plot, and a bar per configuration of what its search found beside its crossover. They
follow the page's plot rules (sweep/report/plotrules.py): integer ticks on an axis of whole numbers (concurrencies),
the legend outside the axes past plotrules.LEGEND_INSIDE lines.
Nothing here raises on a field of the wrong type: such a value is left out, and the page says which.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from genready.redact import escape
from genready.store.bounded import FileError
from genready.sweep import search
from genready.sweep.files import RESULTS_FILE, SEARCH_FILE, bench_line, numbered_lines
from genready.sweep.report import plotrules
from genready.sweep.report.collect import Read
from genready.sweep.report.decision import finite_number as number  # one reading of a number from a line
from genready.sweep.rows import label_of
from genready.tools import benchline
from genready.web import htmlpage

# Per step, what the plots draw (each bench line field's key and title). achieved_rate falls back to
# requests_per_second (a bench client before issue 39's load fields wrote only that).
THROUGHPUT: Final = benchline.OUTPUT_TOKENS_PER_SECOND
ACHIEVED: Final = benchline.ACHIEVED_RATE
GOODPUT: Final = benchline.GOODPUT
MAX_CONFIGS: Final = plotrules.MAX_CONFIGURATIONS  # configurations per plot: past that, no one tells them apart


@dataclass
class Step:
    """One search step over its ok repeats: its load on the search's axis (`closed`: a closed-loop step of a
    rate search, placed at the rate it achieved), each figure's (median, min, max), `saturated` if any repeat
    was (as searchrun.outcome judges it)."""

    index: int
    kind: str
    load: Any  # a number, or the odd value a line held (left out of the plots, named)
    closed: bool = False
    figures: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    odd: dict[str, Any] = field(default_factory=dict)  # figures whose value is no plottable number
    saturated: bool | None = None


@dataclass
class Search:
    """One configuration's search: its label, its steps in order, its found line (None: the search never
    ended), the SLO it ran under (text, None without one)."""

    label: str
    folder: Path
    index: Any  # its point's number (a line's `index`)
    baseline: bool
    mode: str
    axis: str
    steps: list[Step]
    found: dict[str, Any] | None
    slo: str | None

    @property
    def unit(self) -> str:
        return "concurrent requests" if self.axis == str(search.Axis.CONCURRENCY) else "req/s"

    @property
    def found_key(self) -> str:
        return "max_rate_under_slo" if self.mode == str(search.Mode.SLO) else "saturation_rate"

    def value(self, key: str) -> Any:
        return None if self.found is None else self.found.get(key)

    def saturation_point(self) -> tuple[Any, str] | None:
        """Where it saturated, and from what: the found `saturation_rate`, else the first step the bench
        client called saturated; None when no step did."""
        if (v := self.value("saturation_rate")) is not None:
            return v, "saturation_rate"
        first = next((s for s in self.steps if s.saturated is True), None)
        return None if first is None else (first.load, f"step {first.index}, the first saturated")


def num_text(v: Any) -> str:
    """A found value for text: 3 significant digits (whole from 1000); "-" for none; any other value cut to 40
    characters."""
    if v is None:
        return "-"
    f = number(v)
    if f is not None:
        return f"{f:.0f}" if 1000 <= abs(f) < 1e15 else f"{f:.3g}"  # 5000, not 5e+03
    t = str(v)
    return t if len(t) <= 40 else t[:37] + "..."


def slo_text(v: Any) -> str | None:
    """A bench line's `slo` ({"ttft_p99_ms": 500.0, ...}) or a plan's `slo` text as `ttft_p99_ms=500, ...`."""
    if isinstance(v, str) and v.strip():
        return ", ".join(p.strip() for p in v.split(","))
    if isinstance(v, Mapping) and v:
        return ", ".join(f"{k}={num_text(x)}" for k, x in v.items())
    return None


def _key(v: Any) -> str:
    try:
        return json.dumps(v, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return repr(v)


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        return [rec for _, rec in numbered_lines(path, warn=False)]
    except FileError:
        return []  # a file that cannot be read holds no search: the table report warns about results.jsonl


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def searches(folders: Sequence[Path], read: Read | None = None) -> list[Search]:
    """Every configuration's search over `folders`, in the order their points ran; [] when none has one.
    `read`: the report's own read of those folders' results lines (collect.read_folders), not decoded again."""
    out: list[Search] = []
    results = {folder: [rec for _, rec in lines] for folder, _, lines in read or ()}
    for folder in folders:
        found: dict[str, dict[str, Any]] = {}
        for rec in _lines(folder / SEARCH_FILE):
            found[_point_key(rec)] = rec  # the last search of a point is its search
        runs: dict[str, list[dict[str, Any]]] = {}
        for rec in results[folder] if folder in results else _lines(folder / RESULTS_FILE):
            if _int(rec.get("search_step")) is not None:
                runs.setdefault(_point_key(rec), []).append(rec)
        for key in dict.fromkeys([*runs, *found]):
            out.append(_search(folder, found.get(key), runs.get(key, [])))
    labels = Counter(s.label for s in out)
    for s in out:
        if labels[s.label] > 1:  # the same point in two folders, or a baseline searched each round
            where = f"{s.folder.name or s.folder}, " if len(folders) > 1 else ""
            s.label += f" [{where}point {num_text(s.index)}]"
    return out


def _point_key(rec: Mapping[str, Any]) -> str:
    # A point's number with its values: a baseline run may hold a plan point's values (collect.rows_from), and
    # its number is past the plan's in its results lines and its found line alike (searchrun writes both).
    return _key([rec.get("index"), rec.get("point")])


def _search(folder: Path, found: dict[str, Any] | None, runs: list[dict[str, Any]]) -> Search:
    fp = (found or {}).get("fingerprint", runs[-1].get("fingerprint") if runs else None)
    runs = [r for r in runs if _key(r.get("fingerprint")) == _key(fp)]  # this search's steps, not an older plan's
    spec = fp.get("search") if isinstance(fp, dict) else None
    spec = spec if isinstance(spec, dict) else {}
    first: dict[str, Any] = found or (runs[0] if runs else {})
    mode, axis = str((found or {}).get("mode", spec.get("mode", ""))), str((found or {}).get("axis",
                                                                                        spec.get("axis", "rate")))
    by_step: dict[int, dict[int, tuple[dict[str, Any], dict[str, Any]]]] = {}
    for r in runs:
        if r.get("status") != "ok" or not isinstance(r.get("out"), str):
            continue
        try:
            line = bench_line(folder / r["out"])
        except FileError:
            line = None
        if line is not None:
            step, rep = _int(r.get("search_step")), _int(r.get("repeat")) or 1
            assert step is not None
            by_step.setdefault(step, {})[rep] = (r, line)  # a repeat run again (--resume): its last line
    steps = [_step(axis, i, list(reps.values())) for i, reps in sorted(by_step.items())]
    slo = next((t for _, reps in sorted(by_step.items()) for _, b in reps.values()
                if (t := slo_text(b.get(benchline.SLO.key)))), None) or slo_text(spec.get("slo"))
    base = bool(first.get("baseline")) or any(r.get("baseline") for r in runs)
    return Search(("baseline " if base else "") + label_of(first.get("point")), folder, first.get("index"), base, mode,
                  axis, steps, found, slo)


def _step(axis: str, index: int, reps: list[tuple[dict[str, Any], dict[str, Any]]]) -> Step:
    rec, line = reps[0]
    s = Step(index, str(rec.get("search_kind", "")), None)
    for key in (THROUGHPUT.key, ACHIEVED.key, GOODPUT.key):
        raw = [b.get(key) if key != ACHIEVED.key or b.get(key) is not None else b.get(benchline.REQUESTS_PER_SECOND.key)
               for _, b in reps]
        vals = [number(v) for v in raw if v is not None]
        if any(v is None for v in vals):
            s.odd[key] = next(v for v in raw if v is not None and number(v) is None)
        elif vals:
            good = [v for v in vals if v is not None]
            s.figures[key] = (statistics.median(good), min(good), max(good))
    sat = [b.get(benchline.SATURATED.key) for _, b in reps]
    s.saturated = True if any(x is True for x in sat) else (False if all(x is False for x in sat) else None)
    if axis == str(search.Axis.CONCURRENCY):
        s.load = rec.get("search_concurrency", line.get(benchline.CONCURRENCY.key))
    else:
        s.load = rec.get("search_rate", line.get(benchline.OFFERED_RATE.key))
        if s.load is None:  # a closed-loop step (synchronous, throughput): at the rate it achieved
            s.closed = True
            s.load = s.figures[ACHIEVED.key][0] if ACHIEVED.key in s.figures else None
    return s


# --- the text report --------------------------------------------------------------------------------

def crossover_text(s: Search) -> str:
    """The crossover against the baseline in words ("" without one): `≈` where it was interpolated."""
    status, v = s.value("crossover_status"), s.value("crossover")
    if s.baseline or (status in (None, "no_baseline") and v is None):
        return ""
    if status == "pays_throughout":
        return "speculation pays at every load searched (no crossover)"
    if status == "never_pays":
        return "speculation never pays (slower than the baseline at every load searched)"
    if status == "within_noise":
        return "speculation neither pays nor loses (within the plan's noise_limit at every load searched)"
    approx = "≈" if status == "interpolated" else ""
    why = " (interpolated between steps)" if status == "interpolated" else \
        "" if status is None else f" ({num_text(status)})"
    return f"crossover {approx}{num_text(v)} {s.unit}{why}"


def sentences(got: Sequence[Search]) -> list[str]:
    """Per configuration, in words: what its last search found, and its crossover against the baseline."""
    out = []
    for s in got:
        if s.found is None:
            out.append(f"{s.label}: no found line, {len(s.steps)} steps run (the search did not end)")
            continue
        if s.mode == str(search.Mode.SLO):
            what = f"max_rate_under_slo {num_text(s.value('max_rate_under_slo'))} {s.unit}"
        else:
            what = f"saturation between {num_text(s.value('last_unsaturated_rate'))} and " \
                   f"{num_text(s.value('first_saturated_rate'))} req/s (saturation_rate " \
                   f"{num_text(s.value('saturation_rate'))})"
        tail = "" if s.found.get("complete", True) else f" (stopped: {num_text(s.found.get('reason', '?'))})"
        cross = crossover_text(s)
        out.append(f"{s.label}: {what} in {num_text(s.found.get('steps', '?'))} steps{tail}"
                   + (f"; {cross}" if cross else ""))
    return [escape(t).replace("\t", " ") for t in out]  # a value's control characters shown, never run


def table(folders: Sequence[Path], fmt: str = "table", read: Read | None = None) -> str:
    """`sweep report`'s search section in the table format (or `fmt` "markdown": a list), a line per
    configuration ("" when no folder has a search). `read` as searches()."""
    got = sentences(searches(folders, read))
    if not got:
        return ""
    if fmt == "markdown":
        return "\n**Load search** (DIR/search.jsonl):\n\n" + "".join(f"- {t}\n" for t in got)
    return "search (DIR/search.jsonl):\n" + "".join(f"  {t}\n" for t in got)


# --- the HTML page's section -------------------------------------------------------------------------

Left = list[tuple[str, str]]  # (what, why): a value a plot leaves out, named under it (html.left_out_note)
# The plots share the html page's plot conventions (plotrules: plottable, shown, text, svg) rather than copy
# them; the html module itself is imported only when a page is written (matplotlib's module, and it may not
# be imported by this one at its top: it imports this one).


def html_section(folders: Sequence[Path], read: Read | None = None) -> str:
    """The page's "Load search" section ("" when no folder has a search): a plot each of throughput, goodput
    and the found values with the crossover, every value a plot cannot show named under it. html.NoMatplotlib
    without matplotlib. `read` as searches()."""
    got = searches(folders, read)
    if not got:
        return ""
    from genready.sweep.report import html  # matplotlib's module, imported only when a page is written

    mpl, e = html.figure_class(), htmlpage.text
    parts = []
    for pid, what, draw in (("load-throughput", "Throughput against the offered load", _throughput_plot),
                            ("load-goodput", "Goodput against the offered load", _goodput_plot),
                            ("load-found", "What each search found, and the crossover", _found_plot)):
        for n, (title, svg, left, note) in enumerate(draw(mpl, got)):
            image = htmlpage.data_image(svg, title or what) if svg else ""
            notes = f'<p class="note">{e(note)}</p>' if note else ""
            ident = f"{pid}-{n + 1}" if n else pid  # a plot per search axis: ids stay unique
            parts.append(f'<div class="plot" id="{ident}"><h3>{e(title or what)}</h3>{image}{notes}'
                         f"{html.left_out_note(left)}</div>")
    more = f" (the plots show the first {MAX_CONFIGS} of {len(got)})" if len(got) > MAX_CONFIGS else ""
    items = "".join(f"<li>{e(t)}</li>" for t in sentences(got))
    return (f'<h2 id="load-search">Load search</h2><p>{len(got)} configuration{"s" if len(got) != 1 else ""} '
            f"searched ({e(', '.join(sorted({s.mode or '?' for s in got})))}){e(more)}:</p><ul>{items}</ul>"
            f'<div class="plots">{"".join(parts)}</div>')


def _series(s: Search, key: str, title: str, left: Left
            ) -> list[tuple[float, float, float, float, Step]]:
    """(load, median, min, max, step) of figure `key` per step that has it, by load; the rest named in `left`."""
    pts = []
    for st in s.steps:
        what = f"{s.label} step {st.index}"
        if key in st.odd:
            left.append((what, f"{title} = {plotrules.shown(st.odd[key])}"))
            continue
        if key not in st.figures:
            continue
        x = plotrules.plottable(st.load)
        ys = [y for y in map(plotrules.plottable, st.figures[key]) if y is not None]
        if x is None:
            left.append((what, f"load = {plotrules.shown(st.load)}" if st.load is not None
                         else "a closed-loop step without an achieved rate"))
        elif len(ys) < len(st.figures[key]):
            left.append((what, f"{title} = {plotrules.shown(st.figures[key][0])}"))
        else:
            pts.append((x, ys[0], ys[1], ys[2], st))
    return sorted(pts, key=lambda p: p[0])


def _label(text: str) -> str:
    # matplotlib before 3.7 (Debian 12's 3.6) leaves out of a legend a label that starts with "_" (html.py)
    t = str(plotrules.text(plotrules.shown(text, 60)))
    return " " + t if t.startswith("_") else t


def _axis_title(got: Sequence[Search]) -> str:
    axes = {s.axis for s in got}
    if axes == {str(search.Axis.CONCURRENCY)}:
        return "concurrency (requests in flight)"
    return "offered rate req/s" if len(axes) == 1 else "offered load (req/s, or concurrency on that axis)"


def _legend(ax: Any) -> None:
    """The axes' legend by plotrules: outside the axes past LEGEND_INSIDE lines."""
    handles, labels = ax.get_legend_handles_labels()
    plotrules.legend(ax, handles, labels)


def _draw(ax: Any, got: Sequence[Search], key: str, title: str, left: Left
          ) -> tuple[list[float], list[float]]:
    """One line per search through its steps at an offered load (error bars: min to max over repeats), its
    closed-loop steps hollow marks off the line (they offered no rate), saturated steps crossed; the x and y
    values drawn (none: nothing was), for plotrules.integer_ticks."""
    xs: list[float] = []
    ys: list[float] = []
    marked = False
    for i, s in enumerate(got[:MAX_CONFIGS]):
        pts = _series(s, key, title, left)
        if not pts:
            continue
        c, label = f"C{i % 10}", _label(s.label)
        xs += [p[0] for p in pts]
        ys += [v for p in pts for v in p[1:4]]
        line = [p for p in pts if not p[4].closed]
        if line:
            err = [[p[1] - p[2] for p in line], [p[3] - p[1] for p in line]]
            ax.errorbar([p[0] for p in line], [p[1] for p in line], yerr=err if any(any(x) for x in err) else None,
                        marker="o", capsize=3, color=c, label=label)
        closed = [p for p in pts if p[4].closed]
        if closed:
            ax.scatter([p[0] for p in closed], [p[1] for p in closed], s=36, facecolors="white", edgecolors=c,
                       zorder=3, label=None if line else label)
        sat = [p for p in pts if p[4].saturated is True]
        if sat:
            ax.scatter([p[0] for p in sat], [p[1] for p in sat], marker="x", s=70, color="red", zorder=4,
                       label=None if marked else "saturated step")
            marked = True
    return xs, ys


def _throughput_plot(mpl: Any, got: Sequence[Search]) -> list[tuple[str, str | None, Left, str]]:
    """OUT tok/s (above) and the achieved rate (below) against the load, the saturation point a dotted line."""
    left: Left = []
    fig = mpl(figsize=(6.4, 6.0))
    top, bottom = fig.subplots(2, 1, sharex=True)
    tx, ty = _draw(top, got, THROUGHPUT.key, THROUGHPUT.title, left)
    bx, by = _draw(bottom, got, ACHIEVED.key, ACHIEVED.title, left)
    if not tx and not bx:
        return [("", None, left, "")] if left else []
    for i, s in enumerate(got[:MAX_CONFIGS]):
        sp = s.saturation_point()
        if sp is None:
            continue
        x = plotrules.plottable(sp[0])
        if x is None:
            left.append((s.label, f"saturation point ({sp[1]}) = {plotrules.shown(sp[0])}"))
            continue
        tx.append(x)
        for ax in (top, bottom):
            ax.axvline(x, color=f"C{i % 10}", linestyle=":", linewidth=1.5,
                       label=_label(f"{s.label}: saturation ≈ {num_text(x)}") if ax is top else None)
    if all(s.axis == str(search.Axis.RATE) for s in got):
        lo, hi = bottom.get_xlim()
        bottom.plot([max(lo, 0), hi], [max(lo, 0), hi], color="grey", linestyle="--", linewidth=0.8,
                    label="achieved = offered")
        bottom.set_xlim(lo, hi)
        _legend(bottom)
    top.set_ylabel(THROUGHPUT.title)
    bottom.set_ylabel(ACHIEVED.title)
    bottom.set_xlabel(_axis_title(got))
    for ax, ys in ((top, ty), (bottom, by)):
        ax.grid(alpha=0.3)
        plotrules.integer_ticks(ax, tx + bx, ys)  # the two share their x axis: its values are both plots'
    _legend(top)
    note = ("Hollow marks: closed-loop steps (synchronous, throughput), which offer no rate, placed at the rate "
            "they achieved. "
            if any(st.closed for s in got for st in s.steps) else "") + \
        "Red crosses: steps the bench client called saturated. Dotted lines: each configuration's saturation point."
    return [("", plotrules.svg(fig), left, note)]


def _goodput_plot(mpl: Any, got: Sequence[Search]) -> list[tuple[str, str | None, Left, str]]:
    """Goodput against the load under the SLO (written on the plot), max_rate_under_slo a dashed line."""
    left: Left = []
    fig = mpl(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    xs, ys = _draw(ax, got, GOODPUT.key, GOODPUT.title, left)
    if not xs:
        if left:
            return [("", None, left, "")]
        return [("", None, [], "No step has a goodput: the searches ran without an SLO (the plan's "
                 "[search] slo, the bench client's --slo).")]
    for i, s in enumerate(got[:MAX_CONFIGS]):
        v = s.value("max_rate_under_slo")
        if v is None:
            continue
        x = plotrules.plottable(v)
        if x is None:
            left.append((s.label, f"max_rate_under_slo = {plotrules.shown(v)}"))
        else:
            xs.append(x)
            ax.axvline(x, color=f"C{i % 10}", linestyle="--", linewidth=1.2,
                       label=_label(f"{s.label}: max under SLO {num_text(x)}"))
    slos = list(dict.fromkeys(s.slo for s in got if s.slo))
    ax.set_title(plotrules.text("SLO: " + ("; ".join(slos) if slos else "not recorded")), fontsize=9)
    ax.set_xlabel(_axis_title(got))
    ax.set_ylabel(GOODPUT.title)
    ax.grid(alpha=0.3)
    plotrules.integer_ticks(ax, xs, ys)
    _legend(ax)
    return [("", plotrules.svg(fig), left, "")]


def _bar_text(v: float | None, found: Any) -> str:
    return num_text(v) if v is not None else ("none found" if found is None else "?")


def _found_plot(mpl: Any, got: Sequence[Search]) -> list[tuple[str, str | None, Left, str]]:
    """Per search axis, a bar per configuration of what its search found (max_rate_under_slo, or the
    saturation rate), and beside it, hatched, its crossover against the baseline (`≈`: interpolated)."""
    out: list[tuple[str, str | None, Left, str]] = []
    for axis in dict.fromkeys(s.axis for s in got):
        group = [s for s in got if s.axis == axis and s.found is not None][:MAX_CONFIGS]
        if not group:
            continue
        left: Left = []
        unit = group[0].unit
        keys = sorted({s.found_key for s in group})
        crossing = any(s.value("crossover") is not None or s.value("crossover_status") not in (None, "no_baseline")
                       for s in group if not s.baseline)
        fig = mpl(figsize=(6.4, 4.0))
        ax = fig.add_subplot()
        width = 0.4 if crossing else 0.6
        pos = list(range(len(group)))
        vals, texts, heights = [], [], []  # heights: the bars drawn (a missing value is a bar of 0, not drawn)
        for s in group:
            raw = s.value(s.found_key)
            v = plotrules.plottable(raw)
            if raw is not None and v is None:
                left.append((s.label, f"{s.found_key} = {plotrules.shown(raw)}"))
            vals.append(v or 0.0)
            heights += [v] if v is not None else []
            texts.append(str(plotrules.text(_bar_text(v, raw))))
        bars = ax.bar([p - width / 2 if crossing else p for p in pos], vals, width, color="C0",
                      label=" / ".join(keys))
        ax.bar_label(bars, labels=texts, fontsize=7)
        if crossing:
            cvals, ctexts = [], []
            for s in group:
                v, text = _crossover_bar(s, left)
                cvals.append(v or 0.0)
                heights += [v] if v is not None else []
                ctexts.append(str(plotrules.text(text)))
            cb = ax.bar([p + width / 2 for p in pos], cvals, width, color="C1", hatch="//",
                        label="crossover (speedup over the baseline falls below 1)")
            ax.bar_label(cb, labels=ctexts, fontsize=7)
        ax.set_xticks(pos, [_label(s.label) for s in group], rotation=20, ha="right", fontsize=7)
        ax.set_ylabel(f"{'concurrency' if unit != 'req/s' else 'offered rate req/s'}")
        ax.margins(y=0.15)
        ax.grid(alpha=0.3, axis="y")
        plotrules.integer_ticks(ax, ys=heights)  # x: the configurations, given their ticks outright
        _legend(ax)
        title = f"{' / '.join(keys)} per configuration ({unit})" + (" and the crossover" if crossing else "")
        note = "≈: a crossover interpolated between two steps, not a step's own load." if any(
            s.value("crossover_status") == "interpolated" for s in group) else ""
        out.append((title, plotrules.svg(fig), left, note))
    return out


def _crossover_bar(s: Search, left: Left) -> tuple[float | None, str]:
    """A configuration's crossover bar: (its height, None for none; its label)."""
    if s.baseline:
        return None, "baseline"
    status, raw = s.value("crossover_status"), s.value("crossover")
    if status == "pays_throughout":
        return None, "pays throughout"
    if status == "never_pays":
        return None, "never pays"
    if status == "within_noise":
        return None, "within noise"
    if raw is None:
        return None, "-" if status in (None, "no_baseline") else plotrules.shown(status)
    v = plotrules.plottable(raw)
    if v is None:
        left.append((s.label, f"crossover = {plotrules.shown(raw)}"))
        return None, "?"
    return v, ("≈" if status == "interpolated" else "") + num_text(v)
