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

The speculative model (`--spec-alpha A`, issue 37 §4): accept length and the time of a verify step from the
server's own settings, so that the true speedup of a configuration is known (genready_dev/simtruth.py). It is
a MODEL, written down so that a sweep's answer can be checked, not a claim about any real drafter:
- each draft token is accepted with probability α (`--spec-alpha`), independently: Leviathan et al. 2023
  ("Fast Inference from Transformers via Speculative Decoding", ICML), whose expected tokens per verify step
  with γ drafts is (1 - α^(γ+1)) / (1 - α), and whose expected speedup is that over (1 + γ c), c the cost of
  one draft step relative to a target step;
- γ is SGLang's `--speculative-num-steps` (the draft depth; vLLM's speculative_config.num_speculative_tokens),
  k its `--speculative-eagle-topk`: with k candidates at each depth (EAGLE's tree) a depth is accepted with
  α_k = 1 - (1 - α)^k (the candidates taken as independent: optimistic, ours); N its
  `--speculative-num-draft-tokens`, the tokens the target verifies a step (default γ k + 1, the whole tree;
  SGLang asks N = γ + 1 with k = 1), which bounds the accepted depth to N - 1;
- accept length X = (1 - α_k^(d+1)) / (1 - α_k), d = min(γ, N - 1); a verify step takes
  t0 (1 + c γ + v (N - 1)): t0 `--token-latency`, c `--spec-draft-cost` (Leviathan's c), v
  `--spec-verify-cost` (each verified draft token's share of a target step: the verify step is no longer
  memory-bound for free once it carries many tokens). The v term is ours; with v = 0 the speedup is
  Leviathan's formula;
- the prompt's category scales α (CATEGORY_FACTORS, from Spec-Bench's per-task speedups for EAGLE), so code
  and mathematics are accepted longer than writing; `--spec-accept-category` gives a category's X outright.
A generation of T tokens takes ceil(T / X) steps (as above), each releasing its accepted drafts and one token
of its own at once. With a fixed `--spec-accept X` instead, X is the same for every prompt (unless
`--spec-accept-category`) and tokens are paced one per --token-latency, as before.
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


# --- the speculative model (--spec-alpha): accept length and step time from the server's settings (module doc)

# Each built-in category's factor on α: Spec-Bench's per-task speedup of EAGLE over its overall speedup
# (hemingkx/Spec-Bench, Leaderboard.md, "Leaderboard on 3090", Vicuna-7B-v1.3, greedy: overall 2.08x;
# mathematical reasoning 2.44x, summarization 2.04x, question answering 1.96x, translation 1.79x). At a fixed
# configuration speedup goes with accept length; applying the ratio to α instead is ours (it keeps X within
# the draft depth). Spec-Bench has no code or free writing task: EAGLE's paper (Li et al. 2024, Table 1) has
# HumanEval above its other sets, so coding takes mathematics' factor and 10 % more (our choice); MT-bench's
# per-category results put writing and roleplay among the lowest (Medusa, Cai et al. 2024, Fig. 4), so writing
# takes Spec-Bench's lowest. Extraction is question answering over a given text.
_SPEC_BENCH_EAGLE: Final = {"overall": 2.08, "math": 2.44, "summarization": 2.04, "qa": 1.96, "translation": 1.79}
CATEGORY_FACTORS: Final[dict[str, float]] = {
    "coding": 1.1 * _SPEC_BENCH_EAGLE["math"] / _SPEC_BENCH_EAGLE["overall"],
    "math_reasoning": _SPEC_BENCH_EAGLE["math"] / _SPEC_BENCH_EAGLE["overall"],
    "summarization": _SPEC_BENCH_EAGLE["summarization"] / _SPEC_BENCH_EAGLE["overall"],
    "extraction": _SPEC_BENCH_EAGLE["qa"] / _SPEC_BENCH_EAGLE["overall"],
    "translation": _SPEC_BENCH_EAGLE["translation"] / _SPEC_BENCH_EAGLE["overall"],
    "writing": _SPEC_BENCH_EAGLE["translation"] / _SPEC_BENCH_EAGLE["overall"],
}
MAX_ALPHA: Final = 0.95  # a category's α is capped here: no drafter is always right
DEFAULT_STEPS: Final = 3  # SGLang's usual EAGLE depth when --speculative-num-steps is not given
DEFAULT_DRAFT_COST: Final = 0.15
DEFAULT_VERIFY_COST: Final = 0.12


@dataclass(frozen=True)
class SpecModel:
    """The settings of the speculative model (module doc): α, γ, k, N, c, v, and --spec-accept-category's X."""

    alpha: float
    steps: int = DEFAULT_STEPS
    topk: int = 1
    draft_tokens: int | None = None  # N; None: γ k + 1
    draft_cost: float = DEFAULT_DRAFT_COST
    verify_cost: float = DEFAULT_VERIFY_COST
    table: dict[str, float] | None = None  # --spec-accept-category: X by category, outright

    @property
    def verified(self) -> int:
        """N, the tokens the target verifies a step."""
        return self.draft_tokens if self.draft_tokens is not None else self.steps * self.topk + 1

    def alpha_of(self, category: str | None) -> float:
        """α for a prompt of `category` (None: not one of the built-in set's): scaled by CATEGORY_FACTORS."""
        return min(MAX_ALPHA, self.alpha * CATEGORY_FACTORS.get(category or "", 1.0))

    def accept(self, category: str | None) -> float:
        """X, the mean tokens a verify step yields for a prompt of `category`."""
        if self.table and category in self.table:
            return self.table[category]
        ak = 1.0 - (1.0 - self.alpha_of(category)) ** self.topk
        depth = max(0, min(self.steps, self.verified - 1))
        return (1.0 - ak ** (depth + 1)) / (1.0 - ak)

    @property
    def step_factor(self) -> float:
        """A verify step's time over a plain decode step's: 1 + c γ + v (N - 1)."""
        return 1.0 + self.draft_cost * self.steps + self.verify_cost * (self.verified - 1)

    def mean_accept(self) -> float:
        """X averaged over the built-in categories (what the server's own average reports)."""
        xs = [self.accept(c) for c in CATEGORY_FACTORS]
        return sum(xs) / len(xs)


def request_seconds(model: SpecModel | None, category: str | None, tokens: int, token_latency: float) -> float:
    """The decode time of one generation of `tokens` tokens: T t0 plain, ceil(T / X) steps of t0 times the
    step factor under `model` (the time the simulator paces, prefill and HTTP aside)."""
    if model is None:
        return tokens * token_latency
    return len(accepted_per_step(tokens, model.accept(category))) * token_latency * model.step_factor
