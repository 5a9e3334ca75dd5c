"""Between a sweep's runs: warm the server up, then empty its prefix cache through its own route.

A run that reuses a verified instance would otherwise measure its TTFT on prompts the run
before it left in the server's prefix (radix, KV) cache. The tools that reuse a server reset
it between runs; so does the sweep, with `between_points = "flush"`, through each server's
own route: each ServerKind's flush (servers/kinds.py, where each route is read from its server's
source). A server with none of them cannot be flushed: the sweep says so once, naming the fix
(kinds.FIX), and records its reused points `warm`. The warmup sends the target's own probe request
(its `prompt`, `max_tokens`, `api`) N times before each run, and the flush comes after it, so
the warmup never warms what the run measures. `warmup = "stable"` streams it instead (the bench
client's own streamed request, benchrun.one_stream, for TTFT and ITL) in windows until the
medians settle (convergence.py).

Every answer is read to its end or to MAX_ANSWER, whichever comes first: one read() returns
only what has arrived so far (a 265 KB /metrics page came back as 32-128 KB).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any, Final

import aiohttp

from genready import apis
from genready.config import TargetConfig
from genready.servers import engineconfig, kinds
from genready.servers.flush import Call, Flushed
from genready.tools import benchrun, convergence
from genready.tools.benchfigures import Outcome

__all__ = ["ServerHttp", "engine_config", "flush", "warm_until_stable", "warm_up"]

TIMEOUT: Final = 30.0  # seconds for one flush or /metrics request: a server that takes longer is not idle
BUSY_WAIT: Final = 30.0  # seconds SGLang's 400 ("requests are running") is waited out
# Tokens a stable warmup's request asks for (at least): a probe's 1 token has a TTFT but no ITL to settle.
WARMUP_TOKENS: Final = 16
MAX_ANSWER: Final = 4 << 20  # bytes read of an answer: a slot list or a /metrics page, not a download


async def read_capped(content: aiohttp.StreamReader, cap: int) -> bytes | None:
    """The whole body, read to its end; None as soon as it passes `cap` bytes (what is past it is not held)."""
    buf = bytearray()
    while chunk := await content.read(cap + 1 - len(buf)):
        buf += chunk
        if len(buf) > cap:
            return None
    return bytes(buf)


class ServerHttp:
    """HTTP to a target's server (not the daemon): its URL, API key and TLS as the target has them."""

    def __init__(self, target: TargetConfig, timeout: float = TIMEOUT) -> None:
        self.t, self.timeout = target, timeout
        ep = target.endpoint
        # A unix socket: aiohttp's UnixConnector, with the URL's host as Host:
        self.base = f"http://localhost{ep.path_prefix}" if ep.unix_path is not None else ep.base_url
        self.headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}

    def session(self) -> aiohttp.ClientSession:
        """A new session to the server (its socket, TLS and API key); the caller closes it."""
        return self._session()

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
                data = await read_capped(r.content, MAX_ANSWER)
                if data is None:
                    too_big = f"{method} {path}: an answer over the {MAX_ANSWER:,}-byte limit, not read further"
                    return 0, too_big.encode()
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
    """Empty the server's prefix cache by the first of the known routes it has (servers/kinds.py, each kind's flush)."""
    async def work(call: Call) -> Flushed:
        return await kinds.flush(call, busy_wait)
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


def engine_config(http: ServerHttp, read: engineconfig.EngineRead, args_line: str | None = None
                  ) -> engineconfig.EngineConfig:
    """What the server says it runs (servers/engineconfig.py), each answer bounded as every answer here."""
    async def work(call: Call) -> engineconfig.EngineConfig:
        return await engineconfig.read_engine(read, call, args_line)
    result: engineconfig.EngineConfig = http.calls(work)
    return result


def warm_until_stable(http: ServerHttp, rule: convergence.Rule) -> tuple[convergence.Verdict, str]:
    """Stream the target's probe prompt (at least WARMUP_TOKENS tokens), one request after another, until
    convergence.verdict says the windows settled or a bound was reached: (the verdict, the first failure's
    words or "")."""
    t = http.t
    api = apis.APIS[t.api]

    async def main() -> tuple[convergence.Verdict, str]:
        async with http.session() as session:
            model = t.model
            if api.needs_model and not model:
                model = await benchrun.discover_model(session, http.base, t.probe_timeout) or ""
            body = apis.stream_body(api, prompt=t.prompt, max_tokens=max(t.max_tokens, WARMUP_TOKENS),
                                    model=model or "", prompt_ids=t.prompt_ids)
            samples: list[convergence.Sample] = []
            first, t0 = "", time.monotonic()
            answered = False  # `first` is a failure the server answered (an HTTP status), not a transport error
            while True:
                left = rule.max_seconds - (time.monotonic() - t0)
                try:  # the bench client's streamed request: the warmup's TTFT and ITL are measured as the run's
                    got = await benchrun.one_stream(session, http.base, api, body,
                                                    max(0.1, min(t.probe_timeout, left)))
                except Exception as e:  # as the bench client: what no rule foresaw is one failed request
                    got = Outcome(False, 0.0, error=f"{type(e).__name__}: {apis.excerpt(str(e))}")
                samples.append(convergence.Sample(got.ttft if got.ok else None, got.itl))
                if not got.ok and (not first or (not answered and got.error.startswith("HTTP "))):
                    # The server's own words beat a transport error's: llama-server answers a prompt beyond its
                    # context with 400 and its reason, and may close before the body is written (ClientOSError)
                    first = f"POST {api.path} (streamed): {got.error}" + (f": {got.said}" if got.said else "")
                    answered = got.error.startswith("HTTP ")
                if (v := convergence.verdict(samples, time.monotonic() - t0, rule)) is not None:
                    return v, first
    result: tuple[convergence.Verdict, str] = asyncio.run(main())
    return result
