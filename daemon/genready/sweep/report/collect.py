"""A report's reading: results folders into rows, one per point and configuration, in plan order.

`read_folders` reads each folder's DIR/results.jsonl once (a report of 64 MiB spends most of its time decoding
them); `rows_from` groups the lines by point and by the configuration that made them (their fingerprint), makes
each group's row (rows.point_row, with its prompt categories), marks the best values and attaches the ratios
against the plan's baseline (speedup.attach), their intervals widened by the spread between loads that the A/A
start's lines (`aa`: noise evidence, never a row) and the baseline's rounds measured (`noise_of`). `coverage` says
which of the plan's points have no line.
Several folders are the shards of one plan, run on several hosts: their rows merge into one table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from genready.store import bounded
from genready.sweep import noise
from genready.sweep.files import RESULTS_FILE, numbered_lines
from genready.sweep.report import categories, outputs, speedup
from genready.sweep.rows import Benches, Row, bench_once, mark_best, point_row


class ReportError(Exception):
    """A folder that holds no sweep results; the message names it."""


Read = list[tuple[Path, Path, list[tuple[int, dict[str, Any]]]]]  # (folder, its results file, numbered lines)


def read_folders(folders: Sequence[Path]) -> Read:
    """Every folder's results lines, read once (a report of 64 MiB spends most of its time decoding them):
    rows_from() and coverage() both take them. ReportError for a folder without results."""
    read: Read = []
    for folder in folders:
        path = folder / RESULTS_FILE
        try:
            lines = numbered_lines(path)
        except bounded.FileError as e:
            raise ReportError(str(e)) from None
        if not lines and not path.is_file():
            raise ReportError(f"{folder}: no {RESULTS_FILE} (expected the --results folder of a sweep)")
        read.append((folder, path, lines))
    return read


def rows_of(folders: Sequence[Path]) -> list[Row]:
    """One row per point over every folder, in plan order (see point_row)."""
    return rows_from(read_folders(folders))


def rows_from(read: Read) -> list[Row]:
    """The rows of read_folders()' lines: one per point and configuration, in plan order."""
    by_point: dict[str, list[tuple[dict[str, Any], Path, str]]] = {}
    aa: dict[str, dict[int, list[tuple[dict[str, Any], Path, str]]]] = {}  # host and point -> A/A load -> its lines
    point_of: dict[str, tuple[str, str]] = {}  # a group's key -> its point's key and its fingerprint's JSON
    for folder, path, lines in read:
        where = f"{path}:"
        for lineno, rec in lines:
            # Lines another configuration made (their fingerprint differs) are never merged into one row.
            point = _point_key(rec.get("point"))
            if isinstance(load := rec.get("aa"), int) and not isinstance(load, bool) and load > 0:
                aa.setdefault(json.dumps([point, rec.get("host")]), {}).setdefault(load, []).append(
                    (rec, folder, where + str(lineno)))
                continue
            if base := rec.get("baseline"):
                # A baseline run may hold a plan point's values: never that point's row. Each host's shard runs
                # the baseline itself, so its runs stay its own (speedup.attach matches by host).
                point += "\0" + json.dumps([base, rec.get("host")])
            fp = rec.get("fingerprint")
            fp_json = "null" if fp is None else json.dumps(fp, sort_keys=True)
            key = point + "\0" + fp_json
            if key not in by_point:
                by_point[key], point_of[key] = [], (point, fp_json)
            by_point[key].append((rec, folder, where + str(lineno)))
    made: dict[str, str] = {}  # a fingerprint's JSON -> _made_by() of its lines: one digest per configuration
    made_by: dict[str, set[str]] = {}
    for key, group in by_point.items():
        point, fp_json = point_of[key]
        if fp_json not in made:
            made[fp_json] = _made_by(group[0][0])
        made_by.setdefault(point, set()).add(made[fp_json])
    rows = []
    benches: Benches = {}
    for key, group in by_point.items():
        row = point_row(group, benches)
        categories.gather(row, group, lambda path: bench_once(path, benches))
        point, fp_json = point_of[key]
        if len(made_by[point]) > 1:
            row.label += f" [{made[fp_json]}]"  # one point, lines of several configurations
        rows.append(row)
    rows.sort(key=lambda r: r.index)
    outputs.attach(rows)  # before mark_best: a point whose answers diverged holds no best value
    mark_best(rows)
    speedup.attach(rows, noise_of(rows, [[point_row(lines, benches) for _, lines in sorted(loads.items())]
                                         for loads in aa.values()]))
    return rows


