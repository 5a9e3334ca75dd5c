"""`genready-bench-client` (`python -m genready.benchclient`): a benchmark client for one LLM server.

N requests against SGLang's native API or the OpenAI routes, at a fixed concurrency C or
arriving as a Poisson process (`--request-rate R`, at most C in flight), streamed by default.
It reports what SGLang's bench_serving and vLLM's benchmark_serving report: time to first
token and inter-token latency (p50/p99, from the stream), end-to-end latency, output tokens/s
and requests/s. Requests and the token count follow apis.py, the probe's definitions.

Run under `genready guard` or `genready sweep` it names the verified server process it
measured (GENREADY_PID, GENREADY_INVOCATION_ID, GENREADY_UNIT) and the sweep point
(GENREADY_SWEEP_POINT), so a result can always be traced to one server start. Exit status 1
if any request failed.

The result block is meant for people, but its lines are stable for scripts and the demo:

    benchclient: N requests at concurrency C to URL (API, max_tokens M[, streaming][, Poisson R/s])[, …]
      requests   N ok, F failed[ (…error kinds…)][, E empty][, R retried][, S stale connections skipped]
      rate       R requests/s, T tokens/s over S s
      latency    p50 X ms, p99 Y ms
      ttft       p50 X ms, p99 Y ms          (streaming only)
      itl        p50 X ms, p99 Y ms          (streaming only)
      accept     length L (SOURCE)[, server average A][, draft acceptance D (ACC/DRAFTED drafted tokens)]
                 or: length - (no speculative decoding seen)
      connection new per request: WHY                 (when the server closes kept-alive connections)
      served by pid P (invocation I, unit U)
      sweep point {…}

An empty answer (valid, but no token: the model's first token ended the sequence) is ok, with 0
tokens. A request that was never sent, because the pooled connection aiohttp gave it had been
closed by the server, is sent once more on a new connection and counted once, as retried; any
other failure counts (see PoolConnector for the server that does this, llama.cpp's).

`--output FILE` appends the same result as one JSON object per line. A progress bar goes to
stderr on a terminal, a plain line per 10 % otherwise.

The accept length of speculative decoding (tokens per verify step of the large model), the
figure a speculative-decoding sweep compares, comes from the server:
- SGLang (`--api sglang`): Σ meta_info.completion_tokens / Σ meta_info.spec_verify_ct over the
  run's requests (sent only when a speculative algorithm runs), and, after the run, GET
  /get_server_info's internal_states[0].avg_spec_accept_length as `server_accept_length`;
- vLLM (the OpenAI APIs): GET /metrics before and after the run, 1 + Δaccepted / Δdrafts of its
  spec_decode counters (vLLM's own "mean acceptance length");
- llama.cpp's llama-server (the OpenAI APIs, started with --metrics): the same from its
  llamacpp:spec_decode_num_{accepted_tokens,drafts}_total counters. Its answers also carry
  timings.draft_n / draft_n_accepted: `draft_acceptance` = Σ accepted / Σ drafted over the run
  (null when no answer drafted), the share of drafted tokens the target model kept.
Without speculative decoding it is null. What is sent: the built-in prompts (tools/prompts.py),
`--dataset FILE`, or random token ids (`--random-input-len`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import select
import ssl
import sys
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple, TextIO

import aiohttp
from aiohttp import http_exceptions
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from genready import apis, config, console
from genready.apis import APIS, MAX_BODY, MODELS_PATH, BadAnswer, ServerApi, model_from_list
from genready.compat import TIMEOUT_ERRORS
from genready.exitcodes import Exit
from genready.tools import prompts as prompt_sets
from genready.tools import servermetrics
from genready.tools.prompts import Prompt

# A model name SGLang accepts when /v1/models cannot be read: it serves one model anyway.
FALLBACK_MODEL: Final = "default"
DEFAULT_URL: Final = "http://127.0.0.1:30000"
PROGRESS_WIDTH: Final = 30
PROGRESS_INTERVAL: Final = 0.1  # seconds between progress-bar redraws
SERVER_FIGURES_CAP: Final = 4 << 20  # bytes read of /metrics or /get_server_info: a figure, not a download
# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py: Counter "vllm:spec_decode_num_drafts"
# and "vllm:spec_decode_num_accepted_tokens"; prometheus_client exposes a counter as NAME_total).
VLLM_DRAFTS: Final = "vllm:spec_decode_num_drafts_total"
VLLM_ACCEPTED: Final = "vllm:spec_decode_num_accepted_tokens_total"
# llama.cpp's llama-server (--metrics): tools/server/server-task.cpp renders its counters as
# "llamacpp:" + spec_decode_num_draft_tokens_total / spec_decode_num_accepted_tokens_total /
# spec_decode_num_drafts_total (the last counts verification steps, n_draft_verif_steps).
LLAMACPP_DRAFTS: Final = "llamacpp:spec_decode_num_drafts_total"
LLAMACPP_ACCEPTED: Final = "llamacpp:spec_decode_num_accepted_tokens_total"
LLAMACPP_DRAFT_TOKENS: Final = "llamacpp:spec_decode_num_draft_tokens_total"
# Where an accept length read from /metrics came from (`accept_length_source`).
VLLM_METRICS_SOURCE: Final = "/metrics spec_decode counters"
LLAMACPP_METRICS_SOURCE: Final = "/metrics llamacpp:spec_decode counters"
# SGLang: GET /get_server_info (older: /server_info), python/sglang/srt/entrypoints/http_server.py.
SGLANG_INFO_PATHS: Final = ("/get_server_info", "/server_info")
# SGLang's OpenAI routes put a choice's meta_info (spec_verify_ct with it) into a non-streamed answer only when
# the request asks with return_meta_info, and refuse it on a stream (python/sglang/srt/entrypoints/openai/
# serving_chat.py and protocol.py). A stream's accept length is then the server's own average.
SGLANG_META_SOURCE: Final = "meta_info.spec_verify_ct (return_meta_info)"
SGLANG_SERVER_SOURCE: Final = "get_server_info avg_spec_accept_length (SGLang's recent average, not this run's alone)"


class Drafts(NamedTuple):
    """One answer's speculative-decoding counts from llama.cpp's llama-server: `timings.draft_n` (tokens the
    draft model proposed) and `timings.draft_n_accepted` (how many of them the target model accepted).

    server_slot_stats::to_json (tools/server/server-common.cpp) sets both only when the slot drafted
    (n_draft_tokens > 0): absent, not 0, without speculative decoding. tools/server/server-task.cpp puts
    `timings` into the answer of /completion, /v1/completions and /v1/chat/completions, and when streaming
    into the final event (the last chunk; for chat with include_usage, the usage chunk)."""

    drafted: int
    accepted: int


def drafts_of(doc: Any) -> Drafts | None:
    """The Drafts of one answer (or stream event) as parsed JSON; None when it has none."""
    timings = doc.get("timings") if isinstance(doc, dict) else None
    if not isinstance(timings, dict):
        return None
    n, acc = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, acc)):
        return None
    assert isinstance(n, int) and isinstance(acc, int)
    return Drafts(n, acc) if n > 0 and 0 <= acc <= n else None


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    tokens: int = 0
    error: str = ""
    ttft: float | None = None  # seconds to the first event with output (streaming only)
    itl: tuple[float, ...] = ()  # seconds between later events with output
    spec_verify_ct: int | None = None  # SGLang's verify steps for this request (speculative decoding only)
    drafts: Drafts | None = None  # llama.cpp's timings.draft_n / draft_n_accepted (only when it drafted)
    retried: bool = False  # sent again on a fresh connection: the pooled one was stale (see _stale_connection)


@dataclass
class Summary:
    requests: int
    concurrency: int
    wall_seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    metrics_accept: float | None = None  # vLLM, llama.cpp: 1 + Δaccepted / Δdrafts over the run
    metrics_source: str | None = None  # which server's /metrics counters metrics_accept comes from
    server_accept_length: float | None = None  # SGLang: avg_spec_accept_length after the run
    stale_connections: int = 0  # pooled connections the server had closed, found before sending on them
    metrics_counts: dict[str, float] | None = None  # the /metrics counters' growth over the run
    new_connections: str = ""  # why later requests each went on a new connection ("": pooled ones were reused)
    sglang_openai: bool = False  # the OpenAI routes of an SGLang server (it answers GET /get_server_info)
    server_counters: servermetrics.RunCounters | None = None  # its /metrics counters over the run

    def accept(self) -> tuple[float | None, str | None]:
        """(accept length, where it came from); (None, None) without speculative decoding."""
        verified = [o for o in self.outcomes if o.ok and o.spec_verify_ct]
        if verified:
            steps = sum(o.spec_verify_ct or 0 for o in verified)
            return sum(o.tokens for o in verified) / steps, SGLANG_META_SOURCE if self.sglang_openai else \
                "meta_info.spec_verify_ct"
        if self.metrics_accept is not None:
            return self.metrics_accept, self.metrics_source or VLLM_METRICS_SOURCE
        if self.sglang_openai and self.server_accept_length is not None:
            return self.server_accept_length, SGLANG_SERVER_SOURCE
        return None, None

    def drafts(self) -> Drafts | None:
        """llama.cpp's draft counts summed over the run's answers; None when no answer drafted."""
        counted = [o.drafts for o in self.outcomes if o.ok and o.drafts is not None]
        if not counted:
            return None
        return Drafts(sum(d.drafted for d in counted), sum(d.accepted for d in counted))

    def draft_acceptance(self) -> float | None:
        """Σ draft_n_accepted / Σ draft_n over the run's answers (the share of drafted tokens the target
        accepted); None when no answer drafted."""
        d = self.drafts()
        return d.accepted / d.drafted if d is not None else None

    @property
    def ok(self) -> int:
        return sum(1 for o in self.outcomes if o.ok)

    @property
    def empty(self) -> int:
        """Valid answers with no output (the model's first token was end-of-sequence), counted as 0 tokens."""
        return sum(1 for o in self.outcomes if o.ok and o.tokens == 0)

    @property
    def retried(self) -> int:
        return sum(1 for o in self.outcomes if o.retried)

    @property
    def failed(self) -> int:
        return len(self.outcomes) - self.ok

    @property
    def tokens(self) -> int:
        return sum(o.tokens for o in self.outcomes if o.ok)

    def errors(self) -> Counter[str]:
        return Counter(o.error for o in self.outcomes if not o.ok)

    def latencies_ms(self) -> list[float]:
        # Only successful requests: a refused connection's 1 ms would flatter the server.
        return sorted(o.seconds * 1000 for o in self.outcomes if o.ok)

    def ttfts_ms(self) -> list[float]:
        return sorted(o.ttft * 1000 for o in self.outcomes if o.ok and o.ttft is not None)

    def itls_ms(self) -> list[float]:
        # Every gap of every request, as bench_serving pools them: a p99 of token gaps, not of requests.
        return sorted(gap * 1000 for o in self.outcomes if o.ok for gap in o.itl)


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (no interpolation: every reported figure was measured)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


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
                      timeout: float, trace: dict[str, Any] | None = None) -> Outcome:
    t0 = time.perf_counter()
    try:
        async with session.post(url + api.path, json=body, timeout=aiohttp.ClientTimeout(total=timeout),
                                allow_redirects=False, trace_request_ctx=trace) as r:
            if r.status != 200:
                return Outcome(False, time.perf_counter() - t0, error=http_error(r))
            raw = await read_body(r)
            took = time.perf_counter() - t0
        # The probe's rule (apis.py) for what a generation looks like; unlike the probe, a valid answer with no
        # output (the model's first token ended the sequence) is an empty answer with 0 tokens, not a failure.
        tokens = api.counted_tokens(raw)
        doc = json.loads(raw)
    except _REQUEST_ERRORS as e:
        return _failed(e, t0, timeout, trace)
    return Outcome(True, took, tokens if _has_output(api, doc) else 0, spec_verify_ct=_verify_ct(api, raw),
                   drafts=drafts_of(doc))


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


