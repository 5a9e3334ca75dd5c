"""The one way genready writes HTML, for its three hand-built pages: the status page (serve/page), the
sweep report (sweep/html) and the comparison of two sweeps (sweep/compare).

- Text from a server, a unit, a plan or a results file goes through `text()`: control characters shown
  escaped as the CLI shows them (redact.escape: `\\x1b[2J`, not a cleared screen), then HTML-escaped.
- A page is self-contained: its stylesheet (base.css, then the page's own) and its script inline, images
  as data: URIs, requests to its own origin only where it asks (the status page's /status). So its
  Content-Security-Policy names each inline block by its SHA-256 and allows nothing else: no
  'unsafe-inline', no host.
- The CSS and the script are package data files beside this module (web/*.css, web/*.js), where a
  linter reads them (tests/test_htmlpage.py), not Python strings.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from genready.redact import escape

BASE_CSS: Final = "base.css"


@functools.cache
def asset(name: str) -> str:
    """The text of one of this package's data files (a .css or .js beside this module)."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


# Text that neither escape changes: printable ASCII but the five characters HTML gives a meaning (" & ' < >),
# in one match. Most cells of a report are such; a report of 64 MiB of results writes a million of them.
_PLAIN: Final = re.compile(r"[\x20\x21\x23-\x25\x28-\x3b\x3d\x3f-\x7e]*").fullmatch


def text(v: object) -> str:
    """`v` as text inside HTML (an element's content or a quoted attribute): control characters escaped
    as the CLI shows them, then `<`, `>`, `&` and quotes as character references."""
    s = str(v)
    if _PLAIN(s):
        return s
    return html.escape(escape(s))


def _finite(doc: Any) -> Any:
    """`doc` with each NaN or ±Infinity as None."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, Mapping):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_finite(v) for v in doc]
    return doc


def json_block(doc: Any) -> str:
    """`doc` as the content of a `<script type="application/json">`: inside it only `</script` or `<!--`
    could end the block early, and `<`, `>` and `&` as JSON escapes make both impossible (JSON.parse reads
    them back as they were). What JSON.parse reads: ASCII (a lone surrogate stays an escape, not a byte
    the page cannot be encoded with), NaN and ±Infinity as null."""
    try:
        out = json.dumps(doc, allow_nan=False)
    except ValueError:
        out = json.dumps(_finite(doc), allow_nan=False)
    return out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def sha256(block: str) -> str:
    """The CSP source that allows exactly this inline `<script>` or `<style>` content."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(block.encode()).digest()).decode() + "'"


def csp(*, scripts: Sequence[str] = (), styles: Sequence[str] = (), connect: bool = False,
        header: bool = True) -> str:
    """The policy of a page whose only inline blocks are `scripts` and `styles` (each allowed by its hash),
    whose images are data: URIs, and that may fetch() its own origin when `connect`. `header`: sent as an
    HTTP header; a `<meta>` policy (a file) cannot hold frame-ancestors (browsers ignore it there, and say
    so in the console)."""
    policy = ["default-src 'none'"]
    if scripts:
        policy.append("script-src " + " ".join(sha256(s) for s in scripts))
    if styles:
        policy.append("style-src " + " ".join(sha256(s) for s in styles))
    if connect:
        policy.append("connect-src 'self'")
    # data: images: the icon (else a browser asks for /favicon.ico) and the report's plots.
    policy += ["img-src data:", "base-uri 'none'", "form-action 'none'"]
    if header:
        policy.append("frame-ancestors 'none'")
    return "; ".join(policy)


@dataclass(frozen=True)
class Page:
    """A page's document and the policy that allows exactly its own script and style."""

    html: str
    csp: str


@dataclass(frozen=True)
class Layout:
    """What a kind of page is made of: its stylesheets (base.css first) and its script files, in order,
    each read once; and the policy that allows them."""

    styles: tuple[str, ...]
    scripts: tuple[str, ...] = ()
    connect: bool = False
    header: bool = True  # the policy goes in an HTTP header (served), else in the page's <meta> (a file)

    @functools.cached_property
    def style(self) -> str:
        return "\n".join(asset(n) for n in (BASE_CSS, *self.styles))

    @functools.cached_property
    def script(self) -> str:
        return "\n".join(asset(n) for n in self.scripts)

    @functools.cached_property
    def csp(self) -> str:
        return csp(scripts=[self.script] if self.scripts else [], styles=[self.style], connect=self.connect,
                   header=self.header)

    @functools.cached_property
    def headers(self) -> Mapping[str, str]:
        """A served page's security headers: its policy, no MIME sniffing, no referrer sent on."""
        return {"Content-Security-Policy": self.csp, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer"}

    def page(self, title: str, body: str, *, data: Mapping[str, Any] | None = None) -> Page:
        """The whole document: `title` (plain text, escaped here), `body` (HTML the caller built with
        text()), and `data`: JSON blocks by id, for the script to read (not run: the CSP does not apply)."""
        meta = "" if self.header else f'<meta http-equiv="Content-Security-Policy" content="{text(self.csp)}">\n'
        blocks = "".join(f'<script type="application/json" id="{text(k)}">{json_block(v)}</script>\n'
                         for k, v in (data or {}).items())
        script = f"<script>{self.script}</script>\n" if self.scripts else ""
        doc = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n' + meta +
               '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
               f'<title>{text(title)}</title>\n<link rel="icon" href="data:,">\n<style>{self.style}</style>\n'
               f"</head><body>\n{body}\n{blocks}{script}</body></html>\n")
        return Page(doc, self.csp)


STATUS: Final = Layout(styles=("status.css",), scripts=("words.js", "status.js"), connect=True)
REPORT: Final = Layout(styles=("report.css",), header=False)


def data_image(svg: str, alt: str) -> str:
    """An SVG as an `<img>` of a data: URI: an image's own styles and scripts are its own, so the page's
    policy stays hash-only (an inline SVG's style attributes would need 'unsafe-inline'), and nothing in
    it can run or fetch."""
    uri = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    return f'<img src="{uri}" alt="{text(alt)}">'
