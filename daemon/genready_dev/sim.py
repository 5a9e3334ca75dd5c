"""`genready simulate`: a stand-in LLM server with SGLang's HTTP surface and its failure modes.

Tests, the demo and users' dry runs need a server that fails the way real ones do, on demand:
late bind, early bind with 503s, an old process that keeps answering after SIGTERM, crashes,
hangs, failing generations, slow tokens, two processes on one port. Each is one flag. So is
what real deployments add: an API key, TLS (mutual too), a unix socket, a model without a chat
template, several models, a server that refuses every generation with one 4xx status.

It never reveals its PID in a response: genready has to prove who answered on its own.
Lifecycle events go to stderr, one flushed line each:

    genready-sim[PID] t=SECONDS EVENT key=value ...

EVENT is one of loading, bound, ready, hanging, crashing, lingering, error, exiting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import ssl
import stat
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from genready import compat

# Deterministic filler: one word is one token. The ids are small on purpose so that no
# output id can be mistaken for a PID by a test that checks the PID never leaks.
FILLER = ("the", "model", "is", "ready", "only", "when", "a", "real", "generation",
          "served", "by", "its", "current", "process", "has", "succeeded")
FIRST_TOKEN_ID = 10
CONTEXT_LENGTH = 4096  # stands in for the model's limit: beyond it SGLang answers 400
NATIVE_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
OPENAI_DEFAULT_MAX_TOKENS = 16
# In-flight requests get this long once the process has decided to exit; a hung handler
# would otherwise hold the exit for aiohttp's 60 s default.
SHUTDOWN_GRACE = 0.25


class Log:
    """One flushed line per lifecycle event; tests and the demo wait on these lines."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._prefix = f"genready-sim[{os.getpid()}]"

    def __call__(self, event: str, **fields: object) -> None:
        parts = [self._prefix, f"t={time.monotonic() - self._t0:.3f}", event]
        parts += [f"{k}={_fmt(v)}" for k, v in fields.items()]
        sys.stderr.write(" ".join(parts) + "\n")
        sys.stderr.flush()


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}"
    s = str(v)
    # Quote only what would break `key=value` splitting.
    return json.dumps(s) if (not s or any(c.isspace() or c == '"' for c in s)) else s


class BadRequest(Exception):
    """The request body is malformed: answered 400 with this message."""


@dataclass(frozen=True)
class GenRequest:
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool = False


def _obj(v: object, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return v


def _count_words(text: str) -> int:
    # A real tokenizer adds at least a BOS token, so even an empty prompt counts one.
    return max(1, len(text.split()))


def _max_tokens(d: dict[str, Any], keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        v = d.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadRequest(f"{key} must be an integer")
        if v < 0:
            raise BadRequest(f"{key} must be non-negative")
        if v > CONTEXT_LENGTH:
            raise BadRequest(f"{key}={v} exceeds the context length ({CONTEXT_LENGTH})")
        return v
    return default


def _check_temperature(d: dict[str, Any]) -> None:
    v = d.get("temperature")
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise BadRequest("temperature must be a non-negative number")


def _stream_flag(d: dict[str, Any]) -> bool:
    v = d.get("stream", False)
    if not isinstance(v, bool):
        raise BadRequest("stream must be a boolean")
    return v


def _token_ids(v: object) -> int | None:
    """The length of a prompt given as token ids (a list of non-negative ints), else None."""
    if isinstance(v, list) and v and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v):
        return len(v)
    return None


def parse_native(body: dict[str, Any]) -> GenRequest:
    # SGLang's GenerateReqInput takes `text` or `input_ids` (a tokenizer-less client sends ids);
    # python/sglang/srt/managers/io_struct.py.
    text, ids = body.get("text"), body.get("input_ids")
    if ids is not None:
        n_ids = _token_ids(ids)
        if n_ids is None:
            raise BadRequest("input_ids must be a non-empty list of token ids")
        prompt_tokens = n_ids
    elif isinstance(text, str):
        prompt_tokens = _count_words(text)
    else:
        raise BadRequest("text must be a string")
    sp = _obj(body.get("sampling_params") or {}, "sampling_params")
    _check_temperature(sp)
    n = _max_tokens(sp, ("max_new_tokens",), NATIVE_DEFAULT_MAX_NEW_TOKENS)
    return GenRequest(prompt_tokens, n, _stream_flag(body))


def _openai_common(body: dict[str, Any], prompt_tokens: int, keys: tuple[str, ...]) -> GenRequest:
    _check_temperature(body)
    n = _max_tokens(body, keys, OPENAI_DEFAULT_MAX_TOKENS)
    opts = _obj(body.get("stream_options") or {}, "stream_options")
    return GenRequest(prompt_tokens, n, _stream_flag(body), bool(opts.get("include_usage", False)))


def parse_completion(body: dict[str, Any]) -> GenRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    n_ids = _token_ids(prompt)  # the OpenAI completions API also takes the prompt as token ids
    if n_ids is not None:
        return _openai_common(body, n_ids, ("max_tokens",))
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string or a list of token ids")
    return _openai_common(body, _count_words(prompt), ("max_tokens",))


def parse_chat(body: dict[str, Any]) -> GenRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    words = 0
    for i, m in enumerate(messages):
        m = _obj(m, f"messages[{i}]")
        if not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}].role must be a string")
        content = m.get("content")
        if isinstance(content, str):
            words += len(content.split())
        elif isinstance(content, list):
            words += sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
        elif content is not None:
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
    return _openai_common(body, max(1, words), ("max_completion_tokens", "max_tokens"))


