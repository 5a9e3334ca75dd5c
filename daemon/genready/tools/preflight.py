"""`genready check-config --probe`: one probe per target, now, with a verdict line each.

For an admin about to install a config: it answers "would genready verify these servers?" before
genready.service depends on it. The probe is the daemon's own (same request, same owner proof,
against the MainPID systemd reports right now); nothing is recorded.
"""

from __future__ import annotations

import asyncio
from typing import TextIO

from genready import compat, console
from genready.config import Config, TargetConfig
from genready.probe.probe import Prober
from genready.redact import escape
from genready.systemd.fresh import FreshReader
from genready.systemd.snapshot import Snapshot
from genready.vocab import ProbeResult

BUS_TIMEOUT = 10.0  # seconds to wait for systemd's answer about a unit


async def _unit_now(fresh: FreshReader, t: TargetConfig) -> tuple[Snapshot | None, str]:
    """(systemd's view of the unit now, a note when that is not a running unit's)."""
    try:
        snap = await compat.wait_for(fresh.read(t.unit), BUS_TIMEOUT)
    except Exception as e:  # any bus failure: the probe still runs, its owner cannot be proven
        return None, f"systemd could not be asked about {t.unit} ({e or type(e).__name__})"
    if snap.absent:
        return None, f"{t.unit} does not exist"
    if snap.active_state != "active":
        return snap, f"{t.unit} is {snap.active_state}/{snap.sub_state}"
    return snap, ""


async def _one(fresh: FreshReader, t: TargetConfig) -> tuple[ProbeResult, str]:
    snap, note = await _unit_now(fresh, t)
    prober = Prober(t)
    try:
        if snap is None:
            r = await prober.probe(0)
        else:
            r = await prober.probe(snap.main_pid, started_us=snap.exec_main_start_us, invocation_id=snap.invocation_id)
    finally:
        await prober.close()
    if prober.model_note and prober.model_note not in r.detail:  # which model was asked for, and why
        note = f"{prober.model_note}; {note}" if note else prober.model_note
    return r, note


def verdict(name: str, r: ProbeResult, note: str) -> str:
    tail = f" [{note}]" if note else ""
    if r.ok:
        who = f"pid {r.served_by_pid}" if r.served_by_pid else "owner not checked"
        return f"{name}: ok ({who}): {r.detail}{tail}"
    return f"{name}: {r.failure}: {r.detail}{tail}"


async def run(cfg: Config, out: TextIO) -> int:
    """Probe every target at once; print a verdict line each, in config order. 0 if all generated."""
    fresh = FreshReader(cfg.daemon.bus)
    try:
        results = await asyncio.gather(*(_one(fresh, t) for t in cfg.targets.values()))
    finally:
        fresh.close()
    for (name, _), (r, note) in zip(cfg.targets.items(), results, strict=True):
        console.write(escape(verdict(name, r, note)) + "\n", out)  # it quotes the server's answer
    return 0 if all(r.ok for r, _ in results) else 1
