"""The HTTP API against its OpenAPI contract, and /metrics moving as a restart scenario runs.

One genready serves two targets for the whole module: `sim` (a simulator unit that becomes
ready) and `gone` (a unit that does not exist), so every response shape can be produced.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import genready
from genready.serve import api, openapi
from genready_dev.harness import GENREADY, Genready, free_port, show, sim_unit, wait_for
from genready_dev.usermanager import UserManager
from tests import ci

UNIT = "ta-sim.service"
FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0}


@pytest.fixture(scope="module")
def served(manager: UserManager, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Genready]:
    tmp = tmp_path_factory.mktemp("api")
    port = free_port()
    manager.install_unit(UNIT, sim_unit(port, "--load-seconds", "0.3", "--linger-seconds", "0.3"))
    manager.systemctl("start", UNIT)
    g = Genready(manager, tmp, {
        "sim": {"unit": UNIT, "url": f"http://127.0.0.1:{port}", **FAST},
        "gone": {"unit": "ta-does-not-exist.service", "url": f"http://127.0.0.1:{free_port()}", **FAST},
    }).start()
    wait_for(lambda: g.get("/ready/sim")[0] == 200, 20, "sim verified")
    try:
        yield g
    finally:
        g.stop()
        manager.systemctl("stop", UNIT)


def conforms(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """The ways `value` breaks `schema` (the JSON Schema subset openapi.py uses)."""
    kinds: dict[str, type | tuple[type, ...]] = {
        "object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool,
        "null": type(None)}
    errs: list[str] = []
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else types
        ok = any(isinstance(value, kinds[t]) and not (t in ("integer", "number") and isinstance(value, bool))
                 for t in allowed)
        if not ok:
            return [f"{where}: expected {allowed}, found {type(value).__name__} {value!r:.60}"]
    if "const" in schema and value != schema["const"]:
        errs.append(f"{where}: expected {schema['const']!r}, found {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{where}: {value!r} not in {schema['enum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        errs.append(f"{where}: {value!r:.60} does not match {schema['pattern']}")
    if isinstance(value, dict):
        errs += [f"{where}: missing {k}" for k in schema.get("required", []) if k not in value]
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                errs += conforms(value[k], sub, f"{where}.{k}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for k, v in value.items():
                if k not in schema.get("properties", {}):
                    errs += conforms(v, extra, f"{where}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errs += conforms(v, schema["items"], f"{where}[{i}]")
    return errs


def response_schema(path: str, code: int) -> dict[str, Any]:
    op = openapi.spec()["paths"][path]["get"]
    assert str(code) in op["responses"], f"{path} answered {code}, which the spec does not document"
    schema: dict[str, Any] = op["responses"][str(code)]["content"]["application/json"]["schema"]
    return schema


@pytest.mark.parametrize(("url", "spec_path", "code"), [
    ("/ready/sim", "/ready/{target}", 200),
    ("/ready/gone", "/ready/{target}", 503),
    ("/ready", "/ready", 503),
    ("/ready/sim?wait=nope", "/ready/{target}", 400),
    ("/ready?pid=-3", "/ready", 400),
    ("/ready/nope", "/ready/{target}", 404),
    ("/status", "/status", 200),
])
def test_responses_match_the_contract(served: Genready, url: str, spec_path: str, code: int) -> None:
    got, body = served.get(url)
    assert got == code, body
    assert conforms(body, response_schema(spec_path, code)) == []


def test_not_ready_says_why(served: Genready) -> None:
    code, body = served.get("/ready/gone")
    assert code == 503 and body["state"] == "absent" and "does not exist" in body["reason"]
    code, body = served.get("/ready")
    assert code == 503 and [t["target"] for t in body["targets"]] == ["gone"]


def test_status_lists_records(served: Genready) -> None:
    status = served.status()
    pid, inv = show(served.um, UNIT)
    rec = status["targets"]["sim"]["records"][0]
    assert (rec["main_pid"], rec["invocation_id"]) == (pid, inv) and rec["ready_at"] and rec["served_by_pid"] == pid
    assert status["owner_proof"] == "available" and status["bus_connected"] is True


def test_head_ready_has_status_and_no_body(served: Genready) -> None:
    req = urllib.request.Request(served.base + "/ready/sim", method="HEAD")
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200 and r.read() == b""


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/", "/ready", "/ready/sim", "/status", "/metrics", "/openapi.json"])
def test_nothing_changes_anything(served: Genready, path: str, method: str) -> None:
    req = urllib.request.Request(served.base + path, method=method, data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 405
    assert "error" in json.loads(e.value.read())


def test_unknown_path_is_json_404(served: Genready) -> None:
    code, body = served.get("/admin")
    assert code == 404 and "no such endpoint" in body["error"]


def test_spec_is_served_and_covers_every_route(served: Genready) -> None:
    code, body = served.get("/openapi.json")
    assert code == 200 and body == openapi.spec()
    app = api.make_app({}, None)
    routes = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    assert routes == set(body["paths"])


def metric(families: dict[str, Any], name: str, **labels: str) -> float:
    for s in families[name].samples:
        if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {name}{labels}")


def load_count(families: dict[str, Any]) -> float:
    return next(float(s.value) for s in families["genready_load_seconds"].samples if s.name.endswith("_count"))


def scrape(g: Genready) -> tuple[str, dict[str, Any]]:
    with urllib.request.urlopen(g.base + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_move_through_a_restart(served: Genready) -> None:
    labels = {"target": "sim", "unit": UNIT}
    _, before = scrape(served)
    assert metric(before, "genready_ready", **labels) == 1
    assert metric(before, "genready_state", genready_state="ready", **labels) == 1
    old_pid = show(served.um, UNIT)[0]
    assert metric(before, "genready_main_pid", **labels) == old_pid
    starts = metric(before, "genready_starts", **labels)
    revoked = metric(before, "genready_revocations", reason="job_queued", **labels) + metric(
        before, "genready_revocations", reason="inactive", **labels)
    loads = load_count(before)
    oks = metric(before, "genready_probes", result="ok", **labels)

    served.um.systemctl("restart", UNIT)
    new_pid = show(served.um, UNIT)[0]
    wait_for(lambda: (c := served.get("/ready/sim"))[0] == 200 and c[1]["pid"] == new_pid, 20, "re-verified")
    text, after = scrape(served)
    assert metric(after, "genready_starts", **labels) == starts + 1
    assert metric(after, "genready_revocations", reason="job_queued", **labels) + metric(
        after, "genready_revocations", reason="inactive", **labels) == revoked + 1
    assert load_count(after) == loads + 1
    assert metric(after, "genready_probes", result="ok", **labels) == oks + 1
    assert metric(after, "genready_main_pid", **labels) == new_pid
    assert metric(after, "genready_ready_requests", code="200") >= 1
    assert metric(after, "genready_build_info", version=genready.__version__) == 1
    promtool = ci.tool("promtool", "Debian/Ubuntu: apt-get install prometheus")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "" and out.stderr.strip() == "", out



def test_status_cli_prints_a_table_and_json(served: Genready) -> None:
    out = subprocess.run([*GENREADY, "status", "--url", served.base], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    pid = show(served.um, UNIT)[0]
    lines = out.stdout.splitlines()
    row = next(line for line in lines if line.startswith("sim "))
    assert "ready" in row.split() and str(pid) in row.split()
    assert any(line.startswith("gone ") and "absent" in line for line in lines)
    js = subprocess.run([*GENREADY, "status", "--json", "--url", served.base], capture_output=True, text=True,
                        timeout=30)
    assert json.loads(js.stdout)["targets"]["sim"]["pid"] == pid
    down = subprocess.run([*GENREADY, "status", "--url", f"http://127.0.0.1:{free_port()}"], capture_output=True,
                          text=True, timeout=30)
    assert down.returncode == 69 and "unreachable" in down.stderr


def connected_to(port: int) -> bool:
    """An ESTABLISHED TCP connection to 127.0.0.1:port exists (its local end is the client)."""
    want = f":{port:04X} "
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(r.split()[2].endswith(want.strip()) and r.split()[3] == "01" for r in rows)


def test_long_poll_at_shutdown_gets_a_503_saying_so(manager: UserManager, tmp_path: Path) -> None:
    g = Genready(manager, tmp_path, {"gone": {"unit": "ta-never.service", "url": f"http://127.0.0.1:{free_port()}"}})
    g.start()
    result: list[tuple[int, Any]] = []
    t = threading.Thread(target=lambda: result.append(g.get("/ready/gone?wait=60", timeout=30)))
    t.start()
    wait_for(lambda: connected_to(g.port), 5, "the long-poll's connection")
    assert g.stop() == 0
    t.join(10)
    code, body = result[0]
    assert code == 503 and body["reason"] == "genready is shutting down", body


@pytest.mark.system
def test_cli_against_something_that_is_not_genready() -> None:
    """A port that speaks another protocol is 'unreachable' (69) with a message, not a traceback."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]

        def banner() -> None:
            for _ in range(2):
                conn, _ = srv.accept()
                with conn:
                    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        t = threading.Thread(target=banner, daemon=True)
        t.start()
        for cmd in (["status"], ["wait", "t", "--timeout", "0"]):
            out = subprocess.run([*GENREADY, *cmd, "--url", f"http://127.0.0.1:{port}"], capture_output=True,
                                 text=True, timeout=30)
            assert out.returncode == 69, out
            assert "Traceback" not in out.stderr and "unreachable" in out.stderr

