"""The simulator knows the truth (issue 37 §4): the speculative model's arithmetic, the simulator's pacing against
it on an event loop with a clock of its own (exact, whatever else the machine runs), per-category accept lengths
through the bench client, and a sweep with repeats whose every speedup interval holds the model's true speedup (or
says it is noise)."""

from __future__ import annotations

import asyncio
import json
import math
import random
import selectors
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.tools import prompts
from genready_dev import sim, simargs, simspec, simtruth
from genready_dev.harness import GENREADY, PY
from genready_dev.simrequests import GenRequest
from tests.test_benchclient import Sim, bench
from tests.test_sweep import Rig

T0 = 0.004
PLAIN = f"--token-latency {T0}"
# the sweep's runs (generated in process, and end to end): tokens a request, requests, concurrency, --seed
TOKENS, N, C, SEED = 24, 12, 2, 1
SLOW_T0 = 0.016  # a request's fixed cost (HTTP, the client: ~3 ms here) stays small against its decode


def spec(steps: int, topk: int, alpha: float = 0.6, extra: str = "") -> str:
    return (f"--token-latency {T0} --spec-alpha {alpha} --speculative-num-steps {steps} "
            f"--speculative-eagle-topk {topk} {extra}").strip()


# --- the model ---------------------------------------------------------------------------------------------


def test_a_chain_of_drafts_accepts_leviathans_expected_tokens_per_step() -> None:
    m = simspec.SpecModel(alpha=0.6, steps=3, topk=1)
    assert m.verified == 4 and m.accept(None) == pytest.approx((1 - 0.6 ** 4) / 0.4)
    assert m.step_factor == pytest.approx(1 + 0.15 * 3 + 0.12 * 3)
    wide = simspec.SpecModel(alpha=0.6, steps=3, topk=2)  # a tree: a depth is accepted at 1 - 0.4^2 = 0.84
    assert wide.verified == 7 and wide.accept(None) == pytest.approx((1 - 0.84 ** 4) / 0.16)
    # N below the depth bounds it: 2 verified tokens, one draft
    assert simspec.SpecModel(alpha=0.6, steps=3, topk=1, draft_tokens=2).accept(None) == pytest.approx(1.6)
    free = simspec.SpecModel(alpha=0.6, steps=3, draft_cost=0.0, verify_cost=0.0)
    assert free.step_factor == 1.0  # Leviathan's formula with c = 0: the speedup is the accept length


def test_categories_are_accepted_as_spec_bench_orders_them_and_the_table_overrides() -> None:
    m = simspec.SpecModel(alpha=0.6, steps=3, topk=1)
    x = {c: m.accept(c) for c in simspec.CATEGORY_FACTORS}
    assert x["coding"] > x["math_reasoning"] > x["summarization"] > x["extraction"] > x["translation"]
    assert x["writing"] == x["translation"] and min(x.values()) > 1 and max(x.values()) < 4
    assert set(simspec.CATEGORY_FACTORS) == {p.category for p in prompts.CATEGORIZED}
    over = simspec.SpecModel(alpha=0.6, steps=3, table={"writing": 3.9})
    assert over.accept("writing") == 3.9 and over.accept("coding") == x["coding"]
    assert simspec.SpecModel(alpha=0.9, steps=3).alpha_of("coding") == simspec.MAX_ALPHA


def test_the_flags_make_the_model_and_the_true_speedup() -> None:
    model, t0 = simtruth.model_of(spec(3, 2, extra="--spec-accept-category coding=3"))
    assert t0 == T0 and model == simspec.SpecModel(alpha=0.6, steps=3, topk=2, table={"coding": 3.0})
    vllm, _ = simtruth.model_of(["--spec-alpha", "0.5", "--speculative-config", '{"num_speculative_tokens": 5}'])
    assert vllm is not None and (vllm.steps, vllm.topk, vllm.verified) == (5, 1, 6)
    assert simtruth.model_of(PLAIN)[0] is None
    cats = simtruth.categories(24, 1)
    assert len(cats) == 24 and set(cats) <= set(simspec.CATEGORY_FACTORS)
    assert simtruth.true_speedup(PLAIN, PLAIN, tokens=48, cats=cats, concurrency=2) == 1.0
    # one request at a time: the baseline's tokens x t0 over the configuration's steps x step time, summed
    one = simtruth.true_speedup(spec(3, 2), PLAIN, tokens=48, cats=["coding"], concurrency=1)
    m = simspec.SpecModel(alpha=0.6, steps=3, topk=2)
    assert one == pytest.approx(48 / (math.ceil(48 / m.accept("coding")) * m.step_factor))
    assert simtruth.makespan([3.0, 1.0, 1.0, 1.0], 2) == 3.0 and simtruth.makespan([1.0] * 5, 2) == 3.0


