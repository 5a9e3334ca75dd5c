"""The noise first (issue 51 §1-2): the spread within and between loads (sweep/noise.py), the A/A start
(`noise_check`, sweep/run/noisecheck.py) and `repeats = "auto"` (sweep/run/autorepeat.py)."""

from __future__ import annotations

import io
import json
import math
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.config import ConfigError
from genready.sweep import noise
from genready.sweep import plan as sweepplan
from genready.sweep.main import dry_run
from genready.sweep.report import collect, speedup
from genready.sweep.report import table as sweepreport
from genready.sweep.report.decision import Facts
from genready.sweep.rows import Row
from genready.sweep.run import autorepeat
from genready.sweep.run.autorepeat import Stop
from genready_dev.harness import GENREADY, PY
from tests.test_sweep import Rig

TPS = speedup.RATIOS[0][1]

# a spread between loads of 4 %, as good as known (a million degrees of freedom)
KNOWN = noise.Components(within=0.01 ** 2, between=0.04 ** 2, loads=10 ** 6, runs=3 * 10 ** 6, df_within=2 * 10 ** 6,
                         df_between=10 ** 6 - 1)

# --- the statistics ---------------------------------------------------------------------------------------------


def _loads(rng: random.Random, level: float, sd_within: float, sd_between: float, loads: int, runs: int
           ) -> list[list[float]]:
    """Runs of one configuration: each load's level moved by sd_between, each run by sd_within (log scale)."""
    out = []
    for _ in range(loads):
        at = level + rng.gauss(0, sd_between)
        out.append([math.exp(at + rng.gauss(0, sd_within)) for _ in range(runs)])
    return out


def test_the_components_come_back_from_samples_of_known_spread() -> None:
    rng = random.Random(51)
    for sd_w, sd_b in ((0.01, 0.04), (0.03, 0.0), (0.02, 0.02)):
        configs = [_loads(rng, math.log(100 + 10 * i), sd_w, sd_b, 3, 4) for i in range(300)]
        got = noise.components(configs)
        assert got is not None and (got.loads, got.runs, got.df_within, got.df_between) == (900, 3600, 2700, 600)
        assert math.sqrt(got.within) == pytest.approx(sd_w, rel=0.05)
        assert math.sqrt(got.between) == pytest.approx(sd_b, abs=0.005)  # truncated at 0: a little above 0 there
    # unequal loads: n0 corrects for them
    configs = [[*_loads(rng, 5.0, 0.01, 0.04, 1, 2), *_loads(rng, 5.0, 0.01, 0.04, 1, 6)] for _ in range(2000)]
    got = noise.components(configs)
    assert got is not None and math.sqrt(got.between) == pytest.approx(0.04, rel=0.08)
    # nothing to compare: a configuration loaded once, or no run at all
    assert noise.components([_loads(rng, 5.0, 0.01, 0.04, 1, 5)]) is None
    assert noise.components([[[], [1.0]]]) is None


def test_the_between_load_term_makes_the_intervals_cover_a_second_load() -> None:
    """A point and the baseline, each on its own load with 3 runs, true ratio 1.2, 1 % within a load and 4 %
    between loads: one load's repeats give intervals far too narrow; with the between-load variance each
    side's load adds they hold the truth about 95 times in 100."""
    rng = random.Random(7)
    with_it = without = 0
    trials = 400
    for _ in range(trials):
        point = _loads(rng, math.log(120.0), 0.01, 0.04, 1, 3)[0]
        base = _loads(rng, math.log(100.0), 0.01, 0.04, 1, 3)[0]
        wide, narrow = noise.ratio(point, base, loads=KNOWN), noise.ratio(point, base)
        assert wide is not None and narrow is not None and wide.low is not None and narrow.low is not None
        with_it += wide.low <= 1.2 <= (wide.high or 0)
        without += narrow.low <= 1.2 <= (narrow.high or 0)
    assert with_it >= 0.92 * trials and without <= 0.6 * trials, (with_it, without)


def test_an_estimate_from_an_aa_start_of_three_loads_covers_as_asked() -> None:
    """The between part estimated from an A/A start of 3 loads of 3 runs (2 degrees of freedom), its doubt in the
    interval's t (Welch-Satterthwaite): the interval holds the truth about 95 times in 100."""
    rng = random.Random(11)
    held, trials = 0, 300
    for _ in range(trials):
        aa = noise.components([_loads(rng, 5.0, 0.01, 0.04, 3, 3)])
        assert aa is not None and aa.df_between == 2
        point = _loads(rng, math.log(120.0), 0.01, 0.04, 1, 3)[0]
        base = _loads(rng, math.log(100.0), 0.01, 0.04, 1, 3)[0]
        got = noise.ratio(point, base, loads=aa)
        assert got is not None and got.low is not None and got.high is not None
        held += got.low <= 1.2 <= got.high
    assert held >= 0.9 * trials, held


