"""The report's category × configuration table (issue 37 §2): per prompt category, each point's accept length
and its speedup against the plan's baseline.

A point's bench line carries `categories` (the bench client's figures per prompt category: tools/benchfigures.py,
Summary.categories). `gather` keeps them per point over its ok repeats; `section` writes, for the table,
markdown and HTML reports, one table of accept length and, with a `baseline`, one of speedup, a row per point
and a column per category. A category's speedup is the point's per-category output tok/s over the baseline's
at the same client setting (the baseline round before the point, on the same host, as speedup.attach pairs
them), by the same ratio and 95 % interval over repeats (noise.ratio). The per-category tok/s is each
request's own speed (Σ tokens / Σ request seconds), since a run's categories share its wall time.

Nothing is written when no point has categories (random prompts, a dataset without them, bench lines from
before categories).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from genready.redact import escape
from genready.store import bounded
from genready.sweep import noise
from genready.sweep.files import category_figures
from genready.sweep.noise import Ratio
from genready.sweep.rows import Row
from genready.tools import benchline
from genready.web import htmlpage

TPS: Final = benchline.OUTPUT_TOKENS_PER_SECOND.key
ACCEPT: Final = benchline.ACCEPT_LENGTH.key


def gather(row: Row, lines: Iterable[tuple[dict[str, Any], Path, str]],
           bench_line: Callable[[Path], dict[str, Any] | None]) -> None:
    """row.categories from its results lines' bench lines (`bench_line`: collect's, which reads each once), else
    from the results line's own copy (a folder whose {out} folders were not kept): per category and figure, the
    values over the ok repeats. A bench line that cannot be read is the row's to say (rows.row_of), not again."""
    for rec, folder, _ in lines:
        out = rec.get("out")
        if rec.get("status") != "ok" or not isinstance(out, str):
            continue
        try:
            line = bench_line(folder / out)
        except bounded.FileError:
            continue
        cats = (line or {}).get(benchline.CATEGORIES.key)
        for name, figures in category_figures(cats if isinstance(cats, dict) else rec.get("categories")).items():
            kept = row.categories.setdefault(name, {})
            for key, v in figures.items():
                kept.setdefault(key, []).append(v)


def _key(host: str, round_: int | None, client: dict[str, Any] | None) -> str:
    return json.dumps([host, round_, client], sort_keys=True)


def speedups(rows: Sequence[Row]) -> dict[int, dict[str, Ratio]]:
    """Per row (by position in `rows`), per category: its output tok/s over its baseline's (speedup.attach's
    pairing: the baseline round before it, same host and client setting); only where both sides have runs."""
    bases = {_key(r.host, r.baseline, r.client): r for r in rows if r.baseline and r.status == "ok"
             and r.client is not None}
    out: dict[int, dict[str, Ratio]] = {}
    for i, r in enumerate(rows):
        if r.baseline or r.status != "ok" or r.client is None or not r.baseline_round:
            continue
        base = bases.get(_key(r.host, r.baseline_round, r.client))
        if base is None:
            continue
        for name, figures in r.categories.items():
            got = noise.ratio(figures.get(TPS, []), base.categories.get(name, {}).get(TPS, []),
                              loads=r.noise.loads(TPS) if r.noise is not None else None)
            if got is not None:
                out.setdefault(i, {})[name] = got
    return out


def _median(values: Sequence[float] | None) -> float | None:
    return statistics.median(values) if values else None


def accept_text(r: Row, name: str) -> str:
    """An accept-length cell: the median over the repeats, `-` without one."""
    v = _median(r.categories.get(name, {}).get(ACCEPT))
    return "-" if v is None else f"{v:.2f}"


def ratio_text(got: Ratio | None, noise_limit: float) -> str:
    """A speedup cell: `1.52x [1.31-1.77]`, `slower` below 1, `~` within the noise (as report.ratio_text)."""
    if got is None:
        return "-"
    text = f"{got.value:.2f}x" + (" slower" if got.value < 1 else "")
    if got.low is not None and got.high is not None:
        text += f" [{got.low:.2f}-{got.high:.2f}]"
    return text + (" ~" if got.within_noise(noise_limit) else "")


def _grids(rows: Sequence[Row]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, cells) of each table: accept length (where some point has one: a server's answers may
    carry no per-request counts, and the baseline none), then (with a baseline) speedup."""
    shown = [r for r in rows if r.categories]
    names = sorted({n for r in shown for n in r.categories})
    grids = []
    if any(c.get(ACCEPT) for r in shown for c in r.categories.values()):
        grids.append(("accept length per prompt category (median over the repeats)", ["POINT", *names],
                      [[r.label, *(accept_text(r, n) for n in names)] for r in shown]))
    if any(r.baseline for r in rows):
        ratios = speedups(rows)
        index = {id(r): i for i, r in enumerate(rows)}
        body = []
        for r in shown:
            got = ratios.get(index[id(r)], {})
            body.append([r.label, *("baseline" if r.baseline else ratio_text(got.get(n), r.noise_limit)
                                    for n in names)])
        grids.append(("speedup per prompt category (the category's output tok/s per request / the baseline's at "
                      "the same client settings; [95 % interval over the repeats]; ~ within the noise)",
                      ["POINT", *names], body))
    return grids


def section(rows: Sequence[Row], fmt: str) -> str:
    """The category tables in `fmt` ("table" or "markdown"); "" when no row has categories."""
    if not any(r.categories for r in rows):
        return ""
    out = []
    for title, head, body in _grids(rows):
        cells = [[escape(c) for c in r] for r in [head, *body]]  # names come from the prompt files
        if fmt == "markdown":
            out.append(f"\n**{title}**\n\n" + "".join("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |\n"
                                                     for r in [cells[0], ["---"] * len(head), *cells[1:]]))
        else:
            # Indented: a script that finds a point's row of the points' table by its label finds only that one
            widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
            out.append(f"\n{title}:\n" + "".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                                                 .rstrip() + "\n" for r in cells))
    return "".join(out)


def html_section(rows: Sequence[Row]) -> str:
    """The category tables for the HTML report (a <h2> and a table each); "" when no row has categories. A
    speedup within the noise is orange (class noisy), as in the points' table."""
    grids = _grids(rows) if any(r.categories for r in rows) else []
    if not grids:
        return ""
    e = htmlpage.text
    out = ['<h2 id="categories">Per prompt category</h2>']
    for title, head, body in grids:
        rows_html = "".join("<tr>" + "".join(f'<td class="{"noisy" if c.endswith(" ~") else ""}">{e(c)}</td>'
                                             for c in r) + "</tr>" for r in body)
        out.append(f"<h3>{e(title)}</h3><table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in head)
                   + f"</tr></thead><tbody>{rows_html}</tbody></table>")
    return "".join(out)
