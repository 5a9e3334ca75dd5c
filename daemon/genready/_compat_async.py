"""The asyncio and aiohttp half of compat.py (import the names from genready.compat, which loads
this module on first use so that the CLI never imports asyncio or aiohttp)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

T = TypeVar("T")

# Up to 3.10, asyncio.TimeoutError (raised by asyncio.wait_for and by aiohttp's client timeouts)
# is not the builtin TimeoutError, so `except TimeoutError` lets it through. Catch this tuple
# around anything that can raise the asyncio one. (Here, not in compat.py: it needs asyncio.)
TIMEOUT_ERRORS: tuple[type[Exception], ...] = (TimeoutError, asyncio.TimeoutError)

if sys.version_info >= (3, 11):
    timeout = asyncio.timeout
    wait_for = asyncio.wait_for
else:
    @contextlib.asynccontextmanager
    async def timeout(delay: float | None) -> AsyncIterator[None]:
        """asyncio.timeout (3.11+): cancel the block after `delay` seconds and raise the builtin
        TimeoutError instead. (Without Task.uncancel, a cancellation from outside arriving in the
        same instant as the deadline is reported as the timeout.)"""
        if delay is None:
            yield
            return
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout() must be used inside a task")
        fired = False

        def fire() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        handle = asyncio.get_running_loop().call_later(delay, fire)
        try:
            yield
        except asyncio.CancelledError:
            if fired:
                raise TimeoutError from None
            raise
        finally:
            handle.cancel()

    async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
        """asyncio.wait_for, raising the builtin TimeoutError as it does on 3.11+."""
        try:
            return await asyncio.wait_for(aw, timeout)
        except asyncio.TimeoutError:
            raise TimeoutError from None


# aiohttp 3.9 added web.AppKey and moved the graceful-shutdown wait from the sites to AppRunner.
AIOHTTP_VERSION = tuple(int(p) for p in aiohttp.__version__.split(".")[:2])
_AIOHTTP_39 = AIOHTTP_VERSION >= (3, 9)


def app_key(name: str, t: type[T]) -> web.AppKey[T]:
    """A typed application key on aiohttp 3.9+ (where string keys warn); the string itself on 3.8."""
    if _AIOHTTP_39:
        return web.AppKey(name, t)
    return name  # type: ignore[return-value]  # 3.8's Application takes any hashable key


class AppRunner(web.AppRunner):
    """web.AppRunner with `shutdown_timeout` said once, whichever aiohttp is installed. 3.9+ takes it
    here; 3.8 takes it on each site, and given to 3.8's AppRunner it is passed on to every
    connection's handler as an unknown argument, which drops each connection without a word."""

    def __init__(self, app: web.Application, *, shutdown_timeout: float, **kwargs: Any) -> None:
        if _AIOHTTP_39:
            kwargs["shutdown_timeout"] = shutdown_timeout
        super().__init__(app, **kwargs)
        self.site_shutdown_timeout = shutdown_timeout


def _site_kwargs(runner: web.BaseRunner, kwargs: dict[str, Any]) -> dict[str, Any]:
    if not _AIOHTTP_39 and isinstance(runner, AppRunner):
        kwargs["shutdown_timeout"] = runner.site_shutdown_timeout
    return kwargs


def tcp_site(runner: web.BaseRunner, host: str | None, port: int | None, **kwargs: Any) -> web.TCPSite:
    return web.TCPSite(runner, host, port, **_site_kwargs(runner, kwargs))


def sock_site(runner: web.BaseRunner, sock: socket.socket, **kwargs: Any) -> web.SockSite:
    return web.SockSite(runner, sock, **_site_kwargs(runner, kwargs))
