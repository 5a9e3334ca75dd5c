"""`genready sweep replay DIR --schedule vllm|sglang` (issue 52 §2): the sweep's schedule proven in one more load.

A sweep of the speculation depth over loads gives a schedule (report/schedule.py). The replay loads the unit once
more with it and runs each load level of the sweep again, as a sweep of its own whose plan is the sweep's plan,
changed in four places (`replay_plan`):

- its drop-in is the sweep's, rendered for the schedule's other server settings (held at their best) at its
  deepest depth, with the schedule put into the last ExecStart= by the engine's format (servers/schedules.py,
  ScheduleFormat.argv: vLLM's keys merged into --speculative-config; SGLang's --speculative-adaptive with its
  config file, written to DIR/replay/);
- its `expect` adds the keys of the engine's own report that show the schedule took (ScheduleFormat.expect), so a
  start whose engine does not report them is config_mismatch, not measured (run/confirm.py);
- its points are the sweep's client settings, one each, the depth axis set to "schedule" (no baseline, no
  search, no prune): the same command, hence the same prompts and seed, and the same repeats;
- its results go to DIR/replay/ (report/replay.py's REPLAY_DIR), beside DIR/replay/schedule.json, which says
  what ran (the engine, the tiers, the drop-in, the expected keys).

A plan key was the other way in: a sweep that ends by replaying its own schedule. A sub-command is kept apart
because the replay needs the sweep's results whole (every depth at every load, the baseline's rounds among them)
and a choice the plan does not make (the engine's format); it can run again after a `--resume` of the sweep, and
a plan stays one sweep.

It runs through sweep/main.py's `run`, so every step is the sweep's (run/steps.py, dropin.py, confirm.py): the
drop-in checked and written, the restart verified by the daemon, the engine's report confirmed, the warmup and the
flush, the command pinned to the verified instance, each attempt's results line, and the unit restored at the
end. Then the replay's verdict (report/replay.py) is printed, and `sweep report DIR --schedule ENGINE` carries it
into the Decision. Exit status: the sweep's; 1 also when a level regressed (below 0.90x the best static).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from genready import console
from genready.config import Config, ConfigError
from genready.exitcodes import Exit, Failed
from genready.servers.schedules import ScheduleFormat, Tier
from genready.store import durable
from genready.store.bounded import FileError
from genready.sweep import main as sweepmain
from genready.sweep.explore import GRID
from genready.sweep.files import RESULTS_FILE, read_results
from genready.sweep.plan import Plan, Point, Template, load_plan
from genready.sweep.report import collect, decision
from genready.sweep.report import replay as verdict
from genready.sweep.report import schedule as sweepschedule

SCHEDULED: Final = "schedule"  # the depth axis's value in the replay's points
ADAPTIVE_FILE: Final = "speculative-adaptive.json"  # SGLang's config file, in DIR/replay
_OUT: Final = "\0out\0"  # {out} while the drop-in is rewritten: no unit file holds a NUL
_PLAIN: Final = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def words_of(value: str) -> list[tuple[str, str]]:
    """An ExecStart= value's words as systemd splits them (whitespace outside quotes; a word that starts with a
    quote ends at its closing quote), each as (its text as written, the word)."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(value)
    while i < n:
        if value[i].isspace():
            i += 1
            continue
        start = i
        if value[i] in "'\"":
            quote, i, word = value[i], i + 1, []
            while i < n and value[i] != quote:
                if value[i] == "\\" and i + 1 < n:
                    i += 1
                word.append(value[i])
                i += 1
            i += 1
            out.append((value[start:i], "".join(word)))
        else:
            while i < n and not value[i].isspace():
                i += 1
            out.append((value[start:i], value[start:i]))
    return out


def quoted(word: str) -> str:
    """A word as ExecStart= takes it back: plain, single-quoted, or double-quoted with its escapes."""
    if _PLAIN.fullmatch(word):
        return word
    if "'" not in word and "\\" not in word:
        return f"'{word}'"
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def with_schedule(text: str, change: Callable[[list[str]], list[str]]) -> str:
    """Drop-in text whose last ExecStart= with a command has its words changed by `change`: the words it keeps
    keep their spelling (quotes, specifiers, `$VARS`), the new ones are quoted for systemd with their `%`
    doubled. ValueError when there is no such line."""
    lines = text.replace("\\\n", " ").split("\n")  # a continued line is one line to systemd
    at = max((i for i, ln in enumerate(lines) if ln.strip().startswith("ExecStart=")
              and ln.strip().removeprefix("ExecStart=").strip()), default=None)
    if at is None:
        raise ValueError("the drop-in has no ExecStart= with a command to put the schedule into")
    spelled = words_of(lines[at].strip().removeprefix("ExecStart="))
    raw = {w: r for r, w in spelled}
    new = change([w for _, w in spelled])
    lines[at] = "ExecStart=" + " ".join(raw[w] if w in raw else quoted(w).replace("%", "%%") for w in new)
    return "\n".join(lines)


def template_of(text: str) -> Template:
    """Rendered drop-in text back as a template whose one placeholder is {out} (its literal text stays as it is:
    a template's literal `%` is not doubled again)."""
    parts: list[str | tuple[str]] = []
    for i, piece in enumerate(text.split(_OUT)):
        if i:
            parts.append(("out",))
        if piece:
            parts.append(piece)
    return Template(tuple(parts))


