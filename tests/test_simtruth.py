"""The simulator knows the truth (issue 37 §4): the speculative model's arithmetic, the simulator's pacing against
it on a real event loop, per-category accept lengths through the bench client, and a sweep with repeats whose
every speedup interval holds the model's true speedup (or says it is noise)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.tools import prompts
from genready_dev import sim, simspec, simtruth
from genready_dev.harness import GENREADY, PY
from genready_dev.simrequests import GenRequest
from genready_dev.usermanager import UserManager
from tests.test_benchclient import Sim, bench
from tests.test_sweep import Rig

T0 = 0.004
PLAIN = f"--token-latency {T0}"


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


# --- the simulator's pacing, on a real event loop -------------------------------------------------------------


async def _run(flags: str, texts: list[str], tokens: int, concurrency: int) -> float:
    """Wall seconds for generations of `texts` through the simulator's own token pacing, `concurrency` at once
    (the HTTP layer aside: the model is the simulator's decode time)."""
    s = sim.Simulator(sim.parser().parse_args(flags.split()))
    todo = iter(texts)

    async def worker() -> None:
        for text in todo:
            s._prefill(GenRequest(1, tokens, True, prompt_key=json.dumps(text)))
            got = [w async for w, _ in s._tokens(tokens)]
            assert len(got) == tokens

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


@pytest.mark.parametrize("steps,topk", [(3, 2), (8, 1)])
async def test_the_simulators_throughput_follows_the_model(steps: int, topk: int) -> None:
    texts = [p.text for p in prompts.CATEGORIZED[::4]]  # 12 prompts, two of each category
    cats = [simspec.category_of(json.dumps(t)) for t in texts]
    assert None not in cats
    tokens, c = 24, 3
    plain = await _run(PLAIN, texts, tokens, c)
    fast = await _run(spec(steps, topk), texts, tokens, c)
    want_plain = simtruth.run_seconds(PLAIN, tokens, cats, c)
    want = simtruth.run_seconds(spec(steps, topk), tokens, cats, c)
    # never faster than the model (a sleep does not end early); a loaded machine adds a little, not per step
    assert want_plain * 0.98 <= plain <= want_plain * 1.25 + 0.02, (plain, want_plain)
    assert want * 0.98 <= fast <= want * 1.25 + 0.02, (fast, want)
    truth = simtruth.true_speedup(spec(steps, topk), PLAIN, tokens=tokens, cats=cats, concurrency=c)
    assert plain / fast == pytest.approx(truth, rel=0.15), (plain / fast, truth)


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


# --- a sweep with repeats: every true speedup inside its interval, or marked noisy ------------------------------------


@pytest.fixture
def rig(manager: UserManager, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(manager, tmp_path)
    yield r
    r.close()


TOKENS, N, C, SEED = 24, 12, 2, 1
RESIDUE = 1.01
SLOW_T0 = 0.016  # a request's fixed cost (HTTP, the client: ~3 ms here) stays small against its decode


def client_overheads(tmp: Path) -> list[float]:
    """Each of 3 runs' seconds per request beyond its decode: 1-token requests to a simulator of the sweep's token
    latency (the bench client, HTTP and the last step's wake-up; simtruth's doc)."""
    s = Sim(tmp, "--token-latency", str(SLOW_T0))
    try:
        [runs] = simtruth.client_overheads([simtruth.Shape(s.url, SLOW_T0)], requests=N, concurrency=C, seed=SEED,
                                           runs=3)
        return runs
    finally:
        s.stop()


@pytest.mark.system
def test_every_true_speedup_lies_inside_its_interval_or_is_marked_noisy(rig: Rig) -> None:
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
    cats, overheads = simtruth.categories(N, SEED), client_overheads(rig.tmp)
    for name, flags in configs.items():
        row = next(r for r in rows if r["point"] == f"flags={flags} c={C}")
        low, truth, high = simtruth.true_range(flags, plain, tokens=TOKENS, cats=cats, concurrency=C,
                                               overheads=overheads)
        sp = row["speedup"]
        print(name, low, truth, high, sp)
        assert sp["low"] is not None and sp["high"] is not None, sp
        # RESIDUE: what the model leaves out beyond the measured overhead (the client's handling of the last
        # events when streams collide, a busy machine's later wake-ups; the overhead's own spread moves the truth
        # by +-0.2-0.4 %) is up to 0.4 % on a quiet 2-core VM (bench/sweep_decide.py) and more under CI's
        # parallel tests, while three repeats of a simulator with almost no run-to-run noise give intervals of
        # +-0.1 %; low and high are printed to show how far the truth itself is known
        held = sp["low"] / RESIDUE <= truth <= sp["high"] * RESIDUE
        assert held or sp["within_noise"] or sp.get("drifted"), (name, truth, sp)
        assert (sp["value"] > 1) == (truth > 1), (name, truth, sp)  # the sign is right in any case
