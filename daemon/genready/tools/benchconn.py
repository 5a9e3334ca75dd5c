"""The bench client's connections: a pool that never hands out a connection the server has closed,
and, for a server whose kind closes every streamed connection (servers/kinds.py: llama.cpp's
llama-server), a new connection per request once that is seen.

A request that was never sent, because the pooled connection aiohttp gave it had been closed
by the server, is sent once more on a new connection and counted once, as retried (any server
may close a kept-alive connection; llama-server does it after every stream).
"""

from __future__ import annotations

import select
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from genready.servers import kinds
from genready.tools.benchfigures import Outcome


class StaleConnection(Exception):
    """A request that never left: the pooled connection it was given had been closed by the server."""


def refused_write(e: BaseException) -> bool:
    """Whether `e` comes from aiohttp refusing to write into a connection that was already closing: its own
    ConnectionResetError without an errno ("Cannot write to closing transport", aiohttp/http_writer.py),
    raised instead of handing the bytes to the socket. aiohttp 3.8 raises it for the request line and
    headers (as ClientOSError) and, for the body, as the cause of ClientOSError "Can not write request
    body"; later versions hold the headers back and send them with the body, so nothing was sent."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        if isinstance(x, ConnectionResetError) and x.errno is None:
            return True
        seen.add(id(x))
        x = x.__cause__ or x.__context__
    return False


def _closed_by_server(conn: Connection) -> bool:
    """Whether an idle pooled connection has something to read: the server's FIN (it closed the connection)
    or bytes nobody asked for. Either way it must not carry the next request. aiohttp checks only whether
    the transport is closing, which it learns when asyncio reads the socket on a later turn of the loop: a
    FIN that has arrived but not yet been read passes that check."""
    transport = conn.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # no descriptor any more: closed
        return True


class PoolConnector(aiohttp.TCPConnector):
    """aiohttp's TCPConnector, except that it does not hand out a pooled connection the server has closed.

    A server may close a connection it offered to keep alive (llama.cpp's llama-server does after every
    streamed answer: its kind's closes_after_stream). The answer is complete, but the connection goes back
    to aiohttp's pool a moment before its FIN is read, and the next request was sent into it: "Can not write
    request body" (aiohttp 3.8), or a disconnect. A pooled connection that has become readable while idle
    is closed here instead, and the request gets another one (counted in `stale`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._used: weakref.WeakSet[Any] = weakref.WeakSet()  # protocols handed out before: pooled ones
        self.stale = 0

    async def connect(self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
                      ) -> Connection:
        while True:
            conn = await super().connect(req, traces, timeout)
            proto = conn.protocol
            if proto is None or proto not in self._used:
                if proto is not None:
                    self._used.add(proto)
                return conn
            if not _closed_by_server(conn):
                return conn
            self.stale += 1
            conn.close()


def why_not_reuse(trace: Mapping[str, Any], outcome: Outcome, connector: PoolConnector) -> str:
    """Why the rest of the run should send each request on a new connection ("" to keep reusing them): the
    server closes connections it offered to keep alive, so a request may meet one closing before the FIN is
    there to see (PoolConnector) and be lost; a new connection cannot be closing."""
    if trace.get("stream") and kinds.closes_after_stream(str(trace.get("server", ""))):
        return f"{trace['server']} closes the connection after a streamed answer"
    if connector.stale or outcome.retried:
        return "the server closed a kept-alive connection"
    return ""


def reuse_tracer() -> aiohttp.TraceConfig:
    """Marks a request's trace context (a dict passed as trace_request_ctx) "reused" while the connection it
    was given came from the pool, so that a refused write can be told from a new connection's failure."""
    tc = aiohttp.TraceConfig()

    def mark(value: bool) -> Callable[..., Awaitable[None]]:
        async def on(_session: Any, ctx: Any, _params: Any) -> None:
            if isinstance(ctx.trace_request_ctx, dict):
                ctx.trace_request_ctx["reused"] = value
        return on

    tc.on_connection_reuseconn.append(mark(True))
    tc.on_connection_create_end.append(mark(False))
    return tc


