"""genready.serve.metrics: counters move as the daemon reports, gauges are read at scrape time, the
exposition lints clean, and the shipped Prometheus scrape config and alert rules are valid and refer to
metrics that exist."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from genready.gpu.attribution import Holding, TargetGpu
from genready.gpu.gauge import GpuCollector
from genready.gpu.watch import GpuReading
from genready.serve.metrics import (
    PROBE_RESULTS,
    READY_CODES,
    REVOCATION_REASONS,
    STATES,
    Metrics,
    TargetCounters,
    TargetGauges,
)
from genready.serve.openapi import LAST_ERROR
from genready.vocab import Failure
from tests import ci

PROMETHEUS_DIR = Path(__file__).resolve().parent.parent / "packaging" / "prometheus"
T, U = "sglang", "sglang.service"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Targets:
    """What the gauges are read from at a scrape: the test sets it, as the gates change in the daemon."""

    def __init__(self) -> None:
        self.now: dict[str, TargetGauges] = {}
        self.responsive = True
        self.reads = 0

    def set(self, target: str = T, unit: str = U, **kw: Any) -> None:
        base = self.now.get(target) or TargetGauges(target, unit, "unknown", False, 0, None, False, False)
        self.now[target] = dataclasses.replace(base, **kw)

    def __call__(self) -> list[TargetGauges]:
        self.reads += 1
        return list(self.now.values())

    def counters(self, target: str = T, unit: str = U) -> TargetCounters:
        """The target's own counters (as the daemon's Target holds them), the target made if it is new."""
        if target not in self.now:
            self.set(target, unit)
        return self.now[target].counters


@pytest.fixture
def targets() -> Targets:
    return Targets()


@pytest.fixture
def m(targets: Targets) -> Metrics:
    """A fresh Metrics (and so a fresh registry) per test, its gauges read from `targets`."""
    return Metrics("0.1.0", targets=targets, responsive=lambda: targets.responsive)


def samples(m: Metrics) -> Samples:
    """Every exposed sample, parsed back from render() the way Prometheus would read it."""
    body, _ = m.render()
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return samples(m).get((name, frozenset(labels.items())))


def state_series(m: Metrics, target: str = T, unit: str = U) -> dict[str, float]:
    got: dict[str, float] = {}
    for (name, labels), v in samples(m).items():
        d = dict(labels)
        if name == "genready_state" and d["target"] == target and d["unit"] == unit:
            got[d["genready_state"]] = v
    return got


def promtool() -> str:
    """promtool's path; skips without it, but fails under CI where a skipped check hides a broken file."""
    return ci.tool("promtool", "Debian/Ubuntu: apt-get install prometheus")


def run_promtool(*args: str, stdin: bytes | None = None) -> str:
    p = subprocess.run([promtool(), *args], input=stdin, capture_output=True, timeout=60, check=False)
    out = (p.stdout + p.stderr).decode()
    assert p.returncode == 0, f"promtool {' '.join(args)} failed:\n{out}"
    return out


# --- values ---------------------------------------------------------------------------------------


def test_render_returns_text_format_and_build_info(m: Metrics) -> None:
    body, content_type = m.render()
    assert content_type == prometheus_client.exposition.CONTENT_TYPE_LATEST
    assert content_type.startswith("text/plain")
    assert b"# TYPE genready_build_info gauge" in body
    assert value(m, "genready_build_info", version="0.1.0") == 1


def test_registry_is_private_to_the_instance() -> None:
    ta = Targets()
    a, b = Metrics("1", targets=ta), Metrics("2")  # a shared registry would raise "Duplicated timeseries"
    ta.counters().start_seen()
    assert value(a, "genready_starts_total", target=T, unit=U) == 1
    assert value(b, "genready_starts_total", target=T, unit=U) is None
    assert "genready_state" not in prometheus_client.REGISTRY._names_to_collectors


def test_a_new_target_has_every_counter_at_zero(m: Metrics, targets: Targets) -> None:
    targets.set(T, U)
    assert value(m, "genready_starts_total", target=T, unit=U) == 0
    assert value(m, "genready_foreign_answers_total", target=T, unit=U) == 0
    for result in PROBE_RESULTS:
        assert value(m, "genready_probes_total", target=T, unit=U, result=result) == 0, result
    for reason in REVOCATION_REASONS:
        assert value(m, "genready_revocations_total", target=T, unit=U, reason=reason) == 0, reason
    assert value(m, "genready_load_seconds_count", target=T, unit=U) == 0
    assert value(m, "genready_probe_seconds_count", target=T, unit=U) == 0
    for code in READY_CODES:
        assert value(m, "genready_ready_requests_total", code=str(code)) == 0


def test_ready_request_codes_exist_before_any_target(m: Metrics) -> None:
    assert value(m, "genready_ready_requests_total", code="200") == 0
    assert value(m, "genready_ready_requests_total", code="503") == 0