def _verify_ct(api: ServerApi, answer: bytes | None) -> int | None:
    """SGLang's meta_info.spec_verify_ct in an answer (a stream's last event: it is cumulative); on its
    OpenAI routes, the first choice's meta_info (asked for with return_meta_info, non-streamed only).

    SGLang sets it only when a speculative algorithm runs (python/sglang/srt/managers/tokenizer_manager.py)."""
    if not answer:
        return None
    try:
        doc = json.loads(answer)
        if api.needs_model:
            choices = doc.get("choices")
            doc = choices[0] if isinstance(choices, list) and choices else {}
        meta = doc.get("meta_info")
    except (ValueError, AttributeError):
        return None
    v = meta.get("spec_verify_ct") if isinstance(meta, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


class StaleConnection(Exception):
    """A request that never left: the pooled connection it was given had been closed by the server."""


def _refused_write(e: BaseException) -> bool:
    """Whether `e` comes from aiohttp refusing to write into a connection that was already closing: its own
    ConnectionResetError without an errno ("Cannot write to closing transport", aiohttp/http_writer.py),
    raised instead of handing the bytes to the socket. aiohttp 3.8 raises it for the request line and
    headers (as ClientOSError) and, for the body, as the cause of ClientOSError "Can not write request
    body"; later versions hold the headers back and send them with the body, so nothing was sent."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        if isinstance(x, ConnectionResetError) and x.errno is None:
            return True
        seen.add(id(x))
        x = x.__cause__ or x.__context__
    return False


def _failed(e: BaseException, t0: float, timeout: float, trace: dict[str, Any] | None = None) -> Outcome:
    """The Outcome of a request started at `t0` that raised `e`, in words a reader can act on.

    StaleConnection when the request was not sent at all, because the pooled connection aiohttp gave it had
    been closed by the server (`trace` says whether it was a pooled one): the caller sends it again."""
    took = time.perf_counter() - t0
    if trace is not None and trace.get("reused") and _refused_write(e):
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
                     timeout: float, trace: dict[str, Any] | None = None) -> Outcome:
    """One streamed generation: TTFT and the gaps between events that carried output."""
    t0 = time.perf_counter()
    tokens, first, last, gaps, done = 0, None, 0.0, list[float](), False
    last_event: bytes | None = None
    drafts: Drafts | None = None
    try:
        async with session.post(url + api.path, json=body, timeout=aiohttp.ClientTimeout(total=timeout),
                                allow_redirects=False, trace_request_ctx=trace) as r:
            if r.status != 200:
                return Outcome(False, time.perf_counter() - t0, error=http_error(r))
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
                if b'"draft_n"' in data:  # llama.cpp's timings, in the final event: cumulative for the request
                    drafts = drafts_of(json.loads(data)) or drafts
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
    except _STREAM_ERRORS as e:
        return _failed(e, t0, timeout, trace)
    # No event with output (the model's first token ended the sequence) is an empty answer with 0 tokens, not a
    # failure, whatever a final usage event counts (llama.cpp counts that end-of-sequence token: 1).
    return Outcome(True, took, tokens if first is not None else 0, ttft=first, itl=tuple(gaps),
                   spec_verify_ct=_verify_ct(api, last_event), drafts=drafts)


async def _get_json_or_text(session: aiohttp.ClientSession, url: str, timeout: float) -> tuple[int, bytes]:
    """(status, at most SERVER_FIGURES_CAP bytes of the body) of a GET; (0, b"") if it failed."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False) as r:
            return r.status, await read_body(r, SERVER_FIGURES_CAP)
    except _STREAM_ERRORS:  # the request errors, and ValueError
        return 0, b""


def _counter_sums(text: str, names: Sequence[str]) -> list[float] | None:
    """Each named counter of a Prometheus /metrics page, summed over its label sets (vLLM's engines),
    parsed by prometheus_client (servermetrics.counters); None unless every one of them is there."""
    try:
        sums = servermetrics.counters(text)
    except servermetrics.NotMetrics:
        return None
    return [sums[n] for n in names] if all(n in sums for n in names) else None


def vllm_spec_counters(text: str) -> tuple[float, float] | None:
    """(drafts, accepted tokens) summed over engines from a Prometheus /metrics page; None without them."""
    got = _counter_sums(text, (VLLM_DRAFTS, VLLM_ACCEPTED))
    return (got[0], got[1]) if got else None


class SpecCounters(NamedTuple):
    """A server's speculative-decoding counters since it started, from its /metrics page."""

    drafts: float  # verification steps (vLLM: drafts; llama.cpp: spec_decode_num_drafts_total)
    accepted: float  # draft tokens the target model accepted
    source: str  # accept_length_source of an accept length computed from them
    draft_tokens: float | None = None  # draft tokens proposed (llama.cpp only)


def spec_counters(text: str) -> SpecCounters | None:
    """vLLM's or llama.cpp's speculative-decoding counters on a /metrics page; None without either."""
    if (v := vllm_spec_counters(text)) is not None:
        return SpecCounters(v[0], v[1], VLLM_METRICS_SOURCE)
    got = _counter_sums(text, (LLAMACPP_DRAFTS, LLAMACPP_ACCEPTED, LLAMACPP_DRAFT_TOKENS))
    return SpecCounters(got[0], got[1], LLAMACPP_METRICS_SOURCE, got[2]) if got else None


async def read_spec_counters(session: aiohttp.ClientSession, url: str, timeout: float) -> SpecCounters | None:
    status, body = await _get_json_or_text(session, url + "/metrics", timeout)
    return spec_counters(body.decode("utf-8", "replace")) if status == 200 else None


async def read_counters(session: aiohttp.ClientSession, url: str, timeout: float) -> dict[str, float] | None:
    """The server's /metrics counters (servermetrics.counters), or None when it has no readable page."""
    status, body = await _get_json_or_text(session, url + "/metrics", timeout)
    if status != 200:
        return None
    try:
        return servermetrics.counters(body.decode("utf-8", "replace"))
    except servermetrics.NotMetrics:
        return None


async def is_sglang(session: aiohttp.ClientSession, url: str, timeout: float) -> bool:
    """Whether the server answers SGLang's GET /get_server_info (or its older name) with a JSON object."""
    for path in SGLANG_INFO_PATHS:
        status, body = await _get_json_or_text(session, url + path, timeout)
        if status == 200:
            try:
                return isinstance(json.loads(body), dict)
            except ValueError:
                return False
    return False


async def read_sglang_accept(session: aiohttp.ClientSession, url: str, timeout: float) -> float | None:
    """internal_states[0].avg_spec_accept_length of SGLang's server info (None: not there, or no spec)."""
    for path in SGLANG_INFO_PATHS:
        status, body = await _get_json_or_text(session, url + path, timeout)
        if status == 404:
            continue  # an older SGLang: the other name
        try:
            states = json.loads(body).get("internal_states") if status == 200 else None
            v = states[0].get("avg_spec_accept_length") if isinstance(states, list) and states else None
        except (ValueError, AttributeError):
            return None
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    return None


class Progress:
    """A one-line progress bar on a terminal; on anything else a plain line per 10 % (logs stay readable)."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.enabled = stream.isatty()
        self._last = 0.0
        self._tenths = 0

    def update(self, done: int, failed: int, *, force: bool = False) -> None:
        if not self.enabled:
            tenths = 10 * done // max(1, self.total)
            if tenths > self._tenths:
                self._tenths = tenths
                self.stream.write(f"benchclient: {done}/{self.total} done" + (f", {failed} failed" if failed else "")
                                  + "\n")
                self.stream.flush()
            return
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_INTERVAL and done < self.total:
            return
        self._last = now
        filled = PROGRESS_WIDTH * done // max(1, self.total)
        bar = "#" * filled + "-" * (PROGRESS_WIDTH - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total}" + (f"  {failed} failed" if failed else ""))
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _closed_by_server(conn: Connection) -> bool:
    """Whether an idle pooled connection has something to read: the server's FIN (it closed the connection)
    or bytes nobody asked for. Either way it must not carry the next request. aiohttp checks only whether
    the transport is closing, which it learns when asyncio reads the socket on a later turn of the loop: a
    FIN that has arrived but not yet been read passes that check."""
    transport = conn.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # no descriptor any more: closed
        return True


class PoolConnector(aiohttp.TCPConnector):
    """aiohttp's TCPConnector, except that it does not hand out a pooled connection the server has closed.

    llama.cpp's llama-server closes the connection after every streamed answer although its headers
    offered keep-alive (`Keep-Alive: timeout=5, max=100`): its stream provider (tools/server/server-http.cpp,
    process_handler_response) returns false after sink.done(), which cpp-httplib's write_content_chunked
    (vendor/cpp-httplib/httplib.cpp) reports as a failed write, so the keep-alive loop
    (process_server_socket_core) ends and drain_and_close_socket shuts the socket down, discarding whatever
    arrives for 100 ms. The answer is complete, but the connection goes back to aiohttp's pool a moment
    before its FIN is read, and the next request was sent into it: "Can not write request body" (aiohttp
    3.8), or a disconnect. A pooled connection that has become readable while idle is closed here instead,
    and the request gets another one (counted in `stale`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._used: weakref.WeakSet[Any] = weakref.WeakSet()  # protocols handed out before: pooled ones
        self.stale = 0

    async def connect(self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
                      ) -> Connection:
        while True:
            conn = await super().connect(req, traces, timeout)
            proto = conn.protocol
            if proto is None or proto not in self._used:
                if proto is not None:
                    self._used.add(proto)
                return conn
            if not _closed_by_server(conn):
                return conn
            self.stale += 1
            conn.close()


# Servers that close the connection after every streamed answer although they offer keep-alive, by their Server
# header: llama.cpp's llama-server (see PoolConnector).
CLOSES_AFTER_STREAM: Final = ("llama.cpp",)


def _why_not_reuse(trace: Mapping[str, Any], outcome: Outcome, connector: PoolConnector) -> str:
    """Why the rest of the run should send each request on a new connection ("" to keep reusing them): the
    server closes connections it offered to keep alive, so a request may meet one closing before the FIN is
    there to see (PoolConnector) and be lost; a new connection cannot be closing."""
    if trace.get("stream") and str(trace.get("server", "")).split("/")[0] in CLOSES_AFTER_STREAM:
        return f"{trace['server']} closes the connection after a streamed answer"
    if connector.stale or outcome.retried:
        return "the server closed a kept-alive connection"
    return ""


def _reuse_tracer() -> aiohttp.TraceConfig:
    """Marks a request's trace context (a dict passed as trace_request_ctx) "reused" while the connection it
    was given came from the pool, so that a refused write can be told from a new connection's failure."""
    tc = aiohttp.TraceConfig()

    def mark(value: bool) -> Callable[..., Awaitable[None]]:
        async def on(_session: Any, ctx: Any, _params: Any) -> None:
            if isinstance(ctx.trace_request_ctx, dict):
                ctx.trace_request_ctx["reused"] = value
        return on

    tc.on_connection_reuseconn.append(mark(True))
    tc.on_connection_create_end.append(mark(False))
    return tc


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


@dataclass(frozen=True)
class LoadOptions:
    """What is sent: how many requests, how they arrive, what each asks for."""

    requests: int
    concurrency: int
    max_tokens: int
    timeout: float  # seconds one request may take, connecting included
    prompts: Sequence[Prompt]
    stream: bool = True
    request_rate: float | None = None  # None: `concurrency` workers back to back; else Poisson arrivals
    seed: int | None = None
    temperature: float = 0.0
    ignore_eos: bool = False


async def run(server: ServerOptions, load: LoadOptions, progress: Progress) -> Summary:
    """Send `load.requests` generations, at most `load.concurrency` at a time; every one time-bounded.

    Without `request_rate` C workers send back to back; with it, requests arrive as a Poisson
    process of that rate (exponential gaps, as bench_serving's --request-rate), still at most C
    in flight."""
    summary = Summary(load.requests, load.concurrency)
    api, url = APIS[server.api], server.url
    ssl_arg: ssl.SSLContext | bool = server.ssl_context if server.ssl_context is not None else True
    connector = PoolConnector(limit=load.concurrency, ssl=ssl_arg)
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else None
    # A request whose pooled connection turned out stale is sent again on a connection of its own.
    fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=load.concurrency, ssl=ssl_arg,
                                                                 force_close=True), headers=headers)
    async with fresh, aiohttp.ClientSession(connector=connector, headers=headers,
                                             trace_configs=[_reuse_tracer()]) as session:
        model = server.model
        if api.needs_model and model is None:
            model = await discover_model(session, url, load.timeout)
            if model is None:
                print(f"benchclient: cannot read a model from {url}/v1/models; using {FALLBACK_MODEL!r} "
                      "(pass --model)", file=sys.stderr)
                model = FALLBACK_MODEL
        bodies = [request_body(api, p, max_tokens=load.max_tokens, model=model or "", stream=load.stream,
                               temperature=load.temperature, ignore_eos=load.ignore_eos)
                  for p in prompt_sets.schedule(load.prompts, load.requests, random.Random(load.seed))]
        send = one_stream if load.stream else one_request
        before = await read_spec_counters(session, url, load.timeout) if api.needs_model else None
        summary.sglang_openai = api.needs_model and await is_sglang(session, url, load.timeout)
        if summary.sglang_openai and not load.stream:
            for b in bodies:
                b["return_meta_info"] = True  # a choice's meta_info, with spec_verify_ct: SGLANG_META_SOURCE
        counted = await read_counters(session, url, load.timeout)

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            trace: dict[str, Any] = {}
            try:
                try:
                    outcome = await send(fresh if summary.new_connections else session, url, api, bodies[i],
                                         load.timeout, trace)
                except StaleConnection:
                    # Nothing of it was sent: once more, on a new connection (counted as one request, retried).
                    outcome = dataclasses.replace(await send(fresh, url, api, bodies[i], load.timeout), retried=True)
            except Exception as e:  # what no rule above foresaw is still one failed request, never a lost run
                outcome = Outcome(False, time.perf_counter() - t0, error=f"{type(e).__name__}: {apis.excerpt(str(e))}")
            if not summary.new_connections:
                summary.new_connections = _why_not_reuse(trace, outcome, connector)
            summary.outcomes.append(outcome)
            progress.update(len(summary.outcomes), summary.failed)

        t0 = time.perf_counter()
        await _arrivals(load, one)
        summary.wall_seconds = time.perf_counter() - t0
        await _server_figures(summary, session, url, api, load.timeout, before)
        after = await read_counters(session, url, load.timeout)
        if counted is not None and after is not None:
            summary.server_counters = servermetrics.over_run(counted, after)
        summary.stale_connections = connector.stale
    progress.update(len(summary.outcomes), summary.failed, force=True)
    progress.clear()
    return summary


