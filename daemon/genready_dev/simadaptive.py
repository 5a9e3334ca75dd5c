"""The simulator's SGLang `--speculative-adaptive` (issue 52 §3): the draft depth chosen per decode step from the
running batch, as SGLang's source does it, so that `genready sweep replay --schedule sglang` runs on the simulator.

Read from sgl-project/sglang (python/sglang/srt/speculative/):
- adaptive_spec_params.py: `_load_adaptive_config` reads `--speculative-adaptive-config FILE`, a JSON object
  whose integer-string keys are batch-size tiers, each with `candidate_steps` (a non-empty list of integers
  >= 0; other keys skipped; no tier at all is refused); its top-level keys (`ema_alpha`, `update_interval`,
  `warmup_batches`, `up_hysteresis`, `down_hysteresis`, `ceiling_coeff`) are each tier's defaults, a tier's
  own win. `resolve_adaptive_strategy`: "strategy" is "ema" (default) or "throughput_aware" (which profiles
  costs at start: not simulated here, refused). `adaptive_unsupported_reason`: EAGLE or EAGLE3 only, topk 1.
  `AdaptiveStepSlot` per tier: it starts on the server's --speculative-num-steps when that is a candidate, else
  on the middle candidate; after each verify it moves an EMA of the accepted drafts per request (`ema_alpha`
  0.2) and, past `warmup_batches` (10) and every `update_interval` (5) verifies, `_recompute_params` steps down
  while the EMA is at or below the next lower candidate minus 0.5 (plus `down_hysteresis`, default -0.25; 0.5
  for a lower candidate of 0), else up while it is above the current one minus 0.5 (plus `up_hysteresis`); a
  tier at 0 probes its next candidate. With one candidate a tier's depth is pinned (genready's schedules).
- adaptive_step_router.py, `AdaptiveStepRouter.batch_size_key_for_batch`: the running batch is padded up to
  its CUDA-graph batch size first (the least captured size at or above it), then the largest tier key at or
  below that is taken (the least key when all are above). The captured sizes are server_args.py's
  `_generate_cuda_graph_batch_sizes` for speculative decoding: 1-8, 10-32 by 2, 40-64 by 4, 72-256 by 8
  (CUDA_GRAPH_BS).
- adaptive_runtime_state.py, `AdaptiveController`: a runtime state (draft and verify attention backends and
  CUDA graphs, num_draft_tokens = steps + 1) is built for every candidate step at start (`init_states`), and
  `activate_step_by_batch` swaps to the routed step's before the step runs. So switching costs nothing per step
  here (no capture at run time): the cost is at start, a graph set per candidate step, which the simulator's
  load time does not model.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

# server_args.py, _generate_cuda_graph_batch_sizes, the speculative-decoding case (up to 256)
CUDA_GRAPH_BS: Final = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))
STRATEGIES: Final = ("ema", "throughput_aware")
SLOT_DEFAULTS: Final = {"ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10, "down_hysteresis": -0.25,
                        "up_hysteresis": 0.0, "ceiling_coeff": 0}
MAX_CONFIG_BYTES: Final = 1 << 20


@dataclass
class Slot:
    """One tier's AdaptiveStepSlot: its candidates, where it stands, and its EMA."""

    candidates: list[int]
    cfg: Mapping[str, Any]
    current: int = 0
    ema: float = 0.0
    batches: int = 0

    @classmethod
    def of(cls, initial: int, cfg: Mapping[str, Any]) -> Slot:
        candidates = sorted(set(cfg["candidate_steps"]))
        current = initial if initial in candidates else candidates[len(candidates) // 2]
        return cls(candidates, {**SLOT_DEFAULTS, **cfg}, current, float(current - 1))

    def update(self, accepted: float) -> None:
        """After a verify of this tier: `accepted` drafts per request on average (none at depth 0)."""
        if self.current > 0:
            a = float(self.cfg["ema_alpha"])
            self.ema = (1 - a) * self.ema + a * accepted
        self.batches += 1
        warm, every = int(self.cfg["warmup_batches"]), int(self.cfg["update_interval"])
        if self.batches > warm and (self.batches - warm) % every == 0:
            self._recompute()

    def _recompute(self) -> None:
        i = old = self.candidates.index(self.current)
        if self.current == 0:
            i = min(i + 1, len(self.candidates) - 1)
            if self.candidates[i] > 0 and self.ema < 0:
                self.ema = float(self.candidates[i] - 1)
            self.current = self.candidates[i]
            return
        while i > 0:
            below = self.candidates[i - 1]
            if self.ema <= (0.5 if below == 0 else below - 0.5) + float(self.cfg["down_hysteresis"]):
                i -= 1
            else:
                break
        if i == old:
            while i < len(self.candidates) - 1 and \
                    self.ema > self.candidates[i] - 0.5 + float(self.cfg["up_hysteresis"]):
                i += 1
        self.current = self.candidates[i]  # ceiling_coeff (0 by default) is not simulated


@dataclass
class Adaptive:
    """The slots by tier key, and the router's padding: the depth of each step, moved by each verify."""

    slots: dict[int, Slot]
    graph_bs: tuple[int, ...] = CUDA_GRAPH_BS
    switches: int = 0  # steps whose depth differed from the step before's (no cost: module doc)
    _last: int | None = field(default=None, repr=False)

    def key(self, batch: int) -> int:
        at = bisect.bisect_left(self.graph_bs, batch)
        padded = self.graph_bs[at] if at < len(self.graph_bs) else batch
        keys = sorted(self.slots)
        return keys[max(0, bisect.bisect_right(keys, padded) - 1)]

    def steps_for(self, batch: int) -> int:
        d = self.slots[self.key(batch)].current
        if self._last is not None and d != self._last:
            self.switches += 1
        self._last = d
        return d

    def verified(self, batch: int, accepted: float) -> None:
        self.slots[self.key(batch)].update(accepted)


def parse(cfg: object, initial: int) -> Adaptive:
    """The adaptive state a config object gives, with `initial` the server's --speculative-num-steps; ValueError
    as SGLang refuses (module doc)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"speculative adaptive config must be a JSON object, got {type(cfg).__name__}")
    strategy = cfg.get("strategy", "ema")
    if strategy not in STRATEGIES:
        raise ValueError(f"speculative adaptive config 'strategy' must be 'ema' or 'throughput_aware', got "
                         f"{strategy!r}")
    if strategy != "ema":
        raise ValueError("the simulator runs the 'ema' strategy only (throughput_aware profiles the GPU at start)")
    tiers: dict[int, Mapping[str, Any]] = {}
    for key, entry in cfg.items():
        if not isinstance(key, str) or not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or \
                not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        tiers[int(key)] = entry
    if not tiers:
        raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
                         f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(cfg)}')
    shared = {k: v for k, v in cfg.items() if not (isinstance(k, str) and k.isdigit())}
    return Adaptive({bs: Slot.of(initial, {**shared, **entry}) for bs, entry in sorted(tiers.items())})


def check_server(algorithm: object, topk: object) -> None:
    """adaptive_unsupported_reason's first two checks, as ValueError."""
    if algorithm not in ("EAGLE", "EAGLE3", "NEXTN"):  # NEXTN runs as EAGLE (server_args.py)
        raise ValueError(f"--speculative-adaptive: speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are "
                         "supported)")
    if topk not in (None, 1, "1"):
        raise ValueError(f"--speculative-adaptive: speculative_eagle_topk={topk} (only topk=1 is supported)")


def load(path: str | None, initial: int, settings: Mapping[str, Any]) -> Adaptive:
    """`--speculative-adaptive` with its config file (SGLang's defaults without one are DEFAULT_CONFIG)."""
    check_server(settings.get("speculative_algorithm"), settings.get("speculative_eagle_topk"))
    if path is None:
        return parse(DEFAULT_CONFIG, initial)
    raw = Path(path).read_bytes()[:MAX_CONFIG_BYTES + 1]
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: over {MAX_CONFIG_BYTES} bytes")
    try:
        return parse(json.loads(raw), initial)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None


# adaptive_spec_params.py, DEFAULT_ADAPTIVE_CONFIG (its hysteresis values)
DEFAULT_CONFIG: Final[Mapping[str, Any]] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


def depths_of(a: Adaptive, batches: Sequence[int]) -> list[int]:
    """The depth each batch size would run at now (for tests and the truth): no verify fed."""
    return [a.slots[a.key(b)].current for b in batches]
