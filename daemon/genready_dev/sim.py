"""`genready simulate`: a stand-in LLM server with SGLang's HTTP surface and its failure modes.

Tests, the demo and users' dry runs need a server that fails the way real ones do, on demand:
late bind, early bind with 503s, an old process that keeps answering after SIGTERM, crashes,
hangs, failing generations, slow tokens, two processes on one port. Each is one flag. So is
what real deployments add: an API key, TLS (mutual too), a unix socket, a model without a chat
template, several models, a server that refuses every generation with one 4xx status.

`--profile NAME` (a kind's sim_profile: simprofiles.py) imitates one real server's start-up, health route, API-key
rules, error shapes, model list and shutdown, each taken from that server's source (the file is
named at each place below; docs/servers.md has the whole table). Without --profile it is the
generic SGLang-like server the flags above describe.

It never reveals its PID in a response: genready has to prove who answered on its own.
Lifecycle events go to stderr, one flushed line each:

    genready-sim[PID] t=SECONDS EVENT key=value ...

EVENT is one of loading, bound, ready, hanging, crashing, lingering, error, exiting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
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
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler

from genready import compat
from genready.servers import kinds
from genready_dev import simadaptive, simargs, simbatch, simengine, simoutput, simspec, simsurface
from genready_dev.simprofiles import PROFILES, ErrorFn, llamacpp_error, vllm_error
from genready_dev.simrequests import (
    CONTEXT_LENGTH,
    BadRequest,
    GenRequest,
    json_object,
    parse_chat,
    parse_completion,
    parse_native,
)

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


# vLLM's answer to a chat request for a model whose tokenizer has no chat template.
NO_CHAT_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide "
                    "a chat template if the tokenizer does not define one.")



def rejection(status: int) -> web.Response:
    """--reject: FastAPI's shape for a validation error (422), a plain detail otherwise."""
    if status == 422:
        return web.json_response({"detail": [{"type": "missing", "loc": ["body", "input"], "msg": "Field required",
                                              "input": None}]}, status=status)
    return web.json_response({"detail": f"simulated refusal (--reject {status})"}, status=status)


# Each counter's HELP text, as its server writes it.
_COUNTER_HELP: Final = {
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "sglang:prompt_tokens": "Number of prefill tokens processed.",
    "sglang:cached_tokens": "Number of cached prompt tokens.",
}


# The request's --cold-requests slowness, set with its prefill (_cold) and read by its tokens (_tokens).
_SLOW: contextvars.ContextVar[float] = contextvars.ContextVar("slow", default=1.0)
# The request's accept length under the speculative model (--spec-alpha), set with its prefill: its tokens come
# a verify step at a time (_tokens). None: one token per --token-latency.
_ACCEPT: contextvars.ContextVar[float | None] = contextvars.ContextVar("accept", default=None)


def spec_model(a: argparse.Namespace) -> simspec.SpecModel | None:
    """The speculative model the flags ask for (--spec-alpha with the server's speculative settings), or None.
    γ, k and N are SGLang's --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens
    (vLLM's speculative_config.num_speculative_tokens is γ with k = 1)."""
    if a.spec_alpha is None:
        return None
    s = simengine.settings(a, kinds.SGLANG)
    vllm = simengine.settings(a, kinds.VLLM).get("speculative_config")
    steps = s.get("speculative_num_steps")
    if steps is None and isinstance(vllm, dict):
        steps = vllm.get("num_speculative_tokens")
    topk, n = s.get("speculative_eagle_topk"), s.get("speculative_num_draft_tokens")
    for name, v in (("--speculative-num-steps", steps), ("--speculative-eagle-topk", topk),
                    ("--speculative-num-draft-tokens", n)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name}: expected a whole number >= 1, found {v!r}")
    return simspec.SpecModel(alpha=a.spec_alpha, steps=steps or simspec.DEFAULT_STEPS, topk=topk or 1,
                             draft_tokens=n, draft_cost=a.spec_draft_cost, verify_cost=a.spec_verify_cost,
                             table=a.spec_accept_category)


def vllm_speculative_config(a: argparse.Namespace) -> object:
    """vLLM's --speculative-config as the simulator's flags give it (a dict when it is JSON)."""
    return simengine.settings(a, kinds.VLLM).get("speculative_config")


def sglang_adaptive(a: argparse.Namespace, spec: simspec.SpecModel | None) -> simadaptive.Adaptive | None:
    """SGLang's --speculative-adaptive state (its --speculative-adaptive-config, else SGLang's defaults), with the
    speculative model's depth as the initial steps; None without the switch or the model. ValueError (or OSError
    for its file) as SGLang refuses."""
    if not a.speculative_adaptive or spec is None:
        return None
    s = simengine.settings(a, kinds.SGLANG)
    return simadaptive.load(s.get("speculative_adaptive_config"), spec.steps, s)


