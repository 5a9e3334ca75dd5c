"""Issue 51 §3, §5: a search over the server axes instead of the grid. The search's decisions in-process (a pure
module, sweep/explore.py) on generated truth surfaces (genready_dev/simsurface.py) and on small hand-made ones;
the plan keys; the order the runner loads groups in (run/order.py). Whole sweeps on the simulator: at the end.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import explore, noise
from genready.sweep import plan as sweepplan
from genready.sweep.report import collect
from genready.sweep.run import baseline, noisecheck, order
from genready.sweep.run.results import Results, first_load
from genready_dev import sim, simbatch, simsurface
from genready_dev.harness import GENREADY, PY
from tests.test_sweep import Rig

AXES = explore.Axes(("steps", "topk", "draft_tokens"),
                    (simsurface.STEPS, simsurface.TOPK, simsurface.DRAFT_TOKENS))


def searched(truth: Callable[[explore.Config], dict[str, float] | None], axes: explore.Axes = AXES,
             **kw: Any) -> explore.Pattern:
    """A pattern search run to its end, each load measuring `truth` (None: the configuration does not start)."""
    p = explore.Pattern(axes, **kw)
    while (c := p.next_load()) is not None:
        got = truth(c)
        p.told(c, None if got is None else {s: [v] for s, v in got.items()})
        assert len(p.visited) <= axes.size
    return p


def surface_truth(seed: int) -> Callable[[explore.Config], dict[str, float]]:
    def truth(c: explore.Config) -> dict[str, float]:
        config = tuple(AXES.values_of(c).values())
        return {f"concurrency={n}": simsurface.true_tps(seed, config, n) for n in simsurface.CONCURRENCY}  # type: ignore[arg-type]
    return truth


def grid2(values: dict[tuple[int, int], float]) -> tuple[explore.Axes, Callable[[explore.Config], dict[str, float]]]:
    """A 2-axis grid whose one client setting measures `values` (position -> figure; 1.0 elsewhere)."""
    axes = explore.Axes(("a", "b"), (tuple(range(5)), tuple(range(5))))
    return axes, lambda c: {"c=1": values.get((c[0], c[1]), 1.0)}


# --- the truth surfaces ------------------------------------------------------------------------------------------

def test_a_surface_is_a_pure_function_of_its_seed_and_its_best_moves_with_concurrency() -> None:
    assert simsurface.surface(3) == simsurface.surface(3) and simsurface.surface(3) != simsurface.surface(4)
    assert simsurface.true_tps(3, (4, 2, 8), 4) == simsurface.true_tps(3, (4, 2, 8), 4)
    moved = [s for s in range(10) if simsurface.best(s, 1)[0] != simsurface.best(s, 16)[0]]
    assert len(moved) >= 8, moved  # deep, wide trees at one request in flight; smaller ones at 16
    on_edge = [s for s in range(10) if any(simsurface.best(s, n)[0][0] in (simsurface.STEPS[0], simsurface.STEPS[-1])
                                           for n in simsurface.CONCURRENCY)]
    assert on_edge  # some bests on an edge of the grid
    tuned = [s for s in range(10) if simsurface.surface(s).bump < 1]
    assert tuned == [1, 4, 7]


def test_the_simulator_paces_its_batch_by_the_same_function() -> None:
    a = sim.parser().parse_args(["--surface", "3", "--batch-max-running", "32", "--speculative-num-steps", "4",
                                 "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "8",
                                 "--token-latency", str(simsurface.TOKEN_LATENCY),
                                 "--batch-token-seconds", str(simsurface.BATCH_TOKEN_SECONDS)])
    m = simbatch.from_args(a)
    assert m is not None and m.surface == simsurface.surface(3).shape(4, 2, 8)
    shape = m.surface
    steps = simsurface.steps_for(24, shape.accept)
    # a run of 48 requests of 24 tokens at concurrency 4: 12 rounds of `steps` steps of 4 requests
    wall = 12 * steps * simbatch.step_time(m, 4)
    assert 48 * 24 / wall == pytest.approx(simsurface.true_tps(3, (4, 2, 8), 4))
    assert simbatch.step_gain(m, 4) == shape.accept


def test_the_simulator_refuses_a_surface_without_the_batch_model() -> None:
    assert sim.main(sim.parser().parse_args(["--surface", "1"])) == 2


# --- the search's decisions --------------------------------------------------------------------------------------

def test_the_search_finds_each_settings_best_on_most_surfaces_with_fewer_loads_than_the_grid() -> None:
    found, loads = 0, []
    for seed in range(10):
        p = searched(surface_truth(seed))
        loads.append(len(p.visited))
        ok = True
        for n in simsurface.CONCURRENCY:
            best = max(p.measured, key=lambda c: p.measured[c][f"concurrency={n}"].value)
            true = simsurface.true_tps(seed, tuple(AXES.values_of(best).values()), n)  # type: ignore[arg-type]
            ok &= true >= 0.97 * simsurface.best(seed, n)[1]
        found += ok
    assert found >= 9 and max(loads) <= 20 and sum(loads) <= 0.4 * 10 * AXES.size, (found, loads)


def test_it_climbs_from_the_start_and_stops_where_no_neighbour_is_better() -> None:
    axes, truth = grid2({(3, 3): 5.0, (2, 3): 4.0, (2, 2): 3.0, (3, 2): 4.0, (1, 2): 2.0})
    p = searched(truth, axes)
    assert p.moves[0]["why"].startswith("start") and p.moves[0]["config"] == {"a": 2, "b": 2}
    assert p.best == {"c=1": (3, 3)}
    for c, _, _ in p._neighbours((3, 3), None):
        assert c in p.visited  # every neighbour of the best loaded, none better
    assert p.unloaded() and all(why == explore.NOT_CLOSE for why in p.unloaded().values())
    assert len(p.visited) < axes.size


def test_a_neighbour_better_by_less_than_min_gain_does_not_move_the_best() -> None:
    axes, truth = grid2({(2, 2): 1.0, (3, 2): 1.015, (4, 2): 1.5})
    assert searched(truth, axes, min_gain=0.02).best == {"c=1": (2, 2)}
    assert searched(truth, axes, min_gain=0.01).best == {"c=1": (4, 2)}


def test_repeats_widen_the_margin_by_their_interval() -> None:
    new, old = explore.Measured((1.05, 1.15, 0.95)), explore.Measured((1.0, 1.0, 1.0))
    assert not explore.beats(new, old, 0.02)  # 5 % higher, but its runs spread more than that
    assert explore.beats(explore.Measured((1.05, 1.05, 1.05)), old, 0.02)


def test_each_client_setting_keeps_its_own_best_and_the_search_goes_on_while_any_improves() -> None:
    axes = explore.Axes(("a",), (tuple(range(7)),))
    p = searched(lambda c: {"c=1": 10.0 - abs(c[0] - 0), "c=16": 10.0 - abs(c[0] - 6)}, axes, start=(3,))
    assert p.best == {"c=1": (0,), "c=16": (6,)} and len(p.visited) == 7


def test_a_ridge_two_axes_must_climb_together_is_crossed() -> None:
    # each single step from (2, 2) loses; one step on both axes at once wins
    axes, truth = grid2({(2, 2): 3.0, (3, 2): 2.8, (2, 3): 2.8, (1, 2): 1.0, (2, 1): 1.0, (3, 3): 4.0})
    p = searched(truth, axes)
    assert p.best == {"c=1": (3, 3)}
    assert any("ridge" in m["why"] for m in p.moves)


def test_the_audit_loads_unvisited_configurations_at_random_and_says_what_it_found() -> None:
    axes, truth = grid2({(2, 2): 3.0, (0, 0): 9.0})  # a second optimum, not next to the first
    plain = searched(truth, axes, audit=0)
    assert plain.best == {"c=1": (2, 2)} and not plain.audited
    p = searched(truth, axes, audit=axes.size, seed=5)  # enough to reach it
    assert p.best == {"c=1": (0, 0)} and p.audit_better == [(0, 0)]
    assert "found 1 better" in explore.coverage_note(p.summary())
    again = searched(truth, axes, audit=3, seed=5)
    assert [m["config"] for m in again.moves] == [m["config"] for m in searched(truth, axes, audit=3, seed=5).moves]
    some = searched(truth, axes, audit=3, seed=5)
    assert len(some.audited) == 3 and [m["why"] for m in some.moves if m["why"].startswith("audit")] == [
        "audit 1 of 3", "audit 2 of 3", "audit 3 of 3"]


def test_a_configuration_without_a_figure_is_never_a_best_and_its_neighbours_are_tried() -> None:
    axes, truth = grid2({(2, 2): 9.0, (1, 2): 1.5, (0, 2): 2.0})
    p = searched(lambda c: None if c == (2, 2) else truth(c), axes)  # the start does not start
    assert (2, 2) in p.failed and p.best == {"c=1": (0, 2)}
    assert p.moves[1]["why"].startswith("neighbour of a failed load")


def test_the_same_measurements_replay_the_same_search() -> None:
    """--resume: told the loads an earlier run made, in order, the search asks for the same next ones."""
    rng = random.Random(1)
    noisy = {c: {"c=1": rng.uniform(1, 2)} for c in AXES.all()}
    first = searched(lambda c: noisy[c], audit=2, seed=3)
    second = searched(lambda c: noisy[c], audit=2, seed=3)
    assert [m["config"] for m in first.moves] == [m["config"] for m in second.moves]


def test_stopped_early_the_rest_is_out_of_budget() -> None:
    p = explore.Pattern(AXES)
    c = p.next_load()
    assert c is not None
    p.told(c, {"c=1": [1.0]})
    p.stop("out of budget")
    assert p.next_load() is None and set(p.unloaded().values()) == {"out of budget"}
    assert len(p.unloaded()) == AXES.size - 1


# --- the plan keys --------------------------------------------------------------------------------------------

DROPIN = '"[Service]\\nEnvironment=A={steps} B={topk}"'


def plan(text: str) -> sweepplan.Plan:
    return sweepplan.parse_plan(tomllib.loads(text), "plan.toml")


def test_the_strategy_keys_and_their_defaults() -> None:
    p = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\n[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1, 4]')
    assert (p.strategy, p.start, p.audit, p.audit_seed, p.min_gain) == ("grid", None, 0, 0, 0.02)
    p = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\nstrategy = "pattern"\naudit = 2\naudit_seed = 7\n'
             'min_gain = 0.05\nstart = { steps = 4, topk = 1 }\n[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1, 4]')
    assert (p.strategy, p.start, p.audit, p.audit_seed, p.min_gain) == ("pattern", (("steps", 4), ("topk", 1)), 2, 7,
                                                                        0.05)


@pytest.mark.parametrize(("extra", "says"), [
    ('strategy = "random"', 'plan.toml: strategy: expected "grid" or "pattern", found string \'random\''),
    ('strategy = "pattern"\naudit = -1', "plan.toml: audit: expected an integer from 0 to 1000, found integer -1"),
    ('strategy = "pattern"\nmin_gain = 2', "plan.toml: min_gain: expected a fraction from 0 to 1 (0.02 is 2 %), "
     "found integer 2"),
    ("audit = 3", 'plan.toml: audit: expected strategy = "pattern" (the grid loads every configuration), found '
     "strategy 'grid'"),
    ('strategy = "pattern"\nstart = { steps = 3, topk = 1 }', "plan.toml: start.steps: expected one of the matrix's "
     "values: 1, 2, 4, found 3"),
    ('strategy = "pattern"\nstart = { steps = 1 }', "plan.toml: start: expected a table giving each server axis one "
     "of its values: steps, topk, found a table of steps"),
    ('strategy = "pattern"\nstart = 2', "plan.toml: start: expected a table giving each server axis one of its "
     "values: steps, topk, found int"),
])
def test_a_bad_strategy_key_is_refused_naming_file_key_expected_and_found(extra: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        plan(f'command = "x {{c}}"\ndropin = {DROPIN}\n{extra}\n[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1]')
    assert str(e.value) == says


def test_a_search_needs_server_axes_that_make_a_full_grid() -> None:
    with pytest.raises(ConfigError, match=r"strategy: expected server axes whose values make a full grid .* found "
                                          r"2 of the 4 combinations of steps, topk"):
        plan(f'command = "x"\ndropin = {DROPIN}\nstrategy = "pattern"\n[[points]]\nsteps = 1\ntopk = 1\n'
             "[[points]]\nsteps = 2\ntopk = 2")
    with pytest.raises(ConfigError, match="strategy: expected server axes to search"):
        plan('command = "x {c}"\nstrategy = "pattern"\n[matrix]\nc = [1, 2]')


# --- the reloads: the best named by its mean over loads --------------------------------------------------------

def noisy(values: dict[tuple[int, int], float], load_noise: dict[tuple[tuple[int, int], int], float]
          ) -> tuple[explore.Axes, Callable[[explore.Pattern, explore.Config], dict[str, list[float]]]]:
    """A 2-axis grid as grid2, each load's figure times its own factor (configuration, load K -> factor; 1.0 else)."""
    axes, truth = grid2(values)

    def measure(p: explore.Pattern, c: explore.Config) -> dict[str, list[float]]:
        k = p.reload_of(c)
        return {s: [v * load_noise.get(((c[0], c[1]), k), 1.0)] for s, v in truth(c).items()}
    return axes, measure


