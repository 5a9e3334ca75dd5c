"""The gate's decisions, in-process and table-driven: every state, every revocation reason,
and the instance proof around a probe (see gatefakes.py for why these use stand-ins)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from genready.redact import redact_lines
from genready.rule.gate import RESTART_SETTLE, is_ready
from genready.rule.history import expected_load
from genready.store.records import StartRecord
from genready.systemd.snapshot import Snapshot
from genready.timewords import Clock, iso
from genready.vocab import Failure, Instance, Revocation, State
from genready_dev.harness import free_port
from tests.gatefakes import UNIT, Rig, failed, ok, snap, target


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(**cfg: Any) -> Rig:
        rigs.append(Rig(tmp_path / str(len(rigs)), **cfg))
        return rigs[-1]

    yield make
    for r in rigs:
        await r.close()


# --- the rule itself --------------------------------------------------------------------------

A = Instance("inv-a", 100)


@pytest.mark.parametrize(("shown", "verified", "ready"), [
    (snap(), A, True),
    (snap(), None, False),  # nothing verified
    (None, A, False),  # no connection to systemd
    (snap(pid=101), A, False),  # another MainPID
    (snap(inv="inv-b"), A, False),  # another start
    (snap(job=3), A, False),  # a job is pending
    (snap("deactivating"), A, False),
    (snap("reloading"), A, False),  # only `active` counts
    (snap("activating"), A, False),
], ids=["same-instance", "unverified", "bus-lost", "pid", "invocation", "job", "deactivating", "reloading",
        "activating"])
def test_is_ready(shown: Any, verified: Instance | None, ready: bool) -> None:
    assert is_ready(shown, verified) is ready


# --- every state ------------------------------------------------------------------------------

async def _unknown(r: Rig) -> None:
    r.show(snap("inactive", 0, ""))
    r.show(None)


async def _absent(r: Rig) -> None:
    r.show(snap("inactive", 0, "", load="not-found"))


async def _absent_refused(r: Rig) -> None:
    r.show(snap("inactive", 0, "", error="org.freedesktop.DBus.Error.InvalidArgs: bad name"))


async def _inactive(r: Rig) -> None:
    r.show(snap("failed", 0, "inv-a", sub="failed"))


async def _starting_job(r: Rig) -> None:
    r.show(snap("inactive", 0, "", job=7))


async def _starting_activating(r: Rig) -> None:
    r.show(snap("activating", 0, "inv-a", sub="start-pre"))


async def _loading(r: Rig) -> None:
    r.prober.answer = lambda pid: failed()
    r.show(snap())
    await r.until(lambda: r.gate.progress.probes >= 2, "two failed probes")


async def _warming(r: Rig) -> None:
    hold = asyncio.Event()
    r.prober.queue.append(r.prober.answer(100))
    r.prober.during = lambda: setattr(r.prober, "hold", hold if r.prober.calls > 1 else None)
    r.show(snap())
    await r.until(lambda: r.gate.progress.successes == 1 and r.prober.calls == 2, "one success, the next held")


async def _ready(r: Rig) -> None:
    await r.ready(snap())


async def _stuck(r: Rig) -> None:
    r.prober.answer = lambda pid: failed()
    r.show(snap())
    await r.until(lambda: r.gate.state == State.STUCK, "stuck after load_timeout")


async def _rejected(r: Rig) -> None:
    r.prober.answer = lambda pid: failed(Failure.REJECTED, 401)
    r.show(snap())
    await r.until(lambda: r.gate.progress.probes >= 1, "a rejected probe")


STATE_ROWS: dict[str, tuple[Callable[[Rig], Awaitable[None]], dict[str, Any], State, str]] = {
    # name: (what happens, target settings, expected state, a word of the expected reason)
    "unknown": (_unknown, {}, State.UNKNOWN, "no connection to systemd"),
    "absent": (_absent, {}, State.ABSENT, "does not exist"),
    "absent-refused": (_absent_refused, {}, State.ABSENT, "refuses to report"),
    "inactive": (_inactive, {}, State.INACTIVE, "is failed"),
    "starting-job": (_starting_job, {}, State.STARTING, "a job is pending"),
    "starting-activating": (_starting_activating, {}, State.STARTING, "activating/start-pre"),
    "loading": (_loading, {}, State.LOADING, "http_status"),
    "warming": (_warming, {"warmup": 3}, State.WARMING, "1/3 generations verified"),
    "ready": (_ready, {}, State.READY, ""),
    "stuck": (_stuck, {"load_timeout": 0.05}, State.STUCK, "load_timeout"),
    "rejected": (_rejected, {}, State.REJECTED, "rejected (scripted)"),
}


def test_the_table_has_a_row_for_every_state() -> None:
    assert {row[2] for row in STATE_ROWS.values()} == set(State)


@pytest.mark.parametrize("row", STATE_ROWS)
async def test_state(make_rig: Callable[..., Rig], row: str) -> None:
    happen, cfg, state, reason = STATE_ROWS[row]
    r = make_rig(**cfg)
    await happen(r)
    await r.until(lambda: r.gate.state == state, f"state {state}")
    assert reason in r.gate.reason
    assert r.gate.ready is (state == State.READY)
    assert r.events.states[-1] == state  # the listener heard the state the gate is in
    body = r.gate.to_json()
    assert body["state"] == state and body["ready"] is (state == State.READY)


# --- every revocation reason -------------------------------------------------------------------

async def _pid_changed(r: Rig) -> None:
    r.show(snap(pid=101))


async def _invocation_changed(r: Rig) -> None:
    r.show(snap(pid=200, inv="inv-b"))


async def _left_active(r: Rig) -> None:
    r.show(snap("deactivating", sub="stop-sigterm"))


async def _job_queued(r: Rig) -> None:
    r.show(snap(job=9))


async def _bus_lost(r: Rig) -> None:
    r.show(None)


async def _rechecks_fail(r: Rig) -> None:
    r.prober.answer = lambda pid: failed(Failure.TIMEOUT, None)
    await r.until(lambda: not r.gate.ready, "revoked by rechecks")


async def _config_changed(r: Rig) -> None:
    await r.gate.reconfigure(replace(r.gate.cfg, probe_timeout=7.0))


# The foreign-listener row's target port: its own, so a socket it opens is in no other test's way.
_STRANGER_URL = f"http://127.0.0.1:{free_port()}"


def _second_listener(r: Rig) -> socket.socket:
    """A socket of this process (not the unit's main pid 100 or a descendant) on the target's port."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", r.gate.cfg.endpoint.port))
    s.listen()
    r.closing.append(s)
    return s


