"""The load search's decisions (issue 39 §2), in process: the `[search]` table, the next step from the steps so
far, the bench client flags of a step and what the search found, driven against model servers whose answer is
known."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from genready.config import ConfigError
from genready.sweep import crossover, search
from genready.sweep.crossover import Status
from genready.sweep.report import decision
from genready.sweep.search import Axis, Mode, Outcome, SearchSpec, Spacing, Step
from genready_dev import simbatch


def drive(spec: SearchSpec, serve: Callable[[Step], Outcome], limit: int = 100) -> list[Outcome]:
    """Every step the search asks for, answered by `serve`, until it stops (bounded, so a loop fails the test)."""
    done: list[Outcome] = []
    while (step := search.next_step(spec, done)) is not None:
        assert step.index == len(done) + 1
        done.append(serve(step))
        assert len(done) < limit, "the search never stopped"
    return done


def server(capacity: float, conc_limit: int = 1000, knee: float = 1.0) -> Callable[[Step], Outcome]:
    """A server serving `capacity` requests/s at most (1 at a time: capacity / 8): saturated past knee x capacity
    (queueing shows before the throughput stops growing); its SLO holds up to `conc_limit` in flight and below
    0.8 x capacity."""
    def serve(step: Step) -> Outcome:
        if step.rate is None:
            rate = capacity * min(1.0, step.concurrency / 8)
            return Outcome(step, rate, None, step.concurrency <= conc_limit)
        return Outcome(step, min(step.rate, capacity), step.rate > knee * capacity, step.rate <= 0.8 * capacity)
    return serve


def test_rates_between_are_strictly_inside_evenly_or_geometrically() -> None:
    assert search.rates_between(1, 5, 3, Spacing.LINEAR) == pytest.approx([2, 3, 4])
    assert search.rates_between(1, 16, 3, Spacing.GEOMETRIC) == pytest.approx([2, 4, 8])
    assert search.rates_between(5, 5, 3, Spacing.LINEAR) == [] and search.rates_between(0, 5, 3, Spacing.LINEAR) == []


def test_saturation_runs_synchronous_then_throughput_then_rates_and_stops_after_the_first_saturated() -> None:
    """Capacity 100/s, queueing past 75/s, one at a time 12.5/s: rates 12.5 + k * 87.5 / 11 for k = 1..10; 68.2
    keeps up, 76.1 (k = 8) is the first saturated and the last step run: 2 of the 10 rates are never run."""
    spec = SearchSpec(Mode.SATURATION, steps=10, max_concurrency=16)
    done = drive(spec, server(100.0, knee=0.75))
    assert [o.step.kind for o in done[:2]] == ["synchronous", "throughput"]
    assert done[0].step.concurrency == 1 and done[1].step == Step(2, "throughput", None, 16)
    rates = [o.step.rate or 0.0 for o in done[2:]]
    assert rates == sorted(rates) and done[-1].saturated is True and not any(o.saturated for o in done[2:-1])
    f = search.found(spec, done)
    assert f.last_unsaturated is not None and f.first_saturated is not None
    assert f.last_unsaturated <= 75 < f.first_saturated  # the true saturation lies within one step
    assert f.first_saturated - f.last_unsaturated == pytest.approx(87.5 / 11) and len(done) == 2 + 8
    # saturated only past what the throughput run achieved: every rate between keeps up, the bound is that run's
    full = drive(spec, server(100.0))
    assert len(full) == 12 and search.found(spec, full).first_saturated == 100.0


def test_saturation_without_a_saturated_step_runs_every_rate_and_without_room_none() -> None:
    spec = SearchSpec(Mode.SATURATION, steps=3, spacing=Spacing.GEOMETRIC)
    done = drive(spec, lambda s: Outcome(s, 10.0 if s.rate is None and s.concurrency == 1 else 40.0
                                         if s.rate is None else s.rate, False))
    assert [round(o.step.rate or 0, 3) for o in done[2:]] == [14.142, 20.0, 28.284] and len(done) == 5
    flat = drive(spec, lambda s: Outcome(s, 10.0, None))  # concurrency gains nothing: no rates between
    assert len(flat) == 2 and search.found(spec, flat).last_unsaturated is None


@pytest.mark.parametrize("start", [1.0, 500.0])
def test_slo_on_the_rate_axis_brackets_then_bisects_to_the_highest_rate_that_meets_it(start: float) -> None:
    """The SLO holds up to 80/s: from 1/s it doubles to 128/s, from 500/s it halves to 62.5/s; then it bisects
    within max_steps to within 2 % below 80."""
    spec = SearchSpec(Mode.SLO, slo="e2e_p99_ms=100", start=start, max_steps=20)
    done = drive(spec, server(100.0))
    assert done[0].step == Step(1, "bracket", start, 64)
    assert {o.step.kind for o in done} == {"bracket", "bisect"}
    best = search.found(spec, done).max_under_slo
    assert best is not None and 0.98 * 80 <= best <= 80


def test_slo_stops_at_max_steps_and_a_saturated_rate_does_not_meet_it() -> None:
    spec = SearchSpec(Mode.SLO, slo="e2e_p99_ms=100", max_steps=4)
    done = drive(spec, server(100.0))
    assert len(done) == 4 and search.found(spec, done).max_under_slo == 8.0  # 1, 2, 4, 8: still bracketing
    sat = Outcome(Step(1, "bracket", 5.0, 4), 3.0, True, True)
    assert not search.passes(spec, sat)
    assert search.passes(SearchSpec(Mode.SLO, Axis.CONCURRENCY, slo="x"), Outcome(Step(1, "bracket", None, 4), 3.0,
                                                                                  True, True))


def test_slo_on_the_concurrency_axis_finds_the_integer_limit_within_max_concurrency() -> None:
    spec = SearchSpec(Mode.SLO, Axis.CONCURRENCY, slo="itl_p50_ms=40", max_concurrency=64, max_steps=20)
    done = drive(spec, server(100.0, conc_limit=11))
    assert all(o.step.rate is None for o in done) and search.found(spec, done).max_under_slo == 11
    assert [o.step.concurrency for o in done[:5]] == [1, 2, 4, 8, 16]
    every = drive(spec, server(100.0))  # meets it everywhere: doubling stops at max_concurrency
    assert every[-1].step.concurrency == 64 and search.found(spec, every).max_under_slo == 64
    none = drive(spec, server(100.0, conc_limit=0))
    assert len(none) == 1 and search.found(spec, none).max_under_slo is None


def test_a_steps_bench_flags_are_bounded_by_the_step_limits() -> None:
    spec = SearchSpec(Mode.SLO, slo="ttft_p99_ms=500", max_requests_per_step=300, max_step_seconds=20)
    assert search.bench_args(spec, Step(3, "bisect", 12.5, 64)) == [
        "-n", "300", "-c", "64", "--duration", "20", "--request-rate", "12.5", "--slo", "ttft_p99_ms=500"]
    assert search.bench_args(SearchSpec(Mode.SATURATION), Step(1, "synchronous", None, 1)) == [
        "-n", "200", "-c", "1", "--duration", "60"]


def test_an_outcome_reads_a_results_line() -> None:
    o = Outcome.of_line(Step(1, "rate", 5.0, 8), {"requests_per_second": 4.5, "saturated": True, "slo_met": None,
                                                  "output_tokens_per_second": 90})
    assert (o.achieved_rate, o.saturated, o.slo_met, o.output_tps) == (4.5, True, None, 90.0)
    assert Outcome.of_line(Step(1, "rate", 5.0, 8), {"output_tokens_per_second": True}).output_tps is None


def test_the_eta_expects_each_search_point_to_run_its_steps() -> None:
    assert search.expected_steps(SearchSpec(Mode.SATURATION, steps=5)) == 7  # synchronous, throughput, 5 rates
    assert search.expected_steps(SearchSpec(Mode.SLO, slo="x", max_steps=6)) == 6


# --- the crossover (crossover.py) ----------------------------------------------------------------------

def test_the_crossover_interpolates_two_curves_stepped_at_different_loads() -> None:
    """The baseline 100 + 10 x at loads 0, 2, 4, 8, 10; the configuration a flat 150 at 1, 3, 6, 9: both are
    linear between their steps, so they cross at exactly x = 5, in the range both searched, [1, 9]."""
    base = tuple((x, 100 + 10 * x) for x in (0.0, 2.0, 4.0, 8.0, 10.0))
    config = tuple((x, 150.0) for x in (1.0, 3.0, 6.0, 9.0))
    got = crossover.find(config, base)
    assert got.status is Status.INTERPOLATED and got.load == pytest.approx(5.0) and got.within == (1.0, 9.0)
    assert got.fields() == {"crossover": got.load, "crossover_status": "interpolated", "crossover_range": [1.0, 9.0]}
    # a speedup of exactly 1 is not below it: the crossing is where it goes under
    assert crossover.find(((1.0, 110.0), (3.0, 110.0)), base).load == pytest.approx(1.0)


def test_the_crossover_says_when_there_is_none_to_find() -> None:
    base = ((1.0, 100.0), (4.0, 400.0))
    assert crossover.find(((1.0, 101.0), (2.0, 250.0), (5.0, 800.0)), base) == \
        crossover.Crossover(None, Status.PAYS_THROUGHOUT, (1.0, 4.0))  # above it over [1, 4]: 5 is past the base's
    assert crossover.find(((1.0, 99.0), (4.0, 900.0)), base).status is Status.NEVER_PAYS  # below at the first load
    assert crossover.find(((2.0, 99.0),), base) == crossover.Crossover(None, Status.NEVER_PAYS, (2.0, 2.0))
    for other in (None, ()):
        assert crossover.find(((1.0, 5.0),), other).status is Status.NO_BASELINE
    assert crossover.find((), base).status is Status.NO_BASELINE
    assert crossover.find(((5.0, 1.0), (6.0, 1.0)), base) == crossover.Crossover(None, Status.NO_BASELINE)  # disjoint


def test_a_crossover_in_the_noise_is_neither_paying_nor_losing() -> None:
    """Issue 53 #4: the same server as the baseline "paid up to 35.3 req/s" or "never paid" on differences of
    0.2-1 %. Within the plan's noise_limit of the baseline is neither, as a speedup within it is (~)."""
    base = ((1.0, 100.0), (2.0, 200.0), (4.0, 390.0), (8.0, 400.0))
    same = ((1.0, 100.4), (2.0, 199.0), (4.0, 392.0), (8.0, 398.0))  # +0.4 %, -0.5 %, +0.5 %, -0.5 %
    assert crossover.find(same, base).status is Status.INTERPOLATED  # by sign alone (noise_limit 0): a crossover
    got = crossover.find(same, base, 0.10)
    assert got == crossover.Crossover(None, Status.WITHIN_NOISE, (1.0, 8.0))
    below = ((1.0, 99.0), (2.0, 198.0), (4.0, 386.0), (8.0, 396.0))  # 1 % slower at each: by sign, never_pays
    assert crossover.find(below, base).status is Status.NEVER_PAYS
    assert crossover.find(below, base, 0.10).status is Status.WITHIN_NOISE
    # beyond the noise it is what it was: pays, then falls 10 % below the baseline between 4 and 8
    faster = ((1.0, 150.0), (4.0, 450.0), (8.0, 300.0))
    got = crossover.find(faster, base, 0.10)
    assert got.status is Status.INTERPOLATED and got.load is not None and 4.0 < got.load < 8.0
    margin = crossover.value_at(faster, got.load) - 0.9 * crossover.value_at(base, got.load)
    assert margin == pytest.approx(0.0, abs=1e-9)
    assert crossover.find(((1.0, 150.0), (2.0, 300.0), (4.0, 400.0), (8.0, 420.0)), base, 0.10).status is \
        Status.PAYS_THROUGHOUT
    assert crossover.find(((1.0, 80.0), (2.0, 300.0), (4.0, 400.0), (8.0, 420.0)), base, 0.10).status is \
        Status.NEVER_PAYS  # 20 % slower at the first load
    assert decision.crossover_words({"crossover_status": "within_noise"}) == (
        "speculation neither pays nor loses at the loads searched: within the plan's noise_limit of the baseline "
        "at each")


