"""The watcher's calls off the event loop (`Worker`: one thread, one connection), and the one view
of whether the manager answers (`Health`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from genready.systemd.bus import open_bus, retry_eintr, timed_out

if TYPE_CHECKING:
    from genready.systemd import sdbus

log = logging.getLogger("genready.systemd.worker")

# How long the loop waits for an answer the API needs (a fresh read for /ready): /ready must answer
# within 1 s even when the manager does not, so the bound sits below that.
READ_TIMEOUT: Final = 0.75
# How long anything else waits (connect, subscribe, a full read of a unit, a heartbeat) before the
# manager counts as unresponsive. The call itself goes on: its answer is still used when it comes.
CALL_TIMEOUT: Final = 2.0
# sd-bus's own method timeout for the daemon's connections (default 25 s): a call stuck on a frozen
# manager ends after this, and the next one is answered as soon as the manager is back.
SD_BUS_TIMEOUT: Final = 5.0
# How long `Worker.answering()` waits for the manager's Version (through sdbus) before a pystemd
# call that would wait for the manager is skipped instead. Equal
# to READ_TIMEOUT: a manager that slow fails /ready's own reads as well.
PROBE_TIMEOUT: Final = READ_TIMEOUT


class Unresponsive(TimeoutError):
    """The manager did not answer within the bound; the call goes on in its worker thread (or, raised
    by `Worker.answering()`, the call that was to follow was not made)."""


class Worker:
    """One daemon thread that owns one D-Bus connection and runs calls on it in order, off the loop.

    `submit(fn)` runs `fn(bus)` in the thread (connecting first if needed, then `on_open(bus)`)
    and settles an asyncio future on the loop. Results come back in the order the calls ran, and
    `apply(ok, result)`, if given, runs on the loop before anything else sees the result: the
    watcher relies on that to apply reads and signals in the order the thread saw them. A call
    that fails with anything but a timeout closes the connection; the next call opens a new one.
    """

    def __init__(self, kind: str, name: str, on_open: Callable[[Any], None] | None = None) -> None:
        self.kind = kind
        self.name = name
        self.bus: Any = None  # pystemd's DBus
        self.on_open = on_open
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._probe: sdbus.Connection | None = None  # answering()'s own connection, thread-owned

    def submit(self, fn: Callable[[Any], Any], apply: Callable[[bool, Any], None] | None = None
               ) -> asyncio.Future[Any]:
        if self._closed:
            raise ConnectionError(f"{self.name}: closed")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._q.put(_Job(fn, fut, apply))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"genready-{self.name}", daemon=True)
            self._thread.start()
        return fut

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                break
            ok, res = self._one(job)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                job.fut.get_loop().call_soon_threadsafe(_settle, job, ok, res)
        self._close_bus()

    def _one(self, job: _Job) -> tuple[bool, Any]:
        try:
            if self.bus is None:
                bus = open_bus(self.kind)
                if self.on_open is not None:
                    try:
                        self.on_open(bus)
                    except BaseException:
                        # Half set up (not subscribed, say), even after a mere timeout: never reused.
                        with contextlib.suppress(Exception):
                            bus.close()
                        raise
                self.bus = bus
            return True, job.fn(self.bus)
        except BaseException as e:
            if not timed_out(e):
                self._close_bus()  # a broken connection is not reused
            return False, e

    def answering(self) -> None:
        """In the worker thread only, right before a pystemd call that waits for the manager: raise
        Unresponsive unless the manager answers a Version question within PROBE_TIMEOUT.

        A pystemd call on a frozen manager would stop the event loop for sd-bus's whole method
        timeout (the package's docstring says why). This question goes through sdbus, on a
        connection of its own, without holding up the loop. What it
        cannot cover: the manager freezing in the microseconds between its answer and the pystemd
        call. That call then holds up the loop until sd-bus gives up, SD_BUS_TIMEOUT (5 s, `serve`
        sets SYSTEMD_BUS_TIMEOUT) at most."""
        from genready.systemd import sdbus  # here: only the daemon's watcher needs ctypes and libsystemd

        conn = self._probe
        try:
            if conn is None or not conn.alive():
                if conn is not None:
                    conn.close()
                conn = self._probe = sdbus.Connection(self.kind, int(PROBE_TIMEOUT * 1e6))
            retry_eintr(conn.version)
        except Exception as e:
            # Not reused: a late answer would stay queued in it for ever (nothing else reads it).
            self._close_probe()
            if timed_out(e):
                raise Unresponsive(f"the {self.kind} manager did not answer within {PROBE_TIMEOUT:g} s; "
                                   "nothing was asked on the watching connection") from e
            raise

    def _close_bus(self) -> None:
        bus, self.bus = self.bus, None
        if bus is not None:
            with contextlib.suppress(Exception):
                bus.close()
        self._close_probe()

    def _close_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            with contextlib.suppress(Exception):
                probe.close()

    def close(self) -> None:
        """Stop the thread once its queue is done (a call stuck on the manager ends by sd-bus's timeout)."""
        self._closed = True
        self._q.put(None)
        if self._thread is None:
            self._close_bus()


@dataclass(frozen=True)
class _Job:
    fn: Callable[[Any], Any]
    fut: asyncio.Future[Any]
    apply: Callable[[bool, Any], None] | None


def _settle(job: _Job, ok: bool, res: Any) -> None:
    if job.apply is not None:
        try:
            job.apply(ok, res)
        except Exception:
            log.exception("applying a D-Bus answer failed")
    settle(job.fut, ok, res)


def settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Resolve `fut` with a result or an exception, unless it is done already."""
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
        fut.exception()  # retrieved: a bounded wait that gave up must not log "never retrieved"


class Health:
    """Does the manager answer? One view for the daemon: the watcher and the fresh reads report to it.

    `on_change(responsive)` runs on the loop at each transition (the daemon logs it once, sets
    genready_systemd_responsive, and has the watcher re-read every unit after a thaw).
    """

    def __init__(self, on_change: Callable[[bool], None] | None = None) -> None:
        self.responsive = True
        self.since = time.monotonic()  # of the last transition
        self.on_change = on_change

    def silent(self) -> None:
        """The manager did not answer within a bound (the opposite of `answered()`)."""
        self._set(False)

    def answered(self) -> None:
        self._set(True)

    def _set(self, responsive: bool) -> None:
        if responsive == self.responsive:
            return
        self.responsive, self.since = responsive, time.monotonic()
        if self.on_change is not None:
            self.on_change(responsive)

    def silent_for(self) -> float:
        return 0.0 if self.responsive else time.monotonic() - self.since
