"""compat.py behaves the same on every supported Python and aiohttp. `./dev test` runs this file on
the .venv's Python, on Python 3.10 and on Debian 12's aiohttp 3.8, so each branch of compat.py is
exercised by one of those runs."""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from genready import compat

GREETING = compat.app_key("greeting", str)


async def test_timeout_raises_the_builtin_timeout_error() -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        async with compat.timeout(0.05):
            await asyncio.sleep(30)
    assert type(e.value) is TimeoutError  # not 3.10's asyncio.TimeoutError, which `except TimeoutError` misses
    assert time.monotonic() - t0 < 10


async def test_timeout_leaves_a_quick_block_and_outside_cancellation_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every timer scheduled from here on is recorded: each must be cancelled when its block ends,
    # so none can fire later (no sleep can show that; a cancelled handle can never run).
    loop = asyncio.get_running_loop()
    timers: list[asyncio.TimerHandle] = []
    call_at = loop.call_at

    def recorded(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        timers.append(call_at(when, callback, *args, **kwargs))
        return timers[-1]

    monkeypatch.setattr(loop, "call_at", recorded)
    async with compat.timeout(5):
        await asyncio.sleep(0)
    assert timers and all(t.cancelled() for t in timers), timers
    async with compat.timeout(None):
        await asyncio.sleep(0)
    started = asyncio.Event()

    async def guarded() -> None:
        async with compat.timeout(30):
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(guarded())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(timers) >= 3 and all(t.cancelled() for t in timers), timers  # the timeout's timer too


async def test_wait_for_raises_the_builtin_timeout_error() -> None:
    with pytest.raises(TimeoutError) as e:
        await compat.wait_for(asyncio.Event().wait(), 0.05)
    assert type(e.value) is TimeoutError
    assert await compat.wait_for(asyncio.sleep(0, result=7), 5) == 7


class Color(compat.StrEnum):
    RED = "red"
    DARK_BLUE = "dark-blue"


class Auto(compat.StrEnum):
    SOME_NAME = enum.auto()


def test_str_enum_members_are_their_values() -> None:
    assert str(Color.DARK_BLUE) == "dark-blue"
    assert f"{Color.RED}" == "red"
    assert f"{Color.RED:>5}" == "  red"
    assert "%s" % Color.RED == "red"  # noqa: UP031 (the logging module formats this way)
    assert json.dumps({"c": Color.RED}) == '{"c": "red"}'
    assert Color("red") is Color.RED
    assert Color.RED == "red"  # type: ignore[comparison-overlap]  # mypy does not know the str mixin compares
    assert str(Auto.SOME_NAME) == "some_name"


def test_utc_is_the_utc_timezone() -> None:
    from datetime import datetime, timedelta

    assert datetime(2026, 1, 1, tzinfo=compat.UTC).utcoffset() == timedelta(0)


def test_tomllib_parses() -> None:
    assert compat.tomllib.loads('a = 1\n[b]\nc = "d"\n') == {"a": 1, "b": {"c": "d"}}
    with pytest.raises(ValueError):
        compat.tomllib.loads("a = ")


class Served:
    """A real aiohttp server on loopback, with a handler that runs until released."""

    def __init__(self) -> None:
        self.hanging = asyncio.Event()
        self.release = asyncio.Event()
        self.runner: compat.AppRunner | None = None
        self.url = ""

    async def start(self, shutdown_timeout: float) -> None:
        async def hello(request: web.Request) -> web.Response:
            return web.Response(text=request.app[GREETING])

        async def hang(request: web.Request) -> web.Response:
            self.hanging.set()
            await self.release.wait()
            return web.Response(text="released")

        app = web.Application()
        app[GREETING] = "hello"
        app.router.add_get("/", hello)
        app.router.add_get("/hang", hang)
        self.runner = compat.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        await self.runner.setup()
        await compat.tcp_site(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    s = Served()
    await s.start(shutdown_timeout=0.2)
    try:
        yield s
    finally:
        s.release.set()  # aiohttp 3.8 leaves a handler running after its client left
        assert s.runner is not None
        await s.runner.cleanup()


async def test_runner_serves_and_app_keys_work(served: Served) -> None:
    # Given to aiohttp 3.8's AppRunner, shutdown_timeout made it drop every connection unanswered.
    async with aiohttp.ClientSession() as s, s.get(served.url + "/") as r:
        assert (r.status, await r.text()) == (200, "hello")


async def test_shutdown_timeout_bounds_the_wait_for_a_running_handler(served: Served) -> None:
    assert served.runner is not None
    async with aiohttp.ClientSession() as s:
        pending = asyncio.create_task(s.get(served.url + "/hang"))
        await compat.wait_for(served.hanging.wait(), 10)
        t0 = time.monotonic()
        await served.runner.cleanup()
        took = time.monotonic() - t0
        with pytest.raises(aiohttp.ClientError):
            await pending
    # aiohttp's default is 60 s (waited twice on 3.9+); 0.2 s asked for must not turn into that.
    assert took < 10, f"cleanup took {took:.1f} s"


async def test_timeout_errors_catch_aiohttp_client_timeouts(served: Served) -> None:
    caught: BaseException | None = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.1)) as s:
        try:
            await s.get(served.url + "/hang")
        except compat.TIMEOUT_ERRORS as e:
            caught = e
    assert caught is not None