def test_a_curve_is_output_tokens_against_the_offered_load_on_the_search_s_axis() -> None:
    sat = SearchSpec(Mode.SATURATION)
    done = [Outcome(Step(1, "synchronous", None, 1), 2.0, None, None, 40.0),
            Outcome(Step(2, "throughput", None, 8), 9.0, None, None, 180.0),
            Outcome(Step(3, "rate", 4.0, 8), 4.0, False, None, 80.0),
            Outcome(Step(4, "rate", 6.0, 8), 6.0, False, None, None)]  # no tok/s: not on the curve
    assert crossover.curve(sat, done) == ((2.0, 40.0), (4.0, 80.0), (9.0, 180.0))  # a closed loop at what it achieved
    conc = SearchSpec(Mode.SLO, Axis.CONCURRENCY, slo="x")
    done = [Outcome(Step(1, "bracket", None, 2), 5.0, None, True, 100.0),
            Outcome(Step(2, "bracket", None, 2), 5.0, None, True, 120.0)]
    assert crossover.curve(conc, done) == ((2.0, 110.0),)  # one load, its steps averaged


def closed_loop(m: simbatch.BatchModel, tokens: int, e2e_slo: float) -> Callable[[Step], Outcome]:
    """The batch model's closed loop at concurrency c <= its cap: each request takes steps x t(c, w) seconds."""
    def serve(step: Step) -> Outcome:
        e2e = simbatch.steps_for(m, tokens) * simbatch.step_time(m, min(step.concurrency, m.max_running))
        rps = step.concurrency / e2e
        return Outcome(step, rps, None, e2e <= e2e_slo, rps * tokens)
    return serve


