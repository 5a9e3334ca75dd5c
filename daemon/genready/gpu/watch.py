"""One object the daemon (or the sweep) holds to ask "who holds the GPUs, whose start is it": a
provider, the recorded process trees, and a read that runs on a worker thread.

Wiring, for the integrator: make one `GpuWatch(choose())` at start-up (GpuUnavailable: no GPU
here, leave the feature off); on every start and end of a target's unit, and every `gpu_interval`
seconds, `await watch.refresh([starts_of(...), ...])`, and call `watch.record_tree(...)` for each
running start (also off the loop: `await read_off_loop(executor, lambda: ...)`). `/status` shows
`reading.targets[name].to_json()`; the gauge `genready_gpu_stray_bytes{target,gpu}` is
`reading.targets[name].stray_bytes()`.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from genready.gpu import nvml, smi
from genready.gpu.attribution import (
    Holding,
    Proc,
    Start,
    TargetGpu,
    TargetStarts,
    Trees,
    ancestry,
    attribute,
    per_target,
)
from genready.gpu.provider import GpuSample, GpuUnavailable, Provider, read_off_loop
from genready.store.records import StartRecord
from genready.timewords import from_iso


@dataclass
class GpuReading:
    """One reading: when, each GPU process's Holding, each target's picture; `error` (and nothing
    else) when the provider could not read."""

    at: float
    holdings: list[Holding] = field(default_factory=list)
    targets: dict[str, TargetGpu] = field(default_factory=dict)
    error: str | None = None


def starts_of(target: str, unit: str, records: Iterable[StartRecord], current_invocation: str | None,
              control_group: str | None = None) -> TargetStarts:
    """A target's starts as attribution wants them, from its start records (rule/history) and the
    unit's InvocationID now (None or "": not running)."""
    cur: Start | None = None
    earlier = []
    for r in records:
        s = Start(r.invocation_id, r.main_pid, from_iso(r.started_at) or from_iso(r.active_at), from_iso(r.ended_at))
        if current_invocation and r.invocation_id == current_invocation:
            cur = s
        else:
            earlier.append(s)
    return TargetStarts(target, unit, cur, tuple(earlier), control_group)


def choose(prefer: str = "auto") -> Provider:
    """The provider to use: `nvml`, `smi`, or `auto` (NVML if `nvidia-ml-py` is installed and the
    driver answers it, else nvidia-smi). GpuUnavailable names every reason none would do."""
    reasons: list[str] = []
    if prefer in ("auto", "nvml"):
        try:
            return nvml.NvmlProvider()
        except GpuUnavailable as e:
            reasons.append(f"nvml: {e}")
    if prefer in ("auto", "smi"):
        try:
            return smi.SmiProvider()
        except GpuUnavailable as e:
            reasons.append(f"nvidia-smi: {e}")
    raise GpuUnavailable("; ".join(reasons) or f"unknown provider {prefer!r} (expected auto, nvml or smi)")


class GpuWatch:
    """The provider and the trees; each method blocks unless it says otherwise."""

    def __init__(self, provider: Provider, executor: concurrent.futures.Executor | None = None) -> None:
        self.provider = provider
        self.executor = executor
        self.trees = Trees()
        self.latest: GpuReading | None = None  # the last reading, for /status and the gauges

    def record_tree(self, target: str, invocation_id: str, main_pid: int) -> int:
        """Remember this start's processes now (blocks on /proc): see attribution.Trees."""
        return self.trees.record(target, invocation_id, main_pid) if main_pid else 0

    def read(self, targets: Sequence[TargetStarts]) -> GpuReading:
        """Read the GPUs' processes and attribute them (blocks: the provider and /proc)."""
        now = time.time()
        try:
            procs = self.provider.processes()
        except GpuUnavailable as e:
            self.latest = GpuReading(now, error=str(e))
            return self.latest
        chains: dict[int, list[Proc]] = {p.pid: ancestry(p.pid) for p in procs}
        holdings = attribute(procs, chains, targets, self.trees.seen)
        # One assignment of a whole new reading: a scrape on another thread sees the old or the new.
        self.latest = GpuReading(now, holdings, per_target(holdings, (t.target for t in targets)))
        return self.latest

    def samples(self) -> list[GpuSample]:
        """One sample per GPU (blocks); GpuUnavailable propagates."""
        return self.provider.samples()

    async def refresh(self, targets: Sequence[TargetStarts]) -> GpuReading:
        """`read` on the executor's thread: the event loop never waits on the driver or /proc."""
        return await read_off_loop(self.executor, lambda: self.read(targets))


def stray_line(h: Holding) -> str:
    """One stray for people (a live line, the sweep's refusal, a failed start's note): which GPU,
    how much, which process, which start left it, and how to end it (genready never does)."""
    size = "an unknown amount" if h.used_bytes is None else f"{h.used_bytes / 2**30:.1f} GiB"
    start = f"the start {h.invocation_id[:12]}" if h.invocation_id else "an earlier start genready has no record of"
    where = f"in {h.unit}'s cgroup" if h.unit else "outside any unit"
    return (f"{h.gpu_uuid} holds {size} in PID {h.pid} ({h.command or '?'}), {where}, left by {start}; "
            f"end it with `kill {h.pid}`")
