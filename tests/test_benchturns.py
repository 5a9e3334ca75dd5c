"""Multi-turn questions (issue 37 §2): MT-bench's and Spec-Bench's later `turns` are sent, each after the answer
before it, with the earlier turns and the server's own answers (verbatim), each turn a request of its own.

What the server was sent is seen from outside the client: a recording proxy on loopback in front of the real
server (the simulator, llama.cpp's llama-server) keeps every request's body and answer's bytes as they passed.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from genready.apis import APIS
from genready.tools import benchclient, benchrun, prompts
from genready.tools.prompts import Prompt
from genready_dev import gguf_models, realservers
from genready_dev.harness import PY, LlamaServer, Simulator, env_without_notify
from tests import ci

GENERATE = ("/generate", "/v1/completions", "/v1/chat/completions")


class Exchange:
    """One generation request that passed the proxy: its body, the answer's bytes, when each passed."""

    def __init__(self, body: dict[str, Any], sent: float) -> None:
        self.body, self.sent, self.answer, self.done = body, sent, b"", 0.0

    def text(self) -> str:
        """The answer's generated text as the server sent it (a stream's pieces, joined)."""
        if not self.answer.lstrip().startswith(b"data:"):
            doc = json.loads(self.answer)
            return str(doc["text"] if "text" in doc else doc["choices"][0]["message"]["content"])
        pieces = []
        for line in self.answer.splitlines():
            data = line[5:].strip() if line.startswith(b"data:") else b""
            if not data or data == b"[DONE]":
                continue
            event = json.loads(data)
            if "choices" not in event:  # SGLang's own stream: the whole text so far in every event
                pieces = [event.get("text", "")]
                continue
            for c in event["choices"][:1]:
                pieces.append((c.get("delta") or {}).get("content") or c.get("text") or "")
        return "".join(pieces)


@asynccontextmanager
async def recording_proxy(upstream: str) -> AsyncIterator[tuple[str, list[Exchange]]]:
    """A loopback HTTP proxy to `upstream` that passes every request and answer through unchanged (a stream as
    it comes) and keeps the generation requests' Exchanges in order of arrival; yields (its URL, them)."""
    seen: list[Exchange] = []
    client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))

    async def forward(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        ex = Exchange(json.loads(raw), time.monotonic()) if request.path in GENERATE else None
        if ex is not None:
            seen.append(ex)
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with client.request(request.method, upstream + request.path_qs, data=raw or None, headers=headers,
                                  allow_redirects=False) as r:
            out = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get("Content-Type", "")})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                if ex is not None:
                    ex.answer += chunk
                await out.write(chunk)
            await out.write_eof()
        if ex is not None:
            ex.done = time.monotonic()
        return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()
        await client.close()


async def run_through(url: str, api: str, questions: list[Prompt], *, n: int, c: int, stream: bool,
                      max_tokens: int = 12) -> tuple[benchclient.Summary, list[Exchange]]:
    async with recording_proxy(url) as (proxy, seen):
        server = benchclient.ServerOptions(proxy, api)
        load = benchclient.LoadOptions(n, c, max_tokens, 30.0, questions, stream=stream, seed=3)
        summary = await benchclient.run(server, load, benchclient.Progress(n, io.StringIO()))
    return summary, seen


def conversations(seen: list[Exchange], questions: list[Prompt]) -> dict[str, list[Exchange]]:
    """The exchanges by the question whose first turn they start with."""
    out: dict[str, list[Exchange]] = {}
    for ex in seen:
        first = str(ex.body["messages"][0]["content"] if "messages" in ex.body else
                    ex.body.get("text", ex.body.get("prompt")))
        q = next(q for q in questions if first.startswith(q.text))
        out.setdefault(q.text, []).append(ex)
    return out


QUESTIONS = [Prompt(f"Question {i}: write about topic {i}.", category=cat, later_turns=(f"Now shorten answer {i}.",))
             for i, cat in enumerate(["writing", "coding", "writing"])]


