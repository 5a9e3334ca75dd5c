"""What systemd says about one unit: the `Snapshot`, and the table from D-Bus properties to its fields.

Each property is defined once, in the table; a full read (GetAll), a signal (PropertiesChanged)
and the loop's quick read (QUICK, fresh.py) all go through it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from genready.systemd.bus import SERVICE_IFACE, UNIT_IFACE


def _hex(v: Any) -> str:
    return bytes(v).hex() if v else ""


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def exec_argvs(exec_start: Any) -> tuple[tuple[str, ...], ...]:
    """ExecStart's D-Bus value, a(sasbttttuii), as argv tuples. argv[0] may differ from the path
    (`ExecStart=@/path name …`); the path is what runs, so it replaces argv[0]."""
    out = []
    for entry in exec_start or []:
        path, argv = _s(entry[0]), [_s(a) for a in (entry[1] or [])]
        out.append(tuple([path, *argv[1:]] if path else argv))
    return tuple(out)


def exec_fingerprint(exec_start: Any) -> str:
    """A short digest of the command lines alone. The D-Bus value also carries the last run's
    timestamps and PID, which change with every start; this does not."""
    return fingerprint_of(exec_argvs(exec_start))


def fingerprint_of(argvs: tuple[tuple[str, ...], ...]) -> str:
    return hashlib.sha256(repr(argvs).encode()).hexdigest()[:16] if argvs else ""


@dataclass(frozen=True)
class Snapshot:
    """What systemd says about one unit at one moment. Times are CLOCK_REALTIME µs (for display and
    records), except *_mono_us (CLOCK_MONOTONIC µs, for durations); 0 = never."""

    unit: str
    load_state: str = ""
    active_state: str = ""
    sub_state: str = ""
    main_pid: int = 0
    exec_main_pid: int = 0  # the last main process, kept after it exited (MainPID is 0 then)
    invocation_id: str = ""
    job_id: int = 0
    exec_main_start_us: int = 0
    exec_main_start_mono_us: int = 0
    exec_main_exit_us: int = 0
    active_enter_us: int = 0
    inactive_enter_us: int = 0
    inactive_enter_mono_us: int = 0
    exec_main_code: int = 0  # CLD_* of the main process's end, 0 if none
    exec_main_status: int = 0
    n_restarts: int = 0
    result: str = ""
    exec_start: tuple[tuple[str, ...], ...] = ()  # ExecStart= as argv tuples (exec_argvs)
    environment: tuple[str, ...] = ()  # Environment= as KEY=VALUE, as systemd resolved it
    # A daemon-reload was seen and ExecStart/Environment not read since: they may be the old ones.
    # (systemd sends neither in PropertiesChanged: only a full read brings them.)
    exec_stale: bool = False
    fragment_path: str = ""  # the unit file and its drop-ins: where its output files are named
    dropin_paths: tuple[str, ...] = ()
    # The unit's own cgroup, exact ("" while systemd has none for it). No PropertiesChanged carries it:
    # only a full read brings it (the watcher reads a unit again when a new start appears).
    control_group: str = ""
    error: str = ""  # systemd refused to report on this unit (its D-Bus error); the bus itself is fine

    @property
    def exec_fingerprint(self) -> str:
        """The ExecStart= command lines, digested: "the same server configuration"."""
        return fingerprint_of(self.exec_start)

    @property
    def absent(self) -> bool:
        """The unit does not exist (no unit file, or not loaded yet), or systemd refuses to report on it."""
        return self.load_state in ("", "not-found") or bool(self.error)

    def to_json(self) -> dict[str, object]:
        return {
            "load_state": self.load_state, "active_state": self.active_state, "sub_state": self.sub_state,
            "main_pid": self.main_pid, "invocation_id": self.invocation_id, "job_pending": self.job_id != 0,
            "exec_main_start_us": self.exec_main_start_us, "n_restarts": self.n_restarts,
            "result": self.result,
        }


# D-Bus property -> (Snapshot field, converter). Each property is defined once, here.
_UNIT_PROPS: Final[dict[bytes, tuple[str, Callable[[Any], Any]]]] = {
    b"LoadState": ("load_state", _s),
    b"ActiveState": ("active_state", _s),
    b"SubState": ("sub_state", _s),
    b"InvocationID": ("invocation_id", _hex),
    b"Job": ("job_id", lambda v: int(v[0])),
    b"ActiveEnterTimestamp": ("active_enter_us", int),
    b"InactiveEnterTimestamp": ("inactive_enter_us", int),
    b"InactiveEnterTimestampMonotonic": ("inactive_enter_mono_us", int),
    b"FragmentPath": ("fragment_path", _s),
    b"DropInPaths": ("dropin_paths", lambda v: tuple(_s(p) for p in v or ())),
}
_SERVICE_PROPS: Final[dict[bytes, tuple[str, Callable[[Any], Any]]]] = {
    b"MainPID": ("main_pid", int),
    b"ExecMainPID": ("exec_main_pid", int),
    b"ExecMainStartTimestamp": ("exec_main_start_us", int),
    b"ExecMainStartTimestampMonotonic": ("exec_main_start_mono_us", int),
    b"ExecMainExitTimestamp": ("exec_main_exit_us", int),
    b"ExecMainCode": ("exec_main_code", int),
    b"ExecMainStatus": ("exec_main_status", int),
    b"NRestarts": ("n_restarts", int),
    b"Result": ("result", _s),
    b"ExecStart": ("exec_start", exec_argvs),
    b"Environment": ("environment", lambda v: tuple(_s(e) for e in v or ())),
    b"ControlGroup": ("control_group", _s),
}
_PROPS_BY_IFACE: Final = {UNIT_IFACE: _UNIT_PROPS, SERVICE_IFACE: _SERVICE_PROPS}


def apply_properties(snap: Snapshot, iface: bytes, changed: dict[bytes, Any]) -> Snapshot:
    """A new snapshot with the properties of one interface applied; unknown ones ignored."""
    table = _PROPS_BY_IFACE.get(iface, {})
    updates = {table[k][0]: table[k][1](v) for k, v in changed.items() if k in table}
    return replace(snap, **updates) if updates else snap


def settled(snap: Snapshot) -> Snapshot:
    """A not-found unit keeps its old service values in systemd's memory; they mean nothing now."""
    if snap.absent and not snap.error:
        return Snapshot(snap.unit, load_state=snap.load_state or "not-found", active_state="inactive")
    return snap


