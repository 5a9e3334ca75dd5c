"""The read-only HTTP API: /ready, /status, /metrics, the status page at /. Nothing here changes anything."""

from __future__ import annotations

import asyncio
import json
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from genready import __version__
from genready.compat import app_key
from genready.serve import openapi, page, sweepcheck

if TYPE_CHECKING:
    from genready.rule.gate import TargetGate, Verification
    from genready.serve.metrics import Metrics
    from genready.serve.target import Target


MAX_WAIT = 3600.0
CLIENT_CHECK = 1.0  # seconds between checks that a long-poll's client is still connected
_INVOCATION = re.compile(r"[0-9a-f]{32}")
# ASCII only: str.isdigit() and float() also take '²', '①' or '٣'. Bounded, so a 5,000-digit
# value is a 400, not int()'s ValueError (a 500) or a float of inf.
_PID = re.compile(r"[0-9]{1,10}")
_NUMBER = re.compile(r"([0-9]{1,12}(\.[0-9]{0,9})?|\.[0-9]{1,9})([eE][+-]?[0-9]{1,2})?")
_PID_MAX = 2**22  # the kernel's PID_MAX_LIMIT
TARGETS = app_key("targets", dict)  # name -> serve.target.Target, as the daemon holds them (reloads included)
METRICS = app_key("metrics", object)
STARTED = app_key("started", float)
STATUS_EXTRA = app_key("status_extra", object)
STOPPING = app_key("stopping", asyncio.Event)
LONG_POLLS = app_key("long_polls", object)


class LongPolls:
    """Counts /ready?wait= requests in flight: each holds a connection (a file descriptor) for
    up to MAX_WAIT, so beyond `limit` they are answered 503 at once instead of exhausting them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self.refused = 0


class BadQuery(Exception):
    pass


def _json_error(status: int, reason: str, **extra: object) -> web.Response:
    return web.json_response({"error": reason, **extra}, status=status)


@web.middleware
async def errors_as_json(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
    """404 and 405 answer JSON too, so scripts never have to parse HTML."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as e:
        return web.json_response({"error": "method not allowed", "allowed": sorted(e.allowed_methods)},
                                 status=405, headers={"Allow": ",".join(sorted(e.allowed_methods))})
    except web.HTTPNotFound:
        return _json_error(404, f"no such endpoint: {request.path}")


def _float(q: Mapping[str, str], key: str, lo: float, hi: float | None = None) -> float | None:
    if key not in q:
        return None
    if not _NUMBER.fullmatch(q[key]):
        raise BadQuery(f"{key} must be a plain decimal number (ASCII digits, e.g. 30 or 1.5), got {_shown(q[key])}")
    v = float(q[key])
    if v < lo or (hi is not None and v > hi):
        raise BadQuery(f"{key} must be between {lo:g} and {hi:g}" if hi is not None else f"{key} must be >= {lo:g}")
    return v


def _shown(v: str) -> str:
    """A query value for an error message: repr'd (so '٣' shows as itself) and cut short."""
    return repr(v) if len(v) <= 40 else repr(v[:40]) + f"… ({len(v)} characters)"


_NO_QUERY: Final[Mapping[str, Any]] = MappingProxyType({"wait": 0.0, "since": None, "pid": None, "invocation": None,
                                                        "since_monotonic": None})
_KNOWN: Final = ("wait", "since", "since_monotonic", "pid", "invocation")


def parse_ready_query(q: Mapping[str, str]) -> dict[str, Any]:
    """Validate /ready's query; BadQuery names the parameter."""
    unknown = set(q) - set(_KNOWN)
    if unknown:
        raise BadQuery(f"unknown query parameter(s): {', '.join(sorted(unknown))}; known: {', '.join(_KNOWN)}")
    out: dict[str, Any] = dict(_NO_QUERY)
    wait = _float(q, "wait", 0.0)
    if wait is not None:
        out["wait"] = min(wait, MAX_WAIT)  # capped, then answered 503 if still not ready
    out["since"] = _float(q, "since", 0.0)
    out["since_monotonic"] = _float(q, "since_monotonic", 0.0)
    if "pid" in q:
        if not _PID.fullmatch(q["pid"]) or not 0 < int(q["pid"]) <= _PID_MAX:
            raise BadQuery(f"pid must be a positive integer of ASCII digits up to {_PID_MAX}, got {_shown(q['pid'])}")
        out["pid"] = int(q["pid"])
    if "invocation" in q:
        inv = q["invocation"].replace("-", "").lower()
        if not _INVOCATION.fullmatch(inv):
            raise BadQuery(f"invocation must be 32 hex digits, got {_shown(q['invocation'])}")
        out["invocation"] = inv
    return out


