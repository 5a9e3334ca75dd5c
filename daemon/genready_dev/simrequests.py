"""The simulator's reading of a generation request: SGLang's POST /generate and the OpenAI routes' bodies into
one GenRequest, or BadRequest (answered 400 with its message). What each server then does with it is sim.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CONTEXT_LENGTH = 4096  # stands in for the model's limit: beyond it SGLang answers 400
NATIVE_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
OPENAI_DEFAULT_MAX_TOKENS = 16


class BadRequest(Exception):
    """The request body is malformed: answered 400 with this message."""


@dataclass(frozen=True)
class GenRequest:
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool = False
    text_prompt: bool = True  # False: the prompt came as token ids
    model: str | None = None  # the OpenAI routes' `model`, as sent
    prompt_key: str = ""  # the prompt as sent: what the prefix cache knows it by
    return_meta_info: bool = False  # SGLang's OpenAI routes: a choice's meta_info in the answer
    return_spec_tokens_details: bool = False  # SGLang's OpenAI routes (>= 0.5.12): sglext.spec_tokens_details


def json_object(v: object, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return v


def _count_words(text: str) -> int:
    # A real tokenizer adds at least a BOS token, so even an empty prompt counts one.
    return max(1, len(text.split()))


def _max_tokens(d: dict[str, Any], keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        v = d.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadRequest(f"{key} must be an integer")
        if v < 0:
            raise BadRequest(f"{key} must be non-negative")
        if v > CONTEXT_LENGTH:
            raise BadRequest(f"{key}={v} exceeds the context length ({CONTEXT_LENGTH})")
        return v
    return default


def _check_temperature(d: dict[str, Any]) -> None:
    v = d.get("temperature")
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise BadRequest("temperature must be a non-negative number")


def _stream_flag(d: dict[str, Any]) -> bool:
    v = d.get("stream", False)
    if not isinstance(v, bool):
        raise BadRequest("stream must be a boolean")
    return v


def _token_ids(v: object) -> int | None:
    """The length of a prompt given as token ids (a list of non-negative ints), else None."""
    if isinstance(v, list) and v and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v):
        return len(v)
    return None


def parse_native(body: dict[str, Any]) -> GenRequest:
    text, ids = body.get("text"), body.get("input_ids")
    if text is None and ids is None:
        # SGLang's GenerateReqInput (python/sglang/srt/managers/io_struct.py, _validate_inputs)
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    if ids is not None:  # a tokenizer-less client (--skip-tokenizer-init) sends token ids
        n_ids = _token_ids(ids)
        if n_ids is None:
            raise BadRequest("input_ids must be a non-empty list of token ids")
        prompt_tokens = n_ids
    elif isinstance(text, str):
        prompt_tokens = _count_words(text)
    else:
        raise BadRequest("text must be a string")
    sp = json_object(body.get("sampling_params") or {}, "sampling_params")
    _check_temperature(sp)
    n = _max_tokens(sp, ("max_new_tokens",), NATIVE_DEFAULT_MAX_NEW_TOKENS)
    return GenRequest(prompt_tokens, n, _stream_flag(body), text_prompt=ids is None,
                      prompt_key=json.dumps(ids if ids is not None else text))


def _openai_common(body: dict[str, Any], prompt_tokens: int, keys: tuple[str, ...], *,
                   text_prompt: bool = True, prompt: object = None) -> GenRequest:
    _check_temperature(body)
    n = _max_tokens(body, keys, OPENAI_DEFAULT_MAX_TOKENS)
    opts = json_object(body.get("stream_options") or {}, "stream_options")
    model = body.get("model")
    return GenRequest(prompt_tokens, n, _stream_flag(body), bool(opts.get("include_usage", False)), text_prompt,
                      model if isinstance(model, str) else None, json.dumps(prompt, sort_keys=True),
                      body.get("return_meta_info") is True, body.get("return_spec_tokens_details") is True)


def _required(body: dict[str, Any], key: str, model: str) -> None:
    # FastAPI's validation error for a missing field, as SGLang and vLLM turn it into a 400
    # (sglang/srt/entrypoints/http_server.py and vllm/entrypoints/openai/server_utils.py,
    # validation_exception_handler): the message is str(RequestValidationError).
    if key not in body:
        raise BadRequest(f"1 validation error for {model}\n{key}\n  Field required [type=missing, "
                         f"input_value={excerpt_dict(body)}, input_type=dict]")


def excerpt_dict(body: dict[str, Any]) -> str:
    return json.dumps(body)[:80]


def parse_completion(body: dict[str, Any]) -> GenRequest:
    _required(body, "prompt", "CompletionRequest")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    n_ids = _token_ids(prompt)  # the OpenAI completions API also takes the prompt as token ids
    if n_ids is not None:
        return _openai_common(body, n_ids, ("max_tokens",), text_prompt=False, prompt=prompt)
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string or a list of token ids")
    return _openai_common(body, _count_words(prompt), ("max_tokens",), prompt=prompt)


def parse_chat(body: dict[str, Any]) -> GenRequest:
    _required(body, "messages", "ChatCompletionRequest")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    words = 0
    for i, m in enumerate(messages):
        m = json_object(m, f"messages[{i}]")
        if not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}].role must be a string")
        content = m.get("content")
        if isinstance(content, str):
            words += len(content.split())
        elif isinstance(content, list):
            words += sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
        elif content is not None:
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
    return _openai_common(body, max(1, words), ("max_completion_tokens", "max_tokens"), prompt=messages)
