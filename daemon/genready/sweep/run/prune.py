"""Don't load what cannot start: the plan's `prune` axes, and the stop after repeated failed starts.

A configuration whose start failed (it ended before it was verified: an out-of-memory at load or at
CUDA-graph capture) will not start at a larger value of an axis that needs more memory either. So
with `prune = ["draft", "topk"]`, every configuration at least as large on every pruned axis and
equal on the plan's other server-side axes is not loaded: its points are recorded `skipped`, with
`pruned_by` naming the failed point and systemd's Result. Groups run smaller-first on those axes,
so a failure is met before the configurations it prunes.

A start that timed out (still loading at `timeout`) neither prunes nor counts as a failed start: the
server did not fail, it was slow, and a longer `timeout` may see it verified. plan.py checks the
`prune` key and orders the groups; what follows a failed start is here: pure functions and one
small state (Pruner), read by the runner; a resumed sweep rebuilds it from results.jsonl.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from genready.sweep.plan import Point, Scalar

LAST_LINES: Final = 3  # per failed start, in the message of the stop


def at_least_as_large(failed: Mapping[str, Scalar], other: Mapping[str, Scalar], axes: Sequence[str],
                      server_axes: Sequence[str]) -> bool:
    """Whether the configuration `other` is pruned by the failed start of `failed`: at least as large on
    every pruned axis, and equal on every other server-side axis (client-side axes, such as a concurrency,
    do not change what is loaded)."""
    for a in server_axes:
        f, o = failed.get(a), other.get(a)
        if a in axes:
            if not isinstance(f, int | float) or not isinstance(o, int | float) or o < f:
                return False
        elif f != o:
            return False
    return True


def failed_start(line: Mapping[str, Any]) -> str | None:
    """systemd's Result of a results line's start that ended before it was verified, or None: a `not_ready`
    line of a start that was waited for (`waited_seconds`) and ended with a Result other than success. A
    timed-out start (its unit still running: Result success), a drop-in systemd refused or a daemon that
    refused is no failed start."""
    if line.get("status") != "not_ready" or line.get("waited_seconds") is None or line.get("pid") is not None:
        return None
    result = line.get("unit_result")
    return result if isinstance(result, str) and result and result != "success" else None


@dataclass(frozen=True)
class Source:
    """A failed start that prunes: its point and systemd's Result of it."""

    point: Point
    result: str

    def to_json(self) -> dict[str, Any]:
        """A skipped line's `pruned_by`."""
        return {"index": self.point.index, "point": self.point.as_dict(), "unit_result": self.result}

    @property
    def words(self) -> str:
        return f"point {self.point.index} ({self.point.label}) failed to start ({self.result})"


@dataclass
class Pruner:
    """The failed starts that prune, this run's and (`--resume`) an earlier run's, and the consecutive
    failed starts the stop counts. `axes` empty: nothing is pruned (no key, or --no-prune)."""

    axes: tuple[str, ...]
    server_axes: tuple[str, ...]
    max_failed_starts: int | None  # None: --keep-going
    sources: list[Source] = field(default_factory=list)
    earlier: set[int] = field(default_factory=set)  # points whose start failed in an earlier run: not loaded again
    in_a_row: list[tuple[Point, Mapping[str, Any]]] = field(default_factory=list)  # failed starts since a verified one

    def add(self, point: Point, result: str) -> None:
        if self.axes and all(s.point.index != point.index for s in self.sources):
            self.sources.append(Source(point, result))

    def pruned_by(self, point: Point) -> Source | None:
        """The failed start that prunes `point`, or None: the first recorded whose configuration `point`'s is
        at least as large as (its own group's later points too: the same configuration)."""
        if not self.axes:
            return None
        values = point.as_dict()
        return next((s for s in self.sources if s.point.index != point.index
                     and at_least_as_large(s.point.as_dict(), values, self.axes, self.server_axes)), None)

    def started(self, line: Mapping[str, Any], point: Point) -> str:
        """Count one attempt's line: a failed start adds to the failed starts in a row, a verified one
        (a pid) ends the row. Why the sweep must stop now, or ""."""
        if failed_start(line) is not None:
            self.in_a_row.append((point, line))
        elif line.get("pid") is not None and line.get("restarted", True):
            self.in_a_row.clear()
        if self.max_failed_starts is None or len(self.in_a_row) < self.max_failed_starts:
            return ""
        return stop_words(self.in_a_row, self.max_failed_starts)


def stop_words(starts: Sequence[tuple[Point, Mapping[str, Any]]], limit: int) -> str:
    """The stop's message: how many starts failed in a row, each with its Result and last lines."""
    def one(p: Point, line: Mapping[str, Any]) -> str:
        journal = [str(x) for x in line.get("journal") or []][-LAST_LINES:]
        last = " | ".join(x[:200] for x in journal) if journal else "no output"
        return f"point {p.index} ({p.label}), attempt {line.get('attempt')}: {line.get('unit_result')}; " \
            f"last lines: {last}"
    return (f"{len(starts)} starts in a row ended before they were verified (max_failed_starts = {limit}; "
            "--keep-going goes on): " + "; ".join(one(p, ln) for p, ln in starts))


def earlier_failures(points: Iterable[Point], lines: Iterable[Mapping[str, Any]],
                     fingerprints: Mapping[int, Mapping[str, Any]]) -> dict[int, str]:
    """From an earlier run's results lines: the plan's points whose last attempt (made by the configuration
    they have now: same fingerprint) was a failed start, and no attempt ok: index -> systemd's Result."""
    by_values = {_key(p.as_dict()): p for p in points}
    last: dict[int, Mapping[str, Any]] = {}
    ok: set[int] = set()
    for line in lines:
        values = line.get("point")
        p = by_values.get(_key(values)) if isinstance(values, dict) and not line.get("baseline") else None
        if p is None or line.get("fingerprint") != dict(fingerprints.get(p.index, {})):
            continue
        if line.get("status") == "ok":
            ok.add(p.index)
        elif line.get("status") != "skipped":
            last[p.index] = line
    return {i: r for i, line in last.items() if i not in ok and (r := failed_start(line)) is not None}


def _key(values: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in values.items()))
