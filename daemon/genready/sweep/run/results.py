"""The sweep's results: DIR/results.jsonl, one line per attempt, and the one store of what is known.

Each line records what made it: its fingerprint (the rendered drop-in and command, the target,
the unit, and the plan keys that change a run). `--resume` reuses a line only when its fingerprint
is the plan's now; a folder that holds lines of another fingerprint for the plan's points is
refused before the unit is touched (exit 78), unless `--resume=rerun-changed` redoes those points.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from genready.compat import StrEnum
from genready.store import durable
from genready.sweep.files import RESULTS_FILE, read_results, reload_of
from genready.sweep.plan import Plan, Point, Scalar
from genready.sweep.plankeys import RUN_KEYS
from genready.timewords import iso
from genready.tools import servermetrics

LOCK_FILE: Final = ".sweep.lock"
OUT_TOKEN: Final = "{out}"  # what `{out}` is rendered as in a fingerprint: each attempt's folder differs


class Cache(StrEnum):
    """What the server's prefix cache held when a run started (the `cache` of a results.jsonl line)."""

    COLD_START = "cold_start"  # the first run on a fresh start: only the warmup ran, and it was flushed if it can be
    FLUSHED = "flushed"  # a reused instance whose cache was emptied (servercache.flush) after the warmup
    WARM = "warm"  # a reused instance, not flushed (between_points = "none", or no route): figures biased


class Status(StrEnum):
    """What one attempt at one point came to (the `status` of a results.jsonl line)."""

    OK = "ok"  # the command exited 0 and the verified instance stayed ready throughout
    FAILED = "failed"  # the command exited non-zero (not retried: the server was fine)
    INVALIDATED = "invalidated"  # the server restarted or lost readiness during the run, or we were stopped
    NOT_READY = "not_ready"  # no verified start within the timeout, or the unit failed to start
    SKIPPED = "skipped"  # not loaded: a configuration no larger on the plan's `prune` axes failed to start (pruned_by)
    CONFIG_MISMATCH = "config_mismatch"  # the engine reports another configuration than its flags or `expect`: not run
    NO_DRAFTING = "no_drafting"  # ran, on a speculative server, and its counters show no draft token at all


RETRIED: Final = (Status.INVALIDATED, Status.NOT_READY)


class SweepError(Exception):
    """Something outside the plan stops the sweep (permissions, daemon, unit); the message says what."""


class SweepBusy(SweepError):
    """The unit's drop-in belongs to another sweep that is still running (exit 75)."""


class ResultsUnwritable(SweepError):
    """The results folder cannot be created or written (exit 73, EX_CANTCREAT); the unit is restored first."""


def unwritable(folder: Path, e: OSError) -> ResultsUnwritable:
    """`e` in words that name the results folder, and what is wrong with it when that is the cause."""
    if folder.is_symlink() and not folder.exists():
        why = f"it is a symlink to {os.readlink(folder)}, which does not exist"
    elif folder.exists() and not folder.is_dir():
        why = "it exists and is not a folder"
    else:
        why = e.strerror or str(e)
        if e.filename is not None and Path(os.fsdecode(e.filename)) != folder:
            why += f" ({os.fsdecode(e.filename)})"
    return ResultsUnwritable(f"cannot write the results folder {folder}: {why}")


@contextlib.contextmanager
def writing(folder: Path) -> Iterator[None]:
    """Turns an OSError of writing under the results folder into ResultsUnwritable (exit 73)."""
    try:
        yield
    except OSError as e:
        raise unwritable(folder, e) from None


