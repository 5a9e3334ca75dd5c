"""A plan's `[search]` run by the sweep (issue 39 §2): the plan key's checks in process, and real searches on a
simulator unit whose batch model saturates (--batch-max-running), each step a verified run of the bench client."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import plan as sweepplan
from genready.sweep import results as sweepresults
from genready.sweep import search, searchrun
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


def search_plan(rig: Rig, table: dict[str, Any]) -> Path:
    doc = {"target": "t", "timeout": 20, "warmup": 0,
           "command": [PY, "-m", "genready.benchclient", "--url", rig.url, "--max-tokens", "10", "--seed", "3",
                       "--output", "{out}/bench.jsonl", "{search}"],
           "dropin": f'[Service]\nEnvironment="SIM_FLAGS={SIM}"\n', "matrix": {"cap": [4]},
           "search": {"max_requests_per_step": 16, "max_step_seconds": 10, "max_concurrency": 8, **table}}
    path = rig.tmp / "plan.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def found_lines(rig: Rig) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (rig.results / searchrun.SEARCH_FILE).read_text().splitlines()]


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
    (simrig.results / searchrun.SEARCH_FILE).unlink()
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
