"""The CLI's side of the HTTP API: small blocking calls, and a readable status table."""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from typing import Any, NoReturn

from genready import console
from genready.exitcodes import Exit


class Unreachable(Exception):
    """The genready daemon did not answer."""


def unreachable(base: str, e: Exception) -> NoReturn:
    console.err(f"genready: the daemon at {base} is unreachable: {e}")
    console.err("hint: is genready.service running? `systemctl status genready`")
    sys.exit(Exit.UNAVAILABLE)


def request(base: str, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    """(HTTP status, decoded JSON body). Raises Unreachable if the daemon does not answer."""
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {"error": f"HTTP {e.code}"}
    except (OSError, ValueError, http.client.HTTPException) as e:  # incl. a port that does not speak HTTP
        raise Unreachable(str(e) or type(e).__name__) from e


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
    targets: dict[str, Any] = data.get("targets", {})
    rows = [["TARGET", "UNIT", "STATE", "PID", "READY SINCE", "LOAD s", "PROBES", "REASON / LAST ERROR"]]
    for name, t in targets.items():
        rows.append([name, *(_cell(t.get(k)) for k in ("unit", "state", "pid", "ready_since", "load_seconds",
                                                      "probes")), _cell(t.get("reason") or t.get("last_error"))])
    out.append("\n" + _table(rows))
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
    return "".join(out)
