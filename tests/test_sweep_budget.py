"""Issue 51 §4: a plan's `budget`. In-process: the duration words, the plan key and the flag, the history an estimate
is made of, the estimate and the stop rule (a clock passed in), the Decision's provisional sentence; then whole sweeps
on the simulator: a dry run from the unit's own loads, and a budget that stops a sweep after its first load.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import budget as sweepbudget
from genready.sweep import main as sweep
from genready.sweep import plan as sweepplan
from genready.sweep.budget import History
from genready.sweep.report import collect
from genready.sweep.report import table as sweepreport
from genready.sweep.report.main import decision_facts
from genready.sweep.run import budgetrun
from genready.sweep.run.lines import Timings
from genready.timewords import duration, seconds_of
from genready_dev.harness import GENREADY
from tests.test_sweep import Rig
from tests.test_sweep_decision import Folder, section, three_configs

PLAN = 'command = "x {c}"\ndropin = "[Service]\\nEnvironment=A={a}"\n[matrix]\na = [1, 2, 3]\nc = [1, 2]\n'


def plan(extra: str = "") -> sweepplan.Plan:
    return sweepplan.parse_plan(tomllib.loads(extra + "\n" + PLAN), "plan.toml")


# --- the words, the key, the flag -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [("4h", 14400), ("90m", 5400), ("1h30m", 5400), ("1h 30m", 5400),
                                               ("6m02s", 362), ("4.2s", 4.2), ("2d", 172800), ("3600", 3600)])
def test_a_duration_is_read_as_people_write_it(text: str, seconds: float) -> None:
    assert seconds_of(text) == seconds


@pytest.mark.parametrize("s", [4.2, 42, 190, 362, 3900, 14400])
def test_what_duration_writes_reads_back(s: float) -> None:
    assert seconds_of(duration(s)) == pytest.approx(s, abs=30)  # duration() rounds an hour to its minutes


@pytest.mark.parametrize("text", ["", "h", "4x", "30m1h", "inf", "nan", "1e400", "four hours"])
def test_what_is_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        seconds_of(text)


def test_the_budget_key_takes_a_duration_or_seconds() -> None:
    assert plan('budget = "4h"').budget == 14400 and plan("budget = 90").budget == 90 and plan().budget is None


@pytest.mark.parametrize(("value", "found"), [('"0s"', "string '0s'"), ("-1", "integer -1"), ("true", "boolean True"),
                                              ('"4 hours"', "string '4 hours'"), ("[1]", "array [1]")])
def test_a_bad_budget_names_file_key_expected_found(value: str, found: str) -> None:
    with pytest.raises(ConfigError) as e:
        plan(f"budget = {value}")
    assert str(e.value) == (f'plan.toml: budget: expected a duration such as "4h", "90m", "1h30m" or "45s" (or a '
                            f"number of seconds), > 0, found {found}")


def test_the_flag_says_what_it_expects() -> None:
    assert sweep.budget_flag("2h") == 7200
    with pytest.raises(ValueError, match=r"--budget: expected a duration such as .*, > 0, found '0'"):
        sweep.budget_flag("0")


@pytest.mark.system
def test_a_bad_budget_exits_78_and_a_bad_flag_64(tmp_path: Path) -> None:
    (tmp_path / "plan.toml").write_text('budget = "soon"\n' + PLAN)
    (tmp_path / "g.toml").write_text('[targets.t]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n')
    args = [*GENREADY, "sweep", str(tmp_path / "plan.toml"), "--results", str(tmp_path / "r"), "--config",
            str(tmp_path / "g.toml"), "--url", "http://127.0.0.1:1", "--dry-run"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert p.returncode == 78 and "plan.toml: budget: expected a duration" in p.stderr and "'soon'" in p.stderr
    (tmp_path / "plan.toml").write_text(PLAN)
    p = subprocess.run([*args, "--budget", "later"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 64 and "--budget: expected a duration" in p.stderr, p.stderr


# --- the history and the estimate -------------------------------------------------------------------------------

def record(load: float | None, ready: bool = True) -> dict[str, Any]:
    return {"ready_at": "2026-01-01T00:00:00+00:00" if ready else None, "load_seconds": load}


def test_the_history_is_the_median_of_the_units_last_five_verified_starts() -> None:
    recs = [record(10), record(None, ready=False), record(30), record(20), record(1000, ready=False), record(40),
            record(50), record(99)]  # newest first: 99 is the sixth verified start, not counted
    got = sweepbudget.history(recs, [{"status": "ok", "run_seconds": 4.0}, {"status": "ok", "run_seconds": 6.0},
                                     {"status": "failed", "run_seconds": 100.0}])
    assert (got.load, got.loads, got.run, got.runs) == (30, 5, 5.0, 2)
    assert got.words() == ("a load takes 30s: the median of 5 verified starts (genready's records of the unit); a run "
                           "5.0s: the mean of 2 ok runs in the results folder")


def test_without_the_daemons_records_the_results_folders_loads_count() -> None:
    lines = [{"restarted": True, "load_seconds": 8.0, "status": "ok", "run_seconds": 2.0},
             {"restarted": False, "load_seconds": 8.0, "status": "ok", "run_seconds": 2.0},  # the same load, reused
             {"restarted": True, "load_seconds": 12.0, "status": "not_ready"}]
    got = sweepbudget.history(None, lines)
    assert (got.load, got.loads, got.load_from) == (10.0, 2, "the results folder's earlier loads")
    none = sweepbudget.history([], [])
    assert none.load is None and none.words().startswith("no load history") and "hours unknown" in none.words()


def at(seconds: float) -> str:
    return f"2026-01-01T00:{int(seconds) // 60:02d}:{seconds % 60:06.3f}+00:00"


def test_the_clock_scale_is_what_an_instances_runs_took_over_its_load_and_commands() -> None:
    one = {"status": "ok", "invocation_id": "a", "host": "h"}
    lines = [{**one, "restarted": True, "load_seconds": 10.0, "run_seconds": 5.0, "started_at": at(0),
              "ended_at": at(20)},  # load and command: 15 s of 20 on the clock (a warmup)
             {**one, "restarted": False, "load_seconds": 10.0, "run_seconds": 5.0, "started_at": at(22),
              "ended_at": at(30)},  # reused (its load not counted again): 2 s between the two, 3 s of warmup
             {"status": "not_ready", "restarted": True, "load_seconds": None, "started_at": at(30),
              "ended_at": at(90)},  # no load, no run: not counted
             {**one, "invocation_id": "b", "restarted": True, "load_seconds": 1.0, "run_seconds": 1.0,
              "started_at": "garbage", "ended_at": at(99)}]
    assert sweepbudget.clock_scale(lines) == pytest.approx(30 / 20)
    assert sweepbudget.clock_scale([]) == 1.0
    quick = [{**lines[0], "ended_at": at(1)}]  # faster than its own load: never below 1
    assert sweepbudget.clock_scale(quick) == 1.0
    assert "x1.50 for their warmups and flushes" in sweepbudget.history([], lines).words()


def timings(p: sweepplan.Plan, load: float | None, run: float | None) -> Timings:
    return sweep.estimate_timings(p, [list(g) for g in p.groups()], False, History(load, 5, "x", run, 3))


def test_the_estimate_counts_a_load_per_configuration_and_a_run_per_point() -> None:
    t = timings(plan("repeats = 2"), 300.0, 60.0)
    left = t.left(t.schedule[0][0], loading=True)
    assert (left.loads, left.runs, left.seconds) == (3, 12, 3 * 300 + 12 * 60)
    one = t.left(t.schedule[0][0], loading=True, one_load=True)  # what the budget checks before the first load
    assert (one.loads, one.runs, one.seconds) == (1, 4, 300 + 4 * 60)
    assert [c for _, c in budgetrun.load_costs(t)] == [540.0, 540.0, 540.0]


def test_dry_run_says_the_loads_and_hours_and_whether_the_budget_fits() -> None:
    hist = History(300.0, 5, "genready's records of the unit", 60.0, 3)
    out = io.StringIO()
    assert sweep.dry_run(plan('budget = "20m"'), Path("/r"), "u.service", "user", set(), out, history=hist) == 0
    said = [ln for ln in out.getvalue().splitlines() if ln.startswith("# expected") or ln.startswith("# budget")]
    assert said == ["# expected: 3 loads and 6 runs, about 21m00s (a load takes 5m00s: the median of 5 verified starts "
                    "(genready's records of the unit); a run 1m00s: the mean of 3 ok runs in the results folder)",
                    "# budget 20m00s: the plan does not fit (about 21m00s expected): the sweep would stop before "
                    "load 3 of 3 (point 5, a=3 c=1), leaving 2 points not reached"]
    out = io.StringIO()
    sweep.dry_run(plan('budget = "1h"'), Path("/r"), "u.service", "user", set(), out, history=hist)
    assert "# budget 1h00m: the plan fits (about 21m00s expected)" in out.getvalue()
    out = io.StringIO()
    sweep.dry_run(plan('budget = "20m"'), Path("/r"), "u.service", "user", set(), out,
                  history=History(160.0, 5, "genready's records of the unit", 60.0, 3, scale=1.5))
    assert "# expected: 3 loads and 6 runs, about 21m00s" in out.getvalue()  # (3 x 160 + 6 x 60) x 1.5
    assert "# budget 20m00s: the plan does not fit (about 21m00s expected): the sweep would stop before load 3" in \
        out.getvalue()
    out = io.StringIO()
    sweep.dry_run(plan('budget = "1h"'), Path("/r"), "u.service", "user", set(), out,
                  history=History(None, 0, "", None, 0))
    assert "# expected: 3 loads and 6 runs, hours unknown (no load history" in out.getvalue()
    assert "# budget 1h00m: whether the plan fits cannot be told without a load history" in out.getvalue()


# --- the stop rule ----------------------------------------------------------------------------------------------

def test_a_load_that_would_end_past_the_budget_does_not_start() -> None:
    assert sweepbudget.fits(0, 100, 100) and not sweepbudget.fits(1, 100, 100)
    assert sweepbudget.fits(10**6, None, 1)  # no estimate yet: it goes ahead (and is timed)
    assert sweepbudget.reach([40, 40, 40], 100) == 2 and sweepbudget.reach([None, 40], 10) == 1
    assert sweepbudget.reach([], 1) == 0


def test_the_guard_checks_each_planned_load_on_the_clock_it_is_given() -> None:
    now = [1000.0]
    t = timings(plan(), 300.0, 60.0)  # each load and its two runs: 420 s
    g = budgetrun.Guard(900.0, clock=lambda: now[0])
    first, second, third = (p for p, load in t.schedule if load)
    assert g.check(t, first) is None
    now[0] += 420
    assert g.check(t, second) is None  # 420 + 420 <= 900
    now[0] += 420
    over = g.check(t, third)
    assert over is not None and g.over is over and (over.spent, over.cost) == (840, 420)
    assert over.words == ("not loaded: the budget of 15m00s would be exceeded (14m00s spent; the next load and its "
                          "runs are expected to take 7m00s)")
    assert budgetrun.left_points(t.schedule, third) == [p for p, _ in t.schedule[4:]]


def test_what_a_load_and_its_runs_took_on_the_clock_scales_the_next_ones_cost() -> None:
    # Timings expects 420 s of each load and its runs (loads and commands); each takes 600 s on the clock (warmups,
    # flushes): after the first, the second is expected to take 600 s too, and 600 + 600 is past 1100.
    now = [0.0]
    t = timings(plan(), 300.0, 60.0)
    g = budgetrun.Guard(1100.0, clock=lambda: now[0])
    first, second, _ = (p for p, load in t.schedule if load)
    assert g.check(t, first) is None
    now[0] += 600
    over = g.check(t, second)
    assert over is not None and over.cost == pytest.approx(600) and over.spent == 600
    quicker = budgetrun.Guard(500.0, clock=lambda: now[0])  # a load quicker than expected: never scaled down
    assert quicker.check(t, first) is None
    now[0] += 100
    over = quicker.check(t, second)
    assert over is not None and (over.spent, over.cost) == (100, 420)
    history = budgetrun.Guard(500.0, clock=lambda: now[0], scale=1.5)  # before a load is done: the history's scale
    assert history.check(t, first) is not None and history.over is not None and history.over.cost == 630


# --- the report -------------------------------------------------------------------------------------------------

def not_reached(index: int, point: dict[str, Any]) -> str:
    return json.dumps({"point": point, "index": index, "status": "skipped", "attempt": 0,
                       "reason": "not loaded: the budget ...",
                       "budget": sweepbudget.budget_json(3600, 3000, 900)}) + "\n"


def test_the_decision_says_it_is_provisional_and_what_the_budget_left(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 200, 150, 60)])
    f.lines += [not_reached(5, {"algo": "big", "c": 1}), not_reached(6, {"algo": "huge", "c": 1})]
    first, best = section(f.report())
    assert first == ("Provisional: the budget (1h00m) ran out before 2 points could be loaded, so the answers above "
                     "are among the configurations reached only. Not reached: algo=big c=1, algo=huge c=1."), first
    assert best.startswith("At c=1: algo=eagle is the best") and best.endswith("; 2 points without an ok run not "
                                                                                "counted."), best
    data = json.loads(f.report("json"))["decision"]
    assert data["provisional"] is True and data["not_reached"] == [
        {"point": "algo=big c=1", "baseline": None, "budget_seconds": 3600, "spent_seconds": 3000,
         "expected_seconds": 900}, {"point": "algo=huge c=1", "baseline": None, "budget_seconds": 3600,
                                    "spent_seconds": 3000, "expected_seconds": 900}]
    read = collect.read_folders([tmp_path])
    from genready.sweep.report import decision
    html = decision.render(collect.rows_from(read), decision_facts(read), "html")
    assert "<li>Provisional: the budget (1h00m) ran out before 2 points" in html


def test_a_point_a_later_run_reached_is_no_longer_left(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 200, 150, 60)])
    f.lines.insert(0, not_reached(2, {"algo": "ngram", "c": 1}))  # then --resume ran it (three_configs' line)
    (f.path / "results.jsonl").write_text("".join(f.lines))
    read = collect.read_folders([tmp_path])
    assert decision_facts(read).provisional is None
    assert json.loads(f.report("json"))["decision"]["provisional"] is False
    assert not sweepreport.render(collect.rows_from(read), "table", decision_facts(read)).startswith("Provisional")


# --- whole sweeps on the simulator ------------------------------------------------------------------------------

def dry(rig: Rig, path: Path, *args: str) -> str:
    return subprocess.run([*GENREADY, "sweep", str(path), "--results", str(rig.results), "--config",
                           str(rig.g.config_path), "--dry-run", *args], env=rig.manager.env, capture_output=True,
                          text=True, timeout=60, check=True).stdout


@pytest.mark.system
def test_dry_run_gives_the_loads_and_hours_from_the_units_own_loads(rig: Rig) -> None:
    path = rig.write_plan({"budget": [8, 16, 32], "topk": [4, 8]})
    # the rig's first start is the unit's one verified start so far
    assert re.search(r"^# expected: 6 loads and 6 runs, more than \d+\.\ds \(a load takes \d+\.\ds: the median of "
                     r"1 verified start \(genready's records of the unit\); no run timed", dry(rig, path), re.M)
    rc, _ = rig.run(path)
    assert rc == 0
    loads = [ln["load_seconds"] for ln in rig.results_lines() if ln["restarted"]]
    out = dry(rig, path, "--budget", "1h")
    # the daemon's records now hold the sweep's three loads and the restore's: the last five verified starts
    m = re.search(r"^# expected: 6 loads and 6 runs, about (\S+) \(a load takes (\S+): the median of 5 verified "
                  r"starts \(genready's records of the unit\); a run (\S+): the mean of 6 ok runs", out, re.M)
    assert m is not None, out
    assert min(loads) - 0.2 <= seconds_of(m.group(2)) <= max(loads) + 1, (m.group(2), loads)
    assert "# budget 1h00m: the plan fits" in out


@pytest.mark.system
def test_a_budget_stops_the_sweep_before_a_load_that_would_overrun_it(rig: Rig) -> None:
    # Each load takes at least 3 s (the simulator's --load-seconds): the first load goes ahead (the unit's history: the
    # rig's first start, a fraction of that), and once it and its two runs are done, the next load, expected to take
    # as long as the first, would end past 5 s.
    path = rig.write_plan({"budget": [8, 16, 32], "topk": [4, 8]}, budget="5s",
                          flags="--model m-{budget} --load-seconds 3")  # topk: a client setting, 2 points a load
    started = time.monotonic()
    rc, out = rig.run(path)
    took = time.monotonic() - started
    err = rig.err.read_text()
    lines = rig.results_lines()
    assert rc == 1, err
    got = [(ln["point"]["budget"], ln["status"]) for ln in lines]
    assert got[:2] == [(8, "ok"), (8, "ok")] and {s for _, s in got[2:]} == {"skipped"} and len(got) == 6, got
    left = lines[-1]
    assert left["budget"]["budget_seconds"] == 5 and left["reason"].startswith("not loaded: the budget of 5.0s")
    assert "budget: stopping before point 3" in err and "4 points not reached" in err, err
    assert re.search(r"^budget 5\.0s: stopped after \S+, the next load and its runs expected to take \S+; 4 points "
                     r"not reached", out, re.M), out
    assert "2/6 points ok" in out
    print(f"budget 5s: stopped after {took:.1f}s (with the restore)")
    rig.assert_restored()
    report = subprocess.run([*GENREADY, "sweep", "report", str(rig.results)], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    assert report.startswith("Decision\n  Provisional: the budget (5.0s) ran out before 4 points could be loaded"), \
        report
    assert "Not reached: budget=16 topk=4, budget=16 topk=8, budget=32 topk=4, budget=32 topk=8." in report