def reloaded(axes: explore.Axes, measure: Callable[[explore.Pattern, explore.Config], dict[str, list[float]]],
             **kw: Any) -> explore.Pattern:
    p = explore.Pattern(axes, **kw)
    while (c := p.next_load()) is not None:
        p.told(c, measure(p, c))
    return p


def test_a_close_call_decided_by_one_loads_noise_is_loaded_again_and_named_by_the_mean() -> None:
    """(2, 2) is truly 1.5 % better than (2, 3); (2, 3)'s first load drew +3 %, so by one load it leads. The
    reloads load both again (their second loads draw no noise) and the mean names the true best."""
    values = {(2, 2): 1.5, (2, 3): 1.478, (1, 2): 1.2, (3, 2): 1.2, (2, 1): 1.2}
    axes, measure = noisy(values, {((2, 3), 0): 1.03})
    p = reloaded(axes, measure, reloads=0)
    assert p.named()["c=1"] == (2, 3) and not p.tries  # one load each: the noise decides
    q = reloaded(axes, measure, reloads=4)
    assert q.named()["c=1"] == (2, 2) and q.visited == p.visited  # the same search, then the reloads
    reloads = [m for m in q.moves if m.get("reload")]
    assert reloads and len(reloads) == sum(q.tries.values()) <= 4
    assert {m["why"] for m in reloads} <= {"reload: leader at c=1", "reload: contender at c=1"}
    assert reloads[0]["config"] == {"a": 2, "b": 3} and reloads[0]["reload"] == 1  # the leader, then the rival
    assert any(m["best_moved"] == ["c=1"] for m in reloads)
    assert q.figures((2, 3), "c=1") == pytest.approx([1.478 * 1.03, 1.478] + [1.478] * (q.tries[(2, 3)] - 1))
    summary = q.summary()
    assert summary["best"] == {"c=1": {"a": 2, "b": 2}} and summary["reloaded"] == sum(q.tries.values())
    assert summary["loads"] == len(q.visited) + summary["reloaded"]
    # the search's own best moves only for more than min_gain: (2, 3)'s 1.5 % did not move it; the named best is
    # the highest mean, which one load each had put at (2, 3)
    assert summary["search_best"] == {"c=1": {"a": 2, "b": 2}}
    assert "reloaded" in explore.coverage_note(summary)


