"""The status page at `/`, in-process: the real app from serve/api.py (pytest-aiohttp's client, real
HTTP on loopback) over real gates whose systemd and server are the gate fakes (gatefakes.py says why).
What a real browser makes of the page, against a real manager: test_page_browser.py."""

from __future__ import annotations

import base64
import hashlib
import html.parser
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from genready.redact import escape
from genready.serve import api, openapi, page
from genready.serve.httplimits import HostCheck
from genready.serve.lastwords import LastWords
from genready.serve.target import Target
from tests.gatefakes import Rig, snap

if TYPE_CHECKING:  # generic from aiohttp 3.9 on: spelled only for mypy, never at run time
    Client = TestClient[web.Request, web.Application]

INV = "0123456789abcdef0123456789abcdef"
# What a hostile server or unit could write: markup, an end of the data block, escape sequences.
HOSTILE = ('<img src=x onerror="document.title=\'pwned\'"></script><script>document.title="pwned"</script>'
           "<!-- \x1b]0;pwned\x07 \x1b[2J & \u202e")


class Page:
    """One target `a`, ready as pid 100, whose server names a hostile model and whose last failed
    start wrote hostile lines; behind the real app with the daemon's Host: check."""

    def __init__(self, tmp: Path) -> None:
        self.a = Rig(tmp / "a", "a")
        self.a.prober.model_note = f"model {HOSTILE!r} (listed by the server)"
        words = LastWords(self.a.gate, "user")
        # Set here as LastWords sets it from a unit's output file: reading real lines off a real
        # unit is test_page_browser.py's; this checks what the page does with them.
        words.failure = {"invocation_id": "f" * 32, "main_pid": 99, "started_at": None, "ended_at": None,
                         "result": "exit-code", "exit_code": "exited", "exit_status": 3, "journal": [HOSTILE, "ok"]}
        hosts = HostCheck(lambda: (), "127.0.0.1:9")
        self.app = api.make_app({"a": Target(self.a.gate, words)}, None, limits=(hosts.middleware,))
        self.client: Client | None = None

    async def get(self, path: str, **headers: str) -> tuple[int, dict[str, str], str]:
        assert self.client is not None
        async with self.client.get(path, headers=headers) as r:
            return r.status, dict(r.headers), await r.text()


@pytest.fixture
async def served(tmp_path: Path, aiohttp_client: Callable[[web.Application], Awaitable[Client]]
                 ) -> AsyncIterator[Page]:
    p = Page(tmp_path)
    await p.a.ready(snap(inv=INV))
    p.client = await aiohttp_client(p.app)
    yield p
    await p.a.close()