def test_the_truth_is_known_as_well_as_the_overhead_and_the_overhead_excludes_the_decode() -> None:
    cats = simtruth.categories(12, 1)
    fast: dict[str, Any] = {"tokens": 24, "cats": cats, "concurrency": 2}
    assert simtruth.true_range(spec(3, 2), PLAIN, **fast, overheads=[0.002] * 3) == (
        (simtruth.true_speedup(spec(3, 2), PLAIN, **fast, overhead=0.002),) * 3)
    low, mid, high = simtruth.true_range(spec(3, 2), PLAIN, **fast, overheads=[0.003, 0.001, 0.002])
    assert mid == simtruth.true_speedup(spec(3, 2), PLAIN, **fast, overhead=0.002)
    # the baseline's lowest against the configuration's highest, and the other way; a speedup above 1 is pulled
    # towards 1 by the overhead
    assert low < mid < high and mid < simtruth.true_speedup(spec(3, 2), PLAIN, **fast)
    assert low == pytest.approx(simtruth.run_seconds(PLAIN, 24, cats, 2, 0.001)
                                / simtruth.run_seconds(spec(3, 2), 24, cats, 2, 0.003))
    assert high == pytest.approx(simtruth.run_seconds(PLAIN, 24, cats, 2, 0.003)
                                 / simtruth.run_seconds(spec(3, 2), 24, cats, 2, 0.001))
    # 12 requests from 2 slots: 6 a slot, each a step of t0 and its overhead
    assert simtruth.overhead_of(6 * (T0 + 0.0025), 12, 2, T0) == pytest.approx(0.0025)
    assert simtruth.overhead_of(0.015, 12, 2) == pytest.approx(0.0025)
    # requests of 24 one-token steps: the decode is 24 steps
    assert simtruth.overhead_of(6 * (24 * T0 + 0.003), 12, 2, T0, tokens=24) == pytest.approx(0.003)


def test_a_3_by_3_grid_has_a_best_inside_and_slowdowns() -> None:
    """The default costs make a real choice: depth 3, top-k 2 best, the deepest and widest slower than no
    speculation at all (what bench/sweep_decide.py sweeps)."""
    cats = simtruth.categories(24, 1)
    grid = {(s, k): simtruth.true_speedup(spec(s, k), PLAIN, tokens=48, cats=cats, concurrency=2)
            for s in (1, 3, 8) for k in (1, 2, 8)}
    best = max(grid, key=lambda p: grid[p])
    assert best == (3, 2) and sorted(grid.values())[-2] < 0.95 * grid[best], grid
    assert grid[(8, 1)] < 1 and grid[(3, 8)] < 1, grid


def test_spec_alpha_and_spec_accept_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(sim.parser().parse_args(["--spec-alpha", "0.6", "--spec-accept", "2"])) == 2
    assert "give one" in capsys.readouterr().err
    assert sim.main(sim.parser().parse_args(["--spec-alpha", "0.6", "--speculative-num-steps", "0"])) == 2
    assert "--speculative-num-steps: expected a whole number >= 1, found 0" in capsys.readouterr().err
    for bad in ("0", "1", "x"):
        with pytest.raises(SystemExit):
            sim.parser().parse_args(["--spec-alpha", bad])


# --- the simulator's pacing, on an event loop with a clock of its own ------------------------------------------


class _LateSelector(selectors.DefaultSelector):
    """A selector that never waits: when nothing is ready, its clock jumps to the loop's next timer and `late`
    past it, as a loaded machine wakes a sleeper late (never early)."""

    def __init__(self, late: float) -> None:
        super().__init__()
        self.now, self.late = 0.0, late

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if not events and timeout is None:
            raise AssertionError("every task waits, and not on a timer: the run would never end")
        if not events and timeout:
            self.now += timeout + self.late
        return events


class LateClockLoop(asyncio.SelectorEventLoop):
    """An event loop on the selector's clock: the simulator's sleeps take no wall time and its pacing is timed
    exactly, whatever else the machine runs; every wake-up `late` seconds late."""

    def __init__(self, late: float) -> None:
        self.clock = _LateSelector(late)
        super().__init__(self.clock)

    def time(self) -> float:
        return self.clock.now


