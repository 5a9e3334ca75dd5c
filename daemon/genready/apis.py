"""The LLM server APIs genready speaks: per API, the route, the request body, and how an answer is read.

Used by the probe (one generation proves a server can generate) and by the bench client (many
generations measure it), so both send the same request and judge an answer by the same rule:

    A 200 answer is a generation when it is a JSON object of the API's shape, carries no
    "error", and shows at least one generated token: the server's own count
    (meta_info.completion_tokens / usage.completion_tokens), the number of output_ids, or, when
    the server gives no count, non-empty generated text (counted as 1). A count of 0 next to
    output is a contradiction, and no generation either.

The rule is the probe's, which is the lenient one on purpose: servers differ in what they
fill in (SGLang versions without meta_info, a reasoning model's chat answer with `content:
null` but a usage count), and any one of them is evidence that a token was generated.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from genready.redact import escape

MODELS_PATH: Final = "/v1/models"
# The largest answer body genready reads: the probe's, and the bench client's non-streamed answers and
# /v1/models. An answer of a few tokens is a few KiB; a server sending more is broken or hostile, and
# reading it whole would cost that much memory (a 300 MB answer took 1.6 GB in the bench client).
MAX_BODY: Final = 1 << 20
EXCERPT_CHARS: Final = 200


class BadAnswer(Exception):
    """A 200 whose body is not a generation of the API (the text says what was wrong)."""


def excerpt(data: bytes | str, limit: int = EXCERPT_CHARS) -> str:
    """Server text as genready keeps and shows it, wherever it enters (error details, model ids): one
    line of at most `limit` characters, escaped as for a terminal (redact.escape: no control character,
    no lone surrogate), so every surface (the page, /status, the CLI, the log) gets the same safe text."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return escape(text if len(text) <= limit else text[:limit] + "…")


def too_large(v: int) -> bool:
    """Whether an integer a server sent is past any count (and past what a float holds: 10**400)."""
    return v.bit_length() > 1000


def _count(v: Any) -> int:
    """A positive count, else 0; BadAnswer for an integer that cannot be a float (10**400): no count of
    tokens is that large, and every figure made of it would overflow."""
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        return 0
    if too_large(v):
        raise BadAnswer(f"a count of {v.bit_length()} bits, too large to be one (completion_tokens?)")
    return v


