"""The one systemd client: the Snapshot of a unit, its property table, and every D-Bus call genready makes.

pystemd is imported in this sub-package only (tests/test_layout.py checks it). The watcher's calls
run on a `Worker`: one thread per connection (sd-bus connections are not thread-safe), results
handed back to the event loop in order. pystemd keeps the GIL while sd-bus waits for an answer, so
a pystemd call stuck on a frozen manager stops every thread; the reads `/ready` and the heartbeat
need never wait at all (fresh.py, through sdbus.py), and the watcher's own calls (Subscribe,
GetAll, signals) are made only while the manager answers: `Worker.answering()` asks it
through sdbus right before each.

`Client` is the blocking face for the command line and the sweep (reading a unit, restart,
reset-failed, reload, runtime drop-ins: where they go, written atomically, removed).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from pystemd.dbuslib import DBus

    from genready.systemd import sdbus

log = logging.getLogger("genready.systemd.bus")

SYSTEMD: Final = b"org.freedesktop.systemd1"
MANAGER_PATH: Final = b"/org/freedesktop/systemd1"
MANAGER_IFACE: Final = b"org.freedesktop.systemd1.Manager"
UNIT_IFACE: Final = b"org.freedesktop.systemd1.Unit"
SERVICE_IFACE: Final = b"org.freedesktop.systemd1.Service"
PROPS_IFACE: Final = b"org.freedesktop.DBus.Properties"
# How long the loop waits for an answer the API needs (a fresh read for /ready): /ready must answer
# within 1 s even when the manager does not, so the bound sits below that.
READ_TIMEOUT: Final = 0.75
# How long anything else waits (connect, subscribe, a full read of a unit, a heartbeat) before the
# manager counts as unresponsive. The call itself goes on: its answer is still used when it comes.
CALL_TIMEOUT: Final = 2.0
# sd-bus's own method timeout for the daemon's connections (default 25 s): a call stuck on a frozen
# manager ends after this, and the next one is answered as soon as the manager is back.
SD_BUS_TIMEOUT: Final = 5.0
# How long `Worker.answering()` waits for the manager's Version (sdbus: the GIL left to the loop)
# before a pystemd call that would wait for the manager with the GIL held is skipped instead. Equal
# to READ_TIMEOUT: a manager that slow fails /ready's own reads as well.
PROBE_TIMEOUT: Final = READ_TIMEOUT


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
    return fingerprint_of(exec_argvs(exec_start))


def fingerprint_of(argvs: tuple[tuple[str, ...], ...]) -> str:
    return hashlib.sha256(repr(argvs).encode()).hexdigest()[:16] if argvs else ""


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
    error: str = ""  # systemd refused to report on this unit (its D-Bus error); the bus itself is fine

    @property
    def exec_fingerprint(self) -> str:
        """The ExecStart= command lines, digested: "the same server configuration"."""
        return fingerprint_of(self.exec_start)

    @property
    def absent(self) -> bool:
        """The unit does not exist (no unit file, or not loaded yet), or systemd refuses to report on it."""
        return self.load_state in ("", "not-found") or bool(self.error)

    @property
    def failed_start(self) -> bool:
        """No job pending and the unit is down, or waiting to be restarted after a failure."""
        return self.job_id == 0 and (self.active_state in ("failed", "inactive") or self.sub_state == "auto-restart")

    def how_it_ended(self) -> str:
        code = {1: "exited", 2: "killed", 3: "dumped"}.get(self.exec_main_code)
        return f"Result={self.result}" + (f", {code} with status {self.exec_main_status}" if code else "")

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
    b"ExecStart": ("exec_start", exec_argvs),
    b"Environment": ("environment", lambda v: tuple(_s(e) for e in v or ())),
}
_PROPS_BY_IFACE: Final = {UNIT_IFACE: _UNIT_PROPS, SERVICE_IFACE: _SERVICE_PROPS}
IFACES: Final = (UNIT_IFACE, SERVICE_IFACE)


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


T = TypeVar("T")


def retry_eintr(call: Callable[[], T], attempts: int = 3, quick: float = 0.5) -> T:
    """A signal arriving while sd-bus waits (SIGTERM, SIGHUP) fails the wait with EINTR. That says
    nothing about the bus or the unit: ask again, but only if the interrupted call was quick. One
    that had already waited `quick` seconds is stuck on an unanswering bus, and the signal (most
    likely SIGTERM) must get to the event loop. pystemd raises DBusInterruptedError, an
    InterruptedError whose errno is None (issue 24 #7): the class says it, not the errno."""
    for attempt in range(attempts):
        t0 = time.monotonic()
        try:
            return call()
        except Exception as e:
            eintr = isinstance(e, InterruptedError) or abs(getattr(e, "errno", 0) or 0) == errno.EINTR
            if not eintr or attempt == attempts - 1 or time.monotonic() - t0 > quick:
                raise
    raise AssertionError("unreachable")


def timed_out(e: BaseException) -> bool:
    """Did sd-bus give up waiting for the manager (its method timeout), rather than get an answer?"""
    return isinstance(e, TimeoutError) or abs(getattr(e, "errno", 0) or 0) == errno.ETIMEDOUT


def open_bus(kind: str) -> DBus:
    """A connected bus to the "system" or "user" manager; raises pystemd's DBusError if unreachable."""
    from pystemd.dbuslib import DBus  # here, not at the top: the CLI imports this module cheaply

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


def check_bus(kind: str, timeout: float = 2.0) -> None:
    """Raise unless the bus daemon completes a SASL handshake within `timeout` seconds.

    pystemd connects synchronously and keeps the GIL: against a bus socket nobody serves (a
    dbus-daemon being restarted, a socket unit whose service is stopping) it would freeze the
    whole process for sd-bus's 25 s. This asks first, with a plain socket (no GIL held)."""
    path = bus_socket_path(kind)
    if path is None:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
        line = s.recv(256)
    if not line.startswith(b"OK"):
        raise ConnectionError(f"the bus at {path} refused authentication: {line[:80]!r}")


def call(bus: DBus, path: bytes, iface: bytes, method: bytes, *args: bytes) -> Any:
    """One method call with string arguments, retried after EINTR."""
    return retry_eintr(lambda: bus.call_method(SYSTEMD, path, iface, method, [(ord("s"), a) for a in args]))


def manager_call(bus: DBus, method: bytes, *args: bytes) -> Any:
    return call(bus, MANAGER_PATH, MANAGER_IFACE, method, *args)


def read_all(bus: DBus, unit: str) -> list[tuple[bytes, int, dict[bytes, Any]]]:
    """GetAll of both interfaces: (interface, the reply's cookie, properties) each. The cookie
    orders the read against signals on the same connection (watcher.py)."""
    path = unit_path(unit)
    out = []
    for iface in IFACES:
        reply = call(bus, path, PROPS_IFACE, b"GetAll", iface)
        out.append((iface, int(reply.get_cookie()), reply.body or {}))
    return out


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


def ping(bus: DBus) -> None:
    """A question that involves no unit: does the manager answer at all?"""
    retry_eintr(lambda: bus.get_property(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, b"Version", b"s"))


class Unresponsive(TimeoutError):
    """The manager did not answer within the bound; the call goes on in its worker thread (or, raised
    by `Worker.answering()`, the call that was to follow was not made)."""


class Worker:
    """One daemon thread that owns one D-Bus connection and runs calls on it in order, off the loop.

    `submit(fn)` runs `fn(bus)` in the thread (connecting first if needed, then `on_open(bus)`)
    and settles an asyncio future on the loop. Results come back in the order the calls ran, and
    `apply(ok, result)`, if given, runs on the loop before anything else sees the result: the
    watcher relies on that to apply reads and signals in the order the thread saw them. A call
    that fails with anything but a timeout closes the connection; the next call opens a new one.
    """

    def __init__(self, kind: str, name: str, on_open: Callable[[Any], None] | None = None) -> None:
        self.kind = kind
        self.name = name
        self.bus: Any = None  # pystemd's DBus
        self.on_open = on_open
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._probe: sdbus.Connection | None = None  # answering()'s own connection, thread-owned

    def submit(self, fn: Callable[[Any], Any], apply: Callable[[bool, Any], None] | None = None
               ) -> asyncio.Future[Any]:
        if self._closed:
            raise ConnectionError(f"{self.name}: closed")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._q.put(_Job(fn, fut, apply))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"genready-{self.name}", daemon=True)
            self._thread.start()
        return fut

    async def run(self, fn: Callable[[Any], Any], *, bound: float = CALL_TIMEOUT,
                  apply: Callable[[bool, Any], None] | None = None) -> Any:
        """`fn(bus)` in the thread; Unresponsive after `bound` seconds (the call goes on)."""
        fut = self.submit(fn, apply)
        done, _ = await asyncio.wait([fut], timeout=bound)
        if not done:
            raise Unresponsive(f"the {self.kind} manager has not answered for {bound:g} s")
        return fut.result()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                break
            ok, res = self._one(job)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                job.fut.get_loop().call_soon_threadsafe(_settle, job, ok, res)
        self._close_bus()

    def _one(self, job: _Job) -> tuple[bool, Any]:
        try:
            if self.bus is None:
                bus = open_bus(self.kind)
                if self.on_open is not None:
                    try:
                        self.on_open(bus)
                    except BaseException:
                        # Half set up (not subscribed, say), even after a mere timeout: never reused.
                        with contextlib.suppress(Exception):
                            bus.close()
                        raise
                self.bus = bus
            return True, job.fn(self.bus)
        except BaseException as e:
            if not timed_out(e):
                self._close_bus()  # a broken connection is not reused
            return False, e

    def answering(self) -> None:
        """In the worker thread only, right before a pystemd call that waits for the manager: raise
        Unresponsive unless the manager answers a Version question within PROBE_TIMEOUT.

        pystemd keeps the GIL while sd-bus waits: a frozen manager (SIGSTOP, PID 1 in a long
        daemon-reload) would stop the event loop for sd-bus's whole method timeout. This question
        goes through sdbus, on a connection of its own, with the GIL left to the loop. What it
        cannot cover: the manager freezing in the microseconds between its answer and the pystemd
        call. That call then holds the GIL until sd-bus gives up, SD_BUS_TIMEOUT (5 s, `serve`
        sets SYSTEMD_BUS_TIMEOUT) at most."""
        from genready.systemd import sdbus  # here: only the daemon's watcher needs ctypes and libsystemd

        conn = self._probe
        try:
            if conn is None or not conn.alive():
                if conn is not None:
                    conn.close()
                conn = self._probe = sdbus.Connection(self.kind, int(PROBE_TIMEOUT * 1e6))
            retry_eintr(conn.version)
        except Exception as e:
            # Not reused: a late answer would stay queued in it for ever (nothing else reads it).
            self._close_probe()
            if timed_out(e):
                raise Unresponsive(f"the {self.kind} manager did not answer within {PROBE_TIMEOUT:g} s; "
                                   "nothing was asked on the watching connection") from e
            raise

    def _close_bus(self) -> None:
        bus, self.bus = self.bus, None
        if bus is not None:
            with contextlib.suppress(Exception):
                bus.close()
        self._close_probe()

    def _close_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            with contextlib.suppress(Exception):
                probe.close()

    def close(self) -> None:
        """Stop the thread once its queue is done (a call stuck on the manager ends by sd-bus's timeout)."""
        self._closed = True
        self._q.put(None)
        if self._thread is None:
            self._close_bus()


