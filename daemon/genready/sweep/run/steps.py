"""An attempt's steps, each a function that takes values and returns one (runner.Sweep._attempt calls them in
order, with strays.wait_out before a load and after it, and confirm's verdict after `Verified`):

    reconfigure -> start        -> Verified | NotReady     (a fresh start of the point's configuration)
    reuse                       -> Verified | None         (the group's instance, if still that one and ready)
    stale(Verified)             -> Ran | None              (refused: the unit was reloaded since it started)
    prepare(Verified)           -> (Cache, Warmed)         (the warmup, then the flush)
    run_command(Verified, ...)  -> Ran                     (the command, pinned to that instance; GPU cost, counters)

The command, the warmup and the flush take a `Verified`, and only a 200 of the daemon's /ready for
a start newer than the restart makes one (`Verified.of`): a start that timed out, failed, was
refused or was interrupted is a `NotReady`, and there is nothing to run it against (issue 41 #0).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from genready.client import GUARD_STOP_GRACE, guard, waiting
from genready.client.progress import target_line
from genready.config import TargetConfig
from genready.servers import kinds
from genready.servers.metricspage import NotMetrics, Reading
from genready.store.bounded import FileError
from genready.sweep.files import bench_line, category_figures
from genready.sweep.plan import Plan, Point, Shard
from genready.sweep.plankeys import Between
from genready.sweep.run import gpucost
from genready.sweep.run.dropin import POLL, DropinLife
from genready.sweep.run.lines import Console, Timings
from genready.sweep.run.results import Cache, Status, SweepError, json_text, writing
from genready.systemd import bus
from genready.systemd.unitlog import OutputMark
from genready.timewords import duration, iso
from genready.tools import benchline, convergence, servercache, servermetrics
from genready.tools.benchfigures import failures_text

# The grace an interrupted command gets between SIGINT, SIGTERM and SIGKILL: guard's, one definition.
STOP_GRACE: Final = GUARD_STOP_GRACE
STOP_LADDER: Final = (signal.SIGTERM, signal.SIGKILL)  # after the SIGINT, one STOP_GRACE apart
LOADING_EVERY: Final = 30.0  # seconds between "loading" lines when stderr is not a terminal


@dataclass(frozen=True)
class SweepOptions:
    """What `genready sweep` was asked to do: the plan, the target and its unit, where the results
    go, and the flags."""

    plan: Plan
    base: str  # the daemon's URL
    target: str
    unit: str
    bus_kind: str
    timeout: float  # seconds a point's start may take to be verified
    results: Path
    keep_config: bool = False
    restart_each: bool = False
    shard: Shard | None = None
    secrets: tuple[str, ...] = ()  # the target's own API key: masked in the unit's lines we keep
    server: TargetConfig | None = None  # the target: how the warmup, the flush and /metrics reach its server
    ignore_strays: bool = False  # --ignore-strays: load and run next to GPU strays (sweep/run/strays.py)

    @property
    def every_run_restarts(self) -> bool:
        """--restart-each, or between_points = "restart": no instance is reused."""
        return self.restart_each or self.plan.between_points is Between.RESTART


class Interrupted(Exception):
    """A SIGINT or SIGTERM arrived: stop this point, clean up, exit."""


class RestartRefused(Exception):
    """systemd refused to restart the unit on this point's configuration (its words)."""


class Signals:
    """The stop signals the sweep got, and the command's process group they reach."""

    def __init__(self) -> None:
        self.count = 0
        self.cleaning = False  # the cleanup runs to its end: a first signal no longer interrupts
        self.group: guard.ProcessGroup | None = None  # the running command's

    def stop_command(self) -> None:
        """The command's group gets SIGINT now, then SIGTERM and SIGKILL STOP_GRACE apart (guard's ladder)."""
        if self.group is not None:
            self.group.stop(signal.SIGINT, then=STOP_LADDER)

    def check(self) -> None:
        if self.count and not self.cleaning:
            raise Interrupted()


@dataclass(frozen=True)
class Ctx:
    """What every step reads: the options, where it speaks, the unit's drop-in, the timings, the signals,
    and the server's own HTTP (warmup, flush, /metrics)."""

    opts: SweepOptions
    console: Console
    life: DropinLife
    timings: Timings
    signals: Signals
    http: servercache.ServerHttp | None
    started: float  # when the sweep began (the drop-in's header)


