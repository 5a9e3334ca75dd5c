"""The CLI's side of the HTTP API: small blocking calls, and a readable status table."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from genready import console
from genready.exitcodes import Exit
from genready.timewords import duration, local_time


class Unreachable(Exception):
    """The genready daemon did not answer."""


def unreachable(base: str, e: Exception) -> NoReturn:
    console.err(f"genready: the daemon at {base} is unreachable: {e}")
    console.err("hint: is genready.service running? `systemctl status genready`")
    sys.exit(Exit.UNAVAILABLE)


def request(base: str, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    """(HTTP status, decoded JSON body). Raises Unreachable if the daemon does not answer."""
    try:
        status, body = _get(base, path, timeout) if base.startswith("http://") else _get_tls(base, path, timeout)
    except (OSError, ValueError) as e:  # incl. a port that does not speak HTTP
        raise Unreachable(str(e) or type(e).__name__) from e
    try:
        return status, json.loads(body)
    except ValueError:
        if 200 <= status < 300:
            raise Unreachable(f"HTTP {status} with a body that is not JSON") from None
        return status, {"error": f"HTTP {status}"}


MAX_HEAD = 64 * 1024  # bytes of status line and headers


def _get(base: str, path: str, timeout: float) -> tuple[int, bytes]:
    """GET over plain HTTP/1.1, `Connection: close`: the daemon's API, read with a socket alone.
    urllib and http.client would bring email and ssl along, a third of `genready wait`'s start-up,
    and that command is the ExecCondition= of every triggered benchmark (bench/cli_start.py)."""
    from urllib.parse import urlsplit  # already loaded with the config

    url = urlsplit(base + path)
    if url.hostname is None:
        raise ValueError(f"no host in {base!r}")
    netloc = url.netloc.rpartition("@")[2]
    target = (url.path or "/") + (f"?{url.query}" if url.query else "")
    head = f"GET {target} HTTP/1.1\r\nHost: {netloc}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    # An ASCII host as bytes: a str one is encoded by the idna codec, which loads unicodedata.
    host: str | bytes = url.hostname.encode("ascii") if url.hostname.isascii() else url.hostname
    with socket.create_connection((host, url.port or 80), timeout=timeout) as s:  # type: ignore[arg-type]
        s.sendall(head.encode("ascii"))
        data = b""
        while b"\r\n\r\n" not in data:
            if len(data) > MAX_HEAD:
                raise ValueError("the answer's headers are too long")
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("the connection closed before an HTTP answer")
            data += chunk
        raw_head, _, body = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise ValueError(f"not an HTTP answer: {lines[0][:60]!r}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers["content-length"]) if "content-length" in headers else None
        while length is None or len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _unchunk(body)
    elif length is not None:
        if len(body) < length:
            raise ConnectionError(f"the answer ended after {len(body)} of {length} bytes")
        body = body[:length]
    return int(rest[:3]), body


def _unchunk(data: bytes) -> bytes:
    out, i = b"", 0
    while True:
        end = data.index(b"\r\n", i)  # ValueError on a cut answer
        size = int(data[i:end].split(b";")[0], 16)
        if size == 0:
            return out
        out += data[end + 2:end + 2 + size]
        i = end + 2 + size + 2


def _get_tls(base: str, path: str, timeout: float) -> tuple[int, bytes]:
    """Any other URL (https:// behind a proxy of the user's): urllib, loaded only then."""
    import http.client
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except http.client.HTTPException as e:
        raise ValueError(str(e) or type(e).__name__) from e


def get_json(base: str, path: str, timeout: float = 10.0) -> Any:
    """GET a JSON document or exit 69 when the daemon is unreachable."""
    try:
        return request(base, path, timeout)[1]
    except Unreachable as e:
        unreachable(base, e)


def _cell(v: object) -> str:
    return "-" if v is None or v == "" else str(v)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows)


def format_status(data: dict[str, Any]) -> str:
    """/status as text: a line per target, then each target's newest start records."""
    out = [f"genready {data.get('version')}  up {data.get('uptime_seconds', 0):.0f}s  "
           f"bus {data.get('bus')} {'connected' if data.get('bus_connected') else 'DISCONNECTED'}  "
           f"owner proof: {data.get('owner_proof')}\n"]
    if data.get("config_error"):
        out.append(f"config reload refused: {data['config_error']}\n")
    out.extend(f"{why}\n" for why in data.get("restart_needed") or [])
    for name, t in (data.get("targets") or {}).items():
        if t.get("config_changed_since_start"):
            out.append(f"warning: {name}: {t.get('unit')} changed since pid {t.get('pid')} started; it runs the old "
                       f"configuration until restarted (guard and sweep refuse it): "
                       f"{'; '.join(t.get('config_changes') or [])}\n")
    targets: dict[str, Any] = data.get("targets", {})
    rows = [["TARGET", "UNIT", "STATE", "PID", "READY SINCE", "LOAD s", "PROBES", "REASON / LAST ERROR"]]
    for name, t in targets.items():
        rows.append([name, *(_cell(t.get(k)) for k in ("unit", "state", "pid", "ready_since", "load_seconds",
                                                      "probes")), _cell(t.get("reason") or t.get("last_error"))])
    out.append("\n" + _table(rows))
    for name, t in targets.items():
        out += [f"warning: {name}: {w}\n" for w in t.get("warnings") or []]
    for name, t in targets.items():
        recs = t.get("records") or []
        if not recs:
            continue
        out.append(f"\n{name}: newest starts\n")
        rows = [["INVOCATION", "PID", "STARTED", "READY", "LOAD s", "ENDED", "RESULT"]]
        for r in recs:
            rows.append([str(r.get("invocation_id", ""))[:12],
                         *(_cell(r.get(k)) for k in ("main_pid", "started_at", "ready_at", "load_seconds", "ended_at")),
                         _cell(r.get("result") or r.get("revoke_reason"))])
        out.append(_table(rows))
    out.append(format_failures(targets))
    out.append(format_gpu(targets))
    return "".join(out)


