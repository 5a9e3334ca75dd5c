"""The bench client's figures: one request's Outcome, the run's Summary, and where its accept length
comes from, decided in one place (Summary.accept).

What each server says per answer is its ServerKind's (servers/kinds.py): SGLang's
meta_info.spec_verify_ct, llama.cpp's timings.draft_n / draft_n_accepted, and every kind's
answer_spec, the counts of accepted drafts, drafts and verify steps under each spelling its
versions used (AnswerCounts). What its /metrics counters give over the run is servermetrics'
(read once before the run and once after).

Acceptance is measured two ways and reconciled (issue 38 §4): every figure is token-weighted, Σ
accepted over Σ steps (or Σ drafted) over the run's answers, never a mean of per-answer means; where
the answers and the counters both give a figure and they differ by more than DISAGREEMENT, the run
records both (Summary.disagreement); and a speculative server whose answers carry none of the known
keys is said once, by name (Summary.acceptance_missing), not left a silent null.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from genready.apis import BadAnswer, ServerApi, too_large
from genready.redact import escape
from genready.servers import acceptance, kinds
from genready.servers.acceptance import AcceptanceRecord
from genready.tools import answerfacts, servermetrics

# Two sources of one figure that differ by more than this (relative to the larger) disagree.
DISAGREEMENT: Final = 0.05
# The category of a dataset's prompts that name none, when others do
UNCATEGORISED: Final = "(none)"
# A histogram longer than this is no draft length any server runs: not counted.
MAX_HISTOGRAM: Final = 256
# An SSE event that may carry an answer's counts (each kind's answer_spec path's first key)
COUNT_KEYS: Final = tuple(f'"{p[0]}"'.encode() for k in kinds.answer_spec_kinds() if k.answer_spec
                          for p in k.answer_spec.paths if p[0] not in ("choices",))



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


class AnswerCounts(NamedTuple):
    """One answer's speculative-decoding counts, as its server spelled them (a kind's answer_spec)."""

    source: str  # where: the object's path, e.g. "metrics.speculative_decoding"
    spelling: kinds.Spelling
    accepted: int  # draft tokens accepted
    drafted: int | None  # draft tokens proposed, where the answer says
    steps: int | None  # verify steps, where the answer says
    histogram: tuple[int, ...] = ()  # verify steps by how many drafts each accepted


def _nonneg(v: Any, what: str) -> int | None:
    """A count that may be 0; None when absent or not a non-negative integer; BadAnswer when too large."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        return None
    if too_large(v):
        raise BadAnswer(f"{what} is an integer of {v.bit_length()} bits, too large to be a count")
    return v


def _histogram(v: Any, what: str) -> tuple[int, ...]:
    """A list of counts by accepted drafts, or a map from their number ("0", "1", ...) to counts; () if neither."""
    if isinstance(v, dict) and all(isinstance(k, str) and k.isdigit() and len(k) < 4 for k in v):
        v = [v.get(str(j), 0) for j in range(max((int(k) for k in v), default=-1) + 1)]
    if not isinstance(v, list) or len(v) > MAX_HISTOGRAM:
        return ()
    counts = [_nonneg(x, what) for x in v]
    return tuple(c for c in counts if c is not None) if all(c is not None for c in counts) else ()


def answer_counts(doc: Any) -> AnswerCounts | None:
    """The speculative-decoding counts in one answer (or stream event) as parsed JSON, under the first
    known spelling it has; None when it has none (or inconsistent ones: more accepted than drafted)."""
    for kind in kinds.answer_spec_kinds():
        spec = kind.answer_spec
        assert spec is not None
        for path in spec.paths:
            obj = answerfacts.at(doc, path)
            if not isinstance(obj, dict):
                continue
            where = ".".join(str(k) for k in path)
            for sp in spec.spellings:
                accepted = _nonneg(obj.get(sp.accepted), f"{where}.{sp.accepted}")
                if accepted is None:
                    continue
                drafted = _nonneg(obj.get(sp.drafted), f"{where}.{sp.drafted}") if sp.drafted else None
                steps = _nonneg(obj.get(sp.steps), f"{where}.{sp.steps}") if sp.steps else None
                if drafted is not None and accepted > drafted:
                    continue
                hist = _histogram(obj.get(sp.histogram), f"{where}.{sp.histogram}") if sp.histogram else ()
                return AnswerCounts(where, sp, accepted, drafted, steps, hist)
    return None


