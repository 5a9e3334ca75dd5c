"""`genready simulate` as real subprocesses on loopback ports: real HTTP, real signals, real sockets.

Every wait is a poll on a condition with a deadline (a log line, a port answering, an exit);
durations are asserted from the simulator's own `t=` log stamps where the process's view counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from genready_dev.harness import await_for, free_port

# Every test here runs the simulator as a real process.
pytestmark = pytest.mark.system

DEADLINE = 10.0  # generous: a deadline, not a duration; tests end as soon as the condition holds
SHORT = aiohttp.ClientTimeout(total=5)


class Sim:
    """One `genready simulate` process and its stderr lines, collected as they arrive."""

    def __init__(self, port: int, *flags: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "genready.cli", "simulate", "--port", str(port), *flags],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _find(self, event: str, nth: int) -> str | None:
        hits = [ln for ln in self.lines if event_of(ln) == event]
        return hits[nth] if len(hits) > nth else None

    def wait_log_sync(self, event: str, nth: int = 0, timeout: float = DEADLINE) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while (line := self._find(event, nth)) is None:
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    raise AssertionError(f"no {event!r} line (#{nth}) in:\n" + "\n".join(self.lines))
                self._cond.wait(left)
            return line

    async def wait_log(self, event: str, nth: int = 0, timeout: float = DEADLINE) -> str:
        return await asyncio.to_thread(self.wait_log_sync, event, nth, timeout)

    async def wait_exit(self, timeout: float = DEADLINE) -> int:
        rc = await asyncio.to_thread(self.proc.wait, timeout)
        await asyncio.to_thread(self.wait_eof)
        return rc

    def wait_eof(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._eof, DEADLINE)

    def log_text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(DEADLINE)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def event_of(line: str) -> str:
    parts = line.split()
    return parts[2] if len(parts) > 2 and parts[0].startswith("genready-sim[") else ""


def stamp(line: str) -> float:
    m = re.search(r" t=([0-9.]+) ", line)
    assert m, line
    return float(m.group(1))


@pytest.fixture
def start() -> Iterator[Any]:
    """Start simulators; every one still running at the end of the test is killed."""
    sims: list[Sim] = []

    def _start(*flags: str, port: int | None = None) -> Sim:
        sim = Sim(port if port is not None else free_port(), *flags)
        sims.append(sim)
        return sim

    yield _start
    for sim in sims:
        sim.kill()


@pytest.fixture(scope="module")
def ready_sim() -> Iterator[Sim]:
    """One ready simulator shared by the shape tests."""
    sim = Sim(free_port(), "--model", "shape-model")
    try:
        sim.wait_log_sync("ready")
        yield sim
    finally:
        sim.kill()


async def get(url: str, timeout: aiohttp.ClientTimeout = SHORT) -> tuple[int, str]:
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
        return r.status, await r.text()


async def post(url: str, body: Any, timeout: aiohttp.ClientTimeout = SHORT) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=timeout) as s, s.post(url, json=body) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


async def sse(url: str, body: Any) -> list[Any]:
    """The `data:` payloads of a stream, decoded; the final one must be [DONE]."""
    async with aiohttp.ClientSession(timeout=SHORT) as s, s.post(url, json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = await r.text()
    data = [ln[len("data: "):] for ln in raw.splitlines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]", raw
    assert "[DONE]" not in data[:-1]
    return [json.loads(d) for d in data[:-1]]


async def wait_status(url: str, want: int, body: Any = None) -> None:
    """Poll until the route answers `want` (connection errors count as not yet)."""
    async def answered() -> bool:
        try:
            status = (await post(url, body))[0] if body is not None else (await get(url))[0]
        except aiohttp.ClientConnectionError:
            return False
        return status == want
    await await_for(answered, DEADLINE, f"{url} to answer {want}")


NATIVE = {"text": "Say hello", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}
COMPLETION = {"model": "shape-model", "prompt": "Say hello", "max_tokens": 4, "temperature": 0}
CHAT = {"model": "shape-model", "messages": [{"role": "user", "content": "Say hello to me"}], "max_tokens": 3}


# -- shapes ---------------------------------------------------------------------------------------


async def test_models_and_model_info(ready_sim: Sim) -> None:
    status, text = await get(ready_sim.url + "/v1/models")
    assert status == 200
    models = json.loads(text)
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["shape-model"]
    status, text = await get(ready_sim.url + "/get_model_info")
    assert status == 200
    info = json.loads(text)
    assert info["model_path"] == "shape-model"
    assert info["is_generation"] is True


async def test_health_routes_answer_200_when_ready(ready_sim: Sim) -> None:
    assert (await get(ready_sim.url + "/health"))[0] == 200
    assert (await get(ready_sim.url + "/health_generate"))[0] == 200


async def test_native_generate(ready_sim: Sim) -> None:
    status, out = await post(ready_sim.url + "/generate", NATIVE)
    assert status == 200
    assert len(out["text"].split()) == 5  # one token per word
    assert len(out["output_ids"]) == 5
    assert all(isinstance(i, int) for i in out["output_ids"])
    meta = out["meta_info"]
    assert isinstance(meta["id"], str) and meta["id"]
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["prompt_tokens"] == 2
    assert meta["completion_tokens"] == 5
    assert isinstance(meta["e2e_latency"], float) and meta["e2e_latency"] >= 0
    # Deterministic filler: the same request gives the same text.
    assert (await post(ready_sim.url + "/generate", NATIVE))[1]["text"] == out["text"]


async def test_native_generate_defaults_and_zero_tokens(ready_sim: Sim) -> None:
    status, out = await post(ready_sim.url + "/generate", {"text": "hi"})
    assert status == 200
    assert out["meta_info"]["completion_tokens"] == 128  # SGLang's default max_new_tokens
    status, out = await post(ready_sim.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 0}})
    assert status == 200
    assert out["text"] == "" and out["meta_info"]["completion_tokens"] == 0


async def test_native_generate_stream(ready_sim: Sim) -> None:
    chunks = await sse(ready_sim.url + "/generate", {**NATIVE, "stream": True})
    assert len(chunks) == 5
    # SGLang's native stream carries the cumulative text.
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5]
    assert all(chunks[i + 1]["text"].startswith(chunks[i]["text"]) for i in range(4))
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * 4
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert len({c["meta_info"]["id"] for c in chunks}) == 1


async def test_completions(ready_sim: Sim) -> None:
    status, out = await post(ready_sim.url + "/v1/completions", COMPLETION)
    assert status == 200
    assert out["object"] == "text_completion"
    assert out["model"] == "shape-model"
    assert len(out["choices"][0]["text"].split()) == 4
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


async def test_completions_stream(ready_sim: Sim) -> None:
    body = {**COMPLETION, "stream": True, "stream_options": {"include_usage": True}}
    chunks = await sse(ready_sim.url + "/v1/completions", body)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert len("".join(texts).split()) == 4
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    # Identical to the non-streamed text.
    assert "".join(texts) == (await post(ready_sim.url + "/v1/completions", COMPLETION))[1]["choices"][0]["text"]


async def test_chat_completions(ready_sim: Sim) -> None:
    status, out = await post(ready_sim.url + "/v1/chat/completions", CHAT)
    assert status == 200
    assert out["object"] == "chat.completion"
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant"
    assert len(msg["content"].split()) == 3
    assert out["usage"]["completion_tokens"] == 3
    assert out["usage"]["prompt_tokens"] == 4


async def test_chat_completions_stream(ready_sim: Sim) -> None:
    chunks = await sse(ready_sim.url + "/v1/chat/completions", {**CHAT, "stream": True})
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant"
    content = "".join(d.get("content", "") for d in deltas)
    assert len(content.split()) == 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


BAD = [
    ("/generate", "not json"),
    ("/generate", [1, 2]),
    ("/generate", {}),
    ("/generate", {"text": 5}),
    ("/generate", {"text": "x", "sampling_params": "fast"}),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "3"}}),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 10**9}}),
    ("/generate", {"text": "x", "sampling_params": {"temperature": -0.5}}),
    ("/generate", {"text": "x", "stream": "yes"}),
    ("/v1/completions", {"model": "m"}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1.5}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}),
]


@pytest.mark.parametrize(("route", "body"), BAD, ids=[f"{r}:{json.dumps(b)}" for r, b in BAD])
async def test_bad_request_is_400(ready_sim: Sim, route: str, body: Any) -> None:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    async with aiohttp.ClientSession(timeout=SHORT) as s, s.post(ready_sim.url + route, data=data) as r:
        assert r.status == 400
        err = await r.json()
    message = err["error"]["message"] if route == "/generate" else err["message"]
    assert isinstance(message, str) and message


async def test_pid_never_in_responses_or_headers(ready_sim: Sim) -> None:
    # A standalone number equal to the PID; ids, timestamps and latencies embed digits
    # inside longer tokens, which this does not match.
    pid = re.compile(rf"(?<![\w.]){ready_sim.pid}(?![\w.])")
    requests: list[tuple[str, str, Any]] = [
        ("GET", "/v1/models", None), ("GET", "/get_model_info", None), ("GET", "/health", None),
        ("GET", "/health_generate", None), ("POST", "/generate", NATIVE),
        ("POST", "/generate", {**NATIVE, "stream": True}), ("POST", "/v1/completions", COMPLETION),
        ("POST", "/v1/completions", {**COMPLETION, "stream": True}), ("POST", "/v1/chat/completions", CHAT),
        ("POST", "/v1/chat/completions", {**CHAT, "stream": True}), ("POST", "/generate", {"bad": 1}),
        ("GET", "/no-such-route", None),
    ]
    async with aiohttp.ClientSession(timeout=SHORT) as s:
        for method, route, body in requests:
            async with s.request(method, ready_sim.url + route, json=body) as r:
                text = await r.text()
                headers = "\n".join(f"{k}: {v}" for k, v in r.headers.items())
            assert not pid.search(headers), (route, headers)
            assert not pid.search(text), (route, text)


# -- lifecycle and failure modes ------------------------------------------------------------------


async def test_late_bind_refuses_connections_while_loading(start: Any) -> None:
    sim: Sim = start("--load-seconds", "1.0")
    loading = await sim.wait_log("loading")
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", sim.port), timeout=2):
        pass
    assert sim.proc.poll() is None
    await wait_status(sim.url + "/generate", 200, NATIVE)
    bound, ready = await sim.wait_log("bound"), await sim.wait_log("ready")
    assert stamp(bound) - stamp(loading) >= 1.0
    assert stamp(ready) >= stamp(bound)


async def test_bind_early_serves_metadata_but_503_until_loaded(start: Any) -> None:
    sim: Sim = start("--load-seconds", "1.0", "--bind-early")
    await sim.wait_log("bound")
    assert (await get(sim.url + "/v1/models"))[0] == 200
    assert (await get(sim.url + "/get_model_info"))[0] == 200
    assert (await get(sim.url + "/health"))[0] == 503
    assert (await get(sim.url + "/health_generate"))[0] == 503
    assert (await post(sim.url + "/generate", NATIVE))[0] == 503
    assert (await post(sim.url + "/v1/completions", COMPLETION))[0] == 503
    assert (await post(sim.url + "/v1/chat/completions", CHAT))[0] == 503
    assert not any(event_of(ln) == "ready" for ln in sim.lines)
    await wait_status(sim.url + "/generate", 200, NATIVE)
    assert (await get(sim.url + "/health"))[0] == 200
    loading, ready = await sim.wait_log("loading"), await sim.wait_log("ready")
    assert stamp(ready) - stamp(loading) >= 1.0


async def test_linger_keeps_generating_after_sigterm_then_exits_0(start: Any) -> None:
    sim: Sim = start("--linger-seconds", "1.0")
    await sim.wait_log("ready")
    sim.proc.send_signal(signal.SIGTERM)
    first = await sim.wait_log("lingering")
    assert "signal=SIGTERM" in first
    assert (await post(sim.url + "/generate", NATIVE))[0] == 200
    assert (await post(sim.url + "/v1/chat/completions", CHAT))[0] == 200
    assert (await get(sim.url + "/health"))[0] == 503  # SGLang: 503 while shutting down
    # A second SIGTERM does not shorten the linger.
    sim.proc.send_signal(signal.SIGTERM)
    second = await sim.wait_log("lingering", nth=1)
    assert "repeated=yes" in second
    assert (await post(sim.url + "/generate", NATIVE))[0] == 200
    assert await sim.wait_exit() == 0
    exiting = await sim.wait_log("exiting")
    assert "code=0" in exiting
    assert stamp(exiting) - stamp(first) >= 1.0


async def test_sigint_is_like_sigterm(start: Any) -> None:
    sim: Sim = start("--linger-seconds", "0.3")
    await sim.wait_log("ready")
    sim.proc.send_signal(signal.SIGINT)
    assert "signal=SIGINT" in await sim.wait_log("lingering")
    assert (await post(sim.url + "/generate", NATIVE))[0] == 200
    assert await sim.wait_exit() == 0


async def test_sigterm_without_linger_exits_promptly(start: Any) -> None:
    sim: Sim = start()
    await sim.wait_log("ready")
    sim.proc.send_signal(signal.SIGTERM)
    assert await sim.wait_exit(timeout=3) == 0


async def test_crash_after_exits_nonzero(start: Any) -> None:
    sim: Sim = start("--crash-after", "0.3")
    ready = await sim.wait_log("ready")
    assert await sim.wait_exit() != 0
    crashing = await sim.wait_log("crashing")
    assert stamp(crashing) - stamp(ready) >= 0.3
    assert not any(event_of(ln) == "exiting" for ln in sim.lines)  # abrupt: no orderly exit
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", sim.port), timeout=2):
        pass


async def test_hang_after_accepts_but_never_answers(start: Any) -> None:
    sim: Sim = start("--hang-after", "0.3")
    await sim.wait_log("ready")
    assert (await get(sim.url + "/v1/models"))[0] == 200
    await sim.wait_log("hanging")
    with socket.create_connection(("127.0.0.1", sim.port), timeout=2):
        pass  # the port still accepts
    tight = aiohttp.ClientTimeout(total=0.5)
    with pytest.raises(asyncio.TimeoutError):
        await get(sim.url + "/v1/models", timeout=tight)
    with pytest.raises(asyncio.TimeoutError):
        await get(sim.url + "/health", timeout=tight)
    with pytest.raises(asyncio.TimeoutError):
        await post(sim.url + "/generate", NATIVE, timeout=tight)
    # A request left hanging does not keep a SIGTERM from ending the process, and it gets
    # no answer, only the connection closing.
    before = socket_inodes(sim.pid)
    with socket.create_connection(("127.0.0.1", sim.port), timeout=DEADLINE) as conn:
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: sim\r\n\r\n")
        await await_for(lambda: socket_inodes(sim.pid) - before, DEADLINE, "the server side to accept the connection",
                        interval=0.01)
        sim.proc.send_signal(signal.SIGTERM)
        assert await sim.wait_exit(timeout=5) == 0
        with contextlib.suppress(ConnectionResetError):  # closed or reset, never answered
            assert conn.recv(4096) == b""


async def test_fail_rate_one_fails_every_generation(start: Any) -> None:
    sim: Sim = start("--fail-rate", "1.0")
    await sim.wait_log("ready")
    assert (await get(sim.url + "/v1/models"))[0] == 200
    status, err = await post(sim.url + "/generate", NATIVE)
    assert status == 500 and err["error"]["message"]
    assert (await post(sim.url + "/generate", {**NATIVE, "stream": True}))[0] == 500
    assert (await post(sim.url + "/v1/completions", COMPLETION))[0] == 500
    assert (await post(sim.url + "/v1/chat/completions", CHAT))[0] == 500
    assert (await get(sim.url + "/health_generate"))[0] == 503
    assert (await post(sim.url + "/generate", {"text": 1}))[0] == 400  # validation comes first


async def test_token_latency_paces_generation_and_stream(start: Any) -> None:
    sim: Sim = start("--token-latency", "0.1")
    await sim.wait_log("ready")
    t0 = time.monotonic()
    status, out = await post(sim.url + "/generate", NATIVE)
    assert status == 200
    assert time.monotonic() - t0 >= 0.5 and out["meta_info"]["e2e_latency"] >= 0.5
    arrivals: list[float] = []
    async with aiohttp.ClientSession(timeout=SHORT) as s, \
            s.post(sim.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                arrivals.append(time.monotonic())
    # role chunk, 3 content chunks, finish chunk: the content arrives a token at a time.
    assert len(arrivals) == 5
    assert arrivals[3] - arrivals[0] >= 0.25
    assert arrivals[3] - arrivals[1] >= 0.15  # content chunks, not one burst at the end


def listening_inodes(port: int) -> set[str]:
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and int(f[1].split(":")[1], 16) == port:  # 0A: LISTEN
            inodes.add(f[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with_target = os.readlink(fd) if fd.is_symlink() else ""
        if with_target.startswith("socket:["):
            out.add(with_target[len("socket:["):-1])
    return out


async def test_reuse_port_lets_two_processes_listen_on_one_port(start: Any) -> None:
    port = free_port()
    a: Sim = start("--reuse-port", port=port)
    await a.wait_log("bound")
    b: Sim = start("--reuse-port", port=port)
    await b.wait_log("ready")
    listening = listening_inodes(port)
    assert len(listening) == 2
    mine_a, mine_b = socket_inodes(a.pid) & listening, socket_inodes(b.pid) & listening
    assert len(mine_a) == 1 and len(mine_b) == 1 and mine_a != mine_b
    # The old one leaves; the port keeps answering, from the new one.
    a.proc.send_signal(signal.SIGTERM)
    assert await a.wait_exit() == 0
    assert (await post(b.url + "/generate", NATIVE))[0] == 200
    assert listening_inodes(port) == mine_b


async def test_port_taken_without_reuse_port_is_an_error(start: Any) -> None:
    a: Sim = start()
    await a.wait_log("ready")
    b: Sim = start(port=a.port)
    assert await b.wait_exit() == 1
    err = await b.wait_log("error")
    assert "Address already in use" in err
    assert "code=1" in await b.wait_log("exiting")
    assert (await post(a.url + "/generate", NATIVE))[0] == 200


async def test_port_zero_reports_the_bound_port(start: Any) -> None:
    sim: Sim = start(port=0)
    bound = await sim.wait_log("bound")
    m = re.search(r"addr=127\.0\.0\.1:(\d+)", bound)
    assert m, bound
    assert (await get(f"http://127.0.0.1:{m.group(1)}/v1/models"))[0] == 200


@pytest.mark.parametrize("flags", [["--fail-rate", "1.5"], ["--load-seconds", "-1"], ["--port", "70000"]])
def test_invalid_flags_exit_2(flags: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "genready.cli", "simulate", *flags],
                       capture_output=True, text=True, timeout=DEADLINE)
    assert r.returncode == 2
    assert "error" in r.stderr


# -- what real deployments add ------------------------------------------------------------------

async def test_api_key_guards_everything_but_health(start: Any) -> None:
    sim = start("--api-key", "sk-sim", "--extra-model", "lora-a")
    sim.wait_log_sync("ready")
    async with aiohttp.ClientSession(timeout=SHORT) as s:
        async with s.post(sim.url + "/generate", json=NATIVE) as r:
            assert (r.status, await r.json()) == (401, {"error": "Unauthorized"})
        async with s.get(sim.url + "/v1/models") as r:
            assert r.status == 401
        async with s.get(sim.url + "/health") as r:
            assert r.status == 200
        async with s.post(sim.url + "/generate", json=NATIVE, headers={"Authorization": "Bearer sk-sim"}) as r:
            assert r.status == 200
        async with s.get(sim.url + "/v1/models", headers={"x-api-key": "sk-sim"}) as r:
            assert [m["id"] for m in (await r.json())["data"]] == ["sim-model", "lora-a"]


async def test_no_chat_template_and_reject(start: Any) -> None:
    a, b = start("--no-chat-template"), start("--reject", "422")
    a.wait_log_sync("ready")
    b.wait_log_sync("ready")
    status, body = await post(a.url + "/v1/chat/completions", CHAT)
    assert status == 400 and "chat template" in body["message"]
    assert (await post(a.url + "/v1/completions", COMPLETION))[0] == 200
    status, body = await post(b.url + "/generate", NATIVE)
    assert status == 422 and body["detail"][0]["msg"] == "Field required"


async def test_unix_socket(start: Any, tmp_path: Path) -> None:
    path = tmp_path / "sim.sock"
    path.touch()  # not a socket: never deleted, an error
    bad = start("--uds", str(path))
    assert "not a socket file" in bad.wait_log_sync("error")
    path.unlink()
    sim = start("--uds", str(path))
    assert f"addr=unix:{path}" in sim.wait_log_sync("bound")
    conn = aiohttp.UnixConnector(path=str(path))
    async with aiohttp.ClientSession(connector=conn, timeout=SHORT) as s, \
            s.post("http://localhost/generate", json=NATIVE) as r:
        assert r.status == 200
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_log_sync("exiting")
    assert not path.exists()  # it cleans up after itself


def test_tls_flags_go_together() -> None:
    r = subprocess.run([sys.executable, "-m", "genready.cli", "simulate", "--tls-cert", "/dev/null"],
                       capture_output=True, text=True, timeout=DEADLINE)
    assert r.returncode == 2 and "go together" in r.stderr
