"""genready against each server's profile (`genready simulate --profile`, docs/servers.md).

Without systemd where the gate's state machine is not the question (the probe, in this process,
against a real simulator process, its owner proven by its PID); under the private systemd
manager where it is: the restart race, readiness while SGLang warms up, rechecks.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genready import config
from genready.apis import APIS
from genready.config import TargetConfig
from genready.probe.probe import Prober
from genready.servers import kinds
from genready.servers.kinds import WRONG_SHAPE
from genready.vocab import Failure, ProbeResult
from genready_dev.harness import Genready, free_port, show, wait_for
from genready_dev.usermanager import UserManager
from tests.test_gate import ReadyPoller, assert_never_stale, left_active_at, start_sim_target
from tests.test_sim import Sim

# The API genready speaks to each simulated kind: its own (SGLang's /generate), else the one `init` proposes.
API = {p: kinds.BY_NAME[name].native_api or kinds.BY_NAME[name].api for p, name in kinds.SIMULATED.items()}
PROFILES = list(API)
FAST: dict[str, Any] = {"backoff_initial": 0.05, "backoff_max": 0.3, "probe_timeout": 5.0}


def target(url: str, api: str, key: str = "", **kw: Any) -> TargetConfig:
    """A TargetConfig with every default, from the config's own table."""
    t = config.parse({"targets": {"t": {"unit": "t.service", "url": url, "api": api, **kw}}}).targets["t"]
    return dataclasses.replace(t, api_key=key)


async def probe(sim: Sim, t: TargetConfig) -> ProbeResult:
    prober = Prober(t)
    try:
        return await prober.probe(sim.pid)
    finally:
        await prober.close()


@pytest.fixture
def sims() -> Iterator[list[Sim]]:
    made: list[Sim] = []
    yield made
    for s in made:
        s.proc.terminate()
        s.proc.wait(10)


def start(sims: list[Sim], *flags: str, ready: bool = True) -> Sim:
    sim = Sim(free_port(), *flags)
    sims.append(sim)
    sim.wait_log_sync("ready" if ready else "bound")
    return sim


def answer(url: str, body: dict[str, Any]) -> tuple[int, str]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def post(url: str, body: dict[str, Any]) -> int:
    return answer(url, body)[0]


def generates(url: str) -> bool:
    """A generation at `url` answers 200; False while nothing listens yet (a loaded machine starts the simulator
    late: a refused connection is "not yet", as for the daemon's own probe)."""
    try:
        return post(url, {"text": "hi"}) == 200
    except urllib.error.URLError as e:
        if isinstance(e.reason, ConnectionRefusedError):
            return False
        raise


# --- keys, model lists, token ids, the router: the probe against each profile -------------------

def takes_a_key(profile: str) -> bool:
    kind = kinds.BY_NAME[kinds.SIMULATED[profile]]
    return "key" in {*kind.flags.values(), *kind.env.values()}


# Only the servers that take a key (TensorRT-LLM takes none): a test that cannot apply is not one that skips.
@pytest.mark.system  # starts simulator processes
@pytest.mark.parametrize("profile", [p for p in PROFILES if takes_a_key(p)])
async def test_wrong_and_missing_key_per_server(sims: list[Sim], profile: str) -> None:
    sim = start(sims, "--profile", profile, "--api-key", "sk-right", "--load-seconds", "0")
    missing = await probe(sim, target(sim.url, API[profile]))
    assert missing.failure is Failure.REJECTED and missing.status == 401, missing
    assert "set api_key_file" in missing.detail
    wrong = await probe(sim, target(sim.url, API[profile], "sk-wrong"))
    assert wrong.failure is Failure.REJECTED and "refused the API key" in wrong.detail, wrong
    assert "sk-wrong" not in wrong.detail
    right = await probe(sim, target(sim.url, API[profile], "sk-right"))
    assert right.ok, right
    # Where each server answers 401 (docs/servers.md): vLLM and llama.cpp guard the model list
    # too (llama.cpp leaves only /health and /v1/health open), SGLang has no model list to ask.
    where = "model discovery: GET /v1/models" if APIS[API[profile]].needs_model else "POST /generate"
    assert missing.detail.startswith(where), missing.detail


@pytest.mark.system  # starts simulator processes
async def test_vllm_aliases_the_first_is_probed_a_pinned_one_must_be_listed(sims: list[Sim]) -> None:
    sim = start(sims, "--profile", "vllm", "--served-model-name", "a", "b", "--extra-model", "lora-x")
    first = await probe(sim, target(sim.url, "openai-chat"))
    assert first.ok, first
    assert 'model "a" (first of 3 listed: a, b, lora-x' in first.detail
    pinned = await probe(sim, target(sim.url, "openai-chat", model="b"))
    assert pinned.ok and 'model "b" (set by model; listed by the server)' in pinned.detail, pinned
    unlisted = await probe(sim, target(sim.url, "openai-chat", model="zz"))
    assert unlisted.failure is Failure.REJECTED, unlisted
    assert "does not list model = 'zz'; it lists 3: a, b, lora-x" in unlisted.detail


