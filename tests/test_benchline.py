"""The bench line's one schema (tools/benchline.py, issue 49 §3): the writer writes exactly the table's fields,
and the sweep's readers look every field up through it, never by a key spelled again."""

from __future__ import annotations

import ast
from pathlib import Path

from genready.sweep import rows
from genready.tools import benchclient, benchline
from genready.tools.benchfigures import Outcome, Summary

ROOT = Path(__file__).resolve().parents[1] / "daemon" / "genready"
# The modules that read a bench line (files.bench_line, Row.figures, a category's figures, a search step's line).
READERS = ("sweep/files.py", "sweep/rows.py", "sweep/search.py", "sweep/report/*.py", "sweep/run/gpucost.py",
           "sweep/run/steps.py", "sweep/run/searchrun.py")
# Words that are also something else than the bench line's key, where that is what the module means by them.
STATUS = {"ok", "failed"}  # a results line's status (run/results.Status), in every reader
ELSEWHERE = {
    "sweep/rows.py": {"target"},  # the results line's own `target` (the page's context)
    "sweep/search.py": {"slo", "saturation", "concurrency"},  # the plan's [search] key, a Mode, an Axis
    "sweep/report/decision.py": {"slo", "saturation", "concurrency", "failed"},  # results/search lines, the JSON's
    "sweep/report/categories.py": {"categories"},  # the results line's copy (run/results.py writes it)
    "sweep/report/html.py": {"target"},  # the results line's context
    "sweep/report/loadreport.py": {"slo", "concurrency"},  # the plan's [search] slo; an axis label's word
    "sweep/report/schedule.py": {"concurrency"},  # a plan axis's name (LOAD_AXES)
}


def _summary() -> Summary:
    """A run of two categories with streamed timings: every figure the line can have, has one."""
    outcomes = [Outcome(True, 0.2, 10, ttft=0.05, itl=(0.01, 0.02), category="code", sent=0.0),
                Outcome(True, 0.3, 12, ttft=0.06, itl=(0.02,), category="chat", sent=0.1),
                Outcome(False, 0.1, error="HTTP 500", category="chat", sent=0.2)]
    return Summary(3, 2, wall_seconds=0.5, outcomes=outcomes, conversations=3)


def _line() -> dict[str, object]:
    args = benchclient.build_parser().parse_args(["--slo", "ttft_p99_ms=500"])
    args.prompt_source = "--prompt"
    return benchclient.result_json(args, _summary(), {})


def test_the_writer_writes_every_field_of_the_table_and_no_other() -> None:
    written = set(_line())
    assert written - set(benchline.BY_KEY) == set(), "written, but not defined in tools/benchline.py"
    assert set(benchline.BY_KEY) - written == set(), "defined in tools/benchline.py, but not written"


def test_each_category_holds_the_tables_category_fields() -> None:
    cats = _line()[benchline.CATEGORIES.key]
    assert isinstance(cats, dict) and set(cats) == {"code", "chat"}, cats
    for figures in cats.values():
        assert set(figures) == {f.key for f in benchline.CATEGORY_FIELDS}, figures


def test_each_old_name_is_still_written_with_its_new_fields_value() -> None:
    line = _line()
    for old, new in benchline.OLD_NAMES.items():
        assert line[old.key] == line[new.key] is not None, (old.key, new.key)


def test_each_field_is_defined_once() -> None:
    assert len(benchline.BY_KEY) == len(benchline.FIELDS) > 60


def test_each_report_figure_is_a_bench_line_field_or_says_where_else_it_comes_from() -> None:
    """A figure the bench client never writes (the GPUs' cost) is the results line's: its Figure names the field."""
    for f in rows.FIGURES:
        assert f.field in benchline.FIELDS or f.from_results, f
        assert f.title and f.field.digits is not None, f


def _spelled_keys(path: Path, keys: set[str]) -> list[tuple[int, str]]:
    """(line, key) of each string in `path` that is a bench line key: docstrings, the text of f-strings and a
    Figure's `from_results` (a results line's field) left out."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            skip.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in node.values}
        if isinstance(node, ast.keyword) and node.arg == "from_results":
            skip.add(id(node.value))
    return [(node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and node.value in keys and id(node) not in skip]


def test_no_reader_spells_a_bench_line_key_again() -> None:
    """`"output_tokens_per_second"` was spelled 12 times in 9 modules (review-0881ad4 §2.4): a reader names a
    field as benchline.FIELD.key, so a key renamed in the table is renamed for every reader."""
    keys = set(benchline.BY_KEY)
    assert all(words <= keys for words in ELSEWHERE.values()), "a word listed here is no bench line key any more"
    found = []
    paths = sorted({p for pattern in READERS for p in ROOT.glob(pattern)})
    assert len(paths) > 15, "the readers were not found"
    for path in paths:
        name = str(path.relative_to(ROOT))
        spelled = _spelled_keys(path, keys - STATUS - ELSEWHERE.get(name, set()))
        found += [f"{name}:{line}: {key!r}" for line, key in spelled]
    assert not found, "spell these as tools/benchline.py's FIELD.key:\n" + "\n".join(found)
