"""Fresh reads of a unit for /ready, and the heartbeat, on the event loop without ever waiting on it.

`/ready` answers 200 only on a systemd read that began after the request arrived. The read is
a batch of Properties.Get questions on one sd-bus connection of its own (sdbus.py), sent without
blocking; the loop watches the connection's fd and collects the answers as they come. No thread:
a frozen manager leaves the questions unanswered and the loop free, and a bounded wait (a timer)
tells the callers `systemd_unresponsive`.

Concurrent callers share reads: every caller that arrives before a read is sent joins it, and
while one read is out the next callers gather for the one after. A burst of /ready requests costs
one round trip to the manager, not one per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from genready.systemd import sdbus
from genready.systemd.bus import MANAGER_IFACE, MANAGER_PATH, timed_out, unit_path
from genready.systemd.snapshot import QUICK, Snapshot, quick_snapshot
from genready.systemd.worker import CALL_TIMEOUT, READ_TIMEOUT, SD_BUS_TIMEOUT, Health, Unresponsive, settle

log = logging.getLogger("genready.systemd.fresh")
HEARTBEAT: Final = 1.0  # seconds between "do you answer?" questions to the manager


class FreshReader:
    """Reads a unit's identity and state, sharing reads between callers (see the module docstring).

    `read(unit)` returns a snapshot from a read that *began after the call*; it waits at most
    READ_TIMEOUT, and while a question has gone unanswered longer than that it raises
    Unresponsive at once. A question unanswered for SD_BUS_TIMEOUT gives up on the connection
    (as sd-bus's own method timeout would); the next read opens a new one.
    """

    def __init__(self, bus_kind: str, health: Health | None = None) -> None:
        self.bus_kind = bus_kind
        self.health = health or Health()
        self.reads = 0
        self._conn: sdbus.Connection | None = None
        self._fd = -1  # the connection's fd as registered with the loop (sd-bus may close it first)
        self._writing = False  # the loop watches the fd for writability too
        self._asked: dict[int, _Question] = {}  # cookie -> the question it belongs to
        self._out: list[_Question] = []  # the questions not fully answered, oldest first
        self._pending: dict[str, _Batch] = {}
        self._flush_scheduled = False
        self._in_flight = False

    def overdue(self) -> float:
        """Seconds beyond READ_TIMEOUT the oldest unanswered question has waited (0: none has)."""
        if not self._out:
            return 0.0
        late = time.monotonic() - self._out[0].sent - READ_TIMEOUT
        return late if late > 0 else 0.0

    async def read(self, unit: str) -> Snapshot:
        """A snapshot read after this call began; raises on D-Bus errors (caller: not ready)."""
        if late := self.overdue():
            self._give_up_if_hopeless()
            raise Unresponsive(f"the {self.bus_kind} manager has not answered for {late + READ_TIMEOUT:.1f} s")
        loop = asyncio.get_running_loop()
        batch = self._pending.get(unit)
        if batch is None:
            # One timer per batch, not per caller (asyncio.wait with a timeout per /ready cost a
            # fifth of the request): armed when the first caller arrives, it bounds every later one.
            batch = self._pending[unit] = _Batch()
            batch.timer = loop.call_later(READ_TIMEOUT, self._expire, unit, batch)
            if not self._flush_scheduled and not self._in_flight:
                # call_soon: the read is sent after every handler already scheduled in this loop
                # iteration has joined it, and strictly after each of them arrived.
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        # A future per caller: a cancelled caller cancels its own, never the others' answer.
        fut: asyncio.Future[Snapshot] = loop.create_future()
        batch.waiters.append(fut)
        return await fut

    def _expire(self, unit: str, batch: _Batch) -> None:
        """A batch has waited READ_TIMEOUT: its callers hear Unresponsive (the read, if out, goes on)."""
        if self._pending.get(unit) is batch:
            del self._pending[unit]  # later callers start a batch of their own, with their own bound
        if all(fut.done() for fut in batch.waiters):
            return
        self.health.silent()
        err = Unresponsive(f"the {self.bus_kind} manager has not answered for {READ_TIMEOUT:g} s")
        for fut in batch.waiters:
            settle(fut, False, err)

    def _flush(self) -> None:
        self._flush_scheduled = False
        batches, self._pending = self._pending, {}
        if not batches:
            return  # every caller's wait ran out before the read could be sent
        self.reads += len(batches)
        self._in_flight = True
        left = len(batches)

        def answered(unit: str, answers: list[Any] | BaseException) -> None:
            nonlocal left
            batch = batches[unit]
            if batch.timer is not None:
                batch.timer.cancel()
            ok: bool = False
            value: Any = answers
            if not isinstance(answers, BaseException):
                try:
                    ok, value = True, quick_snapshot(unit, answers)
                except Exception as e:
                    value = e
            if ok or not timed_out(value):
                self.health.answered()
            for fut in batch.waiters:
                settle(fut, ok, value)
            left -= 1
            if left == 0:  # one read at a time: the next callers gathered meanwhile go now
                self._in_flight = False
                if self._pending and not self._flush_scheduled:
                    self._flush_scheduled = True
                    asyncio.get_running_loop().call_soon(self._flush)

        for unit in batches:
            path = unit_path(unit)
            self._ask([(path, iface, prop, sig) for iface, prop, sig in QUICK],
                      lambda answers, unit=unit: answered(unit, answers))  # type: ignore[misc]

    async def heartbeat(self, interval: float = HEARTBEAT) -> None:
        """Ask the manager for its Version every `interval` seconds, so a manager that stops answering
        shows (genready_systemd_responsive 0, the log) even when nobody asks /ready, and one that
        answers again is noticed (the watcher then re-reads every unit)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            if self._out:  # a question is out already: its answer will tell
                if time.monotonic() - self._out[0].sent > CALL_TIMEOUT:
                    self.health.silent()
                self._give_up_if_hopeless()
                continue
            fut: asyncio.Future[Any] = loop.create_future()

            def version(answers: list[Any] | BaseException, fut: asyncio.Future[Any] = fut) -> None:
                settle(fut, not isinstance(answers, BaseException), answers)

            self._ask([(MANAGER_PATH, MANAGER_IFACE, b"Version", "s")], version)
            done, _ = await asyncio.wait([fut], timeout=CALL_TIMEOUT)
            if not done:
                self.health.silent()
            elif fut.exception() is None or not timed_out(fut.exception()):  # type: ignore[arg-type]
                self.health.answered()

    # -- the connection ---------------------------------------------------------------------

    def _ask(self, gets: list[tuple[bytes, bytes, bytes, str]],
             then: Callable[[list[Any] | BaseException], None]) -> None:
        """Send the questions; `then(answers)` once every one is answered, or `then(error)` if the
        connection fails first."""
        q = _Question(len(gets), then)
        try:
            conn = self._connection()
            for i, (path, iface, prop, sig) in enumerate(gets):
                cookie = conn.send_get(path, iface, prop, sig)
                self._asked[cookie], q.index[cookie] = q, i
        except OSError as e:
            self._lost(e)
            q.finish(e)
            return
        self._out.append(q)
        self._on_io()  # write what sd-bus queued, and take what may have come already

    def _connection(self) -> sdbus.Connection:
        if self._conn is None:
            conn = sdbus.Connection(self.bus_kind, int(SD_BUS_TIMEOUT * 1e6))
            self._fd = conn.fileno()
            asyncio.get_running_loop().add_reader(self._fd, self._on_io)
            self._conn, self._writing = conn, False
        return self._conn

    def _on_io(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            answers = conn.process()
        except OSError as e:
            self._lost(e)
            return
        for cookie, value in answers:
            q = self._asked.pop(cookie, None)
            if q is not None and q.answer(cookie, value):
                self._out.remove(q)
        if conn is not self._conn:
            return  # an answer's handler gave up on this connection
        if not conn.alive():
            self._lost(ConnectionError(f"the {self.bus_kind} bus closed the connection"))
            return
        wants = conn.wants_write()
        if wants != self._writing:
            loop = asyncio.get_running_loop()
            if wants:
                loop.add_writer(self._fd, self._on_io)
            else:
                loop.remove_writer(self._fd)
            self._writing = wants

    def _give_up_if_hopeless(self) -> None:
        if self._out and time.monotonic() - self._out[0].sent > SD_BUS_TIMEOUT:
            self._lost(TimeoutError(f"the {self.bus_kind} manager has not answered for {SD_BUS_TIMEOUT:g} s"))

    def _lost(self, e: BaseException) -> None:
        """The connection is gone (or given up on): every question out fails with `e`; the next
        read opens a new connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                loop = asyncio.get_running_loop()
                # By the number registered: at EOF sd-bus has closed the fd already, and a stale
                # registration would swallow the next socket that gets the same number.
                loop.remove_reader(self._fd)
                loop.remove_writer(self._fd)
            self._fd = -1
            conn.close()
        out, self._asked, self._out = self._out, {}, []
        for q in out:
            q.finish(e)

    def close(self) -> None:
        self._lost(ConnectionError("genready is shutting down"))


@dataclass
class _Batch:
    """The callers waiting for one unit's next fresh read, and the timer that bounds their wait."""

    waiters: list[asyncio.Future[Snapshot]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class _Question:
    """Some Gets sent together: their answers, in the order asked, go to `then` once all are in."""

    def __init__(self, n: int, then: Callable[[list[Any] | BaseException], None]) -> None:
        self.sent = time.monotonic()
        self.answers: list[Any] = [None] * n
        self.index: dict[int, int] = {}  # cookie -> position
        self.left = n
        self.then: Callable[[list[Any] | BaseException], None] | None = then

    def answer(self, cookie: int, value: Any) -> bool:
        """Record one answer; True once every answer is in (and `then` has been called)."""
        self.answers[self.index[cookie]] = value
        self.left -= 1
        if self.left:
            return False
        self.finish(self.answers)
        return True

    def finish(self, result: list[Any] | BaseException) -> None:
        then, self.then = self.then, None
        if then is not None:
            try:
                then(result)
            except Exception:
                log.exception("handling the manager's answer failed")
