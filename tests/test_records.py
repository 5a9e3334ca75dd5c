"""The start-record store: round trips, last-wins updates, torn and garbage lines, the cap, the
writer thread that keeps fsyncs off the caller (the event loop), and real SIGKILLs."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from genready.store import durable, records
from genready.store.records import RecordStore, StartRecord, StoreBusyError
from genready_dev.harness import wait_for

REPO = Path(__file__).resolve().parents[1]


def rec(iid: str, target: str = "llm", **kw: object) -> StartRecord:
    base = StartRecord(
        target=target,
        unit=f"{target}.service",
        invocation_id=iid,
        main_pid=1234,
        started_at="2026-11-29T10:01:02.123456+00:00",
        active_at=None,
        ended_at=None,
        result=None,
        exit_code=None,
        exit_status=None,
        n_restarts=0,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def file_lines(state: Path) -> list[str]:
    data = (state / records.RECORDS_FILE).read_text()
    assert data == "" or data.endswith("\n"), "the log must end on a line boundary"
    return data.splitlines()


def put(s: RecordStore, r: StartRecord) -> None:
    """Remember `r` and wait until its line is written (or its write failed): what a test reads
    back from the file is then there."""
    s.remember(r)
    assert s.flush(10)


def opened(state: Path, keep: int = 1000) -> RecordStore:
    s = RecordStore(state, keep_per_target=keep)
    s.load()
    return s


def reloaded(state: Path, target: str = "llm", keep: int = 1000) -> list[StartRecord]:
    """What a fresh store sees, closed again so its lock is released."""
    with RecordStore(state, keep_per_target=keep) as s:
        return s.all(target)


def test_json_round_trip_and_unknown_keys() -> None:
    r = rec("a" * 32, ready_at="2026-11-29T10:02:00+00:00", load_seconds=57.25, probes=3, served_by_pid=99)
    d = r.to_json()
    assert StartRecord.from_json(json.loads(json.dumps(d))) == r
    # A file from a newer version carries keys we don't know; an older one lacks the defaulted ones.
    newer = {**d, "future_field": [1, 2]}
    assert StartRecord.from_json(newer) == r
    older = {k: v for k, v in d.items() if k not in ("ready_at", "load_seconds", "probes", "served_by_pid")}
    assert StartRecord.from_json(older) == rec("a" * 32)
    assert StartRecord.from_json({**d, "load_seconds": 57}).load_seconds == 57.0


@pytest.mark.parametrize(
    "bad",
    [
        {"main_pid": "1234"},
        {"main_pid": True},
        {"n_restarts": None},
        {"target": 5},
        {"exit_status": 1.5},
    ],
)
def test_from_json_rejects_wrong_types(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        StartRecord.from_json({**rec("x").to_json(), **bad})


def test_from_json_rejects_missing_required() -> None:
    d = rec("x").to_json()
    del d["invocation_id"]
    with pytest.raises(ValueError, match="invocation_id"):
        StartRecord.from_json(d)


def test_put_get_and_reload_after_close(tmp_path: Path) -> None:
    state = tmp_path / "state"
    s = opened(state)
    a, b = rec("a"), rec("b", target="other", main_pid=7)
    put(s, a)
    put(s, b)
    assert s.get("llm", "a") == a and s.get("other", "b") == b
    assert s.get("llm", "b") is None and s.get("nope", "a") is None
    s.close()
    assert stat.S_IMODE(state.stat().st_mode) & 0o027 == 0  # 0o750 at most (umask can only tighten)
    with pytest.raises(RuntimeError, match="closed"):
        put(s, rec("c"))
    s2 = opened(state)
    assert s2.all("llm") == [a] and s2.all("other") == [b]
    s2.close()


def test_update_last_wins_one_record_and_identical_put_is_noop(tmp_path: Path) -> None:
    s = opened(tmp_path)
    r = rec("a")
    put(s, r)
    put(s, rec("b"))
    ended = dataclasses.replace(
        r, ended_at="2026-11-29T11:00:00+00:00", result="signal", exit_code="killed", exit_status=9
    )
    put(s, ended)
    put(s, ended)  # identical: nothing appended
    assert len(file_lines(tmp_path)) == 3
    assert s.get("llm", "a") == ended
    # An update keeps the record's place: age is first appearance.
    assert [x.invocation_id for x in s.all("llm")] == ["a", "b"]
    s.close()
    s = opened(tmp_path)
    assert s.all("llm") == [ended, rec("b")]
    s.close()


def test_newest_order_and_limit(tmp_path: Path) -> None:
    s = opened(tmp_path)
    for i in range(5):
        put(s, rec(f"i{i}"))
    assert [r.invocation_id for r in s.newest("llm", 3)] == ["i4", "i3", "i2"]
    assert [r.invocation_id for r in s.newest("llm")] == ["i4", "i3", "i2", "i1", "i0"]
    assert s.newest("llm", 0) == [] and s.newest("none") == []
    s.close()


def test_torn_last_line_is_dropped_and_next_put_starts_a_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = opened(tmp_path)
    put(s, rec("a"))
    put(s, rec("b"))
    s.close()
    path = tmp_path / records.RECORDS_FILE
    whole = json.dumps(rec("c").to_json()) + "\n"
    with path.open("a") as f:
        f.write(whole[: len(whole) // 2])  # what a SIGKILL mid-write leaves
    caplog.set_level(logging.WARNING, logger="genready.store.records")
    s = opened(tmp_path)
    assert [r.invocation_id for r in s.all("llm")] == ["a", "b"]
    assert any(f"{path}:3:" in m and "torn" in m for m in caplog.messages), caplog.messages
    put(s, rec("d"))
    s.close()
    assert [json.loads(line)["invocation_id"] for line in file_lines(tmp_path)] == ["a", "b", "d"]
    caplog.clear()
    s = opened(tmp_path)
    assert [r.invocation_id for r in s.all("llm")] == ["a", "b", "d"]
    assert caplog.messages == []
    s.close()


def test_whole_last_line_without_newline_is_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / records.RECORDS_FILE
    path.write_text(json.dumps(rec("a").to_json()) + "\n" + json.dumps(rec("b").to_json()))
    s = opened(tmp_path)
    put(s, rec("c"))
    s.close()
    assert [r.invocation_id for r in reloaded(tmp_path)] == ["a", "b", "c"]
    assert len(file_lines(tmp_path)) == 3


def test_garbage_lines_in_the_middle_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / records.RECORDS_FILE
    good = [json.dumps(rec(i).to_json()) for i in ("a", "b", "c")]
    bad_type = json.dumps({**rec("x").to_json(), "main_pid": "nope"})
    lines = [good[0], "{not json", "\x00\x00\x00", bad_type, "[1, 2]", "", good[1], good[2]]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    caplog.set_level(logging.WARNING, logger="genready.store.records")
    s = opened(tmp_path)
    assert [r.invocation_id for r in s.all("llm")] == ["a", "b", "c"]
    warned = {int(m.split(":")[1]) for m in caplog.messages if m.startswith(f"{path}:")}
    assert warned == {2, 3, 4, 5, 9}  # the blank line 6 is not worth a warning
    s.close()


def test_cap_keeps_newest_per_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "_COMPACT_MIN_LINES", 8)
    s = opened(tmp_path, keep=5)
    others = [rec(f"o{i}", target="other") for i in range(3)]
    for o in others:
        put(s, o)
    for i in range(40):
        put(s, rec(f"i{i:02d}"))
    expect = [f"i{i:02d}" for i in range(35, 40)]
    assert [r.invocation_id for r in s.all("llm")] == expect
    assert s.all("other") == others
    s.close()
    # Compaction ran: the file holds about the live records, not all 43 puts.
    assert len(file_lines(tmp_path)) <= 2 * 8
    s = opened(tmp_path, keep=5)
    assert [r.invocation_id for r in s.all("llm")] == expect and s.all("other") == others
    s.close()


def test_default_cap_is_1000(tmp_path: Path) -> None:
    assert RecordStore(tmp_path).keep_per_target == 1000


def test_update_of_an_evicted_record_comes_back_as_newest_after_reload_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "_COMPACT_MIN_LINES", 1000)  # keep every line: reload must replay the same
    s = opened(tmp_path, keep=2)
    for i in ("a", "b", "c"):
        put(s, rec(i))
    put(s, rec("a", ended_at="2026-11-29T12:00:00+00:00"))
    live = s.all("llm")
    assert [r.invocation_id for r in live] == ["c", "a"]
    s.close()
    assert reloaded(tmp_path, keep=2) == live


def test_compaction_is_atomic_and_leaves_no_temp_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "_COMPACT_MIN_LINES", 10)
    # A crash mid-compaction leaves a temp file; the next load removes it.
    (tmp_path / "records.jsonl.abc123.tmp").write_text('{"half": ')
    s = opened(tmp_path)
    inode = (tmp_path / records.RECORDS_FILE).stat().st_ino
    for i in range(4):
        put(s, rec(f"r{i}"))
    for n in range(12):  # updates make dead lines until the file passes 2x live and compacts
        put(s, rec(f"r{n % 4}", n_restarts=n))
    assert (tmp_path / records.RECORDS_FILE).stat().st_ino != inode, "compaction should have replaced the file"
    put(s, rec("after"))  # appends go to the new file
    want = s.all("llm")
    s.close()
    assert {p.name for p in tmp_path.iterdir()} == {records.LOCK_FILE, records.RECORDS_FILE}
    lines = file_lines(tmp_path)
    assert len(lines) < 16 and [StartRecord.from_json(json.loads(x)) for x in lines][-1] == rec("after")
    assert reloaded(tmp_path) == want


def test_failed_compaction_keeps_old_file_and_the_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(records, "_COMPACT_MIN_LINES", 4)

    def no_replace(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("genready.store.records.os.replace", no_replace)
    s = opened(tmp_path)
    for n in range(8):
        put(s, rec("a", n_restarts=n))  # put never fails because housekeeping did
    s.close()
    assert any("compacting" in m for m in caplog.messages)
    assert {p.name for p in tmp_path.iterdir()} == {records.LOCK_FILE, records.RECORDS_FILE}
    assert len(file_lines(tmp_path)) == 8
    monkeypatch.undo()
    assert reloaded(tmp_path) == [rec("a", n_restarts=7)]


def test_state_dir_created_and_errors_propagate(tmp_path: Path) -> None:
    RecordStore(tmp_path / "a" / "b").load()  # never closed, like a crashed daemon
    assert (tmp_path / "a" / "b" / records.RECORDS_FILE).exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        RecordStore(tmp_path / "file")
    with pytest.raises(OSError):
        RecordStore(tmp_path / "file" / "sub")


def test_second_writer_is_refused(tmp_path: Path) -> None:
    s = opened(tmp_path)
    with pytest.raises(StoreBusyError, match="already open"):
        opened(tmp_path)
    s.close()
    opened(tmp_path).close()  # the lock goes with close()


class HeldFsync:
    """os.fsync held on the store's writer thread until released: what a busy disk looks like to
    its caller (the call does not return), on demand and for as long as the test needs, which a
    real disk cannot be made to do. Other threads' fsyncs pass (the module's `os` is the one os)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()  # the writer is inside a held fsync
        self.release = threading.Event()
        real = os.fsync

        def fsync(fd: int) -> None:
            if threading.current_thread().name == records.WRITER_THREAD:
                self.entered.set()
                # Bounded: a test that forgot to release fails instead of hanging.
                assert self.release.wait(30), "fsync held for 30 s"
            real(fd)

        monkeypatch.setattr("genready.store.records.os.fsync", fsync)


