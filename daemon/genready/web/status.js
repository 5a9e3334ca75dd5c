// The status page at `/` (serve/page.py): draws everything from /status's document, first the one the page
// carries (the JSON block #status), then /status every refresh_ms. Every text from the document goes through
// el()/esc() into textContent: nothing is parsed as HTML. esc(), duration() and ago() come from words.js,
// which comes first in the same <script>.
(() => {
const SETTINGS = JSON.parse(document.getElementById("settings").textContent);
window.genreadyEscape = esc;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = esc(text);
  return e;
}
function add(parent, ...kids) { for (const k of kids) if (k) parent.append(k); return parent; }
const time = (iso) => {
  const d = new Date(iso);
  return iso && !isNaN(d) ? d.toLocaleTimeString([], {hour12: false}) : "–";
};
const agoIso = (iso) => {
  const t = Date.parse(iso);
  return isNaN(t) ? "" : ago((Date.now() - t) / 1000);
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
      ? "not answering for " + duration(st.systemd_silent_seconds) : "answering", st.systemd_responsive === false),
    fact("up", duration(st.uptime_seconds)),
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
  let words = now == null ? "not loading" : (t.ready ? "loaded in " : "loading for ") + duration(now);
  words += expected == null ? " · no usual load yet" : " · usual " + duration(expected);
  if (!t.ready && t.eta_seconds != null) words += " · eta " + duration(t.eta_seconds);
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
  for (const x of t.foreign_listeners || []) {
    all.push("PID " + x.pid + " (" + x.comm + ", uid " + x.uid + ") listens on " + x.address + " port " + x.port
      + " too, outside this start: it gets connections made to the url; not ready while it does");
  }
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
    + time(f.ended_at) + " (" + agoIso(f.ended_at) + ")"));
  const pre = el("pre");
  pre.dataset.field = "journal";
  pre.textContent = (f.journal || []).map(esc).join("\n") || "(it wrote nothing)";
  box.append(pre);
  for (const h of f.gpu_strays || []) box.append(el("p", "err", "GPU memory was held by a stray: " + h.line));
  return box;
}

const gib = (n) => n == null ? "?" : (n / 2 ** 30).toFixed(1) + " GiB";
// Who holds the GPUs' memory (daemon.gpu_interval): the current start's per GPU, and each stray, a process
// of an earlier start still holding memory (the likely cause of the next start's CUDA out-of-memory).
function gpu(g) {
  if (!g) return null;
  const box = el("div", "gpu");
  box.dataset.field = "gpu";
  if (g.error) return add(box, el("p", "err", "GPU processes not read: " + g.error));
  const cur = Object.entries(g.current_bytes || {}).map(([u, n]) => u + " " + gib(n)).join(", ");
  const strays = g.strays || [];
  if (!cur && !strays.length) return null;
  box.append(el("p", "mono", "GPU memory of this start: " + (cur || "none")));
  if (strays.length) {
    const ul = el("ul", "warnings strays");
    for (const h of strays) {
      const li = el("li", null, "⚠ stray PID " + h.pid + " holds " + gib(h.bytes) + " on " + h.gpu + ": "
        + h.command + " · " + (h.invocation_id ? "left by start " + h.invocation_id.slice(0, 12)
        : "of a start genready has no record of") + " · end it with kill " + h.pid);
      li.dataset.pid = String(h.pid);
      ul.append(li);
    }
    box.append(ul);
  }
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
  const recs = (records || []).filter((r) => !isNaN(Date.parse(r.started_at))).slice(0, SETTINGS.timeline_starts);
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
    if (o === "failed") words += "failed after " + duration((end - start) / 1000) + ": " + (r.result || "ended");
    else if (o === "loading") words += "loading " + duration((nowMs - start) / 1000);
    else words += "ready in " + duration(r.load_seconds) + (o === "serving" ? "" : o === "revoked"
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
  const since = t.ready ? el("span", null, "ready since " + time(t.ready_since) + " (" + agoIso(t.ready_since) + ")")
    : t.waiting_since && WAITING.includes(t.state) ? el("span", null, "waiting since " + time(t.waiting_since)) : null;
  const ids = add(el("span", "ids"), add(el("span", null, "PID "), pid), since);
  add(c, add(el("div", "top"), el("h2", null, t.target), el("span", "unit", t.unit), state, ids),
    el("p", "reason", t.reason), loadbar(t), probes(t), warnings(t), gpu(t.gpu), failure(t.last_failure),
    timeline(t.records));
  return c;
}

let drawnAt = Date.now();  // when the page last drew an answer of genready's: what "stale since" names

function draw(st) {
  header(st);
  const main = document.getElementById("targets");
  const cards = Object.values(st.targets || {}).map(card);
  main.replaceChildren(...(cards.length ? [...cards, legend()] : [el("p", null, "no targets configured")]));
  drawnAt = Date.now();
  document.body.classList.remove("stale");
  document.getElementById("stale").textContent = "";
  document.body.dataset.drawn = String(drawnAt);
}

// What the page shows stays as genready last said it, dimmed, under a note of since when and why.
function stale(why) {
  document.body.classList.add("stale");
  const since = new Date(drawnAt).toISOString();
  document.getElementById("stale").textContent = esc("stale since " + time(since) + " (" + agoIso(since) + "): "
    + why + "; showing what genready last said, asking again every " + duration(SETTINGS.refresh_ms / 1000));
}

// Every request has a deadline: a frozen genready (SIGSTOP, swap) accepts the connection in the kernel and
// never answers, and a fetch without one would wait forever, with the page still saying "ready".
async function refresh() {
  const abort = new AbortController();
  const deadline = setTimeout(() => abort.abort(), SETTINGS.timeout_ms);
  try {
    const r = await fetch("/status", {headers: {Accept: "application/json"}, cache: "no-store",
                                      signal: abort.signal});
    if (!r.ok) throw new Error("/status answered " + r.status);
    draw(await r.json());
  } catch (e) {
    stale(abort.signal.aborted ? "genready did not answer within " + duration(SETTINGS.timeout_ms / 1000)
      : "genready does not answer (" + e.message + ")");
  } finally {
    clearTimeout(deadline);
    setTimeout(refresh, SETTINGS.refresh_ms);
  }
}

draw(JSON.parse(document.getElementById("status").textContent));
setTimeout(refresh, SETTINGS.refresh_ms);
})();
