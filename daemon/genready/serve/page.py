"""The status page at `/`: one self-contained HTML page drawn from `/status`'s own document.

The server sends the page with the `/status` document it would answer now embedded as a JSON data
block, and a plain table of each target's state for readers without JavaScript (curl, a text
browser). The page's one inline script draws everything from that document and then from `/status`
every 2 s. Nothing is fetched from anywhere else, and the Content-Security-Policy allows only this
page's own script and style (by hash), requests to its own origin, and the empty data: icon.

Text from a server, a unit or a config is never parsed as HTML: the server escapes it (html.escape,
and `<`, `>`, `&` as JSON escapes inside the data block), and the script sets it as textContent after
the same control-character escape as the CLI's (`redact.escape`), so an escape sequence in a unit's
last lines shows as `\\x1b[2J`, not as nothing.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Mapping
from typing import Any, Final

REFRESH_SECONDS: Final = 2.0
TIMELINE_STARTS: Final = 8  # the newest starts drawn per target (of /status's 20)

CSS: Final = """
:root { --ink: #1f2328; --muted: #656d76; --line: #d0d7de; --bg: #f6f8fa; --card: #fff;
  --ready: #1a7f37; --warming: #2da44e; --loading: #bf8700; --stuck: #d1242f; --bad: #cf222e;
  --off: #8c959f; --unknown: #8250df; --served: #57606a; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink);
  background: var(--bg); }
header { background: #24292f; color: #f6f8fa; padding: 10px 20px; display: flex; flex-wrap: wrap;
  gap: 6px 18px; align-items: center; }
