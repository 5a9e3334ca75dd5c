"""The simulator's speculative decoding (`--spec-accept X`): what each server says of it, per answer under
each version's spelling and on /metrics, from one deterministic model of the verify steps.

A generation of T tokens at accept length X takes S = ceil(T / X) verify steps, each proposing K =
ceil(X) draft tokens; the A = T - S accepted drafts are spread over the steps as evenly as they go
(the first A mod S steps accept one more). So every source the simulator answers (SGLang's meta_info
in each spelling, vLLM's metrics.speculative_decoding, vLLM's /metrics counters and their
per-position samples) tells the same story, unless `--spec-metrics-accept Y` makes /metrics count
accept length Y instead: two sources that disagree, as vLLM and SpecForge did (vLLM issue #42508).
`--spec-accept-category coding=3.6,writing=1.8` gives the bench client's built-in prompts of those categories
their own accept length (code and arithmetic are drafted right more often than prose, as Spec-Bench found).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Final

from genready.servers import kinds

# --sglang-version: the spelling of SGLang's per-request counts (kinds.SGLANG.answer_spec's spellings, newest
# first), by the first release that used it. Older releases use the last one.
SGLANG_SPELLINGS: Final = ((0, 5, 12), (0, 5, 11), (0, 0, 0))
SGLANG_DEFAULT_VERSION: Final = "0.5.12"
# vLLM's --per-request-spec-decode-metrics values: "detailed" adds the histogram
PER_REQUEST_MODES: Final = ("none", "summary", "detailed")


def version(s: str) -> tuple[int, int, int]:
    """A version "A.B.C" (or "A.B") as a tuple; ValueError otherwise."""
    parts = s.split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"a version such as 0.5.12, not {s!r}")
    a, b, c = (int(p) for p in (*parts, "0")[:3])
    return a, b, c


def sglang_spelling(v: tuple[int, int, int]) -> kinds.Spelling:
    """The spelling an SGLang of version `v` answers."""
    spec = kinds.SGLANG.answer_spec
    assert spec is not None
    i = next(i for i, since in enumerate(SGLANG_SPELLINGS) if v >= since)
    return spec.spellings[i]


def accepted_per_step(tokens: int, x: float) -> list[int]:
    """Each verify step's accepted drafts for `tokens` output tokens at accept length `x` (the model above)."""
    steps = math.ceil(tokens / x) if tokens else 0
    if not steps:
        return []
    accepted = tokens - steps  # each step's own token is not an accepted draft
    return [accepted // steps + (1 if i < accepted % steps else 0) for i in range(steps)]


def drafts_per_step(x: float) -> int:
    """K, the draft tokens each step proposes (num_speculative_tokens)."""
    return max(1, math.ceil(x))


def histogram(per_step: list[int], k: int) -> list[int]:
    """Steps by accepted drafts: [steps that accepted 0, 1, …, k]."""
    return [sum(1 for a in per_step if a == j) for j in range(k + 1)]


def counts(tokens: int, x: float) -> dict[str, Any]:
    """One answer's counts: accepted, drafted, steps, histogram."""
    per_step, k = accepted_per_step(tokens, x), drafts_per_step(x)
    return {"accepted": sum(per_step), "drafted": k * len(per_step), "steps": len(per_step),
            "histogram": histogram(per_step, k)}


def sglang_meta(tokens: int, x: float, v: tuple[int, int, int]) -> dict[str, Any]:
    """SGLang's meta_info speculative fields for one answer, in version `v`'s spelling (with spec_verify_ct,
    which every version sets when a speculative algorithm runs: python/sglang/srt/managers/tokenizer_manager.py)."""
    c, sp = counts(tokens, x), sglang_spelling(v)
    out = {"spec_verify_ct": c["steps"], sp.accepted: c["accepted"], sp.drafted: c["drafted"]}
    if sp.histogram:
        out[sp.histogram] = c["histogram"]
    return out


def sglang_details(tokens: int, x: float) -> dict[str, Any]:
    """sglext.spec_tokens_details of an OpenAI answer (SGLang >= 0.5.12 with return_spec_tokens_details:
    python/sglang/srt/entrypoints/openai/utils.py, spec_tokens_details_from_meta_info)."""
    c = counts(tokens, x)
    steps = c["steps"]
    return {"spec_accept_rate": c["accepted"] / c["drafted"] if c["drafted"] else 0.0,
            "spec_accept_length": tokens / steps if steps else 0.0,
            "spec_num_correct_drafts": c["accepted"], "spec_num_proposed_drafts": c["drafted"],
            "spec_verify_ct": steps, "spec_correct_drafts_histogram": c["histogram"]}


def vllm_metrics(tokens: int, x: float, mode: str) -> dict[str, Any]:
    """vLLM's answer `metrics` with --per-request-spec-decode-metrics summary|detailed ({} with none)."""
    if mode == "none":
        return {}
    c = counts(tokens, x)
    steps, accepted, drafted = c["steps"], c["accepted"], c["drafted"]
    spec: dict[str, Any] = {"mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
                            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
                            "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted,
                            "num_spec_steps": steps}
    if mode == "detailed":
        spec["acceptance_histogram"] = c["histogram"]
    return {"metrics": {"speculative_decoding": spec}}


@dataclass
class Counters:
    """vLLM's speculative-decoding counters since start (vllm/v1/spec_decode/metrics.py)."""

    drafts: int = 0  # verify steps
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)  # accepted drafts by position

    def count(self, tokens: int, x: float) -> None:
        per_step, k = accepted_per_step(tokens, x), drafts_per_step(x)
        self.drafts += len(per_step)
        self.draft_tokens += k * len(per_step)
        self.accepted += sum(per_step)
        self.per_pos += [0] * (k - len(self.per_pos))
        for j in range(k):
            self.per_pos[j] += sum(1 for a in per_step if a > j)

    def page(self, model: str) -> list[str]:
        """The counters as prometheus_client writes them (`_total` added), one engine."""
        spec = kinds.VLLM.spec
        assert spec is not None
        labels = f'engine="0",model_name="{model}"'
        lines = []
        for name, doc, v in ((spec.steps, "Number of spec decoding drafts.", self.drafts),
                             (spec.draft_tokens, "Number of draft tokens.", self.draft_tokens),
                             (spec.accepted, "Number of accepted tokens.", self.accepted)):
            lines += [f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter",
                      f"{name}_total{{{labels}}} {float(v)}"]
        name = spec.per_pos
        lines += [f"# HELP {name}_total Accepted tokens per draft position.", f"# TYPE {name}_total counter"]
        lines += [f'{name}_total{{{labels},position="{j}"}} {float(v)}' for j, v in enumerate(self.per_pos)]
        return lines