def test_a_clear_best_is_not_loaded_again_and_the_cap_bounds_the_reloads() -> None:
    axes, measure = noisy({(2, 2): 1.5, (1, 2): 1.2, (3, 2): 1.2, (2, 1): 1.2, (2, 3): 1.2}, {})
    assert not reloaded(axes, measure, reloads=10).tries  # 25 % ahead: no contender
    # four configurations alike: every one a contender, for as long as the cap allows
    flat = {(2, 2): 1.5, (1, 2): 1.5, (3, 2): 1.5, (2, 1): 1.5, (2, 3): 1.5}
    axes, measure = noisy(flat, {})
    p = reloaded(axes, measure, reloads=3)
    assert sum(p.tries.values()) == 3 and max(p.tries.values()) == 1  # the fewest loads first: three configurations


def test_the_between_load_spread_pools_the_reloads_with_the_prior_an_aa_start_would_give() -> None:
    """With no reload the spread is the prior's (`noise`, the seam an A/A start fills); a reload that differs by
    10 % from its first load raises it, and a prior of more degrees of freedom moves less."""
    flat = {(2, 2): 1.5, (1, 2): 1.5, (3, 2): 1.5, (2, 1): 1.5, (2, 3): 1.5}
    axes, measure = noisy(flat, {((2, 2), 1): 1.1})
    p = reloaded(axes, measure, reloads=0)
    assert p.between_sd() == explore.BETWEEN_PRIOR.sd
    q = reloaded(axes, measure, reloads=1)
    assert q.tries == {(2, 2): 1}
    wide = math.log(1.1) ** 2 / 2  # one pair's variance of log figures
    assert q.between_sd() == pytest.approx(math.sqrt((0.02 ** 2 * 4 + wide) / 5))
    r = reloaded(axes, measure, reloads=1, noise=explore.Noise(0.02, 40))
    assert explore.BETWEEN_PRIOR.sd < r.between_sd() < q.between_sd()
    # a known wide spread makes more contenders: a 6 % gap is a close call at SD 0.05, not at 0.01
    axes, measure = noisy({(2, 2): 1.59, (1, 2): 1.5, (3, 2): 1.2, (2, 1): 1.2, (2, 3): 1.2}, {})
    assert reloaded(axes, measure, reloads=2, noise=explore.Noise(0.05, 100)).tries
    assert not reloaded(axes, measure, reloads=2, noise=explore.Noise(0.01, 100)).tries


