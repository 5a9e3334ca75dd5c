"""The bench client's run: N generations at concurrency C or as Poisson arrivals, each time-bounded,
and the server's own figures over the run, asked of its kind (servers/kinds.py), told once per run (kind_of):
its counter page read once before and once after, its info route's average after. Requests and the token
count follow apis.py, the probe's rules. A prompt is a conversation: one request, or one per turn of a
multi-turn question, each later turn sent once the answer before it arrived, with the earlier turns and
answers (docs/benchclient.md, "Multi-turn questions").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

import aiohttp
from aiohttp import http_exceptions

from genready import apis
from genready.apis import APIS, MAX_BODY, MODELS_PATH, BadAnswer, ServerApi, model_from_list
from genready.compat import TIMEOUT_ERRORS
from genready.servers import kinds
from genready.servers.acceptance import AcceptanceRecord
from genready.servers.kinds import TokenIds
from genready.servers.metricspage import NotMetrics, Reading
from genready.tools import answerfacts, benchload, servermetrics
from genready.tools import prompts as prompt_sets
from genready.tools.benchconn import PoolConnector, StaleConnection, refused_write, reuse_tracer, why_not_reuse
from genready.tools.benchfigures import (
    AnswerCounts,
    Drafts,
    Outcome,
    Summary,
    answer_counts,
    carries_counts,
    drafts_of,
    from_counters,
    verify_ct,
)
from genready.tools.prompts import Prompt

# What the bench client's CLI, scripts and tests reach here (the connection's parts are benchconn's).
__all__ = ["AUTO", "DEFAULT_URL", "LoadOptions", "PoolConnector", "Progress", "ServerOptions", "discover_model",
           "failed", "one_request", "one_stream", "read_body", "request_body", "run", "takes_token_ids",
           "why_not_reuse"]

# A model name SGLang accepts when /v1/models cannot be read: it serves one model anyway.
FALLBACK_MODEL: Final = "default"
DEFAULT_URL: Final = "http://127.0.0.1:30000"
AUTO: Final = "auto"  # --kind: told by what the server answers
PROGRESS_WIDTH: Final = 30
PROGRESS_INTERVAL: Final = 0.1  # seconds between progress-bar redraws
SAID_BYTES: Final = 4096  # read of a refused request's body: the server's reason, not a download
SAID_CHARS: Final = 300  # kept of it, as one line
SERVER_FIGURES_CAP: Final = 4 << 20  # bytes read of /metrics or /get_server_info: a figure, not a download

async def read_body(r: aiohttp.ClientResponse, cap: int = MAX_BODY) -> bytes:
    """The whole body, or BadAnswer as soon as it passes `cap` bytes: what is not read is not held in memory,
    whatever the server sends (aiohttp buffers a bounded amount ahead of the reader)."""
    if r.content_length is not None and r.content_length > cap:
        raise BadAnswer(f"a body of {r.content_length:,} bytes, over the {cap:,}-byte cap")
    buf = bytearray()
    while chunk := await r.content.read(cap + 1 - len(buf)):
        buf += chunk
        if len(buf) > cap:
            raise BadAnswer(f"a body over the {cap:,}-byte cap")
    return bytes(buf)


def http_error(r: aiohttp.ClientResponse) -> str:
    """A non-200 answer as a failure kind. A redirect is not followed: another server answering would be
    counted for the verified one (a 307 to elsewhere was followed and counted ok, under the pid of this one)."""
    if 300 <= r.status < 400:
        return f"HTTP {r.status} redirect to {apis.excerpt(r.headers.get('Location', '?'), 80)} (not followed)"
    return f"HTTP {r.status}"


async def refusal_words(r: aiohttp.ClientResponse) -> str:
    """A refused request's answer in the server's words: at most SAID_BYTES of its body, as one escaped line
    (apis.excerpt); "" for a redirect or an answer that cannot be read (the status says the rest)."""
    if 300 <= r.status < 400:
        return ""
    try:
        return apis.excerpt(await r.content.read(SAID_BYTES), SAID_CHARS)
    except _REQUEST_ERRORS:
        return ""


async def discover_model(session: aiohttp.ClientSession, url: str, timeout: float) -> str | None:
    """The first model id from /v1/models, or None when it cannot be read (or is not answered here: a
    redirect is not followed, an answer over MAX_BODY not read)."""
    try:
        async with session.get(url + MODELS_PATH, timeout=aiohttp.ClientTimeout(total=timeout),
                               allow_redirects=False) as r:
            if r.status != 200:
                return None
            return model_from_list(await read_body(r))
    except (aiohttp.ClientError, BadAnswer):
        return None
    except TIMEOUT_ERRORS:
        return None


# What a request to the server may raise that is the server's doing (or the network's).
_REQUEST_ERRORS: tuple[type[BaseException], ...] = (*TIMEOUT_ERRORS, aiohttp.ClientError, BadAnswer)
# A stream adds an SSE line over aiohttp's line limit: LineTooLong (an HttpProcessingError, not a
# ValueError) in aiohttp 3.10+ and Debian's 3.8.4, ValueError in other 3.8/3.9 releases.
_LINE_TOO_LONG: Final = (ValueError, http_exceptions.LineTooLong)
_STREAM_ERRORS: tuple[type[BaseException], ...] = (*_REQUEST_ERRORS, *_LINE_TOO_LONG)


async def one_request(session: aiohttp.ClientSession, url: str, api: ServerApi, body: dict[str, Any],
                      timeout: float, trace: dict[str, Any] | None = None, *, keep_text: bool = False,
                      ids: TokenIds | None = None) -> Outcome:
    """One non-streamed generation; with `keep_text`, its answer's text on the Outcome (a later turn's history,
    a request line) and, where `ids` says where they are, its token ids."""
    t0 = time.perf_counter()
    try:
        async with session.post(url + api.path, json=body, timeout=aiohttp.ClientTimeout(total=timeout),
                                allow_redirects=False, trace_request_ctx=trace) as r:
            if r.status != 200:
                return Outcome(False, time.perf_counter() - t0, error=http_error(r), said=await refusal_words(r))
            raw = await read_body(r)
            took = time.perf_counter() - t0
        # The probe's rule (apis.py) for what a generation looks like; unlike the probe, a valid answer with no
        # output (the model's first token ended the sequence) is an empty answer with 0 tokens, not a failure.
        tokens = api.counted_tokens(raw)
        doc = json.loads(raw)
        steps, drafts, counts = verify_ct(api, doc), drafts_of(doc), answer_counts(doc)
    except _REQUEST_ERRORS as e:
        return failed(e, t0, timeout, trace)
    got = answerfacts.token_ids(ids, doc) if keep_text else None
    return Outcome(True, took, tokens if _has_output(api, doc) else 0, spec_verify_ct=steps, drafts=drafts,
                   counts=counts, answer=answer_text(api, doc) if keep_text else "",
                   input_tokens=answerfacts.input_tokens(doc), finish_reason=answerfacts.finish_reason(doc),
                   token_ids=None if got is None else tuple(got))


def answer_text(api: ServerApi, doc: Any) -> str:
    """The generated text of a (valid) non-streamed answer, as the server sent it: SGLang's `text`, a chat
    choice's message.content (what FastChat's MT-bench keeps: fastchat/llm_judge/common.py, chat_completion_openai),
    a completion choice's `text`; "" without (a reasoning model's thinking is not part of the conversation)."""
    if not isinstance(doc, dict):
        return ""
    if not api.needs_model:
        return doc["text"] if isinstance(doc.get("text"), str) else ""
    choices = doc.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    msg = first.get("message")
    text = msg.get("content") if isinstance(msg, dict) else first.get("text")
    return text if isinstance(text, str) else ""


def streamed_text(api: ServerApi, event: Any, before: str) -> str:
    """The answer's text after one stream event: the OpenAI routes send each new piece (delta.content, or a
    completion's text); SGLang's own stream repeats the whole text so far (its default; with
    --incremental-streaming-output only the new piece, which is then appended)."""
    if not isinstance(event, dict):
        return before
    if not api.needs_model:
        text = event.get("text")
        if not isinstance(text, str):
            return before
        return text if text.startswith(before) else before + text
    choices = event.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    delta = first.get("delta")
    piece = delta.get("content") if isinstance(delta, dict) else first.get("text")
    return before + piece if isinstance(piece, str) else before


def _has_output(api: ServerApi, doc: Any) -> bool:
    """Whether a (valid) non-streamed answer carries any output: text, token ids, or a reasoning model's
    thinking. An answer without is empty, whatever the server counts: llama.cpp counts the end-of-sequence
    token it sampled first as usage.completion_tokens 1 next to an empty text."""
    if not isinstance(doc, dict):
        return False
    if not api.needs_model:  # SGLang: text, or output_ids alone with --skip-tokenizer-init
        return bool(doc.get("text")) or bool(doc.get("output_ids"))
    choices = doc.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    msg = first.get("message")
    if isinstance(msg, dict):
        return any(isinstance(v, str) and v for v in (msg.get(k) for k in ("content", "reasoning",
                                                                             "reasoning_content")))
    return isinstance(first.get("text"), str) and first["text"] != ""


def failed(e: BaseException, t0: float, timeout: float, trace: dict[str, Any] | None = None) -> Outcome:
    """The Outcome of a request started at `t0` that raised `e`, in words a reader can act on.

    StaleConnection when the request was not sent at all, because the pooled connection aiohttp gave it had
    been closed by the server (`trace` says whether it was a pooled one): the caller sends it again."""
    took = time.perf_counter() - t0
    if trace is not None and trace.get("reused") and refused_write(e):
        raise StaleConnection(str(e)) from e
    if isinstance(e, TIMEOUT_ERRORS):
        return Outcome(False, took, error=f"timeout ({timeout:g} s)")
    if isinstance(e, aiohttp.ClientConnectorError):
        # asyncio words refusals as "Connect call failed (addr)"; the errno says it shorter.
        err = e.os_error
        why = os.strerror(err.errno) if err.errno else str(err)
        return Outcome(False, took, error=f"cannot connect: {why}")
    if isinstance(e, BadAnswer):
        return Outcome(False, took, error=f"bad response: {e}")
    if isinstance(e, _LINE_TOO_LONG):
        return Outcome(False, took, error="bad response: a stream line over aiohttp's limit")
    return Outcome(False, took, error=f"{type(e).__name__}: {e}")


async def one_stream(session: aiohttp.ClientSession, url: str, api: ServerApi, body: dict[str, Any],
                     timeout: float, trace: dict[str, Any] | None = None, *, keep_text: bool = False,
                     ids: TokenIds | None = None) -> Outcome:
    """One streamed generation: TTFT and the gaps between events that carried output; with `keep_text`, the
    answer's text (at most MAX_BODY characters: more is a bad answer, as a non-streamed body over it is), its
    finish reason and, where `ids` says where they are, its token ids."""
    t0 = time.perf_counter()
    tokens, first, last, gaps, done = 0, None, 0.0, list[float](), False
    text = ""
    got: list[int] | None = None
    finish: str | None = None
    last_event: bytes | None = None
    drafts: Drafts | None = None
    counts: AnswerCounts | None = None
    try:
        async with session.post(url + api.path, json=body, timeout=aiohttp.ClientTimeout(total=timeout),
                                allow_redirects=False, trace_request_ctx=trace) as r:
            if r.status != 200:
                return Outcome(False, time.perf_counter() - t0, error=http_error(r), said=await refusal_words(r))
            if trace is not None:
                trace.update(stream=True, server=r.headers.get("Server", ""))
            async for raw in r.content:  # one SSE line at a time
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                tokens, new = apis.streamed(api, data, tokens)
                last_event = data
                if keep_text:
                    event = json.loads(data)
                    text = streamed_text(api, event, text)
                    got, finish = answerfacts.token_ids(ids, event, got), answerfacts.finish_reason(event, finish)
                    if len(text) > MAX_BODY:
                        raise BadAnswer(f"an answer over {MAX_BODY:,} characters, too long to send back in a "
                                        "later turn")
                if carries_counts(data):  # timings, metrics, meta_info: in the final event, cumulative
                    event = json.loads(data)
                    drafts, counts = drafts_of(event) or drafts, answer_counts(event) or counts
                if new:
                    now = time.perf_counter()
                    if first is None:
                        first = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
            took = time.perf_counter() - t0
        if not done:
            raise BadAnswer("the stream ended without data: [DONE]")
        if last_event is None:
            raise BadAnswer("the stream carried no event before data: [DONE]")
        final = json.loads(last_event)
        steps = verify_ct(api, final)
    except _STREAM_ERRORS as e:
        return failed(e, t0, timeout, trace)
    # No event with output (the model's first token ended the sequence) is an empty answer with 0 tokens, not a
    # failure, whatever a final usage event counts (llama.cpp counts that end-of-sequence token: 1).
    return Outcome(True, took, tokens if first is not None else 0, ttft=first, itl=tuple(gaps),
                   spec_verify_ct=steps, drafts=drafts, counts=counts, answer=text,
                   input_tokens=answerfacts.input_tokens(final), finish_reason=answerfacts.finish_reason(final, finish),
                   token_ids=None if got is None else tuple(got))


async def _get_json_or_text(session: aiohttp.ClientSession, url: str, timeout: float) -> tuple[int, bytes]:
    """(status, at most SERVER_FIGURES_CAP bytes of the body) of a GET; (0, b"") if it failed."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False) as r:
            return r.status, await read_body(r, SERVER_FIGURES_CAP)
    except _STREAM_ERRORS:  # the request errors, and ValueError
        return 0, b""