async def _foreign_listener(r: Rig) -> None:
    _second_listener(r)
    await r.until(lambda: not r.gate.ready, "revoked for the second listener", timeout=10)


REVOCATION_ROWS: dict[Revocation, tuple[Callable[[Rig], Awaitable[None]], dict[str, Any]]] = {
    Revocation.PID_CHANGED: (_pid_changed, {}),
    Revocation.INVOCATION_CHANGED: (_invocation_changed, {}),
    Revocation.INACTIVE: (_left_active, {}),
    Revocation.JOB_QUEUED: (_job_queued, {}),
    Revocation.BUS_LOST: (_bus_lost, {}),
    Revocation.RECHECK_FAILED: (_rechecks_fail, {"recheck_interval": 0.01, "failure_threshold": 2}),
    Revocation.CONFIG_CHANGED: (_config_changed, {}),
    Revocation.FOREIGN_LISTENER: (_foreign_listener, {"url": _STRANGER_URL, "verify_owner": True}),
}


def test_the_table_has_a_row_for_every_revocation() -> None:
    assert set(REVOCATION_ROWS) == set(Revocation)


@pytest.mark.parametrize("reason", list(REVOCATION_ROWS))
async def test_revocation(make_rig: Callable[..., Rig], reason: Revocation) -> None:
    happen, cfg = REVOCATION_ROWS[reason]
    r = make_rig(**cfg)
    await r.ready(snap())
    assert [rec.main_pid for rec in r.events.verified] == [100]
    await happen(r)
    assert not r.gate.ready
    assert r.events.revoked == [reason]
    rec = r.gate.history.get("inv-a")
    assert rec is not None and rec.revoke_reason == reason and rec.revoked_at


