"""The Grafana dashboard (packaging/grafana/genready.json): importable as it is, every metric it
queries exported by a running daemon, every query one Prometheus parses (promtool), and every
query answered with samples by a real Prometheus that scraped a real genready through restarts
of its target (tests/promserver.py); the shipped alert rules evaluated on the same samples."""

from __future__ import annotations

import calendar
import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from genready_dev.harness import REPO, Genready, free_port, http, sim_unit, wait_for
from genready_dev.usermanager import UserManager
from tests.promserver import PrometheusServer, finite, values
from tests.test_metrics import PROMETHEUS_DIR, run_promtool

DASHBOARD = REPO / "packaging" / "grafana" / "genready.json"
# Grafana's variables, as a query would see them once chosen ("All" is .*).
VARIABLES = {"$target": ".*", "$instance": ".*", "$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
METRIC = re.compile(r"\b(?:genready|process)_[a-z_]+\b")


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def queries() -> list[str]:
    d = dashboard()
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in d["templating"]["list"] if v["type"] == "query"]
    return exprs


def concrete(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def test_the_dashboard_has_its_variables_and_panels() -> None:
    d = dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"target", "instance"} <= set(variables)
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
        assert all('target=~"$target"' in t["expr"] or "target" not in t["expr"] for t in p["targets"]), p["title"]
    text = json.dumps(d)
    for needle in ("state-timeline", "genready_expected_load_seconds", "genready_probes_total",
                   "genready_load_seconds_bucket", "genready_revocations_total", "genready_api_refused_total",
                   "process_cpu_seconds_total", "process_resident_memory_bytes"):
        assert needle in text, needle
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])


@pytest.mark.system
def test_every_query_parses(tmp_path: Path) -> None:
    exprs = [concrete(e) for e in queries() if not e.startswith("label_values(")]
    # label_values(METRIC{…}, label) is Grafana's; its selector must parse as a query of its own
    exprs += [concrete(m.group(1)) for e in queries() if (m := re.fullmatch(r"label_values\((.*), \w+\)", e))]
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard-rules.yml"
    # JSON is YAML: promtool reads it as a rules file
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}, indent=1))
    out = run_promtool("check", "rules", str(path))
    assert f"SUCCESS: {len(rules)} rules found" in out, out


def test_every_metric_queried_is_exported_by_a_running_daemon(manager: UserManager, tmp_path: Path) -> None:
    port, unit = free_port(), "dash-sim.service"
    manager.install_unit(unit, sim_unit(port))
    g = Genready(manager, tmp_path, {"sim": {"unit": unit, "url": f"http://127.0.0.1:{port}",
                                             "verify_owner": False, "backoff_initial": 0.05, "backoff_max": 0.2}})
    try:
        with g:
            manager.systemctl("start", unit)
            wait_for(lambda: g.ready_pid("sim"), 30, "a verified load")
            _, text = http(g.base + "/metrics")
            exported = {line.split("{")[0].split(" ")[0] for line in str(text).splitlines()
                        if line and not line.startswith("#")}
            queried = {name for e in queries() for name in METRIC.findall(e)}
            assert queried and queried <= exported, sorted(queried - exported)
    finally:
        manager.remove_unit(unit)


# --- against a real Prometheus ---------------------------------------------------------------------

SCRAPE = 1  # seconds: Prometheus's scrape and rule evaluation interval in these tests
STEP = 1  # seconds: the range queries' step, Grafana's $__interval for a panel this test draws
# Grafana's own rule: max($__interval + scrape interval, 4 x scrape interval).
RATE_INTERVAL = max(STEP + SCRAPE, 4 * SCRAPE)
LOAD = 1.5  # the simulator's load: longer than a scrape interval, so each load is scraped mid-way
RESTARTS = 2  # starts after the first: revocations, and loads that have an expected length


@dataclass
class Scraped:
    """A Prometheus that has scraped a genready through a start and RESTARTS restarts of its target."""

    prom: PrometheusServer
    instance: str  # the scrape target, as Prometheus labels it
    start: float  # wall clock (s): before Prometheus's first scrape
    first_scrape: float  # its first scrape of genready (the target list's lastScrape when first up)
    end: float  # after its scrape of the last verified start
    pids: list[int]

    def grafana(self, expr: str) -> str:
        """`expr` as Grafana sends it with the scraped genready and its target chosen: a =~ variable
        is regex-escaped, and the escape doubled inside the PromQL string (Grafana's
        prometheusRegularEscape), $__range spans the run."""
        chosen = {"$target": "sim", "$instance": re.escape(self.instance).replace("\\", "\\\\"),
                  "$__rate_interval": f"{RATE_INTERVAL}s", "$__interval": f"{STEP}s",
                  "$__range": f"{int(self.end - self.start) + 1}s"}
        for var, value in chosen.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"a variable this test does not know: {expr}"
        return expr

    def over_the_run(self, expr: str) -> list[dict[str, Any]]:
        return self.prom.query_range(expr, self.start, self.end, STEP)


