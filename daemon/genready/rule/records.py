"""The start-record store: one record per systemd InvocationID, kept crash-safe on disk.

The file is append-only JSON Lines at `<state_dir>/records.jsonl`. Every `put` appends one
complete line with a single write and fsyncs it before returning; an update is a new full line
and on load the last line for a (target, invocation_id) wins. A SIGKILL at any moment loses no
line whose `put` returned, and a torn last line is dropped on the next load. Compaction rewrites
the live records into a temp file and renames it over the log, so a crash leaves old or new.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import tempfile
import threading
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Final

from genready.redact import redact_lines

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


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data`; a regular file only writes short on ENOSPC or a fatal signal."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def _read_all(fd: int) -> bytes:
    """The whole file behind `fd`, from offset 0."""
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _fsync_dir(path: Path) -> None:
    """Make a rename or create inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StoreBusyError(OSError):
    """Another RecordStore, in this process or another, has the same state dir open."""


class RecordStore:
    """The start records of all targets, newest `keep_per_target` per target, in `<state_dir>/records.jsonl`.

    One writer per state dir (enforced with a lock file); methods are safe to call from several threads.
    """

    def __init__(self, state_dir: Path, *, keep_per_target: int = 1000) -> None:
        """Create `state_dir` (mode 0o750) if missing, else raise the OSError; the file is read by load()."""
        if keep_per_target < 1:
            raise ValueError(f"keep_per_target must be >= 1, found {keep_per_target}")
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / RECORDS_FILE
        self.keep_per_target = keep_per_target
        self.state_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        self._mutex = threading.Lock()
        # target -> invocation_id -> record; dicts keep first-insertion order, which is "age".
        self._records: dict[str, dict[str, StartRecord]] = {}
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._loaded = False
        self._closed = False
        self._lines = 0  # complete lines in the file, live or superseded
        self._compact_not_before = 0  # after a failed compaction, wait for the file to grow again
        self._unsynced = False  # remember() kept records in memory that the file does not have
        # Called (under the store's lock: it must not call back into the store) for every failed write.
        self.on_error: Callable[[OSError], None] | None = None

    # -- public API ---------------------------------------------------------------------------

    def load(self) -> None:
        """Read records.jsonl (last line per key wins) and open it for appends; takes the writer lock.

        Unreadable lines are skipped with a warning naming file and line; a torn last line is cut off.
        """
        with self._mutex:
            self._load_locked()

    def put(self, rec: StartRecord) -> None:
        """Store `rec` durably (appended and fsynced) before returning; no-op if equal to the stored one."""
        with self._mutex:
            self._ensure_open()
            if self._records.get(rec.target, {}).get(rec.invocation_id) == rec:
                return
            self._append(_encode(rec))
            self._apply(rec)
            self._lines += 1
            self._maybe_compact()

    def remember(self, rec: StartRecord) -> OSError | None:
        """put(), except that a failed write (disk full, read-only) keeps `rec` in memory and returns
        the error instead of raising: the records are history, and whoever keeps them must go on.
        Unwritten records are written by the next successful remember() or sync()."""
        with self._mutex:
            self._ensure_open()
            if self._records.get(rec.target, {}).get(rec.invocation_id) == rec:
                return None
            if self._unsynced:
                self._apply(rec)
                return self._sync_locked(report=True)
            try:
                self._append(_encode(rec))
            except OSError as e:
                self._apply(rec)
                self._unsynced = True
                self._report(e)
                return e
            self._apply(rec)
            self._lines += 1
            self._maybe_compact()
            return None

    @property
    def unsynced(self) -> bool:
        """Some records live only in memory since a write failed."""
        return self._unsynced

    def sync(self) -> OSError | None:
        """Write the records a failed write left in memory only (the whole file, atomically); the
        error if that fails too."""
        with self._mutex:
            if not self._unsynced or self._closed:
                return None
            return self._sync_locked(report=False)

    def _sync_locked(self, *, report: bool) -> OSError | None:
        try:
            self._compact(self._live())
        except OSError as e:
            if report:
                self._report(e)
            return e
        self._unsynced = False
        return None

    def _report(self, e: OSError) -> None:
        if self.on_error is not None:
            self.on_error(e)

    def get(self, target: str, invocation_id: str) -> StartRecord | None:
        """The stored version of one record, or None."""
        with self._mutex:
            self._ensure_loaded()
            return self._records.get(target, {}).get(invocation_id)

    def newest(self, target: str, n: int = 20) -> list[StartRecord]:
        """Up to `n` records of `target`, newest first (by when each invocation was first stored)."""
        with self._mutex:
            self._ensure_loaded()
            return list(islice(reversed(self._records.get(target, {}).values()), max(n, 0)))

    def all(self, target: str) -> list[StartRecord]:
        """Every kept record of `target`, oldest first."""
        with self._mutex:
            self._ensure_loaded()
            return list(self._records.get(target, {}).values())

    def forget_removed(self, configured: Iterable[str], before: float) -> list[str]:
        """Drop every record of each target not in `configured` whose newest record (its end, or
        start) is older than `before` (wall clock), and rewrite the file without them. The targets
        dropped, sorted. A failed rewrite keeps the file as it is (tried again next time)."""
        keep = set(configured)
        with self._mutex:
            self._ensure_open()
            gone = sorted(t for t, recs in self._records.items()
                          if t not in keep and _last_seen(recs.values()) < before)
            if not gone:
                return gone
            for target in gone:
                del self._records[target]
            try:
                self._compact(self._live())
            except OSError as e:
                log.warning("rewriting %s without the records of %s failed: %s", self.path, ", ".join(gone), e)
            return gone

    def close(self) -> None:
        """Close the file and release the lock; later puts raise, reads answer from memory. Idempotent."""
        with self._mutex:
            self._closed = True
            self._loaded = False
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

    # -- internals (caller holds self._mutex) -------------------------------------------------

    def _ensure_loaded(self) -> None:
        # Reads after close() answer from memory rather than silently reopening the file.
        if not self._loaded and not self._closed:
            self._load_locked()

    def _ensure_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"RecordStore for {self.path} is closed")
        # A put before load() must not happen blind: compaction would drop what the file holds.
        self._ensure_loaded()

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

    def _load_locked(self) -> None:
        self._acquire_lock()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._records = {}
        self._lines = 0
        self._compact_not_before = 0
        existed = self.path.exists()
        # O_NOFOLLOW: a symlink planted in the state dir must not make genready (root) append to
        # or truncate whatever it points at; it fails with ELOOP instead.
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        try:
            if not existed:
                _fsync_dir(self.state_dir)  # the new name must survive a crash, not only its data
            self._replay(fd, _read_all(fd))
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._closed = False
        self._loaded = True
        self._remove_stale_temps()
        self._maybe_compact()

    def _replay(self, fd: int, data: bytes) -> None:
        """Apply every line of `data` as a put would; repair a torn tail so the next append starts a line."""
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
            # A write cut short by a crash: its put never returned, so nothing acknowledged is lost.
            log.warning(
                "%s:%d: dropping torn last line (%d bytes, no newline): %s", self.path, lineno, len(tail), e
            )
            os.ftruncate(fd, len(data) - len(tail))
            os.fsync(fd)
            return
        # Whole record but no newline (hand edit, or killed between the bytes): keep it, end the line.
        log.warning("%s:%d: last line had no newline; adding one", self.path, lineno)
        _write_all(fd, b"\n")
        os.fsync(fd)
        self._apply(rec)
        self._lines += 1

    def _apply(self, rec: StartRecord) -> None:
        """A put's in-memory effect: replace in place, or add as newest and evict the oldest over the cap."""
        recs = self._records.setdefault(rec.target, {})
        new = rec.invocation_id not in recs
        recs[rec.invocation_id] = rec
        if new:
            while len(recs) > self.keep_per_target:
                del recs[next(iter(recs))]

    def _append(self, line: bytes) -> None:
        """Append one complete line and fsync it; on failure cut the file back so no torn line stays."""
        fd = self._fd
        assert fd is not None
        start = os.fstat(fd).st_size
        try:
            _write_all(fd, line)  # one os.write in practice; O_APPEND puts it at the end
            os.fsync(fd)
        except OSError:
            # A half line left here would glue itself to the next record and lose both.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise

    def _live(self) -> int:
        return sum(len(recs) for recs in self._records.values())

    def _maybe_compact(self) -> None:
        live = self._live()
        if self._lines <= max(2 * live, _COMPACT_MIN_LINES) or self._lines < self._compact_not_before:
            return
        try:
            self._compact(live)
        except OSError as e:
            # The records themselves are already durable; only the rewrite failed (e.g. disk full).
            self._compact_not_before = self._lines + max(live, _COMPACT_MIN_LINES)
            log.warning("compacting %s failed, will retry after more records: %s", self.path, e)

    def _compact(self, live: int) -> None:
        """Rewrite the live records to a temp file, fsync it, rename it over the log, fsync the dir."""
        data = b"".join(_encode(rec) for rec in self._iter_live())
        tmp_fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=self.state_dir)
        try:
            os.fchmod(tmp_fd, 0o640)  # mkstemp makes 0600; keep the log's usual mode
            _write_all(tmp_fd, data)
            os.fsync(tmp_fd)
            # Appends after the swap go through this fd, so it needs O_APPEND like the original.
            fcntl.fcntl(tmp_fd, fcntl.F_SETFL, fcntl.fcntl(tmp_fd, fcntl.F_GETFL) | os.O_APPEND)
            os.replace(tmp_name, self.path)
        except BaseException:
            os.close(tmp_fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        old_fd, self._fd = self._fd, tmp_fd
        if old_fd is not None:
            os.close(old_fd)
        self._lines = live
        self._compact_not_before = 0
        _fsync_dir(self.state_dir)

    def _iter_live(self) -> Iterable[StartRecord]:
        for recs in self._records.values():
            yield from recs.values()

    def _remove_stale_temps(self) -> None:
        """Delete temp files of a compaction that a crash interrupted; we hold the lock, so none is live."""
        for p in self.state_dir.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
            try:
                p.unlink()
                log.info("removed %s left by an interrupted compaction", p)
            except OSError as e:
                log.warning("cannot remove %s left by an interrupted compaction: %s", p, e)