async def test_rechecks_that_fail_fewer_times_than_the_threshold_keep_readiness(
        make_rig: Callable[..., Rig]) -> None:
    r = make_rig(recheck_interval=0.01, failure_threshold=3)
    await r.ready(snap())
    n = r.prober.calls
    r.prober.queue.extend([failed(Failure.TIMEOUT, None), failed(Failure.TIMEOUT, None)])
    await r.until(lambda: r.prober.calls >= n + 4, "two failed rechecks and two good ones")
    assert r.gate.ready and r.events.revoked == []


async def test_revoked_by_rechecks_then_verified_again_counts_warmup_anew(make_rig: Callable[..., Rig]) -> None:
    r = make_rig(recheck_interval=0.01, failure_threshold=1, warmup=2)
    await r.ready(snap())
    r.prober.queue.append(failed(Failure.TIMEOUT, None))
    await r.until(lambda: r.events.revoked == [Revocation.RECHECK_FAILED], "revoked")
    await r.until(lambda: r.gate.ready, "verified again")
    assert len(r.events.verified) == 2
    # warmup 2: two successes before each verification, and the one failure between.
    oks = [p.ok for p in r.events.probes]
    assert oks[:2] == [True, True] and False in oks[2:]


async def test_a_second_listener_keeps_the_target_unready_until_it_is_gone(make_rig: Callable[..., Rig]) -> None:
    r = make_rig(url=_STRANGER_URL, verify_owner=True)
    await r.ready(snap())
    s = _second_listener(r)
    await r.until(lambda: not r.gate.ready, "revoked", timeout=10)
    assert r.events.revoked == [Revocation.FOREIGN_LISTENER]
    body = r.gate.to_json()
    listed = body["foreign_listeners"]
    assert isinstance(listed, list) and [x["address"] for x in listed] == ["127.0.0.1"]
    assert "foreign_owner: a second listener on 127.0.0.1" in r.gate.reason, r.gate.reason
    # Probes go on, and succeed, but verify nothing while it listens.
    n = r.prober.calls
    await r.until(lambda: r.prober.calls >= n + 2, "two more probes")
    assert not r.gate.ready and r.events.probes[-1].failure == Failure.FOREIGN_OWNER
    s.close()
    await r.until(lambda: r.gate.ready, "verified again once it is gone", timeout=10)
    assert r.gate.to_json()["foreign_listeners"] == [] and len(r.events.verified) == 2


async def test_without_owner_proof_no_stranger_is_looked_for(make_rig: Callable[..., Rig]) -> None:
    """verify_owner = false proves nothing about who answers: a second listener changes nothing."""
    r = make_rig(url=_STRANGER_URL)  # gatefakes' targets have verify_owner = false
    await r.ready(snap())
    _second_listener(r)
    await r.until(lambda: r.gate._task is None or r.gate._task.done(), "no task kept once verified")
    assert r.gate.ready and r.gate.listen.looks == 0 and r.events.revoked == []


