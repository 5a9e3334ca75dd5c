"""The simulator's batch model (issue 39 §4): the arithmetic in process, the scheduler on a real event loop, and
a real simulator process whose throughput plateaus at --batch-max-running while the bench client calls a load
past it saturated."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from genready import compat
from genready_dev import sim, simargs, simbatch, simspec
from genready_dev.simbatch import BatchModel
from tests.test_benchclient import Sim, bench

PLAIN = BatchModel(max_running=4, step_seconds=0.01, token_seconds=0.001)
SPEC = BatchModel(max_running=4, step_seconds=0.01, token_seconds=0.001, spec_accept=2.5)  # k = 3, w = 4


def test_a_step_grows_with_the_batch_and_a_verify_step_costs_w_tokens_per_slot() -> None:
    assert simbatch.step_time(PLAIN, 1) == pytest.approx(0.011)
    assert simbatch.step_time(PLAIN, 8) == pytest.approx(0.018)
    assert SPEC.width == 4 and PLAIN.width == 1
    assert simbatch.step_time(SPEC, 8) == pytest.approx(0.01 + 0.001 * 8 * 4)
    assert simbatch.steps_for(PLAIN, 10) == 10 and simbatch.steps_for(SPEC, 10) == 4
    assert simbatch.steps_for(SPEC, 0) == 0


def test_capacity_is_the_full_batch_over_a_requests_steps() -> None:
    assert simbatch.capacity(PLAIN, 10) == pytest.approx(4 / (10 * 0.014))
    assert simbatch.capacity(SPEC, 10) == pytest.approx(4 / (4 * (0.01 + 0.001 * 4 * 4)))


def test_speculation_decodes_faster_below_the_crossover_rate_and_slower_above() -> None:
    n = 20
    lam = simbatch.crossover_rate(SPEC, n)
    assert lam is not None
    assert lam == pytest.approx(1.5 / (n * 0.001 * 3))
    assert simbatch.decode_seconds(SPEC, n, lam) == pytest.approx(simbatch.decode_seconds(PLAIN, n, lam))
    assert simbatch.decode_seconds(SPEC, n, 0.5 * lam) < simbatch.decode_seconds(PLAIN, n, 0.5 * lam)
    assert simbatch.decode_seconds(SPEC, n, 1.2 * lam) > simbatch.decode_seconds(PLAIN, n, 1.2 * lam)
    assert simbatch.decode_seconds(PLAIN, n, 1 / (n * 0.001)) == math.inf  # past the compute bound


def test_the_crossover_batch_is_where_tokens_per_second_per_request_meet() -> None:
    b = simbatch.crossover_batch(SPEC)
    assert b == pytest.approx(0.01 * 1.5 / (0.001 * 1.5))
    per_request = {m.spec_accept: m.per_step / simbatch.step_time(m, b) for m in (PLAIN, SPEC)}  # type: ignore[arg-type]
    assert per_request[2.5] == pytest.approx(per_request[None])


def test_no_crossover_without_a_per_token_cost_or_speculation_or_with_every_draft_accepted() -> None:
    assert simbatch.crossover_rate(PLAIN, 10) is None and simbatch.crossover_batch(PLAIN) is None
    free = BatchModel(4, 0.01, 0.0, spec_accept=2.5)
    assert simbatch.crossover_rate(free, 10) is None and simbatch.crossover_batch(free) is None
    perfect = BatchModel(4, 0.01, 0.001, spec_accept=3.0)  # k = 3: X = 3 < w = 4 still loses past a point
    assert simbatch.crossover_batch(perfect) is not None
    assert simbatch.crossover_batch(BatchModel(4, 0.01, 0.001, spec_accept=1.0)) == 0.0  # X = 1: never pays


def parse(*flags: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    simargs.add_arguments(p)
    return p.parse_args(list(flags))


def test_the_batch_model_is_off_unless_asked_for_and_takes_t0_from_token_latency() -> None:
    assert simbatch.from_args(parse()) is None
    m = simbatch.from_args(parse("--batch-max-running", "3", "--token-latency", "0.02", "--batch-token-seconds",
                                 "0.001", "--spec-accept", "2"))
    assert m == BatchModel(3, 0.02, 0.001, 2.0)


@pytest.mark.parametrize("flags", [["--batch-max-running", "0"], ["--batch-max-running", "x"],
                                   ["--batch-token-seconds", "-1"]])
def test_bad_batch_flags_are_usage_errors(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse(*flags)
    assert e.value.code == 2 and "expected" in capsys.readouterr().err


async def test_the_batcher_runs_at_most_the_cap_and_serves_in_arrival_order() -> None:
    b = simbatch.Batcher(BatchModel(max_running=3, step_seconds=0.001, token_seconds=0.0))
    finished: list[int] = []

    async def one(i: int, tokens: int) -> list[int]:
        got = [t async for t in b.decode(tokens)]
        finished.append(i)
        return got

    outs = await compat.wait_for(asyncio.gather(*(one(i, 5) for i in range(9))), 10)
    assert all(o == list(range(5)) for o in outs)
    assert b.peak_running == 3 and not b.running and not b.waiting
    assert finished[:3] == [0, 1, 2] and sorted(finished[3:6]) == [3, 4, 5]  # the 4th waits for a slot
    assert [t async for t in b.decode(0)] == []


async def test_a_speculative_request_gains_x_tokens_a_step_on_average() -> None:
    """X = 2.5: credit 2.5, 5, 7.5, 10 after each step, so 10 tokens in 4 steps, not 10."""
    b = simbatch.Batcher(BatchModel(max_running=1, step_seconds=0.001, token_seconds=0.0, spec_accept=2.5))
    assert [t async for t in b.decode(10)] == list(range(10))
    assert b.steps == 4 == simbatch.steps_for(b.m, 10)


@pytest.mark.system
def test_throughput_plateaus_at_max_running_and_a_load_past_it_is_saturated(tmp_path: Path) -> None:
    """Cap 4, 10 tokens of t(b) = 10 ms + 2.5 ms * b: 8 requests/s one at a time, 20/s at the cap (4 / 0.2 s).
    Closed loops of 4 and 12 serve about the same; one at a time much less. Offered 60/s, the load is saturated;
    offered 6/s, it is not."""
    s = Sim(tmp_path, "--token-latency", "0.01", "--batch-max-running", "4", "--batch-token-seconds", "0.0025")
    out = tmp_path / "b.jsonl"
    common = ["--url", s.url, "--max-tokens", "10", "--output", str(out)]
    try:
        runs = [bench(*common, "-n", str(n), "-c", str(c)) for n, c in ((8, 1), (40, 4), (60, 12))]
        over = bench(*common, "-n", "60", "-c", "60", "--request-rate", "60", "--seed", "3")
        under = bench(*common, "-n", "18", "-c", "8", "--request-rate", "6", "--seed", "3")
    finally:
        s.stop()
    assert all(r.returncode == 0 for r in (*runs, over, under)), [r.stdout + r.stderr for r in (*runs, over, under)]
    one, cap, past, o, u = (json.loads(line) for line in out.read_text().splitlines())
    rps = [r["requests_per_second"] for r in (one, cap, past)]
    assert rps[1] <= 20 * 1.1 and rps[2] <= 20 * 1.1, rps  # never past the cap's capacity
    assert rps[2] == pytest.approx(rps[1], rel=0.25), rps  # a plateau: 3x the concurrency, the same throughput
    assert rps[0] < 0.6 * rps[1], rps
    assert o["saturated"] is True and o["achieved_rate"] < 0.9 * o["scheduled_rate"], o["saturation"]
    assert u["saturated"] is False, u["saturation"]


# --- the depth-aware model and vLLM's run-time switching (issue 52 §3) ------------------------------------------

MOVING_SPEC = simspec.SpecModel(alpha=0.75, steps=5, draft_cost=0.05)
MOVING = BatchModel(max_running=64, step_seconds=0.02, token_seconds=0.001, spec=MOVING_SPEC)
DEPTHS = (0, 1, 3, 5)


def best_depth(m: BatchModel, batch: int) -> int:
    return max(DEPTHS, key=lambda d: simbatch.depth_tps(m, batch, d))


def test_the_truth_surface_moves_the_best_depth_with_load() -> None:
    # deep where the weights' read (t0) dominates a step, off where each token's compute (s b w) does
    assert [best_depth(MOVING, b) for b in (1, 8, 32, 64)] == [5, 3, 1, 0]
    assert simbatch.step_time(MOVING, 8) == pytest.approx(0.02 * (1 + 0.05 * 5) + 0.001 * 8 * 6)  # depth 5: w 6
    assert simbatch.step_gain(replace(MOVING, depths=(0, 0)), 1) == 1.0  # depth 0: a plain step


def test_vllms_schedule_becomes_its_dense_lookup() -> None:
    # vllm/v1/spec_decode/dynamic/utils.py: gaps and the tail carry the previous K; K capped at the config's
    got = simbatch.vllm_depths([[1, 4, 3], [9, 16, 1]], 20, 5)
    assert got[1:] == (3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
    assert simbatch.vllm_depths([[1, 4, 7]], 4, 5)[1:] == (5, 5, 5, 5)
    for bad in ([], [[2, 4, 1]], [[1, 4, 1], [4, 8, 0]], [[1, 4, -1]], [[1, 4]], "x"):
        with pytest.raises(ValueError):
            simbatch.vllm_depths(bad, 16, 5)


def test_the_simulator_takes_the_schedule_from_its_speculative_config(capsys: pytest.CaptureFixture[str]) -> None:
    table = [[1, 2, 5], [3, 16, 3], [17, 45, 1], [46, 64, 0]]
    a = parse("--batch-max-running", "64", "--token-latency", "0.02", "--batch-token-seconds", "0.001",
              "--spec-alpha", "0.75", "--speculative-config",
              json.dumps({"method": "eagle", "num_speculative_tokens": 5,
                          "num_speculative_tokens_per_batch_size": table}))
    m = simbatch.from_args(a, sim.spec_model(a), sim.vllm_speculative_config(a))
    assert m is not None and m.depths is not None
    assert [simbatch.depth_at(m, b) for b in (1, 2, 3, 16, 17, 45, 46, 64)] == [5, 5, 3, 3, 1, 1, 0, 0]
    bad = parse("--spec-alpha", "0.75", "--batch-max-running", "8", "--speculative-config",
                json.dumps({"num_speculative_tokens": 5, "num_speculative_tokens_per_batch_size": [[2, 8, 1]]}))
    assert sim.main(bad) == 2 and "must start at 1" in capsys.readouterr().err  # refused at start, as vLLM does


def test_a_schedule_from_the_sweep_reaches_the_best_static_depth_at_every_load(tmp_path: Path) -> None:
    """The sweep's measurements are the model's truth (depth_tps, with ±1 % noise over three repeats): the
    schedule written from them (sweep/report/schedule.py), run by the depth-aware model as vLLM would switch,
    is the best static depth at every load measured and within 0.90x of it at every batch size between."""
    from genready.servers import schedules
    from genready.sweep.report import collect, schedule
    from tests.test_sweep_schedule import LOADS, sweep

    surface = {c: tuple(simbatch.depth_tps(MOVING, c, d) for d in DEPTHS) for c in LOADS}
    s = schedule.schedule(collect.rows_of([sweep(tmp_path, surface).path]))
    keys = schedules.vllm_keys(s.tiers())
    assert keys is not None and [lv.depth for lv in s.levels] == [5, 3, 1, 0]
    run = replace(MOVING, depths=simbatch.vllm_depths(keys["num_speculative_tokens_per_batch_size"], 64,
                                                      keys["num_speculative_tokens"]))
    for b in range(1, 65):
        scheduled = b * simbatch.step_gain(run, b) / simbatch.step_time(run, b)
        best = max(simbatch.depth_tps(MOVING, b, d) for d in DEPTHS)
        assert scheduled / best >= (0.97 if b in LOADS else 0.90), (b, scheduled / best)


async def test_the_batcher_switches_depth_per_step_by_the_requests_running() -> None:
    # 8 requests together run at the schedule's depth for 8 (3), one alone at its depth for 1 (5): their steps
    m = replace(MOVING, step_seconds=0.001, token_seconds=0.0001,
                depths=simbatch.vllm_depths([[1, 2, 5], [3, 16, 3]], 64, 5))
    x3 = simbatch.step_gain(replace(m, depths=(0, 3)), 1)
    x5 = simbatch.step_gain(m, 1)
    b = simbatch.Batcher(m)

    async def one() -> list[int]:
        return [t async for t in b.decode(40)]

    outs = await compat.wait_for(asyncio.gather(*(one() for _ in range(8))), 10)
    assert all(o == list(range(40)) for o in outs) and b.steps == math.ceil(40 / x3 - 1e-9)
    alone = simbatch.Batcher(m)
    assert [t async for t in alone.decode(40)] == list(range(40)) and alone.steps == math.ceil(40 / x5 - 1e-9)
