"""`genready guard TARGET -- CMD`: run CMD only on one verified instance, and say if it changed.

A benchmark's numbers are only worth keeping if the server it measured stayed the same
verified instance from start to end. guard pins that instance (pid, invocation, ready
since) before CMD starts, re-checks it while CMD runs and once more after CMD exits.
`genready sweep` runs each point's command through `run_pinned`, the same guarantee.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from genready.client import client
from genready.exitcodes import Exit


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
    return pinned, ""


def run(base: str, target: str, cmd: list[str], *, interval: float = 0.2) -> int:
    """Run `cmd` guarded by the readiness of `target`; CMD's status, or 75 (see module doc)."""
    pinned, why = pin(base, target)
    if pinned is None:
        print(f"genready guard: {why}; not running {cmd[0]}", file=sys.stderr)
        return Exit.TEMPFAIL
    try:
        child = subprocess.Popen(cmd, env=dict(os.environ, **guard_env(target, pinned)))
    except OSError as e:
        print(f"genready guard: cannot run {cmd[0]}: {e}", file=sys.stderr)
        return Exit.NOT_RUN

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)

    result = run_pinned(base, target, pinned, child, interval=interval)
    if result.problem:
        print(f"genready guard: {target} pid {pinned['pid']}: {result.problem}; the results of {cmd[0]} "
              f"(exit {result.returncode}) are not trustworthy", file=sys.stderr)
        return Exit.TEMPFAIL
    return result.returncode
