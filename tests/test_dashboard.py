"""The Grafana dashboard (packaging/grafana/genready.json): importable as it is, every metric it
queries exported by a running daemon, every query one Prometheus parses (promtool)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from genready_dev.harness import REPO, Genready, free_port, http, sim_unit, wait_for
from genready_dev.usermanager import UserManager
from tests.test_metrics import run_promtool

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