def replay_plan(plan: Plan, planned: sweepschedule.Schedule, clients: Sequence[dict[str, Any]], fmt: ScheduleFormat,
                path: str) -> tuple[Plan, str, dict[str, str]]:
    """The replay's plan (module doc), its drop-in as rendered for {out}, and the engine keys it expects.
    ValueError when the plan's drop-in cannot carry the schedule."""
    if plan.dropin is None:
        raise ValueError("the plan has no drop-in: the replay loads the unit with the schedule through one")
    tiers: list[Tier] = planned.tiers()
    deepest = Point(0, tuple({**planned.held, planned.axis: max(d for _, _, d in tiers)}.items()))
    text = plan.dropin_for(deepest, _OUT) or ""
    dropin = with_schedule(text, lambda words: fmt.argv(words, tiers, path))
    expect = {**plan.expect_for(deepest), **fmt.expect(tiers, path)}
    points = tuple(Point(i, tuple({**planned.held, planned.axis: SCHEDULED, **client}.items()))
                   for i, client in enumerate(clients, 1))
    # one configuration, every client setting, each run counted: no search over configurations, no A/A start, no
    # budget; with repeats = "auto" each level gets the most runs a sweep's point could have had
    return (replace(plan, dropin=template_of(dropin), points=points, baseline=None, baseline_every=None, prune=(),
                    search=None, expect=tuple((k, Template((v,))) for k, v in expect.items()), strategy=GRID,
                    start=None, audit=0, noise_check=0, repeats_auto=False, budget=None),
            dropin.replace(_OUT, "{out}"), expect)


def plan_path(results: Path, given: str | None) -> Path:
    """The sweep's plan: --plan, else the one its results lines name."""
    if given:
        return Path(given)
    named = {str(rec["plan"]) for rec in read_results(results / RESULTS_FILE) if isinstance(rec.get("plan"), str)}
    if len(named) != 1:
        raise Failed(f"{results / RESULTS_FILE} names {len(named) or 'no'} plan files"
                     + (f" ({', '.join(sorted(named))})" if named else ""), hint="give the sweep's plan: --plan FILE",
                     status=Exit.BAD_ARGUMENT)
    return Path(named.pop())


def replay_main(args: argparse.Namespace, cfg: Config, base: str) -> int:
    """`genready sweep replay DIR --schedule ENGINE`, called by the CLI with its arguments, the config and the
    daemon's URL."""
    results, engine = Path(args.folder), args.schedule
    try:
        rows = collect.rows_of([results])
    except collect.ReportError as e:
        raise Failed(str(e), status=Exit.BAD_DATA) from None
    try:
        planned = sweepschedule.schedule(rows)
    except sweepschedule.NoSchedule as e:
        raise Failed(f"no schedule to replay: {e}", status=Exit.BAD_ARGUMENT) from None
    if planned.static is not None:
        raise Failed(f"no schedule to replay: {sweepschedule.static_words(planned)}", status=Exit.BAD_ARGUMENT)
    try:
        plan = load_plan(plan_path(results, args.plan))
    except ConfigError as e:
        raise Failed(str(e), hint="give the sweep's plan: --plan FILE", status=Exit.CONFIG) from None
    sets = decision.settings(rows)
    by_load = {sweepschedule.load_of(values): values for values, _ in sets}
    clients = [by_load[lv.load] for lv in planned.levels]
    out = results / verdict.REPLAY_DIR
    fmt = sweepschedule.FORMATS[engine]
    data = fmt.file(planned.tiers())
    path = str((out / ADAPTIVE_FILE).resolve()) if data is not None else ""
    try:
        replayed, dropin, expect = replay_plan(plan, planned, clients, fmt, path)
    except ValueError as e:
        raise Failed(f"cannot replay the schedule: {e}", status=Exit.CONFIG) from None
    ran = {"engine": engine, "axis": planned.axis, "held": planned.held, "tiers": [list(t) for t in planned.tiers()],
           "loads": [lv.load for lv in planned.levels], "plan": str(plan.path), "dropin": dropin, "expect": expect,
           "file": path or None}
    if not args.dry_run:
        try:
            out.mkdir(parents=True, exist_ok=True)
            if data is not None:
                durable.replace(Path(path), (json.dumps(data) + "\n").encode())
            durable.replace(out / verdict.SCHEDULE_FILE, (json.dumps(ran, indent=1) + "\n").encode())
        except OSError as e:
            raise Failed(f"cannot write {out}: {e.strerror or e}", status=Exit.CANNOT_CREATE) from None
    tiers = ", ".join(f"{a}-{b}: {d}" for a, b, d in planned.tiers())
    console.err(f"genready sweep replay: the {engine} schedule ({tiers} by batch size) at {len(clients)} loads, in "
                f"one more load; results in {out}")
    flags = argparse.Namespace(resume=args.resume, dry_run=args.dry_run, keep_config=False, restart_each=False,
                               ignore_strays=args.ignore_strays, no_prune=True, keep_going=False)
    code = sweepmain.run(replayed, out, flags, cfg, base)
    if args.dry_run or code == Exit.INTERRUPTED:
        return code
    try:
        rp = verdict.replay_of(planned, set(sets[0][0]), collect.rows_of([out]), engine, str(out))
    except (collect.ReportError, FileError) as e:
        raise Failed(str(e), status=Exit.BAD_DATA) from None
    console.write("\n" + verdict.text(rp) + verdict.deploy_line(rp, rows, engine) + "\n", sys.stdout)
    return code or (Exit.TIMEOUT if rp.regressed else Exit.OK)
