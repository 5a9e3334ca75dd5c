#!/usr/bin/env python3
"""What one RecordStore.remember() costs its caller, the event loop (the fsync is off the loop).

History calls remember() on the event loop for every start record it creates or updates. The
store is opened in a temporary directory on the disk under test (`--dir`, default /var/tmp, not
a tmpfs) and N records are remembered the way a start goes: created, then updated twice; each
call's wall time is reported as p50 / p99 / max in µs, plus the time until close() has written
everything. `--busy` runs a thread that writes and fsyncs 8 MiB chunks to the same disk
meanwhile, as a model download or a checkpoint would.

Another checkout's store (its `daemon/` directory on PYTHONPATH) gives the before of a before/after;
the line printed names the module measured:

    git worktree add /tmp/old <commit> && PYTHONPATH=/tmp/old/daemon .venv/bin/python bench/records.py

Run: .venv/bin/python bench/records.py [--n 1000] [--busy]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from genready.store import records


def busy_disk(where: Path, stop: threading.Event) -> None:
    """Write and fsync 8 MiB at a time until `stop`: keeps the disk's flush queue full."""
    chunk = os.urandom(8 << 20)
    path = where / "busy.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while not stop.is_set():
            os.pwrite(fd, chunk, 0)
            os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="remember() calls (default 1000)")
    ap.add_argument("--dir", default="/var/tmp", help="where the state dir is made (default /var/tmp)")
    ap.add_argument("--busy", action="store_true", help="keep the disk busy with fsynced writes meanwhile")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="genready-bench-records.") as tmp:
        stop = threading.Event()
        busy = threading.Thread(target=busy_disk, args=(Path(tmp), stop), daemon=True)
        if args.busy:
            busy.start()
        store = records.RecordStore(Path(tmp) / "state")
        store.load()
        times: list[float] = []
        base: Any = records.StartRecord(
            target="llm", unit="llm.service", invocation_id="", main_pid=1, started_at="2026-12-02T10:00:00+00:00",
            active_at=None, ended_at=None, result=None, exit_code=None, exit_status=None, n_restarts=0)
        t_all = time.perf_counter()
        for i in range(args.n):
            stage = i % 3  # a start is created, becomes active, ends
            rec = dataclasses.replace(base, invocation_id=f"inv{i // 3:06d}", main_pid=1000 + i // 3)
            if stage >= 1:
                rec = dataclasses.replace(rec, active_at="2026-12-02T10:00:05+00:00")
            if stage == 2:
                rec = dataclasses.replace(rec, ended_at="2026-12-02T10:01:00+00:00", result="success")
            t0 = time.perf_counter()
            store.remember(rec)
            times.append(time.perf_counter() - t0)
        t_calls = time.perf_counter() - t_all
        store.close()  # waits for what is queued, where remember() no longer writes itself
        t_closed = time.perf_counter() - t_all
        stop.set()
        if args.busy:
            busy.join()
        got = records.RecordStore(Path(tmp) / "state")
        got.load()
        n_back = sum(1 for _ in got.all("llm"))
        got.close()
    us = sorted(t * 1e6 for t in times)
    p99 = us[min(len(us) - 1, round(0.99 * len(us)))]
    busy_note = " (disk busy)" if args.busy else ""
    print(f"remember() x {args.n}{busy_note} on {args.dir}: p50 {statistics.median(us):.0f} µs, "
          f"p99 {p99:.0f} µs, max {us[-1]:.0f} µs; all calls {t_calls:.3f} s, written and closed {t_closed:.3f} s; "
          f"{n_back} records read back ({records.__file__})")
    return 0 if n_back == (args.n + 2) // 3 else 1


if __name__ == "__main__":
    sys.exit(main())
