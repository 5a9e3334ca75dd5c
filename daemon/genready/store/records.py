"""The start-record store: one record per systemd InvocationID, kept crash-safe on disk.

The file is append-only JSON Lines at `<state_dir>/records.jsonl`. An update is a new full line
and on load the last line for a (target, invocation_id) wins. Every write appends complete lines
with a single write and fsyncs them; a torn last line (a crash mid-write) is dropped on the next
load. Compaction rewrites the live records into a temp file and renames it over the log, so a
crash leaves old or new.

Who waits for the disk: only `flush` and `close`. `remember`, which the event loop calls for every
start a unit makes, only changes memory (readers see the record at once) and queues the line for the
store's one writer thread, which writes and fsyncs in order, many queued lines at a time. So an
fsync on a busy disk (ms to seconds) never stalls /ready, /status or /metrics. The price is a
window: a remembered record is lost by a SIGKILL or a power cut between the call and its fsync
(normally well under a millisecond; as long as the disk is slow). That is acceptable because the
records are history, not the truth: systemd is. After a restart genready
re-reads each unit and recreates the record of the running start from systemd's own properties
and timestamps; what such a loss can cost is the ready_at of a start verified just before the
crash. close() and flush() wait for everything queued, so a clean stop loses nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import queue
import threading
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Final

from genready.redact import redact_lines
from genready.store import durable

log = logging.getLogger(__name__)

RECORDS_FILE: Final = "records.jsonl"
LOCK_FILE: Final = "records.lock"
_TMP_PREFIX: Final = RECORDS_FILE + "."
_TMP_SUFFIX: Final = ".tmp"
# Below this many lines a rewrite saves too little to be worth it; tests lower it.
_COMPACT_MIN_LINES = 64


@dataclass(frozen=True, slots=True)
class StartRecord:
    """One start of a unit (one systemd InvocationID); immutable, update with dataclasses.replace."""

    target: str
    unit: str
    invocation_id: str
    main_pid: int
    started_at: str | None  # wall clock, ISO 8601 with zone
    active_at: str | None
    ended_at: str | None
    result: str | None  # systemd Result=, e.g. "success", "signal", "exit-code"
    exit_code: str | None  # ExecMainCode as text: "exited", "killed", "dumped"
    exit_status: int | None  # ExecMainStatus
    n_restarts: int
    ready_at: str | None = None
    load_seconds: float | None = None
    probes: int | None = None
    served_by_pid: int | None = None
    revoked_at: str | None = None
    revoke_reason: str | None = None
    exec_fingerprint: str | None = None  # digest of ExecStart= at this start: loads compare like with like
    # What this start was started with: ExecStart= (one shell-quoted line per command) and
    # Environment= (KEY=VALUE), to say when the unit's have changed since (a drop-in edited and
    # reloaded, not restarted). None: not known (a daemon-reload not yet read, or an older record).
    exec_start: tuple[str, ...] | None = None
    environment: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, object]:
        """All fields as a JSON-ready dict (field name -> value)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def public_json(self) -> dict[str, object]:
        """to_json for /status, which every local user may read: secrets in the command lines and
        the environment (an --api-key, HF_TOKEN=…) masked."""
        out = self.to_json()
        for key in ("exec_start", "environment"):
            if out[key] is not None:
                out[key] = redact_lines(out[key])  # type: ignore[arg-type]  # a tuple of str
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> StartRecord:
        """Build a record from `to_json` output; a missing or mistyped field raises ValueError.

        Unknown keys are ignored, so a file written by a newer version still loads.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"expected a JSON object, found {type(d).__name__}")
        kwargs: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                if f.default is dataclasses.MISSING:
                    raise ValueError(f"missing field {f.name!r}")
                continue
            kwargs[f.name] = _checked(f.name, d[f.name], _FIELD_TYPES[f.name])
        return cls(**kwargs)  # type: ignore[arg-type]  # each value was checked against its field type


def _allowed_types(hint: object) -> tuple[type, ...]:
    """The runtime types a field annotation admits: `int | None` -> (int, NoneType)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for a in typing.get_args(hint) for t in _allowed_types(a))
    if hint is None:
        return (type(None),)
    # Before the `type` test: on Python 3.10, isinstance(tuple[str, ...], type) is True.
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[1:] == (...,) and typing.get_args(hint)[0] is str:
        return (tuple,)  # tuple[str, ...]: a JSON array of strings
    if isinstance(hint, type) and typing.get_origin(hint) is None:
        return (hint,)
    raise TypeError(f"unsupported field type {hint!r}")


