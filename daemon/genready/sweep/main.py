"""`genready sweep PLAN.toml --results DIR`: reconfigure, restart, verify, confirm, warm, benchmark, record; per point.

A hand-written benchmark loop is where measuring the wrong server happens: a restart that
was not waited for, a result kept although the server changed under it. The sweep runs each
point of a plan with the guarantees of `genready restart` and `genready guard` (run/runner.py,
Sweep._attempt, in this order):

1. GPU strays of an earlier start are waited out (run/strays.py; `stray_wait`), before the load;
2. the point's drop-in is written as a *runtime* drop-in of the target's unit (gone after a
   reboot, like `systemctl edit --runtime`) and the manager reloads over D-Bus (run/dropin.py);
3. the unit restarts over D-Bus, and the sweep waits, with the daemon, for a verified start
   newer than the restart (a start that fails, or crash-loops, is `not_ready` at once); strays
   this restart left are waited out again;
4. the engine's own report of what it runs is compared with its flags and the plan's `expect`
   (run/confirm.py): a point whose engine runs something else is `config_mismatch`, not run;
5. the warmup (not counted) and, with `between_points = "flush"`, the flush of the server's
   prefix cache (run/steps.py `prepare`);
6. the command runs pinned to that verified instance (guard.run_pinned), the GPUs sampled
   (run/gpucost.py) and the server's counters read around it; a speculative server that drafted
   nothing is `no_drafting`;
7. one fsync'd JSON line per attempt goes to DIR/results.jsonl (run/results.py).

Each repeat is another attempt on the same instance (its drop-in and restart skipped); with a
`[search]`, each load step is such a run (run/searchrun.py) and what the search found goes to DIR/search.jsonl. With a
`baseline`, its rounds run among the groups (run/baseline.py); with `prune`, a failed start skips
the larger configurations (run/prune.py); with a `budget` (or --budget), no load starts that is expected to end
past it, and the points left are recorded `skipped` (run/budgetrun.py; --dry-run says the loads and hours expected
from the unit's load history). At the end, main.py writes the summary (the rows the runner ran, through
report/table.py).

Loading a large model takes minutes, so steps 2-3 happen once per *server configuration*:
points whose rendered drop-ins are byte-identical form a group (Plan.groups), and the later
points of a group reuse the group's verified instance if, checked right before their command
(guard.check), it is still that very instance and ready; otherwise that point restarts.
`--restart-each` restarts for every point (for cold-start measurements).

At the end, and on SIGINT/SIGTERM/SIGHUP, the drop-in is removed and the unit restarted on its
own configuration (unless --keep-config); a second signal exits at once, naming what is left.
The drop-in's header names the sweep that wrote it (pid, start, plan, results), so a leftover
of a sweep that was killed can be told from a running sweep's: `genready sweep restore TARGET`
removes it, and a second sweep of the same unit refuses to start while the first is alive.

`run` is the sweep of a plan already read: `genready sweep`'s, and `sweep replay`'s (sweep/replay.py), whose plan
is the sweep's with the schedule in its drop-in, so the replay's every step is the sweep's.
"""

from __future__ import annotations

import argparse
import errno
import shlex
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from genready import console
from genready.client import client
from genready.config import Config, ConfigError, stuck_after
from genready.exitcodes import Exit, Failed
from genready.servers import kinds
from genready.store.bounded import FileError
from genready.sweep.budget import History
from genready.sweep.files import RESULTS_FILE, read_results
from genready.sweep.plan import Plan, Point, Shard, load_plan
from genready.sweep.plankeys import Between
from genready.sweep.report import table as sweepreport
from genready.sweep.run import autorepeat, budgetrun, noisecheck, order
from genready.sweep.run import baseline as sweepbaseline
from genready.sweep.run.dropin import dropin_refused, refused_dropins, restore
from genready.sweep.run.lines import Timings, between_words, loads_line, shown
from genready.sweep.run.prune import Pruner, earlier_failures
from genready.sweep.run.results import (
    LEGACY_WARMUP,
    Results,
    ResultsUnwritable,
    SweepBusy,
    SweepError,
    as_measured,
    changed_points,
    fingerprint,
    first_load,
    ok_runs,
)
from genready.sweep.run.runner import Sweep
from genready.sweep.run.steps import SweepOptions
from genready.sweep.search import expected_steps
from genready.systemd import analyze, bus, control
from genready.systemd.sweepdropin import DROPIN_NAME, describe_owner, owner_alive, owner_of, read_dropin
from genready.timewords import DURATION_WORDS, duration, seconds_of