def test_state_is_exactly_one_and_ready_follows(m: Metrics, targets: Targets) -> None:
    targets.set(T, U)
    targets.set("vllm", "vllm.service")
    assert state_series(m) == {s: (1.0 if s == "unknown" else 0.0) for s in STATES}
    for state in ("starting", "loading", "warming", "ready", "stuck", "inactive", "ready", "absent"):
        targets.set(T, U, state=state)
        series = state_series(m)
        assert sorted(series) == sorted(STATES)
        assert [s for s, v in series.items() if v == 1] == [state]
        assert sum(series.values()) == 1
        assert value(m, "genready_ready", target=T, unit=U) == 0  # the state name does not set it (outputs.py)
        # The other target is untouched.
        assert [s for s, v in state_series(m, "vllm", "vllm.service").items() if v == 1] == ["unknown"]


def test_gauges_are_read_at_each_scrape_and_only_then(m: Metrics, targets: Targets) -> None:
    targets.set(T, U, state="ready", ready=True, main_pid=4242, expected_load_seconds=3.5, config_changed=True)
    before = targets.reads
    targets.counters(T, U).start_seen()  # events count without reading the gates
    assert targets.reads == before
    assert value(m, "genready_ready", target=T, unit=U) == 1
    assert value(m, "genready_main_pid", target=T, unit=U) == 4242
    assert value(m, "genready_expected_load_seconds", target=T, unit=U) == 3.5
    assert value(m, "genready_config_changed_since_start", target=T, unit=U) == 1
    assert value(m, "genready_sweep_dropin_orphaned", target=T, unit=U) == 0
    assert value(m, "genready_systemd_responsive") == 1
    assert targets.reads == before + 6  # once per scrape (render)
    targets.set(T, U, ready=False, main_pid=0, expected_load_seconds=None, sweep_dropin_orphaned=True)
    targets.responsive = False
    assert value(m, "genready_ready", target=T, unit=U) == 0
    assert value(m, "genready_main_pid", target=T, unit=U) == 0
    assert value(m, "genready_sweep_dropin_orphaned", target=T, unit=U) == 1
    assert value(m, "genready_systemd_responsive") == 0
    assert math.isnan(value(m, "genready_expected_load_seconds", target=T, unit=U) or 0.0)
    assert math.isnan(value(m, "genready_loading_seconds", target=T, unit=U) or 0.0)  # not loading
    targets.set(T, U, state="loading", loading_seconds=12.5)
    assert value(m, "genready_loading_seconds", target=T, unit=U) == 12.5
    targets.now.clear()  # the target is gone: so are its gauges and counters, with nothing to forget
    assert value(m, "genready_ready", target=T, unit=U) is None
    assert value(m, "genready_starts_total", target=T, unit=U) is None


def test_counters(m: Metrics, targets: Targets) -> None:
    targets.set(T, U)
    targets.counters(T, U).start_seen()
    targets.counters(T, U).start_seen()
    assert value(m, "genready_starts_total", target=T, unit=U) == 2
    targets.counters(T, U).revoked("pid_changed")
    targets.counters(T, U).revoked("pid_changed")
    targets.counters(T, U).revoked("something_new")  # an unlisted reason still counts
    assert value(m, "genready_revocations_total", target=T, unit=U, reason="pid_changed") == 2
    assert value(m, "genready_revocations_total", target=T, unit=U, reason="something_new") == 1
    assert value(m, "genready_revocations_total", target=T, unit=U, reason="bus_lost") == 0
    targets.counters(T, U).foreign_answer()
    assert value(m, "genready_foreign_answers_total", target=T, unit=U) == 1
    for code in (200, 200, 503, 404):
        m.ready_request(code)
    assert value(m, "genready_ready_requests_total", code="200") == 2
    assert value(m, "genready_ready_requests_total", code="503") == 1
    assert value(m, "genready_ready_requests_total", code="404") == 1


def test_probe_counts_and_duration_histogram(m: Metrics, targets: Targets) -> None:
    targets.set(T, U)
    for _ in range(3):
        targets.counters(T, U).probe("refused", 0.002)
    targets.counters(T, U).probe("timeout", 30.0)
    targets.counters(T, U).probe("ok", 0.04)
    assert value(m, "genready_probes_total", target=T, unit=U, result="refused") == 3
    assert value(m, "genready_probes_total", target=T, unit=U, result="timeout") == 1
    assert value(m, "genready_probes_total", target=T, unit=U, result="ok") == 1
    assert value(m, "genready_probes_total", target=T, unit=U, result="http_status") == 0
    assert value(m, "genready_probe_seconds_count", target=T, unit=U) == 5
    assert value(m, "genready_probe_seconds_sum", target=T, unit=U) == pytest.approx(30.046)
    assert value(m, "genready_probe_seconds_bucket", target=T, unit=U, le="0.005") == 3
    assert value(m, "genready_probe_seconds_bucket", target=T, unit=U, le="0.05") == 4
    assert value(m, "genready_probe_seconds_bucket", target=T, unit=U, le="30.0") == 5