def snapshot_of(unit: str, reads: list[tuple[bytes, int, dict[bytes, Any]]], base: Snapshot | None = None,
                *, settle: bool = True) -> Snapshot:
    """`base` (or an empty snapshot) with the properties of each (interface, cookie, properties) applied."""
    snap = base or Snapshot(unit)
    for iface, _, props in reads:
        snap = apply_properties(snap, iface, props)
    return settled(snap) if settle else snap


# A quick read of a unit: the Properties.Get questions, in this order. InvocationID comes first
# and last: the manager answers a connection's calls in the order they were sent, so a start in
# between is always seen (each start gets a new ID).
QUICK: Final = ((UNIT_IFACE, b"InvocationID", "ay"), (UNIT_IFACE, b"LoadState", "s"),
                (SERVICE_IFACE, b"MainPID", "u"), (UNIT_IFACE, b"Job", "(uo)"),
                (UNIT_IFACE, b"ActiveState", "s"), (UNIT_IFACE, b"InvocationID", "ay"))


def quick_snapshot(unit: str, answers: list[Any]) -> Snapshot:
    """The identity and state of a unit from the answers to QUICK (a value, or the error systemd
    answered with, each). A start mid-read is reported as activating with a job, which no gate
    accepts as ready. Raises the first error that matters."""
    inv1, load, pid, job, active, inv2 = answers
    for (_, prop, _), value in zip(QUICK, answers, strict=True):
        # A unit systemd cannot load has no Service properties to give: its MainPID means nothing.
        if isinstance(value, Exception) and not (prop == b"MainPID" and not isinstance(load, Exception)
                                                 and load in ("", "not-found")):
            raise value
    snap = apply_properties(Snapshot(unit), UNIT_IFACE, {
        b"InvocationID": inv1, b"LoadState": load, b"Job": (job, b""), b"ActiveState": active})
    if not snap.absent:
        snap = apply_properties(snap, SERVICE_IFACE, {b"MainPID": pid})
    if snap.invocation_id != _hex(inv2):
        return replace(snap, active_state="activating", invocation_id=_hex(inv2), job_id=snap.job_id or 1)
    return snap
