"""Prometheus metrics: what genready saw, per target, in a registry of its own.

Every per-target series carries `target` (the config table name) and `unit` (the systemd unit),
so a query can join on either. The registry is private to each `Metrics` instance: nothing lands
in prometheus_client's global REGISTRY, so tests and a second daemon in one process never collide.

Every per-target series is made at a scrape (`TargetCollector`, prometheus_client's custom-collector
pattern, as its own process collector does) from what each configured target holds now: its gauges
read from its gate (so a gauge can never disagree with /ready, and nothing has to remember to set
one) and its counters and histograms (`TargetCounters`, counted by the target as events come). A
target removed by a reload is simply not there at the next scrape: no label set to forget. The few
series that belong to no target (the API's answers and refusals, record errors) are plain counters.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Info, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from genready.vocab import REFUSALS, SYSTEMD_UNRESPONSIVE, Failure, Revocation, State

# Derived from the shared words in vocab (states, revocations, probe failure classes), so a new
# value shows up here, in the OpenAPI schema and in the docs at once.
STATES: Final[tuple[str, ...]] = tuple(s.value for s in State)

# Pre-initialised per target so that rate()/increase() see the 0 before the first event: a series
# born at 1 has no earlier sample, and increase() over it reports 0, which hides the first event
# from an alert. Other values are still accepted (counted from their first occurrence).
PROBE_RESULTS: Final[tuple[str, ...]] = ("ok", *(f.value for f in Failure))
REVOCATION_REASONS: Final[tuple[str, ...]] = tuple(r.value for r in Revocation)
# The readiness endpoint's two everyday answers: ready / not ready.
READY_CODES: Final[tuple[int, ...]] = (200, 503)

# Why the API turned a client away (httplimits.py): over the connection cap, over the long-poll
# cap, no complete request within the read timeout, or closed while idle to make room.
API_REFUSALS: Final[tuple[str, ...]] = REFUSALS

# Model loads take minutes (a 70B model from cold disk: 5-20 min); the top bucket matches the
# longest load_timeout anyone should configure before calling the server stuck.
LOAD_BUCKETS: Final[tuple[float, ...]] = (
    1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600,
)
# A probe generates 1 token: milliseconds on a warm server, seconds when it is busy or compiling,
# 30 s being the default probe_timeout.
PROBE_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30,
)

_LABELS: Final = ("target", "unit")


class _Histogram:
    """One label set's histogram: cumulative buckets as prometheus_client's Histogram keeps them."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one: +Inf
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v

    def buckets(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), float(total)))  # as Histogram spells le
        return out


@dataclass
class TargetCounters:
    """One target's counters and histograms, counted as its events come and exposed at each scrape.
    Every probe result and revocation reason starts at 0, so rate()/increase() see the 0 before the
    first event; other values are counted from their first occurrence."""

    created: float = field(default_factory=time.time)
    starts: int = 0
    foreign_answers: int = 0
    stamp_errors: int = 0
    probes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROBE_RESULTS, 0))
    revocations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REVOCATION_REASONS, 0))
    probe_seconds: _Histogram = field(default_factory=lambda: _Histogram(PROBE_BUCKETS))
    load_seconds: _Histogram = field(default_factory=lambda: _Histogram(LOAD_BUCKETS))

    def start_seen(self) -> None:
        self.starts += 1

    def revoked(self, reason: str) -> None:
        self.revocations[reason] = self.revocations.get(reason, 0) + 1

    def loaded(self, seconds: float) -> None:
        self.load_seconds.observe(seconds)

    def probe(self, result: str, seconds: float) -> None:
        self.probes[result] = self.probes.get(result, 0) + 1
        self.probe_seconds.observe(seconds)

    def foreign_answer(self) -> None:
        self.foreign_answers += 1

    def stamp_error(self) -> None:
        self.stamp_errors += 1


