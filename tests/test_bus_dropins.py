"""The systemd client's runtime drop-ins, in-process (no manager): where they go, that they are written
whole or not at all, and when the manager is asked to reload. The same against a real manager, with the
sweep that uses them: test_sweep.py (its Rig tests)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from genready.systemd import control

UNIT = "d.service"
NAME = "zz-test.conf"


class FakeBus:
    """Stands for pystemd's DBus: answers UnitPath, keeps the method calls, fails Reload if told to."""

    def __init__(self, unit_paths: list[str], events: list[str], reload_fails: bool = False) -> None:
        self.unit_paths, self.events, self.reload_fails = unit_paths, events, reload_fails

    def get_property(self, dest: bytes, path: bytes, iface: bytes, prop: bytes, sig: bytes) -> list[bytes]:
        assert prop == b"UnitPath", prop
        return [p.encode() for p in self.unit_paths]

    def call_method(self, dest: bytes, path: bytes, iface: bytes, method: bytes, args: list[Any]) -> None:
        self.events.append(method.decode())
        if method == b"Reload" and self.reload_fails:
            raise RuntimeError("the manager refused to reload")

    def close(self) -> None:
        pass


def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[str], *,
           on_path: bool = True, reload_fails: bool = False) -> tuple[control.Client, Path]:
    """A user-manager Client on a FakeBus whose runtime unit directory is under tmp_path; that directory."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    base = tmp_path / "systemd" / "user"
    c = object.__new__(control.Client)  # Client() would connect to a real bus
    c.kind = "user"
    c._bus = FakeBus(["/etc/systemd/user", *([str(base)] if on_path else [])], events, reload_fails)
    return c, base


def test_the_runtime_dropin_goes_in_the_runtime_unit_dir_the_manager_searches(monkeypatch: pytest.MonkeyPatch) -> None:
    system = control.runtime_dropin_path("system", ["/etc/systemd/system", "/run/systemd/system"], UNIT, NAME)
    assert system == Path("/run/systemd/system") / f"{UNIT}.d" / NAME
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    user = control.runtime_dropin_path("user", ["/run/user/4242/systemd/user"], UNIT, NAME)
    assert user == Path("/run/user/4242/systemd/user") / f"{UNIT}.d" / NAME


def test_a_runtime_dir_the_manager_does_not_search_is_refused_naming_its_unit_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A user manager started with another XDG_RUNTIME_DIR would never read a drop-in written here.
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    with pytest.raises(control.NotOnUnitPath) as e:
        control.runtime_dropin_path("user", ["/etc/systemd/user", "/run/user/1000/systemd/user"], UNIT, NAME)
    assert str(e.value) == ("the user manager does not load units from /run/user/4242/systemd/user (its UnitPath: "
                            "/etc/systemd/user /run/user/1000/systemd/user); is XDG_RUNTIME_DIR the manager's?")


def test_write_dropin_puts_the_whole_file_in_place_then_reloads(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    c, base = client(tmp_path, monkeypatch, events)
    old = os.umask(0o077)
    try:
        path = c.write_dropin(UNIT, NAME, "[Service]\nEnvironment=A=1\n",
                              written=lambda p: events.append(f"written {p.read_text()!r}"))
    finally:
        os.umask(old)
    assert path == base / f"{UNIT}.d" / NAME == c.dropin_path(UNIT, NAME)
    # The callback sees the whole file, and the manager is asked to reload only after it.
    assert events == ["written '[Service]\\nEnvironment=A=1\\n'", "Reload"], events
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # whatever the umask: the manager must read it
    assert os.listdir(path.parent) == [NAME]  # no temporary file left beside it
    c.write_dropin(UNIT, NAME, "[Service]\nEnvironment=A=2\n")
    assert path.read_text() == "[Service]\nEnvironment=A=2\n" and os.listdir(path.parent) == [NAME]


def test_a_dropin_that_cannot_be_written_changes_nothing_and_reloads_nothing(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    c, base = client(tmp_path, monkeypatch, events)
    # The rename fails (a directory sits where the drop-in goes): the temporary file must not stay.
    (base / f"{UNIT}.d" / NAME).mkdir(parents=True)
    with pytest.raises(OSError):
        c.write_dropin(UNIT, NAME, "[Service]\n", written=lambda p: events.append("written"))
    assert os.listdir(base / f"{UNIT}.d") == [NAME] and events == []


def test_a_failed_reload_leaves_the_written_dropin_for_the_caller_to_remove(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    c, _ = client(tmp_path, monkeypatch, events, reload_fails=True)
    with pytest.raises(RuntimeError, match="refused to reload"):
        c.write_dropin(UNIT, NAME, "[Service]\n", written=lambda p: events.append("written"))
    assert events == ["written", "Reload"] and c.dropin_path(UNIT, NAME).read_text() == "[Service]\n"


def test_a_dropin_is_not_written_where_the_manager_does_not_look(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    c, base = client(tmp_path, monkeypatch, events, on_path=False)
    with pytest.raises(control.NotOnUnitPath):
        c.write_dropin(UNIT, NAME, "[Service]\n")
    assert not base.exists() and events == []


def test_remove_dropin_removes_ours_keeps_others_and_reloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    c, base = client(tmp_path, monkeypatch, events)
    folder = base / f"{UNIT}.d"
    folder.mkdir(parents=True)
    (folder / NAME).write_text("[Service]\n")
    (folder / "10-theirs.conf").write_text("[Service]\n")
    assert c.remove_dropin(UNIT, NAME) == folder / NAME
    assert os.listdir(folder) == ["10-theirs.conf"] and events == ["Reload"]  # someone else's stays, and its folder
    (folder / "10-theirs.conf").unlink()
    (folder / NAME).write_text("[Service]\n")
    c.remove_dropin(UNIT, NAME)
    assert not folder.exists()  # ours was the last: its folder goes too
    c.remove_dropin(UNIT, NAME)  # gone already: still a reload (the manager may hold the old one)
    assert events == ["Reload"] * 3