async def read_counters(session: aiohttp.ClientSession, url: str, kind: kinds.ServerKind | None,
                        timeout: float) -> Reading | None:
    """The server's counters by its kind's page (kind unknown: every kind's), or None when it has no readable one."""
    for route in kinds.metrics_routes(kind):
        status, body = await _get_json_or_text(session, url + route, timeout)
        if status != 200:
            continue
        try:
            return kinds.read_metrics(kind, route, body)
        except NotMetrics:
            continue
    return None


async def kind_of(session: aiohttp.ClientSession, url: str, server: ServerOptions, timeout: float) \
        -> kinds.ServerKind | None:
    """The server's kind, once per run: --kind when given; with auto, the kind whose own API --api is, else
    (on the OpenAI routes) the first kind whose server-info route answers a JSON object, else None."""
    if server.kind != AUTO:
        return kinds.BY_NAME[server.kind]
    if (own := kinds.by_native_api(server.api)) is not None:
        return own
    for kind in kinds.info_kinds():
        for path in kind.info_routes:
            status, body = await _get_json_or_text(session, url + path, timeout)
            if status == 200:
                try:
                    if isinstance(json.loads(body), dict):
                        return kind
                except ValueError:
                    pass
                break
    return None


async def read_info_accept(session: aiohttp.ClientSession, url: str, kind: kinds.ServerKind,
                           timeout: float) -> AcceptanceRecord | None:
    """The kind's own average accept length from its server-info route, as its adapter's record (None: not
    there, or no spec); a 404 is an older version's other name."""
    for path in kind.info_routes:
        status, body = await _get_json_or_text(session, url + path, timeout)
        if status == 404:
            continue
        return kind.info_acceptance(body) if status == 200 else None
    return None