def native_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


_OPENAI_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
                       503: "ServiceUnavailableError"}
# vLLM's answer to a chat request for a model whose tokenizer has no chat template.
NO_CHAT_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide "
                    "a chat template if the tokenizer does not define one.")


def openai_error(status: int, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message,
                              "type": _OPENAI_ERROR_TYPES.get(status, "BadRequestError"),
                              "param": None, "code": status}, status=status)


def rejection(status: int) -> web.Response:
    """--reject: FastAPI's shape for a validation error (422), a plain detail otherwise."""
    if status == 422:
        return web.json_response({"detail": [{"type": "missing", "loc": ["body", "input"], "msg": "Field required",
                                              "input": None}]}, status=status)
    return web.json_response({"detail": f"simulated refusal (--reject {status})"}, status=status)


ErrorFn = Callable[[int, str], web.Response]


class Simulator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.log = Log()
        self.loaded = False
        self.stopping = False  # a SIGTERM/SIGINT arrived: /health* say 503, the rest keeps serving
        self.hung = False
        self.exit_code = 0
        self._rng = random.Random()
        self._created = int(time.time())
        self._stop = asyncio.Event()
        self._exit_at: float | None = None
        self._runner: compat.AppRunner | None = None
        self._uds_bound: str | None = None
        # --spec-accept: speculative-decoding counters since start, as vLLM's /metrics counts them.
        self.spec_drafts = 0
        self.spec_accepted = 0

    # -- lifecycle: startup, serve until _stop is set, shutdown ---------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        self._runner = compat.AppRunner(self._app(), access_log=None, shutdown_timeout=SHUTDOWN_GRACE)
        await self._runner.setup()
        life = asyncio.create_task(self._lifecycle())
        life.add_done_callback(self._lifecycle_done)
        await self._stop.wait()
        life.cancel()
        await asyncio.wait([life])  # its failure, if any, was logged by _lifecycle_done
        await self._runner.cleanup()
        if self._uds_bound:
            with contextlib.suppress(OSError):
                os.unlink(self._uds_bound)
        self.log("exiting", code=self.exit_code)
        return self.exit_code

    async def _lifecycle(self) -> None:
        a = self.a
        self.log("loading", model=a.model, seconds=a.load_seconds, bind_early=a.bind_early)
        if a.bind_early:
            await self._bind()
        await asyncio.sleep(a.load_seconds)
        if not a.bind_early:
            await self._bind()
        self.loaded = True
        self.log("ready")
        loop = asyncio.get_running_loop()
        if a.crash_after is not None:
            loop.call_later(a.crash_after, self._crash)
        if a.hang_after is not None:
            loop.call_later(a.hang_after, self._hang)

    def _lifecycle_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self.log("error", msg=f"{type(exc).__name__}: {exc}")
        self.exit_code = 1
        self._stop.set()

    async def _bind(self) -> None:
        a = self.a
        sock = self._unix_socket(a.uds) if a.uds else self._tcp_socket()
        assert self._runner is not None
        # SockSite listens on our socket as is: the bind happens exactly when we say.
        await compat.sock_site(self._runner, sock, ssl_context=self._tls()).start()
        if a.uds:
            self.log("bound", addr=f"unix:{a.uds}", tls=a.tls_cert is not None)
            return
        host, port = sock.getsockname()[:2]
        self.log("bound", addr=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                 reuse_port=a.reuse_port, tls=a.tls_cert is not None)

    def _tcp_socket(self) -> socket.socket:
        a = self.a
        infos = socket.getaddrinfo(a.host, a.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, type_, proto, _, addr = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if a.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(addr)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"cannot bind {a.host}:{a.port}: {e.strerror}") from e
        return sock

    def _unix_socket(self, path: str) -> socket.socket:
        # Like uvicorn (vLLM --uds): a socket file left by a dead server is replaced; any
        # other file at the path is an error, never deleted.
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise OSError(17, f"cannot bind unix:{path}: not a socket file")
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"cannot bind unix:{path}: {e.strerror}") from e
        self._uds_bound = path
        return sock

    def _tls(self) -> ssl.SSLContext | None:
        a = self.a
        if a.tls_cert is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(a.tls_cert, a.tls_key)
        if a.tls_client_ca:
            # vLLM's --ssl-ca-certs with --ssl-cert-reqs 2: mutual TLS.
            ctx.load_verify_locations(a.tls_client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        loop = asyncio.get_running_loop()
        if self._exit_at is not None:
            # Only the first signal starts the clock: realistically it is systemd's SIGKILL
            # after TimeoutStopSec that ends a process which ignores SIGTERM.
            self.log("lingering", signal=name, seconds=max(0.0, self._exit_at - loop.time()), repeated=True)
            return
        self.stopping = True
        self._exit_at = loop.time() + self.a.linger_seconds
        self.log("lingering", signal=name, seconds=float(self.a.linger_seconds))
        loop.call_later(self.a.linger_seconds, self._stop.set)

    def _crash(self) -> None:
        self.log("crashing", after=float(self.a.crash_after))
        os._exit(1)  # abrupt on purpose: no cleanup, no close, sockets die with the process

    def _hang(self) -> None:
        self.hung = True
        self.log("hanging", after=float(self.a.hang_after))

    # -- HTTP -----------------------------------------------------------------------------------

    def _app(self) -> web.Application:
        @web.middleware
        async def hang(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self.hung:
                await self._forever()
            return await handler(request)

        @web.middleware
        async def api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
            # SGLang's --api-key: only /health* goes through without the key (Bearer or x-api-key).
            key = self.a.api_key
            if key is None or request.path.startswith("/health"):
                return await handler(request)
            given = request.headers.get("Authorization", "")
            if given == f"Bearer {key}" or request.headers.get("x-api-key") == key:
                return await handler(request)
            return web.json_response({"error": "Unauthorized"}, status=401)

        app = web.Application(middlewares=[hang, api_key])
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/server_info", self.server_info)  # the older name of the same route
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def _forever(self) -> None:
        # The connection stays accepted and open; only the answer never comes.
        await asyncio.get_running_loop().create_future()

    async def _tokens(self, n: int) -> AsyncIterator[tuple[str, int]]:
        """n filler tokens, each after --token-latency; stalls for good once hung."""
        for i in range(n):
            if self.a.token_latency > 0:
                await asyncio.sleep(self.a.token_latency)
            if self.hung:
                await self._forever()
            k = i % len(FILLER)
            yield " " + FILLER[k], FIRST_TOKEN_ID + k

    def _fails(self) -> bool:
        fail_rate: float = self.a.fail_rate
        return self._rng.random() < fail_rate

    async def _admit(
        self, request: web.Request, parse: Callable[[dict[str, Any]], GenRequest], error: ErrorFn
    ) -> GenRequest | web.Response:
        """The checks every generation passes, in the order SGLang makes them: ready, valid, ok."""
        if not self.loaded:
            return error(503, "the model is still loading")
        if self.a.reject is not None:
            return rejection(self.a.reject)
        try:
            raw = await request.read()
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise BadRequest(f"invalid JSON body: {e}") from e
            req = parse(_obj(body, "the request body"))
        except BadRequest as e:
            return error(400, str(e))
        if self._fails():
            return error(500, "simulated engine failure (--fail-rate)")
        return req

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": self._created, "owned_by": "sglang", "root": m,
             "max_model_len": CONTEXT_LENGTH} for m in (self.a.model, *self.a.extra_model)]})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.a.model, "tokenizer_path": self.a.model,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default"})

    # -- speculative decoding (--spec-accept X): the figures servers report, each from its source --

    def verify_steps(self, tokens: int) -> int:
        """Verify steps for `tokens` output tokens at accept length X: each step yields X tokens on
        average (the accepted drafts plus the target model's own token)."""
        x: float = self.a.spec_accept
        return math.ceil(tokens / x) if tokens else 0

    def spec_done(self, tokens: int) -> None:
        """Count a finished generation into the /metrics counters."""
        if self.a.spec_accept is None:
            return
        steps = self.verify_steps(tokens)
        self.spec_drafts += steps
        self.spec_accepted += tokens - steps  # each step's own token is not an accepted draft

    def spec_meta(self, tokens: int) -> dict[str, int]:
        # SGLang adds meta_info["spec_verify_ct"] only when a speculative algorithm runs
        # (python/sglang/srt/managers/tokenizer_manager.py); accept length = completion_tokens / it.
        return {} if self.a.spec_accept is None else {"spec_verify_ct": self.verify_steps(tokens)}

    async def server_info(self, request: web.Request) -> web.Response:
        # SGLang's GET /get_server_info (alias /server_info): server args, scheduler info and, per DP
        # rank, internal_states with avg_spec_accept_length (None without speculative decoding);
        # python/sglang/srt/entrypoints/http_server.py.
        return web.json_response({"model_path": self.a.model, "version": "sim", "internal_states": [
            {"last_gen_throughput": 0.0, "avg_spec_accept_length": self.a.spec_accept}]})

    async def metrics(self, request: web.Request) -> web.Response:
        # vLLM's speculative-decoding counters, per engine, exposed only when speculative decoding
        # is configured: vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens
        # (prometheus_client adds "_total"); vllm/v1/spec_decode/metrics.py. Mean acceptance length
        # = 1 + accepted / drafts there too.
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
                 "# TYPE vllm:num_requests_running gauge",
                 f'vllm:num_requests_running{{engine="0",model_name="{self.a.model}"}} 0.0']
        if self.a.spec_accept is not None:
            k = max(1, math.ceil(self.a.spec_accept))  # num_speculative_tokens: drafts proposed per step
            for name, doc, v in (("spec_decode_num_drafts", "Number of spec decoding drafts.", self.spec_drafts),
                                 ("spec_decode_num_draft_tokens", "Number of draft tokens.", self.spec_drafts * k),
                                 ("spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                                  self.spec_accepted)):
                lines += [f"# HELP vllm:{name}_total {doc}", f"# TYPE vllm:{name}_total counter",
                          f'vllm:{name}_total{{engine="0",model_name="{self.a.model}"}} {float(v)}']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def health(self, request: web.Request) -> web.Response:
        # Newer SGLang answers both /health and /health_generate with a 1-token internal
        # generation, and 503 while starting or shutting down.
        if not self.loaded or self.stopping:
            return web.Response(status=503)
        async for _ in self._tokens(1):
            pass
        return web.Response(status=503 if self._fails() else 200)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        req = await self._admit(request, parse_native, native_error)
        if isinstance(req, web.Response):
            return req
        rid, t0 = uuid.uuid4().hex, time.monotonic()
        text, ids = "", list[int]()

        def chunk(done: bool) -> dict[str, Any]:
            return {"text": text, "output_ids": list(ids), "meta_info": {
                "id": rid, "finish_reason": {"type": "length", "length": req.max_tokens} if done else None,
                "prompt_tokens": req.prompt_tokens, "completion_tokens": len(ids),
                "cached_tokens": 0, "e2e_latency": round(time.monotonic() - t0, 6), **self.spec_meta(len(ids))}}

        if not req.stream:
            async for word, tid in self._tokens(req.max_tokens):
                text, ids = text + word, [*ids, tid]
            self.spec_done(len(ids))
            return web.json_response(chunk(True))

        async def events() -> AsyncIterator[dict[str, Any]]:
            nonlocal text, ids
            i = 0
            async for word, tid in self._tokens(req.max_tokens):
                i += 1
                text, ids = text + word, [*ids, tid]
                yield chunk(i == req.max_tokens)  # SGLang streams the cumulative text
            if req.max_tokens == 0:
                yield chunk(True)
            self.spec_done(len(ids))

        return await self._sse(request, events())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = await self._admit(request, parse_completion, openai_error)
        if isinstance(req, web.Response):
            return req
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.a.model}
        usage = _usage(req.prompt_tokens, req.max_tokens)

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}

        if not req.stream:
            text = "".join([w async for w, _ in self._tokens(req.max_tokens)])
            self.spec_done(req.max_tokens)
            return web.json_response({**head, "choices": [choice(text, "length")], "usage": usage})

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for word, _ in self._tokens(req.max_tokens):
                yield {**head, "choices": [choice(word, None)], "usage": None}
            self.spec_done(req.max_tokens)
            yield {**head, "choices": [choice("", "length")], "usage": None}
            if req.include_usage:
                yield {**head, "choices": [], "usage": usage}

        return await self._sse(request, events())

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._admit(request, parse_chat, openai_error)
        if isinstance(req, web.Response):
            return req
        if self.a.no_chat_template:
            return openai_error(400, NO_CHAT_TEMPLATE)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.a.model}
        usage = _usage(req.prompt_tokens, req.max_tokens)

        if not req.stream:
            text = "".join([w async for w, _ in self._tokens(req.max_tokens)])
            self.spec_done(req.max_tokens)
            message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
            return web.json_response({**head, "object": "chat.completion", "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": "length",
                 "matched_stop": None}], "usage": usage})

        def delta(d: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {**head, "object": "chat.completion.chunk", "usage": None,
                    "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]}

        async def events() -> AsyncIterator[dict[str, Any]]:
            yield delta({"role": "assistant", "content": ""}, None)
            i = 0
            async for word, _ in self._tokens(req.max_tokens):
                # --reasoning-tokens: a reasoning model's first tokens go in vLLM's DeltaMessage field
                # `reasoning`, not `content` (vllm/entrypoints/openai/engine/protocol.py).
                yield delta({"reasoning" if i < self.a.reasoning_tokens else "content": word}, None)
                i += 1
            self.spec_done(req.max_tokens)
            yield delta({}, "length")
            if req.include_usage:
                yield {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}

        return await self._sse(request, events())

    async def _sse(self, request: web.Request, events: AsyncIterator[dict[str, Any]]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            async for ev in events:
                await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client left mid-stream: there is no one left to tell
        return resp


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _seconds(s: str) -> float:
    v = float(s)
    if not v >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a non-negative number of seconds, not {s!r}")
    return v


def _fraction(s: str) -> float:
    v = float(s)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {s!r}")
    return v


def _port(s: str) -> int:
    v = int(s)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, not {s!r}")
    return v


def _client_error(s: str) -> int:
    v = int(s)
    if not 400 <= v <= 499:
        raise argparse.ArgumentTypeError(f"must be a 4xx status, not {s!r}")
    return v


def _accept_length(s: str) -> float:
    v = float(s)
    if not 1 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 1 (tokens per verify step), not {s!r}")
    return v


def _file(s: str) -> str:
    if not os.access(s, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {s!r}")
    return s


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=_port, default=30000,
                   help="port to listen on; 0 picks a free one, shown on the `bound` line "
                   "(default: %(default)s)")
    p.add_argument("--model", default="sim-model", metavar="NAME",
                   help="model name in /v1/models and responses (default: %(default)s)")
    p.add_argument("--load-seconds", type=_seconds, default=0.0, metavar="S",
                   help="time to 'load weights' before generating (default: %(default)s)")
    p.add_argument("--bind-early", action="store_true",
                   help="bind the port before loading; /v1/models and /get_model_info answer 200 while "
                   "generation and /health* answer 503 (llama.cpp, SGLang warmup). Without it the port "
                   "binds only once loaded (SGLang)")
    p.add_argument("--linger-seconds", type=_seconds, default=0.0, metavar="S",
                   help="after SIGTERM/SIGINT keep serving generations (/health* say 503) for S seconds, "
                   "then exit 0; further signals do not shorten it (default: %(default)s)")
    p.add_argument("--crash-after", type=_seconds, default=None, metavar="S",
                   help="S seconds after ready, exit abruptly with status 1")
    p.add_argument("--hang-after", type=_seconds, default=None, metavar="S",
                   help="S seconds after ready, keep accepting connections but never answer again")
    p.add_argument("--fail-rate", type=_fraction, default=0.0, metavar="P",
                   help="fraction of generations answered 500 (/health* answer 503) (default: %(default)s)")
    p.add_argument("--token-latency", type=_seconds, default=0.0, metavar="S",
                   help="seconds per generated token, also paces streamed chunks (default: %(default)s)")
    p.add_argument("--reuse-port", action="store_true",
                   help="set SO_REUSEPORT so an old and a new process can listen on the port at once")
    p.add_argument("--uds", metavar="PATH", help="listen on this unix socket instead of --host/--port "
                   "(vLLM --uds, llama.cpp --host PATH.sock); a stale socket file there is replaced")
    p.add_argument("--api-key", metavar="KEY", help="answer 401 {\"error\":\"Unauthorized\"} to every request "
                   "without `Authorization: Bearer KEY` (or x-api-key: KEY), except /health* (SGLang --api-key)")
    p.add_argument("--tls-cert", type=_file, metavar="PEM", help="serve HTTPS with this certificate (chain); "
                   "needs --tls-key (SGLang/vLLM --ssl-certfile)")
    p.add_argument("--tls-key", type=_file, metavar="PEM", help="the certificate's private key (--ssl-keyfile)")
    p.add_argument("--tls-client-ca", type=_file, metavar="PEM", help="mutual TLS: require a client certificate "
                   "signed by this CA (vLLM --ssl-ca-certs with --ssl-cert-reqs 2)")
    p.add_argument("--no-chat-template", action="store_true",
                   help="answer chat completions 400 like vLLM for a model without a chat template")
    p.add_argument("--extra-model", action="append", default=[], metavar="NAME",
                   help="list another model in /v1/models (repeatable), as a server with LoRA adapters does")
    p.add_argument("--spec-accept", type=_accept_length, metavar="X",
                   help="speculative decoding with mean accept length X (>= 1): SGLang's meta_info.spec_verify_ct "
                   "and GET /get_server_info's internal_states[0].avg_spec_accept_length, vLLM's "
                   "vllm:spec_decode_* counters on GET /metrics")
    p.add_argument("--reasoning-tokens", type=int, default=0, metavar="N",
                   help="stream a chat answer's first N tokens as delta.reasoning (vLLM's reasoning models)")
    p.add_argument("--reject", type=_client_error, metavar="STATUS",
                   help="answer every generation with this 4xx status once loaded (e.g. 403, 405, 422)")


def main(args: argparse.Namespace) -> int:
    if (args.tls_cert is None) != (args.tls_key is None):
        print("genready simulate: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.tls_client_ca and not args.tls_cert:
        print("genready simulate: --tls-client-ca needs --tls-cert and --tls-key", file=sys.stderr)
        return 2
    return asyncio.run(Simulator(args).run())


def cli(argv: list[str]) -> int:
    """`genready simulate ARGS`."""
    p = argparse.ArgumentParser(prog="genready simulate", description="An LLM-server simulator with SGLang's "
                                "HTTP surface and its failure modes (for tests, the demo and dry runs).")
    add_arguments(p)
    return main(p.parse_args(argv))