@pytest.fixture
def held_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldFsync]:
    held = HeldFsync(monkeypatch)
    try:
        yield held
    finally:
        held.release.set()


def test_a_slow_fsync_blocks_neither_remember_nor_readers(tmp_path: Path, held_fsync: HeldFsync) -> None:
    n_held = 200  # records remembered while the writer is stuck in fsync
    s = opened(tmp_path)
    seen: dict[str, object] = {}

    def on_the_loop() -> None:
        """What History and the API do on the event loop, while the first line's fsync is held."""
        s.remember(rec("first"))
        assert held_fsync.entered.wait(5), "the writer never reached fsync"
        for i in range(n_held):
            s.remember(rec(f"r{i:03d}"))
            assert s.get("llm", f"r{i:03d}") == rec(f"r{i:03d}")  # seen at once
        s.remember(rec("r000", n_restarts=1))  # an update, seen at once too
        seen["newest"], seen["all"] = s.newest("llm", 2), s.all("llm")

    # On a thread of its own so that a call which waits for the held fsync fails the test in 5 s.
    loop = threading.Thread(target=on_the_loop, daemon=True)
    loop.start()
    loop.join(5)
    assert not loop.is_alive(), "remember() or a reader waited for the writer's fsync"
    assert not held_fsync.release.is_set() and "all" in seen
    newest, every = seen["newest"], seen["all"]
    assert isinstance(newest, list) and isinstance(every, list)
    assert [r.invocation_id for r in newest] == ["r199", "r198"]
    assert len(every) == n_held + 1 and s.get("llm", "r000") == rec("r000", n_restarts=1)
    # Only the first line is written (its fsync is the one held); the rest wait their turn.
    assert [json.loads(x)["invocation_id"] for x in file_lines(tmp_path)] == ["first"]
    held_fsync.release.set()
    assert s.flush(5)
    s.close()
    assert reloaded(tmp_path) == every


