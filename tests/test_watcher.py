"""The watcher and start records against a real systemd user manager (no LLM server needed).

The watched units run `sleep`: nothing answers generations, so no start is ever verified;
these tests are about what genready records of each start and how it follows systemd.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from genready.store import records
from genready.systemd.bus import unit_path
from genready.systemd.snapshot import Snapshot
from genready.systemd.watcher import Watcher
from genready_dev.harness import Genready, await_for, free_port, show, wait_for
from genready_dev.usermanager import UserManager

SLEEPER = """[Unit]
StartLimitIntervalSec=0

[Service]
ExecStart=/bin/sleep infinity
Restart={restart}
RestartSec=0.05
"""


def target(unit: str) -> dict[str, Any]:
    # Nothing listens on this port: probes fail (refused) and nothing becomes ready.
    return {"unit": unit, "url": f"http://127.0.0.1:{free_port()}", "backoff_initial": 0.5, "backoff_max": 2.0}


def test_unit_path_matches_systemd(manager: UserManager) -> None:
    out = manager.systemctl("show", "-p", "Id", "--value", "dbus.service").stdout.strip()
    assert out == "dbus.service"
    assert unit_path("web-1.service") == b"/org/freedesktop/systemd1/unit/web_2d1_2eservice"
    assert unit_path("a@b.service") == b"/org/freedesktop/systemd1/unit/a_40b_2eservice"


def new_start(manager: UserManager, unit: str, old: tuple[int, str]) -> tuple[int, str]:
    """Wait until systemd shows a running start other than `old`; its (MainPID, InvocationID)."""
    def changed() -> tuple[int, str] | None:
        s = show(manager, unit)
        return s if s != old and s[0] != 0 else None
    return wait_for(changed, 10, "a new start")


def _records_match(g: Genready, unit_starts: list[tuple[int, str]]) -> bool:
    recs = {r["invocation_id"]: r["main_pid"] for r in g.records("t")}
    return all(recs.get(inv) == pid for pid, inv in unit_starts[-20:])


def _on_disk_match(g: Genready, unit_starts: list[tuple[int, str]]) -> bool:
    """records.jsonl holds each of `unit_starts` with its pid (last line per invocation wins; a
    line still being written does not count)."""
    on_disk: dict[str, int] = {}
    for line in (g.state_dir / records.RECORDS_FILE).read_bytes().splitlines(keepends=True):
        if line.endswith(b"\n"):
            rec = json.loads(line)
            on_disk[rec["invocation_id"]] = rec["main_pid"]
    return all(on_disk.get(inv) == pid for pid, inv in unit_starts)


def test_every_start_is_recorded_with_systemds_pid_and_invocation(manager: UserManager, tmp_path: Path) -> None:
    unit = "tw-restarts.service"
    manager.install_unit(unit, SLEEPER.format(restart="always"))
    manager.systemctl("start", unit)
    starts = [show(manager, unit)]
    with Genready(manager, tmp_path, {"t": target(unit)}) as g:
        wait_for(lambda: _records_match(g, starts), 10, "the first start's record")
        for i in range(21):
            old = starts[-1]
            if i % 3 == 0:
                manager.systemctl("restart", unit)
            elif i % 3 == 1:
                manager.systemctl("restart", "--no-block", unit)
            else:
                manager.systemctl("kill", "-s", "SIGKILL", unit)  # Restart=always brings it back
            starts.append(new_start(manager, unit, old))
            wait_for(lambda: _records_match(g, starts), 10, f"record of start {i}")
        recs = g.records("t")
    invocations = [r["invocation_id"] for r in recs]
    assert len(invocations) == len(set(invocations)) == 20  # /status shows the newest 20
    by_inv = {r["invocation_id"]: r for r in recs}
    for pid, inv in starts[-20:]:
        assert by_inv[inv]["main_pid"] == pid
        assert by_inv[inv]["started_at"] and by_inv[inv]["started_at"].endswith("+00:00")
    # Every start but the newest has ended, and says how.
    ended = [r for r in recs if r["invocation_id"] != starts[-1][1]]
    assert all(r["ended_at"] for r in ended), ended
    assert {r["result"] for r in ended} >= {"signal"} or {r["exit_code"] for r in ended} >= {"killed"}
    manager.systemctl("stop", unit)


def test_sigkill_genready_loses_and_duplicates_nothing(manager: UserManager, tmp_path: Path) -> None:
    unit = "tw-kill9.service"
    manager.install_unit(unit, SLEEPER.format(restart="no"))
    manager.systemctl("start", unit)
    seen: list[tuple[int, str]] = [show(manager, unit)]
    g = Genready(manager, tmp_path, {"t": target(unit)}).start()
    for _ in range(4):
        manager.systemctl("restart", unit)
        seen.append(show(manager, unit))
        wait_for(lambda: _records_match(g, seen), 10, "records of the restarts")
    # What a kill -9 must not lose is what is on disk: remember() returns before its fsync (the
    # store's doc names that window), so the kill waits for the file, not only for /status.
    wait_for(lambda: _on_disk_match(g, seen), 10, "the records of the restarts on disk")
    manager.systemctl("restart", "--no-block", unit)
    g.stop(signal.SIGKILL)  # in the middle of a restart
    seen.append(new_start(manager, unit, seen[-1]))
    g2 = Genready(manager, tmp_path, {"t": target(unit)}).start()
    try:
        wait_for(lambda: _records_match(g2, seen), 10, "every start after the restart of genready")
        recs = g2.records("t")
        invs = [r["invocation_id"] for r in recs]
        assert len(invs) == len(set(invs)) == len(seen)
        # Reconciled: only the current start is still open.
        open_ = [r["invocation_id"] for r in recs if r["ended_at"] is None]
        assert open_ == [seen[-1][1]]
    finally:
        g2.stop()
        manager.systemctl("stop", unit)


def test_absent_unit_is_picked_up_when_it_appears(manager: UserManager, tmp_path: Path) -> None:
    unit = "tw-later.service"
    manager.remove_unit(unit)
    with Genready(manager, tmp_path, {"t": target(unit)}) as g:
        wait_for(lambda: g.status()["targets"]["t"]["state"] == "absent", 10, "state absent")
        manager.install_unit(unit, SLEEPER.format(restart="no"))
        manager.systemctl("daemon-reload")
        wait_for(lambda: g.status()["targets"]["t"]["state"] == "inactive", 10, "state inactive after reload")
        manager.systemctl("start", unit)
        pid, inv = show(manager, unit)
        wait_for(lambda: any(r["invocation_id"] == inv and r["main_pid"] == pid for r in g.records("t")), 10,
                 "the record of the first start")
        assert g.status()["targets"]["t"]["state"] in ("loading", "stuck")
    manager.remove_unit(unit)


def test_bus_loss_makes_state_unknown_then_recovers(manager: UserManager, tmp_path: Path) -> None:
    unit = "tw-bus.service"
    manager.install_unit(unit, SLEEPER.format(restart="no"))
    manager.systemctl("start", unit)
    with Genready(manager, tmp_path, {"t": target(unit)}) as g:
        wait_for(lambda: g.status()["targets"]["t"]["state"] == "loading", 10, "state loading")
        # Stopping the bus daemon drops every connection, genready's included; with its socket
        # gone too, reconnecting fails until it is back.
        manager.systemctl("stop", "dbus.socket", "dbus.service")
        try:
            wait_for(lambda: g.status()["targets"]["t"]["state"] == "unknown", 10, "state unknown")
            body = g.status()
            assert body["bus_connected"] is False and body["bus_error"]
            assert g.get("/ready/t")[0] == 503
        finally:
            manager.systemctl("start", "dbus.socket")
        wait_for(lambda: g.status()["targets"]["t"]["state"] == "loading", 20, "recovery after the bus is back")
        assert g.status()["bus_connected"] is True
        # Still following events after the reconnect.
        manager.systemctl("stop", unit)
        wait_for(lambda: g.status()["targets"]["t"]["state"] == "inactive", 10, "state inactive")


async def test_watcher_follows_a_restart_in_process(manager: UserManager) -> None:
    """The Watcher itself, in this process: the snapshots it reports match systemctl."""
    unit = "tw-inproc.service"
    manager.install_unit(unit, SLEEPER.format(restart="no"))
    manager.systemctl("start", unit)
    seen: list[Snapshot | None] = []
    w = Watcher("user", [unit], lambda u, s: seen.append(s))
    task = asyncio.create_task(w.run())
    try:
        pid, inv = show(manager, unit)
        await await_for(lambda: (s := w.snapshot(unit)) and (s.main_pid, s.invocation_id) == (pid, inv), 10,
                        "the first start")
        n = len(seen)
        await asyncio.to_thread(manager.systemctl, "restart", unit)
        pid2, inv2 = show(manager, unit)
        await await_for(lambda: (s := w.snapshot(unit)) and (s.main_pid, s.invocation_id, s.active_state)
                        == (pid2, inv2, "active"), 10, "the start after the restart")
        states = [s.active_state for s in seen[n:] if s]
        assert "inactive" in states or "deactivating" in states  # the stop was seen, not just the end
        # The start's monotonic time (what durations are measured from) comes with the signals too.
        mono = int(manager.show(unit, "ExecMainStartTimestampMonotonic")["ExecMainStartTimestampMonotonic"])
        assert mono > 0
        await await_for(lambda: (s := w.snapshot(unit)) and s.exec_main_start_mono_us == mono, 10,
                        "ExecMainStartTimestampMonotonic of the new start")
        assert abs(time.monotonic() - mono / 1e6) < 30  # the same clock as genready's time.monotonic()
        stopped = int(manager.show(unit, "InactiveEnterTimestampMonotonic")["InactiveEnterTimestampMonotonic"])
        assert 0 < stopped <= mono  # the restart's stop, before the new start
        await await_for(lambda: (s := w.snapshot(unit)) and s.inactive_enter_mono_us == stopped, 10,
                        "InactiveEnterTimestampMonotonic of the restart's stop")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        manager.systemctl("stop", unit)


async def test_fresh_read_agrees_with_a_full_read(manager: UserManager) -> None:
    """The fresh read /ready relies on (its questions sent at once, answers collected on the loop)
    gives what a full pystemd read gives: for a running unit, a stopped one, and one that does not
    exist; a burst of callers shares one read."""
    from genready.systemd.control import Client
    from genready.systemd.fresh import FreshReader

    unit = "tw-quick.service"
    manager.install_unit(unit, SLEEPER.format(restart="no"))
    manager.systemctl("start", unit)
    fresh = FreshReader("user")
    fields = ("load_state", "active_state", "main_pid", "invocation_id", "job_id")
    try:
        with Client("user") as full:
            for step in ("running", "stopped", "absent"):
                name = "tw-quick-nothing.service" if step == "absent" else unit
                reads = fresh.reads
                burst = await asyncio.gather(*(fresh.read(name) for _ in range(20)))
                assert fresh.reads == reads + 1 and len({id(s) for s in burst}) == 1, "one read for the burst"
                quick, slow = burst[0], await asyncio.to_thread(full.read, name)
                assert {f: getattr(quick, f) for f in fields} == {f: getattr(slow, f) for f in fields}, step
                if step == "running":
                    assert quick.main_pid == show(manager, unit)[0] > 0 and quick.active_state == "active"
                    await asyncio.to_thread(manager.systemctl, "stop", unit)
                elif step == "stopped":
                    assert quick.main_pid == 0 and quick.active_state == "inactive"
                else:
                    assert quick.absent and quick.main_pid == 0
    finally:
        fresh.close()
