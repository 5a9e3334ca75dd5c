"""`sweep report --schedule vllm|sglang` (issue 52 §1, §5): the speculation depth per load, in the engine's format.

A sweep whose server axes include the speculation depth (DEPTH_AXES: SGLang's steps, vLLM's
num_speculative_tokens, llama.cpp's draft-max) and whose client settings span loads (a concurrency axis,
LOAD_AXES) measured a surface: depth x load. Per load level, the best depth by output tok/s, the baseline
standing as depth 0 (speculation off: decision.py's judgement, issue 52 §4); a depth within noise of the best
(decision.within_noise) ties with it and the shallowest of the tied wins, as it costs less when the estimate is
off. The server's other axes are held at their best: the values whose best depths give the highest geometric
mean of output tok/s over the levels. When one depth is within noise of the best at every level, a schedule is
not worth it and that depth, run static, is the answer.

The load level is the client's concurrency, the requests in flight, which is the engine's batch size in its
steady state (both engines count requests, not tokens). Between two levels measured, a level's depth holds up to
the geometric mean of the two (loads are swept on a log scale); below the least, the least's depth; above the
largest, the largest's (each engine carries its last tier on).

The formats, read from the engines' source:

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

Pure functions of the report's rows: the caller (report/main.py) prints, and adds the JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from genready.redact import escape
from genready.sweep.report import decision
from genready.sweep.rows import Row

# A server axis whose value is the speculation depth (draft tokens a step): the plan's names for it.
DEPTH_AXES: Final = ("steps", "speculative_num_steps", "num_speculative_tokens", "num_spec_tokens", "draft_max",
                     "depth", "gamma")
# A client axis whose value is the requests in flight (the bench client's -c).
LOAD_AXES: Final = ("c", "concurrency", "max_concurrency", "clients")
SGLANG_FILE: Final = "/etc/genready/speculative-adaptive.json"  # where the drop-in's flag points; any path will do


class NoSchedule(ValueError):
    """The sweep cannot give a schedule (no depth axis, no concurrency, no baseline...); the message says why."""


@dataclass(frozen=True)
class Level:
    """One load level's choice."""

    load: int  # requests in flight
    depth: int  # 0: speculation off
    tps: float  # the chosen depth's output tok/s
    best: int  # the best depth by its estimate
    tied: tuple[int, ...]  # the depths within noise of the best (the best included)
    answer: str | None  # decision.py's answer at this setting
    repeats: int | None  # decision.UNDECIDED: repeats that would tell


@dataclass(frozen=True)
class Schedule:
    axis: str
    held: dict[str, Any]  # the other server axes' values
    levels: tuple[Level, ...]  # by load
    static: int | None  # a depth within noise of the best at every level: no schedule needed

    def tiers(self) -> list[tuple[int, int, int]]:
        """[(first batch size, last batch size, depth)]: from 1, merged where the depth does not change; the last
        tier ends at the largest load measured (the engines carry it on)."""
        out: list[tuple[int, int, int]] = []
        lo = 1
        for i, lv in enumerate(self.levels):
            nxt = self.levels[i + 1].load if i + 1 < len(self.levels) else None
            hi = lv.load if nxt is None else max(lv.load, min(nxt - 1, math.isqrt(lv.load * nxt)))
            if out and out[-1][2] == lv.depth:
                out[-1] = (out[-1][0], hi, lv.depth)
            else:
                out.append((lo, hi, lv.depth))
            lo = hi + 1
        return out


def depth_axis(rows: Sequence[Row], client: set[str]) -> str:
    axes = {k for r in rows if not r.baseline for k in r.point if k not in client}
    found = [a for a in DEPTH_AXES if a in axes]
    if len(found) != 1:
        raise NoSchedule(f"a schedule needs one server axis of the speculation depth ({', '.join(DEPTH_AXES)}); "
                         f"the sweep's server axes: {', '.join(sorted(axes)) or 'none'}")
    return found[0]