header h1 { font-size: 17px; margin: 0 8px 0 0; }
header a { color: #9ecbff; }
#facts { display: flex; flex-wrap: wrap; gap: 4px 18px; }
.fact { white-space: nowrap; }
.fact b { color: #afb8c1; font-weight: 400; margin-right: 4px; }
.fact.bad { color: #ffaba8; font-weight: 600; }
.links { margin-left: auto; display: flex; gap: 14px; }
.problems { margin: 0; padding: 8px 20px; background: #ffebe9; color: #82071e; list-style: none; }
.problems:empty, .stale-note:empty { display: none; }
.stale-note { padding: 6px 20px; background: #fff8c5; color: #633c01; }
main { max-width: 1120px; margin: 16px auto; padding: 0 16px; display: grid; gap: 14px; }
.card { background: var(--card); border: 1px solid var(--line); border-left: 6px solid var(--off);
  border-radius: 6px; padding: 12px 16px; }
.top { display: flex; flex-wrap: wrap; align-items: baseline; gap: 4px 12px; }
.top h2 { font-size: 18px; margin: 0; }
.mono, .unit, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.unit { color: var(--muted); }
.state { color: #fff; background: var(--off); border-radius: 10px; padding: 1px 10px; font-weight: 600; }
.ids { margin-left: auto; color: var(--muted); }
.ids span { margin-left: 14px; }
.ids b { color: var(--ink); font-weight: 600; }
.reason { margin: 4px 0 8px; color: var(--muted); }
.load { display: flex; align-items: center; gap: 10px; margin: 6px 0; }
.bar { position: relative; flex: 0 0 320px; height: 12px; background: #eaeef2; border-radius: 6px;
  overflow: hidden; }
.fill { position: absolute; left: 0; top: 0; bottom: 0; background: var(--loading); }
.fill.done { background: var(--ready); }
.fill.over { background: var(--stuck); }
.mark { position: absolute; top: 0; bottom: 0; width: 2px; background: var(--ink); }
.probes { margin: 4px 0; }
.probes .err { color: var(--bad); }
.warnings { margin: 6px 0; padding: 6px 10px; background: #fff8c5; border: 1px solid #d4a72c;
  border-radius: 6px; list-style: none; }
.failure { margin: 8px 0; border: 1px solid #ffcecb; border-radius: 6px; background: #fff5f5; }
.failure h3 { font-size: 13px; margin: 0; padding: 6px 10px; color: var(--bad); }
pre { margin: 0; padding: 6px 10px; font-size: 12px; white-space: pre-wrap; word-break: break-all;
  background: #fff; border-top: 1px solid #ffcecb; max-height: 16em; overflow: auto; }
.timeline h3 { font-size: 13px; margin: 10px 0 4px; color: var(--muted); font-weight: 600; }
.start { display: grid; grid-template-columns: 70px 1fr 360px; gap: 10px; align-items: center;
  font-size: 12px; }
.track { position: relative; height: 10px; background: #eaeef2; border-radius: 3px; }
.span { position: absolute; top: 0; bottom: 0; min-width: 3px; border-radius: 3px; }
.o-serving { background: var(--ready); } .o-served { background: var(--served); }
.o-failed { background: var(--bad); } .o-loading { background: var(--loading); }
.o-revoked { background: var(--unknown); }
.when { color: var(--muted); }
.legend { font-size: 12px; color: var(--muted); display: flex; gap: 12px; margin: 0 4px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
.st-ready { border-left-color: var(--ready); } .st-ready .state { background: var(--ready); }
.st-warming { border-left-color: var(--warming); } .st-warming .state { background: var(--warming); }
.st-loading, .st-starting { border-left-color: var(--loading); }
.st-loading .state, .st-starting .state { background: var(--loading); }
.st-stuck, .st-rejected { border-left-color: var(--stuck); }
.st-stuck .state, .st-rejected .state { background: var(--stuck); }
.st-unknown { border-left-color: var(--unknown); } .st-unknown .state { background: var(--unknown); }
table.plain { border-collapse: collapse; background: #fff; }
table.plain td, table.plain th { border: 1px solid var(--line); padding: 4px 8px; text-align: left; }
body.stale main { opacity: .55; }
"""

# Every text from the document goes through el()/esc() into textContent: nothing is parsed as HTML.
# esc() is redact.escape's table (tests/test_page.py checks both give the same).
SCRIPT: Final = r"""
"use strict";
(() => {
const CTRL = /[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const hex = (n, w) => n.toString(16).padStart(w, "0");
const esc = (s) => String(s).replace(CTRL, (c) => {
  const n = c.charCodeAt(0);
  return n < 0x100 ? "\\x" + hex(n, 2) : "\\u" + hex(n, 4);
});
window.genreadyEscape = esc;
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = esc(text);
  return e;
}
function add(parent, ...kids) { for (const k of kids) if (k) parent.append(k); return parent; }
const secs = (s) => s == null ? "–" : s < 10 ? s.toFixed(2) + " s" : s < 120 ? s.toFixed(1) + " s"
  : s < 7200 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h";
const time = (iso) => {
  const d = new Date(iso);
  return iso && !isNaN(d) ? d.toLocaleTimeString([], {hour12: false}) : "–";
};
const ago = (iso) => {
  const t = Date.parse(iso);
  return isNaN(t) ? "" : secs(Math.max(0, (Date.now() - t) / 1000)) + " ago";
};
function fact(name, value, bad) {
  const f = add(el("span", bad ? "fact bad" : "fact"), el("b", null, name));
  f.append(esc(value));
  return f;
}

function header(st) {
  const facts = document.getElementById("facts");
  facts.replaceChildren(
    fact("version", st.version),
    fact("bus", st.bus + (st.bus_connected ? " (connected)" : " (not connected)"), !st.bus_connected),
    fact("systemd", st.systemd_responsive === false
      ? "not answering for " + secs(st.systemd_silent_seconds) : "answering", st.systemd_responsive === false),
    fact("up", secs(st.uptime_seconds)),
    fact("updated", time(new Date().toISOString())));
  const problems = document.getElementById("problems");
  problems.replaceChildren();
  const say = (text) => problems.append(el("li", null, text));
  if (st.bus_error) say("bus: " + st.bus_error);
  if (st.config_error) say("config: " + st.config_error);
  for (const r of st.restart_needed || []) say(r);
  if (st.owner_proof && st.owner_proof !== "available") say("owner proof: " + st.owner_proof);
}

function loadbar(t) {
  const expected = t.expected_load_seconds, now = t.ready ? t.load_seconds : t.loading_seconds;
  if (now == null && expected == null) return null;
  const scale = Math.max(now || 0, expected || 0) * 1.25 || 1;
  const bar = el("div", "bar");
  const over = expected != null && now != null && now > expected * 1.5;
  const fill = el("div", "fill" + (over ? " over" : t.ready ? " done" : ""));
  fill.style.width = (100 * (now || 0) / scale).toFixed(2) + "%";
  bar.append(fill);
  if (expected != null) {
    const mark = el("div", "mark");
    mark.style.left = (100 * expected / scale).toFixed(2) + "%";
    bar.append(mark);
  }
  let words = now == null ? "not loading" : (t.ready ? "loaded in " : "loading for ") + secs(now);
  words += expected == null ? " · no usual load yet" : " · usual " + secs(expected);
  if (!t.ready && t.eta_seconds != null) words += " · eta " + secs(t.eta_seconds);
  const label = el("span", "mono", words);
  label.dataset.field = "load";
  return add(el("div", "load"), bar, label);
}

function probes(t) {
  const p = el("div", "probes", "probes " + t.probes);
  if (t.health) p.append(esc(" · health " + t.health));
  if (t.model) p.append(esc(" · " + t.model));
  if (t.last_error) { p.append(" · last error "); p.append(el("span", "err mono", t.last_error)); }
  return p;
}

function warnings(t) {
  const all = [...(t.warnings || [])];
  if (t.config_changed_since_start) {
    all.push("configuration changed since this start: " + ((t.config_changes || []).join("; ") || "see the unit"));
  }
  if (!all.length) return null;
  const ul = el("ul", "warnings");
  for (const w of all) ul.append(el("li", null, "⚠ " + w));
  return ul;
}

function failure(f) {
  if (!f) return null;
  const box = el("div", "failure");
  const how = [f.result, f.exit_code, f.exit_status].filter((x) => x != null).join(" ");
  box.append(el("h3", null, "last failed start: PID " + f.main_pid + " · " + (how || "ended") + " · ended "
    + time(f.ended_at) + " (" + ago(f.ended_at) + ")"));
  const pre = el("pre");
  pre.dataset.field = "journal";
  pre.textContent = (f.journal || []).map(esc).join("\n") || "(it wrote nothing)";
  box.append(pre);
  return box;
}

// A stop or restart also revokes (job_queued, inactive, pid_changed): that start served, then ended.
// "revoked" is readiness withdrawn for a failing server (recheck_failed) or a lost bus.
const FAULTS = ["recheck_failed", "bus_lost"];
function outcome(r) {
  if (r.ready_at) {
    return FAULTS.includes(r.revoke_reason) ? "revoked" : r.ended_at || r.revoked_at ? "served" : "serving";
  }
  return r.ended_at ? "failed" : "loading";
}

function timeline(records) {
  const recs = (records || []).filter((r) => !isNaN(Date.parse(r.started_at))).slice(0, __STARTS__);
  if (!recs.length) return null;
  const nowMs = Date.now();
  const t0 = Math.min(...recs.map((r) => Date.parse(r.started_at)));
  const span = Math.max(nowMs - t0, 1000);
  const box = add(el("div", "timeline"), el("h3", null, "newest starts"));
  for (const r of recs) {
    const o = outcome(r), start = Date.parse(r.started_at);
    const end = Date.parse(r.ready_at || r.ended_at) || nowMs;
    const bar = el("div", "span o-" + o);
    bar.style.left = (100 * (start - t0) / span).toFixed(2) + "%";
    bar.style.width = (100 * Math.max(end - start, 0) / span).toFixed(2) + "%";
    let words = "PID " + r.main_pid + " · ";
    if (o === "failed") words += "failed after " + secs((end - start) / 1000) + ": " + (r.result || "ended");
    else if (o === "loading") words += "loading " + secs((nowMs - start) / 1000);
    else words += "ready in " + secs(r.load_seconds) + (o === "serving" ? "" : o === "revoked"
      ? " · revoked: " + r.revoke_reason : " · ended");
    const row = add(el("div", "start"), el("span", "when", time(r.started_at)),
      add(el("div", "track"), bar), el("span", "mono", words));
    row.dataset.outcome = o;
    box.append(row);
  }
  return box;
}

function legend() {
  const box = el("div", "legend");
  box.append("newest starts:");
  for (const [o, words] of [["serving", "ready now"], ["served", "was ready, ended"], ["revoked", "revoked"],
                            ["failed", "ended before ready"], ["loading", "loading"]]) {
    const item = el("span");
    item.append(el("i", "o-" + o), words);
    box.append(item);
  }
  return box;
}

const WAITING = ["starting", "loading", "warming", "stuck", "rejected"];  // a start being probed
function card(t) {
  const c = el("section", "card st-" + t.state);
  c.dataset.target = t.target;
  const state = el("span", "state", t.state);
  state.dataset.field = "state";
  const pid = el("b", null, t.pid ? t.pid : "–");  // 0: no process runs
  pid.dataset.field = "pid";
  const since = t.ready ? el("span", null, "ready since " + time(t.ready_since) + " (" + ago(t.ready_since) + ")")
    : t.waiting_since && WAITING.includes(t.state) ? el("span", null, "waiting since " + time(t.waiting_since)) : null;
  const ids = add(el("span", "ids"), add(el("span", null, "PID "), pid), since);
  add(c, add(el("div", "top"), el("h2", null, t.target), el("span", "unit", t.unit), state, ids),
    el("p", "reason", t.reason), loadbar(t), probes(t), warnings(t), failure(t.last_failure), timeline(t.records));
  return c;
}

function draw(st) {
  header(st);
  const main = document.getElementById("targets");
  const cards = Object.values(st.targets || {}).map(card);
  main.replaceChildren(...(cards.length ? [...cards, legend()] : [el("p", null, "no targets configured")]));
  document.body.classList.remove("stale");
  document.getElementById("stale").textContent = "";
  document.body.dataset.drawn = String(Date.now());
}

async function refresh() {
  try {
    const r = await fetch("/status", {headers: {Accept: "application/json"}, cache: "no-store"});
    if (!r.ok) throw new Error("/status answered " + r.status);
    draw(await r.json());
  } catch (e) {
    document.body.classList.add("stale");
    document.getElementById("stale").textContent = esc("genready does not answer (" + e.message
      + "); showing what it last said, trying again every __REFRESH__ s");
  } finally {
    setTimeout(refresh, __REFRESH_MS__);
  }
}

draw(JSON.parse(document.getElementById("status").textContent));
setTimeout(refresh, __REFRESH_MS__);
})();
""".replace("__STARTS__", str(TIMELINE_STARTS)).replace("__REFRESH_MS__", str(int(REFRESH_SECONDS * 1000))) \
    .replace("__REFRESH__", f"{REFRESH_SECONDS:g}")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# The page's only permissions: its own script and style (by hash: no nonce to keep per response),
# fetch() to its own origin, and the data: icon (else the browser asks for /favicon.ico, a 404).
CSP: Final = "; ".join([
    "default-src 'none'", f"script-src {_sha256(SCRIPT)}", f"style-src {_sha256(CSS)}", "connect-src 'self'",
    "img-src data:", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'",
])
HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store", "Vary": "Accept",
}


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


def _data_block(doc: Mapping[str, Any]) -> str:
    # Inside <script type="application/json"> only `</script` or `<!--` could end the block early:
    # `<`, `>` and `&` as JSON escapes make both impossible, and JSON.parse reads them back as they were.
    text = json.dumps(doc, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _summary(doc: Mapping[str, Any]) -> str:
    """Each target's state as a plain table: what curl and a reader without JavaScript see."""
    rows = []
    targets: Mapping[str, Mapping[str, Any]] = doc.get("targets") or {}
    for t in targets.values():
        cells = (t.get("target"), t.get("unit"), t.get("state"), t.get("pid"), t.get("reason"))
        rows.append("<tr>" + "".join(f"<td>{html.escape(str('' if c is None else c))}</td>" for c in cells) + "</tr>")
    return ('<table class="plain"><tr><th>target</th><th>unit</th><th>state</th><th>PID</th><th>reason</th></tr>'
            + "".join(rows) + "</table>")


def render(doc: Mapping[str, Any]) -> str:
    """The page, carrying `doc` (the `/status` document of this moment)."""
    version = html.escape(str(doc.get("version", "")))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>genready {version}</title>
<link rel="icon" href="data:,">
<style>{CSS}</style>
</head><body>
<header><h1>genready</h1><span id="facts"><span class="fact"><b>version</b>{version}</span></span>
<nav class="links"><a href="/status">/status</a><a href="/metrics">/metrics</a>
<a href="/openapi.json">API (OpenAPI)</a></nav></header>
<ul id="problems" class="problems"></ul><div id="stale" class="stale-note"></div>
<main id="targets">{_summary(doc)}</main>
<script type="application/json" id="status">{_data_block(doc)}</script>
<script>{SCRIPT}</script>
</body></html>
"""
