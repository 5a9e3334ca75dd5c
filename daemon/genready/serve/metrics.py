"""Prometheus metrics: what genready saw, per target, in a registry of its own.

Every per-target series carries `target` (the config table name) and `unit` (the systemd unit),
so a query can join on either. The registry is private to each `Metrics` instance: nothing lands
in prometheus_client's global REGISTRY, so tests and a second daemon in one process never collide.

Two kinds of series. Counters and histograms count events as they happen (`start_seen`, `probe`,
...). Gauges say how things are: they are read from the gates and systemd's health when
Prometheus scrapes (`GaugeCollector`, prometheus_client's custom-collector pattern, as its own
process collector does), so a gauge can never disagree with /ready, and nothing has to remember
to set one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric, StateSetMetricFamily
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
_RESPONSIVE = ("genready_systemd_responsive", "1 while the systemd manager answers; 0 while it does not (SIGSTOPped, "
               f"or busy in a long daemon-reload): /ready is then 503 with reason {SYSTEMD_UNRESPONSIVE}")


class GaugeCollector(Collector):
    """The gauges, computed at each scrape from `targets()` and `responsive()` (a custom collector:
    prometheus_client calls `collect` when the registry is rendered)."""

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
        ready, expected, loading, pid, sweep, config = (
            GaugeMetricFamily(*nh, labels=_LABELS) for nh in (_READY, _EXPECTED, _LOADING, _MAIN_PID, _SWEEP, _CONFIG))
        for t in targets:
            labels = [t.target, t.unit]
            state.add_metric(labels, {s: s == t.state for s in STATES})
            ready.add_metric(labels, 1 if t.ready else 0)
            expected.add_metric(labels, math.nan if t.expected_load_seconds is None else t.expected_load_seconds)
            loading.add_metric(labels, math.nan if t.loading_seconds is None else t.loading_seconds)
            pid.add_metric(labels, t.main_pid)
            sweep.add_metric(labels, 1 if t.sweep_dropin_orphaned else 0)
            config.add_metric(labels, 1 if t.config_changed else 0)
        yield from (state, ready, expected, loading, pid, sweep, config)


class Metrics:
    """The daemon's metrics. `targets` and `responsive` are read at each scrape (the gauges); call
    `register_target` for each configured target, so its counters are 0 before the first event."""

    def __init__(self, version: str, registry: CollectorRegistry | None = None, *,
                 targets: Callable[[], Iterable[TargetGauges]] = tuple,
                 responsive: Callable[[], bool] = lambda: True) -> None:
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        # (target, unit) -> the `result` / `reason` label values created for it, so forget_target can
        # remove them without reaching into prometheus_client's private child map.
        self._results: dict[tuple[str, str], set[str]] = {}
        self._reasons: dict[tuple[str, str], set[str]] = {}
        r = self.registry

        # genready's own CPU, RSS and fds (process_cpu_seconds_total, process_resident_memory_bytes, …),
        # read from /proc/self at each scrape: the dashboard's "genready itself" panel.
        ProcessCollector(registry=r)
        # Info appends `_info`, so the exposed name is genready_build_info{version} 1.
        Info("genready_build", "genready build information", registry=r).info({"version": version})
        r.register(GaugeCollector(targets, responsive))
        self._starts = Counter(
            "genready_starts", "Starts of the unit seen (new MainPID or invocation)", _LABELS, registry=r,
        )
        self._revocations = Counter(
            "genready_revocations", "Readiness revoked, by reason", (*_LABELS, "reason"), registry=r,
        )
        self._load = Histogram(
            "genready_load_seconds", "Seconds from the unit's start until it was first ready",
            _LABELS, buckets=LOAD_BUCKETS, registry=r,
        )
        self._probes = Counter(
            "genready_probes", "Probe generations, by result (ok or the failure class)",
            (*_LABELS, "result"), registry=r,
        )
        self._probe_seconds = Histogram(
            "genready_probe_seconds", "Duration of probe generations, any result", _LABELS,
            buckets=PROBE_BUCKETS, registry=r,
        )
        self._foreign = Counter(
            "genready_foreign_answers",
            "Answers at the target's URL that did not come from the unit's MainPID or a descendant",
            _LABELS, registry=r,
        )
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
        self._stamp_errors = Counter(
            "genready_stamp_errors", "Failed writes or removals of the target's ready stamp (runtime_dir); "
            "retried until they succeed", _LABELS, registry=r,
        )
        self._api_refused = Counter(
            "genready_api_refused", "API connections or long-polls refused (503 or closed) over their caps, "
            "connections closed for not sending a complete request in time, and requests for a Host: that is "
            "not genready (421), by why",
            ("why",), registry=r,
        )
        for why in API_REFUSALS:
            self._api_refused.labels(why=why)

    def register_target(self, target: str, unit: str) -> None:
        """Create the target's counters and histograms at zero (a series born at 1 hides its first event
        from increase()). Idempotent: a second call for a known (target, unit) resets nothing."""
        key = (target, unit)
        if key in self._results:
            return
        self._results[key] = set(PROBE_RESULTS)
        self._reasons[key] = set(REVOCATION_REASONS)
        self._starts.labels(target, unit)
        self._stamp_errors.labels(target, unit)
        self._foreign.labels(target, unit)
        self._load.labels(target, unit)
        self._probe_seconds.labels(target, unit)
        for result in PROBE_RESULTS:
            self._probes.labels(target, unit, result)
        for reason in REVOCATION_REASONS:
            self._revocations.labels(target, unit, reason)

    def forget_target(self, target: str, unit: str) -> None:
        """Drop the counters of a target no longer configured (its gauges go with its gate)."""
        key = (target, unit)
        if key not in self._results:
            return
        for metric in (self._starts, self._foreign, self._load, self._probe_seconds, self._stamp_errors):
            metric.remove(target, unit)
        for result in self._results.pop(key):
            self._probes.remove(target, unit, result)
        for reason in self._reasons.pop(key):
            self._revocations.remove(target, unit, reason)

    def start_seen(self, target: str, unit: str) -> None:
        self.register_target(target, unit)
        self._starts.labels(target, unit).inc()

    def revoked(self, target: str, unit: str, reason: str) -> None:
        self.register_target(target, unit)
        self._reasons[target, unit].add(reason)
        self._revocations.labels(target, unit, reason).inc()

    def loaded(self, target: str, unit: str, seconds: float) -> None:
        self.register_target(target, unit)
        self._load.labels(target, unit).observe(seconds)

    def probe(self, target: str, unit: str, result: str, seconds: float) -> None:
        self.register_target(target, unit)
        self._results[target, unit].add(result)
        self._probes.labels(target, unit, result).inc()
        self._probe_seconds.labels(target, unit).observe(seconds)

    def foreign_answer(self, target: str, unit: str) -> None:
        self.register_target(target, unit)
        self._foreign.labels(target, unit).inc()

    def record_error(self) -> None:
        self._record_errors.inc()

    def stamp_error(self, target: str, unit: str) -> None:
        self.register_target(target, unit)
        self._stamp_errors.labels(target, unit).inc()

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