# --- in process ---------------------------------------------------------------------------------------------


def test_a_later_turn_carries_the_earlier_turns_and_answers_in_order() -> None:
    q = Prompt(messages=(("system", "Be brief."), ("user", "One?")), category="qa", later_turns=("Two?", "Three?"))
    assert q.turns() == 3 and q.turn([]) is q
    third = q.turn(["first answer", " second answer\n"])
    assert third.messages == (("system", "Be brief."), ("user", "One?"), ("assistant", "first answer"),
                              ("user", "Two?"), ("assistant", " second answer\n"), ("user", "Three?"))
    assert third.category == "qa" and third.later_turns == ()
    # a text API (SGLang's /generate, /v1/completions) gets the contents one after another, as any chat prompt
    assert Prompt("One?", later_turns=("Two?",)).turn(["A."]).as_text() == "One?\n\nA.\n\nTwo?"
    with pytest.raises(ValueError, match="turn 3 of a 2-turn prompt"):
        Prompt("One?", later_turns=("Two?",)).turn(["a", "b"])


@pytest.mark.parametrize("api", ["sglang", "openai-completions", "openai-chat"])
def test_the_answer_text_is_read_as_each_api_sends_it(api: str) -> None:
    a = APIS[api]
    whole = {"sglang": {"text": " Hi there"}, "openai-completions": {"choices": [{"text": " Hi there"}]},
             "openai-chat": {"choices": [{"message": {"content": " Hi there", "reasoning_content": "hmm"}}]}}[api]
    assert benchrun.answer_text(a, whole) == " Hi there"
    by_api: dict[str, list[dict[str, Any]]] = {
        "sglang": [{"text": " Hi"}, {"text": " Hi there"}],  # SGLang repeats the whole text so far
        "openai-completions": [{"choices": [{"text": " Hi"}]}, {"choices": [{"text": " there"}]},
                               {"choices": [], "usage": {"completion_tokens": 2}}],
        "openai-chat": [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                        {"choices": [{"delta": {"reasoning": "hmm"}}]}, {"choices": [{"delta": {"content": " Hi"}}]},
                        {"choices": [{"delta": {"content": " there"}}]},
                        {"choices": [{"delta": {}, "finish_reason": "length"}]}]}
    events = by_api[api]
    text = ""
    for e in events:
        text = benchrun.streamed_text(a, e, text)
    assert text == " Hi there"


