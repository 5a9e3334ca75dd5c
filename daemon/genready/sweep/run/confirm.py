"""The sweep's confirm step: the engine says what it runs, and a point whose engine runs something else is
not measured (issue 38 §2).

After a start is verified and before its run, the target's kind (probe/serverkind.py: its `kind` key, else
the command line of the process that serves it, else ExecStart=) says whose report to read; that kind's own
report of its configuration is read once per loaded instance (servers/engineconfig.py: routes, the vLLM
start's args line, /metrics *_info) and compared, for each point run on it, with the flags the server got
(its process's command line: systemd's `$VARS` expanded, behind any wrapper that execs; else the unit's
ExecStart= words expanded with its environment) and with the plan's `expect` rendered for the point. The
runner asks it between the start and the warmup (`confirm`, its verdict `refused`) and after the run
(`after_run`):

- a value the engine reports otherwise: the point is `config_mismatch`, not run, not retried;
- a flag the engine does not report: a warning line, and the point runs;
- an `expect` that cannot be checked (no kind genready can ask, or none of its sources answered):
  `config_mismatch` with that reason, never ok;
- after the run, a speculative engine whose counters show no draft token: `no_drafting`.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from genready.config import AUTO
from genready.probe import serverkind
from genready.redact import escape, redact
from genready.servers import engineconfig as ec
from genready.servers import kinds
from genready.sweep.plan import Point
from genready.sweep.run.results import Cache, Status
from genready.sweep.run.steps import Ctx, Ran, Verified
from genready.systemd import unitexec
from genready.tools import servercache, servermetrics


@dataclass(frozen=True)
class Engine:
    """What one loaded instance's engine said it runs, and what its command line's flags set; or, `unasked`
    set, why it could not be asked at all."""

    kind: kinds.ServerKind | None
    read: ec.EngineRead | None
    want: Mapping[str, tuple[str, str]]  # key -> (flag, value), from the command line the server got
    got: ec.EngineConfig
    unasked: str = ""  # why the engine could not be asked ("" when it was)

    @property
    def unchecked(self) -> str:
        """Why nothing the engine says can be checked ("" when something can): not asked, or no source answered."""
        if self.unasked:
            return self.unasked
        if not self.got.sources:
            label = self.kind.label if self.kind else "the engine"
            return f"{label} answered none of its sources ({'; '.join(self.got.problems) or 'none'})"
        return ""


@dataclass(frozen=True)
class Checked:
    """One point's comparison: what was read, how it compares, and the sweep's decision on it."""

    engine: Engine
    conf: ec.Confirmation
    verdict: ec.Verdict

    def records(self) -> dict[str, Any]:
        """The results line's `engine_config` and `config_check` (the config redacted)."""
        return {"engine_config": self.engine.got.to_json(), "config_check": self.conf.to_json()}


def _unasked(ctx: Ctx, why: str) -> Engine:
    ctx.console.once("engine", f"not confirming the engine's configuration: {why}")
    return Engine(None, None, {}, ec.EngineConfig(problems=[why]), why)


def _started_with(point: Point, ctx: Ctx, found: serverkind.TargetKind, read: ec.EngineRead
                  ) -> dict[str, tuple[str, str]]:
    """What the server's command line sets, read from what it got (its process's command line, after systemd's
    expansion and behind a wrapper); said on the point's line where that cannot be read."""
    if found.args is not None:
        return ec.expected(read, found.args)
    if found.argv_from == "process":  # a launcher that names no kind (the kind is the config's): its flags only
        return ec.expected(replace(read, positional=""), found.argv[1:])
    why = "; ".join(found.notes) or "no command line to read"
    ctx.console.progress(point, f"the server's flags are not compared with its report: cannot read what it was "
                         f"started with ({why})")
    return {}


def read_engine(ctx: Ctx, point: Point, v: Verified) -> Engine:
    """What `v`'s engine says it runs: once per loaded instance (the caller keeps it for the group). The kind is
    the target's (probe/serverkind.py: its `kind` key, else what the serving process runs, else ExecStart=);
    `unasked` says why, once, when no kind genready can ask is known or the server cannot be reached."""
    o = ctx.opts
    if ctx.http is None:
        return _unasked(ctx, "the target's server cannot be reached over HTTP from here")
    try:
        ue = unitexec.read(o.bus_kind, o.unit)
        commands, env = ue.commands, ue.environment
    except Exception as e:  # pystemd's errors (the bus, the unit): the process's own command line may do
        commands, env = (), {}
        ctx.console.once("engine-exec", f"cannot read {o.unit}'s ExecStart= ({type(e).__name__}: {str(e)[:200]})")
    words, unknown = unitexec.expand(commands[-1], env) if commands else ([], ())
    found = serverkind.resolve(o.server.kind if o.server else AUTO, pids=[v.pid], exec_start=words, unknown=unknown)
    if found.kind is None or found.kind.engine is None:
        asked = ", ".join(k.label for k in kinds.KINDS if k.engine)
        if found.kind is not None:
            return _unasked(ctx, f"{found.kind.label} does not say what it runs (genready reads the report of "
                            f"{asked})")
        argv = escape(redact(shlex.join(found.argv[:8]), o.secrets)) or "nothing could be read"
        return _unasked(ctx, f"{o.unit} runs no server kind genready knows ({argv}); if it runs one of {asked} "
                        "(behind a wrapper), set the target's kind")
    kind, read = found.kind, found.kind.engine
    # vLLM says its settings once, in its start's output: only a start this sweep made has a mark to read from
    line = v.mark.first_line(o.bus_kind, o.unit, read.args_mark, o.secrets) if read.args_mark and v.mark else None
    got = servercache.engine_config(ctx.http, read, line)
    ctx.console.progress(point, f"{kind.label} says what it runs: {len(got.values)} settings from "
                         f"{', '.join(got.sources) or 'no source'} (its kind from {found.source})")
    for problem in got.problems:
        ctx.console.progress(point, f"{kind.label}'s configuration: {problem}")
    return Engine(kind, read, _started_with(point, ctx, found, read), got)


