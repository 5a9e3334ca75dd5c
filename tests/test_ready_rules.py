"""/ready's query rules, in-process: the real app from serve/api.py (pytest-aiohttp's client,
real HTTP on loopback) over real gates whose systemd and server are the gate fakes
(gatefakes.py says why). The same answers against a real manager: test_api.py, test_hookups.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from genready.compat import wait_for
from genready.serve import api
from genready.serve.metrics import Metrics
from genready.serve.target import Target
from genready_dev.harness import await_for
from tests.gatefakes import Rig, snap

if TYPE_CHECKING:  # generic from aiohttp 3.9 on: spelled only for mypy, never at run time
    Client = TestClient[web.Request, web.Application]
INV = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


class Served:
    """Two targets, `a` (ready as pid 100) and `b` (not ready), behind the real app."""

    def __init__(self, tmp: Path) -> None:
        self.a, self.b = Rig(tmp / "a", "a"), Rig(tmp / "b", "b")
        self.metrics = Metrics("test")
        self.app = api.make_app({"a": Target(self.a.gate), "b": Target(self.b.gate)}, self.metrics, max_long_polls=2)
        self.client: Client | None = None

    async def get(self, path: str) -> tuple[int, Any]:
        assert self.client is not None
        async with self.client.get(path) as r:
            return r.status, await r.json()

    async def long_polls_in_flight(self, n: int, timeout: float = 10.0) -> None:
        polls: api.LongPolls = self.app[api.LONG_POLLS]  # type: ignore[assignment]
        await await_for(lambda: polls.active >= n, timeout, f"{n} long-poll(s) in flight", interval=0.005)

    def ready_requests(self, code: int) -> float:
        return self.metrics.registry.get_sample_value("genready_ready_requests_total", {"code": str(code)}) or 0.0


@pytest.fixture
async def served(tmp_path: Path, aiohttp_client: Callable[[web.Application], Awaitable[Client]]
                 ) -> AsyncIterator[Served]:
    s = Served(tmp_path)
    await s.a.ready(snap(inv=INV))
    s.b.show(snap("activating", 0, ""))
    s.client = await aiohttp_client(s.app)
    yield s
    await s.a.close()
    await s.b.close()


async def test_a_ready_target_answers_200_naming_the_verified_instance(served: Served) -> None:
    code, body = await served.get("/ready/a")
    assert code == 200
    assert body["ready"] is True and body["target"] == "a" and body["unit"] == "t.service"
    assert body["pid"] == 100 and body["invocation_id"] == INV
    assert served.ready_requests(200) == 1


async def test_a_200_needs_a_systemd_read_made_after_the_request(served: Served) -> None:
    """The gate's view says ready; systemd, read afresh, shows a job queued meanwhile: 503."""
    reads = served.a.fresh.reads
    served.a.fresh.snap = snap(inv=INV, job=7)
    code, body = await served.get("/ready/a")
    assert code == 503 and "job pending" in body["reason"]
    assert served.a.fresh.reads == reads + 1


async def test_not_ready_says_why_and_since_when(served: Served) -> None:
    code, body = await served.get("/ready/b")
    assert code == 503
    assert body["ready"] is False and body["target"] == "b" and body["state"] == "starting"
    assert body["reason"] and body["waiting_since"] and "probes" in body and "last_error" in body
    assert served.ready_requests(503) == 1


async def test_all_targets_are_ready_only_when_each_one_is(served: Served) -> None:
    code, body = await served.get("/ready")
    assert code == 503 and body["ready"] is False
    assert [t["target"] for t in body["targets"]] == ["b"]  # only the ones holding it back
    await served.b.ready(snap(pid=200, inv=OTHER))
    code, body = await served.get("/ready")
    assert code == 200 and [t["pid"] for t in body["targets"]] == [100, 200]


async def test_an_unknown_target_is_404_listing_the_known_ones(served: Served) -> None:
    code, body = await served.get("/ready/nope")
    assert code == 404 and body["targets"] == ["a", "b"] and "nope" in body["error"]