def test_writes_land_in_call_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "_COMPACT_MIN_LINES", 10_000)  # every line stays, to read the order back
    s = opened(tmp_path)
    calls = []
    for i in range(300):
        r = rec(f"i{i % 50:02d}", n_restarts=i)  # updates of earlier records among new ones
        calls.append(r)
        s.remember(r)
    put(s, rec("last"))  # flush waits for every line queued before it
    calls.append(rec("last"))
    assert [StartRecord.from_json(json.loads(x)) for x in file_lines(tmp_path)] == calls
    s.close()


def test_flush_returns_only_once_the_line_is_fsynced(tmp_path: Path, held_fsync: HeldFsync) -> None:
    s = opened(tmp_path)
    putter = threading.Thread(target=put, args=(s, rec("a")))
    putter.start()
    assert held_fsync.entered.wait(5)
    assert putter.is_alive()  # held inside the fsync of its line: put cannot have returned
    held_fsync.release.set()
    putter.join(5)
    assert not putter.is_alive() and [json.loads(x)["invocation_id"] for x in file_lines(tmp_path)] == ["a"]
    s.close()


def test_close_waits_for_queued_writes(tmp_path: Path, held_fsync: HeldFsync) -> None:
    s = opened(tmp_path)
    for i in range(50):
        s.remember(rec(f"r{i:02d}"))
    want = s.all("llm")
    assert held_fsync.entered.wait(5)
    closer = threading.Thread(target=s.close)
    closer.start()
    assert closer.is_alive()  # the writer is held in fsync, so close() cannot have finished
    held_fsync.release.set()
    closer.join(10)
    assert not closer.is_alive(), "close() did not return once the writes were done"
    assert reloaded(tmp_path) == want
    with pytest.raises(RuntimeError, match="closed"):
        s.remember(rec("late"))
    assert s.all("llm") == want  # reads after close answer from memory


