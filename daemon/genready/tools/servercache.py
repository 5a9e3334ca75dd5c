"""Between a sweep's runs: warm the server up, then empty its prefix cache through its own route.

A run that reuses a verified instance would otherwise measure its TTFT on prompts the run
before it left in the server's prefix (radix, KV) cache. The tools that reuse a server reset
it between runs; so does the sweep, with `between_points = "flush"`, through each server's
own route, as its source has it:

- SGLang: `/flush_cache`, GET or POST (python/sglang/srt/entrypoints/http_server.py,
  flush_cache): 200, or 400 while requests are running or waiting, so a 400 is waited out
  (bounded) and asked again;
- vLLM: `POST /reset_prefix_cache`, then `/reset_mm_cache` and `/reset_encoder_cache`
  (vllm/entrypoints/serve/cache/api_router.py): 200; the routes exist only when the server
  runs with VLLM_SERVER_DEV_MODE=1 (attach_router), else 404;
- llama.cpp's llama-server: `GET /slots` lists the slots, `POST /slots/{id}?action=erase`
  empties one (tools/server/server-context.cpp, handle_slots / handle_slots_action); 501 when
  the server runs with `--no-slots`, and (checked on the real llama-server 11434) every slot
  action, erase too, is 501 "This server does not support slots action" unless it runs with
  `--slot-save-path DIR`.

A server with none of them cannot be flushed: the sweep says so once, naming the fix, and
records its reused points `warm`. The warmup sends the target's own probe request (its
`prompt`, `max_tokens`, `api`) N times before each run, and the flush comes after it, so the
warmup never warms what the run measures.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from genready import apis
from genready.config import TargetConfig

TIMEOUT: Final = 30.0  # seconds for one flush or /metrics request: a server that takes longer is not idle
BUSY_WAIT: Final = 30.0  # seconds SGLang's 400 ("requests are running") is waited out
BUSY_POLL: Final = 0.25
MAX_ANSWER: Final = 4 << 20  # bytes read of an answer: a slot list or a /metrics page, not a download
NO_ROUTE: Final = ("the server has none of the flush routes (SGLang /flush_cache; vLLM POST /reset_prefix_cache, "
                   "which exists only with VLLM_SERVER_DEV_MODE=1 in the server's environment; llama-server "
                   "GET /slots and POST /slots/ID?action=erase, which need --slot-save-path DIR and not --no-slots)")
FIX: Final = 'set between_points = "restart" in the plan for a fresh start per point'


@dataclass(frozen=True)
class Flushed:
    """What a flush came to: `route` when the cache was emptied, else `why` it could not be."""

    route: str = ""
    why: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.route)


class ServerHttp:
    """HTTP to a target's server (not the daemon): its URL, API key and TLS as the target has them."""

    def __init__(self, target: TargetConfig, timeout: float = TIMEOUT) -> None:
        self.t, self.timeout = target, timeout
        ep = target.endpoint
        # A unix socket: aiohttp's UnixConnector, with the URL's host as Host:
        self.base = f"http://localhost{ep.path_prefix}" if ep.unix_path is not None else ep.base_url
        self.headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}

    def _session(self) -> aiohttp.ClientSession:
        if self.t.unix_path is not None:
            connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=self.t.unix_path)
        else:
            ctx = self.t.tls_context
            tls: ssl.SSLContext | bool = ctx if ctx is not None else True
            connector = aiohttp.TCPConnector(ssl=tls)
        return aiohttp.ClientSession(connector=connector, headers=self.headers)

    async def _one(self, session: aiohttp.ClientSession, method: str, path: str, body: Any = None,
                   timeout: float | None = None) -> tuple[int, bytes]:
        try:
            async with session.request(method, self.base + path, json=body, allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=timeout or self.timeout)) as r:
                data = await r.content.read(MAX_ANSWER)
                return r.status, data
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            return 0, f"{type(e).__name__}: {e}".encode()

    def calls(self, work: Callable[[Callable[..., Any]], Any]) -> Any:
        """Run `work(call)` in one session, where `await call(method, path, body=None)` is (status, body);
        status 0 (with the error as body) when the server could not be asked."""
        async def main() -> Any:
            async with self._session() as session:
                async def call(method: str, path: str, body: Any = None, timeout: float | None = None
                               ) -> tuple[int, bytes]:
                    return await self._one(session, method, path, body, timeout)
                return await work(call)
        return asyncio.run(main())

    def get(self, path: str) -> tuple[int, bytes]:
        async def work(call: Callable[..., Any]) -> tuple[int, bytes]:
            got: tuple[int, bytes] = await call("GET", path)
            return got
        result: tuple[int, bytes] = self.calls(work)
        return result