def test_a_search_with_reloads_replayed_from_its_loads_asks_for_the_same_loads() -> None:
    """--resume tells the search the loads its earlier run made, in order: reloads too (order.py)."""
    axes, measure = noisy({(2, 2): 1.5, (2, 3): 1.478, (1, 2): 1.2, (3, 2): 1.2, (2, 1): 1.2},
                          {((2, 3), 0): 1.03, ((2, 2), 1): 0.99})
    whole = reloaded(axes, measure, reloads=4)
    p = explore.Pattern(axes, reloads=4)
    for m in whole.moves[:len(whole.moves) - 1]:
        c = axes.config_of(m["config"])
        assert p.next_load() == c
        p.told(c, measure(p, c))
    assert p.next_load() == axes.config_of(whole.moves[-1]["config"])


def test_the_reloads_key_and_its_bad_values() -> None:
    grid = f'command = "x {{c}}"\ndropin = {DROPIN}\n'
    axes = "[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1, 4]"
    assert plan(grid + 'strategy = "pattern"\n' + axes).reloads == explore.RELOADS
    assert plan(grid + 'strategy = "pattern"\nreloads = 0\n' + axes).reloads == 0
    for bad, says in (("reloads = -1", "plan.toml: reloads: expected an integer from 0 to 1000, found integer -1"),
                      ('reloads = "2"', "plan.toml: reloads: expected an integer from 0 to 1000, found string '2'")):
        with pytest.raises(ConfigError) as e:
            plan(grid + f'strategy = "pattern"\n{bad}\n' + axes)
        assert str(e.value) == says
    with pytest.raises(ConfigError, match='reloads: expected strategy = "pattern"'):
        plan(grid + "reloads = 2\n" + axes)


