"""The readiness gate: one state machine per target, and the readiness rule.

THE RULE (`is_ready`): a target is ready when a generation was verified for an instance
(InvocationID, MainPID), and systemd says that very instance is the unit's current one,
`active`, with no job pending. Everything else in genready asks this function.

A start is verified when `warmup` consecutive probes succeed, each one a real generation
whose server-side socket belonged to the MainPID or a descendant (probe.py), bracketed by
two fresh systemd reads showing the same instance, active and with no job pending.
Readiness is revoked at once, from the D-Bus event, when the instance changes, the unit
leaves `active`, a job is queued, or rechecks fail; and within STRANGER_CHECK seconds when a
process outside the instance listens where the target's url connects (probe/listen.py: it gets a
share of the connections, or all of those to one of the url's addresses). While such a stranger
listens, no probe verifies the instance; once it is gone, the next probe does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from genready.compat import wait_for
from genready.config import AUTO, TargetConfig, stuck_after
from genready.probe.listen import STRANGER_CHECK, ListenWatch, Stranger
from genready.probe.probe import Prober
from genready.rule.history import History, config_changes
from genready.rule.schedule import Schedule
from genready.store.records import RecordStore, StartRecord
from genready.systemd.fresh import FreshReader
from genready.systemd.snapshot import Snapshot
from genready.systemd.worker import Unresponsive
from genready.timewords import CLOCK, Clock, from_iso, iso
from genready.vocab import DOWN, SYSTEMD_UNRESPONSIVE, Failure, Instance, ProbeResult, Revocation, State

log = logging.getLogger("genready.rule.gate")
# Seconds a unit must stay down, no job pending, before a failed start counts as one systemd will not
# follow with a start of its own: with Restart= it shows failed a moment before activating/auto-restart.
RESTART_SETTLE: Final = 0.2



def is_ready(snap: Snapshot | None, verified: Instance | None) -> bool:
    """The readiness rule. See the module docstring; nothing else decides readiness."""
    return (
        snap is not None
        and verified is not None
        and snap.active_state == "active"
        and snap.job_id == 0
        and instance_of(snap) == verified
    )


def instance_of(snap: Snapshot) -> Instance:
    return Instance(snap.invocation_id, snap.main_pid)


def revocation_reason(snap: Snapshot | None, verified: Instance) -> Revocation:
    """Why `snap` no longer shows the verified instance as ready (for records and metrics)."""
    if snap is None:
        return Revocation.BUS_LOST
    if snap.invocation_id != verified.invocation_id:
        return Revocation.INVOCATION_CHANGED
    if snap.main_pid != verified.main_pid:
        return Revocation.PID_CHANGED
    if snap.job_id != 0:
        return Revocation.JOB_QUEUED
    return Revocation.INACTIVE


def _show(s: Snapshot) -> str:
    return f"pid {s.main_pid} {s.active_state}" + (" with a job pending" if s.job_id else "")


class Listener(Protocol):
    """What the daemon does with the gate's events (metrics, logs, and outputs.py).

    An event says what happened; whether a target is ready is always asked of `gate.ready`.
    One pass of the gate (a snapshot taken, a probe's outcome counted, a reconfiguration) may
    emit several events (verified, then the state changed); `on_settled` follows them once, at
    the end of a pass that changed what a surface shows: that is where READY=1/STATUS= and the
    stamps are brought in line, once per pass.
    """

    def on_state_changed(self, gate: TargetGate, old: State, new: State) -> None: ...
    def on_probed(self, gate: TargetGate, result: ProbeResult) -> None: ...
    def on_verified(self, gate: TargetGate, record: StartRecord) -> None: ...
    def on_revoked(self, gate: TargetGate, reason: Revocation) -> None: ...
    def on_start_seen(self, gate: TargetGate, record: StartRecord) -> None: ...
    def on_settled(self, gate: TargetGate) -> None: ...


@dataclass
class Verification:
    instance: Instance
    ready_since: float  # wall clock
    load_seconds: float | None
    started_at: float | None  # wall clock of the process start, for ?since=
    # CLOCK_MONOTONIC seconds of the process start (systemd's ExecMainStartTimestampMonotonic), for
    # ?since_monotonic=: a wall clock stepped back during a restart makes a new start look older than
    # a since= taken before it; this clock never steps.
    started_mono: float | None = None

    def to_json(self) -> dict[str, object]:
        """The one serialization of a verification: /ready, /status and the ready stamp use it."""
        return {"pid": self.instance.main_pid, "invocation_id": self.instance.invocation_id,
                "ready_since": iso(self.ready_since), "load_seconds": self.load_seconds}


@dataclass
class ProbeProgress:
    instance: Instance | None = None
    waiting_since: float = field(default_factory=time.time)  # wall clock: shown only
    waiting_mono: float = field(default_factory=time.monotonic)  # the same moment, for durations
    probes: int = 0
    successes: int = 0
    failures: int = 0  # consecutive
    last_error: str = ""  # "CLASS: detail"

    @property
    def last_failure(self) -> str:
        """The failure class of the last probe, or "" after a success."""
        return self.last_error.split(":", 1)[0]


class TargetGate:
    """State machine of one target: follows snapshots, probes new starts, keeps records."""

    def __init__(self, cfg: TargetConfig, store: RecordStore, fresh: FreshReader, listener: Listener,
                 *, prober_factory: Callable[[TargetConfig], Prober] = Prober, clock: Clock = CLOCK) -> None:
        self.clock = clock  # wall for what is shown, monotonic for every duration (timewords.Clock)
        self.cfg = cfg
        self.store = store
        self.history = History(cfg.name, cfg.unit, store)
        self.fresh = fresh
        self.listener = listener
        self._prober_factory = prober_factory
        self.prober = prober_factory(cfg)
        self.listen = ListenWatch(cfg.endpoint, enabled=cfg.owner == "process")
        self.strangers: list[Stranger] = []  # other listeners on the url's addresses, at the last look
        self.snap: Snapshot | None = None
        self.state = State.UNKNOWN
        self.reason = "not connected to systemd yet"
        self.verified: Verification | None = None
        self.progress = self._new_progress()
        self._seen: tuple[Instance, float] | None = None  # an instance, and when (monotonic) it was first seen
        self._task: asyncio.Task[None] | None = None
        self.probe_restarts = 0  # probe loops that died and were restarted (see _probe_task_done)
        self._changed = asyncio.Event()
        self._unsettled = False  # this pass verified or revoked: on_settled is due at its end (_set_state)
        self.expected_load_seconds: float | None = None  # refreshed at each start and verification
        self._down_since: float | None = None  # monotonic: since when the unit is down, no job pending

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def unit(self) -> str:
        return self.cfg.unit

    @property
    def ready(self) -> bool:
        return is_ready(self.snap, self.verified.instance if self.verified else None)

    # -- events from the watcher ------------------------------------------------------------

    def on_snapshot(self, snap: Snapshot | None) -> None:
        """A new view from systemd (None: the bus is lost). Revocation happens here, at once."""
        was_ready, self.snap = self.ready, snap
        if snap is not None and snap.invocation_id and (self._seen is None or self._seen[0] != instance_of(snap)):
            self._seen = (instance_of(snap), self.clock.mono())
        try:
            started = self.history.observe(snap) if snap is not None else None
        except Exception:
            # Records are history: whatever goes wrong there, following systemd must go on.
            log.exception("%s: updating the start records failed", self.name)
            started = None
        if started is not None:
            self.listener.on_start_seen(self, started)
        if snap is not None and (started is not None or self.expected_load_seconds is None):
            self._refresh_expected(snap)
        if snap is not None:
            self._follow_down(snap)
        if was_ready and not self.ready:
            assert self.verified is not None
            self._revoke(revocation_reason(snap, self.verified.instance))
        if snap is not None and self.verified and instance_of(snap) != self.verified.instance:
            self.verified = None  # a verification belongs to one instance only
        self._schedule_probing()
        self._set_state()

    def _refresh_expected(self, snap: Snapshot) -> None:
        try:
            self.expected_load_seconds = self.history.expected_load(snap.exec_fingerprint)
        except Exception:
            log.exception("%s: reading the load history failed", self.name)

    @property
    def stuck_after(self) -> float:
        """Seconds of loading after which this target is `stuck` (load_timeout, or "auto")."""
        return stuck_after(self.cfg.load_timeout, self.expected_load_seconds)

    def load_clock(self) -> tuple[float | None, float | None]:
        """(seconds the current start has been loading, seconds it is expected to take still), while
        it is not ready; (None, None) otherwise or unknown."""
        s = self.snap
        if self.ready or s is None or not s.invocation_id or s.active_state not in ("activating", "active"):
            return None, None
        rec = self.history.get(s.invocation_id)
        started = self._start_mono(s) if rec and rec.ended_at is None else None
        if started is None:
            return None, None
        elapsed = max(0.0, self.clock.mono() - started)
        eta = None if self.expected_load_seconds is None else max(0.0, self.expected_load_seconds - elapsed)
        return elapsed, eta

    def _start_mono(self, s: Snapshot) -> float | None:
        """When (monotonic seconds) the start `s` shows began: systemd's ExecMainStartTimestampMonotonic,
        else when genready first saw this instance; None if neither is known."""
        if s.exec_main_start_mono_us:
            return s.exec_main_start_mono_us / 1e6
        return self._seen[1] if self._seen is not None and self._seen[0] == instance_of(s) else None

    @property
    def waiting_seconds(self) -> float:
        """How long the current start has been probed without a verification (monotonic, never negative)."""
        return max(0.0, self.clock.mono() - self.progress.waiting_mono)

    def _new_progress(self, instance: Instance | None = None) -> ProbeProgress:
        return ProbeProgress(instance=instance, waiting_since=self.clock.wall(), waiting_mono=self.clock.mono())

    # -- a failed start --------------------------------------------------------------------------

    def _follow_down(self, snap: Snapshot) -> None:
        """Note since when the unit is down with no job pending; once that has lasted RESTART_SETTLE,
        long-polls look again (a failed start is then final: see start_failed)."""
        down = snap.main_pid == 0 and snap.job_id == 0 and snap.active_state in DOWN
        if not down:
            self._down_since = None
        elif self._down_since is None:
            self._down_since = self.clock.mono()
            # A little after: the loop may run a timer up to its clock's resolution early.
            asyncio.get_running_loop().call_later(RESTART_SETTLE + 0.01, self.wake)

    @property
    def restarting(self) -> bool:
        """Whether systemd may start the unit again by itself: not once it has stayed down (inactive or
        failed, no job pending, no process) for RESTART_SETTLE seconds."""
        return self._down_since is None or self.clock.mono() - self._down_since < RESTART_SETTLE

    def since_wall(self, since: float | None, since_mono: float | None) -> float | None:
        """The wall-clock moment to compare start records with: since= as given, or since_monotonic=
        read on the wall clock as it runs now (records carry systemd's wall-clock start times; after a
        step, new starts carry the stepped clock, and so does this)."""
        if since_mono is None:
            return since
        return self.clock.wall() - max(0.0, self.clock.mono() - since_mono)

    def start_failed(self, since: float | None) -> dict[str, object] | None:
        """The newest start begun after `since` (without it: the newest start) that ended before it was
        verified: how it ended, and whether systemd may start the unit again by itself (`restarting`).
        None if there is none, or a start after `since` was verified. (Its last lines are the surfaces'
        to add: serve/lastwords.py.)"""
        for rec in self.store.newest(self.name, 10):
            started = from_iso(rec.started_at)
            if since is not None and (started is None or started <= since):
                return None
            if rec.ready_at is not None:
                return None
            if rec.ended_at is not None and rec.result not in (None, "unknown"):
                return {"invocation_id": rec.invocation_id, "main_pid": rec.main_pid, "started_at": rec.started_at,
                        "ended_at": rec.ended_at, "result": rec.result, "exit_code": rec.exit_code,
                        "exit_status": rec.exit_status, "restarting": self.restarting}
            if since is None:
                return None  # the newest start runs still
        return None

    def _revoke(self, reason: Revocation) -> None:
        assert self.verified is not None
        self.history.mark_revoked(self.verified.instance.invocation_id, reason)
        log.info("%s: readiness revoked reason=%s pid=%d", self.name, reason, self.verified.instance.main_pid)
        self.verified = None
        self._unsettled = True
        # Even for the same instance (a job came and went): warmup and load_timeout count anew.
        self.progress.successes = 0
        self.progress.waiting_since, self.progress.waiting_mono = self.clock.wall(), self.clock.mono()
        self.listener.on_revoked(self, reason)

    def _set_state(self) -> None:
        """The end of every pass: derive the state, and say once if what the surfaces show changed."""
        new, reason = self._derive_state()
        self.reason = reason
        if new != self.state:
            old, self.state = self.state, new
            self._unsettled = True
            self.listener.on_state_changed(self, old, new)
        if self._unsettled:
            self._unsettled = False
            self.listener.on_settled(self)
        self.wake()

    def wake(self) -> None:
        """Long-polls on this gate look again."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _derive_state(self) -> tuple[State, str]:
        s = self.snap
        if s is None:
            return State.UNKNOWN, "no connection to systemd"
        if s.error:
            return State.ABSENT, f"systemd refuses to report on {self.unit}: {s.error}"
        if s.absent:
            return State.ABSENT, f"{self.unit} does not exist"
        if self.ready:
            return State.READY, ""
        if s.job_id != 0:
            return State.STARTING, "a job is pending for the unit"
        if s.active_state in DOWN:
            return State.INACTIVE, f"{self.unit} is {s.active_state}"
        if s.active_state != "active" and not (s.active_state == "activating" and s.main_pid):
            return State.STARTING, f"{self.unit} is {s.active_state}/{s.sub_state}"
        p = self.progress
        err = f"probe {p.probes}: {p.last_error}" if p.last_error else "waiting for the first generation"
        if p.last_failure == Failure.REJECTED:
            # Up, and refusing: waiting longer changes nothing until someone fixes the server or the config.
            return State.REJECTED, p.last_error.split(": ", 1)[1]
        if self.waiting_seconds > self.stuck_after:
            how = (f"load_timeout = auto: 3 x the usual load of {self.expected_load_seconds:g}s, at least 300s"
                   if self.cfg.load_timeout == AUTO and self.expected_load_seconds is not None else "load_timeout")
            return State.STUCK, f"no verified generation after {self.stuck_after:g}s ({how}); {err}"
        if p.successes:
            return State.WARMING, f"{p.successes}/{self.cfg.warmup} generations verified"
        return State.LOADING, err

    # -- probing -----------------------------------------------------------------------------

    def _probe_wanted(self) -> Instance | None:
        """The instance to probe now, if any: a live unit whose server could be generating."""
        s = self.snap
        if s is None or s.job_id != 0 or s.main_pid == 0 or not s.invocation_id:
            return None
        # Only `active`: readiness needs it, and a verification made earlier (a Type=notify
        # server still activating) could be announced while /ready still says no.
        return instance_of(s) if s.active_state == "active" else None

    def _verified_as(self, inst: Instance) -> bool:
        """Is `inst` the verified instance? (It may no longer be ready: that is `ready`'s question.)"""
        return self.verified is not None and self.verified.instance == inst

    @property
    def _watches_verified(self) -> bool:
        """Does a verified instance keep a task: rechecks (recheck_interval), or looks for strangers?"""
        return bool(self.cfg.recheck_interval) or self._looks

    @property
    def _looks(self) -> bool:
        """Does this target look for strangers? Where the listen watch can see its port, and the owner
        is proven at all (verify_owner = false proves nothing about who answers)."""
        return self.cfg.verify_owner and self.listen.usable

    def _schedule_probing(self) -> None:
        want = self._probe_wanted()
        if want is None:
            self.strangers = []  # they were in the way of an instance that is gone
        if want is not None and self._verified_as(want) and not self._watches_verified:
            want = None
        running = self._task is not None and not self._task.done()
        if running and self.progress.instance == want:
            return
        if running:
            assert self._task is not None
            self._task.cancel()  # its instance is gone: a result would be stale anyway
            self._task = None
        if want is not None:
            if self.progress.instance != want:
                self.progress = self._new_progress(want)
                self.strangers = []
            self._task = asyncio.get_running_loop().create_task(self._probe_loop(want), name=f"probe-{self.name}")
            self._task.add_done_callback(self._probe_task_done)

    def _probe_task_done(self, task: asyncio.Task[None]) -> None:
        """The supervisor: a probe loop that died of an exception is logged and started again
        (after backoff_max), instead of leaving the target in `loading` with nothing probing."""
        if task.cancelled() or task.exception() is None:
            return
        self.probe_restarts += 1
        log.error("%s: the probe loop died and is restarted in %g s (restart %d)", self.name, self.cfg.backoff_max,
                  self.probe_restarts, exc_info=task.exception())

        def restart() -> None:
            if self._task is task:  # nothing rescheduled probing meanwhile
                self._task = None
                self._schedule_probing()
                self._set_state()

        asyncio.get_running_loop().call_later(self.cfg.backoff_max, restart)

    async def _probe_loop(self, inst: Instance) -> None:
        """Probe `inst` until it is verified; then keep rechecking it (recheck_interval) and looking
        for strangers on its addresses, and after a revocation by either, probe it until verified again."""
        while self._probe_wanted() == inst:
            if not self._verified_as(inst):
                await self._probe_until_verified(inst)
            elif self._watches_verified:
                await self._while_verified(inst)
            else:
                return

    async def _probe_until_verified(self, inst: Instance) -> None:
        """Probe on the schedule until `warmup` generations in a row succeed and `inst` is
        verified, or until `inst` is no longer the one to probe."""
        schedule = Schedule(self.cfg.backoff_initial, self.cfg.backoff_max, patience=self.stuck_after)
        # The loop condition also guards against a cancellation lost in a race.
        while self._probe_wanted() == inst:
            result = await self._probe_once(inst)
            if result.ok:
                result = await self._alone(inst, result)
            self._count(result)
            if result.ok and self.progress.successes >= self.cfg.warmup and self._verify(inst, result):
                self._set_state()
                return
            self._set_state()
            await self._pause(schedule, result, inst)

    async def _alone(self, inst: Instance, result: ProbeResult) -> ProbeResult:
        """`result`, a verified generation, if nobody else listens where the url connects; else a
        foreign_owner failure naming who does: the next connection may be theirs."""
        self.strangers = await self.listen.strangers(inst.main_pid) if self._looks else []
        if not self.strangers:
            return result
        return ProbeResult(False, Failure.FOREIGN_OWNER, self._strangers_text(), result.served_by_pid,
                           result.seconds, 0)

    def _strangers_text(self) -> str:
        first, more = self.strangers[0], len(self.strangers) - 1
        return f"{first}" + (f" (and {more} more listener(s) outside the unit's start)" if more else "")

    async def _while_verified(self, inst: Instance) -> None:
        """While `inst` stays verified: look for strangers every STRANGER_CHECK seconds and revoke at
        the first (foreign_listener); with recheck_interval, probe every recheck_interval and revoke
        after failure_threshold failures in a row (recheck_failed)."""
        loop = asyncio.get_running_loop()
        every = self.cfg.recheck_interval or math.inf
        due = loop.time() + every
        while self._probe_wanted() == inst and self._verified_as(inst):
            # On the loop clock's whole STRANGER_CHECKs: every target looks within one shared dump.
            look = STRANGER_CHECK - loop.time() % STRANGER_CHECK if self._looks else math.inf
            if min(look, every) == math.inf:
                return  # nothing left to watch with (the listener table became unreadable)
            await asyncio.sleep(max(0.0, min(look, due - loop.time())))
            if not (self._probe_wanted() == inst and self._verified_as(inst)):
                return
            if self._looks:
                self.strangers = await self.listen.strangers(inst.main_pid)
                if self.strangers and self._verified_as(inst):
                    self.progress.last_error = f"{Failure.FOREIGN_OWNER}: {self._strangers_text()}"
                    self._revoke(Revocation.FOREIGN_LISTENER)
                    self._set_state()
                    return
            if loop.time() < due:
                continue
            due = loop.time() + every
            result = await self._probe_once(inst)
            self._count(result)
            # Verified still? An event may have revoked it while the probe was out.
            if not result.ok and self.progress.failures >= self.cfg.failure_threshold and self._verified_as(inst):
                self._revoke(Revocation.RECHECK_FAILED)
            self._set_state()

    def _count(self, result: ProbeResult) -> None:
        p = self.progress
        p.probes += 1
        if result.ok:
            p.successes += 1
            p.failures = 0
            p.last_error = ""
        else:
            p.successes = 0
            p.failures += 1
            p.last_error = f"{result.failure}: {result.detail}"
        self.listener.on_probed(self, result)

    async def _pause(self, schedule: Schedule, result: ProbeResult, inst: Instance) -> None:
        """Wait before the next probe: as long as the schedule says for what `result` cost the
        server, or, after a refused connection, until the server listens (listen.py)."""
        wait = schedule.after(result, self.waiting_seconds)
        if self.strangers:
            await self.listen.until_alone(inst.main_pid, cap=wait.seconds)
        elif wait.watch:
            await self.listen.pause(wait.seconds, inst.main_pid, cap=self.cfg.backoff_max)
        else:
            await asyncio.sleep(wait.seconds)

    async def _probe_once(self, inst: Instance) -> ProbeResult:
        """One generation with the instance proof around it: same instance before and after.

        After a failed probe the next one is most likely a failure too (a server loading answers
        503 or refuses, five times a second), and the systemd read before it cost more CPU than
        the rest of the probe. So it goes out on the watcher's view alone; should it succeed,
        that success is not counted: the probe is made again at once, read before and after.
        (Not after a failure systemd's read caused: then systemd is asked again first.)"""
        p = self.progress
        if p.failures and p.last_failure != Failure.STALE_INSTANCE and is_ready(self.snap, inst):
            result = await self._generate(inst)
            if not result.ok:
                return result
        return await self._bracketed(inst)

    async def _bracketed(self, inst: Instance) -> ProbeResult:
        try:
            before = await self.fresh.read(self.unit)
        except Exception as e:
            return ProbeResult(False, Failure.STALE_INSTANCE, f"systemd read failed: {e}", None, 0.0, 0)
        if not is_ready(before, inst):
            return ProbeResult(False, Failure.STALE_INSTANCE, f"before the probe systemd showed {_show(before)}",
                               None, 0.0, 0)
        result = await self._generate(inst)
        if not result.ok:
            # Only a success needs the second read: a failure proves nothing to bracket, and while
            # a server loads, failures come every fraction of a second (schedule.py). A change of
            # instance meanwhile arrives as a D-Bus event and restarts probing anyway.
            return result
        try:
            after = await self.fresh.read(self.unit)
        except Exception as e:
            return ProbeResult(False, Failure.STALE_INSTANCE, f"systemd read failed: {e}", None, result.seconds, 0)
        if not is_ready(after, inst):
            return ProbeResult(False, Failure.STALE_INSTANCE, f"the instance changed during the probe: systemd "
                               f"now shows {_show(after)}", result.served_by_pid, result.seconds, 0)
        return result

    async def _generate(self, inst: Instance) -> ProbeResult:
        # The start time comes from the watcher's view (the fresh read skips it), only if that
        # view is of this very instance; 0 makes owner = "container" refuse rather than guess.
        s = self.snap
        started = s.exec_main_start_us if s and (s.invocation_id, s.main_pid) == inst else 0
        return await self.prober.probe(inst.main_pid, started_us=started, invocation_id=inst.invocation_id)

    def _verify(self, inst: Instance, result: ProbeResult) -> bool:
        """Mark `inst` verified, if the watcher's latest view still shows it ready (else False)."""
        if not is_ready(self.snap, inst):
            return False  # a change arrived while we probed: its event will reschedule probing
        assert self.snap is not None  # is_ready says so
        now = self.clock.wall()
        rec = self.history.get(inst.invocation_id)
        started = from_iso(rec.started_at) if rec else None  # wall clock: for since=, not a duration
        start_mono = self._start_mono(self.snap)
        load = round(max(0.0, self.clock.mono() - start_mono), 3) if start_mono is not None else None
        self._unsettled = True
        self.verified = Verification(inst, now, load, started, start_mono)
        rec = self.history.mark_ready(inst.invocation_id, ready_at=now, load_seconds=load,
                                      probes=self.progress.probes, served_by_pid=result.served_by_pid)
        log.info("%s: ready pid=%d invocation=%s load_seconds=%s probes=%d", self.name, inst.main_pid,
                 inst.invocation_id, load, self.progress.probes)
        self._refresh_expected(self.snap)
        if rec is not None:
            self.listener.on_verified(self, rec)
        return True

    # -- questions from the API --------------------------------------------------------------

    async def wait_changed(self, timeout: float) -> None:
        """Return when the state may have changed, or after `timeout` seconds."""
        with contextlib.suppress(TimeoutError):
            await wait_for(self._changed.wait(), timeout)

    async def check(self, *, since: float | None = None, pid: int | None = None,
                    invocation: str | None = None, since_mono: float | None = None) -> tuple[Verification | None, str]:
        """(the verification that holds, or None; why not). It must hold on a systemd read made
        after this call began. since_mono (CLOCK_MONOTONIC seconds), when given, decides instead
        of since (wall clock): a step of the wall clock does not move it."""
        v = self.verified
        if not self.ready or v is None:
            return None, self.reason or self.state
        if since_mono is not None:
            if v.started_mono is None or v.started_mono <= since_mono:
                return None, "the verified start began before since_monotonic="
        elif since is not None and (v.started_at is None or v.started_at <= since):
            return None, "the verified start began before since="
        if pid is not None and v.instance.main_pid != pid:
            return None, f"the verified pid is {v.instance.main_pid}, not {pid}"
        if invocation is not None and v.instance.invocation_id != invocation:
            return None, "the verified invocation is another one"
        try:
            fresh = await self.fresh.read(self.unit)
        except Unresponsive as e:
            return None, f"{SYSTEMD_UNRESPONSIVE}: {e}; genready vouches for no instance until it answers"
        except Exception as e:
            return None, f"systemd read failed: {e}"
        if self.verified is not v or not is_ready(fresh, v.instance):
            return None, f"systemd now shows {_show(fresh)}"
        return v, ""

    @property
    def config_changes(self) -> list[str]:
        """How the unit's ExecStart=/Environment= differ from what its running start was started with."""
        s = self.snap
        return config_changes(self.history.get(s.invocation_id), s) if s and s.invocation_id else []

    def config_json(self) -> dict[str, object]:
        """config_changed_since_start and config_changes, for /ready and /status."""
        changes = self.config_changes
        return {"config_changed_since_start": bool(changes), "config_changes": changes}

    def to_json(self) -> dict[str, object]:
        v, p, s = self.verified, self.progress, self.snap
        unverified = {"pid": s.main_pid if s else None, "invocation_id": s.invocation_id if s else None,
                      "ready_since": None, "load_seconds": None}
        return {
            "target": self.name, "unit": self.unit, "state": self.state, "reason": self.reason,
            "ready": self.ready, "url": self.cfg.url, "api": self.cfg.api,
            "model": self.prober.model_note or None,
            "health": self.prober.health,
            **(v.to_json() if v else unverified),
            "waiting_since": None if self.ready else iso(p.waiting_since),
            "probes": p.probes, "last_error": p.last_error or None,
            "warnings": list(self.cfg.warnings),
            "foreign_listeners": [x.to_json() for x in self.strangers],
            **self.load_json(), **self.config_json(),
            "snapshot": s.to_json() if s else None,
        }

    def load_json(self) -> dict[str, object]:
        """expected_load_seconds, and while loading, how long so far and the ETA (/status, /ready's 503)."""
        elapsed, eta = self.load_clock()
        return {"expected_load_seconds": self.expected_load_seconds,
                "loading_seconds": None if elapsed is None else round(elapsed, 3),
                "eta_seconds": None if eta is None else round(eta, 3)}

    async def reconfigure(self, cfg: TargetConfig) -> None:
        """Take new probe settings. A verification made under the old ones is not kept."""
        await self.close()
        self.cfg = cfg
        self.prober = self._prober_factory(cfg)
        self.listen = ListenWatch(cfg.endpoint, enabled=cfg.owner == "process")
        if self.verified is not None:
            if self.ready:
                self._revoke(Revocation.CONFIG_CHANGED)
            self.verified = None
        self.progress = self._new_progress()
        self._schedule_probing()
        self._set_state()

    async def close(self) -> None:
        self._changed.set()  # long-polls on this gate look again (it may be gone: a reload removed it)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.prober.close()
