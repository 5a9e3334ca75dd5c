"""Serving the API on a host where any local user can connect: bounded, and quiet about abuse.

Any local user can open connections to genready. Without limits, a few thousand idle or
half-sent requests use up its file descriptors and the probes fail with them. So:

* a request must arrive complete within REQUEST_READ_TIMEOUT of the connection opening or
  of the previous answer, else the connection is closed (slowloris);
* at most `max_connections` connections are served; a new one beyond that closes the oldest
  connection not in a request (idle or half-sent), or if every one is in a request (long-polls),
  gets a 503 saying so and is closed quickly; beyond twice the cap new ones are closed at once,
  unanswered, so the file descriptors reserved for probes, D-Bus and records stay free;
* malformed requests are logged in one line (then counted), never as a traceback;
* event-loop errors such as accept() failing with EMFILE are logged once per interval.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from aiohttp import web

from genready.config import is_ip
from genready.log import Summarizer

log = logging.getLogger("genready.serve.api")

REQUEST_READ_TIMEOUT: Final = 10.0  # seconds for a whole request head to arrive
OVER_CAP_TIMEOUT: Final = 1.0  # a connection over the cap gets this long to send the request for its 503
# File descriptors kept free of API connections: for probes (a socket and /proc reads each), the two
# D-Bus connections, the records file, logs and stamps.
RESERVED_FDS: Final = 64
FDS_PER_TARGET: Final = 4
MAX_CONNECTIONS: Final = 512  # even with file descriptors to spare: each connection costs memory and CPU
LOG_INTERVAL: Final = 60.0  # seconds between summaries of repeated trouble
HOST_CACHE: Final = 256  # Host values whose verdict is kept (beyond that, each is decided per request)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def nofile_limit() -> int:
    """This process's soft RLIMIT_NOFILE (the shipped unit raises it with LimitNOFILE=)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(targets: int, nofile: int | None = None) -> int:
    """How many API connections to serve so that, with as many more being refused, the
    reserved file descriptors stay free."""
    spare = (nofile if nofile is not None else nofile_limit()) - RESERVED_FDS - FDS_PER_TARGET * targets
    return max(8, min(MAX_CONNECTIONS, spare // 2))


class _Conn:
    __slots__ = ("deadline", "in_request", "over_cap", "timer")

    def __init__(self, over_cap: bool) -> None:
        self.in_request = 0
        self.over_cap = over_cap
        self.deadline = 0.0  # loop time after which the connection is closed unless in a request
        self.timer: asyncio.TimerHandle | None = None


class ConnectionGuard:
    """Counts and times the API's connections; see the module docstring."""

    def __init__(self, max_connections: int, *, read_timeout: float = REQUEST_READ_TIMEOUT,
                 summarizer: Summarizer | None = None, on_refuse: Callable[[str], None] = lambda why: None) -> None:
        self.max_connections = max_connections
        self.on_refuse = on_refuse  # ("connections" | "read_timeout"), for the metrics
        self.read_timeout = read_timeout
        self.summarizer = summarizer or Summarizer(log, interval=LOG_INTERVAL)
        self._conns: dict[asyncio.BaseTransport, _Conn] = {}
        self.refused = 0  # connections answered 503 or closed for being over the cap
        self.timed_out = 0  # connections closed for not sending a complete request in time
        self.evicted = 0  # idle connections closed to make room for a new one over the cap

    @property
    def open(self) -> int:
        return len(self._conns)

    def install(self, server: web.Server) -> None:
        """Hook into aiohttp's per-connection callbacks (the same in aiohttp 3.8 to 3.14)."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._opened(transport)

        def connection_lost(handler: Any, exc: BaseException | None) -> None:
            transport = handler.transport
            lost(handler, exc)
            self._closed(transport)

        # Instance attributes: aiohttp's RequestHandler calls self._manager.connection_made(...).
        setattr(server, "connection_made", connection_made)  # noqa: B010
        setattr(server, "connection_lost", connection_lost)  # noqa: B010

    def _opened(self, transport: asyncio.Transport) -> None:
        n = len(self._conns) + 1
        if n > self.max_connections and self._evict_oldest_idle():
            n -= 1
        if n > 2 * self.max_connections:
            # No answer: reading the request would hold the descriptor the reserve is for.
            self.refused += 1
            self.on_refuse("connections")
            self.summarizer.note("api", "connections over the cap",
                                 f"API: {n} connections, over twice the cap of {self.max_connections}: "
                                 "closing new ones unanswered", level=logging.WARNING)
            # Not now: aiohttp's handler for it has not started yet and would find itself torn down.
            asyncio.get_running_loop().call_soon(transport.abort)
            return
        conn = _Conn(over_cap=n > self.max_connections)
        self._conns[transport] = conn
        self._arm(transport, conn)

    def _evict_oldest_idle(self) -> bool:
        """Close the oldest connection that is not in a request (idle keep-alive, or a request
        head still arriving): else a flood of those would turn every real client away, while a
        real request is answered within milliseconds of its connection opening."""
        for transport, conn in self._conns.items():  # oldest first
            if not conn.in_request:
                del self._conns[transport]
                if conn.timer is not None:
                    conn.timer.cancel()
                self.evicted += 1
                self.on_refuse("evicted")
                asyncio.get_running_loop().call_soon(transport.close)  # see _opened's abort
                return True
        return False

    def _closed(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self._conns.pop(transport, None) if transport is not None else None
        if conn is not None and conn.timer is not None:
            conn.timer.cancel()

    def _arm(self, transport: asyncio.BaseTransport, conn: _Conn) -> None:
        """The connection must send a whole request within the timeout from now. Moving a deadline
        is all an answered request costs: the timer, when it fires early, sets itself again (a
        timer per request cost as much as the rest of a /ready)."""
        loop = asyncio.get_running_loop()
        conn.deadline = loop.time() + (OVER_CAP_TIMEOUT if conn.over_cap else self.read_timeout)
        if conn.timer is None:
            conn.timer = loop.call_at(conn.deadline, self._expire, transport)

    def _expire(self, transport: asyncio.BaseTransport) -> None:
        conn = self._conns.get(transport)
        if conn is None:
            return
        conn.timer = None
        if conn.in_request:
            return  # armed again when the request is answered
        loop = asyncio.get_running_loop()
        if loop.time() < conn.deadline:
            conn.timer = loop.call_at(conn.deadline, self._expire, transport)
            return
        if not conn.over_cap:
            self.timed_out += 1
            self.on_refuse("read_timeout")
        transport.close()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        conn = self._conns.get(transport) if transport is not None else None
        if conn is None:
            return await handler(request)
        if conn.over_cap:
            self.refused += 1
            self.on_refuse("connections")
            self.summarizer.note("api", "connections over the cap",
                                 f"API: more than {self.max_connections} connections open: answering 503 "
                                 "to new ones", level=logging.WARNING)
            resp = web.json_response(
                {"error": f"genready is serving its maximum of {self.max_connections} connections; retry shortly"},
                status=503, headers={"Retry-After": "1"})
            resp.force_close()
            return resp
        conn.in_request += 1
        try:
            return await handler(request)
        finally:
            conn.in_request -= 1
            if not conn.in_request and transport is not None and transport in self._conns:
                self._arm(transport, conn)  # the next request on this keep-alive connection

def host_allowed(host: str | None, allowed: Iterable[str]) -> bool:
    """May a request with this Host: header be answered? DNS rebinding makes a web page in a
    local browser send requests to genready under the page's own name: so only an absent or
    empty Host (no browser), localhost, an IP address (a rebinding attack needs a name) or a
    name in daemon.allowed_hosts is answered. The port is not compared (tunnels change it)."""
    if not host:
        return True
    if host.startswith("["):  # [v6]:port
        name = host[1:host.find("]")] if "]" in host else host
    else:
        name = host.rpartition(":")[0] if host.count(":") == 1 else host
    name = name.strip().lower().rstrip(".")
    return name == "localhost" or is_ip(name) or name in {a.lower().rstrip(".") for a in allowed}


class HostCheck:
    """The middleware answering 421 to a Host: that `host_allowed` refuses."""

    def __init__(self, allowed: Callable[[], Iterable[str]], listen: str,
                 on_refuse: Callable[[str], None] = lambda why: None) -> None:
        self.allowed = allowed  # read per request: a reload may change daemon.allowed_hosts
        self.listen = listen
        self.on_refuse = on_refuse
        self.summarizer = Summarizer(log, interval=LOG_INTERVAL)
        self._decided: dict[str | None, bool] = {}
        self._decided_for: Iterable[str] | None = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        allowed = self.allowed()
        # Decided once per Host value (and allowed_hosts, which a reload may change): clients send
        # the same Host on every request, and parsing it costs more than the rest of a /ready.
        if allowed is not self._decided_for:
            self._decided, self._decided_for = {}, allowed
        ok = self._decided.get(host)
        if ok is None:
            ok = host_allowed(host, allowed)
            if len(self._decided) < HOST_CACHE:
                self._decided[host] = ok
        if ok:
            return await handler(request)
        self.on_refuse("host")
        shown = repr((host or "")[:100])
        self.summarizer.note("host", "foreign Host", f"API: refused a request for Host {shown} (421): not "
                             "genready's name; DNS rebinding from a web page, or a name missing from "
                             "daemon.allowed_hosts", level=logging.WARNING)
        return web.json_response(
            {"error": f"Host {shown} does not name this genready ({self.listen}); a web page may be trying DNS "
                      "rebinding. If you reach genready under that name, add it to daemon.allowed_hosts"},
            status=421)


class RequestLog(logging.Filter):
    """aiohttp logs a malformed request as "Error handling request" with a traceback (544 bytes
    for a 43-byte request). Attached to the logger aiohttp's server is given, this turns a
    client's mistake into one line, then counts repeats (genready's own bugs keep their traceback)."""

    def __init__(self, summarizer: Summarizer) -> None:
        super().__init__()
        self.summarizer = summarizer

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not _client_caused(exc):
            return True
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
        text = " ".join(str(exc).split())[:200]
        self.summarizer.note("api", "bad request", f"API: bad request: {type(exc).__name__}: {text}",
                             level=logging.INFO, remote=remote)
        return False


def _client_caused(exc: BaseException) -> bool:
    from aiohttp import http_exceptions

    return isinstance(exc, http_exceptions.HttpProcessingError | ConnectionError)


def request_logger() -> logging.Logger:
    """The logger to give aiohttp's server (`AppRunner(..., logger=...)`)."""
    logger = logging.getLogger("genready.serve.api.server")
    if not any(isinstance(f, RequestLog) for f in logger.filters):
        logger.addFilter(RequestLog(Summarizer(logging.getLogger("genready.serve.api"), interval=LOG_INTERVAL)))
    return logger


class LoopErrors:
    """The event loop's exception handler: one line per kind of trouble per interval.

    asyncio reports e.g. accept() failing with EMFILE ("socket.accept() out of system resource")
    through the loop's handler, each time it retries; the default prints a traceback every time.
    """

    def __init__(self, *, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # message -> (when last logged, repeats since)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "event loop error")
        exc = context.get("exception")
        now = self.clock()
        last, repeats = self._last.get(message, (None, 0))
        if last is not None and now - last < self.interval:
            self._last[message] = (last, repeats + 1)
            return
        self._last[message] = (now, 0)
        more = f" (and {repeats} more in the last {now - last:.0f} s)" if last is not None and repeats else ""
        if exc is not None and not isinstance(exc, OSError):
            log.error("event loop: %s: %s: %s%s", message, type(exc).__name__, exc, more, exc_info=exc)
        else:
            log.error("event loop: %s%s%s", message, f": {exc}" if exc else "", more)
