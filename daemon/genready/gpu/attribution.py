"""Whose is each GPU process: the unit's current start, or a stray of an earlier one.

What genready knows of a target's starts (its records: InvocationID, MainPID, when each began and
ended) and what /proc says of a process (its cgroup, its parent chain, its command line, when it
began) decide, in `attribute`, a pure function:
- a descendant of the current MainPID, or a process of the unit's cgroup that began during the
  current start, is the **current** start's;
- any other process of the unit's cgroup is a **stray** (systemd left it there: KillMode=, or a
  process that ignored SIGTERM), of the earlier start it began during;
- a process outside the unit is a stray when its (PID, start time) was recorded in an earlier
  start's process tree (`Trees`), when its parent chain leads to an earlier start's MainPID, or
  when its command line names that MainPID as its parent (`--parent-pid N`, `ppid=N`): schedulers
  that escaped the cgroup (SGLang issues #23627 and #31645) are found so.
Reading /proc (`read_proc`, `ancestry`, `Trees.record`) blocks: it runs on the worker, with the
provider's reads.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from genready.gpu.provider import ComputeProcess
from genready.redact import shown

Role = Literal["current", "stray", "other", "unknown"]
# A process's start time is known to 1/CLK_TCK (10 ms, rounded down) and a record's to the
# microsecond (systemd stamps ExecMainStartTimestamp right after the fork). A restart takes ~40 ms,
# so the slack must stay well under that.
SLACK_S: Final = 0.03
COMMAND_MAX: Final = 300
_PARENT_FLAG: Final = re.compile(r"(?:parent|ppid|main)[_-]?(?:pid)?\W{0,3}?[=:\s]\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Proc:
    """What /proc says of one process."""

    pid: int
    ppid: int
    start_ticks: int  # /proc/PID/stat field 22: clock ticks after boot (with the PID, it names one process)
    started_at: float | None  # the same, as wall-clock seconds
    cmdline: tuple[str, ...]
    cgroup: str | None  # its path in systemd's hierarchy
    unit: str | None  # the innermost .service or .scope of that path

    @property
    def command(self) -> str:
        """The command line for people: secrets masked, control characters escaped, bounded."""
        text = shown(" ".join(self.cmdline))
        return text if len(text) <= COMMAND_MAX else text[:COMMAND_MAX - 1] + "…"


@dataclass(frozen=True, slots=True)
class Start:
    """One start of a unit, as genready recorded it (wall-clock seconds; ended_at None: running)."""

    invocation_id: str
    main_pid: int
    started_at: float | None
    ended_at: float | None = None


@dataclass(frozen=True, slots=True)
class TargetStarts:
    """A target's unit and its starts: the current one (None: the unit is not running) and earlier
    ones. control_group: the unit's ControlGroup as systemd says it over D-Bus (exact, even with
    two managers on one host); None or "": not known, and then no process counts as the unit's by
    its cgroup, never by the unit's name alone."""

    target: str
    unit: str
    current: Start | None
    earlier: tuple[Start, ...] = ()
    control_group: str | None = None


@dataclass(frozen=True, slots=True)
class Holding:
    """One process's memory on one GPU and whose it is. For a stray, invocation_id names the earlier
    start it belongs to (None: a start genready has no record of); `why` says how that was found."""

    gpu_uuid: str
    pid: int
    used_bytes: int | None
    role: Role
    target: str | None = None
    invocation_id: str | None = None
    unit: str | None = None
    command: str = ""
    why: str = ""

    def to_json(self) -> dict[str, object]:
        return {"gpu": self.gpu_uuid, "pid": self.pid, "bytes": self.used_bytes, "role": self.role,
                "invocation_id": self.invocation_id, "unit": self.unit, "command": self.command, "why": self.why}


# --- reading /proc ------------------------------------------------------------------------------

