"""`genready sweep report DIR [DIR...]`: read a sweep's results folders once and write one report of them.

Kept apart from the sweep's run (sweep/main.py) so that a report imports nothing a run needs (the HTTP
client, D-Bus, the steps): a report over 64 MiB of results is timed, and its start-up is part of that time.
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from genready import console
from genready.exitcodes import Exit, Failed
from genready.store import durable
from genready.store.bounded import FileError
from genready.sweep import explore, files
from genready.sweep.report import collect, decision, loadreport
from genready.sweep.report import replay as sweepreplay
from genready.sweep.report import schedule as sweepschedule
from genready.sweep.report import table as sweepreport
from genready.sweep.rows import Row
from genready.web import htmlpage


def decision_facts(read: collect.Read, partial: str = "") -> decision.Facts:
    """What the report's Decision knows besides the rows: the plan's `slo` as the results lines recorded it, and
    each folder's DIR/search.jsonl found lines (a file that cannot be read is a warning, and holds none);
    `partial`: which of the plan's points have no result (its best is then only the best of those present)."""
    found: list[dict[str, Any]] = []
    for folder, _, _ in read:
        try:
            found += [rec for _, rec in files.numbered_lines(folder / files.SEARCH_FILE)]
        except FileError as e:
            files.warn_line(str(e))
    facts = decision.Facts.of((rec for _, _, lines in read for _, rec in lines), found)
    notes = [*facts.notes, *(f"partial: {partial}; the best of the points present" for _ in [partial] if partial)]
    for folder, _, _ in read:  # strategy = "pattern": the search's coverage (explore.py)
        moves = explore_lines(folder)
        summary = next((rec for rec in reversed(moves) if rec.get("done")), None)
        if summary is not None and (note := explore.coverage_note(summary)):
            notes.append(note)
        elif moves:
            notes.append(f"the pattern search did not finish ({len(moves)} loads so far): the configurations it did "
                         "not load have no line")
    return replace(facts, notes=tuple(notes))


def explore_lines(folder: Path) -> list[dict[str, Any]]:
    """DIR/explore.jsonl's lines (none without the file; one that cannot be read is a warning)."""
    try:
        return [rec for _, rec in files.numbered_lines(folder / files.EXPLORE_FILE)]
    except FileError as e:
        files.warn_line(str(e))
        return []


def _with_schedule(text: str, fmt: str, planned: sweepschedule.Schedule, engine: str,
                   replayed: sweepreplay.Replay | None) -> str:
    """The report with --schedule's: a section after the tables (and the replay's, when there is one), a
    `schedule` field in JSON (with its `replay`)."""
    if fmt == "json":
        data = json.loads(text)
        data["schedule"] = sweepschedule.as_json(planned, engine)
        if replayed is not None:
            data["schedule"]["replay"] = sweepreplay.as_json(replayed)
        return json.dumps(data, indent=2, allow_nan=False) + "\n"
    return text + "\n" + sweepschedule.text(planned, engine, fmt) + (
        sweepreplay.text(replayed, fmt) if replayed is not None else "")


def _schedule_html(planned: sweepschedule.Schedule, engine: str, replayed: sweepreplay.Replay | None) -> str:
    """The schedule's and the replay's sections, and the picture of throughput against load for the schedule and
    each static depth (html.schedule_plot: matplotlib, as the page)."""
    from genready.sweep.report import html as sweephtml

    svg = sweephtml.schedule_plot(sweephtml.figure_class(), planned, replayed)
    title = "Output tok/s against load: each static depth, and the schedule as replayed" if replayed else \
        "Output tok/s against load: each static depth (`genready sweep replay` adds the schedule's own)"
    out = [f'<div class="plot" id="schedule-load"><h3>{htmlpage.text(title)}</h3>'
           f"{htmlpage.data_image(svg, title)}</div>" if svg else ""]
    for sid, section in (("schedule", sweepschedule.text(planned, engine)),
                         ("replay", sweepreplay.text(replayed) if replayed is not None else "")):
        if section:
            head, *lines = section.splitlines()
            out.append(f'<section id="{sid}"><h2>{htmlpage.text(head)}</h2><pre>'
                       + "\n".join(htmlpage.text(ln.strip()) for ln in lines if ln) + "</pre></section>")
    return "".join(out)