@pytest.mark.parametrize(("query", "ok"), [
    (f"pid=100&invocation={INV}", True),
    (f"invocation={INV.upper()}", True),  # systemd's spelling and the dashed UUID one are the same ID
    ("invocation=01234567-89ab-cdef-0123-456789abcdef", True),
    ("pid=101", False),
    (f"invocation={OTHER}", False),
    ("since=0", True),
    ("since=9999999999", False),  # the verified start began before `since`
    ("wait=0", True),
], ids=["pid-and-invocation", "upper-case", "dashed", "other-pid", "other-invocation", "since-old", "since-future",
        "wait-0"])
async def test_pin_to_an_instance_or_a_start_time(served: Served, query: str, ok: bool) -> None:
    code, body = await served.get(f"/ready/a?{query}")
    assert code == (200 if ok else 503), body
    if not ok:
        assert body["reason"]


@pytest.mark.parametrize(("query", "names"), [
    ("pid=abc", "pid"), ("pid=0", "pid"), ("pid=%C2%B2", "pid"), ("pid=" + "9" * 5000, "pid"),
    ("pid=4194305", "pid"), ("invocation=xyz", "invocation"), ("wait=-1", "wait"), ("wait=inf", "wait"),
    ("wait=%D9%A3", "wait"), ("since=nan", "since"), ("since=-5", "since"), ("verbose=1", "unknown"),
])
async def test_a_bad_query_is_400_naming_the_parameter(served: Served, query: str, names: str) -> None:
    code, body = await served.get(f"/ready/a?{query}")
    assert code == 400 and names in body["error"], body
    assert len(body["error"]) < 300  # a 5,000-digit value is cut short, not echoed


async def test_wait_returns_as_soon_as_the_target_is_ready(served: Served) -> None:
    t0 = time.monotonic()
    pending = asyncio.ensure_future(served.get("/ready/b?wait=30"))
    await served.long_polls_in_flight(1)
    assert not pending.done()
    await served.b.ready(snap(pid=200, inv=OTHER))
    code, body = await wait_for(pending, 10)
    assert code == 200 and body["pid"] == 200
    assert time.monotonic() - t0 < 10


async def test_wait_times_out_with_503(served: Served) -> None:
    t0 = time.monotonic()
    code, body = await served.get("/ready/b?wait=0.2")
    assert code == 503 and body["state"] == "starting"
    assert 0.2 <= time.monotonic() - t0 < 5


async def test_long_polls_beyond_the_limit_are_refused_at_once(served: Served) -> None:
    polls = [asyncio.ensure_future(served.get("/ready/b?wait=30")) for _ in range(2)]
    await served.long_polls_in_flight(2)
    assert served.client is not None
    async with served.client.get("/ready/b?wait=30") as r:
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert "too many long-polls" in (await r.json())["error"]
    served.app[api.STOPPING].set()  # the two in flight end with a 503 saying so
    for code, body in await wait_for(asyncio.gather(*polls), 10):
        assert code == 503 and "shutting down" in body["reason"]


async def test_head_answers_the_status_without_a_body(served: Served) -> None:
    assert served.client is not None
    async with served.client.head("/ready/a") as r:
        assert r.status == 200 and await r.read() == b""
    async with served.client.head("/ready/b") as r:
        assert r.status == 503


async def test_other_methods_and_paths_are_json(served: Served) -> None:
    assert served.client is not None
    async with served.client.post("/ready/a") as r:
        assert r.status == 405 and r.headers["Allow"] and (await r.json())["error"] == "method not allowed"
    code, body = await served.get("/nothing/here")
    assert code == 404 and "/nothing/here" in body["error"]


async def test_a_ready_target_answers_a_long_poll_even_with_every_slot_held(served: Served) -> None:
    """Any local user can hold the long-poll slots: a target that is ready answers 200 anyway, at once
    and without a slot; a target that is not is still refused (the client then asks without wait=)."""
    held = [asyncio.ensure_future(served.get("/ready/b?wait=30")) for _ in range(2)]
    await served.long_polls_in_flight(2)
    t0 = time.monotonic()
    code, body = await served.get("/ready/a?wait=30")
    assert code == 200 and body["pid"] == 100 and time.monotonic() - t0 < 5
    code, body = await served.get("/ready/b?wait=30")
    assert code == 503 and "too many long-polls" in body["error"]
    served.app[api.STOPPING].set()
    await wait_for(asyncio.gather(*held), 10)
