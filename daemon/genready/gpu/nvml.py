"""The NVML provider, through `nvidia-ml-py` (import name `pynvml`; the `genready[gpu]` extra).

The import is lazy: genready runs without the package, and a host without an NVIDIA driver never
loads libnvidia-ml. The calls are the ones `nvidia-ml-py` wraps from NVML's C API: a value a GPU
does not support (NVML_ERROR_NOT_SUPPORTED, say power on some boards) is None, not an error.

NVML's calls have no time limit, and one into a GPU that fell off the bus can block for good. Each
read (nvmlInit, a list of processes, a round of samples, nvmlShutdown) therefore runs on a thread of
its own and is waited for at most `timeout` seconds, as nvidia-smi is (provider.READ_TIMEOUT_S): past it the
read is GpuUnavailable, its thread is left to NVML, and every read until that call returns fails at
once (no pile of stuck threads). A C call cannot be interrupted: the thread is a daemon one, so it
does not keep the process from exiting.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from genready.gpu.provider import READ_TIMEOUT_S, ComputeProcess, GpuSample, GpuUnavailable

T = TypeVar("T")


def _load() -> ModuleType:
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]  # the optional extra
    except ImportError as e:
        raise GpuUnavailable("nvidia-ml-py is not installed (pip install 'genready[gpu]')") from e
    return pynvml  # type: ignore[no-any-return,unused-ignore]


def _text(v: Any) -> str:
    """NVML strings: bytes from nvidia-ml-py before 11.5, str after."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlProvider:
    """NVML, initialised once (nvmlInit) and shut down by close(). `lib` is the pynvml module;
    a test passes a stand-in of the few calls used here."""

    name = "nvml"

    def __init__(self, lib: ModuleType | Any | None = None, timeout: float = READ_TIMEOUT_S) -> None:
        self.nv = lib if lib is not None else _load()
        self.timeout = timeout
        self._lock = threading.Lock()
        self._closed = False
        # A call past its timeout: (its thread, what it was, since when).
        self._stuck: tuple[threading.Thread, str, float] | None = None
        try:
            self._bounded("nvmlInit", self.nv.nvmlInit)
        except self.nv.NVMLError as e:
            raise GpuUnavailable(f"nvmlInit failed: {e}") from e

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(self.nv.NVMLError, GpuUnavailable):
            self._bounded("nvmlShutdown", self.nv.nvmlShutdown)

    def _bounded(self, what: str, call: Callable[[], T]) -> T:
        """call() on a thread of its own, waited for at most self.timeout s (see the module's docstring)."""
        with self._lock:
            if self._stuck is not None:
                thread, stuck_on, since = self._stuck
                if thread.is_alive():
                    raise GpuUnavailable(f"NVML has not returned from {stuck_on} for {time.monotonic() - since:.0f} s "
                                         "(a GPU that fell off the bus?); no GPU is read until it does")
                self._stuck = None
        done: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                done.append((True, call()))
            except BaseException as e:  # handed to the caller, whatever it is
                done.append((False, e))

        thread = threading.Thread(target=run, name="genready-nvml", daemon=True)
        began = time.monotonic()
        thread.start()
        thread.join(self.timeout)
        if not done:
            with self._lock:
                self._stuck = (thread, what, began)
            raise GpuUnavailable(f"NVML did not answer {what} within {self.timeout:g} s "
                                 "(a GPU that fell off the bus?)")
        ok, value = done[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def _get(self, call: str, *args: Any) -> Any:
        """nv.<call>(*args), or None where NVML says it cannot give that value (not supported)."""
        try:
            return getattr(self.nv, call)(*args)
        except self.nv.NVMLError:
            return None

    def _handles(self) -> list[Any]:
        try:
            return [self.nv.nvmlDeviceGetHandleByIndex(i) for i in range(self.nv.nvmlDeviceGetCount())]
        except self.nv.NVMLError as e:
            raise GpuUnavailable(f"NVML cannot list the GPUs: {e}") from e

    def processes(self) -> list[ComputeProcess]:
        return self._bounded("a list of the GPUs' processes", self._processes)

    def samples(self) -> list[GpuSample]:
        return self._bounded("a round of GPU samples", self._samples)

    def _processes(self) -> list[ComputeProcess]:
        out = []
        for h in self._handles():
            try:
                uuid = _text(self.nv.nvmlDeviceGetUUID(h))
                procs = self.nv.nvmlDeviceGetComputeRunningProcesses(h)
            except self.nv.NVMLError as e:
                raise GpuUnavailable(f"NVML cannot list a GPU's processes: {e}") from e
            for p in procs:
                # usedGpuMemory is None where NVML has no value (NVML_VALUE_NOT_AVAILABLE).
                used = getattr(p, "usedGpuMemory", None)
                out.append(ComputeProcess(uuid, int(p.pid), None if used is None else int(used)))
        return out

    def _throttle(self, h: Any) -> int | None:
        # NVML 12.x names it ClocksEventReasons and keeps the old name; older ones have only the old.
        for call in ("nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetCurrentClocksEventReasons"):
            if hasattr(self.nv, call):
                v = self._get(call, h)
                return None if v is None else int(v)
        return None

    def _samples(self) -> list[GpuSample]:
        nv = self.nv
        out = []
        for i, h in enumerate(self._handles()):
            # Version 2 leaves out the memory the driver reserves, as nvidia-smi does: version 1's
            # `used` was 615 MiB higher on an H200 with driver 580 (bench/gpu_check.py).
            v2 = getattr(nv, "nvmlMemory_v2", None)
            mem = (self._get("nvmlDeviceGetMemoryInfo", h, v2) if v2 is not None else None) \
                or self._get("nvmlDeviceGetMemoryInfo", h)
            util = self._get("nvmlDeviceGetUtilizationRates", h)
            power_mw = self._get("nvmlDeviceGetPowerUsage", h)
            sm = self._get("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
            temp = self._get("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
            energy = self._get("nvmlDeviceGetTotalEnergyConsumption", h)
            out.append(GpuSample(
                index=i, uuid=_text(self._get("nvmlDeviceGetUUID", h) or ""),
                memory_used_bytes=None if mem is None else int(mem.used),
                memory_total_bytes=None if mem is None else int(mem.total),
                utilization_pct=None if util is None else float(util.gpu),
                power_w=None if power_mw is None else power_mw / 1000.0,
                sm_clock_mhz=None if sm is None else float(sm),
                temperature_c=None if temp is None else float(temp),
                throttle_reasons=self._throttle(h),
                energy_mj=None if energy is None else int(energy)))
        return out