def unit_of_cgroup(text: str) -> tuple[str | None, str | None]:
    """(unit, path) from /proc/PID/cgroup: the v2 line (`0::`) where it names a unit, else cgroup v1's
    `name=systemd` line (hybrid hosts have both; a v1-only host only the latter)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            paths["v2"] = path
        elif "name=systemd" in controllers.split(","):
            paths["v1"] = path
    for key in ("v2", "v1"):
        if key not in paths:
            continue
        path = paths[key]
        unit = next((seg for seg in reversed(path.split("/")) if seg.endswith((".service", ".scope"))), None)
        if unit is not None or key == "v1":
            return unit, path
    return None, paths.get("v2")


def _clock() -> tuple[float, int]:
    """(boot time as wall-clock seconds, clock ticks per second). A process's start (stat field 22)
    counts from boot on CLOCK_BOOTTIME; /proc/stat's btime is whole seconds, too coarse to tell
    a start from the restart 40 ms later, so boot time is taken from the clocks themselves."""
    hz = os.sysconf("SC_CLK_TCK")
    try:
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME), hz
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/stat", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1]), hz
    except OSError:
        pass
    return 0.0, hz


def read_proc(pid: int, proc_dir: str = "/proc", clock: tuple[float, int] | None = None) -> Proc | None:
    """What /proc says of pid; None if it is gone (or not visible: another PID namespace)."""
    try:
        with open(f"{proc_dir}/{pid}/stat", "rb") as f:
            raw = f.read()
        with open(f"{proc_dir}/{pid}/cmdline", "rb") as f:
            cmd = f.read(16384)
    except OSError:
        return None
    # comm may hold spaces and parentheses: it ends at the LAST ')'.
    fields = raw.rpartition(b")")[2].split()
    if len(fields) < 20:
        return None
    ppid, ticks = int(fields[1]), int(fields[19])
    btime, hz = clock or _clock()
    try:
        with open(f"{proc_dir}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            unit, path = unit_of_cgroup(f.read())
    except OSError:
        unit, path = None, None
    argv = tuple(a.decode(errors="replace") for a in cmd.split(b"\0") if a)
    return Proc(pid=pid, ppid=ppid, start_ticks=ticks, started_at=btime + ticks / hz if btime else None,
                cmdline=argv, cgroup=path, unit=unit)


def ancestry(pid: int, limit: int = 64, proc_dir: str = "/proc") -> list[Proc]:
    """pid's Proc, then its parent's, up to PID 1 (or `limit`); [] if pid is gone."""
    clock = _clock()
    out: list[Proc] = []
    seen: set[int] = set()
    while pid > 0 and pid not in seen and len(out) < limit:
        seen.add(pid)
        p = read_proc(pid, proc_dir, clock)
        if p is None:
            break
        out.append(p)
        pid = p.ppid
    return out


class Trees:
    """Each start's process tree, recorded while it runs: (PID, start ticks) -> (target,
    InvocationID). A process that later leaves the unit's cgroup (or whose parents died) is still
    known as that start's. Bounded: the oldest entries go first; gone processes are pruned."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self.seen: dict[tuple[int, int], tuple[str, str]] = {}

    def record(self, target: str, invocation_id: str, main_pid: int, proc_dir: str = "/proc") -> int:
        """Record main_pid and its descendants as this start's; how many are known for it now."""
        from genready.probe.owner import descendants  # the same tree walk the owner proof uses

        clock = _clock()
        for pid in (main_pid, *descendants(main_pid)):
            p = read_proc(pid, proc_dir, clock)
            if p is not None:
                self.seen.pop((pid, p.start_ticks), None)
                self.seen[(pid, p.start_ticks)] = (target, invocation_id)
        self.prune(proc_dir)
        return sum(1 for v in self.seen.values() if v == (target, invocation_id))

    def prune(self, proc_dir: str = "/proc") -> None:
        """Forget processes that are gone (or whose PID now names another process), then the oldest
        past the limit."""
        clock = _clock()
        for key in list(self.seen):
            p = read_proc(key[0], proc_dir, clock)
            if p is None or p.start_ticks != key[1]:
                del self.seen[key]
        while len(self.seen) > self.limit:
            del self.seen[next(iter(self.seen))]


# --- deciding (pure) ----------------------------------------------------------------------------

def _in_unit(p: Proc, t: TargetStarts) -> bool:
    """Is p in the unit's own cgroup? Only its exact ControlGroup says so: a unit of the same name
    under another manager (a user's, a second private one, a container's systemd) is another unit,
    and without the ControlGroup no process is taken for the unit's by its cgroup (the MainPID, its
    descendants and the recorded trees still are)."""
    if not t.control_group or p.cgroup is None:
        return False
    return p.cgroup == t.control_group or p.cgroup.startswith(t.control_group.rstrip("/") + "/")


def _during(at: float | None, s: Start, until: float | None) -> bool:
    """Did a process that began at `at` begin during start s (which ended at `until`, None: not yet)?"""
    if at is None or s.started_at is None:
        return False
    return s.started_at - SLACK_S <= at and (until is None or at <= until + SLACK_S)


def _ends(t: TargetStarts) -> list[tuple[Start, float | None]]:
    """Each earlier start with when it ended: its own ended_at, else the next start's beginning."""
    starts = sorted(t.earlier, key=lambda s: s.started_at or 0.0)
    # Each start's successor's beginning; the last earlier one's is the current start's (none: no earlier start).
    nxt = [s.started_at for s in starts[1:]] + ([t.current.started_at if t.current else None] if starts else [])
    return [(s, s.ended_at if s.ended_at is not None else n) for s, n in zip(starts, nxt, strict=True)]


