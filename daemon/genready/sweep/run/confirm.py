"""The sweep's confirm step: the engine says what it runs, and a point whose engine runs something else is
not measured (issue 38 §2).

After a start is verified and before its run, the unit's ExecStart= (as systemd runs it, drop-ins
applied) names the server kind and its flags; that kind's own report of its configuration is read once
per loaded instance (servers/engineconfig.py: routes, the vLLM start's args line, /metrics *_info) and
compared, for each point run on it, with those flags and with the plan's `expect` rendered for the point.
The runner asks it between the start and the warmup (`confirm`, its verdict `refused`) and after the run
(`after_run`):

- a value the engine reports otherwise: the point is `config_mismatch`, not run, not retried;
- a flag the engine does not report: a warning line, and the point runs;
- after the run, a speculative engine whose counters show no draft token: `no_drafting`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from genready.servers import engineconfig as ec
from genready.servers import kinds
from genready.sweep.plan import Point
from genready.sweep.run.results import Cache, Status
from genready.sweep.run.steps import Ctx, Ran, Verified
from genready.systemd import unitexec
from genready.tools import servercache, servermetrics


@dataclass(frozen=True)
class Engine:
    """What one loaded instance's engine said it runs, and what its ExecStart= flags set."""

    kind: kinds.ServerKind
    read: ec.EngineRead
    want: Mapping[str, tuple[str, str]]  # key -> (flag, value), from the argv systemd runs
    got: ec.EngineConfig


@dataclass(frozen=True)
class Checked:
    """One point's comparison: what was read, how it compares, and the sweep's decision on it."""

    engine: Engine
    conf: ec.Confirmation
    verdict: ec.Verdict

    def records(self) -> dict[str, Any]:
        """The results line's `engine_config` and `config_check` (the config redacted)."""
        return {"engine_config": self.engine.got.to_json(), "config_check": self.conf.to_json()}


def read_engine(ctx: Ctx, point: Point, v: Verified) -> Engine | None:
    """What `v`'s engine says it runs: once per loaded instance (the caller keeps it for the group). None, said
    once, when the unit runs no server kind genready can ask, or the server cannot be reached over HTTP."""
    o = ctx.opts
    if ctx.http is None:
        return None
    try:
        ue = unitexec.read(o.bus_kind, o.unit)
    except Exception as e:  # pystemd's errors (the bus, the unit): the run goes on unconfirmed
        ctx.console.once("engine", f"not confirming the engine's configuration: cannot read {o.unit}'s "
                         f"ExecStart= ({type(e).__name__}: {str(e)[:200]})")
        return None
    found = kinds.serving(ue.commands[-1]) if ue.commands else None
    if found is None or found[0].engine is None:
        ctx.console.once("engine", f"not confirming the engine's configuration: {o.unit}'s ExecStart= runs no "
                         "server whose report genready reads (SGLang, vLLM, llama.cpp's llama-server)")
        return None
    kind, args = found
    read = kind.engine
    assert read is not None
    # vLLM says its settings once, in its start's output: only a start this sweep made has a mark to read from
    line = v.mark.first_line(o.bus_kind, o.unit, read.args_mark, o.secrets) if read.args_mark and v.mark else None
    got = servercache.engine_config(ctx.http, read, line)
    ctx.console.progress(point, f"{kind.label} says what it runs: {len(got.values)} settings from "
                         f"{', '.join(got.sources) or 'no source'}")
    for problem in got.problems:
        ctx.console.progress(point, f"{kind.label}'s configuration: {problem}")
    return Engine(kind, read, ec.expected(read, args), got)


def check(ctx: Ctx, point: Point, engine: Engine) -> Checked:
    """`engine`'s report against its flags and the plan's `expect` for `point`; its warnings said on the point's
    line. Its verdict's status, when set, is the point's: it is not run."""
    conf = ec.compare(engine.read, engine.want, engine.got.values)
    if expect := ctx.opts.plan.expect_for(point):
        conf = ec.with_expect(conf, expect, engine.got.values)
    verdict = ec.verdict(conf)
    for warning in verdict.warnings:
        ctx.console.progress(point, warning)
    if verdict.status is None and conf.confirmed:
        ctx.console.progress(point, f"the engine confirms {len(conf.confirmed)} setting(s): "
                             f"{', '.join(sorted(conf.confirmed)[:6])}")
    return Checked(engine, conf, verdict)


def drafted(kind: kinds.ServerKind, counters: servermetrics.RunCounters | None) -> int | None:
    """Draft tokens (else drafts) the server's own counters count over a run; None when it has no such
    counter, or the run's counters are unusable (a reset): nothing is then said about drafting."""
    if counters is None or counters.reset or kind.spec is None:
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
    if v.invocation_id not in engines:
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
