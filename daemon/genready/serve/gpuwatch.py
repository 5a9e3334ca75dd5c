"""The daemon's GPU watch (issue 40): which processes hold GPU memory, and whose start each is.

Read at start-up, at each start and end of a target's unit (`poke`), and every
`daemon.gpu_interval` seconds, always on one worker thread of its own (the provider and /proc
block; the event loop never waits on them). Each reading is handed to the Targets (`Target.gpu`,
what /status and the page show), to the gauges (`latest`), and to a failed start that has no
GPU picture yet (the strays that held memory when it ended: the likely cause of a CUDA OOM).
A host without NVML or nvidia-smi shows nothing and says so once in the log.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from genready.compat import wait_for
from genready.gpu.attribution import Holding
from genready.gpu.provider import GpuUnavailable, Provider
from genready.gpu.watch import GpuReading, GpuWatch, choose, starts_of, stray_line
from genready.serve.target import Target
from genready.store.records import RecordStore
from genready.systemd.snapshot import Snapshot
from genready.timewords import from_iso, iso

log = logging.getLogger("genready.gpu")


def stray_json(h: Holding) -> dict[str, object]:
    """A stray as the API shows it: its Holding, and one line for people."""
    return {**h.to_json(), "line": stray_line(h)}


class DaemonGpu:
    """The watch, its worker thread and the loop that reads it; `latest` for the gauges."""

    def __init__(self, targets: Mapping[str, Target], store: RecordStore, interval: float,
                 choose_provider: Callable[[], Provider] = choose) -> None:
        self.targets = targets
        self.store = store
        self.interval = interval
        self._choose = choose_provider
        # One thread: reads never overlap, and a slow nvidia-smi (bounded by its own timeout) holds up only this.
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="genready-gpu")
        self.watch: GpuWatch | None = None
        self.unavailable: str | None = None  # why no provider would do (said once in the log)
        self._due = asyncio.Event()
        self._seen: dict[str, tuple[str, int, str]] = {}  # unit -> (InvocationID, MainPID, ControlGroup) last seen
        # unit -> its ControlGroup as systemd last said it: kept while the unit is stopped (systemd
        # then says none), when its strays may still be in it. The path changes only with Slice=.
        self.cgroups: dict[str, str] = {}

    @property
    def latest(self) -> GpuReading | None:
        return self.watch.latest if self.watch is not None else None

    def poke(self, unit: str, snap: Snapshot | None) -> None:
        """A unit's snapshot: read again now if a start began or ended, or its cgroup became known."""
        now = (snap.invocation_id, snap.main_pid, snap.control_group) if snap is not None else ("", 0, "")
        if snap is not None and snap.control_group:
            self.cgroups[unit] = snap.control_group
        if self._seen.get(unit) != now:
            self._seen[unit] = now
            self._due.set()

    async def run(self) -> None:
        """Choose the provider (off the loop), then read until cancelled."""
        loop = asyncio.get_running_loop()
        try:
            provider = await loop.run_in_executor(self.executor, self._choose)
        except GpuUnavailable as e:
            self.unavailable = str(e)
            log.info("no GPU processes are read on this host (%s); daemon.gpu_interval = 0 silences this", e)
            return
        self.watch = GpuWatch(provider, self.executor)
        log.info("reading GPU processes through %s every %g s", provider.name, self.interval)
        failing = False
        while True:
            self._due.clear()
            try:
                reading = await self.refresh()
            except Exception as e:  # a bug must not end the reads for good: said, and tried again next time
                log.exception("reading the GPUs' processes failed")
                reading = GpuReading(time.time(), error=f"{type(e).__name__}: {e}")
            if bool(reading.error) != failing:  # once each way, not at every read
                failing = bool(reading.error)
                if failing:
                    log.warning("cannot read the GPUs' processes: %s; retried every %g s", reading.error,
                                self.interval)
                else:
                    log.info("the GPUs' processes are read again")
            with contextlib.suppress(TimeoutError):
                await wait_for(self._due.wait(), self.interval)

    async def refresh(self) -> GpuReading:
        """One reading (the running starts' process trees recorded first), handed to the Targets."""
        assert self.watch is not None
        watch = self.watch
        targets = list(self.targets.values())
        # (target, unit, current InvocationID, MainPID) as the loop sees them now; the rest on the worker.
        now = [(t.name, t.unit, t.gate.snap.invocation_id if t.gate.snap is not None else "",
                t.gate.snap.main_pid if t.gate.snap is not None else 0) for t in targets]
        for t in targets:
            if t.gate.snap is not None and t.gate.snap.control_group:
                self.cgroups[t.unit] = t.gate.snap.control_group
        cgroups = dict(self.cgroups)  # the units' own cgroups, exact: never matched by the unit's name

        def read() -> GpuReading:
            for name, _, inv, pid in now:
                if pid:
                    with contextlib.suppress(OSError):
                        watch.record_tree(name, inv, pid)
            return watch.read([starts_of(name, unit, self.store.all(name), inv if pid else None, cgroups.get(unit))
                               for name, unit, inv, pid in now])

        reading = await asyncio.get_running_loop().run_in_executor(self.executor, read)
        self.hand_out(reading)
        return reading

    def hand_out(self, reading: GpuReading) -> None:
        """Give each Target its picture, and each failed start not yet given one its strays."""
        for name, t in self.targets.items():
            tg = reading.targets.get(name)
            t.gpu = {"read_at": iso(reading.at), "error": reading.error,
                     "current_bytes": dict(tg.current_bytes) if tg else {},
                     "stray_bytes": tg.stray_bytes() if tg else {},
                     "strays": [stray_json(h) for h in tg.strays] if tg else []}
            f = t.lastwords.failure if t.lastwords is not None else None
            ended = from_iso(str(f.get("ended_at"))) if f is not None and f.get("ended_at") else None
            if f is not None and f.get("gpu_strays") is None and ended is not None and reading.at >= ended \
                    and not reading.error:
                f["gpu_strays"] = t.gpu["strays"]
                t.gate.wake()  # a long-poll waiting on start_failed answers with them

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
