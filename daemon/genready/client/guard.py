"""`genready guard TARGET -- CMD`: run CMD only on one verified instance, and say if it changed.

A benchmark's numbers are only worth keeping if the server it measured stayed the same
verified instance from start to end. guard pins that instance (pid, invocation, ready
since) before CMD starts, re-checks it while CMD runs and once more after CMD exits.
`genready sweep` runs each point's command through `run_pinned` and `ProcessGroup`, the same guarantee,
and stops it with the same ladder (`ProcessGroup.stop`: SIGINT, then SIGTERM, then SIGKILL).

CMD runs in a session (and process group) of its own, so guard can end everything CMD
started: a signal guard gets (SIGINT, SIGTERM, SIGHUP, SIGQUIT) goes to the whole group, and
GUARD_STOP_GRACE (10) seconds later whatever is left gets SIGKILL; when CMD exits, processes it left
in its group (a forked daemon) are ended the same way. Nothing of CMD outlives guard,
except a process that left the group on purpose (setsid, a systemd-run unit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

from genready import console
from genready.client import GUARD_MIN_INTERVAL, GUARD_STOP_GRACE, client
from genready.exitcodes import Exit

# Signals guard passes on to CMD's group: anything that would otherwise end guard and leave CMD running.
FORWARDED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
THEN_KILL: Final = (signal.SIGKILL,)  # guard's ladder after the signal it passes on
TICK: Final = 0.05  # seconds between a waiting caller's ticks (ProcessGroup.wait)


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: killed by signal N (Popen says -N) is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group `pgid`, from /proc."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue  # gone meanwhile
        # "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


class ProcessGroup:
    """A child started with `start_new_session=True`, and every process in its group.

    The group is signalled only while the leader is unreaped: its PID (the group's ID) cannot
    be reused by an unrelated process before `wait` reaps it.
    """

    def __init__(self, child: subprocess.Popen[Any], grace: float = GUARD_STOP_GRACE) -> None:
        self.child = child
        self.grace = grace
        self.left_behind = 0  # processes still in the group when the leader exited
        self._kill_timer: threading.Timer | None = None
        self._reaped = False
        # Re-entrant: guard's signal handler runs on the main thread, possibly inside wait().
        self._lock = threading.RLock()

    def signal(self, sig: int) -> None:
        with self._lock, contextlib.suppress(ProcessLookupError, PermissionError):
            if not self._reaped:
                os.killpg(self.child.pid, sig)

    def stop(self, sig: int, then: Sequence[int] = THEN_KILL) -> None:
        """Send `sig` to the group now, then each signal of `then` `grace` seconds apart while the leader is
        unreaped: guard's ladder is the signal it got, then SIGKILL; the sweep's SIGINT, SIGTERM, SIGKILL.
        A stop while one is under way sends its signal and leaves the ladder as it is."""
        self.signal(sig)
        with self._lock:
            if self._kill_timer is None and not self._reaped and then:
                self._arm(tuple(then))

    def _arm(self, ladder: tuple[int, ...]) -> None:
        """The next rung of a stop's ladder, `grace` seconds from now (called with the lock held)."""
        def fire() -> None:
            with self._lock:
                if self._reaped:
                    return
                self.signal(ladder[0])
                if ladder[1:]:
                    self._arm(ladder[1:])

        self._kill_timer = threading.Timer(self.grace, fire)
        self._kill_timer.daemon = True
        self._kill_timer.start()

    def wait(self, child: subprocess.Popen[Any] | None = None, *, tick: Callable[[], None] | None = None) -> int:
        """Wait for the leader to exit, end what it left in its group, then reap it: its status.
        `tick`, if given, runs every TICK seconds until the leader exits (a caller's own signals)."""
        pid = self.child.pid
        # WNOWAIT: the leader stays a zombie, so its PID stays ours while the group is ended.
        if tick is None:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        else:
            while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
                tick()
                time.sleep(TICK)
        self.left_behind = len(self._end_leftovers(pid))
        with self._lock:
            if self._kill_timer is not None:
                self._kill_timer.cancel()
            rc = self.child.wait()
            self._reaped = True
        return rc

    def _end_leftovers(self, pgid: int) -> list[int]:
        """SIGTERM to what is left of the group; SIGKILL after `grace`. The processes found at first."""
        first = [p for p in group_members(pgid) if p != pgid]
        if not first:
            return first
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while [p for p in group_members(pgid) if p != pgid]:
            if time.monotonic() >= deadline:
                self.signal(signal.SIGKILL)
                break
            time.sleep(0.05)
        return first


def check(base: str, target: str, pinned: Mapping[str, Any]) -> str | None:
    """None while the pinned instance is still ready and was never revoked; else why not."""
    try:
        code, body = client.request(base, f"/ready/{target}?pid={pinned['pid']}&invocation={pinned['invocation_id']}")
    except client.Unreachable as e:
        return f"genready became unreachable: {e}"
    if code != 200:
        return f"readiness lost: {body.get('reason') or body.get('state')}"
    if body.get("ready_since") != pinned.get("ready_since"):
        return "readiness was revoked and re-established while the command ran"
    return None


def guard_env(target: str, pinned: Mapping[str, Any]) -> dict[str, str]:
    """What a guarded command learns about the instance it runs against."""
    return {"GENREADY_TARGET": target, "GENREADY_UNIT": str(pinned["unit"]), "GENREADY_PID": str(pinned["pid"]),
            "GENREADY_INVOCATION_ID": str(pinned["invocation_id"])}


@dataclass(frozen=True)
class Guarded:
    """How a guarded command ended: its exit status, and why its results cannot be trusted (or "")."""

    returncode: int
    problem: str


def run_pinned(base: str, target: str, pinned: Mapping[str, Any], child: subprocess.Popen[Any], *,
               interval: float = 0.2, wait: Callable[[subprocess.Popen[Any]], int] | None = None) -> Guarded:
    """Follow `pinned` while `child` runs and once more after it exits.

    `wait` replaces `child.wait()` for a caller that must stay responsive (the sweep polls
    for its own signals); it must return the child's exit status.
    """
    problem: list[str] = []
    done = threading.Event()

    def follow() -> None:
        while not done.wait(interval):
            why = check(base, target, pinned)
            if why:
                problem.append(why)
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        rc = wait(child) if wait else child.wait()
    finally:
        done.set()
        follower.join()
    if not problem and (why := check(base, target, pinned)):
        problem.append(why)
    return Guarded(rc, problem[0] if problem else "")


def pin(base: str, target: str) -> tuple[dict[str, Any] | None, str]:
    """The target's verified instance now, or (None, why not). Exits 69 if the daemon is unreachable."""
    try:
        code, pinned = client.request(base, f"/ready/{target}")
    except client.Unreachable as e:
        client.unreachable(base, e)
    if code != 200:
        reason = pinned.get("reason") or pinned.get("error") if isinstance(pinned, dict) else pinned
        return None, f"{target} is not ready ({reason})"
    if not isinstance(pinned, dict) or not {"unit", "pid", "invocation_id"} <= pinned.keys():
        return None, f"{base} did not answer like genready: {str(pinned)[:200]}"
    if why := stale_config(target, pinned):
        return None, why
    return pinned, ""


def stale_config(target: str, pinned: Mapping[str, Any]) -> str:
    """Why not to benchmark a verified instance whose unit now has another ExecStart=/Environment=
    than it was started with (results would be filed under settings it does not run); "" if none."""
    if not pinned.get("config_changed_since_start"):
        return ""
    return (f"{target} pid {pinned.get('pid')} does not run its unit's configuration: "
            f"{'; '.join(pinned.get('config_changes') or ['changed since it started'])}; restart it first "
            f"(genready restart {target})")


def run(base: str, target: str, cmd: list[str], *, interval: float = 0.2, grace: float = GUARD_STOP_GRACE) -> int:
    """Run `cmd` guarded by the readiness of `target`; CMD's status, or 75 (see module doc)."""
    pinned, why = pin(base, target)
    if pinned is None:
        console.err(f"genready guard: {why}; not running {cmd[0]}")
        return Exit.TEMPFAIL
    group: ProcessGroup | None = None
    early: list[int] = []  # a signal that came before CMD existed: CMD gets it as soon as it does

    def forward(signum: int, frame: FrameType | None) -> None:
        if group is None:
            early.append(signum)
        else:
            group.stop(signum)

    old = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        try:
            # Its own session: a terminal's Ctrl-C or hang-up reaches guard, which stops the whole group.
            child = subprocess.Popen(cmd, env=dict(os.environ, **guard_env(target, pinned)), start_new_session=True)
        except OSError as e:
            console.err(f"genready guard: cannot run {cmd[0]}: {e}")
            return Exit.NOT_RUN
        group = ProcessGroup(child, grace)
        if early:
            group.stop(early[0])
        result = run_pinned(base, target, pinned, child, interval=max(interval, GUARD_MIN_INTERVAL),
                            wait=group.wait)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if group.left_behind:
        console.err(f"genready guard: {cmd[0]} exited leaving {group.left_behind} process(es) in its process "
                    "group; they were ended (SIGTERM, then SIGKILL)")
    status = exit_status(result.returncode)
    if result.problem:
        console.err(f"genready guard: {target} pid {pinned['pid']}: {result.problem}; the results of {cmd[0]} "
                    f"(exit {status}) are not trustworthy")
        return Exit.TEMPFAIL
    return status