class Progress:
    """A one-line progress bar on a terminal; on anything else a plain line per 10 % (logs stay readable).
    With `seconds` (--duration) the share done is the time gone, not the requests."""

    def __init__(self, total: int, stream: TextIO, seconds: float | None = None) -> None:
        self.total = total
        self.stream = stream
        self.enabled = stream.isatty()
        self.seconds = seconds
        self._start = time.monotonic()
        self._last = 0.0
        self._tenths = 0

    def update(self, done: int, failed: int, *, force: bool = False) -> None:
        if self.seconds is None:
            share, of = done / max(1, self.total), f"{done}/{self.total}"
            tenths = 10 * done // max(1, self.total)  # in integers: 7/10 of the requests is 7 tenths, exactly
        else:
            gone = time.monotonic() - self._start
            share, of = min(1.0, gone / self.seconds), f"{done} in {min(gone, self.seconds):.0f}/{self.seconds:g} s"
            tenths = int(10 * share)
        if not self.enabled:
            if tenths > self._tenths:
                self._tenths = tenths
                self.stream.write(f"benchclient: {of} done" + (f", {failed} failed" if failed else "") + "\n")
                self.stream.flush()
            return
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_INTERVAL and share < 1:
            return
        self._last = now
        filled = int(PROGRESS_WIDTH * share)
        bar = "#" * filled + "-" * (PROGRESS_WIDTH - filled)
        self.stream.write(f"\r[{bar}] {of}" + (f"  {failed} failed" if failed else ""))
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def request_body(server: ServerApi, p: Prompt, *, max_tokens: int, model: str, stream: bool,
                 temperature: float = 0.0, ignore_eos: bool = False) -> dict[str, Any]:
    """The JSON body of one generation of `p`, on the API's shape (apis.py) with the run's sampling."""
    n = p.max_tokens or max_tokens
    body = (apis.stream_body(server, prompt=p.as_text(), max_tokens=n, model=model) if stream else
            server.body(prompt=p.as_text(), max_tokens=n, model=model))
    sampling = body.get("sampling_params", body)
    sampling["temperature"] = temperature
    if ignore_eos:
        # SGLang's SamplingParams.ignore_eos; vLLM takes it as an extra sampling parameter of its OpenAI API.
        sampling["ignore_eos"] = True
    if "messages" in body:
        body["messages"] = p.as_messages()
    elif p.ids:
        if "text" in body:  # SGLang's GenerateReqInput: input_ids instead of text
            del body["text"]
            body["input_ids"] = list(p.ids)
        else:  # /v1/completions: the prompt as a list of token ids
            body["prompt"] = list(p.ids)
    return body