def format_failures(targets: dict[str, Any], when: Callable[[str | None], str] = str) -> str:
    """Each target's last start that failed before it was verified: how it ended, its last lines.
    `when` shows a time (the API's ISO 8601 as it is, or local time for people)."""
    out = []
    for name, t in targets.items():
        f = t.get("last_failure")
        if not f:
            continue
        code = f" ({f['exit_code']} with status {f['exit_status']})" if f.get("exit_code") else ""
        out.append(f"\n{name}: start {str(f.get('invocation_id'))[:12]} (pid {f.get('main_pid')}) ended before it "
                   f"was verified: Result={f.get('result')}{code}, at {when(f.get('ended_at'))}\n")
        out += [f"  | {line}\n" for line in f.get("journal") or []]
        out += [f"  GPU memory was held by a stray: {h.get('line')}\n" for h in f.get("gpu_strays") or []
                if isinstance(h, dict)]
    return "".join(out)


def _gib(n: object) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, int) else "?"


def format_gpu(targets: dict[str, Any]) -> str:
    """Each target's GPU memory (as the daemon last read it): the current start's per GPU, then each
    stray (a process of an earlier start still holding memory) with how to end it."""
    out = []
    for name, t in targets.items():
        g = t.get("gpu")
        if not isinstance(g, dict):
            continue
        if g.get("error"):
            out.append(f"\n{name}: GPU processes not read: {g['error']}\n")
            continue
        current = ", ".join(f"{gpu} {_gib(n)}" for gpu, n in (g.get("current_bytes") or {}).items()) or "none"
        strays = [h for h in g.get("strays") or [] if isinstance(h, dict)]
        if not strays and current == "none":
            continue
        out.append(f"\n{name}: GPU memory of the current start: {current}\n")
        if strays:
            rows = [["STRAY PID", "GPU", "MEMORY", "LEFT BY", "COMMAND"]]
            rows += [[_cell(h.get("pid")), _cell(h.get("gpu")), _gib(h.get("bytes")),
                      str(h.get("invocation_id") or "unknown start")[:12], str(h.get("command", ""))[:80]]
                     for h in strays]
            out.append(_table(rows))
            out += [f"warning: {name}: {h.get('line')}\n" for h in strays]
    return "".join(out)


def format_status_tty(data: dict[str, Any], now: float | None = None) -> str:
    """/status for a person at a terminal: one row per target (local times, "3m ago", the load
    against its usual length, the last failure), then each failed start's own last lines."""
    from genready.client import progress

    out = [f"genready {data.get('version')}, up {duration(data.get('uptime_seconds', 0))}, "
           f"{data.get('bus')} bus {'connected' if data.get('bus_connected') else 'DISCONNECTED'}\n"]
    if data.get("config_error"):
        out.append(f"config reload refused: {data['config_error']}\n")
    targets: dict[str, Any] = data.get("targets", {})
    rows = [["TARGET", "STATE", "PID", "SINCE", "LOAD (EXPECTED)", "LAST FAILURE"]]
    for name, t in targets.items():
        since = t.get("ready_since") if t.get("ready") else t.get("waiting_since")
        expected = t.get("expected_load_seconds")
        usual = f" (~{duration(expected)})" if expected is not None else ""
        if t.get("ready"):
            load = f"{duration(t.get('load_seconds'))}{usual}" if t.get("load_seconds") is not None else "-"
        else:
            load = progress.load_text(t) or "-"
        f = t.get("last_failure")
        if f:
            status = f" {f.get('exit_code')} {f.get('exit_status')}" if f.get("exit_code") else ""
            ended = local_time(f.get("ended_at"), now).split(" (")[-1].rstrip(")")
            failure = f"{f.get('result')}{status}, {ended}"
        elif t.get("last_error"):
            failure = f"probe {t.get('probes')}: {t['last_error']}"
        else:
            failure = "-" if t.get("ready") or not t.get("reason") else str(t["reason"])
        rows.append([name, str(t.get("state")), _cell(t.get("pid")), local_time(since, now), load,
                     failure[:80]])
    out.append("\n" + _table(rows))
    out.append(format_failures(targets, lambda iso: local_time(iso, now)))
    out.append(format_gpu(targets))
    return "".join(out)