def test_the_crossover_of_two_slo_searches_on_the_batch_model_lies_near_the_true_one() -> None:
    """bench/load_search.py's servers without their noise: speculation (X = 2.5, w = 4) against plain decoding, a
    step of 20 + 4 ms per token, 20 tokens, cap 16. Each search brackets and bisects its own concurrencies for
    e2e <= 0.9 s (plain decoding meets it up to 6, speculation up to 5): their steps differ (7 against 5), and the
    throughputs cross at simbatch.crossover_batch = 5."""
    plain = simbatch.BatchModel(16, 0.020, 0.004)
    spec_m = simbatch.BatchModel(16, 0.020, 0.004, 2.5)
    spec = SearchSpec(Mode.SLO, Axis.CONCURRENCY, slo="e2e_p50_ms=900", max_concurrency=16, max_steps=8)
    base = drive(spec, closed_loop(plain, 20, 0.9))
    conf = drive(spec, closed_loop(spec_m, 20, 0.9))
    assert [o.step.concurrency for o in base] == [1, 2, 4, 8, 6, 7]
    assert [o.step.concurrency for o in conf] == [1, 2, 4, 8, 6, 5]
    got = crossover.find(crossover.curve(spec, conf), crossover.curve(spec, base))
    true = simbatch.crossover_batch(spec_m)
    assert got.status is Status.INTERPOLATED and got.load is not None and true is not None
    assert true == pytest.approx(5.0)
    assert abs(got.load - true) / true < 0.15
    # the other way round: plain decoding against speculation never pays at first, where speculation does
    assert crossover.find(crossover.curve(spec, base), crossover.curve(spec, conf)).status is Status.NEVER_PAYS


