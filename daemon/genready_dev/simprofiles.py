"""The simulator's profiles: what each real server does where servers differ (its error shapes, the paths its
key leaves open, its start-up, its routes beside the common ones, its refusals), each taken from that server's
source, named at each place. One Profile per ServerKind with a `sim_profile` (servers/kinds.py), keyed by it:
`genready simulate --profile NAME` imitates that kind. The HTTP serving itself is sim.py's Simulator, which
asks its profile and never a server's name.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from genready.servers import kinds
from genready.servers.kinds import ServerKind
from genready_dev import simengine

if TYPE_CHECKING:
    from genready_dev.sim import Simulator

# SGLang's refusal of a text prompt by a server started with --skip-tokenizer-init
# (python/sglang/srt/managers/tokenizer_manager.py, _tokenize_one_request); answered 400.
NO_TOKENIZER = ("The engine initialized with skip_tokenizer_init=True cannot accept text prompts. Please provide "
                "input_ids or re-initialize the engine with skip_tokenizer_init=False.")



def native_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)



_OPENAI_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
                       503: "ServiceUnavailableError"}
def openai_error(status: int, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message,
                              "type": _OPENAI_ERROR_TYPES.get(status, "BadRequestError"),
                              "param": None, "code": status}, status=status)



ErrorFn = Callable[[int, str], web.Response]


# --- the servers, from their source ------------------------------------------------------------

def _unauthorized() -> web.Response:
    # SGLang (python/sglang/srt/utils/common.py, add_api_key_middleware) and vLLM
    # (vllm/entrypoints/openai/server_utils.py, AuthenticationMiddleware) answer the same body.
    return web.json_response({"error": "Unauthorized"}, status=401)


_VLLM_TYPES = {400: "Bad Request", 404: "NotFoundError", 500: "InternalServerError", 503: "Service Unavailable"}


def vllm_error(status: int, message: str, param: str | None = None) -> web.Response:
    # vLLM's ErrorResponse: {"error": {message, type, param, code}}
    # (vllm/entrypoints/openai/engine/protocol.py; server_utils.py validation_exception_handler: 400)
    return web.json_response({"error": {"message": message, "type": _VLLM_TYPES.get(status, "BadRequestError"),
                                        "param": param, "code": status}}, status=status)


_LLAMA_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


def llamacpp_error(status: int, message: str) -> web.Response:
    # llama.cpp's format_error_response: {"error": {code, message, type}} (tools/server/server-common.cpp;
    # the 401 and the "Loading model" 503 are written out in tools/server/server-http.cpp)
    return web.json_response({"error": {"code": status, "message": message,
                                        "type": _LLAMA_TYPES.get(status, "server_error")}}, status=status)



# --- each server's routes beside the common ones ---------------------------------------------------------

def own_api_routes(sim: Simulator, app: web.Application) -> None:
    """SGLang's (and the generic server's) own routes: python/sglang/srt/entrypoints/http_server.py."""
    app.router.add_get("/metrics", sim.metrics)
    app.router.add_get("/get_model_info", sim.model_info)
    app.router.add_get("/health_generate", sim.health)
    app.router.add_get("/get_server_info", sim.server_info)
    app.router.add_get("/server_info", sim.server_info)  # the newer name of the same route (docs.sglang.io)
    app.router.add_post("/generate", sim.generate)
    app.router.add_route("GET", "/flush_cache", sim.flush_cache)
    app.router.add_route("POST", "/flush_cache", sim.flush_cache)


def slot_routes(sim: Simulator, app: web.Application) -> None:
    """llama.cpp's: tools/server/server.cpp registers /slots, /props, /v1/health and /metrics."""
    app.router.add_get("/metrics", sim.metrics)
    app.router.add_get("/slots", sim.slots)
    app.router.add_get("/props", sim.props)
    app.router.add_post("/slots/{id_slot}", sim.slot_action)
    app.router.add_get("/v1/health", sim.health)


def dev_mode_routes(sim: Simulator, app: web.Application) -> None:
    """vLLM's: /metrics, /ping, and the reset routes only with VLLM_SERVER_DEV_MODE (vllm/envs.py: bool(int(...)))."""
    app.router.add_get("/metrics", sim.metrics)
    app.router.add_get("/ping", sim.health)
    if os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0"):
        for path in ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache"):
            app.router.add_post(path, sim.reset_cache)


def iteration_stats_routes(sim: Simulator, app: web.Application) -> None:
    """TensorRT-LLM's (tensorrt_llm/serve/openai_server.py, register_routes): /health_generate, /version, and
    /metrics as JSON iteration stats. (/prometheus/metrics is mounted only with return_perf_metrics and holds no
    speculative-decoding figure: not simulated.)"""
    async def metrics(request: web.Request) -> web.Response:
        return web.json_response(iteration_stats(sim))

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0+genready.sim"})  # never a real release's number

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health_generate", sim.health)
    app.router.add_get("/version", version)