class Disk:
    """records' writes (appends and rewrites alike) failing with ENOSPC while `full`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        real = durable.write_all

        def write_all(fd: int, data: bytes) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd, data)

        monkeypatch.setattr(durable, "write_all", write_all)


def test_a_failed_write_keeps_records_sets_unsynced_reports_and_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch)
    s = opened(tmp_path)
    errors: list[tuple[int | None, str]] = []
    recovered: list[str] = []
    s.on_error = lambda e: errors.append((e.errno, threading.current_thread().name))
    s.on_recovered = lambda: recovered.append(threading.current_thread().name)
    s.remember(rec("a"))
    assert s.flush(5) and not s.unsynced and errors == []
    disk.full = True
    s.remember(rec("b"))
    assert s.get("llm", "b") == rec("b")  # in memory at once, whatever the disk says
    assert s.flush(5)
    assert s.unsynced and errors == [(errno.ENOSPC, records.WRITER_THREAD)]
    assert [json.loads(x)["invocation_id"] for x in file_lines(tmp_path)] == ["a"]  # no torn line either
    s.remember(rec("c"))  # a new record that cannot be written: a new failure, reported
    assert s.flush(5) and len(errors) == 2
    s.sync_soon()  # a retry of old ones that fails again is not a new failure
    assert s.flush(5) and len(errors) == 2 and s.unsynced
    put(s, rec("d"))  # a new record that cannot be written is
    assert len(errors) == 3 and recovered == [] and s.unsynced
    assert [r.invocation_id for r in s.all("llm")] == ["a", "b", "c", "d"]
    disk.full = False
    s.sync_soon()  # what the daemon's upkeep does: the rewrite happens on the writer thread
    wait_for(lambda: recovered, 5, "on_recovered called", interval=0.001)
    assert recovered == [records.WRITER_THREAD] and not s.unsynced
    assert [json.loads(x)["invocation_id"] for x in file_lines(tmp_path)] == ["a", "b", "c", "d"]
    s.remember(rec("e"))  # appends again
    s.close()
    assert [r.invocation_id for r in reloaded(tmp_path)] == ["a", "b", "c", "d", "e"]
    assert recovered == [records.WRITER_THREAD]


def test_a_later_write_that_works_writes_the_unsynced_ones_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = Disk(monkeypatch)
    s = opened(tmp_path)
    recovered: list[bool] = []
    s.on_recovered = lambda: recovered.append(True)
    disk.full = True
    s.remember(rec("a"))
    assert s.flush(5) and s.unsynced
    disk.full = False
    s.remember(rec("b"))
    assert s.flush(5) and not s.unsynced and recovered == [True]
    s.close()
    assert [r.invocation_id for r in reloaded(tmp_path)] == ["a", "b"]


def test_a_callback_that_raises_stops_neither_the_writer_nor_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk(monkeypatch)
    s = opened(tmp_path)

    def broken(e: OSError) -> None:
        raise ValueError("owner's bug")

    s.on_error = broken
    disk.full = True
    s.remember(rec("a"))
    assert s.flush(5) and s.unsynced
    assert any("callback" in m for m in caplog.messages), caplog.messages
    disk.full = False
    put(s, rec("b"))  # the writer still runs
    s.close()
    assert [r.invocation_id for r in reloaded(tmp_path)] == ["a", "b"]


# The child puts records in a loop and prints "<stage> <invocation_id>" only after flush returned.
# Each record goes through three versions (start, active, ended), so dead lines pile up and
# compaction runs every few dozen records. In the "before-replace" / "after-replace" modes the
# child parks itself at that point of its first compaction and says so, so that a kill is sure
# to land mid-compaction; a random kill rarely does, the window being small.
CHILD = textwrap.dedent(
    """
    import dataclasses, os, signal, sys
    from pathlib import Path
    from genready.store import records
    from genready.store.records import RecordStore, StartRecord

    records._COMPACT_MIN_LINES = 16
    state, run, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    real_replace = os.replace

    def parked_replace(src, dst):
        if mode == "after-replace":
            real_replace(src, dst)
        print("compacting", flush=True)
        signal.pause()  # until the parent's SIGKILL

    if mode != "random":
        records.os.replace = parked_replace

    def put(s, r):  # acknowledged once its line is written, as the parent expects
        s.remember(r)
        s.flush()

    s = RecordStore(state)
    s.load()
    print("loaded", flush=True)
    for i in range(1_000_000):
        iid = f"{run}-{i:06d}"
        r = StartRecord(target="llm", unit="llm.service", invocation_id=iid, main_pid=1000 + i,
                        started_at="2026-11-29T10:01:02.123456+00:00", active_at=None, ended_at=None,
                        result=None, exit_code=None, exit_status=None, n_restarts=i)
        put(s, r)
        print("1", iid, flush=True)
        r = dataclasses.replace(r, active_at="2026-11-29T10:01:03+00:00")
        put(s, r)
        print("2", iid, flush=True)
        put(s, dataclasses.replace(r, ended_at="2026-11-29T10:01:04+00:00", result="signal",
                                  exit_code="killed", exit_status=9))
        print("3", iid, flush=True)
    """
)


def stage(r: StartRecord) -> int:
    return 3 if r.ended_at else 2 if r.active_at else 1


def run_child_until_killed(state: Path, run: str, mode: str, rng: random.Random) -> list[str]:
    """Start the child, SIGKILL it (after a random number of acks, or once parked), return what it acked."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "daemon")}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(state), run, mode], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    printed: list[str] = []
    try:
        # In random mode kill after n acks; parked modes wait for "compacting", which can even
        # come before "loaded" when load() itself finds the file due for compaction.
        n = rng.randint(1, 400) if mode == "random" else 20_000
        while len(printed) < n:
            line = child.stdout.readline()
            assert line, f"child ended early: rc={child.poll()}"
            if line == "compacting\n":
                break
            if line != "loaded\n":
                printed.append(line)
        else:
            assert mode == "random", f"child never reached a compaction in {n} puts"
        child.send_signal(signal.SIGKILL)
        printed += child.stdout.readlines()  # lines printed before death were acknowledged too
    finally:
        child.kill()
        child.wait(5)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return [ln for ln in printed if ln not in ("loaded\n", "compacting\n")]


