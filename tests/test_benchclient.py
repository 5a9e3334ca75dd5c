"""The benchmark client against real simulator processes: every API, the pid line, failures, timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pty
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from genready import apis
from genready.servers import metricspage
from genready.sweep.run import steps
from genready.tools import benchclient, benchrun, prompts, servermetrics
from genready.tools.prompts import Prompt
from genready_dev.harness import PY, Simulator, env_without_notify, free_port
from genready_dev.hostile import raw_server

BENCH = [PY, "-m", "genready.benchclient"]
GUARD_ENV = {"GENREADY_PID": "4242", "GENREADY_INVOCATION_ID": "0123456789abcdef0123456789abcdef",
             "GENREADY_UNIT": "sglang.service"}


Sim = Simulator  # `genready simulate` on a free port (genready_dev.harness)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    s = Sim(tmp_path_factory.mktemp("sim"), "--token-latency", "0.001")
    yield s
    s.stop()


def bench(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = env_without_notify()
    for k in GUARD_ENV:
        full_env.pop(k, None)
    full_env.update(env or {})
    return subprocess.run([*BENCH, *args], env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("api", apis.NAMES)
@pytest.mark.system
def test_every_api_counts_and_names_the_guarded_pid(sim: Sim, api: str, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    r = bench("--url", sim.url, "--api", api, "-n", "12", "-c", "3", "--max-tokens", "5", "--target", "sglang",
              "--output", str(out), env=GUARD_ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (f"benchclient: 12 requests at concurrency 3 to {sim.url} ({api}, max_tokens 5, "
                        "streaming), target sglang, pid 4242")
    assert "  requests   12 ok, 0 failed" in lines
    assert any(line.startswith("  rate       ") and " requests/s, " in line and " tokens/s over " in line
               for line in lines)
    assert any(line.startswith("  latency    p50 ") and ", p99 " in line for line in lines)
    assert lines[-1] == ("  served by pid 4242 (invocation 0123456789abcdef0123456789abcdef, unit sglang.service)")
    assert any(line.startswith("  ttft       p50 ") for line in lines)
    assert any(line.startswith("  itl        p50 ") for line in lines)
    # Not a terminal: plain progress lines, no bar.
    assert "\r" not in r.stderr and "benchclient: 12/12 done" in r.stderr.splitlines()
    result = json.loads(out.read_text())
    assert (result["ok"], result["failed"], result["api"], result["target"]) == (12, 0, api, "sglang")
    assert result["served_by"] == {"pid": "4242", "invocation_id": GUARD_ENV["GENREADY_INVOCATION_ID"],
                                   "unit": "sglang.service"}
    # 5 tokens per request, counted from the server's own usage figures.
    assert result["tokens_per_second"] == pytest.approx(5 * result["requests_per_second"], rel=1e-3)
    assert 0 < result["latency_p50_ms"] <= result["latency_p99_ms"]
    assert 0 < result["ttft_p50_ms"] <= result["ttft_p99_ms"] <= result["e2e_p99_ms"]
    assert result["output_tokens"] == 60 and result["stream"] is True


@pytest.mark.parametrize("api", apis.NAMES)
@pytest.mark.system
def test_streaming_times_the_first_token_and_the_gaps_between_tokens(tmp_path: Path, api: str) -> None:
    """The simulator paces each token by --token-latency: the gaps the client sees are token gaps,
    not whole requests, and the first token comes one gap after the request, not at its end."""
    s = Sim(tmp_path, "--token-latency", "0.03")
    try:
        out = tmp_path / "r.jsonl"
        r = bench("--url", s.url, "--api", api, "-n", "4", "-c", "2", "--max-tokens", "6", "--label", "pace",
                  "--output", str(out), env={"GENREADY_SWEEP_POINT": '{"budget": 8}', **GUARD_ENV})
    finally:
        s.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert 25 <= res["itl_p50_ms"] <= 150, res  # one token's latency, with room for a busy machine
    assert 25 <= res["ttft_p50_ms"] < res["e2e_p50_ms"], res
    assert res["e2e_p50_ms"] >= 6 * 30 * 0.9, res
    assert res["output_tokens"] == 24 and res["label"] == "pace"
    assert res["sweep_point"] == {"budget": 8} and res["served_by"]["pid"] == "4242"
    assert '  sweep point {"budget": 8}' in r.stdout and ", label pace," in r.stdout.splitlines()[0]


@pytest.mark.system
def test_poisson_arrivals_follow_the_seeded_schedule(sim: Sim, tmp_path: Path) -> None:
    """--request-rate spaces the sends by exponential gaps; with --seed the schedule is known."""
    rng = random.Random(7)
    gaps = sum(rng.expovariate(10.0) for _ in range(7))  # 8 requests: 7 gaps between sends
    out = tmp_path / "p.jsonl"
    r = bench("--url", sim.url, "-n", "8", "-c", "8", "--request-rate", "10", "--seed", "7", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["wall_seconds"] >= gaps and res["request_rate"] == 10.0 and res["ok"] == 8
    assert "Poisson 10 requests/s" in r.stdout.splitlines()[0]


@pytest.mark.system
def test_no_stream_has_no_token_timings(sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "n.jsonl"
    r = bench("--url", sim.url, "-n", "3", "--no-stream", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["stream"] is False and res["ttft_p50_ms"] is None and res["itl_p50_ms"] is None
    assert "ttft" not in r.stdout and "streaming" not in r.stdout


@pytest.mark.system
def test_no_pid_line_outside_guard(sim: Sim) -> None:
    r = bench("--url", sim.url, "-n", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "served by" not in r.stdout
    assert ", pid " not in r.stdout.splitlines()[0]


@pytest.mark.system
def test_openai_model_is_discovered(sim: Sim, tmp_path: Path) -> None:
    """Without --model the client asks /v1/models, as a user would; the simulator's name comes back."""
    r = bench("--url", sim.url, "--api", "openai-chat", "-n", "2", "--output", str(tmp_path / "o.jsonl"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cannot read a model" not in r.stderr


@pytest.mark.system
def test_failing_server_exits_nonzero(tmp_path: Path) -> None:
    s = Sim(tmp_path, "--fail-rate", "1")
    try:
        r = bench("--url", s.url, "-n", "6", "-c", "2", env=GUARD_ENV)
    finally:
        s.stop()
    assert r.returncode == 1, r.stdout + r.stderr
    said = next(ln for ln in r.stdout.splitlines() if ln.startswith("  requests "))
    # issue 53 #14: the server's own words for the failure, not only its status
    assert said.startswith("  requests   0 ok, 6 failed (6x HTTP 500: ") and "simulated engine failure" in said, said
    assert "latency    p50 -, p99 -" in r.stdout
    assert "served by pid 4242" in r.stdout  # which server failed matters as much as which one worked


@pytest.mark.system
def test_unreachable_server_exits_nonzero() -> None:
    r = bench("--url", f"http://127.0.0.1:{free_port()}", "-n", "3")
    assert r.returncode == 1
    assert "0 ok, 3 failed (3x cannot connect: Connection refused)" in r.stdout


@pytest.mark.system
def test_hung_server_is_time_bounded(tmp_path: Path) -> None:
    """A server that accepts but never answers costs --timeout per request, not forever."""
    s = Sim(tmp_path, "--hang-after", "0")
    try:
        r = bench("--url", s.url, "-n", "4", "-c", "4", "--timeout", "0.5", timeout=20)
    finally:
        s.stop()
    assert r.returncode == 1
    assert "0 ok, 4 failed (4x timeout (0.5 s))" in r.stdout


@pytest.mark.system
def test_progress_bar_only_on_a_terminal(sim: Sim) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([*BENCH, "--url", sim.url, "-n", "5", "-c", "1"], env=env_without_notify(),
                              stdout=subprocess.PIPE, stderr=slave, text=True, timeout=60)
        os.close(slave)
        slave = -1
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 0
    assert b"5/5" in seen and b"[####" in seen
    assert "5/5" not in proc.stdout  # the bar never mixes into the result on stdout


@pytest.mark.parametrize("args", [["-n", "0"], ["-c", "-1"], ["--timeout", "nan"], ["--api", "grpc"]])
@pytest.mark.system
def test_usage_errors(args: list[str]) -> None:
    r = bench(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert benchclient.percentile(values, 50) == 50.0
    assert benchclient.percentile(values, 99) == 99.0
    assert benchclient.percentile([7.0], 99) == 7.0
    assert benchclient.percentile([], 50) is None


@pytest.mark.system
def test_api_key_from_a_genready_config_target(tmp_path: Path) -> None:
    """--config takes the target's url, api and API key, as the probe uses them; without the key: 401s."""
    s = Sim(tmp_path, "--api-key", "s3cret")
    try:
        keyfile = tmp_path / "key"
        keyfile.write_text("s3cret\n")
        cfg = tmp_path / "genready.toml"
        cfg.write_text(f'[targets.llm]\nunit = "llm.service"\nurl = "{s.url}"\napi = "openai-chat"\n'
                       f'api_key_file = "{keyfile}"\n')
        r = bench("--config", str(cfg), "-n", "3", "--max-tokens", "2")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines()[0].startswith(f"benchclient: 3 requests at concurrency 4 to {s.url} (openai-chat")
        assert "target llm" in r.stdout.splitlines()[0]
        r = bench("--url", s.url, "-n", "2", "--max-tokens", "2")
        assert r.returncode == 1 and "2x HTTP 401" in r.stdout, r.stdout
        r = bench("--url", s.url, "-n", "2", "--max-tokens", "2", "--api-key-file", str(keyfile))
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        s.stop()


# --- accept length, prompts --------------------------------------------------------------------------


@pytest.mark.parametrize(("api", "stream"), [(a, True) for a in apis.NAMES] + [("sglang", False)])
@pytest.mark.system
def test_accept_length_is_the_simulators_for_every_api(tmp_path: Path, api: str, stream: bool) -> None:
    """--spec-accept 2.5 with 10 tokens per request: 4 verify steps each, so exactly 2.5 from SGLang's
    spec_verify_ct and from vLLM's counters (1 + 6 accepted / 4 drafts per request)."""
    s = Sim(tmp_path, "--spec-accept", "2.5", "--token-latency", "0.001")
    try:
        out = tmp_path / "a.jsonl"
        r = bench("--url", s.url, "--api", api, "-n", "8", "-c", "2", "--max-tokens", "10", "--output", str(out),
                  *([] if stream else ["--no-stream"]))
    finally:
        s.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["accept_length"] == 2.5, res
    if api == "sglang":
        assert res["accept_length_source"] == "meta_info.spec_verify_ct" and res["server_accept_length"] == 2.5
        assert "  accept     length 2.50 (meta_info.spec_verify_ct), server average 2.50" in r.stdout
    else:  # the simulator's OpenAI routes answer SGLang 0.5.12's sglext.spec_tokens_details: the run's own counts
        # come before the /metrics counters, which agree (issue 38 §4)
        source = "per answer: sglext.spec_tokens_details spec_num_correct_drafts / spec_verify_ct"
        assert res["accept_length_source"] == source and res["server_accept_length"] is None
        assert res["counters_accept_length"] == 2.5 and res["accept_disagreement"] is None, res
        assert f"  accept     length 2.50 ({source})" in r.stdout


@pytest.mark.parametrize("api", apis.NAMES)
@pytest.mark.system
def test_no_speculative_decoding_no_accept_length(sim: Sim, tmp_path: Path, api: str) -> None:
    out = tmp_path / "n.jsonl"
    r = bench("--url", sim.url, "--api", api, "-n", "2", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["accept_length"] is None and res["accept_length_source"] is None and res["server_accept_length"] is None
    assert "  accept     length - (no speculative decoding seen)" in r.stdout


@pytest.mark.system
def test_vllm_reasoning_deltas_time_the_first_token(tmp_path: Path) -> None:
    """A reasoning model streams its thinking in delta.reasoning: that is the first token, not the answer's."""
    s = Sim(tmp_path, "--reasoning-tokens", "100", "--token-latency", "0.01")
    try:
        out = tmp_path / "r.jsonl"
        r = bench("--url", s.url, "--api", "openai-chat", "-n", "2", "-c", "1", "--max-tokens", "5", "--output",
                  str(out))
    finally:
        s.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["ttft_p50_ms"] is not None and res["itl_p50_ms"] is not None and res["output_tokens"] == 10, res


def test_vllm_counters_are_summed_over_engines() -> None:
    page = ('# TYPE vllm:spec_decode_num_drafts_total counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 6.0\n'
            'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0\n')
    got = metricspage.counters(page)
    assert (got["vllm:spec_decode_num_drafts_total"], got["vllm:spec_decode_num_accepted_tokens_total"]) == (16, 20)
    run = servermetrics.over_run({k: 0.0 for k in got}, got)
    assert run.acceptance is not None and (run.acceptance.accepted, run.acceptance.steps) == (20, 16)


@pytest.mark.system
def test_random_ids_reach_every_api_that_takes_them(sim: Sim, tmp_path: Path) -> None:
    for api in ("sglang", "openai-completions"):
        out = tmp_path / f"{api}.jsonl"
        r = bench("--url", sim.url, "--api", api, "-n", "4", "--random-input-len", "50", "--random-output-len", "6",
                  "--random-range-ratio", "0.5", "--seed", "3", "--output", str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        res = json.loads(out.read_text())
        assert res["ok"] == 4 and 4 * 3 <= res["output_tokens"] <= 4 * 6, res
        assert res["prompts"] == "random ids: input 50, output 6, ratio 0.5" and res["seed"] == 3


@pytest.mark.system
def test_random_ids_with_chat_exit_64() -> None:
    r = bench("--url", "http://127.0.0.1:1", "--api", "openai-chat", "--random-input-len", "8")
    assert r.returncode == 64 and "token ids, which openai-chat cannot take" in r.stderr, r.stderr


def test_request_bodies_carry_ids_messages_and_sampling() -> None:
    ids = prompts.Prompt(ids=(1001, 1002), max_tokens=7)
    sg = benchclient.request_body(apis.APIS["sglang"], ids, max_tokens=3, model="", stream=True, temperature=0.7,
                                  ignore_eos=True)
    assert "text" not in sg and sg["input_ids"] == [1001, 1002] and sg["stream"] is True
    assert sg["sampling_params"] == {"max_new_tokens": 7, "temperature": 0.7, "ignore_eos": True}
    comp = benchclient.request_body(apis.APIS["openai-completions"], ids, max_tokens=3, model="m", stream=False)
    assert comp["prompt"] == [1001, 1002] and comp["max_tokens"] == 7 and "ignore_eos" not in comp
    chat = prompts.Prompt(messages=(("system", "be brief"), ("user", "hi")))
    body = benchclient.request_body(apis.APIS["openai-chat"], chat, max_tokens=3, model="m", stream=False)
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert benchclient.request_body(apis.APIS["sglang"], chat, max_tokens=3, model="", stream=False)["text"] == \
        "be brief\n\nhi"


def test_the_builtin_set_is_varied_and_the_seed_repeats_the_order() -> None:
    texts = {p.as_text() for p in prompts.BUILTIN}
    assert len(prompts.BUILTIN) >= 24 and len(texts) == len(prompts.BUILTIN)
    assert any(p.messages for p in prompts.BUILTIN)
    a = prompts.schedule(prompts.BUILTIN, 50, random.Random(5))
    assert a == prompts.schedule(prompts.BUILTIN, 50, random.Random(5)) != prompts.schedule(
        prompts.BUILTIN, 50, random.Random(6))
    assert set(a[:len(prompts.BUILTIN)]) == set(prompts.BUILTIN)  # each once before any repeats


def test_datasets_jsonl_and_sharegpt_first_turn(tmp_path: Path) -> None:
    jl = tmp_path / "d.jsonl"
    jl.write_text('{"prompt": "one"}\n\n{"messages": [{"role": "system", "content": "s"}, '
                  '{"role": "user", "content": "two"}, {"role": "assistant", "content": "x"}]}\n')
    got = prompts.load_dataset(jl)
    assert got == [prompts.Prompt("one"), prompts.Prompt(messages=(("system", "s"), ("user", "two")))]
    sg = tmp_path / "sharegpt.json"
    sg.write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "q1"},
                                                             {"from": "gpt", "value": "a1"},
                                                             {"from": "human", "value": "q2"}]},
                              {"id": "b", "conversations": [{"from": "gpt", "value": "hello"}]}], indent=1))
    assert prompts.load_dataset(sg) == [prompts.Prompt(messages=(("user", "q1"),))]