@dataclass(frozen=True)
class _Job:
    fn: Callable[[Any], Any]
    fut: asyncio.Future[Any]
    apply: Callable[[bool, Any], None] | None


def _settle(job: _Job, ok: bool, res: Any) -> None:
    if job.apply is not None:
        try:
            job.apply(ok, res)
        except Exception:
            log.exception("applying a D-Bus answer failed")
    settle(job.fut, ok, res)


def settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Resolve `fut` with a result or an exception, unless it is done already."""
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
        fut.exception()  # retrieved: a bounded wait that gave up must not log "never retrieved"


class Health:
    """Does the manager answer? One view for the daemon: the watcher and the fresh reads report to it.

    `on_change(responsive)` runs on the loop at each transition (the daemon logs it once, sets
    genready_systemd_responsive, and has the watcher re-read every unit after a thaw).
    """

    def __init__(self, on_change: Callable[[bool], None] | None = None) -> None:
        self.responsive = True
        self.since = time.monotonic()  # of the last transition
        self.on_change = on_change

    def stuck(self) -> None:
        self._set(False)

    def answered(self) -> None:
        self._set(True)

    def _set(self, responsive: bool) -> None:
        if responsive == self.responsive:
            return
        self.responsive, self.since = responsive, time.monotonic()
        if self.on_change is not None:
            self.on_change(responsive)

    def silent_for(self) -> float:
        return 0.0 if self.responsive else time.monotonic() - self.since


# --- the blocking client (command line, sweep) -----------------------------------------------------


def denied(e: BaseException) -> bool:
    """A D-Bus error that says we may not (AccessDenied, InteractiveAuthorizationRequired: root or a polkit
    rule would help), not that systemd refused what we asked (a unit it cannot load, ...)."""
    return getattr(e, "errno", None) in (errno.EACCES, errno.EPERM) or type(e).__name__ in (
        "DBusAccessDeniedError", "DBusInteractiveAuthorizationRequiredError")


def dbus_words(e: BaseException) -> str:
    """systemd's own message of a D-Bus error ("Unit x.service has a bad unit file setting."), without
    pystemd's wrapping ("DBusBaseError ... i bet you did not see that coming"). A call sd-bus gave up
    on says why, not sd-bus's bare "Connection timed out" after the command waited 25 s."""
    if timed_out(e):
        return ("systemd did not answer within sd-bus's method timeout (25 s unless SYSTEMD_BUS_TIMEOUT says "
                "otherwise): the manager is stopped, or busy in a long daemon-reload")
    msg = getattr(e, "err_message", None)
    if isinstance(msg, bytes):
        msg = msg.decode(errors="replace")
    return msg or str(e)