def _baseline_rounds(rng: random.Random, rounds: int, settings: int) -> list[Row]:
    """A baseline's rounds at `settings` client settings, 3 runs each at 1 % within a load: every setting of a
    round runs on that round's one load (one load effect of 4 %), as a sweep runs them."""
    rows: list[Row] = []
    for round_ in range(1, rounds + 1):
        at = math.log(100.0) + rng.gauss(0, 0.04)
        for c in range(1, settings + 1):
            rows.append(Row(len(rows), f"baseline#{round_} c={c}", "ok", baseline=round_, point={"c": c},
                            samples={TPS: [math.exp(at + rng.gauss(0, 0.01)) for _ in range(3)]}))
    return rows


def test_client_settings_of_one_load_count_as_one_load() -> None:
    """A baseline round runs every client setting on one load: its 4 settings' rounds are 3 loads, not 12, and
    the between part's df are 2, not 8 (a t at 8 df made intervals too narrow)."""
    est = collect.noise_of(_baseline_rounds(random.Random(3), 3, 4), [])
    assert est is not None and est.baseline_loads == 3
    got = est.loads(TPS)
    assert got is not None and (got.loads, got.runs, got.df_between, got.df_within) == (3, 36, 2, 24)
    # the pooled estimate is the same as when the settings were counted apart: only its firmness changes
    apart = noise.components([[r.samples[TPS] for r in est_rows if r.point["c"] == c]
                              for est_rows in [_baseline_rounds(random.Random(3), 3, 4)] for c in range(1, 5)])
    assert apart is not None and apart.df_between == 8 and apart.between == pytest.approx(got.between)


def test_an_estimate_from_a_baselines_rounds_at_several_settings_covers_as_asked() -> None:
    """The between part from a baseline's 3 rounds at 4 client settings (2 df: the settings share each round's
    load), a point and the baseline each on its own load, true ratio 1.2: the interval holds the truth about
    95 times in 100 (85 with the settings' rounds counted as loads of their own)."""
    rng = random.Random(51)
    held, trials = 0, 600
    for _ in range(trials):
        est = collect.noise_of(_baseline_rounds(rng, 3, 4), [])
        assert est is not None
        point = _loads(rng, math.log(120.0), 0.01, 0.04, 1, 3)[0]
        base = _loads(rng, math.log(100.0), 0.01, 0.04, 1, 3)[0]
        got = noise.ratio(point, base, loads=est.loads(TPS))
        assert got is not None and got.low is not None and got.high is not None
        held += got.low <= 1.2 <= got.high
    assert held >= 0.91 * trials, held


def test_the_replication_interval_holds_a_second_sweeps_estimate() -> None:
    """Where a second sweep of the same plan lands: the confidence interval (about the true ratio) holds another
    sweep's estimate only about 83 % of the time at a well-known spread (that estimate has its own noise); the
    replication interval, sqrt(2) times as wide on the log scale, about 95 %."""
    rng = random.Random(29)
    in_ci = in_rep = 0
    trials = 600

    def measured() -> noise.Ratio:
        point = _loads(rng, math.log(120.0), 0.01, 0.04, 1, 3)[0]
        base = _loads(rng, math.log(100.0), 0.01, 0.04, 1, 3)[0]
        got = noise.ratio(point, base, loads=KNOWN)
        assert got is not None
        return got

    for _ in range(trials):
        a, b = measured(), measured()
        assert a.low is not None and a.high is not None and a.rep_low is not None and a.rep_high is not None
        half = math.log(a.high / a.value)
        assert math.log(a.rep_high / a.value) == pytest.approx(math.sqrt(2) * half)
        assert math.log(a.value / a.rep_low) == pytest.approx(math.sqrt(2) * half)
        in_ci += a.low <= b.value <= a.high
        in_rep += a.rep_low <= b.value <= a.rep_high
    assert in_ci <= 0.88 * trials and in_rep >= 0.92 * trials, (in_ci, in_rep)
    # one run a side: no interval of either kind
    assert noise.ratio([1.2], [1.0]) == noise.Ratio(1.2)
    # --format json gives it beside the confidence interval, whose fields stay as they were
    row = Row(1, "algo=x c=1", "ok", ratios={"speedup": a, "ttft_ratio": noise.Ratio(0.9)})
    got = sweepreport.ratio_json(row)
    assert got["speedup"]["replication"] == {"low": a.rep_low, "high": a.rep_high}
    assert (got["speedup"]["low"], got["speedup"]["high"]) == (a.low, a.high)
    assert got["ttft_ratio"]["replication"] is None