def carries_counts(event: bytes) -> bool:
    """Whether a stream's event may hold an answer's counts (worth parsing for answer_counts)."""
    return any(k in event for k in COUNT_KEYS)


class Totals(NamedTuple):
    """The run's per-answer counts summed: token-weighted figures are ratios of these sums."""

    source: str
    spelling: kinds.Spelling
    answers: int
    accepted_drafted: tuple[int, int] | None  # (Σ accepted, Σ drafted) over answers that say both
    accepted_steps: tuple[int, int] | None  # (Σ accepted, Σ steps) over answers that say both
    histogram: tuple[int, ...]


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    tokens: int = 0
    error: str = ""
    said: str = ""  # a refusal's answer in the server's words (apis.excerpt: one escaped line, bounded)
    ttft: float | None = None  # seconds to the first event with output (streaming only)
    itl: tuple[float, ...] = ()  # seconds between later events with output
    spec_verify_ct: int | None = None  # SGLang's verify steps for this request (speculative decoding only)
    drafts: Drafts | None = None  # llama.cpp's timings.draft_n / draft_n_accepted (only when it drafted)
    counts: AnswerCounts | None = None  # the answer's own speculative-decoding counts, any kind's spelling
    retried: bool = False  # sent again on a fresh connection: the pooled one was stale (see _stale_connection)
    sent: float = 0.0  # seconds after the run's start it was sent (the run sets it; benchload's rates)
    arrival: float | None = None  # seconds after the start it was due (--request-rate); None: back to back
    late: float = 0.0  # seconds the client itself was behind the schedule when it was due (not a slot's wait)
    category: str = ""  # its prompt's category (tools/prompts.py): the run's figures are also given per category
    turn: int = 0  # which turn of its conversation it was (0: the first; a multi-turn dataset's later turns 1, 2, …)
    answer: str = ""  # the answer's text, kept only while its conversation's next turn needs it (benchrun)
    input_tokens: int | None = None  # the prompt's tokens, as the answer counts them (tools/answerfacts.py)
    finish_reason: str | None = None
    token_ids: tuple[int, ...] | None = None  # its output ids, where asked for and returned (request lines only)