@pytest.mark.system  # starts simulator processes
@pytest.mark.parametrize(("profile", "api"), [("sglang", "sglang"), ("sglang", "openai-completions"),
                                              ("vllm", "openai-completions")])
async def test_token_id_prompts_for_a_server_without_a_tokenizer(sims: list[Sim], profile: str, api: str) -> None:
    sim = start(sims, "--profile", profile, "--skip-tokenizer-init")
    text = await probe(sim, target(sim.url, api))
    assert text.failure is Failure.REJECTED and text.status == 400, text
    assert "set prompt_ids" in text.detail
    ids = await probe(sim, target(sim.url, api, prompt_ids=[9707, 11]))
    assert ids.ok, ids


@pytest.mark.system  # starts simulator processes
@pytest.mark.parametrize("profile", ["sglang", "vllm"])
def test_a_wrong_shape_is_400_and_its_text_fires_the_wrong_api_hint(sims: list[Sim], profile: str) -> None:
    sim = start(sims, "--profile", profile)
    answers = [answer(sim.url + "/v1/completions", {"text": "hi"})]  # the native body on the OpenAI route
    if profile == "sglang":
        answers.append(answer(sim.url + "/generate", {"model": "m", "prompt": "hi"}))  # and the other way
    for status, body in answers:
        assert status == 400, (status, body)  # SGLang and vLLM turn FastAPI's 422 into 400
        assert any(m in body.lower() for m in WRONG_SHAPE), body


@pytest.mark.system  # starts simulator processes
async def test_llamacpp_router_not_loaded_then_loaded(sims: list[Sim]) -> None:
    sim = start(sims, "--profile", "llamacpp", "--router", "--load-seconds", "0.5", "--extra-model", "m2")
    t = target(sim.url, "openai-chat")
    r = await probe(sim, t)
    assert r.failure is Failure.UNHEALTHY and "model is not loaded" in r.detail, r  # loading, not rejected
    assert post(sim.url + "/models/load", {"model": "sim-model"}) == 200
    r = await probe(sim, t)
    assert r.failure is Failure.UNHEALTHY and "as 'loading'" in r.detail, r
    sim.wait_log_sync("ready", 1)  # the model's own "ready" line
    r = await probe(sim, t)
    assert r.ok and 'model "sim-model" (first of 2 listed' in r.detail, r


@pytest.mark.system  # starts simulator processes
async def test_llamacpp_router_autoload_a_held_post_is_loading_not_timeout(sims: list[Sim]) -> None:
    sim = start(sims, "--profile", "llamacpp", "--router", "--models-autoload", "--load-seconds", "3")
    t = target(sim.url, "openai-chat", probe_timeout=1.0)
    held = await probe(sim, t)
    assert held.failure is Failure.UNHEALTHY and "loads it on demand" in held.detail, held
    loading = await probe(sim, t)
    assert loading.failure is Failure.UNHEALTHY and "as 'loading'" in loading.detail, loading
    sim.wait_log_sync("ready", 1)
    assert (await probe(sim, t)).ok


@pytest.mark.system  # starts simulator processes
async def test_llamacpp_503_while_loading_is_loading(sims: list[Sim]) -> None:
    sim = start(sims, "--profile", "llamacpp", "--load-seconds", "60", ready=False)
    # the model list answers 503 "Loading model" too (server-http.cpp middleware_server_state)
    r = await probe(sim, target(sim.url, "openai-chat"))
    assert r.failure is Failure.HTTP_STATUS and r.status == 503, r
    assert "model discovery: GET /v1/models: HTTP 503" in r.detail and "Loading model" in r.detail


@pytest.mark.system  # starts simulator processes
async def test_sglang_warmup_generate_answers_but_the_probe_is_unhealthy(sims: list[Sim]) -> None:
    sim = start(sims, "--profile", "sglang", "--warmup-seconds", "60", ready=False)
    sim.wait_log_sync("warming")
    assert post(sim.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}) == 200
    r = await probe(sim, target(sim.url, "sglang"))
    assert r.failure is Failure.UNHEALTHY and r.status == 503, r
    assert r.served_by_pid == sim.pid


# --- the gate under systemd -----------------------------------------------------------------------

def restart_verified(manager: UserManager, g: Genready, unit: str, old: int) -> int:
    """`systemctl restart --no-block`, then wait until genready verified the new MainPID."""
    manager.systemctl("restart", "--no-block", unit)
    new: int = wait_for(lambda: (n := show(manager, unit)[0]) not in (0, old) and n, 30, "a new MainPID")
    wait_for(lambda: g.ready_pid("t") == new, 30, f"{unit}: the new start verified")
    return new