def test_load_histogram_covers_an_hour(m: Metrics, targets: Targets) -> None:
    targets.counters(T, U).loaded(362.1)
    targets.counters(T, U).loaded(3000.0)
    assert value(m, "genready_load_seconds_count", target=T, unit=U) == 2
    assert value(m, "genready_load_seconds_sum", target=T, unit=U) == pytest.approx(3362.1)
    assert value(m, "genready_load_seconds_bucket", target=T, unit=U, le="300.0") == 0
    assert value(m, "genready_load_seconds_bucket", target=T, unit=U, le="600.0") == 1
    assert value(m, "genready_load_seconds_bucket", target=T, unit=U, le="2700.0") == 1
    assert value(m, "genready_load_seconds_bucket", target=T, unit=U, le="3600.0") == 2


def test_a_removed_target_leaves_no_series(m: Metrics, targets: Targets) -> None:
    targets.counters(T, U).probe("weird", 0.1)
    targets.counters(T, U).revoked("something_new")
    targets.set("vllm", "vllm.service")
    del targets.now[T]  # what a reload does: the Target goes, and its counters with it
    for _name, labels in samples(m):
        assert ("target", T) not in labels
    assert value(m, "genready_starts_total", target="vllm", unit="vllm.service") == 0
    targets.counters(T, U).start_seen()  # and it can come back, counted anew
    assert value(m, "genready_starts_total", target=T, unit=U) == 1


# --- promtool -------------------------------------------------------------------------------------


def busy(m: Metrics, targets: Targets) -> Metrics:
    """Metrics with every kind of series populated, for linting."""
    targets.set(T, U)
    targets.set("vllm", "vllm.service")
    targets.set(T, U, state="ready", ready=True, main_pid=4242, expected_load_seconds=3.5)
    targets.set("vllm", "vllm.service")
    targets.counters(T, U).start_seen()
    targets.counters(T, U).loaded(362.1)
    targets.counters(T, U).probe("ok", 0.03)
    targets.counters("vllm", "vllm.service").probe("refused", 0.001)
    targets.counters(T, U).revoked("pid_changed")
    targets.counters("vllm", "vllm.service").foreign_answer()
    m.ready_request(200)
    # The GPU gauges as the daemon registers them (serve/daemon.py), over a reading with a stray: a
    # reading, not the stand-in nvidia-smi, since what is checked here is the exposition, not the read.
    stray = Holding("GPU-0", 4243, 70000 << 20, "stray", T, "a" * 32, U, "python3 -m sglang", "in the cgroup")
    reading = GpuReading(0.0, [stray], {T: TargetGpu({"GPU-0": 1 << 30}, [stray])})
    m.registry.register(GpuCollector(lambda: reading))
    return m


@pytest.mark.system
def test_promtool_check_metrics(m: Metrics, targets: Targets) -> None:
    body, _ = busy(m, targets).render()
    out = run_promtool("check", "metrics", stdin=body)
    assert out.strip() == "", out


@pytest.mark.system
def test_promtool_check_rules() -> None:
    out = run_promtool("check", "rules", str(PROMETHEUS_DIR / "alerts.yml"))
    assert "SUCCESS" in out and "WARNING" not in out, out


@pytest.mark.system
def test_promtool_alert_rule_unit_tests() -> None:
    """alerts_test.yml: the rules fire (and stay quiet) on the series genready exposes."""
    out = run_promtool("test", "rules", str(PROMETHEUS_DIR / "alerts_test.yml"))
    assert "SUCCESS" in out, out


@pytest.mark.system
def test_promtool_check_config_with_scrape_snippet(tmp_path: Path) -> None:
    scrape = (PROMETHEUS_DIR / "scrape.yml").read_text()
    assert "127.0.0.1:9901" in scrape
    # The snippet is a top-level `scrape_configs:` block, so a full config is global + rules + it.
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 30s\n  evaluation_interval: 30s\n"
        f"rule_files:\n  - {PROMETHEUS_DIR / 'alerts.yml'}\n" + scrape
    )
    out = run_promtool("check", "config", str(config))
    assert "SUCCESS" in out and "WARNING" not in out and "FAILED" not in out, out


def test_alert_rules_use_only_exposed_metrics(m: Metrics, targets: Targets) -> None:
    """A renamed metric would leave an alert that silently never fires."""
    exposed = {name for name, _ in samples(busy(m, targets))}
    used = set(re.findall(r"\bgenready_[a-z_]+", (PROMETHEUS_DIR / "alerts.yml").read_text()))
    assert used, "alerts.yml mentions no genready metric"
    assert used <= exposed, f"not exposed: {sorted(used - exposed)}"


def test_every_failure_class_is_documented_and_in_the_contract() -> None:
    """Failure classes are defined once (vocab.Failure); docs/api.md and the OpenAPI pattern follow."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    pattern = LAST_ERROR["pattern"]
    for f in Failure:
        assert f"`{f.value}`" in doc, f"docs/api.md does not name the failure class {f.value}"
        assert re.search(pattern, f"{f.value}: detail"), f.value
