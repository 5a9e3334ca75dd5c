"""The report's Decision section (issue 37 §3, issue 39 §3): in-process over results folders written here (the
report's own reading of results.jsonl, bench.jsonl and search.jsonl): the best configuration with its speedup
and interval, the ones within noise of it, a slowdown said, the plan's `slo` judged, the search's found lines
(with and without crossovers); the `slo` plan key; --compare's speedup changes; and a sweep on the simulator
whose report starts with the decision naming the configuration the simulator makes faster.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from genready.compat import tomllib
from genready.config import ConfigError
from genready.sweep import plan as sweepplan
from genready.sweep.report import collect, decision
from genready.sweep.report import compare as sweepcompare
from genready.sweep.report import table as sweepreport
from genready.sweep.report.main import decision_facts, report_main
from genready_dev.harness import GENREADY
from tests.test_sweep import Rig
from tests.test_sweep_speedup import _speed_plan

SLO = {"ttft_p99_ms": 500, "itl_p50_ms": 40}


class Folder:
    """A results folder written line by line, as a sweep writes it: results.jsonl, each run's bench.jsonl."""

    def __init__(self, path: Path, *, slo: dict[str, Any] | None = None, baseline: bool = True) -> None:
        self.path, self.slo, self.baseline = path, slo, baseline
        self.lines: list[str] = []
        path.mkdir(parents=True, exist_ok=True)

    def run(self, index: int, point: dict[str, Any], tps: float, repeat: int = 1, *, base: int = 0,
            bench: dict[str, float] | None = None) -> None:
        out = f"{index:02d}/repeat-{repeat}"
        (self.path / out).mkdir(parents=True)
        (self.path / out / "bench.jsonl").write_text(json.dumps({
            "output_tokens_per_second": tps, "ttft_p50_ms": 20.0, "ttft_p99_ms": 100.0, "itl_p50_ms": 10.0,
            "itl_p99_ms": 15.0, "e2e_p50_ms": 8000 / tps, "e2e_p99_ms": 9000 / tps, **(bench or {})}) + "\n")
        rec: dict[str, Any] = {"point": point, "index": index, "status": "ok", "out": out, "repeat": repeat,
                               "noise_limit": 0.1, "attempt": 1}
        if self.baseline:
            rec["client"] = {"c": point["c"]}
            rec["baseline" if base else "baseline_round"] = base or 1
        if self.slo is not None:
            rec["slo"] = self.slo
        self.lines.append(json.dumps(rec) + "\n")

    def search(self, *found: dict[str, Any]) -> None:
        (self.path / "search.jsonl").write_text("".join(json.dumps(f) + "\n" for f in found))

    def report(self, fmt: str = "table") -> str:
        (self.path / "results.jsonl").write_text("".join(self.lines))
        read = collect.read_folders([self.path])
        return sweepreport.render(collect.rows_from(read), fmt, decision_facts(read))


def section(text: str) -> list[str]:
    """The Decision section's sentences (a table's: indented under the title, up to the notes)."""
    lines = text.splitlines()
    assert lines[0] == "Decision", text
    return [ln.strip() for ln in itertools.takewhile(lambda ln: ln.startswith("  "), lines[1:])]


def three_configs(f: Folder, rounds: list[tuple[float, float, float, float]], **bench: dict[str, float]) -> None:
    """algo = eagle, ngram, slow at c=1 and their baseline (algo=none), one line each per repeat."""
    for r, (b, eagle, ngram, slow) in enumerate(rounds, 1):
        f.run(4, {"algo": "none", "c": 1}, b, r, base=1)
        for index, name, tps in ((1, "eagle", eagle), (2, "ngram", ngram), (3, "slow", slow)):
            f.run(index, {"algo": name, "c": 1}, tps, r, bench=bench.get(name))


def test_the_best_its_speedup_with_its_interval_and_those_within_noise(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 200, 195, 60), (102, 204, 199, 61), (98, 198, 205, 59)])
    text = f.report()
    (sentence,) = section(text)
    assert sentence.startswith("At c=1: algo=eagle is the best at 200.0 output tok/s, 2.01x the baseline's "
                               "[95 % interval 1.93-2.09]; within noise of it: algo=ngram (199.0)."), sentence
    assert "algo=slow" not in sentence and "SLO" not in sentence  # far from the best; no slo in these lines
    assert "(within noise: their output tok/s over the best's has a 95 % interval holding 1" in text
    assert text.index("Decision") < text.index("POINT")  # first
    data = json.loads(f.report("json"))
    assert data["decision"]["settings"][0]["best"]["configuration"] == "algo=eagle"
    assert [p["configuration"] for p in data["decision"]["settings"][0]["within_noise"]] == ["algo=ngram"]
    assert data["decision"]["slo"] is None and len(data["rows"]) == 4  # the rows as before
    md = f.report("markdown")
    assert md.startswith("## Decision\n\n- At c=1: algo=eagle is the best") and "\n| POINT |" in md