@dataclass
class Summary:
    requests: int
    concurrency: int
    wall_seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    metrics_accept: float | None = None  # vLLM, llama.cpp: 1 + Δaccepted / Δdrafts over the run (/metrics)
    metrics_source: str | None = None  # which server's /metrics counters metrics_accept comes from
    server_acceptance: AcceptanceRecord | None = None  # the kind's info route after the run (SGLang's average)
    stale_connections: int = 0  # pooled connections the server had closed, found before sending on them
    metrics_counts: dict[str, float] | None = None  # the /metrics counters' growth over the run
    new_connections: str = ""  # why later requests each went on a new connection ("": pooled ones were reused)
    kind: kinds.ServerKind | None = None  # the server's kind, resolved once per run (None: none known)
    own_api: bool = False  # the run speaks the kind's own wire format (kind.native_api), not its OpenAI routes
    server_counters: servermetrics.RunCounters | None = None  # its /metrics counters over the run
    peak_concurrency: int = 0  # the most requests in flight at once
    duration: float | None = None  # --duration: requests were sent for this many seconds
    unsent: list[float] = field(default_factory=list)  # --duration: due times of arrivals never given a slot
    metrics_kind: str | None = None  # the kind whose counters gave metrics_accept
    conversations: int = 0  # prompts started (a multi-turn one sends a request per turn)
    conversations_cut: int = 0  # multi-turn ones that stopped before their last turn (a failure, -n, --duration)

    def accept(self) -> tuple[float | None, str | None]:
        """(accept length, where it came from); (None, None) without speculative decoding. The answers'
        own counts come first (they are this run's alone), then /metrics, then SGLang's server average."""
        verified = [o for o in self.outcomes if o.ok and o.spec_verify_ct]
        if verified:
            steps = sum(o.spec_verify_ct or 0 for o in verified)
            kind = self.kind or self.kind_of_answers()
            own, openai = kind.verify_sources if kind is not None else ("", "")
            return sum(o.tokens for o in verified) / steps, (own if self.own_api else openai) or "verify steps"
        if (got := self.answers_accept()) is not None:
            return got
        if self.metrics_accept is not None:
            return self.metrics_accept, self.metrics_source
        # The server's own average only on the OpenAI routes: its own API's answers carry the run's counts.
        if not self.own_api and self.server_accept_length is not None and self.server_acceptance is not None:
            return self.server_accept_length, self.server_acceptance.steps_source
        return None, None

    @property
    def server_accept_length(self) -> float | None:
        """The engine's own average accept length from its info route (None: none read)."""
        return None if self.server_acceptance is None else self.server_acceptance.accept_length()

    def kind_of_answers(self) -> kinds.ServerKind | None:
        """The kind whose per-answer fields the run's answers carry, when no kind was known before the run."""
        if any(o.spec_verify_ct for o in self.outcomes):
            return next((k for k in kinds.KINDS if k.verify_field), None)
        if any(o.drafts for o in self.outcomes):
            return next((k for k in kinds.KINDS if k.draft_fields), None)
        return None

    def totals(self) -> Totals | None:
        """The per-answer counts of the run's successful answers, summed; None when no answer had any."""
        counted = [o.counts for o in self.outcomes if o.ok and o.counts is not None]
        if not counted:
            return None
        with_drafted = [(c.accepted, c.drafted) for c in counted if c.drafted is not None]
        with_steps = [(c.accepted, c.steps) for c in counted if c.steps is not None]
        width = max(len(c.histogram) for c in counted)
        hist = tuple(sum(c.histogram[j] for c in counted if j < len(c.histogram)) for j in range(width))
        return Totals(counted[-1].source, counted[-1].spelling, len(counted),
                      (sum(a for a, _ in with_drafted), sum(d for _, d in with_drafted)) if with_drafted else None,
                      (sum(a for a, _ in with_steps), sum(s for _, s in with_steps)) if with_steps else None, hist)

    def answers_accept(self) -> tuple[float, str] | None:
        """1 + Σ accepted / Σ verify steps over the answers that say both (vLLM's metrics.speculative_decoding);
        None without. Token-weighted: never the mean of the answers' mean_acceptance_length."""
        t = self.totals()
        if t is None or t.accepted_steps is None or t.accepted_steps[1] == 0:
            return None
        accepted, steps = t.accepted_steps
        return acceptance.accept_length(accepted, steps), \
            f"per answer: {t.source} {t.spelling.accepted} / {t.spelling.steps}"

    def drafts(self) -> Drafts | None:
        """The answers' draft counts summed over the run (llama.cpp's timings, vLLM's and SGLang's counts);
        None when no answer drafted."""
        t = self.totals()
        if t is not None and t.accepted_drafted is not None and t.accepted_drafted[1] > 0:
            return Drafts(t.accepted_drafted[1], t.accepted_drafted[0])
        counted = [o.drafts for o in self.outcomes if o.ok and o.drafts is not None]
        if not counted:
            return None
        return Drafts(sum(d.drafted for d in counted), sum(d.accepted for d in counted))

    def draft_acceptance(self) -> float | None:
        """Σ accepted / Σ drafted over the run's answers (the share of drafted tokens the target accepted);
        None when no answer drafted."""
        d = self.drafts()
        return d.accepted / d.drafted if d is not None else None

    def per_position(self) -> tuple[list[float] | None, str | None]:
        """(acceptance at draft position 0, 1, …, where it came from): from the answers' histograms (a step
        that accepted i drafts accepted positions 0 … i-1), else from the /metrics per-position counter."""
        t = self.totals()
        if t is not None and t.histogram and (steps := sum(t.histogram)) > 0:
            rates = [sum(t.histogram[j + 1:]) / steps for j in range(len(t.histogram) - 1)]
            return [round(r, 4) for r in rates], f"per answer: {t.source} {t.spelling.histogram}"
        run = self.server_counters
        if run is not None and run.accept_per_position:
            return run.accept_per_position, run.accept_source
        return None, None

    def disagreement(self) -> dict[str, dict[str, Any]] | None:
        """Each figure that both the answers and the /metrics counters give, and that differs between them by
        more than DISAGREEMENT: {figure: {per_answer, counters, their sources}}; None when they agree."""
        run, t = self.server_counters, self.totals()
        if run is None or t is None:
            return None
        out: dict[str, dict[str, Any]] = {}
        mine = self.answers_accept()
        pairs = [("accept_length", mine[0] if mine else None, mine[1] if mine else None,
                  run.accept_length, run.accept_source)]
        if t.accepted_drafted is not None and t.accepted_drafted[1] > 0:
            pairs.append(("draft_acceptance", t.accepted_drafted[0] / t.accepted_drafted[1],
                          f"per answer: {t.source} {t.spelling.accepted} / {t.spelling.drafted}",
                          run.draft_acceptance, run.draft_acceptance_source))
        for figure, a, a_source, c, c_source in pairs:
            if a is not None and c is not None and abs(a - c) > DISAGREEMENT * max(abs(a), abs(c)):
                out[figure] = {"per_answer": round(a, 4), "counters": round(c, 4),
                               "per_answer_source": a_source, "counters_source": c_source}
        return out or None

    def speculative(self) -> bool:
        """Whether anything of the run says the server decodes speculatively."""
        return (any(o.ok and (o.spec_verify_ct or o.drafts) for o in self.outcomes)
                or self.metrics_accept is not None
                or (self.server_accept_length is not None and self.server_accept_length > 1))

    def acceptance_missing(self) -> str | None:
        """The words for a speculative server whose answers carry none of its kind's known acceptance keys
        (renamed by a new version, or not switched on); None when they carry them, or it is not speculative."""
        if not self.speculative() or self.totals() is not None or not self.ok:
            return None
        kind = self.kind or (kinds.BY_NAME.get(self.metrics_kind or "") if not any(
            o.spec_verify_ct for o in self.outcomes) else None) or self.kind_of_answers()
        if kind is None or kind.answer_spec is None:
            return None
        spec = kind.answer_spec
        where = " / ".join(".".join(str(k) for k in p) for p in spec.paths)
        return (f"no per-request acceptance: the server answers none of {where} "
                f"{', '.join(spec.names())} ({kind.label}); upgrade, or {spec.fix}")

    def acceptance_fields(self) -> dict[str, Any]:
        """What the run's results line says of acceptance beyond accept_length: per position, the sources'
        disagreement, the words for missing per-answer counts."""
        per_pos, per_pos_source = self.per_position()
        mine = self.answers_accept()
        return {"accept_per_position": per_pos, "accept_per_position_source": per_pos_source,
                "accept_disagreement": self.disagreement(), "accept_missing": self.acceptance_missing(),
                "answers_accept_length": round(mine[0], 4) if mine else None}

    def acceptance_lines(self) -> list[str]:
        """The lines of the text summary for acceptance beyond the accept length."""
        lines = []
        per_pos, source = self.per_position()
        if per_pos:
            lines.append(f"  accept     by position {', '.join(f'{r:.3f}' for r in per_pos)} ({source})")
        for figure, d in (self.disagreement() or {}).items():
            lines.append(f"  accept     DISAGREE {figure}: {d['per_answer']} per answer ({d['per_answer_source']}) "
                         f"vs {d['counters']} from /metrics ({d['counters_source']})")
        if (missing := self.acceptance_missing()) is not None:
            lines.append(f"  accept     {missing}")
        return lines

    def categories(self) -> dict[str, dict[str, Any]] | None:
        """The figures per prompt category, from the answers alone (a server's /metrics and averages cannot be
        split by prompt): requests, output tokens, accept length and draft acceptance token-weighted as the
        run's (accept, draft_acceptance), and output tok/s as Σ tokens / Σ request seconds (the categories'
        requests share the run's wall time, so each request's own speed is what compares them). None when no
        prompt has a category; prompts without one are counted under UNCATEGORISED."""
        if not any(o.category for o in self.outcomes):
            return None
        out: dict[str, dict[str, Any]] = {}
        for name in sorted({o.category or UNCATEGORISED for o in self.outcomes}):
            part = Summary(0, self.concurrency, kind=self.kind, own_api=self.own_api,
                           outcomes=[o for o in self.outcomes if (o.category or UNCATEGORISED) == name])
            length, source = part.accept()
            acceptance = part.draft_acceptance()
            seconds = sum(o.seconds for o in part.outcomes if o.ok)
            out[name] = {"requests": len(part.outcomes), "ok": part.ok, "output_tokens": part.tokens,
                         "output_tokens_per_second": round(part.tokens / seconds, 3) if seconds > 0 else None,
                         "accept_length": None if length is None else round(length, 4),
                         "accept_length_source": source,
                         "draft_acceptance": None if acceptance is None else round(acceptance, 4)}
        return out

    def category_lines(self) -> list[str]:
        """The text summary's lines per category (none without categories)."""
        lines = []
        for name, c in (self.categories() or {}).items():
            accept = "-" if c["accept_length"] is None else f"{c['accept_length']:.2f}"
            drafts = "" if c["draft_acceptance"] is None else f", draft acceptance {c['draft_acceptance']:.3f}"
            speed = "-" if c["output_tokens_per_second"] is None else f"{c['output_tokens_per_second']:.1f}"
            lines.append(f"  category   {escape(name)}: {c['requests']} requests, accept length {accept}{drafts}, "
                         f"{speed} output tok/s per request")
        return lines

    def later_turns(self) -> int:
        """Requests that were a later turn of a multi-turn prompt."""
        return sum(1 for o in self.outcomes if o.turn > 0)

    def turns_line(self) -> list[str]:
        """The text summary's `turns` line, when any later turn was sent or cut (none for single-turn prompts)."""
        if not self.later_turns() and not self.conversations_cut:
            return []
        return [f"  turns      {self.conversations} conversations, {self.later_turns()} later turns sent with the "
                f"earlier answers, {self.conversations_cut} conversations cut short"]

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

    def error_words(self) -> dict[str, str]:
        """Each failure kind's first answer in the server's words, where it gave one: `HTTP 400` alone does not
        say that the prompt exceeds the context (llama-server's answer does)."""
        words: dict[str, str] = {}
        for o in self.outcomes:
            if not o.ok and o.said and o.error not in words:
                words[o.error] = o.said
        return words

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


