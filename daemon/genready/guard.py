"""`genready guard TARGET -- CMD`: run CMD only on one verified instance, and say if it changed.

A benchmark's numbers are only worth keeping if the server it measured stayed the same
verified instance from start to end. guard pins that instance (pid, invocation, ready
since) before CMD starts, re-checks it while CMD runs and once more after CMD exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from types import FrameType
from typing import Any

from genready import client
from genready.exitcodes import Exit


def _check(base: str, target: str, pinned: dict[str, Any]) -> str | None:
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


def run(base: str, target: str, cmd: list[str], *, interval: float = 0.2) -> int:
    """Run `cmd` guarded by the readiness of `target`; CMD's status, or 75 (see module doc)."""
    try:
        code, pinned = client.request(base, f"/ready/{target}")
    except client.Unreachable as e:
        client.unreachable(base, e)
    if code != 200:
        reason = pinned.get("reason") or pinned.get("error") if isinstance(pinned, dict) else pinned
        print(f"genready guard: {target} is not ready ({reason}); not running {cmd[0]}", file=sys.stderr)
        return Exit.TEMPFAIL
    if not isinstance(pinned, dict) or not {"unit", "pid", "invocation_id"} <= pinned.keys():
        print(f"genready guard: {base} did not answer like genready: {str(pinned)[:200]}", file=sys.stderr)
        return Exit.TEMPFAIL
    env = dict(os.environ, GENREADY_TARGET=target, GENREADY_UNIT=str(pinned["unit"]),
               GENREADY_PID=str(pinned["pid"]), GENREADY_INVOCATION_ID=str(pinned["invocation_id"]))
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        print(f"genready guard: cannot run {cmd[0]}: {e}", file=sys.stderr)
        return Exit.NOT_RUN

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)

    problem: list[str] = []
    done = threading.Event()

    def follow() -> None:
        while not done.wait(interval):
            why = _check(base, target, pinned)
            if why:
                problem.append(why)
                return

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    rc = child.wait()
    done.set()
    watcher.join()
    if not problem and (why := _check(base, target, pinned)):
        problem.append(why)
    if problem:
        print(f"genready guard: {target} pid {pinned['pid']}: {problem[0]}; the results of {cmd[0]} "
              f"(exit {rc}) are not trustworthy", file=sys.stderr)
        return Exit.TEMPFAIL
    return rc