RERUN_CHANGED = "rerun-changed"  # --resume=rerun-changed: redo the points whose lines another configuration made


def budget_flag(text: str) -> float:
    """--budget's value in seconds; ValueError saying what it expects (as the plan's key, plan.py)."""
    try:
        seconds = seconds_of(text)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise ValueError(f"--budget: expected {DURATION_WORDS}, > 0, found {text!r}")
    return seconds


def check_results_path(results: Path) -> str | None:
    """Why `results` cannot be the results folder's path, or None. Its path is written into drop-ins ({out}),
    where a line break would start a new directive (a `%` is doubled there, as any value's)."""
    bad = next((c for c in str(results) if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        return f"--results: expected a path without control characters or line breaks, found {repr(bad)[1:-1]} in " \
            f"{shown(str(results))!r}"
    return None



def other_lines(results: Path, changed: dict[int, list[str]]) -> str:
    """The words for a results folder that holds lines another configuration made for some of the plan's points."""
    first, keys = next(iter(changed.items()))
    return (f"{results / RESULTS_FILE} holds lines made by another configuration for {len(changed)} of the plan's "
            f"points (point {first}: {', '.join(keys)} differ" + (", and others" if len(changed) > 1 else "") + ")")


def dry_run(plan: Plan, results: Path, unit: str, bus_kind: str, skip: set[int], out: TextIO, *,
            restart_each: bool = False, shard: Shard | None = None,
            check: Callable[[str], list[str]] | None = None, history: History | None = None) -> int:
    """Print what the sweep would do, in the order it would do it; touch nothing. With `check`, each drop-in
    is checked as systemd would read it: 78 if systemd would not take one as written, else 0. With `history` (the
    unit's loads, budget.py), the expected loads and hours, and whether the plan's budget fits."""
    def w(text: str) -> None:
        console.write(text, out)  # `--dry-run | head` is not an error

    where = ("/run/systemd/system" if bus_kind == "system" else "$XDG_RUNTIME_DIR/systemd/user") + \
        f"/{unit}.d/{DROPIN_NAME}"
    width = len(str(len(plan.points)))
    groups = noisecheck.schedule(plan, sweepbaseline.schedule(plan, shard.take(plan.groups()) if shard
                                                              else plan.groups()))
    total = max([len(plan.points), *(p.index for g in groups for p in g)])  # baseline runs are numbered past the plan
    todo = [[p for p in g if p.index not in skip] for g in groups]
    todo = [g for g in todo if g]
    refused = refused_dropins(plan, [p for g in todo for p in g], results, check)[1] if check else {}
    w(f"# {loads_line(sum(map(len, todo)), todo, restart_each)}"
      + (f" (shard {shard}: {sum(map(len, groups))} of the plan's {len(plan.points)} points)" if shard else "")
      + f"; {len(skip)} already ok in {results / RESULTS_FILE}; drop-in: {where}\n")
    w(f"# {between_words(plan)}\n")
    if history is not None:
        for line in budgetrun.estimate_lines(estimate_timings(plan, todo, restart_each, history), history,
                                             plan.budget):
            w(f"# {line}\n")
    if words := order.dry_run_words(plan):
        w(f"# {words}\n")
    if plan.prune:
        w(f"# prune = {list(plan.prune)}: smaller values first; a start that fails skips every configuration at least "
          "as large on them (--no-prune loads them)\n")
    if plan.between_points is Between.FLUSH:
        # Said once, before anything runs: which routes a flush needs, and what a server without them gets.
        w(f"# a flush needs one of: {kinds.FLUSH_NEEDS}. A server without one runs its reused points warm "
          f"(cache=warm): {kinds.FIX}\n")
    for n, group in enumerate(groups, 1):
        w(f"\n## server configuration {n}" + (f", the baseline (round {group[0].baseline})" if group[0].baseline
                                               else f", the A/A start (load {group[0].aa})" if group[0].aa
                                               else "") + f": points {', '.join(str(p.index) for p in group)}\n")
        for i, p in enumerate(group):
            folder = results / p.slug(width) / "attempt-N"
            how = "restart" if restart_each or i == 0 else "reuse the verified instance, if still ready"
            w(f"\n[{p.index}/{total}] {shown(p.label)}" + (
                "  (ok earlier: skipped with --resume)" if p.index in skip else f"  ({how})") + "\n")
            text = plan.dropin_for(p, str(folder))
            if text is not None and (i == 0 or "out" in (plan.dropin.names if plan.dropin else [])):
                w("  drop-in:\n" + "".join(f"    {shown(ln)}\n" for ln in text.removesuffix("\n").split("\n")))
            if p in refused:
                w("  systemd would not take this drop-in as written:\n"
                  + "".join(f"    {shown(ln)}\n" for ln in refused[p]))
            w(f"  command: {shown(shlex.join(plan.command_for(p, str(folder))))}\n")
    if refused:
        first, said = next(iter(refused.items()))
        console.err(f"genready sweep: {dropin_refused(plan, first, said)}" + (
            f" (and {len(refused) - 1} more drop-ins)" if len(refused) > 1 else ""))
        return Exit.CONFIG
    return 0


def estimate_timings(plan: Plan, todo: list[list[Point]], restart_each: bool, history: History) -> Timings:
    """The ETA's Timings for the points to run, before any of them runs: a load planned at each group's first (every
    point with --restart-each), the expected load and run from the unit's history."""
    timings = Timings(repeats=plan.repeats, every_run_loads=restart_each,
                      steps=expected_steps(plan.search) if plan.search else 1,
                      schedule=[(p, restart_each or i == 0) for g in todo for i, p in enumerate(g)])
    budgetrun.seeded(timings, history)
    return timings


def dry_run_check(plan: Plan, unit: str, bus_kind: str) -> Callable[[str], list[str]] | None:
    """The drop-in check for --dry-run (it only reads the unit's files), or None, saying why, if it cannot run."""
    if plan.dropin is None:
        return None
    sd = None
    try:
        sd = control.UnitClient(bus_kind, unit)
        state = sd.state()
        dropin = sd.dropin_path(unit, DROPIN_NAME)
        return analyze.DropinCheck(unit, state.fragment_path, dropin, user=bus_kind == "user").complaints
    except Exception as e:  # no manager to ask (D-Bus), no systemd-analyze: the dry run goes on unchecked
        console.err(f"genready sweep: not checking the drop-ins with systemd-analyze verify: {bus.dbus_words(e)}")
        return None
    finally:
        if sd is not None:
            sd.close()


def main(args: argparse.Namespace, cfg: Config, base: str) -> int:
    """`genready sweep`, called by the CLI with the parsed arguments, the config and the daemon's URL."""
    shard = None
    if args.shard is not None:
        try:
            shard = Shard.parse(args.shard)
        except ValueError as e:
            raise Failed(str(e), status=Exit.BAD_ARGUMENT) from None
    try:
        plan = load_plan(Path(args.plan))
    except ConfigError as e:
        raise Failed(str(e), hint="see `genready sweep --help` and docs/sweeps.md",
                     status=Exit.CONFIG) from None
    if getattr(args, "budget", None) is not None:
        try:
            plan = replace(plan, budget=budget_flag(args.budget))
        except ValueError as e:
            raise Failed(str(e), status=Exit.BAD_ARGUMENT) from None
    if shard is not None and plan.strategy != "grid":
        raise Failed(f'--shard: a plan of strategy = "grid" (a search\'s next load depends on the last; {plan.path} '
                     f"has strategy = {plan.strategy!r})", status=Exit.BAD_ARGUMENT)
    return run(plan, Path(args.results), args, cfg, base, shard)


def run(plan: Plan, results: Path, args: argparse.Namespace, cfg: Config, base: str, shard: Shard | None = None
        ) -> int:
    """A plan's sweep into `results`, by the flags in `args` (resume, dry_run, keep_config, restart_each,
    no_prune, keep_going, ignore_strays): `genready sweep`'s, and `sweep replay`'s plan of one more load."""
    target = cfg.only_target(plan.target)
    if target is None:
        raise Failed(f"the plan names no target and {cfg.path} has several: {', '.join(cfg.targets)}",
                     status=Exit.CONFIG)
    if target not in cfg.targets:
        raise Failed(f"{plan.path}: target: expected one of {', '.join(cfg.targets)}, found {target!r}",
                     status=Exit.CONFIG)
    tcfg = cfg.targets[target]
    why = check_results_path(results)
    if why:
        raise Failed(why, status=Exit.BAD_ARGUMENT)
    restart_each = args.restart_each or plan.between_points is Between.RESTART
    measured = as_measured(plan, results, lambda pl, p: fingerprint(pl, p, target, tcfg.unit,
                                                                     restart_each=restart_each))
    if measured is not plan:
        plan = measured
        console.err(f"genready sweep: the plan sets no warmup and {results / RESULTS_FILE} was measured with the "
                    f"old default, warmup = {LEGACY_WARMUP}: its points get the same, so the folder stays comparable "
                    f'(set warmup = "stable" and --resume={RERUN_CHANGED} to measure it anew)')
    fingerprints = {p.index: fingerprint(plan, p, target, tcfg.unit, restart_each=restart_each) for p in plan.points}
    changed = changed_points(plan, results, fingerprints)
    if changed and args.resume != RERUN_CHANGED:
        raise Failed(other_lines(results, changed), hint=f"write to a new folder (--results NEW), or redo those points "
                     f"and keep the rest (--resume={RERUN_CHANGED})", status=Exit.CONFIG)
    # a search's points resume step by step (searchrun.py reads their lines): none is skipped whole
    done = ok_runs(plan, results, fingerprints) if args.resume and plan.search is None else {}
    skip = {i for i, recs in done.items()  # repeats = "auto": those whose last line stopped them, too
            if len(first_load(recs)) == plan.repeats or (plan.repeats_auto and autorepeat.finished(first_load(recs)))}
    if args.dry_run:
        return dry_run(plan, results, tcfg.unit, cfg.daemon.bus, skip, sys.stdout, restart_each=restart_each,
                       shard=shard, check=dry_run_check(plan, tcfg.unit, cfg.daemon.bus),
                       history=budgetrun.read_history(base, target, results))
    try:
        code, _ = client.request(base, f"/ready/{target}")
    except client.Unreachable as e:
        client.unreachable(base, e)
    if code == 404:
        raise Failed(f"the daemon at {base} has no target {target!r}", hint="is it running with this config?",
                     status=Exit.USAGE)
    sweep = Sweep(SweepOptions(plan, base, target, tcfg.unit, cfg.daemon.bus,
                               plan.timeout or stuck_after(tcfg.load_timeout, None), results,
                               keep_config=args.keep_config, restart_each=args.restart_each, shard=shard,
                               secrets=(tcfg.api_key,), server=tcfg, ignore_strays=args.ignore_strays),
                  results=Results(done),
                  pruner=pruner(plan, args, results, fingerprints))
    pruned = sweep.pruner.earlier | {p.index for p in plan.points if sweep.pruner.pruned_by(p)}
    todo = [[p for p in g if p.index not in skip | pruned] for g in sweep.groups]
    todo = [g for g in todo if g]
    say = sweep.console.say
    if plan.budget is not None and sweep.guard is not None:  # the history until this sweep times its own
        budgetrun.seeded(sweep.timings, hist := budgetrun.read_history(base, target, results))
        sweep.guard.scale = hist.scale
        say(f"budget {duration(plan.budget)}: no load starts that is expected to end past it, with its runs; "
            f"{hist.words()}")
    say(loads_line(sum(map(len, todo)), todo, restart_each) + (f" (shard {shard})" if shard else "") +
        f"; {between_words(plan)}")
    if words := order.dry_run_words(plan):
        say(words.replace("the listing below is the grid; ", ""))
    if changed:
        say(f"--resume={RERUN_CHANGED}: {other_lines(results, changed)}; those points run again")
    if skip:
        say(f"--resume: {len(skip)} of {len(plan.points)} points already ok in {results / RESULTS_FILE}")
    partial = sum(1 for i, recs in done.items() if i not in skip and first_load(recs))
    if partial:
        say(f"--resume: {partial} points have some of their {plan.repeats} repeats ok; only the missing ones run")
    if sweep.pruner.axes:
        say(f"prune = {list(plan.prune)}: smaller values first; a start that fails skips every configuration at "
            "least as large on them (--no-prune loads them)")
    if sweep.pruner.earlier:
        say(f"--resume: {len(sweep.pruner.earlier)} points whose start failed in {results / RESULTS_FILE} are not "
            f"loaded again, nor the configurations they prune (--no-prune loads them)")
    try:
        code = sweep.run(skip)
    except ConfigError as e:  # a drop-in systemd would not take as written, found before anything changed
        raise Failed(str(e), hint="see `genready sweep --help` and docs/sweeps.md",
                     status=Exit.CONFIG) from None
    except ResultsUnwritable as e:
        raise Failed(str(e), hint="make room, or fix the folder, then run again with --resume: the points already "
                     "ok are kept", status=Exit.CANNOT_CREATE) from None
    except SweepBusy as e:
        raise Failed(str(e), hint="wait for it, or stop it (it restores the unit); if it hangs, kill it, then "
                     f"`genready sweep restore {target}`", status=Exit.TEMPFAIL) from None
    except (SweepError, control.NotOnUnitPath) as e:
        raise Failed(str(e), status=Exit.TIMEOUT) from None
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise Failed(f"{e}", hint="a system unit's runtime drop-in needs root", status=Exit.TIMEOUT) from None
        raise
    console.write(sweepreport.summary(sweep.summary_rows()) + sweep.tally(), sweep.out)  # the run's own report
    return code


def pruner(plan: Plan, args: argparse.Namespace, results: Path, fingerprints: dict[int, Any]) -> Pruner:
    """prune.py's state for this sweep: the plan's prune axes unless --no-prune, its max_failed_starts unless
    --keep-going, and with --resume the failed starts of earlier runs (by the configuration the plan has now)."""
    axes = () if getattr(args, "no_prune", False) else plan.prune
    p = Pruner(axes, plan.server_axes, None if getattr(args, "keep_going", False) else plan.max_failed_starts)
    if args.resume and axes:
        by_index = {pt.index: pt for pt in plan.points}
        for i, result in earlier_failures(plan.points, read_results(results / RESULTS_FILE), fingerprints).items():
            p.add(by_index[i], result)
            p.earlier.add(i)
    return p


def restore_main(target: str | None, cfg: Config, base: str, timeout: float | None) -> int:
    """`genready sweep restore TARGET`: put the unit back on its own configuration after a killed sweep."""
    target = cfg.only_target(target)
    if target is None or target not in cfg.targets:
        raise Failed(f"name the target to restore; configured: {', '.join(cfg.targets)}", status=Exit.USAGE)
    unit = cfg.targets[target].unit

    def say(text: str) -> None:
        console.err(f"genready sweep restore: {text}")

    sd = control.UnitClient(cfg.daemon.bus, unit)
    try:
        dropin = sd.dropin_path(unit, DROPIN_NAME)
        try:
            owner = owner_of(read_dropin(dropin))
        except FileError:
            owner = None  # not one a sweep wrote as it is: removed like an unnamed one
        except FileNotFoundError:
            say(f"{unit} has no sweep drop-in ({dropin}); nothing to restore")
            return Exit.OK
        if owner is not None and owner_alive(owner):
            raise Failed(f"{dropin} belongs to a running {describe_owner(owner)}; it restores {unit} when it ends",
                         hint=f"stop it (kill -TERM {owner['pid']}) instead", status=Exit.TEMPFAIL)
        say(f"{dropin} was left by " + (f"{describe_owner(owner)}, gone" if owner else "an earlier sweep"))
        ok = restore(sd, base, target, timeout or stuck_after(cfg.targets[target].load_timeout, None), say)
    except Failed:
        raise
    except (SweepError, control.NotOnUnitPath) as e:
        raise Failed(str(e), status=Exit.TIMEOUT) from None
    except Exception as e:  # D-Bus: permission, no such unit
        raise Failed(f"could not restore {unit} on the {cfg.daemon.bus} bus: {e}",
                     hint="a system unit needs root (its runtime drop-in, its restart)", status=Exit.TIMEOUT) from None
    finally:
        sd.close()
    return Exit.OK if ok else Exit.TIMEOUT
