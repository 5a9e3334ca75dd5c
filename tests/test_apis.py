"""The one rule for a generation's answer (genready.apis), shared by the probe and the bench client."""

from __future__ import annotations

import json

import pytest

from genready import apis
from genready.apis import APIS, BadAnswer


@pytest.mark.parametrize(("api", "body", "tokens"), [
    ("sglang", {"text": "x", "meta_info": {"completion_tokens": 3}}, 3),
    ("sglang", {"text": "x"}, 1),  # no count: the non-empty text proves one token
    ("sglang", {"output_ids": [10, 11]}, 2),
    ("sglang", {"meta_info": {"completion_tokens": 1}}, 1),
    ("openai-completions", {"choices": [{"text": "hi"}]}, 1),
    ("openai-completions", {"choices": [], "usage": {"completion_tokens": 3}}, 3),
    ("openai-chat", {"choices": [{"message": {"content": None}}], "usage": {"completion_tokens": 1}}, 1),
    ("openai-chat", {"choices": [{"message": {"content": "hello"}}]}, 1),
])
def test_a_generation_counts_its_tokens(api: str, body: object, tokens: int) -> None:
    assert APIS[api].generated_tokens(json.dumps(body).encode()) == tokens


@pytest.mark.parametrize(("api", "body", "says"), [
    ("sglang", [1, 2], "expected a JSON object"),
    ("sglang", {"foo": 1}, "no text, output_ids or meta_info"),
    ("sglang", {"text": ""}, "0 generated tokens"),
    ("sglang", {"text": 5}, "'text' is int"),
    ("sglang", {"error": "oom"}, "reported an error"),
    ("openai-completions", {"object": "error", "message": "x"}, "reported an error"),
    ("openai-completions", {"id": "x"}, "no choices or usage"),
    ("openai-chat", {"choices": [{"message": {}}]}, "0 generated tokens"),
    ("openai-chat", {"choices": [{}], "usage": {"completion_tokens": True}}, "0 generated tokens"),
    ("openai-chat", {"choices": ["x"]}, "choices[0] is str"),
    ("sglang", {"text": "x", "meta_info": {"completion_tokens": 0}}, "contradiction"),
    ("openai-completions", {"choices": [{"text": "x"}], "usage": {"completion_tokens": 0}}, "contradiction"),
])
def test_anything_else_is_a_bad_answer(api: str, body: object, says: str) -> None:
    with pytest.raises(BadAnswer, match=says.replace("[", r"\[").replace("]", r"\]")):
        APIS[api].generated_tokens(json.dumps(body).encode())


def test_not_json() -> None:
    with pytest.raises(BadAnswer, match="not JSON"):
        APIS["sglang"].generated_tokens(b"<html>")


@pytest.mark.parametrize("name", apis.NAMES)
def test_bodies_ask_for_a_short_greedy_generation(name: str) -> None:
    body = APIS[name].body(prompt="p", max_tokens=1, model="m")
    params = body.get("sampling_params", body)  # SGLang's native API nests them
    assert params["temperature"] == 0
    assert params.get("max_tokens", params.get("max_new_tokens")) == 1
    assert ("model" in body) == APIS[name].needs_model


def test_model_list() -> None:
    assert apis.model_from_list(b'{"data": [{"id": "llama"}]}') == "llama"
    with pytest.raises(BadAnswer, match="no model listed"):
        apis.model_from_list(b'{"data": []}')


@pytest.mark.parametrize(("api", "events", "counts", "new"), [
    # SGLang's native stream repeats the cumulative answer; the count is the server's.
    ("sglang", [b'{"text": " a", "output_ids": [1], "meta_info": {"completion_tokens": 1}}',
                b'{"text": " a b c", "output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 3}}',
                b'{"text": " a b c", "output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 3}}'],
     [1, 3, 3], [True, True, False]),
    # OpenAI: a piece per event; the role-only first delta and the finish event carry no output;
    # the usage event raises the count (two tokens per piece here) without being an output event.
    ("openai-chat", [b'{"choices": [{"delta": {"role": "assistant", "content": ""}}]}',
                     b'{"choices": [{"delta": {"content": "Hi"}}]}',
                     b'{"choices": [{"delta": {"content": " there"}}]}',
                     b'{"choices": [{"delta": {}, "finish_reason": "length"}]}',
                     b'{"choices": [], "usage": {"completion_tokens": 4}}'],
     [0, 1, 2, 2, 4], [False, True, True, False, False]),
    ("openai-completions", [b'{"choices": [{"text": " x"}]}', b'{"choices": [{"text": ""}], "usage": null}'],
     [1, 1], [True, False]),
])
def test_stream_events_count_tokens_and_mark_output(api: str, events: list[bytes], counts: list[int],
                                                    new: list[bool]) -> None:
    n, seen_counts, seen_new = 0, [], []
    for ev in events:
        n, fresh = apis.streamed(apis.APIS[api], ev, n)
        seen_counts.append(n)
        seen_new.append(fresh)
    assert (seen_counts, seen_new) == (counts, new)


def test_stream_bodies_ask_for_a_stream_and_openai_for_usage() -> None:
    assert apis.stream_body(apis.APIS["sglang"], prompt="p", max_tokens=3)["stream"] is True
    chat = apis.stream_body(apis.APIS["openai-chat"], prompt="p", max_tokens=3, model="m")
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    with pytest.raises(apis.BadAnswer, match="error"):
        apis.streamed(apis.APIS["openai-chat"], b'{"object": "error", "message": "boom"}', 0)


@pytest.mark.parametrize(("api", "body"), [
    ("sglang", b'{"text": "x", "meta_info": {"completion_tokens": 1%s}}' % (b"0" * 400)),
    ("openai-completions", b'{"choices": [{"text": "x"}], "usage": {"completion_tokens": 1%s}}' % (b"0" * 400)),
])
def test_a_count_no_float_holds_is_a_bad_answer(api: str, body: bytes) -> None:
    """10**400 tokens is valid JSON and no count: every figure made of it overflows (issue 41 #8)."""
    with pytest.raises(apis.BadAnswer, match="too large"):
        apis.APIS[api].counted_tokens(body)