@dataclass(frozen=True)
class Verified:
    """An instance the daemon verified: its /ready 200 answer (unit, pid, invocation_id, ready_since...).
    The only thing a point's warmup, flush and command run against."""

    pinned: Mapping[str, Any]
    restarted: bool  # False: the group's instance, reused
    started_at: float  # when its restart was asked, or its reuse began
    mark: OutputMark | None = None  # where the unit's output stood before its start (its engine's args line)

    @classmethod
    def of(cls, body: object, *, restarted: bool, started_at: float) -> Verified | None:
        """The instance a daemon's 200 names, or None if it names none (no pid, unit or invocation)."""
        if not isinstance(body, dict) or not {"unit", "pid", "invocation_id"} <= body.keys() \
                or isinstance(body["pid"], bool) or not isinstance(body["pid"], int):
            return None
        return cls(dict(body), restarted, started_at)

    @property
    def pid(self) -> int:
        return int(self.pinned["pid"])

    @property
    def invocation_id(self) -> str:
        return str(self.pinned["invocation_id"])

    @property
    def load_seconds(self) -> float | None:
        v = self.pinned.get("load_seconds")
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class NotReady:
    """No verified instance for this attempt, and why; `stop`: the sweep cannot go on (after recording it)."""

    reason: str
    started_at: float
    unit_result: str | None = None
    journal: tuple[str, ...] = ()
    retry: bool = True  # False: another attempt would meet the same refusal
    invocation_id: str | None = None
    waited_seconds: float | None = None
    stop: str = ""


@dataclass(frozen=True)
class Ran:
    """How a point's command ended on its verified instance."""

    status: Status
    reason: str
    ended_at: float
    cache: Cache
    exit_code: int | None = None
    ran_at: float | None = None
    counters: servermetrics.RunCounters | None = None
    warmed: Warmed | None = None  # None: no warmup ran (the command was refused first)
    gpu: dict[str, Any] | None = None  # the run's GPU cost (sweep/run/gpucost.py): results-line fields
    categories: dict[str, dict[str, float]] | None = None  # its bench line's figures per prompt category


# --- getting a verified instance ---------------------------------------------------------------------


def reconfigure(ctx: Ctx, point: Point, folder: Path) -> NotReady | None:
    """Write and load the point's drop-in; NotReady (not retried) if systemd would not take it as written:
    the unit is not touched then."""
    o = ctx.opts
    text = o.plan.dropin_for(point, str(folder))
    if text is None:
        return None
    with writing(o.results):
        (folder / "dropin.conf").write_text(text)
    if complaints := ctx.life.complaints(text):
        return NotReady(f"systemd would not take the drop-in as written: {complaints[0]}", time.time(),
                        journal=tuple(complaints), retry=False)
    ctx.life.write(text, plan=o.plan.path, results=o.results, started=iso(ctx.started) or "", bus_kind=o.bus_kind)
    return None


def reuse(ctx: Ctx, point: Point, instance: Verified, folder: Path) -> Verified | None:
    """The group's verified instance, if it is still that very instance and ready (as guard checks)."""
    o = ctx.opts
    if why := guard.check(o.base, o.target, instance.pinned):
        ctx.console.progress(point, f"the instance of this configuration is no longer usable ({why}); restarting")
        return None
    text = o.plan.dropin_for(point, str(folder))
    if text is not None:
        with writing(o.results):
            (folder / "dropin.conf").write_text(text)  # the same configuration, kept with the results
    return Verified(instance.pinned, restarted=False, started_at=time.time())