def iteration_stats(sim: Simulator) -> list[dict[str, Any]]:
    """The iteration stats since the previous read, as get_iteration_stats drains them (openai_server.py,
    `llm.get_stats_async`): the simulator has no iterations of its own, so everything since the last read is one
    row; its specDecodingStats (cpp/include/tensorrt_llm/executor/types.h) only under --spec-accept."""
    c, last = sim.spec_counters, sim.stats_read
    sim.stats_read = (c.drafts, c.draft_tokens, c.accepted)
    steps, drafted, accepted = c.drafts - last[0], c.draft_tokens - last[1], c.accepted - last[2]
    if not steps:
        return []
    row: dict[str, Any] = {"iter": c.drafts, "iterLatencyMS": 0.0, "gpuMemUsage": 0, "numActiveRequests": 0}
    row["specDecodingStats"] = {"numDraftTokens": drafted, "numAcceptedTokens": accepted,
                                "numRequestsWithDraftTokens": steps, "acceptanceLength": (accepted + steps) / steps,
                                "iterLatencyMS": 0.0, "draftOverhead": 0.0}
    return [row]


def model_card(sim: Simulator, m: str) -> dict[str, Any]:
    """TensorRT-LLM's ModelCard (tensorrt_llm/serve/openai_protocol.py): id, object, created, owned_by."""
    return {"id": m, "object": "model", "created": sim.created, "owned_by": "tensorrt_llm"}


def router_card(sim: Simulator, m: str) -> dict[str, Any]:
    """llama.cpp's model entry; its router's carries each model's status (tools/server/server-models.cpp)."""
    entry: dict[str, Any] = {"id": m, "object": "model", "owned_by": "llamacpp", "created": sim.created}
    if sim.router:
        entry["status"] = {"value": sim.router[m], "args": []}
    return entry


def llamacpp_not_found() -> web.Response:
    return llamacpp_error(404, "File Not Found")  # tools/server/server-http.cpp's error handler


@dataclass(frozen=True)
class Profile:
    """What one real server does where servers differ. Each field names the file it comes from."""

    key_exempt: Callable[[str], bool]  # paths answered without the API key
    unauthorized: Callable[[], web.Response]
    native_error: ErrorFn  # errors of POST /generate
    openai_error: ErrorFn  # errors of the /v1 routes
    has_native: bool = True  # serves SGLang's /generate
    loading_gate: bool = False  # binds at once; every route answers 503 until loaded
    # cpp-httplib (llama.cpp): every answer >= 400 closes its connection, and so does the end of a
    # streamed answer, although its headers offered keep-alive
    closes_after_errors_and_streams: bool = False
    # llama.cpp --host X.sock: binds without removing a file at the path (a stale socket fails the
    # start: "couldn't bind HTTP server socket"), and leaves its socket file behind on exit
    uds_stale_blocks: bool = False
    listen_after_load: bool = False  # binds the socket at once, listen()s only once loaded
    health_poll: float = 0.0  # a healthy /health answers after this long
    warmup_seconds: float = 0.0  # after binding: generations work while /health says 503
    linger_seconds: float = 0.0  # after SIGTERM: keeps serving, /health 503
    checks_model: bool = False  # an unknown `model` is 404
    health_ok: Callable[[], web.Response] = lambda: web.Response(status=200)
    # The product's ServerKind of this server: its counter names come from there (None: the generic server,
    # which has SGLang's surface)
    kind: ServerKind | None = None
    engine_label: bool = False  # its counters carry engine="0" (vLLM's per-engine loggers)
    start_log: Callable[[argparse.Namespace], None] | None = None  # what its start writes (simengine.py)
    not_found: Callable[[], web.Response] = lambda: web.json_response({"detail": "Not Found"}, status=404)  # FastAPI
    # its routes beside the common ones (models, health, the OpenAI generations): each adds them to the app
    routes: tuple[Callable[[Simulator, web.Application], None], ...] = ()
    no_tokenizer: str = NO_TOKENIZER  # its refusal of a text prompt under --skip-tokenizer-init
    card: Callable[[Simulator, str], dict[str, Any]] | None = None  # its /v1/models entry (None: OpenAI's)
    owned_by: str = "sglang"  # an OpenAI model card's owned_by
    per_request_metrics: bool = False  # its answers can carry metrics.speculative_decoding (vLLM)
    spec_on_metrics: bool = True  # its speculative-decoding counters are on its Prometheus page
    engine_info: str = ""  # a *_info gauge line of its Prometheus page (vLLM's cache config)

    @property
    def name(self) -> str:
        return self.kind.sim_profile if self.kind is not None else "generic"

    @property
    def surface(self) -> ServerKind:
        """The kind whose counter names it uses: its own, or (the generic server) SGLang's."""
        return self.kind or kinds.SGLANG