def _typed(doc: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    v = doc.get(key)
    if v is not None and not isinstance(v, kind):
        raise BadAnswer(f"{what}: {key!r} is {type(v).__name__}, expected {kind.__name__}")
    return v


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """The answer as a JSON object; BadAnswer if it is not one, or if the server reports an error."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise BadAnswer(f"{what}: not JSON: {excerpt(body) or '(empty body)'}") from None
    if not isinstance(doc, dict):
        raise BadAnswer(f"{what}: expected a JSON object, got {type(doc).__name__}: {excerpt(body)}")
    if "error" in doc or doc.get("object") == "error":
        raise BadAnswer(f"{what}: the server reported an error: {excerpt(body)}")
    return doc


def _consistent(what: str, count: Any, has_output: bool) -> None:
    """A server that says it generated 0 tokens but returns output contradicts itself: whichever
    half is wrong, this answer proves no generation, so it is a bad answer, not ready."""
    if count == 0 and not isinstance(count, bool) and has_output:
        raise BadAnswer(f"{what}: completion_tokens is 0 but the answer has output "
                        "(a contradiction; not a generation we can trust)")


def _tokens_sglang(doc: Mapping[str, Any], what: str) -> int:
    text = _typed(doc, "text", str, what)
    ids = _typed(doc, "output_ids", list, what)
    meta = _typed(doc, "meta_info", dict, what)
    if text is None and ids is None and meta is None:
        raise BadAnswer(f"{what}: no text, output_ids or meta_info in {excerpt(json.dumps(doc))}")
    _consistent(what, (meta or {}).get("completion_tokens"), bool(text) or bool(ids))
    return max(_count((meta or {}).get("completion_tokens")), len(ids or ()), 1 if text else 0)


def _tokens_openai(doc: Mapping[str, Any], what: str, *, chat: bool) -> int:
    choices = _typed(doc, "choices", list, what)
    usage = _typed(doc, "usage", dict, what)
    if choices is None and usage is None:
        raise BadAnswer(f"{what}: no choices or usage in {excerpt(json.dumps(doc))}")
    text: Any = None
    if choices:
        first = choices[0]
        if not isinstance(first, dict):
            raise BadAnswer(f"{what}: choices[0] is {type(first).__name__}, expected an object")
        if chat:
            msg = _typed(first, "message", dict, what)
            text = (msg or {}).get("content")
        else:
            text = first.get("text")
    has_text = isinstance(text, str) and text != ""
    _consistent(what, (usage or {}).get("completion_tokens"), has_text)
    return max(_count((usage or {}).get("completion_tokens")), 1 if has_text else 0)


Prompt = str | Sequence[int]  # text, or token ids for a server without a tokenizer


@dataclass(frozen=True)
class ServerApi:
    """One generation API: where to POST, what to send, how to count what came back."""

    name: str
    path: str
    needs_model: bool  # the OpenAI routes want a model name (discovered from /v1/models)
    takes_ids: bool  # it accepts token ids instead of text (prompt_ids)
    _body: Callable[[Prompt, str, int], dict[str, Any]]
    _tokens: Callable[[Mapping[str, Any], str], int]

    def body(self, *, prompt: str, max_tokens: int, model: str = "", prompt_ids: Sequence[int] = ()) -> dict[str, Any]:
        """The JSON body of one non-streaming, greedy generation: of `prompt_ids` if given, else of `prompt`."""
        if prompt_ids and not self.takes_ids:
            raise ValueError(f"api {self.name!r} takes no token ids")
        return self._body(list(prompt_ids) if prompt_ids else prompt, model, max_tokens)

    def counted_tokens(self, body: bytes) -> int:
        """Tokens generated according to a 200 answer's body: 0 for an answer of the API's shape that has
        none (the model's first token ended the sequence); BadAnswer if it is not an answer of the API."""
        what = f"POST {self.path}"
        return self._tokens(json_object(body, what), what)

    def generated_tokens(self, body: bytes) -> int:
        """Tokens generated according to a 200 answer's body (>= 1); BadAnswer if it is no generation."""
        what = f"POST {self.path}"
        tokens = self.counted_tokens(body)
        if tokens < 1:
            raise BadAnswer(f"{what}: 200 but 0 generated tokens: {excerpt(body)}")
        return tokens


def _sglang_body(prompt: Prompt, model: str, n: int) -> dict[str, Any]:
    # SGLang's GenerateReqInput takes `input_ids` instead of `text`; a server started with
    # --skip-tokenizer-init refuses text (python/sglang/srt/managers/tokenizer_manager.py).
    key = "text" if isinstance(prompt, str) else "input_ids"
    return {key: prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}}


APIS: Final[dict[str, ServerApi]] = {a.name: a for a in (
    ServerApi("sglang", "/generate", False, True, _sglang_body, _tokens_sglang),
    # OpenAI's /v1/completions takes `prompt` as a string or as a list of token ids (vLLM's
    # CompletionRequest, llama.cpp's tokenize_input_prompts).
    ServerApi("openai-completions", "/v1/completions", True, True,
              lambda prompt, model, n: {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0},
              lambda doc, what: _tokens_openai(doc, what, chat=False)),
    ServerApi("openai-chat", "/v1/chat/completions", True, False,
              lambda prompt, model, n: {"model": model, "messages": [{"role": "user", "content": prompt}],
                                        "max_tokens": n, "temperature": 0},
              lambda doc, what: _tokens_openai(doc, what, chat=True)),
)}
NAMES: Final[tuple[str, ...]] = tuple(APIS)


class Listed(NamedTuple):
    """One entry of a GET /v1/models answer."""

    id: str
    # llama.cpp's router mode lists every model it can load with status.value: "loaded", "loading",
    # "unloaded", … (tools/server/server-models.cpp, get_router_models); None from other servers.
    state: str | None = None


def listed_models(body: bytes) -> list[Listed]:
    """The entries of a GET /v1/models answer (data[].id), in its order; BadAnswer if there is none."""
    what = f"GET {MODELS_PATH}"
    doc = json_object(body, what)
    data = doc.get("data")
    out: list[Listed] = []
    for m in data if isinstance(data, list) else []:
        if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]:
            status = m.get("status")
            value = status.get("value") if isinstance(status, dict) else None
            out.append(Listed(m["id"], value if isinstance(value, str) else None))
    if not out:
        raise BadAnswer(f"{what}: no model listed (data[0].id): {excerpt(body)}")
    return out