def start(ctx: Ctx, point: Point) -> Verified | NotReady:
    """Restart, then wait for a verified start newer than the restart (waiting.restart_and_wait, as
    `genready restart`). Meanwhile only the daemon is asked: its 503 says when such a start ended before
    it was verified, and a crash loop (systemd restarting the unit itself) is no load to measure either."""
    o, sd, say = ctx.opts, ctx.life.sd, ctx.console
    before = sd.state()
    mark = OutputMark.take(before.fragment_path, before.dropin_paths)
    started = [time.time()]
    last_line, last_state = time.monotonic(), ""

    def restart() -> None:
        started[0] = time.time()
        try:
            sd.restart()
        except Exception as e:
            if bus.denied(e):
                raise SweepError(f"could not restart {o.unit} on the {o.bus_kind} bus: {bus.dbus_words(e)} "
                                 "(restarting a system unit needs root or a polkit rule)") from None
            raise RestartRefused(bus.dbus_words(e)) from None
        say.progress(point, f"restarting {o.unit}{ctx.timings.eta(point, loading=True)}")

    def tick(code: int, body: Any) -> None:
        nonlocal last_line, last_state
        ctx.signals.check()
        body = body if isinstance(body, dict) else {}
        expected = body.get("expected_load_seconds")
        if isinstance(expected, int | float) and not isinstance(expected, bool):
            ctx.timings.expected_load = float(expected)
        now_state = str(body.get("state", ""))
        # a line every LOADING_EVERY seconds off a terminal, and at each change of state
        if time.monotonic() - last_line < (1.0 if say.tty else LOADING_EVERY) and now_state == last_state:
            return
        last_line, last_state = time.monotonic(), now_state
        loading = f"loading for {duration(time.time() - started[0])}"
        if now_state == "ready":
            # A 503 of /ready?since=: the instance the daemon has verified is older than the restart.
            text = f"waiting for the restarted instance (pid {body.get('pid')} is the one before); {loading}"
        elif now_state:
            text = target_line(body)  # the daemon's own account: state, pid, time loading, last probe
        else:
            last = f" (last load {duration(ctx.timings.last_load)})" if ctx.timings.last_load else ""
            text = f"{body.get('reason')}; {loading}{last}"
        say.progress(point, f"{text}{ctx.timings.eta(point, loading=True)}", transient=True)

    try:
        out = waiting.restart_and_wait(restart, o.base, o.target, o.timeout, on_failure=waiting.OnFailure.ANY,
                                       poll=POLL, tick=tick)
    except RestartRefused as e:
        # systemd refused this configuration (a drop-in it cannot load, such as an empty ExecStart=):
        # the point's doing, not the sweep's. Another attempt would be refused the same way.
        return NotReady(f"systemd refused to restart {o.unit}: {e}", started[0], sd.state().result,
                        (str(e),), retry=False)
    body = out.body if isinstance(out.body, dict) else {}
    if out.ready:
        v = Verified.of(body, restarted=True, started_at=started[0])
        if v is not None:
            ctx.timings.loaded(time.time() - started[0])
            return replace(v, mark=mark)
        return NotReady(f"genready answered ready without naming the instance: {str(body)[:200]}", started[0])
    if out.code in (400, 404):
        why = f"the daemon refused: {body.get('error')} (is it running with this config?)"
        return NotReady(why, started[0], stop=why)
    waited = time.time() - started[0]
    failed = out.failed
    if failed is not None:
        how = waiting.failure_lines(failed)[0]
        # The daemon's lines, once it has read them; else the sweep's own mark of the output files.
        journal = list(failed.get("journal") or []) or mark.lines(o.bus_kind, o.unit, secrets=o.secrets)
        return NotReady(f"{o.unit} failed and systemd restarted it ({how})" if failed.get("restarting") else
                        f"{o.unit} failed to start ({how})", started[0], failed.get("result"), tuple(journal),
                        invocation_id=failed.get("invocation_id"), waited_seconds=waited)
    detail = body.get("reason") or body.get("last_error")
    state = sd.state()
    loading = f"pid {state.main_pid} still loading after {duration(waited)}" if state.main_pid else \
        f"no process after {duration(waited)}"
    return NotReady(f"no verified start within {o.timeout:g}s ({loading}" + (f"; {detail})" if detail else ")"),
                    started[0], state.result, tuple(mark.lines(o.bus_kind, o.unit, secrets=o.secrets)),
                    invocation_id=state.invocation_id or None, waited_seconds=waited)


# --- on a verified instance ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Warmed:
    """What a run's warmup came to: requests sent, and (warmup = "stable") whether they settled."""

    requests: int | None = None  # None: no warmup could run (no server to send it to)
    converged: bool | None = None  # None: a fixed count, nothing to converge