def test_the_smallest_speedup_and_the_warning() -> None:
    c = noise.Components(within=0.02 ** 2, between=0.0, loads=2, runs=6, df_within=4, df_between=1)
    # two sides of 3 runs at 2 %: t(0.975, 4) = 2.776 times sqrt(2 * 0.0004 / 3)
    assert c.smallest_speedup(3) == pytest.approx(math.exp(2.776 * math.sqrt(2 * 0.0004 / 3)), rel=1e-3)
    text, warn = noise.words(c, 3, 0.10, "output tok/s")
    assert not warn and "1.046x" in text and "between loads 0.0%" in text
    loud = noise.Components(within=0.02 ** 2, between=0.05 ** 2, loads=2, runs=6, df_within=4, df_between=1)
    text, warn = noise.words(loud, 3, 0.10, "output tok/s")
    assert warn and "warning: larger than the plan's noise_limit (10%)" in text and "repeats shrink only" in text
    assert loud.smallest_speedup(100) > 1.1  # more repeats never beat the between-load part


# --- the stop rule ---------------------------------------------------------------------------------------------

def test_the_stop_rule() -> None:
    rule = autorepeat.rule
    assert rule([100.0], [200.0, 201.0], loads=None, cap=8, noise_limit=0.1) == (None, None)  # two runs first
    stop, got = rule([100.0, 101.0], [200.0, 201.0], loads=None, cap=8, noise_limit=0.1)
    assert stop is Stop.BEHIND and got is not None and got.high is not None and got.high < 1
    assert rule([200.0, 201.0], [100.0, 101.0], loads=None, cap=8, noise_limit=0.1)[0] is Stop.AHEAD
    # its interval holds 1, but at the cap, at this ratio and these runs' spread, it would not: another run
    assert rule([100.0, 112.0], [92.0, 92.5, 92.2], loads=None, cap=8, noise_limit=0.1)[0] is None
    # at this ratio, so close to 1, even the cap would leave it holding 1: tied
    assert rule([100.0, 112.0], [104.0, 105.0, 104.5], loads=None, cap=8, noise_limit=0.1)[0] is Stop.TIED
    # near the leader, and the between-load part alone keeps the interval over 1: tied
    assert rule([100.0, 103.0], [101.0, 99.0], loads=KNOWN, cap=8, noise_limit=0.1)[0] is Stop.TIED
    # alone at its setting: until its own interval is within noise_limit / 2
    assert rule([100.0, 130.0], None, loads=None, cap=8, noise_limit=0.1)[0] is None
    assert rule([100.0, 100.1, 99.9], None, loads=None, cap=8, noise_limit=0.1)[0] is Stop.ALONE
    assert rule([100.0, 130.0, 100.0], None, loads=None, cap=3, noise_limit=0.1)[0] is Stop.CAP
    assert rule([100.0, 112.0, 99.0, 108.0], [104.0, 105.0, 104.5], loads=None, cap=4, noise_limit=0.1)[0] is Stop.CAP


# --- the plan's keys --------------------------------------------------------------------------------------------

def _plan(**keys: Any) -> sweepplan.Plan:
    return sweepplan.parse_plan({"command": "bench {c}", "matrix": {"c": [1, 2]}, **keys}, "plan.toml")


