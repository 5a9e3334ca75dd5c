"""How genready reaches a server, end to end on simulator units: API keys, TLS, unix sockets,
refusals, several models (the real servers' differences, as `genready simulate` imitates them).

One genready (a unit of the private user manager, with LoadCredential=) watches a dozen targets on
a handful of simulator units, set up once for the module: each test asserts on its own targets,
so the whole module costs one start-up. The last test mutates the setup (key rotation).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready_dev.harness import Simulator, free_port, genready_service, http, show, sim_unit, wait_for
from genready_dev.usermanager import UserManager
from tests.pki import make_pki
from tests.world import World as WorldBase

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 2.0, "gate_startup": False}
KEY_FILE, KEY_CRED, KEY_ROTATED = "sk-file-7f3a91c2e4", "sk-cred-5b8d20aa6e", "sk-rotated-c0ffee42"
KEYS = (KEY_FILE, KEY_CRED, KEY_ROTATED)
UNITS = ("rs-key", "rs-cred", "rs-tls", "rs-self", "rs-mtls", "rs-uds", "rs-chat", "rs-422")
GENREADY_UNIT = "rs-genready.service"


@dataclass
class World(WorldBase):
    key_file: Path
    cred_dir: Path
    ports: dict[str, int]
    socket: Path
    foreign_socket: Path
    foreign: Simulator

    def env_with_credential(self) -> dict[str, str]:
        return {**self.manager.env, "CREDENTIALS_DIRECTORY": str(self.cred_dir)}


def sim(manager: UserManager, tmp: Path, unit: str, *flags: str) -> int:
    port = free_port()
    manager.install_unit(f"{unit}.service", sim_unit(port, *flags, extra=f"StandardError=append:{tmp}/{unit}.log"))
    return port


def targets(w: World) -> dict[str, dict[str, Any]]:
    p = w.ports

    def https(name: str) -> str:
        return f"https://127.0.0.1:{p[name]}"

    return {
        "key_file": {"unit": "rs-key.service", "url": f"http://127.0.0.1:{p['rs-key']}",
                     "api_key_file": str(w.key_file), **FAST},
        "key_cred": {"unit": "rs-cred.service", "url": f"http://127.0.0.1:{p['rs-cred']}", "api": "openai-chat",
                     "api_key_credential": "llm-key", **FAST},
        "no_key": {"unit": "rs-key.service", "url": f"http://127.0.0.1:{p['rs-key']}", **FAST},
        "tls_ca": {"unit": "rs-tls.service", "url": https("rs-tls"), "ca_file": str(w.pki.ca), **FAST},
        "tls_self": {"unit": "rs-self.service", "url": https("rs-self"), **FAST},
        "mtls": {"unit": "rs-mtls.service", "url": https("rs-mtls"), "ca_file": str(w.pki.ca),
                 "client_cert_file": str(w.pki.client_cert), "client_key_file": str(w.pki.client_key), **FAST},
        "uds": {"unit": "rs-uds.service", "url": f"unix:{w.socket}", "api": "openai-completions", **FAST},
        "uds_foreign": {"unit": "rs-uds.service", "url": f"unix:{w.foreign_socket}", **FAST},
        "chat400": {"unit": "rs-chat.service", "url": f"http://127.0.0.1:{p['rs-chat']}", "api": "openai-chat",
                    "model": "sim-model", **FAST},
        "two_models": {"unit": "rs-chat.service", "url": f"http://127.0.0.1:{p['rs-chat']}",
                       "api": "openai-completions", **FAST},
        "unlisted": {"unit": "rs-chat.service", "url": f"http://127.0.0.1:{p['rs-chat']}",
                     "api": "openai-completions", "model": "nope", **FAST},
        "wrong_path": {"unit": "rs-chat.service", "url": f"http://127.0.0.1:{p['rs-chat']}/nope", **FAST},
        "shape422": {"unit": "rs-422.service", "url": f"http://127.0.0.1:{p['rs-422']}", **FAST},
    }


def write_config(w: World, only: list[str] | None = None, path: Path | None = None) -> Path:
    ts = targets(w)
    cfg = {"daemon": {"listen": f"127.0.0.1:{w.port}", "bus": "user", "state_dir": str(w.tmp / "state"),
                      "runtime_dir": str(w.tmp / "runtime"), "log_level": "debug"},
           "targets": {k: v for k, v in ts.items() if only is None or k in only}}
    path = path or w.config
    path.write_text(tomli_w.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def world(manager: UserManager, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("access")
    pki = make_pki(tmp / "pki")
    key_file, cred_src, cred_dir = tmp / "llm.key", tmp / "cred.key", tmp / "creds"
    key_file.write_text(KEY_FILE + "\n")
    cred_src.write_text(KEY_CRED)
    cred_dir.mkdir()
    shutil.copy(cred_src, cred_dir / "llm-key")  # for check-config run from the test, outside the unit
    sock, foreign_sock = tmp / "uds" / "llm.sock", tmp / "uds" / "foreign.sock"
    sock.parent.mkdir()
    ports = {
        "rs-key": sim(manager, tmp, "rs-key", "--api-key", KEY_FILE),
        "rs-cred": sim(manager, tmp, "rs-cred", "--api-key", KEY_CRED),
        "rs-tls": sim(manager, tmp, "rs-tls", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
        "rs-self": sim(manager, tmp, "rs-self", "--tls-cert", str(pki.self_signed_cert),
                       "--tls-key", str(pki.self_signed_key)),
        "rs-mtls": sim(manager, tmp, "rs-mtls", "--tls-cert", str(pki.server_cert), "--tls-key",
                       str(pki.server_key), "--tls-client-ca", str(pki.ca)),
        "rs-uds": sim(manager, tmp, "rs-uds", "--uds", str(sock)),
        "rs-chat": sim(manager, tmp, "rs-chat", "--no-chat-template", "--extra-model", "lora-a"),
        "rs-422": sim(manager, tmp, "rs-422", "--reject", "422"),
    }
    # A server on a unix socket that is no unit's: the owner proof must refuse it.
    foreign = Simulator(tmp, "--uds", str(foreign_sock))  # its --port unused
    w = World(manager, tmp, pki, free_port(), tmp / "genready.toml", tmp / "genready.log", key_file, cred_dir,
              ports, sock, foreign_sock, foreign)
    write_config(w)
    manager.install_unit(GENREADY_UNIT, genready_service(w.config, w.log, f"LoadCredential=llm-key:{cred_src}"))
    try:
        manager.systemctl("start", *(f"{u}.service" for u in UNITS))
        r = manager.systemctl("start", GENREADY_UNIT, check=False)
        assert r.returncode == 0, (r.stderr, w.log.read_text() if w.log.exists() else "")
        yield w
    finally:
        foreign.stop()
        for u in (GENREADY_UNIT, *(f"{u}.service" for u in UNITS)):
            manager.remove_unit(u)


# --- API keys ----------------------------------------------------------------------------------

def test_key_from_a_file_and_from_a_credential(world: World) -> None:
    for name, unit in (("key_file", "rs-key.service"), ("key_cred", "rs-cred.service")):
        t = world.wait_state(name, "ready")
        assert t["pid"] == show(world.manager, unit)[0]


def test_401_without_a_key_is_rejected_at_the_first_probe_with_the_hint(world: World) -> None:
    t = world.wait_state("no_key", "rejected")
    assert "HTTP 401" in t["reason"] and "Unauthorized" in t["reason"] and "set api_key_file" in t["reason"]
    # Every probe was a refusal from the first one on: none was taken for loading.
    probes = world.metric("genready_probes_total", target="no_key")
    assert probes["rejected"] >= 1 and all(v == 0 for k, v in probes.items() if k != "rejected"), probes
    code, body = http(world.base + "/ready/no_key")
    assert code == 503 and body["state"] == "rejected"
    states = world.metric("genready_state", target="no_key", label="genready_state")
    assert states["rejected"] == 1 and sum(states.values()) == 1
    r = world.cli("wait", "no_key", "--url", world.base, "--timeout", "0")
    assert r.returncode == 1 and "no_key: not ready: rejected: " in r.stderr and "HTTP 401" in r.stderr
    r = world.cli("status", "--url", world.base)
    assert r.returncode == 0 and re.search(r"^no_key\s+rs-key\.service\s+rejected\s", r.stdout, re.M), r.stdout


# --- TLS ---------------------------------------------------------------------------------------

def test_tls_with_a_ca_file_and_mutual_tls(world: World) -> None:
    for name, unit in (("tls_ca", "rs-tls.service"), ("mtls", "rs-mtls.service")):
        t = world.wait_state(name, "ready")
        assert t["pid"] == show(world.manager, unit)[0]


def test_self_signed_without_ca_file_is_tls_naming_the_problem(world: World) -> None:
    err = world.wait_error("tls_self", "tls: ")
    assert "certificate verify failed: self-signed certificate" in err and "set ca_file" in err
    probes = world.metric("genready_probes_total", target="tls_self")
    assert probes["tls"] >= 1 and probes["refused"] == 0, probes
    assert world.target("tls_self")["state"] in ("loading", "stuck")


# --- unix sockets ------------------------------------------------------------------------------

def test_unix_socket_verified_by_its_owner(world: World) -> None:
    t = world.wait_state("uds", "ready")
    pid = show(world.manager, "rs-uds.service")[0]
    assert t["pid"] == pid
    rec = next(r for r in t["records"] if r["main_pid"] == pid)
    assert rec["served_by_pid"] == pid


def test_a_foreign_process_on_the_socket_path_is_refused(world: World) -> None:
    err = world.wait_error("uds_foreign", "foreign_owner: ")
    # issue 53 #16: proven by the process holding the accepted end (unix_diag), as TCP is, not the listener's creds
    assert f"foreign_owner: pid {world.foreign.proc.pid} is not main pid" in err, err
    assert world.target("uds_foreign")["ready"] is False


# --- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "says"), [
    ("chat400", ["HTTP 400", "chat template", 'use api = "openai-completions"']),
    ("wrong_path", ["POST /generate: HTTP 404", "the url's path", "GET /nope/health answered 404/405 as well"]),
    ("shape422", ["HTTP 422", "Field required", "another request shape"]),
    ("unlisted", ["does not list model = 'nope'", "it lists 2: sim-model, lora-a", "set model"]),
])
def test_refusals_are_rejected_with_the_fix(world: World, name: str, says: list[str]) -> None:
    reason = world.wait_state(name, "rejected")["reason"]
    for s in says:
        assert s in reason, reason


def test_openapi_and_metrics_know_the_new_words(world: World) -> None:
    _, spec = http(world.base + "/openapi.json")
    status_schema = spec["paths"]["/status"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert "rejected" in status_schema["properties"]["targets"]["additionalProperties"]["properties"]["state"]["enum"]
    probes = world.metric("genready_probes_total", target="key_file")
    assert {"rejected", "tls"} <= set(probes)


def test_several_models_the_first_is_ready_and_status_says_why(world: World) -> None:
    # vLLM --served-model-name a b, LoRA adapters, llama.cpp's router: the first is what a request
    # without `model` gets (vllm/entrypoints/openai/models/serving.py)
    t = world.wait_state("two_models", "ready")
    assert t["model"].startswith('model "sim-model" (first of 2 listed: sim-model, lora-a'), t
    r = world.cli("check-config", "--probe", "--config", str(write_config(world, ["two_models"],
                                                                           world.tmp / "two.toml")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'two_models: ok (pid ' in r.stdout and 'model "sim-model" (first of 2 listed: sim-model, lora-a' in r.stdout


# --- check-config --probe ----------------------------------------------------------------------

def test_check_config_probe(world: World) -> None:
    world.wait_state("key_file", "ready")
    good = write_config(world, ["key_file", "key_cred", "tls_ca", "mtls", "uds"], world.tmp / "good.toml")
    r = world.cli("check-config", "--probe", "--config", str(good), env=world.env_with_credential())
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()[1:]
    assert [ln.split(":")[0] for ln in lines] == ["key_file", "key_cred", "tls_ca", "mtls", "uds"]
    pid = show(world.manager, "rs-uds.service")[0]
    assert f"uds: ok (pid {pid}): " in r.stdout
    r = world.cli("check-config", "--probe", "--config", str(world.config), env=world.env_with_credential())
    assert r.returncode == 1, r.stdout + r.stderr
    verdicts = dict(ln.split(": ", 1) for ln in r.stdout.splitlines()[1:])
    assert len(verdicts) == len(targets(world))
    assert verdicts["no_key"].startswith("rejected: ") and "set api_key_file" in verdicts["no_key"]
    assert verdicts["tls_self"].startswith("tls: ")
    assert verdicts["uds_foreign"].startswith("foreign_owner: ")
    assert verdicts["key_file"].startswith("ok (pid ")


# --- the key is never shown --------------------------------------------------------------------

def test_the_keys_appear_on_no_surface(world: World) -> None:
    world.wait_state("key_cred", "ready")
    env = world.env_with_credential()
    surfaces = {
        "/status": http(world.base + "/status")[1], "/metrics": http(world.base + "/metrics")[1],
        "/openapi.json": http(world.base + "/openapi.json")[1],
        "/ready": http(world.base + "/ready")[1], "daemon log": world.log.read_text(),
        "genready status": world.cli("status", "--url", world.base).stdout,
        "genready status --json": world.cli("status", "--json", "--url", world.base).stdout,
        "check-config": (r := world.cli("check-config", "--config", str(world.config), env=env)).stdout + r.stderr,
        "check-config --probe": (p := world.cli("check-config", "--probe", "--config", str(world.config),
                                                env=env)).stdout + p.stderr,
    }
    assert r.returncode == 0 and str(world.key_file) in r.stdout  # the path is shown, the content never
    for where, content in surfaces.items():
        text = content if isinstance(content, str) else json.dumps(content)
        for key in KEYS:
            assert key not in text, f"the API key is in {where}"


# --- rotation (mutates the setup: last) --------------------------------------------------------

def test_key_rotation_on_sighup(world: World) -> None:
    m = world.manager
    old_pid = world.wait_state("key_file", "ready")["pid"]
    # The file goes missing: a reload is refused, the running config (and key) kept.
    world.key_file.unlink()
    m.systemctl("reload", GENREADY_UNIT)
    err = wait_for(lambda: world.status()["config_error"], 10, "the refused reload in /status")
    assert "api_key_file" in err and "No such file" in err
    assert world.target("key_file")["state"] == "ready"
    # The server gets a new key: genready's old one is refused, and the hint says so.
    m.install_unit("rs-key.service", sim_unit(world.ports["rs-key"], "--api-key", KEY_ROTATED,
                                              extra=f"StandardError=append:{world.tmp}/rs-key.log"))
    m.systemctl("restart", "rs-key.service")
    reason = world.wait_state("key_file", "rejected")["reason"]
    assert "refused the API key" in reason
    # The admin writes the new key and reloads genready: verified again, with the new key.
    world.key_file.write_text(KEY_ROTATED)
    m.systemctl("reload", GENREADY_UNIT)
    t = world.wait_state("key_file", "ready")
    assert t["pid"] != old_pid and t["pid"] == show(m, "rs-key.service")[0]
    assert world.status()["config_error"] is None
    assert KEY_ROTATED not in world.log.read_text()


def test_environment_leaves_no_key(world: World) -> None:
    """The unit's environment carries no key either (LoadCredential= is a file, not a variable)."""
    pid = int(world.manager.show(GENREADY_UNIT, "MainPID")["MainPID"])
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert all(k.encode() not in environ for k in KEYS)
    assert os.path.isdir(dict(v.split(b"=", 1) for v in environ.split(b"\0") if b"=" in v)
                         [b"CREDENTIALS_DIRECTORY"].decode())