def replay_beside(folders: Sequence[str], rows: Sequence[Row], engine: str | None) -> sweepreplay.Replay | None:
    """The replay of `sweep replay` in DIR/replay (one folder's report), when it ran the schedule these rows give
    now for `engine` (any engine when None); None otherwise, said on stderr when a replay is there but not used."""
    if len(folders) != 1:
        return None
    folder = Path(folders[0])
    try:
        ran = sweepreplay.read_schedule(folder)
        if ran is None:
            return None
        planned = sweepschedule.schedule(rows)
        if why := sweepreplay.stale(planned, ran, engine):
            console.err(f"genready sweep report: not using {folder / sweepreplay.REPLAY_DIR}: {why}")
            return None
        replay_rows = collect.rows_of([folder / sweepreplay.REPLAY_DIR])
    except (FileError, collect.ReportError, sweepschedule.NoSchedule) as e:
        console.err(f"genready sweep report: not using {folder / sweepreplay.REPLAY_DIR}: {e}")
        return None
    client = set(decision.settings(rows)[0][0])
    return sweepreplay.replay_of(planned, client, replay_rows, str(ran.get("engine")),
                                 str(folder / sweepreplay.REPLAY_DIR))


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """The cyclic garbage collector held off while a report reads, builds and renders its many small objects
    (decoded lines, rows, cells): none is in a cycle, yet each collection walked every line read so far, a
    quarter of the time over 64 MiB of results. Reference counting still frees them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@_no_collection()
def report_main(folders: Sequence[str], fmt: str, *, output: str | None = None, x: str | None = None,
                lines: str | None = None, compare: bool = False, strict: bool = False,
                heatmap: str | None = None, schedule: str | None = None) -> int:
    """`genready sweep report DIR [DIR...]`: one table of every point's result and bench figures; with
    `--format html` a self-contained page with plots (sweephtml, which needs matplotlib: exit 69 without);
    with `--compare A B` two sweeps' points side by side (sweepcompare). A set missing some of the plan's
    points (a shard that never ran) says so, and marks no best value; `strict`: exit 1 then. `schedule` (vllm,
    sglang): the speculation depth per load in that engine's format (report/schedule.py), after the report and
    in its JSON; the Decision's last line says what to deploy either way."""
    if compare and (len(folders) != 2 or fmt not in ("table", "html")):
        raise Failed("--compare: expected two folders A B and --format table or html, found "
                     f"{len(folders)} folder{'s' if len(folders) != 1 else ''} and --format {fmt}",
                     status=Exit.BAD_ARGUMENT)
    if schedule is not None and (compare or fmt == "csv"):
        raise Failed("--schedule: a report of one sweep in --format table, markdown, json or html",
                     status=Exit.BAD_ARGUMENT)
    if fmt == "html" and not compare:  # matplotlib before the results: see there
        from genready.sweep.report import html as sweephtml
        sweephtml.preload()
    try:
        sides = [collect.rows_of([Path(f)]) for f in folders] if compare else []
        read = [] if compare else collect.read_folders([Path(f) for f in folders])
    except collect.ReportError as e:
        raise Failed(str(e), status=Exit.BAD_DATA) from None
    rows = collect.rows_from(read)
    partial = "" if compare else collect.coverage((rec for _, _, lines in read for _, rec in lines),
                                                  {r.index for r in rows})
    if partial:
        for r in rows:
            r.best.clear()  # the best of half a plan is not the plan's best
        console.err(f"genready sweep report: {partial}; no best values marked (a partial set)")
    replayed = None if compare or partial else replay_beside(folders, rows, schedule)
    facts = None if compare else replace(decision_facts(read, partial), deploy=(
        sweepreplay.deploy_line(replayed, rows, schedule) if replayed is not None else
        sweepschedule.deploy_line(rows, schedule)))
    planned: sweepschedule.Schedule | None = None
    if schedule is not None and not compare:
        try:
            planned = sweepschedule.schedule(rows)
        except sweepschedule.NoSchedule as e:
            raise Failed(f"--schedule: {e}", status=Exit.BAD_ARGUMENT) from None
    if compare:
        from genready.sweep.report import compare as sweepcompare

        render = sweepcompare.render_html if fmt == "html" else sweepcompare.render_text
        text = render(sides[0], sides[1], folders[0], folders[1])
    elif fmt == "html":
        from genready.sweep.report import html as sweephtml  # matplotlib: only here, only when asked for

        try:
            text = sweephtml.render(rows, x=x, lines=lines, heatmap_axes=heatmap,  # and a [search]'s load curves
                                    sections=[loadreport.html_section([Path(f) for f in folders], read),
                                              _schedule_html(planned, schedule, replayed) if planned and schedule
                                              else ""],
                                    facts=facts)
        except sweephtml.NoMatplotlib as e:
            raise Failed(str(e), status=Exit.UNAVAILABLE) from None
        except ValueError as e:
            raise Failed(str(e), status=Exit.BAD_ARGUMENT) from None
    else:
        from genready.sweep.report import heatmap as sweepheatmap  # `sweep report` only
        from genready.sweep.report.html import axes_of  # the page's axes (html.py imports no matplotlib until it draws)

        try:  # the speedup heatmap as text, after the Decision (the html draws it)
            grid = sweepheatmap.text(rows, axes_of(rows), heatmap, fmt) if fmt in ("table", "markdown") else ""
        except ValueError as e:
            raise Failed(str(e), status=Exit.BAD_ARGUMENT) from None
        text = sweepreport.render(rows, fmt, facts, heatmap=grid)
        if fmt in ("table", "markdown"):  # a [search]'s found values and crossover, a line per configuration
            text += loadreport.table([Path(f) for f in folders], fmt, read)
            text += "".join(explore.report_text(explore_lines(folder)) for folder, _, _ in read)
        if planned is not None and schedule is not None:
            text = _with_schedule(text, fmt, planned, schedule, replayed)
        if partial and fmt in ("table", "markdown"):
            text += f"(partial: {partial}; no best values marked)\n"
    status = Exit.TIMEOUT if partial and strict else Exit.OK
    if output is None:
        sys.stdout.write(text)
        return status
    try:
        durable.replace(Path(output), text.encode())  # whole or not at all: a ticket gets no half page
    except OSError as e:
        raise Failed(f"cannot write {output}: {e.strerror or e}", status=Exit.CANNOT_CREATE) from None
    return status
