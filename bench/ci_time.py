"""CI's time per phase, against its budget: reads the summary `./dev test` ends with (its
`dev: phase NAME SECONDS s STATUS` lines) from a saved log, or runs `CI=true ./dev test` itself.

    python3 bench/ci_time.py LOG          # a log saved from `CI=true ./dev test 2>&1 | tee LOG`
    python3 bench/ci_time.py --run        # runs it here (as root; ~30-45 min), then the same table

The budget (issue 36 §9): 90 minutes is CI's hard limit; a fresh machine, real-server builds
included, must take at most 45, and one with everything built at most 30. A run whose real-server
build took more than a minute is judged as fresh.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

PHASE = re.compile(r"^dev: phase (?P<name>.+?)\s+(?P<seconds>\d+) s  (?P<status>.*)$")
FRESH_BUDGET, BUILT_BUDGET, HARD_LIMIT = 45 * 60, 30 * 60, 90 * 60
BUILT_WITHIN = 60  # seconds of "real-server build" that mean nothing was built


def phases(log: str) -> list[tuple[str, int, str]]:
    """(name, seconds, status) of each phase line, in order; the last summary if there are several."""
    found: list[tuple[str, int, str]] = []
    for line in log.splitlines():
        if line.startswith("dev: ---- time per phase"):
            found = []
        elif m := PHASE.match(line):
            found.append((m["name"], int(m["seconds"]), m["status"]))
    return found


def report(found: list[tuple[str, int, str]]) -> tuple[str, bool]:
    """The table and the verdict, and whether the run fits its budget (and every phase passed)."""
    if not found:
        return "no `dev: phase` lines: not a `./dev test` log (or one that ended before its summary)", False
    total = next((s for n, s, _ in found if n == "total"), sum(s for _, s, _ in found))
    build = next((s for n, s, _ in found if n == "real-server build"), 0)
    fresh = build > BUILT_WITHIN
    budget = FRESH_BUDGET if fresh else BUILT_BUDGET
    lines = [f"{'phase':<28} {'time':>9}  status"]
    lines += [f"{n:<28} {s // 60:>4d}m{s % 60:02d}s  {st}" for n, s, st in found]
    ok = total <= budget and all(not st.startswith("FAILED") for _, _, st in found)
    lines.append(f"{'fresh' if fresh else 'built'} machine: {total / 60:.1f} min of a {budget // 60} min budget "
                 f"({HARD_LIMIT // 60} min hard limit): {'fits' if ok else 'DOES NOT FIT, or a phase failed'}")
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log", nargs="?", type=Path, help="a saved `./dev test` log (default: stdin)")
    p.add_argument("--run", action="store_true", help="run `CI=true ./dev test` here first, its output shown")
    args = p.parse_args(argv)
    if args.run:
        repo = Path(__file__).resolve().parents[1]
        seen = []
        with subprocess.Popen([str(repo / "dev"), "test"], env={**os.environ, "CI": "true"}, cwd=repo,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:  # shown as it comes: the run takes half an hour
                print(line, end="", flush=True)
                seen.append(line)
        text = "".join(seen)
    else:
        text = args.log.read_text(errors="replace") if args.log else sys.stdin.read()
    table, ok = report(phases(text))
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
