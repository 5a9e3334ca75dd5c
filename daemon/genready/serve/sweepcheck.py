"""Leftover sweep drop-ins: a unit that still carries the drop-in of a `genready sweep` that is
gone (killed mid-point) runs that point's configuration. Shown as a warning in /status and as
`genready_sweep_dropin_orphaned`; checked when /status or /metrics is asked.

DropInPaths as the watcher last read them: a drop-in takes effect only at a daemon-reload, after
which the watcher re-reads every unit, so no fresh read is needed (with 200 targets one per
/status cost 40 ms). The file and /proc are read off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from genready.compat import TIMEOUT_ERRORS, wait_for
from genready.systemd import sweepdropin

if TYPE_CHECKING:
    from genready.serve.target import Target

log = logging.getLogger("genready.serve.sweepcheck")
SWEEP_CHECK_WAIT: Final = 2.0  # seconds /status and /metrics wait for the check before answering


async def check(targets: Iterable[Target]) -> None:
    """Look again at every target, setting each one's `sweep_warning` (logged once, when it appears).
    Bounded: a slow disk or /proc leaves the last answers standing."""
    with contextlib.suppress(*TIMEOUT_ERRORS):
        await wait_for(asyncio.gather(*(_check(t) for t in targets)), SWEEP_CHECK_WAIT)


async def _check(t: Target) -> None:
    snap = t.gate.snap
    if snap is None:
        return  # the bus is down: /status says so elsewhere; the last answer stands
    found = None
    if sweepdropin.names_a_sweep_dropin(snap.dropin_paths):
        found = await asyncio.to_thread(sweepdropin.leftover, snap.dropin_paths)
    warning = found.warning(t.unit, t.name) if found else None
    if warning is not None and warning != t.sweep_warning:
        log.warning("%s: %s", t.name, warning)
    t.sweep_warning = warning
