"""Connecting to a systemd manager and calling it through pystemd: the D-Bus names, the calls
with their EINTR retry, and the words for what a D-Bus error means.

The watcher's `Worker` (worker.py) and the blocking `Client` (control.py) call through here;
the loop's own fresh reads go through sdbus.py instead (see the package's docstring for why).
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from pystemd.dbuslib import DBus

SYSTEMD: Final = b"org.freedesktop.systemd1"
MANAGER_PATH: Final = b"/org/freedesktop/systemd1"
MANAGER_IFACE: Final = b"org.freedesktop.systemd1.Manager"
UNIT_IFACE: Final = b"org.freedesktop.systemd1.Unit"
SERVICE_IFACE: Final = b"org.freedesktop.systemd1.Service"
PROPS_IFACE: Final = b"org.freedesktop.DBus.Properties"
IFACES: Final = (UNIT_IFACE, SERVICE_IFACE)  # a unit's property interfaces, read in this order


def unit_path(unit: str) -> bytes:
    """systemd's object path for a unit name (sd_bus_path_encode)."""
    out = bytearray(b"/org/freedesktop/systemd1/unit/")
    for i, ch in enumerate(unit.encode()):
        if chr(ch).isalnum() and ch < 128 and not (i == 0 and chr(ch).isdigit()):
            out.append(ch)
        else:
            out += b"_%02x" % ch
    return bytes(out)


T = TypeVar("T")


def retry_eintr(call: Callable[[], T], attempts: int = 3, quick: float = 0.5) -> T:
    """A signal arriving while sd-bus waits (SIGTERM, SIGHUP) fails the wait with EINTR. That says
    nothing about the bus or the unit: ask again, but only if the interrupted call was quick. One
    that had already waited `quick` seconds is stuck on an unanswering bus, and the signal (most
    likely SIGTERM) must get to the event loop. pystemd raises DBusInterruptedError, an
    InterruptedError whose errno is None: the class says it, not the errno."""
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

    pystemd connects synchronously: against a bus socket nobody serves (a dbus-daemon being
    restarted, a socket unit whose service is stopping) it would freeze the whole process for
    sd-bus's 25 s (the package's docstring says why). This asks first, with a plain socket."""
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


def ping(bus: DBus) -> None:
    """A question that involves no unit: does the manager answer at all?"""
    retry_eintr(lambda: bus.get_property(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, b"Version", b"s"))


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
