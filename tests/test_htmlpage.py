"""web/htmlpage.py and the pages' CSS and JavaScript files: the linters `./dev test` runs over them, the
page script's words against the CLI's on the same inputs, and the helper's escaping and policy.

The stylesheets are read by tinycss2 (a test extra; Debian 12: python3-tinycss2), in-process. The scripts
are read by node (`node --check`: V8's own parser) and their words run in it, so those tests start a
process and are `system` tests; node is on every machine of this project (the machine's Node.js 20)."""

from __future__ import annotations

import html
import json
import math
import random
import re
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from genready.redact import escape
from genready.timewords import ago, duration
from genready.web import htmlpage
from tests import ci

WEB = resources.files("genready.web")
CSS_FILES = sorted(p.name for p in WEB.iterdir() if p.name.endswith(".css"))
JS_FILES = sorted(p.name for p in WEB.iterdir() if p.name.endswith(".js"))
LAYOUTS = {"status": htmlpage.STATUS, "report": htmlpage.REPORT}


def tinycss2() -> Any:
    try:
        import tinycss2
    except ImportError:  # the Debian-libraries run without python3-tinycss2 (./dev installs it)
        ci.require("tinycss2 is not installed (pip: the test extra; Debian: python3-tinycss2)", "the CSS linter")
    return tinycss2


def css_problems(css: str, defined: set[str]) -> list[str]:
    """What is wrong with a stylesheet: a parse error at any level, a block or string left open, an empty
    declaration, a custom property used (var(--x)) but defined nowhere in `defined` or in `css` itself."""
    t = tinycss2()
    problems = []
    try:  # tinycss2 closes what was left open when it writes the sheet back
        if t.serialize(t.parse_stylesheet(css)) != css:
            problems.append("a block, string or comment left open")
    except TypeError:  # a parse error it cannot write back: named below
        pass
    own = set(re.findall(r"(--[\w-]+)\s*:", css))
    for rule in t.parse_stylesheet(css, skip_comments=True, skip_whitespace=True):
        if rule.type == "error":
            problems.append(f"line {rule.source_line}: {rule.message}")
            continue
        if rule.type != "qualified-rule":
            problems.append(f"line {rule.source_line}: {rule.type} (no at-rule is used: is it meant?)")
            continue
        for d in t.parse_declaration_list(rule.content, skip_comments=True, skip_whitespace=True):
            if d.type == "error":
                problems.append(f"line {d.source_line}: {d.message}")
            elif d.type == "declaration":
                if not [v for v in d.value if v.type not in ("whitespace", "comment")]:
                    problems.append(f"line {d.source_line}: {d.name}: no value")
                for name in re.findall(r"var\((--[\w-]+)\)", t.serialize(d.value)):
                    if name not in defined | own:
                        problems.append(f"line {d.source_line}: {d.name} uses {name}, defined nowhere")
    return problems


def base_variables() -> set[str]:
    return set(re.findall(r"(--[\w-]+)\s*:", htmlpage.asset(htmlpage.BASE_CSS)))


@pytest.mark.parametrize("name", CSS_FILES)
def test_each_stylesheet_is_clean_css(name: str) -> None:
    assert css_problems(htmlpage.asset(name), base_variables()) == []


@pytest.mark.parametrize(("css", "problem"), [
    ("a { color: red;", "left open"), ("a { color red }", "Expected ':'"), ("a { color: red } }", "line 1"),
    ("a { color: ; }", "no value"), ("a { color: var(--nope) }", "--nope, defined nowhere"),
    ('a { content: "open }', "left open"), ("@media x { a { b: c } }", "at-rule"),
])
def test_the_css_linter_finds_what_it_should(css: str, problem: str) -> None:
    problems = css_problems(css, base_variables())
    assert any(problem in p for p in problems), problems


def test_every_page_has_one_style_and_its_policy_names_exactly_its_blocks() -> None:
    for name, layout in LAYOUTS.items():
        doc = layout.page("t <x>", "<p>body</p>", data={"d": {"a": "</script><!--"}}).html
        styles = re.findall(r"<style>(.*?)</style>", doc, re.S)
        scripts = re.findall(r"<script>(.*?)</script>", doc, re.S)
        assert styles == [layout.style] and scripts == ([layout.script] if layout.scripts else []), name
        policy = {d.split()[0]: d.split()[1:] for d in layout.csp.split("; ")}
        assert policy["default-src"] == ["'none'"] and policy["style-src"] == [htmlpage.sha256(styles[0])], name
        assert policy.get("script-src", []) == [htmlpage.sha256(s) for s in scripts], name
        assert not [v for vs in policy.values() for v in vs if "unsafe" in v or v in ("*", "http:", "https:")]
        assert layout.style.startswith(htmlpage.asset(htmlpage.BASE_CSS)), f"{name}: the shared stylesheet first"
        assert "<title>t &lt;x&gt;</title>" in doc and "</script><!--" not in doc.split("<body>")[1]
        # a file carries its policy in <meta>, where frame-ancestors is ignored and complained about
        assert ('http-equiv="Content-Security-Policy"' in doc) is (not layout.header), name
        assert ("frame-ancestors" in layout.csp) is layout.header, name


