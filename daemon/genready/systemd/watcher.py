"""Watch systemd units over D-Bus, event-driven, and keep one snapshot per unit.

One connection listens: `Manager.Subscribe()` plus a `PropertiesChanged` match per unit
path. It lives in a worker thread (worker.Worker), so the event loop never waits on it. The fresh
reads /ready needs are not made here: `fresh.FreshReader` makes them on the event loop, on a
connection of its own (sdbus), so they never wait behind the listening connection's work. A
manager that does not answer (SIGSTOPped, or busy in a long daemon-reload) shows as
`Health.responsive` False instead of freezing /ready, /status and /metrics.

Before each call on the listening connection that waits for the manager (Subscribe, GetAll, the
ping) its worker asks the manager first (`Worker.answering()`, see the package's docstring for
why). A manager that does not answer is not asked: the call fails Unresponsive, `health` says so,
and the re-read after the thaw (`resync()`) makes up for it. AddMatch is answered by the bus
daemon, not the manager.

Ordering: systemd sends signals and method replies on one connection with increasing
cookies (serials). A full read records the reply's cookie per interface, and any signal
older than that read is dropped, so a state read after a signal is never overwritten by
the signal's older view. The worker hands results back to the loop in the order it saw them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from genready.systemd.bus import (
    MANAGER_IFACE,
    MANAGER_PATH,
    PROPS_IFACE,
    SYSTEMD,
    check_bus,
    manager_call,
    ping,
    read_all,
    timed_out,
    unit_path,
)
from genready.systemd.snapshot import Snapshot, snapshot_of
from genready.systemd.worker import CALL_TIMEOUT, Health, Worker

if TYPE_CHECKING:
    from pystemd.dbuslib import DBus

log = logging.getLogger("genready.systemd.watcher")

OnChange = Callable[[str, "Snapshot | None"], None]
_Read = tuple[str, Any]  # ("ok", the GetAll replies) or ("unit_error", what systemd said about the unit)


class Watcher:
    """Keeps a snapshot per unit from D-Bus signals; reconnects with backoff when the bus drops.

    `on_change(unit, snapshot)` runs on the event loop after every change; a snapshot of
    None means "unknown": genready has no live connection to systemd. A manager that stops
    answering is not a lost connection: the snapshots stay, `health` says it, and once the
    manager answers again `resync()` re-reads every unit.
    """

    def __init__(self, bus_kind: str, units: Iterable[str], on_change: OnChange,
                 health: Health | None = None) -> None:
        self.bus_kind = bus_kind
        self.units = list(dict.fromkeys(units))
        self.on_change = on_change
        self.health = health or Health()
        self.connected = False  # following: connected, subscribed, and every unit read once
        self._live = False  # the connection is set up (its results are applied)
        self.last_error = ""
        self._snaps: dict[str, Snapshot] = {}
        self._read_cookie: dict[tuple[str, bytes], int] = {}
        self._by_path = {unit_path(u): u for u in self.units}
        self._worker: Worker | None = None
        self._lost: asyncio.Future[None] | None = None
        self._callbacks: tuple[Callable[..., None], ...] = ()
        self._inbox: list[tuple[Any, ...]] = []  # filled by the callbacks, in the worker thread only
        self._dispatched = False
        self._draining = False
        self._fd = -1
        self._unit_errors: dict[str, str] = {}  # unit -> the D-Bus error last logged for it

    def snapshot(self, unit: str) -> Snapshot | None:
        """The latest snapshot, or None while disconnected (state unknown)."""
        return self._snaps.get(unit) if self.connected else None

    async def run(self) -> None:
        """Connect, follow signals, and reconnect with backoff forever (until cancelled)."""
        backoff = 0.1
        while True:
            try:
                await self._connect()
                await self._call(lambda bus: None)  # every unit read (queued before it) is applied
                self.connected = True
                shown = ", ".join(self.units) if len(self.units) <= 10 else f"{len(self.units)} units"
                log.info("connected to the %s bus; watching %s", self.bus_kind, shown)
                backoff = 0.1
                await self._follow()
            except asyncio.CancelledError:
                # Stopping is not losing the bus: nobody should be told the targets are unknown.
                self.on_change = lambda unit, snap: None
                self._disconnect("shutting down", lost=False)
                raise
            except Exception as e:  # pystemd raises DBusError and, from callbacks, SystemError
                self._disconnect(f"{type(e).__name__}: {e}")
            self._disconnect(self.last_error or "connection lost")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    # -- calls on the listening connection ---------------------------------------------------

    async def _call(self, fn: Callable[[DBus], Any], apply: Callable[[bool, Any], None] | None = None) -> Any:
        """`fn(bus)` on the worker. Past CALL_TIMEOUT the manager counts as unresponsive, and the
        call is awaited on: its answer, when the manager is back, is still applied."""
        worker = self._worker
        if worker is None:
            raise ConnectionError("not connected")
        fut = worker.submit(fn, apply)
        done, _ = await asyncio.wait([fut], timeout=CALL_TIMEOUT)
        if not done:
            self.health.silent()
            await asyncio.wait([fut])  # sd-bus ends it after its method timeout at the latest
        e = fut.exception()
        if e is None or not timed_out(e):
            self.health.answered()
        else:
            self.health.silent()  # the call was skipped or gave up: the re-read after the thaw makes up for it
        self._kick()  # the call may have queued signals without making the fd readable
        return fut.result()

    async def _connect(self) -> None:
        # pystemd stores metadata on the callback object, so it must be a plain function.
        def on_props(msg: Any, error: Any = None, userdata: Any = None) -> None:
            self._dispatched = True
            try:
                msg.process_reply(True)
                self._inbox.append((msg.get_path(), msg.body[0], msg.body[1], msg.get_cookie()))
            except Exception:
                log.exception("bad PropertiesChanged signal")

        def on_manager(msg: Any, error: Any = None, userdata: Any = None) -> None:
            self._dispatched = True
            try:
                msg.process_reply(True)
                # pystemd unwraps a single-argument body: Reloading(b) arrives as a bare bool.
                body = msg.body
                starting = body[0] if isinstance(body, list | tuple) else body
                if msg.get_member() == b"Reloading" and not starting:
                    self._inbox.append(("reloaded",))
            except Exception:
                log.exception("bad Manager signal")

        def on_open(bus: DBus) -> None:
            # Without Subscribe() systemd emits no unit signals at all, even during a restart.
            # Asked only of a manager that answers (see the module doc); the first call on a new
            # connection also waits for the bus daemon's Hello, which the probe's answer vouches for.
            worker.answering()
            manager_call(bus, b"Subscribe")
            # Not UnitNew/UnitRemoved: reading a not-found unit loads it (UnitNew) and systemd
            # unloads it again (UnitRemoved), so refreshing on those feeds itself. A unit started
            # without daemon-reload announces itself through PropertiesChanged on its path.
            bus.match_signal(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, b"Reloading", on_manager)
            for unit in self.units:
                bus.match_signal(SYSTEMD, unit_path(unit), PROPS_IFACE, b"PropertiesChanged", on_props)

        # pystemd hands sd-bus a borrowed pointer to the callback: keep it alive as long as the bus.
        self._callbacks = (on_props, on_manager)
        # pystemd connects synchronously: ask the bus socket first (check_bus).
        await asyncio.to_thread(check_bus, self.bus_kind)
        self._lost = asyncio.get_running_loop().create_future()
        self._read_cookie.clear()
        self._worker = worker = Worker(self.bus_kind, "watcher", on_open=on_open)
        self._fd = await self._call(lambda bus: bus.get_fd())
        asyncio.get_running_loop().add_reader(self._fd, self._on_readable)
        self._live = True
        self.last_error = ""
        self._refresh(self.units)

    async def _follow(self) -> None:
        """Until the connection is lost. No heartbeat here: fresh.FreshReader.heartbeat asks
        without waiting instead."""
        assert self._lost is not None
        await self._lost

    def resync(self) -> None:
        """The manager answers again after a silence: make sure the subscription still holds
        (systemd answers AlreadySubscribed if it does) and re-read every unit, so no change the
        silence hid is missed."""
        worker = self._worker
        if worker is None or not self._live or not self.health.responsive:
            return

        def subscribe(bus: DBus) -> None:
            worker.answering()
            try:
                manager_call(bus, b"Subscribe")
            except Exception as e:
                if "AlreadySubscribed" not in f"{type(e).__name__} {e}" and "already subscribed" not in str(e):
                    raise

        worker.submit(subscribe, self._lose_on_error)
        self._refresh(self.units)
        self._kick()

    # -- signals ----------------------------------------------------------------------------

    def _on_readable(self) -> None:
        # The worker reads the fd: stop watching it until that drain is done, or the loop would
        # call this again and again meanwhile.
        self._forget_fd(keep_number=True)
        self._kick()

    def _kick(self) -> None:
        """Schedule one drain of the connection, unless one is already queued."""
        if self._draining or self._worker is None or not self._live:
            return
        self._draining = True
        self._worker.submit(self._drain, self._apply_drain)

    def _drain(self, bus: DBus) -> list[tuple[Any, ...]]:
        # In the worker. sd-bus may buffer several messages from one read: process until nothing is left.
        while True:
            self._dispatched = False
            msg = bus.process()
            if msg.is_empty() and not self._dispatched:
                break
        # At EOF sd-bus closes the fd itself (so epoll never wakes us again) and reports
        # the loss only on a later call: a negative fd is how we learn it now.
        if bus.get_fd() < 0:
            raise ConnectionError("the bus connection was closed")
        out, self._inbox = self._inbox, []
        return out

    def _apply_drain(self, ok: bool, res: Any) -> None:
        self._draining = False
        if not ok:
            self._lose(res)
            return
        for item in res:
            if item[0] == "reloaded":
                # After daemon-reload a unit file may have appeared, changed or gone. Until each unit is
                # read again, a start seen meanwhile must not take the old ExecStart/Environment for its own.
                for unit, snap in list(self._snaps.items()):
                    self._snaps[unit] = replace(snap, exec_stale=True)
                self._refresh(self.units)
            else:
                self._on_properties(*item)
        if self._live and self._fd >= 0:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().add_reader(self._fd, self._on_readable)

    def _on_properties(self, path: bytes, iface: bytes, changed: dict[bytes, Any], cookie: int) -> None:
        unit = self._by_path.get(path)
        if unit is None:
            return
        if cookie <= self._read_cookie.get((unit, iface), 0):
            return  # older than a full read we already applied
        old = self._snaps.get(unit, Snapshot(unit))
        snap = snapshot_of(unit, [(iface, cookie, changed)], old, settle=False)
        self._update(unit, snap)
        if snap.invocation_id and snap.invocation_id != old.invocation_id and not snap.control_group:
            # A new start, and the unit's cgroup not known yet: no signal ever carries ControlGroup
            # (what GPU attribution matches processes by), so read the unit once more.
            self._refresh([unit])

    # -- full reads -------------------------------------------------------------------------

    def _refresh(self, units: Iterable[str]) -> None:
        """Queue a full read of each unit (reply cookies remembered: see module doc)."""
        worker = self._worker
        if worker is None:
            return
        for unit in units:
            worker.submit(lambda bus, unit=unit: _read_unit(bus, unit, worker.answering),  # type: ignore[misc]
                          lambda ok, res, unit=unit: self._apply_read(unit, ok, res))  # type: ignore[misc]
        self._kick()

    def _apply_read(self, unit: str, ok: bool, res: Any) -> None:
        if not ok:
            if timed_out(res):
                # Not read (the manager did not answer): marked unresponsive, so the first answer
                # after the silence brings resync(), which reads it again. Else a read lost to a
                # short freeze the heartbeat missed would leave the snapshot stale (exec_stale after
                # a reload, or a change whose signal came before the read).
                log.debug("%s not read now: %s", unit, res)
                self.health.silent()
            else:
                self._lose(res)
            return
        kind, value = res
        if kind == "unit_error":
            # An error about this one unit (e.g. systemd rejects its name) is that target's
            # problem: taking it for a lost bus would leave every target unknown, reconnecting.
            if self._unit_errors.get(unit) != value:
                log.warning("systemd refuses to report on %s (the bus itself works): %s", unit, value)
            self._unit_errors[unit] = value
            self._update(unit, Snapshot(unit, load_state="error", active_state="inactive", error=value))
            return
        self._unit_errors.pop(unit, None)
        for iface, cookie, _ in value:
            self._read_cookie[(unit, iface)] = cookie
        self._update(unit, replace(snapshot_of(unit, value, self._snaps.get(unit, Snapshot(unit))), exec_stale=False))

    # -- losing the connection --------------------------------------------------------------

    def _lose_on_error(self, ok: bool, res: Any) -> None:
        if not ok:
            if timed_out(res):
                self.health.silent()  # asked again by the resync after the thaw
            else:
                self._lose(res)

    def _lose(self, e: BaseException) -> None:
        """The connection is gone: say why and wake run(), which reconnects."""
        self.last_error = f"{type(e).__name__}: {e}"
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        # sd-bus may have closed the fd already: unregister the number we registered, now,
        # before anything can reuse it (a stale registration would swallow another socket).
        self._forget_fd()

    def _disconnect(self, why: str, *, lost: bool = True) -> None:
        worker, self._worker = self._worker, None
        was_connected, self.connected = self.connected or self._live, False
        self._live = False
        self._forget_fd()
        self._draining = False
        if worker is not None:
            worker.close()
        self._snaps.clear()  # after a reconnect every unit is reported afresh
        if was_connected and lost:
            self.last_error = why
            log.warning("lost the %s bus (%s); every target is unknown until it is back", self.bus_kind, why)
            for unit in self.units:
                self.on_change(unit, None)

    def _forget_fd(self, *, keep_number: bool = False) -> None:
        if self._fd >= 0:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            if not keep_number:
                self._fd = -1

    def _update(self, unit: str, snap: Snapshot) -> None:
        if self._snaps.get(unit) == snap:
            return
        self._snaps[unit] = snap
        self.on_change(unit, snap)


def _read_unit(bus: DBus, unit: str, answering: Callable[[], None]) -> _Read:
    """In the worker: a full read of `unit`, or ("unit_error", why) when systemd refuses to report
    on this one unit while the connection itself still answers. `answering()` (Worker.answering)
    raises Unresponsive before any pystemd call could wait on a frozen manager.
    The two GetAll of read_all follow one probe: a freeze between them is the window its doc names."""
    answering()
    try:
        return "ok", read_all(bus, unit)
    except Exception as e:
        if timed_out(e):
            raise
        answering()  # a manager that stopped since is Unresponsive (re-read later), not this unit's error
        try:
            ping(bus)
        except Exception:
            raise e from None
        return "unit_error", f"{type(e).__name__}: {e}"
