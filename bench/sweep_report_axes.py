"""The time `genready sweep report --format html` takes over a results.jsonl whose lines each name another
axis (issue 41 #9d: it was quadratic in the axes; the goal is 64 MiB in under 10 s), beside the time
`--format table` takes over the same file, at 1/8, 1/4, 1/2 and all of SIZE MiB: a linear report takes
about twice as long for twice the lines. Per size: the wall time, the report's own CPU time (the machine
may be shared: the load average is printed before and after), CPU seconds per MiB, and per MiB added
since the size before (the start-up, matplotlib's import included, left out). Exit 1 when either format
takes 10 s or more over the whole size.

Each line is a real sweep's results line (its plan values, status, PID, InvocationID, load and run time,
host, target, unit, times, the sweep's own read of the accept length) whose point names one axis no other
line names. The files are written here; a report reads at most 64 MiB (files.MAX_RESULTS_BYTES).

    .venv/bin/python bench/sweep_report_axes.py [SIZE_MIB]     (default 64)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
LIMIT_MIB = 64  # files.MAX_RESULTS_BYTES: the most a report reads
GOAL_S = 10  # issue 41 #9d: 64 MiB of such lines in under 10 s


def write(path: Path, size: int) -> int:
    """Lines each naming another axis, up to `size` bytes; how many."""
    n = written = 0
    with path.open("w") as f:
        while True:
            line = json.dumps({"point": {f"axis_{n:07d}": n, "draft": f"d{n % 10}"}, "index": n + 1, "group": 1,
                               "status": "ok", "attempt": 1, "repeat": 1, "cache": "flushed", "pid": 1000 + n,
                               "invocation_id": f"{n:032x}", "load_seconds": 30.0, "run_seconds": 5.0,
                               "host": "gpu1", "target": "t", "unit": "sglang.service",
                               "started_at": "2026-12-04T01:00:00Z", "ended_at": "2026-12-04T02:00:00Z",
                               "metrics_accept_length": 1.5 + (n % 7) / 10}) + "\n"
            if written + len(line) > size:
                return n
            f.write(line)
            written += len(line)
            n += 1


def timed(folder: Path, fmt: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one report: the CPU time is the report's own on a machine others load too."""
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([PY, "-m", "genready.cli", "sweep", "report", str(folder), "--format", fmt, "--output",
                    str(folder.parent / f"report.{fmt}")], check=True, cwd=REPO)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, cpu.ru_utime - cpu0.ru_utime + cpu.ru_stime - cpu0.ru_stime


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> int:
    size_mib = float(sys.argv[1]) if len(sys.argv) > 1 else LIMIT_MIB
    print(load(), flush=True)
    took: dict[str, float] = {}
    before: tuple[float, dict[str, float]] | None = None  # the size before, and its CPU time per format
    for part in (8, 4, 2, 1):
        mib = size_mib / part
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "results"
            folder.mkdir()
            lines = write(folder / "results.jsonl", int(mib * (1 << 20)))
            cpu: dict[str, float] = {}
            text = []
            for fmt in ("html", "table"):
                took[fmt], cpu[fmt] = timed(folder, fmt)
                added = "" if before is None else \
                    f", {(cpu[fmt] - before[1][fmt]) / (mib - before[0]):.3f} s/MiB added"
                text.append(f"--format {fmt} {took[fmt]:5.1f} s ({cpu[fmt]:5.1f} s CPU, {cpu[fmt] / mib:.3f} s/MiB"
                            f"{added})")
            print(f"{mib:5.1f} MiB, {lines:,} lines naming {lines:,} axes: " + "; ".join(text), flush=True)
            before = (mib, cpu)
    print(load(), flush=True)
    return 0 if all(t < GOAL_S for t in took.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
