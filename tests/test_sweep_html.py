"""`genready sweep report --format html`: one self-contained page, checked in a real headless Chromium.

The browser opens the file with name resolution off, takes a screenshot (kept in the test's folder),
and its network log shows every request the page made; the DOM it built shows every plot and a
hostile point value as text.
"""

from __future__ import annotations

import base64
import gc
import html
import io
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from genready.exitcodes import Failed
from genready.sweep import files
from genready.sweep import rows as sweeprows
from genready.sweep.report import collect, heatmap, speedup
from genready.sweep.report import html as sweephtml
from genready.sweep.report import table as sweepreport
from genready.sweep.report.main import report_main
from genready_dev.harness import PY, REPO, wait_for
from tests import ci

sys.path.insert(0, str(REPO / "bench"))
import sweep_report_html  # bench/: the 1,000-point timing writes the same folders

HOSTILE = "<script>alert(1)</script>\x1b[31m$x$"


def results(tmp: Path, n: int = 20) -> Path:
    folder = tmp / "results"
    folder.mkdir()
    sweep_report_html.write(folder, n)
    lines = folder.joinpath("results.jsonl").read_text().splitlines()
    for k in range(3):  # point 1's three repeats: a value holding a script tag and an escape sequence
        rec = json.loads(lines[k])
        rec["point"]["draft"] = HOSTILE
        lines[k] = json.dumps(rec)
    folder.joinpath("results.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_without_matplotlib_html_exits_69_naming_the_extra_and_other_formats_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = results(tmp_path, 4)
    # A machine without matplotlib cannot be had in this process: None in sys.modules makes its import fail.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(Failed) as e:
        report_main([str(folder)], "html")
    assert e.value.status == 69 and "genready[report]" in str(e.value) and "python3-matplotlib" in str(e.value)
    for fmt in sweepreport.FORMATS:
        assert report_main([str(folder)], fmt) == 0
    assert "draft=d1" in capsys.readouterr().out


def test_only_the_html_report_imports_matplotlib() -> None:
    daemon = REPO / "daemon" / "genready"
    importing = sorted(str(p.relative_to(daemon)) for p in daemon.rglob("*.py")
                       if re.search(r"^\s*(import|from) matplotlib", p.read_text(), re.M))
    # html.py and the two modules only it imports (each imports matplotlib inside the function that draws)
    assert importing == ["sweep/report/heatmap.py", "sweep/report/html.py", "sweep/report/plotrules.py"], importing
    users = sorted(str(p.relative_to(daemon)) for p in daemon.rglob("*.py") if re.search(
        r"^\s*from genready\.sweep\.report import .*\b(heatmap|plotrules)\b", p.read_text(), re.M))
    # loadreport's plots follow plotrules too; none of these imports matplotlib outside a function that draws
    # (report/main.py: heatmap's text grid, imported by `sweep report` only)
    assert users == ["sweep/report/heatmap.py", "sweep/report/html.py", "sweep/report/loadreport.py",
                     "sweep/report/main.py"], users
    for name in ("heatmap", "plotrules"):
        assert not re.search(r"^(import|from) matplotlib", (daemon / "sweep" / "report" / f"{name}.py").read_text(),
                             re.M)
    # and the sweep's entry points load that module only for --format html
    for entry in ("main.py", "report/main.py"):
        assert not re.search(r"^from genready.sweep(.report)? import .*html", (daemon / "sweep" / entry).read_text(),
                             re.M)


def test_the_pareto_front_is_the_points_nothing_beats_on_both() -> None:
    pts = [(10.0, 100.0, "a"), (12.0, 90.0, "b"), (12.0, 150.0, "c"), (20.0, 150.0, "d"), (30.0, 200.0, "e")]
    assert [p[2] for p in sweephtml.pareto_front(pts)] == ["a", "c", "e"]


def test_axes_and_a_bad_axis_flag(tmp_path: Path) -> None:
    rows = collect.rows_of([results(tmp_path, 20)])
    client, _ = sweephtml.axes_of(rows)
    assert "c" in client and sweephtml.default_x(rows) in client
    with pytest.raises(Failed) as e:
        report_main([str(tmp_path / "results")], "html", x="nope")
    assert e.value.status == 64 and "--x" in str(e.value) and "draft" in str(e.value)


CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  # no name resolution at all: nothing can leave the machine by name
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps"]


def chromium(page: Path, out: Path, *what: str) -> tuple[str, list[str]]:
    """(stdout, the URLs the page itself asked for): Chromium's own services (updates, the clock) start
    their requests with no origin ("not an origin" in the network log) and are not the page's."""
    exe = ci.tool("chromium", "apt-get install chromium")
    netlog = out.with_suffix(".netlog.json")
    run = subprocess.run([exe, *CHROMIUM_FLAGS, f"--log-net-log={netlog}", *what, page.as_uri()],
                         capture_output=True, text=True, timeout=120, cwd=out.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = [p["url"] for ev in log["events"] if ev["type"] == start and "url" in (p := ev.get("params", {}))
            and p.get("initiator") != "not an origin"]
    return run.stdout, urls


@pytest.mark.system
def test_the_html_report_in_a_real_browser(tmp_path: Path) -> None:
    folder = results(tmp_path)
    page = tmp_path / "report.html"
    done = subprocess.run([PY, "-m", "genready.cli", "sweep", "report", str(folder), "--format", "html", "--output",
                           str(page)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # the check can fail: a page that loads an image from outside shows in the log
    control = tmp_path / "control.html"
    control.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    assert chromium(control, tmp_path / "control.png", "--dump-dom")[1] == ["http://example.invalid/x.png"]

    dom, asked = chromium(page, tmp_path / "dom.html", "--dump-dom")
    assert asked == [], asked
    plots = re.findall(r'<div class="plot" id="([a-z0-9_-]+)">(.*?)</div>', dom, re.S)
    ids = [i for i, _ in plots]
    assert ids == [f"plot-{k}" for k in sweephtml.PLOTTED] + ["pareto-ttft_p50_ms", "pareto-itl_p50_ms"], ids
    for i, body in plots:  # each plot an SVG image (a data: URI, so the policy stays hash-only)
        assert len(svgs(body)) == 1 and svgs(body)[0].count("<path") > 20, f"{i}: an empty plot"
    # the hostile value is text: escaped, no element made of it, the escape sequence shown as \x1b
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[31m$x$" in dom and "<script" not in dom
    assert "Pareto front: " in dom and "d9 c=2" in dom

    shot = tmp_path / "report.png"
    _, asked = chromium(page, shot, f"--screenshot={shot}", "--window-size=1300,2600")
    assert asked == [] and shot.stat().st_size > 50_000
    png: Any = __import__("matplotlib.image", fromlist=["imread"]).imread(str(shot))
    assert png.std() > 0.05  # not a blank page
    print(f"screenshot: {shot}")


VISIBLE = """(() => {
  const out = {};
  for (const div of document.querySelectorAll("div.plot")) {
    const img = div.querySelector("img"), r = img && img.getBoundingClientRect(), s = img && getComputedStyle(img);
    out[div.id] = img ? [img.complete && img.naturalWidth > 0, r.width, r.height, s.visibility, s.display] : null;
  }
  return out;
})()"""


@pytest.mark.system
def test_the_decision_the_heatmap_and_the_per_user_pareto_are_visible_in_a_real_browser(tmp_path: Path) -> None:
    """Chromium over its DevTools protocol (tests/browser.py): the Decision comes first, one sentence per client
    setting; each heatmap and the per-user/per-GPU Pareto is an image the browser decoded and lays out at a
    visible size, and the page asked for nothing but itself."""
    from tests.browser import Browser

    folder = spec_sweep(tmp_path)
    page = tmp_path / "report.html"
    done = subprocess.run([PY, "-m", "genready.cli", "sweep", "report", str(folder), "--format", "html", "--output",
                           str(page)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    b = Browser(tmp_path / "chromium-profile").start()
    try:
        b.navigate(page.as_uri())
        wait_for(lambda: b.js("document.readyState") == "complete", 30, "the report loaded")
        shown = b.js(VISIBLE)
        for plot in ("heatmap-1", "heatmap-2", "pareto-per-user"):
            decoded, width, height, visibility, display = shown[plot]
            assert decoded and width > 200 and height > 150 and visibility == "visible" and display != "none", shown
        # the decision first: its section is laid out above the heatmap, visible, one sentence per client setting
        top = "document.getElementById('%s').getBoundingClientRect().top"
        assert b.js(top % "decision") < b.js(top % "heatmap"), "the decision is not first"
        sentences = b.js("[...document.querySelectorAll('#decision li')].map(li => li.innerText)")
        assert len(sentences) == 3 and all(re.match(r"At c=\d+: .* is the best at ", t) for t in sentences[:2]), \
            sentences
        assert sentences[2].startswith("Deploy: "), sentences  # what to run, last (issue 52 §5)
        assert b.js("document.getElementById('decision').getBoundingClientRect().height") > 20
        assert b.js("document.getElementById('heatmap').getBoundingClientRect().top") < b.js(
            "document.querySelector('table').getBoundingClientRect().top")  # the heatmap before the table
        caption = b.js("document.querySelector('.heatmap-caption').innerText")
        assert caption.startswith("Each cell: a server configuration's speedup"), caption
        b.screenshot(tmp_path / "report.png")
        assert b.console_errors == [], b.console_errors
        # nothing but the page itself and its data: images (the plots)
        assert b.requests[0] == page.as_uri() and all(u.startswith("data:") for u in b.requests[1:]), b.requests
        assert len(b.requests) > 1  # the images' requests are seen: the check can see a request
    finally:
        b.stop()
    print(f"screenshot: {tmp_path / 'report.png'}")


# --- what every other format reads (issue 41 #9) ---------------------------------------------------------

def hostile_results(tmp: Path, lines: list[str]) -> Path:
    folder = tmp / "hostile"
    folder.mkdir()
    folder.joinpath("results.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def line(i: int, point: str, accept: str = "2.0", group: int = 1) -> str:
    """A results line written as text: 10**400 has no float, and json.dumps writes 1.7e308 as it is."""
    return (f'{{"index": {i}, "status": "ok", "group": {group}, "point": {point}, '
            f'"metrics_accept_length": {accept}}}')


def report(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert report_main([str(folder)], "table") == 0  # what the table reads ...
    capsys.readouterr()
    assert report_main([str(folder)], "html") == 0  # ... the page reads
    return capsys.readouterr().out


def svgs(page: str) -> list[str]:
    """The plots' SVG documents, from their data: images (or inline, as the page once had them)."""
    return [base64.b64decode(b).decode() for b in re.findall(r'<img src="data:image/svg\+xml;base64,([^"]+)"', page)
            ] + re.findall(r"<svg.*?</svg>", page, re.S)


def left_out(page: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r'<p class="note left-out">(.*?)</p>', page)]


def test_point_values_that_are_lists_or_objects_are_categories(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder = hostile_results(tmp_path, [line(1, '{"c": [1, 2]}'), line(2, '{"c": {"x": 1}}', "3.0"),
                                        line(3, '{"c": 3}', "2.5")])
    page = report(folder, capsys)
    assert len(svgs(page)) == 1 and not left_out(page)
    # each value a category on x, written as the table writes it
    for tick in ("[1, 2]", "{'x': 1}", "3"):
        assert f"<!-- {html.escape(tick, quote=False)} -->" in svgs(page)[0], tick


def test_numbers_beyond_a_plot_are_left_out_and_the_page_says_so(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    big = "1" + "0" * 400
    folder = hostile_results(tmp_path, [
        line(1, f'{{"c": {big}}}'), line(2, '{"c": 2}', big), line(3, '{"c": 1.7e308}', "1.7e308"),
        line(4, '{"c": -1.7e308}'), line(5, '{"c": 5}', "-1.7e308"), line(6, '{"c": 6}', "2.5"),
        line(7, '{"c": 7}', "3.5")])
    page = report(folder, capsys)  # not exit 64 for an --x flag nobody gave
    assert len(svgs(page)) == 1
    notes = left_out(page)
    assert len(notes) == 1 and notes[0].startswith("Left out of this plot: 5 points"), notes
    for named in ("c=1000000000", "c=2: ACCEPT = inf", "c=1.7e+308: c = 1.7e+308", "c=-1.7e+308",
                  "c=5: ACCEPT = -1.7e+308"):
        assert named in notes[0], (named, notes)
    assert "c=6" not in notes[0] and len(notes[0]) < 1000  # the 400 digits cut


def test_values_near_the_largest_float_are_no_bad_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # matplotlib cannot lay out an axis from -1.7e308 to 1.7e308: its ValueError once left as exit 64
    # "bad --x flag", with no flag given
    folder = hostile_results(tmp_path, [line(1, '{"c": 1}', "1.7e308"), line(2, '{"c": 2}', "-1.7e308"),
                                        line(3, '{"c": 3}', "2.0"), line(4, '{"c": 4}', "2.5")])
    page = report(folder, capsys)
    assert len(svgs(page)) == 1 and "2 points" in left_out(page)[0]


def test_an_axis_named_with_an_underscore_draws_its_legend(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # matplotlib leaves out of a legend every label that starts with "_"
    folder = hostile_results(tmp_path, [line(tp * 10 + c, f'{{"_tp": {tp}, "c": {c}}}', str(1 + c / tp), group=tp)
                                        for tp in (1, 2, 4) for c in (1, 2, 3)])
    page = report(folder, capsys)
    plot = svgs(page)[0]
    assert "<!-- c -->" in plot  # x: the client-side axis
    assert [tp for tp in (1, 2, 4) if f"_tp={tp} -->" not in plot] == []  # the legend's text, drawn


def old_axes_of(rows: list[sweeprows.Row]) -> tuple[list[str], list[str]]:
    """axes_of as it was (quadratic): the definition the linear one must keep."""
    names: list[str] = []
    for r in rows:
        names += [k for k in r.point if k not in names]
    by_group: dict[int, list[sweeprows.Row]] = {}
    for r in rows:
        by_group.setdefault(r.group if r.group is not None else r.index, []).append(r)
    client = [n for n in names if any(len({repr(r.point.get(n)) for r in g}) > 1 for g in by_group.values())]
    return client, [n for n in names if n not in client]


def test_axes_are_found_in_one_pass_as_they_were_defined() -> None:
    rng = random.Random(9)
    for _ in range(300):
        rows = [sweeprows.Row(i, "", "ok", group=rng.choice([None, 1, 2]),
                                point={f"a{rng.randrange(5)}": rng.choice([None, 1, 2, "x", [1]])
                                       for _ in range(rng.randrange(4))}) for i in range(rng.randrange(1, 12))]
        assert sweephtml.axes_of(rows) == old_axes_of(rows), [(r.group, r.point) for r in rows]
        old_x = None
        client, server = old_axes_of(rows)
        if client or server:
            old_x = max(client or server, key=lambda n: len({repr(r.point.get(n)) for r in rows}))
        assert sweephtml.default_x(rows) == old_x


def test_lines_each_naming_another_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the correctness of the linear path; bench/sweep_report_axes.py times it over 64 MiB
    folder = hostile_results(tmp_path, [line(i, f'{{"axis{i}": {i}}}') for i in range(2000)])
    page = report(folder, capsys)
    assert "client: axis0, axis1," in page and "and 1,980 more; server: -" in page


def test_lines_naming_one_out_folder_read_its_bench_jsonl_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # 64 MiB of lines may each name the same out folder, whose bench.jsonl may be 64 MiB: read once, not per line
    folder = measured(tmp_path, [({}, {"output_tokens_per_second": 100.0}, {"c": 1})])
    text = folder.joinpath("results.jsonl").read_text()
    folder.joinpath("results.jsonl").write_text(
        "".join(text.replace('"index": 1', f'"index": {i}').replace('{"c": 1}', f'{{"c": {i}}}') for i in range(1, 51)))
    reads: list[Path] = []
    real = files.bench_line

    def spy(f: Path) -> dict[str, Any] | None:  # not a fake: the real read runs; only how often is counted
        reads.append(f)
        return real(f)
    monkeypatch.setattr(sweeprows, "bench_line", spy)
    assert report_main([str(folder)], "json") == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 50 and {r["output_tokens_per_second"] for r in rows} == {100.0}
    assert reads == [folder / "0001-p"]


def test_the_report_turns_the_garbage_collector_back_on(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # held off while a report runs (its objects form no cycle), on again after it, whether it failed or not
    folder = hostile_results(tmp_path, [line(i, f'{{"c": {i}}}') for i in range(3)])
    assert gc.isenabled()
    assert report_main([str(folder)], "table") == 0
    assert gc.isenabled()
    with pytest.raises(Failed):
        report_main([str(tmp_path / "none")], "table")
    assert gc.isenabled()


def test_the_invocation_id_is_shown_short_with_the_whole_on_hover(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = hostile_results(tmp_path, [
        line(1, '{"c": 1}')[:-1] + ', "invocation_id": "0123456789abcdef0123456789abcdef"}',
        line(2, '{"c": 2}')[:-1] + ', "invocation_id": "<b>\\u001b[2J0123456789"}',  # escaped, cut or whole
        line(3, '{"c": 3}')])
    page = report(folder, capsys)
    assert re.findall(r'<td class="mono".*?</td>', page) == [
        '<td class="mono" title="0123456789abcdef0123456789abcdef">0123456789ab</td>',
        '<td class="mono" title="&lt;b&gt;\\x1b[2J0123456789">&lt;b&gt;\\x1b[2J01234</td>',
        '<td class="mono">-</td>']
    assert ".mono" in page.split("</style>")[0]  # the monospace rule is the page's own (base.css)


def test_an_axis_of_many_text_values_labels_at_most_max_ticks(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = hostile_results(tmp_path, [line(i, f'{{"m": "m{i:05d}{"x" * 300}"}}') for i in range(3000)])
    plot = svgs(report(folder, capsys))[0]
    ticks = re.findall(r"<!-- (m\d{5}x*\.\.\.) -->", plot)
    assert ticks[:2] == ["m00000" + "x" * 31 + "...", "m00075" + "x" * 31 + "..."] and len(ticks) == 40, ticks


def measured(tmp: Path, points: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]) -> Path:
    """A results folder: per point (its results line's extra fields, its bench line, its plan values), an out
    folder holding that bench line as the bench client writes it (an empty bench line: no bench.jsonl)."""
    folder = tmp / "measured"
    folder.mkdir()
    lines = []
    for i, (extra, bench, point) in enumerate(points, 1):
        out = f"{i:04d}-p"
        if bench:
            folder.joinpath(out).mkdir()
            folder.joinpath(out, "bench.jsonl").write_text(json.dumps(bench) + "\n")
        lines.append(json.dumps({"index": i, "status": "ok", "group": 1, "point": point, "out": out,
                                 "repeat": extra.pop("repeat", 1), **extra}))
    folder.joinpath("results.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_per_position_acceptance_is_a_column_and_a_json_list_only_where_a_point_has_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = measured(tmp_path, [
        ({}, {"output_tokens_per_second": 100.0, "accept_per_position": [0.81, 0.62, 0.4],
              "accept_per_position_source": "counters"}, {"c": 1}),
        ({}, {"output_tokens_per_second": 90.0}, {"c": 2}),  # no per-position figures: "-"
        ({"metrics_accept_per_position": [0.5, 0.25]}, {"output_tokens_per_second": 80.0}, {"c": 3}),  # the sweep's
        ({}, {"output_tokens_per_second": 70.0, "accept_per_position": [0.9, "x"]}, {"c": 4}),  # not numbers: "-"
    ])
    assert report_main([str(folder)], "table") == 0
    out = capsys.readouterr().out
    table = out[out.index("POINT"):].splitlines()  # the table, after the Decision section
    assert "ACC/POS" in table[0]
    assert "0.81 0.62 0.40" in table[1] and "0.50 0.25" in table[3], table
    at = table[0].index("ACC/POS")  # before the figures, as the other columns that describe the run
    assert table[2][at:].startswith("- ") and table[4][at:].startswith("- "), table
    assert any(t.startswith("(ACC/POS:") for t in table), table
    assert report_main([str(folder)], "json") == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["accept_per_position"] for r in rows] == [[0.81, 0.62, 0.4], None, [0.5, 0.25], None]
    page = report(folder, capsys)
    assert "<th>ACC/POS</th>" in page and "<td>0.81 0.62 0.40</td>" in page
    (tmp_path / "plain").mkdir()
    plain = measured(tmp_path / "plain", [({}, {"output_tokens_per_second": 1.0}, {"c": 1})])
    assert report_main([str(plain)], "table") == 0
    assert "ACC/POS" not in capsys.readouterr().out
    assert "ACC/POS" not in report(plain, capsys)


def test_per_position_acceptance_over_repeats_is_the_median_per_position() -> None:
    folder = Path("/nonexistent")  # no "out": nothing read from disk
    recs = [({"index": 1, "status": "ok", "repeat": k, "point": {"c": 1}, "metrics_accept_per_position": pos},
             folder, f"r:{k}") for k, pos in enumerate(([0.9, 0.5], [0.7, 0.3, 0.1], [0.8]), 1)]
    assert sweeprows.point_row(recs).accept_per_position == [0.8, 0.4, 0.1]


def test_tokens_per_second_against_power_is_drawn_only_where_a_point_has_power(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    power = measured(tmp_path, [({"mean_power_w": w, "energy_j": w * 10, "tokens_per_joule": tps / w},
                                 {"output_tokens_per_second": tps}, {"c": c})
                                for c, (w, tps) in enumerate(((310.5, 1200.0), (455.0, 1900.0)), 1)])
    page = report(power, capsys)
    assert page.count('id="power"') == 1 and "OUT tok/s against mean GPU power W" in page
    drawn = [s for s in svgs(page) if "<!-- mean GPU power W -->" in s]
    assert len(drawn) == 1 and "<!-- c=1 -->" in drawn[0] and "<!-- c=2 -->" in drawn[0], drawn  # labelled
    assert report_main([str(power)], "json") == 0
    assert [r["mean_power_w"] for r in json.loads(capsys.readouterr().out)["rows"]] == [310.5, 455.0]
    (tmp_path / "plain").mkdir()
    plain = measured(tmp_path / "plain", [({}, {"output_tokens_per_second": 1200.0}, {"c": 1}),
                                          ({}, {"output_tokens_per_second": 1900.0}, {"c": 2})])
    page = report(plain, capsys)
    assert 'id="power"' not in page and not [s for s in svgs(page) if "mean GPU power" in s]


# --- issue 37 §3: the speedup heatmap, the per-user/per-GPU Pareto, plots a person can read ---------------------

import sweep_screenshot  # noqa: E402  bench/: the folder of the docs' picture is the heatmap's fixture


def spec_sweep(tmp: Path) -> Path:
    """bench/sweep_screenshot.py's folder: a baseline, draft x topk (two server axes) x c [1, 8], 3 repeats,
    gpus = 2; one configuration noisy, one drifted, one failed."""
    folder = tmp / "spec"
    folder.mkdir()
    sweep_screenshot.write(folder)
    return folder


def plot_svgs(page: str, plot_id: str) -> list[str]:
    body = re.search(rf'<div class="plot" id="{plot_id}">(.*?)</div>', page, re.S)
    assert body, f"no plot {plot_id}"
    return svgs(body.group(1))


def comments(svg: str) -> list[str]:
    """The text matplotlib drew (as paths), in drawing order: each line of each text is a comment."""
    return [html.unescape(c) for c in re.findall(r"<!-- (.*?) -->", svg)]


@pytest.fixture(scope="module")
def spec_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """spec_sweep's folder and its page, written once for the tests that only read them: the page draws ten
    figures (about a second of matplotlib), the same for each."""
    folder = spec_sweep(tmp_path_factory.mktemp("spec-page"))
    page = folder.parent / "report.html"
    assert report_main([str(folder)], "html", output=str(page)) == 0
    return folder, page.read_text()


def heatmap_section(folder: Path, flag: str | None = None) -> str:
    """The page's heatmap section alone, drawn by what the page draws it with (heatmap.section, matplotlib's
    Figure as html.render gives it): a page of 64 configurations also draws its other figures as 16 small
    multiples each, seconds that check nothing of the heatmap."""
    sweephtml.preload()  # matplotlib as the page sets it up (the svg backend, a fixed hash salt)
    from matplotlib.figure import Figure

    rows = collect.rows_of([folder])
    client, server = sweephtml.axes_of(rows)
    return heatmap.section(Figure, rows, heatmap.choose(rows, server, flag), client, server)


def cell_colour(svg: str, nx: int, ny: int, j: int, i: int) -> tuple[float, float, float]:
    """The colour at the centre of cell (x j, y i) of a heatmap's image (origin lower: y 0 at the bottom)."""
    tag = re.search(r'<image xlink:href="data:image/png;base64,([^"]+)"([^>]*)>', svg)
    assert tag, "no image in the heatmap"
    png: Any = __import__("matplotlib.image", fromlist=["imread"]).imread(io.BytesIO(base64.b64decode(tag.group(1))),
                                                                          format="png")
    h, w = png.shape[:2]
    flipped = "scale(1 -1)" in tag.group(2)  # the image's rows stored bottom first, drawn flipped
    px = png[int(((i + 0.5) if flipped else (ny - i - 0.5)) / ny * h), int((j + 0.5) / nx * w)]
    return float(px[0]), float(px[1]), float(px[2])


def test_the_speedup_heatmap_writes_each_configurations_speedup_and_marks_the_noisy_ones(
        spec_page: tuple[Path, str]) -> None:
    folder, page = spec_page
    rows = [r for r in collect.rows_of([folder]) if not r.baseline]
    assert '<h2 id="heatmap">' in page and "no-heatmap" not in page
    # the heatmap comes before the table: the answer first
    assert page.index('id="heatmap-1"') < page.index("<h2>Points</h2>")
    drafts, topks = sweep_screenshot.DRAFTS, sweep_screenshot.TOPKS
    hatched = 0
    for n, c in enumerate(sweep_screenshot.CONCURRENCIES, 1):
        assert f"SPEEDUP over draft x topk, c={c}</h3>" in page
        (svg,) = plot_svgs(page, f"heatmap-{n}")
        text = comments(svg)
        assert text[:8] == ["2", "4", "6", "draft", "1", "2", "4", "topk"], text  # x: draft, y: topk
        noisy = []
        for r in (r for r in rows if r.point["c"] == c):
            d, k = r.point["draft"], r.point["topk"]
            j, i = drafts.index(d), topks.index(k)
            got = r.ratios.get("speedup")
            if r.status != "ok":
                assert got is None and "failed" in text
                continue
            assert got is not None and got.low is not None and got.high is not None
            within = got.within_noise(r.noise_limit)
            assert f"{got.value:.2f}x" + (" ~" if within else "") in text, (r.label, text)  # the value, written
            assert f"[{got.low:.2f}-{got.high:.2f}]" in text  # and its interval
            if within or r.drifted is not None:
                noisy.append(f"noisy-{n}-{i}-{j}")
            if r.drifted is not None:
                assert f"drifted {speedup.drift_text(r.drifted)}" in text
            # a diverging scale centred on 1: a speedup blue, a slowdown red (a clear one: past 10 %)
            red, _, blue = cell_colour(svg, len(drafts), len(topks), j, i)
            if got.value > 1.1:
                assert blue > red + 0.1, (r.label, red, blue)
            elif got.value < 0.9:
                assert red > blue + 0.1, (r.label, red, blue)
        # each noisy cell hatched (a pattern over the cell), and no other
        in_order = sorted(noisy, key=lambda s: [int(x) for x in s.split("-")[1:]])
        assert re.findall(r'<g id="(noisy-[^"]+)"', svg) == in_order
        assert svg.count("<pattern") == (1 if noisy else 0) and svg.count("url(#h") == len(noisy)
        hatched += len(noisy)
    # the fixture has what the marks are for: a slowdown, a speedup, a cell within the noise and a drifted one
    assert hatched >= 2
    values = [r.ratios["speedup"] for r in rows if "speedup" in r.ratios]
    assert min(v.value for v in values) < 0.9 < 1.1 < max(v.value for v in values)
    assert any(r.drifted is not None for r in rows) and any(v.within_noise(0.1) for v in values)
    caption = re.search(r'<p class="note heatmap-caption">(.*?)</p>', page)
    assert caption and "Hatched: noisy" in caption.group(1) and "red: slower" in caption.group(1)


def test_heatmap_chooses_its_axes_and_a_bad_one_names_the_axes_there_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = spec_sweep(tmp_path)
    drawn = heatmap_section(folder, "topk,draft")  # the page's flag reaches heatmap.choose: the bad ones below
    assert "SPEEDUP over topk x draft, c=1</h3>" in drawn
    assert comments(plot_svgs(drawn, "heatmap-1")[0])[:8] == ["1", "2", "4", "topk", "2", "4", "6", "draft"]
    for bad in ("c,draft", "draft", "draft,draft", "nope,topk", "draft,topk,c"):
        with pytest.raises(Failed) as e:
            report_main([str(folder)], "html", heatmap=bad)
        assert e.value.status == 64 and "--heatmap" in str(e.value) and "draft, topk" in str(e.value), str(e.value)
        assert repr(bad) in str(e.value)
    # and from the command line's flag
    from genready import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["sweep", "report", str(folder), "--format", "html", "--heatmap", "draft,c"])
    err = capsys.readouterr().err
    assert exited.value.code == 64 and "server-side axes: draft, topk" in err, err


def text_grids(out: str, fmt: str) -> dict[str, list[list[str]]]:
    """The text heatmaps of a table (or markdown) report, by panel title: the header line and each row's cells."""
    grids: dict[str, list[list[str]]] = {}
    if fmt == "markdown":
        for title, body in re.findall(r"\*\*SPEEDUP over \S+ x \S+, (.*?)\*\*\n\n((?:\|.*\|\n)+)", out):
            lines = [ln[2:-2].split(" | ") for ln in body.splitlines()]
            grids[title] = [lines[0], *lines[2:]]  # less the --- line
        return grids
    section = out.split("Speedup against the baseline (", 1)[1].split("\n(each cell", 1)[0]
    for part in re.split(r"\n  (?=\S)", section)[1:]:
        title, *lines = part.splitlines()
        grids[title] = [re.split(r"\s{2,}", ln.strip()) for ln in lines]
    return grids


def numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_the_text_formats_hold_the_heatmap_with_the_html_cells_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    folder = spec_sweep(tmp_path)
    assert report_main([str(folder)], fmt) == 0
    out = capsys.readouterr().out
    # after the Decision, before the table
    assert out.index("Decision") < out.index("Speedup against the baseline") < out.index("POINT")
    grids = text_grids(out, fmt)
    assert list(grids) == [f"c={c}" for c in sweep_screenshot.CONCURRENCIES], list(grids)
    drafts, topks = sweep_screenshot.DRAFTS, sweep_screenshot.TOPKS
    marks = set()
    for c, (head, *body) in zip(sweep_screenshot.CONCURRENCIES, grids.values(), strict=True):
        assert head == ["topk \\ draft", *map(str, drafts)], head  # x across, as the page draws it
        assert [line[0] for line in body] == [str(k) for k in reversed(topks)]  # y up, as the page draws it
        for r in collect.rows_of([folder]):
            if r.baseline or r.point["c"] != c:
                continue
            got = body[list(reversed(topks)).index(r.point["topk"])][1 + drafts.index(r.point["draft"])]
            value, drawn, noisy = heatmap._cell(r)  # what the html heatmap writes in that cell
            if value is None:
                assert got == drawn == r.status == "failed", (r.label, got)
                marks.add("failed")
                continue
            assert numbers(got) == numbers(drawn), (r.label, got, drawn)  # speedup, interval, drift: the same
            assert got.startswith(f"{value:.2f}x") and ("slower" in got) is (value < 1)
            assert ("~" in got) is ("~" in drawn) and ("drifted" in got) is ("drifted" in drawn)
            assert noisy is ("~" in got or "drifted" in got)
            marks |= {m for m in ("slower", "~", "drifted") if m in got}
    assert marks == {"failed", "slower", "~", "drifted"}  # the fixture has each kind of cell


def test_the_text_heatmap_takes_the_page_s_axes_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = spec_sweep(tmp_path)
    assert report_main([str(folder)], "table", heatmap="topk,draft") == 0
    (head, *body) = text_grids(capsys.readouterr().out, "table")["c=1"]
    assert head == ["draft \\ topk", *map(str, sweep_screenshot.TOPKS)], head
    assert [line[0] for line in body] == [str(d) for d in reversed(sweep_screenshot.DRAFTS)]
    with pytest.raises(Failed) as e:
        report_main([str(folder)], "markdown", heatmap="c,draft")
    assert e.value.status == 64 and "server-side axes: draft, topk" in str(e.value), str(e.value)
    # the formats without a heatmap take the flag as they did
    assert report_main([str(folder)], "json", heatmap="topk,draft") == 0
    assert "Speedup against the baseline" not in capsys.readouterr().out


def test_without_a_baseline_or_two_server_axes_the_page_says_why_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two = hostile_results(tmp_path, [line(10 * a + b * 2 + c, f'{{"a": {a}, "b": {b}, "c": {c}}}', group=2 * a + b)
                                     for a in (1, 2) for b in (0, 1) for c in (0, 1)])
    page = report(two, capsys)
    why = re.findall(r'<p class="note" id="no-heatmap">(.*?)</p>', page)
    assert why == ["No speedup heatmap: the plan has no baseline (the plan key `baseline`) to measure speedups "
                   "against."], why
    assert 'id="heatmap-' not in page
    one = servers(tmp_path, 3)
    page = report(one, capsys)  # s is its only server axis
    assert re.findall(r'id="no-heatmap">(.*?)</p>', page) == [
        "A speedup heatmap needs two server-side axes; this plan has 1 (s)."]
    # and the text formats hold no heatmap at all: the page's line is enough
    for folder in (two, one):
        for fmt in ("table", "markdown"):
            assert report_main([str(folder)], fmt) == 0
            out = capsys.readouterr().out
            assert "Speedup against the baseline" not in out and "SPEEDUP over" not in out, out


def test_the_per_user_per_gpu_pareto_as_vllm_draws_it(spec_page: tuple[Path, str]) -> None:
    folder, page = spec_page
    (svg,) = plot_svgs(page, "pareto-per-user")
    text = comments(svg)
    assert "tokens/s per user (OUT tok/s / concurrency)" in text and "tokens/s per GPU (OUT tok/s / gpus)" in text
    # the front, worked out here by brute force: no other point at least as good on both and better on one
    tps = {r.label: t for r in collect.rows_of([folder])
           if r.status == "ok" and (t := (r.figures or {}).get("output_tokens_per_second")) is not None}
    pts = [(t / int(label.split("c=")[1]), t / 2, label) for label, t in tps.items()]
    front = {p[2] for p in pts if not any(q[0] >= p[0] and q[1] >= p[1] and q[:2] != p[:2] for q in pts)}
    listed = re.search(r'id="pareto-per-user">.*?<p>Pareto front: (.*?)</p>', page, re.S)
    assert listed and set(listed.group(1).split("; ")) == front and len(front) >= 2, (listed, front)
    for label in front:
        assert label in text  # each point of the front labelled on the plot
    # the per-GPU figure divides by the plan's gpus (2 in every line): the y axis ends near the best tok/s / 2
    best = max(p[1] for p in pts)
    ticks = [float(t) for t in text if re.fullmatch(r"-?\d+(\.\d+)?", t)]
    assert max(ticks) < 2 * best, (best, ticks)


def test_a_report_of_bench_lines_without_concurrency_draws_no_per_user_plot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = report(results(tmp_path, 4), capsys)  # lines another client wrote: no concurrency
    assert 'id="pareto-per-user"' not in page and 'id="pareto-ttft_p50_ms"' in page


def ticks(svg: str, axis: int) -> list[str]:
    """The labels of the ticks of matplotlib's axis `axis` (1: the first axes' x, 2: its y)."""
    part = svg.split(f'<g id="matplotlib.axis_{axis}">', 1)[1].split('<g id="matplotlib.axis_', 1)[0]
    return [html.unescape(t) for t in re.findall(r'<g id="[xy]tick_\d+">.*?<!-- (.*?) -->', part, re.S)]


def test_an_axis_of_integers_has_integer_ticks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # two concurrencies, accept lengths that are whole numbers: matplotlib's own ticks would be 1.0, 1.2, ...
    folder = hostile_results(tmp_path, [line(c, f'{{"c": {c}}}', accept) for c, accept in ((1, "2"), (2, "3"))])
    (svg,) = svgs(report(folder, capsys))
    assert ticks(svg, 1) and all(re.fullmatch(r"\d+", t) for t in ticks(svg, 1)), ticks(svg, 1)
    assert ticks(svg, 2) and all(re.fullmatch(r"\d+", t) for t in ticks(svg, 2)), ticks(svg, 2)
    # and an axis of fractions keeps its fractions
    (tmp_path / "f").mkdir()
    folder = hostile_results(tmp_path / "f", [line(c, f'{{"c": {c}}}', accept)
                                              for c, accept in ((1, "2.2"), (2, "2.3"))])
    (svg,) = svgs(report(folder, capsys))
    assert any("." in t for t in ticks(svg, 2)), ticks(svg, 2)


def box(svg: str, gid: str) -> tuple[float, float]:
    """(left, right) x of the first path drawn inside the group `gid`."""
    part = svg.split(f'<g id="{gid}">', 1)[1]
    d = re.search(r'<path d="([^"]+)"', part).group(1)  # type: ignore[union-attr]
    xs = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", d)][::2]
    return min(xs), max(xs)


def servers(tmp: Path, n: int, axes: int = 1) -> Path:
    """n server configurations (group each) x c [1, 2]: one axis s, or with axes=2 a x b (4 values of a)."""
    (tmp / str(n)).mkdir()
    lines = []
    for g in range(n):
        point = f'"s": {g}' if axes == 1 else f'"a": {g // 4}, "b": {g % 4}'
        lines += [line(g * 2 + c, f'{{{point}, "c": {c}}}', str(1 + g / 10 + c / 5), group=g + 1) for c in (1, 2)]
    return hostile_results(tmp / str(n), lines)


def test_over_six_lines_the_legend_goes_outside_the_axes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for n, outside in ((6, False), (7, True), (12, True)):
        svg = svgs(report(servers(tmp_path, n), capsys))[0]
        left, right = box(svg, "axes_1")  # the axes' background: the plot's area
        legend = box(svg, "legend_1")
        assert (legend[0] > right) is outside and (legend[1] < right) is not outside, (n, left, right, legend)
        assert svg.count('<g id="axes_') == 1


def test_over_twelve_configurations_small_multiples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 16 configurations of a x b: a panel per value of a, its 4 lines named by b, sharing both axes
    page = report(servers(tmp_path, 16, axes=2), capsys)
    svg = plot_svgs(page, "plot-accept_length")[0]
    assert svg.count('<g id="axes_') == 4 and svg.count('<g id="legend_') == 4
    text = comments(svg)
    assert [t for t in text if t.startswith("a=")] == ["a=0", "a=1", "a=2", "a=3"], text
    assert text.count("b=3") == 4 and "c" in text and "ACCEPT" in text  # shared labels, once
    # 13 configurations of one axis: a panel each
    svg = plot_svgs(report(servers(tmp_path, 13), capsys), "plot-accept_length")[0]
    assert svg.count('<g id="axes_') == 13 and '<g id="legend_' not in svg
    assert [t for t in comments(svg) if t.startswith("s=")] == [f"s={g}" for g in range(13)]
    # 40: the first MAX_PANELS, and the figure says so
    svg = plot_svgs(report(servers(tmp_path, 40), capsys), "plot-accept_length")[0]
    assert svg.count('<g id="axes_') == 16 and "first 16 of 40 panels (40 lines)" in comments(svg)


def test_the_gpus_plan_key_and_its_results_field() -> None:
    from genready.config import ConfigError
    from genready.sweep import plan as sweepplan
    from genready.sweep.run import results as sweepresults

    base = {"command": "bench -c {c}", "matrix": {"c": [1, 2]}}
    assert sweepplan.parse_plan(base, "p.toml").gpus == 1
    p = sweepplan.parse_plan({**base, "gpus": 8}, "p.toml")
    assert p.gpus == 8
    for bad, found in ((0, "integer 0"), (2.5, "number 2.5"), ("8", "string '8'"), (True, "boolean True")):
        with pytest.raises(ConfigError) as e:
            sweepplan.parse_plan({**base, "gpus": bad}, "p.toml")
        assert (e.value.file, e.value.key, e.value.expected) == ("p.toml", "gpus", "an integer >= 1"), str(e.value)
        assert found in str(e.value), str(e.value)
    att = sweepresults.Attempt(p.points[0], 1, "01-c=1/attempt-1", sweepresults.Status.OK, 0.0, 1.0, gpus=p.gpus)
    assert att.to_json("t", "u.service")["gpus"] == 8
    # the report reads it back; a line from before the key (or a bad value) counts 1
    folder = Path("/nonexistent")
    assert sweeprows.row_of({"index": 1, "status": "ok", "gpus": 8}, folder).gpus == 8
    assert sweeprows.row_of({"index": 1, "status": "ok"}, folder).gpus == 1
    assert sweeprows.row_of({"index": 1, "status": "ok", "gpus": True}, folder).gpus == 1


def test_a_heatmap_past_49_cells_writes_the_value_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        spec_page: tuple[Path, str]) -> None:
    """Up to heatmap.MAX_WITH_INTERVAL cells each writes its interval under its value; past that (8 x 8 here) the
    value alone, so a big grid stays legible and draws in time (the table keeps the intervals)."""
    from genready.sweep.report import heatmap as sweepheatmap

    monkeypatch.setattr(sweep_screenshot, "DRAFTS", tuple(range(2, 10)))
    monkeypatch.setattr(sweep_screenshot, "TOPKS", tuple(range(1, 9)))
    assert len(sweep_screenshot.DRAFTS) * len(sweep_screenshot.TOPKS) > sweepheatmap.MAX_WITH_INTERVAL
    text = comments(plot_svgs(heatmap_section(spec_sweep(tmp_path)), "heatmap-1")[0])
    values = [t for t in text if re.fullmatch(r"\d\.\d\dx( ~)?", t)]
    assert len(values) >= 60 and not any(t.startswith("[") for t in text), text[:20]
    # the 3 x 3 fixture's page: every cell has its interval under its value
    small = comments(plot_svgs(spec_page[1], "heatmap-1")[0])
    assert sum(t.startswith("[") for t in small) >= 8, small
