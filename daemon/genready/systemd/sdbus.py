"""A small sd-bus connection through ctypes: the reads that must never hold up the event loop.

pystemd keeps the GIL while sd-bus waits (see the package's docstring), so the reads `/ready`
and the heartbeat need do not wait at all: `send_get` queues a Properties.Get and `process` collects
whatever answers have arrived, both without blocking (the socket is non-blocking), and the event
loop watches the connection's fd (fresh.py). No thread, so no GIL handed back and forth: under
load a worker thread returning from a foreign call waits up to sys.getswitchinterval() (5 ms) for
a busy loop to let go of the GIL, once per call. These calls go through a ctypes.PyDLL handle,
which keeps the GIL: they never wait.

`get_string` is a plain blocking call (through ctypes.CDLL, which releases the GIL while it waits),
for a thread that only needs to know whether the manager answers.
"""

from __future__ import annotations

import ctypes
import errno as errno_
import os
import select
from typing import Any, Final

_SYSTEMD: Final = b"org.freedesktop.systemd1"
_MANAGER_PATH: Final = b"/org/freedesktop/systemd1"
_MANAGER_IFACE: Final = b"org.freedesktop.systemd1.Manager"
_PROPS_IFACE: Final = b"org.freedesktop.DBus.Properties"


class _Error(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("message", ctypes.c_char_p), ("_need_free", ctypes.c_int)]


class BusCallError(OSError):
    """sd-bus failed a call: errno (positive) and, when the peer answered with one, the D-Bus error."""

    def __init__(self, err: int, what: str, name: str = "", message: str = "") -> None:
        text = f"{what}: {name + ': ' if name else ''}{message or os.strerror(err)}"
        super().__init__(err, text)
        self.dbus_name = name


_wait: Any = None  # libsystemd through CDLL: the GIL is released while these run
_fast: Any = None  # the same library through PyDLL: the GIL is kept (calls that never block)
_libc: Any = None