def test_the_reports_figure_for_a_reloaded_point_is_the_mean_over_its_loads(tmp_path: Path) -> None:
    """Point a: a first load of two repeats (100, 102) and a reload of one (110): each load's median, then their
    mean, 105.5 (not the last load's 110, nor the median of the three runs, 102); b, one load: 104."""
    lines = []
    for index, name, load, repeat, tps in [(1, "a", 0, 1, 100.0), (1, "a", 0, 2, 102.0), (2, "b", 0, 1, 104.0),
                                           (2, "b", 0, 2, 104.0), (1, "a", 1, 1, 110.0)]:
        out = f"{index:02d}/load-{load}/repeat-{repeat}"
        (tmp_path / out).mkdir(parents=True)
        (tmp_path / out / "bench.jsonl").write_text(json.dumps({"output_tokens_per_second": tps}) + "\n")
        rec = {"point": {"algo": name, "c": 1}, "index": index, "status": "ok", "out": out, "repeat": repeat,
               "noise_limit": 0.1, "attempt": 1, "group": index, **({"reload": load} if load else {})}
        lines.append(json.dumps(rec) + "\n")
    (tmp_path / "results.jsonl").write_text("".join(lines))
    rows = collect.rows_of([tmp_path])
    a, b = rows
    assert (a.label, b.label) == ("algo=a c=1", "algo=b c=1")
    assert a.figures is not None and b.figures is not None
    assert a.figures["output_tokens_per_second"] == pytest.approx(105.5)
    assert b.figures["output_tokens_per_second"] == 104.0
    assert "output_tokens_per_second" in a.best and a.runs == 3  # every load's runs, the reload's too


def test_results_know_a_reloads_repeats_apart_from_the_first_loads() -> None:
    """--resume: a point's reload is a load of its own, its repeats done or not apart from the first load's."""
    first, again = {"repeat": 1, "status": "ok"}, {"repeat": 1, "status": "ok", "reload": 1}
    r = Results({3: [first, again]})
    assert r.done_repeats(3) == {1} and r.done_repeats(3, 1) == {1} and r.done_repeats(3, 2) == set()
    assert Results({3: [again]}).done_repeats(3) == set()
    assert first_load([first, again]) == [first]


# --- the order the runner loads groups in (run/order.py) ---------------------------------------------------------

def test_the_grid_order_is_the_schedule() -> None:
    p = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\n[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1, 4]')
    groups = baseline.schedule(p, p.groups())
    assert list(order.of(p, groups, Results(), Path("/nonexistent"), {})) == list(enumerate(groups, 1))


