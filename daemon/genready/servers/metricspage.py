"""A server's counter page: which route serves it, how its body becomes counters, and whether they count
since the start or since the last read. Each ServerKind holds one (`ServerKind.metrics`); the bench client
and the sweep read the page through the kind and never name a route or a format themselves.

The Prometheus text reader is prometheus_client's parser, not one by hand. Only counters count, summed over
their label sets (vLLM's engines, SGLang's ranks), and never their `_created` series: those are timestamps,
which prometheus_client's text exposition writes as a gauge `NAME_created` next to every counter (and
OpenMetrics inside the counter's family), and which sum into nonsense. A sample labelled with a draft
`position` (vLLM's accepted tokens per position) is also kept under its position's key (position_key).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

POSITION_LABEL: Final = "position"


class NotMetrics(ValueError):
    """The page is not in the format its reader reads."""


def position_key(sample: str, position: int) -> str:
    """The key of one draft position's sample among a page's counters."""
    return f'{sample}{{{POSITION_LABEL}="{position}"}}'


def counters(text: str) -> dict[str, float]:
    """Every counter sample of a Prometheus text page, summed over label sets, by sample name; `_created` left
    out. A sample without a TYPE line counts when its name ends in `_total`, the counters' naming rule.
    NotMetrics if prometheus_client cannot parse the page, or when it is JSON (prometheus_client would read
    some JSON as samples)."""
    if text.lstrip()[:1] in ("[", "{"):
        raise NotMetrics("not Prometheus text: a JSON document")
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.type not in ("counter", "unknown", "untyped"):
                continue
            for s in family.samples:
                if s.name.endswith("_created") or not isinstance(s.value, int | float) or math.isnan(s.value):
                    continue
                if family.type != "counter" and not s.name.endswith("_total"):
                    continue
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
                if (pos := s.labels.get(POSITION_LABEL, "")).isdigit():
                    key = position_key(s.name, int(pos))
                    out[key] = out.get(key, 0.0) + float(s.value)
    except (ValueError, TypeError, IndexError) as e:
        raise NotMetrics(f"not Prometheus text: {e}") from None
    return out


def prometheus(body: bytes) -> dict[str, float]:
    return counters(body.decode("utf-8", "replace"))


@dataclass(frozen=True)
class Reading:
    """One read of a counter page: its counters, and whether they count since the server started (a run's
    figures are after - before) or only since the previous read (the page drains a queue: the run's figures
    are what the read after it returns, and the read before it only empties the queue)."""

    values: dict[str, float]
    cumulative: bool = True


@dataclass(frozen=True)
class MetricsPage:
    """Where a kind's counters are, and how to read them."""

    route: str
    read: Callable[[bytes], dict[str, float]]  # NotMetrics when the body is not this format
    cumulative: bool = True
    label: str = "Prometheus text"  # the format, for people

    def reading(self, body: bytes) -> Reading:
        return Reading(self.read(body), self.cumulative)


PROMETHEUS: Final = MetricsPage("/metrics", prometheus)


# TensorRT-LLM's GET /metrics (tensorrt_llm/serve/openai_server.py, get_iteration_stats): a JSON list of the
# iteration stats collected since the previous read (`llm.get_stats_async` drains the executor's queue), filled
# only with `enable_iter_perf_stats: true` among the LLM-API options (docs/source/commands/trtllm-serve.rst);
# each row's specDecodingStats holds numDraftTokens, numAcceptedTokens and numRequestsWithDraftTokens, the
# requests that drafted in that iteration: one verify step each (cpp/include/tensorrt_llm/executor/types.h,
# SpecDecodingStats; its acceptanceLength is (accepted + requests) / requests). Summed over the rows into
# counters under the trtllm_spec_decode_ prefix Dynamo's TensorRT-LLM backend uses for its re-export.
ITERATIONS: Final = "trtllm_iterations_total"
ITERATION_SPEC: Final = (("numAcceptedTokens", "trtllm_spec_decode_num_accepted_tokens_total"),
                         ("numDraftTokens", "trtllm_spec_decode_num_draft_tokens_total"),
                         ("numRequestsWithDraftTokens", "trtllm_spec_decode_num_requests_with_draft_tokens_total"))


def iteration_stats(body: bytes) -> dict[str, float]:
    """TensorRT-LLM's iteration stats as counters over the rows of one read; NotMetrics when the body is no JSON
    list. A field that is not a finite count is left out of its sum (never NaN in the results)."""
    try:
        rows = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise NotMetrics(f"not iteration stats: {str(e)[:80]}") from None
    if not isinstance(rows, list):
        raise NotMetrics("not iteration stats: not a JSON list")
    out = {ITERATIONS: 0.0, **{name: 0.0 for _, name in ITERATION_SPEC}}
    for row in rows:
        if not isinstance(row, dict):
            continue
        out[ITERATIONS] += 1
        spec = row.get("specDecodingStats")
        if not isinstance(spec, dict):
            continue
        for key, name in ITERATION_SPEC:
            v = spec.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1e300:
                out[name] += float(v)
    return out


ITERATION_STATS: Final = MetricsPage("/metrics", iteration_stats, cumulative=False, label="JSON iteration stats")