def _load() -> Any:
    global _wait, _fast, _libc
    if _fast is None:
        p, cp, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64
        pp, e = ctypes.POINTER(p), ctypes.POINTER(_Error)
        signatures: dict[str, tuple[list[Any], Any]] = {
            "sd_bus_open_user": ([pp], ctypes.c_int), "sd_bus_open_system": ([pp], ctypes.c_int),
            "sd_bus_set_method_call_timeout": ([p, u64], ctypes.c_int),
            "sd_bus_get_property_string": ([p, cp, cp, cp, cp, e, ctypes.POINTER(cp)], ctypes.c_int),
            "sd_bus_wait": ([p, u64], ctypes.c_int),
            "sd_bus_close_unref": ([p], p), "sd_bus_error_free": ([e], None),
            "sd_bus_get_fd": ([p], ctypes.c_int), "sd_bus_get_events": ([p], ctypes.c_int),
            "sd_bus_is_open": ([p], ctypes.c_int),
            "sd_bus_message_new_method_call": ([p, pp, cp, cp, cp, cp], ctypes.c_int),
            "sd_bus_message_append_basic": ([p, ctypes.c_char, p], ctypes.c_int),
            "sd_bus_send": ([p, p, ctypes.POINTER(u64)], ctypes.c_int),
            "sd_bus_process": ([p, pp], ctypes.c_int),
            "sd_bus_message_get_reply_cookie": ([p, ctypes.POINTER(u64)], ctypes.c_int),
            "sd_bus_message_get_error": ([p], e),
            "sd_bus_message_get_errno": ([p], ctypes.c_int),
            "sd_bus_message_enter_container": ([p, ctypes.c_char, cp], ctypes.c_int),
            "sd_bus_message_read_basic": ([p, ctypes.c_char, p], ctypes.c_int),
            "sd_bus_message_read_array": ([p, ctypes.c_char, pp, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int),
            "sd_bus_message_unref": ([p], p),
        }
        # By soname: ctypes.util.find_library would run ldconfig in a subprocess, for a name that is fixed.
        wait, fast = ctypes.CDLL("libsystemd.so.0", use_errno=True), ctypes.PyDLL("libsystemd.so.0")
        for lib in (wait, fast):
            for name, (args, res) in signatures.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
        libc = ctypes.CDLL("libc.so.6")
        libc.free.argtypes = [p]
        _wait, _fast, _libc = wait, fast, libc
    return _fast


def _raise_for(r: int, what: str, name: str = "", message: str = "") -> None:
    if -r == errno_.EINTR:
        raise InterruptedError(errno_.EINTR, f"{what}: interrupted")
    if -r == errno_.ETIMEDOUT:
        raise TimeoutError(errno_.ETIMEDOUT, f"{what}: no answer within sd-bus's method timeout")
    raise BusCallError(-r, what, name, message)


class Connection:
    """One sd-bus connection to the "system" or "user" bus. Not thread-safe: one thread uses it.
    Opening it does not wait either: sd-bus connects and authenticates as `process` is called."""

    def __init__(self, kind: str, timeout_usec: int) -> None:
        _load()
        self._bus = ctypes.c_void_p()
        self._expect: dict[int, tuple[str, str]] = {}  # cookie -> (property, signature) of a send_get
        opener = _wait.sd_bus_open_user if kind == "user" else _wait.sd_bus_open_system
        r = opener(ctypes.byref(self._bus))
        if r < 0:
            _raise_for(r, f"connecting to the {kind} bus")
        _fast.sd_bus_set_method_call_timeout(self._bus, timeout_usec)

    def get_string(self, path: bytes, iface: bytes, prop: bytes) -> str:
        err, out = _Error(), ctypes.c_char_p()
        r = _wait.sd_bus_get_property_string(self._bus, _SYSTEMD, path, iface, prop, ctypes.byref(err),
                                             ctypes.byref(out))
        if r < 0:
            name, message = (err.name or b"").decode(errors="replace"), (err.message or b"").decode(errors="replace")
            _wait.sd_bus_error_free(ctypes.byref(err))
            _raise_for(r, f"reading {prop.decode()}", name, message)
        try:
            return (out.value or b"").decode(errors="replace")
        finally:
            _libc.free(ctypes.cast(out, ctypes.c_void_p))

    def fileno(self) -> int:
        return int(_fast.sd_bus_get_fd(self._bus))

    def wants_write(self) -> bool:
        """sd-bus has bytes queued that the socket would not take yet: wait for it to be writable."""
        events = _fast.sd_bus_get_events(self._bus)
        return events > 0 and bool(events & select.POLLOUT)

    def send_get(self, path: bytes, iface: bytes, prop: bytes, sig: str) -> int:
        """Queue a Properties.Get (signature one of s, u, ay, (uo)) without waiting; its cookie.
        The manager answers a connection's calls in the order they were sent."""
        msg = ctypes.c_void_p()
        what = f"asking for {prop.decode()}"
        r = _fast.sd_bus_message_new_method_call(self._bus, ctypes.byref(msg), _SYSTEMD, path, _PROPS_IFACE, b"Get")
        if r < 0:
            _raise_for(r, what)
        try:
            for s in (iface, prop):
                r = _fast.sd_bus_message_append_basic(msg, b"s", ctypes.c_char_p(s))
                if r < 0:
                    _raise_for(r, what)
            cookie = ctypes.c_uint64()
            r = _fast.sd_bus_send(self._bus, msg, ctypes.byref(cookie))
            if r < 0:
                _raise_for(r, what)
        finally:
            _fast.sd_bus_message_unref(msg)
        self._expect[int(cookie.value)] = (prop.decode(), sig)
        return int(cookie.value)

    def process(self) -> list[tuple[int, Any]]:
        """Whatever has arrived, without waiting: (cookie, the value or the BusCallError systemd
        answered with) for each answer to a send_get. Raises OSError if the connection failed."""
        out: list[tuple[int, Any]] = []
        while True:
            msg = ctypes.c_void_p()
            r = _fast.sd_bus_process(self._bus, ctypes.byref(msg))
            if r < 0:
                _raise_for(r, "reading from the bus")
            if msg.value:
                try:
                    cookie = ctypes.c_uint64()
                    if _fast.sd_bus_message_get_reply_cookie(msg, ctypes.byref(cookie)) >= 0 and (
                            cookie.value in self._expect):
                        prop, sig = self._expect.pop(cookie.value)
                        out.append((int(cookie.value), self._decode(msg, prop, sig)))
                    # else: not an answer to a send_get of this connection
                finally:
                    _fast.sd_bus_message_unref(msg)
            if r == 0:
                return out

    @staticmethod
    def _decode(msg: ctypes.c_void_p, prop: str, sig: str) -> Any:
        what = f"reading {prop}"
        err = _fast.sd_bus_message_get_error(msg)
        if err:
            name = (err.contents.name or b"").decode(errors="replace")
            message = (err.contents.message or b"").decode(errors="replace")
            return BusCallError(_fast.sd_bus_message_get_errno(msg) or errno_.EIO, what, name, message)

        def check(r: int) -> int:
            if r < 0:
                _raise_for(r, f"decoding {prop}")
            return r

        check(_fast.sd_bus_message_enter_container(msg, b"v", sig.encode()))
        if sig == "s":
            s = ctypes.c_char_p()
            check(_fast.sd_bus_message_read_basic(msg, b"s", ctypes.byref(s)))
            return (s.value or b"").decode(errors="replace")
        if sig in ("u", "(uo)"):
            if sig == "(uo)":
                check(_fast.sd_bus_message_enter_container(msg, b"r", b"uo"))
            u = ctypes.c_uint32()
            check(_fast.sd_bus_message_read_basic(msg, b"u", ctypes.byref(u)))
            return int(u.value)
        if sig == "ay":
            ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
            check(_fast.sd_bus_message_read_array(msg, b"y", ctypes.byref(ptr), ctypes.byref(size)))
            return ctypes.string_at(ptr, size.value) if size.value else b""
        raise ValueError(f"send_get: signature {sig!r} not supported")

    def version(self) -> str:
        return self.get_string(_MANAGER_PATH, _MANAGER_IFACE, b"Version")

    def alive(self) -> bool:
        return bool(self._bus.value) and _fast.sd_bus_is_open(self._bus) > 0

    def close(self) -> None:
        if self._bus.value:
            # No flush: only questions are ever queued here, and a flush could wait on a frozen peer.
            _fast.sd_bus_close_unref(self._bus)
            self._bus = ctypes.c_void_p()