def models_from_list(body: bytes) -> list[str]:
    """The model ids of a GET /v1/models answer (data[].id), in its order; BadAnswer if there is none."""
    return [m.id for m in listed_models(body)]


def model_from_list(body: bytes) -> str:
    """The first model id of a GET /v1/models answer (data[0].id); BadAnswer if there is none."""
    return models_from_list(body)[0]


# --- streaming (the bench client's TTFT and inter-token latency) -----------------------------------
#
# A stream is SSE `data: {json}` events ending with `data: [DONE]`. SGLang's native stream repeats
# the cumulative text/output_ids/meta_info in every event; the OpenAI routes send each new piece
# (choices[0].text, or choices[0].delta.content) and, with stream_options.include_usage, a last
# event with usage.completion_tokens. `streamed_tokens` turns either into a running token count.


def _stream_body(api: ServerApi, prompt: str, max_tokens: int, model: str, prompt_ids: Sequence[int] = ()
                 ) -> dict[str, Any]:
    body = api.body(prompt=prompt, max_tokens=max_tokens, model=model, prompt_ids=prompt_ids)
    body["stream"] = True
    if api.needs_model:  # the OpenAI routes: ask for the final usage event, the server's own count
        body["stream_options"] = {"include_usage": True}
    return body


def _openai_piece(doc: Mapping[str, Any], what: str) -> bool:
    choices = _typed(doc, "choices", list, what)
    first = choices[0] if choices else None
    if not isinstance(first, dict):
        return False
    delta = first.get("delta")
    # A reasoning model's thinking comes first: vLLM streams it as delta.reasoning (DeltaMessage,
    # vllm/entrypoints/openai/engine/protocol.py), SGLang and older vLLM as delta.reasoning_content.
    piece = (delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")) \
        if isinstance(delta, dict) else first.get("text")
    return isinstance(piece, str) and piece != ""


def streamed(api: ServerApi, event: bytes, before: int) -> tuple[int, bool]:
    """After one stream event's JSON: (generated tokens so far, never below `before`; whether the
    event carried new output). Only events with output time tokens: a final usage event may raise
    the count (several tokens per piece, as in speculative decoding) but carries none.

    BadAnswer if the event is not JSON of the API's shape, or reports an error."""
    what = f"POST {api.path} (stream)"
    doc = json_object(event, what)
    if not api.needs_model:
        ids = _typed(doc, "output_ids", list, what)
        meta = _typed(doc, "meta_info", dict, what)
        text = _typed(doc, "text", str, what)
        now = max(before, _count((meta or {}).get("completion_tokens")), len(ids or ()),
                  1 if text and not before else 0)
        return now, now > before
    usage = _typed(doc, "usage", dict, what)
    piece = _openai_piece(doc, what)
    return max(before + piece, _count((usage or {}).get("completion_tokens"))), piece


def stream_body(api: ServerApi, *, prompt: str, max_tokens: int, model: str = "", prompt_ids: Sequence[int] = ()
                ) -> dict[str, Any]:
    """The JSON body of one streaming, greedy generation (of `prompt_ids` if given, as ServerApi.body)."""
    return _stream_body(api, prompt, max_tokens, model, prompt_ids)