async def test_since_monotonic_is_not_moved_by_a_wall_clock_step(make_rig: Callable[..., Rig]) -> None:
    """since= is taken before a restart; the wall clock then steps back 30 s (emulated: the client's
    clock 30 s ahead). The new start began after since on CLOCK_MONOTONIC, before it on the wall clock."""
    r = make_rig()
    since_mono, since = time.monotonic(), time.time() + 30
    await r.ready(snap())  # the new start: ExecMainStartTimestamp(Monotonic) now
    v, why = await r.gate.check(since=since)
    assert v is None and "before since=" in why  # the wall clock: this start would never count
    v, why = await r.gate.check(since=since, since_mono=since_mono)
    assert v is not None and v.instance == Instance("inv-a", 100), why
    # And an older start does not count: since_monotonic taken after it began.
    v, why = await r.gate.check(since_mono=time.monotonic())
    assert v is None and "before since_monotonic=" in why
    # The failed-start shortcut reads since_monotonic on the daemon's wall clock as it runs.
    assert r.gate.since_wall(None, time.monotonic() - 5) == pytest.approx(time.time() - 5, abs=0.5)
    assert r.gate.since_wall(since, None) == since


# --- the instance proof around a probe -------------------------------------------------------

async def test_a_success_while_systemd_changed_instance_does_not_verify(make_rig: Callable[..., Rig]) -> None:
    """The server answered, but by then systemd shows another start: the answer proves nothing."""
    r = make_rig()
    r.prober.during = lambda: setattr(r.fresh, "snap", snap(pid=200, inv="inv-b"))
    r.show(snap())
    await r.until(lambda: r.prober.calls >= 1 and r.events.probes, "the first probe")
    first = r.events.probes[0]
    assert not first.ok and first.failure == Failure.STALE_INSTANCE and "now shows pid 200" in first.detail
    assert not r.gate.ready and r.events.verified == []


async def test_no_probe_counts_while_the_fresh_read_disagrees_with_the_event(make_rig: Callable[..., Rig]) -> None:
    """The D-Bus event said pid 100; a fresh read says a job is pending: not probed as ready."""
    r = make_rig()
    r.gate.on_snapshot(snap())
    r.fresh.snap = snap(job=4)
    await r.until(lambda: len(r.events.probes) >= 2, "two probes")
    assert r.prober.calls == 0
    assert all(p.failure == Failure.STALE_INSTANCE for p in r.events.probes)
    assert not r.gate.ready


async def test_a_verification_belongs_to_one_instance(make_rig: Callable[..., Rig]) -> None:
    r = make_rig()
    await r.ready(snap())
    r.prober.answer = lambda pid: failed()
    r.show(snap(pid=200, inv="inv-b"))
    assert r.gate.verified is None and not r.gate.ready
    # The old instance coming back in an event (a stale view) does not make it ready again.
    r.show(snap())
    await r.until(lambda: r.gate.progress.probes >= 1, "probing the instance afresh")
    assert not r.gate.ready and len(r.events.verified) == 1


async def test_check_reads_systemd_afresh(make_rig: Callable[..., Rig]) -> None:
    """/ready's question: ready in the gate's view, but a fresh read shows a job: no."""
    r = make_rig()
    await r.ready(snap())
    v, why = await r.gate.check()
    assert v is not None and v.instance == A and why == ""
    r.fresh.snap = snap(job=5)
    v, why = await r.gate.check()
    assert v is None and "with a job pending" in why
    v, why = await r.gate.check(pid=999)
    assert v is None and "not 999" in why


def test_target_defaults_come_from_the_config_table() -> None:
    cfg = target()
    assert cfg.warmup == 1 and cfg.recheck_interval == 0


# --- how long loads usually take --------------------------------------------------------------

def _loaded(inv: str, seconds: float, fingerprint: str | None = "fp-1") -> StartRecord:
    return StartRecord(target="t", unit=UNIT, invocation_id=inv, main_pid=1, started_at=iso(1000.0),
                       active_at=None, ended_at=iso(2000.0), result="success", exit_code=None, exit_status=None,
                       n_restarts=0, ready_at=iso(1000.0 + seconds), load_seconds=seconds,
                       exec_fingerprint=fingerprint)