# --- accept length by the prompt's category (--spec-accept-category): the truth per-category figures are tested on

def category_table(s: str) -> dict[str, float]:
    """`--spec-accept-category coding=3.6,writing=1.8`: accept length by category; ValueError when malformed."""
    out: dict[str, float] = {}
    for part in s.split(","):
        name, eq, value = part.partition("=")
        try:
            x = float(value)
        except ValueError:
            x = 0.0
        if not eq or not name.strip() or not 1 <= x < float("inf"):
            raise ValueError(f"NAME=X pairs with X >= 1, e.g. coding=3.6,writing=1.8; not {part!r}")
        out[name.strip()] = x
    return out


@functools.cache
def _builtin_categories() -> tuple[tuple[str, str], ...]:
    """(the prompt text as JSON writes it inside a string, its category) for the bench client's built-in set."""
    from genready.tools import prompts
    return tuple((json.dumps(p.text)[1:-1], p.category) for p in prompts.CATEGORIZED)


def category_of(prompt_key: str) -> str | None:
    """The category of a request whose prompt (as sent, JSON: sim.GenRequest.prompt_key) holds one of the bench
    client's built-in categorised prompts; None for any other prompt. A server cannot know a category: the
    simulator recognises its own test set, so that tests know the true accept length of each category."""
    return next((cat for text, cat in _builtin_categories() if text in prompt_key), None)


def accept_for(x: float, table: dict[str, float] | None, prompt_key: str) -> float:
    """The accept length of one request: its category's in `table`, else `x` (--spec-accept)."""
    if not table:
        return x
    cat = category_of(prompt_key)
    return table.get(cat, x) if cat is not None else x
