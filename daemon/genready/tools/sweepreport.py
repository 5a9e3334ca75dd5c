"""The sweep's results as one table: the summary at the end of a sweep, and `genready sweep report`.

A row is one point of a plan: its last attempt in DIR/results.jsonl (an `ok` one if there is
one), and, when the point's command wrote `{out}/bench.jsonl` (the bench client's `--output`),
the figures a speculative-decoding sweep compares: accept length, output tokens/s, TTFT p50 and
ITL p50. `report` merges several results folders (the shards of one plan, run on several hosts)
into one table in plan order and marks the best value of each figure column.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

RESULTS_FILE: Final = "results.jsonl"
BENCH_FILE: Final = "bench.jsonl"  # what a point's command writes into {out}: `--output {out}/bench.jsonl`
FORMATS: Final = ("table", "csv", "markdown", "json")


@dataclass(frozen=True)
class Figure:
    key: str  # in the bench client's JSON line
    title: str
    higher_is_better: bool
    digits: int


FIGURES: Final = (
    Figure("accept_length", "ACCEPT", True, 2),
    Figure("output_tokens_per_second", "OUT tok/s", True, 1),
    Figure("ttft_p50_ms", "TTFT p50 ms", False, 1),
    Figure("itl_p50_ms", "ITL p50 ms", False, 2),
)


class ReportError(Exception):
    """A folder that holds no sweep results; the message names it."""


def read_results(path: Path, *, warn: bool = True) -> list[dict[str, Any]]:
    """Every complete, readable line of a JSON Lines file ([] if there is none); a torn last line, from a
    crash, is skipped (with a warning on stderr unless `warn` is False)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            if warn:
                print(f"genready sweep: {path}:{lineno}: skipping an unreadable line", file=sys.stderr)
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def bench_figures(folder: Path) -> dict[str, float | None] | None:
    """The figures of the last bench line in `folder`/bench.jsonl, or None without one."""
    lines = read_results(folder / BENCH_FILE, warn=False)
    if not lines:
        return None
    last = lines[-1]
    return {f.key: v if isinstance(v := last.get(f.key), int | float) and not isinstance(v, bool) else None
            for f in FIGURES}


@dataclass
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


def label_of(point: Any) -> str:
    if not isinstance(point, dict):
        return str(point)
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in point.items()) or "(no values)"


def row_of(rec: dict[str, Any], folder: Path) -> Row:
    """The row of one results.jsonl line of `folder`."""
    index = rec.get("index")
    if not isinstance(index, int):  # a line from before "index": the out folder starts with it
        m = re.match(r"(\d+)-", str(rec.get("out", "")))
        index = int(m.group(1)) if m else 0
    out = rec.get("out")
    figures = bench_figures(folder / out) if isinstance(out, str) else None
    return Row(index, label_of(rec.get("point")), str(rec.get("status")), str(rec.get("attempt", "-")),
               str(rec.get("pid") or "-"), rec.get("load_seconds"), rec.get("run_seconds"), rec.get("restarted"),
               str(rec.get("host") or ""), figures)


def rows_of(folders: Sequence[Path]) -> list[Row]:
    """One row per point over every folder, in plan order; an ok attempt wins over later failed ones."""
    best: dict[str, tuple[Row, bool]] = {}
    for folder in folders:
        path = folder / RESULTS_FILE
        if not path.is_file():
            raise ReportError(f"{folder}: no {RESULTS_FILE} (expected the --results folder of a sweep)")
        for rec in read_results(path):
            key = json.dumps(rec.get("point"), sort_keys=True)
            ok = rec.get("status") == "ok"
            if key not in best or ok or not best[key][1]:
                best[key] = (row_of(rec, folder), ok)
    rows = sorted((r for r, _ in best.values()), key=lambda r: r.index)
    mark_best(rows)
    return rows


def mark_best(rows: Sequence[Row]) -> None:
    """Mark, per figure, the rows of ok points that hold the best value (ties all marked)."""
    for f in FIGURES:
        vals = [(r, v) for r in rows if r.status == "ok" and r.figures and (v := r.figures.get(f.key)) is not None]
        if len(vals) < 2:
            continue
        top = (max if f.higher_is_better else min)(v for _, v in vals)
        for r, v in vals:
            if v == top:
                r.best.add(f.key)


def _num(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _cells(rows: Sequence[Row], *, mark: str) -> tuple[list[str], list[list[str]]]:
    with_bench = any(r.figures for r in rows)
    with_host = len({r.host for r in rows if r.host}) > 1
    head = ["POINT", "STATUS", "ATTEMPT", "PID", "LOAD s", "RUN s"] + (["HOST"] if with_host else []) + \
        ([f.title for f in FIGURES] if with_bench else [])
    body = []
    for r in rows:
        cells = [r.label, r.status, r.attempt, r.pid, _num(r.load, 1), _num(r.run, 1)]
        if with_host:
            cells.append(r.host or "-")
        if with_bench:
            for f in FIGURES:
                v = (r.figures or {}).get(f.key)
                text = _num(v, f.digits)
                cells.append(mark.format(text) if f.key in r.best else text)
        body.append(cells)
    return head, body


def render(rows: Sequence[Row], fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps({"rows": [{"index": r.index, "point": r.label, "status": r.status, "attempt": r.attempt,
                                     "pid": r.pid, "load_seconds": r.load, "run_seconds": r.run,
                                     "restarted": r.restarted, "host": r.host or None, **(r.figures or {}),
                                     "best": sorted(r.best)} for r in rows]}, indent=2) + "\n"
    if fmt == "csv":
        head, body = _cells(rows, mark="{}*")
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([head, *body])
        return buf.getvalue()
    if fmt == "markdown":
        head, body = _cells(rows, mark="**{}**")
        return "".join("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |\n"
                       for r in [head, ["---"] * len(head), *body])
    head, body = _cells(rows, mark="{}*")
    table = [head, *body]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    text = "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in table)
    return text + ("(* best of its column)\n" if any(r.best for r in rows) else "")