def test_expected_load_is_the_median_of_the_same_command_else_of_the_unit() -> None:
    newest_first = [_loaded("a", 400.0, "fp-2"), _loaded("b", 100.0), _loaded("c", 120.0), _loaded("d", 90.0),
                    _loaded("e", 110.0), _loaded("f", 130.0), _loaded("g", 900.0)]
    assert expected_load(newest_first, "fp-1") == 110.0  # b..f: the last 5 with this ExecStart=; g too old
    assert expected_load(newest_first, "fp-2") == 400.0
    assert expected_load(newest_first, "fp-3") == 110.0  # none of its own: the unit's last 5 (a..e)
    unverified = replace(_loaded("x", 5.0), ready_at=None, load_seconds=None)
    assert expected_load([unverified], "fp-1") is None


@pytest.mark.parametrize("auto", [True, False])
async def test_load_timeout_auto_is_stuck_at_three_times_the_usual_load(make_rig: Callable[..., Rig],
                                                                         auto: bool) -> None:
    r = make_rig(**({} if auto else {"load_timeout": 1800}))
    for i, seconds in enumerate((190.0, 200.0, 210.0)):
        r.store.remember(_loaded(f"old-{i}", seconds, None))
    r.prober.answer = lambda pid: failed()
    r.show(snap())
    await r.until(lambda: r.gate.progress.probes >= 1, "probing")
    assert r.gate.expected_load_seconds == 200.0
    limit = 600.0 if auto else 1800.0
    assert r.gate.stuck_after == limit
    r.gate.progress.waiting_mono = time.monotonic() - (limit - 5)
    await r.until(lambda: r.gate.progress.probes >= 3, "a probe later")
    assert r.gate.state == State.LOADING
    r.gate.progress.waiting_mono = time.monotonic() - (limit + 5)
    await r.until(lambda: r.gate.state == State.STUCK, "stuck")
    assert f"after {limit:g}s" in r.gate.reason
    elapsed, eta = r.gate.load_clock()
    assert elapsed is not None and eta is not None and 0 <= eta <= 200.0


def test_redaction_of_every_kind_of_secret() -> None:
    own = "own-key-0123456789"
    lines = [
        "server_args=ServerArgs(model_path='m', api_key='sk-sglang-1', admin_api_key=None, port=30000)",
        "launch: vllm serve m --api-key sk-vllm-2 --port 8000",
        "launch: llama-server --api-key=sk-llama-3 --api-key-file /etc/k",
        "request headers: Authorization: Bearer sk-bearer-4",
        "env: HF_TOKEN=hf_abcdef5 GITHUB_TOKEN='ghp_6' PATH=/usr/bin",
        f"echo {own} from the target's own key file",
    ]
    out = "\n".join(redact_lines(lines, [own]))
    for secret in ("sk-sglang-1", "sk-vllm-2", "sk-llama-3", "sk-bearer-4", "hf_abcdef5", "ghp_6", own):
        assert secret not in out, secret
    assert "api_key=***" in out and "--api-key ***" in out and "--api-key=***" in out
    assert "Bearer ***" in out and "HF_TOKEN=***" in out and "--api-key-file /etc/k" in out
    assert "model_path='m'" in out and "PATH=/usr/bin" in out and "port=30000" in out


async def test_after_a_failed_probe_the_next_skips_the_read_before_it(make_rig: Callable[..., Rig]) -> None:
    """While a server keeps failing, only the first probe of the run reads systemd before it."""
    r = make_rig()
    r.prober.answer = lambda pid: failed()
    r.show(snap())
    await r.until(lambda: len(r.events.probes) >= 5, "five failed probes")
    assert r.fresh.reads == 1 and r.prober.calls >= 5


async def test_a_success_seen_without_the_read_before_it_is_probed_again_bracketed(
        make_rig: Callable[..., Rig]) -> None:
    r = make_rig(warmup=2)
    r.prober.answer = lambda pid: failed()
    r.show(snap())
    await r.until(lambda: len(r.events.probes) >= 2, "two failed probes")
    calls, reads = r.prober.calls, r.fresh.reads
    r.prober.answer = ok
    await r.until(lambda: r.gate.ready, "verified")
    # Each counted success had systemd's read before and after it; the first one found on the
    # watcher's view alone was made again (so warmup = 2 took three generations, not two).
    assert r.prober.calls - calls == 3
    assert r.fresh.reads - reads == 4
    assert [p.ok for p in r.events.probes[-2:]] == [True, True] and r.gate.progress.successes == 2


