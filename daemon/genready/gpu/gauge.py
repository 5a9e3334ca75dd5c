"""The GPU gauges, read from the watch's latest reading at each scrape (prometheus_client's custom
collector, as serve/metrics' GaugeCollector): `genready_gpu_stray_bytes{target,gpu}`, what the
alert on strays watches, and `genready_gpu_current_bytes{target,gpu}`. Register it on the daemon's
own registry: `metrics.registry.register(GpuCollector(lambda: watch.latest))`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from genready.gpu.watch import GpuReading

_STRAY: Final = ("genready_gpu_stray_bytes",
                 "GPU memory held by processes of an earlier start of the target's unit (strays), per GPU (UUID)")
_CURRENT: Final = ("genready_gpu_current_bytes", "GPU memory held by the target's current start, per GPU (UUID)")
_READ_OK: Final = ("genready_gpu_read_ok", "1 if the last read of the GPUs' processes succeeded")
_LABELS: Final = ("target", "gpu")


class GpuCollector(Collector):
    """The gauges of `latest()` (None: no reading yet, no series). A (target, GPU) series exists
    while something of that kind holds memory there and is absent otherwise: an alert on
    `genready_gpu_stray_bytes > 0` needs no zeros, and GPUs that come and go leave no series behind."""

    def __init__(self, latest: Callable[[], GpuReading | None]) -> None:
        self.latest = latest

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(*_STRAY, labels=_LABELS), GaugeMetricFamily(*_CURRENT, labels=_LABELS),
                GaugeMetricFamily(*_READ_OK)]

    def collect(self) -> Iterator[Metric]:
        reading = self.latest()
        stray = GaugeMetricFamily(*_STRAY, labels=_LABELS)
        current = GaugeMetricFamily(*_CURRENT, labels=_LABELS)
        if reading is not None:
            for target, tg in sorted(reading.targets.items()):
                for gpu, n in sorted(tg.stray_bytes().items()):
                    stray.add_metric([target, gpu], n)
                for gpu, n in sorted(tg.current_bytes.items()):
                    current.add_metric([target, gpu], n)
            yield GaugeMetricFamily(*_READ_OK, value=0 if reading.error else 1)
        yield stray
        yield current
