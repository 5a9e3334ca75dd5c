"""The sweep's drop-in on the target's unit, from first check to last removal.

Checked before anything changes (systemd-analyze verify: a plan whose every drop-in systemd would
refuse is exit 78), a dead sweep's leftover taken over (a live one's refused), each point's written
headed by whose it is (systemd/sweepdropin) and the manager reloaded, and at the end removed and the
unit restarted on its own configuration until that start is verified (`restore`, also `sweep restore`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from genready.client import waiting
from genready.config import ConfigError
from genready.store.bounded import FileError
from genready.sweep.plan import Plan, Point
from genready.sweep.run.lines import shown
from genready.sweep.run.results import SweepBusy, SweepError
from genready.systemd import analyze, control
from genready.systemd.snapshot import Snapshot
from genready.systemd.sweepdropin import DROPIN_NAME, describe_owner, owner_alive, owner_header, owner_of, read_dropin

POLL = 0.5  # seconds: how quickly a failed start, or a signal, is noticed while waiting


def refused_dropins(plan: Plan, points: Sequence[Point], results: Path,
                    complaints: Callable[[str], list[str]]) -> tuple[int, dict[Point, list[str]]]:
    """(how many distinct drop-ins the points have, the first point of each that systemd would not take as
    written, with its words). Each distinct drop-in is checked once, rendered with `{out}` as DIR/OUT (the
    points' own folders do not exist yet)."""
    seen: set[str] = set()
    refused: dict[Point, list[str]] = {}
    for p in points:
        text = plan.dropin_for(p, str(results / "OUT"))
        if text is None or text in seen:
            continue
        seen.add(text)
        if said := complaints(text):
            refused[p] = said
    return len(seen), refused


def dropin_refused(plan: Plan, point: Point, complaints: Sequence[str]) -> ConfigError:
    """The plan error for a drop-in systemd would not take as written, in systemd's words."""
    return ConfigError(plan.path, "dropin", "unit file text systemd takes as written (systemd-analyze verify)",
                       f"for point {point.index} ({shown(point.label)}): " + " / ".join(complaints))


def restore(sd: control.UnitClient, base: str, target: str, timeout: float, say: Callable[[str], None], *,
            on_removed: Callable[[], None] | None = None) -> bool:
    """Remove the sweep's drop-in, reload, restart the unit on its own configuration and wait until that
    start is verified; True if it was. The end of every sweep, and `genready sweep restore`."""
    dropin = sd.remove_dropin(sd.unit, DROPIN_NAME)
    if on_removed:
        on_removed()
    say(f"removed {dropin}; restarting {sd.unit} on its own configuration")
    out = waiting.restart_and_wait(sd.restart, base, target, timeout, on_failure=waiting.OnFailure.ANY, poll=POLL)
    if out.ready and isinstance(out.body, dict):
        say(f"{sd.unit} is back on its own configuration: pid {out.body.get('pid')} verified")
        return True
    if out.failed is not None:
        first, *lines = waiting.failure_lines(out.failed)
        say(f"{sd.unit} failed to start on its own configuration ({first})")
        for line in lines:
            say(line)
        return False
    say(f"{sd.unit} restarted on its own configuration, not verified within {timeout:g}s")
    return False


@dataclass
class DropinLife:
    """What the sweep has changed on the unit: what the cleanup (or a second signal's last words) undoes.
    One per sweep; its fields change only through its methods."""

    sd: control.UnitClient
    path: Path
    written: bool = False
    restored: bool = True  # False from the first drop-in until the unit is verified on its own config
    check: analyze.DropinCheck | None = None  # systemd-analyze verify, when it can run

    @classmethod
    def open(cls, bus_kind: str, unit: str) -> tuple[DropinLife, Snapshot]:
        """The unit's client and where its drop-in goes; SweepError if the unit is not loaded."""
        sd = control.UnitClient(bus_kind, unit)
        try:
            state = sd.state()
            if state.load_state != "loaded":
                raise SweepError(f"{unit} is {state.load_state or 'unknown'} on the {bus_kind} bus")
            return cls(sd, sd.dropin_path(unit, DROPIN_NAME)), state
        except BaseException:
            sd.close()
            raise

    def check_plan(self, plan: Plan, points: Sequence[Point], results: Path, state: Snapshot, *, user: bool,
                   say: Callable[[str], None]) -> None:
        """Every server configuration still to run, as systemd would read it (systemd-analyze verify). If it
        would take none as written, the plan is wrong: ConfigError naming the first point and systemd's words.
        If only some, those points will be recorded not_ready, with systemd's words (`complaints`)."""
        if plan.dropin is None:
            return
        try:
            self.check = analyze.DropinCheck(self.sd.unit, state.fragment_path, self.path, user=user)
        except analyze.CannotVerify as e:
            say(f"not checking the drop-ins with systemd-analyze verify: {e}")
            return
        distinct, refused = refused_dropins(plan, points, results, self.check.complaints)
        if not refused:
            return
        first = dropin_refused(plan, *next(iter(refused.items())))
        if len(refused) == distinct:
            raise first
        say(f"systemd would not take the drop-in of {len(refused)} of {distinct} server configurations as "
            f"written; their points will be recorded not_ready: {first}")

    def complaints(self, text: str) -> list[str]:
        return self.check.complaints(text) if self.check else []

    def take_over_leftover(self, say: Callable[[str], None]) -> None:
        """A drop-in already there: another live sweep's stops us (SweepBusy); a dead one's is replaced."""
        try:
            text = read_dropin(self.path)
        except FileNotFoundError:
            return
        except FileError as e:
            raise SweepError(f"{e}: not a drop-in a sweep wrote; remove it (genready sweep restore)") from None
        owner = owner_of(text)
        if owner is not None and owner.get("pid") != os.getpid() and owner_alive(owner):
            raise SweepBusy(f"{self.path} belongs to a running {describe_owner(owner)}; two sweeps of "
                            f"{self.sd.unit} would change its configuration under each other")
        who = f" ({describe_owner(owner)}, gone)" if owner else ""
        say(f"{self.path} was left by an earlier sweep{who}; replacing it")
        self.written, self.restored = True, False

    def write(self, text: str, *, plan: str, results: Path, started: str, bus_kind: str) -> None:
        """The point's drop-in in place, headed by whose it is (sweepdropin), and the manager reloaded."""
        self.restored = False
        try:
            self.sd.write_dropin(self.sd.unit, DROPIN_NAME, owner_header(plan, results, started) + text,
                                 written=self._written)
        except PermissionError as e:
            hint = (" (a runtime drop-in for a system unit needs root: run the sweep with sudo, or sweep a "
                    "user manager's unit)" if bus_kind == "system" else "")
            raise SweepError(f"cannot write {self.path}: {e.strerror}{hint}") from None

    def _written(self, path: Path) -> None:
        # Set before the reload: if that fails, the drop-in is in place all the same and the cleanup removes it.
        self.written = True

    def restore(self, base: str, target: str, timeout: float, say: Callable[[str], None]) -> None:
        """The end of a sweep: the unit back on its own configuration, if a drop-in of ours was ever there."""
        if self.written:
            self.restored = restore(self.sd, base, target, timeout, say, on_removed=self._removed)

    def _removed(self) -> None:
        self.written = False

    def left_behind(self, ctl: str, unit: str, target: str) -> str | None:
        """What a sweep that exits at once leaves to clean up on the unit, in words, or None."""
        if self.path.exists():
            return f"the drop-in {self.path} is still in place: rm {self.path} && {ctl} daemon-reload && " \
                f"genready restart {target}"
        if not self.restored:
            return f"{unit} is on its own configuration again but its start was not verified: genready wait {target}"
        return None