def finite(value: Any) -> Any:
    """`value` with every non-finite float made None: a results line is JSON that jq, JavaScript and Go
    read (issue 41 #7), and a counter of +Inf is no figure."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, **kw: Any) -> str:
    """JSON as every file the sweep writes is: strict (no NaN or Infinity tokens)."""
    return json.dumps(finite(value), allow_nan=False, **kw)


# --- what made a line ------------------------------------------------------------------------------


def _digest(text: str | None) -> str:
    return "" if text is None else hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(plan: Plan, point: Point, target: str, unit: str, *, restart_each: bool) -> dict[str, Any]:
    """What makes a run of `point` what it is, key by key (drop-in and command as digests of their text
    with `{out}` left as written: each attempt's folder differs, its meaning does not)."""
    fp: dict[str, Any] = {"dropin": _digest(plan.dropin_for(point, OUT_TOKEN)),
                          "command": _digest("\0".join(plan.command_for(point, OUT_TOKEN))),
                          "target": target, "unit": unit, "restart_each": restart_each}
    for key in RUN_KEYS:
        fp[key] = str(getattr(plan, key)) if key == "between_points" else getattr(plan, key)
    if plan.search is not None:  # another search is another run; a plan without one keeps its fingerprint
        fp["search"] = json.loads(json.dumps(asdict(plan.search)))  # plain strings, as a line read back has
    if plan.expect:  # what confirm checks decides whether a point may run: a line made without it is not ok for it
        fp["expect"] = plan.expect_for(point)
    if plan.stable:  # the rule that ended the warmup; not warmup_max_seconds, a bound in time (as `timeout`)
        fp["warmup_rule"] = {"window": plan.warmup_window, "tolerance": plan.warmup_tolerance,
                             "max": plan.warmup_max}
    return fp


# `warmup`'s default before it became "stable" (issue 38): what the lines of a plan without the key recorded.
LEGACY_WARMUP: Final = 2


def as_measured(plan: Plan, results: Path, fingerprint_of: Callable[[Plan, Point], Mapping[str, Any]]) -> Plan:
    """`plan`, or, when it sets no `warmup` and DIR's lines for its points were made by it under the old default
    (warmup = 2) and none under "stable", the plan with warmup = 2: an old folder resumes as it was measured,
    every point of it warmed alike, instead of being refused for a default that changed."""
    if "warmup" in plan.given or not plan.stable:
        return plan
    old = replace(plan, warmup=LEGACY_WARMUP)
    by_point = {json.dumps(p.as_dict(), sort_keys=True): p for p in plan.points}
    legacy = False
    for r in read_results(results / RESULTS_FILE):
        p = by_point.get(json.dumps(r.get("point"), sort_keys=True)) if isinstance(r.get("point"), dict) else None
        if p is None:
            continue
        if not differing(r.get("fingerprint"), fingerprint_of(plan, p)):
            return plan
        legacy = legacy or not differing(r.get("fingerprint"), fingerprint_of(old, p))
    return old if legacy else plan


def differing(a: object, b: Mapping[str, Any]) -> list[str]:
    """The keys in which a line's fingerprint `a` differs from `b` (["fingerprint"] for a line with none:
    made before lines said what made them)."""
    if not isinstance(a, dict):
        return ["fingerprint"]
    return [k for k in b if a.get(k) != b[k]] + [k for k in a if k not in b]


# --- results.jsonl ----------------------------------------------------------------------------------


def same_point(a: object, b: Mapping[str, Scalar]) -> bool:
    return isinstance(a, dict) and a == dict(b)


class ResultsLog:
    """DIR/results.jsonl, append-only: each line one write, fsync'd before `append` returns (store/durable.py).

    One sweep per DIR at a time (a lock file), so two sweeps never interleave their points.
    """

    def __init__(self, folder: Path) -> None:
        self.folder, self.path = folder, folder / RESULTS_FILE
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
            self._lock = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise SweepError(f"another sweep is writing {folder}") from None
        try:
            with writing(folder):
                self._fd = durable.open_append(self.path, 0o644, read=True)
                durable.end_line(self._fd)  # a line torn by a crash must not glue itself to the next one
        except ResultsUnwritable:
            os.close(self._lock)
            raise

    def append(self, rec: Mapping[str, Any]) -> None:
        line = json_text(rec, ensure_ascii=True, separators=(",", ":")) + "\n"
        with writing(self.folder):
            durable.append(self._fd, line.encode("ascii"))

    def close(self) -> None:
        for fd in (self._fd, self._lock):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class Attempt:
    """One try at one point, and what became of it: a results.jsonl line. Built once, from what the
    point's steps returned (runner.py)."""

    point: Point
    attempt: int
    out: str  # relative to DIR
    status: Status
    started_at: float
    ended_at: float
    group: int = 1  # the point's server configuration (1-based, in the order groups run)
    restarted: bool = True  # False: it ran on the instance verified for an earlier point of its group
    reason: str = ""
    pid: int | None = None
    invocation_id: str | None = None
    load_seconds: float | None = None
    exit_code: int | None = None
    ran_at: float | None = None
    unit_result: str | None = None
    journal: Sequence[str] | None = None
    retry: bool = True  # False: another attempt would meet the same refusal (systemd's, of the drop-in)
    repeat: int = 1  # which of the plan's `repeats` runs of the point
    reload: int = 0  # which load of a configuration a search loaded again (explore.py's reloads): 0 its first
    cache: Cache = Cache.COLD_START
    noise_limit: float = 0.10
    max_divergence: float = 0.10  # the plan's: the report (which reads results, not the plan) marks by it
    counters: servermetrics.RunCounters | None = None  # the server's /metrics counters over the run
    plan: str = ""  # the plan file's path, for the report's context
    waited_seconds: float | None = None  # not_ready: how long the start was waited for
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    plan_points: int = 0  # how many points the plan has: a merged report can tell which have no result
    shard: str | None = None  # --shard K/N
    client: Mapping[str, Any] | None = None  # with a baseline: the point's client setting (sweep/run/baseline.py)
    baseline_round: int | None = None  # with a baseline: the round of it that ran last before this point
    warmup_requests: int | None = None  # warmup requests sent before the run (None: none ran, not_ready)
    warmup_converged: bool | None = None  # warmup = "stable": whether it settled (False: unstable); else None
    engine_config: Mapping[str, Any] | None = None  # what the engine said it runs (sweep/run/confirm.py), redacted
    config_check: Mapping[str, Any] | None = None  # how that compares with its flags and the plan's `expect`
    gpu: Mapping[str, Any] | None = None  # the run's GPU cost (sweep/run/gpucost.py), its fields as they go in the line
    gpus: int = 1  # the plan's `gpus`: the report, which reads results folders and not the plan, divides by it
    categories: Mapping[str, Mapping[str, float]] | None = None  # the bench line's figures per prompt category

    @property
    def run_seconds(self) -> float | None:
        return None if self.ran_at is None else self.ended_at - self.ran_at

    def to_json(self, target: str, unit: str) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "point": self.point.as_dict(), "status": self.status.value, "target": target, "unit": unit,
            "pid": self.pid, "invocation_id": self.invocation_id, "load_seconds": self.load_seconds,
            "exit_code": self.exit_code, "started_at": iso(self.started_at), "ended_at": iso(self.ended_at),
            "run_seconds": None if self.run_seconds is None else round(self.run_seconds, 3),
            "attempt": self.attempt, "out": self.out, "index": self.point.index, "group": self.group,
            "restarted": self.restarted, "host": socket.gethostname(), "repeat": self.repeat,
            "cache": self.cache.value, "noise_limit": self.noise_limit,
            "max_divergence": self.max_divergence, "plan": self.plan,
            "fingerprint": dict(self.fingerprint), "plan_points": self.plan_points, "shard": self.shard,
            "warmup_requests": self.warmup_requests, "warmup_converged": self.warmup_converged,
        }
        if self.reload:
            rec["reload"] = self.reload
        if self.point.baseline:
            rec["baseline"] = self.point.baseline
        if self.point.aa:
            rec["aa"] = self.point.aa  # a load of the A/A start: noise evidence, no point of the plan (noisecheck.py)
        if self.client is not None:
            rec["client"], rec["baseline_round"] = dict(self.client), self.baseline_round
        if self.counters is not None:
            rec["prefix_cache_hit_rate"] = self.counters.prefix_cache_hit_rate
            rec["metrics_accept_length"] = self.counters.accept_length
            rec["metrics_accept_per_position"] = self.counters.accept_per_position
            rec["counters_reset"] = bool(self.counters.reset)
        if self.engine_config is not None:
            rec["engine_config"] = dict(self.engine_config)
            rec["config_check"] = dict(self.config_check or {})
        if self.gpu:
            rec.update(self.gpu)
        if self.categories:
            rec["categories"] = {name: dict(figures) for name, figures in self.categories.items()}
        rec["gpus"] = self.gpus
        if self.reason:
            rec["reason"] = self.reason
        if self.status is Status.NOT_READY:
            rec["unit_result"] = self.unit_result
            rec["journal"] = list(self.journal or [])
            if self.waited_seconds is not None:
                rec["waited_seconds"] = round(self.waited_seconds, 3)
        return rec