def earlier_start(chain: Sequence[Proc], t: TargetStarts, trees: Mapping[tuple[int, int], tuple[str, str]],
                  *, in_unit: bool) -> tuple[Start | None, str]:
    """Which earlier start of t the process chain[0] belongs to, and how that is known; (None, "") if
    nothing ties it to one (for a process of the unit's cgroup, the reason then says so)."""
    p = chain[0]
    ends = _ends(t)
    by_id = {s.invocation_id: s for s in t.earlier}
    rec = trees.get((p.pid, p.start_ticks))
    if rec is not None and rec[0] == t.target and rec[1] in by_id:
        return by_id[rec[1]], "recorded in that start's process tree"
    for a in chain[1:]:
        for s, until in ends:
            if a.pid == s.main_pid and _during(a.started_at, s, until):
                return s, f"its parent chain leads to that start's MainPID {s.main_pid}"
    named = {int(m) for m in _PARENT_FLAG.findall(" ".join(p.cmdline))}
    for s, until in ends:
        if s.main_pid in named and _during(p.started_at, s, until):
            return s, f"its command line names that start's MainPID {s.main_pid}"
    if in_unit:
        for s, until in reversed(ends):
            if _during(p.started_at, s, until):
                return s, f"in {t.unit}'s cgroup, begun during that start"
        return None, f"in {t.unit}'s cgroup, begun before the current start; genready has no record of its start"
    return None, ""


def attribute(gpu_procs: Iterable[ComputeProcess], chains: Mapping[int, Sequence[Proc]],
              targets: Sequence[TargetStarts], trees: Mapping[tuple[int, int], tuple[str, str]] | None = None,
              ) -> list[Holding]:
    """Each GPU process's Holding: whose start it is (see the module's docstring). `chains`: each
    PID's ancestry (the process first); a PID missing there is `unknown` (gone, or in another PID
    namespace); a process of none of the targets is `other`, with its unit."""
    trees = trees or {}
    out = []
    for g in gpu_procs:
        chain = chains.get(g.pid) or ()
        if not chain:
            out.append(Holding(g.gpu_uuid, g.pid, g.used_bytes, "unknown", why="not visible in /proc"))
            continue
        out.append(_one(g, chain, targets, trees))
    return out


def _one(g: ComputeProcess, chain: Sequence[Proc], targets: Sequence[TargetStarts],
         trees: Mapping[tuple[int, int], tuple[str, str]]) -> Holding:
    p = chain[0]

    def held(role: Role, t: TargetStarts | None, inv: str | None, why: str) -> Holding:
        return Holding(g.gpu_uuid, g.pid, g.used_bytes, role, t.target if t else None, inv, p.unit, p.command, why)

    for t in targets:  # the current start's first: a process is a stray only if no target's start claims it
        cur = t.current
        if cur is None:
            continue
        if cur.main_pid and any(a.pid == cur.main_pid for a in chain):
            return held("current", t, cur.invocation_id, "the current MainPID or its descendant")
        if _in_unit(p, t) and _during(p.started_at, cur, None):
            return held("current", t, cur.invocation_id, f"in {t.unit}'s cgroup, begun during the current start")
        if trees.get((p.pid, p.start_ticks)) == (t.target, cur.invocation_id):
            return held("current", t, cur.invocation_id, "recorded in the current start's process tree")
    for t in targets:
        in_unit = _in_unit(p, t)
        s, why = earlier_start(chain, t, trees, in_unit=in_unit)
        if s is not None or in_unit:
            return held("stray", t, s.invocation_id if s else None, why)
    return held("other", None, None, f"of {p.unit}" if p.unit else "of no unit")


# --- what the surfaces show ---------------------------------------------------------------------

@dataclass
class TargetGpu:
    """One target's GPU picture for /status: bytes held by the current start per GPU, and its strays."""

    current_bytes: dict[str, int] = field(default_factory=dict)
    strays: list[Holding] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"current_bytes": dict(self.current_bytes), "strays": [h.to_json() for h in self.strays],
                "stray_bytes": self.stray_bytes()}

    def stray_bytes(self) -> dict[str, int]:
        """Per GPU, the bytes strays hold (the metric `genready_gpu_stray_bytes{target,gpu}`)."""
        out: dict[str, int] = {}
        for h in self.strays:
            out[h.gpu_uuid] = out.get(h.gpu_uuid, 0) + (h.used_bytes or 0)
        return out


def per_target(holdings: Iterable[Holding], targets: Iterable[str]) -> dict[str, TargetGpu]:
    """Holdings grouped by target: every target named gets an entry, empty if nothing is its."""
    out = {t: TargetGpu() for t in targets}
    for h in holdings:
        if h.target is None or h.target not in out:
            continue
        tg = out[h.target]
        if h.role == "current":
            tg.current_bytes[h.gpu_uuid] = tg.current_bytes.get(h.gpu_uuid, 0) + (h.used_bytes or 0)
        elif h.role == "stray":
            tg.strays.append(h)
    return out
