"""`sweep report`'s load search section (issue 39 §3, sweep/report/loadreport.py): in process on results folders written
as a search writes them (results.jsonl lines with `search_step`, a bench.jsonl per run, DIR/search.jsonl), and a
real `[search]` sweep on the simulator whose page has the section."""

from __future__ import annotations

import base64
import html
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from genready.compat import tomllib
from genready.sweep.report import loadreport
from genready.sweep.report.main import report_main
from genready_dev.harness import GENREADY
from genready_dev.usermanager import UserManager
from tests.test_searchrun import search_plan
from tests.test_sweep import Rig
from tests.test_sweep_html import box, ticks

SLO = "ttft_p99_ms=500"


def step(rate: float | None, cap: float, **extra: Any) -> dict[str, Any]:
    """A step at offered `rate` on a server that serves at most `cap` req/s, 100 tokens a request, goodput 80 %
    of the cap (None: a closed loop that achieved the cap)."""
    achieved = cap if rate is None else min(rate, cap)
    return {"rate": rate, "achieved": achieved, "tps": achieved * 100, "goodput": min(achieved, 0.8 * cap),
            "saturated": rate is not None and rate > cap, **extra}


def write(folder: Path, configs: list[tuple[Any, list[dict[str, Any]], dict[str, Any] | None]],
          mode: str = "slo", axis: str = "rate", slo: str | None = SLO) -> Path:
    """A results folder as a search leaves it: per configuration (its point, its steps, its found line's fields;
    None: no found line) each step's results line and {out}/bench.jsonl, and DIR/search.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    res, found = [], []
    for ci, (point, steps, f) in enumerate(configs, 1):
        fp = {"search": {"mode": mode, "axis": axis, **({"slo": slo} if slo else {})}, "dropin": f"d{ci}"}
        for si, st in enumerate(steps, 1):
            out = f"{ci:02d}-point/step-{si:02d}/attempt-1"
            (folder / out).mkdir(parents=True)
            bench = {"requests_per_second": st["achieved"], "achieved_rate": st["achieved"],
                     "output_tokens_per_second": st["tps"], "goodput": st["goodput"] if slo else None,
                     "slo": {"ttft_p99_ms": 500.0} if slo else None, "saturated": st["saturated"],
                     "offered_rate": st["rate"], "concurrency": st.get("c", 8), **st.get("bench", {})}
            (folder / out / "bench.jsonl").write_text(json.dumps(bench) + "\n")
            res.append({"point": point, "index": ci, "status": "ok", "out": out, "repeat": 1, "search_step": si,
                        "search_kind": st.get("kind", "bracket"), "search_rate": st["rate"],
                        "search_concurrency": st.get("c", 8), "fingerprint": fp, **st.get("line", {})})
        if f is not None:
            found.append({"point": point, "index": ci, "mode": mode, "axis": axis, "steps": len(steps),
                          "complete": True, "fingerprint": fp, **f})
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in res))
    (folder / "search.jsonl").write_text("".join(json.dumps(r) + "\n" for r in found))
    return folder


def three(tmp: Path) -> Path:
    """A baseline and two speculative configurations searched for the SLO, one crossing, one never paying."""
    rates = (2.0, 4.0, 8.0, 16.0)
    return write(tmp / "r", [
        ({"spec": "none"}, [step(r, 10) for r in rates], {"max_rate_under_slo": 8, "baseline": 1}),
        ({"spec": "eagle"}, [step(r, 15) for r in rates],
         {"max_rate_under_slo": 12, "crossover": 9.3, "crossover_status": "interpolated"}),
        ({"spec": "ngram"}, [step(r, 8) for r in rates],
         {"max_rate_under_slo": 4, "crossover": None, "crossover_status": "never_pays"})])


def section(*folders: Path) -> tuple[str, dict[str, str]]:
    """The html report's load section as the page writes it (loadreport.html_section: the first test below
    checks that the page holds it whole), and its plots' SVG by the plot's id. Drawn alone: the page's other
    figures would double the time and check nothing of this section."""
    sec = loadreport.html_section(list(folders))
    assert sec.count('id="load-search"') == 1, sec[-2000:]
    plots = {m.group(1): base64.b64decode(m.group(2)).decode() for m in
             re.finditer(r'<div class="plot" id="(load-[a-z]+)"><h3>[^<]*</h3><img src="data:image/svg\+xml;base64,'
                         r'([^"]+)"', sec)}
    return sec, plots


def texts(svg: str) -> list[str]:
    """The text matplotlib drew (as paths, each after a comment holding it)."""
    return [html.unescape(t) for t in re.findall(r"<!-- (.*?) -->", svg)]


def test_the_text_report_gives_each_configuration_its_found_value_and_crossover(tmp_path: Path) -> None:
    got = loadreport.table([three(tmp_path)])
    lines = got.splitlines()
    assert lines[0] == "search (DIR/search.jsonl):" and len(lines) == 4, got
    assert lines[1] == "  baseline spec=none: max_rate_under_slo 8 req/s in 4 steps"
    assert lines[2] == "  spec=eagle: max_rate_under_slo 12 req/s in 4 steps; crossover ≈9.3 req/s " \
                       "(interpolated between steps)"
    assert "speculation never pays" in lines[3]
    md = loadreport.table([tmp_path / "r"], "markdown")
    assert md.startswith("\n**Load search** (DIR/search.jsonl):\n\n- baseline spec=none: max_rate_under_slo 8")
    assert "- spec=eagle: max_rate_under_slo 12 req/s in 4 steps; crossover ≈9.3" in md
    folder = write(tmp_path / "s", [({"cap": 4}, [step(None, 8, kind="synchronous"), step(None, 20, kind="throughput"),
                                                  step(12, 20), step(18, 15)],
                                     {"last_unsaturated_rate": 12, "first_saturated_rate": 18, "saturation_rate": 12,
                                      "crossover": 30, "crossover_status": "pays_throughout"}),
                                    ({"cap": 8}, [step(5, 20)], None)], mode="saturation", slo=None)
    got = loadreport.table([folder])
    assert "  cap=4: saturation between 12 and 18 req/s (saturation_rate 12) in 4 steps; speculation pays at " \
           "every load searched" in got
    assert "  cap=8: no found line, 1 steps run (the search did not end)" in got
    assert loadreport.table([write(tmp_path / "none", [])]) == ""  # no search: no section
    # the SLO as the plan wrote it: a bench line's {"ttft_p99_ms": 5000.0} is not "5e+03"
    assert loadreport.slo_text({"ttft_p99_ms": 5000.0, "itl_p50_ms": 40}) == "ttft_p99_ms=5000, itl_p50_ms=40"


def test_the_page_draws_a_curve_per_configuration_the_saturation_point_the_slo_and_the_bars(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = three(tmp_path)
    assert report_main([str(folder)], "html") == 0
    page = capsys.readouterr().out
    sec, plots = section(folder)
    assert page.count('id="load-search"') == 1 and sec in page  # the page holds the section whole, once
    assert set(plots) == {"load-throughput", "load-goodput", "load-found"}
    labels = ["baseline spec=none", "spec=eagle", "spec=ngram"]
    tp = texts(plots["load-throughput"])
    assert all(tp.count(label) == 2 for label in labels), tp  # one line each on tok/s and on the achieved rate
    assert {"OUT tok/s", "achieved req/s", "offered rate req/s", "saturated step", "achieved = offered"} <= set(tp)
    # the saturation point: each configuration's first saturated step (slo mode has no saturation_rate)
    assert {f"{label}: saturation ≈ 16" for label in labels} <= set(tp)
    assert plots["load-throughput"].count("<path d=\"M") > 0
    gp = texts(plots["load-goodput"])
    assert f"SLO: {SLO}" in gp and all(label in gp for label in labels)
    assert {"spec=eagle: max under SLO 12", "baseline spec=none: max under SLO 8"} <= set(gp)
    bars = texts(plots["load-found"])
    assert {"8", "12", "4", "≈9.3", "never pays", "baseline", "max_rate_under_slo"} <= set(bars), bars
    assert "crossover (speedup over the baseline falls below 1)" in bars
    assert "≈: a crossover interpolated between two steps" in sec and "Left out" not in sec


def test_a_saturation_search_places_its_closed_loop_steps_at_the_rate_achieved_and_marks_saturation_rate(
        tmp_path: Path) -> None:
    folder = write(tmp_path / "r", [({"cap": 4}, [step(None, 8, kind="synchronous"),
                                                  step(None, 20, kind="throughput"), step(12, 20), step(18, 15)],
                                     {"last_unsaturated_rate": 12, "first_saturated_rate": 18,
                                      "saturation_rate": 12})], mode="saturation", slo=None)
    (got,) = loadreport.searches([folder])
    assert [(st.load, st.closed) for st in got.steps] == [(8, True), (20, True), (12, False), (18, False)]
    sec, plots = section(folder)
    assert "cap=4: saturation ≈ 12" in texts(plots["load-throughput"])
    assert "Hollow marks: closed-loop steps" in sec
    assert "load-goodput" not in plots and "No step has a goodput" in sec  # no SLO: said, not drawn
    assert "saturation_rate per configuration (req/s)" in sec and "12" in texts(plots["load-found"])
    assert "crossover" not in " ".join(texts(plots["load-found"]))  # no baseline: no crossover bar


def test_a_concurrency_search_is_drawn_against_concurrency(tmp_path: Path) -> None:
    folder = write(tmp_path / "r", [({"cap": 4}, [step(None, c, c=c) for c in (1, 2, 4)], {"max_rate_under_slo": 2})],
                   axis="concurrency")
    sec, plots = section(folder)
    assert "concurrency (requests in flight)" in texts(plots["load-goodput"])
    assert "max_rate_under_slo per configuration (concurrent requests)" in sec
    assert "achieved = offered" not in texts(plots["load-throughput"])  # a closed loop offers no rate


def test_searches_on_two_axes_get_a_bar_plot_each(tmp_path: Path) -> None:
    rate = write(tmp_path / "rate", [({"cap": 4}, [step(2, 4), step(4, 4)], {"max_rate_under_slo": 4})])
    conc = write(tmp_path / "conc", [({"cap": 4}, [step(None, c, c=c) for c in (1, 2)], {"max_rate_under_slo": 2})],
                 axis="concurrency")
    page, _ = section(rate, conc)
    assert 'id="load-found"><h3>max_rate_under_slo per configuration (req/s)' in page
    assert 'id="load-found-2"><h3>max_rate_under_slo per configuration (concurrent requests)' in page
    assert "cap=4 [rate, point 1]" in page and "cap=4 [conc, point 1]" in page


def test_an_older_plan_s_steps_are_not_this_search_s(tmp_path: Path) -> None:
    folder = three(tmp_path)
    lines = (folder / "results.jsonl").read_text().splitlines()
    old = json.loads(lines[0])
    old["fingerprint"] = {"search": {"mode": "slo"}, "dropin": "older"}
    old["search_step"] = 9
    (folder / "results.jsonl").write_text("\n".join([json.dumps(old), *lines]) + "\n")
    (base, *_) = loadreport.searches([folder])
    assert [s.index for s in base.steps] == [1, 2, 3, 4]


def test_a_baseline_with_a_plan_point_s_values_is_a_search_of_its_own(tmp_path: Path) -> None:
    folder = write(tmp_path / "r", [({"spec": "none"}, [step(2, 10)], {"max_rate_under_slo": 2}),
                                    ({"spec": "none"}, [step(2, 10, line={"baseline": 1}), step(4, 10)],
                                     {"max_rate_under_slo": 4})])
    got = loadreport.searches([folder])
    assert [(s.label, len(s.steps)) for s in got] == [("spec=none", 1), ("baseline spec=none", 2)]
    again = write(tmp_path / "r2", [({"spec": "none"}, [step(2, 10)], {"max_rate_under_slo": 2}),
                                    ({"spec": "none"}, [step(4, 10)], {"max_rate_under_slo": 4})])
    assert [s.label for s in loadreport.searches([again])] == ["spec=none [point 1]", "spec=none [point 2]"]
    assert [s.label for s in loadreport.searches([folder, again])][2:] == ["spec=none [r2, point 1]",
                                                                          "spec=none [r2, point 2]"]


def test_hostile_fields_are_left_out_and_named_never_a_crash(tmp_path: Path) -> None:
    folder = write(tmp_path / "r", [
        ({"spec": "$x$ <b>\x1b[2J\n"}, [step(2, 10, bench={"output_tokens_per_second": "fast", "goodput": 1e400}),
                               step(4, 10, line={"search_rate": 10**400}),
                               step(8, 10, bench={"achieved_rate": True, "saturated": "yes"}),
                               step(16, 10, line={"out": ["no"]}),
                               step(32, 10, line={"search_step": True}),
                               step(64, 10, line={"out": "../nowhere"})],
         {"max_rate_under_slo": "many", "crossover": "x", "crossover_status": 5, "mode": ["slo"], "steps": None,
          "complete": False, "reason": {"r": 1}}),
        ([1, 2], [step(2, 10)], {"max_rate_under_slo": float("inf"), "crossover": 10**400,
                                 "crossover_status": "interpolated", "fingerprint": "odd"}),
    ])
    with (folder / "search.jsonl").open("a") as f:
        f.write('not json\n{"point": null}\n[]\n')
    got = loadreport.table([folder])
    assert "spec=$x$ <b>\\x1b[2J\\x0a: saturation between - and - req/s" in got and "[1, 2]" in got
    assert "\x1b" not in got and len(got.splitlines()) == 4  # shown, never run by a terminal
    sec, plots = section(folder)
    assert "Left out of this plot" in sec and "$x$ &lt;b&gt;" in sec
    note = html.unescape(sec)
    assert "OUT tok/s = fast" in note and "max_rate_under_slo = many" in note and "crossover = x" in note
    assert "load-throughput" in plots


def test_no_search_no_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write(tmp_path / "r", [])
    (folder / "results.jsonl").write_text(json.dumps({"point": {"a": 1}, "index": 1, "status": "ok"}) + "\n")
    assert loadreport.html_section([folder]) == "" and loadreport.searches([folder]) == []
    assert report_main([str(folder)], "html") == 0
    assert "load-search" not in capsys.readouterr().out


# --- issue 37 §3's plot rules (sweep/report/plotrules.py) hold in the load search's plots too -------------------

def test_an_axis_of_whole_numbers_has_integer_ticks(tmp_path: Path) -> None:
    # concurrency 1, 2, 4 and a found concurrency of 2: matplotlib's own ticks would be 1.5, 2.5 ... and 0.25 ...
    folder = write(tmp_path / "r", [({"cap": 4}, [step(None, c, c=c) for c in (1, 2, 4)], {"max_rate_under_slo": 2})],
                   axis="concurrency")
    _, plots = section(folder)
    for plot, axis in (("load-goodput", 1), ("load-throughput", 3), ("load-found", 2)):  # x, the lower x, the bars' y
        got = ticks(plots[plot], axis)
        assert got and all(re.fullmatch(r"\d+", t) for t in got), (plot, got)
    # and an axis of fractions keeps its fractions (rates offered 0.5 apart)
    folder = write(tmp_path / "f", [({"cap": 4}, [step(r, 4) for r in (1.5, 2.0, 2.5)], {"max_rate_under_slo": 2.5})])
    _, plots = section(folder)
    assert any("." in t for t in ticks(plots["load-goodput"], 1)), ticks(plots["load-goodput"], 1)


def test_over_six_legend_lines_the_legend_goes_outside_the_axes(tmp_path: Path) -> None:
    # the goodput plot's legend: a line and a "max under SLO" line per configuration
    for n, outside in ((3, False), (4, True)):
        folder = write(tmp_path / str(n), [({"cap": c}, [step(r, 4 + c) for r in (2.0, 4.0)],
                                            {"max_rate_under_slo": 2 + c}) for c in range(n)])
        _, plots = section(folder)
        svg = plots["load-goodput"]
        assert len([t for t in texts(svg) if t.startswith("cap=")]) == 2 * n
        left, right = box(svg, "axes_1")  # the axes' background: the plot's area
        legend = box(svg, "legend_1")
        assert (legend[0] > right) is outside and (legend[1] < right) is not outside, (n, left, right, legend)


@pytest.fixture
def simrig(manager: UserManager, tmp_path: Path) -> Any:
    r = Rig(manager, tmp_path)
    yield r
    r.close()


@pytest.mark.system
def test_a_real_slo_search_on_the_simulator_has_its_load_section(simrig: Rig) -> None:
    path = search_plan(simrig, {"mode": "slo", "slo": "ttft_p99_ms=5000", "start": 4, "max_steps": 3})
    doc = tomllib.loads(path.read_text())
    doc["matrix"] = {"cap": [2, 4]}  # two configurations: a curve each
    path.write_text(tomli_w.dumps(doc))
    rc, out = simrig.run(path)
    assert rc == 0, out
    page = simrig.tmp / "report.html"
    p = subprocess.run([*GENREADY, "sweep", "report", str(simrig.results), "--format", "html", "--output",
                        str(page)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    sec = page.read_text()
    sec = sec[sec.index('id="load-search"'):]
    svg = {m.group(1): base64.b64decode(m.group(2)).decode() for m in re.finditer(
        r'id="(load-[a-z]+)"><h3>[^<]*</h3><img src="data:image/svg\+xml;base64,([^"]+)"', sec)}
    assert set(svg) == {"load-throughput", "load-goodput", "load-found"}, sec[:3000]
    assert all(texts(svg["load-throughput"]).count(f"cap={c}") == 2 for c in (2, 4))
    assert "SLO: ttft_p99_ms=5000" in texts(svg["load-goodput"])
    found = [json.loads(ln) for ln in (simrig.results / "search.jsonl").read_text().splitlines()]
    assert len(found) == 2
    bars = texts(svg["load-found"])
    assert all(loadreport.num_text(f["max_rate_under_slo"]) in bars for f in found if f["max_rate_under_slo"])
    table = subprocess.run([*GENREADY, "sweep", "report", str(simrig.results)], capture_output=True, text=True,
                           timeout=60)
    assert "cap=2: max_rate_under_slo" in table.stdout and "cap=4: max_rate_under_slo" in table.stdout
    simrig.assert_restored()