@dataclass(frozen=True)
class TargetGauges:
    """One target's gauges, as they are at the moment of a scrape."""

    target: str
    unit: str
    state: str  # one of STATES
    ready: bool  # the readiness rule's answer now (gate.ready), never a state name
    main_pid: int  # 0: none
    expected_load_seconds: float | None  # None: no load verified yet (NaN)
    sweep_dropin_orphaned: bool
    config_changed: bool
    # How long the current start has been loading (the gate's load_clock, /status's loading_seconds);
    # None while it is ready, stopped or not known (NaN). Without it no rule could tell a load running
    # far past genready_expected_load_seconds: genready_load_seconds is observed only once a load ends.
    loading_seconds: float | None = None
    # LISTEN sockets outside the unit's current start on the target's url addresses at the last look
    # (the gate's strangers, /status's foreign_listeners): readiness is revoked while there are any.
    foreign_listeners: int = 0
    counters: TargetCounters = field(default_factory=TargetCounters)  # the target's own, live


# (name, help) of the gauges, in exposition order.
_STATE = ("genready_state", "Current state of the target's state machine (one series per state, the current one is 1)")
_READY = ("genready_ready", "1 if a generation served by the unit's current MainPID succeeded, else 0")
_EXPECTED = ("genready_expected_load_seconds", "How long this target's loads usually take: the median of the last "
             "(up to) 5 verified loads with the same ExecStart=, else of the unit's last 5; NaN without any")
_LOADING = ("genready_loading_seconds", "How long the current start has been loading (from systemd's start of its "
            "process), while it is not ready; NaN while it is ready, stopped or not known")
_MAIN_PID = ("genready_main_pid", "The unit's current MainPID (0: none)")
_SWEEP = ("genready_sweep_dropin_orphaned", "1 while the unit carries the drop-in of a genready sweep that is gone "
          "(killed mid-point): it runs that point's configuration; `genready sweep restore TARGET`")
_CONFIG = ("genready_config_changed_since_start", "1 while the unit's ExecStart= or Environment= differ from what its "
           "running process was started with (edited and reloaded, not restarted): it is still ready, but does not "
           "run the unit's configuration; guard and sweep refuse it")
_STRANGERS = ("genready_foreign_listeners", "LISTEN sockets held by processes outside the unit's current start on "
              "an address the target's url resolves to, at its port, at the last look: the kernel hands them "
              "connections to the url; the target is not ready while there are any")
_RESPONSIVE = ("genready_systemd_responsive", "1 while the systemd manager answers; 0 while it does not (SIGSTOPped, "
               f"or busy in a long daemon-reload): /ready is then 503 with reason {SYSTEMD_UNRESPONSIVE}")


# (name, help) of each target's counters and histograms.
_STARTS = ("genready_starts", "Starts of the unit seen (new MainPID or invocation)")
_REVOCATIONS = ("genready_revocations", "Readiness revoked, by reason")
_LOAD = ("genready_load_seconds", "Seconds from the unit's start until it was first ready")
_PROBES = ("genready_probes", "Probe generations, by result (ok or the failure class)")
_PROBE_SECONDS = ("genready_probe_seconds", "Duration of probe generations, any result")
_FOREIGN = ("genready_foreign_answers", "Answers at the target's URL that did not come from the unit's MainPID or a "
            "descendant")
_STAMP_ERRORS = ("genready_stamp_errors", "Failed writes or removals of the target's ready stamp (runtime_dir); "
                 "retried until they succeed")


