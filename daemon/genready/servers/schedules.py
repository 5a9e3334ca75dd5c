"""How an engine takes a speculation depth per batch size (issue 52 §1): the data it reads, the lines that carry
it into a unit, and the Decision's deploy sentence. One `ScheduleFormat` per server kind that has one
(servers/kinds.py, `ServerKind.schedule`); sweep/report/schedule.py finds the schedule, a kind writes it.

A schedule is a list of tiers `(first batch size, last batch size, depth)`, from 1, in order; depth 0 is no
drafting. The formats, read from the engines' source:

- vLLM's dynamic speculative decoding (PR #32374): the `--speculative-config` key
  `num_speculative_tokens_per_batch_size`, a list of `[range_start, range_end, K]` with inclusive batch-size
  ranges (vllm/config/speculative.py, SpeculativeConfig). vllm/v1/spec_decode/dynamic/utils.py's
  `validate_and_normalize_dynamic_sd_schedule` wants the first range to start at 1, ranges sorted and not
  overlapping, K >= 0 (0: no drafting for that step); `build_dynamic_sd_schedule_lookup` fills a gap with the
  previous range's K and the tail past the last range with the last K, and caps every K at the config's
  `num_speculative_tokens` (which must be > 0: the schedule's deepest depth). The batch size is the number of
  requests scheduled in the step: vllm/v1/core/sched/scheduler.py looks up
  `dynamic_sd_lookup[len(num_scheduled_tokens)]`.
- SGLang's `--speculative-adaptive` (PRs #21599, #23336) with `--speculative-adaptive-config FILE`: a JSON
  object whose integer-string keys are batch-size tiers, each `{"candidate_steps": [...]}`, beside a
  `"strategy"` ("ema", the default; python/sglang/srt/speculative/adaptive_spec_params.py,
  `_load_adaptive_config`, `resolve_adaptive_strategy`). A key is the tier's lower bound:
  python/sglang/srt/speculative/adaptive_step_router.py's `batch_size_key_for_batch` pads the running batch up
  to its CUDA-graph batch size, then takes the largest key at or below it (the least key below them all). The
  "ema" slot moves only among its candidate steps (`AdaptiveStepSlot._recompute_params`): one candidate pins the
  tier's depth, 0 included (no drafting). Adaptive runs EAGLE/EAGLE3 with topk 1 only, without attention DP
  (`adaptive_unsupported_reason`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

Tier = tuple[int, int, int]  # (first batch size, last batch size, depth)
# Where the drop-in's --speculative-adaptive-config points; any path will do.
ADAPTIVE_CONFIG_FILE: Final = "/etc/genready/speculative-adaptive.json"


@dataclass(frozen=True)
class ScheduleFormat:
    """One engine's way to carry a schedule: what it reads (JSON; None: nothing to write), the lines that carry it
    into the unit, and the deploy sentence (`steps`: the schedule in words)."""

    data: Callable[[Sequence[Tier]], dict[str, Any] | None]
    carrier: Callable[[Sequence[Tier]], list[str]]
    deploy: Callable[[Sequence[Tier], str], str]


def _deepest(tiers: Sequence[Tier]) -> int:
    return max(d for _, _, d in tiers)


def _off(steps: str) -> str:
    return f"Deploy: no speculation ({steps}): the baseline's drop-in."


def vllm_keys(tiers: Sequence[Tier]) -> dict[str, Any] | None:
    """The keys to merge into the unit's `--speculative-config` JSON; None when the depth is 0 at every tier
    (vLLM wants num_speculative_tokens > 0: run without speculation)."""
    if _deepest(tiers) == 0:
        return None
    return {"num_speculative_tokens": _deepest(tiers),
            "num_speculative_tokens_per_batch_size": [list(t) for t in tiers]}


def _vllm_carrier(tiers: Sequence[Tier]) -> list[str]:
    keys = vllm_keys(tiers)
    if keys is None:
        return ["speculation off at every load: no --speculative-config"]
    return ["add to the --speculative-config JSON of ExecStart (its method and model stay as they are):",
            "  " + json.dumps(keys)[1:-1]]


def _vllm_deploy(tiers: Sequence[Tier], steps: str) -> str:
    keys = vllm_keys(tiers)
    if keys is None:
        return _off(steps)
    return f"Deploy: the schedule ({steps}): add {json.dumps(keys)[1:-1]} to ExecStart's --speculative-config."


def adaptive_config(tiers: Sequence[Tier]) -> dict[str, Any]:
    """SGLang's `--speculative-adaptive-config` file: a tier per lower bound, one candidate step each."""
    return {"strategy": "ema", **{str(lo): {"candidate_steps": [d]} for lo, _, d in tiers}}


def _adaptive_flags(tiers: Sequence[Tier]) -> str:
    return (f"--speculative-adaptive --speculative-adaptive-config {ADAPTIVE_CONFIG_FILE} "
            f"--speculative-num-steps {_deepest(tiers)}")


def _adaptive_carrier(tiers: Sequence[Tier]) -> list[str]:
    if _deepest(tiers) == 0:
        return ["speculation off at every load: no --speculative-algorithm"]
    return [f"add to ExecStart: {_adaptive_flags(tiers)}", f"{ADAPTIVE_CONFIG_FILE}:",
            "  " + json.dumps(adaptive_config(tiers))]


def _adaptive_deploy(tiers: Sequence[Tier], steps: str) -> str:
    if _deepest(tiers) == 0:
        return _off(steps)
    return (f"Deploy: the schedule ({steps}): add {_adaptive_flags(tiers)} to ExecStart, and write "
            f"{json.dumps(adaptive_config(tiers))} to {ADAPTIVE_CONFIG_FILE}.")


PER_BATCH_SIZE: Final = ScheduleFormat(vllm_keys, _vllm_carrier, _vllm_deploy)
ADAPTIVE: Final = ScheduleFormat(adaptive_config, _adaptive_carrier, _adaptive_deploy)
