"""Watch systemd units over D-Bus, event-driven, and keep one snapshot per unit.

One connection listens: `Manager.Subscribe()` plus a `PropertiesChanged` match per unit
path, its fd driven from the asyncio loop. A second connection serves fresh reads
(`FreshReader`), so a blocking call never pulls signals off the listening connection.

Ordering: systemd sends signals and method replies on one connection with increasing
cookies (serials). A full read records the reply's cookie per interface, and any signal
older than that read is dropped, so a state read after a signal is never overwritten by
the signal's older view.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVar

from pystemd.dbuslib import DBus

from genready import compat

log = logging.getLogger("genready.systemd.watcher")

SYSTEMD: Final = b"org.freedesktop.systemd1"
MANAGER_PATH: Final = b"/org/freedesktop/systemd1"
MANAGER_IFACE: Final = b"org.freedesktop.systemd1.Manager"
UNIT_IFACE: Final = b"org.freedesktop.systemd1.Unit"
SERVICE_IFACE: Final = b"org.freedesktop.systemd1.Service"
PROPS_IFACE: Final = b"org.freedesktop.DBus.Properties"


def unit_path(unit: str) -> bytes:
    """systemd's object path for a unit name (sd_bus_path_encode)."""
    out = bytearray(b"/org/freedesktop/systemd1/unit/")
    for i, ch in enumerate(unit.encode()):
        if chr(ch).isalnum() and ch < 128 and not (i == 0 and chr(ch).isdigit()):
            out.append(ch)
        else:
            out += b"_%02x" % ch
    return bytes(out)


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
    argvs = exec_argvs(exec_start)
    if not argvs:
        return ""
    return hashlib.sha256(repr(argvs).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Snapshot:
    """What systemd says about one unit at one moment. Times are CLOCK_REALTIME µs, 0 = never."""

    unit: str
    load_state: str = ""
    active_state: str = ""
    sub_state: str = ""
    main_pid: int = 0
    invocation_id: str = ""
    job_id: int = 0
    exec_main_start_us: int = 0
    exec_main_exit_us: int = 0
    active_enter_us: int = 0
    inactive_enter_us: int = 0
    exec_main_code: int = 0
    exec_main_status: int = 0
    n_restarts: int = 0
    result: str = ""
    exec_fingerprint: str = ""  # the ExecStart= command lines, digested: "the same server configuration"
    fragment_path: str = ""  # the unit file and its drop-ins: where its output files are named
    dropin_paths: tuple[str, ...] = ()
    error: str = ""  # systemd refused to report on this unit (its D-Bus error); the bus itself is fine

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
    b"FragmentPath": ("fragment_path", _s),
    b"DropInPaths": ("dropin_paths", lambda v: tuple(_s(p) for p in v or ())),
}
_SERVICE_PROPS: Final[dict[bytes, tuple[str, Callable[[Any], Any]]]] = {
    b"MainPID": ("main_pid", int),
    b"ExecMainStartTimestamp": ("exec_main_start_us", int),
    b"ExecMainExitTimestamp": ("exec_main_exit_us", int),
    b"ExecMainCode": ("exec_main_code", int),
    b"ExecMainStatus": ("exec_main_status", int),
    b"NRestarts": ("n_restarts", int),
    b"Result": ("result", _s),
    b"ExecStart": ("exec_fingerprint", exec_fingerprint),
}
_PROPS_BY_IFACE: Final = {UNIT_IFACE: _UNIT_PROPS, SERVICE_IFACE: _SERVICE_PROPS}


def apply_properties(snap: Snapshot, iface: bytes, changed: dict[bytes, Any]) -> Snapshot:
    """A new snapshot with the properties of one interface applied; unknown ones ignored."""
    table = _PROPS_BY_IFACE.get(iface, {})
    updates = {table[k][0]: table[k][1](v) for k, v in changed.items() if k in table}
    return replace(snap, **updates) if updates else snap


T = TypeVar("T")


def retry_eintr(call: Callable[[], T], attempts: int = 3, quick: float = 0.5) -> T:
    """pystemd keeps the GIL in sd-bus's blocking calls, so a signal arriving meanwhile (SIGTERM,
    SIGHUP) makes the wait fail with EINTR. That says nothing about the bus or the unit: ask again,
    but only if the interrupted call was quick. One that had already waited `quick` seconds is
    stuck on an unanswering bus, and the signal (most likely SIGTERM) must get to the event loop."""
    for attempt in range(attempts):
        t0 = time.monotonic()
        try:
            return call()
        except Exception as e:
            eintr = abs(getattr(e, "errno", 0) or 0) == errno.EINTR
            if not eintr or attempt == attempts - 1 or time.monotonic() - t0 > quick:
                raise
    raise AssertionError("unreachable")