def test_the_keys_and_their_errors() -> None:
    p = _plan()
    assert (p.repeats, p.repeats_auto, p.noise_check, p.max_repeats) == (1, False, 0, 8)
    p = _plan(repeats="auto", max_repeats=5, noise_check=True)
    assert (p.repeats, p.repeats_auto, p.noise_check) == (5, True, 2)
    assert _plan(noise_check=4).noise_check == 4 and _plan(noise_check=False).noise_check == 0
    cases: list[tuple[dict[str, Any], str, str, str]] = [
            ({"repeats": "sometimes"}, "repeats", 'an integer from 1 to 1000, or "auto"', "string 'sometimes'"),
            ({"repeats": "auto", "max_repeats": 1}, "max_repeats", "an integer from 2 to 1000", "integer 1"),
            ({"max_repeats": 4}, "max_repeats", 'repeats = "auto" (its cap)', "repeats = 1"),
            ({"noise_check": 1}, "noise_check", "true, false, or a number of loads from 2 to 10", "integer 1"),
            ({"noise_check": "yes"}, "noise_check", "true, false, or a number of loads from 2 to 10", "string 'yes'"),
            ({"noise_check": 11}, "noise_check", "true, false, or a number of loads from 2 to 10", "integer 11")]
    for keys, key, expected, found in cases:
        with pytest.raises(ConfigError) as e:
            _plan(**keys)
        assert (e.value.file, e.value.key, e.value.expected, e.value.found) == ("plan.toml", key, expected, found)
    search = {"command": "bench {search}", "matrix": {"c": [1]}, "search": {"mode": "saturation"}}
    for key, value, expected in (("repeats", "auto", "an integer with [search]"), ("noise_check", True, "false")):
        with pytest.raises(ConfigError) as e:
            sweepplan.parse_plan({**search, key: value}, "plan.toml")
        assert e.value.key == key and e.value.expected.startswith(expected), e.value


# --- the report ---------------------------------------------------------------------------------------------------

def _line(folder: Path, index: int, point: dict[str, Any], tps: float, repeat: int, **extra: Any) -> str:
    out = f"{index:02d}-{extra.get('aa', 0)}/repeat-{repeat}"
    (folder / out).mkdir(parents=True)
    (folder / out / "bench.jsonl").write_text(json.dumps({"output_tokens_per_second": tps}) + "\n")
    return json.dumps({"point": point, "index": index, "status": "ok", "out": out, "repeat": repeat,
                       "noise_limit": 0.1, "client": {"c": 1}, "plan_points": 2, **extra}) + "\n"


def _results(folder: Path, *, aa: bool) -> list[Any]:
    lines = []
    for r, (a1, a2, b, fast, slow) in enumerate([(100, 110, 100, 150, 90), (101, 111, 101, 152, 91),
                                                 (99, 109, 99, 148, 89)], 1):
        if aa:  # the A/A start: the first point's values, loaded twice, 10 % apart
            lines += [_line(folder, 4, {"lat": 1, "c": 1}, a1, r, aa=1),
                      _line(folder, 5, {"lat": 1, "c": 1}, a2, r, aa=2)]
        lines += [_line(folder, 3, {"lat": 0, "c": 1}, b, r, baseline=1),
                  _line(folder, 1, {"lat": 1, "c": 1}, fast, r, baseline_round=1),
                  _line(folder, 2, {"lat": 2, "c": 1}, slow, r, baseline_round=1)]
    (folder / "results.jsonl").write_text("".join(lines))
    return collect.rows_of([folder])


def test_the_report_takes_the_between_load_part_in_or_says_one_load(tmp_path: Path) -> None:
    one = _results(tmp_path / "one", aa=False)
    note, warn = speedup.noise_note(one)
    assert note == speedup.ONE_LOAD and not warn
    narrow = one[0].ratios["speedup"]
    two = _results(tmp_path / "two", aa=True)
    assert [r.label for r in two] == ["lat=1 c=1", "lat=2 c=1", "baseline#1 lat=0 c=1"]  # the A/A loads: no rows
    wide = two[0].ratios["speedup"]
    assert wide.value == pytest.approx(narrow.value)
    assert wide.low is not None and narrow.low is not None and wide.high is not None and narrow.high is not None
    assert wide.low < narrow.low and wide.high > narrow.high
    note, warn = speedup.noise_note(two)
    assert note.startswith("the intervals take in the spread between loads, measured by an A/A start of 2 loads")
    # two loads 10 % apart: a spread of 0.095 / sqrt(2), too wide to tell the plan's noise_limit
    assert "between loads 6.9%" in note and warn and "warning: larger than the plan's noise_limit" in note
    data = json.loads(sweepreport.render(two, "json", Facts()))["decision"]
    assert data["noise"]["figures"]["output_tokens_per_second"]["loads"] == 2 and data["noise"]["warning"]
    assert note in data["notes"]
    text = sweepreport.render(one, "table", Facts())
    assert "the intervals cover one load only" in text


# --- on the simulator -----------------------------------------------------------------------------------------

def _noisy_plan(rig: Rig, matrix: dict[str, list[Any]], **extra: Any) -> Path:
    """Each configuration's speed set by the simulator's --token-latency; every start drawn 5 % slower or
    faster (--load-noise)."""
    doc = {"target": "t", "timeout": 20, "warmup": 1, "baseline": {"lat": 0.02},
           "command": [PY, "-m", "genready.benchclient", "--url", rig.url, "-n", "4", "-c", "{c}", "--max-tokens", "8",
                       "--output", "{out}/bench.jsonl"],
           "dropin": f"[Service]\nExecStart=\nExecStart={PY} -m genready.cli simulate --port {rig.port} "
                     "--load-seconds 0.2 --token-latency {lat} --load-noise 0.05\n",
           "matrix": matrix, **extra}
    path = rig.tmp / "plan.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


