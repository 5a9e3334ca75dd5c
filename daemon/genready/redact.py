"""Text from elsewhere, made fit to show: secrets masked (`redact`), control characters escaped (`escape`).

A server's own output holds secrets: SGLang logs `server_args={…, 'api_key': '…', …}` at every
start (python/sglang/srt/entrypoints/engine.py), older vLLM logs `non-default args: {…, 'api_key':
['…', '…']}` (vllm/entrypoints/openai/cli_args.py), a command line echoes `--admin-api-key KEY`, a
client's trace shows `Authorization: Basic …`, an environment dump shows `HF_TOKEN hf_…`. /status is
open to every local user, so every such value becomes `***` before a line leaves genready.

`redact` is one pass over one table of rules: each rule finds where a secret value starts (after a
secret-named key, flag, variable or header, or in a URL's userinfo) and says how far the value runs.
The rules go by the shape of the text, not by a list of spellings:

- a name ending in key, token, password or secret (or holding secret or password), then `=` or `:`:
  the value is a quoted string, or a list, tuple, dict or call (`SecretStr('…')`) to its closing
  bracket, or one bare word;
- a flag whose name ends so (`--hf-token`, `--admin-api-key`, `--ssl-keyfile-password`): its value,
  the words after it up to the next flag, or the first word of the next line when the flag ends a
  line; in a Python list of arguments (`['--api-key', '…']`) the next element;
- an environment spelling (`*_KEY`, `*_TOKEN`, `*SECRET*`, `*PASSWORD*`) then a space and a word;
- `Authorization:` whatever its scheme (Bearer, Basic, Token, a bare key): what follows the scheme,
  to the end of its string or line; and a bare `Bearer TOKEN`;
- the user:password@ of any URL.

`escape` is the one function that makes text from a server, a unit's output, a results file or a
config value safe for a terminal or a log line: C0 controls but tab, DEL, C1, line and paragraph
separators and bidirectional overrides become `\\x1b`-style escapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

MASK: Final = "***"

# A name that holds a secret: it ends in one of these words, or holds secret/password anywhere.
# A name is matched whole (greedy, one pass), then judged in Python: a pattern that looked for the
# secret word inside it backtracked quadratically on a long word.
_NAME: Final = r"(?P<name>[A-Za-z0-9_.-]+)"
_ENDS: Final = ("key", "token", "password", "passwd", "secret")


def secret_name(name: str) -> bool:
    """A name that holds a secret: it ends in key, token, password or secret, or holds secret or password."""
    n = name.lower().lstrip("-")
    return n.endswith(_ENDS) or "secret" in n or "password" in n


def secret_env(name: str) -> bool:
    """An environment variable's spelling of a secret: *_KEY, *_TOKEN, *SECRET*, *PASSWORD* (capitals)."""
    return name.isupper() and (name.endswith(("_KEY", "_TOKEN")) or "SECRET" in name or "PASSWORD" in name)
_CLOSE: Final = {"[": "]", "(": ")", "{": "}"}
_BARE_END: Final = re.compile(r"[\s,;)\]}'\"]")
_WORD: Final = re.compile(r"""'(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s,;)\]}'"]+""")
_CALL: Final = re.compile(r"[A-Za-z_][\w.]*\(")
_MORE: Final = re.compile(r"[ \t]+(?=[^\s-])")
_NEXT_LINE: Final = re.compile(r"[ \t]*\r?\n[ \t]*")
_NOT_SECRET: Final = frozenset({"None", "none", "null", "NULL", "True", "False", "true", "false", "''", '""'})


def _quoted(text: str, i: int) -> int:
    """The end of the quoted string starting at i (backslash escapes honoured; the end of text if unclosed)."""
    q, j = text[i], i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == q:
            return j + 1
        j += 1
    return len(text)


