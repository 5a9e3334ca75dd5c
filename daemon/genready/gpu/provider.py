"""The GPU provider seam: what every provider answers (compute processes, per-GPU samples) and which
one to use is `watch.choose()`. AMD (`amdsmi`) would be a third `Provider`.

Every call here blocks (a library call into the driver, or a subprocess): callers run it on a
worker thread (`read_off_loop`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
MIB = 1024 * 1024
# The longest any one read of the GPUs is waited for (an nvidia-smi query, a round of NVML calls):
# a driver that does not answer costs that read, never the daemon's or the sweep's own work.
READ_TIMEOUT_S: Final = 5.0


class GpuUnavailable(RuntimeError):
    """No provider can read the GPUs here (no driver, no library, no nvidia-smi, or it failed);
    the message says which and why."""


@dataclass(frozen=True, slots=True)
class ComputeProcess:
    """One process holding a context on one GPU. `used_bytes` is None where the driver does not
    say (nvidia-smi's `[N/A]`: some containers, MIG, or not permitted)."""

    gpu_uuid: str
    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU; a field is None where the driver does not report it."""

    index: int
    uuid: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_pct: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    temperature_c: float | None
    # The driver's clock-event ("throttle") reason bitmask, as NVML and nvidia-smi give it.
    throttle_reasons: int | None
    # The GPU's energy counter since the driver loaded (NVML only, Volta and later), in mJ: a run's
    # energy from it misses nothing between samples, where power.draw is a 1 s average.
    energy_mj: int | None = None

    @property
    def throttled(self) -> bool:
        """Any reason other than idle (0x1) or application-clock setting (0x2): those two say only
        that the GPU had nothing to do or was told its clocks, not that it was held back."""
        return bool(self.throttle_reasons and self.throttle_reasons & ~0x3)


class Provider(Protocol):
    """A source of GPU readings. Both calls block, and raise GpuUnavailable when they cannot read."""

    name: str

    def processes(self) -> list[ComputeProcess]:
        """Every compute process on every GPU, with the memory it holds."""
        ...

    def samples(self) -> list[GpuSample]:
        """One sample per GPU, in index order."""
        ...


async def read_off_loop(executor: concurrent.futures.Executor | None, call: Callable[[], T]) -> T:
    """`call()` (a provider read) on `executor`'s thread, awaited: the event loop never waits on
    the driver or on nvidia-smi. None: asyncio's default executor."""
    return await asyncio.get_running_loop().run_in_executor(executor, call)