# Resolved once: the annotations are strings under `from __future__ import annotations`.
_FIELD_TYPES: Final[dict[str, tuple[type, ...]]] = {
    name: _allowed_types(hint) for name, hint in typing.get_type_hints(StartRecord).items()
}


def _checked(name: str, value: object, allowed: tuple[type, ...]) -> object:
    """`value` if it has one of the `allowed` types, else ValueError; an int is accepted for a float."""
    # bool is an int subclass, but true/false in a pid or count field is garbage, not a number.
    if isinstance(value, bool) and bool not in allowed:
        raise ValueError(f"field {name!r}: expected {_type_names(allowed)}, found {value!r}")
    if tuple in allowed and isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if isinstance(value, allowed):
        return value
    if isinstance(value, int) and float in allowed:
        return float(value)
    raise ValueError(f"field {name!r}: expected {_type_names(allowed)}, found {value!r}")


def _type_names(allowed: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in allowed)


def _encode(rec: StartRecord) -> bytes:
    """One complete JSON line, ASCII only so no encoding question can arise on read."""
    return (json.dumps(rec.to_json(), ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def _decode(raw: bytes) -> StartRecord:
    """Parse one line (without its newline); any unreadable content raises ValueError."""
    try:
        obj = json.loads(raw)
    except RecursionError as e:  # absurdly nested garbage
        raise ValueError("nested too deeply") from e
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, found {type(obj).__name__}")
    return StartRecord.from_json(obj)


def _last_seen(recs: Iterable[StartRecord]) -> float:
    """When the newest of `recs` was last heard of (ended, else started), as Unix time; 0 if never."""
    last = 0.0
    for rec in recs:
        for when in (rec.ended_at, rec.started_at):
            if when:
                with contextlib.suppress(ValueError):
                    last = max(last, datetime.fromisoformat(when).timestamp())
                break
    return last


def _read_all(fd: int) -> bytes:
    """The whole file behind `fd`, from offset 0."""
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


class StoreBusyError(OSError):
    """Another RecordStore, in this process or another, has the same state dir open."""


WRITER_THREAD: Final = "genready-records"


@dataclass(slots=True)
class _Waiter:
    """Set by the writer once its job, and every job queued before it, is done."""

    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class _Job:
    """One item of the writer's queue: a record's line, a sync request, a barrier, or stop."""

    seq: int = 0  # a record's place in the order of remember calls (1, 2, ...); 0 for the rest
    rec: StartRecord | None = None
    waiter: _Waiter | None = None
    sync: bool = False  # write what failed writes left in memory only (a full rewrite)
    stop: bool = False  # the last job: close() is waiting for the thread to end


class RecordStore:
    """The start records of all targets, newest `keep_per_target` per target, in `<state_dir>/records.jsonl`.

    One writer per state dir (enforced with a lock file); methods are safe to call from several threads.

    Two locks, never taken the other way round: `_io` (the file: fd, line count, compaction) is
    held across writes and fsyncs; `_mutex` (the records in memory) only for moments, never
    across a system call that may wait for the disk, so readers (get/newest/all, on the event
    loop) never wait for it. The one exception is load(), which reads the file under both: it
    runs before the store is used (or as its first use, which must wait for it anyway).
    """

    def __init__(self, state_dir: Path, *, keep_per_target: int = 1000) -> None:
        """Create `state_dir` (mode 0o750) if missing, else raise the OSError; the file is read by load()."""
        if keep_per_target < 1:
            raise ValueError(f"keep_per_target must be >= 1, found {keep_per_target}")
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / RECORDS_FILE
        self.keep_per_target = keep_per_target
        self.state_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        # -- under _mutex: what readers see
        self._mutex = threading.Lock()
        # target -> invocation_id -> record; dicts keep first-insertion order, which is "age".
        self._records: dict[str, dict[str, StartRecord]] = {}
        self._seq = 0  # records handed to the writer so far; each job carries its number
        self._loaded = False
        self._closed = False
        self._unsynced = False  # a failed write left records in memory that the file does not have
        # -- under _io: the file (and the lock file), touched by the writer thread, load, close and forget_removed
        self._io = threading.Lock()
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._lines = 0  # complete lines in the file, live or superseded
        self._compact_not_before = 0  # after a failed compaction, wait for the file to grow again
        self._covered = 0  # a rewrite took memory as of this seq: queued jobs up to it are in the file already
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        # Called on the writer thread (holding the file lock, not the readers': they may read the
        # store, but not flush, load or close it) for every failed write of records...
        self.on_error: Callable[[OSError], None] | None = None
        # ...and once the records failed writes kept in memory only are all on disk again.
        self.on_recovered: Callable[[], None] | None = None

    # -- public API ---------------------------------------------------------------------------

    def load(self) -> None:
        """Read records.jsonl (last line per key wins) and open it for appends; takes the writer lock.

        Unreadable lines are skipped with a warning naming file and line; a torn last line is cut off.
        Loading again re-reads the file after what is queued is written: before other threads use the store.
        """
        self.flush()
        with self._io:
            self._load_io()

    def remember(self, rec: StartRecord) -> None:
        """Store `rec` without waiting for the disk: readers see it at once, the writer thread
        appends and fsyncs it (in call order) right after. A failed write (disk full, read-only)
        keeps the records in memory, sets `unsynced` and calls `on_error`; the records are history,
        and whoever keeps them must go on. They are written by the next successful write or sync."""
        self._enqueue(rec)

    @property
    def unsynced(self) -> bool:
        """Some records live only in memory since a write failed."""
        return self._unsynced

    def sync_soon(self) -> None:
        """Write the records a failed write left in memory only (the whole file, atomically), on the
        writer thread, not waited for: `on_recovered` says when it worked."""
        self._send(_Job(sync=True))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record remembered so far is written (or its write failed); False if
        `timeout` seconds passed first."""
        waiter = _Waiter()
        return not self._send(_Job(waiter=waiter)) or waiter.done.wait(timeout)

    def get(self, target: str, invocation_id: str) -> StartRecord | None:
        """The stored version of one record, or None."""
        self._ensure_loaded()
        with self._mutex:
            return self._records.get(target, {}).get(invocation_id)

    def newest(self, target: str, n: int = 20) -> list[StartRecord]:
        """Up to `n` records of `target`, newest first (by when each invocation was first stored)."""
        self._ensure_loaded()
        with self._mutex:
            return list(islice(reversed(self._records.get(target, {}).values()), max(n, 0)))

    def all(self, target: str) -> list[StartRecord]:
        """Every kept record of `target`, oldest first."""
        self._ensure_loaded()
        with self._mutex:
            return list(self._records.get(target, {}).values())

    def forget_removed(self, configured: Iterable[str], before: float) -> list[str]:
        """Drop every record of each target not in `configured` whose newest record (its end, or
        start) is older than `before` (wall clock), and rewrite the file without them, on the
        calling thread. The targets dropped, sorted. A failed rewrite keeps the file as it is
        (tried again next time)."""
        keep = set(configured)
        self._ensure_loaded()
        with self._io:
            with self._mutex:
                if self._closed:
                    raise RuntimeError(f"RecordStore for {self.path} is closed")
                gone = sorted(t for t, recs in self._records.items()
                              if t not in keep and _last_seen(recs.values()) < before)
                for target in gone:
                    del self._records[target]
            if not gone:
                return gone
            try:
                self._rewrite()
            except OSError as e:
                log.warning("rewriting %s without the records of %s failed: %s", self.path, ", ".join(gone), e)
            return gone

    def close(self) -> None:
        """Wait for the writer to write what is queued, close the file and release the lock; later
        puts raise, reads answer from memory. Idempotent."""
        with self._mutex:
            self._closed = True
            self._loaded = False
            writer, self._writer = self._writer, None
            if writer is not None:
                self._queue.put(_Job(stop=True))  # behind every job queued before _closed was set
        if writer is not None:
            writer.join()
        with self._io:
            for fd in (self._fd, self._lock_fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._fd = self._lock_fd = None

    def __enter__(self) -> RecordStore:
        self.load()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the callers' side --------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        """Load on first use. Unlocked peek first: once loaded this must not wait for `_io`,
        which the writer holds across fsyncs. Reads after close() answer from memory."""
        if self._loaded or self._closed:
            return
        with self._io:
            if not self._loaded and not self._closed:
                self._load_io()

    def _enqueue(self, rec: StartRecord) -> bool:
        """Apply `rec` in memory and queue its line; False if it equals the stored version."""
        # A record before load() must not happen blind: compaction would drop what the file holds.
        self._ensure_loaded()
        with self._mutex:
            if self._closed:
                raise RuntimeError(f"RecordStore for {self.path} is closed")
            if self._records.get(rec.target, {}).get(rec.invocation_id) == rec:
                return False
            self._apply(rec)
            self._seq += 1
            self._queue.put(_Job(seq=self._seq, rec=rec))  # under _mutex: in seq order
            return True

    def _send(self, job: _Job) -> bool:
        """Queue a job that carries no record; False (not queued) if no writer runs: nothing to wait for."""
        with self._mutex:
            if self._writer is None:
                return False
            self._queue.put(job)
            return True

    # -- the writer thread --------------------------------------------------------------------

    def _start_writer(self) -> None:
        """Caller holds _io and _mutex."""
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name=WRITER_THREAD, daemon=True)
            self._writer.start()

    def _write_loop(self) -> None:
        # A daemon thread: a store never closed (a crash, a test) does not hold up the exit; what
        # it had queued is then lost, like the window after remember() that the module doc names.
        while True:
            jobs = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while True:  # whatever queued meanwhile goes in the same write and fsync
                    jobs.append(self._queue.get_nowait())
            try:
                with self._io:
                    self._write_jobs(jobs)  # a failure is reported through on_error
            except Exception:  # a bug, not the disk: say so, and never strand a waiter
                log.exception("writing start records to %s failed", self.path)
            for job in jobs:
                if job.waiter is not None:
                    job.waiter.done.set()
            if any(job.stop for job in jobs):
                return

    def _write_jobs(self, jobs: list[_Job]) -> OSError | None:
        """Caller holds _io. Append the records of `jobs` in one write and one fsync, or rewrite
        the whole file if an earlier write failed; the OSError if that failed."""
        # A rewrite that took memory as of seq N holds every record queued up to N already.
        recs = [job.rec for job in jobs if job.rec is not None and job.seq > self._covered]
        sync = any(job.sync for job in jobs)
        if self._fd is None or not (recs or sync):
            return None
        if self._unsynced:  # only this thread and load change it, both under _io
            try:
                self._rewrite()
            except OSError as e:
                if recs:  # a new record failed to be written; a retry of old ones is not a new failure
                    self._report(e)
                return e
            with self._mutex:
                self._unsynced = False
            if self.on_recovered is not None:
                self._callback(self.on_recovered)
            return None
        if not recs:
            return None
        try:
            self._append(b"".join(_encode(rec) for rec in recs))
        except OSError as e:
            with self._mutex:
                self._unsynced = True
            self._report(e)
            return e
        self._lines += len(recs)
        self._maybe_compact()
        return None

    def _report(self, e: OSError) -> None:
        if self.on_error is not None:
            self._callback(self.on_error, e)

    def _callback(self, fn: Callable[..., None], *args: object) -> None:
        # The owner's code: its bug must neither stop the writer nor turn a write into a failure.
        try:
            fn(*args)
        except Exception:
            log.exception("the record store's callback %r failed", fn)

    # -- internals (caller holds self._io) ----------------------------------------------------

    def _acquire_lock(self) -> None:
        if self._lock_fd is not None:
            return
        lock_path = self.state_dir / LOCK_FILE
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            # Two writers would lose records: one's compaction orphans the other's appends.
            busy = "record store already open by another RecordStore or process"
            raise StoreBusyError(errno.EWOULDBLOCK, busy, str(lock_path)) from None
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _load_io(self) -> None:
        self._acquire_lock()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._lines = 0
        self._compact_not_before = 0
        # nofollow: a symlink planted in the state dir must not make genready (root) append to
        # or truncate whatever it points at; it fails with ELOOP instead.
        fd = durable.open_append(self.path, 0o640, read=True, nofollow=True)
        try:
            # Loading happens before the store is used (or lazily, by its first use): holding the
            # readers' lock across the read is what makes that first use wait for it.
            with self._mutex:
                self._records = {}
                self._unsynced = False
                self._covered = self._seq  # nothing queued before a load is still to be written
                self._replay(fd, _read_all(fd))
                self._closed = False
                self._loaded = True
                self._start_writer()
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._remove_stale_temps()
        self._maybe_compact()

    def _replay(self, fd: int, data: bytes) -> None:
        """Apply every line of `data` as remember would; repair a torn tail so the next append starts a line."""
        *lines, tail = data.split(b"\n")
        for lineno, raw in enumerate(lines, 1):
            self._lines += 1
            if not raw.strip():
                continue
            try:
                self._apply(_decode(raw))
            except ValueError as e:
                log.warning("%s:%d: skipping unreadable record line: %s", self.path, lineno, e)
        if not tail:
            return
        lineno = len(lines) + 1
        try:
            rec = _decode(tail)
        except ValueError as e:
            # A write cut short by a crash: nothing flushed is lost.
            log.warning(
                "%s:%d: dropping torn last line (%d bytes, no newline): %s", self.path, lineno, len(tail), e
            )
            durable.truncate(fd, len(data) - len(tail))
            return
        # Whole record but no newline (hand edit, or killed between the bytes): keep it, end the line.
        log.warning("%s:%d: last line had no newline; adding one", self.path, lineno)
        durable.append(fd, b"\n")
        self._apply(rec)
        self._lines += 1

    def _apply(self, rec: StartRecord) -> None:
        """A record's in-memory effect (caller holds _mutex): replace in place, or add as newest and
        evict the oldest over the cap."""
        recs = self._records.setdefault(rec.target, {})
        new = rec.invocation_id not in recs
        recs[rec.invocation_id] = rec
        if new:
            while len(recs) > self.keep_per_target:
                del recs[next(iter(recs))]

    def _append(self, lines: bytes) -> None:
        """Append complete lines and fsync them; on failure cut the file back so no torn line stays."""
        assert self._fd is not None
        durable.append(self._fd, lines)  # a half line left would glue itself to the next record

    def _maybe_compact(self) -> None:
        with self._mutex:
            live = sum(len(recs) for recs in self._records.values())
        if self._lines <= max(2 * live, _COMPACT_MIN_LINES) or self._lines < self._compact_not_before:
            return
        try:
            self._rewrite()
        except OSError as e:
            # The records themselves are already durable; only the rewrite failed (e.g. disk full).
            self._compact_not_before = self._lines + max(live, _COMPACT_MIN_LINES)
            log.warning("compacting %s failed, will retry after more records: %s", self.path, e)

    def _rewrite(self) -> None:
        """Rewrite the live records to a temp file, fsync it, rename it over the log, fsync the dir.

        Memory is copied under _mutex (records are immutable: a list of references), encoded and
        written outside it."""
        with self._mutex:
            live = [rec for recs in self._records.values() for rec in recs.values()]
            seq = self._seq
        data = b"".join(_encode(rec) for rec in live)
        # Appends after the swap go through the new file's descriptor (kept open, in append mode).
        new_fd = durable.replace(self.path, data, mode=0o640, tmp_prefix=_TMP_PREFIX, keep_open=True)
        assert new_fd is not None
        old_fd, self._fd = self._fd, new_fd
        if old_fd is not None:
            os.close(old_fd)
        self._lines = len(live)
        self._compact_not_before = 0
        # Jobs still queued up to `seq` are in the new file: appending them again would put an
        # older version after a newer one if the writer died between the two.
        self._covered = max(self._covered, seq)
        durable.fsync_dir(self.state_dir)

    def _remove_stale_temps(self) -> None:
        """Delete temp files of a compaction that a crash interrupted; we hold the lock, so none is live."""
        for p in self.state_dir.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
            try:
                p.unlink()
                log.info("removed %s left by an interrupted compaction", p)
            except OSError as e:
                log.warning("cannot remove %s left by an interrupted compaction: %s", p, e)