def ok_runs(plan: Plan, results: Path, fingerprints: Mapping[int, Mapping[str, Any]] | None = None
            ) -> dict[int, list[dict[str, Any]]]:
    """The plan's points' `ok` lines already in DIR/results.jsonl, by point index (one per repeat of each load, a
    line without `repeat` being repeat 1, from before repeats; repeats beyond the plan's are not counted; a search's
    reloads are loads of their own, `reload_of`).
    With `fingerprints` (point index -> its fingerprint now), only lines made by that fingerprint."""
    recs = read_results(results / RESULTS_FILE)
    out: dict[int, list[dict[str, Any]]] = {}
    for p in plan.points:
        seen: dict[tuple[int, int], dict[str, Any]] = {}
        for r in recs:
            rep = r.get("repeat", 1)
            if r.get("status") == Status.OK.value and same_point(r.get("point"), p.as_dict()) and \
                    not r.get("baseline") and not r.get("aa") and \
                    isinstance(rep, int) and 1 <= rep <= plan.repeats and \
                    (fingerprints is None or not differing(r.get("fingerprint"), fingerprints[p.index])):
                seen.setdefault((reload_of(r), rep), r)
        if seen:
            out[p.index] = list(seen.values())
    return out


def first_load(recs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The lines of a point's first load (a search's reloads are loads of their own)."""
    return [r for r in recs if not reload_of(r)]


def changed_points(plan: Plan, results: Path, fingerprints: Mapping[int, Mapping[str, Any]]
                   ) -> dict[int, list[str]]:
    """The plan's points that DIR/results.jsonl holds lines of another fingerprint for: index -> the keys
    that differ (those of the first such line)."""
    out: dict[int, list[str]] = {}
    by_point = {json.dumps(p.as_dict(), sort_keys=True): p for p in plan.points}
    for r in read_results(results / RESULTS_FILE):
        if r.get("baseline") or r.get("aa"):
            continue  # a run of the baseline or the A/A start, which may hold a plan point's values: not its line
        p = by_point.get(json.dumps(r.get("point"), sort_keys=True)) if isinstance(r.get("point"), dict) else None
        if p is None or p.index in out:
            continue
        if keys := differing(r.get("fingerprint"), fingerprints[p.index]):
            out[p.index] = keys
    return out


class Results:
    """The one store of what is known about each point: the lines an earlier run left (`--resume`) and
    this run's attempts. The summary, the exit status and what is left to run all ask it."""

    def __init__(self, earlier: Mapping[int, Sequence[dict[str, Any]]] | None = None) -> None:
        self.earlier = {i: list(recs) for i, recs in (earlier or {}).items()}
        self._attempts: dict[int, dict[tuple[int, int], Attempt]] = {}  # index -> (reload, repeat) -> its last
        self._lines: dict[int, list[dict[str, Any]]] = {}  # point index -> this run's lines

    def done_repeats(self, index: int, reload: int = 0) -> set[int]:
        """The repeats of a point's load (its first, or a search's reload) already ok in an earlier run."""
        return {r.get("repeat", 1) for r in self.earlier.get(index, []) if reload_of(r) == reload}

    def reuse(self, index: int, line: dict[str, Any]) -> None:
        """An earlier run's line this run counts as its own (a search step --resume does not run again)."""
        self.earlier.setdefault(index, []).append(line)

    def add(self, att: Attempt, line: dict[str, Any]) -> None:
        self._attempts.setdefault(att.point.index, {})[att.reload, att.repeat] = att
        self._lines.setdefault(att.point.index, []).append(line)

    def ran(self, index: int) -> bool:
        return index in self._attempts

    def outcome(self, index: int) -> Attempt | None:
        """The attempt that stands for a point run in this sweep: its first repeat not ok, else its last."""
        runs = self._attempts.get(index)
        if not runs:
            return None
        return next((a for a in runs.values() if a.status is not Status.OK), list(runs.values())[-1])

    def lines(self, index: int) -> list[dict[str, Any]]:
        return self.earlier.get(index, []) + self._lines.get(index, [])

    def all_ok(self) -> bool:
        return all(a.status is Status.OK for i in self._attempts if (a := self.outcome(i)) is not None)

    def ok_count(self) -> int:
        return sum(1 for i in self._attempts if (a := self.outcome(i)) is not None and a.status is Status.OK)