def _bracketed(text: str, i: int) -> int:
    """The end of the list, tuple, dict or call starting at the bracket at i (quotes skipped, nesting
    counted); the end of the line if it never closes (a cut line keeps nothing of the value)."""
    stack, j = [_CLOSE[text[i]]], i + 1
    while j < len(text) and stack:
        c = text[j]
        if c in "'\"":
            j = _quoted(text, j)
            continue
        if c in _CLOSE:
            stack.append(_CLOSE[c])
        elif c == stack[-1]:
            stack.pop()
        elif c == "\n":
            return j
        j += 1
    return j


def _expr(text: str, i: int) -> int:
    """A value after `name=` / `name:`: quoted, bracketed, a call `Name(…)`, or one bare word."""
    if i >= len(text):
        return i
    if text[i] in "'\"":
        return _quoted(text, i)
    if text[i] in _CLOSE:
        return _bracketed(text, i)
    m = _CALL.match(text, i)
    if m:
        return _bracketed(text, m.end() - 1)
    m = _BARE_END.search(text, i)
    return m.start() if m else len(text)


def _one_word(text: str, i: int) -> int:
    m = _WORD.match(text, i)
    return m.end() if m else i


def _words(text: str, i: int) -> int:
    """A flag's value: its words up to the next flag (nargs="+" lists: `--api-key k1 k2`)."""
    end = _one_word(text, i)
    while True:
        m = _MORE.match(text, end)
        if not m or text[m.end()] in "[(<{|&;#":
            return end
        nxt = _one_word(text, m.end())
        if nxt == m.end():
            return end
        end = nxt


def _next_line_word(text: str, i: int) -> int:
    """After a flag that ends its line: the first word of the next line (i is at the line break)."""
    m = _NEXT_LINE.match(text, i)
    return _one_word(text, m.end()) if m else i


def _credentials(text: str, start: re.Match[str]) -> int:
    """An Authorization value after its scheme: to the quote that opened it, else to the end of the line."""
    q, i = start.group("q"), start.end()
    m = re.compile(f"[{q}\r\n]" if q else "[\r\n]").search(text, i)
    return m.start() if m else len(text)


def _at(value: Callable[[str, int], int]) -> Callable[[str, re.Match[str]], int]:
    return lambda text, m: value(text, m.end())


@dataclass(frozen=True)
class Rule:
    why: str
    pattern: str  # a match ends where the value starts
    value: Callable[[str, re.Match[str]], int]  # the value's end, from the match that ends at its start
    name_ok: Callable[[str], bool] | None = None  # for a pattern with a (?P<name>…): is it a secret's name?
    flags: int = 0

    @cached_property
    def start(self) -> re.Pattern[str]:
        """Compiled at the first redact(), not at import: `genready wait`, the ExecCondition= of every
        triggered benchmark, prints through escape() and never redacts (bench/cli_start.py)."""
        return re.compile(self.pattern, self.flags)

    def next(self, text: str, pos: int) -> tuple[int, int, int] | None:
        """(match start, value start, value end) of the first match at or after `pos` with a value."""
        for m in self.start.finditer(text, pos):
            if self.name_ok is not None and not self.name_ok(m.group("name")):
                continue
            end = self.value(text, m)
            if end > m.end():  # an empty value is no value
                return m.start(), m.end(), end
        return None