def test_a_pattern_order_puts_the_baseline_rounds_among_the_loads_it_makes(tmp_path: Path) -> None:
    p = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\nstrategy = "pattern"\nbaseline = {{ steps = 0, topk = 0 }}\n'
             "baseline_every = 2\n[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1, 4]")
    groups = baseline.schedule(p, p.groups())
    rounds = [g for g in groups if g[0].baseline]
    results = Results()
    before: dict[int, int] = {}
    o = order.of(p, groups, results, tmp_path, before)
    seen = []
    for n, group in o:
        seen.append((n, group[0].baseline or group[0].as_dict()["steps"], group[0].as_dict()["topk"]))
        o.told(group)  # no lines: every configuration without a figure, so the search tries their neighbours
    assert seen[0] == (1, 1, 0) and seen[1][1:] == (2, 1)  # round 1, then the middle configuration
    assert [s[1] for s in seen if s[2] == 0] == [r[0].baseline for r in rounds][:len([s for s in seen if s[2] == 0])]
    assert [n for n, *_ in seen] == list(range(1, len(seen) + 1))
    assert all(before[pt.index] >= 1 for g in groups if not g[0].baseline for pt in g if pt.index in before)
    lines = [json.loads(ln) for ln in (tmp_path / "explore.jsonl").read_text().splitlines()]
    assert lines[0]["why"].startswith("start") and lines[0]["measured"] == {}


def test_a_pattern_order_loads_the_aa_start_first_and_never_counts_it_as_a_configuration(tmp_path: Path) -> None:
    """noise_check's loads (noisecheck.schedule puts them first) come before the search's start, each told to the
    order without moving the search: its first configuration is still the middle one."""
    p = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\nstrategy = "pattern"\nnoise_check = 3\n'
             "[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1, 4]")
    groups = noisecheck.schedule(p, baseline.schedule(p, p.groups()))
    o = order.of(p, groups, Results(), tmp_path, {})
    seen = []
    for n, group in o:
        seen.append((n, group[0].aa))
        o.told(group)
        if len(seen) == 4:
            break
    assert seen == [(1, 1), (2, 2), (3, 3), (4, 0)]
    assert not (tmp_path / "explore.jsonl").exists() or \
        json.loads((tmp_path / "explore.jsonl").read_text().splitlines()[0])["why"].startswith("start")


def test_a_pattern_orders_reloads_are_told_their_own_lines_and_named_by_the_mean(tmp_path: Path) -> None:
    """The order says which load of its configuration each group is (the runner's `reload`), and tells the search
    only that load's lines: steps=2 topk=1 measures 103 on its first load and 97 on each reload, steps=2 topk=2
    100 on every load; by one load the first leads, by the means the second is named."""
    p = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\nstrategy = "pattern"\nreloads = 3\n'
             "start = { steps = 2, topk = 1 }\n[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1]")
    tps: dict[tuple[Any, Any], tuple[float, float]] = {(2, 1): (103.0, 97.0), (2, 2): (100.0, 100.0)}  # the others 50
    results = Results()
    o = order.of(p, baseline.schedule(p, p.groups()), results, tmp_path, {})
    assert isinstance(o, order.PatternOrder)
    seen = []
    for _, group in o:  # each configuration's first load, then reloads: (first load, a reload)'s figure
        (pt,) = group
        config = (pt.as_dict()["steps"], pt.as_dict()["topk"])
        seen.append((config, o.reload))
        out = f"{pt.index:02d}/attempt-{len([s for s in seen if s[0] == config])}"
        (tmp_path / out).mkdir(parents=True)
        (tmp_path / out / "bench.jsonl").write_text(json.dumps(
            {"output_tokens_per_second": tps.get(config, (50.0, 50.0))[min(o.reload, 1)]}) + "\n")
        results.reuse(pt.index, {"point": pt.as_dict(), "index": pt.index, "status": "ok", "out": out, "repeat": 1,
                                 "attempt": 1, **({"reload": o.reload} if o.reload else {})})
        o.told(group)
    first = [k for _, k in seen].index(1)  # the search's loads, then the reloads
    assert seen[0] == ((2, 1), 0) and all(k == 0 for _, k in seen[:first]) and all(k for _, k in seen[first:])
    assert len({c for c, _ in seen[:first]}) == first  # one first load a configuration
    again = seen[first:]
    assert again and all(k == 1 + [a for a, _ in again[:i]].count(c) for i, (c, k) in enumerate(again))
    assert {c for c, _ in again} == {(2, 1), (2, 2)}
    assert o.search.named() == {"c=1": (1, 1)} and o.search.summary()["best"] == {"c=1": {"steps": 2, "topk": 2}}
    lines = [json.loads(ln) for ln in (tmp_path / "explore.jsonl").read_text().splitlines()]
    assert [ln.get("reload", 0) for ln in lines] == [k for _, k in seen]
    assert lines[-1]["best"] == {"c=1": {"steps": 2, "topk": 2}}