_PROFILES: Final[tuple[Profile, ...]] = (
    # The generic server of the flags: SGLang's surface, nothing profile-specific.
    Profile(lambda path: path.startswith("/health"), _unauthorized, native_error, openai_error,
            routes=(own_api_routes,)),
    Profile(
        # add_api_key_middleware (python/sglang/srt/utils/common.py): /health* and /metrics* pass
        lambda path: path.startswith(("/health", "/metrics")), _unauthorized,
        # http_server.py: a ValueError from /generate is 400 {"error": {"message"}}; the OpenAI
        # routes' ErrorResponse is {"object": "error", message, type, param, code}
        # (python/sglang/srt/entrypoints/openai/protocol.py)
        native_error, openai_error,
        # http_server.py health_generate: after a 1-token generation it sleeps 1 s at a time until
        # the scheduler answered, then 200; 503 while ServerStatus.Starting or gracefully_exit
        health_poll=1.0,
        # http_server.py _wait_and_warmup: the port is bound (every scheduler loaded), then a warmup
        # POST /generate runs, and only then server_status = Up: /health is 503 until then
        # (managers/tokenizer_manager.py, ServerStatus)
        warmup_seconds=1.0,
        # tokenizer_manager.py: on SIGTERM gracefully_exit is set, /health answers 503, requests in
        # flight and new ones are still served while it drains
        linger_seconds=1.0, kind=kinds.SGLANG, routes=(own_api_routes,),
        spec_on_metrics=False),  # python/sglang/srt/metrics/collector.py: no speculative-decoding counters
    Profile(
        # AuthenticationMiddleware (vllm/entrypoints/openai/server_utils.py): only paths starting
        # with /v1 want the key; /health, /metrics, /ping pass
        lambda path: not path.startswith("/v1"), _unauthorized,
        lambda status, message: vllm_error(status, message), lambda status, message: vllm_error(status, message),
        has_native=False,
        # vllm/entrypoints/openai/api_server.py: the socket is created and bound (SO_REUSEADDR,
        # SO_REUSEPORT) before the engine is built, uvicorn listen()s on it after
        listen_after_load=True,
        # models/serving.py check_model: an unknown model is 404 "The model `x` does not exist."
        # Shutdown: SIGTERM cancels the server task, no draining (vllm/entrypoints/launcher.py,
        # serve_http): linger 0.
        checks_model=True, kind=kinds.VLLM, engine_label=True,
        # its start logs the arguments it runs with (vllm/entrypoints/serve/utils/api_utils.py; simengine.py)
        start_log=simengine.log_vllm_args, routes=(dev_mode_routes,),
        # vllm/v1/engine/async_llm.py, get_tokenizer
        no_tokenizer="Unable to get tokenizer because skip_tokenizer_init is True", owned_by="vllm",
        # --per-request-spec-decode-metrics (kinds.VLLM.answer_spec); vllm/v1/metrics/loggers.py: *_info gauges
        per_request_metrics=True, engine_info=simengine.VLLM_CACHE_INFO),
    Profile(
        # tools/server/server-http.cpp get_public_endpoints: only /health and /v1/health (and the web
        # UI's assets, when built with it) pass without the key; /v1/models is 401 (checked on the
        # real llama-server 11434; older versions also let /models, /v1/models and / through)
        lambda path: path in ("/health", "/v1/health"),
        lambda: llamacpp_error(401, "Invalid API Key"), llamacpp_error, llamacpp_error,
        has_native=False,
        # server-http.cpp middleware_server_state, checked before the key: 503 "Loading model" on
        # every route while the model loads, the model list included (older versions,
        # tools/server/server.cpp, let the model list through)
        loading_gate=True,
        # vendor/cpp-httplib/httplib.cpp Server::write_response_core ("Don't leave connections open
        # after errors"); a stream's provider ends the keep-alive loop (server-http.cpp)
        closes_after_errors_and_streams=True,
        # server-http.cpp: AF_UNIX when --host ends in .sock, bound as is (the real server: exit 1)
        uds_stale_blocks=True,
        # tools/server/server-context.cpp get_health: {"status": "ok"}. Shutdown: SIGTERM terminates
        # the task queue, no draining (tools/server/server.cpp, shutdown_handler): linger 0.
        health_ok=lambda: web.json_response({"status": "ok"}), kind=kinds.LLAMA_CPP,
        routes=(slot_routes,), not_found=llamacpp_not_found, card=router_card),
    Profile(
        # tensorrt_llm/commands/serve.py and serve/openai_server.py: no API key at all
        lambda path: True, _unauthorized,
        # OpenAIServer.create_error_response: ErrorResponse {object: "error", message, type, param, code}, 400 for
        # a request it cannot serve and for FastAPI's validation errors (serve/openai_protocol.py)
        openai_error, openai_error,
        has_native=False,
        # serve.py launch_server: the socket is bound before the LLM is built, uvicorn serves on it after
        listen_after_load=True,
        # openai_server.py: GET /metrics is JSON iteration stats; its speculative-decoding figures are there, not
        # on a Prometheus page. /health answers 200 with no body once it serves; no route checks `model`.
        # Shutdown: uvicorn's, no draining (linger 0).
        kind=kinds.TENSORRT_LLM, routes=(iteration_stats_routes,), card=model_card, owned_by="tensorrt_llm",
        spec_on_metrics=False),
)


# The profiles by `genready simulate --profile` name, that name the kind's own (servers/kinds.py: SIMULATED);
# "" is the generic server.
PROFILES: Final[dict[str, Profile]] = {("" if p.kind is None else p.kind.sim_profile): p for p in _PROFILES}