def test_where_every_configuration_is_slower_it_says_no_speculation_at_this_load(tmp_path: Path) -> None:
    # issue 52 §4: the baseline is a candidate; a best that is slower than it is never named as the answer
    f = Folder(tmp_path)
    three_configs(f, [(100, 50, 40, 30), (102, 52, 41, 31), (98, 49, 39, 29)])
    (sentence,) = section(f.report())
    assert sentence.startswith("At c=1: no speculation at this load: the baseline's 100.0 output tok/s is the best; "
                               "the closest configuration, algo=eagle at 50.0, is 0.50x the baseline's [95 % interval"
                               ), sentence
    assert ": a slowdown, the baseline is faster" in sentence and " is the best at " not in sentence, sentence
    got = json.loads(f.report("json"))["decision"]["settings"][0]
    assert got["answer"] == "no_speculation" and got["repeats_needed"] is None


def test_a_baseline_best_by_its_estimate_within_noise_is_still_no_speculation(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 97, 40, 30), (104, 99, 41, 31), (96, 98, 39, 29)])
    (sentence,) = section(f.report())
    assert sentence.startswith("At c=1: no speculation at this load: the baseline's 100.0 output tok/s is the best; "
                               "the closest configuration, algo=eagle at 98.0, is 0.98x"), sentence
    assert "within noise of the baseline, no speedup shown" in sentence


def test_an_interval_too_wide_to_tell_asks_for_repeats_and_names_no_configuration(tmp_path: Path) -> None:
    # The stand-in: two repeats of a noisy baseline, the best configuration below it by its estimate
    # and an interval from far below to far above 1. No answer is named; the repeats that would tell are said.
    f = Folder(tmp_path)
    three_configs(f, [(900, 540, 400, 300), (430, 490, 380, 290)])
    (sentence,) = section(f.report())
    assert sentence.startswith("At c=1: more repeats needed, no configuration named: the best estimate, algo=eagle "
                               "at 515.0 output tok/s, is 0.83x the baseline's [95 % interval 0.01-65.67], "), sentence
    assert "too wide to tell a 10% gain from a 10% loss (the plan's noise_limit); more than 100 repeats of each " \
        "would be needed (the runs' noise: 7% and the baseline's 69%): make the runs steadier;" in sentence, sentence
    assert "is the best at" not in sentence and "no speculation" not in sentence
    # a steadier baseline: a number of repeats, from the noise measured, that would tell
    g = Folder(tmp_path / "steadier")
    three_configs(g, [(100, 120, 40, 30), (80, 86, 39, 29)])
    (sentence,) = section(g.report())
    assert "more repeats needed" in sentence and "; repeats = " in sentence, sentence
    got = json.loads(g.report("json"))["decision"]["settings"][0]
    assert got["answer"] == "undecided" and isinstance(got["repeats_needed"], int) and got["repeats_needed"] > 2


def test_the_repeats_needed_narrow_the_interval_as_said() -> None:
    # repeats_needed's n, fed runs of the measured noise, gives an interval that tells a 10 % gain from a loss;
    # one fewer does not
    from genready.sweep import noise
    from genready.sweep.report import speedup
    a, b = [100.0, 108.0, 93.0], [120.0, 111.0, 131.0]
    n = speedup.repeats_needed(a, b, 0.1)
    assert n is not None and 3 < n < 100

    def half(k: int) -> float:
        # runs with the same log variance, repeated to k: the interval's half width on the log scale
        sa, sb = statistics.variance([math.log(v) for v in a]), statistics.variance([math.log(v) for v in b])
        va, vb = sa / k, sb / k
        df = (va + vb) ** 2 / ((va * va + vb * vb) / (k - 1))
        return noise.t_quantile(0.975, df) * math.sqrt(va + vb)

    assert half(n) < math.log1p(0.1) <= half(n - 1)
    assert speedup.repeats_needed([100.0], [120.0], 0.1) is None  # no noise measured
    assert speedup.repeats_needed([100.0, 300.0], [50.0, 400.0], 0.1) is None  # more than 100