def takes_token_ids(api: str) -> bool:
    return "messages" not in APIS[api].body(prompt="", max_tokens=1, model="")


@dataclass(frozen=True)
class ServerOptions:
    """Which server the requests go to and how to speak to it: the flags that mirror a genready
    target's settings (url, api, model, the API key, TLS)."""

    url: str
    api: str = "sglang"
    model: str | None = None  # None: the first of /v1/models (OpenAI APIs)
    api_key: str = ""
    ssl_context: ssl.SSLContext | None = None  # None: the system's trust store
    kind: str = "auto"  # a servers.kinds name, or AUTO: told by what the server answers (kind_of), once per run


@dataclass(frozen=True)
class LoadOptions:
    """What is sent: how many requests, how they arrive, what each asks for."""

    requests: int  # with `duration`: at most this many
    concurrency: int
    max_tokens: int
    timeout: float  # seconds one request may take, connecting included
    prompts: Sequence[Prompt]
    stream: bool = True
    request_rate: float | None = None  # None: `concurrency` workers back to back; else gamma arrivals
    seed: int | None = None
    burstiness: float = 1.0  # the arrivals' gamma shape (benchload.arrival_times): 1 is Poisson
    duration: float | None = None  # send for this many seconds (then finish those in flight), not `requests`
    temperature: float = 0.0
    ignore_eos: bool = False


