"""The sweep's check for GPU strays (issue 40): a point's server does not load, nor its command run,
while processes of an earlier start of the unit hold memory on the target's GPUs (a CUDA
out-of-memory, or a run measured on what memory is left). The daemon reads the GPUs
(serve/gpuwatch.py); the sweep asks its /status. genready never ends a stray: it waits up to the
plan's `stray_wait` for them to exit, then stops the sweep naming them and how to end them.
`--ignore-strays` skips the check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from genready.client import client
from genready.sweep.run.steps import Signals, SweepOptions

POLL = 1.0  # seconds between asks of the daemon while strays hold memory


def strays(base: str, target: str) -> list[dict[str, Any]]:
    """The target's strays holding GPU memory as the daemon last read them ([]: none, or no reading:
    a daemon with daemon.gpu_interval = 0, or on a host without GPUs)."""
    t = ((client.get_json(base, "/status") or {}).get("targets") or {}).get(target) or {}
    gpu = t.get("gpu") or {}
    return [h for h in gpu.get("strays") or [] if isinstance(h, dict) and h.get("bytes") != 0]


def refusal(found: list[dict[str, Any]], waited: float, ctl: str, unit: str) -> str:
    """Why the sweep stops: each stray, and how to end it (the sweep never does)."""
    names = "; ".join(str(h.get("line") or f"PID {h.get('pid')} on {h.get('gpu')}") for h in found)
    return (f"strays of an earlier start of {unit} still hold GPU memory after {waited:g} s (stray_wait): {names}. "
            f"genready ends no process: check each (`ps -o pid,lstart,cmd -p PID`), then `kill PID`, or "
            f"`{ctl} kill --kill-whom=all {unit}` while the unit is to stop anyway; then run again with "
            "--resume (or --ignore-strays to measure next to them)")


def wait_out(opts: SweepOptions, say: Callable[[str], None], signals: Signals,
             sleep: Callable[[float], None] = time.sleep) -> str:
    """Wait until no stray holds memory on the target's GPUs, at most the plan's stray_wait: "" then,
    else the refusal. Interrupted (a stop signal) propagates."""
    if opts.ignore_strays:
        return ""
    deadline = time.monotonic() + opts.plan.stray_wait
    found = strays(opts.base, opts.target)
    if found:
        say(f"waiting up to {opts.plan.stray_wait:g} s for {len(found)} stray process(es) holding GPU memory to exit: "
            + "; ".join(str(h.get("line")) for h in found))
    while found:
        if time.monotonic() >= deadline:
            ctl = "systemctl --user" if opts.bus_kind == "user" else "systemctl"
            return refusal(found, opts.plan.stray_wait, ctl, opts.unit)
        signals.check()
        sleep(min(POLL, max(0.0, deadline - time.monotonic())))
        found = strays(opts.base, opts.target)
    return ""
