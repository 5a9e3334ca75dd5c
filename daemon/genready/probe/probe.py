"""One probe: a real generation over one fresh connection, classified, with proof of who served it.

Success means the server's own health route (health_path) answering 200, then HTTP 200, JSON of
the API's shape and at least one generated token, both on one keep-alive connection, all within
probe_timeout, and (with verify_owner) that the server side of that very connection is held by
the unit's MainPID or a descendant of it, checked while the connection is still open: the owner
proof covers the health answer and the generation alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import logging
import os
import re
import socket
import ssl
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from genready import __version__, reach
from genready.apis import APIS, EXCERPT_CHARS, MAX_BODY, MODELS_PATH, BadAnswer, Listed, excerpt, listed_models
from genready.compat import timeout
from genready.config import TargetConfig
from genready.probe.container import UnitStart, find_container_owner, find_process_owner
from genready.probe.owner import Owner, unix_owner
from genready.servers import kinds
from genready.vocab import Failure, HealthRoute, ProbeResult

log = logging.getLogger("genready.probe.probe")
_HEAD_LIMIT: Final = 64 * 1024  # status line + headers, and one chunk-size line
_EXCERPT_BYTES: Final = 4096  # what we read of a non-200 body, for the detail
_HEALTH_CAP: Final = 64 * 1024  # a health answer is a status; its body only has to be read past
# ASCII digits only, and bounded: str.isdigit() takes '²', and int() refuses over 4,300 digits
# with a ValueError, which no malformed answer may turn into anything but bad_response.
_STATUS: Final = re.compile(r"[1-5][0-9][0-9]")
_LENGTH: Final = re.compile(r"[0-9]{1,18}")
_CHUNK_SIZE: Final = re.compile(rb"[0-9A-Fa-f]{1,15}")
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


class _Fail(Exception):
    def __init__(self, failure: Failure, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.failure, self.detail, self.status = failure, detail, status


@dataclass(frozen=True)
class _Response:
    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


def _oserror(e: OSError) -> str:
    # asyncio's connect errors carry "Connect call failed (...)" as strerror; the errno says more.
    if isinstance(e, socket.gaierror):
        return e.strerror or str(e)
    return os.strerror(e.errno) if e.errno else (str(e) or type(e).__name__)


def _os_fail(e: OSError, what: str) -> _Fail:
    """An OSError as a failure: genready's own shortage (EMFILE…) is not the server refusing."""
    if e.errno in _RESOURCE_ERRNOS:
        return _Fail(Failure.LOCAL_RESOURCES, f"{what}: genready itself is out of resources: {_oserror(e)} "
                                              f"({errno.errorcode.get(e.errno or 0, e.errno)})")
    return _Fail(Failure.REFUSED, f"{what}: {_oserror(e)}")


def _is_local(family: int, sockaddr: tuple[Any, ...]) -> bool:
    """Is this address one of this machine's own? Binding to it succeeds only if it is."""
    ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
    if ip.is_loopback or ip.is_unspecified:
        return True
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((sockaddr[0], 0, *sockaddr[2:]))
        except OSError:
            return False
    return True