class Parsed(html.parser.HTMLParser):
    """The elements and the scripts' and styles' text, as a browser's parser splits them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.blocks: list[tuple[str, dict[str, str | None], str]] = []  # (tag, attrs, text) of script/style
        self._open: tuple[str, dict[str, str | None]] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._open = (tag, dict(attrs))

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.blocks.append((*self._open, data))
            self._open = None
        else:
            self.text.append(data)

    def handle_endtag(self, tag: str) -> None:
        self._open = None


def parse(text: str) -> Parsed:
    p = Parsed()
    p.feed(text)
    p.close()
    return p


def csp(headers: dict[str, str]) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in headers["Content-Security-Policy"].split(";") if d.strip()}


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("accept", [None, "*/*", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
                                    "text/html, application/json", "application/json;q=0.5, text/html"])
async def test_a_browser_and_plain_curl_get_the_page(served: Page, accept: str | None) -> None:
    code, headers, text = await served.get("/", **({"Accept": accept} if accept is not None else {}))
    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert text.startswith("<!DOCTYPE html>") and headers["Vary"] == "Accept"
    # curl gets something to read without JavaScript: each target's state in a plain table.
    assert "<td>a</td><td>t.service</td><td>ready</td><td>100</td>" in text


@pytest.mark.parametrize("accept", ["application/json", "application/json, text/html;q=0.9", "application/json, */*"])
async def test_accept_json_gets_the_status_document(served: Page, accept: str) -> None:
    code, headers, text = await served.get("/", Accept=accept)
    assert code == 200 and headers["Content-Type"].startswith("application/json")
    doc = json.loads(text)
    _, _, status = await served.get("/status")
    want = json.loads(status)
    for d in (doc, want):
        d.pop("uptime_seconds")
        for t in d["targets"].values():
            t.pop("loading_seconds"), t.pop("eta_seconds")
    assert doc == want
    schema = openapi.spec()["paths"]["/"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema is openapi.STATUS


async def test_the_page_carries_the_status_document_it_shows(served: Page) -> None:
    _, _, text = await served.get("/")
    data = {attrs["id"]: t for tag, attrs, t in parse(text).blocks if attrs.get("type") == "application/json"}
    assert set(data) == {"status", "settings"}
    assert json.loads(data["settings"]) == page.SETTINGS
    doc = json.loads(data["status"])
    assert doc["targets"]["a"]["state"] == "ready" and doc["targets"]["a"]["pid"] == 100
    assert doc["targets"]["a"]["last_failure"]["journal"] == [HOSTILE, "ok"]  # read back exactly as it was
    assert doc["targets"]["a"]["model"] == served.a.prober.model_note


async def test_csp_allows_only_the_pages_own_script_and_style(served: Page) -> None:
    _, headers, text = await served.get("/")
    policy = csp(headers)
    assert policy["default-src"] == ["'none'"] and policy["connect-src"] == ["'self'"]
    assert policy["img-src"] == ["data:"] and policy["frame-ancestors"] == ["'none'"]
    assert not any("unsafe" in v or v in ("*", "http:", "https:") for vs in policy.values() for v in vs), policy
    parsed = parse(text)
    scripts = [t for tag, attrs, t in parsed.blocks if tag == "script" and "type" not in attrs]
    styles = [t for tag, _, t in parsed.blocks if tag == "style"]
    assert policy["script-src"] == [sha256(s) for s in scripts] and len(scripts) == 1
    assert policy["style-src"] == [sha256(s) for s in styles] and len(styles) == 1
    # Nothing from elsewhere: no src=, and the only href= are this API's own routes or the data: icon.
    assert not [a for _, a in parsed.tags if "src" in a]
    hrefs = {a["href"] for _, a in parsed.tags if "href" in a}
    assert hrefs == {"data:,", "/status", "/metrics", "/openapi.json"}
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"


async def test_hostile_text_is_no_markup_in_the_page(served: Page) -> None:
    _, _, text = await served.get("/")
    parsed = parse(text)
    # Every element in the page is the page's own: no <img>, no third <script>, no handler attribute.
    assert sorted({tag for tag, _ in parsed.tags}) == sorted(
        {"html", "head", "meta", "title", "link", "style", "body", "header", "h1", "span", "b", "nav", "a", "ul",
         "div", "main", "table", "tr", "th", "td", "script"})
    assert [tag for tag, _ in parsed.tags].count("script") == 3  # the status and settings blocks, the script
    assert not [a for _, a in parsed.tags if any(k.startswith("on") for k in a)]
    assert "<img" not in text and "</script><script>" not in text.replace("</script>\n<script>", "")
    assert "\x1b" not in text.split('<script type="application/json"')[0]  # nor raw in the plain table


async def test_the_script_never_parses_data_as_html() -> None:
    # The page's script builds every element itself and sets text as textContent: none of the DOM's
    # HTML parsers (and no eval) may appear in it. test_page_browser.py checks the same in Chromium.
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
                 "createContextualFragment", "DOMParser", "srcdoc"):
        assert sink not in page.LAYOUT.script, sink


def test_the_scripts_escape_is_the_clis() -> None:
    # The same table as redact.escape: what the browser test checks in Chromium with real text.
    pattern = re.search(r"const CTRL = /\[(.*?)\]/g;", page.LAYOUT.script)
    assert pattern is not None
    js_class = re.compile("[" + pattern.group(1).encode().decode("unicode_escape") + "]")
    every = "".join(chr(c) for c in range(0x3000))
    assert [c for c in every if js_class.match(c)] == [c for c in every if escape(c) != c]


async def test_a_foreign_host_gets_421_not_the_page(served: Page) -> None:
    code, _, text = await served.get("/", Host="evil.example")
    assert code == 421 and "DNS rebinding" in json.loads(text)["error"] and "<html" not in text
    code, _, _ = await served.get("/", Host="localhost:9")
    assert code == 200


async def test_the_page_changes_nothing(served: Page) -> None:
    assert served.client is not None
    async with served.client.post("/", data=b"{}") as r:
        assert r.status == 405 and (await r.json())["error"] == "method not allowed"
    async with served.client.head("/") as r:
        assert r.status == 200 and await r.read() == b""


@pytest.mark.parametrize(("accept", "json_"), [
    ("application/json", True), ("application/json;q=0", False), ("application/json;q=x", False),
    ("APPLICATION/JSON", True), ("text/html;q=0.1, application/json;q=0.2", True), ("", False),
    ("text/plain", False),
])
def test_accept_rules(accept: str, json_: bool) -> None:
    assert page.wants_json(accept) is json_


def test_render_escapes_every_field_of_the_plain_table() -> None:
    doc: dict[str, Any] = {"version": "<v>", "targets": {"x": {"target": "x", "unit": "<u>", "state": "ready",
                                                               "pid": None, "reason": "a & <b>"}}}
    text = page.render(doc)
    assert "<td>&lt;u&gt;</td>" in text and "<td>a &amp; &lt;b&gt;</td>" in text and "genready &lt;v&gt;" in text
