"""`genready serve`: the daemon. What it promises:

- start-up: the API is bound before anything talks to systemd or probes a server (a taken port
  fails start-up at once); every resource opened is closed again, in reverse order, however
  start-up or the run ends (`startup()` pushes each cleanup on one exit stack);
- readiness is said only as the rule says it now: READY=1/STATUS= and the stamps are brought in
  line once per pass of a gate (`on_settled`), recomputed from the rule when sent
  (serve/outputs.py); every series of /metrics is made from the Targets at each scrape; the
  counters they expose and the log lines come from the gate's events (`on_*`);
- each target is one `Target` (serve/target.py): its gate and what is shown beside it, made and
  closed together, so a reload that removes it leaves nothing behind;
- SIGTERM/SIGINT: STOPPING=1, each long-poll in flight gets a 503 saying so, and genready exits within
  SHUTDOWN_DEADLINE (3 s) whatever blocks, every thread's stack logged if it had to be cut;
- SIGHUP: the config is re-read off the loop; a broken one is refused and the running one kept;
  targets are added, removed or re-probed (`reload_plan`); listen, bus and directories change
  only with a restart (`restart_needed`);
- signal handlers only set flags: the main loop acts on them, never a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from genready import __version__, compat, config
from genready.gpu.gauge import GpuCollector
from genready.log import Summarizer, event
from genready.probe.owner import owner_check_unavailable
from genready.rule.gate import TargetGate
from genready.serve import api, httplimits, stamp
from genready.serve.gpuwatch import DaemonGpu
from genready.serve.lastwords import LastWords
from genready.serve.metrics import Metrics, TargetCounters
from genready.serve.outputs import Outputs
from genready.serve.target import Target
from genready.store.records import RecordStore, StartRecord
from genready.systemd.fresh import FreshReader
from genready.systemd.notify import Notifier
from genready.systemd.snapshot import Snapshot
from genready.systemd.watcher import Watcher
from genready.systemd.worker import SD_BUS_TIMEOUT, Health
from genready.vocab import SYSTEMD_UNRESPONSIVE, Failure, ProbeResult, Revocation, State

log = logging.getLogger("genready")
UPKEEP_INTERVAL = 2.0  # seconds between retries of records and stamps that could not be written
SHUTDOWN_DEADLINE = 3.0  # seconds after which a stuck shutdown is cut short (faulthandler exits)
SHUTDOWN_GRACE = 0.5  # seconds in-flight HTTP requests get to finish at shutdown
FORGET_INTERVAL = 3600.0  # seconds between looks for records of targets removed long ago
CONFIG_READ_TIMEOUT = 10.0  # seconds a reload waits for the config file to be read (a hung mount)
T = TypeVar("T")
# Failures that do not go away while a model loads: someone has to act.
_NEEDS_AN_ADMIN = frozenset({Failure.FOREIGN_OWNER, Failure.REJECTED, Failure.TLS})


@dataclass(frozen=True)
class ReloadPlan:
    """What a new configuration changes among the targets (names, in config order)."""

    remove: tuple[str, ...]  # gone, or watching another unit now (removed, then added anew)
    reconfigure: tuple[str, ...]  # same unit, other settings: re-probed under the new ones
    add: tuple[str, ...]
    units_changed: bool  # the set of watched units differs: the watcher starts over
    # only `kind` changed: nothing the probe proves depends on it, so the verified start stands
    relabel: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.remove or self.reconfigure or self.add or self.relabel)


def reload_plan(old: Mapping[str, config.TargetConfig], new: Mapping[str, config.TargetConfig]) -> ReloadPlan:
    """The diff between two configs' targets, decided before anything is touched."""
    remove = tuple(n for n, t in old.items() if n not in new or new[n].unit != t.unit)
    changed = tuple(n for n, t in old.items() if n not in remove and new[n] != t)
    relabel = tuple(n for n in changed if replace(new[n], kind=old[n].kind) == old[n])
    reconfigure = tuple(n for n in changed if n not in relabel)
    add = tuple(n for n in new if n not in old or n in remove)
    units_changed = {t.unit for t in old.values()} != {t.unit for t in new.values()}
    return ReloadPlan(remove, reconfigure, add, units_changed, relabel)