def flush(http: ServerHttp, *, busy_wait: float = BUSY_WAIT) -> Flushed:
    """Empty the server's prefix cache by the first of the known routes it has (see the module's words)."""
    async def work(call: Callable[..., Any]) -> Flushed:
        # SGLang: 400 while it has requests running or waiting (the run's last ones may still be finishing).
        deadline = time.monotonic() + busy_wait
        while True:
            status, body = await call("POST", "/flush_cache")
            if status != 400 or time.monotonic() >= deadline:
                break
            await asyncio.sleep(BUSY_POLL)
        if status == 200:
            return Flushed("SGLang /flush_cache")
        if status == 400:
            return Flushed(why=f"SGLang /flush_cache still answered 400 (requests running) after {busy_wait:g}s")
        if status == 0:
            return Flushed(why=f"the server could not be asked: {body.decode('utf-8', 'replace')[:200]}")
        if status in (401, 403):
            return Flushed(why=f"/flush_cache answered {status}: the target's api_key is not the server's")
        status, _ = await call("POST", "/reset_prefix_cache")
        if status == 200:
            for extra in ("/reset_mm_cache", "/reset_encoder_cache"):  # where the server has them
                await call("POST", extra)
            return Flushed("vLLM /reset_prefix_cache")
        status, body = await call("GET", "/slots")
        if status == 501:
            return Flushed(why="llama-server's /slots is disabled (--no-slots): start it without --no-slots")
        if status in (401, 403):
            return Flushed(why=f"llama-server's /slots answered {status}: the target's api_key is not the server's")
        if status == 200:
            try:
                ids = [s["id"] for s in json.loads(body) if isinstance(s, dict) and isinstance(s.get("id"), int)]
            except (ValueError, TypeError, KeyError):
                ids = []
            if not ids:
                return Flushed(why=f"llama-server's /slots listed no slot ids: {apis.excerpt(body)}")
            for i in ids:
                status, body = await call("POST", f"/slots/{i}?action=erase")
                if status == 501:
                    return Flushed(why="llama-server refuses slot actions (501: it was started without "
                                   "--slot-save-path): start it with --slot-save-path DIR")
                if status != 200:
                    return Flushed(why=f"llama-server's POST /slots/{i}?action=erase answered {status}: "
                                   f"{apis.excerpt(body)}")
            return Flushed(f"llama-server /slots/ID?action=erase ({len(ids)} slot{'s' if len(ids) != 1 else ''})")
        return Flushed(why=NO_ROUTE)
    result: Flushed = http.calls(work)
    return result


def warm_up(http: ServerHttp, n: int) -> tuple[int, str]:
    """Send the target's probe generation `n` times, one after another: (how many were answered 200, the
    first failure's words or "")."""
    t = http.t
    api = apis.APIS[t.api]

    async def work(call: Callable[..., Any]) -> tuple[int, str]:
        model = t.model
        if api.needs_model and not model:
            status, body = await call("GET", apis.MODELS_PATH)
            try:
                model = apis.model_from_list(body) if status == 200 else ""
            except apis.BadAnswer:
                model = ""
        req = api.body(prompt=t.prompt, max_tokens=t.max_tokens, model=model or "", prompt_ids=t.prompt_ids)
        ok, first = 0, ""
        for _ in range(n):
            status, body = await call("POST", api.path, req, t.probe_timeout)
            if status == 200:
                ok += 1
            elif not first:
                first = f"POST {api.path} answered {status or 'nothing'}: {apis.excerpt(body)}"
        return ok, first
    result: tuple[int, str] = http.calls(work)
    return result
