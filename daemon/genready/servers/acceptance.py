"""One neutral record of speculative decoding's acceptance, whatever the engine reported it by.

ai-dynamo/aiperf's SpecDecodeAcceptanceRecord is the model (src/aiperf/metrics/types/spec_decode_metrics.py:
its metrics "read only the engine-neutral record produced by an engine adapter and never branch on the
serving engine"). Each kind's adapter makes one: its counter page's deltas over a run
(ServerKind.acceptance, kinds.acceptance_of: vLLM's, llama.cpp's and TensorRT-LLM's counters under their
own names), or its info route's own average (ServerKind.info_acceptance: SGLang's avg_spec_accept_length).
The figures are the record's: the accept length 1 + accepted / verify steps (each step gives its accepted
drafts plus one token of the target's own), the draft acceptance accepted / drafted, each position's
accepted / steps.
"""

from __future__ import annotations

from dataclasses import dataclass


def accept_length(accepted: float, steps: float) -> float:
    """Tokens per verify step of the large model: each step gives its accepted draft tokens plus one of its own
    (vLLM's "mean acceptance length"); every reader of acceptance takes it from here."""
    return 1 + accepted / steps


@dataclass(frozen=True)
class AcceptanceRecord:
    """A run's acceptance in no engine's words; where a count is unknown it is None (TensorRT-LLM as Dynamo
    re-exports it counts no verify steps: a draft acceptance, no accept length)."""

    kind: str  # the kind whose adapter made it
    accepted: float | None = None  # draft tokens the target model accepted
    steps: float | None = None  # verify steps of the target model
    drafted: float | None = None  # draft tokens proposed
    per_position: tuple[float, ...] = ()  # accepted draft tokens at draft position 0, 1, …
    average: float | None = None  # the engine's own average accept length, where it gives no counts
    steps_source: str = ""  # where accepted / steps (or the average) come from, for people
    drafted_source: str = ""  # where accepted / drafted come from
    label: str = ""  # the kind's short name for the source (the bench client's accept_length_source)

    def accept_length(self) -> float | None:
        if self.accepted is not None and self.steps:
            return accept_length(self.accepted, self.steps)
        return self.average

    def draft_acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.accepted is not None and self.drafted else None

    def position_rates(self) -> list[float]:
        """Each draft position's accepted / steps ([] without the per-position counts or the steps)."""
        return [v / self.steps for v in self.per_position] if self.steps else []
