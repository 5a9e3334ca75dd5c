"""Stand-ins for the gate's two outside parties, for in-process tests of its own logic.

Why fakes here, when the rest of the suite is real: these tests check the gate's decisions
row by row (every state, every revocation reason, the instance proof around a probe), which
needs systemd's answers and a server's answers chosen exactly and instantly. The same
transitions against a real systemd manager and a real server are covered end to end in
test_gate.py, test_hookups.py and test_hostile.py.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from genready import config
from genready.config import TargetConfig
from genready.rule.gate import TargetGate
from genready.store.records import RecordStore, StartRecord
from genready.systemd.snapshot import Snapshot
from genready.timewords import CLOCK, Clock
from genready.vocab import Failure, HealthRoute, ProbeResult, Revocation, State
from genready_dev.harness import await_for

UNIT = "t.service"


def snap(active: str = "active", pid: int = 100, inv: str = "inv-a", *, job: int = 0, load: str = "loaded",
         sub: str = "running", error: str = "") -> Snapshot:
    """A unit as systemd would describe it."""
    return Snapshot(UNIT, load_state=load, active_state=active, sub_state=sub, main_pid=pid, invocation_id=inv,
                    job_id=job, exec_main_start_us=int(time.time() * 1e6),
                    exec_main_start_mono_us=int(time.monotonic() * 1e6), error=error)


def target(name: str = "t", **kw: Any) -> TargetConfig:
    """A TargetConfig with every default from the config's own table, fast retries, no owner proof."""
    table = {"unit": UNIT, "url": "http://127.0.0.1:9", "verify_owner": False, "backoff_initial": 0.01,
             "backoff_max": 0.02, **kw}
    return config.parse({"targets": {name: table}}).targets[name]


def ok(pid: int) -> ProbeResult:
    return ProbeResult(True, None, "1 token(s)", pid, 0.001, 1, 200)


def failed(failure: Failure = Failure.HTTP_STATUS, status: int | None = 503) -> ProbeResult:
    return ProbeResult(False, failure, f"{failure} (scripted)", None, 0.001, 0, status)


class FakeFresh:
    """The fresh systemd read: answers whatever `snap` is now (as set by the test)."""

    def __init__(self) -> None:
        self.snap: Snapshot | None = None
        self.reads = 0

    async def read(self, unit: str) -> Snapshot:
        self.reads += 1
        assert self.snap is not None, "the test never said what systemd shows"
        return self.snap

    async def heartbeat(self) -> None:
        """The manager always answers here: nothing to watch."""
        await asyncio.Event().wait()

    def close(self) -> None:
        pass


class ScriptedProber:
    """The server: each probe answers `answer(main_pid)`; `during` runs while a probe is in flight
    (e.g. to change what systemd shows); `hold` makes probes wait until it is set."""

    def __init__(self) -> None:
        self.answer: Callable[[int], ProbeResult] = ok
        self.queue: deque[ProbeResult] = deque()  # answered first, one per probe
        self.during: Callable[[], None] | None = None
        self.hold: asyncio.Event | None = None
        self.calls = 0
        self.model_note = ""  # as Prober: which model it asks for, and why (shown by /status)
        self.health: HealthRoute | None = None  # as Prober: what health_path said at this start

    async def probe(self, main_pid: int, **kw: Any) -> ProbeResult:
        self.calls += 1
        if self.during is not None:
            self.during()
        if self.hold is not None:
            await self.hold.wait()
        await asyncio.sleep(0)
        return self.queue.popleft() if self.queue else self.answer(main_pid)

    async def close(self) -> None:
        pass


class Events:
    """A recording Listener: every event the gate emits, in order."""

    def __init__(self) -> None:
        self.states: list[State] = []
        self.revoked: list[Revocation] = []
        self.verified: list[StartRecord] = []
        self.starts: list[StartRecord] = []
        self.probes: list[ProbeResult] = []
        self.settled = 0
        self.then: Callable[[], None] | None = None  # run after every event (outputs.py does that)

    def _after(self) -> None:
        if self.then is not None:
            self.then()

    def on_state_changed(self, gate: TargetGate, old: State, new: State) -> None:
        self.states.append(new)
        self._after()

    def on_probed(self, gate: TargetGate, result: ProbeResult) -> None:
        self.probes.append(result)
        self._after()

    def on_verified(self, gate: TargetGate, record: StartRecord) -> None:
        self.verified.append(record)
        self._after()

    def on_revoked(self, gate: TargetGate, reason: Revocation) -> None:
        self.revoked.append(reason)
        self._after()

    def on_start_seen(self, gate: TargetGate, record: StartRecord) -> None:
        self.starts.append(record)
        self._after()

    def on_settled(self, gate: TargetGate) -> None:
        self.settled += 1
        self._after()


class Rig:
    """One TargetGate wired to the fakes above and a real RecordStore."""

    def __init__(self, tmp: Path, name: str = "t", *, clock: Clock = CLOCK, **cfg: Any) -> None:
        self.fresh = FakeFresh()
        self.prober = ScriptedProber()
        self.events = Events()
        self.closing: list[socket.socket] = []  # sockets a test opened for this rig, closed with it
        self.store = RecordStore(tmp / "state")
        self.store.load()
        self.gate = TargetGate(target(name, **cfg), self.store, self.fresh, self.events,  # type: ignore[arg-type]
                               prober_factory=lambda _cfg: self.prober,  # type: ignore[arg-type,return-value]
                               clock=clock)

    def show(self, s: Snapshot | None) -> None:
        """systemd now shows `s`, to fresh reads and as a D-Bus event (None: the bus is lost)."""
        if s is not None:
            self.fresh.snap = s
        self.gate.on_snapshot(s)

    async def until(self, pred: Callable[[], object], what: str, timeout: float = 5.0) -> None:
        await await_for(pred, timeout, lambda: f"{what} (state {self.gate.state}, reason {self.gate.reason!r})",
                        interval=0.002)

    async def ready(self, s: Snapshot) -> None:
        self.show(s)
        await self.until(lambda: self.gate.ready, f"ready for pid {s.main_pid}")

    async def close(self) -> None:
        await self.gate.close()
        self.store.close()
        for s in self.closing:
            s.close()
