"""The files a sweep writes and its report reads: their names, their JSON Lines, and a run's bench line.

DIR/results.jsonl holds a line per attempt (run/results.py writes it), DIR/search.jsonl a line per
configuration's search (run/searchrun.py), DIR/explore.jsonl a line per load of a pattern search over the
server configurations and its summary (run/order.py), and each attempt's {out}/bench.jsonl the line its command's
bench client wrote (`--output {out}/bench.jsonl`). The run side and the report side meet here and in
rows.py: neither imports the other's modules.

Every file is read through the one bounded reader (bounded.read_file): a FIFO, a device, a directory or a
symlink loop where a file should be is named, never waited on or read without end.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from genready import console
from genready.store import bounded
from genready.tools import benchline

RESULTS_FILE: Final = "results.jsonl"
BENCH_FILE: Final = "bench.jsonl"  # what a point's command writes into {out}: `--output {out}/bench.jsonl`
SEARCH_FILE: Final = "search.jsonl"  # DIR/search.jsonl: what each configuration's search found, a line each
EXPLORE_FILE: Final = "explore.jsonl"  # DIR/explore.jsonl: strategy = "pattern"'s loads, a line each, then its summary
MAX_RESULTS_BYTES: Final = 64 << 20  # a results.jsonl or bench.jsonl: lines of a few KiB each
# The figures kept per prompt category of a bench line's `categories`, as the bench client names them.
CATEGORY_FIGURES: Final = tuple(f.key for f in (benchline.ACCEPT_LENGTH, benchline.OUTPUT_TOKENS_PER_SECOND,
                                                benchline.DRAFT_ACCEPTANCE, benchline.REQUESTS))
MAX_CATEGORIES: Final = 64  # columns: a dataset's categories are a handful; more is a mistaken field


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


def reload_of(rec: Mapping[str, Any]) -> int:
    """Which load of its configuration a results line ran on: 0 the first, K a pattern search's K-th reload of it
    (its `reload`; explore.py). The report's figure for a point loaded more than once is its mean over loads."""
    k = rec.get("reload", 0)
    return k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 0


def bench_line(folder: Path) -> dict[str, Any] | None:
    """The last line of `folder`/bench.jsonl, or None without one; bounded.FileError for a bench.jsonl
    that cannot be read (a directory, a FIFO, a symlink loop, a device, too big)."""
    lines = numbered_lines(folder / BENCH_FILE, warn=False)
    return lines[-1][1] if lines else None


def category_figures(cats: Any) -> dict[str, dict[str, float]]:
    """A bench line's (or results line's) `categories` as CATEGORY_FIGURES per category: finite numbers only,
    the first MAX_CATEGORIES categories; {} for anything else. What a run's results line records (run/steps.py)
    and report/categories.gather() collects over repeats."""
    if not isinstance(cats, dict):
        return {}
    out: dict[str, dict[str, float]] = {}
    for name, figures in list(cats.items())[:MAX_CATEGORIES]:
        if isinstance(name, str) and isinstance(figures, dict):
            out[name] = {key: float(v) for key in CATEGORY_FIGURES if isinstance(v := figures.get(key), int | float)
                         and not isinstance(v, bool) and math.isfinite(v)}
    return out