def failures_text(errors: Mapping[str, int], words: Mapping[str, str], most: int = 3, chars: int = 120) -> str:
    """The commonest failure kinds, each with its first answer in the server's words where it gave one:
    `3x HTTP 400: {"error": …}, 1x timeout (30 s)`, and `, …` when there are more kinds. Escaped, each answer cut
    at `chars`: the bench client's summary and the sweep's line for a run (read from a bench line) say it alike."""
    return ", ".join(f"{n}x {escape(e)}" + (f": {escape(words[e][:chars])}" if e in words else "")
                     for e, n in Counter(errors).most_common(most)) + (", …" if len(errors) > most else "")


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (no interpolation: every reported figure was measured)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def from_counters(summary: Summary, run: servermetrics.RunCounters) -> None:
    """The run's speculative-decoding figures from its counters (read once before, once after): the neutral
    record the kind's adapter made of them, when it has verify steps (an accept length)."""
    summary.server_counters = run
    rec = run.acceptance
    if rec is None or rec.accepted is None or not rec.steps:
        return
    summary.metrics_accept = rec.accept_length()
    summary.metrics_source = rec.label
    summary.metrics_kind = rec.kind
    summary.metrics_counts = {"drafts": rec.steps, "accepted": rec.accepted}
    if rec.drafted is not None:
        summary.metrics_counts["draft_tokens"] = rec.drafted


def finite(v: Any) -> Any:
    """`v` with every float that is not finite made None: what is written is strict JSON (allow_nan=False)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [finite(x) for x in v]
    return v
