"""`sweep report --schedule vllm|sglang` (issue 52 §1, §5): the depth per load from results folders written here,
in each engine's format, parsed back the way the engine parses it (the parsers below are reimplemented from the
engines' source, each naming its file); a surface where one depth wins everywhere needs no schedule; the
Decision ends with what to deploy.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from genready.exitcodes import Exit, Failed
from genready.servers import schedules
from genready.sweep.report import collect, decision, schedule
from genready.sweep.report.main import report_main
from tests.test_sweep_decision import Folder, section

LOADS = (1, 8, 32, 64)
# output tok/s by concurrency: the baseline's, then depth 1, 3, 5 (the moving best: 5, 3, 1, off)
MOVING = {1: (100.0, 150.0, 200.0, 240.0), 8: (600.0, 800.0, 900.0, 850.0), 32: (2000.0, 2300.0, 2000.0, 1600.0),
          64: (3000.0, 2700.0, 2200.0, 1700.0)}
NOISE = (1.0, 1.01, 0.99)  # three repeats, ±1 %


def sweep(path: Path, surface: Mapping[int, tuple[float, ...]], depths: tuple[int, ...] = (1, 3, 5),
          extra: dict[str, Any] | None = None) -> Folder:
    f = Folder(path)
    index = 0
    for c in LOADS:
        base, *tps = surface[c]
        for r, k in enumerate(NOISE, 1):
            f.run(100 + c, {"steps": 0, "c": c}, base * k, r, base=1)
            for i, (d, t) in enumerate(zip(depths, tps, strict=True)):
                f.run(index + i + 1, {"steps": d, **(extra or {}), "c": c}, t * k, r)
        index += len(depths)
    (f.path / "results.jsonl").write_text("".join(f.lines))
    return f


def planned(f: Folder) -> schedule.Schedule:
    return schedule.schedule(collect.rows_of([f.path]))


# --- the engines' parsers, reimplemented from their source -------------------------------------------------------

def vllm_lookup(keys: dict[str, Any], max_batch_size: int) -> list[int]:
    """vllm/v1/spec_decode/dynamic/utils.py: validate_and_normalize_dynamic_sd_schedule (its 3-item form) and
    build_dynamic_sd_schedule_lookup: a dense batch size -> K list, gaps and the tail carried from the previous
    range, each K capped at num_speculative_tokens (vllm/config/speculative.py requires it > 0)."""
    sched, cap = keys["num_speculative_tokens_per_batch_size"], keys["num_speculative_tokens"]
    assert isinstance(cap, int) and cap > 0
    assert isinstance(sched, list) and sched
    parsed = []
    for entry in sched:
        assert isinstance(entry, list | tuple) and len(entry) == 3
        lo, hi, k = int(entry[0]), int(entry[1]), int(entry[2])
        assert lo > 0 and hi > 0 and lo <= hi and k >= 0
        parsed.append((lo, hi, k))
    prev_end = 0
    for lo, hi, _ in sorted(parsed):
        assert lo > prev_end, "Batch-size ranges must be non-overlapping and sorted."
        prev_end = hi
    assert sorted(parsed)[0][0] == 1, "The first batch-size range must start at 1"
    dense = [0] * (max_batch_size + 1)
    next_bs, last_k = 1, None
    for lo, hi, k in sorted(parsed):
        if lo > next_bs and last_k is not None:
            for bs in range(next_bs, min(lo, max_batch_size + 1)):
                dense[bs] = min(cap, last_k)
        for bs in range(max(lo, next_bs), min(hi, max_batch_size) + 1):
            dense[bs] = min(cap, k)
        next_bs, last_k = max(next_bs, hi + 1), k
        if next_bs > max_batch_size:
            break
    if last_k is not None:
        for bs in range(next_bs, max_batch_size + 1):
            dense[bs] = min(cap, last_k)
    return dense  # the scheduler's K: dense[len(num_scheduled_tokens)] (vllm/v1/core/sched/scheduler.py)


def sglang_steps(cfg: dict[str, Any], batch_size: int, cuda_graph_bs: list[int] | None = None) -> int:
    """python/sglang/srt/speculative/adaptive_spec_params.py: _load_adaptive_config (integer-string keys, each a
    non-empty list of non-negative candidate_steps), resolve_adaptive_strategy; AdaptiveStepSlot's steps (one
    candidate: that one, as _recompute_params can move only among candidates); adaptive_step_router.py's
    batch_size_key_for_batch: pad up to the CUDA-graph batch size, then the largest key at or below."""
    assert cfg.get("strategy", "ema") in ("ema", "throughput_aware")
    slots: dict[int, list[int]] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        assert isinstance(steps, list) and steps and all(isinstance(s, int) and s >= 0 for s in steps)
        slots[int(key)] = sorted(set(steps))
    assert slots
    if cuda_graph_bs is not None:
        i = bisect.bisect_left(cuda_graph_bs, batch_size)
        if i < len(cuda_graph_bs):
            batch_size = cuda_graph_bs[i]
    keys = sorted(slots)
    candidates = slots[keys[max(0, bisect.bisect_right(keys, batch_size) - 1)]]
    assert len(candidates) == 1, "a schedule pins each tier: one candidate"
    return candidates[0]


# --- the tests ----------------------------------------------------------------------------------------------------

def test_the_best_depth_per_load_and_both_engines_parse_it_to_the_same_depths(tmp_path: Path) -> None:
    s = planned(sweep(tmp_path, MOVING))
    assert s.axis == "steps" and s.static is None and s.held == {}
    assert [(lv.load, lv.depth) for lv in s.levels] == [(1, 5), (8, 3), (32, 1), (64, 0)]
    # between two levels the lower one's depth holds to their geometric mean (2.8, 16, 45.3)
    assert s.tiers() == [(1, 2, 5), (3, 16, 3), (17, 45, 1), (46, 64, 0)]
    keys = schedules.vllm_keys(s.tiers())
    assert keys == {"num_speculative_tokens": 5,
                    "num_speculative_tokens_per_batch_size": [[1, 2, 5], [3, 16, 3], [17, 45, 1], [46, 64, 0]]}
    dense = vllm_lookup(json.loads(json.dumps(keys)), max_batch_size=256)
    cfg = json.loads(json.dumps(schedules.adaptive_config(s.tiers())))
    graphs = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 256]  # SGLang's default capture list
    for lv in s.levels:  # each engine runs the measured load at the depth chosen for it
        assert dense[lv.load] == lv.depth == sglang_steps(cfg, lv.load) == sglang_steps(cfg, lv.load, graphs)
    assert dense[2] == sglang_steps(cfg, 2) == 5 and dense[3] == sglang_steps(cfg, 3) == 3
    assert dense[200] == sglang_steps(cfg, 200) == 0  # past the largest load: the last tier carries on
    # SGLang pads a batch up to its CUDA graph first: 45 requests run as 48, in the next tier (the docstring says)
    assert dense[45] == sglang_steps(cfg, 45) == 1 and sglang_steps(cfg, 45, graphs) == 0


def test_the_parsers_refuse_what_the_engines_refuse() -> None:
    # the reimplementations can fail: a schedule not from 1, overlapping ranges, an empty tier
    with pytest.raises(AssertionError):
        vllm_lookup({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[2, 8, 3]]}, 16)
    with pytest.raises(AssertionError):
        vllm_lookup({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 8, 3], [8, 9, 1]]},
                    16)
    with pytest.raises(AssertionError):
        sglang_steps({"1": {"candidate_steps": []}}, 1)
    assert vllm_lookup({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 4, 5]]}, 8)[3] == 2


def test_a_tie_within_the_noise_goes_to_the_shallower_depth(tmp_path: Path) -> None:
    surface = dict(MOVING)
    surface[1] = (100.0, 150.0, 238.0, 240.0)  # depth 3 within noise of depth 5 at one request in flight
    surface[32] = (2290.0, 2300.0, 2000.0, 1600.0)  # the baseline within noise of depth 1: off
    s = planned(sweep(tmp_path, surface))
    assert [(lv.load, lv.best, lv.depth) for lv in s.levels] == [(1, 5, 3), (8, 3, 3), (32, 1, 0), (64, 0, 0)]
    assert s.levels[0].tied == (3, 5) and s.tiers() == [(1, 16, 3), (17, 64, 0)]


def test_a_depth_within_the_noise_but_more_than_tie_loss_slower_does_not_tie(tmp_path: Path) -> None:
    # bench/schedule.py's c=1: two repeats each, depth 3's within 1 % of each other, depth 5's within 0.1 %; Welch's
    # interval (about 1 degree of freedom) holds 1 for depth 3's 4.4 % loss, which the replay then measured
    f = Folder(tmp_path)
    for c in LOADS:
        base, *tps = MOVING[c]
        if c == 1:
            base, tps = 47.1, [68.5, 0.0, 0.0]  # depth 3 and 5 per repeat below
        for r in (1, 2):
            f.run(100 + c, {"steps": 0, "c": c}, base, r, base=1)
            for i, (d, t) in enumerate(zip((1, 3, 5), tps, strict=True)):
                if c == 1 and d == 3:
                    t = (93.8, 95.4)[r - 1]
                elif c == 1 and d == 5:
                    t = (98.8, 99.0)[r - 1]
                f.run(10 * c + i, {"steps": d, "c": c}, t, r)
    (f.path / "results.jsonl").write_text("".join(f.lines))
    rows = collect.rows_of([f.path])
    s = schedule.schedule(rows)
    by = s.levels[0].rows
    assert decision.within_noise(by[3], by[5])  # the interval alone would call it a tie
    assert s.levels[0].tied == (5,) and s.levels[0].depth == 5
    assert s.levels[0].within == (3, 5) and s.static is None  # within noise at c=1 only: a schedule still


def test_one_depth_best_everywhere_needs_no_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flat = {c: (base, base * 1.1, base * 1.5, base * 1.2) for c, base in zip(LOADS, (100.0, 600.0, 2000.0, 3000.0),
                                                                               strict=True)}
    f = sweep(tmp_path, flat)
    assert planned(f).static == 3
    assert report_main([str(f.path)], "table", schedule="vllm") == 0
    text = capsys.readouterr().out
    assert section(text)[-1] == ("Deploy: the plan's drop-in with steps=3: steps=3 at every load: a schedule is not "
                                 "worth it, it is within noise of the best at each load measured."), section(text)
    assert "  No schedule: steps=3 at every load: a schedule is not worth it" in text
    assert "num_speculative_tokens_per_batch_size" not in text


def test_the_report_prints_the_schedule_and_its_flags_and_the_decision_ends_with_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = sweep(tmp_path, MOVING)
    assert report_main([str(f.path)], "table", schedule="vllm") == 0
    out = capsys.readouterr().out
    decided = section(out)
    assert decided[-1] == ('Deploy: the schedule (steps=5 at c=1, steps=3 at c=8, steps=1 at c=32, speculation off '
                           'at c=64): add "num_speculative_tokens": 5, "num_speculative_tokens_per_batch_size": '
                           "[[1, 2, 5], [3, 16, 3], [17, 45, 1], [46, 64, 0]] to ExecStart's --speculative-config."
                           ), decided
    assert decided[-2].startswith("At c=64: no speculation at this load: the baseline's 3000.0 output tok/s is the "
                                  "best"), decided
    tail = out[out.index("Schedule (vllm): the best steps per concurrency"):]
    assert tail.splitlines()[1:7] == [
        "  c=1: steps=5 (240.0 output tok/s)", "  c=8: steps=3 (900.0 output tok/s)",
        "  c=32: steps=1 (2300.0 output tok/s)", "  c=64: speculation off (3000.0 output tok/s)",
        "  add to the --speculative-config JSON of ExecStart (its method and model stay as they are):",
        '    "num_speculative_tokens": 5, "num_speculative_tokens_per_batch_size": [[1, 2, 5], [3, 16, 3], '
        '[17, 45, 1], [46, 64, 0]]']
    assert report_main([str(f.path)], "table", schedule="sglang") == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith('    {"strategy"'))
    assert sglang_steps(json.loads(line), 8) == 3 and "--speculative-adaptive --speculative-adaptive-config " in out
    assert report_main([str(f.path)], "json", schedule="sglang") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schedule"]["sglang"] == json.loads(line) and data["schedule"]["worth_it"] is True
    assert [lv["depth"] for lv in data["schedule"]["levels"]] == [5, 3, 1, 0]
    assert data["decision"]["deploy"].endswith(
        f"to ExecStart, and write {line.strip()} to {schedules.ADAPTIVE_CONFIG_FILE}.")
    assert report_main([str(f.path)], "markdown") == 0  # without --schedule: the Decision says how to get one
    assert "- Deploy: a schedule by load (steps=5 at c=1, " in capsys.readouterr().out


def test_the_other_server_axes_are_held_at_their_best(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    for c in LOADS:
        base, *tps = MOVING[c]
        for r, k in enumerate(NOISE, 1):
            f.run(100 + c, {"steps": 0, "topk": 1, "c": c}, base * k, r, base=1)
            for i, (d, t) in enumerate(zip((1, 3, 5), tps, strict=True)):
                f.run(c * 10 + i, {"steps": d, "topk": 1, "c": c}, t * k, r)
                # topk=2 beats topk=1 at c=64 alone: held at topk=1, the best over the loads
                f.run(c * 10 + i + 5, {"steps": d, "topk": 2, "c": c}, t * k * (1.2 if c == 64 else 0.8), r)
    (f.path / "results.jsonl").write_text("".join(f.lines))
    s = planned(f)
    assert s.held == {"topk": 1} and [lv.depth for lv in s.levels] == [5, 3, 1, 0]


def test_a_sweep_without_a_depth_axis_gives_no_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = Folder(tmp_path)
    for c in (1, 8):
        f.run(100 + c, {"algo": "none", "c": c}, 100.0, base=1)
        f.run(c, {"algo": "eagle", "c": c}, 150.0)
    (f.path / "results.jsonl").write_text("".join(f.lines))
    with pytest.raises(Failed) as got:
        report_main([str(f.path)], "table", schedule="vllm")
    assert got.value.status == Exit.BAD_ARGUMENT and "one server axis of the speculation depth" in got.value.msg
    with pytest.raises(Failed, match="a report of one sweep"):
        report_main([str(f.path)], "csv", schedule="vllm")
    assert report_main([str(f.path)], "table") == 0
    assert section(capsys.readouterr().out)[-1] == "Deploy: the plan's drop-in with algo=eagle."
    one = Folder(tmp_path / "one", baseline=False)  # a sweep of one configuration over loads: nothing to choose
    for c in (1, 8):
        one.run(c, {"c": c}, 100.0 * c)
    (one.path / "results.jsonl").write_text("".join(json.dumps({**json.loads(ln), "group": 1}) + "\n"
                                                    for ln in one.lines))  # one load: c is the client's axis
    assert report_main([str(one.path)], "table") == 0
    assert section(capsys.readouterr().out)[-1] == "Deploy: the plan's drop-in (its one configuration)."