Record = Callable[[Outcome, Prompt], None]  # told each request's Outcome, with its answer, and its (first) prompt


async def run(server: ServerOptions, load: LoadOptions, progress: Progress, record: Record | None = None) -> Summary:
    """Send `load.requests` generations (with `load.duration`: for that long, at most that many), at most
    `load.concurrency` at a time; every one time-bounded.

    Without `request_rate` C workers send back to back; with it, requests arrive at that rate with gamma
    gaps of shape `burstiness` (1: a Poisson process, as bench_serving's --request-rate), still at most C
    in flight. Each Outcome says when it was due and sent; the summary, the peak in flight. `record`, when given,
    is told every Outcome with its answer's text (and token ids, where the server's kind can be asked for them)
    before the text is dropped: the request lines (tools/requestlog.py)."""
    summary = Summary(load.requests, load.concurrency, duration=load.duration)
    api, url = APIS[server.api], server.url
    ssl_arg: ssl.SSLContext | bool = server.ssl_context if server.ssl_context is not None else True
    connector = PoolConnector(limit=load.concurrency, ssl=ssl_arg)
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else None
    # A request whose pooled connection turned out stale is sent again on a connection of its own.
    fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=load.concurrency, ssl=ssl_arg,
                                                                 force_close=True), headers=headers)
    async with fresh, aiohttp.ClientSession(connector=connector, headers=headers,
                                             trace_configs=[reuse_tracer()]) as session:
        model = server.model
        if api.needs_model and model is None:
            model = await discover_model(session, url, load.timeout)
            if model is None:
                print(f"benchclient: cannot read a model from {url}/v1/models; using {FALLBACK_MODEL!r} "
                      "(pass --model)", file=sys.stderr)
                model = FALLBACK_MODEL
        send = one_stream if load.stream else one_request
        kind = summary.kind = await kind_of(session, url, server, load.timeout)
        summary.own_api = kind is not None and kind.native_api == server.api
        before = await read_counters(session, url, kind, load.timeout)  # once before the run, once after
        # what the kind's OpenAI routes need asked to carry the answer's acceptance counts
        extra = {} if kind is None or summary.own_api else dict(kind.openai_fields[1 if load.stream else 0])
        ids = kind.token_ids if record is not None and kind is not None else None
        routes = server.api if summary.own_api else ""  # as TokenIds.api names them: "" is the OpenAI routes
        if ids is not None and ids.api != routes:
            ids = None  # it returns them on its other routes only
        extra.update(ids.ask if ids is not None else {})
        # The prompts in schedule's order, a shuffled round at a time as they are needed (a --duration run
        # does not know its count): the same sequence schedule(prompts, N) gives, so --seed repeats it. Each
        # prompt is a conversation: one request, or one per turn of a multi-turn question.
        drawn: list[Prompt] = []
        order = random.Random(load.seed)

        def conversation(j: int) -> Prompt:
            while len(drawn) <= j:
                drawn.extend(prompt_sets.schedule(load.prompts, len(load.prompts), order))
            return drawn[j]

        def body(p: Prompt) -> dict[str, Any]:
            b = request_body(api, p, max_tokens=load.max_tokens, model=model or "", stream=load.stream,
                             temperature=load.temperature, ignore_eos=load.ignore_eos)
            b.update(extra)
            return b

        in_flight = 0
        claimed = 0  # requests sent or reserved by a conversation, of load.requests (-n counts requests)

        def over() -> bool:
            return load.duration is not None and time.perf_counter() - start >= load.duration

        def room() -> bool:
            return claimed < load.requests and not over()

        async def one(b: dict[str, Any], p: Prompt, turn: int, arrival: float | None, late: float,
                      keep_text: bool) -> Outcome:
            """Send one request (claimed by the caller) and record its Outcome; the one returned keeps the
            answer's text when `keep_text` (the recorded one never does: a run of 100,000 need not hold them)."""
            nonlocal in_flight
            t0 = time.perf_counter()
            in_flight += 1
            summary.peak_concurrency = max(summary.peak_concurrency, in_flight)
            trace: dict[str, Any] = {}
            try:
                try:
                    outcome = await send(fresh if summary.new_connections else session, url, api, b, load.timeout,
                                         trace, keep_text=keep_text, ids=ids)
                except StaleConnection:
                    # Nothing of it was sent: once more, on a new connection (counted as one request, retried).
                    outcome = dataclasses.replace(
                        await send(fresh, url, api, b, load.timeout, keep_text=keep_text, ids=ids), retried=True)
            except Exception as e:  # what no rule above foresaw is still one failed request, never a lost run
                outcome = Outcome(False, time.perf_counter() - t0, error=f"{type(e).__name__}: {apis.excerpt(str(e))}")
            finally:
                in_flight -= 1
            outcome = dataclasses.replace(outcome, sent=t0 - start, arrival=arrival, late=late, category=p.category,
                                          turn=turn)
            if not summary.new_connections:
                summary.new_connections = why_not_reuse(trace, outcome, connector)
            if record is not None:
                record(outcome, p)
            summary.outcomes.append(dataclasses.replace(outcome, answer="", token_ids=None)
                                    if outcome.answer or outcome.token_ids else outcome)
            progress.update(len(summary.outcomes), summary.failed)
            return outcome

        async def converse(j: int, arrival: float | None, late: float) -> None:
            """Conversation j (`room()` was just checked): its first request, then each later turn once the answer
            before it arrived, with the earlier turns and answers (Prompt.turn). Its turns are reserved of -n at
            its start, so -n cuts at most the last conversation whatever the timing; a failed turn ends it (there
            is no answer to send back) and gives its unsent turns back, as --duration's end does, and so do
            answers over MAX_BODY characters together."""
            nonlocal claimed
            p = conversation(j)
            summary.conversations += 1
            turns = min(p.turns(), load.requests - claimed)
            claimed += turns
            answers: list[str] = []
            for k in range(turns):
                if k and over():
                    break
                o = await one(body(p.turn(answers)), p, k, arrival if k == 0 else None, late if k == 0 else 0.0,
                              k < turns - 1 or record is not None)
                answers.append(o.answer)
                if not o.ok or sum(map(len, answers)) > MAX_BODY:  # the history sent back is bounded as an answer is
                    break
            claimed -= turns - len(answers)
            if len(answers) < p.turns():
                summary.conversations_cut += 1

        start = time.perf_counter()
        await _arrivals(load, converse, room, start, summary.unsent)
        summary.wall_seconds = time.perf_counter() - start
        # The requests sent: with --duration, or when a failed turn gave turns back after the arrivals had
        # stopped, fewer than -n (single-turn prompts without --duration: every one of the N is sent)
        summary.requests = len(summary.outcomes)
        after = await read_counters(session, url, kind, load.timeout)
        if before is not None and after is not None:
            run = servermetrics.over_run(before.values, after.values, cumulative=after.cumulative)
            if api.needs_model:  # the OpenAI routes: spec decoding's counters (SGLang's own API: its meta_info)
                from_counters(summary, run)
            else:
                summary.server_counters = run
        if kind is not None and kind.info_accept is not None and (summary.own_api or (
                summary.metrics_accept is None and not any(o.spec_verify_ct for o in summary.outcomes))):
            # the kind's own average after the run: on its own API always (for the results line), on its
            # OpenAI routes when neither the answers nor the counters gave an accept length (a stream's answers
            # carry none without the kind's openai_fields)
            summary.server_acceptance = await read_info_accept(session, url, kind, load.timeout)
        summary.stale_connections = connector.stale
    progress.update(len(summary.outcomes), summary.failed, force=True)
    progress.clear()
    return summary


