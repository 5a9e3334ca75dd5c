"""The watcher's decisions, in-process (no bus): which of a signal and a read is newer, and what a
manager reload sets off. The same against a real manager: test_watcher.py, test_frozen.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from genready.systemd import worker as worker_module
from genready.systemd.bus import SERVICE_IFACE, UNIT_IFACE, unit_path
from genready.systemd.snapshot import Snapshot
from genready.systemd.watcher import Watcher, _read_unit
from genready.systemd.worker import Health, Unresponsive, Worker

UNIT = "w.service"


class RecordingWorker:
    """Stands for worker.Worker: keeps what the watcher asked for instead of asking systemd."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, Any]] = []

    def submit(self, fn: Any, apply: Any = None, bound: float = 0.0) -> asyncio.Future[Any]:
        self.jobs.append((fn, apply))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        return fut


def watching(seen: list[Snapshot | None]) -> tuple[Watcher, RecordingWorker]:
    w = Watcher("user", [UNIT], lambda unit, snap: seen.append(snap), Health())
    worker = RecordingWorker()
    w._worker = worker  # type: ignore[assignment]
    w._live = w.connected = True
    return w, worker


def read_reply(cookie: int, active: str, pid: int, inv: bytes) -> tuple[str, Any]:
    """What _read_unit hands back: both interfaces' GetAll, each with its reply cookie."""
    return "ok", [(UNIT_IFACE, cookie, {b"LoadState": b"loaded", b"ActiveState": active.encode(),
                                        b"InvocationID": list(inv), b"Job": (0, b"/")}),
                  (SERVICE_IFACE, cookie + 1, {b"MainPID": pid})]


async def test_a_signal_older_than_a_read_is_dropped_and_a_newer_one_applied() -> None:
    seen: list[Snapshot | None] = []
    w, _ = watching(seen)
    w._apply_read(UNIT, True, read_reply(10, "active", 42, b"\x01" * 16))
    assert w.snapshot(UNIT) is not None and w.snapshot(UNIT).active_state == "active"  # type: ignore[union-attr]
    # Sent before the read's reply (cookie 9 < 10), dispatched after it: systemd's older view.
    w._on_properties(unit_path(UNIT), UNIT_IFACE, {b"ActiveState": b"deactivating"}, 9)
    assert w.snapshot(UNIT).active_state == "active"  # type: ignore[union-attr]
    # The service interface has its own cookie: 10 is older than its read (11).
    w._on_properties(unit_path(UNIT), SERVICE_IFACE, {b"MainPID": 0}, 10)
    assert w.snapshot(UNIT).main_pid == 42  # type: ignore[union-attr]
    w._on_properties(unit_path(UNIT), UNIT_IFACE, {b"ActiveState": b"deactivating"}, 12)
    assert w.snapshot(UNIT).active_state == "deactivating"  # type: ignore[union-attr]
    assert [s.active_state for s in seen if s] == ["active", "deactivating"]


async def test_a_signal_for_another_path_is_ignored() -> None:
    seen: list[Snapshot | None] = []
    w, _ = watching(seen)
    w._on_properties(unit_path("other.service"), UNIT_IFACE, {b"ActiveState": b"active"}, 5)
    assert seen == [] and w.snapshot(UNIT) is None


async def test_a_finished_manager_reload_re_reads_every_unit() -> None:
    """Reloading(false): a unit file may have appeared, changed or gone; each unit is read again,
    and the signals drained after the reads (the reads may queue some without waking the fd)."""
    seen: list[Snapshot | None] = []
    w, worker = watching(seen)
    w._apply_drain(True, [("reloaded",)])
    reads = [apply for _, apply in worker.jobs if apply is not None and apply != w._apply_drain]
    assert len(reads) == 1  # one unit watched: one full read
    drains = [apply for _, apply in worker.jobs if apply == w._apply_drain]
    assert len(drains) == 1 and worker.jobs[-1][1] == w._apply_drain
    # The read's answer, applied: a unit that is gone after the reload is absent, not stale.
    reads[0](True, ("ok", [(UNIT_IFACE, 20, {b"LoadState": b"not-found", b"ActiveState": b"inactive"}),
                           (SERVICE_IFACE, 21, {b"MainPID": 7})]))
    s = w.snapshot(UNIT)
    assert s is not None and s.absent and s.main_pid == 0


