"""Each run's GPU cost: the GPUs sampled every `interval` seconds on a thread of their own while a
run goes, and the run's figures from those samples (mean power, energy, output tokens per joule,
peak memory, whether anything other than idle held the clocks back).

Every read is made on the sampler's thread, never on the caller's (the sweep's), and the run's end
waits for a read in flight at most `bound` seconds: a driver that stops answering costs the run its
GPU figures (said in them), never its results line, its cleanup or a prompt stop on SIGTERM.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from genready.gpu.provider import READ_TIMEOUT_S, GpuSample, GpuUnavailable, Provider

# How long the run's end waits for the read in flight: a provider's own bound, and a little more.
END_BOUND_S: Final = READ_TIMEOUT_S + 1.0


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
    errors: int = 0  # reads that failed (each costs one sample)
    # "counter" (the GPUs' own energy counters), "power" (power.draw integrated); None: no energy.
    energy_from: str | None = None
    energy_note: str | None = None  # why the energy is not the counters' though they were read, or why there is none
    error: str | None = None  # the first failed read, in its words

    def to_json(self) -> dict[str, object]:
        return {"gpu_samples": self.samples, "gpu_seconds": round(self.seconds, 3),
                "mean_power_w": self.mean_power_w, "energy_j": self.energy_j, "energy_from": self.energy_from,
                "energy_note": self.energy_note, "tokens_per_joule": self.tokens_per_joule,
                "peak_gpu_memory_bytes": self.peak_memory_bytes, "throttled": self.throttled,
                "throttle_reasons": f"{self.throttle_reasons:#x}", "gpu_read_errors": self.errors,
                "gpu_read_error": self.error}


def _counted(timeline: Sequence[tuple[float, Sequence[GpuSample]]]) -> tuple[float | None, str | None]:
    """Joules from the GPUs' energy counters, first reading to last, where every GPU has one in both
    ((None, None) otherwise: the caller integrates power instead). A counter that went down between
    two readings restarted (a driver reload, a GPU reset): its difference means nothing, (None, why)."""
    first, last = timeline[0][1], timeline[-1][1]
    if len(timeline) < 2 or not first or [s.uuid for s in first] != [s.uuid for s in last]:
        return None, None
    if any(s.energy_mj is None for s in (*first, *last)):
        return None, None
    for gpu in first:
        seen = [s.energy_mj for _, ss in timeline for s in ss if s.uuid == gpu.uuid and s.energy_mj is not None]
        if any(b < a for a, b in itertools.pairwise(seen)):
            return None, f"the energy counter of {gpu.uuid} went down between two samples (it restarted)"
    return sum((b.energy_mj or 0) - (a.energy_mj or 0) for a, b in zip(first, last, strict=True)) / 1000, None


def _watts(s: GpuSample) -> float | None:
    """A sample's power, if it is a reading at all (a NaN or a negative one is none)."""
    return s.power_w if s.power_w is not None and math.isfinite(s.power_w) and s.power_w >= 0 else None


def summarise(timeline: Sequence[tuple[float, Sequence[GpuSample]]], output_tokens: int | None,
              errors: int = 0, error: str | None = None) -> RunGpu:
    """The figures of (monotonic time, one sample per GPU) readings: energy from the GPUs' energy
    counters where they have one (NVML) and none restarted, else their power integrated over time
    (trapezoids between readings); mean power that energy over the time sampled (a plain mean of
    one reading)."""
    powers = [(t, sum(w for s in ss if (w := _watts(s)) is not None))
              for t, ss in timeline if any(_watts(s) is not None for s in ss)]
    energy: float | None = None
    mean: float | None = None
    seconds = timeline[-1][0] - timeline[0][0] if len(timeline) > 1 else 0.0
    counted, note = _counted(timeline)
    source: str | None = None
    if counted is not None and seconds > 0:
        energy, mean, source = counted, counted / seconds, "counter"
    elif len(powers) > 1:
        source = "power"
        energy = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(powers))
        span = powers[-1][0] - powers[0][0]
        mean = energy / span if span > 0 else powers[0][1]
        note = note and f"{note}: energy from power.draw integrated instead"
    elif powers:
        mean = powers[0][1]
    if note and source is None:
        note = f"{note}, and no power readings to integrate: no energy"
    mems = [sum(s.memory_used_bytes for s in ss if s.memory_used_bytes is not None)
            for _, ss in timeline if any(s.memory_used_bytes is not None for s in ss)]
    reasons = 0
    throttled = False
    for _, ss in timeline:
        for s in ss:
            reasons |= s.throttle_reasons or 0
            throttled = throttled or s.throttled
    tpj = output_tokens / energy if output_tokens is not None and energy is not None and energy > 0 else None
    return RunGpu(len(timeline), seconds, mean, energy, tpj, max(mems) if mems else None, throttled, reasons, errors,
                  source, note, error)


@dataclass
class Sampler:
    """`with Sampler(provider): run()` samples every GPU each `interval` seconds on its own thread,
    from entry to exit (once at each end too); `summary(tokens)` gives the run's figures after.
    Exit waits for a read in flight at most `bound` seconds (see the module's docstring)."""

    provider: Provider
    interval: float = 1.0
    bound: float = END_BOUND_S
    timeline: list[tuple[float, list[GpuSample]]] = field(default_factory=list)
    errors: int = 0
    error: str | None = None  # the first failed read's words
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False  # the run ended: a read that returns later is not kept
    _thread: threading.Thread | None = None

    def _failed(self, why: str) -> None:
        with self._lock:
            self.errors += 1
            self.error = self.error or why

    def _sample(self) -> None:
        try:
            got = self.provider.samples()
        except GpuUnavailable as e:
            self._failed(str(e))
            return
        except Exception as e:  # a value no parser foresaw, a provider's bug: it costs this sample, not the run
            self._failed(f"{type(e).__name__}: {e}")
            return
        with self._lock:
            if not self._closed:
                self.timeline.append((time.monotonic(), got))

    def _loop(self) -> None:
        self._sample()
        while not self._stop.wait(self.interval):
            self._sample()
        self._sample()  # the run's end

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, name="genready-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.bound)
            if self._thread.is_alive():
                self._failed(f"a GPU read did not return within {self.bound:g} s of the run's end")
        with self._lock:
            self._closed = True

    def summary(self, output_tokens: int | None) -> RunGpu:
        with self._lock:
            timeline = list(self.timeline)
        return summarise(timeline, output_tokens, self.errors, self.error) if timeline else \
            RunGpu(0, 0.0, None, None, None, None, False, 0, self.errors, error=self.error)
