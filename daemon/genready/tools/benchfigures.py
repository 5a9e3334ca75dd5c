"""The bench client's figures: one request's Outcome, the run's Summary, and where its accept length
comes from, decided in one place (Summary.accept).

What each server says per answer is its ServerKind's (servers/kinds.py): SGLang's
meta_info.spec_verify_ct, llama.cpp's timings.draft_n / draft_n_accepted. What its /metrics
counters give over the run is servermetrics' (read once before the run and once after).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from genready.apis import BadAnswer, ServerApi, too_large
from genready.servers import kinds
from genready.tools import servermetrics

# SGLang's OpenAI routes put a choice's meta_info (spec_verify_ct with it) into a non-streamed answer only when
# the request asks with return_meta_info, and refuse it on a stream (python/sglang/srt/entrypoints/openai/
# serving_chat.py and protocol.py). A stream's accept length is then the server's own average.
SGLANG_META_SOURCE: Final = "meta_info.spec_verify_ct (return_meta_info)"
SGLANG_SERVER_SOURCE: Final = "get_server_info avg_spec_accept_length (SGLang's recent average, not this run's alone)"






def count(v: Any, what: str) -> int | None:
    """A count in an answer: None when absent or not a positive integer; BadAnswer when it is an integer
    that cannot be a float (10**400): a malformed answer, whose figures would overflow the run's."""
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        return None
    if too_large(v):
        raise BadAnswer(f"{what} is an integer of {v.bit_length()} bits, too large to be a count")
    return v


class Drafts(NamedTuple):
    """One answer's speculative-decoding counts (each kind's draft_fields; llama.cpp's llama-server:
    `timings.draft_n`, tokens the draft model proposed, and `timings.draft_n_accepted`, how many of them
    the target model accepted).

    server_slot_stats::to_json (tools/server/server-common.cpp) sets both only when the slot drafted
    (n_draft_tokens > 0): absent, not 0, without speculative decoding. tools/server/server-task.cpp puts
    `timings` into the answer of /completion, /v1/completions and /v1/chat/completions, and when streaming
    into the final event (the last chunk; for chat with include_usage, the usage chunk)."""

    drafted: int
    accepted: int


def drafts_of(doc: Any) -> Drafts | None:
    """The Drafts of one answer (or stream event) as parsed JSON; None when it has none; BadAnswer when a
    count cannot be a float."""
    timings = doc.get("timings") if isinstance(doc, dict) else None
    if not isinstance(timings, dict):
        return None
    for drafted, accepted in kinds.draft_fields():
        n, acc = timings.get(drafted), timings.get(accepted)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, acc)):
            continue
        assert isinstance(n, int) and isinstance(acc, int)
        count(n, f"timings.{drafted}")
        if n > 0 and 0 <= acc <= n:
            return Drafts(n, acc)
    return None


def verify_ct(api: ServerApi, doc: Any) -> int | None:
    """SGLang's meta_info.spec_verify_ct in an answer (a stream's last event: it is cumulative); on its
    OpenAI routes, the first choice's meta_info (asked for with return_meta_info, non-streamed only).
    BadAnswer when it cannot be a float.

    SGLang sets it only when a speculative algorithm runs (python/sglang/srt/managers/tokenizer_manager.py)."""
    if api.needs_model and isinstance(doc, dict):
        choices = doc.get("choices")
        doc = choices[0] if isinstance(choices, list) and choices else {}
    meta = doc.get("meta_info") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        return None
    for name in kinds.verify_fields():
        if (v := count(meta.get(name), f"meta_info.{name}")) is not None:
            return v
    return None


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
    sent: float = 0.0  # seconds after the run's start it was sent (the run sets it; benchload's rates)
    arrival: float | None = None  # seconds after the start it was due (--request-rate); None: back to back
    late: float = 0.0  # seconds the client itself was behind the schedule when it was due (not a slot's wait)


@dataclass
class Summary:
    requests: int
    concurrency: int
    wall_seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    metrics_accept: float | None = None  # vLLM, llama.cpp: 1 + Δaccepted / Δdrafts over the run (/metrics)
    metrics_source: str | None = None  # which server's /metrics counters metrics_accept comes from
    server_accept_length: float | None = None  # SGLang: avg_spec_accept_length after the run
    stale_connections: int = 0  # pooled connections the server had closed, found before sending on them
    metrics_counts: dict[str, float] | None = None  # the /metrics counters' growth over the run
    new_connections: str = ""  # why later requests each went on a new connection ("": pooled ones were reused)
    sglang_openai: bool = False  # the OpenAI routes of an SGLang server (it answers GET /get_server_info)
    server_counters: servermetrics.RunCounters | None = None  # its /metrics counters over the run
    peak_concurrency: int = 0  # the most requests in flight at once
    duration: float | None = None  # --duration: requests were sent for this many seconds
    unsent: list[float] = field(default_factory=list)  # --duration: due times of arrivals never given a slot

    def accept(self) -> tuple[float | None, str | None]:
        """(accept length, where it came from); (None, None) without speculative decoding."""
        verified = [o for o in self.outcomes if o.ok and o.spec_verify_ct]
        if verified:
            steps = sum(o.spec_verify_ct or 0 for o in verified)
            return sum(o.tokens for o in verified) / steps, SGLANG_META_SOURCE if self.sglang_openai else \
                "meta_info.spec_verify_ct"
        if self.metrics_accept is not None:
            return self.metrics_accept, self.metrics_source
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

    def finished_after_duration(self) -> int | None:
        """Requests sent within --duration that were still in flight when it ended (finished, and counted)."""
        if self.duration is None:
            return None
        return sum(1 for o in self.outcomes if o.sent + o.seconds > self.duration)

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




def from_counters(summary: Summary, run: servermetrics.RunCounters) -> None:
    """The run's speculative-decoding figures from its /metrics counters (read once before, once after)."""
    summary.server_counters = run
    got = servermetrics.spec_of(run)
    if got is None:
        return
    kind, accepted, steps, drafted = got
    assert kind.spec is not None
    summary.metrics_accept = servermetrics.accept_length(accepted, steps)
    summary.metrics_source = kind.spec.source
    summary.metrics_counts = {"drafts": steps, "accepted": accepted}
    if drafted is not None:
        summary.metrics_counts["draft_tokens"] = drafted


def finite(v: Any) -> Any:
    """`v` with every float that is not finite made None: what is written is strict JSON (allow_nan=False)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [finite(x) for x in v]
    return v
