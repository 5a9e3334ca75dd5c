"""One configured target in the daemon: its gate and everything the surfaces show beside it, made
and closed together. A reload that removes a target closes one object, and nothing of it is left
in a registry beside it: not its failed start's lines, its sweep warning, its stamp, nor a series
at the next scrape (its counters are its own, read by the scrape-time collector)."""

from __future__ import annotations

from typing import Final

from genready.probe.serverkind import TargetKind, resolve
from genready.rule.gate import TargetGate
from genready.serve.lastwords import LastWords
from genready.serve.metrics import TargetCounters, TargetGauges
from genready.serve.stamp import Stamps

NO_STAMP: Final[dict[str, object]] = {}  # "not yet decided": differs from every payload, including None


class Target:
    """A target's gate, its last words (a failed start's lines), its sweep warning (a leftover drop-in of
    a sweep that is gone), its ready stamp and its counters."""

    def __init__(self, gate: TargetGate, lastwords: LastWords | None = None, stamps: Stamps | None = None) -> None:
        self.gate = gate
        self.lastwords = lastwords
        self.counters = TargetCounters()
        self.sweep_warning: str | None = None  # serve/sweepcheck.py sets it when /status or /metrics asks
        self.config_changed = False  # its unit differs from what its running start runs (logged once each way)
        # What the GPU watch (serve/gpuwatch.py) last read for it: current start's bytes, strays; None: no reading.
        self.gpu: dict[str, object] | None = None
        self.stamped: dict[str, object] | None = NO_STAMP  # the stamp's content as last applied (None: absent)
        self._stamps = stamps
        # (the start and the kind key it was resolved for, it)
        self._kind: tuple[tuple[str, int, bool, str], TargetKind] | None = None
        if stamps is not None:
            self.stamp(None)  # a stamp left by an earlier run proves nothing now

    @property
    def name(self) -> str:
        return self.gate.name

    @property
    def unit(self) -> str:
        return self.gate.unit

    @property
    def kind(self) -> TargetKind:
        """The server kind its unit runs (probe/serverkind.py): resolved once per start of the unit, and once
        more when that start is verified (the process that served the probe is then known)."""
        g = self.gate
        s, v = g.snap, g.verified
        key = (s.invocation_id if s else "", s.main_pid if s else 0, v is not None, g.cfg.kind)
        if self._kind is None or self._kind[0] != key:
            rec = g.history.get(key[0]) if key[0] else None
            served = rec.served_by_pid if rec is not None and v is not None else None
            words = s.exec_start[-1] if s and s.exec_start else ()
            self._kind = key, resolve(g.cfg.kind, pids=[served or 0, key[1]], exec_start=words)
        return self._kind[1]

    def stamp(self, payload: dict[str, object] | None) -> None:
        """Make the ready stamp hold `payload` (None: no stamp), if that is not what it holds already."""
        if self._stamps is not None and payload != self.stamped:
            self.stamped = payload
            self._stamps.set(self.name, payload)

    def lines(self, invocation_id: str) -> list[str]:
        """A failed start's own lines, if `invocation_id` is the last failed start and they were read."""
        return self.lastwords.lines(invocation_id) if self.lastwords is not None else []

    def gpu_strays(self, invocation_id: str) -> list[object] | None:
        """The strays that held GPU memory when the failed start `invocation_id` ended (None: not read)."""
        f = self.lastwords.failure if self.lastwords is not None else None
        return f.get("gpu_strays") if f is not None and f["invocation_id"] == invocation_id else None  # type: ignore[return-value]

    def gauges(self) -> TargetGauges:
        """Every series of this target as it is now: what /metrics shows at a scrape."""
        g = self.gate
        return TargetGauges(target=g.name, unit=g.unit, state=str(g.state), ready=g.ready,
                            main_pid=g.snap.main_pid if g.snap else 0, expected_load_seconds=g.expected_load_seconds,
                            sweep_dropin_orphaned=self.sweep_warning is not None,
                            config_changed=bool(g.config_changes), loading_seconds=g.load_clock()[0],
                            foreign_listeners=len(g.strangers),
                            counters=self.counters)

    async def close(self, *, removed: bool = False) -> None:
        """Stop its reads and probes; `removed` (a reload without it): its stamp goes too (retried
        until it is gone, like any stamp that cannot be written). At shutdown the stamps stay."""
        if self.lastwords is not None:
            self.lastwords.close()
        if removed:
            self.stamp(None)
        await self.gate.close()