def load_of(client: Mapping[str, Any]) -> int:
    numbers = {k: v for k, v in client.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    named = [k for k in LOAD_AXES if k in numbers]
    if named:
        return int(numbers[named[0]])
    if len(numbers) == 1:
        return int(next(iter(numbers.values())))
    raise NoSchedule(f"a schedule needs the client's concurrency (an axis {', '.join(LOAD_AXES)}): the engines "
                     f"switch depth by requests in flight; found the client setting {escape(json.dumps(client))}")


def _depth(r: Row, axis: str) -> int | None:
    v = r.point.get(axis)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def schedule(rows: Sequence[Row]) -> Schedule:
    """The depth per load level (module doc); NoSchedule when the sweep cannot give one."""
    if not any(r.baseline for r in rows):
        raise NoSchedule("a schedule needs the plan's `baseline` (speculation off) measured at every load")
    sets = decision.settings(rows)
    if len(sets) < 2:
        raise NoSchedule("a schedule needs two load levels or more (a concurrency list)")
    client = set(sets[0][0])
    axis = depth_axis(rows, client)
    decided = decision.decide(rows)  # the same settings, in the same order, each with its answer
    base_of = decision.baseline_runs(rows)

    def others(r: Row) -> str:
        return json.dumps({k: v for k, v in r.point.items() if k not in client and k != axis}, sort_keys=True,
                          default=str)

    # per level: held values -> depth -> the row; depth 0 from the baseline where the plan has no depth 0
    grid: list[tuple[int, dict[str, dict[int, Row]], Row | None, decision.Setting]] = []
    for (values, group), s in zip(sets, decided, strict=True):
        by: dict[str, dict[int, Row]] = {}
        for r in group:
            if decision.tps(r) is not None and (d := _depth(r, axis)) is not None:
                by.setdefault(others(r), {})[d] = r
        base = next((b for r in group if (b := base_of(r)) is not None and decision.tps(b) is not None), None)
        grid.append((load_of(values), by, base, s))
    if len({g[0] for g in grid}) != len(grid):
        raise NoSchedule("two client settings share a concurrency: a schedule is by concurrency alone")
    grid.sort(key=lambda g: g[0])
    held = _held(grid)
    levels = []
    for load, by, base, s in grid:
        cands = dict(by.get(held, {}))
        if 0 not in cands and base is not None:
            cands[0] = base
        if not cands:
            raise NoSchedule(f"no depth ran ok at concurrency {load}")
        best = max(sorted(cands), key=lambda d: decision.tps(cands[d]) or 0.0)  # the shallowest of equals
        tied = tuple(d for d in sorted(cands) if d == best or decision.within_noise(cands[d], cands[best]))
        levels.append(Level(load, tied[0], decision.tps(cands[tied[0]]) or 0.0, best, tied, s.answer, s.repeats))
    everywhere = set.intersection(*(set(lv.tied) for lv in levels))
    return Schedule(axis, json.loads(held), tuple(levels), min(everywhere) if everywhere else None)


def _held(grid: Sequence[tuple[int, dict[str, dict[int, Row]], Row | None, decision.Setting]]) -> str:
    """The other server axes' values whose best depths give the highest geometric mean over the levels (among
    those measured at every level)."""
    common = set.intersection(*(set(by) for _, by, _, _ in grid))
    if not common:
        raise NoSchedule("no values of the other server axes were measured at every load")

    def score(key: str) -> float:
        return sum(math.log(max(decision.tps(r) or 1e-300 for r in by[key].values())) for _, by, _, _ in grid)

    return max(sorted(common), key=score)


# --- the engines' formats ---------------------------------------------------------------------------------------

def vllm_keys(s: Schedule) -> dict[str, Any] | None:
    """The keys to merge into the unit's `--speculative-config` JSON; None when the depth is 0 at every level
    (vLLM wants num_speculative_tokens > 0: run without speculation)."""
    tiers = s.tiers()
    deepest = max(d for _, _, d in tiers)
    if deepest == 0:
        return None
    return {"num_speculative_tokens": deepest, "num_speculative_tokens_per_batch_size": [list(t) for t in tiers]}


def sglang_config(s: Schedule) -> dict[str, Any]:
    """The `--speculative-adaptive-config` file: a tier per lower bound, one candidate step each."""
    return {"strategy": "ema", **{str(lo): {"candidate_steps": [d]} for lo, _, d in s.tiers()}}


def _deepest(s: Schedule) -> int:
    return max(d for _, _, d in s.tiers())


def _vllm_carrier(s: Schedule) -> list[str]:
    keys = vllm_keys(s)
    if keys is None:
        return ["speculation off at every load: no --speculative-config"]
    return ["add to the --speculative-config JSON of ExecStart (its method and model stay as they are):",
            "  " + json.dumps(keys)[1:-1]]


def _vllm_deploy(s: Schedule, steps: str) -> str:
    keys = vllm_keys(s)
    if keys is None:
        return f"Deploy: no speculation ({steps}): the baseline's drop-in."
    return f"Deploy: the schedule ({steps}): add {json.dumps(keys)[1:-1]} to ExecStart's --speculative-config."


def _sglang_flags(s: Schedule) -> str:
    return (f"--speculative-adaptive --speculative-adaptive-config {SGLANG_FILE} "
            f"--speculative-num-steps {_deepest(s)}")


def _sglang_carrier(s: Schedule) -> list[str]:
    if _deepest(s) == 0:
        return ["speculation off at every load: no --speculative-algorithm"]
    return [f"add to ExecStart: {_sglang_flags(s)}", f"{SGLANG_FILE}:", "  " + json.dumps(sglang_config(s))]


def _sglang_deploy(s: Schedule, steps: str) -> str:
    if _deepest(s) == 0:
        return f"Deploy: no speculation ({steps}): the baseline's drop-in."
    return (f"Deploy: the schedule ({steps}): add {_sglang_flags(s)} to ExecStart, and write "
            f"{json.dumps(sglang_config(s))} to {SGLANG_FILE}.")


@dataclass(frozen=True)
class Format:
    """One engine's way to carry a schedule: what it reads (JSON), the lines that carry it, the deploy sentence."""

    data: Callable[[Schedule], dict[str, Any] | None]
    carrier: Callable[[Schedule], list[str]]
    deploy: Callable[[Schedule, str], str]


FORMATS: Final[Mapping[str, Format]] = {
    "vllm": Format(vllm_keys, _vllm_carrier, _vllm_deploy),
    "sglang": Format(sglang_config, _sglang_carrier, _sglang_deploy),
}
ENGINES: Final = tuple(FORMATS)


def _depth_words(axis: str, d: int) -> str:
    return "speculation off" if d == 0 else f"{axis}={d}"


def static_words(s: Schedule) -> str:
    assert s.static is not None
    held = decision._words(s.held)
    what = _depth_words(s.axis, s.static) + (f" {held}" if held and s.static else "")
    return f"{what} at every load: a schedule is not worth it, it is within noise of the best at each load measured"


def text(s: Schedule, engine: str, fmt: str = "table") -> str:
    """The schedule's section: a line per level, then what carries it (or that one static depth does)."""
    head = f"Schedule ({engine}): the best {s.axis} per concurrency" + \
        (f", the other server axes held at {decision._words(s.held)}" if s.held else "")
    lines = []
    for lv in s.levels:
        line = f"c={lv.load}: {_depth_words(s.axis, lv.depth)} ({lv.tps:.1f} output tok/s)"
        if lv.best != lv.depth:
            line += f"; the best by its estimate, {_depth_words(s.axis, lv.best)}, is within noise of it"
        if lv.answer == decision.UNDECIDED:
            line += "; the baseline cannot be told from the best here: " + \
                (f"repeats = {lv.repeats} would" if lv.repeats else "the runs are too noisy")
        lines.append(line)
    if s.static is not None:
        lines.append("No schedule: " + static_words(s))
    else:
        lines += FORMATS[engine].carrier(s)
    if fmt == "markdown":
        return f"## {head}\n\n" + "".join(f"    {ln}\n" for ln in lines) + "\n"
    return head + "\n" + "".join(f"  {ln}\n" for ln in lines) + "\n"


def as_json(s: Schedule, engine: str) -> dict[str, Any]:
    return {"engine": engine, "axis": s.axis, "held": s.held,
            "levels": [{"concurrency": lv.load, "depth": lv.depth, "output_tokens_per_second": lv.tps,
                        "best": lv.best, "within_noise": list(lv.tied), "answer": lv.answer,
                        "repeats_needed": lv.repeats} for lv in s.levels],
            "tiers": [list(t) for t in s.tiers()],
            "static": s.static, "worth_it": s.static is None,
            engine: FORMATS[engine].data(s), "carrier": FORMATS[engine].carrier(s) if s.static is None else []}


def deploy_line(rows: Sequence[Row], engine: str | None) -> str:
    """The Decision's last sentence (issue 52 §5): what to run. With a depth axis over loads, the schedule (its
    flags when `engine` is given) or the one static depth; otherwise the one configuration the Decision names at
    every setting, or each setting's."""
    try:
        s = schedule(rows)
    except NoSchedule:
        return _static_deploy(rows)
    if s.static is not None:
        held = decision._words(s.held)
        values = f"{s.axis}={s.static}" + (f" {held}" if held else "")
        return ("Deploy: no speculation (the baseline's drop-in)" if s.static == 0 else
                f"Deploy: the plan's drop-in with {values}") + f": {static_words(s)}."
    steps = ", ".join(f"{_depth_words(s.axis, lv.depth)} at c={lv.load}" for lv in s.levels)
    if engine is None:
        return (f"Deploy: a schedule by load ({steps}): `genready sweep report DIR --schedule vllm|sglang` writes "
                "the engine's lines.")
    return FORMATS[engine].deploy(s, steps)


def _static_deploy(rows: Sequence[Row]) -> str:
    sets = [s for s in decision.decide(rows) if s.best is not None]
    if not sets:
        return ""
    if any(s.answer == decision.UNDECIDED for s in sets):
        return "Deploy: not yet: repeat the sweep where more repeats are needed."
    names = [_answer(s) for s in sets]
    if len(set(names)) == 1:
        return ("Deploy: no speculation (the baseline's drop-in)." if names[0] == NONE else
                f"Deploy: the plan's drop-in with {names[0]}." if names[0] else
                "Deploy: the plan's drop-in (its one configuration).")
    return "Deploy: no one configuration is the best at every client setting: " + "; ".join(
        f"{decision._words(s.client)}: {name}" for s, name in zip(sets, names, strict=True)) + "."


NONE: Final = "no speculation"


def _answer(s: decision.Setting) -> str:
    """What a setting says to run: no speculation where the baseline is the best or within noise of it (a tie
    goes to the shallower), else the best configuration."""
    assert s.best is not None
    if s.answer in (decision.NO_SPECULATION, decision.WITHIN_BASELINE):
        return NONE
    # its server-side values ("" for a sweep of one configuration, whose rows are named by their client values)
    return escape(decision._words({k: v for k, v in s.best.point.items() if k not in s.client}))