def warm(ctx: Ctx, point: Point) -> Warmed:
    """The warmup before a run: the plan's fixed count of probes, or (warmup = "stable") streamed requests in
    windows until the median TTFT and ITL settle (convergence.py), said on the point's line either way."""
    plan, http, say = ctx.opts.plan, ctx.http, ctx.console
    if http is None:
        return Warmed()
    if not plan.stable:
        n = int(plan.warmup)
        if n:
            ok, why = servercache.warm_up(http, n)
            say.progress(point, f"warmup: {ok} of {n} requests answered" + (f" ({why})" if why else ""))
        return Warmed(n)
    rule = convergence.Rule(plan.warmup_window, plan.warmup_tolerance, plan.warmup_max, plan.warmup_max_seconds)
    v, why = servercache.warm_until_stable(http, rule)
    say.progress(point, f"warmup: {convergence.words(v, rule)}" + (f" (first failure: {why})" if why else ""))
    return Warmed(v.requests, v.converged)


def prepare(ctx: Ctx, point: Point, v: Verified) -> tuple[Cache, Warmed]:
    """Before the command: the warmup (not counted), then, with between_points = "flush", the flush, so the
    warmup's prompts are gone too. What the run starts on, and what the warmup came to."""
    plan, http, say = ctx.opts.plan, ctx.http, ctx.console
    cache = Cache.COLD_START if v.restarted else Cache.WARM
    if http is None:
        return cache, Warmed()
    warmed = warm(ctx, point)
    if plan.between_points is not Between.FLUSH or (v.restarted and not warmed.requests):
        return cache, warmed  # a fresh start with no warmup has nothing to flush
    done = servercache.flush(http)
    if done.ok:
        say.progress(point, f"prefix cache flushed ({done.route})")
        return (cache if v.restarted else Cache.FLUSHED), warmed
    say.once("flush", f"cannot flush the server's prefix cache: {done.why}; its reused points run warm "
             f"(marked cache=warm): {kinds.FIX}")
    return cache, warmed


def stale(ctx: Ctx, point: Point, v: Verified) -> Ran | None:
    """The Ran of a command not run because `v`'s unit was edited and reloaded since it started (its results
    would be filed under settings it does not run); None when it may run."""
    if why := guard.stale_config(ctx.opts.target, v.pinned):
        ctx.console.progress(point, f"not running the command: {why}")
        return Ran(Status.NOT_READY, why, time.time(), Cache.COLD_START if v.restarted else Cache.WARM)
    return None