def _run(flags: str, texts: list[str], tokens: int, concurrency: int, late: float) -> float:
    """Seconds, on a LateClockLoop's clock, for generations of `texts` through the simulator's own token pacing,
    `concurrency` at once (the HTTP layer aside: the model is the simulator's decode time)."""
    s = sim.Simulator(sim.parser().parse_args(flags.split()))
    todo = iter(texts)

    async def worker() -> None:
        for text in todo:
            s._prefill(GenRequest(1, tokens, True, prompt_key=json.dumps(text)))
            got = [w async for w, _ in s._tokens(tokens)]
            assert len(got) == tokens

    async def run() -> None:
        await asyncio.gather(*(worker() for _ in range(concurrency)))

    loop = LateClockLoop(late)
    try:
        loop.run_until_complete(run())
        return loop.time()
    finally:
        loop.close()


@pytest.mark.parametrize("steps,topk", [(3, 2), (8, 1)])
def test_the_simulators_throughput_follows_the_model(steps: int, topk: int) -> None:
    texts = [p.text for p in prompts.CATEGORIZED[::4]]  # 12 prompts, two of each category
    cats = [simspec.category_of(json.dumps(t)) for t in texts]
    assert None not in cats
    tokens, c = 24, 3
    truth = simtruth.true_speedup(spec(steps, topk), PLAIN, tokens=tokens, cats=cats, concurrency=c)
    for flags in (PLAIN, spec(steps, topk)):
        want = simtruth.run_seconds(flags, tokens, cats, c)
        # woken on time: the model's time exactly
        assert _run(flags, texts, tokens, c, 0.0) == pytest.approx(want, rel=1e-9), flags
        # woken 1 ms late every time (a loaded machine): a request keeps its own clock, so it ends at most one
        # late wake-up after the model says, not one per step (24 steps a request without speculation)
        got = _run(flags, texts, tokens, c, 0.001)
        assert want <= got <= want + len(texts) * 0.001, (flags, got, want)
    on_time = _run(PLAIN, texts, tokens, c, 0.0) / _run(spec(steps, topk), texts, tokens, c, 0.0)
    assert on_time == pytest.approx(truth, rel=1e-9)


def test_generated_repeats_give_intervals_that_hold_the_true_speedup() -> None:
    """The sweep below end to end, on generated runs with a known truth: each run's requests a drawn overhead
    longer than the model's decode (the client and HTTP: 3 +- 1 ms, seeded), three runs a side, their output
    tok/s through noise.ratio. Its 95 % interval holds the true speedup (at the overhead's mean) in about 95 of
    100 trials (a 50 % interval would in about 50), and the sign is right in every one."""
    from genready.sweep import noise

    rng = random.Random(5)
    cats, plain, held = simtruth.categories(N, SEED), f"--token-latency {SLOW_T0}", 0
    configs = (spec(3, 2).replace(f"{T0}", f"{SLOW_T0}"), spec(8, 1).replace(f"{T0}", f"{SLOW_T0}"))
    truth = {f: simtruth.true_speedup(f, plain, tokens=TOKENS, cats=cats, concurrency=C, overhead=0.003)
             for f in configs}
    assert truth[configs[0]] > 1.2 and truth[configs[1]] < 0.8  # a speedup and a slowdown
    for trial in range(100):
        flags = configs[trial % 2]
        tps = {f: [N * TOKENS / simtruth.run_seconds(f, TOKENS, cats, C, max(0.0, rng.gauss(0.003, 0.001)))
                   for _ in range(3)] for f in (flags, plain)}
        got = noise.ratio(tps[flags], tps[plain])
        assert got is not None and got.low is not None and got.high is not None
        held += got.low <= truth[flags] <= got.high
        assert (got.value > 1) == (truth[flags] > 1), (flags, got, truth[flags])
    assert held >= 88, held


# --- through the bench client: per-category accept length --------------------------------------------------------


@pytest.mark.system
def test_per_category_accept_lengths_follow_the_defaults_through_the_bench_client(tmp_path: Path) -> None:
    s = Sim(tmp_path, *spec(3, 1, alpha=0.6).split())
    try:
        out = tmp_path / "a.jsonl"
        r = bench("--url", s.url, "-n", "48", "-c", "8", "--max-tokens", "60", "--seed", "1", "--output", str(out))
    finally:
        s.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())["categories"]
    m = simspec.SpecModel(alpha=0.6, steps=3)
    for name, c in got.items():  # 60 tokens at X take ceil(60 / X) steps: the figure is 60 / that
        assert c["accept_length"] == pytest.approx(60 / math.ceil(60 / m.accept(name)), abs=1e-3), (name, c)
    x = {k: v["accept_length"] for k, v in got.items()}
    assert x["coding"] > x["math_reasoning"] > x["summarization"] >= x["extraction"] >= x["translation"], x
    assert x["writing"] < x["math_reasoning"] and x["writing"] < x["coding"], x
    # a category accepted longer also decodes faster, per request
    assert got["coding"]["output_tokens_per_second"] > got["writing"]["output_tokens_per_second"], got


