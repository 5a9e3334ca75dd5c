"""probe.py against real HTTP servers on loopback: every failure class, for every API."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from genready import apis, compat
from genready.config import TargetConfig
from genready.probe.probe import Prober
from genready.vocab import Failure, HealthRoute, ProbeResult

APIS = list(apis.NAMES)
OPENAI = ["openai-completions", "openai-chat"]
ROUTE = {name: api.path for name, api in apis.APIS.items()}
ME = os.getpid()  # the in-test servers run in this process


def target(url: str, api: str = "sglang", **kw: Any) -> TargetConfig:
    values: dict[str, Any] = dict(
        name="t", unit="llm.service", url=url, api=api, model="", prompt="Say OK.", max_tokens=1,
        probe_timeout=5.0, backoff_initial=0.25, backoff_max=2.0, warmup=1, load_timeout=1800.0,
        recheck_interval=0.0, failure_threshold=3, verify_owner=True, owner="process", container="",
        container_socket="", gate_startup=True)
    values.update(kw)
    return TargetConfig(**values)


async def probe_once(t: TargetConfig, main_pid: int = ME, **kw: Any) -> ProbeResult:
    prober = Prober(t, **kw)
    try:
        return await prober.probe(main_pid)
    finally:
        await prober.close()


def ok_doc(path: str, model: str) -> dict[str, Any]:
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    if path.endswith("/generate"):
        return {"text": " OK", "output_ids": [11],
                "meta_info": {"id": "a", "finish_reason": {"type": "length"}, "prompt_tokens": 3,
                              "completion_tokens": 1, "e2e_latency": 0.01}}
    if path.endswith("/v1/completions"):
        return {"id": "c", "object": "text_completion", "model": model,
                "choices": [{"index": 0, "text": " OK", "finish_reason": "length"}], "usage": usage}
    return {"id": "c", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "length"}],
            "usage": usage}


def zero_doc(path: str) -> dict[str, Any]:
    if path.endswith("/generate"):
        return {"text": "", "output_ids": [], "meta_info": {"completion_tokens": 0}}
    if path.endswith("/v1/completions"):
        return {"choices": [{"index": 0, "text": ""}], "usage": {"completion_tokens": 0}}
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}}],
            "usage": {"completion_tokens": 0}}


@dataclass
class Sim:
    """An in-process LLM server whose behaviour each test sets."""

    mode: str = "ok"
    models_mode: str = "ok"
    model: str = "m1"
    seen: list[tuple[str, Any]] = field(default_factory=list)  # (path, JSON body or None)
    client_ports: list[int] = field(default_factory=list)
    url: str = ""
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends "hang" handlers at teardown
    key: str = ""  # if set, generations without `Authorization: Bearer KEY` get 401
    auth: list[str | None] = field(default_factory=list)  # the Authorization header of each request
    status_body: str = '{"detail": "refused"}'  # the body for mode "status:NNN"
    health: int = 200  # the status GET /health answers
    close_after_health: bool = False  # answer /health with Connection: close

    def app(self, prefix: str = "") -> web.Application:
        app = web.Application()
        for route in ("/generate", "/v1/completions", "/v1/chat/completions"):
            app.router.add_post(prefix + route, self.generate)
        app.router.add_get(prefix + "/v1/models", self.models)
        app.router.add_get(prefix + "/health", self.health_route)
        return app

    async def health_route(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, None))
        self.auth.append(request.headers.get("Authorization"))
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.client_ports.append(peer[1] if peer else -1)
        headers = {"Connection": "close"} if self.close_after_health else {}
        return web.Response(status=self.health, headers=headers)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((request.path, body))
        self.auth.append(request.headers.get("Authorization"))
        if self.key and request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.client_ports.append(peer[1] if peer else -1)
        if not request.path.endswith("/generate") and body.get("model") != self.model:
            return web.json_response({"object": "error", "message": "model not found"}, status=404)
        mode = self.mode
        if mode.startswith("status:"):
            return web.Response(status=int(mode[7:]), text=self.status_body)
        if mode == "ok":
            return web.json_response(ok_doc(request.path, self.model))
        if mode == "chunked":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            raw = json.dumps(ok_doc(request.path, self.model)).encode()
            for i in range(0, len(raw), 7):  # many small chunks
                await resp.write(raw[i:i + 7])
            await resp.write_eof()
            return resp
        if mode == "503":
            return web.Response(status=503, text="Loading model, please wait")
        if mode == "not_json":
            return web.Response(text="<html><body>OK</body></html>", content_type="text/html")
        if mode == "list":
            return web.json_response(["OK"])
        if mode == "wrong_shape":
            return web.json_response({"result": "OK"})
        if mode == "zero_tokens":
            return web.json_response(zero_doc(request.path))
        if mode == "error_200":
            return web.json_response({"error": {"message": "CUDA out of memory"}})
        if mode == "over_cap":
            return web.json_response({**ok_doc(request.path, self.model), "pad": "x" * 8192})
        raise AssertionError(f"unknown mode {mode}")

    async def models(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, None))
        self.auth.append(request.headers.get("Authorization"))
        if self.models_mode == "401":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if self.models_mode == "two":
            return web.json_response({"object": "list", "data": [{"id": "m1"}, {"id": "lora-a"}]})
        if self.models_mode == "ok":
            return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})
        if self.models_mode.startswith("router:"):  # llama.cpp's router: every model with its state
            return web.json_response({"object": "list", "data": [
                {"id": self.model, "object": "model", "owned_by": "llamacpp",
                 "status": {"value": self.models_mode[7:], "args": []}}]})
        if self.models_mode == "404":
            return web.json_response({"error": {"message": "File Not Found"}}, status=404)
        if self.models_mode == "503":
            return web.Response(status=503, text="starting")
        if self.models_mode == "empty":
            return web.json_response({"object": "list", "data": []})
        if self.models_mode == "garbage":
            return web.Response(text="{not json")
        if self.models_mode == "hang":
            await self.release.wait()
            return web.Response(status=503, text="too late")
        raise AssertionError(f"unknown models_mode {self.models_mode}")

    def generations(self) -> list[tuple[str, Any]]:
        return [s for s in self.seen if not s[0].endswith(("/v1/models", "/health"))]


async def start_sim(host: str = "127.0.0.1") -> tuple[Sim, web.AppRunner]:
    sim = Sim()
    runner = web.AppRunner(sim.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    sim.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    return sim, runner


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    s, runner = await start_sim()
    yield s
    s.release.set()
    await runner.cleanup()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Raw asyncio servers for what aiohttp will not do: hang, garbage, endless bodies."""
    servers: list[asyncio.Server] = []
    tasks: set[asyncio.Task[None]] = set()

    async def start(handler: Handler) -> str:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await handler(reader, writer)
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(run, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in servers:
        s.close()
        await s.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request read (its body skipped); returns its head."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port nothing listens on: bound (so nobody else takes it) but not listening."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


# --- ok -----------------------------------------------------------------------------------------

EXPECTED_REQUEST = {
    "sglang": {"text": "Say OK.", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
    "openai-completions": {"model": "m1", "prompt": "Say OK.", "max_tokens": 1, "temperature": 0},
    "openai-chat": {"model": "m1", "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1,
                    "temperature": 0},
}


@pytest.mark.parametrize("api", APIS)
async def test_ok(sim: Sim, api: str) -> None:
    r = await probe_once(target(sim.url, api))
    assert r.ok and r.failure is None, r
    assert r.served_by_pid == ME and r.tokens == 1
    assert f"pid {ME} (main)" in r.detail
    assert 0 < r.seconds < 5
    assert sim.generations() == [(ROUTE[api], EXPECTED_REQUEST[api])]
    assert [p for p, _ in sim.seen].count("/v1/models") == (1 if api in OPENAI else 0)


@pytest.mark.parametrize("api", APIS)
async def test_ok_chunked_answer(sim: Sim, api: str) -> None:
    sim.mode = "chunked"
    r = await probe_once(target(sim.url, api))
    assert r.ok, r
    assert r.served_by_pid == ME


@pytest.mark.parametrize("api", OPENAI)
async def test_a_configured_model_must_be_listed_once(sim: Sim, api: str) -> None:
    prober = Prober(target(sim.url, api, model="m1"))
    try:
        first, second = await prober.probe(ME), await prober.probe(ME)
    finally:
        await prober.close()
    assert first.ok and second.ok, (first, second)
    assert 'model "m1" (set by model; listed by the server)' in first.detail
    # The list is read once; each probe asks /health then generates, on one connection.
    assert [p for p, _ in sim.seen] == ["/v1/models", "/health", ROUTE[api], "/health", ROUTE[api]]
    assert sim.client_ports[0] == sim.client_ports[1] != sim.client_ports[2] == sim.client_ports[3]


async def test_ok_over_ipv6() -> None:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 is not available here")
    s6, runner = await start_sim("::1")
    try:
        r = await probe_once(target(s6.url, "sglang"))
        assert r.ok and r.served_by_pid == ME, r
    finally:
        await runner.cleanup()


async def test_localhost_tries_each_address(sim: Sim) -> None:
    # localhost may resolve to ::1 first; the sim listens on 127.0.0.1 only.
    r = await probe_once(target(sim.url.replace("127.0.0.1", "localhost"), "sglang"))
    assert r.ok and r.served_by_pid == ME, r


async def test_url_path_prefix_is_kept(raw: Callable[[Handler], Awaitable[str]]) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n")[0])
        body = json.dumps(ok_doc("/generate", "")).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await reader.read()  # keep the connection until the client closes it

    url = await raw(handler)
    r = await probe_once(target(url + "/llm/", "sglang", health_path=""))
    assert r.ok, r
    assert seen == [b"POST /llm/generate HTTP/1.1"]


async def test_each_probe_uses_a_fresh_connection(sim: Sim) -> None:
    prober = Prober(target(sim.url, "sglang"))
    try:
        results = [await prober.probe(ME) for _ in range(3)]
    finally:
        await prober.close()
    assert all(r.ok for r in results), results
    assert len(set(sim.client_ports)) == 3


# --- refused ------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
async def test_refused(closed_port: int, api: str) -> None:
    r = await probe_once(target(f"http://127.0.0.1:{closed_port}", api, model="m1"))
    assert r.failure is Failure.REFUSED and not r.ok, r
    assert "refused" in r.detail.lower()
    assert r.served_by_pid is None


@pytest.mark.parametrize("api", OPENAI)
async def test_refused_during_discovery(closed_port: int, api: str) -> None:
    r = await probe_once(target(f"http://127.0.0.1:{closed_port}", api))
    assert r.failure is Failure.REFUSED, r
    assert r.detail.startswith("model discovery")


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_closed_or_reset_without_answer_is_refused(raw: Callable[[Handler], Awaitable[str]], how: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if how == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    url = await raw(handler)
    r = await probe_once(target(url, "sglang", health_path=""))
    assert r.failure is Failure.REFUSED, r


# --- timeout ------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
async def test_timeout_accepts_but_never_answers(raw: Callable[[Handler], Awaitable[str]], api: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (await read_request(reader)).startswith(b"GET /v1/models"):
            body = b'{"data": [{"id": "m1"}]}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            return
        await asyncio.Event().wait()

    url = await raw(handler)
    r = await probe_once(target(url, api, probe_timeout=0.3, health_path=""))
    assert r.failure is Failure.TIMEOUT, r
    assert 0.3 <= r.seconds < 2.0
    assert "waiting for the answer" in r.detail
    assert r.served_by_pid == ME  # who held the hanging connection is still reported


async def test_cancelled_probe_closes_its_connection(raw: Callable[[Handler], Awaitable[str]]) -> None:
    """The gate cancels a probe whose instance is gone; its connection must not stay open."""
    got_request, saw_eof = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        got_request.set()
        if await reader.read(1) == b"":  # the client closed its side
            saw_eof.set()

    url = await raw(handler)
    prober = Prober(target(url, probe_timeout=30, health_path=""))
    try:
        task = asyncio.create_task(prober.probe(ME))
        await compat.wait_for(got_request.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await compat.wait_for(saw_eof.wait(), 5)
    finally:
        await prober.close()


async def test_timeout_never_accepted() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # the kernel completes handshakes into the backlog; nobody accept()s
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        r = await probe_once(target(url, "sglang", probe_timeout=0.3))
    finally:
        listener.close()
    assert r.failure is Failure.TIMEOUT, r
    assert "not accepted yet" in r.detail


@pytest.mark.parametrize("api", OPENAI)
async def test_timeout_during_discovery_counts_against_the_probe(sim: Sim, api: str) -> None:
    sim.models_mode = "hang"
    r = await probe_once(target(sim.url, api, probe_timeout=0.3))
    assert r.failure is Failure.TIMEOUT, r
    assert "discovering the model" in r.detail
    assert sim.generations() == []


# --- http_status --------------------------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
async def test_http_503(sim: Sim, api: str) -> None:
    sim.mode = "503"
    r = await probe_once(target(sim.url, api))
    assert r.failure is Failure.HTTP_STATUS, r
    assert "HTTP 503" in r.detail and "Loading model" in r.detail
    assert r.served_by_pid == ME


@pytest.mark.parametrize("api", OPENAI)
async def test_unknown_model_is_rejected(sim: Sim, api: str) -> None:
    r = await probe_once(target(sim.url, api, model="nope"))
    assert r.failure is Failure.REJECTED, r
    assert "does not list model = 'nope'; it lists 1: m1" in r.detail and "set model" in r.detail
    assert sim.generations() == []


# --- bad_response -------------------------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(("mode", "says"), [
    ("not_json", "not JSON"), ("list", "expected a JSON object"), ("wrong_shape", "no "),
    ("zero_tokens", "0 generated tokens"), ("error_200", "reported an error"), ("over_cap", "cap"),
])
async def test_bad_response(sim: Sim, api: str, mode: str, says: str) -> None:
    sim.mode = mode
    r = await probe_once(target(sim.url, api), max_body=4096)
    assert r.failure is Failure.BAD_RESPONSE, r
    assert says in r.detail
    assert r.tokens == 0


async def test_endless_body_stops_at_the_cap(raw: Callable[[Handler], Awaitable[str]]) -> None:
    sent = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:  # until the client goes away
            writer.write(b"1000\r\n" + b"x" * 0x1000 + b"\r\n")
            sent += 0x1000
            await writer.drain()

    url = await raw(handler)
    r = await probe_once(target(url, "sglang", probe_timeout=5.0, health_path=""), max_body=64 * 1024)
    assert r.failure is Failure.BAD_RESPONSE, r  # not a timeout: we stopped reading
    assert "cap" in r.detail and r.seconds < 2.0


async def test_declared_length_over_the_cap_is_not_read(raw: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n{")
        await asyncio.Event().wait()  # never sends the rest: a reader that waited would time out

    url = await raw(handler)
    r = await probe_once(target(url, "sglang", probe_timeout=2.0, health_path=""), max_body=1 << 20)
    assert r.failure is Failure.BAD_RESPONSE, r
    assert "1000000000 bytes" in r.detail


@pytest.mark.parametrize("answer", [b"hello there\r\n", b"HTTP/1.1 abc\r\n\r\n", b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n"])
async def test_garbage_instead_of_http(raw: Callable[[Handler], Awaitable[str]], answer: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await asyncio.Event().wait()  # and then hang: still a bad response, not a timeout

    url = await raw(handler)
    r = await probe_once(target(url, "sglang", probe_timeout=2.0, health_path=""))
    assert r.failure is Failure.BAD_RESPONSE, r


# --- model discovery ----------------------------------------------------------------------------

@pytest.mark.parametrize("api", OPENAI)
@pytest.mark.parametrize(("models_mode", "failure"), [
    ("503", Failure.HTTP_STATUS), ("empty", Failure.BAD_RESPONSE), ("garbage", Failure.BAD_RESPONSE),
])
async def test_discovery_failures(sim: Sim, api: str, models_mode: str, failure: Failure) -> None:
    sim.models_mode = models_mode
    r = await probe_once(target(sim.url, api))
    assert r.failure is failure, r
    assert r.detail.startswith("model discovery")
    assert sim.generations() == []  # discovery alone never counts


@pytest.mark.parametrize("api", OPENAI)
async def test_rediscovery_after_a_failure(sim: Sim, api: str) -> None:
    prober = Prober(target(sim.url, api))
    try:
        assert (await prober.probe(ME)).ok
        assert (await prober.probe(ME)).ok
        assert [p for p, _ in sim.seen].count("/v1/models") == 1  # cached while it works
        sim.model = "m2"  # the server was replaced by one serving another model
        r = await prober.probe(ME)
        assert r.failure is Failure.REJECTED, r
        r = await prober.probe(ME)
        assert r.ok, r
        assert sim.generations()[-1][1]["model"] == "m2"
    finally:
        await prober.close()


# --- foreign_owner ------------------------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
@pytest.mark.system
async def test_foreign_owner(sim: Sim, api: str, unrelated_pid: int) -> None:
    r = await probe_once(target(sim.url, api), main_pid=unrelated_pid)
    assert r.failure is Failure.FOREIGN_OWNER and not r.ok, r
    assert r.served_by_pid == ME
    assert f"pid {ME} is not main pid {unrelated_pid}" in r.detail
    assert len(sim.generations()) == 1  # it did generate; it just was not the unit's process


@pytest.mark.system
async def test_foreign_owner_outranks_the_failure_it_served(sim: Sim, unrelated_pid: int) -> None:
    sim.mode = "503"
    r = await probe_once(target(sim.url, "sglang"), main_pid=unrelated_pid)
    assert r.failure is Failure.FOREIGN_OWNER, r
    assert "HTTP 503" in r.detail and r.served_by_pid == ME


@pytest.mark.system
async def test_a_repeated_5xx_from_a_proven_server_skips_the_owner_scan(sim: Sim, unrelated_pid: int) -> None:
    # While loading, the same 503 comes several times a second: its owner is proven once per main
    # pid; a new status, a 200 or another main pid is checked again (a 200 always is).
    sim.mode = "503"
    prober = Prober(target(sim.url, "sglang"))
    try:
        first, repeat = await prober.probe(ME), await prober.probe(ME)
        assert first.served_by_pid == ME and first.status == 503, first
        assert repeat.failure is Failure.HTTP_STATUS and repeat.served_by_pid is None, repeat
        other = await prober.probe(unrelated_pid)  # another instance: proven anew, and it is not the unit's
        assert other.failure is Failure.FOREIGN_OWNER, other
        assert (await prober.probe(unrelated_pid)).failure is Failure.FOREIGN_OWNER  # never skipped: not proven
        sim.mode = "ok"
        ok = await prober.probe(ME)
        assert ok.ok and ok.served_by_pid == ME, ok
        sim.mode = "503"
        assert (await prober.probe(ME)).served_by_pid == ME  # after a success: proven anew
    finally:
        await prober.close()


@pytest.mark.system
async def test_owner_not_checked_when_disabled(sim: Sim, unrelated_pid: int) -> None:
    r = await probe_once(target(sim.url, "sglang", verify_owner=False), main_pid=unrelated_pid)
    assert r.ok and r.served_by_pid is None, r


async def test_remote_host_cannot_be_owner_checked() -> None:
    # 203.0.113.0/24 is TEST-NET-3: never an address of this machine. No connection is attempted.
    r = await probe_once(target("http://203.0.113.7:30000", "sglang", probe_timeout=2.0))
    assert r.failure is Failure.FOREIGN_OWNER, r
    assert "not an address of this machine" in r.detail and r.seconds < 1.0


async def test_server_that_closes_cannot_be_proven(raw: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = json.dumps(ok_doc("/generate", "")).encode()
        # No Content-Length: the body ends when the server closes, so its socket is gone before
        # the client has the answer. A good answer, but no proof of who gave it.
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()

    url = await raw(handler)
    r = await probe_once(target(url, "sglang", health_path=""))
    assert r.failure is Failure.FOREIGN_OWNER, r
    assert r.served_by_pid is None and r.tokens == 1
    assert "owner not proven" in r.detail and "keep-alive" in r.detail


async def test_a_closed_prober_refuses_to_probe(sim: Sim) -> None:
    prober = Prober(target(sim.url, "sglang"))
    await prober.close()
    with pytest.raises(RuntimeError):
        await prober.probe(ME)


# --- rejected: the server is up and refuses the probe ---------------------------------------------

@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 413, 422])
async def test_client_errors_are_rejected(sim: Sim, status: int) -> None:
    sim.mode = f"status:{status}"
    r = await probe_once(target(sim.url, "sglang"))
    assert r.failure is Failure.REJECTED, r
    assert f"HTTP {status}" in r.detail and "refused" in r.detail  # the server's answer, excerpted
    assert r.served_by_pid == ME


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
async def test_errors_the_server_may_get_over_stay_http_status(sim: Sim, status: int) -> None:
    sim.mode = f"status:{status}"
    r = await probe_once(target(sim.url, "sglang"))
    assert r.failure is Failure.HTTP_STATUS, r


@pytest.mark.parametrize("api", APIS)
async def test_401_without_a_key_says_set_api_key_file(sim: Sim, api: str) -> None:
    sim.key = "sk-right"
    r = await probe_once(target(sim.url, api, model="m1"))
    assert r.failure is Failure.REJECTED, r
    assert "HTTP 401" in r.detail and "Unauthorized" in r.detail and "set api_key_file" in r.detail


async def test_a_wrong_key_says_the_key_was_refused(sim: Sim) -> None:
    sim.key = "sk-right"
    r = await probe_once(target(sim.url, api_key="sk-wrong"))
    assert r.failure is Failure.REJECTED, r
    assert "refused the API key" in r.detail and "sk-wrong" not in r.detail


@pytest.mark.parametrize("api", OPENAI)
async def test_the_key_goes_with_discovery_and_generation(sim: Sim, api: str) -> None:
    sim.key = "sk-right"
    r = await probe_once(target(sim.url, api, api_key="sk-right"))
    assert r.ok, r
    # GET /v1/models, GET /health (SGLang, vLLM and llama.cpp need no key there: it does no harm), the generation
    assert sim.auth == ["Bearer sk-right"] * 3


async def test_no_key_no_header(sim: Sim) -> None:
    assert (await probe_once(target(sim.url))).ok
    assert sim.auth == [None, None]


async def test_chat_without_template_says_use_completions(sim: Sim) -> None:
    sim.mode, sim.status_body = "status:400", json.dumps({"object": "error", "message": (
        "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
        "template if the tokenizer does not define one."), "type": "BadRequestError", "code": 400})
    r = await probe_once(target(sim.url, "openai-chat"))
    assert r.failure is Failure.REJECTED, r
    assert 'use api = "openai-completions"' in r.detail


@pytest.mark.parametrize("api", OPENAI)
async def test_several_models_the_first_is_probed_and_said_so(sim: Sim, api: str) -> None:
    sim.models_mode = "two"  # vLLM --served-model-name m1 lora-a, or a LoRA adapter: listed after the base
    r = await probe_once(target(sim.url, api))
    assert r.ok, r
    assert 'model "m1" (first of 2 listed: m1, lora-a' in r.detail
    assert [body["model"] for _, body in sim.generations()] == ["m1"]


@pytest.mark.parametrize("api", OPENAI)
async def test_a_pinned_second_model_is_probed(sim: Sim, api: str) -> None:
    sim.models_mode, sim.model = "two", "lora-a"  # the server accepts only lora-a
    r = await probe_once(target(sim.url, api, model="lora-a"))
    assert r.ok, r
    assert [body["model"] for _, body in sim.generations()] == ["lora-a"]


async def test_discovery_401_is_rejected(sim: Sim) -> None:
    sim.models_mode = "401"  # vLLM guards /v1/models too
    r = await probe_once(target(sim.url, "openai-chat"))
    assert r.failure is Failure.REJECTED, r
    assert r.detail.startswith("model discovery") and "set api_key_file" in r.detail


# --- unix sockets -------------------------------------------------------------------------------

@pytest.fixture
async def unix_sim(tmp_path: Any) -> AsyncIterator[tuple[Sim, str]]:
    sim = Sim()
    runner = web.AppRunner(sim.app("/api"), access_log=None)
    await runner.setup()
    path = str(tmp_path / "llm.sock")
    await web.UnixSite(runner, path).start()
    yield sim, path
    await runner.cleanup()


@pytest.mark.parametrize("api", ["sglang", "openai-completions"])
async def test_unix_socket_with_owner_proof(unix_sim: tuple[Sim, str], api: str) -> None:
    sim, path = unix_sim
    r = await probe_once(target(f"unix:{path}", api, path_prefix="/api"))
    assert r.ok, r
    assert sim.generations()
    assert r.served_by_pid == ME and f"pid {ME} (main)" in r.detail


@pytest.mark.system
async def test_unix_socket_of_a_foreign_process(unix_sim: tuple[Sim, str], unrelated_pid: int) -> None:
    _, path = unix_sim
    r = await probe_once(target(f"unix:{path}", path_prefix="/api"), main_pid=unrelated_pid)
    assert r.failure is Failure.FOREIGN_OWNER, r
    assert f"pid {ME} is not main pid {unrelated_pid}" in r.detail


async def test_unix_socket_nobody_listens(tmp_path: Any) -> None:
    r = await probe_once(target(f"unix:{tmp_path}/none.sock"))
    assert r.failure is Failure.REFUSED, r
    assert "No such file" in r.detail


# --- TLS ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.pki import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


async def start_tls_sim(cert: Any, key: Any, client_ca: Any = None) -> tuple[Sim, web.AppRunner]:
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        ctx.load_verify_locations(str(client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    sim = Sim()
    runner = web.AppRunner(sim.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    sim.url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    return sim, runner


@pytest.mark.system  # the PKI is made with the openssl CLI
async def test_tls_with_ca_file(pki: Any) -> None:
    sim, runner = await start_tls_sim(pki.server_cert, pki.server_key)
    try:
        r = await probe_once(target(sim.url, ca_file=str(pki.ca)))
        assert r.ok and r.served_by_pid == ME, r
        r = await probe_once(target(sim.url))  # the system store does not know our CA
        assert r.failure is Failure.TLS, r
        assert "certificate verify failed: unable to get local issuer certificate" in r.detail
        assert "set ca_file" in r.detail
    finally:
        await runner.cleanup()


@pytest.mark.system  # the PKI is made with the openssl CLI
async def test_self_signed_is_tls_not_refused(pki: Any) -> None:
    sim, runner = await start_tls_sim(pki.self_signed_cert, pki.self_signed_key)
    try:
        r = await probe_once(target(sim.url))
        assert r.failure is Failure.TLS, r
        assert "certificate verify failed: self-signed certificate" in r.detail
        r = await probe_once(target(sim.url, tls_verify=False))
        assert r.ok, r
    finally:
        await runner.cleanup()


@pytest.mark.system  # the PKI is made with the openssl CLI
async def test_mutual_tls(pki: Any) -> None:
    sim, runner = await start_tls_sim(pki.server_cert, pki.server_key, client_ca=pki.ca)
    try:
        r = await probe_once(target(sim.url, ca_file=str(pki.ca), client_cert_file=str(pki.client_cert),
                                    client_key_file=str(pki.client_key)))
        assert r.ok, r
        r = await probe_once(target(sim.url, ca_file=str(pki.ca)))
        assert r.failure is Failure.TLS, r
        assert "client certificate" in r.detail
    finally:
        await runner.cleanup()


async def test_https_to_a_plain_http_server_is_tls(sim: Sim) -> None:
    r = await probe_once(target(sim.url.replace("http://", "https://")))
    assert r.failure is Failure.TLS, r
    assert "does not speak TLS" in r.detail


# --- the server's own health (health_path) ------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
async def test_health_503_is_unhealthy_and_nothing_is_generated(sim: Sim, api: str) -> None:
    sim.health = 503  # SGLang while its warmup runs, or draining: /generate would still answer 200
    r = await probe_once(target(sim.url, api))
    assert r.failure is Failure.UNHEALTHY and r.status == 503, r
    assert "GET /health: HTTP 503" in r.detail and "not ready" in r.detail
    assert sim.generations() == []
    assert r.served_by_pid == ME  # the owner of the refusal is still named


@pytest.mark.parametrize("status", [404, 405])
async def test_no_health_route_the_generation_alone_decides(sim: Sim, status: int) -> None:
    """llama-cpp-python's server has no /health: a 404 (or 405) is no refusal. That start rests on
    the generation alone; the route is not asked again until the next start."""
    sim.health = status
    prober = Prober(target(sim.url))
    try:
        assert prober.health is None  # not asked yet
        r = await prober.probe(ME, invocation_id="a")
        assert r.ok and r.served_by_pid == ME, r
        assert "no /health route (404/405): the generation alone" in r.detail
        assert prober.health is HealthRoute.ABSENT
        assert await prober.probe(ME, invocation_id="a")
        assert [p for p, _ in sim.seen] == ["/health", "/generate", "/generate"]
        # A new start asks again: an upgraded server may have the route now.
        sim.health = 200
        r = await prober.probe(ME, invocation_id="b")
        assert r.ok and "/health 200 first" in r.detail, r
        assert prober.health is HealthRoute.OK
        assert [p for p, _ in sim.seen][3:] == ["/health", "/generate"]
    finally:
        await prober.close()


async def test_no_health_route_is_logged_once(sim: Sim, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="genready.probe.probe")
    sim.health = 404
    prober = Prober(target(sim.url))
    try:
        for inv in ("a", "a", "b", "c"):
            assert (await prober.probe(ME, invocation_id=inv)).ok
    finally:
        await prober.close()
    said = [r.getMessage() for r in caplog.records if "no health route" in r.getMessage()]
    assert len(said) == 1 and "GET /health answered 404" in said[0], said


async def test_no_health_route_and_no_generation_route_is_rejected_saying_both(sim: Sim) -> None:
    sim.health = 404
    r = await probe_once(target(sim.url + "/nope", "openai-completions", model="m1"))
    assert r.failure is Failure.REJECTED and r.status == 404, r
    assert "POST /v1/completions: HTTP 404" in r.detail and "the url's path" in r.detail
    assert "GET /nope/health answered 404/405 as well" in r.detail


@pytest.mark.parametrize(("status", "failure"), [(503, Failure.UNHEALTHY), (500, Failure.UNHEALTHY),
                                                 (401, Failure.REJECTED), (403, Failure.REJECTED)])
async def test_a_health_route_that_answers_otherwise_is_not_absent(sim: Sim, status: int, failure: Failure) -> None:
    sim.health = status
    prober = Prober(target(sim.url))
    try:
        r = await prober.probe(ME)
        assert r.failure is failure and r.status == status, r
        assert prober.health is HealthRoute.UNHEALTHY
        assert sim.generations() == []
    finally:
        await prober.close()


async def test_health_off_is_said(sim: Sim) -> None:
    prober = Prober(target(sim.url, health_path=""))
    try:
        assert prober.health is HealthRoute.OFF
        assert (await prober.probe(ME)).ok
        assert prober.health is HealthRoute.OFF
    finally:
        await prober.close()


async def test_health_path_off_sends_no_health_request(sim: Sim) -> None:
    sim.health = 503
    r = await probe_once(target(sim.url, health_path=""))
    assert r.ok, r
    assert [p for p, _ in sim.seen] == ["/generate"]


async def test_health_and_generation_share_one_connection(sim: Sim) -> None:
    r = await probe_once(target(sim.url))
    assert r.ok, r
    assert [p for p, _ in sim.seen] == ["/health", "/generate"]
    assert len(set(sim.client_ports)) == 1  # so the owner proof of the generation covers the health answer
    assert "/health 200 first" in r.detail


async def test_health_answered_with_close_cannot_be_proven(sim: Sim) -> None:
    sim.close_after_health = True
    r = await probe_once(target(sim.url))
    assert r.failure is Failure.FOREIGN_OWNER, r
    assert "one keep-alive connection" in r.detail
    assert sim.generations() == []


async def test_health_answered_with_close_reconnects_without_owner_proof(sim: Sim) -> None:
    sim.close_after_health = True
    r = await probe_once(target(sim.url, verify_owner=False))
    assert r.ok, r
    assert len(set(sim.client_ports)) == 2


async def test_health_401_says_the_key(sim: Sim) -> None:
    sim.health = 401  # a proxy in front that guards every path
    r = await probe_once(target(sim.url))
    assert r.failure is Failure.REJECTED, r
    assert "set api_key_file" in r.detail


async def test_the_key_goes_to_health_too(sim: Sim) -> None:
    r = await probe_once(target(sim.url, api_key="sk-1"))
    assert r.ok, r
    assert sim.auth == ["Bearer sk-1", "Bearer sk-1"]


# --- model lists like the servers' --------------------------------------------------------------

@pytest.mark.parametrize("api", OPENAI)
async def test_a_pinned_model_without_a_model_list_is_used(sim: Sim, api: str) -> None:
    sim.models_mode = "404"
    r = await probe_once(target(sim.url, api, model="m1"))
    assert r.ok, r
    assert "the server offers no model list" in r.detail


async def test_router_model_not_loaded_is_unhealthy(sim: Sim) -> None:
    # llama.cpp's router without --models-autoload (tools/server/server-models.cpp)
    sim.models_mode, sim.mode = "router:unloaded", "status:400"
    sim.status_body = json.dumps({"error": {"code": 400, "message": "model is not loaded",
                                            "type": "invalid_request_error"}})
    r = await probe_once(target(sim.url, "openai-chat"))
    assert r.failure is Failure.UNHEALTHY, r
    assert "model is not loaded" in r.detail


async def test_router_listing_the_model_as_loading_is_unhealthy_without_a_post(sim: Sim) -> None:
    sim.models_mode = "router:loading"
    r = await probe_once(target(sim.url, "openai-chat"))
    assert r.failure is Failure.UNHEALTHY, r
    assert "as 'loading'" in r.detail
    assert sim.generations() == []


async def test_a_post_held_while_the_router_loads_is_unhealthy_not_timeout(
        raw: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (await read_request(reader)).startswith(b"GET /v1/models"):
            body = b'{"data": [{"id": "m1", "status": {"value": "unloaded"}}]}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            return
        await asyncio.Event().wait()  # --models-autoload: the POST waits for the whole load

    url = await raw(handler)
    r = await probe_once(target(url, "openai-chat", probe_timeout=0.3, health_path=""))
    assert r.failure is Failure.UNHEALTHY, r
    assert "loads it on demand" in r.detail


# --- hints that fire, token ids -----------------------------------------------------------------

async def test_sglang_400_for_a_wrong_shape_says_wrong_api(sim: Sim) -> None:
    # SGLang turns FastAPI's 422 into 400 (http_server.py, validation_exception_handler)
    sim.mode, sim.status_body = "status:400", json.dumps({"object": "error", "message": (
        "1 validation error: {'type': 'missing', 'loc': ('body', 'model'), 'msg': 'Field required'}"),
        "type": "Bad Request", "param": None, "code": 400})
    r = await probe_once(target(sim.url, "openai-completions", model="m1"))
    assert r.failure is Failure.REJECTED, r
    assert "expects another request shape" in r.detail


async def test_sglang_400_without_a_tokenizer_says_prompt_ids(sim: Sim) -> None:
    sim.mode, sim.status_body = "status:400", json.dumps({"error": {"message": (
        "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. Please provide "
        "input_ids or re-initialize the engine with skip_tokenizer_init=False.")}})
    r = await probe_once(target(sim.url))
    assert r.failure is Failure.REJECTED, r
    assert "set prompt_ids" in r.detail


@pytest.mark.parametrize(("api", "key"), [("sglang", "input_ids"), ("openai-completions", "prompt")])
async def test_prompt_ids_are_sent_as_token_ids(sim: Sim, api: str, key: str) -> None:
    r = await probe_once(target(sim.url, api, prompt_ids=(9707, 11)))
    assert r.ok, r
    (_, body), = sim.generations()
    assert body[key] == [9707, 11] and "text" not in body