async def test_a_unit_systemd_refuses_is_that_units_problem_not_a_lost_bus() -> None:
    seen: list[Snapshot | None] = []
    w, _ = watching(seen)
    w._apply_read(UNIT, True, ("unit_error", "DBusInvalidArgsError: bad name"))
    s = w.snapshot(UNIT)
    assert s is not None and s.error and s.absent and w.connected


async def test_a_timed_out_read_is_not_a_lost_bus() -> None:
    """A read that sd-bus gave up on (the manager is frozen) keeps the connection and the snapshots."""
    seen: list[Snapshot | None] = []
    w, _ = watching(seen)
    w._apply_read(UNIT, True, read_reply(10, "active", 42, b"\x02" * 16))
    w._apply_read(UNIT, False, TimeoutError(110, "no answer"))
    assert w.connected and w.snapshot(UNIT) is not None and seen[-1] is not None
    # But the read was lost: the manager counts as silent, so its first answer brings resync().
    assert not w.health.responsive


async def test_the_first_answer_after_a_skipped_read_reads_every_unit_again() -> None:
    seen: list[Snapshot | None] = []
    w, worker = watching(seen)
    w.health.on_change = lambda responsive: w.resync() if responsive else None  # as the daemon wires it
    w._apply_read(UNIT, False, Unresponsive("the probe had no answer"))
    assert not w.health.responsive and worker.jobs == []
    w.health.answered()
    reads = [apply for _, apply in worker.jobs if apply is not None and apply not in (w._apply_drain,
                                                                                      w._lose_on_error)]
    assert len(reads) == 1 and any(apply == w._lose_on_error for _, apply in worker.jobs)  # + Subscribe


class CountingBus:
    """Stands for pystemd's DBus: counts the calls that would wait for the manager."""

    def __init__(self) -> None:
        self.calls = 0

    def call_method(self, *args: Any) -> Any:
        self.calls += 1
        raise AssertionError("asked a manager the probe found silent")


def test_a_silent_manager_is_not_asked_on_the_watching_connection() -> None:
    """pystemd keeps the GIL while it waits: a read asks only after the sdbus probe has an answer."""
    bus = CountingBus()

    def silent() -> None:
        raise Unresponsive("no answer")

    with pytest.raises(Unresponsive):
        _read_unit(bus, UNIT, silent)
    assert bus.calls == 0


class FakeBus:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def test_a_connection_whose_setup_failed_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Subscribe skipped (or timed out) in on_open: that connection is closed, the next call opens anew,
    even though a timeout alone never closes a set-up connection."""
    opened: list[FakeBus] = []
    def on_open(bus: Any) -> None:
        if len(opened) == 1:
            raise Unresponsive("silent")

    def opener(kind: str) -> FakeBus:
        opened.append(FakeBus())
        return opened[-1]

    monkeypatch.setattr(worker_module, "open_bus", opener)
    worker = Worker("user", "test", on_open=on_open)
    try:
        with pytest.raises(Unresponsive):
            await worker.submit(lambda bus: bus)
        assert await worker.submit(lambda bus: bus) is opened[1]
        assert opened[0].closed and not opened[1].closed
    finally:
        worker.close()


def test_a_manager_that_never_answered_is_said_so_not_connection_timed_out() -> None:
    """The command line and the sweep wait sd-bus's 25 s on a frozen manager, then say why."""
    from pystemd.dbusexc import DBusBaseError

    from genready.systemd.bus import dbus_words

    late = DBusBaseError(-110, b"org.freedesktop.DBus.Error.Timeout", b"Connection timed out")
    assert "the manager is stopped, or busy in a long daemon-reload" in dbus_words(late)
    assert "busy" in dbus_words(TimeoutError(110, "x")) and dbus_words(OSError("plain")) == "plain"