def test_text_escapes_markup_and_control_characters() -> None:
    assert htmlpage.text('<b a="1">&\x1b[2J') == "&lt;b a=&quot;1&quot;&gt;&amp;\\x1b[2J"
    # text() returns plain text as it is without escaping it (a report writes a million cells): every
    # character, alone and inside plain text, must come out as the two escapes make it
    for c in map(chr, [*range(0x300), 0x2028, 0x2029, 0x202E, 0xD800, 0xFEFF]):
        for v in (c, f"a{c}b"):
            assert htmlpage.text(v) == html.escape(escape(v)), repr(v)


def test_a_json_block_is_one_json_parse_reads_whole() -> None:
    doc = {"a": "</script><!-- & >", "nan": math.nan, "inf": [math.inf], "lone": "m\udc80"}
    block = htmlpage.json_block(doc)
    assert "<" not in block and ">" not in block and "&" not in block
    block.encode()  # a lone surrogate stays an escape: the page can be sent as UTF-8
    assert json.loads(block, parse_constant=lambda c: pytest.fail(f"{c} in the block")) == {
        "a": "</script><!-- & >", "nan": None, "inf": [None], "lone": "m\udc80"}


def test_the_plots_are_images_the_policy_allows() -> None:
    img = htmlpage.data_image('<svg xmlns="http://www.w3.org/2000/svg"><style>*{}</style></svg>', 'a "plot"')
    assert img.startswith('<img src="data:image/svg+xml;base64,') and 'alt="a &quot;plot&quot;"' in img
    assert "img-src data:" in htmlpage.REPORT.csp


# --- the scripts, in node --------------------------------------------------------------------------------

def node() -> str:
    return ci.tool("node", "Node.js: on every machine of this project")


@pytest.mark.system
@pytest.mark.parametrize("name", [*JS_FILES, "the status page's script"])
def test_each_script_parses(name: str, tmp_path: Path) -> None:
    path = tmp_path / "script.js"
    path.write_text(htmlpage.STATUS.script if name.startswith("the ") else htmlpage.asset(name))
    done = subprocess.run([node(), "--check", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.system
def test_the_script_linter_finds_a_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.js"
    path.write_text(htmlpage.asset("words.js").replace("function ago(d) {", "function ago(d) {{", 1))
    done = subprocess.run([node(), "--check", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "SyntaxError" in done.stderr


def inputs() -> list[float]:
    """Seconds where the two languages could part: ties of each rounding, unit edges, tiny and large."""
    edges = [0, 0.04, 0.05, 0.15, 0.25, 0.35, 0.45, 0.75, 1.25, 2.5, 9.94, 9.95, 9.96, 9.99, 9.999, 10, 10.5,
             11.5, 12.5, 59.4, 59.5, 59.6, 60, 362, 60.5, 61.5, 119.5, 599.5, 3599.4, 3599.5, 3600, 3600.5, 3659.5,
             86399.5, 86400, 86400.5, 1e6 + 0.5, 12345678.5, 2.5e9, -0.0, -1, -10.5, 1e-300, 5e-324]
    rng = random.Random(41)
    drawn = [rng.lognormvariate(3, 3) for _ in range(3000)] + [rng.randrange(0, 400000) / 4 for _ in range(2000)]
    return edges + drawn + [math.nextafter(e, math.inf) for e in edges] + [math.nextafter(e, -math.inf) for e in edges]


@pytest.mark.system
def test_the_pages_durations_and_escape_are_the_clis(tmp_path: Path) -> None:
    """The same numbers, written by timewords.duration/ago in Python and by words.js in node."""
    xs = inputs()
    texts = ["plain", "\x1b[2J\x1b]0;t\x07", "c1 \x9b del \x7f", "\u2028 \u202e \u2066 tab\t", "é ☃ \U0001f600",
             "".join(chr(c) for c in range(0x3000))]
    program = (htmlpage.asset("words.js") + "\nconst input = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n"
               "process.stdout.write(JSON.stringify({duration: input.xs.map(duration), "
               "ago: input.xs.map(ago), esc: input.texts.map(esc)}));\n")
    (tmp_path / "words.js").write_text(program)
    done = subprocess.run([node(), str(tmp_path / "words.js")], input=json.dumps({"xs": xs, "texts": texts}),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    js = json.loads(done.stdout)
    want = {"duration": [duration(x) for x in xs], "ago": [ago(0.0, x) for x in xs],
            "esc": [escape(t) for t in texts]}
    for what in want:
        differ = [(x, p, j) for x, p, j in zip(xs if what != "esc" else texts, want[what], js[what], strict=True)
                  if p != j]
        assert not differ, f"{what}: (input, Python, JavaScript) {differ[:10]}"
    assert js["duration"][xs.index(362)] == "6m02s"  # what the page once wrote as "6.0 min"
