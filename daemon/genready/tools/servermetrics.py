"""The server's own counters over one run: its counter page before and after (read through its kind:
servers/metricspage.py), the deltas, and the figures derived from them.

A counter that went down between the two reads is a reset (the server restarted in between): no negative
delta, the run's derived figures are invalidated. A page that counts only since its last read (TensorRT-LLM's
iteration stats drain a queue) gives the run's figures by the read after it alone.

Derived where the server exports the counters (each ServerKind's names, from its source: servers/kinds.py):
the prefix-cache hit rate, hits / queries in tokens (llama.cpp's prompt_tokens exclude the cached
ones); the speculative-decoding accept length, 1 + Δaccepted / Δverify steps; the draft
acceptance Δaccepted / Δdraft tokens where the draft tokens are counted (alone where a page counts no
verify steps); and, where the server counts accepted tokens by draft position (vLLM's
_per_pos counter, one sample per `position` label), each position's Δaccepted / Δverify steps. A
counter is matched with and without `_total` (llama.cpp's names have been written both ways).

A counter that is not finite (`+Inf`, or label sets summing past 1.8e308) is treated as a reset:
no delta of it is a number, so the run's figures are invalid, and `reset` names it. What is
written of a run (`to_json`, through the sweep's json_text) is strict JSON: jq, JavaScript and Go refuse NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from genready.servers import kinds
from genready.servers.acceptance import AcceptanceRecord

METRICS_FILE: Final = "server_metrics.json"

# (server and its page's route, hit counter, its denominator, whether the denominator excludes the hits), per kind
# that counts them
HIT_RATES: Final = tuple((f"{k.name} {k.metrics.route}", kinds.total(h.hits), kinds.total(h.total),
                          h.total_excludes_hits)
                         for k in kinds.hit_rate_kinds() if (h := k.hit_rate) is not None)
# Counters with one sample per draft position, kept apart by their `position` label as well as summed
PER_POSITION: Final = frozenset(n for k in kinds.spec_kinds() if k.spec is not None and k.spec.per_pos
                                for n in (k.spec.per_pos, kinds.total(k.spec.per_pos)))


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
    accept_per_position: list[float] | None = None  # Δaccepted at draft position j / Δverify steps, j = 0, 1, …
    draft_acceptance_source: str | None = None  # where draft_acceptance came from (TensorRT-LLM: no accept length)
    acceptance: AcceptanceRecord | None = None  # the neutral record the figures above come from

    def to_json(self) -> dict[str, Any]:
        return {"counters": self.deltas, "reset": self.reset or None,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate, "prefix_cache_source": self.prefix_cache_source,
                "accept_length": self.accept_length, "draft_acceptance": self.draft_acceptance,
                "accept_length_source": self.accept_source, "accept_per_position": self.accept_per_position,
                "draft_acceptance_source": self.draft_acceptance_source}



def _rounded(v: float) -> float:
    return round(v, 4)


def over_run(before: Mapping[str, float], after: Mapping[str, float], *, cumulative: bool = True) -> RunCounters:
    """The deltas of the counters on both pages, and the derived figures (none after a reset, or after a
    counter that is not finite: the same, no figure of it can be trusted). A page that is not `cumulative`
    counts since its previous read: `after` is the run's, `before` only emptied it."""
    run = RunCounters()
    if not cumulative:
        before = {k: 0.0 for k in after}
    # A position's sample first seen after the run counted from 0: prometheus_client shows a label set only once
    # it is touched, and the run's first draft at a position may be what touched it.
    new = {k for k in set(after) - set(before) if k.endswith('"}') and k.split("{")[0] in PER_POSITION}
    before = {**before, **{k: 0.0 for k in new}}
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
                run.prefix_cache_hit_rate, run.prefix_cache_source = _rounded(h / t), f"{server} {hits}"
            break
    if (rec := kinds.acceptance_of(run.deltas)) is not None:
        run.acceptance = rec
        if (length := rec.accept_length()) is not None:
            run.accept_length, run.accept_source = _rounded(length), rec.steps_source
        if (share := rec.draft_acceptance()) is not None:
            run.draft_acceptance, run.draft_acceptance_source = _rounded(share), rec.drafted_source
        run.accept_per_position = [_rounded(r) for r in rec.position_rates()] or None
    return run