def runtime_unit_dir(kind: str) -> Path:
    """The manager's runtime unit directory (`systemctl edit --runtime` writes there)."""
    if kind == "system":
        return Path("/run/systemd/system")
    return Path(os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}") / "systemd" / "user"


class NotOnUnitPath(LookupError):
    """The manager does not search the runtime unit directory this process computed (for a user
    manager: XDG_RUNTIME_DIR is not the manager's), so a drop-in written there would be ignored."""


def runtime_dropin_path(kind: str, unit_paths: list[str], unit: str, name: str) -> Path:
    """Where the runtime drop-in `name` of `unit` goes, checked against the manager's UnitPath."""
    base = runtime_unit_dir(kind)
    if str(base) not in unit_paths:
        raise NotOnUnitPath(f"the {kind} manager does not load units from {base} (its UnitPath: "
                            f"{' '.join(unit_paths)}); is XDG_RUNTIME_DIR the manager's?")
    return base / f"{unit}.d" / name


def write_atomically(path: Path, text: str) -> None:
    """`text` at `path`, all of it or none: a temporary file beside it, fsync'd, renamed over it. The
    manager may reload at any moment (anyone's daemon-reload), and must never read half a drop-in.
    The mode is as open() makes it (0666 less the umask); the directory is made if missing. A
    failure leaves `path` as it was and no temporary file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class Client:
    """The blocking client of one manager, on one connection: for the command line and the sweep.

    Errors are pystemd's (or check_bus's), for the caller to word; a manager that does not answer
    fails a call after sd-bus's method timeout (25 s).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        check_bus(kind)
        self._bus = open_bus(kind)

    def read(self, unit: str) -> Snapshot:
        """Every property in the table (a unit not loaded yet is loaded first: it has none before)."""
        return snapshot_of(unit, [(iface, 0, props) for iface, props in self.read_raw(unit).items()])

    def read_raw(self, unit: str) -> dict[bytes, dict[bytes, Any]]:
        """Every property of the unit, as D-Bus gives them, by interface (the unit loaded first)."""
        manager_call(self._bus, b"LoadUnit", unit.encode())
        return {iface: props for iface, _, props in read_all(self._bus, unit)}

    def unit_paths(self) -> list[str]:
        paths = retry_eintr(lambda: self._bus.get_property(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, b"UnitPath", b"as"))
        return [_s(p) for p in paths]

    def reload(self) -> None:
        """Manager.Reload: returns once the manager has re-read every unit file (as daemon-reload)."""
        manager_call(self._bus, b"Reload")

    # Runtime drop-ins (`systemctl edit --runtime`): gone at reboot, applied in file-name order
    # among the unit's other drop-ins, whatever directory those sit in.

    def dropin_path(self, unit: str, name: str) -> Path:
        """The runtime drop-in `name` of `unit`, in the runtime unit directory the manager searches
        (NotOnUnitPath if it searches none this process can name)."""
        return runtime_dropin_path(self.kind, self.unit_paths(), unit, name)

    def write_dropin(self, unit: str, name: str, text: str, *,
                     written: Callable[[Path], None] | None = None) -> Path:
        """Put `text` in place as the runtime drop-in `name` of `unit` (atomically: write_atomically),
        then Manager.Reload so the unit's next start uses it; its path.

        The file's OSError (PermissionError for a system unit without root) means nothing changed.
        `written(path)` runs once the file is in place, before the reload: a reload that fails then
        raises its D-Bus error with the drop-in in place, for the caller to remove."""
        path = self.dropin_path(unit, name)
        write_atomically(path, text)
        if written is not None:
            written(path)
        self.reload()
        return path

    def remove_dropin(self, unit: str, name: str) -> Path:
        """Remove the runtime drop-in `name` of `unit` (there or not), and its directory if that is now
        empty (other drop-ins in it are not ours), then Manager.Reload; its path."""
        path = self.dropin_path(unit, name)
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()
        self.reload()
        return path

    def reset_failed(self, unit: str) -> None:
        manager_call(self._bus, b"ResetFailedUnit", unit.encode())

    def restart(self, unit: str, *, reset_failed: bool = False) -> None:
        """Queue a restart job ("replace") with the caller's privileges; with `reset_failed`, a
        failed unit's start limit is reset first."""
        if reset_failed:
            with contextlib.suppress(Exception):  # not failed: nothing to reset
                self.reset_failed(unit)
        manager_call(self._bus, b"RestartUnit", unit.encode(), b"replace")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._bus.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UnitClient(Client):
    """A Client for one unit (the sweep's): `state()`, `restart()` name it."""

    def __init__(self, kind: str, unit: str) -> None:
        super().__init__(kind)
        self.unit = unit

    def state(self) -> Snapshot:
        return self.read(self.unit)

    def restart(self, unit: str | None = None, *, reset_failed: bool = True) -> None:
        """Queue a restart job of the unit; a failed unit's start limit is reset first."""
        super().restart(unit or self.unit, reset_failed=reset_failed)


def restart_unit(kind: str, unit: str) -> None:
    """Queue a restart job (Manager.RestartUnit, mode "replace") with the caller's privileges."""
    with Client(kind) as c:
        c.restart(unit)
