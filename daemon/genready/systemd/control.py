"""The blocking client of a manager, for the command line and the sweep: reading a unit, restart,
reset-failed, reload, and runtime drop-ins (where they go, written atomically, removed).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from genready.store import durable
from genready.systemd.bus import (
    MANAGER_IFACE,
    MANAGER_PATH,
    SYSTEMD,
    check_bus,
    manager_call,
    open_bus,
    read_all,
    retry_eintr,
)
from genready.systemd.snapshot import Snapshot, snapshot_of


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
        return [p.decode() if isinstance(p, bytes) else str(p) for p in paths]

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
        """Put `text` in place as the runtime drop-in `name` of `unit`, then Manager.Reload so the
        unit's next start uses it; its path. The file is replaced atomically (store/durable.py):
        the manager may reload at any moment (anyone's daemon-reload) and never reads half of it.

        The file's OSError (PermissionError for a system unit without root) means nothing changed.
        `written(path)` runs once the file is in place, before the reload: a reload that fails then
        raises its D-Bus error with the drop-in in place, for the caller to remove."""
        path = self.dropin_path(unit, name)
        durable.replace(path, text.encode(), mode=0o644, mkdir=True)
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