# --- a sweep with repeats: each speedup with its interval, on the truth's side of 1 (the smoke) ------------------


@pytest.mark.system
def test_a_sweep_with_repeats_gives_each_speedup_an_interval_on_the_truths_side_of_1(rig: Rig) -> None:
    """The end-to-end smoke of test_generated_repeats_give_intervals_that_hold_the_true_speedup: simulator units,
    the bench client, results lines and the report. How often an interval holds the truth is a statistic of
    wall-clock runs, which a busy machine moves (the client's own time is part of every run): it is tested on the
    generated runs, and here the figures only have to arrive, with the speedup and the slowdown on their sides."""
    plain = f"--token-latency {SLOW_T0}"
    configs = {"fast": spec(3, 2).replace(f"{T0}", f"{SLOW_T0}"), "slow": spec(8, 1).replace(f"{T0}", f"{SLOW_T0}")}
    doc = {"target": "t", "timeout": 60, "repeats": 3,
           "command": [PY, "-m", "genready.benchclient", "--url", rig.url, "-n", str(N), "-c", "{c}",
                       "--max-tokens", str(TOKENS), "--seed", str(SEED), "--output", "{out}/bench.jsonl"],
           "dropin": '[Service]\nEnvironment="SIM_FLAGS={flags}"\n',
           "baseline": {"flags": plain},
           "matrix": {"flags": list(configs.values()), "c": [C]}}
    plan = rig.tmp / "plan.toml"
    plan.write_text(tomli_w.dumps(doc))
    p = rig.sweep(plan)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out + rig.err.read_text()
    # each ok run's results line carries its bench line's figures per prompt category (issue 37 §2)
    oks = [rec for ln in (rig.results / "results.jsonl").read_text().splitlines() if (rec := json.loads(ln))
           ["status"] == "ok"]
    assert len(oks) == 9, oks  # 3 repeats of the baseline and of 2 configurations
    for rec in oks:
        assert sum(c["requests"] for c in rec["categories"].values()) == N, rec
        assert all(("accept_length" in c) == ("baseline" not in rec) for c in rec["categories"].values()), rec
    report = subprocess.run([*GENREADY, "sweep", "report", str(rig.results), "--format", "json"], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    rows = [r for r in json.loads(report)["rows"] if r.get("speedup")]
    assert len(rows) == 2, report
    cats = simtruth.categories(N, SEED)
    for name, flags in configs.items():
        row = next(r for r in rows if r["point"] == f"flags={flags} c={C}")
        truth = simtruth.true_speedup(flags, plain, tokens=TOKENS, cats=cats, concurrency=C, overhead=0.003)
        sp = row["speedup"]
        print(name, truth, sp)
        assert sp["low"] is not None and sp["low"] <= sp["value"] <= sp["high"], sp
        assert (sp["value"] > 1) == (truth > 1), (name, truth, sp)  # 1.32x and 0.70x: the sign is right


def test_load_noise_draws_one_factor_per_start_from_its_seed() -> None:
    """--load-noise: a start's steps, prefill and batch cost are all scaled by one factor; a seed repeats it,
    another seed gives another, and none is 1.0 by chance of the flag being ignored."""
    def scaled(seed: int) -> tuple[float, float, float, float]:
        a = sim.parser().parse_args(["--token-latency", "0.02", "--prefill-latency", "0.001",
                                     "--batch-token-seconds", "0.002", "--load-noise", "0.05",
                                     "--load-noise-seed", str(seed)])
        f = simargs.apply_load_noise(a)
        return f, a.token_latency / 0.02, a.prefill_latency / 0.001, a.batch_token_seconds / 0.002

    f1, *ratios = scaled(1)
    assert f1 != 1.0 and all(abs(r - f1) < 1e-12 for r in ratios)
    assert scaled(1)[0] == f1 and scaled(2)[0] != f1
    factors = [scaled(s)[0] for s in range(200)]
    assert 0.04 < statistics.stdev(factors) < 0.06  # the flag's standard deviation, not another
    quiet = sim.parser().parse_args(["--token-latency", "0.02"])
    assert simargs.apply_load_noise(quiet) == 1.0 and quiet.token_latency == 0.02