async def ready(request: web.Request) -> web.StreamResponse:
    targets: dict[str, Target] = request.app[TARGETS]
    metrics: Metrics | None = request.app[METRICS]  # type: ignore[assignment]
    resp = await _ready(request, targets)
    if metrics is not None:
        metrics.ready_request(resp.status)
    return resp


async def _ready(request: web.Request, targets: dict[str, Target]) -> web.Response:
    name = request.match_info.get("target")
    if name is not None and name not in targets:
        return _json_error(404, f"no such target: {name}", targets=sorted(targets))
    try:
        # Most scripts ask without a query: skip parsing one.
        q = parse_ready_query(request.query) if request.query_string else _NO_QUERY
    except BadQuery as e:
        return _json_error(400, str(e))
    if q["wait"] > 0:
        polls: LongPolls = request.app[LONG_POLLS]  # type: ignore[assignment]
        if polls.active >= polls.limit:
            # Readiness first: a ready target answers its 200 without a slot, so slots held by others
            # (any local user can open them) never turn a ready answer into a refusal.
            now = await _answer(request, targets, name, {**q, "wait": 0.0})
            if now.status != 503:
                return now
            polls.refused += 1
            metrics_: Metrics | None = request.app[METRICS]  # type: ignore[assignment]
            if metrics_ is not None:
                metrics_.api_refused("long_polls")
            return web.json_response({"error": f"too many long-polls in flight (limit {polls.limit}); retry "
                                               "shortly, or ask without wait="},
                                     status=503, headers={"Retry-After": "1"})
        polls.active += 1
        try:
            return await _answer(request, targets, name, q)
        finally:
            polls.active -= 1
    return await _answer(request, targets, name, q)


