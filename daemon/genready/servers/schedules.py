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

To prove a schedule in one more load (genready sweep replay, issue 52 §2), each format also rewrites the server's
arguments to run it (`argv`), says which keys of the engine's own report confirm it took (`expect`, read as
servers/engineconfig.py flattens the report: vLLM's start line of non-default args carries the whole
`speculative_config`; SGLang's /server_info its ServerArgs fields `speculative_adaptive` and
`speculative_adaptive_config`, python/sglang/srt/server_args.py), and names the file it needs (`file`: SGLang's
config, whose content the engine does not report; vLLM's schedule is all on the command line).
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
    # the server's words (program and arguments) with the schedule in; `path`: where `file` is written.
    # ValueError when the words have nothing to add it to (no speculative flag)
    argv: Callable[[Sequence[str], Sequence[Tier], str], list[str]]
    # engine key -> the value the engine's own report must show for the schedule to have taken (`path` as above)
    expect: Callable[[Sequence[Tier], str], dict[str, str]]
    file: Callable[[Sequence[Tier]], dict[str, Any] | None]  # the file the engine reads the schedule from


def flag_value(words: Sequence[str], names: Sequence[str]) -> str | None:
    """The last value of one of the flags `names` in `words` (`--flag value` or `--flag=value`); None if absent."""
    found = None
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                found = words[i + 1]
            elif w.startswith(n + "="):
                found = w[len(n) + 1:]
    return found


def set_flag(words: Sequence[str], names: Sequence[str], value: str | None) -> list[str]:
    """`words` with every occurrence of the flags `names` removed, then `names[0]` (with `value`, when not None: a
    switch otherwise) appended: one occurrence, the one the engine reads."""
    out: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if w in names:
            skip = value is not None  # a flag with a value takes the next word; a switch none
            continue
        if any(w.startswith(n + "=") for n in names):
            continue
        out.append(w)
    return [*out, names[0], *([value] if value is not None else [])]


def compact(doc: object) -> str:
    """JSON without spaces: one word on a command line (systemd splits ExecStart= at whitespace)."""
    return json.dumps(doc, separators=(",", ":"))


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


VLLM_CONFIG_FLAGS: Final = ("--speculative-config", "-sc")  # vllm/engine/arg_utils.py


def _vllm_argv(words: Sequence[str], tiers: Sequence[Tier], path: str) -> list[str]:
    """The schedule's keys merged into the words' --speculative-config JSON (its method and model kept)."""
    keys = vllm_keys(tiers)
    given = flag_value(words, VLLM_CONFIG_FLAGS)
    config = _json_object(given)
    if keys is None:
        raise ValueError("speculation off at every load: no schedule to run")
    if config is None:
        raise ValueError("a vLLM schedule goes into the server's --speculative-config JSON, and the command line has "
                         + ("none" if given is None else "no JSON object there"))
    return set_flag(words, VLLM_CONFIG_FLAGS, compact({**config, **keys}))


def _json_object(text: str | None) -> dict[str, Any] | None:
    try:
        doc = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _vllm_expect(tiers: Sequence[Tier], path: str) -> dict[str, str]:
    # engineconfig.flatten writes a list of lists as its compact JSON, on both sides
    keys = vllm_keys(tiers) or {}
    return {f"speculative_config.{k}": compact(v) if isinstance(v, list) else str(v) for k, v in keys.items()}


def _adaptive_argv(words: Sequence[str], tiers: Sequence[Tier], path: str) -> list[str]:
    """--speculative-adaptive with its config file, the deepest depth as --speculative-num-steps (SGLang builds a
    runtime state per candidate step at start, each verifying steps + 1 tokens: adaptive_runtime_state.py)."""
    if flag_value(words, ("--speculative-algorithm",)) is None:
        raise ValueError("an SGLang schedule needs a speculative server (--speculative-algorithm EAGLE or EAGLE3, "
                         "--speculative-eagle-topk 1)")
    deepest = _deepest(tiers)
    out = set_flag(words, ("--speculative-num-steps",), str(deepest))
    if flag_value(out, ("--speculative-num-draft-tokens",)) is not None:
        out = set_flag(out, ("--speculative-num-draft-tokens",), str(deepest + 1))
    return set_flag(set_flag(out, ("--speculative-adaptive",), None), ("--speculative-adaptive-config",), path)


def _adaptive_expect(tiers: Sequence[Tier], path: str) -> dict[str, str]:
    return {"speculative_adaptive": "true", "speculative_adaptive_config": path,
            "speculative_num_steps": str(_deepest(tiers))}


def _no_file(tiers: Sequence[Tier]) -> dict[str, Any] | None:
    return None


PER_BATCH_SIZE: Final = ScheduleFormat(vllm_keys, _vllm_carrier, _vllm_deploy, _vllm_argv, _vllm_expect, _no_file)
ADAPTIVE: Final = ScheduleFormat(adaptive_config, _adaptive_carrier, _adaptive_deploy, _adaptive_argv,
                                 _adaptive_expect, adaptive_config)