def noise_of(rows: Sequence[Row], aa: Sequence[Sequence[Row]]) -> noise.Estimate | None:
    """The spread within and between loads (sweep/noise.py) from the A/A start's loads (`aa`: per configuration
    its loads' rows) and the baseline's rounds (each client setting's rounds on one host: loads of one
    configuration); None when neither has two loads. A round runs every client setting on one load, so the
    settings' rounds share their loads (noise.components' `shared`: the host's), as the A/A start's do."""
    rounds: dict[str, list[Row]] = {}
    for r in rows:
        if r.baseline and r.status == "ok" and r.samples:
            rounds.setdefault(json.dumps([r.host, r.point], sort_keys=True), []).append(r)
    repeated = [loads for loads in rounds.values() if len(loads) >= 2]
    aa_ok = [[r.samples for r in loads if r.status == "ok" and r.samples] for loads in aa]
    aa_keys = [json.dumps(["aa", loads[0].host if loads else None]) for loads in aa]
    base_keys = [json.dumps(["baseline", loads[0].host]) for loads in repeated]
    distinct_rounds = {(r.host, r.baseline) for loads in repeated for r in loads}
    distinct_aa: dict[str, int] = {}  # the A/A start's client settings, if several, share its loads too
    for key, loads in zip(aa_keys, aa_ok, strict=True):
        if len(loads) >= 2:
            distinct_aa[key] = max(distinct_aa.get(key, 0), len(loads))
    return noise.estimate([*aa_ok, *([r.samples for r in loads] for loads in repeated)],
                          aa_loads=sum(distinct_aa.values()), baseline_loads=len(distinct_rounds),
                          shared=[*aa_keys, *base_keys])


def _point_key(point: Any) -> str:
    """A point's values as a key, alike in any order (plain values: their sorted items' repr, cheaper than JSON)."""
    plain = isinstance(point, dict) and all(type(v) in (str, int, float, bool) or v is None for v in point.values())
    return repr(sorted(point.items())) if plain else json.dumps(point, sort_keys=True)


def _made_by(rec: dict[str, Any]) -> str:
    """Which configuration made a line, in a few characters: its fingerprint's digest, or that it has none."""
    fp = rec.get("fingerprint")
    if not isinstance(fp, dict):
        return "no fingerprint"
    return "fingerprint " + hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:8]


def coverage(records: Iterable[dict[str, Any]], present: set[int]) -> str:
    """"N of M points have no result (shard K/N missing or unfinished)" for results lines that name their
    plan's size (`plan_points`) and shard, when some of the plan's points have no line; else ""."""
    sizes: set[int] = set()
    shards: dict[int, set[int]] = {}  # N -> the K seen
    for r in records:
        if isinstance(n := r.get("plan_points"), int) and not isinstance(n, bool) and n > 0:
            sizes.add(n)
        k, _, n_s = str(r.get("shard") or "").partition("/")
        if k.isdigit() and n_s.isdigit():
            shards.setdefault(int(n_s), set()).add(int(k))
    if not sizes:
        return ""  # lines from before plan_points: the plan's size is not known
    m = max(sizes)
    missing = m - len({i for i in present if 1 <= i <= m})
    if missing <= 0:
        return ""
    gone = [f"{k}/{n}" for n, seen in sorted(shards.items()) for k in range(1, n + 1) if k not in seen]
    return f"{missing} of {m} points have no result" + (
        f" (shard {', '.join(gone)} missing or unfinished)" if gone else " (unfinished)")