async def _arrivals(load: LoadOptions, one: Callable[[int], Awaitable[None]]) -> None:
    """`one(i)` for every request: `concurrency` workers back to back, or Poisson arrivals at
    `request_rate` with at most `concurrency` in flight."""
    if load.request_rate is None:
        todo = iter(range(load.requests))

        async def worker() -> None:
            for i in todo:  # workers pull from one shared iterator: exactly `requests` in total
                await one(i)

        await asyncio.gather(*(worker() for _ in range(min(load.concurrency, load.requests))))
        return
    rng = random.Random(load.seed)
    slots = asyncio.Semaphore(load.concurrency)

    async def limited(i: int) -> None:
        async with slots:
            await one(i)

    tasks = []
    for i in range(load.requests):
        tasks.append(asyncio.ensure_future(limited(i)))
        if i + 1 < load.requests:
            await asyncio.sleep(rng.expovariate(load.request_rate))
    await asyncio.gather(*tasks)


async def _server_figures(summary: Summary, session: aiohttp.ClientSession, url: str, api: ServerApi,
                          timeout: float, before: SpecCounters | None) -> None:
    """The server's own speculative-decoding figures over the run: the growth of its /metrics
    counters (vLLM, llama.cpp), or SGLang's avg_spec_accept_length."""
    if not api.needs_model:
        summary.server_accept_length = await read_sglang_accept(session, url, timeout)
        return
    after = await read_spec_counters(session, url, timeout)
    if before is None or after is None or after.source != before.source or after.drafts <= before.drafts:
        if summary.sglang_openai and not any(o.spec_verify_ct for o in summary.outcomes):
            # SGLang's OpenAI routes, streamed (no meta_info): the server's own average is all there is
            summary.server_accept_length = await read_sglang_accept(session, url, timeout)
        return
    summary.metrics_accept = 1 + (after.accepted - before.accepted) / (after.drafts - before.drafts)
    summary.metrics_source = after.source
    summary.metrics_counts = {"drafts": after.drafts - before.drafts, "accepted": after.accepted - before.accepted}
    if after.draft_tokens is not None and before.draft_tokens is not None:
        summary.metrics_counts["draft_tokens"] = after.draft_tokens - before.draft_tokens