def test_a_speedup_within_noise_of_1_says_so(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 103, 40, 30), (104, 97, 41, 31), (96, 101, 39, 29)])
    (sentence,) = section(f.report())
    assert "within noise of the baseline, no speedup shown" in sentence, sentence


def test_a_skipped_point_counts_at_its_client_setting(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 200, 150, 60)])
    # a pruned point's line names no client setting (nothing ran): its point's values say which
    f.lines.append(json.dumps({"point": {"algo": "big", "c": 1}, "index": 5, "status": "skipped", "attempt": 0}) + "\n")
    (sentence,) = section(f.report())
    assert sentence.startswith("At c=1: algo=eagle is the best") and sentence.endswith(
        "; 1 point without an ok run not counted."), sentence


def test_a_partial_set_says_its_best_is_of_the_points_present(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 200, 150, 60)])
    f.lines = [json.dumps({**json.loads(ln), "plan_points": 5}) + "\n" for ln in f.lines]  # point 5 never ran
    (f.path / "results.jsonl").write_text("".join(f.lines))
    assert report_main([str(f.path)], "table") == 0
    out = capsys.readouterr().out
    assert section(out)[0].startswith("At c=1: algo=eagle is the best")
    assert "(partial: 1 of 5 points have no result" in out and "; the best of the points present)" in \
        out[:out.index("POINT")], out


def test_without_a_baseline_it_says_so_and_gives_tok_s(tmp_path: Path) -> None:
    f = Folder(tmp_path, baseline=False)
    for index, (name, c, tps) in enumerate([("a", 1, 100.0), ("b", 1, 150.0), ("a", 4, 300.0), ("b", 4, 290.0)], 1):
        f.run(index, {"algo": name, "c": c}, tps)
    # no `client` in the lines: the client axis is the one that changes inside a server configuration (its group)
    f.lines = [json.dumps({**json.loads(ln), "group": 1 if '"a"' in ln else 2}) + "\n" for ln in f.lines]
    text = f.report()
    assert section(text) == [
        "At c=1: algo=b is the best at 150.0 output tok/s; no other configuration within noise of it.",
        # one run each: within the plan's noise_limit (10 %) of the best
        "At c=4: algo=a is the best at 300.0 output tok/s; within noise of it: algo=b (290.0)."], text
    assert "(no baseline in this sweep: tok/s only" in text


def test_the_slo_best_among_those_that_met_it_and_what_each_other_failed(tmp_path: Path) -> None:
    f = Folder(tmp_path, slo=SLO)
    three_configs(f, [(100, 200, 150, 60), (102, 204, 151, 61), (98, 198, 149, 59)],
                  eagle={"ttft_p99_ms": 800.0}, slow={"itl_p50_ms": 41.5})
    text = f.report()
    (sentence,) = section(text)
    assert "algo=eagle is the best at 200.0 output tok/s" in sentence
    assert "; under your SLO the best is algo=ngram at 150.0 tok/s, 1.50x the baseline's [95 % interval" in sentence
    assert "; not met by algo=eagle (ttft_p99_ms 800 > 500), algo=slow (itl_p50_ms 41.5 > 40)." in sentence, sentence
    assert "(your SLO (the plan's slo key): ttft_p99_ms <= 500 ms, itl_p50_ms <= 40 ms" in text
    slo = json.loads(f.report("json"))["decision"]
    assert slo["slo"] == {"ttft_p99_ms": 500.0, "itl_p50_ms": 40.0}
    assert slo["settings"][0]["slo_best"]["configuration"] == "algo=ngram"
    assert [(x["configuration"], x["failed"]) for x in slo["settings"][0]["slo_not_met"]] == [
        ("algo=eagle", {"ttft_p99_ms": 800.0}), ("algo=slow", {"itl_p50_ms": 41.5})]


def test_a_point_meets_the_slo_only_if_its_worst_repeat_does(tmp_path: Path) -> None:
    f = Folder(tmp_path, slo=SLO)
    f.run(3, {"algo": "none", "c": 1}, 100.0, base=1)
    f.run(1, {"algo": "eagle", "c": 1}, 200.0, 1)
    # the median of the two repeats would pass; this repeat does not
    f.run(1, {"algo": "eagle", "c": 1}, 200.0, 2, bench={"ttft_p99_ms": 501.0})
    f.run(2, {"algo": "ngram", "c": 1}, 120.0)
    (sentence,) = section(f.report())
    assert "not met by algo=eagle (ttft_p99_ms 501 > 500)" in sentence and "under your SLO the best is algo=ngram" \
        in sentence, sentence