def test_an_aa_start_gives_the_reloads_its_measured_spread_between_loads(tmp_path: Path) -> None:
    """noisecheck.after_load's spread reaches the search (runner: order.knows): its reloads' prior is the measured
    one; a spread without degrees of freedom between loads leaves the prior as it was."""
    p = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\nstrategy = "pattern"\nnoise_check = 3\n'
             "[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1, 4]")
    o = order.of(p, noisecheck.schedule(p, baseline.schedule(p, p.groups())), Results(), tmp_path, {})
    assert isinstance(o, order.PatternOrder) and o.search.noise == explore.BETWEEN_PRIOR
    o.knows(noise.Components(within=0.0001, between=0.0009, loads=1, runs=3, df_within=2, df_between=0))
    assert o.search.noise == explore.BETWEEN_PRIOR
    o.knows(noise.Components(within=0.0001, between=0.0016, loads=3, runs=9, df_within=6, df_between=2))
    assert o.search.noise == explore.Noise(0.04, 2)
    order.of(p, baseline.schedule(p, p.groups()), Results(), tmp_path, {}).knows(  # the grid: nothing to tell
        noise.Components(within=0.0001, between=0.0016, loads=3, runs=9, df_within=6, df_between=2))


def test_a_budget_stopping_a_pattern_order_leaves_its_unloaded_configurations_and_rounds(tmp_path: Path) -> None:
    """The budget's stop (runner._out_of_budget) hands the order the grid schedule's points not run: a search
    does not reach its rounds left and the configurations it never loaded; a configuration it loaded is not
    among them, and explore.jsonl's summary says why it stopped."""
    p = plan(f'command = "x {{c}}"\ndropin = {DROPIN}\nstrategy = "pattern"\nbaseline = {{ steps = 0, topk = 0 }}\n'
             "[matrix]\nsteps = [1, 2, 4]\ntopk = [1, 2]\nc = [1, 4]")
    groups = baseline.schedule(p, p.groups())
    o = order.of(p, groups, Results(), tmp_path, {})
    it = iter(o)
    _, first_round = next(it)
    _, loaded = next(it)  # the middle configuration: loaded (told), no figure
    o.told(loaded)
    left = [pt for g in groups for pt in g if pt not in first_round and pt not in loaded]
    gone = o.stop(left, "out of budget")
    assert gone and not set(pt.index for pt in loaded) & {pt.index for pt in gone}
    assert {pt.index for pt in gone if not pt.baseline} == set(o.unloaded)
    assert len({pt.index for pt in gone if not pt.baseline}) == len([pt for pt in left if not pt.baseline])
    assert next(it, None) is None  # a stopped search asks for nothing more
    summary = json.loads((tmp_path / "explore.jsonl").read_text().splitlines()[-1])
    assert summary["stopped"] == "out of budget" and summary["unloaded_why"] == ["out of budget"]


# --- whole sweeps on the simulator -------------------------------------------------------------------------------

def _surface_plan(rig: Rig, requests: int = 32, **extra: Any) -> Path:
    """Truth surface 2 on a 2 x 2 x 3 part of the grid, at concurrency 1 and 16, each point a bench run of
    `requests` (`extra` on top: another matrix too)."""
    flags = (f"--surface 2 --batch-max-running 32 --token-latency {simsurface.TOKEN_LATENCY} "
             f"--batch-token-seconds {simsurface.BATCH_TOKEN_SECONDS} --speculative-num-steps {{steps}} "
             "--speculative-eagle-topk {topk} --speculative-num-draft-tokens {draft_tokens}")
    doc = {"target": "t", "timeout": 20, "warmup": 2, "between_points": "none",
           "command": [PY, "-m", "genready.benchclient", "--url", rig.url, "-n", str(requests), "-c", "{c}",
                       "--max-tokens", "24", "--output", "{out}/bench.jsonl"],
           "dropin": f'[Service]\nEnvironment="SIM_FLAGS={flags}"\n',
           "matrix": {"steps": [2, 4], "topk": [1, 2], "draft_tokens": list(simsurface.DRAFT_TOKENS), "c": [1, 16]},
           **extra}
    path = rig.tmp / "plan.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def _within_3_percent_of_the_truths_best(config: dict[str, int], n: int) -> bool:
    configs = [(g, k, d) for g in (2, 4) for k in (1, 2) for d in simsurface.DRAFT_TOKENS]
    best = max(simsurface.true_tps(2, c, n, requests=32) for c in configs)
    got = simsurface.true_tps(2, (config["steps"], config["topk"], config["draft_tokens"]), n, requests=32)
    return got >= 0.97 * best


