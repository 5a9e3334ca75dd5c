"""Each run's GPU cost: the GPUs sampled every `interval` seconds on a thread of their own while a
run goes, and the run's figures from those samples (mean power, energy, output tokens per joule,
peak memory, whether anything other than idle held the clocks back)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from genready.gpu.provider import GpuSample, GpuUnavailable, Provider


@dataclass(frozen=True, slots=True)
class RunGpu:
    """A run's GPU figures over all GPUs sampled; None where no sample had the value."""

    samples: int
    seconds: float
    mean_power_w: float | None
    energy_j: float | None
    tokens_per_joule: float | None
    peak_memory_bytes: int | None
    throttled: bool
    throttle_reasons: int  # every reason bit seen, ORed
    errors: int = 0
    energy_from: str = ""  # "counter" (the GPUs' own energy counters), "power" (power.draw integrated) or ""

    def to_json(self) -> dict[str, object]:
        return {"gpu_samples": self.samples, "gpu_seconds": round(self.seconds, 3),
                "mean_power_w": self.mean_power_w, "energy_j": self.energy_j, "energy_from": self.energy_from,
                "tokens_per_joule": self.tokens_per_joule, "peak_gpu_memory_bytes": self.peak_memory_bytes,
                "throttled": self.throttled, "throttle_reasons": f"{self.throttle_reasons:#x}"}


def _counted(timeline: Sequence[tuple[float, Sequence[GpuSample]]]) -> float | None:
    """Joules from the GPUs' energy counters, first reading to last, where every GPU has one in both
    (None otherwise: the caller integrates power instead)."""
    first, last = timeline[0][1], timeline[-1][1]
    if len(timeline) < 2 or not first or [s.uuid for s in first] != [s.uuid for s in last]:
        return None
    if any(s.energy_mj is None for s in (*first, *last)):
        return None
    return sum((b.energy_mj or 0) - (a.energy_mj or 0) for a, b in zip(first, last, strict=True)) / 1000


def summarise(timeline: Sequence[tuple[float, Sequence[GpuSample]]], output_tokens: int | None,
              errors: int = 0) -> RunGpu:
    """The figures of (monotonic time, one sample per GPU) readings: energy from the GPUs' energy
    counters where they have one (NVML), else their power integrated over time (trapezoids between
    readings); mean power that energy over the time sampled (a plain mean of one reading)."""
    powers = [(t, sum(s.power_w for s in ss if s.power_w is not None))
              for t, ss in timeline if any(s.power_w is not None for s in ss)]
    energy: float | None = None
    mean: float | None = None
    seconds = timeline[-1][0] - timeline[0][0] if len(timeline) > 1 else 0.0
    counted = _counted(timeline)
    source = ""
    if counted is not None and seconds > 0:
        energy, mean, source = counted, counted / seconds, "counter"
    elif len(powers) > 1:
        source = "power"
        energy = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(powers))
        span = powers[-1][0] - powers[0][0]
        mean = energy / span if span > 0 else powers[0][1]
    elif powers:
        mean = powers[0][1]
    mems = [sum(s.memory_used_bytes for s in ss if s.memory_used_bytes is not None)
            for _, ss in timeline if any(s.memory_used_bytes is not None for s in ss)]
    reasons = 0
    throttled = False
    for _, ss in timeline:
        for s in ss:
            reasons |= s.throttle_reasons or 0
            throttled = throttled or s.throttled
    tpj = output_tokens / energy if output_tokens is not None and energy else None
    return RunGpu(len(timeline), seconds, mean, energy, tpj, max(mems) if mems else None, throttled, reasons, errors,
                  source)


@dataclass
class Sampler:
    """`with Sampler(provider): run()` samples every GPU each `interval` seconds on its own thread,
    from entry to exit (once at each end too); `summary(tokens)` gives the run's figures after."""

    provider: Provider
    interval: float = 1.0
    timeline: list[tuple[float, list[GpuSample]]] = field(default_factory=list)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        try:
            self.timeline.append((time.monotonic(), self.provider.samples()))
        except GpuUnavailable:
            self.errors += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="genready-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def summary(self, output_tokens: int | None) -> RunGpu:
        return summarise(self.timeline, output_tokens, self.errors) if self.timeline else \
            RunGpu(0, 0.0, None, None, None, None, False, 0, self.errors)