def test_the_best_meeting_it_and_none_meeting_it(tmp_path: Path) -> None:
    f = Folder(tmp_path / "all", slo=SLO)
    three_configs(f, [(100, 200, 150, 60)])
    (sentence,) = section(f.report())
    assert "; it meets your SLO" in sentence and "not met" not in sentence, sentence
    f = Folder(tmp_path / "none", slo={"ttft_p99_ms": 50})
    three_configs(f, [(100, 200, 150, 60)])
    (sentence,) = section(f.report())
    assert "; none met your SLO; not met by algo=eagle (ttft_p99_ms 100 > 50), algo=ngram (ttft_p99_ms 100 > 50)" \
        in sentence, sentence


def test_a_part_no_bench_figure_measures_is_not_judged_met(tmp_path: Path) -> None:
    f = Folder(tmp_path, slo={"ttft_p90_ms": 500})  # the bench line carries p50 and p99
    three_configs(f, [(100, 200, 150, 60)])
    (sentence,) = section(f.report())
    assert "none met your SLO" in sentence and "not judged: algo=eagle (ttft_p90_ms not measured)" in sentence


def test_an_old_folder_without_slo_has_no_slo_sentence_and_the_last_slo_counts(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 200, 150, 60)])
    assert "SLO" not in f.report()
    facts = decision.Facts.of([{"slo": {"ttft_p99_ms": 9}}, {"slo": "garbage"}, {"slo": {"itl_p50_ms": 40}}, {}])
    assert [p.key for p in facts.slo] == ["itl_p50_ms"] and "2 different SLOs" in facts.notes[0]


FOUND = {"mode": "slo", "axis": "rate", "steps": 6, "complete": True}


def test_the_search_sentences_best_under_the_slo_and_where_speculation_pays(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 200, 150, 60)])
    f.search({**FOUND, "point": {"algo": "eagle", "c": 1}, "max_rate_under_slo": 9.0, "crossover": 3.0,
              "crossover_status": "interpolated"},
             {**FOUND, "point": {"algo": "ngram", "c": 1}, "max_rate_under_slo": 12.5, "crossover": 7.25,
              "crossover_status": "interpolated"},
             {**FOUND, "point": {"algo": "slow", "c": 1}, "max_rate_under_slo": 2.0, "crossover": None,
              "crossover_status": "never_pays"},
             # the baseline's own search, though it holds a plan point's values (left out, and not that point's)
             {**FOUND, "point": {"algo": "ngram", "c": 1}, "max_rate_under_slo": 30.0, "baseline": 1})
    got = section(f.report())
    # a searched configuration's row is its search's last step: the search's sentences speak for it, not the row
    assert got[0] == "Best under your SLO: algo=ngram c=1, serves up to 12.5 req/s; speculation pays up to 7.25 " \
        "req/s (interpolated between steps).", got
    assert "algo=slow c=1: speculation never pays at the loads searched" in got[1] and len(got) == 2


def test_search_lines_without_crossover_fields_and_other_statuses(tmp_path: Path) -> None:
    f = Folder(tmp_path)
    three_configs(f, [(100, 200, 150, 60)])
    f.search({**FOUND, "point": {"algo": "eagle", "c": 1}, "max_rate_under_slo": 9.0})  # before crossovers
    got = section(f.report())
    assert got[1] == "Best under your SLO: algo=eagle c=1, serves up to 9 req/s.", got  # the others' rows first
    f.search({**FOUND, "axis": "concurrency", "point": {"algo": "eagle", "c": 1}, "max_rate_under_slo": 6,
              "crossover_status": "pays_throughout", "crossover": None, "complete": False, "reason": "step 4 failed"})
    assert section(f.report())[1] == "Best under your SLO: algo=eagle c=1, serves up to 6 concurrent requests; " \
        "speculation pays at every load searched (its search stopped early: step 4 failed)."
    f.search({**FOUND, "point": {"algo": "eagle", "c": 1}, "max_rate_under_slo": None,
              "crossover_status": "no_baseline"})
    assert section(f.report())[1] == "Best under your SLO: no configuration met the search's SLO at any load tried."
    f.search({"mode": "saturation", "axis": "rate", "point": {"algo": "eagle", "c": 1}, "saturation_rate": 14.0,
              "last_unsaturated_rate": 14.0, "first_saturated_rate": 16.0, "crossover_status": "no_baseline"})
    assert section(f.report())[1] == "Most load before saturating: algo=eagle c=1, keeps up to 14 req/s (saturated " \
        "by 16); no crossover: the baseline was not searched."
    (f.path / "search.jsonl").write_text("not json\n{\"mode\": 3}\n")  # tolerated: nothing to say from it
    assert len(section(f.report())) == 1


