"""Secrets out of text that other people read: journal lines in /status, the log, a sweep's results.

A server's own output holds secrets: SGLang logs `server_args=ServerArgs(…, api_key='…', …)` at
every start (python/sglang/srt/entrypoints/engine.py), a command line echoes `--api-key KEY`, a
client's trace shows `Authorization: Bearer KEY`, an environment dump shows `HF_TOKEN=…`. /status
is open to every local user, so every such value becomes `***` before a line leaves genready.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

MASK: Final = "***"

# Each pattern keeps group 1 (the name and separator) and masks the value after it.
_PATTERNS: Final = (
    # api_key='…' / api_key="…" / api_key=… / "api_key": "…" (also admin_api_key, api-key, apikey)
    re.compile(r"""(api[_-]?key['"]?\s*[=:]\s*)(?:'[^']*'|"[^"]*"|[^\s,;)'"]+)""", re.IGNORECASE),
    # --api-key KEY / --api-key=KEY / --api_key KEY (not --api-key-file, whose value is a path)
    re.compile(r"(--api[-_]key(?![-_\w])(?:=|\s+))(?:'[^']*'|\"[^\"]*\"|\S+)", re.IGNORECASE),
    # Authorization: Bearer KEY (and a bare "Bearer KEY")
    re.compile(r"(\bBearer\s+)[^\s'\",;]+", re.IGNORECASE),
    # HF_TOKEN=… / GITHUB_TOKEN: … / hf_token='…'
    re.compile(r"""(\b\w*_TOKEN['"]?\s*[=:]\s*)(?:'[^']*'|"[^"]*"|[^\s,;)'"]+)""", re.IGNORECASE),
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret value, and the target's own keys (`secrets`), as ***."""
    for s in secrets:
        if s:
            text = text.replace(s, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def redact_lines(lines: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    keys = [s for s in secrets if s]
    return [redact(line, keys) for line in lines]
