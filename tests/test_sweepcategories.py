"""The report's category × configuration table (issue 37 §2): per prompt category, each point's accept length and
its speedup against the baseline, from real results folders (results.jsonl and each run's bench.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from genready.sweep import files
from genready.sweep.report import categories, collect
from genready.sweep.report import table as sweepreport
from genready.sweep.rows import Row
from genready.sweep.run import steps

# Per configuration and category: (output tok/s per request, accept length) of repeats 1, 2, 3.
Runs = dict[str, list[tuple[float, float | None]]]
BASE: Runs = {"coding": [(100, None), (104, None), (96, None)], "writing": [(80, None), (82, None), (78, None)]}
EAGLE: Runs = {"coding": [(250, 3.4), (262, 3.6), (244, 3.5)], "writing": [(81, 1.6), (79, 1.5), (83, 1.7)]}
NGRAM: Runs = {"coding": [(90, 2.0), (93, 2.1), (88, 1.9)], "writing": [(60, 1.2), (62, 1.2), (58, 1.2)]}


def _line(folder: Path, index: int, point: dict[str, Any], cats: Runs,
          repeat: int, *, base: int = 0) -> str:
    """One results line of a repeat, and its run's bench.jsonl with the bench client's `categories`."""
    out = f"{index:02d}/repeat-{repeat}"
    (folder / out).mkdir(parents=True)
    by = {name: {"requests": 16, "ok": 16, "output_tokens_per_second": runs[repeat - 1][0],
                 "accept_length": runs[repeat - 1][1], "draft_acceptance": None} for name, runs in cats.items()}
    total = sum(runs[repeat - 1][0] for runs in cats.values())
    (folder / out / "bench.jsonl").write_text(json.dumps({"output_tokens_per_second": total, "categories": by}) + "\n")
    rec: dict[str, Any] = {"point": point, "index": index, "status": "ok", "out": out, "repeat": repeat,
                           "noise_limit": 0.1, "client": {"c": point["c"]}}
    rec.update({"baseline": base} if base else {"baseline_round": 1})
    return json.dumps(rec) + "\n"


def _folder(tmp_path: Path) -> Path:
    lines = []
    for r in (1, 2, 3):
        lines += [_line(tmp_path, 1, {"algo": "eagle", "c": 1}, EAGLE, r),
                  _line(tmp_path, 2, {"algo": "ngram", "c": 1}, NGRAM, r),
                  _line(tmp_path, 3, {"algo": "none", "c": 1}, BASE, r, base=1)]
    (tmp_path / "results.jsonl").write_text("".join(lines))
    return tmp_path


def test_each_points_categories_are_kept_over_its_repeats(tmp_path: Path) -> None:
    rows = collect.rows_of([_folder(tmp_path)])
    eagle, _, base = rows
    assert eagle.categories["coding"]["accept_length"] == [3.4, 3.6, 3.5]
    assert eagle.categories["writing"]["output_tokens_per_second"] == [81, 79, 83]
    assert "accept_length" not in base.categories["coding"]  # no speculation: null, not kept
    got = categories.speedups(rows)
    assert got[0]["coding"].value == pytest.approx(250 / 100, rel=0.02)  # geometric means: 251.9 / 99.9
    assert got[0]["writing"].within_noise(0.1) and not got[0]["coding"].within_noise(0.1)
    assert got[1]["coding"].value < 1 and 2 not in got  # the baseline has no speedup of its own
    low, high = got[0]["coding"].low, got[0]["coding"].high
    assert low is not None and high is not None and low < 2.52 < high


def test_a_results_line_carries_its_runs_categories_and_the_report_reads_them_without_the_bench_files(
        tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    kept = collect.rows_of([folder])
    # what the sweep records in each ok line (steps.bench_categories), then the {out} folders are not kept
    lines = [json.loads(ln) for ln in (folder / "results.jsonl").read_text().splitlines()]
    for rec in lines:
        rec["categories"] = steps.bench_categories(folder / rec["out"])
        (folder / rec["out"] / "bench.jsonl").unlink()
    assert lines[0]["categories"]["coding"] == {"requests": 16, "output_tokens_per_second": 250, "accept_length": 3.4}
    (folder / "results.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    assert [r.categories for r in collect.rows_of([folder])] == [r.categories for r in kept]
    assert steps.bench_categories(folder / "01/repeat-1") is None  # no bench line: none recorded


def test_a_lines_categories_keep_only_finite_numbers_of_the_kept_figures() -> None:
    got = files.category_figures({"coding": {"accept_length": float("nan"), "requests": 3, "other": 1.0,
                                            "output_tokens_per_second": True}, "x": [1], 7: {"requests": 1}})
    assert got == {"coding": {"requests": 3.0}}
    assert files.category_figures(None) == {} and files.category_figures([]) == {}


def test_the_table_and_markdown_reports_add_the_category_tables(tmp_path: Path) -> None:
    rows = collect.rows_of([_folder(tmp_path)])
    table = sweepreport.render(rows)
    points = table[:table.index("\naccept length per prompt category")]
    assert [ln.split()[0] for ln in table.splitlines() if ln.startswith("algo=")] == ["algo=eagle", "algo=ngram"]
    assert "coding" not in points  # the points' table is as it was; the category tables follow, indented
    accept = table[table.index("accept length per prompt category"):table.index("speedup per prompt category")]
    assert accept.splitlines()[1].split() == ["POINT", "coding", "writing"]
    assert next(ln for ln in accept.splitlines() if ln.startswith("  algo=eagle")).split()[-2:] == ["3.50", "1.60"]
    assert next(ln for ln in accept.splitlines() if ln.startswith("  baseline#1")).split()[-2:] == ["-", "-"]
    speed = table[table.index("speedup per prompt category"):]
    eagle = next(ln for ln in speed.splitlines() if ln.startswith("  algo=eagle"))
    assert "2.52x [" in eagle and eagle.rstrip().endswith("~"), speed  # writing: as fast as the baseline
    ngram = next(ln for ln in speed.splitlines() if ln.startswith("  algo=ngram"))
    assert ngram.count("slower") == 2, speed  # a slowdown is said, never hidden
    assert next(ln for ln in speed.splitlines() if ln.startswith("  baseline#1")).split()[-2:] == ["baseline"] * 2
    md = sweepreport.render(rows, "markdown")
    assert "\n**speedup per prompt category" in md and "| POINT | coding | writing |" in md
    assert "| algo=eagle c=1 | 3.50 | 1.60 |" in md
    assert "categories" not in json.loads(sweepreport.render(rows, "json"))["rows"][0]  # the JSON rows unchanged


def test_without_a_baseline_only_accept_length_and_without_categories_nothing(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    lines = [_line(tmp_path / "a", 1, {"algo": "eagle", "c": 1}, EAGLE, r) for r in (1, 2, 3)]
    (tmp_path / "a" / "results.jsonl").write_text("".join(ln.replace('"baseline_round": 1', '"x": 0') for ln in lines))
    table = sweepreport.render(collect.rows_of([tmp_path / "a"]))
    assert "accept length per prompt category" in table and "speedup per prompt category" not in table
    (tmp_path / "b" / "01").mkdir(parents=True)
    (tmp_path / "b" / "01" / "bench.jsonl").write_text(json.dumps({"output_tokens_per_second": 5.0,
                                                                   "categories": None}) + "\n")
    (tmp_path / "b" / "results.jsonl").write_text(json.dumps({"point": {"c": 1}, "index": 1, "status": "ok",
                                                              "out": "01"}) + "\n")
    rows = collect.rows_of([tmp_path / "b"])
    assert rows[0].categories == {} and "prompt category" not in sweepreport.render(rows)
    assert categories.section(rows, "markdown") == "" and categories.html_section(rows) == ""
    # categories without an accept length (no speculative decoding) and no baseline: no table says nothing
    (tmp_path / "c").mkdir()
    plain: Runs = {"coding": [(100.0, None)] * 3, "writing": [(80.0, None)] * 3}
    (tmp_path / "c" / "results.jsonl").write_text(_line(tmp_path / "c", 1, {"algo": "none", "c": 1}, plain, 1)
                                                  .replace('"baseline_round": 1', '"x": 0'))
    rows = collect.rows_of([tmp_path / "c"])
    assert rows[0].categories["coding"]["output_tokens_per_second"] == [100.0]
    assert "prompt category" not in sweepreport.render(rows) and categories.html_section(rows) == ""


def named(tmp_path: Path, category: str) -> list[Row]:
    """_folder's rows, with one more category of that name in eagle's first repeat (a prompt file's name)."""
    folder = _folder(tmp_path)
    bench = folder / "01" / "repeat-1" / "bench.jsonl"
    line = json.loads(bench.read_text())
    line["categories"][category] = {"requests": 1, "accept_length": 2.0, "output_tokens_per_second": 9.0}
    bench.write_text(json.dumps(line) + "\n")
    return collect.rows_of([folder])


def test_the_html_report_has_the_category_tables_escaped(tmp_path: Path) -> None:
    rows = named(tmp_path, "<b>qa</b>")
    got = categories.html_section(rows)
    assert got.startswith('<h2 id="categories">Per prompt category</h2>')
    assert "<th>&lt;b&gt;qa&lt;/b&gt;</th>" in got and "<b>qa" not in got
    assert '<td class="noisy">1.01x [0.96-1.07] ~</td>' in got  # eagle's writing: within the noise
    sweephtml = pytest.importorskip("genready.sweep.report.html")
    pytest.importorskip("matplotlib")
    page = sweephtml.render(rows)
    assert got in page


def test_category_names_reach_the_terminal_and_markdown_escaped(tmp_path: Path) -> None:
    """Issue 53 #11: a category named with an ESC sequence or a line break went raw into the table headers."""
    rows = named(tmp_path, "\x1b[2Jqa\nx")
    for fmt in ("table", "markdown"):
        got = categories.section(rows, fmt)
        assert "\\x1b[2Jqa\\x0ax" in got and "\x1b" not in got, got
    md = categories.section(rows, "markdown")
    header = next(ln for ln in md.splitlines() if ln.startswith("| POINT"))
    assert header.count("|") == 5  # POINT, the escaped name, coding, writing: one line, four cells