def served_by(env: Mapping[str, str]) -> dict[str, str] | None:
    """The verified server instance `genready guard` pinned for us, if we run under it."""
    pid = env.get("GENREADY_PID")
    if not pid:
        return None
    return {"pid": pid, "invocation_id": env.get("GENREADY_INVOCATION_ID", "?"),
            "unit": env.get("GENREADY_UNIT", "?")}


def sweep_point(env: Mapping[str, str]) -> Any:
    """The sweep point `genready sweep` runs us for (GENREADY_SWEEP_POINT, JSON), if any."""
    raw = env.get("GENREADY_SWEEP_POINT")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def header(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    s = served_by(env)
    how = "".join([", streaming" if args.stream else "",
                   f", Poisson {args.request_rate:g} requests/s" if args.request_rate else ""])
    return (f"benchclient: {args.requests} requests at concurrency {args.concurrency} to {args.url} "
            f"({args.api}, max_tokens {args.max_tokens}{how})"
            + (f", target {args.target}" if args.target else "") + (f", label {args.label}" if args.label else "")
            + (f", pid {s['pid']}" if s else ""))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def format_summary(s: Summary, env: Mapping[str, str], *, stream: bool = False) -> str:
    lat = s.latencies_ms()
    wall = max(s.wall_seconds, 1e-9)
    errors = s.errors()
    why = ""
    if errors:
        why = " (" + ", ".join(f"{n}x {e}" for e, n in errors.most_common(3)) + (
            ", …" if len(errors) > 3 else "") + ")"
    more = "".join([f", {s.empty} empty" if s.empty else "", f", {s.retried} retried" if s.retried else "",
                    f", {s.stale_connections} stale connections skipped" if s.stale_connections else ""])
    lines = [
        f"  requests   {s.ok} ok, {s.failed} failed{why}{more}",
        f"  rate       {s.ok / wall:.1f} requests/s, {s.tokens / wall:.1f} tokens/s over {s.wall_seconds:.2f} s",
        f"  latency    p50 {_ms(percentile(lat, 50))}, p99 {_ms(percentile(lat, 99))}",
    ]
    if stream:
        ttft, itl = s.ttfts_ms(), s.itls_ms()
        lines.append(f"  ttft       p50 {_ms(percentile(ttft, 50))}, p99 {_ms(percentile(ttft, 99))}")
        lines.append(f"  itl        p50 {_ms(percentile(itl, 50))}, p99 {_ms(percentile(itl, 99))}")
    length, source = s.accept()
    server = "" if s.server_accept_length is None else f", server average {s.server_accept_length:.2f}"
    drafts, acceptance = s.drafts(), s.draft_acceptance()
    if drafts is not None and acceptance is not None:
        server += f", draft acceptance {acceptance:.3f} ({drafts.accepted}/{drafts.drafted} drafted tokens)"
    if length is not None:
        lines.append(f"  accept     length {length:.2f} ({source}){server}")
    elif drafts is not None:  # llama.cpp drafted, but its /metrics (--metrics) could not be read
        lines.append(f"  accept     length - (no /metrics spec_decode counters){server}")
    else:
        lines.append(f"  accept     length - (no speculative decoding seen){server}")
    if s.new_connections:
        lines.append(f"  connection new per request: {s.new_connections}")
    who = served_by(env)
    if who:
        lines.append(f"  served by pid {who['pid']} (invocation {who['invocation_id']}, unit {who['unit']})")
    point = sweep_point(env)
    if point is not None:
        lines.append(f"  sweep point {json.dumps(point)}")
    return "\n".join(lines) + "\n"


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def result_json(args: argparse.Namespace, s: Summary, env: Mapping[str, str]) -> dict[str, Any]:
    lat, ttft, itl = s.latencies_ms(), s.ttfts_ms(), s.itls_ms()
    wall = max(s.wall_seconds, 1e-9)
    return {
        "time": time.time(), "label": args.label, "target": args.target, "url": args.url, "api": args.api,
        "requests": s.requests, "concurrency": s.concurrency, "request_rate": args.request_rate,
        "stream": args.stream, "max_tokens": args.max_tokens,
        "ok": s.ok, "failed": s.failed, "errors": dict(s.errors()), "empty": s.empty, "retried": s.retried,
        "stale_connections": s.stale_connections, "new_connections": s.new_connections or None,
        "wall_seconds": round(s.wall_seconds, 6), "requests_per_second": round(s.ok / wall, 3),
        "tokens_per_second": round(s.tokens / wall, 3), "output_tokens": s.tokens,
        "output_tokens_per_second": round(s.tokens / wall, 3),
        "latency_p50_ms": _r(percentile(lat, 50)), "latency_p99_ms": _r(percentile(lat, 99)),
        "e2e_p50_ms": _r(percentile(lat, 50)), "e2e_p99_ms": _r(percentile(lat, 99)),
        "ttft_p50_ms": _r(percentile(ttft, 50)), "ttft_p99_ms": _r(percentile(ttft, 99)),
        "itl_p50_ms": _r(percentile(itl, 50)), "itl_p99_ms": _r(percentile(itl, 99)),
        "accept_length": _r(s.accept()[0]), "accept_length_source": s.accept()[1],
        "server_accept_length": _r(s.server_accept_length),
        "draft_acceptance": _r(s.draft_acceptance()),
        "draft_tokens": drafts.drafted if (drafts := s.drafts()) else None,
        "draft_accepted": drafts.accepted if drafts else None,
        "spec_decode_counters": s.metrics_counts,
        "prefix_cache_hit_rate": s.server_counters.prefix_cache_hit_rate if s.server_counters else None,
        "prefix_cache_source": s.server_counters.prefix_cache_source if s.server_counters else None,
        "prompts": args.prompt_source, "temperature": args.temperature, "ignore_eos": args.ignore_eos,
        "seed": args.seed,
        "served_by": served_by(env), "sweep_point": sweep_point(env),
    }


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {s!r}")
    return v


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {s!r}") from None
    if not v > 0 or math.isinf(v):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a positive number, not {s!r}")
    return v


def _number_from(lo: float, hi: float, what: str) -> Callable[[str], float]:
    """An argparse type: a number in [lo, hi] (nan refused), else a usage error saying `what`."""
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            v = math.nan
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be {what}, not {s!r}")
        return v
    return parse


_ratio = _number_from(0.0, 1.0, "a number from 0 to 1")
_non_negative_float = _number_from(0.0, sys.float_info.max, "a number >= 0")


def prompt_set(args: argparse.Namespace) -> list[Prompt]:
    """What to send, from the flags; exits 65 for a bad dataset and 64 for ids an API cannot take.
    Sets args.prompt_source, the words the JSON line keeps."""
    if args.random_input_len and not takes_token_ids(args.api):
        print(f"benchclient: --random-input-len sends token ids, which {args.api} cannot take (it wants chat "
              "messages); use --api sglang or openai-completions", file=sys.stderr)
        raise SystemExit(Exit.BAD_ARGUMENT)
    rng = random.Random(args.seed)
    if args.random_input_len:
        args.prompt_source = (f"random ids: input {args.random_input_len}, output "
                              f"{args.random_output_len or args.max_tokens}, ratio {args.random_range_ratio:g}")
        return [prompt_sets.random_prompt(rng, args.random_input_len, args.random_output_len,
                                          args.random_range_ratio) for _ in range(args.requests)]
    if args.dataset:
        try:
            base = prompt_sets.load_dataset(Path(args.dataset))
        except prompt_sets.DatasetError as e:
            console.err(f"benchclient: {e}")
            raise SystemExit(Exit.BAD_DATA) from None
        args.prompt_source = f"dataset {args.dataset} ({len(base)} prompts)"
    elif args.prompt is not None:
        base, args.prompt_source = [Prompt(args.prompt)], "--prompt"
    else:
        base, args.prompt_source = list(prompt_sets.BUILTIN), f"built-in ({len(prompt_sets.BUILTIN)} prompts)"
    if args.random_output_len:  # the same prompts, each with its own drawn output length
        return [dataclasses.replace(p, max_tokens=prompt_sets.random_prompt(
            rng, None, args.random_output_len, args.random_range_ratio).max_tokens) for p in base]
    return base


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m genready.benchclient",
        description="Send N generations to an LLM server, at concurrency C or as Poisson arrivals, and print "
        "time to first token and inter-token latency (streaming), end-to-end latency (p50/p99), output tokens/s "
        "and requests/s. Under `genready guard` or `genready sweep` it also names the verified server pid it "
        "measured and the sweep point. Exit status 1 if any request failed. A request fails, and is counted, on "
        f"an answer other than 200 (a redirect is not followed), a non-streamed answer or /v1/models over "
        f"{MAX_BODY >> 20} MiB (not read further), or a stream line over aiohttp's limit; the report is written "
        "whatever the requests did.")
    add_target_flags(p)
    p.add_argument("--config", metavar="PATH", help="a genready.toml: take url, api, model, the API key and the "
                   "TLS settings of --target (or $GENREADY_TARGET, set by guard and sweep, or the only target)")
    p.add_argument("-n", "--requests", type=_positive_int, default=50, metavar="N",
                   help="requests in total (default: %(default)s)")
    p.add_argument("-c", "--concurrency", type=_positive_int, default=4, metavar="C",
                   help="requests in flight at once (default: %(default)s)")
    p.add_argument("--max-tokens", type=_positive_int, default=32, metavar="M",
                   help="tokens to generate per request (default: %(default)s)")
    p.add_argument("--request-rate", type=_positive_float, metavar="R",
                   help="send requests as a Poisson process of R requests/s (at most C in flight); "
                   "default: C requests back to back")
    p.add_argument("--seed", type=int, help="random seed of the prompts' order, random prompts and the Poisson "
                   "arrivals: the same seed sends the same requests at the same times on every sweep point")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="stream the answers, for time to first token and inter-token latency (default: on)")
    p.add_argument("--timeout", type=_positive_float, default=60.0, metavar="S",
                   help="seconds one request may take, connecting included (default: %(default)s)")
    p.add_argument("--prompt", help="one prompt for every request (default: the built-in set of "
                   f"{len(prompt_sets.BUILTIN)} varied prompts: chat, code, reasoning, summarising)")
    p.add_argument("--dataset", metavar="FILE", help="prompts from FILE: JSON Lines with \"prompt\" (text) or "
                   "\"messages\" (chat) per line, or a ShareGPT-style JSON array (\"conversations\" of from/value); "
                   "the first turn of each; exit 65 naming FILE:LINE if it is missing, empty or malformed")
    p.add_argument("--random-input-len", type=_positive_int, metavar="N", help="send random token ids, N per "
                   "prompt (no tokenizer needed): SGLang gets input_ids, /v1/completions a prompt of ids; "
                   "openai-chat cannot take them (exit 64)")
    p.add_argument("--random-output-len", type=_positive_int, metavar="M", help="generate M tokens per request "
                   "(instead of --max-tokens); with --random-range-ratio, a length drawn per request")
    p.add_argument("--random-range-ratio", type=_ratio, default=1.0, metavar="R", help="random lengths are "
                   "drawn from [max(1, N*R), N], as SGLang's bench_serving (default 1: exactly N)")
    p.add_argument("--temperature", type=_non_negative_float, default=0.0, metavar="T",
                   help="sampling temperature (default 0: greedy)")
    p.add_argument("--ignore-eos", action="store_true", help="ask the server to generate the full length even "
                   "past an end-of-sequence token (SGLang's and vLLM's ignore_eos)")
    p.add_argument("--target", metavar="NAME", help="genready target name, for the report (and --config)")
    p.add_argument("--label", metavar="TEXT", help="a name for this run, kept in the report and its JSON line")
    p.add_argument("--output", metavar="FILE", help="also append the result as one JSON line to FILE")
    return p