class SteppedClock:
    """The clock the gate reads, moved by the test: `advance` moves both clocks (time passes), `step`
    only the wall clock (NTP, an operator, a resumed VM)."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_800_000_000.0, 5_000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def step(self, seconds: float) -> None:
        self.wall += seconds

    def clock(self) -> Clock:
        return Clock(wall=lambda: self.wall, mono=lambda: self.mono)

    def start(self, **kw: Any) -> Snapshot:
        """A start systemd shows as begun now, on both its clocks."""
        return replace(snap(**kw), exec_main_start_us=int(self.wall * 1e6),
                       exec_main_start_mono_us=int(self.mono * 1e6))


async def test_a_wall_clock_step_back_changes_no_duration(make_rig: Callable[..., Rig]) -> None:
    c = SteppedClock()
    r = make_rig(clock=c.clock())
    r.prober.answer = lambda pid: failed()
    r.show(c.start())
    await r.until(lambda: r.gate.progress.probes >= 1, "probing")
    c.advance(4.0)
    c.step(-100.0)  # the wall clock jumps back while the server loads
    assert r.gate.load_json()["loading_seconds"] == 4.0
    assert r.gate.waiting_seconds == 4.0
    r.prober.answer = ok
    await r.until(lambda: r.gate.ready, "verified")
    assert r.gate.verified is not None and r.gate.verified.load_seconds == 4.0  # /ready's load_seconds
    rec = r.store.get("t", "inv-a")
    assert rec is not None and rec.load_seconds == 4.0  # the record's, which `wait` and the sweep read
    assert r.gate.expected_load_seconds == 4.0  # the next load is expected to take as long
    # A second start after a step forward: its load is what passed, not what the wall clock says.
    r.prober.answer = lambda pid: failed()
    r.show(c.start(pid=200, inv="inv-b"))
    await r.until(lambda: r.gate.progress.instance == Instance("inv-b", 200), "probing the new start")
    c.advance(6.0)
    c.step(+3600.0)
    r.prober.answer = ok
    await r.until(lambda: r.gate.ready, "the second start verified")
    assert r.gate.verified is not None and r.gate.verified.load_seconds == 6.0
    assert r.gate.expected_load_seconds == 5.0  # the median of 4 and 6, not of an hour


async def test_a_wall_clock_step_forward_makes_nothing_stuck(make_rig: Callable[..., Rig]) -> None:
    c = SteppedClock()
    r = make_rig(clock=c.clock(), load_timeout=300)
    r.prober.answer = lambda pid: failed()
    r.show(c.start())
    await r.until(lambda: r.gate.progress.probes >= 1, "probing")
    c.step(+1000.0)
    probes = r.gate.progress.probes
    await r.until(lambda: r.gate.progress.probes >= probes + 2, "probes after the step")
    assert r.gate.state == State.LOADING, r.gate.reason
    elapsed, _ = r.gate.load_clock()
    assert elapsed == 0.0
    c.advance(301.0)  # while 301 s do pass, it is stuck
    await r.until(lambda: r.gate.state == State.STUCK, "stuck after load_timeout")


async def test_a_settled_failure_is_timed_on_the_gate_clock(make_rig: Callable[..., Rig]) -> None:
    """`restarting` (how long the unit has stayed down) is a duration: it is read off the gate's Clock,
    not the process's, so a test's clock (or none other) decides it."""
    c = SteppedClock()
    r = make_rig(clock=c.clock())
    r.show(replace(c.start(), active_state="failed", sub_state="failed", main_pid=0))
    assert r.gate.restarting  # down for no time yet: systemd may start it again by itself
    c.advance(RESTART_SETTLE * 10)  # on the gate's clock only: no real time passes
    assert not r.gate.restarting