# A raw HTTP/1.1 client instead of aiohttp: the owner proof needs the exact connection that carried
# the answer to stay open until /proc has been checked, and one fresh connection per probe. aiohttp
# pools connections, or with force_close releases them the moment the body is read, and its body
# cap is not a hard stop. The requests are three fixed JSON POSTs and one GET; answers are
# Content-Length, chunked or close-delimited, which is all this needs to read.
class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, unix: bool = False) -> None:
        self.reader, self.writer = reader, writer
        self.unix = unix
        self.local: tuple[str, int] = ("", 0)
        self.peer: tuple[str, int] = ("", 0)
        self.peer_pid = 0  # unix: the server's pid from SO_PEERCRED (0: unknown)
        self.inode = 0  # unix: our end's socket inode, which names the server's accepted end (owner.py)
        if unix:
            with contextlib.suppress(OSError):
                sock = writer.get_extra_info("socket")
                self.inode = os.fstat(sock.fileno()).st_ino
                creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                self.peer_pid = struct.unpack("3i", creds)[0]
        else:
            sockname, peername = writer.get_extra_info("sockname"), writer.get_extra_info("peername")
            # IPv6 socket addresses are 4-tuples; owner.py wants (host, port).
            self.local = (str(sockname[0]), int(sockname[1]))
            self.peer = (str(peername[0]), int(peername[1]))
        self.answered = False  # the server sent at least a status line
        self.server_closes = False  # it said Connection: close
        self.tls_closed_hint: str | None = None  # TLS: what a close without any answer most likely means

    async def request(self, method: str, path: str, host: str, body: bytes | None, api_key: str = "") -> None:
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"User-Agent: genready/{__version__}",
                "Accept: application/json", "Accept-Encoding: identity"]
        if api_key:
            head.append(f"Authorization: Bearer {api_key}")
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (body or b""))
        await self.writer.drain()

    async def response(self, cap: int) -> _Response:
        """Read one response. A 200 body over `cap` fails; other bodies are cut to an excerpt."""
        while True:
            status, reason, headers = await self._head()
            if 100 <= status < 200 and status != 101:
                continue  # interim (100 Continue, 103 Early Hints): the real answer follows
            break
        self.server_closes = "close" in headers.get("connection", "").lower()
        if status in (101, 204, 304) or 100 <= status < 200:
            return _Response(status, reason, headers, b"")
        body = await self._body(headers, cap if status == 200 else _EXCERPT_BYTES, strict=status == 200)
        return _Response(status, reason, headers, body)

    async def _head(self) -> tuple[int, str, dict[str, str]]:
        try:
            # Five bytes first: a server that writes something other than HTTP and then waits is
            # a bad response now, not a timeout later.
            first = await self.reader.readexactly(5)
            if first != b"HTTP/":
                more = b""
                with contextlib.suppress(TimeoutError, OSError):
                    async with timeout(0.05):  # whatever else already arrived, for the detail
                        more = await self.reader.read(EXCERPT_CHARS)
                raise _Fail(Failure.BAD_RESPONSE, f"not an HTTP answer: {excerpt(first + more)}")
            raw = first + await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial and not self.answered and self.tls_closed_hint is not None:
                # TLS 1.3 completes the client's side of the handshake before the server checks our
                # certificate; a server that refuses it (uvicorn, aiohttp) just closes, with no alert.
                raise _Fail(Failure.TLS, "the server closed the TLS connection right after the handshake, "
                                         f"without answering: {self.tls_closed_hint}") from None
            if not e.partial and not self.answered:
                raise _Fail(Failure.REFUSED, "the server closed the connection without answering") from None
            raise _Fail(Failure.BAD_RESPONSE, f"the connection closed mid-header: {excerpt(e.partial)}") from None
        except asyncio.LimitOverrunError:
            raise _Fail(Failure.BAD_RESPONSE, f"response headers longer than {_HEAD_LIMIT} bytes") from None
        self.answered = True
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not _STATUS.fullmatch(parts[1]):
            raise _Fail(Failure.BAD_RESPONSE, f"malformed status line: {excerpt(lines[0])}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _Fail(Failure.BAD_RESPONSE, f"malformed header line: {excerpt(line)}")
            key = name.lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        return int(parts[1]), parts[2] if len(parts) > 2 else "", headers

    async def _body(self, headers: Mapping[str, str], cap: int, *, strict: bool) -> bytes:
        try:
            te = headers.get("transfer-encoding", "").lower()
            if te:
                if te.split(",")[-1].strip() != "chunked":
                    raise _Fail(Failure.BAD_RESPONSE, f"unsupported Transfer-Encoding: {excerpt(te)}")
                return await self._chunked(cap, strict=strict)
            if "content-length" in headers:
                cl = headers["content-length"]
                if not _LENGTH.fullmatch(cl):
                    raise _Fail(Failure.BAD_RESPONSE, f"bad Content-Length: {excerpt(cl)}")
                n = int(cl)
                if n > cap:
                    if strict:
                        raise _Fail(Failure.BAD_RESPONSE, f"the body ({n} bytes) is over the {cap}-byte cap")
                    return await self.reader.read(cap)
                try:
                    return await self.reader.readexactly(n)
                except asyncio.IncompleteReadError as e:
                    if strict:
                        raise _Fail(Failure.BAD_RESPONSE,
                                    f"the body was cut short at {len(e.partial)} of {n} bytes") from None
                    return e.partial
            # Close-delimited: read to EOF, but never past the cap.
            data = bytearray()
            while len(data) <= cap and (chunk := await self.reader.read(cap + 1 - len(data))):
                data += chunk
            if len(data) > cap:
                if strict:
                    raise _Fail(Failure.BAD_RESPONSE, f"the body is over the {cap}-byte cap (stopped reading)")
                del data[cap:]
            return bytes(data)
        except asyncio.LimitOverrunError:
            raise _Fail(Failure.BAD_RESPONSE, "malformed chunked body (chunk-size line too long)") from None

    async def _chunked(self, cap: int, *, strict: bool) -> bytes:
        data = bytearray()
        try:
            while True:
                line = await self.reader.readuntil(b"\r\n")
                field = line.split(b";", 1)[0].strip()
                if not _CHUNK_SIZE.fullmatch(field):  # int(x, 16) also takes "-1", "+a" and "0x10"
                    raise _Fail(Failure.BAD_RESPONSE, f"bad chunk size: {excerpt(line)}")
                size = int(field, 16)
                if size == 0:
                    # Trailers, if any, end with an empty line.
                    while await self.reader.readuntil(b"\r\n") != b"\r\n":
                        pass
                    return bytes(data)
                if len(data) + size > cap:
                    if strict:
                        raise _Fail(Failure.BAD_RESPONSE, f"the body is over the {cap}-byte cap (stopped reading)")
                    data += await self.reader.readexactly(cap - len(data))
                    return bytes(data)
                data += await self.reader.readexactly(size)
                if await self.reader.readexactly(2) != b"\r\n":
                    raise _Fail(Failure.BAD_RESPONSE, "malformed chunked body (no CRLF after a chunk)")
        except asyncio.IncompleteReadError:
            if not strict:
                return bytes(data)
            raise _Fail(Failure.BAD_RESPONSE, f"the chunked body was cut short after {len(data)} bytes") from None

    async def close(self) -> None:
        # abort(), not close(): nothing is left to send, and a TLS close_notify exchange with a
        # wedged server could outlive the probe's deadline.
        self.writer.transport.abort()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


def _seen(what: str, resp: _Response) -> str:
    """What a non-200 answer said, for a failure's detail."""
    return f"{what}: HTTP {resp.status} {resp.reason}".rstrip() + (f": {excerpt(resp.body)}" if resp.body else "")


@dataclass
class _Attempt:
    """One probe in progress: where it is (for a timeout's detail) and its connection."""

    phase: str = "starting"
    conn: _Conn | None = None
    refused: bool = False  # the connection failed: there is no server side left to check
    router_state: str | None = None  # llama.cpp router: the probed model's listed state, if not loaded


class Prober:
    """Probes one target: each probe() is one generation on a fresh connection."""

    def __init__(self, target: TargetConfig, *, max_body: int = MAX_BODY) -> None:
        if target.api not in APIS:
            raise ValueError(f"unknown api {target.api!r}")
        if max_body < 1:
            raise ValueError("max_body must be >= 1")
        self._t = target
        self._max_body = max_body
        # The url was parsed, and the TLS context built, once, with the config (reach.Endpoint).
        ep = target.endpoint
        self._unix = ep.unix_path
        self._host, self._port, self._host_header, self._base = ep.host, ep.port, ep.host_header, ep.path_prefix
        self._numeric = ep.numeric_host
        self._ssl: ssl.SSLContext | None = target.tls_context
        self._model: str | None = None  # discovered from /v1/models; dropped after any failure
        # Which model the probe asks for and why (`model "a" (first of 2 listed: a, b)`), for
        # /status and check-config; "" for an API without model names.
        self.model_note = ""
        # What health_path said at the current start (/status's `health`); the start whose health
        # route answered 404/405: not asked again until the next start (see _health).
        self.health: HealthRoute | None = HealthRoute.OFF if not target.health_path else None
        self._health_start: UnitStart | None = None
        self._absent_start: UnitStart | None = None
        self._absent_logged = False
        # (start, status) of the last 5xx whose server side was proven the unit's; see _probe.
        self._proven_5xx: tuple[UnitStart, int] | None = None
        self._open: set[_Conn] = set()
        self._logged: set[tuple[str, str]] = set()  # kinds of unexpected exception already logged
        self._closed = False

    async def probe(self, main_pid: int, *, started_us: int = 0, invocation_id: str = "") -> ProbeResult:
        """One generation, classified; served_by_pid is checked against main_pid (owner = "process"),
        or its container against the start at started_us (ExecMainStartTimestamp, realtime µs) and
        invocation_id (owner = "container"). Never raises for server misbehaviour (only for
        cancellation, or after close())."""
        if self._closed:
            raise RuntimeError("Prober is closed")
        t0 = time.monotonic()
        att = _Attempt()
        try:
            return await self._probe(att, UnitStart(main_pid, started_us, invocation_id), t0)
        except Exception as e:  # the last line of defence: a probe returns a result, it does not die
            f = self._unexpected(e, Failure.PROBE_ERROR, att.phase)
            return ProbeResult(False, f.failure, f.detail, None, time.monotonic() - t0, 0)
        finally:
            # Also when cancelled (the gate cancels a probe whose instance is gone): never leak it.
            if att.conn is not None and att.conn in self._open:
                await asyncio.shield(self._release(att.conn))

    async def _probe(self, att: _Attempt, start: UnitStart, t0: float) -> ProbeResult:
        outcome: int | _Fail
        try:
            async with timeout(self._t.probe_timeout):
                outcome = await self._generate(att, start)
        except TimeoutError:  # before OSError: it is one
            outcome = _Fail(Failure.TIMEOUT, f"no complete answer within {self._t.probe_timeout:g} s "
                                             f"({att.phase})")
            if att.router_state is not None and att.phase.startswith("waiting for the answer to POST"):
                # llama.cpp's router with --models-autoload holds the POST until the model is loaded
                # (ensure_model_loaded, tools/server/server-models.cpp): the server is loading.
                outcome = _Fail(Failure.UNHEALTHY, f"{outcome.detail}: the llama.cpp router listed the model "
                                                   f"{att.router_state!r} and loads it on demand")
        except _Fail as f:
            outcome = f
        except ssl.SSLError as e:  # before OSError: it is one
            att.refused = True
            outcome = _Fail(Failure.TLS, f"TLS failed {att.phase}: {reach.describe(e)}")
        except OSError as e:  # reset, broken pipe
            att.refused = True
            outcome = _os_fail(e, f"the connection failed {att.phase}")
        except Exception as e:
            # Whatever an answer can make the parser raise, it is a classified failure, never a
            # dead probe: bad_response once the server said anything, else genready's own fault.
            answered = att.conn is not None and att.conn.answered
            outcome = self._unexpected(e, Failure.BAD_RESPONSE if answered else Failure.PROBE_ERROR, att.phase)
        owner: Owner | None = None
        # A failed answer's owner only names the culprit (foreign_owner); nothing is verified by it.
        # A loading server answers the same 5xx several times a second (schedule.py): once its
        # owner was proven for this start, repeats skip the /proc scan, a fifth of the probe.
        status = outcome.status if isinstance(outcome, _Fail) else None
        repeat = status is not None and status >= 500 and self._proven_5xx == (start, status)
        try:
            conn = att.conn
            if conn is not None and self._t.verify_owner and not att.refused and not repeat:
                # Before closing: once closed, the server's socket loses its inode and the proof is gone.
                try:
                    if conn.unix:  # the accepted end's holder (unix_diag): the process rule, whatever `owner` says
                        owner = await asyncio.to_thread(unix_owner, conn.peer_pid, start.main_pid, conn.inode)
                    else:
                        owner = await asyncio.to_thread(self._owner, conn.local, conn.peer, start)
                except Exception as e:  # an unreadable /proc entry, a bug: no proof, and said so
                    self._unexpected(e, Failure.FOREIGN_OWNER, "checking who answered")
                    owner = Owner(None, False, f"the owner check failed: {type(e).__name__}: {e}")
                if owner.pid is None and conn.server_closes:
                    owner = Owner(None, False, owner.detail + " (the server answered Connection: close; "
                                                              "owner proof needs HTTP keep-alive)")
        finally:
            if att.conn is not None:
                await self._release(att.conn)
        result = self._result(outcome, owner, time.monotonic() - t0)
        if not repeat:
            proven = status is not None and status >= 500 and owner is not None and owner.trusted
            self._proven_5xx = (start, status) if proven and status is not None else None
        if not result.ok:
            self._model = None  # the server may have been replaced: ask again next time
        return result

    def _unexpected(self, e: Exception, failure: Failure, phase: str) -> _Fail:
        """An exception no rule classified: a failure of class `failure`, logged with its traceback
        once per kind (a server repeating it would otherwise flood the log every retry)."""
        kind = (type(e).__name__, phase)
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s: unexpected %s while %s, classified %s (logged once)", self._t.name,
                        type(e).__name__, phase, failure, exc_info=e)
        return _Fail(failure, f"{phase}: {type(e).__name__}: {excerpt(str(e) or repr(e))}")

    async def close(self) -> None:
        """Abort any connection in flight; the Prober cannot be used afterwards."""
        self._closed = True
        for conn in list(self._open):
            await self._release(conn)

    # --- internals ---

    def _owner(self, local: tuple[str, int], peer: tuple[str, int], start: UnitStart) -> Owner:
        if self._t.owner == "container":
            return find_container_owner(local, peer, start, self._t.container, self._t.container_socket)
        return find_process_owner(local, peer, start.main_pid)

    def _result(self, outcome: int | _Fail, owner: Owner | None, seconds: float) -> ProbeResult:
        pid = owner.pid if owner else None
        if isinstance(outcome, _Fail):
            if owner is not None and owner.pid is not None and not owner.trusted:
                # A positively foreign process is the root cause, whatever it answered.
                return ProbeResult(False, Failure.FOREIGN_OWNER, f"{owner.detail}; and the probe failed: "
                                   f"{outcome.failure}: {outcome.detail}", pid, seconds, 0, outcome.status)
            detail = outcome.detail
            if owner is not None and owner.pid is None:
                detail += f" ({owner.detail})"
            return ProbeResult(False, outcome.failure, detail, pid, seconds, 0, outcome.status)
        tokens = outcome
        if owner is not None and not owner.trusted:
            detail = owner.detail if owner.pid is not None else f"owner not proven: {owner.detail}"
            return ProbeResult(False, Failure.FOREIGN_OWNER, detail, pid, seconds, tokens, 200)
        by = f" from {owner.detail}" if owner else " (owner not checked)"
        health = ""
        if self.health is HealthRoute.ABSENT:
            health = f", no {self._t.health_path} route (404/405): the generation alone"
        elif self._t.health_path:
            health = f", {self._t.health_path} 200 first"
        model = f"; {self.model_note}" if self.model_note else ""
        return ProbeResult(True, None, f"{tokens} token(s) in {seconds:.3f} s{health}{by}{model}", pid, seconds,
                           tokens, 200)

    async def _generate(self, att: _Attempt, start: UnitStart) -> int:
        api = APIS[self._t.api]
        model = ""
        if api.needs_model:
            model = self._model or await self._discover(att)
        path = api.path
        payload = api.body(prompt=self._t.prompt, max_tokens=self._t.max_tokens, model=model,
                           prompt_ids=self._t.prompt_ids)
        att.phase = f"connecting to {self._where}"
        att.conn = await self._connect(att)
        if self._t.health_path:
            if self._health_start != start:  # a new start: what its health route says is not known yet
                self._health_start, self.health = start, None
            if self._absent_start != start:
                await self._health(att, start)
        att.phase = f"waiting for the answer to POST {path}"
        assert att.conn is not None
        await att.conn.request("POST", self._base + path, self._host_header, json.dumps(payload).encode(),
                               self._t.api_key)
        resp = await att.conn.response(self._max_body)
        if resp.status != 200:
            fail = self._not_ok(f"POST {path}", resp)
            if self.health is HealthRoute.ABSENT and resp.status in (404, 405):
                fail.detail += f" (GET {self._base}{self._t.health_path} answered 404/405 as well)"
            raise fail
        try:
            return api.generated_tokens(resp.body)
        except BadAnswer as e:
            raise _Fail(Failure.BAD_RESPONSE, str(e)) from None

    async def _health(self, att: _Attempt, start: UnitStart) -> None:
        """GET health_path on the probe's own connection, before the generation: the server's own
        word that it is ready (SGLang says 503 while its warmup runs or it drains, llama.cpp while it
        loads), proven to come from the same process as the generation that follows.

        404 or 405: the server has no health route (llama-cpp-python's server has none): that start's
        readiness rests on the generation alone, which follows at once; the route is not asked again
        until the next start (an upgraded server may have one)."""
        what = f"GET {self._t.health_path}"
        att.phase = f"waiting for the answer to {what} (health_path)"
        assert att.conn is not None
        # With the key: SGLang, vLLM and llama.cpp let /health through without one, a proxy may not.
        await att.conn.request("GET", self._base + self._t.health_path, self._host_header, None, self._t.api_key)
        resp = await att.conn.response(_HEALTH_CAP)
        if resp.status in (404, 405):
            self._absent_start, self.health = start, HealthRoute.ABSENT
            if not self._absent_logged:
                self._absent_logged = True
                log.info("%s: %s answered %d: the server has no health route; readiness rests on the "
                         "generation alone (said once)", self._t.name, what, resp.status)
            # The generation on a fresh connection: the 404's body may not have been read whole,
            # and the owner proof has only the generation to cover.
            await self._release(att.conn)
            att.phase = f"connecting to {self._where}"
            att.conn = await self._connect(att)
            return
        if resp.status != 200:
            self.health = HealthRoute.UNHEALTHY
            if 400 <= resp.status < 500 and resp.status not in (408, 429):
                raise self._not_ok(what, resp)
            raise _Fail(Failure.UNHEALTHY, f"{_seen(what, resp)} (the server says it is not ready)", resp.status)
        self.health = HealthRoute.OK
        if att.conn.server_closes:
            if self._t.verify_owner:
                # A second connection could reach another process: the proof must cover both answers.
                raise _Fail(Failure.FOREIGN_OWNER, f"{what} answered 200 with Connection: close: the owner proof "
                                                   "needs the health answer and the generation on one keep-alive "
                                                   'connection (or set health_path = "")')
            await self._release(att.conn)
            att.phase = f"connecting to {self._where}"
            att.conn = await self._connect(att)

    async def _discover(self, att: _Attempt) -> str:
        """The model to ask for, from GET /v1/models: `model` if set (it must be listed), else the
        first listed, which is what vLLM serves a request without `model` with (the first of
        --served-model-name; vllm/entrypoints/openai/models/serving.py, model_name). Its own
        connection: this proves nothing."""
        att.phase = "discovering the model (GET /v1/models)"
        what = "model discovery: GET /v1/models"
        pinned = self._t.model
        sub = _Attempt()
        try:
            conn = await self._connect(sub)
            try:
                await conn.request("GET", self._base + MODELS_PATH, self._host_header, None, self._t.api_key)
                resp = await conn.response(self._max_body)
            finally:
                await self._release(conn)
        except _Fail as f:
            raise _Fail(f.failure, f"{what}: {f.detail}", f.status) from None
        except ssl.SSLError as e:
            raise _Fail(Failure.TLS, f"{what}: TLS failed: {reach.describe(e)}") from None
        except OSError as e:
            if isinstance(e, TimeoutError):
                raise
            raise _os_fail(e, f"{what}: the connection failed") from None
        if resp.status in (404, 405) and pinned:
            return self._unchecked(pinned, "the server offers no model list")
        if resp.status != 200:
            raise self._not_ok(what, resp)
        try:
            listed = listed_models(resp.body)
        except BadAnswer as e:
            if pinned:  # the generation will say whether the server knows it
                return self._unchecked(pinned, "the server's model list is unreadable")
            raise _Fail(Failure.BAD_RESPONSE, f"model discovery: {e}") from None
        chosen = self._choose(listed, what)
        if chosen.state in kinds.ROUTER_LOADING:
            raise _Fail(Failure.UNHEALTHY, f"{what}: the llama.cpp router lists model {excerpt(chosen.id)!r} as "
                                           f"{excerpt(chosen.state)!r}")
        if chosen.state not in (None, "loaded"):
            att.router_state = chosen.state
        self._model = chosen.id
        return chosen.id

    def _unchecked(self, pinned: str, why: str) -> str:
        self.model_note = f'model "{pinned}" (set by model; {why})'
        self._model = pinned
        return pinned

    def _choose(self, listed: list[Listed], what: str) -> Listed:
        # Shown cut and escaped as other server text (an id of 90 KB, or with a lone surrogate, is the
        # server's to send, not every surface's to repeat); the request names the id as listed.
        ids = [excerpt(m.id) for m in listed]
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        pinned = self._t.model
        if pinned:
            for m in listed:
                if m.id == pinned:
                    self.model_note = f'model "{pinned}" (set by model; listed by the server)'
                    return m
            raise _Fail(Failure.REJECTED, f"{what}: the server does not list model = {pinned!r}; it lists "
                                          f"{len(ids)}: {shown}: set model to one of them (or \"\" for the first)")
        first = listed[0]
        # The first is what vLLM serves a request without `model` with; `model` pins another.
        self.model_note = (f'model "{ids[0]}" (the only one listed)' if len(ids) == 1 else
                           f'model "{ids[0]}" (first of {len(ids)} listed: {shown})')
        return first

    def _not_ok(self, what: str, resp: _Response) -> _Fail:
        """A non-200 answer: `rejected` for a client error the server will repeat until someone acts,
        `http_status` for one it may get over (5xx, 408 Request Timeout, 429 Too Many Requests),
        `unhealthy` for llama.cpp's router saying the model is not loaded (it may load it)."""
        seen = _seen(what, resp)
        if resp.status == 400 and kinds.says(resp.body, kinds.ROUTER_NOT_LOADED):
            return _Fail(Failure.UNHEALTHY, f"{seen} (llama.cpp's router: load the model, or start it with "
                                            "--models-autoload)", resp.status)
        if 400 <= resp.status < 500 and resp.status not in (408, 429):
            return _Fail(Failure.REJECTED, f"{seen}; {self._fix(resp.status, resp.body, what)}", resp.status)
        return _Fail(Failure.HTTP_STATUS, seen, resp.status)

    def _fix(self, status: int, body: bytes, what: str) -> str:
        """The likely fix for a refusal, in terms of this target's config keys."""
        text = body.decode("utf-8", "replace").lower()
        t = self._t
        if status == 401:
            if t.api_key:
                return ("the server refused the API key: make api_key_file (or api_key_credential) hold the key "
                        "the server was started with (--api-key), then reload genready")
            return "the server wants an API key: set api_key_file (or api_key_credential) to a file holding it"
        if status == 403:
            return "the server forbids this request: check the API key and the server's access rules"
        if "chat template" in text or "chat_template" in text:
            return 'the model has no chat template: use api = "openai-completions"'
        if "model" in text and ("not found" in text or "does not exist" in text) and APIS[t.api].needs_model:
            return "the server does not serve that model: set model to one listed by GET /v1/models (or \"\")"
        if status in (404, 405) and MODELS_PATH in what:
            return 'the server offers no model list (GET /v1/models): set model = "NAME" for this target'
        if status in (404, 405):
            where = "path_prefix" if self._unix is not None else "the url's path"
            return f"the server has no {what} here: check api ({t.api!r}; {kinds.api_words()}) and {where}"
        if status == 400 and "tokenizer" in text and not t.prompt_ids:
            return ("the server has no tokenizer (started with --skip-tokenizer-init?): set prompt_ids = [...] "
                    "(the token ids of a short prompt) for this target")
        if status == 422 or (status == 400 and kinds.says(body, kinds.WRONG_SHAPE)):
            return f"the server expects another request shape: check api ({t.api!r}; {kinds.api_words()})"
        return "the server refuses the probe's request: check api, model, prompt and max_tokens"

    @property
    def _where(self) -> str:
        return self._t.endpoint.where

    async def _connect(self, att: _Attempt) -> _Conn:
        if self._unix is not None:
            return await self._connect_unix(att, self._unix)
        loop = asyncio.get_running_loop()
        try:
            if self._numeric:
                # No lookup to wait for: skip the executor round trip (probes come every 0.2 s
                # while a server loads, and the hop costs more than the rest of a refused probe).
                infos = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM,
                                           proto=socket.IPPROTO_TCP, flags=socket.AI_NUMERICHOST)
            else:
                infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM,
                                               proto=socket.IPPROTO_TCP)
        except OSError as e:
            att.refused = True
            raise _os_fail(e, f"cannot resolve {self._host}") from None
        addrs: list[tuple[int, tuple[Any, ...]]] = []
        for info in infos:
            if (info[0], info[4]) not in addrs:
                addrs.append((int(info[0]), tuple(info[4])))
        if self._t.verify_owner:
            local = [a for a in addrs if _is_local(*a)]
            if not local:
                shown = ", ".join(str(sa[0]) for _, sa in addrs)
                raise _Fail(Failure.FOREIGN_OWNER,
                            f"{self._host} ({shown}) is not an address of this machine: the owner of a remote "
                            "server cannot be proven (set verify_owner = false to probe it anyway)")
            addrs = local
        errors: list[str] = []
        for family, sockaddr in addrs:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, sockaddr)
            except OSError as e:
                sock.close()
                errors.append(f"{sockaddr[0]!s} port {sockaddr[1]!s}: {_oserror(e)}")
                continue
            except BaseException:
                sock.close()
                raise
            try:
                reader, writer = await asyncio.open_connection(
                    sock=sock, ssl=self._ssl, server_hostname=self._host if self._ssl else None, limit=_HEAD_LIMIT)
            except BaseException as e:
                sock.close()
                if self._ssl is not None and isinstance(e, OSError) and not isinstance(e, TimeoutError):
                    # The server took the connection: what failed is the TLS handshake, never "refused".
                    att.refused = True
                    why = reach.describe(e) if isinstance(e, ssl.SSLError) else (
                        f"the server closed the connection during the handshake ({_oserror(e)})")
                    raise _Fail(Failure.TLS, f"TLS handshake with {sockaddr[0]!s} port {sockaddr[1]!s} failed: "
                                             f"{why}{self._tls_hint(e)}") from None
                if isinstance(e, OSError) and not isinstance(e, TimeoutError):
                    errors.append(f"{sockaddr[0]!s} port {sockaddr[1]!s}: {_oserror(e)}")
                    continue
                raise
            conn = _Conn(reader, writer)
            if self._ssl is not None:
                conn.tls_closed_hint = (
                    "was our client certificate (client_cert_file) refused?" if self._t.client_cert_file else
                    "does it require a client certificate (mutual TLS)? set client_cert_file and client_key_file")
            self._open.add(conn)
            return conn
        att.refused = True
        raise _Fail(Failure.REFUSED, "cannot connect to " + "; ".join(errors))

    def _tls_hint(self, e: BaseException) -> str:
        if isinstance(e, ssl.SSLCertVerificationError):
            msg = e.verify_message or ""
            if "hostname" in msg.lower() or "ip address mismatch" in msg.lower():
                return " (the url's host must be a name or IP address in the certificate)"
            if not self._t.ca_file:
                return " (set ca_file to the CA that signed the server's certificate)"
            return f" (is {self._t.ca_file} the CA that signed the server's certificate?)"
        return ""

    async def _connect_unix(self, att: _Attempt, path: str) -> _Conn:
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=_HEAD_LIMIT)
        except OSError as e:
            if isinstance(e, TimeoutError):
                raise
            att.refused = True
            raise _os_fail(e, f"cannot connect to unix:{path}") from None
        conn = _Conn(reader, writer, unix=True)
        self._open.add(conn)
        return conn

    async def _release(self, conn: _Conn) -> None:
        self._open.discard(conn)
        await conn.close()