# The flags that mirror a target's settings are built from config's settings table (name, help,
# choices), and what they give is checked by config.parse as a target of the config is: one
# definition of each setting, of how a key file is read and of how a TLS context is built.
MIRRORED: Final = ("url", "api", "model", "api_key_file", "ca_file", "tls_verify", "client_cert_file",
                   "client_key_file")
FALLBACK: Final[Mapping[str, object]] = {"url": DEFAULT_URL}  # without --config, where a setting has no default
TLS_SETTINGS: Final = ("ca_file", "tls_verify", "client_cert_file", "client_key_file")
NOTES: Final[Mapping[str, str]] = {"url": "; the bench client itself speaks TCP only"}  # what differs here


def flag(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def add_target_flags(p: argparse.ArgumentParser) -> None:
    """--url, --api, --model, --api-key-file, --ca-file, --[no-]tls-verify, --client-cert-file,
    --client-key-file: each a target setting of config's table, defaulting to the --config target's."""
    table = {s.name: s for s in config.TARGET_SETTINGS}
    for name in MIRRORED:
        s = table[name]
        fallback = FALLBACK.get(name, s.default)
        if s.type is bool:
            p.add_argument(flag(name), action=argparse.BooleanOptionalAction, default=None,
                           help=f"{s.help}{NOTES.get(name, '')} (default: the --config target's, else "
                           f"{'on' if fallback else 'off'})")
            continue
        is_file = name.endswith("_file")
        else_ = f", else {fallback}" if fallback else ""
        p.add_argument(flag(name), default=None, choices=s.choices or None, metavar="FILE" if is_file else None,
                       type=os.path.abspath if is_file else str,  # a file named on the command line: from the cwd
                       help=f"{s.help}{NOTES.get(name, '')} (default: the --config target's{else_})")


def settings(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, ssl.SSLContext | None]:
    """The target the requests go to: --config's target (or each setting's default) with the mirrored
    flags given on top, checked as config.parse checks a target; args.url/api/model/target filled in.
    (API key, TLS context or None)."""
    name, table, where = "benchclient", {"unit": "benchclient.service", **FALLBACK}, "the bench client's flags"
    loaded: config.TargetConfig | None = None  # --config's target, as loaded: used as it is when no flag changes it
    if args.config:
        try:
            # A credential is checked by name here: only the target sent to needs its key (below).
            cfg = config.load(Path(args.config), service=False)
        except config.ConfigError as e:
            raise SystemExit(f"benchclient: {e}") from None
        found = args.target or env.get("GENREADY_TARGET") or (next(iter(cfg.targets)) if len(cfg.targets) == 1
                                                               else None)
        if found is None or found not in cfg.targets:
            raise SystemExit(f"benchclient: name a target of {args.config} with --target: {', '.join(cfg.targets)}")
        name, table, where = found, cfg.to_toml_dict()["targets"][found], f"{args.config} with the flags given"
        loaded = cfg.targets[found]
        args.target = name
    given = {n: getattr(args, n) for n in MIRRORED if getattr(args, n) is not None}
    if "api_key_file" in given:
        table["api_key_credential"] = ""  # the flag's key replaces the target's, however it gave one
    if "url" in given:  # another address: the target's transport settings went with its own url
        table["path_prefix"] = ""
        if not given["url"].startswith("https:"):
            table.update({s.name: s.default for s in config.TARGET_SETTINGS if s.name in TLS_SETTINGS})
    try:
        t = loaded if loaded is not None and not given else \
            config.parse({"targets": {name: {**table, **given}}}, where, service=False).targets[name]
    except config.ConfigError as e:
        setting = e.key.rpartition(".")[2]
        if setting in given:
            raise SystemExit(f"benchclient: {flag(setting)}: expected {e.expected}"
                             + (f", found {e.found}" if e.found else "")) from None
        raise SystemExit(f"benchclient: {e}") from None
    if t.unix_path is not None:
        raise SystemExit(f"benchclient: targets.{name} is served on a unix socket ({t.url}), which the bench "
                         "client does not speak: pass --url with a TCP address of the server")
    if t.credential_unchecked:
        raise SystemExit(f"benchclient: {args.config}: targets.{name}.api_key_credential = "
                         f"{t.api_key_credential!r}: only genready.service has $CREDENTIALS_DIRECTORY; "
                         "give the key with --api-key-file FILE (or run under LoadCredential=)")
    for w in t.warnings:
        print(f"benchclient: warning: {w}", file=sys.stderr)
    # The url as the config parsed it, and the TLS context it built (and checked).
    args.url, args.api, args.model = t.endpoint.base_url, t.api, t.model or None
    return t.api_key, t.tls_context


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env = os.environ
    api_key, ssl_context = settings(args, env)
    prompts = prompt_set(args)
    console.out(header(args, env))
    server = ServerOptions(args.url, args.api, args.model, api_key, ssl_context)
    load = LoadOptions(args.requests, args.concurrency, args.max_tokens, args.timeout, prompts, stream=args.stream,
                       request_rate=args.request_rate, seed=args.seed, temperature=args.temperature,
                       ignore_eos=args.ignore_eos)
    summary = asyncio.run(run(server, load, Progress(args.requests, sys.stderr)))
    console.write(format_summary(summary, env, stream=args.stream), sys.stdout)  # a closed stdout: --output still
    if args.output:
        try:
            with open(args.output, "a") as f:
                f.write(json.dumps(result_json(args, summary, env), sort_keys=True) + "\n")
        except OSError as e:
            print(f"benchclient: cannot write {args.output}: {e}", file=sys.stderr)
            return 1
    return 1 if summary.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
