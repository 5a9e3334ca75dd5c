"""The bench client's `--output` line, one definition per field (issue 49 §3).

Each `Field` is the one place a field of the line is named: its key, the title a report shows it under, its unit,
which way is better and the digits a report gives it (ai-dynamo/aiperf's metric classes: one definition gives the
key, the header, the unit and the direction). The writer (benchclient.result_json) keys its values by these
fields and `line()` turns them into the JSON object; the sweep's readers (sweep/rows.py, sweep/search.py,
sweep/report/*) look a value up by `FIELD.key`, so a field renamed here is renamed for both sides at once
(tests/test_benchline.py fails on a key spelled again in a reader, and on a key written but not defined here).

A leaf: it imports nothing of genready, so the bench client (tools/) and the sweep's run and report sides can
all import it. Old names (`OLD_NAMES`) are still written, as copies of their new field's value, for one release
(docs/benchclient.md, "Old names").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class Field:
    """One field of the bench line. `title`, `unit`, `higher_is_better` and `digits` are for a figure a report
    shows (None for a field that describes the run or is no number, or a figure neither side of which is
    better: the concurrency, a hit rate)."""

    key: str
    title: str = ""
    unit: str = ""
    higher_is_better: bool | None = None
    digits: int | None = None


# --- what was run -------------------------------------------------------------------------------------------------
TIME: Final = Field("time", unit="s")  # the Unix time the line was made
LABEL: Final = Field("label")
TARGET: Final = Field("target")
URL: Final = Field("url")
API: Final = Field("api")
REQUESTS: Final = Field("requests", "REQUESTS", "requests")  # sent (per category: in the category)
CONCURRENCY: Final = Field("concurrency", "CONC", "requests", digits=0)  # -c
REQUEST_RATE: Final = Field("request_rate", unit="req/s")  # --request-rate, None: a closed loop
STREAM: Final = Field("stream")
MAX_TOKENS: Final = Field("max_tokens", unit="tokens")
PROMPTS: Final = Field("prompts")  # where the prompts came from
TEMPERATURE: Final = Field("temperature")
IGNORE_EOS: Final = Field("ignore_eos")
SEED: Final = Field("seed")
SERVED_BY: Final = Field("served_by")  # the PID and InvocationID a guard or sweep verified
SWEEP_POINT: Final = Field("sweep_point")
REQUEST_LINES: Final = Field("request_lines")  # lines written to the request lines' file (None: none written)

# --- how the requests went ----------------------------------------------------------------------------------------
OK: Final = Field("ok", unit="requests")
FAILED: Final = Field("failed", unit="requests")
ERRORS: Final = Field("errors")  # failed requests by reason
ERROR_WORDS: Final = Field("error_words")  # each reason's first answer, in the server's words (escaped, bounded)
EMPTY: Final = Field("empty", unit="requests")
RETRIED: Final = Field("retried", unit="requests")
STALE_CONNECTIONS: Final = Field("stale_connections")
NEW_CONNECTIONS: Final = Field("new_connections")
CONVERSATIONS: Final = Field("conversations")
LATER_TURNS: Final = Field("later_turns")
CONVERSATIONS_CUT: Final = Field("conversations_cut")

# --- throughput and latency ---------------------------------------------------------------------------------------
WALL_SECONDS: Final = Field("wall_seconds", unit="s")
REQUESTS_PER_SECOND: Final = Field("requests_per_second", "req/s", "req/s", True, 3)
OUTPUT_TOKENS: Final = Field("output_tokens", unit="tokens")
OUTPUT_TOKENS_PER_SECOND: Final = Field("output_tokens_per_second", "OUT tok/s", "tok/s", True, 1)
E2E_P50_MS: Final = Field("e2e_p50_ms", "E2E p50 ms", "ms", False, 1)
E2E_P99_MS: Final = Field("e2e_p99_ms", "E2E p99 ms", "ms", False, 1)
TTFT_P50_MS: Final = Field("ttft_p50_ms", "TTFT p50 ms", "ms", False, 1)
TTFT_P99_MS: Final = Field("ttft_p99_ms", "TTFT p99 ms", "ms", False, 1)
ITL_P50_MS: Final = Field("itl_p50_ms", "ITL p50 ms", "ms", False, 2)
ITL_P99_MS: Final = Field("itl_p99_ms", "ITL p99 ms", "ms", False, 2)

# --- speculative decoding (benchfigures.Summary decides the accept length and its source) -------------------------
ACCEPT_LENGTH: Final = Field("accept_length", "ACCEPT", "tokens", True, 2)
ACCEPT_LENGTH_SOURCE: Final = Field("accept_length_source")
SERVER_ACCEPT_LENGTH: Final = Field("server_accept_length", unit="tokens")
# llama.cpp's llama-server: Σ timings.draft_n_accepted / Σ timings.draft_n over the point's answers.
DRAFT_ACCEPTANCE: Final = Field("draft_acceptance", "DRAFT ACC", "", True, 3)
DRAFT_TOKENS: Final = Field("draft_tokens", unit="tokens")
DRAFT_ACCEPTED: Final = Field("draft_accepted", unit="tokens")
SPEC_DECODE_COUNTERS: Final = Field("spec_decode_counters")
COUNTERS_ACCEPT_LENGTH: Final = Field("counters_accept_length", unit="tokens")
ACCEPT_PER_POSITION: Final = Field("accept_per_position")  # the acceptance at draft position 0, 1, ...
ACCEPT_PER_POSITION_SOURCE: Final = Field("accept_per_position_source")
ACCEPT_DISAGREEMENT: Final = Field("accept_disagreement")
ACCEPT_MISSING: Final = Field("accept_missing")
ANSWERS_ACCEPT_LENGTH: Final = Field("answers_accept_length", unit="tokens")
CATEGORIES: Final = Field("categories")  # per prompt category: REQUESTS, OK, OUTPUT_TOKENS, ... (CATEGORY_FIELDS)

# --- the server's own counters (servermetrics.py) -----------------------------------------------------------------
# The server's prefix-cache hit rate over the run: near 0 after a flush; it describes the run, so neither way is
# better.
PREFIX_CACHE_HIT_RATE: Final = Field("prefix_cache_hit_rate", "PREFIX HIT", "", None, 3)
PREFIX_CACHE_SOURCE: Final = Field("prefix_cache_source")

# --- load and the latency target (benchload.py) -------------------------------------------------------------------
BURSTINESS: Final = Field("burstiness")
DURATION: Final = Field("duration", unit="s")
FINISHED_AFTER_DURATION: Final = Field("finished_after_duration", unit="requests")
UNSENT_AT_DURATION: Final = Field("unsent_at_duration", unit="requests")
OFFERED_RATE: Final = Field("offered_rate", unit="req/s")
SCHEDULED_RATE: Final = Field("scheduled_rate", unit="req/s")
ACHIEVED_RATE: Final = Field("achieved_rate", "achieved req/s", "req/s", True, 3)
PEAK_CONCURRENCY: Final = Field("peak_concurrency", unit="requests")
SATURATED: Final = Field("saturated")
SATURATION: Final = Field("saturation")  # the reasons it saturated
TTFT_TREND: Final = Field("ttft_trend")
CLIENT_LAG_P99_MS: Final = Field("client_lag_p99_ms", unit="ms")
ARRIVAL_WAIT_P99_MS: Final = Field("arrival_wait_p99_ms", unit="ms")
SLO: Final = Field("slo")  # --slo as written: {"ttft_p99_ms": 500, ...}
SLO_MET: Final = Field("slo_met")
SLO_ATTAINMENT: Final = Field("slo_attainment")
GOODPUT: Final = Field("goodput", "goodput req/s (met the SLO)", "req/s", True, 3)
GOOD_REQUESTS: Final = Field("good_requests", unit="requests")
SLO_PARTS: Final = Field("slo_parts")

# --- old names, written for one release as copies of their new field (docs/benchclient.md) ------------------------
TOKENS_PER_SECOND: Final = Field("tokens_per_second", unit="tok/s")
LATENCY_P50_MS: Final = Field("latency_p50_ms", unit="ms")
LATENCY_P99_MS: Final = Field("latency_p99_ms", unit="ms")
OLD_NAMES: Final = {TOKENS_PER_SECOND: OUTPUT_TOKENS_PER_SECOND, LATENCY_P50_MS: E2E_P50_MS,
                    LATENCY_P99_MS: E2E_P99_MS}

FIELDS: Final = tuple(v for v in dict(globals()).values() if isinstance(v, Field))  # every field above, in order
BY_KEY: Final = {f.key: f for f in FIELDS}

# The figures of each category under CATEGORIES (benchfigures.Summary.categories writes them).
CATEGORY_FIELDS: Final = (REQUESTS, OK, OUTPUT_TOKENS, OUTPUT_TOKENS_PER_SECOND, ACCEPT_LENGTH, ACCEPT_LENGTH_SOURCE,
                          DRAFT_ACCEPTANCE)
# The latencies an `--slo` part may name (METRIC_pNN_ms), by key: what sweep/report/decision.py judges a point by.
LATENCIES: Final = (TTFT_P50_MS, TTFT_P99_MS, ITL_P50_MS, ITL_P99_MS, E2E_P50_MS, E2E_P99_MS)


def line(values: Mapping[Field, Any], *parts: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object of a bench line: `values` by their fields' keys, each old name with its new field's value,
    and `parts` (the figures benchfigures.Summary gives already keyed: their keys are fields here too)."""
    out = {f.key: v for f, v in values.items()}
    out.update({old.key: values[new] for old, new in OLD_NAMES.items() if new in values})
    for part in parts:
        out.update(part)
    return out