class Simulator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.p = PROFILES[args.profile or ""]
        self.log = Log()
        self.loaded = False
        self.starting = False  # loaded, warmup running: generations work, /health says 503 (SGLang)
        self.unhealthy = False  # --unhealthy-after: /health says 503, generations still work
        self.stopping = False  # a SIGTERM/SIGINT arrived: /health* say 503, the rest keeps serving
        self.hung = False
        self.bind_early = args.bind_early or self.p.loading_gate
        self.warmup = args.warmup_seconds if args.warmup_seconds is not None else self.p.warmup_seconds
        self.linger = args.linger_seconds if args.linger_seconds is not None else self.p.linger_seconds
        # The names the model is served under (vLLM --served-model-name a b), then LoRA adapters or
        # a router's other models (--extra-model).
        self.names: list[str] = args.served_model_name or [args.model]
        self.listed = [*self.names, *(m for m in args.extra_model if m not in self.names)]
        # llama.cpp's router (--router): each listed model's state, "unloaded" until asked for
        # (tools/server/server-models.cpp); without --router every model is served at once.
        self.router: dict[str, str] = {m: "unloaded" for m in self.listed} if args.router else {}
        self._router_loaded: dict[str, asyncio.Event] = {}
        self.exit_code = 0
        self._rng = random.Random()
        self.created = int(time.time())
        self._stop = asyncio.Event()
        self._exit_at: float | None = None
        self._runner: compat.AppRunner | None = None
        self._uds_bound: str | None = None
        # A prefix cache: the prompts seen since start (or the last flush). A prompt seen before is a whole-prompt
        # hit and skips --prefill-latency, as a radix/prefix cache skips the prefill of cached tokens.
        self.prefix_cache: set[str] = set()
        self.prompt_tokens_total = 0  # prompt tokens asked for (SGLang prompt_tokens, vLLM prefix_cache_queries)
        self.cached_tokens_total = 0  # of them, found in the prefix cache (cached_tokens, prefix_cache_hits)
        self.in_flight = 0  # generations being served: SGLang's /flush_cache refuses (400) while there are any
        self.generations = 0  # generations begun since start: --cold-requests slows the first ones
        self.flushes = 0
        self.tasks_served = 0  # llama.cpp: a slot lists its task's params once it served one
        # --spec-alpha: accept length and step time from the speculative settings; --spec-accept stands for its
        # mean over the built-in categories wherever one figure is reported (the server's own average)
        self.spec_model = spec_model(args)
        if self.spec_model is not None:
            args.spec_accept = self.spec_model.mean_accept()
        # --spec-accept: speculative-decoding counters since start, as vLLM's /metrics counts them.
        self.spec_counters = simspec.Counters()
        # the counters at the last read of a drained counter page (TensorRT-LLM's iteration stats: simprofiles.py)
        self.stats_read = (0, 0, 0)
        # each position's sample at 0 from the start, as SpecDecodingProm makes them (vllm/v1/spec_decode/metrics.py)
        if args.spec_accept is not None:
            self.spec_counters.per_pos = [0] * simspec.drafts_per_step(args.spec_accept)
        # --batch-max-running: decode in one continuous batch (issue 39 §4); with --spec-alpha at the depth the
        # server's flags (and vLLM's schedule by batch size) give, issue 52 §3
        model = simbatch.from_args(args, self.spec_model, vllm_speculative_config(args),
                                   sglang_adaptive(args, self.spec_model))
        self.batch = None if model is None else simbatch.Batcher(model)

    # -- lifecycle: startup, serve until _stop is set, shutdown ---------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        # SIGUSR1: hang from now on, as --hang-after does at its time; a test sends it once it has
        # seen what must come first (a verification), which no timer can promise on a loaded machine.
        loop.add_signal_handler(signal.SIGUSR1, self._hang)
        self._runner = compat.AppRunner(self._app(), access_log=None, shutdown_timeout=SHUTDOWN_GRACE)
        await self._runner.setup()
        life = asyncio.create_task(self._lifecycle())
        life.add_done_callback(self._lifecycle_done)
        await self._stop.wait()
        life.cancel()
        await asyncio.wait([life])  # its failure, if any, was logged by _lifecycle_done
        await self._runner.cleanup()
        if self._uds_bound and not self.p.uds_stale_blocks:  # llama.cpp leaves it behind
            with contextlib.suppress(OSError):
                os.unlink(self._uds_bound)
        self.log("exiting", code=self.exit_code)
        return self.exit_code

    async def _lifecycle(self) -> None:
        a = self.a
        self.log("loading", model=a.model, seconds=a.load_seconds, bind_early=self.bind_early,
                 profile=self.p.name)
        if self.p.start_log is not None:  # what its start writes (vLLM: the arguments it runs with)
            self.p.start_log(a)
        # vLLM: bound (SO_REUSEPORT) at once, listening only once loaded: connections are refused.
        early_sock = self._tcp_socket(reuse_port=True) if self.p.listen_after_load and not a.uds else None
        if self.bind_early or self.router:  # a router comes up at once; its models load on demand
            await self._bind()
        if not self.router:
            await asyncio.sleep(a.load_seconds)
        if a.fail_load:
            # As a load that runs out of GPU memory (weights, KV cache, CUDA-graph capture): a last line, exit 1.
            print(f"torch.OutOfMemoryError: CUDA out of memory ({a.fail_load}) after {a.load_seconds:g}s of loading",
                  file=sys.stderr, flush=True)
            self.log("load failed", why=a.fail_load)
            os._exit(1)
        if not (self.bind_early or self.router):
            await self._bind(early_sock)
        self.loaded = True
        if self.warmup > 0:
            self.starting = True
            self.log("warming", seconds=self.warmup)
            await asyncio.sleep(self.warmup)
            self.starting = False
        self.log("ready")
        loop = asyncio.get_running_loop()
        if a.crash_after is not None:
            loop.call_later(a.crash_after, self._crash)
        if a.hang_after is not None:
            loop.call_later(a.hang_after, self._hang)
        if a.unhealthy_after is not None:
            loop.call_later(a.unhealthy_after, self._unhealthy)

    def _lifecycle_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self.log("error", msg=f"{type(exc).__name__}: {exc}")
        self.exit_code = 1
        self._stop.set()

    async def _bind(self, sock: socket.socket | None = None) -> None:
        a = self.a
        sock = sock or (self._unix_socket(a.uds) if a.uds else self._tcp_socket())
        assert self._runner is not None
        # SockSite listens on our socket as is: the bind happens exactly when we say.
        await compat.sock_site(self._runner, sock, ssl_context=self._tls()).start()
        if a.uds:
            self.log("bound", addr=f"unix:{a.uds}", tls=a.tls_cert is not None)
            return
        host, port = sock.getsockname()[:2]
        self.log("bound", addr=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                 reuse_port=a.reuse_port or self.p.listen_after_load, tls=a.tls_cert is not None)

    def _tcp_socket(self, *, reuse_port: bool = False) -> socket.socket:
        a = self.a
        infos = socket.getaddrinfo(a.host, a.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, type_, proto, _, addr = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if a.reuse_port or reuse_port:
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
            if self.p.uds_stale_blocks:
                raise OSError(98, f"cannot bind unix:{path}: a socket file is there (llama.cpp: couldn't bind "
                                  "HTTP server socket; remove it before the start)")
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
        self._exit_at = loop.time() + self.linger
        self.log("lingering", signal=name, seconds=float(self.linger))
        loop.call_later(self.linger, self._stop.set)

    def _crash(self) -> None:
        self.log("crashing", after=float(self.a.crash_after))
        os._exit(1)  # abrupt on purpose: no cleanup, no close, sockets die with the process

    def _hang(self) -> None:
        self.hung = True
        why = {"after": float(self.a.hang_after)} if self.a.hang_after is not None else {"on": "SIGUSR1"}
        self.log("hanging", **why)

    def _unhealthy(self) -> None:
        # SGLang marks itself ServerStatus.UnHealthy when its health generation gets no answer for
        # 20 s (http_server.py health_generate); from then on /health says 503.
        self.unhealthy = True
        self.log("unhealthy", after=float(self.a.unhealthy_after))

    # -- HTTP -----------------------------------------------------------------------------------

    def _app(self) -> web.Application:
        @web.middleware
        async def hang(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self.hung:
                await self._forever()
            return await handler(request)

        @web.middleware
        async def loading(request: web.Request, handler: Handler) -> web.StreamResponse:
            # llama.cpp checks its state before the key (server-http.cpp): 503 while loading.
            if self.p.loading_gate and not self.loaded:
                return llamacpp_error(503, "Loading model")
            return await handler(request)

        @web.middleware
        async def api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
            # --api-key: the profile's exempt paths go through without the key (Bearer; x-api-key too).
            key = self.a.api_key
            if key is None or self.p.key_exempt(request.path):
                return await handler(request)
            given = request.headers.get("Authorization", "")
            scheme, _, token = given.partition(" ")
            if (scheme.lower() == "bearer" and token == key) or request.headers.get("x-api-key") == key:
                return await handler(request)
            return self.p.unauthorized()

        @web.middleware
        async def not_found(request: web.Request, handler: Handler) -> web.StreamResponse:
            try:
                return await handler(request)
            except web.HTTPNotFound:
                return self.p.not_found()

        @web.middleware
        async def close_after_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
            resp = await handler(request)
            if self.p.closes_after_errors_and_streams and resp.status >= 400 and not resp.prepared:
                resp.force_close()
            return resp

        @web.middleware
        async def busy(request: web.Request, handler: Handler) -> web.StreamResponse:
            # A generation is running until its answer (or stream) has been written.
            if request.path not in ("/generate", "/v1/completions", "/v1/chat/completions"):
                return await handler(request)
            self.in_flight += 1
            try:
                return await handler(request)
            finally:
                self.in_flight -= 1

        app = web.Application(middlewares=[close_after_errors, hang, loading, api_key, not_found, busy])
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        for add_routes in self.p.routes:
            add_routes(self, app)
        if self.router:
            app.router.add_get("/models", self.models)
            app.router.add_post("/models/load", self.router_load)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def _forever(self) -> None:
        # The connection stays accepted and open; only the answer never comes.
        await asyncio.get_running_loop().create_future()

    def _prefill(self, req: GenRequest) -> tuple[int, float]:
        """(cached prompt tokens, seconds of prefill) for a generation of `req`, counted into /metrics."""
        cached = req.prompt_tokens if req.prompt_key in self.prefix_cache else 0
        self.prefix_cache.add(req.prompt_key)
        self.prompt_tokens_total += req.prompt_tokens
        self.cached_tokens_total += cached
        prefill: float = self.a.prefill_latency * self._cold()
        _ACCEPT.set(None if self.spec_model is None else self.spec_x(req))
        return cached, prefill * (req.prompt_tokens - cached)

    def _cold(self) -> float:
        """--cold-requests: how much slower this generation is than a warmed process's (1 once warm), kept for
        its tokens (_tokens, in the same request's task). SGLang issue #28706: TTFT 6,350 ms right after a
        restart against 3,661 ms converged, after 50 to 100 requests (JIT, CUDA graphs, autotuning)."""
        k, n = self.generations, self.a.cold_requests
        self.generations += 1
        slow = 1 + (self.a.cold_factor - 1) * math.exp(-3 * k / n) if k < n else 1.0
        _SLOW.set(slow)
        return slow

    async def _tokens(self, n: int, prefill: float = 0.0) -> AsyncIterator[tuple[str, int]]:
        """n filler tokens, each after --token-latency (under --spec-alpha: a verify step's at a time), the first
        after `prefill` seconds more; stalls for good once hung."""
        if prefill > 0:
            await asyncio.sleep(prefill)
        if self.batch is not None:
            async for i in self.batch.decode(n):
                if self.hung:
                    await self._forever()
                yield simoutput.word(i, self.a.output_fault)
            return
        # One token a step, or under --spec-alpha a verify step's accepted drafts and its own token at once. Steps
        # are kept on the request's own clock (each ends a step after the last one was due, not after the loop woke
        # up late), so a loaded machine's late wake-ups do not add up over a generation's steps: its time is the
        # model's (simspec.request_seconds), which a sweep's measured speedup is tested against.
        x, dt = _ACCEPT.get(), self.a.token_latency * _SLOW.get()
        if x is not None and self.spec_model is not None:
            per_step, dt = [a + 1 for a in simspec.accepted_per_step(n, x)], dt * self.spec_model.step_factor
        else:
            per_step = [1] * n
        loop = asyncio.get_running_loop()
        end, i = loop.time(), 0
        for count in per_step:
            if dt > 0:
                end += dt
                await asyncio.sleep(max(0.0, end - loop.time()))
            if self.hung:
                await self._forever()
            for _ in range(count):
                yield simoutput.word(i, self.a.output_fault)
                i += 1

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
            req = parse(json_object(body, "the request body"))
        except BadRequest as e:
            return error(400, str(e))
        if self.a.skip_tokenizer_init and req.text_prompt:
            return error(400, self.p.no_tokenizer)
        if (refused := await self._model_served(request, req)) is not None:
            return refused
        if self._fails():
            return error(500, "simulated engine failure (--fail-rate)")
        return req

    async def _model_served(self, request: web.Request, req: GenRequest) -> web.Response | None:
        """The OpenAI routes' `model`, checked as the profile's server checks it."""
        if not request.path.startswith("/v1"):
            return None
        name = req.model
        if self.router:
            # tools/server/server-models.cpp: the router needs a model name, one it knows, loaded;
            # with --models-autoload it holds the request until the model is loaded.
            if not name:
                return llamacpp_error(400, "model name is missing from the request")
            if name not in self.router:
                return llamacpp_error(400, f"model '{name}' not found")
            if self.router[name] != "loaded":
                if not self.a.models_autoload:
                    return llamacpp_error(400, "model is not loaded")
                await self._router_load(name)
            return None
        if self.p.checks_model and name and name not in self.listed:
            # vllm/entrypoints/openai/models/serving.py check_model
            return vllm_error(404, f"The model `{name}` does not exist.", "model")
        return None

    def _router_start(self, name: str) -> asyncio.Event:
        done = self._router_loaded.get(name)
        if done is None:
            done = self._router_loaded[name] = asyncio.Event()
            self.router[name] = "loading"
            self.log("loading", model=name, seconds=self.a.load_seconds, router=True)

            def loaded() -> None:
                self.router[name] = "loaded"
                self.log("ready", model=name)
                done.set()

            asyncio.get_running_loop().call_later(self.a.load_seconds, loaded)
        return done

    async def _router_load(self, name: str) -> None:
        await self._router_start(name).wait()

    async def router_load(self, request: web.Request) -> web.Response:
        # POST /models/load {"model": NAME} (tools/server/server-models.cpp): starts loading, answers at once
        try:
            name = (await request.json()).get("model")
        except ValueError:
            name = None
        if name not in self.router:
            return llamacpp_error(404, "model not found")
        if self.router[name] == "loaded":
            return llamacpp_error(400, "model is already loaded")
        self._router_start(name)
        return web.json_response({"success": True})

    async def models(self, request: web.Request) -> web.Response:
        def card(m: str) -> dict[str, Any]:
            if self.p.card is not None:
                return self.p.card(self, m)
            # vLLM lists every --served-model-name with the same root (the weights), then LoRA
            # adapters with their own root and parent (vllm/entrypoints/openai/models/serving.py)
            served = m in self.names
            return {"id": m, "object": "model", "created": self.created,
                    "owned_by": self.p.owned_by,
                    "root": self.a.model if served else m, "parent": None if served else self.names[0],
                    "max_model_len": CONTEXT_LENGTH}

        return web.json_response({"object": "list", "data": [card(m) for m in self.listed]})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.a.model, "tokenizer_path": self.a.model,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default"})

    # -- speculative decoding (--spec-accept X): the figures servers report, each from its source --

    def spec_x(self, req: GenRequest) -> float:
        """The accept length of `req`: the speculative model's for its prompt's category (--spec-alpha), else
        --spec-accept, or its prompt's category's (--spec-accept-category)."""
        if self.spec_model is not None:
            return self.spec_model.accept(simspec.category_of(req.prompt_key))
        assert self.a.spec_accept is not None
        return simspec.accept_for(self.a.spec_accept, self.a.spec_accept_category, req.prompt_key)

    def _step_ends(self, tokens: int) -> set[int] | None:
        """Under --spec-alpha, the token counts at which this request's verify steps end (after _prefill)."""
        x = _ACCEPT.get()
        if self.spec_model is None or x is None or self.batch is not None:
            return None
        ends, done = set(), 0
        for accepted in simspec.accepted_per_step(tokens, x):
            done += accepted + 1
            ends.add(done)
        return ends

    def spec_done(self, tokens: int, req: GenRequest) -> None:
        """Count a finished generation into the /metrics counters (at --spec-metrics-accept, if given)."""
        self.tasks_served += 1
        if self.a.spec_accept is None:
            return
        self.spec_counters.count(tokens, self.a.spec_metrics_accept or self.spec_x(req))

    def spec_meta(self, tokens: int, req: GenRequest) -> dict[str, Any]:
        # SGLang adds meta_info["spec_verify_ct"] and its counts only when a speculative algorithm runs
        # (python/sglang/srt/managers/tokenizer_manager.py); accept length = completion_tokens / it. The counts'
        # names are --sglang-version's (simspec).
        if self.a.spec_accept is None:
            return {}
        return simspec.sglang_meta(tokens, self.spec_x(req), simspec.version(self.a.sglang_version))

    def spec_answer(self, req: GenRequest, tokens: int) -> dict[str, Any]:
        """What an OpenAI answer (a stream's last event) carries of speculative decoding at its top level:
        SGLang's sglext.spec_tokens_details (>= 0.5.12, asked with return_spec_tokens_details), vLLM's
        metrics.speculative_decoding (--per-request-spec-decode-metrics)."""
        if self.a.spec_accept is None:
            return {}
        x = self.spec_x(req)
        if self.p.has_native and req.return_spec_tokens_details and \
                simspec.version(self.a.sglang_version) >= simspec.SGLANG_SPELLINGS[0]:
            return {"sglext": {"spec_tokens_details": simspec.sglang_details(tokens, x)}}
        if self.p.per_request_metrics:
            return simspec.vllm_metrics(tokens, x, self.a.per_request_spec_decode_metrics)
        return {}

    def _meta_refused(self, req: GenRequest) -> web.Response | None:
        # SGLang's OpenAI routes: return_meta_info on a stream is a ValueError, answered 400
        # (python/sglang/srt/entrypoints/openai/serving_chat.py); other servers ignore the field.
        if self.p.has_native and req.return_meta_info and req.stream:
            return self.p.openai_error(400, "return_meta_info is not supported with streaming. Please set "
                                       "stream=false when using return_meta_info=true.")
        return None

    def _choice_meta(self, req: GenRequest) -> dict[str, Any]:
        # serving_chat.py / serving_completions.py: choice.meta_info = ret_item["meta_info"] if return_meta_info
        if not (self.p.has_native and req.return_meta_info):
            return {}
        return {"meta_info": {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.max_tokens,
                              **self.spec_meta(req.max_tokens, req)}}

    async def server_info(self, request: web.Request) -> web.Response:
        # SGLang's GET /get_server_info (alias /server_info): server args, scheduler info and, per DP
        # rank, internal_states with avg_spec_accept_length (None without speculative decoding);
        # python/sglang/srt/entrypoints/http_server.py.
        # Newer versions serve /server_info and keep /get_server_info as a deprecated alias (docs.sglang.io).
        return web.json_response(simengine.sglang_server_info(self.a, self.a.spec_accept))

    async def props(self, request: web.Request) -> web.Response:
        # llama.cpp: GET /props (tools/server/server-context.cpp, get_res_props; simengine.py)
        return web.json_response(simengine.llamacpp_props(self.a, CONTEXT_LENGTH))

    async def metrics(self, request: web.Request) -> web.Response:
        # vLLM's speculative-decoding counters, per engine, exposed only when speculative decoding
        # is configured: vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens
        # (prometheus_client adds "_total"); vllm/v1/spec_decode/metrics.py. Mean acceptance length
        # = 1 + accepted / drafts there too.
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
                 "# TYPE vllm:num_requests_running gauge",
                 f'vllm:num_requests_running{{engine="0",model_name="{self.a.model}"}} 0.0']
        if self.a.spec_accept is not None and self.p.spec_on_metrics:
            lines += self.spec_counters.page(self.a.model)
        lines += self._prefix_metrics()
        if self.p.engine_info:
            lines.append(self.p.engine_info)
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def _prefix_metrics(self) -> list[str]:
        """The prefix cache's counters under the profile's server's names, with the `_created` sample
        prometheus_client adds to every counter (a timestamp: summing it into a total is wrong)."""
        hits = self.p.surface.hit_rate
        if hits is None or hits.total_excludes_hits:
            return []  # llama.cpp's prompt_tokens counters are not simulated
        # vllm/v1/metrics/loggers.py: Counter "vllm:prefix_cache_queries" / "vllm:prefix_cache_hits", in tokens;
        # python/sglang/srt/metrics/collector.py: Counter "sglang:prompt_tokens" and "sglang:cached_tokens"
        labels = (f'{{engine="0",model_name="{self.a.model}"}}' if self.p.engine_label else
                  f'{{model_name="{self.a.model}"}}')
        names = ((hits.total, _COUNTER_HELP.get(hits.total, hits.total), self.prompt_tokens_total),
                 (hits.hits, _COUNTER_HELP.get(hits.hits, hits.hits), self.cached_tokens_total))
        out = []
        for name, doc, v in names:
            # prometheus_client's generate_latest() of a Counter: NAME_total, then NAME_created as a gauge
            out += [f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter", f"{name}_total{labels} {float(v)}",
                    f"# HELP {name}_created {doc}", f"# TYPE {name}_created gauge",
                    f"{name}_created{labels} {float(self.created)}"]
        return out

    # -- the prefix cache's flush routes, each as its server has it --------------------------------

    async def flush_cache(self, request: web.Request) -> web.Response:
        # SGLang: @app.api_route("/flush_cache", methods=["GET", "POST"]) in
        # python/sglang/srt/entrypoints/http_server.py: 200, or 400 while requests are running or waiting.
        ok = self.in_flight == 0
        if ok:
            self._flush()
        return web.Response(status=200 if ok else 400, text=(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n"))

    async def reset_cache(self, request: web.Request) -> web.Response:
        # vLLM: POST /reset_prefix_cache, /reset_mm_cache, /reset_encoder_cache, 200 with no body; attached only
        # with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/cache/api_router.py, attach_router).
        if request.path == "/reset_prefix_cache":
            self._flush()
        return web.Response(status=200)

    def _slot(self, i: int) -> dict[str, Any]:
        params = simengine.llamacpp_slot_params(self.a)
        drafting = self.a.spec_accept is not None or str(params.get("speculative.types", "none")) != "none"
        slot = {"id": i, "id_task": -1, "n_ctx": CONTEXT_LENGTH, "speculative": drafting,
                "is_processing": self.in_flight > 0}
        # server-context.cpp, server_slot::to_json: "params" once the slot has served a task
        return {**slot, "params": params} if self.tasks_served else slot

    async def slots(self, request: web.Request) -> web.Response:
        # llama.cpp: GET /slots lists the slots, each with its "id" (tools/server/server-context.cpp,
        # handle_slots); --no-slots makes it 501 "This server does not support slots endpoint."
        if self.a.no_slots:
            return llamacpp_error(501, "This server does not support slots endpoint.")
        return web.json_response([self._slot(i) for i in range(self.a.parallel)])

    async def slot_action(self, request: web.Request) -> web.Response:
        # llama.cpp: POST /slots/{id_slot}?action=erase clears that slot's cached tokens and answers
        # {"id_slot", "n_erased"} (server-context.cpp, handle_slots_action / handle_slots_erase). Every slot
        # action, erase too, is 501 without --slot-save-path: checked on the real llama-server 11434.
        if self.a.no_slots:
            return llamacpp_error(501, "This server does not support slots endpoint.")
        if not self.a.slot_save_path:
            return llamacpp_error(501, "This server does not support slots action. Start it with `--slot-save-path`")
        try:
            slot = int(request.match_info["id_slot"])
        except ValueError:
            return llamacpp_error(400, "Invalid slot ID")
        if request.query.get("action") != "erase":
            return llamacpp_error(400, "Invalid action")
        if not 0 <= slot < self.a.parallel:
            return llamacpp_error(400, "Invalid slot ID")
        n = self.cached_tokens_total
        self._flush()
        return web.json_response({"id_slot": slot, "n_erased": n})

    def _flush(self) -> None:
        self.prefix_cache.clear()
        self.flushes += 1
        self.log("flushed", n=self.flushes)

    async def health(self, request: web.Request) -> web.Response:
        # Newer SGLang answers both /health and /health_generate with a 1-token internal
        # generation, and 503 while starting (warmup), unhealthy or shutting down
        # (python/sglang/srt/entrypoints/http_server.py, health_generate).
        if not self.loaded or self.stopping or self.starting or self.unhealthy:
            return web.Response(status=503)
        if self.p.health_poll:
            await asyncio.sleep(self.p.health_poll)
        async for _ in self._tokens(1):
            pass
        return web.Response(status=503) if self._fails() else self.p.health_ok()

    async def generate(self, request: web.Request) -> web.StreamResponse:
        req = await self._admit(request, parse_native, self.p.native_error)
        if isinstance(req, web.Response):
            return req
        rid, t0 = uuid.uuid4().hex, time.monotonic()
        text, ids = "", list[int]()
        cached, prefill = self._prefill(req)

        def chunk(done: bool) -> dict[str, Any]:
            # Without a tokenizer SGLang has no text to give back, only output_ids.
            head: dict[str, Any] = {} if self.a.skip_tokenizer_init else {"text": text}
            return {**head, "output_ids": list(ids), "meta_info": {
                "id": rid, "finish_reason": {"type": "length", "length": req.max_tokens} if done else None,
                "prompt_tokens": req.prompt_tokens, "completion_tokens": len(ids),
                "cached_tokens": cached, "e2e_latency": round(time.monotonic() - t0, 6),
                **self.spec_meta(len(ids), req)}}

        if not req.stream:
            async for word, tid in self._tokens(req.max_tokens, prefill):
                text, ids = text + word, [*ids, tid]
            self.spec_done(len(ids), req)
            return web.json_response(chunk(True))

        # Under --spec-alpha one event a verify step, with all its tokens, as SGLang streams a speculative answer
        ends = self._step_ends(req.max_tokens)

        async def events() -> AsyncIterator[dict[str, Any]]:
            nonlocal text, ids
            i = 0
            async for word, tid in self._tokens(req.max_tokens, prefill):
                i += 1
                text, ids = text + word, [*ids, tid]
                if ends is None or i in ends:
                    yield chunk(i == req.max_tokens)  # SGLang streams the cumulative text
            if req.max_tokens == 0:
                yield chunk(True)
            self.spec_done(len(ids), req)

        return await self._sse(request, events())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = await self._admit(request, parse_completion, self.p.openai_error)
        if isinstance(req, web.Response):
            return req
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": req.model or self.names[0]}
        usage = _usage(req.prompt_tokens, req.max_tokens)
        prefill = self._prefill(req)[1]

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}

        if (refused := self._meta_refused(req)) is not None:
            return refused
        if not req.stream:
            text = "".join([w async for w, _ in self._tokens(req.max_tokens, prefill)])
            self.spec_done(req.max_tokens, req)
            return web.json_response({**head, "choices": [{**choice(text, "length"), **self._choice_meta(req)}],
                                      "usage": usage, **self.spec_answer(req, req.max_tokens)})

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for word, _ in self._tokens(req.max_tokens, prefill):
                yield {**head, "choices": [choice(word, None)], "usage": None}
            self.spec_done(req.max_tokens, req)
            last = self.spec_answer(req, req.max_tokens)
            yield {**head, "choices": [choice("", "length")], "usage": None, **({} if req.include_usage else last)}
            if req.include_usage:
                yield {**head, "choices": [], "usage": usage, **last}

        return await self._sse(request, events())

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._admit(request, parse_chat, self.p.openai_error)
        if isinstance(req, web.Response):
            return req
        if self.a.no_chat_template:
            return self.p.openai_error(400, NO_CHAT_TEMPLATE)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": req.model or self.names[0]}
        usage = _usage(req.prompt_tokens, req.max_tokens)
        prefill = self._prefill(req)[1]

        if (refused := self._meta_refused(req)) is not None:
            return refused
        if not req.stream:
            text = "".join([w async for w, _ in self._tokens(req.max_tokens, prefill)])
            self.spec_done(req.max_tokens, req)
            message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
            return web.json_response({**head, "object": "chat.completion", "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": "length",
                 "matched_stop": None, **self._choice_meta(req)}], "usage": usage,
                **self.spec_answer(req, req.max_tokens)})

        def delta(d: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {**head, "object": "chat.completion.chunk", "usage": None,
                    "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]}

        async def events() -> AsyncIterator[dict[str, Any]]:
            yield delta({"role": "assistant", "content": ""}, None)
            i = 0
            async for word, _ in self._tokens(req.max_tokens, prefill):
                # --reasoning-tokens: a reasoning model's first tokens go in vLLM's DeltaMessage field
                # `reasoning`, not `content` (vllm/entrypoints/openai/engine/protocol.py).
                yield delta({"reasoning" if i < self.a.reasoning_tokens else "content": word}, None)
                i += 1
            self.spec_done(req.max_tokens, req)
            last = self.spec_answer(req, req.max_tokens)  # in the last event, as vLLM's test_per_request_... checks
            yield {**delta({}, "length"), **({} if req.include_usage else last)}
            if req.include_usage:
                yield {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage, **last}

        return await self._sse(request, events())

    async def _sse(self, request: web.Request, events: AsyncIterator[dict[str, Any]]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if self.p.closes_after_errors_and_streams:
            resp.force_close()
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


def main(args: argparse.Namespace) -> int:
    if (args.tls_cert is None) != (args.tls_key is None):
        print("genready simulate: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.tls_client_ca and not args.tls_cert:
        print("genready simulate: --tls-client-ca needs --tls-cert and --tls-key", file=sys.stderr)
        return 2
    if args.models_autoload and not args.router:
        print("genready simulate: --models-autoload needs --router", file=sys.stderr)
        return 2
    if args.spec_alpha is not None and args.spec_accept is not None:
        print("genready simulate: --spec-alpha and --spec-accept each set the accept length; give one",
              file=sys.stderr)
        return 2
    if args.surface is not None and (args.batch_max_running is None or args.spec_alpha is not None
                                     or args.spec_accept is not None):
        print("genready simulate: --surface needs --batch-max-running, and sets the accept length itself (no "
              "--spec-alpha, --spec-accept)", file=sys.stderr)
        return 2
    if (factor := simargs.apply_load_noise(args)) != 1.0:
        print(f"genready simulate: --load-noise: this load's steps take {factor:.4f} times their time", file=sys.stderr)
    try:  # refused as the engine would
        if (shape := simsurface.from_args(args)) is not None:
            args.spec_accept = shape.accept  # what the server reports of it (counters, meta_info)
        simbatch.from_args(args, spec_model(args), vllm_speculative_config(args),
                           sglang_adaptive(args, spec_model(args)))
    except (ValueError, OSError) as e:
        print(f"genready simulate: {e}", file=sys.stderr)
        return 2
    return asyncio.run(Simulator(args).run())


def parser() -> argparse.ArgumentParser:
    """`genready simulate`'s argument parser."""
    p = argparse.ArgumentParser(prog="genready simulate", description="An LLM-server simulator with SGLang's "
                                "HTTP surface and its failure modes (for tests, the demo and dry runs); --profile "
                                "sglang|vllm|llamacpp imitates one server as its source does (docs/servers.md).")
    simargs.add_arguments(p)
    return p


def cli(argv: list[str]) -> int:
    """`genready simulate ARGS`."""
    return main(parser().parse_args(argv))