@pytest.mark.system
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    acked: dict[str, int] = {}  # invocation_id -> highest stage whose put returned
    in_flight: set[str] = set()  # per run, the one record whose first put may have landed unprinted
    modes = ["random", "before-replace", "random", "after-replace", "random", "random", "random", "random"]
    for run, mode in enumerate(modes):
        for ln in run_child_until_killed(tmp_path, f"r{run}", mode, rng):
            st_text, iid = ln.split()
            acked[iid] = max(acked.get(iid, 0), int(st_text))
        last_i = max(int(iid.split("-")[1]) for iid in acked if iid.startswith(f"r{run}-"))
        in_flight.add(f"r{run}-{last_i + 1:06d}")
        leftovers = list(tmp_path.glob("*.tmp"))
        assert bool(leftovers) == (mode == "before-replace"), (mode, leftovers)

        s = opened(tmp_path)
        stored = s.all("llm")
        s.close()
        ids = [r.invocation_id for r in stored]
        assert len(ids) == len(set(ids)), "a record appears twice"
        by_id = {r.invocation_id: r for r in stored}
        for iid, st in acked.items():
            assert iid in by_id, f"acknowledged {iid} lost after kill #{run} ({mode})"
            assert stage(by_id[iid]) >= st, f"acknowledged update of {iid} lost"
        # Only a put in flight at a kill may have landed without being printed.
        unacked = set(by_id) - set(acked)
        assert unacked <= in_flight, unacked
        assert not list(tmp_path.glob("*.tmp")), "the load after a crash must clear compaction leftovers"
        file_lines(tmp_path)  # ends on a line boundary after load's repair