@pytest.mark.system
def test_an_aa_start_loads_the_first_configuration_twice_first(rig: Rig) -> None:
    plan = _noisy_plan(rig, {"lat": [0.01, 0.03], "c": [1]}, noise_check=True, repeats=2)
    rc, out = rig.run(plan)
    assert rc == 0, out
    lines = rig.results_lines()
    aa = [ln for ln in lines if ln.get("aa")]
    assert lines[:6] == aa and [ln["aa"] for ln in aa] == [1, 1, 1, 2, 2, 2]  # first, 3 runs a load at least
    assert all(ln["point"] == {"lat": 0.01, "c": 1} and ln["status"] == "ok" for ln in aa)
    assert len({ln["pid"] for ln in aa[:3]}) == 1 and len({ln["pid"] for ln in aa}) == 2  # two starts
    assert all("/repeat-" in ln["out"] for ln in aa)
    err = rig.err.read_text()
    assert "noise check, output tok/s: within a load" in err and "(2 loads, 6 runs)" in err, err
    report = json.loads(_report_json(rig))
    got = report["decision"]["noise"]
    assert got["source"] == "an A/A start of 2 loads of one configuration" and not got["one_load"]
    assert got["figures"]["output_tokens_per_second"]["loads"] == 2
    assert [r["point"] for r in report["rows"]] == ["lat=0.01 c=1", "lat=0.03 c=1", "baseline#1 lat=0.02 c=1"]


def _report_json(rig: Rig) -> str:
    return subprocess.run([*GENREADY, "sweep", "report", str(rig.results), "--format", "json"], capture_output=True,
                          text=True, timeout=60, check=True).stdout


@pytest.mark.system
def test_repeats_auto_stops_a_point_that_is_clearly_behind(rig: Rig) -> None:
    # the baseline first (alone), then a configuration twice as fast, then one 2.5 times slower than that
    plan = _noisy_plan(rig, {"lat": [0.01, 0.05], "c": [1]}, repeats="auto", max_repeats=6)
    rc, out = rig.run(plan)
    assert rc == 0, out
    lines = rig.results_lines()
    slow = [ln for ln in lines if ln["point"] == {"lat": 0.05, "c": 1}]
    assert 2 <= len(slow) < 6 and all(ln["status"] == "ok" for ln in slow)
    last = slow[-1]["repeats_auto"]
    assert last["stop"] == "behind" and last["leader"] == 1 and last["ratio"]["high"] < 1, last
    assert all(ln["repeats_auto"]["stop"] is None for ln in slow[:-1])
    assert all("/repeat-" in ln["out"] for ln in lines)
    assert len(lines) < 3 * 6
    # --resume: every point stopped, none runs again (the baseline does, as it always does on --resume)
    rc, out = rig.run(plan, "--resume")
    assert rc == 0, out
    points = [ln for ln in lines if not ln.get("baseline")]
    assert [ln for ln in rig.results_lines() if not ln.get("baseline")] == points


def test_the_dry_run_shows_the_aa_start_first(tmp_path: Path) -> None:
    plan = sweepplan.parse_plan({"command": "bench {c}", "dropin": "[Service]\nEnvironment=L={lat}\n",
                                 "matrix": {"lat": [1, 2], "c": [1]}, "noise_check": 2, "repeats": 3}, "plan.toml")
    out = io.StringIO()
    assert dry_run(plan, tmp_path, "sim.service", "user", set(), out) == 0
    text = out.getvalue()
    assert "## server configuration 1, the A/A start (load 1): points 3" in text, text
    assert "## server configuration 2, the A/A start (load 2): points 4" in text
    assert "## server configuration 3: points 1" in text and "[3/4] a/a#1 lat=1 c=1  (restart)" in text
    assert "; 3 repeats per point; an A/A start of 2 loads first (noise_check)" in text
    auto = sweepplan.parse_plan({"command": "bench {c}", "matrix": {"c": [1]}, "repeats": "auto"}, "plan.toml")
    out = io.StringIO()
    dry_run(auto, tmp_path, "sim.service", "user", set(), out)
    assert "; up to 8 repeats per point" in out.getvalue()