def prometheus_config(genready_port: int) -> str:
    """The shipped scrape snippet, pointed at the test's genready and scraping every SCRAPE s, plus
    the shipped alert rules."""
    scrape = (PROMETHEUS_DIR / "scrape.yml").read_text()
    assert "127.0.0.1:9901" in scrape and "scrape_interval: 15s" in scrape
    scrape = scrape.replace("127.0.0.1:9901", f"127.0.0.1:{genready_port}")
    scrape = scrape.replace("scrape_interval: 15s", f"scrape_interval: {SCRAPE}s")
    return (f"global:\n  scrape_interval: {SCRAPE}s\n  scrape_timeout: {SCRAPE}s\n"
            f"  evaluation_interval: {SCRAPE}s\n"
            f"rule_files:\n  - {PROMETHEUS_DIR / 'alerts.yml'}\n" + scrape)


def scraped_up(prom: PrometheusServer, instance: str) -> dict[str, Any] | None:
    t = [t for t in prom.targets() if t["labels"].get("instance") == instance]
    return t[0] if t and t[0]["health"] == "up" else None


@pytest.fixture(scope="module")
def scraped(manager: UserManager, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    tmp = tmp_path_factory.mktemp("scraped")
    port, unit = free_port(), "prom-sim.service"
    manager.install_unit(unit, sim_unit(port, "--load-seconds", str(LOAD)))
    g = Genready(manager, tmp, {"sim": {"unit": unit, "url": f"http://127.0.0.1:{port}", "verify_owner": False,
                                        "backoff_initial": 0.05, "backoff_max": 0.2}})
    # Prometheus hands a new scrape target to its scrapers only at its discovery manager's next
    # 5 s tick: genready and the first load start meanwhile.
    prom = PrometheusServer(tmp, prometheus_config(g.port))
    instance = f"127.0.0.1:{g.port}"
    try:
        with prom, g:
            start = time.time()
            manager.systemctl("start", unit)
            target = wait_for(lambda: scraped_up(prom, instance), 30, lambda: f"{instance} up in Prometheus's "
                              f"/api/v1/targets ({prom.targets()})")
            assert target["labels"]["job"] == "genready" and target["lastError"] == ""
            first_scrape = unix_time(target["lastScrape"])
            pids: list[int] = []
            for n in range(RESTARTS + 1):
                if n:
                    manager.systemctl("restart", unit)
                    # A sample of this load (loading_seconds is NaN except while loading), then of its
                    # verified start: Prometheus holds each state, not only the last.
                    wait_for(lambda: prom.query('genready_loading_seconds{target="sim"} >= 0'), 20,
                             "a scrape mid-load")
                pid = wait_for(lambda: (p := g.ready_pid("sim")) not in (None, *pids) and p, 30, "a verified load")
                ready = f'genready_main_pid{{target="sim"}} == {pid} and genready_ready{{target="sim"}} == 1'
                wait_for(functools.partial(prom.query, ready), 20, f"a scrape of pid {pid} ready")
                pids.append(pid)
            end = time.time()
            # The rules have been evaluated on the last scrape too.
            wait_for(lambda: all(unix_time(r["lastEvaluation"]) > end for r in prom.rules()), 20,
                     "an evaluation of every rule after the last scrape")
            yield Scraped(prom, instance, start, first_scrape, end, pids)
        assert prom.proc is not None and prom.proc.poll() is not None, "prometheus still runs"
    finally:
        prom.stop()  # already stopped, unless the with block was never entered
        manager.remove_unit(unit)


def unix_time(rfc3339: str) -> float:
    """A time as Prometheus's API writes it (Go's RFC 3339 in UTC, up to 9 decimals, trailing zeros cut;
    Python 3.10's fromisoformat reads neither the Z nor the nanoseconds)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", rfc3339)
    assert m, rfc3339
    return calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + float(m.group(2) or 0)


def test_prometheus_scraped_every_second_of_the_run(scraped: Scraped) -> None:
    """The samples the dashboard is evaluated on: one scrape a second, all of them up."""
    window = scraped.end - scraped.first_scrape
    sel = f'{{job="genready", instance="{scraped.instance}"}}'
    at: dict[str, str | float] = {"time": scraped.end}
    scrapes = values(scraped.prom.query(f"count_over_time(up{sel}[{int(window * 1000)}ms])", **at))
    assert scrapes and scrapes[0] >= 0.8 * window / SCRAPE, (scrapes, window)
    assert values(scraped.prom.query(f"min_over_time(up{sel}[{int(window * 1000)}ms])", **at)) == [1.0]
    assert finite(scraped.prom.query(f"scrape_samples_scraped{sel} > 50", **at))


# What RESTARTS restarts must put on each panel, beyond "samples to draw": a panel that draws
# only zeros through revocations and loads is as broken as an empty one.
RESTARTS_SHOW: dict[str, Callable[[list[float]], bool]] = {
    "Readiness per target": lambda vs: {0.0, 1.0} <= set(vs),
    "Load durations against their expected value": lambda vs: bool(vs) and min(vs) >= LOAD,
    "Time from restart to verified (p50, p90)": lambda vs: bool(vs) and min(vs) > 0,
    "Probes by failure class": lambda vs: max(vs) > 0,
    "Revocations by reason": lambda vs: max(vs) > 0,
    "genready's own CPU and RSS": lambda vs: max(vs) > 0,
}


def test_every_panel_query_returns_samples_from_a_real_prometheus(scraped: Scraped) -> None:
    """Each query of each panel, as Grafana sends it (a range query, its variables chosen), answers
    samples a panel can draw; a valid query that is always empty is a broken panel."""
    d = dashboard()
    assert set(RESTARTS_SHOW) <= {p["title"] for p in d["panels"]}
    empty, unlike = [], []
    for p in d["panels"]:
        for t in p["targets"]:
            expr = scraped.grafana(t["expr"])
            got = finite(scraped.over_the_run(expr))
            if not got:
                empty.append(f"{p['title']!r}: {expr}")
            elif p["title"] in RESTARTS_SHOW and not RESTARTS_SHOW[p["title"]](got):
                unlike.append(f"{p['title']!r}: {expr} drew {sorted(set(got))[:10]}")
    assert not empty, "panels with nothing to draw:\n" + "\n".join(empty)
    assert not unlike, "panels that do not show the restarts:\n" + "\n".join(unlike)
    states = {s["metric"]["genready_state"] for s in scraped.over_the_run(scraped.grafana(
        next(t["expr"] for p in d["panels"] if p["title"] == "State per target" for t in p["targets"])))}
    assert {"loading", "ready"} <= states, states


def test_the_variables_list_the_scraped_genready_and_its_target(scraped: Scraped) -> None:
    """label_values(SELECTOR, LABEL), as Grafana asks it: /api/v1/label/LABEL/values?match[]=SELECTOR."""
    want = {"instance": scraped.instance, "target": "sim"}
    for v in dashboard()["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["definition"])
        assert m, v["definition"]
        params: dict[str, str | float] = {"match[]": scraped.grafana(m.group(1)), "start": scraped.start,
                                          "end": scraped.end}
        got = scraped.prom.api(f"label/{m.group(2)}/values", **params)
        assert got == [want[v["name"]]], (v["name"], got)


# Each new rule's expression with its threshold moved so that the healthy run crosses it: the
# series it names exist, and its two sides match label for label (a join on labels that differ
# would never fire, and promtool's tests of hand-written series could not tell).
CROSSED = {
    "GenreadySystemdUnresponsive": [("== 0", "== 1")],
    "GenreadySweepDropinOrphaned": [("== 1", "== 0")],
    "GenreadyLoadFarPastExpected": [("> 2 * genready_expected", "> 0 * genready_expected"), ("+ 300", "- 300")],
}


def test_the_alert_rules_run_on_the_real_samples(scraped: Scraped) -> None:
    prom = scraped.prom
    shipped = re.findall(r"^\s*- alert: (\w+)$", (PROMETHEUS_DIR / "alerts.yml").read_text(), re.M)
    rules = {r["name"]: r for r in prom.rules()}
    assert sorted(rules) == sorted(shipped) and set(CROSSED) <= set(rules)
    for name, r in rules.items():
        assert r["health"] == "ok" and not r.get("lastError"), (name, r)
        prom.query(r["query"], time=scraped.end)  # runs: PrometheusError otherwise
    # A healthy run, restarts and all: none of the new alerts is even pending.
    assert {name: rules[name]["state"] for name in CROSSED} == dict.fromkeys(CROSSED, "inactive")
    # The restarts did revoke readiness: that alert fires, from real samples.
    revoked = rules["GenreadyReadinessRevoked"]
    assert revoked["state"] == "firing", revoked
    assert {a["labels"]["reason"] for a in revoked["alerts"]} & {"pid_changed", "invocation_changed", "inactive",
                                                                   "job_queued"}, revoked["alerts"]
    for name, moves in CROSSED.items():
        expr = rules[name]["query"]
        for old, new in moves:
            assert old in expr, f"{name}: {old!r} not in {expr!r}: update CROSSED with the rule"
            expr = expr.replace(old, new)
        got = scraped.over_the_run(expr)
        assert finite(got), f"{name}: {expr} matched nothing in the run"
        assert all(s["metric"].get("instance") == scraped.instance for s in got), got
        if name != "GenreadySystemdUnresponsive":
            assert all(s["metric"].get("target") == "sim" for s in got), got
