"""What genready says about readiness outside its HTTP API: sd_notify (READY=1, RELOADING=1,
STATUS=) and the ready stamps.

Each one is recomputed from the readiness rule (`TargetGate.ready`, i.e. `gate.is_ready`) at
the moment it is sent, never taken from an event's payload or from a flag remembered since:
a target verified and then revoked before genready's first READY=1 gets no READY=1, and a
stamp can only say "ready" while /ready would say 200. (The gauges of /metrics are read from the
gates at each scrape: serve/target.py.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Final

from genready.rule.gate import TargetGate
from genready.serve.target import Target
from genready.systemd.notify import Notifier
from genready.timewords import duration
from genready.vocab import State

log = logging.getLogger("genready")

# A probe's outcome changes only STATUS='s progress words, at most once per this many seconds.
# Loading servers are probed several times a second each; STATUS= is read by a person
# (`systemctl status`), and rebuilding it for every target on every probe cost genready most of
# a core with 200 loading targets.
PROGRESS_EVERY: Final = 1.0


def stamp_payload(gate: TargetGate) -> dict[str, object] | None:
    """The ready stamp's content while the target is ready, else None (no stamp)."""
    if not gate.ready or gate.verified is None:
        return None
    v = gate.verified.to_json()
    # `ready_at` is the stamp's first spelling of `ready_since`: kept for existing readers.
    return {"target": gate.name, "unit": gate.unit, **v, "ready_at": v["ready_since"]}


def status_line(g: TargetGate) -> str:
    """One target's part of STATUS= (what `systemctl status genready` shows)."""
    if g.ready and g.verified:
        load = f" (loaded in {duration(g.verified.load_seconds)})" if g.verified.load_seconds else ""
        return f"{g.name}: ready pid {g.verified.instance.main_pid}{load}"
    if g.state in (State.LOADING, State.WARMING, State.STUCK) and g.snap:
        p = g.progress
        err = f", probe {p.probes}: {p.last_failure}" if p.last_failure else ""
        return f"{g.name}: {g.state} pid {g.snap.main_pid} for {duration(g.waiting_seconds)}{err}"
    return f"{g.name}: {g.state}" + (f" ({g.reason})" if g.reason else "")


class Outputs:
    """Keeps sd_notify and the stamps in line with the rule; `update()` after any change.

    systemd hears READY=1 once the API listens and every `gate_startup` target is ready;
    after that, RELOADING=1 while one of them is not, and READY=1 when all are again.
    """

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.sent_ready = False  # READY=1 was sent once: start-up is over for systemd
        self.reloading = False  # RELOADING=1 was sent and its READY=1 not yet
        self._status_sent = float("-inf")  # time.monotonic() of the last STATUS=

    def begin_reload(self) -> None:
        """A new configuration is being applied (SIGHUP): RELOADING=1 once start-up is over."""
        if self.sent_ready:
            self.reloading = True
            self.notifier.reloading(status="genready: applying a new configuration")

    def update(self, targets: Iterable[Target], *, listening: bool, notes: Iterable[str] = ()) -> None:
        """Bring every output in line with `gate.ready` now; `notes` are extra STATUS= lines."""
        gates = []
        for t in targets:
            t.stamp(stamp_payload(t.gate))
            gates.append(t.gate)
        status = self._status(gates, notes)
        all_ready = all(g.ready for g in gates if g.cfg.gate_startup)
        if not self.sent_ready:
            if listening and all_ready:
                self.sent_ready = True
                self.notifier.ready(status=status)
                log.info("all gating targets verified: READY=1 sent to systemd")
                return
        elif not self.reloading and not all_ready:
            self.reloading = True
            self.notifier.reloading(status=status)
            return
        elif self.reloading and all_ready:
            self.reloading = False
            self.notifier.ready(status=status)
            return
        self.notifier.status(status)

    def progress(self, targets: Iterable[Target], *, notes: Iterable[str] = ()) -> None:
        """A probe's outcome: only STATUS= changes (probe count, last failure), at most once per
        PROGRESS_EVERY. Readiness never changes by a probe alone: a verification, revocation or
        state change follows it as its own event, and `update()` sends that at once."""
        if time.monotonic() - self._status_sent >= PROGRESS_EVERY:
            self.notifier.status(self._status([t.gate for t in targets], notes))

    def _status(self, gates: list[TargetGate], notes: Iterable[str]) -> str:
        """The STATUS= text, built only to be sent at once: its time is what progress() paces by."""
        self._status_sent = time.monotonic()
        return "\n".join([*(status_line(g) for g in gates), *notes])
