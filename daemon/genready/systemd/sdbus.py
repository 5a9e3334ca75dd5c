"""A small sd-bus connection through ctypes, for the reads that must never hold up the event loop.

pystemd (0.11 and 0.15 alike) keeps the GIL while sd-bus waits for an answer: a call stuck on a
SIGSTOPped manager, even in a worker thread, stops every other thread of genready (seen with gdb:
the main thread in take_gil, the worker in sd_bus_call's ppoll). ctypes releases the GIL around
every foreign call, so the same libsystemd calls made through it leave the event loop running
while the worker waits. Only what `/ready` and the heartbeat need is here: a unit's identity and
state (read_quick) and the manager's Version. It has its own method timeout (SD_BUS_TIMEOUT).
"""

from __future__ import annotations

import ctypes
import errno as errno_
import os
from typing import Any, Final

_SYSTEMD: Final = b"org.freedesktop.systemd1"
_MANAGER_PATH: Final = b"/org/freedesktop/systemd1"
_MANAGER_IFACE: Final = b"org.freedesktop.systemd1.Manager"


class _Error(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("message", ctypes.c_char_p), ("_need_free", ctypes.c_int)]


class BusCallError(OSError):
    """sd-bus failed a call: errno (positive) and, when the peer answered with one, the D-Bus error."""

    def __init__(self, err: int, what: str, name: str = "", message: str = "") -> None:
        text = f"{what}: {name + ': ' if name else ''}{message or os.strerror(err)}"
        super().__init__(err, text)
        self.dbus_name = name


_lib: Any = None
_libc: Any = None


def _load() -> Any:
    global _lib, _libc
    if _lib is None:
        # By soname: ctypes.util.find_library would run ldconfig in a subprocess, for a name that is fixed.
        lib = ctypes.CDLL("libsystemd.so.0", use_errno=True)
        p, cp, e = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(_Error)
        for name, args in {
            "sd_bus_open_user": [ctypes.POINTER(p)], "sd_bus_open_system": [ctypes.POINTER(p)],
            "sd_bus_set_method_call_timeout": [p, ctypes.c_uint64],
            "sd_bus_get_property_string": [p, cp, cp, cp, cp, e, ctypes.POINTER(cp)],
            "sd_bus_get_property_trivial": [p, cp, cp, cp, cp, e, ctypes.c_char, p],
            "sd_bus_get_property_strv": [p, cp, cp, cp, cp, e, ctypes.POINTER(ctypes.POINTER(cp))],
            "sd_bus_get_property": [p, cp, cp, cp, cp, e, ctypes.POINTER(p), cp],
            "sd_bus_message_read_array": [p, ctypes.c_char, ctypes.POINTER(p), ctypes.POINTER(ctypes.c_size_t)],
            "sd_bus_message_enter_container": [p, ctypes.c_char, cp],
            "sd_bus_message_read_basic": [p, ctypes.c_char, p],
            "sd_bus_message_unref": [p], "sd_bus_flush_close_unref": [p], "sd_bus_error_free": [e],
            "sd_bus_get_fd": [p],
        }.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = p if name.endswith("unref") else ctypes.c_int
        libc = ctypes.CDLL("libc.so.6")
        libc.free.argtypes = [p]
        _lib, _libc = lib, libc
    return _lib


