"""Start history: one StartRecord per systemd start of a target, kept from the watcher's snapshots.

The gate decides readiness; this module only remembers what systemd showed about each start
(InvocationID): when it began, became active, ended and how, and the gate's verdicts on it
(ready_at, revoked_at). Records live in the crash-safe RecordStore (records.py).

Records are history, not a precondition of readiness: a write that fails (a state_dir full of
model weights, or read-only) keeps the record in memory and never stops the gate; the store
reports the error and writes the records once it can (RecordStore.remember/sync).
"""

from __future__ import annotations

import shlex
import statistics
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from genready.redact import redact
from genready.store.records import RecordStore, StartRecord
from genready.systemd.snapshot import Snapshot
from genready.timewords import iso
from genready.vocab import ALIVE

# ExecMainCode is a CLD_* code from waitid(2); records keep it as text.
EXIT_CODE_NAMES = {1: "exited", 2: "killed", 3: "dumped", 4: "trapped", 5: "stopped", 6: "continued"}


# expected_load_seconds: the median of this many recent verified loads.
EXPECTED_FROM = 5


def expected_load(records: Iterable[StartRecord], fingerprint: str) -> float | None:
    """The median of the last (up to) EXPECTED_FROM verified loads with the same ExecStart= (its
    fingerprint); without those, of the unit's last EXPECTED_FROM loads; without those, None.
    `records` newest first."""
    loads = [(r.exec_fingerprint, r.load_seconds) for r in records if r.ready_at and r.load_seconds is not None]
    same = [s for f, s in loads if fingerprint and f == fingerprint][:EXPECTED_FROM]
    pick = same or [s for _, s in loads][:EXPECTED_FROM]
    return round(statistics.median(pick), 3) if pick else None


def _us(v: int) -> float | None:
    return v / 1e6 if v else None


def started_with(s: Snapshot) -> dict[str, Any]:
    """What a start that `s` shows runs with, as record fields; {} while a daemon-reload was seen
    and not read yet (the unit's ExecStart/Environment may be the old ones)."""
    if s.exec_stale or not s.exec_start:
        return {}
    return {"exec_start": tuple(shlex.join(argv) for argv in s.exec_start), "environment": s.environment,
            "exec_fingerprint": s.exec_fingerprint or None}


def config_changes(rec: StartRecord | None, s: Snapshot) -> list[str]:
    """How the unit's ExecStart= and Environment= now differ from what the start `rec` runs with
    (someone edited a drop-in and reloaded, without restarting): [] if they do not, or if either
    side is not known. Values pass through redact (/ready and /status are open to local users)."""
    if rec is None or rec.exec_start is None or rec.environment is None or s.invocation_id != rec.invocation_id:
        return []
    now = started_with(s)
    if not now:
        return []
    out = []
    if now["exec_start"] != rec.exec_start:
        out.append(f"ExecStart: {' ; '.join(rec.exec_start)} is now {' ; '.join(now['exec_start'])}")
    before, after = _env(rec.environment), _env(now["environment"])
    for key in sorted(before.keys() | after.keys()):
        if key not in after:
            out.append(f"Environment: {key}={before[key]} removed")
        elif key not in before:
            out.append(f"Environment: {key}={after[key]} added")
        elif before[key] != after[key]:
            out.append(f"Environment: {key}={before[key]} is now {key}={after[key]}")
    return [redact(line) for line in out]


def _env(entries: Iterable[str]) -> dict[str, str]:
    return {key: value for key, _, value in (e.partition("=") for e in entries)}


def ended(s: Snapshot) -> bool:
    """`s` shows its start over: no process, no job pending, and the unit down or waiting to be
    restarted. (Not inactive alone: for a moment at each start systemd shows inactive/dead with
    the NEW InvocationID and the NEW MainPID, a job pending.)"""
    return s.main_pid == 0 and s.job_id == 0 and (s.active_state in ("inactive", "failed")
                                                   or s.sub_state == "auto-restart")