def test_the_search_table_parses_with_its_defaults() -> None:
    assert search.parse({"mode": "saturation"}, "p.toml") == SearchSpec(Mode.SATURATION)
    s = search.parse({"mode": "slo", "axis": "concurrency", "slo": "itl_p50_ms=40", "max_steps": 6, "start": 2,
                      "max_step_seconds": 30, "max_requests_per_step": 500, "spacing": "geometric"}, "p.toml")
    assert s == SearchSpec(Mode.SLO, Axis.CONCURRENCY, spacing=Spacing.GEOMETRIC, max_steps=6, slo="itl_p50_ms=40",
                           start=2.0, max_requests_per_step=500, max_step_seconds=30.0)


@pytest.mark.parametrize(("table", "key", "expected"), [
    ([], "search", "a table"),
    ({}, "search.mode", '"saturation" or "slo"'),
    ({"mode": "fast"}, "search.mode", '"saturation" or "slo"'),
    ({"mode": "saturation", "stepz": 3}, "search.stepz", "one of the known keys"),
    ({"mode": "saturation", "steps": 0}, "search.steps", "an integer from 1 to 100"),
    ({"mode": "saturation", "steps": True}, "search.steps", "an integer from 1 to 100"),
    ({"mode": "saturation", "max_step_seconds": -1}, "search.max_step_seconds", "seconds > 0"),
    ({"mode": "saturation", "axis": "tokens"}, "search.axis", '"rate" or "concurrency"'),
    ({"mode": "slo"}, "search.slo", 'a latency target for mode = "slo"'),
    ({"mode": "slo", "slo": "ttft_p99_ms=abc"}, "search.slo", "--slo text"),
    ({"mode": "slo", "slo": 5}, "search.slo", "--slo text"),
])
def test_a_bad_search_table_names_the_key_and_what_it_takes(table: Any, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        search.parse(table, "plan.toml")
    assert e.value.key == key and expected in e.value.expected and str(e.value).startswith("plan.toml: ")
