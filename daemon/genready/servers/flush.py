"""The flush of a server's prefix cache, one function per server kind, each as the server's source has it.

A flush answers None when the server has not this kind's route, so the next kind is asked
(kinds.flush); otherwise what it came to, emptied or why not.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from genready.apis import excerpt

# (status, body) of one request to the server; status 0 (with the error as body) when it could not be asked.
Call = Callable[..., Awaitable[tuple[int, bytes]]]


@dataclass(frozen=True)
class Flushed:
    """What a flush came to: `route` when the cache was emptied, else `why` it could not be."""

    route: str = ""
    why: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.route)


# A kind's flush: its result, or None when the server has not this kind's route (the next kind is asked).
Flush = Callable[[Call, float], Awaitable[Flushed | None]]


# --- flushes, each as the server's source has it ---------------------------------------------------------

BUSY_POLL: Final = 0.25


async def flush_sglang(call: Call, busy_wait: float) -> Flushed | None:
    # python/sglang/srt/entrypoints/http_server.py, flush_cache: GET or POST; 400 while requests are running or
    # waiting (the run's last ones may still be finishing), waited out (bounded) and asked again.
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
    return None


async def flush_vllm(call: Call, busy_wait: float) -> Flushed | None:
    # vllm/entrypoints/serve/cache/api_router.py: 200; the routes exist only with VLLM_SERVER_DEV_MODE=1.
    status, _ = await call("POST", "/reset_prefix_cache")
    if status != 200:
        return None
    for extra in ("/reset_mm_cache", "/reset_encoder_cache"):  # where the server has them
        await call("POST", extra)
    return Flushed("vLLM /reset_prefix_cache")


async def flush_llamacpp(call: Call, busy_wait: float) -> Flushed | None:
    # tools/server/server-context.cpp, handle_slots / handle_slots_action: 501 with --no-slots, and (checked on
    # the real llama-server 11434) every slot action is 501 unless it runs with --slot-save-path DIR.
    status, body = await call("GET", "/slots")
    if status == 501:
        return Flushed(why="llama-server's /slots is disabled (--no-slots): start it without --no-slots")
    if status in (401, 403):
        return Flushed(why=f"llama-server's /slots answered {status}: the target's api_key is not the server's")
    if status != 200:
        return None
    try:
        ids = [s["id"] for s in json.loads(body) if isinstance(s, dict) and isinstance(s.get("id"), int)]
    except (ValueError, TypeError, KeyError):
        ids = []
    if not ids:
        return Flushed(why=f"llama-server's /slots listed no slot ids: {excerpt(body)}")
    for i in ids:
        status, body = await call("POST", f"/slots/{i}?action=erase")
        if status == 501:
            return Flushed(why="llama-server refuses slot actions (501: it was started without "
                           "--slot-save-path): start it with --slot-save-path DIR")
        if status != 200:
            return Flushed(why=f"llama-server's POST /slots/{i}?action=erase answered {status}: {excerpt(body)}")
    return Flushed(f"llama-server /slots/ID?action=erase ({len(ids)} slot{'s' if len(ids) != 1 else ''})")