async def _answer(request: web.Request, targets: dict[str, Target], name: str | None,
                  q: Mapping[str, Any]) -> web.Response:
    deadline = time.monotonic() + q["wait"]
    while True:
        # The targets as they are now: a reload may have removed (404 at once), replaced or added some.
        if name is not None and name not in targets:
            return _json_error(404, f"no such target: {name} (removed by a config reload)", targets=sorted(targets))
        those = [targets[name]] if name else list(targets.values())
        chosen = [t.gate for t in those]
        # Each pass does a fresh systemd read per target, begun after the request arrived.
        # Concurrently: targets on one unit share a systemd read, and many targets cost one wait, not N.
        checks = [g.check(since=q["since"], pid=q["pid"], invocation=q["invocation"], since_mono=q["since_monotonic"])
                  for g in chosen]
        # One target (the usual question) is awaited directly: a task per request costs more than the rest.
        verdicts = [await checks[0]] if len(checks) == 1 else list(await asyncio.gather(*checks))
        if all(v is not None for v, _ in verdicts):
            # Built from the verifications that were just checked, not from live state.
            if name:
                v = verdicts[0][0]
                assert v is not None
                return web.Response(body=_ready_bytes(chosen[0], v), content_type="application/json", charset="utf-8")
            bodies = [_ready_body(g, v) for g, (v, _) in zip(chosen, verdicts, strict=True) if v is not None]
            return web.json_response({"ready": True, "targets": bodies}, status=200)
        left = deadline - time.monotonic()
        stopping = request.app[STOPPING]
        # A start after since= that ended before it was verified, which systemd will not follow with a start
        # of its own: waiting longer changes nothing, so the answer comes now.
        failed = any(
            v is None and (since := g.since_wall(q["since"], q["since_monotonic"])) is not None
            and (f := g.start_failed(since)) is not None and not f["restarting"]
            for g, (v, _) in zip(chosen, verdicts, strict=True))
        if left <= 0 or stopping.is_set() or failed:
            if stopping.is_set():
                verdicts = [(None, "genready is shutting down")] * len(chosen)
            not_ready = [_not_ready_body(t, why, t.gate.since_wall(q["since"], q["since_monotonic"]))
                         for t, (v, why) in zip(those, verdicts, strict=True) if v is None]
            out: Any = not_ready[0] if name else {"ready": False, "targets": not_ready}
            return web.json_response(out, status=503)
        # A long-poll in flight at shutdown gets a 503 saying so, not a dropped connection.
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(g.wait_changed(left)) for g in chosen]
        waits.append(asyncio.ensure_future(stopping.wait()))
        # Woken each CLIENT_CHECK seconds too: aiohttp 3.9+ does not cancel a handler whose client
        # went away, and a long-poll nobody reads would hold its slot for up to MAX_WAIT.
        _, pending = await asyncio.wait(waits, timeout=min(left, CLIENT_CHECK), return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        if request.transport is None or request.transport.is_closing():
            return web.json_response({"error": "the client went away"}, status=503)


def _ready_body(g: TargetGate, v: Verification) -> dict[str, object]:
    return {"ready": True, "target": g.name, "unit": g.unit, **v.to_json(), **g.config_json()}


# The 200 body of /ready/TARGET, encoded once per verification and snapshot: under load most
# answers are this one. Per gate, only its latest (a new verification is a new object, and so is
# each snapshot: config_changed_since_start changes only with one).
_READY_BYTES: weakref.WeakKeyDictionary[TargetGate, tuple[Verification, object, bytes]] = \
    weakref.WeakKeyDictionary()


def _ready_bytes(g: TargetGate, v: Verification) -> bytes:
    cached = _READY_BYTES.get(g)
    if cached is None or cached[0] is not v or cached[1] is not g.snap:
        cached = _READY_BYTES[g] = (v, g.snap, json.dumps(_ready_body(g, v)).encode())
    return cached[2]


def _not_ready_body(t: Target, why: str, since: float | None = None) -> dict[str, object]:
    g = t.gate
    j = g.to_json()
    body = {k: j[k] for k in ("target", "unit", "state", "pid", "invocation_id", "waiting_since", "probes",
                              "last_error", "expected_load_seconds", "loading_seconds", "eta_seconds")}
    failed = g.start_failed(since)
    if failed is not None:
        failed["journal"] = t.lines(str(failed["invocation_id"]))
        failed["gpu_strays"] = t.gpu_strays(str(failed["invocation_id"]))
    return {"ready": False, "reason": why, **body, "start_failed": failed}


async def status(request: web.Request) -> web.Response:
    return web.json_response(await status_document(request.app))


async def page_or_status(request: web.Request) -> web.Response:
    """`/`: the status page for a browser (and curl's `*/*`), `/status`'s document for `Accept: application/json`."""
    doc = await status_document(request.app)
    if page.wants_json(request.headers.get("Accept")):
        return web.json_response(doc, headers={"Vary": "Accept"})
    return web.Response(text=page.render(doc), content_type="text/html", charset="utf-8", headers=page.HEADERS)


async def status_document(app: web.Application) -> dict[str, object]:
    """What `/status` answers, and what the page at `/` shows."""
    targets: dict[str, Target] = app[TARGETS]
    extra: Callable[[], dict[str, object]] = app[STATUS_EXTRA]  # type: ignore[assignment]
    await sweepcheck.check(targets.values())
    out = {}
    for name, t in targets.items():
        j = t.gate.to_json()
        if t.sweep_warning is not None:
            j["warnings"] = [*j["warnings"], t.sweep_warning]  # type: ignore[misc]
        j["last_failure"] = t.lastwords.failure if t.lastwords is not None else None
        j["gpu"] = t.gpu
        j["kind"] = t.kind.to_json()
        j["records"] = [r.public_json() for r in t.gate.store.newest(name, 20)]
        out[name] = j
    return {
        "version": __version__,
        "uptime_seconds": round(time.monotonic() - app[STARTED], 3),
        **extra(),
        "targets": out,
    }


async def metrics(request: web.Request) -> web.Response:
    m: Metrics | None = request.app[METRICS]  # type: ignore[assignment]
    if m is None:
        return _json_error(404, "metrics are not enabled")
    await sweepcheck.check(request.app[TARGETS].values())
    body, ctype = m.render()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = ctype
    return resp


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(openapi.spec())


def make_app(targets: dict[str, Target], metrics_: Metrics | None,
             status_extra: Callable[[], dict[str, object]] = dict, *,
             limits: Sequence[Any] = (),  # aiohttp middlewares: their type differs across aiohttp versions
             max_long_polls: int = 256) -> web.Application:
    """The aiohttp application; GET (and HEAD) only. `targets`: the daemon's own mapping, read at each
    request (a reload's changes are served). `limits`: middlewares run first, in order (the connection
    guard, then the Host check: a connection over the cap is answered before any other work)."""
    app = web.Application(middlewares=[*limits, errors_as_json])
    app[LONG_POLLS] = LongPolls(max_long_polls)
    app[TARGETS] = targets
    app[METRICS] = metrics_
    app[STARTED] = time.monotonic()
    app[STATUS_EXTRA] = status_extra
    app[STOPPING] = asyncio.Event()
    app.router.add_get("/", page_or_status)
    app.router.add_get("/ready", ready)
    app.router.add_get("/ready/{target}", ready)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi_json)
    return app
