"""The status page at `/`: one self-contained HTML page drawn from `/status`'s own document.

The server sends the page with the `/status` document it would answer now embedded as a JSON data
block, and a plain table of each target's state for readers without JavaScript (curl, a text
browser). The page's one inline script (web/words.js and web/status.js) draws everything from that
document and then from `/status` every 2 s, each request with a deadline: an answer that fails or is
late marks the page "stale since" its last answer. It is written through web/htmlpage, as the sweep's
pages are: its escaping, its Content-Security-Policy (this page's own script and style by hash, requests
to its own origin, the data: icon) and the shared stylesheet.

Text from a server, a unit or a config is never parsed as HTML: the server escapes it (htmlpage.text,
and `<`, `>`, `&` as JSON escapes inside the data block), and the script sets it as textContent after
the same control-character escape as the CLI's (`redact.escape`), so an escape sequence in a unit's
last lines shows as `\\x1b[2J`, not as nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from genready.web import htmlpage
from genready.web.htmlpage import text

TIMELINE_STARTS: Final = 8  # the newest starts drawn per target (of /status's 20)

# How often the page asks /status again, and how long it waits for the answer before it says stale: a
# frozen genready (SIGSTOP) shows as stale within REFRESH + TIMEOUT seconds.
REFRESH_SECONDS: Final = 2.0
TIMEOUT_SECONDS: Final = 2.0
SETTINGS: Final = {"refresh_ms": int(REFRESH_SECONDS * 1000), "timeout_ms": int(TIMEOUT_SECONDS * 1000),
                   "timeline_starts": TIMELINE_STARTS}
LAYOUT: Final = htmlpage.STATUS
HEADERS: Final[Mapping[str, str]] = {**LAYOUT.headers, "Cache-Control": "no-store", "Vary": "Accept"}


def wants_json(accept: str | None) -> bool:
    """Does this Accept: ask for JSON over HTML? A media type named beats a wildcard, so curl's `*/*`
    and a browser's `text/html,…,*/*;q=0.8` get the page, `Accept: application/json` the document."""
    weights: dict[str, float] = {}
    for part in (accept or "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for p in params:
            key, _, value = p.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[media.lower()] = max(q, weights.get(media.lower(), 0.0))
    json_q = weights.get("application/json", 0.0)
    return json_q > 0 and json_q > weights.get("text/html", 0.0)


def _summary(doc: Mapping[str, Any]) -> str:
    """Each target's state as a plain table: what curl and a reader without JavaScript see."""
    rows = []
    targets: Mapping[str, Mapping[str, Any]] = doc.get("targets") or {}
    for t in targets.values():
        cells = (t.get("target"), t.get("unit"), t.get("state"), t.get("pid"), t.get("reason"))
        rows.append("<tr>" + "".join(f"<td>{text('' if c is None else c)}</td>" for c in cells) + "</tr>")
    return ('<table class="plain"><tr><th>target</th><th>unit</th><th>state</th><th>PID</th><th>reason</th></tr>'
            + "".join(rows) + "</table>")


def render(doc: Mapping[str, Any]) -> str:
    """The page, carrying `doc` (the `/status` document of this moment); its policy is HEADERS'."""
    version = text(doc.get("version", ""))
    body = (f'<header><h1>genready</h1><span id="facts"><span class="fact"><b>version</b>{version}</span></span>\n'
            '<nav class="links"><a href="/status">/status</a><a href="/metrics">/metrics</a>\n'
            '<a href="/openapi.json">API (OpenAPI)</a></nav></header>\n'
            '<ul id="problems" class="problems"></ul><div id="stale" class="stale-note"></div>\n'
            f'<main id="targets">{_summary(doc)}</main>')
    return LAYOUT.page(f"genready {doc.get('version', '')}", body, data={"status": doc, "settings": SETTINGS}).html