def open_bus(kind: str) -> DBus:
    """A connected bus to the "system" or "user" manager; raises pystemd's DBusError if unreachable."""
    bus = DBus(user_mode=(kind == "user"))
    bus.open()
    return bus


def bus_socket_path(kind: str) -> str | None:
    """The unix socket path of the "system" or "user" bus, or None if its address is not a path."""
    if kind == "user":
        addr = os.environ.get("DBUS_SESSION_BUS_ADDRESS") or (
            f"unix:path={os.environ.get('XDG_RUNTIME_DIR', f'/run/user/{os.getuid()}')}/bus")
    else:
        addr = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/run/dbus/system_bus_socket")
    for part in addr.split(";")[0].removeprefix("unix:").split(","):
        if part.startswith("path="):
            return part[5:]
    return None


async def bus_answers(kind: str, timeout: float = 2.0) -> None:
    """Raise unless the bus daemon completes a SASL handshake within `timeout` seconds.

    pystemd connects synchronously and holds the GIL: against a bus socket nobody serves
    (a dbus-daemon being restarted, a socket unit whose service is stopping) it would
    freeze genready for sd-bus's 25 s timeout. This asks first, without blocking the loop.
    """
    path = bus_socket_path(kind)
    if path is None:
        return
    reader, writer = await compat.wait_for(asyncio.open_unix_connection(path), timeout)
    try:
        writer.write(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
        await writer.drain()
        line = await compat.wait_for(reader.readline(), timeout)
        if not line.startswith(b"OK"):
            raise ConnectionError(f"the bus at {path} refused authentication: {line[:80]!r}")
    finally:
        writer.close()


def restart_unit(bus_kind: str, unit: str) -> None:
    """Queue a restart job (Manager.RestartUnit, mode "replace") with the caller's privileges."""
    bus = open_bus(bus_kind)
    try:
        bus.call_method(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, b"RestartUnit",
                        [(ord("s"), unit.encode()), (ord("s"), b"replace")])
    finally:
        bus.close()


OnChange = Callable[[str, "Snapshot | None"], None]


class Watcher:
    """Keeps a snapshot per unit from D-Bus signals; reconnects with backoff when the bus drops.

    `on_change(unit, snapshot)` runs on the event loop after every change; a snapshot of
    None means "unknown": genready has no live connection to systemd.
    """

    def __init__(self, bus_kind: str, units: Iterable[str], on_change: OnChange) -> None:
        self.bus_kind = bus_kind
        self.units = list(dict.fromkeys(units))
        self.on_change = on_change
        self.connected = False
        self.last_error = ""
        self._snaps: dict[str, Snapshot] = {}
        self._read_cookie: dict[tuple[str, bytes], int] = {}
        self._by_path = {unit_path(u): u for u in self.units}
        self._bus: DBus | None = None
        self._lost: asyncio.Future[None] | None = None
        self._callbacks: tuple[Callable[..., None], ...] = ()
        self._dispatched = False
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
                await bus_answers(self.bus_kind)
                self._connect()
                await self._watch_units()
                backoff = 0.1
                assert self._lost is not None
                await self._lost
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

    def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        bus = open_bus(self.bus_kind)
        self._bus = bus
        self._lost = loop.create_future()
        self._read_cookie.clear()

        # pystemd stores metadata on the callback object, so it must be a plain function.
        def on_props(msg: Any, error: Any = None, userdata: Any = None) -> None:
            try:
                self._on_properties(msg)
            except Exception:
                log.exception("bad PropertiesChanged signal")

        def on_manager(msg: Any, error: Any = None, userdata: Any = None) -> None:
            try:
                self._on_manager(msg)
            except Exception:
                log.exception("bad Manager signal")

        # pystemd hands sd-bus a borrowed pointer to the callback: keep it alive as long as the bus.
        self._callbacks = (on_props, on_manager)
        # Without Subscribe() systemd emits no unit signals at all, even during a restart.
        bus.call_method(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, b"Subscribe", [])
        # Not UnitNew/UnitRemoved: reading a not-found unit loads it (UnitNew) and systemd
        # unloads it again (UnitRemoved), so refreshing on those feeds itself. A unit started
        # without daemon-reload announces itself through PropertiesChanged on its path.
        bus.match_signal(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, b"Reloading", on_manager)
        self._fd = bus.get_fd()
        loop.add_reader(self._fd, self._drain)
        self.connected = True
        self.last_error = ""
        shown = ", ".join(self.units) if len(self.units) <= 10 else f"{len(self.units)} units"
        log.info("connected to the %s bus; watching %s", self.bus_kind, shown)

    async def _watch_units(self) -> None:
        """Subscribe to and read each unit, yielding to the event loop between units: with many
        targets, the API and the probes of units already read run meanwhile (start-up is not
        one long blocking stretch)."""
        bus = self._bus
        on_props = self._callbacks[0]
        for unit in self.units:
            if self._bus is not bus or bus is None:
                return  # lost meanwhile: run() reconnects
            bus.match_signal(SYSTEMD, unit_path(unit), PROPS_IFACE, b"PropertiesChanged", on_props)
            self._refresh(unit)
            self._drain()  # the read may have queued signals without making the fd readable
            await asyncio.sleep(0)

    def _disconnect(self, why: str, *, lost: bool = True) -> None:
        bus, self._bus = self._bus, None
        was_connected, self.connected = self.connected, False
        self._forget_fd()
        if bus is not None:
            with contextlib.suppress(Exception):
                bus.close()
        self._snaps.clear()  # after a reconnect every unit is reported afresh
        if was_connected and lost:
            self.last_error = why
            log.warning("lost the %s bus (%s); every target is unknown until it is back", self.bus_kind, why)
            for unit in self.units:
                self.on_change(unit, None)

    def _drain(self) -> None:
        # sd-bus may buffer several messages from one read: process until nothing is left.
        bus = self._bus
        if bus is None:
            return
        try:
            while True:
                self._dispatched = False
                msg = bus.process()
                if msg.is_empty() and not self._dispatched:
                    break
            # At EOF sd-bus closes the fd itself (so epoll never wakes us again) and reports
            # the loss only on a later call: a negative fd is how we learn it now.
            if bus.get_fd() < 0:
                raise ConnectionError("the bus connection was closed")
        except Exception as e:
            self._lose(e)

    def _lose(self, e: Exception) -> None:
        """The connection is gone: say why and wake run(), which reconnects."""
        self.last_error = f"{type(e).__name__}: {e}"
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        # sd-bus may have closed the fd already: unregister the number we registered, now,
        # before anything can reuse it (a stale registration would swallow another socket).
        self._forget_fd()

    def _forget_fd(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            self._fd = -1

    def _on_properties(self, msg: Any) -> None:
        self._dispatched = True
        msg.process_reply(True)
        unit = self._by_path.get(msg.get_path())
        if unit is None:
            return
        iface, changed = msg.body[0], msg.body[1]
        if msg.get_cookie() <= self._read_cookie.get((unit, iface), 0):
            return  # older than a full read we already applied
        self._update(unit, apply_properties(self._snaps.get(unit, Snapshot(unit)), iface, changed))

    def _on_manager(self, msg: Any) -> None:
        self._dispatched = True
        msg.process_reply(True)
        # pystemd unwraps a single-argument body: Reloading(b) arrives as a bare bool.
        body = msg.body
        starting = body[0] if isinstance(body, list | tuple) else body
        if msg.get_member() == b"Reloading" and not starting:
            # After daemon-reload a unit file may have appeared, changed or gone.
            for unit in self.units:
                asyncio.get_running_loop().call_soon(self._refresh_and_drain, unit)

    def _refresh_and_drain(self, unit: str) -> None:
        try:
            self._refresh(unit)
        except Exception as e:
            self._lose(e)
            return
        self._drain()

    def _refresh(self, unit: str) -> None:
        """Read every property we keep, remembering the reply cookies (see module doc)."""
        bus = self._bus
        if bus is None:
            return
        snap = self._snaps.get(unit, Snapshot(unit))
        path = unit_path(unit)
        try:
            for iface in (UNIT_IFACE, SERVICE_IFACE):
                reply = retry_eintr(lambda iface=iface: bus.call_method(  # type: ignore[misc]
                    SYSTEMD, path, PROPS_IFACE, b"GetAll", [(ord("s"), iface)]))
                self._read_cookie[(unit, iface)] = reply.get_cookie()
                snap = apply_properties(snap, iface, reply.body or {})
        except Exception as e:
            if not self._bus_alive(bus):
                raise
            # An error about this one unit (e.g. systemd rejects its name) is that target's
            # problem: taking it for a lost bus would leave every target unknown, reconnecting.
            if self._unit_errors.get(unit) != str(e):
                log.warning("systemd refuses to report on %s (the bus itself works): %s", unit, e)
            self._unit_errors[unit] = str(e)
            self._update(unit, Snapshot(unit, load_state="error", active_state="inactive",
                                        error=f"{type(e).__name__}: {e}"))
            return
        self._unit_errors.pop(unit, None)
        if snap.absent:
            # A not-found unit keeps its old service values in memory; they mean nothing now.
            snap = Snapshot(unit, load_state=snap.load_state or "not-found", active_state="inactive")
        self._update(unit, snap)

    @staticmethod
    def _bus_alive(bus: DBus) -> bool:
        """Does the connection still answer a question that involves no unit?"""
        try:
            if bus.get_fd() < 0:
                return False
            retry_eintr(lambda: bus.get_property(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, b"Version", b"s"))
        except Exception:
            return False
        return True

    def _update(self, unit: str, snap: Snapshot) -> None:
        if self._snaps.get(unit) == snap:
            return
        self._snaps[unit] = snap
        self.on_change(unit, snap)


class FreshReader:
    """Reads a unit's identity and state on its own connection, sharing reads between callers.

    `read(unit)` returns a snapshot from a read that *began after the call*; every caller
    that arrives before the read starts shares it, so a burst of /ready requests costs one
    D-Bus round trip (~0.5 ms), not one per request.
    """

    def __init__(self, bus_kind: str) -> None:
        self.bus_kind = bus_kind
        self._bus: DBus | None = None
        self._pending: dict[str, asyncio.Future[Snapshot]] = {}
        self._connecting = asyncio.Lock()
        self.reads = 0

    async def read(self, unit: str) -> Snapshot:
        """A snapshot read after this call began; raises on D-Bus errors (caller: not ready)."""
        if self._bus is None:
            async with self._connecting:  # concurrent first readers must not each open a bus
                if self._bus is None:
                    await bus_answers(self.bus_kind)
                    self._bus = open_bus(self.bus_kind)
        fut = self._pending.get(unit)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._pending[unit] = fut
            # call_soon: the read runs after every handler already scheduled in this loop
            # iteration has joined it, and strictly after each of them arrived.
            asyncio.get_running_loop().call_soon(self._do_read, unit)
        return await asyncio.shield(fut)

    def _do_read(self, unit: str) -> None:
        fut = self._pending.pop(unit)
        try:
            snap = self.read_now(unit)
        except Exception as e:
            if not fut.done():
                fut.set_exception(e)
            fut.exception()  # don't warn about it when nobody waits any more
            return
        if not fut.done():
            fut.set_result(snap)

    def read_now(self, unit: str) -> Snapshot:
        """Blocking read: InvocationID first and last, so a start in between is always seen.

        The properties come from separate calls; the unchanged InvocationID around them
        proves no new start happened while they were read (each start gets a new ID).
        """
        if self._bus is None:
            raise ConnectionError("not connected to the bus")
        bus, path = self._bus, unit_path(unit)
        self.reads += 1
        try:
            def get(iface: bytes, prop: bytes, sig: bytes) -> Any:
                return retry_eintr(lambda: bus.get_property(SYSTEMD, path, iface, prop, sig))

            first = {b"InvocationID": get(UNIT_IFACE, b"InvocationID", b"ay"),
                     b"LoadState": get(UNIT_IFACE, b"LoadState", b"s")}
            snap = apply_properties(Snapshot(unit), UNIT_IFACE, first)
            if not snap.absent:
                snap = apply_properties(snap, SERVICE_IFACE, {b"MainPID": get(SERVICE_IFACE, b"MainPID", b"u")})
            snap = apply_properties(snap, UNIT_IFACE, {b"ActiveState": get(UNIT_IFACE, b"ActiveState", b"s"),
                                                       b"Job": get(UNIT_IFACE, b"Job", b"(uo)"),
                                                       b"DropInPaths": get(UNIT_IFACE, b"DropInPaths", b"as")})
            inv2 = apply_properties(Snapshot(unit), UNIT_IFACE,
                                    {b"InvocationID": get(UNIT_IFACE, b"InvocationID", b"ay")}).invocation_id
        except Exception:
            with contextlib.suppress(Exception):
                bus.close()
            self._bus = None
            raise
        if snap.invocation_id != inv2:
            # A start happened mid-read: report it as changing, which no gate accepts as ready.
            return replace(snap, active_state="activating", invocation_id=inv2, job_id=snap.job_id or 1)
        return snap

    def close(self) -> None:
        if self._bus is not None:
            with contextlib.suppress(Exception):
                self._bus.close()
            self._bus = None