@asynccontextmanager
async def numbered_server(fail: set[int]) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """SGLang's /generate on loopback, in process: the n-th generation (from 0) answers `answer n`, or 500 when
    n is in `fail`; every body is kept."""
    bodies: list[dict[str, Any]] = []

    async def generate(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        n = len(bodies) - 1
        if n in fail:
            return web.json_response({"error": "boom"}, status=500)
        return web.json_response({"text": f"answer {n}", "meta_info": {"completion_tokens": 2}})

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", bodies
    finally:
        await runner.cleanup()


async def test_n_counts_requests_and_a_failed_turn_ends_its_conversation() -> None:
    """-n 5 at concurrency 1 over 2-turn questions: conversation 0's first turn fails (there is no answer to send
    back: its second turn is never sent, and -n's request goes to the next conversation); 1 and 2 are whole."""
    async with numbered_server(fail={0}) as (url, bodies):
        load = benchclient.LoadOptions(5, 1, 4, 10.0, QUESTIONS, stream=False, seed=1)
        s = await benchclient.run(benchclient.ServerOptions(url, "sglang"), load,
                                  benchclient.Progress(5, io.StringIO()))
    assert (len(s.outcomes), s.ok, s.failed) == (5, 4, 1)
    assert [o.turn for o in s.outcomes] == [0, 0, 1, 0, 1] and (s.conversations, s.conversations_cut) == (3, 1)
    assert s.later_turns() == 2 and all(o.answer == "" for o in s.outcomes)  # no answer held once used
    order = prompts.schedule(QUESTIONS, 4, random.Random(1))
    assert bodies[0]["text"] == order[0].text and bodies[1]["text"] == order[1].text
    assert bodies[2]["text"] == f"{order[1].text}\n\nanswer 1\n\n{order[1].later_turns[0]}"
    assert bodies[4]["text"] == f"{order[2].text}\n\nanswer 3\n\n{order[2].later_turns[0]}"
    assert s.categories() is not None and sum(c["requests"] for c in (s.categories() or {}).values()) == 5
    assert s.turns_line() == ["  turns      3 conversations, 2 later turns sent with the earlier answers, "
                              "1 conversations cut short"]


async def test_the_history_sent_back_is_bounded_as_an_answer_is() -> None:
    """Answers of 600,000 characters (each under the 1 MiB an answer may be): the second turn carries the first,
    the third would carry 1.2 MB of answers and is not sent."""
    bodies: list[dict[str, Any]] = []

    async def big(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response({"text": "x" * 600_000, "meta_info": {"completion_tokens": 1}})

    app = web.Application(client_max_size=4 << 20)
    app.router.add_post("/generate", big)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        q = [Prompt("One?", later_turns=("Two?", "Three?"))]
        load = benchclient.LoadOptions(3, 1, 4, 10.0, q, stream=False)
        s = await benchclient.run(benchclient.ServerOptions(f"http://127.0.0.1:{runner.addresses[0][1]}", "sglang"),
                                  load, benchclient.Progress(3, io.StringIO()))
    finally:
        await runner.cleanup()
    assert [len(b["text"]) for b in bodies] == [4, 4 + 2 + 600_000 + 2 + 4, 4]  # then a new conversation
    assert (s.ok, s.conversations, s.conversations_cut) == (3, 2, 2)


async def test_no_turn_is_sent_after_the_duration() -> None:
    """--duration 0.05 s and answers that take 0.5 s: the first turn goes at the start, its answer comes after the
    end, so the second turn is never sent and the conversation is cut."""
    bodies: list[dict[str, Any]] = []

    async def slow(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        await asyncio.sleep(0.5)  # the server's own pace, which the test is about: not a wait for the client
        return web.json_response({"text": "late", "meta_info": {"completion_tokens": 1}})

    app = web.Application()
    app.router.add_post("/generate", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        load = benchclient.LoadOptions(100, 1, 4, 10.0, QUESTIONS[:1], stream=False, duration=0.05)
        s = await benchclient.run(benchclient.ServerOptions(f"http://127.0.0.1:{runner.addresses[0][1]}", "sglang"),
                                  load, benchclient.Progress(100, io.StringIO(), 0.05))
    finally:
        await runner.cleanup()
    assert len(bodies) == 1 and (s.requests, s.ok, s.conversations, s.conversations_cut) == (1, 1, 1, 1)
    assert s.finished_after_duration() == 1


async def test_single_turn_prompts_are_sent_as_before() -> None:
    """No later turns: one request per prompt, in schedule order, no turns line."""
    single = [Prompt(f"p{i}", category="x") for i in range(3)]
    async with numbered_server(fail=set()) as (url, bodies):
        load = benchclient.LoadOptions(7, 2, 4, 10.0, single, stream=False, seed=5)
        s = await benchclient.run(benchclient.ServerOptions(url, "sglang"), load,
                                  benchclient.Progress(7, io.StringIO()))
    assert s.ok == 7 and s.conversations == 7 and s.later_turns() == 0 and s.turns_line() == []
    want = [p.text for p in prompts.schedule(single, 7, random.Random(5))]
    assert sorted(b["text"] for b in bodies) == sorted(want)


# --- against real servers ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    s = Simulator(tmp_path_factory.mktemp("sim"), "--token-latency", "0.002")
    yield s
    s.stop()


@pytest.mark.system
@pytest.mark.parametrize(("api", "stream"), [("openai-chat", True), ("openai-chat", False), ("sglang", True)])
def test_each_later_turn_goes_after_its_answer_with_that_answer_verbatim(sim: Simulator, api: str,
                                                                        stream: bool) -> None:
    s, seen = asyncio.run(run_through(sim.url, api, QUESTIONS, n=6, c=2, stream=stream))
    assert (s.ok, s.failed, len(seen)) == (6, 0, 6) and s.conversations == 3 and s.conversations_cut == 0
    assert s.peak_concurrency <= 2 and sorted(o.turn for o in s.outcomes) == [0, 0, 0, 1, 1, 1]
    by = conversations(seen, QUESTIONS)
    assert len(by) == 3
    for q in QUESTIONS:
        first, second = by[q.text]
        answer = first.text()
        assert answer.strip()
        assert second.sent >= first.done  # sent once the answer before it had arrived
        if api == "openai-chat":
            assert second.body["messages"] == [{"role": "user", "content": q.text},
                                               {"role": "assistant", "content": answer},
                                               {"role": "user", "content": q.later_turns[0]}]
        else:
            assert second.body["text"] == f"{q.text}\n\n{answer}\n\n{q.later_turns[0]}"
    if stream:  # each turn is a request with its own figures
        assert all(o.ttft is not None for o in s.outcomes)
    got = s.categories()
    assert got is not None and (got["writing"]["requests"], got["coding"]["requests"]) == (4, 2)


@pytest.mark.system
def test_the_cli_counts_turns_and_judges_load_on_first_turns(sim: Simulator, tmp_path: Path) -> None:
    """MT-bench's question file as it is, through the CLI: -n counts requests; the JSON line says the turns."""
    data = tmp_path / "question.jsonl"
    data.write_text("".join(json.dumps({"question_id": 81 + i, "category": q.category,
                                        "turns": [q.text, *q.later_turns]}) + "\n" for i, q in enumerate(QUESTIONS)))
    out = tmp_path / "r.jsonl"
    env = {k: v for k, v in env_without_notify().items() if not k.startswith("GENREADY_")}
    r = subprocess.run([PY, "-m", "genready.benchclient", "--url", sim.url, "--api", "openai-chat", "--dataset",
                        str(data), "-n", "5", "-c", "1", "--max-tokens", "8", "--request-rate", "50", "--seed", "2",
                        "--output", str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert (res["requests"], res["ok"], res["conversations"], res["later_turns"], res["conversations_cut"]) == \
        (5, 5, 3, 2, 1)
    assert "  turns      3 conversations, 2 later turns sent with the earlier answers, 1 conversations cut short" \
        in r.stdout
    assert res["scheduled_rate"] is not None and res["achieved_rate"] is not None


@pytest.mark.system
@pytest.mark.real_servers
def test_llama_server_gets_its_own_first_answer_back_verbatim(tmp_path: Path) -> None:
    """llama.cpp's llama-server, streamed chat: the second request of a conversation carries the first answer's
    text as the server streamed it, byte for byte (through its chat template, which the server applies)."""
    for what in ("llama-server", "gguf"):
        ci.require(realservers.missing(what), "a test of llama-server's multi-turn answers")
    binary = realservers.llama_server()
    model = gguf_models.ensure("tiny")["tiny"]
    server = LlamaServer(tmp_path, binary, "-m", str(model), "-c", "2048", "-np", "1", "-t", "1", "-tb", "1")
    try:
        q = [Prompt("Once upon a time, in a land far away,", category="writing", later_turns=("And then?",))]
        s, seen = asyncio.run(run_through(server.url, "openai-chat", q, n=2, c=1, stream=True, max_tokens=16))
    finally:
        server.stop()
    assert (s.ok, len(seen)) == (2, 2), s.errors()
    first, second = seen
    answer = first.text()
    assert answer, first.answer[:300]
    assert second.body["messages"][1] == {"role": "assistant", "content": answer}
    assert second.body["messages"][2] == {"role": "user", "content": "And then?"} and second.sent >= first.done
