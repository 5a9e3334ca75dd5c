"""The CLI's side of the HTTP API: small blocking calls, and a readable status table."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any, NoReturn

EX_UNAVAILABLE = 69


class Unreachable(Exception):
    """The genready daemon did not answer."""


def unreachable(base: str, e: Exception) -> NoReturn:
    print(f"genready: the daemon at {base} is unreachable: {e}", file=sys.stderr)
    print("hint: is genready.service running? `systemctl status genready`", file=sys.stderr)
    sys.exit(EX_UNAVAILABLE)


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
    except (OSError, ValueError) as e:
        raise Unreachable(str(e)) from e


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
        rows.append([name, t["unit"], t["state"], _cell(t["pid"]), _cell(t["ready_since"]),
                     _cell(t["load_seconds"]), _cell(t["probes"]), _cell(t["reason"] or t["last_error"])])
    out.append("\n" + _table(rows))
    for name, t in targets.items():
        recs = t.get("records") or []
        if not recs:
            continue
        out.append(f"\n{name}: newest starts\n")
        rows = [["INVOCATION", "PID", "STARTED", "READY", "LOAD s", "ENDED", "RESULT"]]
        for r in recs:
            rows.append([r["invocation_id"][:12], _cell(r["main_pid"]), _cell(r["started_at"]),
                         _cell(r["ready_at"]), _cell(r["load_seconds"]), _cell(r["ended_at"]),
                         _cell(r["result"] or r.get("revoke_reason"))])
        out.append(_table(rows))
    return "".join(out)