class TargetCollector(Collector):
    """Every per-target series, made at each scrape from `targets()` (gauges and counters alike), and
    the manager's health from `responsive()` (a custom collector: prometheus_client calls `collect`
    when the registry is rendered)."""

    def __init__(self, targets: Callable[[], Iterable[TargetGauges]], responsive: Callable[[], bool]) -> None:
        self.targets = targets
        self.responsive = responsive

    def describe(self) -> list[Metric]:
        """The names, without reading anything: the registry checks them for duplicates at register()."""
        return [*self._families(()), GaugeMetricFamily(*_RESPONSIVE)]

    def collect(self) -> Iterator[Metric]:
        yield from self._families(list(self.targets()))
        yield GaugeMetricFamily(*_RESPONSIVE, value=1 if self.responsive() else 0)

    @staticmethod
    def _families(targets: Iterable[TargetGauges]) -> Iterator[Metric]:
        state = StateSetMetricFamily(*_STATE, labels=_LABELS)
        ready, expected, loading, pid, sweep, config, strangers = (
            GaugeMetricFamily(*nh, labels=_LABELS)
            for nh in (_READY, _EXPECTED, _LOADING, _MAIN_PID, _SWEEP, _CONFIG, _STRANGERS))
        starts, foreign, stamp_errors = (CounterMetricFamily(*nh, labels=_LABELS)
                                         for nh in (_STARTS, _FOREIGN, _STAMP_ERRORS))
        revocations = CounterMetricFamily(*_REVOCATIONS, labels=(*_LABELS, "reason"))
        probes = CounterMetricFamily(*_PROBES, labels=(*_LABELS, "result"))
        load, probe_seconds = (HistogramMetricFamily(*nh, labels=_LABELS) for nh in (_LOAD, _PROBE_SECONDS))
        for t in targets:
            labels = [t.target, t.unit]
            state.add_metric(labels, {s: s == t.state for s in STATES})
            ready.add_metric(labels, 1 if t.ready else 0)
            expected.add_metric(labels, math.nan if t.expected_load_seconds is None else t.expected_load_seconds)
            loading.add_metric(labels, math.nan if t.loading_seconds is None else t.loading_seconds)
            pid.add_metric(labels, t.main_pid)
            sweep.add_metric(labels, 1 if t.sweep_dropin_orphaned else 0)
            config.add_metric(labels, 1 if t.config_changed else 0)
            strangers.add_metric(labels, t.foreign_listeners)
            c = t.counters
            for family, n in ((starts, c.starts), (foreign, c.foreign_answers), (stamp_errors, c.stamp_errors)):
                family.add_metric(labels, n, created=c.created)
            for reason, n in c.revocations.items():
                revocations.add_metric([*labels, reason], n, created=c.created)
            for result, n in c.probes.items():
                probes.add_metric([*labels, result], n, created=c.created)
            for histogram, h in ((load, c.load_seconds), (probe_seconds, c.probe_seconds)):
                histogram.add_metric(labels, h.buckets(), h.sum)
                histogram.add_sample(f"{histogram.name}_created", dict(zip(_LABELS, labels, strict=True)), c.created)
        yield from (state, ready, expected, loading, pid, sweep, config, strangers,
                    starts, revocations, load, probes, probe_seconds, foreign, stamp_errors)


class Metrics:
    """The daemon's metrics. `targets` and `responsive` are read at each scrape: every per-target
    series, gauges and counters (each target counts its own events in its `TargetCounters`)."""

    def __init__(self, version: str, registry: CollectorRegistry | None = None, *,
                 targets: Callable[[], Iterable[TargetGauges]] = tuple,
                 responsive: Callable[[], bool] = lambda: True) -> None:
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        # genready's own CPU, RSS and fds (process_cpu_seconds_total, process_resident_memory_bytes, …),
        # read from /proc/self at each scrape: the dashboard's "genready itself" panel.
        ProcessCollector(registry=r)
        # Info appends `_info`, so the exposed name is genready_build_info{version} 1.
        Info("genready_build", "genready build information", registry=r).info({"version": version})
        r.register(TargetCollector(targets, responsive))
        self._ready_requests = Counter(
            "genready_ready_requests", "Readiness queries answered over HTTP, by status code", ("code",),
            registry=r,
        )
        # Each code's child looked up once: /ready counts every answer, thousands a second under load.
        self._ready_by_code = {code: self._ready_requests.labels(code=str(code)) for code in READY_CODES}
        # Outputs that failed without stopping anything: a full or read-only directory.
        self._record_errors = Counter(
            "genready_record_errors", "Failed writes of start records (state_dir full or read-only); readiness "
            "is unaffected and the records are written once possible", registry=r,
        )
        self._api_refused = Counter(
            "genready_api_refused", "API connections or long-polls refused (503 or closed) over their caps, "
            "connections closed for not sending a complete request in time, and requests for a Host: that is "
            "not genready (421), by why",
            ("why",), registry=r,
        )
        for why in API_REFUSALS:
            self._api_refused.labels(why=why)

    def record_error(self) -> None:
        self._record_errors.inc()

    def api_refused(self, why: str) -> None:
        self._api_refused.labels(why=why).inc()

    def ready_request(self, code: int) -> None:
        child = self._ready_by_code.get(code)
        if child is None:
            child = self._ready_by_code[code] = self._ready_requests.labels(code=str(code))
        child.inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its Content-Type, for the HTTP API's /metrics."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
