"""The server's own counters over one run: its Prometheus /metrics page before and after, the deltas,
and the figures derived from them.

The page is parsed with prometheus_client's parser, not by hand. Only counters count, summed over
their label sets (vLLM's engines, SGLang's ranks), and never their `_created` series: those are
timestamps, which prometheus_client's text exposition writes as a gauge `NAME_created` next to
every counter (and OpenMetrics inside the counter's family), and which sum into nonsense. A counter
that went down between the two reads is a reset (the server restarted in between): no negative
delta, the run's derived figures are invalidated.

Derived where the server exports the counters (each ServerKind's names, from its source: servers/kinds.py):
the prefix-cache hit rate, hits / queries in tokens (llama.cpp's prompt_tokens exclude the cached
ones); the speculative-decoding accept length, 1 + Δaccepted / Δverify steps; and the draft
acceptance Δaccepted / Δdraft tokens where the draft tokens are counted.

A counter that is not finite (`+Inf`, or label sets summing past 1.8e308) is treated as a reset:
no delta of it is a number, so the run's figures are invalid, and `reset` names it. What is
written of a run (to_text) is strict JSON (allow_nan=False): jq, JavaScript and Go refuse NaN.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from genready.servers import kinds

METRICS_FILE: Final = "server_metrics.json"

# (server, hit counter, its denominator, whether the denominator excludes the hits), per kind that counts them
HIT_RATES: Final = tuple((k.name, kinds.total(h.hits), kinds.total(h.total), h.total_excludes_hits)
                         for k in kinds.hit_rate_kinds() if (h := k.hit_rate) is not None)
# (server, accepted tokens, verify steps, draft tokens or ""), per kind that counts them
SPEC: Final = tuple((k.name, kinds.total(m.accepted), kinds.total(m.steps),
                     kinds.total(m.draft_tokens) if m.draft_tokens else "")
                    for k in kinds.spec_kinds() if (m := k.spec) is not None)


class NotMetrics(ValueError):
    """The page is not Prometheus text."""


def counters(text: str) -> dict[str, float]:
    """Every counter sample of a /metrics page, summed over label sets, by sample name; `_created` left
    out. A sample without a TYPE line counts when its name ends in `_total`, the counters' naming rule.
    NotMetrics if prometheus_client cannot parse the page."""
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
    except (ValueError, TypeError, IndexError) as e:
        raise NotMetrics(f"not Prometheus text: {e}") from None
    return out


@dataclass
class RunCounters:
    """A run's counter deltas and what they give."""

    deltas: dict[str, float] = field(default_factory=dict)
    reset: list[str] = field(default_factory=list)  # counters that went down: the server restarted
    prefix_cache_hit_rate: float | None = None
    prefix_cache_source: str | None = None
    accept_length: float | None = None
    draft_acceptance: float | None = None
    accept_source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"counters": self.deltas, "reset": self.reset or None,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate, "prefix_cache_source": self.prefix_cache_source,
                "accept_length": self.accept_length, "draft_acceptance": self.draft_acceptance,
                "accept_length_source": self.accept_source}

    def to_text(self) -> str:
        """The run as strict JSON (never NaN or Infinity: over_run keeps no non-finite number)."""
        return json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n"


def _rounded(v: float) -> float:
    return round(v, 4)


def over_run(before: Mapping[str, float], after: Mapping[str, float]) -> RunCounters:
    """The deltas of the counters on both pages, and the derived figures (none after a reset, or after a
    counter that is not finite: the same, no figure of it can be trusted)."""
    run = RunCounters()
    for name in sorted(set(before) & set(after)):
        d = after[name] - before[name]
        if not math.isfinite(d) or d < 0:
            run.reset.append(name)
        else:
            run.deltas[name] = d
    if run.reset:
        return run  # a restart in between: the counters of two processes, no figure
    for server, hits, total, excludes in HIT_RATES:
        if hits in run.deltas and total in run.deltas:
            h, t = run.deltas[hits], run.deltas[total]
            t = t + h if excludes else t
            if t > 0:
                run.prefix_cache_hit_rate, run.prefix_cache_source = _rounded(h / t), f"{server} /metrics {hits}"
            break
    if (got := spec_of(run)) is not None:
        kind, accepted, steps, drafted = got
        assert kind.spec is not None
        run.accept_length = _rounded(accept_length(accepted, steps))
        if drafted:
            run.draft_acceptance = _rounded(accepted / drafted)
        run.accept_source = f"{kind.name} /metrics {kinds.total(kind.spec.accepted)} / {kinds.total(kind.spec.steps)}"
    return run


def accept_length(accepted: float, steps: float) -> float:
    """Tokens per verify step of the large model: each step gives its accepted draft tokens plus one of its own
    (vLLM's "mean acceptance length"); the bench client and the sweep both take it from here."""
    return 1 + accepted / steps


def spec_of(run: RunCounters) -> tuple[kinds.ServerKind, float, float, float | None] | None:
    """(the kind, Δaccepted, Δverify steps, Δdraft tokens or None) of the first kind whose speculative-decoding
    counters grew over the run; None without (or after a reset). The accept length is 1 + Δaccepted / Δsteps."""
    if run.reset:
        return None
    for kind in kinds.spec_kinds():
        assert kind.spec is not None
        accepted, steps = kinds.total(kind.spec.accepted), kinds.total(kind.spec.steps)
        drafted = kinds.total(kind.spec.draft_tokens) if kind.spec.draft_tokens else ""
        if run.deltas.get(steps, 0) > 0 and accepted in run.deltas:
            return kind, run.deltas[accepted], run.deltas[steps], run.deltas.get(drafted) if drafted else None
    return None
