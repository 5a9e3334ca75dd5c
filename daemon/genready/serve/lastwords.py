"""A failed start's own last words: the lines of the unit's output written by a start that ended
before it was verified, for /status (`last_failure`), `genready status` and /ready's `start_failed`.

Fed by the daemon with each snapshot after the gate has taken it (so the start records are up to
date): while no process runs it notes where the unit's output files stand (the next start's lines
begin there); when a start ends unverified it reads that start's lines, off the loop, and wakes
the gate's long-polls. The readiness rule (rule/) knows nothing of output files or journals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine

from genready.compat import wait_for
from genready.rule.gate import TargetGate
from genready.systemd.snapshot import Snapshot
from genready.systemd.unitlog import JOURNALCTL_TIMEOUT, OutputMark
from genready.timewords import from_iso

log = logging.getLogger("genready.serve.lastwords")
KEEP_MARKS = 16


class LastWords:
    """One target's last failed start and its lines."""

    def __init__(self, gate: TargetGate, bus_kind: str) -> None:
        self.gate = gate
        self.bus_kind = bus_kind
        # The last start that ended before it was verified: how it ended and its own last words.
        self.failure: dict[str, object] | None = None
        # Starts that ended before this are history, not news (wall clock, and monotonic for systemd's own).
        self._created, self._created_mono = time.time(), time.monotonic()
        # Where the unit's output stood at its last quiet moments: (when the read of the sizes ended, on the
        # wall clock and the monotonic one, the mark), oldest first. A start's lines begin at the newest mark
        # read before its process started.
        self._marks: list[tuple[float, float, OutputMark]] = []
        self._chores: set[asyncio.Task[None]] = set()  # file reads off the loop (marks, failed starts)

    def lines(self, invocation_id: str) -> list[str]:
        """The lines of the start `invocation_id`, if it is the last failed one and they were read; else []."""
        f = self.failure
        return list(f["journal"]) if f is not None and f["invocation_id"] == invocation_id else []  # type: ignore[call-overload]

    def follow(self, snap: Snapshot) -> None:
        """While no process runs, note where the unit's output files stand (the next start's lines
        begin there); when a start ends before it was verified, collect its last lines."""
        # MainPID 0: no process of any start runs. (Not "inactive" alone: for a moment at each start
        # systemd shows inactive/dead with the NEW MainPID, whose first lines must not be skipped.)
        if snap.main_pid:
            return
        g = self.gate
        for rec in g.store.newest(g.name, 2):
            if self.failure is not None and self.failure["invocation_id"] == rec.invocation_id:
                break  # known already, and nothing newer ended (else an older failure would take its place)
            ended = from_iso(rec.ended_at)
            if (rec.ready_at is None and ended is not None and self._news(ended, rec.invocation_id, snap)
                    and rec.result != "unknown"):
                self.failure = {"invocation_id": rec.invocation_id, "main_pid": rec.main_pid,
                                "started_at": rec.started_at, "ended_at": rec.ended_at, "result": rec.result,
                                "exit_code": rec.exit_code, "exit_status": rec.exit_status, "journal": [],
                                # The strays holding GPU memory when it ended (serve/gpuwatch.py fills it in).
                                "gpu_strays": None}
                started = from_iso(rec.started_at) or ended
                # A mark read after the process began (a process that wrote within milliseconds of its
                # start, while the read was on its way) would hide its lines: not that one. Compared on the
                # monotonic clock where systemd gives this start's (a wall-clock step moves no mark).
                mono = snap.exec_main_start_mono_us / 1e6 if snap.invocation_id == rec.invocation_id else 0.0
                mark = next((m for wall, mo, m in reversed(self._marks) if (mo < mono if mono else wall < started)),
                            OutputMark(started))
                self._chore(self._collect(self.failure, mark, snap))
                break
        # Also with a job pending (a restart: the old process is gone, the new one not started yet), so a
        # failed start's lines begin after its predecessor's. A mark whose read ended after the new
        # process began may hold some of its lines: the choice above passes over it.
        self._chore(self._take_mark(snap))

    def _news(self, ended: float, invocation_id: str, snap: Snapshot) -> bool:
        """Did the start end after this genready began? On the monotonic clock when `snap` shows that
        start's end (systemd's InactiveEnterTimestampMonotonic, after its process started), so that a
        wall-clock step hides no failure; else on the wall clock of its record."""
        end = snap.inactive_enter_mono_us if snap.invocation_id == invocation_id else 0
        if end and end >= snap.exec_main_start_mono_us:
            return end / 1e6 >= self._created_mono
        return ended >= self._created

    def _chore(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _take_mark(self, snap: Snapshot) -> None:
        try:
            mark = await wait_for(asyncio.to_thread(OutputMark.take, snap.fragment_path, snap.dropin_paths),
                                  JOURNALCTL_TIMEOUT)
            # Several snapshots of one quiet moment each bring a mark: keep enough that one from before a
            # start survives those taken after it ended (a process that lived a few milliseconds).
            self._marks = [*self._marks[-(KEEP_MARKS - 1):], (time.time(), time.monotonic(), mark)]
        except Exception as e:
            log.warning("%s: cannot note where %s's output stands: %s", self.gate.name, self.gate.unit, e)

    async def _collect(self, failure: dict[str, object], mark: OutputMark, snap: Snapshot) -> None:
        g = self.gate
        unit, secrets = g.unit, [g.cfg.api_key]

        def read() -> list[str]:
            m = mark
            if not m.sizes:  # no mark yet (genready started while the unit ran): the files' own tails
                whole = OutputMark.take(snap.fragment_path, snap.dropin_paths, since=m.since)
                m = OutputMark(m.since, dict.fromkeys(whole.sizes, 0))
            return m.lines(self.bus_kind, unit, secrets=secrets)

        try:
            lines = await wait_for(asyncio.to_thread(read), JOURNALCTL_TIMEOUT + 2)
        except Exception as e:
            lines = [f"(genready could not read the unit's output: {e})"]
        failure["journal"] = lines
        g.wake()  # a long-poll waiting on start_failed answers with the lines

    def close(self) -> None:
        for chore in list(self._chores):
            chore.cancel()