async def _arrivals(load: LoadOptions, converse: Callable[[int, float | None, float], Awaitable[None]],
                    room: Callable[[], bool], start: float, unsent: list[float]) -> None:
    """`converse(j, due, late)` for conversation j = 0, 1, … while `room()` (requests left of -n, time left of
    --duration): `concurrency` workers back to back, or arrivals at `request_rate` (benchload.arrival_times)
    with at most `concurrency` conversations in flight; a conversation holds its slot through its turns, so
    there are never more than `concurrency` requests in flight either. With `duration`, the due times of
    arrivals still waiting for a slot at its end go to `unsent`. Single-turn prompts: one request per
    conversation, as before turns were sent."""
    def over() -> bool:
        return load.duration is not None and time.perf_counter() - start >= load.duration

    if load.request_rate is None:
        todo = iter(range(load.requests))  # at most one conversation per request

        async def worker() -> None:
            for j in todo:  # workers pull from one shared iterator
                if not room():
                    return
                await converse(j, None, 0.0)

        await asyncio.gather(*(worker() for _ in range(min(load.concurrency, load.requests))))
        return
    slots = asyncio.Semaphore(load.concurrency)

    async def limited(j: int, due: float) -> None:
        late = max(0.0, time.perf_counter() - start - due)  # the client's own lag, before any wait for a slot
        async with slots:
            if over():  # due within --duration, but no slot came free before its end: never sent
                unsent.append(due)
                return
            if room():  # none left when later turns took the last of -n: not due any more
                await converse(j, due, late)

    tasks = []
    for j, due in enumerate(benchload.arrival_times(load.request_rate, load.burstiness, load.seed,
                                                    count=load.requests, until=load.duration)):
        if not room() and not over():  # -n is used up by later turns (after --duration: unsent, as below)
            break
        # Sleep to each arrival's time from the start, not by the gap: a late wake-up does not shift the rest.
        if (wait := start + due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.ensure_future(limited(j, due)))
    await asyncio.gather(*tasks)