@pytest.fixture
def racers() -> Iterator[list[ReadyPoller]]:
    made: list[ReadyPoller] = []
    yield made
    for p in made:
        p.stop()


@pytest.mark.parametrize("profile", PROFILES)
def test_restart_race_never_false_ready(manager: UserManager, tmp_path: Path, profile: str,
                                        racers: list[ReadyPoller]) -> None:
    unit = f"ts-race-{profile}.service"
    g, _ = start_sim_target(manager, tmp_path, unit, "--profile", profile, "--load-seconds", "1",
                            api=API[profile], **FAST)
    try:
        pid, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == pid, 30, "the first start verified")
        p = ReadyPoller(g, "t")
        racers.append(p)
        p.start()
        for _ in range(2):
            pid = restart_verified(manager, g, unit, pid)
            assert_never_stale(p.answers, left_active_at(manager, unit), pid)
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_sglang_not_ready_while_its_health_says_503(manager: UserManager, tmp_path: Path) -> None:
    unit = "ts-warmup.service"
    g, port = start_sim_target(manager, tmp_path, unit, "--profile", "sglang", "--warmup-seconds", "4", **FAST)
    try:
        pid, _ = show(manager, unit)
        # /generate answers while SGLang's own /health still says 503 (its warmup)
        wait_for(lambda: generates(f"http://127.0.0.1:{port}/generate"), 20, "/generate")
        generate_ok_at = time.time()
        code, body = g.get("/ready/t")
        assert code == 503 and body["state"] == "loading", body
        wait_for(lambda: (b := g.get("/ready/t")[1]).get("last_error") and b, 10, "a probe")
        assert g.get("/ready/t")[1]["last_error"].startswith("unhealthy: GET /health: HTTP 503")
        wait_for(lambda: g.ready_pid("t") == pid, 30, "ready once /health says 200")
        assert time.time() - generate_ok_at > 2.0, "verified while /health still said 503"
        assert "warming" in (tmp_path / f"{unit}.log").read_text()
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_health_turning_503_fails_the_rechecks(manager: UserManager, tmp_path: Path) -> None:
    unit = "ts-unhealthy.service"
    g, port = start_sim_target(manager, tmp_path, unit, "--profile", "sglang", "--warmup-seconds", "0",
                               "--unhealthy-after", "3", recheck_interval=0.2, failure_threshold=2, **FAST)
    try:
        pid, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == pid, 30, "ready")
        # SGLang marks itself UnHealthy: /health 503 while /generate still answers
        wait_for(lambda: g.get("/ready/t")[0] == 503, 30, "readiness revoked by the rechecks")
        assert post(f"http://127.0.0.1:{port}/generate", {"text": "hi"}) == 200
        rec = next(r for r in g.records("t") if r["main_pid"] == pid)
        assert rec["revoke_reason"] == "recheck_failed", rec
        assert g.get("/ready/t")[1]["last_error"].startswith("unhealthy: GET /health: HTTP 503")
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_status_says_which_model_and_why(manager: UserManager, tmp_path: Path) -> None:
    unit = "ts-aliases.service"
    g, _ = start_sim_target(manager, tmp_path, unit, "--profile", "vllm", "--served-model-name", "a", "b",
                            api="openai-chat", **FAST)
    try:
        pid, _ = show(manager, unit)
        wait_for(lambda: g.ready_pid("t") == pid, 30, "the aliased vLLM verified")
        t = g.status()["targets"]["t"]
        assert t["model"].startswith('model "a" (first of 2 listed: a, b'), t
    finally:
        g.stop()
        manager.systemctl("stop", unit)


def test_every_profile_names_its_sources() -> None:
    # docs/servers.md names each profile's source files; the simulator comments name them too.
    doc = (Path(__file__).resolve().parents[1] / "docs" / "servers.md").read_text()
    dev = Path(__file__).resolve().parents[1] / "daemon" / "genready_dev"
    sim = "".join(p.read_text() for p in sorted(dev.glob("sim*.py")))  # the simulator's modules
    for path in ("python/sglang/srt/entrypoints/http_server.py", "python/sglang/srt/managers/tokenizer_manager.py",
                 "vllm/entrypoints/openai/models/serving.py", "vllm/entrypoints/openai/server_utils.py",
                 "tools/server/server-http.cpp", "tools/server/server-models.cpp",
                 "tensorrt_llm/serve/openai_server.py", "tensorrt_llm/commands/serve.py"):
        assert path.rsplit("/", 1)[1] in doc and path.rsplit("/", 1)[1] in sim, path