class Connection:
    """One sd-bus connection to the "system" or "user" bus; its calls block only the calling thread."""

    def __init__(self, kind: str, timeout_usec: int) -> None:
        lib = _load()
        self._bus = ctypes.c_void_p()
        opener = lib.sd_bus_open_user if kind == "user" else lib.sd_bus_open_system
        self._check(opener(ctypes.byref(self._bus)), f"connecting to the {kind} bus")
        lib.sd_bus_set_method_call_timeout(self._bus, timeout_usec)

    @staticmethod
    def _check(r: int, what: str, err: _Error | None = None) -> None:
        if r >= 0:
            return
        name = message = ""
        if err is not None:
            name = (err.name or b"").decode(errors="replace")
            message = (err.message or b"").decode(errors="replace")
            _lib.sd_bus_error_free(ctypes.byref(err))
        if -r == errno_.EINTR:
            raise InterruptedError(errno_.EINTR, f"{what}: interrupted")
        if -r == errno_.ETIMEDOUT:
            raise TimeoutError(errno_.ETIMEDOUT, f"{what}: no answer within sd-bus's method timeout")
        raise BusCallError(-r, what, name, message)

    def get_string(self, path: bytes, iface: bytes, prop: bytes) -> str:
        err, out = _Error(), ctypes.c_char_p()
        r = _lib.sd_bus_get_property_string(self._bus, _SYSTEMD, path, iface, prop, ctypes.byref(err),
                                            ctypes.byref(out))
        self._check(r, f"reading {prop.decode()}", err)
        try:
            return (out.value or b"").decode(errors="replace")
        finally:
            _libc.free(ctypes.cast(out, ctypes.c_void_p))

    def get_strv(self, path: bytes, iface: bytes, prop: bytes) -> list[str]:
        err, out = _Error(), ctypes.POINTER(ctypes.c_char_p)()
        r = _lib.sd_bus_get_property_strv(self._bus, _SYSTEMD, path, iface, prop, ctypes.byref(err),
                                          ctypes.byref(out))
        self._check(r, f"reading {prop.decode()}", err)
        items: list[str] = []
        if not out:
            return items
        try:
            i = 0
            while out[i] is not None:
                items.append(out[i].decode(errors="replace"))
                i += 1
        finally:  # strv_free: every string, then the array
            raw = ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))
            i = 0
            while raw[i]:
                _libc.free(raw[i])
                i += 1
            _libc.free(raw)
        return items

    def get_u32(self, path: bytes, iface: bytes, prop: bytes) -> int:
        err, out = _Error(), ctypes.c_uint32()
        r = _lib.sd_bus_get_property_trivial(self._bus, _SYSTEMD, path, iface, prop, ctypes.byref(err), b"u",
                                             ctypes.byref(out))
        self._check(r, f"reading {prop.decode()}", err)
        return int(out.value)

    def _get(self, path: bytes, iface: bytes, prop: bytes, sig: bytes) -> ctypes.c_void_p:
        err, msg = _Error(), ctypes.c_void_p()
        r = _lib.sd_bus_get_property(self._bus, _SYSTEMD, path, iface, prop, ctypes.byref(err), ctypes.byref(msg),
                                     sig)
        self._check(r, f"reading {prop.decode()}", err)
        return msg

    def get_bytes(self, path: bytes, iface: bytes, prop: bytes) -> bytes:
        msg = self._get(path, iface, prop, b"ay")
        try:
            ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
            self._check(_lib.sd_bus_message_read_array(msg, b"y", ctypes.byref(ptr), ctypes.byref(size)),
                        f"decoding {prop.decode()}")
            return ctypes.string_at(ptr, size.value) if size.value else b""
        finally:
            _lib.sd_bus_message_unref(msg)

    def get_job_id(self, path: bytes, iface: bytes) -> int:
        """The Unit's Job property, (uo): the job's id, 0 for none."""
        msg = self._get(path, iface, b"Job", b"(uo)")
        try:
            self._check(_lib.sd_bus_message_enter_container(msg, b"r", b"uo"), "decoding Job")
            out = ctypes.c_uint32()
            self._check(_lib.sd_bus_message_read_basic(msg, b"u", ctypes.byref(out)), "decoding Job")
            return int(out.value)
        finally:
            _lib.sd_bus_message_unref(msg)

    def version(self) -> str:
        return self.get_string(_MANAGER_PATH, _MANAGER_IFACE, b"Version")

    def alive(self) -> bool:
        return bool(self._bus.value) and _lib.sd_bus_get_fd(self._bus) >= 0

    def close(self) -> None:
        if self._bus.value:
            _lib.sd_bus_flush_close_unref(self._bus)
            self._bus = ctypes.c_void_p()