def judge(engine: Engine, expect: Mapping[str, str]) -> Checked | None:
    """`engine`'s report against the flags its server got and the point's `expect` (engine key -> value): the
    sweep's decision, whose status, when set, is the point's (it is not run). An `expect` that cannot be checked
    (the engine not asked, or none of its sources answered) is config_mismatch, never passed; without `expect`,
    an engine that was not asked gives None: nothing to compare, nothing to record."""
    if expect and (why := engine.unchecked):
        conf = ec.Confirmation(unconfirmed=tuple((f"expect.{k}", k, v) for k, v in sorted(expect.items())))
        return Checked(engine, conf, ec.Verdict(ec.CONFIG_MISMATCH, f"expect cannot be checked: {why}"))
    if engine.read is None:
        return None
    conf = ec.compare(engine.read, engine.want, engine.got.values)
    if expect:
        conf = ec.with_expect(conf, expect, engine.got.values)
    return Checked(engine, conf, ec.verdict(conf))


def check(ctx: Ctx, point: Point, engine: Engine) -> Checked | None:
    """`judge` for `point` with the plan's `expect` rendered for it; its warnings said on the point's line."""
    checked = judge(engine, ctx.opts.plan.expect_for(point))
    if checked is None:
        return None
    for warning in checked.verdict.warnings:
        ctx.console.progress(point, warning)
    if checked.verdict.status is None and checked.conf.confirmed:
        ctx.console.progress(point, f"the engine confirms {len(checked.conf.confirmed)} setting(s): "
                             f"{', '.join(sorted(checked.conf.confirmed)[:6])}")
    return checked


def drafted(kind: kinds.ServerKind | None, counters: servermetrics.RunCounters | None) -> int | None:
    """Draft tokens (else drafts) the server's own counters count over a run; None when it has no such
    counter, or the run's counters are unusable (a reset): nothing is then said about drafting."""
    if counters is None or counters.reset or kind is None or kind.spec is None:
        return None
    for name in (kind.spec.draft_tokens, kind.spec.steps):
        if name and (v := counters.deltas.get(kinds.total(name))) is not None:
            return int(v)
    return None


def drafting(checked: Checked, counters: servermetrics.RunCounters | None) -> ec.Verdict:
    """no_drafting for a run whose server is speculative (its engine's report, or an `expect` of a speculative
    key it confirmed) and whose counters counted no draft token in the whole run."""
    return ec.drafting_verdict(ec.speculative(checked.engine.got.values), drafted(checked.engine.kind, counters))


def confirm(ctx: Ctx, point: Point, v: Verified, engines: dict[str, Engine | None]) -> Checked | None:
    """The confirm step: `v`'s engine's report against its flags and the plan's `expect` for `point` (check);
    None when the engine cannot be asked. `engines` keeps the one instance's report, read at its first point
    (by invocation id), so a reused instance is not asked again."""
    cached = engines.get(v.invocation_id)
    # a read none of whose sources answered is asked again at the next point (issue 53 #9), not kept for the group
    if v.invocation_id not in engines or (cached is not None and not cached.unasked and not cached.got.sources):
        engines.clear()  # a new instance: the last one's report is of no use any more
        engines[v.invocation_id] = read_engine(ctx, point, v)
    engine = engines[v.invocation_id]
    return check(ctx, point, engine) if engine is not None else None


def refused(ctx: Ctx, point: Point, v: Verified, checked: Checked | None) -> Ran | None:
    """The Ran of a point not run because its engine reports another configuration than its flags or the plan's
    `expect` (config_mismatch); None when the command may run."""
    if checked is None or not checked.verdict.status:
        return None
    ctx.console.progress(point, f"not running the command: the engine runs another configuration "
                         f"({checked.verdict.reason})")
    return Ran(Status(checked.verdict.status), checked.verdict.reason, time.time(),
               Cache.COLD_START if v.restarted else Cache.WARM)


def after_run(checked: Checked | None, ran: Ran) -> Ran:
    """The drafting verdict: an ok run of a speculative server that drafted no token is no_drafting."""
    if checked is not None and ran.status is Status.OK and (d := drafting(checked, ran.counters)).status:
        return replace(ran, status=Status(d.status), reason=d.reason)
    return ran