def run_command(ctx: Ctx, point: Point, v: Verified, folder: Path, cache: Cache, warmed: Warmed,
                search_args: Sequence[str] | None = None) -> Ran:
    """The point's command pinned to `v` (guard.run_pinned) on the cache `prepare` left (`cache`, `warmed`), a
    search step's `search_args` in its word {search}; its GPU cost and the server's counters over the run.
    Interrupted if the sweep was signalled meanwhile."""
    o, say = ctx.opts, ctx.console
    cmd = o.plan.command_for(point, str(folder), search_args)
    env = dict(os.environ, **guard.guard_env(o.target, v.pinned),
               GENREADY_SWEEP_POINT=json.dumps(point.as_dict()), GENREADY_SWEEP_OUT=str(folder))
    how = "started" if v.restarted else "reused"
    say.progress(point, f"ready pid {v.pid} ({how}, loaded in {v.load_seconds}s)"
                 f"{ctx.timings.eta(point, loading=False)}; running {shlex.join(cmd)[:120]}")
    before = read_counters(ctx)
    ran_at = time.time()
    with contextlib.ExitStack() as files:
        with writing(o.results):
            so = files.enter_context((folder / "stdout.log").open("wb"))
            se = files.enter_context((folder / "stderr.log").open("wb"))
        try:
            # Its own session: a Ctrl-C reaches the sweep, which stops the command once, on purpose.
            child = subprocess.Popen(cmd, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        except OSError as e:
            return Ran(Status.FAILED, f"cannot run {cmd[0]}: {e.strerror}", time.time(), cache, 127, ran_at,
                       warmed=warmed)
        # guard's runner: when the command exits, what it left in its group is ended before the next point.
        group = ctx.signals.group = guard.ProcessGroup(child, STOP_GRACE)
        try:
            if ctx.signals.count:
                ctx.signals.stop_command()  # a signal came before the group existed
            with gpucost.sampled(say.say, folder, o.results) as cost:  # each second, on a thread of its own
                res = guard.run_pinned(o.base, o.target, v.pinned, child, wait=group.wait)
        finally:
            ctx.signals.group = None
    if group.left_behind:
        say.progress(point, f"{cmd[0]} exited leaving {group.left_behind} process(es) in its process group; "
                     "they were ended (SIGTERM, then SIGKILL)")
    ended = time.time()
    counters = None
    if before is not None and not ctx.signals.count and (after := read_counters(ctx)) is not None:
        counters = servermetrics.over_run(before.values, after.values, cumulative=after.cumulative)
        save_counters(ctx, point, folder, counters)
    if ctx.signals.count:
        raise Interrupted()
    gpu = cost.figures or None
    if res.problem:
        return Ran(Status.INVALIDATED, res.problem, ended, cache, res.returncode, ran_at, counters, warmed, gpu)
    if res.returncode != 0:
        why = bench_failures(folder)
        return Ran(Status.FAILED, f"the command exited {res.returncode}" + (f" ({why})" if why else ""), ended, cache,
                   res.returncode, ran_at, counters, warmed, gpu)
    ctx.timings.run_times.append(ended - ran_at)
    return Ran(Status.OK, "", ended, cache, 0, ran_at, counters, warmed, gpu, bench_categories(folder))


def bench_failures(folder: Path) -> str:
    """The run's failed requests from its {out}/bench.jsonl in a few words, the server's own where it gave them
    (`3x HTTP 400: request (1163 tokens) exceeds the available context size`); "" without a bench line."""
    try:
        line = bench_line(folder) or {}
    except FileError:
        return ""
    errors, words = line.get(benchline.ERRORS.key), line.get(benchline.ERROR_WORDS.key)
    if not isinstance(errors, dict):
        return ""
    # the line is whatever the plan's command wrote: counts that are counts, kinds cut as the answers are
    counts = {str(e)[:80]: n for e, n in errors.items() if isinstance(n, int) and not isinstance(n, bool)}
    said = {str(e)[:80]: w for e, w in words.items() if isinstance(w, str)} if isinstance(words, dict) else {}
    return failures_text(counts, said)


def bench_categories(folder: Path) -> dict[str, dict[str, float]] | None:
    """The run's figures per prompt category from its {out}/bench.jsonl, for its results line (issue 37 §2: the
    bench line, the results and the report carry them); None without them. An unreadable bench line is the
    report's to name."""
    try:
        return category_figures((bench_line(folder) or {}).get(benchline.CATEGORIES.key)) or None
    except FileError:
        return None


def read_counters(ctx: Ctx) -> Reading | None:
    """The server's counters now, by the kinds' counter pages; None (said once) when it has no readable one."""
    if ctx.http is None:
        return None
    why = ""
    # The target's `kind` key names its page and its reader; with "auto", every kind's page in turn.
    kind = kinds.BY_NAME.get(ctx.opts.server.kind) if ctx.opts.server else None
    for route in kinds.metrics_routes(kind):
        status, body = ctx.http.get(route)
        why = f"GET {route} answered {status}" if status else body.decode("utf-8", "replace")[:200]
        if status == 200:
            try:
                return kinds.read_metrics(kind, route, body)
            except NotMetrics as e:
                why = str(e)
    needs = "; ".join(k.metrics_needs for k in kinds.KINDS if k.metrics_needs)
    ctx.console.once("metrics", f"no server counters per run: the server's counter page cannot be read ({why}; "
                     f"{needs})")
    return None


def save_counters(ctx: Ctx, point: Point, folder: Path, run: servermetrics.RunCounters) -> None:
    with writing(ctx.opts.results):
        (folder / servermetrics.METRICS_FILE).write_text(json_text(run.to_json(), indent=1) + "\n")
    if run.reset:
        ctx.console.progress(point, f"the server's counters went down during the run ({', '.join(run.reset[:3])}): "
                             "it restarted; no server figures for this run")