RULES: Final = (
    Rule("Authorization header, any scheme",
         r"""(?<![\w-])['"]?(?:proxy-)?authorization['"]?[ \t]*[:=][ \t]*(?P<q>['"]?)"""
         r"""(?:[A-Za-z][\w.-]*[ \t]+(?=[^\s'"]))?""", _credentials, flags=re.I),
    Rule("a bare bearer token", r"\bBearer[ \t]+(?=[^\s*])", _at(_one_word), flags=re.I),
    Rule("URL userinfo", r"\b[a-z][a-z0-9+.-]*://(?=[^\s/@'\"]+@)", lambda t, m: t.index("@", m.end()),
         flags=re.I),
    Rule("a flag in a Python argument list", rf"""(['"])--?{_NAME}\1[ \t]*,[ \t]*(?=['"])""", _at(_quoted),
         secret_name),
    Rule("a flag and its value", rf"(?<![\w-])--?{_NAME}(?:=|[ \t]+)(?=[^\s-])", _at(_words), secret_name),
    Rule("a flag at the end of a line", rf"(?<![\w-])--?{_NAME}(?=[ \t]*\r?\n)", _at(_next_line_word),
         secret_name),
    Rule("name = value, name: value", rf"""(?<![\w-])(['"]?){_NAME}\1[ \t]*(?:=|:(?!//))[ \t]*(?=\S)""",
         _at(_expr), secret_name),
    Rule("an environment variable, a space, its value", r"(?<![\w-])(?P<name>[A-Z0-9_]+)[ \t]+(?=[^\s=:-])",
         _at(_one_word), secret_env),
)


def _mask_rules(text: str) -> str:
    out: list[str] = []
    pos = 0
    # Each rule's next match is kept until the text before it is done: every rule scans the text about
    # once, however many values are masked (searching anew from each value was quadratic).
    pending = [rule.next(text, 0) for rule in RULES]
    while True:
        for i, hit in enumerate(pending):
            if hit is not None and hit[0] < pos:
                pending[i] = hit = RULES[i].next(text, pos)
        hits = [h for h in pending if h is not None]
        if not hits:
            out.append(text[pos:])
            return "".join(out)
        _, start, end = min(hits)
        value = text[start:end]
        lead = value[:len(value) - len(value.lstrip())]  # the line break before a next line's word stays
        value = value[len(lead):]
        out.append(text[pos:start] + lead)
        out.append(value if value in _NOT_SECRET or value == MASK else MASK)
        pos = end


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every secret value (by RULES) and the target's own keys (`secrets`) as ***."""
    for s in secrets:
        if s:
            text = text.replace(s, MASK)
    return _mask_rules(text)


def redact_lines(lines: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """Each line redacted; a flag that ends one line masks the first word of the next."""
    lines = list(lines)
    keys = [s for s in secrets if s]
    if any("\n" in line for line in lines):
        return [redact(line, keys) for line in lines]
    return redact("\n".join(lines), keys).split("\n") if lines else []


# C0 controls but tab, DEL, C1; line and paragraph separators (a terminal or editor breaks the line
# there, systemd does not); bidirectional controls (they reorder what is shown); lone surrogates (a
# server's JSON may hold "\\udc80", which no UTF-8 encoder takes: the page answered 500 for one).
_SURROGATES: Final = range(0xD800, 0xE000)
_ESCAPED: Final = (
    [c for c in range(0x20) if c != 0x09] + list(range(0x7F, 0xA0))
    + [0x2028, 0x2029, 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)
_ESCAPES: Final = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in (*_ESCAPED, *_SURROGATES)}
_NEEDS: Final = re.compile("[" + "".join(re.escape(chr(c)) for c in _ESCAPED) + "\ud800-\udfff]")


def escape(text: str) -> str:
    """`text` for a terminal, a log line, a report or a page: every control character (C0 but tab, DEL,
    C1), U+2028/U+2029, bidirectional overrides and lone surrogates as `\\x1b` / `\\u2028`; the rest
    unchanged (so the result always encodes as UTF-8)."""
    return text.translate(_ESCAPES) if _NEEDS.search(text) else text


def shown(text: str, secrets: Iterable[str] = ()) -> str:
    """Redacted, then escaped: text from a server or a unit's output, for a terminal or the log."""
    return escape(redact(text, secrets))


def escape_tree(doc: Any) -> Any:
    """A decoded JSON document with every string in it (keys too) escaped: an API answer before it is
    formatted for a terminal."""
    if isinstance(doc, str):
        return escape(doc)
    if isinstance(doc, dict):
        return {escape(k) if isinstance(k, str) else k: escape_tree(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [escape_tree(v) for v in doc]
    return doc
