"""A plan's `[search]` run by the sweep (issue 39 §2): the plan key's checks in process, and real searches on a
simulator unit whose batch model saturates (--batch-max-running), each step a verified run of the bench client."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import crossover, search
from genready.sweep import plan as sweepplan
from genready.sweep.files import SEARCH_FILE
from genready.sweep.run import results as sweepresults
from genready.sweep.run import runner, searchrun, steps
from genready_dev.harness import GENREADY, PY
from genready_dev.usermanager import UserManager
from tests.test_sweep import Rig

BASE = 'command = ["bench", "--output", "{out}/bench.jsonl", "{search}"]\n'


def plan(text: str) -> sweepplan.Plan:
    """A plan of `text`, with one point unless it has its own matrix."""
    return sweepplan.parse_plan(tomllib.loads(text + ("" if "[matrix]" in text else "\n[matrix]\nv = [1]\n")),
                                "p.toml")


@pytest.mark.parametrize(("text", "key", "says"), [
    (BASE + '[search]\nmode = "fast"\n', "search.mode", 'expected "saturation" or "slo"'),
    (BASE + '[search]\nmode = "slo"\n', "search.slo", "a latency target"),
    (BASE + '[search]\nmode = "saturation"\nsteps = 0\n', "search.steps", "an integer from 1 to 100"),
    (BASE + '[search]\nmode = "saturation"\nrate = 3\n', "search.rate", "one of the known keys"),
    (BASE + 'search = 3\n', "search", "a table"),
    ('command = "bench -n 5"\n[search]\nmode = "saturation"\n', "command", "one word {search} on its own"),
    ('command = "bench --x={search}"\n[search]\nmode = "saturation"\n', "command", "one word {search} on its own"),
    ('command = "bench {search}"\n', "command", "a value for {search} in every point"),
    (BASE + '[search]\nmode = "saturation"\n[matrix]\nsearch = [1]\n', "matrix.search", "no point value named"),
])
def test_a_bad_search_names_file_key_expected_found(text: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        plan(text)
    assert e.value.file == "p.toml" and e.value.key == key, str(e.value)
    assert says in str(e.value) and "found" in str(e.value)


def test_a_step_s_flags_replace_the_search_word_and_the_search_is_in_the_fingerprint() -> None:
    p = plan(BASE + '[search]\nmode = "saturation"\nmax_requests_per_step = 7\n')
    assert p.search == search.SearchSpec(search.Mode.SATURATION, max_requests_per_step=7)
    step = search.Step(3, "rate", 2.5, 64)
    words = p.command_for(p.points[0], "/o", search.bench_args(p.search, step))
    assert words == ["bench", "--output", "/o/bench.jsonl", "-n", "7", "-c", "64", "--duration", "60",
                     "--request-rate", "2.5"]
    assert p.command_for(p.points[0], "/o")[-1] == "{search}"  # the fingerprint's and --dry-run's spelling
    fp = sweepresults.fingerprint(p, p.points[0], "t", "u", restart_each=False)
    assert fp["search"]["max_requests_per_step"] == 7 and fp["search"]["mode"] == "saturation"
    other = plan(BASE + '[search]\nmode = "saturation"\nmax_requests_per_step = 8\n')
    assert sweepresults.differing(fp, sweepresults.fingerprint(other, other.points[0], "t", "u",
                                                               restart_each=False)) == ["search"]
    # a plan without a search keeps the fingerprint it had (its old lines resume)
    plain = plan('command = "bench {out}"\n')
    assert "search" not in sweepresults.fingerprint(plain, plain.points[0], "t", "u", restart_each=False)


def test_a_step_is_judged_by_its_worst_repeat() -> None:
    step = search.Step(3, "rate", 5.0, 8)
    o = searchrun.outcome(step, [{"requests_per_second": 4.0, "saturated": False, "slo_met": True},
                                 {"requests_per_second": 5.0, "saturated": True, "slo_met": True},
                                 {"requests_per_second": 6.0, "saturated": False, "slo_met": False}])
    assert (o.achieved_rate, o.saturated, o.slo_met) == (5.0, True, False)
    assert searchrun.outcome(step, []).achieved_rate == 0.0


def test_the_eta_counts_each_search_point_as_its_expected_steps(tmp_path: Path) -> None:
    p = plan(BASE + 'dropin = "[Service]\\nEnvironment=A={a}"\n[matrix]\na = [1, 2]\n'
             '[search]\nmode = "saturation"\nsteps = 3\n')
    s = runner.Sweep(steps.SweepOptions(p, "http://127.0.0.1:1", "t", "u.service", "user", 1, tmp_path),
                     err=io.StringIO())
    s.plan_schedule(set())
    s.timings.load_times, s.timings.run_times = [300.0], [60.0]
    # 2 loads and 2 points of 2 + 3 steps: 2 x 300 + 10 x 60 (one run a point would say 12m00s)
    assert s.eta(p.points[0], loading=True) == ", ETA 20m00s"
    slo = plan(BASE + '[search]\nmode = "slo"\nslo = "ttft_p99_ms=500"\nmax_steps = 4\n')
    s = runner.Sweep(steps.SweepOptions(slo, "http://127.0.0.1:1", "t", "u.service", "user", 1, tmp_path),
                     err=io.StringIO())
    s.plan_schedule(set())
    s.timings.load_times, s.timings.run_times = [300.0], [60.0]
    assert s.eta(slo.points[0], loading=True) == ", ETA 9m00s"  # a load and 4 steps


def outcomes(spec: search.SearchSpec, tps: dict[int, float]) -> list[search.Outcome]:
    return [search.Outcome(search.Step(i, "bracket", None, c), 1.0, None, True, y)
            for i, (c, y) in enumerate(tps.items(), 1)]


def test_a_crossover_waits_for_the_baseline_s_search_and_is_filled_in_when_it_ends(tmp_path: Path) -> None:
    """The runner's own Sweep, its searches' found lines written as searchrun.run writes them (the steps' runs,
    which need a unit, are the system tests'): a configuration searched before the baseline says no_baseline,
    and gets a new line with its crossover when the baseline's search ends."""
    p = plan(BASE + 'dropin = "[Service]\\nEnvironment=ALGO={algo}"\nbaseline = { algo = "none" }\n'
             '[matrix]\nalgo = ["eagle"]\n[search]\nmode = "slo"\naxis = "concurrency"\nslo = "e2e_p50_ms=900"\n')
    assert p.search is not None
    s = runner.Sweep(steps.SweepOptions(p, "http://127.0.0.1:1", "t", "u.service", "user", 1, tmp_path),
                     err=io.StringIO())
    (base,), (conf,) = s.groups
    assert base.baseline == 1 and not conf.baseline
    searchrun.found_line(s, conf, 2, p.search, outcomes(p.search, {1: 100.0, 4: 300.0, 8: 300.0}), "")
    first = found_lines_in(tmp_path)
    assert first[-1]["crossover"] is None and first[-1]["crossover_status"] == "no_baseline"
    assert first[-1]["curve"] == [[1.0, 100.0], [4.0, 300.0], [8.0, 300.0]]
    searchrun.found_line(s, base, 1, p.search, outcomes(p.search, {1: 50.0, 2: 100.0, 8: 400.0}), "")
    got = found_lines_in(tmp_path)
    assert len(got) == 3 and got[1]["baseline"] == 1 and "crossover" not in got[1]
    # 300 against 50 + 50 (x - 1) from 2 on: equal at x = 6, and below it by more than the plan's noise_limit
    # (0.10: issue 53 #4) from 300 = 0.9 x 50 x, x = 20/3 (the configuration's own steps are 4 and 8)
    assert got[2]["point"] == conf.as_dict() and got[2]["crossover_status"] == "interpolated"
    assert got[2]["crossover"] == pytest.approx(20 / 3) and got[2]["crossover_baseline"] == base.index
    assert got[2]["crossover_range"] == [1.0, 8.0]
    # a configuration searched after the baseline gets its crossover at once, and the baseline's line is not redone
    searchrun.found_line(s, conf, 2, p.search, outcomes(p.search, {1: 10.0, 8: 100.0}), "")
    assert [ln.get("crossover_status") for ln in found_lines_in(tmp_path)[3:]] == ["never_pays"]


def test_a_plan_without_a_baseline_says_no_baseline(tmp_path: Path) -> None:
    p = plan(BASE + '[search]\nmode = "saturation"\n')
    assert p.search is not None
    s = runner.Sweep(steps.SweepOptions(p, "http://127.0.0.1:1", "t", "u.service", "user", 1, tmp_path),
                     err=io.StringIO())
    done = [search.Outcome(search.Step(1, "synchronous", None, 1), 2.0, None, None, 40.0)]
    searchrun.found_line(s, p.points[0], 1, p.search, done, "step 2 did not run ok (failed)")
    (rec,) = found_lines_in(tmp_path)
    assert (rec["crossover"], rec["crossover_status"], rec["complete"]) == (None, "no_baseline", False)
    assert rec["crossover_status"] in {str(x) for x in crossover.Status}


def test_resume_reuses_a_configuration_s_steps_but_searches_the_baseline_again(tmp_path: Path) -> None:
    """The baseline at cap 1 holds the same values as the plan's point cap = 1: its lines are not that point's,
    and its own search runs again on --resume, as a baseline round does without a search."""
    p = plan(BASE + 'dropin = "[Service]\\nEnvironment=CAP={cap}"\nbaseline = { cap = 1 }\n'
             '[matrix]\ncap = [1]\n[search]\nmode = "saturation"\n')
    s = runner.Sweep(steps.SweepOptions(p, "http://127.0.0.1:1", "t", "u.service", "user", 1, tmp_path),
                     err=io.StringIO())
    (base,), (conf,) = s.groups
    fp = s.fingerprints[conf.index]
    assert s.fingerprints[base.index] == fp and base.as_dict() == conf.as_dict()
    line = {"point": {"cap": 1}, "status": "ok", "search_step": 1, "repeat": 1, "fingerprint": fp}
    (tmp_path / "results.jsonl").write_text(json.dumps({**line, "baseline": 1}) + "\n")
    assert searchrun.earlier_steps(p, tmp_path, conf, fp) == {}
    with (tmp_path / "results.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    assert searchrun.earlier_steps(p, tmp_path, conf, fp) == {(1, 1): line}
    assert searchrun.earlier_steps(p, tmp_path, base, fp) == {}


def found_lines_in(results: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (results / SEARCH_FILE).read_text().splitlines()]


@pytest.mark.system
def test_a_bad_search_exits_78_before_the_unit_is_touched(tmp_path: Path) -> None:
    (tmp_path / "plan.toml").write_text(BASE + '[search]\nmode = "slo"\nslo = "ttft_p99_ms=-1"\n[matrix]\nv = [1]\n')
    (tmp_path / "g.toml").write_text('[targets.t]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n')
    p = subprocess.run([*GENREADY, "sweep", str(tmp_path / "plan.toml"), "--results", str(tmp_path / "r"),
                        "--config", str(tmp_path / "g.toml")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 78, p.stderr
    assert f"{tmp_path / 'plan.toml'}: search.slo: expected" in p.stderr


# Cap 4 requests decoding together, 10 tokens at t(b) = 10 ms + 2.5 ms * b: 8 requests/s one at a time, about
# 20/s at the cap (test_simbatch.py's model). Each step sends at most 16 requests: a step lasts about a second.
SIM = "--token-latency 0.01 --batch-max-running {cap} --batch-token-seconds 0.0025"


def search_plan(rig: Rig, table: dict[str, Any], output: str = "{out}/bench.jsonl", **extra: Any) -> Path:
    doc = {"target": "t", "timeout": 20, "warmup": 0,
           "command": [PY, "-m", "genready.benchclient", "--url", rig.url, "--max-tokens", "10", "--seed", "3",
                       "--output", output, "{search}"],
           "dropin": f'[Service]\nEnvironment="SIM_FLAGS={SIM}"\n', "matrix": {"cap": [4]},
           "search": {"max_requests_per_step": 16, "max_step_seconds": 10, "max_concurrency": 8, **table}, **extra}
    path = rig.tmp / "plan.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def found_lines(rig: Rig) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (rig.results / SEARCH_FILE).read_text().splitlines()]


def bench_of(rig: Rig, line: dict[str, Any]) -> dict[str, Any]:
    got = searchrun.bench_line(rig.results, line)
    assert got is not None, line
    return got


@pytest.fixture
def simrig(manager: UserManager, tmp_path: Path) -> Any:
    r = Rig(manager, tmp_path)
    yield r
    r.close()


@pytest.mark.system
def test_saturation_search_runs_its_steps_on_one_verified_instance_and_stops_at_the_first_saturated(
        simrig: Rig) -> None:
    rc, out = simrig.run(search_plan(simrig, {"mode": "saturation", "steps": 3}))
    assert rc == 0, out
    lines = simrig.results_lines()
    assert [ln["search_step"] for ln in lines] == list(range(1, len(lines) + 1))
    assert [ln["search_kind"] for ln in lines[:2]] == ["synchronous", "throughput"]
    assert all(ln["search_kind"] == "rate" for ln in lines[2:]) and 3 <= len(lines) <= 5
    assert len({ln["invocation_id"] for ln in lines}) == 1  # one load, every step verified on it
    assert all(ln["status"] == "ok" and ln["invocation_id"] and ln["pid"] for ln in lines)
    benches = [bench_of(simrig, ln) for ln in lines]
    assert all(b["requests"] <= 16 for b in benches)  # max_requests_per_step bounds every step
    assert lines[0]["search_concurrency"] == 1 and lines[0]["search_rate"] is None
    rates = [ln["search_rate"] for ln in lines[2:]]
    assert rates == sorted(rates) and benches[0]["requests_per_second"] < rates[0]
    assert all(b["saturated"] is not True for b in benches[2:-1])  # nothing runs past a saturated step
    if len(lines) < 5:
        assert benches[-1]["saturated"] is True  # stopped early: the last step ran is the first saturated
    # (Here every rate lies below what the throughput run achieved, so the simulator, deterministic, keeps up
    # with all three: tried up to 96 % of it with 32 requests a step. The stop itself is search.next_step's,
    # tests/test_search.py; this test holds the loop to it: no step after a saturated one.)
    (found,) = found_lines(simrig)
    assert found["complete"] and found["steps"] == len(lines) and found["mode"] == "saturation"
    ok = [r for r, b in zip(rates, benches[2:], strict=True) if b["saturated"] is not True]
    assert found["last_unsaturated_rate"] == (max(ok) if ok else None)
    assert found["first_saturated_rate"] is not None
    report = subprocess.run([*GENREADY, "sweep", "report", str(simrig.results)], capture_output=True, text=True,
                            timeout=30)
    assert report.returncode == 0 and "search (DIR/search.jsonl):" in report.stdout, report.stderr
    assert "saturation between" in report.stdout
    simrig.assert_restored()


@pytest.mark.system
def test_slo_search_reports_max_rate_under_slo_and_resume_continues_where_it_stopped(simrig: Rig) -> None:
    plan_path = search_plan(simrig, {"mode": "slo", "slo": "ttft_p99_ms=5000", "start": 8, "max_steps": 4})
    rc, out = simrig.run(plan_path)
    assert rc == 0, out
    lines = simrig.results_lines()
    assert [ln["search_step"] for ln in lines] == list(range(1, len(lines) + 1)) and 2 <= len(lines) <= 4
    assert lines[0]["search_rate"] == 8 and len({ln["invocation_id"] for ln in lines}) == 1
    passed = [ln["search_rate"] for ln in lines
              if (b := bench_of(simrig, ln))["slo_met"] is True and b["saturated"] is not True]
    (found,) = found_lines(simrig)
    assert found["mode"] == "slo" and found["max_rate_under_slo"] == (max(passed) if passed else None)
    assert found["max_rate_under_slo"] is not None, lines  # 8 req/s is well under the cap's 20
    # A sweep that stopped after its first step: --resume reuses it and runs only the steps after it.
    first = (simrig.results / "results.jsonl").read_text().splitlines()[0]
    (simrig.results / "results.jsonl").write_text(first + "\n")
    (simrig.results / SEARCH_FILE).unlink()
    rc, out = simrig.run(plan_path, "--resume")
    assert rc == 0, out
    again = simrig.results_lines()
    assert again[0] == json.loads(first) and [ln["search_step"] for ln in again[1:]] == \
        list(range(2, len(again) + 1))
    assert again[1]["invocation_id"] != lines[0]["invocation_id"]  # a new load for the steps left
    (resumed,) = found_lines(simrig)
    assert resumed["complete"] and resumed["steps"] == len(again) and resumed["max_rate_under_slo"] is not None
    # Resumed once more, the search is over: no step runs, nothing is loaded, and it found the same.
    pid = simrig.g.get("/ready/t")[1]["pid"]
    rc, out = simrig.run(plan_path, "--resume")
    assert rc == 0 and "1/1 points ok" in out, out
    assert simrig.results_lines() == again and found_lines(simrig)[-1]["max_rate_under_slo"] == \
        resumed["max_rate_under_slo"]
    assert simrig.g.get("/ready/t")[1]["pid"] == pid
    simrig.assert_restored()


@pytest.mark.system
def test_a_search_that_stops_before_its_end_makes_the_sweep_exit_1_and_the_sweep_goes_on(simrig: Rig) -> None:
    """The command writes its bench line where the search does not read it: each configuration's search stops
    after its first step, which ran ok. The sweep goes on to the next configuration (as a failed point does, with
    or without --keep-going) and exits 1, as a point that failed makes it, so a script sees it."""
    plan_path = search_plan(simrig, {"mode": "saturation", "steps": 2}, output="{out}/elsewhere.jsonl",
                            matrix={"cap": [4, 8]})
    rc, out = simrig.run(plan_path)
    assert rc == 1, out
    assert "2 searches stopped before the end" in out
    found = found_lines(simrig)
    assert [f["point"] for f in found] == [{"cap": 4}, {"cap": 8}]
    assert all(not f["complete"] and "wrote no bench line" in f["reason"] and f["steps"] == 0 for f in found)
    assert all(ln["status"] == "ok" for ln in simrig.results_lines())  # every run ok: only the search is short
    simrig.assert_restored()


@pytest.mark.system
def test_the_baseline_is_searched_too_and_each_configuration_gets_its_crossover(simrig: Rig) -> None:
    """The baseline decodes one request at a time (cap 1), the configuration 4 together: on the concurrency axis
    from 2 to 8, the configuration serves 1.7 to 3 times the baseline's tok/s, so it pays throughout."""
    plan_path = search_plan(simrig, {"mode": "slo", "axis": "concurrency", "slo": "e2e_p99_ms=60000", "start": 2},
                            baseline={"cap": 1})
    rc, out = simrig.run(plan_path)
    assert rc == 0, out
    lines = simrig.results_lines()
    base_runs = [ln for ln in lines if ln.get("baseline")]
    conf_runs = [ln for ln in lines if not ln.get("baseline")]
    assert [ln["search_concurrency"] for ln in base_runs] == [2, 4, 8] == \
        [ln["search_concurrency"] for ln in conf_runs]
    assert len({ln["invocation_id"] for ln in base_runs}) == 1  # the baseline: one load, its steps verified on it
    assert len({ln["invocation_id"] for ln in conf_runs}) == 1
    assert base_runs[0]["invocation_id"] != conf_runs[0]["invocation_id"]
    base, conf = found_lines(simrig)
    assert base["baseline"] == 1 and base["point"] == {"cap": 1} and "crossover" not in base
    assert conf["point"] == {"cap": 4} and conf["crossover_baseline"] == base["index"]
    assert [x for x, _ in conf["curve"]] == [2.0, 4.0, 8.0]
    want = crossover.find(tuple(map(tuple, conf["curve"])), tuple(map(tuple, base["curve"])))
    assert {k: conf[k] for k in ("crossover", "crossover_status", "crossover_range")} == want.fields()
    assert conf["crossover_status"] == "pays_throughout" and conf["crossover"] is None, conf
    # --resume: the baseline is searched again (a new load), the configuration's steps are reused, and its
    # crossover is computed again against the baseline's new search
    rc, out = simrig.run(plan_path, "--resume")
    assert rc == 0, out
    again = simrig.results_lines()[len(lines):]
    assert again and all(ln.get("baseline") == 1 for ln in again)
    assert {ln["invocation_id"] for ln in again}.isdisjoint({ln["invocation_id"] for ln in base_runs})
    base2, conf2 = found_lines(simrig)[2:]
    assert base2["baseline"] == 1 and conf2["point"] == {"cap": 4} and conf2["curve"] == conf["curve"]
    want = crossover.find(tuple(map(tuple, conf2["curve"])), tuple(map(tuple, base2["curve"])))
    assert {k: conf2[k] for k in ("crossover", "crossover_status", "crossover_range")} == want.fields()
    simrig.assert_restored()