class Daemon:
    """One genready process: watches every configured target and serves the API."""

    def __init__(self, cfg: config.Config, *, config_path: str | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.notifier = Notifier()
        # Every target's series are read from its Target, and the manager's health, at each scrape.
        self.metrics = Metrics(__version__, targets=lambda: [t.gauges() for t in self.targets.values()],
                               responsive=lambda: self.health.responsive)
        self.summarizer = Summarizer(logging.getLogger("genready.probe.probe"))
        self.should_exit = asyncio.Event()
        self.reload_requested = False
        self.config_error = ""
        self.restart_needed: list[str] = []  # settings a reload changed that only a restart applies
        self.listening = False
        self.records_failing = False  # a start-record write failed and has not been caught up yet
        self.owner_problem = owner_check_unavailable()
        # Each target's gate and what the surfaces show beside it, made and closed together.
        self.targets: dict[str, Target] = {}
        self._runner: compat.AppRunner | None = None
        self._watcher_task: asyncio.Task[None] | None = None
        self.health = Health(self._on_systemd_health)
        self._batch = 0  # > 0 while one systemd change is handed to the gates: outputs update once, after
        self._outputs_due = False
        self._progress_due = False  # a probe's progress line is to be sent after its pass (on_probed)
        # Everything startup() opens is pushed here as it is opened, so a failure halfway
        # (e.g. the port is taken) closes exactly what was opened, in reverse order.
        self._exit = contextlib.AsyncExitStack()
        self.gpu: DaemonGpu | None = None  # daemon.gpu_interval = 0: none

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(httplimits.LoopErrors())
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.should_exit.set)
        loop.add_signal_handler(signal.SIGHUP, self._request_reload)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.siginterrupt(sig, False)  # SA_RESTART: a signal does not fail the calls it interrupts
        try:
            await self.startup()
        except BaseException:
            await self._exit.aclose()
            raise
        try:
            await self.main_loop()
        finally:
            await self.shutdown()
        return 0

    async def startup(self) -> None:
        """Open everything, each resource's cleanup pushed on `self._exit` right after it opens.

        The API binds before the watcher starts: a port that is taken fails start-up before
        anything talks to systemd or probes a server.
        """
        d, stack = self.cfg.daemon, self._exit
        self.store = RecordStore(Path(d.state_dir))
        self.store.load()
        stack.callback(self.store.close)
        self._forget_removed()
        self.store.on_error = self._record_error
        self.store.on_recovered = self._records_recovered
        self.stamps = stamp.Stamps(d.runtime_dir, self._stamp_error, self._stamp_fixed)
        self.outputs = Outputs(self.notifier)
        self.fresh = FreshReader(d.bus, self.health)
        stack.callback(self.fresh.close)
        stack.callback(self.summarizer.flush_all)
        self.watcher = self._new_watcher()  # /status reports on it from the first request
        await self._serve_api(stack)
        for t in self.cfg.targets.values():
            self._add_target(t)
        stack.push_async_callback(self._close_targets)
        self._watcher_task = asyncio.create_task(self.watcher.run(), name="watcher")
        stack.push_async_callback(self._stop_watcher)
        self._background(stack, self.fresh.heartbeat(), "systemd-heartbeat")
        if self.notifier.watchdog_interval():
            self._background(stack, self._watchdog(), "watchdog")
        self._background(stack, self._upkeep(), "upkeep")
        if d.gpu_interval > 0:
            self.gpu = DaemonGpu(self.targets, self.store, d.gpu_interval)
            stack.callback(self.gpu.close)
            gpu = self.gpu
            self.metrics.registry.register(GpuCollector(lambda: gpu.latest))
            self._background(stack, self.gpu.run(), "gpu")
        self._update_outputs()
        # What start-up made (modules, config, the app, the gates) lives as long as the daemon: move
        # it out of the collector's sight. A full collection then walks only what came since, instead
        # of stalling the loop for milliseconds under load (/ready's p99 under 64 clients: 2.7x a
        # hello-world handler's with it in sight, 2x without; bench/ready_load.py).
        gc.collect()
        gc.freeze()

    async def _serve_api(self, stack: contextlib.AsyncExitStack) -> None:
        d = self.cfg.daemon
        guard = httplimits.ConnectionGuard(httplimits.connection_cap(len(self.cfg.targets)),
                                       on_refuse=self.metrics.api_refused)
        # The app holds self.targets itself: targets added later (and by reloads) are served.
        hosts = httplimits.HostCheck(lambda: self.cfg.daemon.allowed_hosts, d.listen,
                                     on_refuse=self.metrics.api_refused)
        app = api.make_app(self.targets, self.metrics, self._status_extra,
                           limits=(guard.middleware, hosts.middleware),
                           max_long_polls=max(1, guard.max_connections // 2))
        # aiohttp waits up to shutdown_timeout (default 60 s) for handlers still running at
        # shutdown, and a /ready?wait= long-poll (every `genready wait`) runs for minutes:
        # SIGTERM must finish within seconds. aiohttp waits twice (for the handler to finish,
        # then for it to take a cancellation), so a long-poll is cut after ~2 × SHUTDOWN_GRACE.
        runner = compat.AppRunner(app, access_log=None, handle_signals=False,
                                  shutdown_timeout=SHUTDOWN_GRACE, logger=httplimits.request_logger())
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        self._runner = runner
        assert runner.server is not None
        guard.install(runner.server)
        site = compat.tcp_site(runner, d.host, d.port, reuse_address=True)
        await site.start()
        self.listening = True
        self._write_running(stack)
        log.info("genready %s listening on http://%s/ (targets: %s)", __version__, d.listen,
                 ", ".join(t.name for t in self.cfg.targets.values()))
        if warning := config.listen_warning(d):
            log.warning("%s", warning)

    def _write_running(self, stack: contextlib.AsyncExitStack) -> None:
        """Say what this process runs with, for check-config's "restart needed" (best effort: a
        read-only runtime_dir costs only that)."""
        d = self.cfg.daemon
        path = Path(d.runtime_dir) / stamp.RUNNING_FILE
        info: dict[str, object] = {"pid": os.getpid(), "config": self.cfg.path,
                                   **{s.name: getattr(d, s.name) for s in config.DAEMON_SETTINGS if s.restart}}
        try:
            stamp.write_json(path, info)
        except OSError as e:
            log.debug("cannot write %s: %s", path, e)
            return
        stack.callback(lambda: path.unlink(missing_ok=True))

    @staticmethod
    def _background(stack: contextlib.AsyncExitStack, coro: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        stack.push_async_callback(_cancel, task)

    async def main_loop(self) -> None:
        while not self.should_exit.is_set():
            with contextlib.suppress(TimeoutError):
                await compat.wait_for(self.should_exit.wait(), 0.5)
            if self.reload_requested:
                self.reload_requested = False
                await self._reload()

    async def shutdown(self) -> None:
        # A hard bound, from a C thread that needs no GIL: whatever blocks, genready exits, with
        # every thread's stack in the log saying where.
        faulthandler.dump_traceback_later(SHUTDOWN_DEADLINE, exit=True)
        t0 = time.monotonic()
        self.notifier.stopping(status="genready: stopping")
        if self._runner is not None:
            self._runner.app[api.STOPPING].set()
        log.info("shutting down")
        await self._exit.aclose()
        log.info("shutdown took %.0f ms", (time.monotonic() - t0) * 1000)

    async def _close_targets(self) -> None:
        # All at once: one after the other, each waiting for its probe to unwind, adds up over many targets.
        await asyncio.gather(*(t.close() for t in self.targets.values()), return_exceptions=True)

    def _add_target(self, t: config.TargetConfig) -> None:
        gate = TargetGate(t, self.store, self.fresh, self)
        self.targets[t.name] = Target(gate, LastWords(gate, self.cfg.daemon.bus), self.stamps)
        for w in t.warnings:
            log.warning("%s: %s", t.name, w)
        if t.verify_owner and self.owner_problem:
            log.warning("%s: cannot prove who answers generations: %s; no start will be verified "
                        "until this is fixed (or set verify_owner = false)", t.name, self.owner_problem)

    def _new_watcher(self) -> Watcher:
        return Watcher(self.cfg.daemon.bus, [t.unit for t in self.cfg.targets.values()], self._on_snapshot,
                       self.health)

    async def _stop_watcher(self) -> None:
        if self._watcher_task is not None:
            await _cancel(self._watcher_task)
            self._watcher_task = None

    def _request_reload(self) -> None:
        self.reload_requested = True

    async def _reload(self) -> None:
        """SIGHUP: re-read the config and apply it. A broken one is refused, the running one kept.

        Targets are added, removed or re-probed under their new settings (`reload_plan`); the
        daemon's own address, bus and directories are wired at startup and change only with a
        restart.
        """
        path = config.resolve_path(self.config_path)
        try:
            # Off the loop: the API answers while the file is read, and a read that hangs is given up.
            loaded = await in_thread(lambda: config.load(path), CONFIG_READ_TIMEOUT)
        except (config.ConfigError, TimeoutError) as e:
            self.config_error = str(e) if isinstance(e, config.ConfigError) else \
                f"{path}: not read within {CONFIG_READ_TIMEOUT:g} s"
            log.error("config reload refused, keeping the running config: %s", self.config_error)
            self._update_outputs()
            return
        self.config_error = ""
        self.restart_needed = config.restart_needed(self.cfg.daemon, loaded.daemon)
        for why in self.restart_needed:
            log.warning("config reload: %s; the running value is kept until genready restarts", why)
        new = replace(loaded, daemon=config.keep_running(self.cfg.daemon, loaded.daemon))
        if new == self.cfg:
            log.info("config reloaded from %s: unchanged", path)
            self._update_outputs()
            return
        self.outputs.begin_reload()
        logging.getLogger("genready").setLevel(new.daemon.log_level.upper())
        # One event: the outputs are brought in line once, after every target has taken the new config.
        self._batch += 1
        try:
            plan = reload_plan(self.cfg.targets, new.targets)
            self.cfg = new
            if plan.units_changed:
                await self._stop_watcher()
            for name in plan.remove:
                await self.targets.pop(name).close(removed=True)
                self.summarizer.flush(name)  # its repeated probe failures are summed up now, not never
            for name in plan.reconfigure:
                await self.targets[name].gate.reconfigure(new.targets[name])
            for name in plan.relabel:
                self.targets[name].gate.cfg = new.targets[name]  # /status's kind follows (serve/target.py)
            for name in plan.add:
                self._add_target(new.targets[name])
                if not plan.units_changed:
                    # The unit is watched already: its current snapshot is the new target's at once,
                    # not "not connected to systemd yet" until the unit next changes.
                    snap = self.watcher.snapshot(new.targets[name].unit)
                    if snap is not None:
                        self._to_target(self.targets[name], snap)
            if plan.units_changed:
                self.watcher = self._new_watcher()
                self._watcher_task = asyncio.create_task(self.watcher.run(), name="watcher")
        finally:
            self._batch -= 1
        event(log, logging.INFO, "config reloaded", path=str(path), targets=",".join(self.targets))
        self._update_outputs()
        await self._forget_removed_off_loop()

    async def _watchdog(self) -> None:
        # Pinged from the event loop itself, so a stuck loop stops the pings and systemd acts.
        interval = self.notifier.watchdog_interval() or 1.0
        while True:
            self.notifier.watchdog_ping()
            await asyncio.sleep(interval)

    # -- gate events (the Listener protocol) ----------------------------------------------

    def _on_snapshot(self, unit: str, snap: Snapshot | None) -> None:
        # One change may revoke, record a start and change the state: the outputs are rebuilt
        # once, after every gate of the unit has taken it.
        self._batch += 1
        try:
            for t in list(self.targets.values()):
                if t.unit == unit:
                    self._to_target(t, snap)
            if self.gpu is not None:
                self.gpu.poke(unit, snap)  # after the targets: a failed start's record is there to fill
        finally:
            self._batch -= 1
        if not self._batch and self._outputs_due:
            self._update_outputs()

    def _to_target(self, t: Target, snap: Snapshot | None) -> None:
        t.gate.on_snapshot(snap)
        if snap is not None and t.lastwords is not None:
            t.lastwords.follow(snap)  # after the gate: its start records are up to date
        self._note_config_changes(t)

    def _on_systemd_health(self, responsive: bool) -> None:
        """The manager stopped answering, or answers again: said once each way, in the log and
        STATUS= (the gauge reads `health` itself); after a silence every unit is re-read (signals
        queued meanwhile may be late)."""
        if responsive:
            log.warning("the %s systemd manager answers again; checking the subscription and re-reading every "
                        "unit", self.cfg.daemon.bus)
            self.watcher.resync()
        else:
            log.warning("the %s systemd manager does not answer (stopped, or busy in a long daemon-reload); /ready "
                        "answers 503 %s until it does", self.cfg.daemon.bus, SYSTEMD_UNRESPONSIVE)
        self._update_outputs()

    def _note_config_changes(self, t: Target) -> None:
        """One log line each time a target's unit starts or stops differing from what its running
        start was started with (the gauge reads `config_changes` itself)."""
        g, changes = t.gate, t.gate.config_changes
        if bool(changes) != t.config_changed:
            t.config_changed = bool(changes)
            if changes:
                log.warning("%s: %s changed since pid %s started; it is still ready but runs the old configuration "
                            "until restarted (guard and sweep refuse it): %s", g.name, g.unit,
                            g.snap.main_pid if g.snap else "?", "; ".join(changes))
            else:
                log.info("%s: %s runs its unit's configuration again", g.name, g.unit)

    def on_state_changed(self, gate: TargetGate, old: State, new: State) -> None:
        event(log, logging.INFO, f"{gate.name}: {old} -> {new}", reason=gate.reason or None,
              pid=gate.snap.main_pid if gate.snap else None)
        if new in (State.INACTIVE, State.ABSENT, State.UNKNOWN):
            self.summarizer.flush(gate.name)

    def _counters(self, gate: TargetGate) -> TargetCounters:
        """The counters of the target whose gate this is (a gate closed by a reload may still report:
        its counts go nowhere)."""
        t = self.targets.get(gate.name)
        return t.counters if t is not None and t.gate is gate else TargetCounters()

    def on_probed(self, gate: TargetGate, result: ProbeResult) -> None:
        counters = self._counters(gate)
        counters.probe(str(result.failure or "ok"), result.seconds)
        if result.failure is Failure.FOREIGN_OWNER:
            counters.foreign_answer()
        if result.ok:
            self.summarizer.flush(gate.name)
        else:
            self.summarizer.note(gate.name, str(result.failure), f"{gate.name}: probe failed: {result.failure}",
                                 level=logging.WARNING if result.failure in _NEEDS_AN_ADMIN else logging.INFO,
                                 detail=result.detail, pid=gate.snap.main_pid if gate.snap else None)
        # After the pass this probe is part of: if it verified or changed the state, on_settled has sent
        # STATUS= with that by then, and the progress line is not due (one notification per event).
        if not self._progress_due:
            self._progress_due = True
            asyncio.get_running_loop().call_soon(self._progress)

    def _progress(self) -> None:
        self._progress_due = False
        self.outputs.progress(self.targets.values(), notes=self._notes())

    def on_start_seen(self, gate: TargetGate, record: StartRecord) -> None:
        self._counters(gate).start_seen()
        event(log, logging.INFO, f"{gate.name}: new start recorded", invocation=record.invocation_id,
              pid=record.main_pid or None)

    def on_verified(self, gate: TargetGate, record: StartRecord) -> None:
        if record.load_seconds is not None:
            self._counters(gate).loaded(record.load_seconds)

    def on_revoked(self, gate: TargetGate, reason: Revocation) -> None:
        self._counters(gate).revoked(reason)

    def on_settled(self, gate: TargetGate) -> None:
        """The end of a gate's pass that verified, revoked or changed the state: sd_notify and the
        stamps are brought in line once for all of it (after every gate, during a snapshot)."""
        self._update_outputs()

    def _update_outputs(self) -> None:
        if self._batch:
            self._outputs_due = True
            return
        self._outputs_due = False
        self.outputs.update(self.targets.values(), listening=self.listening, notes=self._notes())

    def _notes(self) -> list[str]:
        notes = ([f"config reload refused: {self.config_error}"] if self.config_error else []) + self.restart_needed
        if not self.health.responsive:
            notes.append(f"{SYSTEMD_UNRESPONSIVE}: the systemd manager does not answer")
        return notes

    # -- outputs that may fail without stopping anything -------------------------------------

    async def _upkeep(self) -> None:
        """Catch up on records and stamps a full or read-only directory kept from being written;
        now and then, forget the records of targets removed long ago."""
        last_forget = time.monotonic()
        while True:
            await asyncio.sleep(UPKEEP_INTERVAL)
            self.catch_up()
            if time.monotonic() - last_forget >= FORGET_INTERVAL:
                last_forget = time.monotonic()
                await self._forget_removed_off_loop()

    async def _forget_removed_off_loop(self) -> None:
        # The rewrite fsyncs: off the loop (the store is thread-safe), and never waited for long.
        with contextlib.suppress(TimeoutError):
            await in_thread(self._forget_removed, CONFIG_READ_TIMEOUT)

    def _forget_removed(self) -> None:
        """Drop the start records of targets no longer configured after daemon.forget_removed_after:
        else they are kept, and parsed at every start, for ever (200 old targets x 1,000 records
        took 2.6 s and 150 MB at start)."""
        after = self.cfg.daemon.forget_removed_after
        if after <= 0:
            return
        gone = self.store.forget_removed(self.cfg.targets, time.time() - after)
        if gone:
            event(log, logging.INFO, "forgot the start records of removed targets", targets=",".join(gone),
                  after_days=round(after / 86400, 1))

    def catch_up(self) -> None:
        if self.store.unsynced:
            self.store.sync_soon()  # the store's writer thread rewrites the file: no fsync on the loop
        self.stamps.retry()

    # The store calls these two on its writer thread, one at a time (never both at once, never
    # with the loop's state half-changed): they touch only records_failing, which nothing on the
    # loop reads, the metrics (prometheus_client's counters are thread-safe) and the log.
    def _records_recovered(self) -> None:
        if self.records_failing:
            self.records_failing = False
            log.warning("start records are written to %s again; the ones kept in memory meanwhile are on disk",
                        self.store.path)

    def _record_error(self, e: OSError) -> None:
        self.metrics.record_error()
        if not self.records_failing:
            self.records_failing = True
            log.error("cannot write start records to %s: %s; readiness is not affected: records are kept in "
                      "memory and written once that works again (retried every %g s)", self.store.path,
                      e.strerror or e, UPKEEP_INTERVAL)

    def _stamp_error(self, target: str, e: OSError, first: bool) -> None:
        t = self.targets.get(target)
        if first and t is not None:  # a removed target's stamp, still being removed, counts for no target
            t.counters.stamp_error()
        path = stamp.stamp_path(self.stamps.runtime_dir, target)
        self.summarizer.note(f"stamp:{target}", f"stamp error {e.errno}",
                             f"{target}: cannot update the ready stamp {path}: {e.strerror or e}; /ready, /status "
                             f"and the metrics are not affected; retried every {UPKEEP_INTERVAL:g} s",
                             level=logging.ERROR)

    def _stamp_fixed(self, target: str) -> None:
        self.summarizer.flush(f"stamp:{target}")
        log.warning("%s: the ready stamp is up to date again", target)

    def _status_extra(self) -> dict[str, object]:
        return {
            "bus": self.cfg.daemon.bus,
            "bus_connected": self.watcher.connected,
            "bus_error": self.watcher.last_error or None,
            "systemd_responsive": self.health.responsive,
            "systemd_silent_seconds": round(self.health.silent_for(), 3),
            "owner_proof": self.owner_problem or "available",
            "config": self.cfg.path,
            "config_error": self.config_error or None,
            "restart_needed": self.restart_needed,
            "systemd_ready_sent": self.outputs.sent_ready,
            "fresh_reads": self.fresh.reads,
        }


async def in_thread(fn: Callable[[], T], timeout: float) -> T:
    """fn() on a thread of its own, waited for at most `timeout` seconds (TimeoutError). A call
    stuck for good (a file on a hung mount) leaves only that thread behind: not the event loop,
    and not the exit either (a daemon thread; asyncio.to_thread's pool is joined at exit)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if fut.done():
            return  # given up on (timed out) meanwhile
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]  # None only together with an error

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = fn()
        except BaseException as e:  # handed to the awaiting coroutine
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="genready-blocking", daemon=True).start()
    return await compat.wait_for(fut, timeout)


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait until it has ended, whatever it ended with.

    Again every 0.1 s until it has: Python 3.11's asyncio.wait_for swallows a cancellation that
    arrives as its inner call fails (the watcher's bus check against a bus that is not there),
    and the task would go on retrying, holding up the shutdown until its 3 s cut."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def serve(cfg: config.Config, config_path: str | None) -> int:
    """Run the daemon until SIGTERM/SIGINT; the exit status."""
    # `kill -USR1` dumps every thread's stack to stderr (the journal): a stuck loop explains itself.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # sd-bus's method timeout (25 s by default) bounds how long a call stuck on a frozen manager
    # occupies its connection; shorter, the first question after a thaw is answered sooner.
    os.environ.setdefault("SYSTEMD_BUS_TIMEOUT", f"{SD_BUS_TIMEOUT:g}s")
    return asyncio.run(Daemon(cfg, config_path=config_path).run())