def test_the_html_report_starts_with_the_decision(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from genready.sweep.report import html as sweephtml

    f = Folder(tmp_path, slo=SLO)
    three_configs(f, [(100, 200, 150, 60), (102, 204, 151, 61)], eagle={"ttft_p99_ms": 800.0})
    (f.path / "results.jsonl").write_text("".join(f.lines))
    read = collect.read_folders([f.path])
    page = sweephtml.render(collect.rows_from(read), facts=decision_facts(read))
    body = page[page.index("<body"):]
    assert body.index('<section id="decision"><h2>Decision</h2><ul><li>At c=1: algo=eagle is the best') < \
        body.index("<table")
    assert "not met by algo=eagle (ttft_p99_ms 800 &gt; 500)" in body


# --- the plan's slo key ---------------------------------------------------------------------------------------

PLAN = 'command = "bench -c {c}"\ndropin = "[Service]\\nEnvironment=A={a}\\n"\n{slo}\n[matrix]\na = [1]\nc = [1]\n'


def test_the_slo_key_takes_the_bench_clients_parts() -> None:
    p = sweepplan.parse_plan(tomllib.loads(PLAN.replace("{slo}", 'slo = { ttft_p99_ms = 500, itl_p50_ms = '
                                                                  '40.5, "e2e_p99.9_ms" = 9000 }')), "plan.toml")
    assert [(x.key, x.limit_ms) for x in p.slo] == [("ttft_p99_ms", 500.0), ("itl_p50_ms", 40.5),
                                                    ("e2e_p99.9_ms", 9000.0)]
    assert sweepplan.parse_plan(tomllib.loads(PLAN.replace("{slo}", "")), "plan.toml").slo == ()


@pytest.mark.parametrize("slo,key,says", [
    ("slo = { ttft_p99x_ms = 500 }", "slo.ttft_p99x_ms", "METRIC_pNN_ms"),
    ("slo = { tpot_p99_ms = 500 }", "slo.tpot_p99_ms", "ttft, itl or e2e"),
    ("slo = { ttft_p0_ms = 500 }", "slo.ttft_p0_ms", "0 < NN <= 100"),
    ('slo = { ttft_p99_ms = "500" }', "slo.ttft_p99_ms", "a number of milliseconds > 0"),
    ("slo = { ttft_p99_ms = -1 }", "slo.ttft_p99_ms", "a number of milliseconds > 0"),
    ("slo = { ttft_p99_ms = true }", "slo.ttft_p99_ms", "a number of milliseconds > 0"),
    ("slo = { ttft_p99_ms = inf }", "slo.ttft_p99_ms", "a number of milliseconds > 0"),
    ("slo = { ttft_p99_ms = nan }", "slo.ttft_p99_ms", "a number of milliseconds > 0"),
    ("slo = { ttft_p99_ms = 1" + "0" * 400 + " }", "slo.ttft_p99_ms", "a number of milliseconds > 0"),
    ("slo = { ttft_p50_ms = 100, ttft_p99_ms = 500 }", "slo", "one limit per request figure"),
    ('slo = "ttft_p99_ms=500"', "slo", "a table of METRIC_pNN_ms = milliseconds"),
    ("slo = {}", "slo", "a table of METRIC_pNN_ms"),
])
def test_a_bad_slo_names_its_key_expected_and_found(slo: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"plan\.toml") as e:
        sweepplan.parse_plan(tomllib.loads(PLAN.replace("{slo}", slo)), "plan.toml")
    assert e.value.key == key and says in str(e.value), str(e.value)


@pytest.mark.system
def test_a_bad_slo_exits_78(tmp_path: Path) -> None:
    (tmp_path / "plan.toml").write_text(PLAN.replace("{slo}", "slo = { ttft_p99x_ms = 500 }"))
    (tmp_path / "g.toml").write_text('[targets.t]\nunit = "x.service"\nurl = "http://127.0.0.1:1"\n')
    p = subprocess.run([*GENREADY, "sweep", str(tmp_path / "plan.toml"), "--results", str(tmp_path / "r"),
                        "--config", str(tmp_path / "g.toml")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 78, p.stderr
    assert f"{tmp_path / 'plan.toml'}: slo.ttft_p99x_ms: expected a part of the bench client's --slo" in p.stderr


# --- --compare ----------------------------------------------------------------------------------------------------

def test_compare_shows_the_speedup_change_and_marks_overlapping_intervals(tmp_path: Path) -> None:
    a, b = Folder(tmp_path / "a"), Folder(tmp_path / "b")
    three_configs(a, [(100, 200, 150, 60), (102, 204, 151, 61), (98, 198, 149, 59)])
    three_configs(b, [(100, 250, 152, 60), (102, 254, 150, 70), (98, 248, 151, 50)])
    for f in (a, b):
        (f.path / "results.jsonl").write_text("".join(f.lines))
    text = sweepcompare.render_text(collect.rows_of([a.path]), collect.rows_of([b.path]), "a", "b")
    rows = {ln.split()[0]: ln for ln in text.splitlines()}
    assert "SPEEDUP" in rows["POINT"]
    assert rows["algo=eagle"].endswith("2.01x [1.93-2.09] -> 2.51x [2.41-2.61] +24.9% better"), text
    assert rows["algo=ngram"].endswith("% ~"), text  # 1.50x and 1.51x: their intervals overlap
    assert rows["algo=slow"].endswith("0.60x slower [0.58-0.63] -> 0.59x slower [0.39-0.90] -0.9% ~"), text
    assert rows["baseline#1"].endswith("baseline") and "the two intervals overlap: not a real change" in text
    page = sweepcompare.render_html(collect.rows_of([a.path]), collect.rows_of([b.path]), "a", "b")
    assert '<td class="better">2.01x [1.93-2.09] -&gt; 2.51x [2.41-2.61] +24.9% better</td>' in page


def test_a_speedup_change_without_intervals_uses_the_noise_limit() -> None:
    from genready.sweep.noise import Ratio

    assert sweepcompare.SpeedupChange(Ratio(2.0), Ratio(2.1), 0.10).inside_noise
    assert not sweepcompare.SpeedupChange(Ratio(2.0), Ratio(2.5), 0.10).inside_noise
    worse = sweepcompare.SpeedupChange(Ratio(2.0, 1.9, 2.1), Ratio(1.5, 1.4, 1.6), 0.10)
    assert not worse.inside_noise and worse.better is False
    assert sweepcompare.SpeedupChange(Ratio(2.0, 1.9, 2.1), Ratio(2.05), 0.0).inside_noise  # inside A's interval


# --- on the simulator ----------------------------------------------------------------------------------------------

@pytest.mark.system
def test_a_sweep_on_the_simulator_reports_the_faster_configuration_first(rig: Rig) -> None:
    # Seconds per token: the baseline 0.02, one configuration faster (0.008), one slower (0.03): the simulator's
    # truth is that lat=0.008 has the higher throughput. Its ITL (about 8 ms) meets itl_p50_ms = 20; 0.03 does not.
    plan = _speed_plan(rig, {"lat": [0.03, 0.008], "c": [1]}, baseline={"lat": 0.02}, repeats=2,
                       slo={"itl_p50_ms": 20})
    rc, out = rig.run(plan)
    assert rc == 0, out
    assert all(ln["slo"] == {"itl_p50_ms": 20.0} for ln in rig.results_lines())  # for the report to know it
    table = subprocess.run([*GENREADY, "sweep", "report", str(rig.results), "--format", "table"],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    print(table)
    sentence, deploy = section(table)
    assert sentence.startswith("At c=1: lat=0.008 is the best at "), table
    assert deploy == "Deploy: the plan's drop-in with lat=0.008.", table  # the one configuration, what to run
    assert "; it meets your SLO; not met by lat=0.03 (itl_p50_ms " in sentence, table
    speed = sentence.split("x the baseline's")[0].rsplit(" ", 1)[1]
    assert float(speed) > 1.3, sentence  # 2.5 by the token latencies, less the requests' own overhead
