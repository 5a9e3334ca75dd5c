"""What one answer says of itself, for its request line (tools/requestlog.py): the prompt's token count, why it
finished and its output token ids.

- input tokens: an OpenAI answer's usage.prompt_tokens (a stream's last event, asked by stream_options), SGLang's
  meta_info.prompt_tokens;
- finish reason: a choice's finish_reason (a stream's last non-null one), SGLang's meta_info.finish_reason.type;
- token ids: where the server's kind says (servers/kinds.py, TokenIds), asked for as it says.
Each reader takes a parsed answer or stream event and what was known before it (a stream's earlier events).
"""

from __future__ import annotations

from typing import Any

from genready.servers.kinds import TokenIds


def at(doc: Any, path: tuple[str | int, ...]) -> Any:
    """The value at `path` in a parsed answer (a key of an object, a number an index of a list); None where the
    answer has no such place. Also where benchfigures looks for an answer's speculative-decoding counts."""
    for step in path:
        if isinstance(step, int):
            doc = doc[step] if isinstance(doc, list) and len(doc) > step else None
        else:
            doc = doc.get(step) if isinstance(doc, dict) else None
    return doc


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def input_tokens(doc: Any, before: int | None = None) -> int | None:
    got = _count(at(doc, ("usage", "prompt_tokens")))
    if got is None:
        got = _count(at(doc, ("meta_info", "prompt_tokens")))
    return before if got is None else got


def finish_reason(doc: Any, before: str | None = None) -> str | None:
    got = at(doc, ("choices", 0, "finish_reason"))
    if not isinstance(got, str):
        meta = at(doc, ("meta_info", "finish_reason"))
        got = meta.get("type") if isinstance(meta, dict) else meta
    return got[:40] if isinstance(got, str) and got else before


def token_ids(spec: TokenIds | None, doc: Any, before: list[int] | None = None) -> list[int] | None:
    """The answer's output ids after `doc` (a whole answer, or a stream event after `before`); None: none given."""
    if spec is None:
        return before
    got = at(doc, spec.path)
    if not isinstance(got, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in got):
        return before
    if before is None:
        return list(got)
    if spec.cumulative and got[:len(before)] == before:
        return list(got)
    return before + got