@pytest.mark.system
def test_a_pattern_sweep_loads_fewer_configurations_than_the_grid_and_finds_the_truths_best(rig: Rig) -> None:
    plan_path = _surface_plan(rig, strategy="pattern")
    dry = subprocess.run([*GENREADY, "sweep", str(plan_path), "--results", str(rig.results), "--config",
                          str(rig.g.config_path), "--dry-run"], capture_output=True, text=True, timeout=30,
                         env=rig.manager.env)
    assert dry.returncode == 0 and '# strategy = "pattern"' in dry.stdout and "at most 16 loads" in dry.stdout, dry
    rc, out = rig.run(plan_path)
    assert rc == 0, out
    lines = rig.results_lines()
    loaded = {json.dumps({k: ln["point"][k] for k in ("steps", "topk", "draft_tokens")}, sort_keys=True)
              for ln in lines if ln["status"] == "ok"}
    unloaded = [ln for ln in lines if ln["status"] == "skipped"]
    assert 0 < len(loaded) < 12 and len(unloaded) == 2 * (12 - len(loaded))  # both client settings of each
    assert all(ln["unloaded"] == explore.NOT_CLOSE and "output_tokens_per_second" not in ln for ln in unloaded)
    assert "not loaded: never predicted close" in out and f"loaded {len(loaded)} of 12 server configurations" in out
    moves = [json.loads(ln) for ln in (rig.results / "explore.jsonl").read_text().splitlines()]
    assert moves[-1]["done"] and moves[-1]["loaded"] == len(loaded)
    # each load (a reload too) a verified start of its own, its first point restarted; a reload's lines say which
    assert sum(1 for ln in lines if ln["status"] == "ok" and ln["restarted"]) == moves[-1]["loads"]
    reloads = {(json.dumps(ln["point"], sort_keys=True), ln["reload"]) for ln in lines if ln.get("reload")}
    assert len(reloads) == 2 * moves[-1]["reloaded"] <= 2 * explore.RELOADS  # both client settings of each
    assert [m["why"].split(":")[0] for m in moves if m.get("reload")] == ["reload"] * moves[-1]["reloaded"]
    best = moves[-1]["best"]
    for n in (1, 16):  # at 16 the truth's best is 18 % ahead of the next; at 1, 3 % ahead
        assert _within_3_percent_of_the_truths_best(best[f"c={n}"], n), (n, best)
    report = subprocess.run([*GENREADY, "sweep", "report", str(rig.results)], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    assert f"the pattern search loaded {len(loaded)} of 12 server configurations" in report
    assert "The pattern search's loads (explore.jsonl), in order:" in report
    assert "partial" not in report  # the configurations not loaded have their lines: no half plan
    data = json.loads(subprocess.run([*GENREADY, "sweep", "report", str(rig.results), "--format", "json"],
                                     capture_output=True, text=True, timeout=60, check=True).stdout)
    assert any("never loaded" in n for n in data["decision"]["notes"])
    rig.assert_restored()


@pytest.mark.system
def test_a_resumed_pattern_sweep_continues_the_same_search(rig: Rig) -> None:
    # what resumes is the search's order, not its answer: a smaller grid, one client setting, short runs
    plan_path = _surface_plan(rig, 16, strategy="pattern", audit=1, audit_seed=4, reloads=1,
                              matrix={"steps": [2, 4], "topk": [1, 2], "draft_tokens": [4, 8], "c": [1]})
    rc, _ = rig.run(plan_path)
    assert rc == 0
    whole = [json.loads(ln) for ln in (rig.results / "explore.jsonl").read_text().splitlines()]
    # cut the sweep after its third load: its lines up to there, as an interrupted run leaves them
    lines = rig.results_lines()
    third = [m["config"] for m in whole[:3]]
    kept = [ln for ln in lines if ln["status"] == "ok" and not ln.get("reload") and
            {k: ln["point"][k] for k in ("steps", "topk", "draft_tokens")} in third]
    (rig.results / "results.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in kept))
    (rig.results / "explore.jsonl").unlink()
    rc, out = rig.run(plan_path, "--resume")
    assert rc == 0, out
    again = [json.loads(ln) for ln in (rig.results / "explore.jsonl").read_text().splitlines()]
    assert [m.get("config") for m in again[:3]] == third  # told from the earlier lines, nothing loaded for them
    assert again[-1]["done"] and again[-1]["loaded"] > 3
    restarted = [ln for ln in rig.results_lines()[len(kept):] if ln["status"] == "ok" and ln.get("restarted")]
    assert len(restarted) == again[-1]["loads"] - 3  # only the loads after the third were made (reloads too)