@pytest.mark.parametrize(("content", "says"), [
    (None, "d.jsonl: cannot read the dataset"),
    ("", "d.jsonl:1: the dataset is empty"),
    ('{"prompt": "ok"}\n{"prompt": "torn"\n', "d.jsonl:2: not a JSON object"),
    ('{"prompt": "ok"}\n\n{"text": "x"}\n', "d.jsonl:3: expected \"prompt\", \"messages\" or \"conversations\""),
    ('{"prompt": 7}\n', "d.jsonl:1: \"prompt\": expected non-empty text"),
    ('[\n {"conversations": []},\n {"conversations": [{"from": "human"}]}\n]', "d.jsonl:3: a turn without"),
    ('[\n {"prompt": "a"},\n {"prompt": \n', "d.jsonl:3: not valid JSON"),
    ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', "d.jsonl:1: no usable prompt in 1 entries"),
])
@pytest.mark.system
def test_a_bad_dataset_exits_65_naming_file_and_line(tmp_path: Path, content: str | None, says: str) -> None:
    path = tmp_path / "d.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(prompts.DatasetError, match=re.escape(says)):
        prompts.load_dataset(path)
    r = bench("--url", "http://127.0.0.1:1", "--dataset", str(path))
    assert r.returncode == 65 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.system
def test_a_dataset_is_sent(sim: Sim, tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"prompt number {i}"}) + "\n" for i in range(5)))
    out = tmp_path / "o.jsonl"
    r = bench("--url", sim.url, "--api", "openai-chat", "-n", "7", "--dataset", str(path), "--temperature", "0.5",
              "--ignore-eos", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["ok"] == 7 and res["prompts"] == f"dataset {path} (5 prompts)"
    assert res["temperature"] == 0.5 and res["ignore_eos"] is True


# --- a hostile server: in-process, against raw loopback servers -------------------------------

GOOD = json.dumps({"text": " OK", "output_ids": [11], "meta_info": {"completion_tokens": 1}}).encode()


def _http(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return (f"HTTP/1.1 {status}\r\n{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def _sse(*events: bytes) -> bytes:
    # With a length, so that the run's closing read of SGLang's server info, answered by the same bytes,
    # ends with the body instead of waiting for the connection to close.
    return _http("200 OK", b"".join(b"data: " + e + b"\n\n" for e in (*events, b"[DONE]")),
                 "Content-Type: text/event-stream")


async def _run(url: str, *, n: int, stream: bool, api: str = "sglang", timeout: float = 10,
               **kw: Any) -> benchclient.Summary:
    server = benchclient.ServerOptions(url, api, kw.pop("model", "m"))
    load = benchclient.LoadOptions(n, 2, 1, timeout, [Prompt(text="hi")], stream=stream, **kw)
    return await benchclient.run(server, load, benchclient.Progress(n, io.StringIO()))


@pytest.mark.parametrize("stream", [False, True])
async def test_a_redirect_is_a_failed_request_never_followed(stream: bool) -> None:
    """A 307 to another server was followed and counted ok, in a report naming the verified pid."""
    elsewhere: list[bytes] = []
    async for other in raw_server(_http("200 OK", GOOD), elsewhere):
        async for url in raw_server(_http("307 Temporary Redirect", b"", f"Location: {other}/generate")):
            s = await _run(url, n=4, stream=stream)
            async with aiohttp.ClientSession() as session:
                assert await benchclient.discover_model(session, url, 5) is None  # /v1/models is not followed
    assert (s.ok, s.failed) == (0, 4)
    assert s.errors() == {f"HTTP 307 redirect to {other}/generate (not followed)": 4}
    assert elsewhere == []


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refusal_is_given_in_the_servers_words_bounded_and_escaped(stream: bool, tmp_path: Path) -> None:
    """Issue 53 #14: "3x HTTP 400" and nothing else, where llama-server's answer said why. Each failure kind's first
    answer goes to the summary, the bench line (error_words) and, from there, the sweep's line for the run."""
    why = (b'{"error":{"code":400,"message":"request (1163 tokens) exceeds the available context size (512 '
           b'tokens), try increasing it\x1b[2J","type":"exceed_context_size_error"}}' + b" " * 10_000)
    async for url in raw_server(_http("400 Bad Request", why)):
        s = await _run(url, n=3, stream=stream)
    assert s.errors() == {"HTTP 400": 3}
    words = s.error_words()["HTTP 400"]
    assert "exceeds the available context size (512 tokens)" in words
    assert "\\x1b[2J" in words and "\x1b" not in words  # escaped for a terminal
    assert len(words) <= benchrun.SAID_CHARS + 1
    assert "3x HTTP 400: {\"error\":{\"code\":400,\"message\":\"request (1163 tokens) exceeds" in \
        benchclient.format_summary(s, {})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "bench.jsonl").write_text(json.dumps({"errors": {"HTTP 400": 3},
                                                              "error_words": s.error_words()}) + "\n")
    assert steps.bench_failures(tmp_path / "run").startswith("3x HTTP 400: {")
    assert steps.bench_failures(tmp_path) == ""  # no bench line: nothing to add


async def test_a_stream_event_over_the_line_limit_is_one_failed_request_and_the_rest_count() -> None:
    """One 600 KiB event among 20 requests raised aiohttp's LineTooLong (not a ValueError since aiohttp 3.10)
    out of the run: no summary, no --output line."""
    event = json.dumps({"text": " OK", "meta_info": {"completion_tokens": 1}}).encode()
    huge = json.dumps({"text": "x" * (600 << 10), "meta_info": {"completion_tokens": 1}}).encode()
    async for url in raw_server(lambda n: _sse(huge if n == 7 else event)):
        s = await _run(url, n=20, stream=True)
    assert (s.ok, s.failed) == (19, 1), s.errors()
    assert list(s.errors()) == ["bad response: a stream line over aiohttp's limit"]


async def test_the_report_is_written_whatever_the_requests_raise(tmp_path: Path) -> None:
    """The whole CLI, in-process: one request raising what nothing foresaw still gives the summary and the
    --output line, with that request counted failed."""
    event = json.dumps({"text": " OK", "meta_info": {"completion_tokens": 1}}).encode()
    huge = json.dumps({"text": "x" * (600 << 10), "meta_info": {"completion_tokens": 1}}).encode()
    out = tmp_path / "r.jsonl"
    real = benchclient.one_stream
    calls = 0

    async def sometimes_broken(*a: Any, **kw: Any) -> benchclient.Outcome:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("nobody saw this coming")
        return await real(*a, **kw)

    async for url in raw_server(lambda n: _sse(huge if n == 1 else event)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(benchrun, "one_stream", sometimes_broken)
            stdout = io.StringIO()
            mp.setattr(sys, "stdout", stdout)
            rc = await asyncio.to_thread(benchclient.main, ["--url", url, "-n", "6", "-c", "1", "--prompt", "hi",
                                                            "--output", str(out)])
    assert rc == 1
    res = json.loads(out.read_text())
    assert (res["ok"], res["failed"]) == (4, 2), res
    assert res["errors"] == {"RuntimeError: nobody saw this coming": 1,
                             "bad response: a stream line over aiohttp's limit": 1}
    assert "  requests   4 ok, 2 failed" in stdout.getvalue()


async def test_answers_over_the_cap_are_failed_requests_not_read_whole() -> None:
    """A 300 MB non-streamed answer took 1.59 GB; a 300 MB /v1/models 1.2 GB. Bodies are read up to
    apis.MAX_BODY (as the probe's), whether the server declares the length or not."""
    big = b'{"text": "' + b"x" * (apis.MAX_BODY + 10) + b'"}'
    declared = b"HTTP/1.1 200 OK\r\nContent-Length: 300000000\r\nConnection: close\r\n\r\n" + b"x" * 4096
    undeclared = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + big
    for raw, says in [(declared, "a body of 300,000,000 bytes, over the 1,048,576-byte cap"),
                      (undeclared, "a body over the 1,048,576-byte cap")]:
        # close: the run's reads of /metrics and the server info get the same answer, and end at the close
        # (open, each waited out its timeout: 6 s of the in-process layer).
        async for url in raw_server(raw, close=True):
            s = await _run(url, n=2, stream=False, timeout=2)
            async with aiohttp.ClientSession() as session:
                assert await benchclient.discover_model(session, url, 5) is None
        assert s.errors() == {f"bad response: {says}": 2}, s.errors()
    # At the cap exactly, an answer is read (and judged) as usual.
    fits = json.dumps({"text": " OK", "meta_info": {"completion_tokens": 1}}).encode()
    fits = fits[:-1] + b" " * (apis.MAX_BODY - len(fits)) + b"}"
    async for url in raw_server(_http("200 OK", fits)):
        s = await _run(url, n=1, stream=False)
    assert s.ok == 1, s.errors()
    assert f"over {apis.MAX_BODY >> 20} MiB" in benchclient.build_parser().format_help().replace("\n", " ")


# --- kept-alive connections the server closes, empty answers, llama.cpp's draft counts (in-process) ----------


class KeptAlive:
    """A loopback HTTP/1.1 server that keeps connections open between requests, as real servers do; `answer`
    gives (head lines, body, then close?) per request. Counts the requests it read whole, per connection."""

    def __init__(self, answer: Any, *, server: str = "test") -> None:
        self.answer, self.server = answer, server
        self.requests: list[tuple[str, bytes]] = []  # (request line, body) of every request read whole
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(Exception):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                body = await reader.readexactly(int(length.group(1)) if length else 0)
                line = head.split(b"\r\n", 1)[0].decode()
                self.requests.append((line, body))
                answer = self.answer(line, json.loads(body) if body else None)
                if answer is None:  # hang up on the request just read, without a word
                    break
                extra, payload, close = answer
                writer.write(b"HTTP/1.1 200 OK\r\nServer: " + self.server.encode() + b"\r\n" + extra
                             + b"Content-Length: %d\r\nKeep-Alive: timeout=5, max=100\r\n\r\n" % len(payload)
                             + payload)
                await writer.drain()
                if close:  # as llama-server after a streamed answer: no "Connection: close", just gone
                    break
        writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


def _llama_answer(api: str, stream: bool, drafts: tuple[int, int] | None, text: str = "ab") -> bytes:
    """An answer shaped as llama-server's (tools/server/server-task.cpp), with `timings` carrying the draft
    counts only when it drafted. An empty text is its answer when the first token was end-of-sequence: it
    counts that token, completion_tokens 1."""
    timings: dict[str, Any] = {"predicted_n": len(text) or 1}
    if drafts:
        timings.update(draft_n=drafts[0], draft_n_accepted=drafts[1])
    usage = {"completion_tokens": len(text) or 1, "prompt_tokens": 3}
    if not stream:
        choice = {"message": {"role": "assistant", "content": text}} if api == "openai-chat" else {"text": text}
        return json.dumps({"choices": [{**choice, "finish_reason": "stop"}], "usage": usage,
                           "timings": timings}).encode()
    if api == "openai-chat":
        events = [{"choices": [{"delta": {"role": "assistant", "content": None}}]},
                  *({"choices": [{"delta": {"content": c}}]} for c in text),
                  {"choices": [{"delta": {}, "finish_reason": "stop"}]},
                  {"choices": [], "usage": usage, "timings": timings}]
    else:
        events = [*({"choices": [{"text": c}]} for c in text),
                  {"choices": [{"text": "", "finish_reason": "stop"}], "usage": usage, "timings": timings}]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


METRICS = ("llamacpp:spec_decode_num_draft_tokens_total {}\nllamacpp:spec_decode_num_accepted_tokens_total {}\n"
           "llamacpp:spec_decode_num_drafts_total {}\n")


@pytest.mark.parametrize(("api", "stream"), [(a, s) for a in ("openai-completions", "openai-chat")
                                             for s in (False, True)])
async def test_llamacpp_draft_counts_give_draft_acceptance_and_its_metrics_the_accept_length(
        api: str, stream: bool) -> None:
    """Per answer timings.draft_n / draft_n_accepted (absent when nothing was drafted): draft acceptance is
    Σ accepted / Σ drafted over the run; /metrics' llamacpp:spec_decode counters give the accept length."""
    scrapes = 0

    def answer(line: str, body: Any) -> tuple[bytes, bytes, bool]:
        nonlocal scrapes
        if line.startswith("GET /metrics"):
            scrapes += 1
            counts = (100, 50, 40) if scrapes == 1 else (100 + 24, 50 + 15, 40 + 6)
            return b"Content-Type: text/plain\r\n", METRICS.format(*counts).encode(), False
        if line.startswith("GET"):
            return b"", b'{"data": [{"id": "m"}]}', False
        n = int(body["messages"][0]["content"] if api == "openai-chat" else body["prompt"])
        drafts = {0: (8, 8), 1: None, 2: (16, 7)}[n % 3]
        return b"", _llama_answer(api, stream, drafts), False

    async with KeptAlive(answer, server="llama.cpp") as url:
        s = await benchclient.run(benchclient.ServerOptions(url, api, "m"),
                                  benchclient.LoadOptions(3, 1, 2, 10, [Prompt(text=str(n)) for n in range(3)],
                                                          stream=stream),
                                  benchclient.Progress(3, io.StringIO()))
    assert (s.ok, s.failed) == (3, 0), s.errors()
    assert s.drafts() == (24, 15) and s.draft_acceptance() == 15 / 24
    assert s.accept() == (1 + 15 / 6, "/metrics llamacpp:spec_decode counters")
    assert s.metrics_counts == {"drafts": 6, "accepted": 15, "draft_tokens": 24}
    text = benchclient.format_summary(s, {}, stream=stream)
    assert "  accept     length 3.50 (/metrics llamacpp:spec_decode counters), draft acceptance 0.625 " \
           "(15/24 drafted tokens)" in text, text


async def test_without_drafts_there_is_no_draft_acceptance_and_without_metrics_no_accept_length() -> None:
    """No `timings.draft_n` anywhere: null, not 0. Drafts but no /metrics (llama-server without --metrics
    answers 501): the acceptance, and the accept length says why it is missing."""
    for drafts, says in [(None, "length - (no speculative decoding seen)"),
                         ((4, 4), "length - (no /metrics spec_decode counters), draft acceptance 1.000 "
                                  "(8/8 drafted tokens)")]:
        def answer(line: str, body: Any, d: Any = drafts) -> tuple[bytes, bytes, bool]:
            return b"", _llama_answer("openai-completions", False, d), False

        async with KeptAlive(answer) as url:
            s = await _run(url, n=2, stream=False, api="openai-completions")
        assert s.ok == 2 and s.metrics_accept is None
        assert s.draft_acceptance() == (None if drafts is None else 1.0)
        assert says in benchclient.format_summary(s, {}), benchclient.format_summary(s, {})


@pytest.mark.parametrize(("api", "stream"), [(a, s) for a in apis.NAMES for s in (False, True)])
async def test_an_answer_without_a_token_is_ok_and_counted_empty(api: str, stream: bool) -> None:
    """The model's first token was end-of-sequence: a valid answer with no output. It was a failed request
    ("the stream carried no generated token") where the server counted no token; it is ok, with 0 tokens
    (also where llama.cpp counts that end-of-sequence token as 1), and the report counts it."""
    empty_sglang = json.dumps({"text": "", "output_ids": [], "meta_info": {"completion_tokens": 0}}).encode()

    def answer(line: str, body: Any) -> tuple[bytes, bytes, bool]:
        if api == "sglang":
            payload = b"data: " + empty_sglang + b"\n\ndata: [DONE]\n\n" if stream else empty_sglang
        else:
            payload = _llama_answer(api, stream, None, text="")
        return b"", payload, False

    async with KeptAlive(answer) as url:
        s = await _run(url, n=4, stream=stream, api=api)
    assert (s.ok, s.failed, s.empty, s.tokens) == (4, 0, 4, 0), s.errors()
    assert "  requests   4 ok, 0 failed, 4 empty" in benchclient.format_summary(s, {}, stream=stream)
    if api == "openai-chat" and not stream:  # a reasoning model's thinking, no content yet: output, not empty
        thinking = json.dumps({"choices": [{"message": {"content": None, "reasoning_content": "Hm"}}],
                               "usage": {"completion_tokens": 1}}).encode()
        async with KeptAlive(lambda line, body: (b"", thinking, False)) as url:
            s = await _run(url, n=2, stream=False, api=api)
        assert (s.ok, s.empty, s.tokens) == (2, 0, 2), s.errors()
    # A stream with no event at all before [DONE] is no answer.
    async with KeptAlive(lambda line, body: (b"", b"data: [DONE]\n\n", False)) as url:
        s = await _run(url, n=1, stream=True, api=api)
    assert s.errors() == {"bad response: the stream carried no event before data: [DONE]": 1}


@pytest.mark.parametrize("server", ["llama.cpp", "other"])
async def test_a_server_that_closes_kept_alive_connections_loses_no_request(server: str) -> None:
    """llama-server closes the connection after every streamed answer although it offered keep-alive: the
    next request, sent into that connection before its FIN was read, was lost ("Can not write request
    body"). Now a pooled connection the server closed is not used, and once the server has shown that it
    closes them (or names itself llama.cpp), each request goes on a new connection: nothing fails."""
    def answer(line: str, body: Any) -> tuple[bytes, bytes, bool]:
        return b"", _llama_answer("openai-chat", True, None), line.startswith("POST")

    for concurrency in (1, 2, 8):
        ka = KeptAlive(answer, server=server)
        async with ka as url:
            s = await benchclient.run(benchclient.ServerOptions(url, "openai-chat", "m"),
                                      benchclient.LoadOptions(40, concurrency, 2, 10, [Prompt(text="hi")]),
                                      benchclient.Progress(40, io.StringIO()))
        assert (s.ok, s.failed) == (40, 0), s.errors()
        assert len([r for r in ka.requests if r[0].startswith("POST")]) == 40  # each sent once
        if server == "llama.cpp":
            assert s.new_connections == "llama.cpp closes the connection after a streamed answer"
        else:
            assert s.new_connections == "the server closed a kept-alive connection"
            assert s.stale_connections + s.retried >= 1


class ClosingPool(benchclient.PoolConnector):
    """Hands out every pooled connection as closing: the state in which asyncio has read the server's FIN
    (and closed the transport) but the request is not yet written, which a real server hits only by chance."""

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn: Any = await super().connect(req, traces, timeout)
        if getattr(conn.protocol, "_handed_out", False):
            conn.transport.is_closing = lambda: True
        else:
            conn.protocol._handed_out = True
        return conn


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_refused_on_a_closed_pooled_connection_is_sent_once_more_on_a_new_one(
        stream: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp refuses to write into a connection that is closing ("Cannot write to closing transport"):
    nothing of the request reached the server. It is sent once more on a new connection and counted as one
    request, retried; the server sees each request once."""
    monkeypatch.setattr(benchrun, "PoolConnector", ClosingPool)
    monkeypatch.setattr(benchrun, "why_not_reuse", lambda *a: "")  # keep using the pool: every time
    ka = KeptAlive(lambda line, body: (b"", _llama_answer("openai-completions", stream, None), False))
    async with ka as url:
        s = await _run(url, n=6, stream=stream, api="openai-completions")
    assert (s.ok, s.failed) == (6, 0), s.errors()
    assert s.retried >= 1 and len([r for r in ka.requests if r[0].startswith("POST")]) == 6, (s.retried, ka.requests)
    assert f", {s.retried} retried" in benchclient.format_summary(s, {}, stream=stream)
    args = benchclient.build_parser().parse_args([])
    args.prompt_source = "--prompt"
    res = benchclient.result_json(args, s, {})
    assert res["retried"] == s.retried and res["failed"] == 0


async def test_a_request_lost_after_it_was_sent_still_counts_failed() -> None:
    """The server read the second request on a kept-alive connection and hung up without an answer: that
    request may have been processed, so it is not sent again. It counts failed."""
    posts = 0

    def answer(line: str, body: Any) -> tuple[bytes, bytes, bool] | None:
        nonlocal posts
        posts += line.startswith("POST")
        return None if posts == 2 else (b"", _llama_answer("openai-completions", False, None), False)

    async with KeptAlive(answer) as url:
        s = await benchclient.run(benchclient.ServerOptions(url, "openai-completions", "m"),
                                  benchclient.LoadOptions(3, 1, 1, 10, [Prompt(text="hi")], stream=False),
                                  benchclient.Progress(3, io.StringIO()))
    assert (s.ok, s.failed, s.retried) == (2, 1, 0), s.errors()
    assert list(s.errors()) == ["ServerDisconnectedError: Server disconnected"]


def test_only_aiohttps_own_refusal_to_write_is_a_request_never_sent() -> None:
    refused = ConnectionResetError("Cannot write to closing transport")
    body = aiohttp.ClientOSError(None, "Can not write request body for http://x/v1/completions")
    body.__cause__ = refused
    head = aiohttp.ClientOSError(*refused.args)
    head.__cause__ = refused
    assert benchclient.refused_write(body) and benchclient.refused_write(head)
    reset = aiohttp.ClientOSError(104, "Connection reset by peer")
    reset.__cause__ = ConnectionResetError(104, "Connection reset by peer")  # the kernel's: bytes may have gone
    assert not benchclient.refused_write(reset)
    assert not benchclient.refused_write(aiohttp.ServerDisconnectedError())
    # On a new connection the same refusal is the server's doing, not a stale pool: a failure.
    assert benchclient.failed(body, 0.0, 5, {"reused": False}).error.startswith("ClientOSError")
    with pytest.raises(benchclient.StaleConnection):
        benchclient.failed(body, 0.0, 5, {"reused": True})


# --- the flags that mirror a target's settings ------------------------------------------------------


def _settings(*argv: str) -> tuple[Any, str, Any]:
    args = benchclient.build_parser().parse_args(list(argv))
    key, ctx = benchclient.settings(args, {})
    return args, key, ctx


def test_the_target_flags_are_the_config_settings_table() -> None:
    """Each flag is a target setting: its name, help and choices come from config's table."""
    from genready import config

    helps = benchclient.build_parser().format_help().replace("\n", " ")
    table = {s.name: s for s in config.TARGET_SETTINGS}
    for name in benchclient.MIRRORED:
        assert benchclient.flag(name) in helps, name
        assert " ".join(table[name].help.split()) in " ".join(helps.split()), name
    assert "{sglang,openai-completions,openai-chat}" in helps and "--no-tls-verify" in helps
    args, key, ctx = _settings()
    assert (args.url, args.api, args.model, key, ctx) == (benchclient.DEFAULT_URL, "sglang", None, "", None)


def test_target_flags_are_checked_as_the_config_checks_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "key").write_text("# the key for llama-server\nsk-2\n")
    args, key, _ = _settings("--url", "http://127.0.0.1:8000/", "--api", "openai-chat", "--api-key-file", "key")
    assert (args.url, key) == ("http://127.0.0.1:8000", "sk-2")  # relative to the cwd; comments skipped, as the daemon
    for argv, words in [
        (["--ca-file", "/etc/ssl/ca.pem"], "--ca-file: expected an https:// url for TLS settings"),
        (["--url", "http://u:p@127.0.0.1:1"], "--url: expected a URL without user:password@"),
        (["--url", "https://127.0.0.1:1", "--ca-file", "missing.pem"], "--ca-file: expected a readable PEM bundle"),
        (["--api-key-file", "nokey"], "--api-key-file: expected a readable file holding the API key"),
    ]:
        with pytest.raises(SystemExit, match=re.escape(words)) as e:
            _settings(*argv)
        assert "u:p" not in str(e.value)


def test_flags_go_on_top_of_the_config_target(tmp_path: Path) -> None:
    path = tmp_path / "genready.toml"
    path.write_text('[targets.uds]\nunit = "u.service"\nurl = "unix:/run/llm.sock"\npath_prefix = "/sg"\n'
                    '[targets.tls]\nunit = "t.service"\nurl = "https://127.0.0.1:9"\napi = "openai-chat"\n'
                    'model = "m"\ntls_verify = false\n')
    with pytest.raises(SystemExit, match="unix socket"):
        _settings("--config", str(path), "--target", "uds")
    args, _, ctx = _settings("--config", str(path), "--target", "uds", "--url", "http://127.0.0.1:30000")
    assert (args.url, args.api, ctx) == ("http://127.0.0.1:30000", "sglang", None)  # its prefix went with its url
    args, _, ctx = _settings("--config", str(path), "--target", "tls")
    assert (args.url, args.api, args.model) == ("https://127.0.0.1:9", "openai-chat", "m")
    assert ctx is not None and not ctx.check_hostname  # tls_verify = false, from the config
    args, _, ctx = _settings("--config", str(path), "--target", "tls", "--tls-verify", "--model", "n")
    assert ctx is not None and ctx.check_hostname and args.model == "n"  # the flags win
    args, _, ctx = _settings("--config", str(path), "--target", "tls", "--url", "http://127.0.0.1:9")
    assert ctx is None  # a plain http:// address: the target's TLS settings went with its url


@pytest.mark.system  # the PKI is made with the openssl CLI
async def test_mutual_tls_from_the_flags_alone(tmp_path: Path) -> None:
    """--ca-file, --client-cert-file and --client-key-file reach a server that wants a client certificate."""
    import ssl

    from aiohttp import web

    from tests.pki import make_pki

    async def generate(request: web.Request) -> web.Response:
        return web.json_response({"text": "ok", "meta_info": {"completion_tokens": 1}})

    pki = make_pki(tmp_path / "pki")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    ctx.load_verify_locations(str(pki.ca))
    ctx.verify_mode = ssl.CERT_REQUIRED
    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx).start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    out = tmp_path / "out.jsonl"
    try:
        base = ["--url", url, "-n", "2", "-c", "1", "--prompt", "hi", "--no-stream", "--ca-file", str(pki.ca)]
        rc = await asyncio.to_thread(benchclient.main, [*base, "--output", str(out)])
        assert rc == 1  # no client certificate: the handshake fails, and the requests are counted failed
        rc = await asyncio.to_thread(benchclient.main, [*base, "--client-cert-file", str(pki.client_cert),
                                                        "--client-key-file", str(pki.client_key), "--output", str(out)])
        assert rc == 0
    finally:
        await runner.cleanup()
    first, second = (json.loads(ln) for ln in out.read_text().splitlines())
    assert (first["ok"], second["ok"]) == (0, 2), (first, second)


# --- hostile numbers (issue 41 #8, #14): a count that cannot be a float, NaN from the server --------------


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


async def _cli(url: str, out: Path, *argv: str) -> tuple[int, str]:
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stdout", stdout)
        rc = await asyncio.to_thread(benchclient.main, ["--url", url, "-n", "3", "-c", "1", "--prompt", "hi",
                                                        "--output", str(out), *argv])
    return rc, stdout.getvalue()


HUGE = "1" + "0" * 400  # 10**400: an integer JSON allows and no float holds


@pytest.mark.parametrize(("api", "stream", "answer"), [
    ("openai-completions", False, '{"choices": [{"text": " OK"}], "usage": {"completion_tokens": HUGE}}'),
    ("sglang", True, '{"text": " OK", "meta_info": {"completion_tokens": HUGE}}'),
    ("sglang", False, '{"text": " OK", "meta_info": {"completion_tokens": 2, "spec_verify_ct": HUGE}}'),
    ("openai-completions", False,
     '{"choices": [{"text": " OK"}], "usage": {"completion_tokens": 2}, "timings": {"draft_n": HUGE, '
     '"draft_n_accepted": 1}}'),
])
async def test_a_count_that_cannot_be_a_float_fails_its_request_and_the_report_is_still_written(
        tmp_path: Path, api: str, stream: bool, answer: str) -> None:
    """completion_tokens (or spec_verify_ct, draft_n) = 10**400 raised OverflowError and lost the run: no summary,
    no --output line. It is a malformed answer: that request fails and is counted."""
    good = ('{"choices": [{"text": " OK"}], "usage": {"completion_tokens": 1}}' if api != "sglang" else
            '{"text": " OK", "meta_info": {"completion_tokens": 1}}')
    posts = 0

    def reply(line: str, body: Any) -> tuple[bytes, bytes, bool]:
        nonlocal posts
        if not line.startswith("POST"):
            return b"", b'{"data": [{"id": "m"}]}' if "models" in line else b"", False
        posts += 1
        doc = answer.replace("HUGE", HUGE) if posts == 2 else good
        return (b"Content-Type: text/event-stream\r\n", b"data: " + doc.encode() + b"\n\ndata: [DONE]\n\n", False) \
            if stream else (b"", doc.encode(), False)

    out = tmp_path / "r.jsonl"
    async with KeptAlive(reply) as url:
        rc, text = await _cli(url, out, "--api", api, "--stream" if stream else "--no-stream")
    res = _strict(out.read_text())
    assert rc == 1 and (res["ok"], res["failed"]) == (2, 1), res
    assert all(e.startswith("bad response") for e in res["errors"]), res["errors"]
    assert "  requests   2 ok, 1 failed (1x bad response" in text, text


@pytest.mark.parametrize("average", ["NaN", "Infinity", HUGE])
async def test_sglangs_average_that_is_no_number_is_null_and_the_output_line_is_strict_json(
        tmp_path: Path, average: str) -> None:
    """avg_spec_accept_length: NaN in SGLang's server info reached --output as a bare NaN, which jq, JavaScript
    and Go refuse; 10**400 raised OverflowError. Neither is a figure: null."""
    def reply(line: str, body: Any) -> tuple[bytes, bytes, bool]:
        if "server_info" in line:
            return b"", b'{"internal_states": [{"avg_spec_accept_length": %s}]}' % average.encode(), False
        if line.startswith("GET"):
            return b"", b"", False
        return b"", b'{"text": " OK", "meta_info": {"completion_tokens": 1}}', False

    out = tmp_path / "r.jsonl"
    async with KeptAlive(reply) as url:
        rc, text = await _cli(url, out, "--api", "sglang", "--no-stream")
    res = _strict(out.read_text())
    assert rc == 0 and res["ok"] == 3 and res["server_accept_length"] is None, res
    assert "NaN" not in text and "nan" not in text.lower().replace("nanos", ""), text


def test_the_output_line_goes_through_durable_and_a_torn_line_is_ended_first(tmp_path: Path) -> None:
    """--output appends through store/durable (synced, one write): a file that ends inside a line (a crash
    mid-write) gets that line ended, so the new result is a line of its own; NaN never reaches the file."""
    out = tmp_path / "r.jsonl"
    out.write_text('{"torn": ')
    benchclient.write_result(out, {"a": 1.0, "b": float("nan"), "c": [float("inf")]})
    lines = out.read_text().splitlines()
    assert lines[0] == '{"torn": ' and _strict(lines[1]) == {"a": 1.0, "b": None, "c": [None]}, lines