class History:
    """The start records of one target, updated from each new snapshot of its unit."""

    def __init__(self, target: str, unit: str, store: RecordStore) -> None:
        self.target = target
        self.unit = unit
        self.store = store
        self._reconciled = False

    def get(self, invocation_id: str) -> StartRecord | None:
        return self.store.get(self.target, invocation_id)

    def observe(self, s: Snapshot) -> StartRecord | None:
        """Bring the records up to date with `s`; the new record if `s` shows a start not seen before."""
        if not self._reconciled:
            self._reconcile(s)
        if not s.invocation_id:
            return None
        rec = self.get(s.invocation_id)
        # activating/auto-restart still carries the old InvocationID while the new MainPID may
        # already be announced; only a start in progress or running owns its MainPID.
        alive = s.active_state in ALIVE and s.sub_state != "auto-restart"
        over = ended(s)
        created = None
        if rec is None:
            self._end_open_records(s)
            # A start already over when first seen (its process exited within milliseconds, and
            # systemd's signals about it came as one): systemd resets ExecMain* at each start, so
            # those are this start's own.
            rec = created = StartRecord(
                target=self.target, unit=self.unit, invocation_id=s.invocation_id,
                main_pid=s.main_pid if alive else s.exec_main_pid if over else 0,
                started_at=iso(_us(s.exec_main_start_us) if alive or over else None) or iso(time.time()),
                active_at=None, ended_at=None, result=None, exit_code=None, exit_status=None,
                n_restarts=s.n_restarts, **started_with(s),
            )
            self.store.remember(rec)
        if rec.ended_at is not None:
            return created  # an ended start is final
        new = rec
        if rec.exec_start is None and (known := started_with(s)):
            new = replace(new, **known)  # created while a daemon-reload was not yet read (or by an older genready)
        # During a restart systemd announces the new MainPID a moment before the new
        # InvocationID; only a live unit's MainPID belongs to its current invocation.
        if alive and s.main_pid and s.main_pid != rec.main_pid:
            new = replace(new, main_pid=s.main_pid, started_at=iso(_us(s.exec_main_start_us)) or new.started_at)
        if s.active_state == "active" and new.active_at is None:
            new = replace(new, active_at=iso(_us(s.active_enter_us)) or iso(time.time()))
        if new.ended_at is None and (over or (s.active_state in ("inactive", "failed") and new.main_pid)):
            new = self._ended(new, s)
        if s.n_restarts != new.n_restarts and alive:
            new = replace(new, n_restarts=s.n_restarts)
        if new != rec:
            self.store.remember(new)
        return created

    def expected_load(self, fingerprint: str) -> float | None:
        """expected_load_seconds for a start whose ExecStart= has `fingerprint`."""
        return expected_load(self.store.newest(self.target, 100), fingerprint)

    def mark_ready(self, invocation_id: str, *, ready_at: float, load_seconds: float | None, probes: int,
                   served_by_pid: int | None) -> StartRecord | None:
        """Record a verification of this start (and clear an earlier revocation of it)."""
        rec = self.get(invocation_id)
        if rec is None:
            return None
        rec = replace(rec, ready_at=iso(ready_at), load_seconds=load_seconds, probes=probes,
                      served_by_pid=served_by_pid, revoked_at=None, revoke_reason=None)
        self.store.remember(rec)
        return rec

    def mark_revoked(self, invocation_id: str, reason: str) -> None:
        rec = self.get(invocation_id)
        if rec is not None:
            self.store.remember(replace(rec, revoked_at=iso(time.time()), revoke_reason=str(reason)))

    def _ended(self, rec: StartRecord, s: Snapshot | None) -> StartRecord:
        if s is None or s.invocation_id != rec.invocation_id:
            # It ended while we were not looking (new start, or genready was down).
            return replace(rec, ended_at=iso(time.time()), result=rec.result or "unknown")
        if not rec.main_pid and s.exec_main_pid:  # first seen between its job and its process
            rec = replace(rec, main_pid=s.exec_main_pid, started_at=iso(_us(s.exec_main_start_us)) or rec.started_at)
        return replace(
            rec, ended_at=iso(_us(s.inactive_enter_us) or _us(s.exec_main_exit_us) or time.time()),
            result=s.result or None, exit_code=EXIT_CODE_NAMES.get(s.exec_main_code),
            exit_status=s.exec_main_status if s.exec_main_code else None,
        )

    def _end_open_records(self, s: Snapshot) -> None:
        for rec in self.store.newest(self.target, 5):
            if rec.ended_at is None and rec.invocation_id != s.invocation_id:
                self.store.remember(self._ended(rec, None))

    def _reconcile(self, s: Snapshot) -> None:
        """After genready restarts: close records whose start systemd no longer runs."""
        self._reconciled = True
        for rec in self.store.all(self.target):
            gone = rec.invocation_id != s.invocation_id or s.active_state in ("inactive", "failed")
            if rec.ended_at is None and gone:
                self.store.remember(self._ended(rec, s))
